//! The agent ↔ coordinator protocol (HTTP/1.1, JSON bodies, bearer token).
//!
//! - `POST /v1/report`: an agent's state ([`Report`]), about once a second
//!   and at once on a stall, a checkpoint or its exit. The reply carries the
//!   commands the agent has not seen yet ([`Reply`]).
//! - `GET /v1/commands?rank=R&after=SEQ`: long poll (up to 20 s) for commands
//!   newer than SEQ, so that a stop or checkpoint reaches every rank at once.
//! - `GET /v1/status`: the job as a whole ([`Status`]), for `resilio status`.
//! - `POST /v1/checkpoint` (`{"reason": "..."}`): ask for a coordinated
//!   checkpoint; the reply names its id and step.
//! - `GET /metrics`: Prometheus text format.
//!
//! Every request carries `Authorization: Bearer TOKEN`; others get 401,
//! before any body is read. A value out of range (a rank beyond the world
//! size, an attempt not started, a duration that is not a finite,
//! non-negative number, a step beyond 2^53 - 1) gets 400 with a one-line
//! reason (`state::JobView::check_report`). Bounds: `docs/security.md`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Protocol version, sent in every report.
pub const VERSION: u32 = 1;

/// Where a rank is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RankState {
    /// Launched, no step yet.
    #[default]
    Starting,
    Running,
    /// Its agent judged it stalled (diagnostics, then stop).
    Stalled,
    /// The trainer is gone; `exit` says how.
    Exited,
}

/// How a rank ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub code: i32,
    /// Failure class (`clean`, `user_error`, `infrastructure`, `hang`, ...).
    pub class: crate::event::Class,
    pub cause: String,
    #[serde(default)]
    pub evidence: Option<String>,
    /// The agent stopped it on request (signal from outside, or the coordinator).
    #[serde(default)]
    pub stopped: bool,
}

/// One agent's report: cumulative totals, so a lost report loses nothing.
/// Figures a report may carry.
pub const MAX_FIGURES: usize = 16;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub v: u32,
    pub rank: u32,
    pub node: String,
    pub attempt: u32,
    pub pid: u32,
    pub state: RankState,
    /// Last step seen.
    pub step: Option<u64>,
    /// Seconds since the last step, measured by the agent when it sent this
    /// (ages, not timestamps: node clocks need not agree).
    pub progress_age_s: Option<f64>,
    /// Step intervals so far in this attempt: count, sum of seconds.
    pub intervals: (u64, f64),
    /// `compute_s` values the trainer sent: count, sum of seconds.
    pub compute: (u64, f64),
    /// Current phase (`train`, `checkpoint`, `eval`).
    pub phase: String,
    /// Steps of the checkpoints the trainer confirmed (most recent last, at most 16).
    pub checkpoints: Vec<u64>,
    /// Only once `state` is `exited`.
    pub exit: Option<ExitInfo>,
    /// The probe of the trainer's threads, taken on a stall or on request:
    /// blocked on a peer (network read or poll)?
    pub waiting_on_peer: Option<bool>,
    /// Not waiting, and shown so: a stack outside any collective, or a
    /// process asleep or stopped in its own code (not merely running, as
    /// NCCL spinning on a GPU is too).
    #[serde(default)]
    pub not_waiting_shown: bool,
    /// Its trainer's CPU time moved while it was probed (it works).
    #[serde(default)]
    pub busy: bool,
    /// Stalled, and its trainer's CPU time stood still over the look at its
    /// limit, on a node without accelerators (where a rank waiting in a
    /// collective blocks rather than spins): waiting or asleep, not
    /// working. Said only where the probe could not tell whether it waits.
    #[serde(default)]
    pub idle: bool,
    pub probe: Option<String>,
    /// A probe was taken in this attempt and its result is in this report
    /// (even when it could not tell: `waiting_on_peer` is then `None`).
    #[serde(default)]
    pub probed: bool,
    /// The sequence number of the coordinator's command the probe in this
    /// report answered (0: none, or the rank's own at its stall). A probe
    /// older than the coordinator's latest ask is no evidence about the
    /// stall it asked about.
    #[serde(default)]
    pub probe_seq: u64,
    /// The rank has shown no progress of its own while the job progressed
    /// (only some ranks print): alive on the job's progress, never judged as
    /// "behind" for the steps it does not report.
    #[serde(default)]
    pub silent: bool,
    /// In a long phase (a checkpoint save, an evaluation) judged by its own
    /// limit: alive, even without new steps, for the silent ranks' sake.
    #[serde(default)]
    pub long_phase: bool,
    /// The highest command sequence number the agent has seen.
    pub commands_seen: u64,
    /// The trainer's latest figures (`loss`, `tokens_per_s_device`,
    /// `tflops`, `mfu`, ...: `progress::figures` and the socket's), finite
    /// values only, at most [`MAX_FIGURES`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub figures: BTreeMap<String, f64>,
}

/// What the coordinator asks of agents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CommandKind {
    /// Save a checkpoint at `step` and confirm with `checkpoint_done step=STEP`.
    Checkpoint { id: u64, step: u64, reason: String },
    /// Stop the trainer (TERM, grace, KILL).
    Stop { reason: String },
    /// Probe the trainer's threads now and report (a peer stalled).
    Diagnose { reason: String },
    /// Not hung after all: a peer is working without a word (busy and
    /// silent); a stalled rank goes back to being watched.
    CarryOn { reason: String },
}

