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
use crate::policy::failure::{self, Class, Grounds, Judgment, RankFailure, Verdict};
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
    /// How the ranks' agents ended, where the job level reaped them itself
    /// (local mode); empty under Slurm (srun's lines tell there).
    pub agents: &'a [AgentEnd],
}

/// How one rank's agent ended, as the process that reaped it saw it.
#[derive(Clone, Debug)]
pub struct AgentEnd {
    pub rank: u32,
    pub status: AgentStatus,
    /// When it was reaped.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// An agent's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentStatus {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
    /// The job level killed it itself (SIGKILL after the grace, a second
    /// Ctrl-C): an echo of the teardown, never a cause.
    KilledHere,
}

/// The reason given for a rank whose agent died without its `rank_exit`.
pub const AGENT_DIED: &str = "its agent died and left no record (resilio's own part failed)";

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
                        ..Default::default()
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
                ..Default::default()
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
    finished_first(records, attempt, &mut failures);
    hung_first(records, attempt, &mut failures);
    straggler_left_out(records, attempt, &mut failures);
    lost_agents(records, attempt, step, &mut failures);
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
                    reason: x.class_reason.clone().unwrap_or_default(),
                    evidence: x.evidence.clone(),
                    ..Default::default()
                },
            })
        })
        .collect()
}

/// A rank whose trainer reported the end of training and then crashed at
/// exit finished; the ranks that failed with no signature of their own
/// (silent ranks crashing at exit the same way, ranks stopped after it)
/// finished with it. So did a rank that aborted or segfaulted with no
/// signature (torch's threads at interpreter exit: `terminate called
/// without an active exception`) after another rank of the attempt
/// completed (exit 0): a data-parallel rank completes only once every rank
/// has done its last collective.
fn finished_first(records: &[Record], attempt: u32, failures: &mut [RankFailure]) {
    let reported = failures
        .iter()
        .find(|f| f.verdict.reason == failure::FINISHED_THEN_CRASHED)
        .map(|f| f.rank);
    let completed = failures
        .iter()
        .find(|f| f.verdict.class == Class::Clean && f.verdict.reason == failure::EXITED_0)
        .map(|f| f.rank);
    // Every rank that failed ended with torch's teardown abort: all past
    // their last collective, together.
    let teardown = |f: &RankFailure| f.verdict.reason == failure::EXIT_TIME_ABORT;
    if failures.iter().any(teardown)
        && failures
            .iter()
            .all(|f| teardown(f) || f.verdict.class == Class::Clean)
    {
        for f in failures.iter_mut().filter(|f| teardown(f)) {
            f.verdict = Verdict {
                class: Class::Clean,
                reason: "finished: every rank ended past its last collective, aborting at interpreter exit (torch's threads)".into(),
                evidence: f.verdict.evidence.clone(),
                ..Default::default()
            };
        }
        return;
    }
    if reported.is_none() && completed.is_none() {
        return;
    }
    // How each rank exited: an abort or a segfault is an exit-time crash.
    let exit_crash = |rank: u32| {
        journal::events(records)
            .filter(|(r, _)| r.attempt == attempt && r.rank == Some(rank))
            .any(|(_, e)| matches!(e, Event::RankExit(x) if matches!(x.exit_code, 134 | 139)))
    };
    for f in failures.iter_mut() {
        let why = match (reported, completed) {
            (Some(done), _)
                if matches!(
                    f.verdict.class,
                    Class::Unknown | Class::Secondary | Class::Preempted
                ) =>
            {
                format!("finished: exited after rank {done} reported the end of training")
            }
            (_, Some(done)) if f.verdict.class == Class::Unknown && exit_crash(f.rank) => {
                format!("finished: crashed at exit after rank {done} completed (exit 0)")
            }
            _ => continue,
        };
        f.verdict = Verdict {
            class: Class::Clean,
            reason: why,
            evidence: f.verdict.evidence.clone(),
            ..Default::default()
        };
    }
}

