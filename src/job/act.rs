//! Carrying out the job level's decisions: the journal records, the Slurm
//! calls (through the [`Slurm`] trait, so that tests use the fake) and the
//! lines on stderr. What to do was decided in [`super::decide`].
//!
//! A requeue is `scontrol requeue`, then `ExcNodeList` while Slurm is still
//! tearing the job down (a running job's exclusion list cannot be changed;
//! SLURM-FACTS), tried on the schedule [`Retry::EXCLUSION`].

use super::decide::{self, Decision, Listed, SeenBySlurm, StartPlan};
use super::retry::Retry;
use crate::journal::Writer;
use crate::policy::restart::Action;
use crate::slurm::{AcctRecord, Slurm};
use serde_json::json;

/// What the job-level supervisor does once it has decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Exit with this code (finished, stopped, or requeued: Slurm starts the next attempt).
    Exit(i32),
    /// Relaunch the step inside the allocation.
    Relaunch(crate::slurm::step::Relaunch),
}

/// What the node history asks of a job at its start.
#[derive(Debug, PartialEq, Eq)]
pub enum AtStart {
    /// Nothing listed in the allocation (or nothing to be done about it).
    Run,
    /// Run the step on `nodes` nodes, leaving `exclude` out.
    LeaveOut { exclude: Vec<String>, nodes: u32 },
    /// The job went back to the queue, excluding the listed nodes.
    Requeued,
}

/// Journal the judgment and the decision on an attempt.
pub fn journal_decision(journal: &mut Writer, d: &Decision) {
    let (j, primary) = (&d.judgment, &d.primary);
    journal.record(
        "judgment",
        json!({
            "class": j.class,
            "primary_rank": (primary.rank != u32::MAX).then_some(primary.rank),
            "primary_node": primary.node,
            "why": j.why,
            "evidence": d.evidence,
            "reason": primary.verdict.reason,
            "blamed_nodes": j.blamed_nodes,
            "secondary": d.secondary,
        }),
        true,
    );
    journal.record(
        "decision",
        json!({ "outcome": d.outcome, "decision": d.action }),
        true,
    );
}

/// The job has ended (no restart follows from this process).
pub fn job_end(journal: &mut Writer, exit_code: i32, reason: &str) {
    journal.record(
        "job_end",
        json!({ "exit_code": exit_code, "reason": reason }),
        true,
    );
}

/// Carry out a batch-level decision on `attempt` (journaled already).
/// `before`: the nodes already left out of the step in this allocation.
pub fn carry_out(
    d: Decision,
    job: &str,
    attempt: u32,
    exit_code: i32,
    before: &[String],
    slurm: &dyn Slurm,
    journal: &mut Writer,
) -> Next {
    let class = d.judgment.class;
    match d.action {
        Action::Finish => job_end(journal, exit_code, "completed"),
        // Local mode's decision (never taken for a Slurm job): the failure stands.
        Action::Stop { reason } | Action::RestartInPlace { reason } => {
            eprintln!("resilio: job {job} not requeued: {reason}");
            job_end(journal, exit_code, &reason);
        }
        Action::RestartInAllocation {
            exclude,
            nodes,
            reason,
        } => {
            for node in exclude.iter().filter(|n| !before.contains(n)) {
                journal.record(
                    "node_excluded",
                    json!({ "excluded_node": node, "reason": class, "evidence": d.evidence, "scope": "step" }),
                    true,
                );
            }
            let next = crate::slurm::step::Relaunch {
                attempt: attempt + 1,
                failed_at_us: (d.primary.at * 1e6) as i64,
                nodes,
                exclude,
            };
            journal.record(
                "restart",
                json!({ "next_attempt": next.attempt, "reason": reason, "in_allocation": true,
                        "exclude": next.exclude, "nodes": nodes }),
                true,
            );
            eprintln!(
                "resilio: relaunching the step of job {job} inside the allocation (attempt {}): {reason}",
                next.attempt
            );
            return Next::Relaunch(next);
        }
        Action::Requeue { exclude, reason } => {
            let exclude = schedulable_exclusion(slurm, job, exclude, journal);
            for node in exclude.iter().filter(|n| !before.contains(n)) {
                journal.record(
                    "node_excluded",
                    json!({ "excluded_node": node, "reason": class, "evidence": d.evidence }),
                    true,
                );
            }
            journal.record(
                "requeue",
                json!({ "reason": reason, "exclude": exclude }),
                true,
            );
            eprintln!("resilio: requeueing job {job}: {reason}");
            if !requeue(slurm, job, &exclude, journal) {
                job_end(journal, exit_code, "requeue failed");
            }
        }
    }
    Next::Exit(exit_code)
}

