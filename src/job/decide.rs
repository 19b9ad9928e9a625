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
use crate::journal::Record;
use crate::node_history::NodeHistory;
use crate::policy::failure::{Class, Judgment, RankFailure};
use crate::policy::restart::{self, Action, Allocation, AttemptOutcome, Relaunch};
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
}

/// What a batch-level supervisor decides an attempt from.
pub struct Facts<'a> {
    /// The journal of this run, every rank's and the supervisor's.
    pub records: &'a [Record],
    pub attempt: u32,
    pub step: &'a StepEnd<'a>,
    pub max_restarts: u32,
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
        max_restarts,
        alloc,
    } = *facts;
    decide_with(records, attempt, step, |outcome, earlier| {
        choose(
            outcome,
            earlier,
            max_restarts,
            step.pre_timeout,
            alloc,
            requeueable,
        )
    })
}

/// The batch-level action for a judged outcome.
fn choose(
    outcome: &AttemptOutcome,
    earlier: &[AttemptOutcome],
    max_restarts: u32,
    pre_timeout: bool,
    alloc: Option<&Allocation>,
    requeueable: impl FnOnce() -> bool,
) -> Action {
    if outcome.class == Class::Preempted && !pre_timeout {
        // Stopped from outside with no warning: scancel, or a time limit the
        // job did not ask to be warned of. Requeueing would undo a cancel.
        return Action::Stop {
            reason: "stopped from outside (scancel, or a time limit without --signal=B:USR1@N): not requeued".into(),
        };
    }
    let Some(alloc) = alloc else {
        return restart::decide(outcome, earlier, max_restarts, requeueable());
    };
    let reason = match restart::decide(outcome, earlier, max_restarts, true) {
        Action::Requeue { reason, .. } => reason,
        other => return other,
    };
    match restart::relaunch_where(alloc, &outcome.blamed_nodes, outcome.class) {
        Relaunch::InAllocation { exclude, nodes } => Action::RestartInAllocation {
            reason: format!("{reason}: relaunched inside the allocation"),
            exclude,
            nodes,
        },
        Relaunch::Requeue { why, .. } if !requeueable() => Action::Stop {
            reason: format!(
                "{}; and not inside the allocation: {why}",
                restart::NOT_REQUEUEABLE
            ),
        },
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
    max_restarts: u32,
    remembered: &[AttemptOutcome],
) -> Option<Decision> {
    let unhealthy = records.iter().any(|r| {
        r.attempt == attempt
            && r.kind == "health_check"
            && r.get("result")
                .and_then(|h| h.get("ok"))
                .and_then(|ok| ok.as_bool())
                == Some(false)
    });
    decide_with(records, attempt, step, |outcome, earlier| {
        let mut earlier = earlier.to_vec();
        for o in remembered {
            if o.attempt < attempt && !earlier.iter().any(|e| e.attempt == o.attempt) {
                earlier.push(o.clone());
            }
        }
        earlier.sort_by_key(|o| o.attempt);
        if unhealthy && outcome.class != Class::Clean {
            return Action::Stop {
                reason: format!(
                    "this machine failed its health check ({}): a restart on it would fail the same way",
                    outcome.detail
                ),
            };
        }
        restart::decide_in_place(outcome, &earlier, max_restarts)
    })
}

fn decide_with(
    records: &[Record],
    attempt: u32,
    step: &StepEnd<'_>,
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
    let outcome = AttemptOutcome::new(
        attempt,
        j.class,
        &evidence,
        last_step,
        j.blamed_nodes.clone(),
    );
    let secondary: Vec<String> = failures
        .iter()
        .enumerate()
        .filter(|(i, f)| *i != j.primary && f.verdict.class != Class::Clean)
        .map(|(_, f)| format!("rank {} on {}: {}", f.rank, f.node, f.verdict.class.name()))
        .collect();
    let earlier = judge::earlier_outcomes(records, attempt);
    let action = choose(&outcome, &earlier);
    Some(Decision {
        judgment: j,
        primary,
        outcome,
        evidence,
        secondary,
        action,
    })
}

/// Never exclude so many nodes that the job could not run again: keep the
/// exclusion only while enough healthy nodes remain for the job's size
/// (`info.num_nodes`), dropping the last wanted nodes first. Unknown sizes
/// keep the exclusion whole.
pub fn limit_exclusion(info: &JobInfo, all: &[NodeInfo], exclude: &[String]) -> Vec<String> {
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
    let listed: Vec<&NodeHistory> = history.iter().filter(|h| h.score >= threshold).collect();
    let here: Vec<Listed> = listed
        .iter()
        .filter(|h| alloc_nodes.contains(&h.node))
        .map(|h| Listed {
            node: h.node.clone(),
            evidence: format!(
                "node history score {:.2} (threshold {threshold}): {}",
                h.score,
                h.events.last().map(|e| e.evidence.as_str()).unwrap_or("")
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
    let requeued_before = records
        .iter()
        .any(|r| r.kind == "requeue" && r.str("by") == Some("node_history"));
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
    let blamed_before = records
        .iter()
        .filter(|r| r.kind == "failure" && judge::about(r) == attempt)
        .any(|r| {
            r.str("blamed_node")
                .is_some_and(|n| failed_nodes.iter().any(|f| f == n))
        });
    let failure = if decided {
        !failed_nodes.is_empty() && !blamed_before
    } else {
        class != Class::Clean
    };
    let outcome = (!decided).then(|| {
        let last_step = records
            .iter()
            .filter(|r| r.attempt == attempt)
            .filter_map(|r| {
                r.u64("last_step")
                    .or_else(|| (r.kind == "progress").then(|| r.u64("step")).flatten())
            })
            .max();
        let detail = if node_fail {
            "node failure"
        } else {
            &row.state
        };
        AttemptOutcome::new(attempt, class, detail, last_step, failed_nodes.clone())
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
