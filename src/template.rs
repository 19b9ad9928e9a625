//! `resilio template`: a ready sbatch script for a common setup, every line
//! commented. Pure: the settings in, the script's text out.
//!
//! The shape is the two-level form of docs/slurm.md: the job-level
//! supervisor (`resilio run` around `srun`, the batch script's process) and
//! one rank agent per task (`srun ... resilio run -- python ...`). The kinds
//! differ in the training command, its checkpoint-resume flag, and what the
//! comments say about the framework.

use std::fmt::Write as _;

/// The frameworks a template is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Framework {
    /// torch.distributed DDP/FSDP in a plain script (torchrun's variables)
    Ddp,
    /// Megatron-LM, or NeMo's Megatron models
    Megatron,
    /// PyTorch Lightning
    Lightning,
    /// Hugging Face accelerate
    Accelerate,
}

/// What the script is generated from.
#[derive(Clone, Debug)]
pub struct Spec {
    pub kind: Framework,
    pub job_name: String,
    /// Nodes of the training step.
    pub nodes: u32,
    /// Spare nodes on top, that replace a failed node inside the allocation.
    pub spares: u32,
    /// GPUs per node, one task each (0: one task per node, no GPU request).
    pub gpus_per_node: u32,
    /// The time limit, as sbatch takes it (`24:00:00`).
    pub time: String,
    /// Seconds before the time limit at which a checkpoint is asked for
    /// (0: no pre-timeout signal).
    pub signal_lead_s: u32,
    /// Restarts allowed after failures (`--max-restarts`).
    pub max_restarts: u32,
    /// `RESILIO_STATE_DIR` (default: the site's `[run] state_dir`, else
    /// `$HOME/.local/state/resilio`).
    pub state_dir: Option<String>,
    /// The training command (default: the kind's usual one).
    pub command: Vec<String>,
}

impl Framework {
    fn name(self) -> &'static str {
        match self {
            Framework::Ddp => "ddp",
            Framework::Megatron => "megatron",
            Framework::Lightning => "lightning",
            Framework::Accelerate => "accelerate",
        }
    }

    /// The usual command and what it says about resuming.
    fn default_command(self) -> (&'static str, &'static str) {
        match self {
            Framework::Ddp => (
                "python train.py --resume auto",
                "train.py reads RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (init_process_group(\"nccl\")) and resumes from its latest checkpoint when told --resume auto",
            ),
            Framework::Megatron => (
                "python pretrain_gpt.py --load $CKPT --save $CKPT --save-interval 1000 \"$@\"",
                "Megatron-LM reads the torch.distributed variables; --load of the --save directory resumes from its latest_checkpointed_iteration.txt (NeMo: exp_manager.resume_if_exists=true)",
            ),
            Framework::Lightning => (
                "python train.py fit --ckpt_path last",
                "Lightning takes its ranks from Slurm's variables (SLURMEnvironment) with one task per GPU, and --ckpt_path last resumes from the last checkpoint",
            ),
            Framework::Accelerate => (
                "python train.py --resume auto",
                "Accelerator() reads the torch.distributed variables (no `accelerate launch` per node under srun); resume with accelerator.load_state(latest) when told --resume auto",
            ),
        }
    }
}

/// Why settings cannot make a script.
pub fn check(s: &Spec) -> Result<(), String> {
    if s.nodes == 0 {
        return Err("template: --nodes must be at least 1".into());
    }
    let name_ok = !s.job_name.is_empty()
        && s.job_name.len() <= 64
        && s.job_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !name_ok {
        return Err(format!(
            "template: --job-name '{}': letters, digits, '-', '_' and '.' only (at most 64)",
            s.job_name
        ));
    }
    let time_ok = !s.time.is_empty()
        && s.time
            .chars()
            .all(|c| c.is_ascii_digit() || c == ':' || c == '-');
    if !time_ok {
        return Err(format!(
            "template: --time '{}' is not a Slurm time (24:00:00, 1-00:00:00, 90)",
            s.time
        ));
    }
    if let Some(d) = &s.state_dir {
        if d.is_empty() || d.contains(['\n', '"', '`']) {
            return Err(format!(
                "template: --state-dir {d:?} cannot be written into a script"
            ));
        }
    }
    if s.command.iter().any(|a| a.contains('\n')) {
        return Err("template: the training command has a newline in it".into());
    }
    Ok(())
}

