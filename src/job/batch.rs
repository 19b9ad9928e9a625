//! The job level under Slurm: the `resilio run` that wraps the job's steps
//! in the batch script (`resilio run -- srun resilio run -- python
//! train.py`). Each entry point reads the facts (the journal, Slurm),
//! decides purely ([`super::decide`]) and then acts ([`super::act`]).
//!
//! - After a step, [`after_attempt`]: judge which failure was primary from
//!   the ranks' journals and srun's lines, decide with the restart policy,
//!   journal both, and act. Inside the allocation first: the step is
//!   relaunched on the nodes that remain once the blamed ones are left out
//!   (`srun --exclude`), when enough remain. Otherwise through the
//!   [`Slurm`] trait: `scontrol requeue`, then `ExcNodeList`.
//! - At an allocation's start: [`reconcile_previous`] records the earlier
//!   allocations as Slurm saw them, and [`history_at_start`] leaves out the
//!   nodes the node history lists.
//!
//! Attempts count steps, not allocations: an allocation runs one attempt,
//! plus one per relaunch inside it. Each allocation's `job_start` record
//! names it (`allocation`, Slurm's requeue count), which maps Slurm's
//! records of an allocation to the attempts that ran in it.

use super::act;
use super::decide::{self, Decision, Facts};
use super::rollback;
use crate::event::Event;
use crate::journal::{self, Record, Writer};
use crate::policy::restart::{Action, Allocation, AttemptOutcome, Budget};
use crate::slurm::Slurm;
use std::path::Path;

pub use super::act::{AtStart, Next};
pub use super::judge::{earlier_outcomes, judge_attempt, srun_failures, StepEnd};

/// The allocation a batch-level `job_start` record was written in.
fn allocation_of(r: &Record) -> Option<u32> {
    match r.event()? {
        Event::JobStart(j) => j.allocation,
        _ => None,
    }
}

/// The attempt a fresh allocation (Slurm's requeue count `allocation`)
/// starts with: the one after every attempt of the earlier allocations.
pub fn first_attempt_of_allocation(records: &[Record], allocation: u32) -> u32 {
    records
        .iter()
        .filter(|r| allocation_of(r).is_some_and(|a| a < allocation))
        .map(|r| r.attempt + 1)
        .max()
        .unwrap_or(0)
        .max(allocation)
}

/// The last attempt that ran in `allocation`.
fn last_attempt_in(records: &[Record], allocation: u32) -> u32 {
    records
        .iter()
        .filter(|r| allocation_of(r) == Some(allocation))
        .map(|r| r.attempt)
        .max()
        .unwrap_or_else(|| first_attempt_of_allocation(records, allocation))
}

/// The allocations before `allocation` that no `previous_attempt` record
/// is about yet.
fn unrecorded_allocations(records: &[Record], allocation: u32) -> Vec<u32> {
    let seen: Vec<u32> = journal::events(records)
        .filter_map(|(_, e)| match e {
            Event::PreviousAttempt(p) => Some(p.about_allocation),
            _ => None,
        })
        .collect();
    (0..allocation).filter(|a| !seen.contains(a)).collect()
}

/// At the start of a later allocation, every earlier one is recorded as
/// Slurm saw it (`sacct -D`, and the current state of its nodes) in a
/// `previous_attempt` record about its last attempt. Attempts that ended
/// with no decision in the journal (the node holding the batch script
/// crashed, or Slurm requeued the job itself after a node failure) also get
/// a `failure` and a `decision`, so that reports, blame and the crash-loop
/// guard see them.
pub fn reconcile_previous(
    records: &[Record],
    job: &str,
    allocation: u32,
    slurm: &dyn Slurm,
    journal: &mut Writer,
) {
    if allocation == 0 {
        return;
    }
    let missing = unrecorded_allocations(records, allocation);
    if missing.is_empty() {
        return;
    }
    let mut rows = match slurm.accounting(job) {
        Ok(rows) => rows,
        Err(e) => {
            journal.write(
                crate::event::PreviousAttemptUnknown {
                    attempts: missing,
                    error: e.to_string(),
                },
                false,
            );
            return;
        }
    };
    // One allocation row per attempt, oldest first.
    rows.retain(|r| !r.start.is_empty() && r.start != "Unknown" && r.start != "None");
    rows.sort_by(|a, b| a.start.cmp(&b.start));
    for alloc in missing {
        let Some(row) = rows.get(alloc as usize) else {
            continue;
        };
        let failed: Vec<crate::slurm::NodeInfo> = slurm
            .node_states(&row.nodes)
            .map(|v| v.into_iter().filter(|n| n.is_failed()).collect())
            .unwrap_or_default();
        let a = last_attempt_in(records, alloc);
        let seen = decide::seen_by_slurm(records, alloc, a, row, &failed);
        act::journal_seen_by_slurm(alloc, row, &seen, journal);
    }
}

