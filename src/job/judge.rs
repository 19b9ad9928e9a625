//! Judging an attempt from what its ranks journaled: pure, reading no
//! clock (the step's end comes in [`StepEnd::ended`]) and writing nothing.
//!
//! Every rank's agent has journaled its end with a verdict
//! (`rank_exit.class`); srun's own error lines name the ranks whose agents
//! died with their node; the coordinator's `hang` and `straggler_exclusion`
//! records name a cause the ranks cannot see. [`judge_attempt`] finds the
//! primary failure among them; [`earlier_outcomes`] reads back what earlier
//! attempts were judged, for the crash-loop guard and the budget.

use crate::event::Event;
use crate::journal::{self, Record};
use crate::policy::failure::{self, Class, Judgment, RankFailure, Verdict};
use crate::policy::restart::AttemptOutcome;

/// What the batch-level agent knows about its own child (srun, or a single trainer).
pub struct StepEnd<'a> {
    pub exit_code: i32,
    pub verdict: &'a Verdict,
    /// The child's last output lines (srun's `srun: error:` lines are here).
    pub tail: &'a [String],
    pub node: &'a str,
    /// Slurm's pre-timeout signal arrived during the attempt.
    pub pre_timeout: bool,
    /// When the step ended (srun's failure lines are dated by it): passed
    /// in, so that judging reads no clock.
    pub ended: chrono::DateTime<chrono::Utc>,
}

