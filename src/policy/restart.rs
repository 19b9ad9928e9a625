//! What to do after an attempt ended: finish, requeue (excluding blamed
//! nodes), restart in place (local mode), or stop. Pure: the history of
//! attempts and the budget in, an action out.
//!
//! Failures are compared by their *signature* (digits masked, so that
//! `NCCL timeout after 600023 ms` matches `... 600117 ms`); people are
//! shown the original text (`detail`), never the masked one.

use super::failure::Class;
pub use super::outcome::{signature_of, AttemptOutcome};
use serde::{Deserialize, Serialize};

/// The decision, as the journal's `decision` record keeps it (tagged by
/// `action`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Nothing failed.
    Finish,
    /// Requeue the job, excluding these nodes first.
    Requeue {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        exclude: Vec<String>,
        #[serde(default)]
        reason: String,
    },
    /// Relaunch the step inside the job's allocation (the job-level
    /// supervisor holds it), leaving out `exclude` and running on `nodes` nodes.
    RestartInAllocation {
        #[serde(default)]
        exclude: Vec<String>,
        #[serde(default)]
        nodes: u32,
        #[serde(default)]
        reason: String,
    },
    /// Local mode (`resilio run` outside Slurm): start every rank again on
    /// this machine. There is no queue and no node to leave out.
    RestartInPlace {
        #[serde(default)]
        reason: String,
    },
    /// Do not requeue; the failure stands.
    Stop {
        #[serde(default)]
        reason: String,
        /// Stopped because restarts brought no progress
        /// ([`Budget::no_progress`]): the job ends with
        /// [`EXIT_NO_PROGRESS`](crate::error::EXIT_NO_PROGRESS).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        no_progress: bool,
    },
    /// An action a later build wrote (read from a journal; never decided).
    #[serde(other)]
    Unknown,
}

impl Action {
    /// The action's name as the journal writes it.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Finish => "finish",
            Action::Requeue { .. } => "requeue",
            Action::RestartInAllocation { .. } => "restart_in_allocation",
            Action::RestartInPlace { .. } => "restart_in_place",
            Action::Stop { .. } => "stop",
            Action::Unknown => "unknown",
        }
    }

    /// Why, where the action has a reason (finishing has none).
    pub fn reason(&self) -> Option<&str> {
        match self {
            Action::Requeue { reason, .. }
            | Action::RestartInAllocation { reason, .. }
            | Action::RestartInPlace { reason }
            | Action::Stop { reason, .. } => Some(reason),
            Action::Finish | Action::Unknown => None,
        }
    }
}

/// Where the job runs again after a failure, which decides the words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    /// A Slurm job: back to the queue (or, decided by the caller, inside the allocation).
    Slurm,
    /// Local mode: restarted in place on this machine.
    Local,
}

/// The allocation a job-level supervisor holds, as far as relaunching the
/// step inside it is concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocation {
    /// Every node of the allocation.
    pub nodes: Vec<String>,
    /// Nodes already left out of the step by earlier relaunches in it.
    pub excluded: Vec<String>,
    /// Nodes the step command leaves out itself (the user's own `srun
    /// --exclude`): never spare, but not excluded from the job by a requeue.
    pub withheld: Vec<String>,
    /// Nodes the step ran on (0: unknown, taken as every node not excluded).
    pub step_nodes: u32,
    /// Whether the step command can be told to leave nodes out (`srun`
    /// without a fixed node list).
    pub can_exclude: bool,
}

/// Where a failed step runs again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Relaunch {
    /// In the allocation, on `nodes` nodes, leaving out `exclude` (which
    /// includes the nodes excluded by earlier relaunches).
    InAllocation { exclude: Vec<String>, nodes: u32 },
    /// Back to the queue: `why` the allocation cannot take the step again.
    Requeue { exclude: Vec<String>, why: String },
}