/// Local mode's judgment and decision ([`decide::decide_local`]),
/// journaled (`judgment`, `decision`). `None` when nothing failed.
pub fn decide_local(
    job_dir: &Path,
    records: &[Record],
    attempt: u32,
    step: &StepEnd<'_>,
    budget: impl Into<Budget>,
    remembered: &[AttemptOutcome],
    journal: &mut Writer,
) -> Option<Decision> {
    let d = decide::decide_local(records, attempt, step, budget.into(), remembered)?;
    act::journal_decision(journal, &d);
    rollback::leave_rollback(job_dir, records, &d, journal);
    Some(d)
}

/// The nodes the ranks of `attempt` ran on.
fn step_nodes(records: &[Record], attempt: u32) -> u32 {
    let mut nodes: Vec<&str> = records
        .iter()
        .filter(|r| r.kind == "rank_start" && r.attempt == attempt && r.rank.is_some())
        .filter_map(|r| r.node.as_deref())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes.len() as u32
}

/// Judge, decide, journal, act. `alloc` is the allocation the step can be
/// relaunched in (`None`: only requeues); its `step_nodes`, when not known
/// from the command line, is counted from the journal.
#[allow(clippy::too_many_arguments)]
pub fn after_attempt(
    state_dir: &Path,
    job: &str,
    attempt: u32,
    step: &StepEnd<'_>,
    budget: impl Into<Budget>,
    observe: bool,
    alloc: Option<Allocation>,
    slurm: &dyn Slurm,
    journal: &mut Writer,
) -> Next {
    let records = journal::read_job(&journal::job_dir(state_dir, job))
        .map(|j| crate::runs::of_key(j.records, journal.run()))
        .unwrap_or_default();
    let requeueable = || match slurm.show_job(job) {
        Ok(info) => info.requeue,
        Err(e) => {
            tracing::warn!("cannot read job {job} from Slurm: {e}");
            false
        }
    };
    let alloc = alloc.map(|a| Allocation {
        step_nodes: if a.step_nodes > 0 {
            a.step_nodes
        } else {
            step_nodes(&records, attempt)
        },
        ..a
    });
    let facts = Facts {
        records: &records,
        attempt,
        step,
        budget: budget.into(),
        alloc: alloc.as_ref(),
    };
    let Some(d) = decide::decide(&facts, requeueable) else {
        act::job_end(journal, step.exit_code, "completed");
        return Next::Exit(step.exit_code);
    };
    act::journal_decision(journal, &d);
    if observe && !matches!(d.action, Action::Finish | Action::Stop { .. }) {
        // Observe mode: what would have been done, and the job ends as
        // its step did.
        journal.write(
            crate::event::Observed {
                would: act::describe(&d.action),
                reason: d.evidence.clone(),
            },
            true,
        );
        tracing::warn!(
            "observe mode: would {}; nothing done",
            act::describe(&d.action)
        );
        act::job_end(journal, step.exit_code, "observe mode: not restarted");
        return Next::Exit(step.exit_code);
    }
    rollback::leave_rollback(&journal::job_dir(state_dir, job), &records, &d, journal);
    let before = alloc.map(|a| a.excluded).unwrap_or_default();
    // A failure that stands ends the job with its primary rank's code; a
    // requeue or relaunch goes on (srun's code is the attempt's).
    let code = match d.action {
        Action::Stop { .. } | Action::RestartInPlace { .. } => {
            decide::job_exit_code(&d, &records, attempt, step.exit_code)
        }
        _ => step.exit_code,
    };
    act::carry_out(d, job, attempt, code, &before, slurm, journal)
}

