//! Which part a `resilio run` process plays, decided once, here, from its
//! command line and environment; each role's module does the rest.
//!
//! ```text
//! batch script:  Guardian ──starts──▶ JobLevel ──srun──▶ Rank (one per task)
//! one prefix:    srun ──▶ Rank (one of them decides for the step: job::decider)
//! SPANK plugin:  slurmstepd ──▶ Rank (the task's command rewritten, crate::spank)
//! local mode:    LocalLauncher ──▶ Rank (N of them, restarted in place)
//! ```
//!
//! The flow runs one way: a role starts the ones to its right and hears
//! from them through the coordinator and the journal, never the reverse.

use crate::error::{Error, Result};
use crate::rank::RunOptions;
use crate::slurm::Slurm;

/// The part a `resilio run` process plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `resilio run --ntasks N`, or a plain run outside Slurm: starts N
    /// rank agents and their coordinator, restarts them in place
    /// ([`crate::job::local`]).
    LocalLauncher { ntasks: u32 },
    /// A role that supervises what Slurm (or a launcher) started: run by
    /// [`run`].
    Supervising(Supervisor),
}

/// The roles [`run`] runs, from the resolved options (the local launcher
/// runs from the command line's own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Supervisor {
    /// The batch script's own process: holds the job up while the job-level
    /// supervisor, its child, may die ([`crate::job::guardian`]).
    Guardian,
    /// The job-level supervisor in a batch script, around srun
    /// ([`crate::job::supervisor`]).
    JobLevel,
    /// One rank's agent: a task of a step, or a rank a launcher started
    /// ([`crate::rank`], then [`crate::job::decider`]).
    Rank,
}

/// The role, from `--ntasks` and the environment. Takes the guardian's
/// link out of the environment (once, before any thread starts).
pub fn of(ntasks: Option<u32>) -> Result<Role> {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if let Some(n) = ntasks {
        if set("SLURM_JOB_ID") && std::env::var_os("SLURM_STEP_ID").is_some() {
            return Err(Error::Usage(
                "run: --ntasks is local mode; inside a Slurm step, srun starts the ranks".into(),
            ));
        }
        return Ok(Role::LocalLauncher { ntasks: n });
    }
    if runs_locally() {
        return Ok(Role::LocalLauncher { ntasks: 1 });
    }
    let guarded = crate::job::guardian::take_link();
    let in_batch_script =
        crate::slurm::env::SlurmContext::from_env().is_ok_and(|s| s.in_batch_script());
    Ok(Role::Supervising(if !in_batch_script {
        Supervisor::Rank
    } else if !guarded && crate::job::guardian::wanted(true) {
        Supervisor::Guardian
    } else {
        Supervisor::JobLevel
    }))
}

/// Whether a plain `resilio run` (no `--ntasks`) is a job of its own on
/// this machine, run as local mode with one rank. Not under Slurm (a task
/// of a step, or the job-level supervisor), not a rank agent started by a
/// launcher (the local one, or a coordinator's), and not one rank of a
/// bigger job started by another launcher (torchrun's `WORLD_SIZE` > 1).
fn runs_locally() -> bool {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    let world = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|w| w.trim().parse::<u32>().ok())
        .unwrap_or(1);
    !set("SLURM_JOB_ID")
        && !set("SLURM_STEP_ID")
        && !set(crate::job::local::ENV_LAUNCHER)
        && !set(crate::coordinator::ENV_URL)
        && world <= 1
}

/// Run a supervising role. Returns resilio's exit code.
pub fn run(role: Supervisor, opts: RunOptions, slurm: &dyn Slurm) -> Result<i32> {
    match role {
        Supervisor::Guardian => {
            let d = crate::job::guardian::Decide {
                argv: &opts.argv,
                cfg: &opts.config,
                slurm,
            };
            match crate::job::guardian::run(d) {
                Some(crate::job::batch::Next::Exit(code)) => Ok(code),
                // The guardian decided to run the step again: it starts over
                // as itself, guardian again, with the hand-over.
                Some(crate::job::batch::Next::Relaunch(r)) => {
                    Ok(crate::job::supervisor::relaunch(&r))
                }
                // It could not start the supervisor: this process is it
                // (fail open).
                None => crate::job::supervisor::run(opts, slurm),
            }
        }
        Supervisor::JobLevel => crate::job::supervisor::run(opts, slurm),
        Supervisor::Rank => crate::util::runtime()?.block_on(async {
            Ok(match crate::rank::supervise(opts, slurm).await? {
                crate::rank::Ended::Early(code) => code,
                crate::rank::Ended::Finished(fin) => crate::job::decider::after_rank(*fin).await,
            })
        }),
    }
}
