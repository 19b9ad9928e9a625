//! The parts of records that are structures of their own: a decision's
//! outcome and action, the hang verdict and the ranks it judged, a settled
//! checkpoint, the checkpoint advice; and their conversions from the
//! policies' own types.

use super::{Class, Event};
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

/// What an attempt came to (`decision.outcome`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
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
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// What was done about it (`decision.decision`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Action {
    /// `finish`, `requeue`, `restart_in_allocation`, `restart_in_place`, `stop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// The coordinator's hang verdict (`hang.verdict`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HangVerdict {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
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