/// The coordinator's job-wide judgment of a hang names the rank that hung
/// first: it is the cause, the ranks that stalled waiting for it are echoes.
fn hung_first(records: &[Record], attempt: u32, failures: &mut [RankFailure]) {
    let Some((judged_at, h)) = records
        .iter()
        .rev()
        .filter(|r| r.kind == "hang" && r.attempt == attempt)
        .find_map(|r| match r.event() {
            Some(Event::Hang(h)) => Some((secs(r), h)),
            _ => None,
        })
    else {
        return;
    };
    let v = h.verdict.clone();
    let blamed = v.blamed_ranks;
    let why = v.reason;
    if blamed.is_empty() {
        // Nobody blamed stays nobody blamed: the ranks that stalled are
        // hung, none of them the culprit (the first to report a stall is
        // as likely the victim waiting on the one that hung).
        for f in failures
            .iter_mut()
            .filter(|f| matches!(f.verdict.class, Class::Hang | Class::Preempted))
        {
            f.verdict = Verdict {
                class: Class::Hang,
                reason: failure::NOBODY_BLAMED.into(),
                evidence: Some(why.clone()),
                ..Default::default()
            };
        }
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
                ..Default::default()
            };
        } else if matches!(f.verdict.class, Class::Hang | Class::Preempted) {
            f.verdict = Verdict {
                class: Class::Secondary,
                reason: "stalled waiting for the rank that hung first".into(),
                evidence: Some(why.clone()),
                ..Default::default()
            };
        } else if f.at > judged_at && f.verdict.class != Class::Infrastructure {
            // Failed after the verdict tore the attempt down: a peer that
            // lost the hung rank's connection (`Connection closed by
            // peer`, exit 1) before its own stop reached it.
            f.verdict = Verdict {
                class: Class::Secondary,
                reason: "failed after the coordinator judged the rank that hung first".into(),
                evidence: Some(why.clone()),
                ..Default::default()
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
    let node = x.straggler_node.clone();
    let rank = x.about_rank.unwrap_or(u32::MAX);
    failures.retain(|f| f.rank != rank);
    for f in failures.iter_mut() {
        if !matches!(
            f.verdict.class,
            Class::Clean | Class::UserError | Class::Numerical
        ) {
            f.verdict = Verdict {
                class: Class::Secondary,
                reason: "stopped to leave a straggling node out".into(),
                evidence: f.verdict.evidence.clone(),
                ..Default::default()
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
            evidence: Some(format!("straggler: {}", x.evidence)),
            ..Default::default()
        },
    });
}

/// A rank that started (`rank_start`) or whose agent the job level reaped,
/// but left no `rank_exit`: its agent died (`kill -9`, the OOM killer, a
/// crash of resilio). That is its rank's failure, class infrastructure,
/// and the ranks stopped because of it (journaled as stopped on request:
/// the teardown's SIGTERM) are its echoes. Only where no rank journaled a
/// failure of its own (that one is the cause, and agents killed in the
/// teardown it started are echoes), and not in a stop from outside (the
/// step's own verdict, or Slurm's pre-timeout signal), where an agent
/// killed after the grace is part of the stop.
fn lost_agents(
    records: &[Record],
    attempt: u32,
    step: &StepEnd<'_>,
    failures: &mut Vec<RankFailure>,
) {
    if step.exit_code == 0 || step.pre_timeout || step.verdict.class == Class::Preempted {
        return;
    }
    let echo = |c: Class| matches!(c, Class::Clean | Class::Secondary | Class::Preempted);
    if failures.iter().any(|f| !echo(f.verdict.class)) {
        return;
    }
    let mut started: Vec<(u32, String)> = Vec::new();
    let mut exited: Vec<u32> = Vec::new();
    for (r, e) in journal::events(records).filter(|(r, _)| r.attempt == attempt) {
        match (e, r.rank) {
            (Event::RankStart(_), Some(rank)) if !started.iter().any(|(k, _)| *k == rank) => {
                started.push((rank, r.node.clone().unwrap_or_default()))
            }
            (Event::RankExit(_), Some(rank)) => exited.push(rank),
            _ => {}
        }
    }
    // An agent killed before its trainer started counts too; one that
    // exited before (a command that cannot start, a usage error) has its
    // own say in the launcher's view.
    for a in step.agents {
        let killed = matches!(a.status, AgentStatus::Signal(_));
        if killed && !started.iter().any(|(k, _)| *k == a.rank) {
            started.push((a.rank, step.node.to_string()));
        }
    }
    started.sort_by_key(|(k, _)| *k);
    let ended = step.ended.timestamp_micros() as f64 / 1e6;
    let srun = srun_failures(step.tail, ended);
    let mut lost = Vec::new();
    for (rank, node) in started.into_iter().filter(|(k, _)| !exited.contains(k)) {
        let seen = match step.agents.iter().find(|a| a.rank == rank) {
            Some(a) => match a.status {
                AgentStatus::KilledHere | AgentStatus::Code(0) => continue,
                AgentStatus::Code(c) => (format!("exited {c}"), a.at),
                AgentStatus::Signal(s) => (format!("died (signal {s})"), a.at),
            },
            // The job level reaped every agent itself: that one never ran.
            None if !step.agents.is_empty() => continue,
            None => ("died".to_string(), step.ended),
        };
        let line = srun.iter().find(|f| f.rank == rank);
        // Its node failed (srun says so): that failure is the cause.
        if srun.iter().any(|f| f.rank == u32::MAX && f.node == node) {
            continue;
        }
        let node = line.map_or(node, |l| l.node.clone());
        let mut evidence = format!("the agent of rank {rank} {} and left no record", seen.0);
        if let Some(l) = line.and_then(|l| l.verdict.evidence.as_deref()) {
            evidence = format!("{evidence}; {l}");
        }
        lost.push(RankFailure {
            rank,
            node,
            at: seen.1.timestamp_micros() as f64 / 1e6,
            verdict: Verdict {
                class: Class::Infrastructure,
                reason: AGENT_DIED.into(),
                evidence: Some(evidence),
                grounds: Grounds::AgentDied,
            },
        });
    }
    let Some(first) = lost
        .iter()
        .min_by(|a, b| a.at.total_cmp(&b.at))
        .map(|f| f.rank)
    else {
        return;
    };
    for f in failures
        .iter_mut()
        .filter(|f| f.verdict.class == Class::Preempted)
    {
        f.verdict = Verdict {
            class: Class::Secondary,
            reason: format!("stopped because the agent of rank {first} died"),
            evidence: f.verdict.evidence.clone(),
            ..Default::default()
        };
    }
    failures.extend(lost);
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
    // A trainer that reported the end of training and crashed at exit
    // finished: the step's exit code is that crash, no failure of its own.
    let finished = failures
        .iter()
        .any(|f| f.verdict.reason.starts_with("finished"));
    if failures.iter().all(|f| f.verdict.class == Class::Clean) && step.exit_code != 0 && !finished
    {
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
            Some(d.outcome.clone())
                .filter(|_| about < attempt)?
                .of_attempt(about)
        })
        .collect()
}

