//! A stall looked into (its diagnostics taken, the coordinator's verdict
//! awaited) ends early when the trainer steps or works again.

use super::*;
use crate::policy::stall::StallKind;

impl Lifecycle {
    /// Stalled, its stall still looked into (its diagnostics taken, the
    /// coordinator's judgment awaited), the trainer alive: a step now
    /// still withdraws it ([`Self::on_progress_while_stalled`]).
    pub fn judging(&self) -> bool {
        self.main_exit.is_none()
            && matches!(
                self.state,
                State::Stalled {
                    step: StallStep::Diagnosing { .. } | StallStep::AwaitingJudgment { .. },
                    ..
                }
            )
    }

    /// The trainer stepped past its stall's last step while the stall was
    /// looked into (the collective it waited in let go a moment after its
    /// limit: a peer's evaluation ended): the stall is withdrawn, at once or
    /// once its diagnostics are done. A stop the coordinator asked for
    /// meanwhile still stands.
    pub fn on_progress_while_stalled(&mut self, now: Instant) -> Vec<Order> {
        let Some(step) = self.policy.last_step() else {
            return Vec::new();
        };
        let (before, at) = match &self.state {
            State::Stalled { stall, step, .. } if self.judging() => (stall.last_step, *step),
            _ => return Vec::new(),
        };
        if before.is_some_and(|b| step <= b) {
            return Vec::new();
        }
        let reason =
            format!("the trainer stepped again (step {step}) while its stall was looked into");
        match at {
            StallStep::Diagnosing { .. } => {
                self.carry_on.get_or_insert(reason);
                Vec::new()
            }
            _ => self.carry_on_now(reason, now),
        }
    }

    /// Waiting for the coordinator's verdict on its stall (its diagnostics
    /// done).
    pub fn awaiting_judgment(&self) -> bool {
        self.main_exit.is_none()
            && matches!(
                self.state,
                State::Stalled {
                    step: StallStep::AwaitingJudgment { .. },
                    ..
                }
            )
    }

    /// The trainer, found not working at its step limit, is found working
    /// in its own code while the verdict is awaited (`how`: the probe's
    /// evidence): the wait that stalled it is over (the barrier let go, and
    /// it went into a save that prints nothing). The stall is withdrawn.
    /// Not a long phase's limit, nor startup's: there the trainer may work
    /// and still be stuck (a loop that never ends).
    pub fn on_work_while_stalled(&mut self, now: Instant, how: String) -> Vec<Order> {
        let step_limit = matches!(
            &self.state,
            State::Stalled { stall, .. } if matches!(stall.kind, StallKind::Step { .. })
        );
        if !self.awaiting_judgment() || !step_limit {
            return Vec::new();
        }
        let reason = format!(
            "the trainer works again while its stall is judged ({how}): the wait that stalled it is over"
        );
        self.carry_on_now(reason, now)
    }
}