/// Decide where a failed step runs again, given the nodes blamed for the
/// failure. A time limit or preemption ends the allocation, so the job
/// goes back to the queue; otherwise the step is relaunched inside the
/// allocation when enough nodes remain once the blamed ones are left out.
pub fn relaunch_where(alloc: &Allocation, blamed: &[String], class: Class) -> Relaunch {
    let mut exclude: Vec<String> = alloc.excluded.clone();
    for n in blamed {
        if !exclude.contains(n) {
            exclude.push(n.clone());
        }
    }
    let requeue = |why: String| Relaunch::Requeue {
        exclude: exclude.clone(),
        why,
    };
    if class == Class::Preempted {
        return requeue("a time limit or preemption ends the allocation".into());
    }
    let newly: Vec<&String> = blamed
        .iter()
        .filter(|n| !alloc.excluded.contains(n))
        .collect();
    if !newly.is_empty() && !alloc.can_exclude {
        return requeue(
            "the step command is not `srun` without a fixed node list, so it cannot leave the blamed node out"
                .into(),
        );
    }
    let inside: Vec<&String> = alloc
        .nodes
        .iter()
        .filter(|n| !exclude.contains(n) && !alloc.withheld.contains(n))
        .collect();
    let needed = if alloc.step_nodes == 0 {
        alloc
            .nodes
            .iter()
            .filter(|n| !alloc.excluded.contains(n) && !alloc.withheld.contains(n))
            .count() as u32
    } else {
        alloc.step_nodes
    };
    if needed == 0 || (inside.len() as u32) < needed {
        return requeue(format!(
            "no spare node: the allocation has {} node(s), the step needs {needed}, {} left out",
            alloc.nodes.len(),
            exclude.len()
        ));
    }
    Relaunch::InAllocation {
        exclude,
        nodes: needed,
    }
}

/// What bounds the restarts of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Failed attempts that may be run again (`[run] max_restarts`).
    pub max_restarts: u32,
    /// Restarts in a row that may bring no progress (no whole checkpoint
    /// newer than the last, no step beyond the best before) before the job
    /// is stopped, whatever their failures (`[run] no_progress_restarts`;
    /// 0: never).
    pub no_progress: u32,
}

impl Budget {
    /// `[run] no_progress_restarts` unless set.
    pub const NO_PROGRESS: u32 = 3;
}

impl From<u32> for Budget {
    /// `max_restarts`, and the default limit on restarts without progress.
    fn from(max_restarts: u32) -> Budget {
        Budget {
            max_restarts,
            no_progress: Budget::NO_PROGRESS,
        }
    }
}

/// Why a job cannot go back to the queue.
pub const NOT_REQUEUEABLE: &str =
    "the job cannot be requeued (an interactive srun, or submitted without --requeue, or JobRequeue=0): submit with `sbatch --requeue`";

/// Decide after `current`, given the earlier attempts (oldest first), for a
/// Slurm job: requeue or stop.
pub fn decide(
    current: &AttemptOutcome,
    earlier: &[AttemptOutcome],
    budget: impl Into<Budget>,
    requeue_allowed: bool,
) -> Action {
    decide_scoped(
        current,
        earlier,
        budget.into(),
        requeue_allowed,
        Scope::Slurm,
    )
}

/// The same for local mode (`resilio run` outside Slurm, one rank or
/// `--ntasks N`): restart in place or stop. A stop from outside (a signal)
/// is never undone by a restart.
pub fn decide_in_place(
    current: &AttemptOutcome,
    earlier: &[AttemptOutcome],
    budget: impl Into<Budget>,
) -> Action {
    decide_scoped(current, earlier, budget.into(), true, Scope::Local)
}

fn decide_scoped(
    current: &AttemptOutcome,
    earlier: &[AttemptOutcome],
    budget: Budget,
    requeue_allowed: bool,
    scope: Scope,
) -> Action {
    if let Some(s) = super::restore::suspect(current, earlier) {
        return from_before(current, earlier, budget, requeue_allowed, scope, &s);
    }
    if let Some(action) = by_class(current, scope) {
        return action;
    }
    if !requeue_allowed {
        return stop(NOT_REQUEUEABLE.into());
    }
    if current.class == Class::Preempted {
        // A time limit or preemption is not a failure: it costs no budget.
        return Action::Requeue {
            exclude: Vec::new(),
            reason: "stopped by Slurm (time limit or preemption): requeued to continue".into(),
        };
    }
    if let Some(action) = no_progress(current, earlier, budget.no_progress)
        .or_else(|| beyond_budget(earlier, budget.max_restarts))
        .or_else(|| crash_loop(current, earlier))
    {
        return action;
    }
    if scope == Scope::Local {
        return Action::RestartInPlace {
            reason: current.shown(),
        };
    }
    let exclude = current.blamed_nodes.clone();
    Action::Requeue {
        reason: format!(
            "{}{}",
            current.shown(),
            if exclude.is_empty() {
                String::new()
            } else {
                format!(", excluding {}", exclude.join(","))
            }
        ),
        exclude,
    }
}

