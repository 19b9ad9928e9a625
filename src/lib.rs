//! resilio: a Slurm-integrated resilient job supervisor for ML training.
//!
//! # Layout
//!
//! - [`cli`]: the command line (thin; parses, dispatches, maps errors to exit codes).
//! - [`rank`]: the rank agent behind `resilio run` (also reachable as
//!   `agent`): setup, a pure lifecycle machine, and the event loop that
//!   carries its actions out.
//! - [`process`]: process wrapping: own process group, child subreaper,
//!   reaping by pid, signalling the whole tree.
//! - [`progress`]: progress sources: output parsing ([`progress::output`]),
//!   the datagram socket ([`progress::socket`]), the progress file
//!   ([`progress::file`]), their default patterns ([`progress::patterns`]),
//!   and the tracker that decides liveness and which source names the step
//!   ([`progress::tracker`]).
//! - [`policy`]: detection policies as pure functions of events and an injected clock.
//! - [`diagnostics`]: what is gathered on a stall (output tail, py-spy, dump signal).
//! - [`health`]: the optional site health check, before start and after a failure.
//! - [`slurm`]: the Slurm adapter (environment, hostlists, commands behind a trait).
//! - [`supervisor`]: the job-level decision after a step: judge, decide, requeue, exclude.
//! - [`coordinator`]: one per job: agents' reports over HTTP (token), the
//!   cross-rank view (crash teardown, job-wide hang judgment, stragglers,
//!   coordinated checkpoints), `/metrics`; [`launcher`]: local mode
//!   (`--ntasks N`) with restarts in place; [`status`]: `resilio status` and
//!   `resilio checkpoint`; [`advice`]: the advised checkpoint interval
//!   the hosts hand the coordinator (read from journals and node history).
//! - [`journal`]: the append-only, crash-safe per-job journal; [`state_dir`]:
//!   where journals live, and a site-wide state dir shared by every user.
//! - [`report`]: reports and timelines computed from journals alone; [`runs`]:
//!   telling apart the runs of a job id used more than once.
//! - [`config`], [`duration`], [`context`], [`error`]: configuration, durations,
//!   the rank's identity, errors and exit codes.
//! - [`demo`]: `resilio demo`, a scripted run with an injected hang.
//! - [`util`]: running a command with a timeout ([`util::cmd`]) and spawning
//!   in a process group of its own that dies with resilio.
//!
//! `docs/architecture.md` follows one event from a trainer's output line to
//! a journal record.

pub mod accounting;
pub mod advice;
pub mod cli;
pub mod config;
pub mod context;
pub mod coordinator;
pub mod demo;
pub mod duration;
pub mod error;
pub mod journal;
pub mod launcher;
pub mod node_history;
pub mod policy;
pub mod progress;
pub mod rank;
pub mod report;
pub mod report_html;
pub mod runs;
pub mod slurm;
pub mod state_dir;
pub mod status;
pub mod supervisor;
pub mod util;

/// The rank agent under its former name.
pub use rank as agent;
/// The rank agent's process wrapping, diagnostics and health check, by their short paths.
pub use rank::{diagnostics, health, process};
