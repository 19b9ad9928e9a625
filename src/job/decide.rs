//! The job level's decisions, pure: facts in, a decision out. Nothing here
//! writes the journal, calls Slurm, prints or reads a clock; [`super::act`]
//! carries the decisions out.
//!
//! - After an attempt: [`decide`] (a batch-level supervisor: restart inside
//!   the allocation, requeue, or stop) and [`decide_local`] (local mode:
//!   restart in place or stop), both from [`judge::judge_attempt`].
//! - How many nodes a requeue may exclude: [`limit_exclusion`].
//! - At an allocation's start: what the node history asks
//!   ([`plan_at_start`]), and what an earlier allocation nobody decided on
//!   looked like to Slurm ([`seen_by_slurm`]).
//!
//! One fact is asked lazily: whether the job can be requeued (`scontrol
//! show job`). It is handed in as a closure and asked only where the
//! decision depends on it, so a decision that does not need it costs no
//! Slurm call.

use super::judge::{self, StepEnd};
use crate::analysis::node_history::NodeHistory;
use crate::event::Event;
use crate::journal::{self, Record};
use crate::policy::failure::{Class, Grounds, Judgment, RankFailure};
use crate::policy::restart::{self, Action, Allocation, AttemptOutcome, Budget, Relaunch};
use crate::policy::restore;
use crate::slurm::{AcctRecord, JobInfo, NodeInfo};

/// The judgment and decision on one attempt: what [`super::act`] journals
/// (`judgment`, `decision`) and carries out.
#[derive(Clone, Debug)]
pub struct Decision {
    pub judgment: Judgment,
    /// The primary failure.
    pub primary: RankFailure,
    pub outcome: AttemptOutcome,
    /// The primary failure's evidence (or its reason when it has none).
    pub evidence: String,
    /// The other failures, as the `judgment` record lists them.
    pub secondary: Vec<String>,
    pub action: Action,
    /// The checkpoint this attempt restored, blamed for its failure
    /// ([`crate::policy::restore`]).
    pub suspect: Option<u64>,
    /// Every checkpoint blamed so far, this attempt's included: none is
    /// loaded again ([`super::rollback::plan_rollback`]).
    pub blamed: Vec<restore::Blamed>,
}

/// What a batch-level supervisor decides an attempt from.
pub struct Facts<'a> {
    /// The journal of this run, every rank's and the supervisor's.
    pub records: &'a [Record],
    pub attempt: u32,
    pub step: &'a StepEnd<'a>,
    pub budget: Budget,
    /// The allocation the step can be relaunched in (`None`: only requeues).
    pub alloc: Option<&'a Allocation>,
}

/// Judge the attempt and decide with the restart policy. `None` when
/// nothing failed. With an allocation, a restart happens inside it when it
/// can take the step again. `requeueable` is asked only when the decision
/// depends on it.
pub fn decide(facts: &Facts<'_>, requeueable: impl FnOnce() -> bool) -> Option<Decision> {
    let Facts {
        records,
        attempt,
        step,
        budget,
        alloc,
    } = *facts;
    decide_with(records, attempt, step, &[], |outcome, earlier| {
        choose(
            outcome,
            earlier,
            budget,
            step.pre_timeout,
            alloc,
            requeueable,
        )
    })
}

/// The job's exit code after a failure it decided on, in local mode and at
/// the batch level alike (there the batch script's, so what `sacct` shows):
/// 124 for a hang (as a stall ends, as timeout(1)), even when the culprit
/// was stopped by the coordinator, not by its agent; else the primary
/// rank's own non-zero code (65 for a numerical stop, the trainer's own for
/// a crash); else `fallback` (under Slurm srun's, which is that of whichever
/// task it saw end worst, often one it stopped itself: 143).
pub fn failure_exit_code(d: &Decision, primary_code: Option<i32>, fallback: i32) -> i32 {
    if matches!(
        d.action,
        Action::Stop {
            no_progress: true,
            ..
        }
    ) {
        return crate::error::EXIT_NO_PROGRESS;
    }
    if d.outcome.class == Class::Hang {
        return crate::error::EXIT_STALLED;
    }
    primary_code.filter(|c| *c != 0).unwrap_or(fallback)
}

/// [`failure_exit_code`] with the primary rank's code from its `rank_exit`
/// in the journal of `attempt`.
pub fn job_exit_code(d: &Decision, records: &[Record], attempt: u32, srun_code: i32) -> i32 {
    let primary = journal::events(records)
        .filter(|(r, _)| r.attempt == attempt && r.rank == Some(d.primary.rank))
        .filter_map(|(_, e)| match e {
            Event::RankExit(x) => Some(x.exit_code),
            _ => None,
        })
        .filter(|c| *c != 0)
        .last();
    failure_exit_code(d, primary, srun_code)
}

/// The batch-level action for a judged outcome.
fn choose(
    outcome: &AttemptOutcome,
    earlier: &[AttemptOutcome],
    budget: Budget,
    pre_timeout: bool,
    alloc: Option<&Allocation>,
    requeueable: impl FnOnce() -> bool,
) -> Action {
    if outcome.class == Class::Preempted && !pre_timeout {
        // Stopped from outside with no warning: scancel, or a time limit the
        // job did not ask to be warned of. Requeueing would undo a cancel.
        return restart::stop(
            "stopped from outside (scancel, or a time limit without --signal=B:USR1@N): not requeued".into(),
        );
    }
    let Some(alloc) = alloc else {
        return restart::decide(outcome, earlier, budget, requeueable());
    };
    let reason = match restart::decide(outcome, earlier, budget, true) {
        Action::Requeue { reason, .. } => reason,
        other => return other,
    };
    match restart::relaunch_where(alloc, &outcome.blamed_nodes, outcome.class) {
        Relaunch::InAllocation { exclude, nodes } => Action::RestartInAllocation {
            reason: format!("{reason}: relaunched inside the allocation"),
            exclude,
            nodes,
        },
        Relaunch::Requeue { why, .. } if !requeueable() => restart::stop(format!(
            "{}; and not inside the allocation: {why}",
            restart::NOT_REQUEUEABLE
        )),
        Relaunch::Requeue { exclude, why } => Action::Requeue {
            reason: format!("{reason}; not inside the allocation: {why}"),
            exclude,
        },
    }
}

