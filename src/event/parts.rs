//! The parts of records that are structures of their own: a decision's
//! outcome (its action is the restart policy's own `Action`), the hang verdict and the ranks it judged, a settled
//! checkpoint, the checkpoint advice; and their conversions from the
//! policies' own types.

use super::{Class, Event};
use crate::policy::restart::AttemptOutcome;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The checkpoint interval advice: its fields are the advice's own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointIntervalAdvised {
    #[serde(flatten)]
    pub advice: Map<String, Value>,
}

impl From<CheckpointIntervalAdvised> for Event {
    fn from(e: CheckpointIntervalAdvised) -> Event {
        Event::CheckpointIntervalAdvised(e)
    }
}

/// What a step relaunched inside its allocation left out
/// (`job_start.relaunch_in_allocation`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RelaunchInAllocation {
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// What the site's health check found (`health_check.result`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthOutcome {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    /// `exit N`, `signal N`, `timed out`, or why it could not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The first lines of its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// What an attempt came to (`decision.outcome`): the restart policy's
/// [`AttemptOutcome`], every field optional as journals of every build
/// have it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<Class>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// The deciding line or reason as written, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default)]
    pub last_step: Option<u64>,
    #[serde(default)]
    pub blamed_nodes: Vec<String>,
    /// The step started no rank (absent: it did).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub launch_trouble: bool,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// The coordinator's hang verdict (`hang.verdict`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HangVerdictRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<crate::policy::hang::HangRule>,
    #[serde(default)]
    pub blamed_ranks: Vec<u32>,
    #[serde(default)]
    pub blamed_nodes: Vec<String>,
    #[serde(default)]
    pub stalled_ranks: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// A coordinated checkpoint settled (`checkpoint_complete`, `checkpoint_incomplete`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointSettled {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_ranks: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_ranks: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_to_last_confirmation_s: Option<f64>,
}

/// What the coordinator knew of one rank when it judged a hang (`hang.ranks`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HangRank {
    pub rank: u32,
    pub node: String,
    pub last_step: Option<u64>,
    /// Seconds on the coordinator's clock when its last step was seen.
    pub last_progress_s: Option<f64>,
    pub stalled: bool,
    pub exited: bool,
    pub waiting_on_peer: Option<bool>,
    pub silent: bool,
    /// What its agent's probe found, in words.
    pub probe: Option<String>,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

impl From<&AttemptOutcome> for Outcome {
    fn from(o: &AttemptOutcome) -> Outcome {
        Outcome {
            attempt: Some(o.attempt),
            class: Some(o.class),
            signature: Some(o.signature.clone()),
            detail: Some(o.detail.clone()),
            last_step: o.last_step,
            blamed_nodes: o.blamed_nodes.clone(),
            launch_trouble: o.launch_trouble,
            more: Map::new(),
        }
    }
}

impl Outcome {
    /// The restart policy's outcome of attempt `about`, as the journal
    /// kept it; `None` without a class or signature. Journals written
    /// before `detail` existed: the signature stands for it.
    pub fn of_attempt(self, about: u32) -> Option<AttemptOutcome> {
        let signature = self.signature?;
        Some(AttemptOutcome {
            attempt: about,
            class: self.class?,
            detail: self.detail.unwrap_or_else(|| signature.clone()),
            signature,
            last_step: self.last_step,
            blamed_nodes: self.blamed_nodes,
            launch_trouble: self.launch_trouble,
        })
    }
}

impl From<&crate::policy::hang::HangVerdict> for HangVerdictRecord {
    fn from(v: &crate::policy::hang::HangVerdict) -> HangVerdictRecord {
        HangVerdictRecord {
            rule: Some(v.rule),
            blamed_ranks: v.blamed_ranks.clone(),
            blamed_nodes: v.blamed_nodes.clone(),
            stalled_ranks: v.stalled_ranks.clone(),
            reason: Some(v.reason.clone()),
            more: Map::new(),
        }
    }
}

names! {
    /// How a job runs (`job_start.mode`).
    JobMode {
        /// `resilio run --ntasks N`, or a plain run outside Slurm.
        Local = "local",
        /// One rank that is the whole job.
        Single = "single",
        /// The job-level supervisor in a batch script.
        Batch = "batch",
    }

    /// What a `failure` record is about (`failure.failure_kind`).
    FailureKind {
        Stall = "stall",
        Crash = "crash",
        Signal = "signal",
        Numerical = "numerical",
        SpawnFailed = "spawn_failed",
        HealthCheck = "health_check",
        /// A rank whose agent died and left no record of its own.
        AgentDied = "agent_died",
        /// Slurm's accounting says the node failed (NODE_FAIL).
        NodeFailure = "node_failure",
        /// Slurm ended the allocation otherwise (from its accounting).
        Slurm = "slurm",
    }

    /// When the site health check ran (`health_check.when`).
    HealthWhen {
        BeforeStart = "before_start",
        AfterFailure = "after_failure",
    }

    /// Who requeued the job (`requeue.by`; absent: resilio after a failure).
    RequeueBy {
        /// At an allocation's start, for the node history.
        NodeHistory = "node_history",
        /// Slurm itself (a node failure without `--no-kill`, a preemption).
        Slurm = "slurm",
    }
}
