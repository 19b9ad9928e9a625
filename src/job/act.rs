//! Carrying out the job level's decisions: the journal records, the Slurm
//! calls (through the [`Slurm`] trait, so that tests use the fake) and the
//! lines on stderr. What to do was decided in [`super::decide`].
//!
//! A requeue is `scontrol requeue`, then `ExcNodeList` while Slurm is still
//! tearing the job down (a running job's exclusion list cannot be changed;
//! SLURM-FACTS), tried on the schedule [`Retry::EXCLUSION`].

use super::decide::{self, Decision, Listed, SeenBySlurm, StartPlan};
use super::retry::Retry;
use crate::event as ev;
use crate::journal::Writer;
use crate::policy::restart::Action;
use crate::slurm::{AcctRecord, Slurm};

/// What the job-level supervisor does once it has decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Exit with this code (finished, stopped, or requeued: Slurm starts the next attempt).
    Exit(i32),
    /// Relaunch the step inside the allocation.
    Relaunch(crate::slurm::step::NextAttempt),
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
    if primary.verdict.grounds == crate::policy::failure::Grounds::AgentDied {
        // The rank left no record of its own: its failure is journaled here.
        journal.write(
            ev::Failure {
                failure_kind: Some(ev::FailureKind::AgentDied),
                cause: Some(format!("the agent of rank {} died", primary.rank)),
                class: Some(primary.verdict.class),
                class_reason: Some(primary.verdict.reason.clone()),
                evidence: primary.verdict.evidence.clone(),
                detail: primary.verdict.evidence.clone(),
                // The dead agent's node (this record is written elsewhere).
                blamed_node: Some(primary.node.clone()),
                ..Default::default()
            },
            true,
        );
    }
    journal.write(
        ev::Judgment {
            class: j.class,
            primary_rank: (primary.rank != u32::MAX && j.culprit).then_some(primary.rank),
            primary_node: j.culprit.then(|| primary.node.clone()),
            why: j.why.clone(),
            evidence: d.evidence.clone(),
            reason: primary.verdict.reason.clone(),
            blamed_nodes: j.blamed_nodes.clone(),
            secondary: d.secondary.clone(),
        },
        true,
    );
    journal.write(
        ev::Decision {
            outcome: (&d.outcome).into(),
            decision: Some(d.action.clone()),
            suspect_checkpoint: d.suspect,
            ..Default::default()
        },
        true,
    );
}

/// A decision's action in words, for observe mode's record ("would ...").
pub fn describe(a: &Action) -> String {
    let leaving = |exclude: &[String]| {
        if exclude.is_empty() {
            String::new()
        } else {
            format!(", excluding {}", exclude.join(","))
        }
    };
    match a {
        Action::Finish => "finish".into(),
        Action::Stop { reason, .. } => format!("stop the job: {reason}"),
        Action::RestartInPlace { reason } => format!("restart every rank in place: {reason}"),
        Action::RestartInAllocation {
            exclude,
            nodes,
            reason,
        } => format!(
            "relaunch the step inside the allocation on {nodes} node(s){}: {reason}",
            leaving(exclude)
        ),
        Action::Requeue { exclude, reason } => {
            format!("requeue the job{}: {reason}", leaving(exclude))
        }
        Action::Unknown => "an action this build does not know".into(),
    }
}

pub fn job_end(journal: &mut Writer, exit_code: i32, reason: &str) {
    journal.write(
        ev::JobEnd {
            exit_code,
            reason: Some(reason.to_string()),
        },
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
        // (Unknown is only ever read from a journal, never decided.)
        Action::Finish | Action::Unknown => job_end(journal, exit_code, "completed"),
        // Local mode's decision (never taken for a Slurm job): the failure stands.
        Action::Stop { reason, .. } | Action::RestartInPlace { reason } => {
            tracing::warn!("job {job} not requeued: {reason}");
            job_end(journal, exit_code, &reason);
        }
        Action::RestartInAllocation {
            exclude,
            nodes,
            reason,
        } => {
            let newly = exclude.iter().filter(|n| !before.contains(n));
            journal_excluded(
                journal,
                newly,
                Some(ev::ExcludedFrom::Step),
                class,
                &d.evidence,
            );
            let next = crate::slurm::step::NextAttempt {
                attempt: attempt + 1,
                failed_at_us: (d.primary.at * 1e6) as i64,
                nodes,
                exclude,
            };
            journal.write(
                ev::Restart {
                    next_attempt: next.attempt,
                    reason: reason.clone(),
                    in_allocation: Some(true),
                    exclude: Some(next.exclude.clone()),
                    nodes: Some(nodes),
                    ..Default::default()
                },
                true,
            );
            tracing::info!(
                "relaunching the step of job {job} inside the allocation (attempt {}): {reason}",
                next.attempt
            );
            return Next::Relaunch(next);
        }
        Action::Requeue { exclude, reason } => {
            let wanted = exclude.clone();
            let exclude = schedulable_exclusion(slurm, job, exclude, journal);
            // The decision's words name what it wanted left out: say what
            // was kept after all, so that the line matches what was done.
            let kept_in: Vec<String> = wanted
                .into_iter()
                .filter(|n| !exclude.contains(n))
                .collect();
            let reason = if kept_in.is_empty() {
                reason
            } else {
                format!(
                    "{reason}; {} not excluded after all: the job could not run without it",
                    crate::slurm::hostlist::compress(&kept_in)
                )
            };
            let newly = exclude.iter().filter(|n| !before.contains(n));
            journal_excluded(journal, newly, None, class, &d.evidence);
            journal.write(
                ev::Requeue {
                    reason: Some(reason.clone()),
                    exclude: Some(exclude.clone()),
                    ..Default::default()
                },
                true,
            );
            tracing::info!("requeueing job {job}: {reason}");
            if !requeue(slurm, job, &exclude, journal) {
                job_end(journal, exit_code, "requeue failed");
            }
        }
    }
    Next::Exit(exit_code)
}