/// Local mode (`resilio run` outside Slurm): the same judgment, and the
/// decision is a restart in place or a stop (never a requeue). `remembered`:
/// outcomes of earlier attempts decided by this process, for when the
/// journal could not be written (the crash-loop guard and the budget hold
/// all the same). A node that failed its health check stops the job: this
/// machine is the only one to run on.
pub fn decide_local(
    records: &[Record],
    attempt: u32,
    step: &StepEnd<'_>,
    budget: impl Into<Budget>,
    remembered: &[AttemptOutcome],
) -> Option<Decision> {
    let unhealthy = journal::events(records).any(|(r, e)| match e {
        Event::HealthCheck(h) if r.attempt == attempt => h.result.ok == Some(false),
        _ => false,
    });
    decide_with(records, attempt, step, remembered, |outcome, earlier| {
        if unhealthy && outcome.class != Class::Clean {
            return restart::stop(format!(
                "this machine failed its health check ({}): a restart on it would fail the same way",
                outcome.detail
            ));
        }
        restart::decide_in_place(outcome, earlier, budget)
    })
}

fn decide_with(
    records: &[Record],
    attempt: u32,
    step: &StepEnd<'_>,
    remembered: &[AttemptOutcome],
    choose: impl FnOnce(&AttemptOutcome, &[AttemptOutcome]) -> Action,
) -> Option<Decision> {
    let (failures, judgment) = judge::judge_attempt(records, attempt, step);
    let last_step = judge::last_step(records, attempt);
    let j = judgment?;
    let primary = failures[j.primary].clone();
    let evidence = primary
        .verdict
        .evidence
        .clone()
        .unwrap_or_else(|| primary.verdict.reason.clone());
    // A hang the probes found in the trainer's own code (or a stopped
    // process) leaves no node out: any node would hang the same way.
    let mut exclude = j.blamed_nodes.clone();
    if j.class == Class::Hang {
        exclude.retain(|n| {
            !crate::analysis::node_history::hang_is_software(records, attempt, primary.rank, n)
        });
    }
    let mut outcome = AttemptOutcome::new(attempt, j.class, &evidence, last_step, exclude);
    outcome.launch_trouble = primary.verdict.grounds == Grounds::LaunchTrouble;
    outcome.rollback =
        j.class == Class::Numerical && judge::rolled_back(records, attempt, primary.rank);
    (outcome.new_checkpoint, outcome.last_checkpoint) =
        judge::new_and_last_checkpoint(records, attempt);
    let restored = judge::restored_checkpoint(records, attempt);
    outcome.restored = restored.map(|(step, _)| step);
    outcome.restored_saved_in = restored.map(|(_, by)| by);
    if j.class == Class::Numerical {
        outcome.failed_from = judge::numerical_since(records, attempt, primary.rank);
    }
    let secondary: Vec<String> = failures
        .iter()
        .enumerate()
        .filter(|(i, f)| *i != j.primary && f.verdict.class != Class::Clean)
        .map(|(_, f)| format!("rank {} on {}: {}", f.rank, f.node, f.verdict.class.name()))
        .collect();
    let mut earlier = judge::earlier_outcomes(records, attempt);
    for o in remembered {
        if o.attempt < attempt && !earlier.iter().any(|e| e.attempt == o.attempt) {
            earlier.push(o.clone());
        }
    }
    earlier.sort_by_key(|o| o.attempt);
    let action = choose(&outcome, &earlier);
    // Every blame so far, this attempt's the last if it has one.
    let blamed = restore::suspects(&[earlier.as_slice(), std::slice::from_ref(&outcome)].concat());
    let suspect = blamed
        .last()
        .filter(|b| b.by_attempt == attempt)
        .map(|b| b.step);
    Some(Decision {
        judgment: j,
        primary,
        outcome,
        evidence,
        secondary,
        action,
        suspect,
        blamed,
    })
}

/// Never exclude so many nodes that the job could not run again: keep the
/// exclusion only while enough healthy nodes remain for the job's size
/// (`info.num_nodes`), dropping the last wanted nodes first. Unknown sizes
/// keep the exclusion whole.
pub fn limit_exclusion(info: &JobInfo, all: &[NodeInfo], exclude: &[String]) -> Vec<String> {
    // A node the job requires (`-w`) is never excluded: Slurm would keep
    // the job pending forever (BadConstraints).
    let exclude: Vec<String> = exclude
        .iter()
        .filter(|n| !info.required.contains(n))
        .cloned()
        .collect();
    let exclude = exclude.as_slice();
    if exclude.is_empty() || info.num_nodes == 0 || all.is_empty() {
        return exclude.to_vec();
    }
    let usable = |excl: &[String]| {
        all.iter()
            .filter(|n| {
                !n.is_failed() && !info.excluded.contains(&n.name) && !excl.contains(&n.name)
            })
            .count() as u32
    };
    let mut kept = exclude.to_vec();
    while !kept.is_empty() && usable(&kept) < info.num_nodes {
        kept.pop();
    }
    kept
}

/// A node of the allocation that the node history lists, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Listed {
    pub node: String,
    pub evidence: String,
}