/// Whether `rank` stopped in `attempt` for a numerical failure whose action
/// is a rollback (its `numerical` record says so).
/// The first bad step of the numerical failure `rank` was stopped for in
/// `attempt` (its `numerical` record's `since_step`, else its step).
pub fn numerical_since(records: &[Record], attempt: u32, rank: u32) -> Option<u64> {
    journal::events(records)
        .filter(|(r, _)| r.attempt == attempt && r.rank == Some(rank))
        .find_map(|(_, e)| match e {
            Event::Numerical(n) => n.since_step.or(n.step),
            _ => None,
        })
}

pub fn rolled_back(records: &[Record], attempt: u32, rank: u32) -> bool {
    journal::events(records)
        .filter(|(r, _)| r.attempt == attempt && r.rank == Some(rank))
        .any(|(_, e)| {
            matches!(e, Event::Numerical(n)
                if n.action == Some(crate::policy::numerical::Act::Rollback))
        })
}

/// Whether `attempt` confirmed a whole checkpoint newer than every one
/// confirmed before it (by step; one whose step is not known counts as
/// new): what a next attempt would start from moved on; and the step of
/// the newest whole checkpoint confirmed by the end of `attempt`.
pub fn new_and_last_checkpoint(records: &[Record], attempt: u32) -> (bool, Option<u64>) {
    let mut before: Option<u64> = None;
    let mut mine: Vec<Option<u64>> = Vec::new();
    for (r, c) in journal::whole_checkpoints(records) {
        if r.attempt < attempt {
            before = before.max(c.step);
        } else if r.attempt == attempt {
            mine.push(c.step);
        }
    }
    let new = mine
        .iter()
        .any(|s| s.is_none_or(|s| before.is_none_or(|b| s > b)));
    (new, mine.iter().copied().fold(before, Option::max))
}