/// Never exclude so many nodes that the job could not run again
/// ([`decide::limit_exclusion`], from `scontrol show job` and `sinfo`);
/// journaled when the exclusion was cut short.
pub fn schedulable_exclusion(
    slurm: &dyn Slurm,
    job: &str,
    exclude: Vec<String>,
    journal: &mut Writer,
) -> Vec<String> {
    if exclude.is_empty() {
        return exclude;
    }
    let (Ok(info), Ok(all)) = (slurm.show_job(job), slurm.all_nodes()) else {
        return exclude;
    };
    let kept = decide::limit_exclusion(&info, &all, &exclude);
    if kept.len() < exclude.len() {
        journal.record(
            "exclusion_limited",
            json!({
                "wanted": exclude,
                "kept": kept,
                "reason": format!("the job needs {} node(s); excluding more would leave it unschedulable", info.num_nodes),
            }),
            true,
        );
    }
    kept
}

/// `scontrol requeue`, then the exclusion while Slurm tears the job down.
/// False when the job could not be requeued (said on stderr and journaled).
pub fn requeue(slurm: &dyn Slurm, job: &str, exclude: &[String], journal: &mut Writer) -> bool {
    requeue_with(slurm, job, exclude, journal, std::thread::sleep)
}

/// [`requeue`], pausing between tries of the exclusion with `sleep`.
fn requeue_with(
    slurm: &dyn Slurm,
    job: &str,
    exclude: &[String],
    journal: &mut Writer,
    sleep: impl FnMut(std::time::Duration),
) -> bool {
    let requeued = match slurm.requeue(job) {
        Ok(()) => Ok(()),
        // Slurm may have requeued the job itself (a node failure):
        // the exclusion still applies to the next attempt.
        Err(e) => match slurm.show_job(job) {
            Ok(info) if info.state.starts_with("PENDING") || info.state.starts_with("REQUEUE") => {
                journal.record(
                    "requeue",
                    json!({ "by": "slurm", "state": info.state }),
                    true,
                );
                Ok(())
            }
            _ => Err(e),
        },
    };
    if let Err(e) = requeued {
        eprintln!("resilio: requeue of job {job} failed: {e}");
        journal.record("requeue_failed", json!({ "error": e.to_string() }), true);
        return false;
    }
    // The exclusion can only be set once the job is no longer running:
    // right after the requeue, while Slurm tears it down.
    if exclude.is_empty() {
        return true;
    }
    match Retry::EXCLUSION.run(|| slurm.exclude_more(job, exclude), sleep) {
        Ok(all) => journal.record(
            "exclusion_set",
            json!({ "exc_node_list": crate::slurm::hostlist::compress(&all) }),
            true,
        ),
        Err(Some(e)) => {
            eprintln!(
                "resilio: could not exclude {} from job {job}: {e}",
                exclude.join(",")
            );
            journal.record("exclusion_failed", json!({ "error": e.to_string() }), true);
        }
        Err(None) => {}
    }
    // Requeued (even when the exclusion failed: the next attempt may land
    // on the node again, which the journal says).
    true
}