/// What the node history asks of an allocation at its start.
#[derive(Clone, Debug, PartialEq)]
pub enum StartPlan {
    /// Nothing listed is in the allocation: run (`listed`: every node listed).
    Run { listed: Vec<String> },
    /// Leave the listed nodes out of the step, which runs on `nodes` nodes.
    LeaveOut { here: Vec<Listed>, nodes: u32 },
    /// Run anyway on the listed nodes, saying why.
    Warn {
        nodes: Vec<String>,
        reason: &'static str,
    },
    /// Requeue once, excluding the listed nodes (as many as leave the job
    /// schedulable).
    Requeue { here: Vec<Listed> },
}

/// `[nodes] exclude_at_start`: before the first step of an allocation,
/// leave out the nodes the node history lists (score at or above the
/// threshold): inside the allocation when spare nodes remain for the step
/// (`argv` is the step command), else by one requeue (never twice for this
/// reason, and not for a job that cannot be requeued: `requeueable`).
pub fn plan_at_start(
    history: &[NodeHistory],
    threshold: f64,
    alloc_nodes: &[String],
    argv: &[std::ffi::OsString],
    records: &[Record],
    requeueable: impl FnOnce() -> bool,
) -> StartPlan {
    let listed: Vec<&NodeHistory> = history.iter().filter(|h| h.listed(threshold)).collect();
    let here: Vec<Listed> = listed
        .iter()
        .filter(|h| alloc_nodes.contains(&h.node))
        .map(|h| Listed {
            node: h.node.clone(),
            evidence: format!(
                "node history score {:.2} (threshold {threshold}): {}",
                h.score,
                h.last_evidence()
            ),
        })
        .collect();
    if here.is_empty() {
        return StartPlan::Run {
            listed: listed.iter().map(|h| h.node.clone()).collect(),
        };
    }
    let names: Vec<String> = here.iter().map(|h| h.node.clone()).collect();
    let requested = crate::slurm::step::requested_nodes(argv);
    if let Some(k) = requested.filter(|_| crate::slurm::step::can_leave_out(argv)) {
        // The user's own `srun --exclude` leaves nodes out too.
        let theirs = crate::slurm::step::user_excluded_nodes(argv);
        let left = alloc_nodes
            .iter()
            .filter(|n| !names.contains(n) && !theirs.contains(n))
            .count() as u32;
        if left >= k {
            return StartPlan::LeaveOut { here, nodes: k };
        }
    }
    let requeued_before = journal::events(records)
        .any(|(_, e)| matches!(e, Event::Requeue(q) if q.by == Some(crate::event::RequeueBy::NodeHistory)));
    let requeueable = requeueable();
    if requeued_before || !requeueable {
        return StartPlan::Warn {
            nodes: names,
            reason: if requeued_before {
                "requeued once for the node history already"
            } else {
                "no spare node for the step and the job cannot be requeued"
            },
        };
    }
    StartPlan::Requeue { here }
}

/// Whether Slurm requeued the job itself (a node failure, a preemption):
/// its `Restarts` went past this allocation's, or it is pending again.
pub fn requeued_by_slurm(info: &JobInfo, allocation_restarts: u32) -> bool {
    info.restarts > allocation_restarts
        || info.state.starts_with("PENDING")
        || info.state.starts_with("REQUEUE")
}

/// What the job level still does once Slurm has requeued the job itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AfterSlurmRequeue {
    /// The allocation's failed nodes, and those the step had left out:
    /// the next allocation must not get them.
    pub exclude: Vec<String>,
    /// Lower the pending job's node count to this: the spare nodes it held
    /// were spent on the failed ones, and without them the job would wait
    /// for the full count (`[run] shrink_after_node_failure`).
    pub num_nodes: Option<u32>,
    /// The job's node count before.
    pub requested: u32,
    /// With the node count: the job's task count, lowered alike (a job of
    /// `--ntasks-per-node=K` asks for K tasks per node it holds).
    pub num_tasks: Option<u32>,
}

/// Pure: `held` the allocation's nodes, `failed` those Slurm now reports
/// failed, `left_out` those the step left out, `step_nodes` the step's
/// size (when the command says it), `requested` the job's node count,
/// `tasks` its task count (`SLURM_NTASKS`).
pub fn after_slurm_requeue(
    held: &[String],
    failed: &[String],
    left_out: &[String],
    step_nodes: Option<u32>,
    requested: u32,
    tasks: Option<u32>,
    shrink: bool,
) -> AfterSlurmRequeue {
    let mut exclude: Vec<String> = Vec::new();
    for n in failed.iter().chain(left_out) {
        if held.contains(n) && !exclude.contains(n) {
            exclude.push(n.clone());
        }
    }
    let num_nodes = step_nodes
        .filter(|_| shrink && !exclude.is_empty())
        .map(|step| step.max((held.len() - exclude.len()) as u32))
        .filter(|n| *n < requested);
    let num_tasks = num_nodes
        .zip(tasks)
        .and_then(|(n, t)| (requested > 0 && t % requested == 0).then(|| t / requested * n));
    AfterSlurmRequeue {
        exclude,
        num_nodes,
        requested,
        num_tasks,
    }
}

/// An earlier allocation as Slurm saw it, for the journal of a later one.
#[derive(Clone, Debug, PartialEq)]
pub struct SeenBySlurm {
    /// The allocation's last attempt, which the records are about.
    pub attempt: u32,
    pub class: Class,
    /// Slurm says a node failed (the job's state, or a node's now).
    pub node_fail: bool,
    /// The allocation's nodes that Slurm now reports failed.
    pub failed_nodes: Vec<String>,
    pub evidence: String,
    /// Journal a `failure`: nobody decided on the attempt and it did not
    /// end cleanly, or a failed node nobody blamed yet.
    pub failure: bool,
    /// Journal a `decision` with this outcome: nobody decided on the attempt.
    pub outcome: Option<AttemptOutcome>,
}

