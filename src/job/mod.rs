//! The job level: what happens above the ranks once a step (or, in local
//! mode, an attempt of every rank) has ended. Facts are read, a pure
//! decision is taken from them, and then it is carried out:
//!
//! - [`judge`]: which failure of an attempt was primary, from the ranks'
//!   journals and srun's lines (pure).
//! - [`decide`]: the decisions, pure: after an attempt, at an allocation's
//!   start (the node history, allocations Slurm ended alone), how many
//!   nodes a requeue may exclude.
//! - [`act`]: carrying them out: journal records, Slurm calls, stderr.
//! - [`retry`]: the schedule a Slurm call is tried again on.
//! - [`batch`]: the job level's judgment and decision after a step, and at
//!   an allocation's start, wiring the above together.
//! - [`supervisor`]: the job-level supervisor, `resilio run -- srun ...` in
//!   a batch script: its step runs under the rank agent's child, loop and
//!   sources ([`crate::rank`]), with the job's part added.
//! - [`guardian`]: the batch script's process under Slurm, above the
//!   job-level supervisor: its death leaves the job and the step running.
//! - [`step_level`]: the one-prefix form (`srun resilio run -- CMD` with
//!   no job level above it): the step's agents judge and decide, one of them.
//! - [`decider`]: after a rank's end, that decision, or the job's end when
//!   the rank is the whole job.
//! - [`local`]: local mode (`resilio run --ntasks N`, and a plain `resilio
//!   run` outside Slurm): N agents, the coordinator, restarts in place
//!   (`crate::job::local` is its old path).

pub mod act;
pub mod batch;
pub mod decide;
pub mod decider;
pub mod guardian;
pub mod judge;
pub mod local;
pub mod retry;
pub mod rollback;
pub mod step_level;
pub mod supervisor;