/// Carry out what the node history asks at an allocation's start.
pub fn start_plan(plan: StartPlan, job: &str, slurm: &dyn Slurm, journal: &mut Writer) -> AtStart {
    match plan {
        StartPlan::Run { listed } => {
            journal.record(
                "node_history_checked",
                json!({ "listed": listed, "in_allocation": [] }),
                false,
            );
            AtStart::Run
        }
        StartPlan::LeaveOut { here, nodes } => {
            for h in &here {
                journal.record(
                    "node_excluded",
                    json!({ "excluded_node": h.node, "reason": "node_history", "evidence": h.evidence, "scope": "step" }),
                    true,
                );
            }
            AtStart::LeaveOut {
                exclude: here.into_iter().map(|h| h.node).collect(),
                nodes,
            }
        }
        StartPlan::Warn { nodes, reason } => {
            journal.record(
                "node_history_warning",
                json!({ "nodes": nodes, "reason": reason }),
                true,
            );
            eprintln!(
                "resilio: the allocation holds node(s) the history lists ({}); running anyway",
                nodes.join(",")
            );
            AtStart::Run
        }
        StartPlan::Requeue { here } => requeue_for_history(&here, job, slurm, journal),
    }
}

/// One requeue that leaves the listed nodes out: not a failure, a decision
/// that costs no restart budget. A refused requeue runs the job where it is
/// rather than not at all.
fn requeue_for_history(
    here: &[Listed],
    job: &str,
    slurm: &dyn Slurm,
    journal: &mut Writer,
) -> AtStart {
    let names: Vec<String> = here.iter().map(|h| h.node.clone()).collect();
    let exclude = schedulable_exclusion(slurm, job, names, journal);
    if exclude.is_empty() {
        return AtStart::Run;
    }
    for h in here.iter().filter(|h| exclude.contains(&h.node)) {
        journal.record(
            "node_excluded",
            json!({ "excluded_node": h.node, "reason": "node_history", "evidence": h.evidence }),
            true,
        );
    }
    let reason = format!(
        "node history lists {} in this allocation and no spare node remains for the step",
        exclude.join(",")
    );
    journal.record(
        "decision",
        json!({
            "outcome": { "class": "clean", "signature": "node history", "last_step": null, "blamed_nodes": exclude },
            "decision": { "action": "requeue", "reason": reason },
        }),
        true,
    );
    journal.record(
        "requeue",
        json!({ "reason": reason, "exclude": exclude, "by": "node_history" }),
        true,
    );
    eprintln!("resilio: requeueing job {job}: {reason}");
    if requeue(slurm, job, &exclude, journal) {
        return AtStart::Requeued;
    }
    eprintln!("resilio: running job {job} on its allocation anyway");
    AtStart::Run
}

