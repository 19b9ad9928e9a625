//! What to do after an attempt ended: finish, requeue (excluding blamed
//! nodes), or stop. Pure: the history of attempts and the budget in, an
//! action out.

use super::failure::Class;
use serde::Serialize;

/// The outcome of one attempt, as judged across its ranks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttemptOutcome {
    pub attempt: u32,
    pub class: Class,
    /// The deciding output line or reason, digits masked (`Xid #`), so that
    /// the same failure is recognised again.
    pub signature: String,
    /// The highest step any rank reached in this attempt.
    pub last_step: Option<u64>,
    pub blamed_nodes: Vec<String>,
}

/// Mask digits so that `NCCL timeout after 600023 ms on rank 3` matches itself.
pub fn signature_of(class: Class, evidence: &str) -> String {
    let mut masked = String::with_capacity(evidence.len());
    for c in evidence.chars() {
        if !c.is_ascii_digit() {
            masked.push(c);
        } else if !masked.ends_with('#') {
            masked.push('#');
        }
    }
    format!("{}: {}", class.name(), masked.trim())
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Nothing failed.
    Finish,
    /// Requeue the job, excluding these nodes first.
    Requeue {
        exclude: Vec<String>,
        reason: String,
    },
    /// Do not requeue; the failure stands.
    Stop { reason: String },
}

