//! The job-level decision after an attempt, taken by the `resilio run` that
//! wraps the job's steps in the batch script
//! (`resilio run -- srun resilio run -- python train.py`).
//!
//! When the step has ended, every rank's agent has journaled its end with a
//! verdict (`rank_exit.class`). This module reads them from the shared
//! journal (plus srun's own error lines, for ranks whose agents died with
//! their node), judges which failure was primary, decides with the restart
//! policy, journals the decision, and acts through the [`Slurm`] trait:
//! `scontrol requeue`, then `ExcNodeList` while Slurm is still tearing the
//! job down (a running job's exclusion list cannot be changed; see
//! SLURM-FACTS).

use crate::journal::{self, Record, Writer};
use crate::policy::failure::{self, Class, Judgment, RankFailure, Verdict};
use crate::policy::restart::{self, Action, AttemptOutcome};
use crate::slurm::Slurm;
use serde_json::json;
use std::path::Path;

/// What the batch-level agent knows about its own child (srun, or a single trainer).
pub struct StepEnd<'a> {
    pub exit_code: i32,
    pub verdict: &'a Verdict,
    /// The child's last output lines (srun's `srun: error:` lines are here).
    pub tail: &'a [String],
    pub node: &'a str,
    /// Slurm's pre-timeout signal arrived during the attempt.
    pub pre_timeout: bool,
}

fn class_of(name: &str) -> Option<Class> {
    Some(match name {
        "clean" => Class::Clean,
        "user_error" => Class::UserError,
        "infrastructure" => Class::Infrastructure,
        "hang" => Class::Hang,
        "secondary" => Class::Secondary,
        "preempted" => Class::Preempted,
        _ => return None,
    })
}

fn secs(r: &Record) -> f64 {
    r.ts.timestamp_micros() as f64 / 1e6
}

