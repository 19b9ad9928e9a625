//! One rank's entry in the coordinator's view: its latest report, when it
//! was heard, and whether its probe is evidence about the stall judged now.

use super::*;

pub(super) struct Entry {
    pub report: Report,
    pub heard: Instant,
    pub last_step_at: Option<Instant>,
    pub lost: bool,
    /// Its probe answers the coordinator's latest ask. A rank stalled
    /// itself is asked too: its stall's probe is evidence until it
    /// answers, and the judgment waits for the answer (its stall's probe
    /// is older than the others').
    pub probe_answered: bool,
    /// Its latest report came through its node's relay.
    pub relayed: bool,
}

/// What a rank's probe says, when it is fresh ([`Entry::probe_fresh`]);
/// nothing when it is not.
#[derive(Clone, Copy, Default)]
pub(super) struct ProbeSays {
    pub probed: bool,
    pub waiting_on_peer: Option<bool>,
    pub not_waiting_shown: bool,
    pub busy: bool,
    pub idle: bool,
}

impl Entry {
    pub fn probe_says(&self) -> ProbeSays {
        if !self.probe_fresh() {
            return ProbeSays::default();
        }
        let r = &self.report;
        ProbeSays {
            probed: r.probed,
            waiting_on_peer: r.waiting_on_peer,
            not_waiting_shown: r.not_waiting_shown,
            busy: r.busy,
            idle: r.idle,
        }
    }

    /// Its probe answers the coordinator's latest ask (or is its own, at
    /// its stall): evidence about the stall being judged. An older one
    /// (a busy evaluation's, a stall ago) is not.
    pub fn probe_fresh(&self) -> bool {
        self.report.state == RankState::Stalled || self.probe_answered
    }

    /// Whether `report`'s probe answers the ask of seq `asked`.
    pub fn answers(report: &Report, asked: u64) -> bool {
        report.probe_seq >= asked
    }
}