/// An argument as bash reads it back (quoted only when it needs to be).
fn shell_word(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// The script.
pub fn render(s: &Spec) -> String {
    let mut o = String::new();
    let total = s.nodes + s.spares;
    let per_node = s.gpus_per_node.max(1);
    let tasks = s.nodes * per_node;
    let (usual, resume_note) = s.kind.default_command();
    let command = if s.command.is_empty() {
        usual.to_string()
    } else {
        s.command
            .iter()
            .map(|a| shell_word(a))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let line = |o: &mut String, code: &str, why: &str| {
        let _ = writeln!(o, "{code:<40} # {why}");
    };
    let _ = writeln!(o, "#!/bin/bash");
    let _ = writeln!(
        o,
        "# A {} training job under resilio: written by `resilio template {}`; see docs/slurm.md.",
        s.kind.name(),
        s.kind.name()
    );
    line(
        &mut o,
        &format!("#SBATCH --job-name={}", s.job_name),
        "the job's name in squeue, sacct and the output file",
    );
    line(
        &mut o,
        &format!("#SBATCH --nodes={total}"),
        &if s.spares > 0 {
            format!(
                "{} for the training step + {} spare(s) that replace a failed node in seconds",
                s.nodes, s.spares
            )
        } else {
            "the training step's nodes (no spare: a failed node means a requeue without it)"
                .to_string()
        },
    );
    line(
        &mut o,
        &format!("#SBATCH --ntasks-per-node={per_node}"),
        if s.gpus_per_node > 0 {
            "one task (one rank) per GPU"
        } else {
            "one task (one rank) per node"
        },
    );
    if s.gpus_per_node > 0 {
        line(
            &mut o,
            &format!("#SBATCH --gpus-per-node={}", s.gpus_per_node),
            "the GPUs of each node",
        );
    }
    line(
        &mut o,
        &format!("#SBATCH --time={}", s.time),
        "the time limit",
    );
    line(
        &mut o,
        "#SBATCH --requeue",
        "let resilio requeue the job when the allocation cannot take the step again",
    );
    if s.spares > 0 {
        line(
            &mut o,
            "#SBATCH --no-kill",
            "keep the allocation when a node dies, so that a spare can take its place",
        );
    }
    if s.signal_lead_s > 0 {
        line(
            &mut o,
            &format!("#SBATCH --signal=B:USR1@{}", s.signal_lead_s),
            &format!(
                "{} s (+0-30 s) before the limit: every rank checkpoints at the same step, then a requeue",
                s.signal_lead_s
            ),
        );
    }
    line(
        &mut o,
        "#SBATCH --open-mode=append",
        "keep the output of every attempt in the one file",
    );
    line(
        &mut o,
        "#SBATCH --output=%x-%j.out",
        "that file: the job's name and id",
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "# Journals, the node history and `resilio report` live here: a filesystem every node sees."
    );
    match &s.state_dir {
        Some(dir) => {
            let _ = writeln!(
                o,
                "export RESILIO_STATE_DIR=\"${{RESILIO_STATE_DIR:-{dir}}}\""
            );
        }
        // Unset, the site's `[run] state_dir` applies, else ~/.local/state/resilio
        // (an exported default would win over the site's).
        None => {
            let _ = writeln!(
                o,
                "# (the site's [run] state_dir, else ~/.local/state/resilio; `resilio config show` prints it)\n# export RESILIO_STATE_DIR=\"$HOME/.local/state/resilio\""
            );
        }
    }
    if s.kind == Framework::Megatron && s.command.is_empty() {
        let _ = writeln!(
            o,
            "# Megatron saves and resumes here (the same directory for --save and --load)."
        );
        let _ = writeln!(
            o,
            "export CKPT=\"${{CKPT:-$PWD/checkpoints/$SLURM_JOB_NAME}}\""
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "# The job-level supervisor: this script's process (exec), it relaunches the step inside"
    );
    let _ = writeln!(
        o,
        "# the allocation without a failed node, requeues when it cannot, and stops on a user error"
    );
    let _ = writeln!(
        o,
        "# or a crash loop (up to --max-restarts). srun starts one rank agent per task, which"
    );
    let _ = writeln!(
        o,
        "# exports RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and a MASTER_PORT new"
    );
    let _ = writeln!(
        o,
        "# to each attempt, and watches its rank for crashes, hangs and stragglers."
    );
    let _ = writeln!(o, "# The training command: {resume_note}.");
    let _ = writeln!(
        o,
        "exec resilio run --max-restarts {} -- \\",
        s.max_restarts
    );
    let _ = writeln!(
        o,
        "  srun --nodes={} --ntasks={tasks} --kill-on-bad-exit=1 \\",
        s.nodes
    );
    let _ = writeln!(o, "  resilio run -- {command}");
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "# Afterwards: resilio report $SLURM_JOB_ID; resilio timeline $SLURM_JOB_ID"
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(kind: Framework) -> Spec {
        Spec {
            kind,
            job_name: "pretrain".into(),
            nodes: 4,
            spares: 1,
            gpus_per_node: 8,
            time: "24:00:00".into(),
            signal_lead_s: 300,
            max_restarts: 3,
            state_dir: None,
            command: Vec::new(),
        }
    }

    #[test]
    fn a_ddp_job_with_a_spare() {
        let t = render(&settings(Framework::Ddp));
        for want in [
            "#SBATCH --nodes=5 ",
            "#SBATCH --ntasks-per-node=8 ",
            "#SBATCH --gpus-per-node=8 ",
            "#SBATCH --requeue ",
            "#SBATCH --no-kill ",
            "#SBATCH --signal=B:USR1@300 ",
            "#SBATCH --open-mode=append ",
            "exec resilio run --max-restarts 3 -- \\\n",
            "  srun --nodes=4 --ntasks=32 --kill-on-bad-exit=1 \\\n",
            "  resilio run -- python train.py --resume auto\n",
        ] {
            assert!(t.contains(want), "{want:?} in\n{t}");
        }
        // Every #SBATCH line says why.
        for l in t.lines().filter(|l| l.starts_with("#SBATCH")) {
            assert!(l.contains(" # "), "{l}");
        }
    }

    #[test]
    fn no_spare_no_gpus_no_signal_and_a_command_of_ones_own() {
        let mut s = settings(Framework::Lightning);
        s.spares = 0;
        s.gpus_per_node = 0;
        s.signal_lead_s = 0;
        s.command = vec![
            "python3".into(),
            "t.py".into(),
            "--name".into(),
            "it's".into(),
        ];
        let t = render(&s);
        assert!(t.contains("#SBATCH --nodes=4 "));
        assert!(t.contains("#SBATCH --ntasks-per-node=1 "));
        for absent in ["--gpus-per-node", "--no-kill", "--signal"] {
            assert!(!t.contains(absent), "{absent}\n{t}");
        }
        assert!(t.contains("srun --nodes=4 --ntasks=4 "));
        assert!(
            t.contains("resilio run -- python3 t.py --name 'it'\\''s'\n"),
            "{t}"
        );
    }

    #[test]
    fn each_kind_has_its_command_and_resume() {
        assert!(render(&settings(Framework::Megatron)).contains("--load $CKPT --save $CKPT"));
        assert!(render(&settings(Framework::Megatron)).contains("export CKPT="));
        assert!(render(&settings(Framework::Lightning)).contains("--ckpt_path last"));
        assert!(render(&settings(Framework::Accelerate)).contains("Accelerator()"));
    }

    #[test]
    fn bad_settings_are_refused() {
        let mut s = settings(Framework::Ddp);
        s.job_name = "a b".into();
        assert!(check(&s).unwrap_err().contains("--job-name"));
        let mut s = settings(Framework::Ddp);
        s.time = "tomorrow".into();
        assert!(check(&s).unwrap_err().contains("--time"));
        let mut s = settings(Framework::Ddp);
        s.nodes = 0;
        assert!(check(&s).is_err());
        let mut s = settings(Framework::Ddp);
        s.state_dir = Some("/x\"; rm -rf /".into());
        assert!(check(&s).is_err());
        assert!(check(&settings(Framework::Ddp)).is_ok());
    }
}