/// A failure blamed on the checkpoint it restored
/// ([`super::restore::suspect`]): run again, the next attempt told to load
/// the checkpoint before it, whatever the failure's class (a NaN or a user
/// error included), within the budget; stopped when a trainer told so
/// before loaded it again.
fn from_before(
    current: &AttemptOutcome,
    earlier: &[AttemptOutcome],
    budget: Budget,
    requeue_allowed: bool,
    scope: Scope,
    s: &super::restore::Suspect,
) -> Action {
    let why = s.why(current);
    if let Some(b) = s.told_before {
        return stop(format!(
            "{why}; the trainer was told to load a checkpoint before step {b} (RESILIO_ROLLBACK_STEP) and did not: stopped rather than load it again"
        ));
    }
    if !requeue_allowed {
        return stop(format!("{why}; {NOT_REQUEUEABLE}"));
    }
    if let Some(action) = no_progress(current, earlier, budget.no_progress)
        .or_else(|| beyond_budget(earlier, budget.max_restarts))
    {
        return action;
    }
    let reason =
        format!("{why}; the next attempt is told to load an earlier one (RESILIO_ROLLBACK_STEP)");
    match scope {
        Scope::Local => Action::RestartInPlace { reason },
        Scope::Slurm => Action::Requeue {
            exclude: current.blamed_nodes.clone(),
            reason,
        },
    }
}

/// A stop for `reason` (not [`no_progress`]'s).
pub fn stop(reason: String) -> Action {
    Action::Stop {
        reason,
        no_progress: false,
    }
}

/// The classes that decide by themselves: a clean end finishes; a user
/// error, a numerical failure (unless it asked for a rollback) and, locally,
/// a stop from outside stop.
fn by_class(current: &AttemptOutcome, scope: Scope) -> Option<Action> {
    let not_done = match scope {
        Scope::Slurm => "not requeued",
        Scope::Local => "not restarted",
    };
    match current.class {
        Class::Clean => Some(Action::Finish),
        Class::UserError => Some(stop(format!(
            "user error ({}): {not_done}, a restart would fail the same way",
            current.detail
        ))),
        Class::Numerical if !current.is_rollback() => Some(stop(format!(
            "numerical failure ({}): {not_done}, the same checkpoint and data would diverge the same way",
            current.detail
        ))),
        Class::Preempted if scope == Scope::Local => Some(stop(
            "stopped from outside (a signal to resilio or to the trainer): not restarted".into(),
        )),
        _ => None,
    }
}

/// The failed attempts before this one that count against the budget.
fn budgeted(earlier: &[AttemptOutcome]) -> impl Iterator<Item = &AttemptOutcome> {
    earlier.iter().filter(|a| {
        (a.class.retryable() || a.is_rollback() || super::restore::failed_soon(a).is_some())
            && a.class != Class::Preempted
    })
}

fn beyond_budget(earlier: &[AttemptOutcome], max_restarts: u32) -> Option<Action> {
    let failed = budgeted(earlier).count();
    (failed as u32 >= max_restarts).then(|| {
        stop(format!(
            "restart budget exhausted: {failed} failed attempt(s) before this one, --max-restarts {max_restarts}"
        ))
    })
}