/// `node_excluded` for each node newly left out (`scope`: `step` inside
/// the allocation; none for the job's next allocation).
fn journal_excluded<'n>(
    journal: &mut Writer,
    nodes: impl Iterator<Item = &'n String>,
    scope: Option<ev::ExcludedFrom>,
    class: crate::policy::failure::Class,
    evidence: &str,
) {
    for node in nodes {
        journal.write(
            ev::NodeExcluded {
                excluded_node: node.clone(),
                scope,
                reason: class.name().into(),
                evidence: evidence.to_string(),
            },
            true,
        );
    }
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
        journal.write(
            ev::ExclusionLimited {
                wanted: exclude.clone(),
                kept: kept.clone(),
                reason:
                    if exclude.iter().any(|n| info.required.contains(n)) {
                        format!(
                            "the job requires {} (-w): excluding a required node would leave it pending forever",
                            crate::slurm::hostlist::compress(&info.required)
                        )
                    } else {
                        format!(
                            "the job needs {} node(s); excluding more would leave it unschedulable",
                            info.num_nodes
                        )
                    },
            },
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
                journal.write(
                    ev::Requeue {
                        by: Some(ev::RequeueBy::Slurm),
                        state: Some(info.state.clone()),
                        ..Default::default()
                    },
                    true,
                );
                Ok(())
            }
            _ => Err(e),
        },
    };
    if let Err(e) = requeued {
        tracing::warn!("requeue of job {job} failed: {e}");
        journal.write(
            ev::RequeueFailed {
                error: e.to_string(),
            },
            true,
        );
        return false;
    }
    // The exclusion can only be set once the job is no longer running:
    // right after the requeue, while Slurm tears it down.
    exclude_next(slurm, job, exclude, journal, sleep);
    // Requeued (even when the exclusion failed: the next attempt may land
    // on the node again, which the journal says).
    true
}

/// Exclude `exclude` from the requeued job's next allocation, tried on the
/// schedule [`Retry::EXCLUSION`]; journaled (`exclusion_set` or
/// `exclusion_failed`).
fn exclude_next(
    slurm: &dyn Slurm,
    job: &str,
    exclude: &[String],
    journal: &mut Writer,
    sleep: impl FnMut(std::time::Duration),
) {
    if exclude.is_empty() {
        return;
    }
    match Retry::EXCLUSION.run(|| slurm.exclude_more(job, exclude), sleep) {
        Ok(all) => journal.write(
            ev::ExclusionSet {
                exc_node_list: crate::slurm::hostlist::compress(&all),
            },
            true,
        ),
        Err(Some(e)) => {
            tracing::warn!(
                "could not exclude {} from job {job}: {e}",
                exclude.join(",")
            );
            journal.write(
                ev::ExclusionFailed {
                    error: e.to_string(),
                },
                true,
            );
        }
        Err(None) => {}
    }
}

