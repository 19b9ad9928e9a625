//! The job level: what happens above the ranks once a step (or, in local
//! mode, an attempt of every rank) has ended.
//!
//! - [`batch`]: the batch-level `resilio run` around `srun` in the batch
//!   script: after a step, judge, decide, act; at an allocation's start,
//!   reconcile attempts Slurm ended alone and leave out the nodes the node
//!   history lists.
//! - [`local`]: local mode (`resilio run --ntasks N`, and a plain `resilio
//!   run` outside Slurm): N agents, the coordinator, restarts in place.

pub mod batch;
pub mod local;