/// A crash loop: the same unexplained failure again, or the same failure
/// at the same step. (Different failures that get nowhere are
/// [`no_progress`]'s.)
fn crash_loop(current: &AttemptOutcome, earlier: &[AttemptOutcome]) -> Option<Action> {
    // Launch trouble (a step that started no rank) is not the trainer's:
    // it neither is nor ends a crash loop; only the budget holds.
    if current.launch_trouble {
        return None;
    }
    let failures: Vec<&AttemptOutcome> = budgeted(earlier).filter(|a| !a.launch_trouble).collect();
    if current.class == Class::Unknown {
        if let Some(prev) = failures.iter().find(|a| a.signature == current.signature) {
            return Some(stop(format!(
                "crash loop: the same unexplained failure ({}) as attempt {}: taken for the trainer's own error",
                current.shown(),
                prev.attempt
            )));
        }
    }
    let prev = failures.last()?;
    if current.signature == prev.signature && current.last_step == prev.last_step {
        return Some(stop(format!(
            "crash loop: the same failure ({}) at the same step as attempt {}",
            current.shown(),
            prev.attempt
        )));
    }
    None
}

/// Whether `a` moved the job on: a whole checkpoint newer than any before
/// it, or a step beyond the best of every attempt before it.
fn progressed(a: &AttemptOutcome, before: &[AttemptOutcome]) -> bool {
    let best = before
        .iter()
        .filter(|b| b.attempt < a.attempt)
        .filter_map(|b| b.last_step)
        .max();
    a.new_checkpoint || a.last_step > best
}