/// The highest step any rank of `attempt` reached: the ranks' own
/// `last_step`, or the progress journaled.
/// The step of the checkpoint `attempt` started from, as far as the
/// journal tells: the newest checkpoint confirmed before the attempt (whole
/// or not) and before its first step; before any step, the rollback it was
/// told (`RESILIO_ROLLBACK_STEP`), else the newest checkpoint (what a
/// trainer loads). `None` for the first attempt, a start from scratch, or
/// no checkpoint confirmed. With the attempt that saved it (its latest
/// save of that step).
pub fn restored_checkpoint(records: &[Record], attempt: u32) -> Option<(u64, u32)> {
    if attempt == 0 {
        return None;
    }
    // Every checkpoint confirmed, whole or not (a trainer resuming from its
    // latest loads a torn one too: trial 18), with the attempt that saved it.
    let saved: Vec<(u64, u32)> = journal::events(records)
        .filter(|(r, _)| r.attempt < attempt)
        .filter_map(|(r, e)| match e {
            Event::CheckpointDone(c) => c.step.map(|s| (s, r.attempt)),
            _ => None,
        })
        .collect();
    let first = journal::events(records)
        .filter(|(r, _)| r.attempt == attempt)
        .filter_map(|(_, e)| match e {
            Event::Progress(p) => p.step,
            _ => None,
        })
        .min();
    let step = match first {
        Some(f) => saved.iter().map(|(s, _)| *s).filter(|c| *c < f).max(),
        None => journal::events(records)
            .find_map(|(_, e)| match e {
                Event::RollbackPlanned(rb) if rb.for_attempt == attempt => Some(rb.checkpoint_step),
                _ => None,
            })
            .unwrap_or_else(|| saved.iter().map(|(s, _)| *s).max()),
    }
    .filter(|c| *c > 0)?;
    let by = saved
        .iter()
        .filter(|(s, _)| *s == step)
        .map(|(_, a)| *a)
        .max()
        .unwrap_or(0);
    Some((step, by))
}

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
            ..Default::default()
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
            agents: &[],
            ended: chrono::DateTime::from_timestamp(1_800_000_100, 0).unwrap(),
        }
    }

    fn own() -> Verdict {
        Verdict {
            class: Class::Unknown,
            reason: "exit 1".into(),
            evidence: None,
            ..Default::default()
        }
    }

    fn new_checkpoint(records: &[Record], attempt: u32) -> bool {
        new_and_last_checkpoint(records, attempt).0
    }

    #[test]
    fn a_new_checkpoint_is_a_whole_one_beyond_every_earlier_one() {
        let ck = |attempt, step: Option<u64>, complete: bool| Record {
            attempt,
            ..rec(
                "checkpoint_done",
                Some(0),
                "n1",
                0,
                json!({ "step": step, "source": "stdout", "complete": complete }),
            )
        };
        let rs = [ck(0, Some(90), true), ck(1, Some(90), true)];
        assert!(new_checkpoint(&rs, 0));
        assert!(!new_checkpoint(&rs, 1), "the same step again is not new");
        assert!(!new_checkpoint(&rs, 2), "none in the attempt");
        let rs = [ck(0, Some(90), true), ck(1, Some(95), false)];
        assert!(!new_checkpoint(&rs, 1), "an incomplete one is not");
        let rs = [
            ck(0, Some(90), true),
            ck(1, Some(85), true),
            ck(1, Some(95), true),
        ];
        assert!(new_checkpoint(&rs, 1));
        let rs = [ck(0, Some(90), true), ck(1, None, true)];
        assert!(new_checkpoint(&rs, 1), "a step not known: taken as new");
        // The trainer's word (stdout) for a checkpoint its directory shows
        // stale does not make it new (trial 16b).
        let stale = Record {
            attempt: 1,
            ..rec(
                "checkpoint_done",
                Some(0),
                "n1",
                0,
                json!({ "step": 95, "source": "checkpoint_dir", "same_as": "checkpoint-90" }),
            )
        };
        let rs = [ck(0, Some(90), true), ck(1, Some(95), true), stale];
        assert_eq!(new_and_last_checkpoint(&rs, 1), (false, Some(90)));
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
    fn ranks_that_crash_after_the_trainer_reported_the_end_of_training_finished() {
        let mut done = exit(0, "n1", 10, "clean");
        done.data
            .insert("class_reason".into(), json!(failure::FINISHED_THEN_CRASHED));
        let records = [done, exit(1, "n2", 10, "unknown")];
        let v = own();
        let (failures, j) = judge_attempt(&records, 0, &step(&v, &[], 134));
        assert!(j.is_none(), "nothing failed: {failures:?}");
        assert!(failures.iter().all(|f| f.verdict.class == Class::Clean));
    }

    #[test]
    fn a_rank_aborting_at_exit_after_its_peer_completed_finished() {
        let mut aborted = exit(1, "n2", 10, "unknown");
        aborted.data.insert("exit_code".into(), json!(134));
        let mut completed = exit(0, "n1", 10, "clean");
        completed
            .data
            .insert("class_reason".into(), json!(failure::EXITED_0));
        let records = [completed.clone(), aborted];
        let v = own();
        let (failures, j) = judge_attempt(&records, 0, &step(&v, &[], 134));
        assert!(j.is_none(), "nothing failed: {failures:?}");
        // A real exit 1 after the peer completed is still a failure.
        let mut failed = exit(1, "n2", 10, "unknown");
        failed.data.insert("exit_code".into(), json!(1));
        let records = [completed, failed];
        assert!(judge_attempt(&records, 0, &step(&v, &[], 1)).1.is_some());
    }

    #[test]
    fn a_hang_the_coordinator_blamed_nobody_for_names_no_rank_and_no_node() {
        // Rank 0 reported the stall (it waited), rank 1 (silent) was
        // stopped in the teardown: the verdict could tell nobody.
        let records = [
            exit(0, "n1", 10, "hang"),
            exit(1, "n2", 11, "preempted"),
            rec(
                "hang",
                None,
                "",
                9,
                json!({ "verdict": { "rule": "undetermined", "blamed_ranks": [], "reason": "the probes could not tell: nobody blamed" } }),
            ),
        ];
        let v = own();
        let (failures, j) = judge_attempt(&records, 0, &step(&v, &[], 1));
        let j = j.unwrap();
        assert_eq!(j.class, Class::Hang);
        assert!(!j.culprit, "{}", j.why);
        assert!(j.blamed_nodes.is_empty(), "{:?}", j.blamed_nodes);
        assert_eq!(failures[j.primary].verdict.reason, failure::NOBODY_BLAMED);
        assert_eq!(
            failures[j.primary].verdict.evidence.as_deref(),
            Some("the probes could not tell: nobody blamed")
        );
    }

    #[test]
    fn a_peer_failing_after_the_hang_verdict_is_its_echo() {
        // The coordinator blamed rank 1 at 9; rank 0's trainer lost its
        // peer when rank 1 was stopped and exited 1 at 10, before rank 1's
        // own exit at 11: rank 1 is the cause, rank 0 its echo.
        let mut crashed = exit(0, "n1", 10, "unknown");
        crashed.data.insert("exit_code".into(), json!(1));
        let records = [
            crashed,
            exit(1, "n2", 11, "hang"),
            rec(
                "hang",
                None,
                "",
                9,
                json!({ "verdict": { "rule": "not_waiting", "blamed_ranks": [1], "reason": "rank(s) 1 were not waiting on a peer" } }),
            ),
        ];
        let v = own();
        let (failures, j) = judge_attempt(&records, 0, &step(&v, &[], 1));
        let j = j.unwrap();
        assert_eq!(j.class, Class::Hang, "{}", j.why);
        assert_eq!(failures[j.primary].rank, 1, "{}", j.why);
        assert_eq!(failures[0].verdict.class, Class::Secondary);
        // A crash before the verdict is judged as before.
        let mut early = exit(0, "n1", 8, "unknown");
        early.data.insert("exit_code".into(), json!(1));
        let records = [
            early,
            exit(1, "n2", 11, "hang"),
            rec(
                "hang",
                None,
                "",
                9,
                json!({ "verdict": { "rule": "not_waiting", "blamed_ranks": [1], "reason": "x" } }),
            ),
        ];
        let (failures, _) = judge_attempt(&records, 0, &step(&v, &[], 1));
        assert_ne!(failures[0].verdict.class, Class::Secondary);
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

    fn start(rank: u32, node: &str) -> Record {
        rec(
            "rank_start",
            Some(rank),
            node,
            1,
            json!({ "pid": 100 + rank }),
        )
    }

    fn agent(rank: u32, status: AgentStatus) -> AgentEnd {
        AgentEnd {
            rank,
            status,
            at: chrono::DateTime::from_timestamp(1_800_000_050, 0).unwrap(),
        }
    }

    #[test]
    fn a_dead_agent_is_its_ranks_failure_and_the_ranks_stopped_for_it_echoes() {
        // Local mode: rank 1's agent was killed by SIGKILL and left no
        // rank_exit; rank 0 was stopped by the launcher's teardown.
        let records = [
            start(0, "ws"),
            start(1, "ws"),
            exit(0, "ws", 60, "preempted"),
        ];
        let v = own();
        let agents = [
            agent(0, AgentStatus::Code(143)),
            agent(1, AgentStatus::Signal(9)),
        ];
        let mut s = step(&v, &[], 137);
        s.agents = &agents;
        let (failures, j) = judge_attempt(&records, 0, &s);
        let j = j.unwrap();
        let p = &failures[j.primary];
        assert_eq!((p.rank, p.verdict.class), (1, Class::Infrastructure));
        assert_eq!(j.class, Class::Infrastructure);
        assert_eq!(p.verdict.reason, AGENT_DIED);
        assert_eq!(
            p.verdict.evidence.as_deref(),
            Some("the agent of rank 1 died (signal 9) and left no record")
        );
        assert_eq!(p.at, 1_800_000_050.0);
        let r0 = failures.iter().find(|f| f.rank == 0).unwrap();
        assert_eq!(r0.verdict.class, Class::Secondary);
        assert_eq!(
            r0.verdict.reason,
            "stopped because the agent of rank 1 died"
        );
        // An agent that exited non-zero after its trainer started, with no
        // record, failed too.
        let agents = [
            agent(0, AgentStatus::Code(143)),
            agent(1, AgentStatus::Code(101)),
        ];
        s.agents = &agents;
        let (failures, j) = judge_attempt(&records, 0, &s);
        let p = &failures[j.unwrap().primary];
        assert_eq!(
            p.verdict.evidence.as_deref(),
            Some("the agent of rank 1 exited 101 and left no record")
        );
    }

    #[test]
    fn a_dead_agent_is_not_the_cause_where_something_else_is() {
        let v = own();
        // A rank's own failure came first: the agent the launcher killed in
        // the teardown (or one that died in it) is an echo.
        let records = [
            start(0, "ws"),
            start(1, "ws"),
            exit(0, "ws", 60, "user_error"),
        ];
        for st in [AgentStatus::KilledHere, AgentStatus::Signal(9)] {
            let agents = [agent(0, AgentStatus::Code(1)), agent(1, st)];
            let mut s = step(&v, &[], 1);
            s.agents = &agents;
            let (failures, j) = judge_attempt(&records, 0, &s);
            let p = &failures[j.unwrap().primary];
            assert_eq!((p.rank, p.verdict.class), (0, Class::UserError));
        }
        // Killed here after the grace, with nothing else failed: not a death.
        let records = [
            start(0, "ws"),
            start(1, "ws"),
            exit(0, "ws", 60, "preempted"),
        ];
        let agents = [
            agent(0, AgentStatus::Code(143)),
            agent(1, AgentStatus::KilledHere),
        ];
        let mut s = step(&v, &[], 137);
        s.agents = &agents;
        let (failures, j) = judge_attempt(&records, 0, &s);
        assert_eq!(j.unwrap().class, Class::Preempted, "{failures:?}");
        // A stop from outside (the step's own verdict): whatever died in it
        // is part of the stop.
        let outside = Verdict {
            class: Class::Preempted,
            reason: "stopped on request".into(),
            evidence: None,
            ..Default::default()
        };
        let agents = [
            agent(0, AgentStatus::Code(143)),
            agent(1, AgentStatus::Signal(9)),
        ];
        let mut s = step(&outside, &[], 143);
        s.agents = &agents;
        assert_eq!(
            judge_attempt(&records, 0, &s).1.unwrap().class,
            Class::Preempted
        );
        // An agent that exited before its trainer started (no rank_start):
        // the launcher's own view stands, as before.
        let records = [start(0, "ws"), exit(0, "ws", 60, "preempted")];
        let agents = [
            agent(0, AgentStatus::Code(143)),
            agent(1, AgentStatus::Code(2)),
        ];
        let mut s = step(&v, &[], 2);
        s.agents = &agents;
        let (failures, _) = judge_attempt(&records, 0, &s);
        assert!(failures.iter().all(|f| f.verdict.reason != AGENT_DIED));
    }

    #[test]
    fn under_slurm_a_rank_that_started_and_left_no_exit_is_its_agents_death() {
        // Two-level form: rank 1's agent on n2 was killed; srun terminated
        // the others, which journaled a stop on request.
        let records = [
            start(0, "n1"),
            start(1, "n2"),
            start(2, "n3"),
            exit(0, "n1", 60, "preempted"),
            exit(2, "n3", 60, "preempted"),
        ];
        let tail = vec![
            "srun: error: n2: task 1: Killed".to_string(),
            "srun: error: n1: task 0: Terminated".to_string(),
        ];
        let v = own();
        let (failures, j) = judge_attempt(&records, 0, &step(&v, &tail, 137));
        let j = j.unwrap();
        let p = &failures[j.primary];
        assert_eq!((p.rank, p.node.as_str()), (1, "n2"));
        assert_eq!(j.class, Class::Infrastructure);
        assert_eq!(j.blamed_nodes, ["n2"]);
        assert_eq!(
            p.verdict.evidence.as_deref(),
            Some("the agent of rank 1 died and left no record; srun: error: n2: task 1: Killed")
        );
        assert!(failures
            .iter()
            .filter(|f| f.rank != 1)
            .all(|f| f.verdict.class == Class::Secondary));
        // Its node failed: Slurm's node failure is the cause, as before.
        let tail = vec!["srun: error: Node failure on n2".to_string()];
        let (failures, j) = judge_attempt(&records, 0, &step(&v, &tail, 1));
        let p = &failures[j.unwrap().primary];
        assert_eq!(
            (p.rank, p.verdict.reason.as_str()),
            (u32::MAX, "Slurm reported a node failure")
        );
        // Slurm's pre-timeout signal: the stop it announced.
        let mut s = step(&v, &[], 143);
        s.pre_timeout = true;
        assert_eq!(
            judge_attempt(&records, 0, &s).1.unwrap().class,
            Class::Preempted
        );
    }
}