/// Decide after `current`, given the earlier attempts (oldest first).
pub fn decide(
    current: &AttemptOutcome,
    earlier: &[AttemptOutcome],
    max_restarts: u32,
    requeue_allowed: bool,
) -> Action {
    let stop = |reason: String| Action::Stop { reason };
    match current.class {
        Class::Clean => return Action::Finish,
        Class::UserError => {
            return stop(format!(
                "user error ({}): not requeued, a restart would fail the same way",
                current.signature
            ))
        }
        _ => {}
    }
    if !requeue_allowed {
        return stop(
            "the job cannot be requeued (submitted without --requeue, or JobRequeue=0): submit with `sbatch --requeue`"
                .into(),
        );
    }
    if current.class == Class::Preempted {
        // A time limit or preemption is not a failure: it costs no budget.
        return Action::Requeue {
            exclude: Vec::new(),
            reason: "stopped by Slurm (time limit or preemption): requeued to continue".into(),
        };
    }
    let failures: Vec<&AttemptOutcome> = earlier
        .iter()
        .filter(|a| a.class.retryable() && a.class != Class::Preempted)
        .collect();
    if failures.len() as u32 >= max_restarts {
        return stop(format!(
            "restart budget exhausted: {} failed attempt(s) before this one, --max-restarts {max_restarts}",
            failures.len()
        ));
    }
    if current.class == Class::Unknown {
        if let Some(prev) = failures.iter().find(|a| a.signature == current.signature) {
            return stop(format!(
                "crash loop: the same unexplained failure ({}) as attempt {}: taken for the trainer's own error",
                current.signature, prev.attempt
            ));
        }
    }
    if let Some(prev) = failures.last() {
        if current.signature == prev.signature && current.last_step == prev.last_step {
            return stop(format!(
                "crash loop: the same failure ({}) at the same step as attempt {}",
                current.signature, prev.attempt
            ));
        }
        // "No new step" needs a step in this attempt: an attempt that failed
        // before its first step (a node failing its health check) is no loop.
        let best_before = earlier.iter().filter_map(|a| a.last_step).max();
        if best_before.is_some() && current.last_step.is_some() && current.last_step <= best_before
        {
            return stop(format!(
                "crash loop: no new step since attempt {} (best step {})",
                prev.attempt,
                best_before.map_or("-".into(), |s| s.to_string())
            ));
        }
    }
    let exclude = current.blamed_nodes.clone();
    Action::Requeue {
        reason: format!(
            "{} ({}){}",
            current.class.name(),
            current.signature,
            if exclude.is_empty() {
                String::new()
            } else {
                format!(", excluding {}", exclude.join(","))
            }
        ),
        exclude,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(
        attempt: u32,
        class: Class,
        evidence: &str,
        step: Option<u64>,
        nodes: &[&str],
    ) -> AttemptOutcome {
        AttemptOutcome {
            attempt,
            class,
            signature: signature_of(class, evidence),
            last_step: step,
            blamed_nodes: nodes.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn infrastructure_failure_requeues_excluding_the_node() {
        let a = decide(
            &out(
                0,
                Class::Infrastructure,
                "killed by SIGKILL",
                Some(40),
                &["n2"],
            ),
            &[],
            3,
            true,
        );
        assert!(
            matches!(&a, Action::Requeue { exclude, .. } if exclude == &["n2"]),
            "{a:?}"
        );
        let a = decide(
            &out(
                0,
                Class::Hang,
                "stopped for making no progress",
                Some(40),
                &["n3"],
            ),
            &[],
            3,
            true,
        );
        assert!(matches!(a, Action::Requeue { .. }));
    }

    #[test]
    fn user_errors_and_unrequeueable_jobs_stop() {
        let a = decide(
            &out(0, Class::UserError, "KeyError: 'x'", Some(3), &[]),
            &[],
            3,
            true,
        );
        assert!(matches!(&a, Action::Stop { reason } if reason.starts_with("user error")));
        let a = decide(
            &out(0, Class::Infrastructure, "x", Some(3), &["n1"]),
            &[],
            3,
            false,
        );
        assert!(matches!(&a, Action::Stop { reason } if reason.contains("--requeue")));
        assert_eq!(
            decide(&out(0, Class::Clean, "", Some(9), &[]), &[], 3, true),
            Action::Finish
        );
    }

    #[test]
    fn crash_loops_and_budgets_stop() {
        let first = out(
            0,
            Class::Infrastructure,
            "NCCL timeout after 600023 ms",
            Some(50),
            &["n2"],
        );
        // Same failure at the same step again: crash loop.
        let again = out(
            1,
            Class::Infrastructure,
            "NCCL timeout after 600117 ms",
            Some(50),
            &["n3"],
        );
        let a = decide(&again, std::slice::from_ref(&first), 3, true);
        assert!(
            matches!(&a, Action::Stop { reason } if reason.starts_with("crash loop")),
            "{a:?}"
        );
        // A different failure but no new step: crash loop too.
        let stuck = out(
            1,
            Class::Infrastructure,
            "killed by SIGKILL",
            Some(48),
            &["n3"],
        );
        assert!(matches!(
            decide(&stuck, std::slice::from_ref(&first), 3, true),
            Action::Stop { .. }
        ));
        // Progress since: requeue.
        let better = out(
            1,
            Class::Infrastructure,
            "killed by SIGKILL",
            Some(90),
            &["n3"],
        );
        assert!(matches!(
            decide(&better, std::slice::from_ref(&first), 3, true),
            Action::Requeue { .. }
        ));
        // Failing before the first step is not "no progress".
        let early = out(
            1,
            Class::Infrastructure,
            "health check failed",
            None,
            &["n4"],
        );
        assert!(matches!(
            decide(&early, std::slice::from_ref(&first), 3, true),
            Action::Requeue { .. }
        ));
        // Budget: 2 failures already with max 2.
        let a = decide(
            &out(2, Class::Infrastructure, "a", Some(200), &[]),
            &[first.clone(), better.clone()],
            2,
            true,
        );
        assert!(
            matches!(&a, Action::Stop { reason } if reason.contains("budget")),
            "{a:?}"
        );
    }

    #[test]
    fn preemption_costs_no_budget() {
        let t = out(0, Class::Preempted, "time limit", Some(10), &[]);
        let a = decide(
            &t,
            &[out(0, Class::Infrastructure, "a", Some(5), &[])],
            1,
            true,
        );
        assert!(matches!(&a, Action::Requeue { exclude, .. } if exclude.is_empty()));
        assert_eq!(
            signature_of(Class::Hang, "step 120 of 400"),
            "hang: step # of #"
        );
    }

    #[test]
    fn an_unexplained_failure_gets_one_restart_and_the_same_again_stops() {
        let first = out(0, Class::Unknown, "exit code 1", Some(5), &[]);
        assert!(matches!(
            decide(&first, &[], 3, true),
            Action::Requeue { .. }
        ));
        // The same failure later, even at a new step: a crash loop.
        let again = out(1, Class::Unknown, "exit code 1", Some(9), &[]);
        match decide(&again, std::slice::from_ref(&first), 3, true) {
            Action::Stop { reason } => assert!(reason.contains("crash loop"), "{reason}"),
            other => panic!("{other:?}"),
        }
        // A different one after it is still worth a restart.
        let other = out(1, Class::Unknown, "RuntimeError: flaky", Some(9), &[]);
        assert!(matches!(
            decide(&other, &[first], 3, true),
            Action::Requeue { .. }
        ));
    }
}