/// No progress: the last `limit` restarts (this attempt's failure the
/// latest) each ended without a whole checkpoint newer than the last and
/// without a step beyond the best before it, whatever their failures
/// looked like (an OOM, then a hang, then an NCCL error). A launch that
/// started no rank and a preemption are neither progress nor its lack.
/// The first attempt is no restart.
fn no_progress(current: &AttemptOutcome, earlier: &[AttemptOutcome], limit: u32) -> Option<Action> {
    if limit == 0 || current.launch_trouble || current.class == Class::Preempted {
        return None;
    }
    let mut all: Vec<AttemptOutcome> = earlier
        .iter()
        .filter(|a| a.attempt < current.attempt)
        .cloned()
        .collect();
    all.push(current.clone());
    all.sort_by_key(|a| a.attempt);
    let mut stuck: Vec<&AttemptOutcome> = Vec::new();
    for a in all.iter().rev() {
        if a.attempt == 0 || progressed(a, &all) {
            break;
        }
        if a.launch_trouble || a.class == Class::Preempted {
            continue;
        }
        stuck.push(a);
    }
    if (stuck.len() as u32) < limit {
        return None;
    }
    stuck.reverse();
    let best = all
        .iter()
        .filter(|a| a.attempt < stuck[0].attempt)
        .filter_map(|a| a.last_step)
        .max();
    let checkpoint = all
        .iter()
        .filter(|a| a.attempt < stuck[0].attempt)
        .filter_map(|a| a.last_checkpoint)
        .max();
    let failures: Vec<String> = stuck
        .iter()
        .map(|a| format!("attempt {}: {}", a.attempt, a.class.name()))
        .collect();
    Some(Action::Stop {
        reason: format!(
            "no progress: {} restart{} in a row brought {} and {} ({}); no_progress_restarts = {limit}",
            stuck.len(),
            if stuck.len() == 1 { "" } else { "s" },
            checkpoint.map_or("no checkpoint".into(), |s| format!(
                "no checkpoint beyond step {s}"
            )),
            best.map_or("no step".into(), |s| format!("no step beyond step {s}")),
            failures.join(", ")
        ),
        no_progress: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(nodes: &[&str], excluded: &[&str], step_nodes: u32, can_exclude: bool) -> Allocation {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        Allocation {
            nodes: v(nodes),
            excluded: v(excluded),
            withheld: Vec::new(),
            step_nodes,
            can_exclude,
        }
    }

    #[test]
    fn a_spare_node_takes_the_blamed_nodes_place() {
        let n2 = vec!["n2".to_string()];
        let a = alloc(&["n1", "n2", "n3", "n4"], &[], 3, true);
        assert_eq!(
            relaunch_where(&a, &n2, Class::Infrastructure),
            Relaunch::InAllocation {
                exclude: n2.clone(),
                nodes: 3
            }
        );
        // Nobody blamed: the same nodes again, even without a spare.
        let full = alloc(&["n1", "n2", "n3"], &[], 3, false);
        assert_eq!(
            relaunch_where(&full, &[], Class::Unknown),
            Relaunch::InAllocation {
                exclude: vec![],
                nodes: 3
            }
        );
        // No spare: back to the queue, excluding the node there.
        assert!(matches!(
            relaunch_where(&alloc(&["n1", "n2", "n3"], &[], 3, true), &n2, Class::Hang),
            Relaunch::Requeue { exclude, why } if exclude == n2 && why.starts_with("no spare node")
        ));
        // Earlier exclusions in this allocation count, and carry over to a requeue.
        let used = alloc(&["n1", "n2", "n3", "n4"], &["n4"], 3, true);
        assert!(matches!(
            relaunch_where(&used, &n2, Class::Infrastructure),
            Relaunch::Requeue { exclude, .. } if exclude == ["n4", "n2"]
        ));
        assert_eq!(
            relaunch_where(&used, &[], Class::Unknown),
            Relaunch::InAllocation {
                exclude: vec!["n4".into()],
                nodes: 3
            }
        );
        // A step the supervisor cannot steer away from a node.
        assert!(matches!(
            relaunch_where(&alloc(&["n1", "n2", "n3", "n4"], &[], 3, false), &n2, Class::Infrastructure),
            Relaunch::Requeue { why, .. } if why.contains("not `srun`")
        ));
        // A time limit ends the allocation.
        assert!(matches!(
            relaunch_where(&a, &[], Class::Preempted),
            Relaunch::Requeue { .. }
        ));
        // Nodes the user's own srun --exclude withholds are no spare, and a
        // requeue does not exclude them from the job.
        let mut held = alloc(&["n1", "n2", "n3", "n4", "n5"], &[], 3, true);
        held.withheld = vec!["n1".into()];
        assert_eq!(
            relaunch_where(&held, &n2, Class::Infrastructure),
            Relaunch::InAllocation {
                exclude: n2.clone(),
                nodes: 3
            }
        );
        held.withheld = vec!["n1".into(), "n5".into()];
        assert!(matches!(
            relaunch_where(&held, &n2, Class::Infrastructure),
            Relaunch::Requeue { exclude, .. } if exclude == n2
        ));
        // Unknown step size: every node not excluded, so no spare.
        assert!(matches!(
            relaunch_where(
                &alloc(&["n1", "n2", "n3", "n4"], &[], 0, true),
                &n2,
                Class::Infrastructure
            ),
            Relaunch::Requeue { .. }
        ));
    }

    #[test]
    fn a_numerical_failure_stops_unless_it_is_a_rollback_within_the_budget() {
        let nan = out(
            0,
            Class::Numerical,
            "loss nan since step 30 (3 steps in a row)",
            Some(37),
            &[],
        );
        assert!(
            matches!(decide_in_place(&nan, &[], 3), Action::Stop { reason, .. } if reason.starts_with("numerical failure"))
        );
        let spike = |a, step| {
            AttemptOutcome {
            rollback: true,
            ..out(
                a,
                Class::Numerical,
                "rollback: loss 9.1 is 10.0x its running median 0.9 since step 130 (3 steps in a row)",
                Some(step),
                &[],
            )
        }
        };
        assert!(spike(0, 133).is_rollback() && !nan.is_rollback());
        assert!(matches!(
            decide_in_place(&spike(0, 133), &[], 3),
            Action::RestartInPlace { .. }
        ));
        // The budget counts rollbacks.
        assert!(matches!(
            decide_in_place(&spike(1, 260), &[spike(0, 133)], 1),
            Action::Stop { reason, .. } if reason.starts_with("restart budget exhausted")
        ));
        // Rolled back and spiking again before getting further: rolled
        // back again, until the restarts in a row without progress...
        assert!(matches!(
            decide_in_place(&spike(1, 131), &[spike(0, 133)], 3),
            Action::RestartInPlace { .. }
        ));
        let two = Budget {
            max_restarts: 5,
            no_progress: 2,
        };
        assert!(matches!(
            decide_in_place(&spike(2, 132), &[spike(0, 133), spike(1, 131)], two),
            Action::Stop {
                no_progress: true,
                ..
            }
        ));
        // ... or the same spike at the same step: a loop.
        assert!(matches!(
            decide_in_place(&spike(1, 133), &[spike(0, 133)], 3),
            Action::Stop { reason, .. } if reason.starts_with("crash loop")
        ));
        // Further on, a new spike is rolled back again.
        assert!(matches!(
            decide_in_place(&spike(1, 260), &[spike(0, 133)], 3),
            Action::RestartInPlace { .. }
        ));
    }

    fn out(
        attempt: u32,
        class: Class,
        evidence: &str,
        step: Option<u64>,
        nodes: &[&str],
    ) -> AttemptOutcome {
        AttemptOutcome::new(
            attempt,
            class,
            evidence,
            step,
            nodes.iter().map(|s| s.to_string()).collect(),
        )
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
        assert!(matches!(&a, Action::Stop { reason, .. } if reason.starts_with("user error")));
        let a = decide(
            &out(0, Class::Infrastructure, "x", Some(3), &["n1"]),
            &[],
            3,
            false,
        );
        assert!(matches!(&a, Action::Stop { reason, .. } if reason.contains("--requeue")));
        assert_eq!(
            decide(&out(0, Class::Clean, "", Some(9), &[]), &[], 3, true),
            Action::Finish
        );
    }

    #[test]
    fn launch_trouble_is_never_a_crash_loop_but_spends_the_budget() {
        let launch = |attempt| AttemptOutcome {
            launch_trouble: true,
            ..out(
                attempt,
                Class::Infrastructure,
                "launch trouble: no rank of the step reported within 300 s of srun's start",
                None,
                &[],
            )
        };
        let crash = out(
            0,
            Class::Infrastructure,
            "NCCL timeout after 600023 ms",
            Some(50),
            &["n2"],
        );
        // The step started no rank twice after a crash: no loop either time.
        assert!(matches!(
            decide(&launch(1), std::slice::from_ref(&crash), 5, true),
            Action::Requeue { .. }
        ));
        assert!(matches!(
            decide(&launch(2), &[crash.clone(), launch(1)], 5, true),
            Action::Requeue { .. }
        ));
        // Nor does it make the trainer's next failure a loop ("no new step",
        // "the same failure at the same step" look past it) ...
        let again = out(3, Class::Infrastructure, "Xid 79", Some(60), &["n3"]);
        assert!(matches!(
            decide(&again, &[crash.clone(), launch(1), launch(2)], 5, true),
            Action::Requeue { .. }
        ));
        let same = out(
            3,
            Class::Infrastructure,
            "NCCL timeout after 600117 ms",
            Some(50),
            &["n3"],
        );
        assert!(matches!(
            decide(&same, &[crash.clone(), launch(1), launch(2)], 5, true),
            Action::Stop { reason, .. } if reason.starts_with("crash loop")
        ));
        // ... and it counts against the budget like any restart.
        assert!(matches!(
            decide(&launch(3), &[crash, launch(1), launch(2)], 3, true),
            Action::Stop { reason, .. } if reason.starts_with("restart budget exhausted")
        ));
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
            matches!(&a, Action::Stop { reason, .. } if reason.starts_with("crash loop")),
            "{a:?}"
        );
        // A different failure and no new step: no loop (no_progress_restarts
        // holds it, below).
        let stuck = out(
            1,
            Class::Infrastructure,
            "killed by SIGKILL",
            Some(48),
            &["n3"],
        );
        assert!(matches!(
            decide(&stuck, std::slice::from_ref(&first), 3, true),
            Action::Requeue { .. }
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
            matches!(&a, Action::Stop { reason, .. } if reason.contains("budget")),
            "{a:?}"
        );
    }

    #[test]
    fn restarts_that_bring_no_progress_stop_whatever_their_failures() {
        let budget = Budget {
            max_restarts: 10,
            no_progress: 3,
        };
        let at = |a, class, evidence, step| out(a, class, evidence, step, &[]);
        // Attempt 0 reached step 100 (its checkpoint at 90); then an OOM, a
        // hang and an NCCL error, none past step 100, none saving anew.
        let first = AttemptOutcome {
            last_checkpoint: Some(90),
            ..at(0, Class::Infrastructure, "Xid 79", Some(100))
        };
        let oom = at(1, Class::Infrastructure, "killed by SIGKILL", Some(97));
        let hang = at(2, Class::Hang, "no progress for 600 s", Some(95));
        let nccl = at(3, Class::Infrastructure, "NCCL watchdog timeout", Some(99));
        let a = decide(&hang, &[first.clone(), oom.clone()], budget, true);
        assert!(matches!(a, Action::Requeue { .. }), "{a:?}");
        let a = decide(
            &nccl,
            &[first.clone(), oom.clone(), hang.clone()],
            budget,
            true,
        );
        let Action::Stop {
            reason,
            no_progress: true,
        } = &a
        else {
            panic!("{a:?}")
        };
        assert_eq!(
            reason,
            "no progress: 3 restarts in a row brought no checkpoint beyond step 90 and no step beyond step 100 (attempt 1: infrastructure, attempt 2: hang, attempt 3: infrastructure); no_progress_restarts = 3"
        );
        // Before the budget: restarts in vain say so, not "budget exhausted".
        let a = decide(&nccl, &[first.clone(), oom.clone(), hang.clone()], 3, true);
        assert!(
            matches!(
                a,
                Action::Stop {
                    no_progress: true,
                    ..
                }
            ),
            "{a:?}"
        );
        // A newer whole checkpoint in any of them is progress...
        let saved = AttemptOutcome {
            new_checkpoint: true,
            ..hang.clone()
        };
        let a = decide(&nccl, &[first.clone(), oom.clone(), saved], budget, true);
        assert!(matches!(a, Action::Requeue { .. }), "{a:?}");
        // ... and so is a step beyond the best before (then the count
        // starts again).
        let further = at(2, Class::Hang, "no progress for 600 s", Some(101));
        let a = decide(&nccl, &[first.clone(), oom.clone(), further], budget, true);
        assert!(matches!(a, Action::Requeue { .. }), "{a:?}");
        // Launch trouble and preemption count neither way.
        let launch = AttemptOutcome {
            launch_trouble: true,
            ..at(2, Class::Infrastructure, "launch trouble", None)
        };
        let pre = at(3, Class::Preempted, "time limit", Some(98));
        let nccl5 = at(5, Class::Infrastructure, "NCCL watchdog timeout", Some(99));
        let hang4 = at(4, Class::Hang, "no progress for 600 s", Some(95));
        let a = decide(
            &hang4,
            &[first.clone(), oom.clone(), launch.clone(), pre.clone()],
            budget,
            true,
        );
        assert!(matches!(a, Action::Requeue { .. }), "{a:?}");
        let a = decide(
            &nccl5,
            &[first.clone(), oom, launch, pre, hang4],
            budget,
            true,
        );
        assert!(
            matches!(
                a,
                Action::Stop {
                    no_progress: true,
                    ..
                }
            ),
            "{a:?}"
        );
        // Attempts that never reached a step: no progress either.
        let none = |a| {
            let why = ["", "ECC errors", "GPU lost", "no InfiniBand port up"][a as usize];
            at(a, Class::Infrastructure, why, None)
        };
        let a = decide(&none(3), &[first.clone(), none(1), none(2)], budget, true);
        assert!(
            matches!(
                a,
                Action::Stop {
                    no_progress: true,
                    ..
                }
            ),
            "{a:?}"
        );
        // 0: never.
        let off = Budget {
            max_restarts: 10,
            no_progress: 0,
        };
        let a = decide(&none(3), &[first, none(1), none(2)], off, true);
        assert!(matches!(a, Action::Requeue { .. }), "{a:?}");
    }

    #[test]
    fn a_decision_to_stop_for_no_progress_says_so_in_the_journal() {
        let a = Action::Stop {
            reason: "no progress".into(),
            no_progress: true,
        };
        let j = serde_json::to_value(&a).unwrap();
        assert_eq!(j["no_progress"], true);
        assert_eq!(serde_json::from_value::<Action>(j).unwrap(), a);
        // Any other stop leaves it out, as journals before it.
        let j = serde_json::to_value(stop("x".into())).unwrap();
        assert!(j.get("no_progress").is_none());
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
            Action::Stop { reason, .. } => assert!(reason.contains("crash loop"), "{reason}"),
            other => panic!("{other:?}"),
        }
        // A different one after it is still worth a restart.
        let other = out(1, Class::Unknown, "RuntimeError: flaky", Some(9), &[]);
        assert!(matches!(
            decide(&other, &[first], 3, true),
            Action::Requeue { .. }
        ));
        // A segfault, then an abort: two failures, not one (trial 16: both
        // were `exit code #`).
        let segv = out(
            0,
            Class::Unknown,
            "exit code 139 (SIGSEGV) with no known signature",
            Some(14),
            &[],
        );
        let abort = out(
            1,
            Class::Unknown,
            "exit code 134 (SIGABRT) with no known signature",
            Some(15),
            &[],
        );
        assert!(matches!(
            decide(&abort, &[segv], 3, true),
            Action::Requeue { .. }
        ));
        assert_eq!(
            signature_of(Class::Unknown, "exit code 134 after 12 s"),
            "unknown: exit code 134 after # s"
        );
    }

    #[test]
    fn people_see_the_original_text_never_the_masked_one() {
        let first = out(
            0,
            Class::Infrastructure,
            "NCCL timeout after 600023 ms on rank 3",
            Some(50),
            &["n2"],
        );
        assert_eq!(
            first.signature,
            "infrastructure: NCCL timeout after # ms on rank #"
        );
        assert_eq!(first.detail, "NCCL timeout after 600023 ms on rank 3");
        let reasons = |a: Action| match a {
            Action::Requeue { reason, .. }
            | Action::RestartInAllocation { reason, .. }
            | Action::RestartInPlace { reason }
            | Action::Stop { reason, .. } => reason,
            Action::Finish | Action::Unknown => String::new(),
        };
        let r = reasons(decide(&first, &[], 3, true));
        assert!(r.contains("600023 ms on rank 3") && !r.contains('#'), "{r}");
        // The crash loop is recognised on the masked signature, told in the original words.
        let again = out(
            1,
            Class::Infrastructure,
            "NCCL timeout after 600117 ms on rank 3",
            Some(50),
            &["n3"],
        );
        let r = reasons(decide(&again, std::slice::from_ref(&first), 3, true));
        assert!(r.starts_with("crash loop") && r.contains("600117"), "{r}");
        assert!(!r.contains('#'), "{r}");
        let oom = out(
            0,
            Class::UserError,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB",
            Some(3),
            &[],
        );
        let r = reasons(decide_in_place(&oom, &[], 3));
        assert!(r.contains("Tried to allocate 2.50 GiB"), "{r}");
        assert!(r.contains("not restarted") && !r.contains("requeue"), "{r}");
    }

    #[test]
    fn local_mode_restarts_in_place_and_never_requeues() {
        let hang = out(
            0,
            Class::Hang,
            "rank 0 stopped at step 3 with no other rank still running to compare it with",
            Some(3),
            &["ws1"],
        );
        assert_eq!(
            decide_in_place(&hang, &[], 3),
            Action::RestartInPlace {
                reason: "hang: rank 0 stopped at step 3 with no other rank still running to compare it with".into()
            }
        );
        // The same hang at the same step: a crash loop, in local mode too.
        let again = AttemptOutcome {
            attempt: 1,
            ..hang.clone()
        };
        assert!(matches!(
            decide_in_place(&again, std::slice::from_ref(&hang), 3),
            Action::Stop { reason, .. } if reason.starts_with("crash loop")
        ));
        // The budget.
        assert!(matches!(
            decide_in_place(&hang, &[], 0),
            Action::Stop { reason, .. } if reason.contains("budget")
        ));
        // A stop from outside is not undone by a restart.
        let stopped = out(0, Class::Preempted, "", Some(3), &[]);
        assert!(matches!(
            decide_in_place(&stopped, &[], 3),
            Action::Stop { reason, .. } if reason.contains("from outside") && !reason.contains("requeue")
        ));
        // The journal's name of the action.
        let v = serde_json::to_value(Action::RestartInPlace { reason: "x".into() }).unwrap();
        assert_eq!(v["action"], "restart_in_place");
    }
}