/// Slurm requeued the job itself (seen when its SIGTERM reached the job
/// level): journal it, lower the pending job's node count where its spares
/// were spent, and exclude the failed nodes from the next allocation.
pub fn after_slurm_requeue(
    plan: decide::AfterSlurmRequeue,
    info: &crate::slurm::JobInfo,
    job: &str,
    slurm: &dyn Slurm,
    journal: &mut Writer,
) {
    let reason = if plan.exclude.is_empty() {
        "Slurm requeued the job itself (a preemption, or a failure Slurm saw)".to_string()
    } else {
        format!(
            "Slurm requeued the job itself after a node failure ({})",
            crate::slurm::hostlist::compress(&plan.exclude)
        )
    };
    tracing::warn!("{reason}");
    journal.write(
        ev::Requeue {
            by: Some(ev::RequeueBy::Slurm),
            state: Some(info.state.clone()),
            reason: Some(reason),
            exclude: Some(plan.exclude.clone()),
        },
        true,
    );
    // Lowered first: how many nodes the exclusion may take depends on it.
    if let Some(n) = plan.num_nodes {
        // Like the exclusion, possible once the job is no longer running.
        let tasks = plan.num_tasks;
        match Retry::EXCLUSION.run(|| slurm.set_size(job, n, tasks), std::thread::sleep) {
            Ok(()) => journal.write(
                ev::NodeCountLowered {
                    from: plan.requested,
                    to: n,
                    reason: "the spare nodes were spent on the failed ones: the job starts on what is left ([run] shrink_after_node_failure)".into(),
                },
                true,
            ),
            Err(e) => {
                let e = e.map_or("no answer".to_string(), |e| e.to_string());
                tracing::warn!("could not lower job {job}'s node count to {n}: {e}");
                journal.write(
                    ev::MonitorError {
                        error: format!("lowering the node count to {n}: {e}"),
                    },
                    true,
                );
            }
        }
    }
    let exclude = schedulable_exclusion(slurm, job, plan.exclude, journal);
    exclude_next(slurm, job, &exclude, journal, std::thread::sleep);
}

/// Carry out what the node history asks at an allocation's start.
pub fn start_plan(plan: StartPlan, job: &str, slurm: &dyn Slurm, journal: &mut Writer) -> AtStart {
    match plan {
        StartPlan::Run { listed } => {
            journal.write(
                ev::NodeHistoryChecked {
                    listed,
                    in_allocation: Vec::new(),
                },
                false,
            );
            AtStart::Run
        }
        StartPlan::LeaveOut { here, nodes } => {
            for h in &here {
                journal.write(
                    ev::NodeExcluded {
                        excluded_node: h.node.clone(),
                        scope: Some(ev::ExcludedFrom::Step),
                        reason: "node_history".into(),
                        evidence: h.evidence.clone(),
                    },
                    true,
                );
            }
            AtStart::LeaveOut {
                exclude: here.into_iter().map(|h| h.node).collect(),
                nodes,
            }
        }
        StartPlan::Warn { nodes, reason } => {
            journal.write(
                ev::NodeHistoryWarning {
                    nodes: nodes.clone(),
                    reason: reason.to_string(),
                },
                true,
            );
            tracing::warn!(
                "the allocation holds node(s) the history lists ({}); running anyway",
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
        journal.write(
            ev::NodeExcluded {
                excluded_node: h.node.clone(),
                scope: None,
                reason: "node_history".into(),
                evidence: h.evidence.clone(),
            },
            true,
        );
    }
    let reason = format!(
        "node history lists {} in this allocation and no spare node remains for the step",
        exclude.join(",")
    );
    journal.write(
        ev::Decision {
            outcome: ev::Outcome {
                class: Some(crate::event::Class::Clean),
                signature: Some("node history".into()),
                blamed_nodes: exclude.clone(),
                ..Default::default()
            },
            decision: Some(Action::Requeue {
                exclude: exclude.clone(),
                reason: reason.clone(),
            }),
            ..Default::default()
        },
        true,
    );
    journal.write(
        ev::Requeue {
            by: Some(ev::RequeueBy::NodeHistory),
            reason: Some(reason.clone()),
            exclude: Some(exclude.clone()),
            ..Default::default()
        },
        true,
    );
    tracing::info!("requeueing job {job}: {reason}");
    if requeue(slurm, job, &exclude, journal) {
        return AtStart::Requeued;
    }
    tracing::info!("running job {job} on its allocation anyway");
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
    journal.write(
        ev::PreviousAttempt {
            about_attempt: a,
            about_allocation: alloc,
            state: row.state.clone(),
            exit_code: row.exit_code.clone(),
            nodes: crate::slurm::hostlist::compress(&row.nodes),
            failed_nodes: seen.failed_nodes.clone(),
            start: row.start.clone(),
            end: row.end.clone(),
            source: ev::ToldBy::Sacct,
        },
        true,
    );
    if seen.failure {
        let (kind, cause) = if seen.node_fail {
            (ev::FailureKind::NodeFailure, "node failure")
        } else {
            (ev::FailureKind::Slurm, row.state.as_str())
        };
        journal.write(
            ev::Failure {
                about_attempt: Some(a),
                failure_kind: Some(kind),
                class: Some(seen.class),
                cause: Some(cause.into()),
                blamed_node: seen.failed_nodes.first().cloned(),
                failed_nodes: Some(seen.failed_nodes.clone()),
                evidence: Some(seen.evidence.clone()),
                source: Some(ev::ToldBy::Sacct),
                ..Default::default()
            },
            true,
        );
    }
    if let Some(outcome) = &seen.outcome {
        journal.write(
            ev::Decision {
                about_attempt: Some(a),
                outcome: outcome.into(),
                decision: Some(Action::Requeue {
                    exclude: Vec::new(),
                    reason: format!("requeued by Slurm ({})", row.state),
                }),
                source: Some(ev::ToldBy::Sacct),
                suspect_checkpoint: None,
            },
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