pub(crate) fn secs(r: &Record) -> f64 {
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
        // An agent that reports 137 saw its trainer SIGKILLed; a task that
        // was itself "Killed" or "Terminated" is srun tearing the step down.
        let class = match (code, what) {
            (Some(137), _) => Class::Infrastructure,
            (_, w) if w.starts_with("Terminated") || w.starts_with("Killed") => Class::Secondary,
            _ => Class::Unknown,
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

/// Judge this attempt from the journal records of its ranks and srun's
/// lines. Pure: the step's end time comes in `step.ended`.
pub fn judge_attempt(
    records: &[Record],
    attempt: u32,
    step: &StepEnd<'_>,
) -> (Vec<RankFailure>, Option<Judgment>) {
    let mut failures = journaled_failures(records, attempt);
    hung_first(records, attempt, &mut failures);
    straggler_left_out(records, attempt, &mut failures);
    add_unjournaled(step, &mut failures);
    let judgment = failure::primary(&failures);
    (failures, judgment)
}

/// The ranks' own verdicts, from their `rank_exit` records.
fn journaled_failures(records: &[Record], attempt: u32) -> Vec<RankFailure> {
    journal::events(records)
        .filter(|(r, _)| r.attempt == attempt)
        .filter_map(|(r, e)| {
            let Event::RankExit(x) = e else { return None };
            Some(RankFailure {
                rank: r.rank?,
                node: r.node.clone().unwrap_or_default(),
                at: secs(r),
                verdict: Verdict {
                    class: x.class?,
                    reason: x.class_reason.unwrap_or_default(),
                    evidence: x.evidence,
                },
            })
        })
        .collect()
}

/// The coordinator's job-wide judgment of a hang names the rank that hung
/// first: it is the cause, the ranks that stalled waiting for it are echoes.
fn hung_first(records: &[Record], attempt: u32, failures: &mut [RankFailure]) {
    let Some(h) = records
        .iter()
        .rev()
        .filter(|r| r.kind == "hang" && r.attempt == attempt)
        .find_map(|r| match r.event() {
            Some(Event::Hang(h)) => Some(h),
            _ => None,
        })
    else {
        return;
    };
    let v = h.verdict.unwrap_or_default();
    let blamed = v.blamed_ranks;
    let why = v.reason.unwrap_or_default();
    if blamed.is_empty() {
        return;
    }
    // A rank that finished cleanly (its trainer ended on its own
    // while the hang was being judged) is no one's hang.
    for f in failures
        .iter_mut()
        .filter(|f| f.verdict.class != Class::Clean)
    {
        if blamed.contains(&f.rank) {
            f.verdict = Verdict {
                class: Class::Hang,
                reason: "hung first (the coordinator's job-wide judgment)".into(),
                evidence: Some(why.clone()),
            };
        } else if matches!(f.verdict.class, Class::Hang | Class::Preempted) {
            f.verdict = Verdict {
                class: Class::Secondary,
                reason: "stalled waiting for the rank that hung first".into(),
                evidence: Some(why.clone()),
            };
        }
    }
}

/// The coordinator stopped the step to leave a confirmed straggler node
/// out: that node is the cause, every rank stopped with it an echo.
fn straggler_left_out(records: &[Record], attempt: u32, failures: &mut Vec<RankFailure>) {
    let Some((r, x)) = records
        .iter()
        .rev()
        .filter(|r| r.kind == "straggler_exclusion" && r.attempt == attempt)
        .find_map(|r| match r.event() {
            Some(Event::StragglerExclusion(x)) => Some((r, x)),
            _ => None,
        })
    else {
        return;
    };
    let node = x.straggler_node.clone().unwrap_or_default();
    let rank = x.about_rank.unwrap_or(u32::MAX);
    failures.retain(|f| f.rank != rank);
    for f in failures.iter_mut() {
        if !matches!(f.verdict.class, Class::Clean | Class::UserError) {
            f.verdict = Verdict {
                class: Class::Secondary,
                reason: "stopped to leave a straggling node out".into(),
                evidence: f.verdict.evidence.clone(),
            };
        }
    }
    failures.push(RankFailure {
        rank,
        node,
        at: secs(r),
        verdict: Verdict {
            class: Class::Infrastructure,
            reason: "confirmed straggler node (the coordinator's judgment)".into(),
            evidence: x.evidence.map(|e| format!("straggler: {e}")),
        },
    });
}

/// Ranks journaled by their agents are known; srun adds the silent ones
/// (unless the supervisor stopped the step itself: then srun's lines are
/// the teardown it asked for). A failed step that nothing journaled as a
/// failure adds the supervisor's own view of it.
fn add_unjournaled(step: &StepEnd<'_>, failures: &mut Vec<RankFailure>) {
    let now = step.ended.timestamp_micros() as f64 / 1e6;
    let srun_lines = if step.pre_timeout {
        Vec::new()
    } else {
        srun_failures(step.tail, now)
    };
    for f in srun_lines {
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
}

/// The attempt a record is about: `about_attempt` when a later attempt
/// recorded it (a reconstructed decision), else its own.
pub(crate) fn about(r: &Record) -> u32 {
    r.event()
        .and_then(|e| e.about_attempt())
        .unwrap_or(r.attempt)
}

/// The outcomes of earlier attempts, from their `decision` records.
pub fn earlier_outcomes(records: &[Record], attempt: u32) -> Vec<AttemptOutcome> {
    journal::events(records)
        .filter_map(|(r, e)| {
            let Event::Decision(d) = e else { return None };
            let about = d.about_attempt.unwrap_or(r.attempt);
            let o = d.outcome.filter(|_| about < attempt)?;
            let signature = o.signature?;
            Some(AttemptOutcome {
                attempt: about,
                class: o.class?,
                // Journals written before `detail` existed: the signature.
                detail: o.detail.unwrap_or_else(|| signature.clone()),
                signature,
                last_step: o.last_step,
                blamed_nodes: o.blamed_nodes,
            })
        })
        .collect()
}

/// The highest step any rank of `attempt` reached: the ranks' own
/// `last_step`, or the progress journaled.
pub fn last_step(records: &[Record], attempt: u32) -> Option<u64> {
    journal::events(records)
        .filter(|(r, _)| r.attempt == attempt)
        .filter_map(|(_, e)| match e {
            Event::RankExit(x) => x.last_step,
            Event::Progress(p) => p.step,
            _ => None,
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn rec(kind: &str, rank: Option<u32>, node: &str, at: i64, data: Value) -> Record {
        Record {
            v: 1,
            ts: chrono::DateTime::from_timestamp(1_800_000_000 + at, 0).unwrap(),
            kind: kind.into(),
            attempt: 0,
            rank,
            node: (!node.is_empty()).then(|| node.into()),
            data: data.as_object().cloned().unwrap_or_default(),
        }
    }

    fn exit(rank: u32, node: &str, at: i64, class: &str) -> Record {
        rec(
            "rank_exit",
            Some(rank),
            node,
            at,
            json!({ "class": class, "class_reason": "", "last_step": 7 }),
        )
    }

    fn step<'a>(v: &'a Verdict, tail: &'a [String], exit_code: i32) -> StepEnd<'a> {
        StepEnd {
            exit_code,
            verdict: v,
            tail,
            node: "n1",
            pre_timeout: false,
            ended: chrono::DateTime::from_timestamp(1_800_000_100, 0).unwrap(),
        }
    }

    fn own() -> Verdict {
        Verdict {
            class: Class::Unknown,
            reason: "exit 1".into(),
            evidence: None,
        }
    }

    #[test]
    fn the_rank_that_hung_first_is_the_cause_and_its_waiting_peers_echoes() {
        let records = [
            exit(0, "n1", 10, "hang"),
            exit(1, "n2", 11, "hang"),
            exit(2, "n3", 12, "clean"),
            rec(
                "hang",
                None,
                "",
                9,
                json!({ "verdict": { "blamed_ranks": [1, 2], "reason": "rank 1 stopped at step 7" } }),
            ),
        ];
        let v = own();
        let (failures, j) = judge_attempt(&records, 0, &step(&v, &[], 1));
        let classes: Vec<Class> = failures.iter().map(|f| f.verdict.class).collect();
        // Rank 2 finished cleanly: no one's hang even though blamed.
        assert_eq!(classes, [Class::Secondary, Class::Hang, Class::Clean]);
        let j = j.unwrap();
        assert_eq!((j.primary, j.class), (1, Class::Hang));
        assert_eq!(j.blamed_nodes, ["n2"]);
    }

    #[test]
    fn a_straggler_left_out_is_the_cause() {
        let records = [
            exit(0, "n1", 10, "preempted"),
            exit(1, "n2", 10, "preempted"),
            rec(
                "straggler_exclusion",
                None,
                "",
                9,
                json!({ "straggler_node": "n2", "about_rank": 1, "evidence": "2.1x slower" }),
            ),
        ];
        let v = own();
        let (failures, j) = judge_attempt(&records, 0, &step(&v, &[], 143));
        let j = j.unwrap();
        let p = &failures[j.primary];
        assert_eq!((p.rank, p.node.as_str()), (1, "n2"));
        assert_eq!(
            p.verdict.evidence.as_deref(),
            Some("straggler: 2.1x slower")
        );
        assert_eq!(j.blamed_nodes, ["n2"]);
        assert_eq!(failures[0].verdict.class, Class::Secondary);
    }

    #[test]
    fn silent_ranks_come_from_srun_dated_by_the_step_end_and_else_the_own_view() {
        let tail = vec!["srun: error: n3: task 2: Exited with exit code 137".to_string()];
        let v = own();
        let records = [exit(0, "n1", 10, "clean")];
        let (failures, j) = judge_attempt(&records, 0, &step(&v, &tail, 137));
        let p = &failures[j.unwrap().primary];
        assert_eq!((p.rank, p.verdict.class), (2, Class::Infrastructure));
        assert_eq!(p.at, 1_800_000_100.0);
        // Nothing journaled, no srun line: the supervisor's own view.
        let (failures, j) = judge_attempt(&records, 0, &step(&v, &[], 1));
        let p = &failures[j.unwrap().primary];
        assert_eq!((p.rank, p.verdict.class), (u32::MAX, Class::Unknown));
        // A clean step with clean ranks: nothing to judge.
        assert!(judge_attempt(&records, 0, &step(&v, &[], 0)).1.is_none());
    }
}