/// Journal an earlier allocation as Slurm saw it: `previous_attempt`, and
/// the `failure` and `decision` that [`decide::seen_by_slurm`] asks for.
pub fn journal_seen_by_slurm(
    alloc: u32,
    row: &AcctRecord,
    seen: &SeenBySlurm,
    journal: &mut Writer,
) {
    let a = seen.attempt;
    journal.record(
        "previous_attempt",
        json!({
            "about_attempt": a,
            "about_allocation": alloc,
            "state": row.state,
            "exit_code": row.exit_code,
            "nodes": crate::slurm::hostlist::compress(&row.nodes),
            "start": row.start,
            "end": row.end,
            "failed_nodes": seen.failed_nodes,
            "source": "sacct",
        }),
        true,
    );
    if seen.failure {
        journal.record(
            "failure",
            json!({
                "about_attempt": a,
                "failure_kind": if seen.node_fail { "node_failure" } else { "slurm" },
                "class": seen.class,
                "cause": if seen.node_fail { "node failure" } else { row.state.as_str() },
                "blamed_node": seen.failed_nodes.first(),
                "failed_nodes": seen.failed_nodes,
                "evidence": seen.evidence,
                "source": "sacct",
            }),
            true,
        );
    }
    if let Some(outcome) = &seen.outcome {
        journal.record(
            "decision",
            json!({
                "about_attempt": a,
                "outcome": outcome,
                "decision": { "action": "requeue", "reason": format!("requeued by Slurm ({})", row.state) },
                "source": "sacct",
            }),
            true,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{self, Record};
    use crate::slurm::fake::FakeSlurm;
    use crate::slurm::JobInfo;

    fn fake(state: &str) -> FakeSlurm {
        FakeSlurm::with_job(JobInfo {
            job_id: "5".into(),
            requeue: true,
            state: state.into(),
            excluded: vec!["n9".into()],
            ..JobInfo::default()
        })
    }

    fn kinds(dir: &std::path::Path) -> Vec<Record> {
        journal::read_job(dir).unwrap().records
    }

    #[test]
    fn a_refused_exclusion_is_tried_on_the_schedule_and_journaled() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), "batch.jsonl", 0, None, None);
        let f = fake("RUNNING");
        f.fail("set_excluded", "Job is no longer pending execution");
        let mut slept = std::time::Duration::ZERO;
        let nodes = vec!["n2".to_string()];
        assert!(requeue_with(&f, "5", &nodes, &mut w, |d| slept += d));
        let calls = f.calls();
        assert_eq!(calls[0], "requeue 5");
        assert_eq!(
            calls
                .iter()
                .filter(|c| c.starts_with("set_excluded"))
                .count(),
            20
        );
        assert_eq!(slept, std::time::Duration::from_secs(2));
        let recs = kinds(dir.path());
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].kind, "exclusion_failed");
    }

    #[test]
    fn a_job_slurm_requeued_itself_still_gets_its_exclusion() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), "batch.jsonl", 0, None, None);
        let f = fake("PENDING");
        f.fail("requeue", "Job is pending execution");
        let nodes = vec!["n2".to_string()];
        assert!(requeue_with(&f, "5", &nodes, &mut w, |_| unreachable!()));
        assert_eq!(
            f.calls(),
            [
                "requeue 5",
                "show_job 5",
                "show_job 5",
                "set_excluded 5 n9,n2"
            ]
        );
        let recs = kinds(dir.path());
        let k: Vec<&str> = recs.iter().map(|r| r.kind.as_str()).collect();
        assert_eq!(k, ["requeue", "exclusion_set"]);
        assert_eq!(recs[0].str("by"), Some("slurm"));
        assert_eq!(recs[1].str("exc_node_list"), Some("n[2,9]"));
        // Refused and still running: the requeue failed.
        let f = fake("RUNNING");
        f.fail("requeue", "Access/permission denied");
        assert!(!requeue_with(&f, "5", &nodes, &mut w, |_| unreachable!()));
        assert_eq!(kinds(dir.path()).last().unwrap().kind, "requeue_failed");
    }

    #[test]
    fn the_node_history_plan_is_carried_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), "batch.jsonl", 0, None, None);
        let here = vec![Listed {
            node: "n2".into(),
            evidence: "node history score 1.50 (threshold 1): Xid 79".into(),
        }];
        let f = fake("RUNNING");
        let out = start_plan(
            StartPlan::LeaveOut {
                here: here.clone(),
                nodes: 3,
            },
            "5",
            &f,
            &mut w,
        );
        assert_eq!(
            out,
            AtStart::LeaveOut {
                exclude: vec!["n2".into()],
                nodes: 3
            }
        );
        assert!(f.calls().is_empty());
        let out = start_plan(StartPlan::Requeue { here }, "5", &f, &mut w);
        assert_eq!(out, AtStart::Requeued);
        let recs = kinds(dir.path());
        let k: Vec<(&str, Option<&str>)> = recs
            .iter()
            .map(|r| (r.kind.as_str(), r.str("scope").or(r.str("by"))))
            .collect();
        assert_eq!(
            k,
            [
                ("node_excluded", Some("step")),
                ("node_excluded", None),
                ("decision", None),
                ("requeue", Some("node_history")),
                ("exclusion_set", None)
            ]
        );
    }
}