/// Failures srun reports for tasks whose agents could not (node crash).
/// `srun: error: n3: task 2: Exited with exit code 137`,
/// `srun: error: Node failure on n2`.
pub fn srun_failures(tail: &[String], at: f64) -> Vec<RankFailure> {
    let mut out = Vec::new();
    for line in tail {
        let Some(rest) = line.trim().strip_prefix("srun: error: ") else {
            continue;
        };
        if let Some(node) = rest.strip_prefix("Node failure on ") {
            let node = node.trim().to_string();
            if crate::slurm::hostlist::valid_node_name(&node) {
                out.push(RankFailure {
                    rank: u32::MAX,
                    node,
                    at,
                    verdict: Verdict {
                        class: Class::Infrastructure,
                        reason: "Slurm reported a node failure".into(),
                        evidence: Some(line.trim().to_string()),
                    },
                });
            }
            continue;
        }
        // "<node>: task <n>: <what>"
        let mut parts = rest.splitn(3, ": ");
        let (Some(node), Some(task), Some(what)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Some(rank) = task
            .strip_prefix("task ")
            .and_then(|t| t.trim().parse::<u32>().ok())
        else {
            continue;
        };
        if !crate::slurm::hostlist::valid_node_name(node) {
            continue;
        }
        let code: Option<i32> = what
            .strip_prefix("Exited with exit code ")
            .and_then(|c| c.trim().parse().ok());
        let class = match (code, what) {
            (Some(137), _) | (_, "Killed") => Class::Infrastructure,
            (_, w) if w.starts_with("Terminated") => Class::Secondary,
            _ => Class::UserError,
        };
        out.push(RankFailure {
            rank,
            node: node.to_string(),
            at,
            verdict: Verdict {
                class,
                reason: format!("srun: {what}"),
                evidence: Some(line.trim().to_string()),
            },
        });
    }
    out
}

/// Judge this attempt from the journal records of its ranks and srun's lines.
pub fn judge_attempt(
    records: &[Record],
    attempt: u32,
    step: &StepEnd<'_>,
) -> (Vec<RankFailure>, Option<Judgment>) {
    let mut failures: Vec<RankFailure> = records
        .iter()
        .filter(|r| r.attempt == attempt && r.kind == "rank_exit" && r.rank.is_some())
        .filter_map(|r| {
            Some(RankFailure {
                rank: r.rank?,
                node: r.node.clone().unwrap_or_default(),
                at: secs(r),
                verdict: Verdict {
                    class: class_of(r.str("class")?)?,
                    reason: r.str("class_reason").unwrap_or("").to_string(),
                    evidence: r.str("evidence").map(str::to_string),
                },
            })
        })
        .collect();
    // Ranks journaled by their agents are known; srun adds the silent ones.
    let now = chrono::Utc::now().timestamp_micros() as f64 / 1e6;
    for f in srun_failures(step.tail, now) {
        if !failures
            .iter()
            .any(|g| g.rank == f.rank && f.rank != u32::MAX)
        {
            failures.push(f);
        }
    }
    if failures.iter().all(|f| f.verdict.class == Class::Clean) && step.exit_code != 0 {
        // Nothing journaled a failure, yet the step failed: our own view.
        failures.push(RankFailure {
            rank: u32::MAX,
            node: step.node.to_string(),
            at: now,
            verdict: step.verdict.clone(),
        });
    }
    let judgment = failure::primary(&failures);
    (failures, judgment)
}

/// The outcomes of earlier attempts, from their `decision` records.
pub fn earlier_outcomes(records: &[Record], attempt: u32) -> Vec<AttemptOutcome> {
    records
        .iter()
        .filter(|r| r.kind == "decision" && r.attempt < attempt)
        .filter_map(|r| {
            let o = r.get("outcome")?;
            Some(AttemptOutcome {
                attempt: r.attempt,
                class: class_of(o.get("class")?.as_str()?)?,
                signature: o.get("signature")?.as_str()?.to_string(),
                last_step: o.get("last_step").and_then(|v| v.as_u64()),
                blamed_nodes: o
                    .get("blamed_nodes")
                    .and_then(|v| v.as_array())
                    .map(|a| {
                        a.iter()
                            .filter_map(|n| n.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// Judge, decide, journal, act. Returns the exit code resilio should exit with.
pub fn after_attempt(
    state_dir: &Path,
    job: &str,
    attempt: u32,
    step: &StepEnd<'_>,
    max_restarts: u32,
    slurm: &dyn Slurm,
    journal: &mut Writer,
) -> i32 {
    let records = journal::read_job(&journal::job_dir(state_dir, job))
        .map(|j| j.records)
        .unwrap_or_default();
    let (failures, judgment) = judge_attempt(&records, attempt, step);
    let last_step = records
        .iter()
        .filter(|r| r.attempt == attempt)
        .filter_map(|r| match r.kind.as_str() {
            "rank_exit" => r.u64("last_step"),
            "progress" => r.u64("step"),
            _ => None,
        })
        .max();
    let Some(j) = judgment else {
        journal.record(
            "job_end",
            json!({ "exit_code": step.exit_code, "reason": "completed" }),
            true,
        );
        return step.exit_code;
    };
    let primary = &failures[j.primary];
    let evidence = primary
        .verdict
        .evidence
        .clone()
        .unwrap_or_else(|| primary.verdict.reason.clone());
    let outcome = AttemptOutcome {
        attempt,
        class: j.class,
        signature: restart::signature_of(j.class, &evidence),
        last_step,
        blamed_nodes: j.blamed_nodes.clone(),
    };
    let secondary: Vec<String> = failures
        .iter()
        .enumerate()
        .filter(|(i, f)| *i != j.primary && f.verdict.class != Class::Clean)
        .map(|(_, f)| format!("rank {} on {}: {}", f.rank, f.node, f.verdict.class.name()))
        .collect();
    journal.record(
        "judgment",
        json!({
            "class": j.class,
            "primary_rank": (primary.rank != u32::MAX).then_some(primary.rank),
            "primary_node": primary.node,
            "why": j.why,
            "evidence": evidence,
            "reason": primary.verdict.reason,
            "blamed_nodes": j.blamed_nodes,
            "secondary": secondary,
        }),
        true,
    );
    let requeue_allowed = match slurm.show_job(job) {
        Ok(info) => info.requeue,
        Err(e) => {
            eprintln!("resilio: cannot read job {job} from Slurm: {e}");
            false
        }
    };
    let earlier = earlier_outcomes(&records, attempt);
    let action = if outcome.class == Class::Preempted && !step.pre_timeout {
        // Stopped from outside with no warning: scancel, or a time limit the
        // job did not ask to be warned of. Requeueing would undo a cancel.
        Action::Stop {
            reason: "stopped from outside (scancel, or a time limit without --signal=B:USR1@N): not requeued".into(),
        }
    } else {
        restart::decide(&outcome, &earlier, max_restarts, requeue_allowed)
    };
    journal.record(
        "decision",
        json!({ "outcome": outcome, "decision": action }),
        true,
    );
    match action {
        Action::Finish => {
            journal.record(
                "job_end",
                json!({ "exit_code": step.exit_code, "reason": "completed" }),
                true,
            );
        }
        Action::Stop { reason } => {
            eprintln!("resilio: job {job} not requeued: {reason}");
            journal.record(
                "job_end",
                json!({ "exit_code": step.exit_code, "reason": reason }),
                true,
            );
        }
        Action::Requeue { exclude, reason } => {
            for node in &exclude {
                journal.record(
                    "node_excluded",
                    json!({ "excluded_node": node, "reason": j.class, "evidence": evidence }),
                    true,
                );
            }
            journal.record(
                "requeue",
                json!({ "reason": reason, "exclude": exclude }),
                true,
            );
            eprintln!("resilio: requeueing job {job}: {reason}");
            match slurm.requeue(job) {
                Err(e) => {
                    eprintln!("resilio: requeue of job {job} failed: {e}");
                    journal.record("requeue_failed", json!({ "error": e.to_string() }), true);
                    journal.record(
                        "job_end",
                        json!({ "exit_code": step.exit_code, "reason": "requeue failed" }),
                        true,
                    );
                }
                Ok(()) => {
                    // The exclusion can only be set once the job is no longer
                    // running: right after the requeue, while Slurm tears it down.
                    if !exclude.is_empty() {
                        let mut last_err = None;
                        for _ in 0..20 {
                            match slurm.exclude_more(job, &exclude) {
                                Ok(all) => {
                                    journal.record("exclusion_set", json!({ "exc_node_list": crate::slurm::hostlist::compress(&all) }), true);
                                    last_err = None;
                                    break;
                                }
                                Err(e) => {
                                    last_err = Some(e);
                                    std::thread::sleep(std::time::Duration::from_millis(100));
                                }
                            }
                        }
                        if let Some(e) = last_err {
                            eprintln!(
                                "resilio: could not exclude {} from job {job}: {e}",
                                exclude.join(",")
                            );
                            journal.record(
                                "exclusion_failed",
                                json!({ "error": e.to_string() }),
                                true,
                            );
                        }
                    }
                }
            }
        }
    }
    step.exit_code
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::fake::FakeSlurm;
    use crate::slurm::JobInfo;

    fn rank_exit(
        dir: &Path,
        rank: u32,
        node: &str,
        attempt: u32,
        class: &str,
        evidence: Option<&str>,
        step: u64,
    ) {
        let mut w = Writer::open(
            dir,
            &format!("rank-{rank}.jsonl"),
            attempt,
            Some(rank),
            Some(node.into()),
        );
        w.record(
            "rank_exit",
            json!({ "class": class, "evidence": evidence, "class_reason": "", "last_step": step, "exit_code": 1 }),
            true,
        );
    }

    fn fake(requeue: bool) -> FakeSlurm {
        FakeSlurm::with_job(JobInfo {
            job_id: "77".into(),
            requeue,
            excluded: vec!["n9".into()],
            ..JobInfo::default()
        })
    }

    #[test]
    fn infrastructure_primary_is_excluded_and_requeued() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        rank_exit(
            &dir,
            1,
            "n2",
            0,
            "infrastructure",
            Some("killed by SIGKILL"),
            40,
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
        rank_exit(
            &dir,
            0,
            "n1",
            0,
            "secondary",
            Some("Connection closed by peer"),
            40,
        );
        rank_exit(
            &dir,
            2,
            "n3",
            0,
            "secondary",
            Some("Connection reset by peer"),
            41,
        );
        let mut w = Writer::open(&dir, "batch.jsonl", 0, None, Some("n1".into()));
        let v = Verdict {
            class: Class::UserError,
            reason: "exit 1".into(),
            evidence: None,
        };
        let f = fake(true);
        let tail = vec!["srun: error: n2: task 1: Exited with exit code 137".to_string()];
        let step = StepEnd {
            exit_code: 137,
            verdict: &v,
            tail: &tail,
            node: "n1",
            pre_timeout: false,
        };
        let code = after_attempt(state.path(), "77", 0, &step, 3, &f, &mut w);
        assert_eq!(code, 137);
        assert_eq!(
            f.calls(),
            [
                "show_job 77",
                "requeue 77",
                "show_job 77",
                "set_excluded 77 n9,n2"
            ]
        );
        let recs = journal::read_job(&dir).unwrap().records;
        let kinds: Vec<&str> = recs
            .iter()
            .filter(|r| r.rank.is_none())
            .map(|r| r.kind.as_str())
            .collect();
        assert_eq!(
            kinds,
            [
                "judgment",
                "decision",
                "node_excluded",
                "requeue",
                "exclusion_set"
            ]
        );
        let j = recs.iter().find(|r| r.kind == "judgment").unwrap();
        assert_eq!(j.u64("primary_rank"), Some(1));
        assert_eq!(j.get("secondary").unwrap().as_array().unwrap().len(), 2);
    }

    #[test]
    fn user_error_is_not_requeued_and_crash_loop_stops() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        rank_exit(&dir, 0, "n1", 0, "user_error", Some("KeyError: 'model'"), 3);
        let mut w = Writer::open(&dir, "batch.jsonl", 0, None, None);
        let v = Verdict {
            class: Class::UserError,
            reason: "exit 1".into(),
            evidence: None,
        };
        let f = fake(true);
        let step = StepEnd {
            exit_code: 1,
            verdict: &v,
            tail: &[],
            node: "n1",
            pre_timeout: false,
        };
        assert_eq!(
            after_attempt(state.path(), "77", 0, &step, 3, &f, &mut w),
            1
        );
        assert!(!f.calls().iter().any(|c| c.starts_with("requeue")));

        // Same infrastructure failure at the same step on two attempts.
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        let f = fake(true);
        for attempt in 0..2 {
            rank_exit(
                &dir,
                0,
                &format!("n{}", attempt + 1),
                attempt,
                "infrastructure",
                Some("killed by SIGKILL"),
                50,
            );
            let mut w = Writer::open(&dir, "batch.jsonl", attempt, None, None);
            let step = StepEnd {
                exit_code: 137,
                verdict: &v,
                tail: &[],
                node: "n1",
                pre_timeout: false,
            };
            after_attempt(state.path(), "77", attempt, &step, 3, &f, &mut w);
        }
        assert_eq!(
            f.calls()
                .iter()
                .filter(|c| c.starts_with("requeue"))
                .count(),
            1,
            "{:?}",
            f.calls()
        );
        let recs = journal::read_job(&dir).unwrap().records;
        let last = recs.iter().rev().find(|r| r.kind == "job_end").unwrap();
        assert!(
            last.str("reason").unwrap().starts_with("crash loop"),
            "{last:?}"
        );
    }

    #[test]
    fn a_job_without_requeue_says_so() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        rank_exit(&dir, 0, "n1", 0, "infrastructure", Some("Xid 79"), 5);
        let mut w = Writer::open(&dir, "batch.jsonl", 0, None, None);
        let v = Verdict {
            class: Class::Infrastructure,
            reason: "x".into(),
            evidence: None,
        };
        let f = fake(false);
        let step = StepEnd {
            exit_code: 1,
            verdict: &v,
            tail: &[],
            node: "n1",
            pre_timeout: false,
        };
        after_attempt(state.path(), "77", 0, &step, 3, &f, &mut w);
        let recs = journal::read_job(&dir).unwrap().records;
        let end = recs.iter().find(|r| r.kind == "job_end").unwrap();
        assert!(end.str("reason").unwrap().contains("--requeue"));
    }

    #[test]
    fn a_stop_from_outside_is_requeued_only_after_the_pre_timeout_signal() {
        for (pre_timeout, requeued) in [(false, false), (true, true)] {
            let state = tempfile::tempdir().unwrap();
            let dir = journal::job_dir(state.path(), "77");
            rank_exit(&dir, 0, "n1", 0, "preempted", None, 30);
            let mut w = Writer::open(&dir, "batch.jsonl", 0, None, None);
            let v = Verdict {
                class: Class::Preempted,
                reason: "stopped".into(),
                evidence: None,
            };
            let f = fake(true);
            let step = StepEnd {
                exit_code: 143,
                verdict: &v,
                tail: &[],
                node: "n1",
                pre_timeout,
            };
            after_attempt(state.path(), "77", 0, &step, 3, &f, &mut w);
            assert_eq!(
                f.calls().iter().any(|c| c.starts_with("requeue")),
                requeued,
                "pre_timeout {pre_timeout}"
            );
        }
    }

    #[test]
    fn srun_lines_name_silent_ranks() {
        let f = srun_failures(
            &[
                "srun: error: n3: task 2: Exited with exit code 137".into(),
                "srun: error: n1: task 0: Terminated".into(),
                "srun: error: Node failure on n4".into(),
                "srun: error: n2: task 1: Exited with exit code 1".into(),
                "noise".into(),
            ],
            1.0,
        );
        let summary: Vec<(u32, &str, Class)> = f
            .iter()
            .map(|f| (f.rank, f.node.as_str(), f.verdict.class))
            .collect();
        assert_eq!(
            summary,
            [
                (2, "n3", Class::Infrastructure),
                (0, "n1", Class::Secondary),
                (u32::MAX, "n4", Class::Infrastructure),
                (1, "n2", Class::UserError)
            ]
        );
    }
}