/// A command with its sequence number; `ranks` empty means every rank,
/// otherwise the ranks it is for, in ascending order (a reply names only
/// the rank it goes to).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Command {
    pub seq: u64,
    pub attempt: u32,
    #[serde(default)]
    pub ranks: Vec<u32>,
    #[serde(flatten)]
    pub kind: CommandKind,
}

impl Command {
    pub fn for_rank(&self, rank: u32, attempt: u32) -> bool {
        self.attempt == attempt
            && (self.ranks.is_empty() || self.ranks.binary_search(&rank).is_ok())
    }
}

/// The commands of `commands` (ascending by `seq`) for `rank` newer than
/// `after`. A command to some ranks names only `rank` in the copy it gets
/// (a probe of every other rank of a large job would otherwise go out
/// whole in every reply).
pub fn commands_for(commands: &[Command], rank: u32, attempt: u32, after: u64) -> Vec<Command> {
    let newer = commands.partition_point(|c| c.seq <= after);
    commands[newer..]
        .iter()
        .filter(|c| c.for_rank(rank, attempt))
        .map(|c| Command {
            ranks: if c.ranks.is_empty() {
                Vec::new()
            } else {
                vec![rank]
            },
            ..c.clone()
        })
        .collect()
}

/// Reply to a report or a long poll.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub commands: Vec<Command>,
    /// Seconds since any rank of the job last made progress (replies to
    /// reports only): keeps ranks that report nothing of their own alive.
    #[serde(default)]
    pub job_progress_age_s: Option<f64>,
}

/// How many ranks a status lists at most (a job of more lists only the
/// ranks worth a look, and counts the others).
pub const STATUS_RANKS: usize = 256;

/// One rank in `resilio status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankStatus {
    pub rank: u32,
    pub node: String,
    pub state: RankState,
    pub step: Option<u64>,
    pub steps_per_s: Option<f64>,
    pub mean_step_s: Option<f64>,
    pub mean_compute_s: Option<f64>,
    pub phase: String,
    pub progress_age_s: Option<f64>,
    pub last_report_age_s: f64,
    /// The rank's latest figures (from its report).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub figures: BTreeMap<String, f64>,
    pub straggler: bool,
    /// Reports no progress of its own; alive while the job progresses.
    #[serde(default)]
    pub silent: bool,
    /// Its agent stopped reporting (`state` is what it last said).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
}

/// The live job, for `resilio status` and `GET /v1/status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub job: String,
    pub attempt: u32,
    pub world_size: u32,
    pub uptime_s: f64,
    /// The ranks: all of them up to [`STATUS_RANKS`]; past that, only
    /// those worth a look (not running, in a long phase, stragglers,
    /// silent, lost), at most [`STATUS_RANKS`].
    pub ranks: Vec<RankStatus>,
    /// Ranks heard from, listed or not.
    #[serde(default)]
    pub ranks_heard: u32,
    /// Ranks heard from but not in `ranks`.
    #[serde(default)]
    pub ranks_omitted: u32,
    /// Ranks heard from by state (`starting`, `running`, `stalled`,
    /// `exited`, `lost`).
    #[serde(default)]
    pub ranks_by_state: BTreeMap<String, u32>,
    pub step: Option<u64>,
    pub steps_per_s: Option<f64>,
    pub straggler_ranks: Vec<String>,
    pub straggler_nodes: Vec<String>,
    pub last_checkpoint: Option<CheckpointStatus>,
    pub pending_checkpoint: Option<CheckpointStatus>,
    pub restarts: u32,
    pub stalls: u64,
    pub unauthorized: u64,
    /// Tokens/s of the job: the ranks' `tokens_per_s_device` (median) ×
    /// world size (one device per rank), when printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// MFU, median over the ranks that print it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    /// The loss of the lowest rank that prints one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointStatus {
    pub id: u64,
    pub step: u64,
    pub reason: String,
    /// The ranks that confirmed it (at most [`STATUS_RANKS`] of them).
    pub confirmed: Vec<u32>,
    /// The live ranks that did not (at most [`STATUS_RANKS`] of them).
    pub missing: Vec<u32>,
    pub age_s: f64,
    /// How many confirmed, and how many did not (the lists may be cut).
    #[serde(default)]
    pub confirmed_count: usize,
    #[serde(default)]
    pub missing_count: usize,
}

/// `POST /v1/checkpoint` body.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CheckpointAsk {
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /v1/checkpoint` reply.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckpointAnswer {
    pub id: u64,
    pub step: u64,
}

/// How many ranks one node's batch may carry (a node of 8 GPUs has 8).
pub const MAX_BATCH: usize = 64;

/// `POST /v1/reports`: a node relay's batch, the latest report of each of
/// its node's ranks (see [`super::relay`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchReport {
    pub v: u32,
    pub node: String,
    pub reports: Vec<Report>,
}

/// Reply to a batch: the commands for any of its ranks that are newer than
/// that rank's `commands_seen` (each naming only the batch's ranks among
/// those it is for), and each rank's job progress age, in the batch's order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchReply {
    pub commands: Vec<Command>,
    #[serde(default)]
    pub job_progress_age_s: Vec<Option<f64>>,
    /// Reports refused (a value out of range), with the one-line reason of
    /// the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}