/// `[nodes] exclude_at_start`: before the first step of an allocation,
/// leave out the nodes the node history lists (score at or above the
/// threshold): inside the allocation when spare nodes remain for the step,
/// else by one requeue with `ExcNodeList` (never twice for this reason).
#[allow(clippy::too_many_arguments)]
pub fn history_at_start(
    history: &[crate::analysis::node_history::NodeHistory],
    threshold: f64,
    job: &str,
    alloc_nodes: &[String],
    argv: &[std::ffi::OsString],
    records: &[Record],
    slurm: &dyn Slurm,
    journal: &mut Writer,
) -> AtStart {
    let requeueable = || slurm.show_job(job).is_ok_and(|i| i.requeue);
    let plan = decide::plan_at_start(history, threshold, alloc_nodes, argv, records, requeueable);
    act::start_plan(plan, job, slurm, journal)
}

/// The allocation a failed step can run again in (see docs/slurm.md), or
/// none when relaunching inside it is off or there is no allocation.
/// `step_out`: the nodes this step already left out, and its size.
pub fn allocation(
    cfg: &crate::config::Config,
    job_nodes: &[String],
    argv: &[std::ffi::OsString],
    step_out: Option<&(Vec<String>, u32)>,
) -> Option<crate::policy::restart::Allocation> {
    (cfg.restart_in_allocation && !job_nodes.is_empty()).then(|| {
        crate::policy::restart::Allocation {
            nodes: job_nodes.to_vec(),
            excluded: step_out.map(|o| o.0.clone()).unwrap_or_default(),
            withheld: crate::slurm::step::user_excluded_nodes(argv),
            // The step's size as launched (the journal's count of nodes
            // that started a rank can miss a node that died early).
            step_nodes: step_out
                .map(|o| o.1)
                .filter(|n| *n > 0)
                .or_else(|| crate::slurm::step::requested_nodes(argv))
                .unwrap_or(0),
            can_exclude: crate::slurm::step::can_leave_out(argv),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::act::schedulable_exclusion;
    use crate::policy::failure::{Class, Verdict};
    use crate::policy::restart::Action;
    use crate::slurm::fake::FakeSlurm;
    use crate::slurm::JobInfo;
    use serde_json::json;

    fn rank_exit(
        dir: &Path,
        rank: u32,
        node: &str,
        attempt: u32,
        class: &str,
        evidence: Option<&str>,
        step: u64,
    ) {
        rank_exit_with(dir, (rank, node, attempt), class, evidence, step, 1);
    }

    fn rank_exit_with(
        dir: &Path,
        (rank, node, attempt): (u32, &str, u32),
        class: &str,
        evidence: Option<&str>,
        step: u64,
        exit_code: i32,
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
            json!({ "class": class, "evidence": evidence, "class_reason": "", "last_step": step, "exit_code": exit_code }),
            true,
        );
    }

    /// A step that ended with `exit_code` on n1, srun having said nothing.
    fn step_end(verdict: &Verdict, exit_code: i32) -> StepEnd<'_> {
        StepEnd {
            ended: chrono::Utc::now(),
            exit_code,
            verdict,
            tail: &[],
            node: "n1",
            pre_timeout: false,
            agents: &[],
        }
    }

    fn verdict(class: Class, reason: &str) -> Verdict {
        Verdict {
            class,
            reason: reason.into(),
            evidence: None,
            ..Default::default()
        }
    }

    fn read(state: &Path) -> Vec<Record> {
        journal::read_job(&journal::job_dir(state, "77"))
            .map(|j| j.records)
            .unwrap_or_default()
    }

    fn fake(requeue: bool) -> FakeSlurm {
        FakeSlurm::with_job(JobInfo {
            job_id: "77".into(),
            requeue,
            excluded: vec!["n9".into()],
            ..JobInfo::default()
        })
    }

    /// Three ranks on n1..n3 started attempt `attempt`; rank 1 on n2 was killed.
    fn killed_on_n2(dir: &Path, attempt: u32) {
        for (rank, node) in [(0, "n1"), (1, "n2"), (2, "n3")] {
            let mut w = Writer::open(
                dir,
                &format!("rank-{rank}.jsonl"),
                attempt,
                Some(rank),
                Some(node.into()),
            );
            w.record("rank_start", json!({ "pid": 1 }), true);
        }
        rank_exit(
            dir,
            1,
            "n2",
            attempt,
            "infrastructure",
            Some("killed by SIGKILL"),
            40 + attempt as u64,
        );
        rank_exit(
            dir,
            0,
            "n1",
            attempt,
            "secondary",
            Some("Connection reset by peer"),
            40 + attempt as u64,
        );
    }

    fn four_nodes(excluded: &[&str]) -> Allocation {
        Allocation {
            nodes: ["n1", "n2", "n3", "n4"].map(String::from).to_vec(),
            excluded: excluded.iter().map(|s| s.to_string()).collect(),
            withheld: Vec::new(),
            step_nodes: 0,
            can_exclude: true,
        }
    }

    #[test]
    fn a_spare_node_keeps_the_restart_inside_the_allocation() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        killed_on_n2(&dir, 0);
        let mut w = Writer::open(&dir, "batch.jsonl", 0, None, Some("n1".into()));
        let v = verdict(Class::Unknown, "exit 137");
        // Even a job that cannot be requeued restarts inside its allocation.
        let f = fake(false);
        let step = step_end(&v, 137);
        let next = after_attempt(
            state.path(),
            "77",
            0,
            &step,
            3,
            false,
            Some(four_nodes(&[])),
            &f,
            &mut w,
        );
        let Next::Relaunch(r) = next else {
            panic!("{next:?}")
        };
        assert_eq!(
            (r.attempt, r.nodes, r.exclude.clone()),
            (1, 3, vec!["n2".to_string()])
        );
        let now_us = chrono::Utc::now().timestamp_micros();
        assert!(r.failed_at_us <= now_us && r.failed_at_us > now_us - 60_000_000);
        assert!(!f
            .calls()
            .iter()
            .any(|c| c.starts_with("requeue") || c.starts_with("set_excluded")));
        let recs = read(state.path());
        let ex: Vec<&Record> = recs.iter().filter(|r| r.kind == "node_excluded").collect();
        assert_eq!(ex.len(), 1);
        assert_eq!(
            (ex[0].str("excluded_node"), ex[0].str("scope")),
            (Some("n2"), Some("step"))
        );
        let d = recs.iter().find(|r| r.kind == "decision").unwrap();
        assert_eq!(
            d.get("decision").unwrap()["action"],
            "restart_in_allocation"
        );
        assert!(recs
            .iter()
            .any(|r| r.kind == "restart" && r.u64("next_attempt") == Some(1)));

        // The relaunch on n1,n3,n4 loses n4 too: no spare node is left, so
        // the job is requeued with both nodes excluded.
        let mut w = Writer::open(&dir, "batch.jsonl", 1, None, Some("n1".into()));
        for (rank, node) in [(0, "n1"), (1, "n3"), (2, "n4")] {
            let mut rw = Writer::open(
                &dir,
                &format!("rank-{rank}.jsonl"),
                1,
                Some(rank),
                Some(node.into()),
            );
            rw.record("rank_start", json!({ "pid": 1 }), true);
        }
        rank_exit(
            &dir,
            2,
            "n4",
            1,
            "infrastructure",
            Some("killed by SIGKILL"),
            60,
        );
        let f = fake(true);
        let next = after_attempt(
            state.path(),
            "77",
            1,
            &step,
            3,
            false,
            Some(four_nodes(&["n2"])),
            &f,
            &mut w,
        );
        assert_eq!(next, Next::Exit(137));
        assert!(
            f.calls().iter().any(|c| c == "set_excluded 77 n9,n2,n4"),
            "{:?}",
            f.calls()
        );
        let recs = read(state.path());
        let req = recs.iter().find(|r| r.kind == "requeue").unwrap();
        assert!(
            req.str("reason").unwrap().contains("no spare node"),
            "{req:?}"
        );
        // n2 was excluded from the step before; only n4 is new.
        assert_eq!(recs.iter().filter(|r| r.kind == "node_excluded").count(), 2);
    }

    #[test]
    fn attempts_continue_across_allocations() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        // Allocation 0 ran attempts 0 and 1 (a relaunch inside it).
        for a in 0..2 {
            let mut w = Writer::open(&dir, "batch.jsonl", a, None, Some("n1".into()));
            w.record("job_start", json!({ "allocation": 0 }), true);
        }
        let recs = read(state.path());
        assert_eq!(first_attempt_of_allocation(&recs, 0), 0);
        assert_eq!(first_attempt_of_allocation(&recs, 1), 2);
        assert_eq!(last_attempt_in(&recs, 0), 1);
        // A journal with no allocation records (the supervisor never ran at
        // batch level): attempts are Slurm's requeue count.
        assert_eq!(first_attempt_of_allocation(&[], 3), 3);
        // Slurm requeued allocation 0 itself (node failure): reconciled about attempt 1.
        killed_on_n2(&dir, 1);
        let f = fake(true);
        f.acct.lock().unwrap().insert(
            "77".into(),
            vec![crate::slurm::AcctRecord {
                job_id: "77".into(),
                state: "NODE_FAIL".into(),
                nodes: vec!["n1".into(), "n2".into(), "n3".into()],
                start: "2026-11-22T01:00:00".into(),
                ..Default::default()
            }],
        );
        let mut w = Writer::open(&dir, "batch.jsonl", 2, None, None);
        reconcile_previous(&read(state.path()), "77", 1, &f, &mut w);
        let recs = read(state.path());
        let prev = recs.iter().find(|r| r.kind == "previous_attempt").unwrap();
        assert_eq!(
            (prev.u64("about_attempt"), prev.u64("about_allocation")),
            (Some(1), Some(0))
        );
        let d = recs.iter().find(|r| r.kind == "decision").unwrap();
        assert_eq!(d.u64("about_attempt"), Some(1));
        // Seen once, not again.
        let n = recs.len();
        reconcile_previous(&recs, "77", 1, &f, &mut w);
        assert_eq!(read(state.path()).len(), n);
    }

    #[test]
    fn a_refused_requeue_for_the_node_history_runs_the_job_where_it_is() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        let mut w = Writer::open(&dir, "batch.jsonl", 0, None, Some("n1".into()));
        let history = vec![crate::analysis::node_history::NodeHistory {
            node: "n2".into(),
            score: 3.0,
            failures_by_class: Default::default(),
            jobs: vec!["70".into()],
            last_seen: chrono::Utc::now(),
            events: Vec::new(),
            listable: true,
        }];
        let nodes: Vec<String> = vec!["n1".into(), "n2".into()];
        let argv: Vec<std::ffi::OsString> = vec!["python".into(), "train.py".into()];
        // Requeueable, but Slurm refuses the requeue.
        let f = fake(true);
        f.fail("requeue", "Access/permission denied");
        let at = history_at_start(&history, 1.0, "77", &nodes, &argv, &[], &f, &mut w);
        assert_eq!(at, AtStart::Run);
        assert!(
            f.calls().iter().any(|c| c == "requeue 77"),
            "{:?}",
            f.calls()
        );
        let kinds: Vec<String> = journal::read_job(&dir)
            .unwrap()
            .records
            .into_iter()
            .map(|r| r.kind)
            .collect();
        assert!(kinds.contains(&"requeue_failed".to_string()), "{kinds:?}");
        assert!(!kinds.contains(&"job_end".to_string()), "{kinds:?}");
        // Granted, the job goes back to the queue and does not run here.
        let f = fake(true);
        let at = history_at_start(&history, 1.0, "77", &nodes, &argv, &[], &f, &mut w);
        assert_eq!(at, AtStart::Requeued);
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
        let v = verdict(Class::UserError, "exit 1");
        let f = fake(true);
        let tail = vec!["srun: error: n2: task 1: Exited with exit code 137".to_string()];
        let step = StepEnd {
            ended: chrono::Utc::now(),
            exit_code: 137,
            verdict: &v,
            tail: &tail,
            node: "n1",
            pre_timeout: false,
            agents: &[],
        };
        let code = after_attempt(state.path(), "77", 0, &step, 3, false, None, &f, &mut w);
        assert_eq!(code, Next::Exit(137));
        assert_eq!(
            f.calls(),
            [
                "show_job 77",
                "show_job 77",
                "all_nodes ",
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

    /// A job stopped with its failure standing exits as its primary rank
    /// did (65 for a loss gone to NaN), not with srun's 143 for the task
    /// it stopped: what `sacct` shows as the job's exit code.
    #[test]
    fn a_stopped_job_exits_with_its_primary_ranks_code_not_sruns() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "78");
        let nan = Some("loss nan since step 40 (3 steps in a row)");
        rank_exit_with(&dir, (1, "n2", 0), "numerical", nan, 42, 65);
        rank_exit_with(&dir, (0, "n1", 0), "peer_failure", None, 42, 143);
        let mut w = Writer::open(&dir, "batch.jsonl", 0, None, None);
        let v = verdict(Class::Unknown, "exit 143");
        let f = fake(true);
        let step = step_end(&v, 143);
        assert_eq!(
            after_attempt(state.path(), "78", 0, &step, 3, false, None, &f, &mut w),
            Next::Exit(crate::error::EXIT_NUMERICAL)
        );
        assert!(!f.calls().iter().any(|c| c.starts_with("requeue")));
        let recs = journal::read_job(&dir).unwrap().records;
        let end = recs.iter().find(|r| r.kind == "job_end").unwrap();
        assert_eq!(end.get("exit_code").and_then(|c| c.as_i64()), Some(65));
    }

    #[test]
    fn user_error_is_not_requeued_and_crash_loop_stops() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        rank_exit(&dir, 0, "n1", 0, "user_error", Some("KeyError: 'model'"), 3);
        let mut w = Writer::open(&dir, "batch.jsonl", 0, None, None);
        let v = verdict(Class::UserError, "exit 1");
        let f = fake(true);
        let step = step_end(&v, 1);
        assert_eq!(
            after_attempt(state.path(), "77", 0, &step, 3, false, None, &f, &mut w),
            Next::Exit(1)
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
            let step = step_end(&v, 137);
            after_attempt(
                state.path(),
                "77",
                attempt,
                &step,
                3,
                false,
                None,
                &f,
                &mut w,
            );
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
        let v = verdict(Class::Infrastructure, "x");
        let f = fake(false);
        let step = step_end(&v, 1);
        after_attempt(state.path(), "77", 0, &step, 3, false, None, &f, &mut w);
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
            let v = verdict(Class::Preempted, "stopped");
            let f = fake(true);
            let step = StepEnd {
                ended: chrono::Utc::now(),
                exit_code: 143,
                verdict: &v,
                tail: &[],
                node: "n1",
                pre_timeout,
                agents: &[],
            };
            after_attempt(state.path(), "77", 0, &step, 3, false, None, &f, &mut w);
            assert_eq!(
                f.calls().iter().any(|c| c.starts_with("requeue")),
                requeued,
                "pre_timeout {pre_timeout}"
            );
        }
    }

    #[test]
    fn a_node_failure_slurm_handled_alone_is_reconstructed_from_sacct() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        let f = fake(true);
        f.acct.lock().unwrap().insert(
            "77".into(),
            vec![
                crate::slurm::AcctRecord {
                    job_id: "77".into(),
                    state: "RUNNING".into(),
                    nodes: vec!["n1".into(), "n3".into(), "n4".into()],
                    start: "2026-11-22T01:01:00".into(),
                    ..Default::default()
                },
                crate::slurm::AcctRecord {
                    job_id: "77".into(),
                    state: "NODE_FAIL".into(),
                    nodes: vec!["n1".into(), "n2".into(), "n3".into()],
                    start: "2026-11-22T01:00:00".into(),
                    ..Default::default()
                },
            ],
        );
        f.node_info.lock().unwrap().insert(
            "n2".into(),
            crate::slurm::NodeInfo {
                name: "n2".into(),
                state: "down*".into(),
                reason: "Not responding".into(),
            },
        );
        rank_exit(
            &dir,
            0,
            "n1",
            0,
            "secondary",
            Some("Connection reset by peer"),
            12,
        );
        let mut w = Writer::open(&dir, "batch.jsonl", 1, None, None);
        reconcile_previous(&read(state.path()), "77", 1, &f, &mut w);
        let recs = journal::read_job(&dir).unwrap().records;
        let prev = recs.iter().find(|r| r.kind == "previous_attempt").unwrap();
        assert_eq!(prev.str("state"), Some("NODE_FAIL"));
        let fail = recs.iter().find(|r| r.kind == "failure").unwrap();
        assert_eq!(fail.str("blamed_node"), Some("n2"));
        let earlier = earlier_outcomes(&recs, 1);
        assert_eq!(earlier.len(), 1);
        assert_eq!(
            (earlier[0].attempt, earlier[0].class, earlier[0].last_step),
            (0, Class::Infrastructure, Some(12))
        );
        assert_eq!(earlier[0].blamed_nodes, ["n2"]);
        // Attempt 0 was decided (peers' echoes only), yet its node failed:
        // the failure on it is recorded all the same.
        let state2 = tempfile::tempdir().unwrap();
        let dir2 = journal::job_dir(state2.path(), "77");
        let mut w0 = Writer::open(&dir2, "batch.jsonl", 0, None, None);
        w0.record(
            "decision",
            json!({ "outcome": { "class": "infrastructure", "signature": "x", "last_step": 5, "blamed_nodes": [] } }),
            true,
        );
        let mut w1 = Writer::open(&dir2, "batch.jsonl", 1, None, None);
        reconcile_previous(&read(state2.path()), "77", 1, &f, &mut w1);
        let recs2 = journal::read_job(&dir2).unwrap().records;
        let fail2 = recs2
            .iter()
            .find(|r| r.kind == "failure")
            .expect("failure recorded from sinfo");
        assert_eq!(fail2.str("blamed_node"), Some("n2"));
        assert_eq!(recs2.iter().filter(|r| r.kind == "decision").count(), 1);
        // Done once: a second call adds nothing.
        let n = recs.len();
        reconcile_previous(&read(state.path()), "77", 1, &f, &mut w);
        assert_eq!(journal::read_job(&dir).unwrap().records.len(), n);
        // The report shows the failure on the node that failed, in attempt 0.
        let r = crate::analysis::report::build("77", &recs, 0, None);
        assert_eq!(r.failures[0].node.as_deref(), Some("n2"));
        assert_eq!(r.failures[0].attempt, 0);
    }

    #[test]
    fn exclusion_never_leaves_the_job_unschedulable() {
        let f = FakeSlurm::with_job(JobInfo {
            job_id: "5".into(),
            num_nodes: 3,
            requeue: true,
            ..JobInfo::default()
        });
        for n in 1..=4 {
            let name = format!("n{n}");
            f.node_info.lock().unwrap().insert(
                name.clone(),
                crate::slurm::NodeInfo {
                    name,
                    state: "idle".into(),
                    reason: String::new(),
                },
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), "batch.jsonl", 0, None, None);
        let kept = schedulable_exclusion(&f, "5", vec!["n1".into(), "n2".into()], &mut w);
        assert_eq!(kept, ["n1"]);
        let recs = journal::read_job(dir.path()).unwrap().records;
        assert_eq!(recs[0].kind, "exclusion_limited");
    }

    #[test]
    fn srun_lines_name_silent_ranks() {
        let f = srun_failures(
            &[
                "srun: error: n3: task 2: Exited with exit code 137".into(),
                "srun: error: n1: task 0: Terminated".into(),
                "srun: error: Node failure on n4".into(),
                "srun: error: n2: task 1: Exited with exit code 1".into(),
                "srun: error: n4: task 3: Killed".into(),
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
                (1, "n2", Class::Unknown),
                (3, "n4", Class::Secondary)
            ]
        );
    }

    #[test]
    fn local_mode_restarts_in_place_says_so_and_remembers_without_a_journal() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        rank_exit(
            &dir,
            0,
            "ws",
            0,
            "infrastructure",
            Some("killed by SIGKILL"),
            7,
        );
        let mut w = Writer::open(&dir, "launcher.jsonl", 0, None, Some("ws".into()));
        let v = verdict(Class::Infrastructure, "rank 0 exited 137");
        let step = StepEnd {
            ended: chrono::Utc::now(),
            exit_code: 137,
            verdict: &v,
            tail: &[],
            node: "ws",
            pre_timeout: false,
            agents: &[],
        };
        let d = decide_local(state.path(), &read(state.path()), 0, &step, 3, &[], &mut w).unwrap();
        assert!(
            matches!(&d.action, Action::RestartInPlace { reason } if reason == "infrastructure: killed by SIGKILL"),
            "{:?}",
            d.action
        );
        let recs = read(state.path());
        let dec = recs.iter().find(|r| r.kind == "decision").unwrap();
        assert_eq!(dec.get("decision").unwrap()["action"], "restart_in_place");
        assert_eq!(dec.get("outcome").unwrap()["detail"], "killed by SIGKILL");

        // No journal to read back (an unwritable state dir): the launcher's
        // own view decides, and what it decided before still counts, so the
        // same failure again is a crash loop instead of endless restarts.
        let mut quiet = Writer::disabled();
        let first = decide_local(state.path(), &[], 0, &step, 3, &[], &mut quiet).unwrap();
        assert!(matches!(first.action, Action::RestartInPlace { .. }));
        let second = decide_local(
            state.path(),
            &[],
            1,
            &step,
            3,
            std::slice::from_ref(&first.outcome),
            &mut quiet,
        )
        .unwrap();
        assert!(
            matches!(&second.action, Action::Stop { reason, .. } if reason.starts_with("crash loop")),
            "{:?}",
            second.action
        );
    }

    #[test]
    fn local_mode_stops_when_this_machine_fails_its_health_check() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        let mut r = Writer::open(&dir, "rank-0.jsonl", 0, Some(0), Some("ws".into()));
        r.record(
            "health_check",
            json!({ "when": "after_failure", "result": { "ok": false, "status": "exit 1" } }),
            true,
        );
        rank_exit(
            &dir,
            0,
            "ws",
            0,
            "infrastructure",
            Some("GPU 3: 12 uncorrectable ECC errors"),
            4,
        );
        let mut w = Writer::open(&dir, "launcher.jsonl", 0, None, Some("ws".into()));
        let v = verdict(Class::Infrastructure, "x");
        let step = StepEnd {
            ended: chrono::Utc::now(),
            exit_code: 1,
            verdict: &v,
            tail: &[],
            node: "ws",
            pre_timeout: false,
            agents: &[],
        };
        let d = decide_local(state.path(), &read(state.path()), 0, &step, 3, &[], &mut w).unwrap();
        assert!(
            matches!(&d.action, Action::Stop { reason, .. } if reason.contains("health check") && reason.contains("ECC")),
            "{:?}",
            d.action
        );
    }

    #[test]
    fn a_killed_agent_is_relaunched_without_its_node_not_taken_for_a_cancel() {
        // Two-level form, 4 nodes, a 3-node step: rank 1's agent on n2 was
        // killed by SIGKILL and left no rank_exit; srun stopped the others.
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        for (rank, node) in [(0, "n1"), (1, "n2"), (2, "n3")] {
            let mut w = Writer::open(
                &dir,
                &format!("rank-{rank}.jsonl"),
                0,
                Some(rank),
                Some(node.into()),
            );
            w.record("rank_start", json!({ "pid": 1 }), true);
        }
        rank_exit(&dir, 0, "n1", 0, "preempted", None, 40);
        rank_exit(&dir, 2, "n3", 0, "preempted", None, 40);
        let mut w = Writer::open(&dir, "batch.jsonl", 0, None, Some("n1".into()));
        let v = verdict(Class::Unknown, "exit 137");
        let tail = vec!["srun: error: n2: task 1: Killed".to_string()];
        let step = StepEnd {
            ended: chrono::Utc::now(),
            exit_code: 137,
            verdict: &v,
            tail: &tail,
            node: "n1",
            pre_timeout: false,
            agents: &[],
        };
        let f = fake(true);
        let next = after_attempt(
            state.path(),
            "77",
            0,
            &step,
            3,
            false,
            Some(four_nodes(&[])),
            &f,
            &mut w,
        );
        let Next::Relaunch(r) = next else {
            panic!("{next:?}")
        };
        assert_eq!((r.attempt, r.exclude.clone()), (1, vec!["n2".to_string()]));
        let recs = read(state.path());
        let j = recs.iter().find(|r| r.kind == "judgment").unwrap();
        assert_eq!(
            (j.str("class"), j.u64("primary_rank")),
            (Some("infrastructure"), Some(1))
        );
        let failure = recs.iter().find(|r| r.kind == "failure").unwrap();
        assert_eq!(failure.str("failure_kind"), Some("agent_died"));
        assert_eq!(
            failure.str("evidence"),
            Some("the agent of rank 1 died and left no record; srun: error: n2: task 1: Killed")
        );
        // Its node is the dead agent's, not the writer's (trial 6: the
        // report said n1; the node history had nothing for n2).
        assert_eq!(failure.str("blamed_node"), Some("n2"));
        let report = crate::analysis::report::build("77", &recs, 0, None);
        assert_eq!(
            report.failures[0].node.as_deref(),
            Some("n2"),
            "{:?}",
            report.failures
        );
        // The node history shows it on n2, held against nothing: a kill -9
        // of resilio's own agent is no evidence against the node (trial 14;
        // docs/admin.md).
        let events = crate::analysis::node_history::events_of("77", &recs);
        assert!(
            events.iter().any(|(n, e)| n == "n2" && !e.counts),
            "{events:?}"
        );
    }
}
