//! The outcome of one attempt, as the restart policies read it: its class,
//! its failure's signature (digits masked, so that `NCCL timeout after
//! 600023 ms` matches `... 600117 ms`) and text for people, its steps and
//! checkpoints.

use super::failure::Class;
use serde::Serialize;

/// The outcome of one attempt, as judged across its ranks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttemptOutcome {
    pub attempt: u32,
    pub class: Class,
    /// The deciding output line or reason, digits masked (`Xid #`), so that
    /// the same failure is recognised again. For comparison only: never
    /// shown to people (see `detail`).
    pub signature: String,
    /// The same line or reason as it was written, for people.
    pub detail: String,
    /// The highest step any rank reached in this attempt.
    pub last_step: Option<u64>,
    pub blamed_nodes: Vec<String>,
    /// The step started no rank ([`Grounds::LaunchTrouble`](super::failure::Grounds)):
    /// never the trainer's error, so never part of a crash loop.
    pub launch_trouble: bool,
    /// The rank stopped for a numerical failure whose action is a rollback
    /// (`numerical.action`).
    pub rollback: bool,
    /// A whole checkpoint newer than every one before this attempt was
    /// confirmed in it: what the next attempt starts from moved on.
    pub new_checkpoint: bool,
    /// The step of the newest whole checkpoint confirmed by the end of this
    /// attempt (in it or before), for people.
    pub last_checkpoint: Option<u64>,
    /// The step of the checkpoint the attempt started from, as far as the
    /// job level can tell (the rollback it was told, else the newest whole
    /// checkpoint before its first step): [`super::restore`]'s input.
    pub restored: Option<u64>,
    /// The attempt that saved the restored checkpoint (its latest save of
    /// that step before this attempt): a save of the same step by a later
    /// attempt is another checkpoint.
    pub restored_saved_in: Option<u32>,
    /// Where the failure began, where that is not its last step: the first
    /// bad step of a numerical failure (found some steps later).
    pub failed_from: Option<u64>,
}

impl AttemptOutcome {
    /// A numerical failure whose action is a rollback: restarted within
    /// the budget (from the checkpoint before it), not stopped.
    pub fn is_rollback(&self) -> bool {
        self.class == Class::Numerical && self.rollback
    }

    /// An outcome whose signature is taken from `evidence` (the original
    /// text is kept as `detail`).
    pub fn new(
        attempt: u32,
        class: Class,
        evidence: &str,
        last_step: Option<u64>,
        blamed_nodes: Vec<String>,
    ) -> AttemptOutcome {
        AttemptOutcome {
            attempt,
            class,
            signature: signature_of(class, evidence),
            detail: evidence.trim().to_string(),
            last_step,
            blamed_nodes,
            launch_trouble: false,
            rollback: false,
            new_checkpoint: false,
            last_checkpoint: None,
            restored: None,
            restored_saved_in: None,
            failed_from: None,
        }
    }

    /// `class: original text`, as people read it.
    pub fn shown(&self) -> String {
        if self.detail.is_empty() {
            self.class.name().to_string()
        } else {
            format!("{}: {}", self.class.name(), self.detail)
        }
    }
}

/// Mask digits so that `NCCL timeout after 600023 ms on rank 3` matches itself.
/// An exit code is kept (`exit code 134` is not `exit code 139`). For
/// comparing failures only; people see the original text.
pub fn signature_of(class: Class, evidence: &str) -> String {
    let mut masked = String::with_capacity(evidence.len());
    let mut keep = false;
    for c in evidence.chars() {
        if !c.is_ascii_digit() {
            keep = false;
            masked.push(c);
        } else if keep || masked.ends_with("exit code ") {
            keep = true;
            masked.push(c);
        } else if !masked.ends_with('#') {
            masked.push('#');
        }
    }
    format!("{}: {}", class.name(), masked.trim())
}
