//! `resilio template`: a ready sbatch script.

use crate::error::{Error, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(super) struct TemplateArgs {
    /// The framework the job trains with
    #[arg(value_enum)]
    kind: crate::template::Framework,
    /// Nodes of the training step
    #[arg(long, default_value_t = 2)]
    nodes: u32,
    /// Spare nodes on top, that replace a failed node inside the allocation
    #[arg(long, default_value_t = 1)]
    spares: u32,
    /// GPUs per node, one rank each (0: one rank per node, no GPU request)
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Time limit, as sbatch takes it
    #[arg(long, default_value = "24:00:00")]
    time: String,
    /// Seconds before the time limit to checkpoint every rank (0: none)
    #[arg(long, default_value_t = 300)]
    signal_lead: u32,
    /// Restarts allowed after failures
    #[arg(long, default_value_t = 3)]
    max_restarts: u32,
    /// The job's name
    #[arg(long, default_value = "train")]
    job_name: String,
    /// RESILIO_STATE_DIR in the script [default: the site's [run] state_dir, else ~/.local/state/resilio]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<String>,
    /// Write the script here (mode 0755) instead of stdout
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The training command [default: the framework's usual one]
    #[arg(last = true, value_name = "COMMAND", num_args = 0..)]
    command: Vec<String>,
}

/// `resilio template`: the script on stdout, or in a file.
pub(super) fn template_cmd(a: TemplateArgs) -> Result<i32> {
    let s = crate::template::Spec {
        kind: a.kind,
        job_name: a.job_name,
        nodes: a.nodes,
        spares: a.spares,
        gpus_per_node: a.gpus_per_node,
        time: a.time,
        signal_lead_s: a.signal_lead,
        max_restarts: a.max_restarts,
        state_dir: a.state_dir,
        command: a.command,
    };
    crate::template::check(&s).map_err(Error::Usage)?;
    let text = crate::template::render(&s);
    match a.output {
        None => print!("{text}"),
        Some(path) => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o755)
                .open(&path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
        }
    }
    Ok(0)
}
