//! `resilio run`: the options, the configuration they resolve to, and the
//! role the process plays (see [`crate::role`]).

use super::{flag_duration, flag_timeout, usage};
use crate::config::{self, Config};
use crate::error::Result;
use crate::rank::RunOptions;
use clap::Args;
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(super) struct RunArgs {
    /// Configuration file (TOML), applied over /etc/resilio/resilio.toml
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where journals live [env: RESILIO_STATE_DIR] [default: $XDG_STATE_HOME/resilio, else ~/.local/state/resilio]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Fixed stall timeout between steps (e.g. 90s, 5m); "adaptive" to learn it
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    stall_timeout: Option<String>,
    /// Allowed time from launch to the first step (default 30m)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    startup_timeout: Option<String>,
    /// Adaptive stall limit: never below this (default 20s)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    stall_floor: Option<String>,
    /// Allowed duration of an evaluation the trainer announces (default 30m)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    eval_timeout: Option<String>,
    /// Allowed duration of a checkpoint save the trainer announces (default 30m)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    checkpoint_timeout: Option<String>,
    /// Observe only: detect, judge and decide as usual, journal and report what would have been done, stop and restart nothing
    #[arg(long)]
    observe: bool,
    /// Regex over output lines; capture group 1 (or `step`) is the step
    #[arg(long, value_name = "RE")]
    progress_regex: Option<String>,
    /// A file the trainer rewrites as it progresses
    #[arg(long, value_name = "FILE")]
    progress_file: Option<PathBuf>,
    /// Time between SIGTERM and SIGKILL when stopping the trainer (default 30s; 0: SIGKILL at once)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    kill_grace: Option<String>,
    /// Signal sent to the trainer on a stall so it dumps its stacks (e.g. SIGUSR2)
    #[arg(long, value_name = "SIG")]
    dump_signal: Option<String>,
    /// Restarts allowed after failures: in place outside Slurm, inside the allocation or by requeue in a batch script (default 3; 0: one attempt)
    #[arg(long, value_name = "N")]
    max_restarts: Option<u32>,
    /// Job id outside Slurm (under Slurm it is SLURM_JOB_ID)
    #[arg(long, value_name = "ID")]
    job_id: Option<String>,
    /// Local mode: launch N ranks on this machine (torchrun variables set),
    /// with a coordinator and in-place restarts (--max-restarts); without
    /// it, outside Slurm, the command is one such rank
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    ntasks: Option<u32>,
    /// Local mode with several ranks: prefix each output line with its rank
    /// ("0: "), as `srun --label` does (off: output passes byte for byte)
    #[arg(long, requires = "ntasks")]
    label: bool,
    /// The command to supervise
    #[arg(last = true, value_name = "COMMAND", num_args = 0..)]
    command: Vec<OsString>,
}

