//! `resilio fleet`: restart storms across every job of a state dir, for
//! admins (cron, node_exporter's textfile collector).

use super::{flag_timeout, state_dir_of};
use crate::error::{Error, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(super) struct FleetArgs {
    /// Machine-readable output
    #[arg(long, conflicts_with = "prometheus")]
    json: bool,
    /// Prometheus text format, for node_exporter's textfile collector
    #[arg(long)]
    prometheus: bool,
    /// A job restarting more than this many times within the window is in a storm
    #[arg(long, default_value_t = 3)]
    restarts: u32,
    /// How far back to count restarts (e.g. 1h, 30m)
    #[arg(long, default_value = "1h")]
    window: String,
    /// Print nothing when no job is in a storm (for cron's mail)
    #[arg(long, short)]
    quiet: bool,
    /// Where journals live [env: RESILIO_STATE_DIR]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

pub(super) fn fleet_cmd(a: &FleetArgs) -> Result<i32> {
    use crate::analysis::storms;
    let window = flag_timeout("window", &a.window, "")?;
    let s = storms::scan(
        &state_dir_of(&a.state_dir)?,
        chrono::Utc::now(),
        window,
        a.restarts,
    );
    if a.json {
        let out = serde_json::to_string_pretty(&s).map_err(|e| Error::Other(e.to_string()))?;
        println!("{out}");
    } else if a.prometheus {
        print!("{}", storms::render_prometheus(&s));
    } else if !(a.quiet && s.jobs.is_empty()) {
        print!("{}", storms::render_text(&s));
    }
    Ok(0)
}
