//! The rank agent: `resilio run -- COMMAND`.
//!
//! One event loop (a current-thread tokio runtime) owns all decisions:
//!
//! ```text
//! signals (TERM INT HUP USR1 USR2 CONT CHLD) ─┐
//! progress events (pumps, socket, file)  ─────┼─▶ loop ─▶ lifecycle ─▶ actions: journal, diagnostics, signals
//! coordinator notes, diagnostics done    ─────┤
//! timer (policy deadline, kill deadline)  ────┘
//! ```
//!
//! - [`setup`]: identity, journal, coordinator, socket, environment, the
//!   checks before the start, the trainer and its sources.
//! - [`lifecycle`]: the decisions, pure, clock injected: stall, probe,
//!   judgment, stop, grace, kill; signals; pre-timeout; coordinator loss.
//! - [`sources`]: the progress socket, output pumps, progress file, checkpoint directory.
//! - [`run`]: the loop, and the effects that carry the lifecycle's actions out.
//! - [`events`]: progress events into the stall policy, the journal and the report.
//! - [`progress_log`]: the sampled `progress` records.
//! - [`records`]: the stall's record, the diagnostics and control files.
//! - [`diagnostics`], [`health`]: what is gathered on a stall, the site
//!   health check. Process wrapping (group, subreaper, reaping, signalling
//!   the tree) is [`crate::process`], shared with local mode.
//! - [`finish`]: `rank_exit`, `failure`, the last report, the job-level decision.
//! - [`step_decision`]: the one-prefix form's decision, taken by one of the step's agents.
//!
//! The pumps (one thread per output stream) only pass bytes through and
//! report steps; the socket listener and file watcher only report. Nothing
//! but the loop touches the trainer's processes.

pub mod diagnostics;
mod ending;
mod events;
mod finish;
pub mod stacks;
pub(crate) use finish::allocation;
pub mod health;
pub mod lifecycle;
mod progress_log;
mod records;
mod run;
mod setup;
mod sources;
mod step_decision;

use crate::config::Config;
use crate::error::Result;
use crate::slurm::Slurm;
use std::ffi::OsString;

use crate::job::batch::Next;

/// What `resilio run` was asked to do.
pub struct RunOptions {
    /// The command and its arguments.
    pub argv: Vec<OsString>,
    /// The resolved configuration.
    pub config: Config,
    /// `--job-id`, if given.
    pub job_id: Option<String>,
}

/// Supervise one rank. Returns the exit code for resilio; an `Err` only
/// when the trainer could not be started. `slurm` carries out the batch
/// level's Slurm commands (requeue, exclusion, signalling the steps).
pub fn run(opts: RunOptions, slurm: &dyn Slurm) -> Result<i32> {
    // The batch script's process guards the job-level supervisor (its
    // child) rather than being it: see `crate::job::guardian`.
    let guardian = crate::job::guardian::take_link();
    if !guardian
        && crate::job::guardian::wanted(
            crate::slurm::env::SlurmContext::from_env().is_ok_and(|s| s.in_batch_script()),
        )
    {
        let d = crate::job::guardian::Decide {
            argv: &opts.argv,
            cfg: &opts.config,
            slurm,
        };
        match crate::job::guardian::run(d) {
            Some(Next::Exit(code)) => return Ok(code),
            // The guardian decided to run the step again: it starts over
            // as itself, guardian again, with the hand-over.
            Some(Next::Relaunch(r)) => return Ok(relaunch(&r)),
            None => {}
        }
    }
    let next = crate::util::runtime()?.block_on(run_async(opts, slurm))?;
    match next {
        Next::Exit(code) => Ok(code),
        Next::Relaunch(r) => Ok(relaunch(&r)),
    }
}

/// The job-level supervisor relaunches the step inside the allocation by
/// starting over as itself (same pid, same arguments: Slurm still sees the
/// batch script's process) with the hand-over in `RESILIO_RELAUNCH`. Runs
/// once the runtime, the coordinator and every file of this attempt are gone.
fn relaunch(r: &crate::slurm::step::Relaunch) -> i32 {
    use std::os::unix::process::CommandExt;
    let mut cmd = crate::util::own_binary();
    cmd.args(crate::util::args_os().into_iter().skip(1))
        .env(crate::slurm::step::ENV_RELAUNCH, r.encode());
    if let Some((k, v)) = crate::job::guardian::keep_across_exec() {
        cmd.env(k, v);
    }
    let err = cmd.exec();
    tracing::error!("cannot relaunch the step inside the allocation: {err}");
    1
}

async fn run_async(opts: RunOptions, slurm: &dyn Slurm) -> Result<Next> {
    let (rank, mut inputs) =
        match setup::setup(opts.config, opts.argv, opts.job_id.as_deref(), slurm)? {
            setup::Setup::Ready(rank, inputs) => (rank, inputs),
            setup::Setup::Done(next) => return Ok(next),
        };
    let (mut agent, mut done) = run::Agent::new(rank, slurm);
    agent.run(&mut inputs, &mut done).await;
    Ok(agent.finish().await)
}