pub(super) fn resolve_run_config(a: &RunArgs) -> Result<Config> {
    let mut cfg = Config::load(a.config.as_deref())?;
    if let Some(d) = &a.state_dir {
        cfg.state_dir = d.clone();
    }
    // A site-wide state dir (mode 1777): this user's own directory in it.
    cfg.state_dir = crate::state_dir::for_writer(&cfg.state_dir).map_err(usage)?;
    // Under a job level (a batch script's `resilio run`, or `#SBATCH
    // --resilio`), a rank journals where the job level reads: a state dir
    // exported inside the script after it started would split the journal,
    // and the job level would judge blind (trial 6).
    if let Some(above) = crate::job::step_level::job_level_state_dir() {
        if std::path::absolute(&cfg.state_dir).ok().as_ref() != Some(&above) {
            if std::env::var("SLURM_PROCID").as_deref().unwrap_or("0") == "0" {
                tracing::warn!(
                    "the state dir {} differs from the job level's {} (RESILIO_STATE_DIR changed inside the batch script?): journaling to the job level's, which judges this job",
                    cfg.state_dir.display(),
                    above.display()
                );
            }
            cfg.state_dir = crate::state_dir::for_writer(&above).map_err(usage)?;
        }
    }
    if let Some(t) = &a.stall_timeout {
        cfg.stall.fixed_timeout = if t.trim() == "adaptive" {
            None
        } else {
            Some(flag_timeout(
                "stall-timeout",
                t,
                "; 'adaptive' learns it from the steps",
            )?)
        };
    }
    if let Some(t) = &a.startup_timeout {
        cfg.stall.startup_timeout = flag_timeout("startup-timeout", t, "")?;
    }
    if a.observe {
        cfg.observe = true;
    }
    if let Some(t) = &a.stall_floor {
        cfg.stall.adaptive_floor = flag_timeout("stall-floor", t, "")?;
    }
    if let Some(t) = &a.eval_timeout {
        cfg.stall.eval_timeout = flag_timeout("eval-timeout", t, "")?;
    }
    if let Some(t) = &a.checkpoint_timeout {
        cfg.stall.checkpoint_timeout = flag_timeout("checkpoint-timeout", t, "")?;
    }
    if let Some(re) = &a.progress_regex {
        cfg.progress.regex =
            config::compile_regex(re).map_err(|e| usage(format!("--progress-regex: {e}")))?;
    }
    if let Some(f) = &a.progress_file {
        cfg.progress.file = Some(f.clone());
    }
    if let Some(n) = a.max_restarts {
        cfg.max_restarts = n;
    }
    if let Some(t) = &a.kill_grace {
        cfg.kill_grace = flag_duration("kill-grace", t)?;
    }
    if let Some(s) = &a.dump_signal {
        cfg.diagnostics.dump_signal =
            Some(config::parse_signal(s).map_err(|e| usage(format!("--dump-signal: {e}")))?);
    }
    Ok(cfg)
}

/// The flags every rank's agent gets from the local launcher.
pub(super) fn agent_args(a: &RunArgs, cfg: &Config) -> Vec<OsString> {
    let mut v: Vec<OsString> = Vec::new();
    let mut put = |flag: &str, value: Option<OsString>| {
        if let Some(x) = value {
            v.push(format!("--{flag}").into());
            v.push(x);
        }
    };
    put("config", a.config.clone().map(Into::into));
    put("state-dir", Some(cfg.state_dir.clone().into()));
    put("stall-timeout", a.stall_timeout.clone().map(Into::into));
    put("startup-timeout", a.startup_timeout.clone().map(Into::into));
    put("stall-floor", a.stall_floor.clone().map(Into::into));
    put("eval-timeout", a.eval_timeout.clone().map(Into::into));
    put(
        "checkpoint-timeout",
        a.checkpoint_timeout.clone().map(Into::into),
    );
    put("progress-regex", a.progress_regex.clone().map(Into::into));
    put("progress-file", a.progress_file.clone().map(Into::into));
    put("kill-grace", a.kill_grace.clone().map(Into::into));
    put("dump-signal", a.dump_signal.clone().map(Into::into));
    if a.observe || cfg.observe {
        v.push("--observe".into());
    }
    v
}

/// `resilio run`: the role decided, then run.
pub(super) fn run_cmd(a: RunArgs) -> Result<i32> {
    if a.command.is_empty() {
        return Err(usage(
            "run: no command given (usage: resilio run [OPTIONS] -- COMMAND [ARGS...])",
        ));
    }
    let config = resolve_run_config(&a)?;
    match crate::role::of(a.ntasks)? {
        crate::role::Role::LocalLauncher { ntasks } => {
            let agent_args = agent_args(&a, &config);
            // Outside Slurm a plain run is local mode with one rank:
            // restarts in place within --max-restarts, and a
            // coordinator for `resilio status` / `resilio checkpoint`.
            let job_id = a.job_id.or_else(|| {
                (a.ntasks.is_none())
                    .then(|| std::env::var("RESILIO_JOB_ID").ok())
                    .flatten()
                    .filter(|j| !j.is_empty())
            });
            crate::job::local::run(crate::job::local::LocalOptions {
                argv: a.command,
                config,
                job_id,
                ntasks,
                agent_args,
                label: a.label && a.ntasks.is_some(),
            })
        }
        crate::role::Role::Supervising(role) => crate::role::run(
            role,
            RunOptions {
                argv: a.command,
                config,
                job_id: a.job_id,
            },
            &crate::slurm::SlurmCli::default(),
        ),
    }
}