/// What to record about allocation `alloc` (its last attempt `attempt`),
/// from its `sacct` row and the states of its nodes now.
pub fn seen_by_slurm(
    records: &[Record],
    alloc: u32,
    attempt: u32,
    row: &AcctRecord,
    failed: &[NodeInfo],
) -> SeenBySlurm {
    let failed_nodes: Vec<String> = failed.iter().map(|n| n.name.clone()).collect();
    let node_fail = row.state.starts_with("NODE_FAIL") || !failed.is_empty();
    let class = if node_fail {
        Class::Infrastructure
    } else if row.state.starts_with("PREEMPTED") || row.state.starts_with("TIMEOUT") {
        Class::Preempted
    } else if row.state.starts_with("COMPLETED") {
        Class::Clean
    } else {
        Class::Infrastructure
    };
    let evidence = format!(
        "sacct: allocation {alloc} (attempt {attempt}) {} on {}{}",
        row.state,
        crate::slurm::hostlist::compress(&row.nodes),
        failed
            .iter()
            .map(|n| format!("; {} {} ({})", n.name, n.state, n.reason))
            .collect::<String>()
    );
    let decided = records
        .iter()
        .any(|r| r.kind == "decision" && judge::about(r) == attempt);
    // A node Slurm now reports failed was part of this attempt: its failure
    // is recorded unless a failure on it is journaled already (the
    // supervisor may have seen only the peers' echoes).
    let blamed_before = journal::events(records).any(|(r, e)| match e {
        Event::Failure(f) if f.about_attempt.unwrap_or(r.attempt) == attempt => f
            .blamed_node
            .as_ref()
            .is_some_and(|n| failed_nodes.contains(n)),
        _ => false,
    });
    let failure = if decided {
        !failed_nodes.is_empty() && !blamed_before
    } else {
        class != Class::Clean
    };
    let outcome = (!decided).then(|| {
        let last_step = journal::events(records)
            .filter(|(r, _)| r.attempt == attempt)
            .filter_map(|(_, e)| match e {
                Event::RankExit(x) => x.last_step,
                Event::Stall(x) => x.last_step,
                Event::Progress(x) => x.step,
                _ => None,
            })
            .max();
        let detail = if node_fail {
            "node failure"
        } else {
            &row.state
        };
        let (new_checkpoint, last_checkpoint) = judge::new_and_last_checkpoint(records, attempt);
        AttemptOutcome {
            new_checkpoint,
            last_checkpoint,
            ..AttemptOutcome::new(attempt, class, detail, last_step, failed_nodes.clone())
        }
    });
    SeenBySlurm {
        attempt,
        class,
        node_fail,
        failed_nodes,
        evidence,
        failure,
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::node_history::NodeEvent;
    use crate::policy::failure::Verdict;
    use serde_json::{json, Value};
    use std::cell::Cell;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_requeue_by_slurm_is_told_by_restarts_or_a_pending_state() {
        let info = |state: &str, restarts| JobInfo {
            state: state.into(),
            restarts,
            ..Default::default()
        };
        assert!(!requeued_by_slurm(&info("COMPLETING", 1), 1));
        assert!(!requeued_by_slurm(&info("CANCELLED", 0), 0));
        assert!(requeued_by_slurm(&info("COMPLETING", 2), 1));
        assert!(requeued_by_slurm(&info("PENDING", 0), 0));
        assert!(requeued_by_slurm(&info("REQUEUED", 0), 0));
    }

    #[test]
    fn after_slurms_own_requeue_the_failed_node_is_excluded_and_spent_spares_dropped() {
        let held = names(&["n1", "n2", "n3", "n4"]);
        // n2 failed; the step (3 nodes) had left n4 out already.
        let p = after_slurm_requeue(
            &held,
            &names(&["n2", "n9"]),
            &names(&["n4"]),
            Some(3),
            4,
            Some(4),
            true,
        );
        assert_eq!(p.num_tasks, Some(3));
        assert_eq!(p.exclude, names(&["n2", "n4"]));
        // Two nodes gone from four: the job needs 3 for its step, no fewer.
        assert_eq!(p.num_nodes, Some(3));
        let one = after_slurm_requeue(&held, &names(&["n2"]), &[], Some(3), 4, Some(8), true);
        // Two tasks per node: six for three nodes.
        assert_eq!(
            (one.exclude, one.num_nodes, one.num_tasks),
            (names(&["n2"]), Some(3), Some(6))
        );
        // A task count that is not per node is left alone.
        let odd = after_slurm_requeue(&held, &names(&["n2"]), &[], Some(3), 4, Some(7), true);
        assert_eq!((odd.num_nodes, odd.num_tasks), (Some(3), None));
        // Not asked for, no spare, no step size, nothing failed: the count stays.
        assert_eq!(
            after_slurm_requeue(&held, &names(&["n2"]), &[], Some(3), 4, Some(8), false).num_nodes,
            None
        );
        assert_eq!(
            after_slurm_requeue(&held, &names(&["n2"]), &[], Some(4), 4, Some(8), true).num_nodes,
            None
        );
        assert_eq!(
            after_slurm_requeue(&held, &names(&["n2"]), &[], None, 4, Some(8), true).num_nodes,
            None
        );
        let none = after_slurm_requeue(&held, &[], &[], Some(3), 4, Some(8), true);
        assert_eq!((none.exclude.len(), none.num_nodes), (0, None));
    }

    fn rec(
        kind: &str,
        attempt: u32,
        rank: Option<u32>,
        node: &str,
        at: i64,
        data: Value,
    ) -> Record {
        Record {
            v: 1,
            ts: chrono::DateTime::from_timestamp(1_800_000_000 + at, 0).unwrap(),
            kind: kind.into(),
            attempt,
            rank,
            node: (!node.is_empty()).then(|| node.into()),
            data: data.as_object().cloned().unwrap_or_default(),
            ..Default::default()
        }
    }

    /// Rank 1 on n2 died of `evidence` at step `step`; rank 0 on n1 echoed it later.
    fn failed_on_n2(attempt: u32, class: &str, evidence: &str, step: u64) -> Vec<Record> {
        let at = 100 * attempt as i64;
        vec![
            rec("rank_start", attempt, Some(0), "n1", at, json!({})),
            rec("rank_start", attempt, Some(1), "n2", at, json!({})),
            rec(
                "rank_exit",
                attempt,
                Some(1),
                "n2",
                at + 10,
                json!({ "class": class, "evidence": evidence, "class_reason": "", "last_step": step }),
            ),
            rec(
                "rank_exit",
                attempt,
                Some(0),
                "n1",
                at + 11,
                json!({ "class": "secondary", "evidence": "Connection reset by peer", "class_reason": "", "last_step": step }),
            ),
        ]
    }

    /// The `decision` record the act step would journal for `d`.
    fn decided(d: &Decision) -> Record {
        rec(
            "decision",
            d.outcome.attempt,
            None,
            "",
            100 * d.outcome.attempt as i64 + 20,
            json!({ "outcome": d.outcome, "decision": d.action }),
        )
    }

    fn verdict() -> Verdict {
        Verdict {
            class: Class::Unknown,
            reason: "exit 1".into(),
            evidence: None,
            ..Default::default()
        }
    }

    fn step(v: &Verdict, pre_timeout: bool) -> StepEnd<'_> {
        StepEnd {
            exit_code: 1,
            verdict: v,
            tail: &[],
            node: "n1",
            pre_timeout,
            agents: &[],
            ended: chrono::DateTime::from_timestamp(1_800_000_500, 0).unwrap(),
        }
    }

    fn alloc(nodes: &[&str]) -> Allocation {
        Allocation {
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            can_exclude: true,
            step_nodes: 2,
            ..Allocation::default()
        }
    }

    /// Decide attempt `attempt` of `records`, counting how often
    /// `requeueable` was asked.
    fn run(
        records: &[Record],
        attempt: u32,
        budget: impl Into<Budget>,
        alloc: Option<&Allocation>,
        requeueable: bool,
    ) -> (Option<Decision>, u32) {
        let v = verdict();
        let s = step(&v, false);
        let asked = Cell::new(0);
        let facts = Facts {
            records,
            attempt,
            step: &s,
            budget: budget.into(),
            alloc,
        };
        let d = decide(&facts, || {
            asked.set(asked.get() + 1);
            requeueable
        });
        (d, asked.get())
    }

    /// Launch trouble is the job level's own sighting, typed: a step that
    /// started no rank is launch trouble in its decision and when the
    /// journal is read back; a trainer printing the same words is not.
    #[test]
    fn launch_trouble_is_the_job_levels_sighting_never_a_ranks_words() {
        let launch = Verdict::launch_trouble(std::time::Duration::from_secs(300));
        let s = step(&launch, false);
        let facts = Facts {
            records: &[],
            attempt: 0,
            step: &s,
            budget: 3.into(),
            alloc: None,
        };
        let d = decide(&facts, || true).expect("a decision");
        assert!(d.outcome.launch_trouble, "{:?}", d.outcome);
        let back = judge::earlier_outcomes(&[decided(&d)], 1);
        assert!(back[0].launch_trouble, "{back:?}");
        // The trainer's own words, the same text.
        let words = "launch trouble: no rank of the step reported within 300s of srun's start";
        let records = failed_on_n2(0, "infrastructure", words, 5);
        let (d, _) = run(&records, 0, 3, None, true);
        let d = d.expect("a decision");
        assert_eq!(d.outcome.detail, words);
        assert!(!d.outcome.launch_trouble);
        assert!(!judge::earlier_outcomes(&[decided(&d)], 1)[0].launch_trouble);
    }

    /// A rollback is the `numerical` record's action, not the evidence's
    /// first word: the same words without it stop the job as numerical.
    #[test]
    fn a_rollback_is_the_numerical_records_action_not_its_words() {
        let words = "rollback: loss 9.1 is 10.0x its running median 0.9 since step 130";
        let mut records = failed_on_n2(0, "numerical", words, 133);
        let (d, _) = run(&records, 0, 3, None, true);
        let d = d.expect("a decision");
        assert!(!d.outcome.rollback);
        assert!(matches!(d.action, Action::Stop { .. }), "{:?}", d.action);
        records.insert(
            2,
            rec(
                "numerical",
                0,
                Some(1),
                "n2",
                9,
                json!({ "finding": "spike", "action": "rollback", "step": 133 }),
            ),
        );
        let (d, _) = run(&records, 0, 3, None, true);
        let d = d.expect("a decision");
        assert!(d.outcome.rollback, "{:?}", d.outcome);
        assert!(!matches!(d.action, Action::Stop { .. }), "{:?}", d.action);
        assert!(judge::earlier_outcomes(&[decided(&d)], 1)[0].rollback);
        // The checkpoint to load: the last whole one before the bad values
        // began (step 130); with only later ones, 0 (start from scratch,
        // never the latest: trial 14); with none, unset.
        let spike = |records: &mut Vec<Record>, steps: &[u64]| {
            for s in steps {
                records.push(rec(
                    "checkpoint_done",
                    0,
                    Some(1),
                    "n2",
                    5,
                    json!({ "step": s }),
                ));
            }
            records[2] = rec(
                "numerical",
                0,
                Some(1),
                "n2",
                9,
                json!({ "finding": "spike", "action": "rollback", "step": 133, "since_step": 130 }),
            );
            let (d, _) = run(records, 0, 3, None, true);
            super::super::rollback::plan_rollback(records, &d.unwrap()).map(|r| r.checkpoint_step)
        };
        assert_eq!(
            spike(&mut records.clone(), &[100, 120, 132]),
            Some(Some(120))
        );
        assert_eq!(spike(&mut records.clone(), &[132]), Some(Some(0)));
        assert_eq!(spike(&mut records.clone(), &[]), Some(None));
    }

    /// The newest checkpoint its files showed torn is not loaded by the
    /// next attempt (told the newest whole one), and a failure after a
    /// restart that loaded it anyway is blamed on it, not on the whole one
    /// before (trial 18).
    #[test]
    fn a_torn_newest_checkpoint_is_neither_loaded_nor_mistaken_for_the_one_before() {
        let mut records = failed_on_n2(0, "infrastructure", "Xid 79", 22);
        for (step, complete) in [(15, true), (20, false)] {
            records.insert(
                1,
                rec(
                    "checkpoint_done",
                    0,
                    Some(0),
                    "n1",
                    4,
                    json!({ "step": step, "path": format!("checkpoint-{step}"), "complete": complete }),
                ),
            );
        }
        let (d, _) = run(&records, 0, 3, None, true);
        let d = d.expect("a decision");
        assert!(!matches!(d.action, Action::Stop { .. }), "{:?}", d.action);
        let rb = super::super::rollback::plan_rollback(&records, &d).expect("a rollback");
        assert_eq!((rb.checkpoint_step, rb.avoid.clone()), (Some(15), vec![20]));
        assert!(
            rb.detail.contains("found incomplete or stale"),
            "{}",
            rb.detail
        );
        // Attempt 1 loaded 20 all the same (its first step 21).
        records.push(rec(
            "progress",
            1,
            Some(0),
            "n1",
            30,
            json!({ "step": 21, "first": true }),
        ));
        assert_eq!(judge::restored_checkpoint(&records, 1), Some((20, 0)));
    }

    #[test]
    fn nothing_failed_is_no_decision() {
        let records = vec![rec(
            "rank_exit",
            0,
            Some(0),
            "n1",
            1,
            json!({ "class": "clean", "last_step": 9 }),
        )];
        let v = verdict();
        let mut s = step(&v, false);
        s.exit_code = 0;
        let facts = Facts {
            records: &records,
            attempt: 0,
            step: &s,
            budget: 3.into(),
            alloc: None,
        };
        assert!(decide(&facts, || unreachable!()).is_none());
    }

    #[test]
    fn restart_within_budget_stays_inside_the_allocation_without_asking_slurm() {
        let records = failed_on_n2(0, "infrastructure", "Xid 79", 40);
        let a = alloc(&["n1", "n2", "n3"]);
        let (d, asked) = run(&records, 0, 3, Some(&a), false);
        let d = d.unwrap();
        assert_eq!(
            asked, 0,
            "requeueable asked for a relaunch inside the allocation"
        );
        assert_eq!(d.primary.rank, 1);
        assert_eq!(d.outcome.blamed_nodes, ["n2"]);
        assert_eq!(d.secondary, ["rank 0 on n1: secondary"]);
        assert_eq!(
            d.action,
            Action::RestartInAllocation {
                exclude: vec!["n2".into()],
                nodes: 2,
                reason: "infrastructure: Xid 79, excluding n2: relaunched inside the allocation"
                    .into(),
            }
        );
    }

    #[test]
    fn requeue_excludes_the_blamed_node_when_no_spare_remains() {
        let records = failed_on_n2(0, "infrastructure", "Xid 79", 40);
        // Without an allocation to relaunch in.
        let (d, asked) = run(&records, 0, 3, None, true);
        assert_eq!(asked, 1);
        assert_eq!(
            d.unwrap().action,
            Action::Requeue {
                exclude: vec!["n2".into()],
                reason: "infrastructure: Xid 79, excluding n2".into(),
            }
        );
        // An allocation with no spare node.
        let a = alloc(&["n1", "n2"]);
        let (d, asked) = run(&records, 0, 3, Some(&a), true);
        assert_eq!(asked, 1);
        let Action::Requeue { exclude, reason } = d.unwrap().action else {
            panic!("not a requeue")
        };
        assert_eq!(exclude, ["n2"]);
        assert!(
            reason.contains("not inside the allocation: no spare node"),
            "{reason}"
        );
        // ... and a job that cannot be requeued stops, saying how to submit it.
        let (d, _) = run(&records, 0, 3, Some(&a), false);
        let Action::Stop { reason, .. } = d.unwrap().action else {
            panic!("not a stop")
        };
        assert!(reason.contains("sbatch --requeue"), "{reason}");
    }

    #[test]
    fn the_same_failure_at_the_same_step_is_a_crash_loop() {
        let mut records = failed_on_n2(0, "infrastructure", "Xid 79", 40);
        let (first, _) = run(&records, 0, 3, None, true);
        records.push(decided(&first.unwrap()));
        records.extend(failed_on_n2(1, "infrastructure", "Xid 79", 40));
        let (d, _) = run(&records, 1, 3, None, true);
        let Action::Stop { reason, .. } = d.unwrap().action else {
            panic!("not a stop")
        };
        assert!(
            reason.starts_with("crash loop: the same failure (infrastructure: Xid 79) at the same step as attempt 0"),
            "{reason}"
        );
        // An unexplained failure seen before is a crash loop at any step.
        let mut records = failed_on_n2(0, "unknown", "exit 1", 10);
        let (first, _) = run(&records, 0, 3, None, true);
        records.push(decided(&first.unwrap()));
        records.extend(failed_on_n2(1, "unknown", "exit 1", 90));
        let (d, _) = run(&records, 1, 3, None, true);
        assert!(
            matches!(&d.unwrap().action, Action::Stop { reason, .. } if reason.starts_with("crash loop: the same unexplained failure")),
        );
    }

    #[test]
    fn a_spent_budget_stops() {
        let mut records = Vec::new();
        for attempt in 0..2 {
            records.extend(failed_on_n2(
                attempt,
                "infrastructure",
                &format!("Xid 7{attempt} at a new place"),
                10 + 10 * attempt as u64,
            ));
            let (d, _) = run(&records, attempt, 2, None, true);
            let d = d.unwrap();
            assert!(matches!(d.action, Action::Requeue { .. }), "{:?}", d.action);
            records.push(decided(&d));
        }
        records.extend(failed_on_n2(2, "infrastructure", "ECC error", 50));
        let (d, _) = run(&records, 2, 2, None, true);
        assert_eq!(
            d.unwrap().action,
            restart::stop(
                "restart budget exhausted: 2 failed attempt(s) before this one, --max-restarts 2"
                    .into()
            )
        );
    }

    #[test]
    fn a_stop_from_outside_is_requeued_only_after_the_warning() {
        let records = vec![rec(
            "rank_exit",
            0,
            Some(0),
            "n1",
            1,
            json!({ "class": "preempted", "last_step": 9 }),
        )];
        let v = verdict();
        for (pre_timeout, requeued) in [(false, false), (true, true)] {
            let s = step(&v, pre_timeout);
            let facts = Facts {
                records: &records,
                attempt: 0,
                step: &s,
                budget: 0.into(),
                alloc: None,
            };
            let d = decide(&facts, || true).unwrap();
            assert_eq!(
                matches!(d.action, Action::Requeue { .. }),
                requeued,
                "{:?}",
                d.action
            );
        }
    }

    #[test]
    fn local_mode_restarts_in_place_and_remembers_what_the_journal_lost() {
        let records = failed_on_n2(0, "infrastructure", "Xid 79", 40);
        let v = verdict();
        let s = step(&v, false);
        let d = decide_local(&records, 0, &s, 3, &[]).unwrap();
        assert_eq!(
            d.action,
            Action::RestartInPlace {
                reason: "infrastructure: Xid 79".into()
            }
        );
        // The next attempt fails the same way; its decision was never journaled.
        let again = failed_on_n2(1, "infrastructure", "Xid 79", 40);
        let d2 = decide_local(&again, 1, &s, 3, std::slice::from_ref(&d.outcome)).unwrap();
        assert!(
            matches!(&d2.action, Action::Stop { reason, .. } if reason.starts_with("crash loop"))
        );
    }

    #[test]
    fn an_exclusion_is_cut_to_what_leaves_the_job_schedulable() {
        let node = |name: &str, state: &str| NodeInfo {
            name: name.into(),
            state: state.into(),
            reason: String::new(),
        };
        let all = [
            node("n1", "idle"),
            node("n2", "idle"),
            node("n3", "down*"),
            node("n4", "idle"),
            node("n5", "idle"),
        ];
        let info = JobInfo {
            num_nodes: 2,
            excluded: vec!["n5".into()],
            ..JobInfo::default()
        };
        let want: Vec<String> = ["n1", "n2"].map(String::from).to_vec();
        // n3 is down, n5 excluded already: n2 and n4 must stay.
        assert_eq!(limit_exclusion(&info, &all, &want), ["n1"]);
        let unknown = JobInfo::default();
        assert_eq!(limit_exclusion(&unknown, &all, &want), want);
        // A node the job requires (`sbatch -w n1,n2`) is never excluded.
        let pinned = JobInfo {
            required: want.clone(),
            ..JobInfo::default()
        };
        assert!(limit_exclusion(&pinned, &all, &want).is_empty());
    }

    fn listed(node: &str, score: f64) -> NodeHistory {
        NodeHistory {
            node: node.into(),
            score,
            failures_by_class: Default::default(),
            jobs: Vec::new(),
            last_seen: chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
            events: vec![NodeEvent {
                ts: chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
                job: "70".into(),
                class: "infrastructure".into(),
                evidence: "Xid 79".into(),
                share: 1.0,
                source: "journal",
                counts: true,
                reason: "the rank's infrastructure failure, with evidence from its output".into(),
                owner: "alice".into(),
                trusted: true,
            }],
            listable: true,
        }
    }

    #[test]
    fn history_at_start_leaves_listed_nodes_out_inside_the_allocation_or_requeues_once() {
        let history = [listed("n2", 1.5), listed("n7", 2.0), listed("n3", 0.2)];
        let nodes: Vec<String> = ["n1", "n2", "n3", "n4"].map(String::from).to_vec();
        let argv = |a: &[&str]| -> Vec<std::ffi::OsString> { a.iter().map(|s| s.into()).collect() };
        let never = || -> bool { unreachable!("requeueable asked") };
        // Nothing listed in the allocation.
        assert_eq!(
            plan_at_start(
                &history,
                1.0,
                &nodes[2..],
                &argv(&["srun", "x"]),
                &[],
                never
            ),
            StartPlan::Run {
                listed: vec!["n2".into(), "n7".into()]
            }
        );
        // A spare node for a step of 3 nodes: n2 is left out of it.
        let srun3 = argv(&["srun", "--nodes=3", "python", "t.py"]);
        assert_eq!(
            plan_at_start(&history, 1.0, &nodes, &srun3, &[], never),
            StartPlan::LeaveOut {
                here: vec![Listed {
                    node: "n2".into(),
                    evidence: "node history score 1.50 (threshold 1): Xid 79".into()
                }],
                nodes: 3
            }
        );
        // No spare: one requeue, if the job can be requeued.
        let srun4 = argv(&["srun", "--nodes=4", "python", "t.py"]);
        assert!(matches!(
            plan_at_start(&history, 1.0, &nodes, &srun4, &[], || true),
            StartPlan::Requeue { here } if here.len() == 1 && here[0].node == "n2"
        ));
        assert!(matches!(
            plan_at_start(&history, 1.0, &nodes, &srun4, &[], || false),
            StartPlan::Warn { reason, .. } if reason.contains("cannot be requeued")
        ));
        // Never twice for the node history.
        let before = [rec(
            "requeue",
            0,
            None,
            "",
            1,
            json!({ "by": "node_history" }),
        )];
        assert!(matches!(
            plan_at_start(&history, 1.0, &nodes, &srun4, &before, || true),
            StartPlan::Warn { nodes, reason } if nodes == ["n2"] && reason.contains("already")
        ));
    }

    #[test]
    fn an_allocation_slurm_ended_alone_is_reconstructed() {
        let row = AcctRecord {
            state: "NODE_FAIL".into(),
            nodes: vec!["n1".into(), "n2".into()],
            ..AcctRecord::default()
        };
        let down = [NodeInfo {
            name: "n2".into(),
            state: "down*".into(),
            reason: "Not responding".into(),
        }];
        let mut records = failed_on_n2(0, "secondary", "Connection reset by peer", 12);
        let seen = seen_by_slurm(&records, 0, 0, &row, &down);
        assert_eq!(
            (seen.class, seen.node_fail, seen.failure),
            (Class::Infrastructure, true, true)
        );
        assert_eq!(seen.failed_nodes, ["n2"]);
        let o = seen.outcome.clone().expect("nobody decided: a decision");
        assert_eq!((o.last_step, o.detail.as_str()), (Some(12), "node failure"));
        assert_eq!((o.new_checkpoint, o.last_checkpoint), (false, None));
        // A checkpoint the attempt saved is in its reconstructed outcome
        // (for the no-progress rule across Slurm's own requeues).
        let mut saved = records.clone();
        saved.push(rec(
            "checkpoint_done",
            0,
            Some(0),
            "n1",
            11,
            json!({ "step": 10, "source": "stdout" }),
        ));
        let o = seen_by_slurm(&saved, 0, 0, &row, &down).outcome.unwrap();
        assert_eq!((o.new_checkpoint, o.last_checkpoint), (true, Some(10)));
        // Decided already, and the failed node blamed: nothing but the row.
        records.push(rec("decision", 0, None, "", 20, json!({})));
        records.push(rec(
            "failure",
            0,
            None,
            "",
            20,
            json!({ "blamed_node": "n2" }),
        ));
        let seen = seen_by_slurm(&records, 0, 0, &row, &down);
        assert!(!seen.failure && seen.outcome.is_none(), "{seen:?}");
        // A time limit Slurm ended: preempted, no node blamed.
        let timeout = AcctRecord {
            state: "TIMEOUT".into(),
            ..row
        };
        let seen = seen_by_slurm(&[], 0, 0, &timeout, &[]);
        assert_eq!((seen.class, seen.failure), (Class::Preempted, true));
    }

    #[test]
    fn a_dead_agent_restarts_in_place_within_the_budget_and_never_reads_as_a_stop_from_outside() {
        use crate::job::judge::{AgentEnd, AgentStatus};
        let attempt_of = |a: u32| {
            vec![
                rec(
                    "rank_start",
                    a,
                    Some(0),
                    "ws",
                    100 * a as i64,
                    json!({ "pid": 1 }),
                ),
                rec(
                    "rank_start",
                    a,
                    Some(1),
                    "ws",
                    100 * a as i64,
                    json!({ "pid": 2 }),
                ),
                rec(
                    "rank_exit",
                    a,
                    Some(0),
                    "ws",
                    100 * a as i64 + 30,
                    json!({ "class": "preempted", "class_reason": "stopped on request", "last_step": 10 * (a + 1) }),
                ),
            ]
        };
        let agents = [
            AgentEnd {
                rank: 0,
                status: AgentStatus::Code(143),
                at: chrono::DateTime::from_timestamp(1_800_000_031, 0).unwrap(),
            },
            AgentEnd {
                rank: 1,
                status: AgentStatus::Signal(9),
                at: chrono::DateTime::from_timestamp(1_800_000_020, 0).unwrap(),
            },
        ];
        let v = verdict();
        let mut s = step(&v, false);
        s.exit_code = 137;
        s.agents = &agents;
        let mut records = attempt_of(0);
        let d = decide_local(&records, 0, &s, 1, &[]).unwrap();
        assert_eq!(
            (d.primary.rank, d.outcome.class),
            (1, Class::Infrastructure)
        );
        assert!(
            matches!(d.action, Action::RestartInPlace { .. }),
            "{:?}",
            d.action
        );
        assert_eq!(d.secondary, ["rank 0 on ws: secondary"]);
        // The budget holds: a second death with --max-restarts 1 stops.
        records.push(decided(&d));
        records.extend(attempt_of(1));
        let d = decide_local(&records, 1, &s, 1, &[]).unwrap();
        let Action::Stop { reason, .. } = &d.action else {
            panic!("{:?}", d.action)
        };
        assert!(reason.contains("budget"), "{reason}");
    }
}
