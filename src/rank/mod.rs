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
//! - [`finish`]: `rank_exit`, `failure`, the last report; what follows is
//!   the role's ([`Finished`]: `crate::job::decider` after a rank,
//!   `crate::job::supervisor` after the job level's step).
//!
//! The job-level supervisor runs its step (srun) with the same setup
//! pieces, loop and sources, and adds its part through [`Hooks`]; the rank
//! agent knows nothing of the job level.
//!
//! The pumps (one thread per output stream) only pass bytes through and
//! report steps; the socket listener and file watcher only report. Nothing
//! but the loop touches the trainer's processes.

mod busy;
pub mod diagnostics;
mod effects;
mod ending;
mod events;
mod finish;
pub mod health;
pub mod lifecycle;
mod progress_log;
mod records;
mod run;
mod setup;
mod sources;
pub mod stacks;
mod supervised;

pub(crate) use lifecycle::Ending;
pub(crate) use run::Agent;
pub(crate) use setup::{prepare, start, Base, Child, Env, Host, Setup, Who};

use crate::config::Config;
use crate::error::Result;
use crate::policy::failure::Verdict;
use crate::slurm::Slurm;
use std::ffi::OsString;
use std::time::Duration;

/// What `resilio run` was asked to do.
pub struct RunOptions {
    /// The command and its arguments.
    pub argv: Vec<OsString>,
    /// The resolved configuration.
    pub config: Config,
    /// `--job-id`, if given.
    pub job_id: Option<String>,
}

/// What a role adds to the agent's loop: the job level's watch over its
/// step (`crate::job::supervisor`). A rank's agent adds nothing.
pub(crate) trait Hooks {
    /// Wake the loop at least this often.
    fn tick_every(&self, _a: &Agent<'_>) -> Option<Duration> {
        None
    }
    /// After each turn of the loop.
    fn tick(&mut self, _a: &mut Agent<'_>) {}
    /// A SIGTERM came, before the lifecycle hears of it.
    fn on_term(&mut self, _a: &mut Agent<'_>) {}
}

/// A rank's agent: no hooks.
pub(crate) struct NoHooks;

impl Hooks for NoHooks {}

/// The child has ended and its end is recorded and reported; the agent
/// (its journal, its hosted coordinator) is the role's for what comes after.
pub(crate) struct Finished<'a> {
    pub agent: Agent<'a>,
    pub ending: Ending,
    pub verdict: Verdict,
    /// The end reached a live coordinator.
    pub reported: bool,
}

/// How a rank's supervision ended.
pub(crate) enum Ended<'a> {
    /// The trainer never started (an unhealthy node): this exit code.
    Early(i32),
    Finished(Box<Finished<'a>>),
}

/// Supervise one rank until its trainer ended. An `Err` only when the
/// trainer could not be started.
pub(crate) async fn supervise(opts: RunOptions, slurm: &dyn Slurm) -> Result<Ended<'_>> {
    let (rank, mut inputs) = match setup::setup(opts.config, opts.argv, opts.job_id.as_deref())? {
        Setup::Ready(rank, inputs) => (rank, inputs),
        Setup::Done(code) => return Ok(Ended::Early(code)),
    };
    let (mut agent, mut done) = Agent::new(rank, slurm);
    crate::util::release_free_memory();
    agent.run(&mut inputs, &mut done, &mut NoHooks).await;
    Ok(Ended::Finished(Box::new(agent.finish().await)))
}
