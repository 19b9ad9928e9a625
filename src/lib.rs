//! resilio: a Slurm-integrated resilient job supervisor for ML training.
//!
//! # Layout
//!
//! - [`cli`]: the command line (thin; parses, dispatches, maps errors to exit codes).
//! - [`rank`]: the rank agent behind `resilio run`: setup, a pure lifecycle
//!   machine, the event loop that carries its actions out, what is gathered
//!   on a stall ([`rank::diagnostics`]) and the site health check
//!   ([`rank::health`]).
//! - [`process`]: process wrapping: own process group, child subreaper,
//!   reaping by pid, signalling the whole tree, `/proc`.
//! - [`progress`]: progress sources: output parsing ([`progress::output`]),
//!   the datagram socket ([`progress::socket`]), the progress file
//!   ([`progress::file`]), their default patterns ([`progress::patterns`]),
//!   and the tracker that decides liveness and which source names the step
//!   ([`progress::tracker`]).
//! - [`policy`]: detection and decision policies as pure functions of events
//!   and an injected clock.
//! - [`job`]: the job level: the batch-level supervisor after a step
//!   (judge, decide purely, then act through Slurm and the journal) and
//!   local mode (`--ntasks N`) with restarts in place.
//! - [`coordinator`]: one per job: agents' reports over HTTP (token), the
//!   cross-rank view (crash teardown, job-wide hang judgment, stragglers,
//!   coordinated checkpoints), `/metrics`; [`status`]: `resilio status` and
//!   `resilio checkpoint`.
//! - [`slurm`]: the Slurm adapter (environment, hostlists, commands behind a trait).
//! - [`event`]: the journal's schema, one typed struct per record kind;
//!   [`journal`]: the append-only, crash-safe per-job journal (writer,
//!   reader); [`state_dir`]: where journals live, and a site-wide state dir
//!   shared by every user; [`runs`]: telling apart the runs of a job id used
//!   more than once.
//! - [`analysis`]: what journals say after the fact: the report and ETTR
//!   accounting, timelines (text, HTML), node history, checkpoint advice.
//! - [`config`], [`duration`], [`context`], [`error`], [`log`]: configuration,
//!   durations, the rank's identity, errors and exit codes, resilio's own
//!   diagnostics.
//! - [`demo`]: `resilio demo`, a scripted run with an injected hang.
//! - [`util`]: running a command with a timeout ([`util::cmd`]) and spawning
//!   in a process group of its own that dies with resilio.
//!
//! `docs/architecture.md` follows one event from a trainer's output line to
//! a journal record.

#[macro_use]
mod names;

pub mod analysis;
pub mod cli;
pub mod config;
pub mod context;
pub mod coordinator;
pub mod demo;
pub mod device;
pub mod duration;
pub mod error;
pub mod event;
pub mod job;
pub mod journal;
pub mod log;
pub mod policy;
pub mod process;
pub mod progress;
pub mod rank;
pub mod role;
pub mod runs;
pub mod slurm;
pub mod spank;
pub mod state_dir;
pub mod status;
pub mod template;
pub mod util;
