//! The job-level decision after an attempt, taken by the `resilio run` that
//! wraps the job's steps in the batch script
//! (`resilio run -- srun resilio run -- python train.py`).
//!
//! When the step has ended, every rank's agent has journaled its end with a
//! verdict (`rank_exit.class`). This module reads them from the shared
//! journal (plus srun's own error lines, for ranks whose agents died with
//! their node), judges which failure was primary, decides with the restart
//! policy, journals the decision, and acts. Inside the allocation first:
//! the step is relaunched on the nodes that remain once the blamed ones are
//! left out (`srun --exclude`), when enough remain. Otherwise through the
//! [`Slurm`] trait: `scontrol requeue`, then `ExcNodeList` while Slurm is
//! still tearing the job down (a running job's exclusion list cannot be
//! changed; see SLURM-FACTS).
//!
//! Attempts count steps, not allocations: an allocation runs one attempt,
//! plus one per relaunch inside it. Each allocation's `job_start` record
//! names it (`allocation`, Slurm's requeue count), which maps Slurm's
//! records of an allocation to the attempts that ran in it.

use crate::journal::{self, Record, Writer};
use crate::policy::failure::{self, Class, Judgment, RankFailure, Verdict};
use crate::policy::restart::{self, Action, Allocation, AttemptOutcome, Relaunch};
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
    /// When the step ended (srun's failure lines are dated by it): passed
    /// in, so that judging reads no clock.
    pub ended: chrono::DateTime<chrono::Utc>,
}

fn class_of(name: &str) -> Option<Class> {
    Some(match name {
        "clean" => Class::Clean,
        "user_error" => Class::UserError,
        "unknown" => Class::Unknown,
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
    // The coordinator's job-wide judgment of a hang names the rank that hung
    // first: it is the cause, the ranks that stalled waiting for it are echoes.
    if let Some(h) = records
        .iter()
        .rev()
        .find(|r| r.kind == "hang" && r.attempt == attempt)
    {
        let v = h.get("verdict");
        let blamed: Vec<u32> = v
            .and_then(|v| v.get("blamed_ranks"))
            .and_then(|b| b.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64().map(|x| x as u32))
                    .collect()
            })
            .unwrap_or_default();
        let why = v
            .and_then(|v| v.get("reason"))
            .and_then(|r| r.as_str())
            .unwrap_or("")
            .to_string();
        if !blamed.is_empty() {
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
    }
    // The coordinator stopped the step to leave a confirmed straggler node
    // out: that node is the cause, every rank stopped with it an echo.
    if let Some(x) = records
        .iter()
        .rev()
        .find(|r| r.kind == "straggler_exclusion" && r.attempt == attempt)
    {
        let node = x.str("straggler_node").unwrap_or("").to_string();
        let rank = x.u64("about_rank").map_or(u32::MAX, |r| r as u32);
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
            at: secs(x),
            verdict: Verdict {
                class: Class::Infrastructure,
                reason: "confirmed straggler node (the coordinator's judgment)".into(),
                evidence: x.str("evidence").map(|e| format!("straggler: {e}")),
            },
        });
    }
    // Ranks journaled by their agents are known; srun adds the silent ones
    // (unless the supervisor stopped the step itself: then srun's lines are
    // the teardown it asked for).
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
    let judgment = failure::primary(&failures);
    (failures, judgment)
}

/// The attempt a record is about: `about_attempt` when a later attempt
/// recorded it (a reconstructed decision), else its own.
fn about(r: &Record) -> u32 {
    r.u64("about_attempt").map_or(r.attempt, |a| a as u32)
}

/// The outcomes of earlier attempts, from their `decision` records.
pub fn earlier_outcomes(records: &[Record], attempt: u32) -> Vec<AttemptOutcome> {
    records
        .iter()
        .filter(|r| r.kind == "decision" && about(r) < attempt)
        .filter_map(|r| {
            let o = r.get("outcome")?;
            let signature = o.get("signature")?.as_str()?.to_string();
            Some(AttemptOutcome {
                attempt: about(r),
                class: class_of(o.get("class")?.as_str()?)?,
                // Journals written before `detail` existed: the signature.
                detail: o
                    .get("detail")
                    .and_then(|d| d.as_str())
                    .map_or_else(|| signature.clone(), str::to_string),
                signature,
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

/// Never exclude so many nodes that the job could not run again: keep the
/// exclusion only while enough healthy nodes remain for the job's size.
fn schedulable_exclusion(
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
    if info.num_nodes == 0 || all.is_empty() {
        return exclude;
    }
    let usable = |excl: &[String]| {
        all.iter()
            .filter(|n| {
                !n.is_failed() && !info.excluded.contains(&n.name) && !excl.contains(&n.name)
            })
            .count() as u32
    };
    let mut kept = exclude.clone();
    while !kept.is_empty() && usable(&kept) < info.num_nodes {
        kept.pop();
    }
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

/// The allocation a batch-level `job_start` record was written in.
fn allocation_of(r: &Record) -> Option<u32> {
    (r.kind == "job_start")
        .then(|| r.u64("allocation").map(|a| a as u32))
        .flatten()
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
    let decided: Vec<u32> = records
        .iter()
        .filter(|r| r.kind == "decision")
        .map(about)
        .collect();
    let seen: Vec<u32> = records
        .iter()
        .filter(|r| r.kind == "previous_attempt")
        .filter_map(|r| r.u64("about_allocation").map(|a| a as u32))
        .collect();
    // Every earlier allocation is recorded as Slurm saw it; those nobody
    // decided on (the supervisor died with its node) also get a failure and decision.
    let missing: Vec<u32> = (0..allocation).filter(|a| !seen.contains(a)).collect();
    if missing.is_empty() {
        return;
    }
    let mut rows = match slurm.accounting(job) {
        Ok(rows) => rows,
        Err(e) => {
            journal.record(
                "previous_attempt_unknown",
                json!({ "attempts": missing, "error": e.to_string() }),
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
        let a = last_attempt_in(records, alloc);
        let failed: Vec<crate::slurm::NodeInfo> = slurm
            .node_states(&row.nodes)
            .map(|v| v.into_iter().filter(|n| n.is_failed()).collect())
            .unwrap_or_default();
        let failed_names: Vec<String> = failed.iter().map(|n| n.name.clone()).collect();
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
            "sacct: allocation {alloc} (attempt {a}) {} on {}{}",
            row.state,
            crate::slurm::hostlist::compress(&row.nodes),
            failed
                .iter()
                .map(|n| format!("; {} {} ({})", n.name, n.state, n.reason))
                .collect::<String>()
        );
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
                "failed_nodes": failed_names,
                "source": "sacct",
            }),
            true,
        );
        // A node Slurm now reports failed was part of this attempt: record
        // its failure unless a failure on it is journaled already (the
        // supervisor may have seen only the peers' echoes).
        let blamed_before = records
            .iter()
            .filter(|r| r.kind == "failure" && about(r) == a)
            .any(|r| {
                r.str("blamed_node")
                    .is_some_and(|n| failed_names.iter().any(|f| f == n))
            });
        if decided.contains(&a) {
            if !failed_names.is_empty() && !blamed_before {
                journal.record(
                    "failure",
                    json!({
                        "about_attempt": a,
                        "failure_kind": "node_failure",
                        "class": Class::Infrastructure,
                        "cause": "node failure",
                        "blamed_node": failed_names.first(),
                        "failed_nodes": failed_names,
                        "evidence": evidence,
                        "source": "sacct",
                    }),
                    true,
                );
            }
            continue;
        }
        if class != Class::Clean {
            journal.record(
                "failure",
                json!({
                    "about_attempt": a,
                    "failure_kind": if node_fail { "node_failure" } else { "slurm" },
                    "class": class,
                    "cause": if node_fail { "node failure" } else { row.state.as_str() },
                    "blamed_node": failed_names.first(),
                    "failed_nodes": failed_names,
                    "evidence": evidence,
                    "source": "sacct",
                }),
                true,
            );
        }
        let last_step = records
            .iter()
            .filter(|r| r.attempt == a)
            .filter_map(|r| {
                r.u64("last_step")
                    .or_else(|| (r.kind == "progress").then(|| r.u64("step")).flatten())
            })
            .max();
        let outcome = AttemptOutcome::new(
            a,
            class,
            if node_fail {
                "node failure"
            } else {
                &row.state
            },
            last_step,
            failed_names.clone(),
        );
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

/// The judgment and decision on one attempt.
pub struct Decided {
    pub judgment: Judgment,
    /// The primary failure.
    pub primary: RankFailure,
    pub outcome: AttemptOutcome,
    pub evidence: String,
    pub action: Action,
}

/// Judge the attempt from the journal, decide with the restart policy, and
/// journal both (`judgment`, `decision`). `None` when nothing failed.
/// With `alloc` (a job-level supervisor holding the allocation), a restart
/// happens inside it when it can take the step again.
pub fn decide_attempt(
    records: &[Record],
    attempt: u32,
    step: &StepEnd<'_>,
    max_restarts: u32,
    alloc: Option<&Allocation>,
    requeue_allowed: impl FnOnce() -> bool,
    journal: &mut Writer,
) -> Option<Decided> {
    let pre_timeout = step.pre_timeout;
    decide_with(records, attempt, step, journal, |outcome, earlier| {
        if outcome.class == Class::Preempted && !pre_timeout {
            // Stopped from outside with no warning: scancel, or a time limit the
            // job did not ask to be warned of. Requeueing would undo a cancel.
            Action::Stop {
                reason: "stopped from outside (scancel, or a time limit without --signal=B:USR1@N): not requeued".into(),
            }
        } else if let Some(alloc) = alloc {
            match restart::decide(outcome, earlier, max_restarts, true) {
                Action::Requeue { reason, .. } => {
                    match restart::relaunch_where(alloc, &outcome.blamed_nodes, outcome.class) {
                        Relaunch::InAllocation { exclude, nodes } => Action::RestartInAllocation {
                            reason: format!("{reason}: relaunched inside the allocation"),
                            exclude,
                            nodes,
                        },
                        Relaunch::Requeue { why, .. } if !requeue_allowed() => Action::Stop {
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
                a => a,
            }
        } else {
            restart::decide(outcome, earlier, max_restarts, requeue_allowed())
        }
    })
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
    journal: &mut Writer,
) -> Option<Decided> {
    let unhealthy = records.iter().any(|r| {
        r.attempt == attempt
            && r.kind == "health_check"
            && r.get("result")
                .and_then(|h| h.get("ok"))
                .and_then(|ok| ok.as_bool())
                == Some(false)
    });
    decide_with(records, attempt, step, journal, |outcome, earlier| {
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
    journal: &mut Writer,
    choose: impl FnOnce(&AttemptOutcome, &[AttemptOutcome]) -> Action,
) -> Option<Decided> {
    let (failures, judgment) = judge_attempt(records, attempt, step);
    let last_step = records
        .iter()
        .filter(|r| r.attempt == attempt)
        .filter_map(|r| match r.kind.as_str() {
            "rank_exit" => r.u64("last_step"),
            "progress" => r.u64("step"),
            _ => None,
        })
        .max();
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
    let earlier = earlier_outcomes(records, attempt);
    let action = choose(&outcome, &earlier);
    journal.record(
        "decision",
        json!({ "outcome": outcome, "decision": action }),
        true,
    );
    Some(Decided {
        judgment: j,
        primary,
        outcome,
        evidence,
        action,
    })
}

/// What the job-level supervisor does once it has decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Exit with this code (finished, stopped, or requeued: Slurm starts the next attempt).
    Exit(i32),
    /// Relaunch the step inside the allocation.
    Relaunch(crate::slurm::step::Relaunch),
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
    max_restarts: u32,
    alloc: Option<Allocation>,
    slurm: &dyn Slurm,
    journal: &mut Writer,
) -> Next {
    let records = journal::read_job(&journal::job_dir(state_dir, job))
        .map(|j| crate::runs::of_key(j.records, journal.run()))
        .unwrap_or_default();
    let requeue_allowed = || match slurm.show_job(job) {
        Ok(info) => info.requeue,
        Err(e) => {
            eprintln!("resilio: cannot read job {job} from Slurm: {e}");
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
    let Some(d) = decide_attempt(
        &records,
        attempt,
        step,
        max_restarts,
        alloc.as_ref(),
        requeue_allowed,
        journal,
    ) else {
        journal.record(
            "job_end",
            json!({ "exit_code": step.exit_code, "reason": "completed" }),
            true,
        );
        return Next::Exit(step.exit_code);
    };
    let (j, evidence, action) = (d.judgment, d.evidence, d.action);
    match action {
        Action::Finish => {
            journal.record(
                "job_end",
                json!({ "exit_code": step.exit_code, "reason": "completed" }),
                true,
            );
        }
        // Local mode's decision (never taken for a Slurm job): the failure stands.
        Action::Stop { reason } | Action::RestartInPlace { reason } => {
            eprintln!("resilio: job {job} not requeued: {reason}");
            journal.record(
                "job_end",
                json!({ "exit_code": step.exit_code, "reason": reason }),
                true,
            );
        }
        Action::RestartInAllocation {
            exclude,
            nodes,
            reason,
        } => {
            let before = alloc
                .as_ref()
                .map(|a| a.excluded.clone())
                .unwrap_or_default();
            for node in exclude.iter().filter(|n| !before.contains(n)) {
                journal.record(
                    "node_excluded",
                    json!({ "excluded_node": node, "reason": j.class, "evidence": evidence, "scope": "step" }),
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
            let before = alloc
                .as_ref()
                .map(|a| a.excluded.clone())
                .unwrap_or_default();
            for node in exclude.iter().filter(|n| !before.contains(n)) {
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
            if !requeue(slurm, job, &exclude, journal) {
                journal.record(
                    "job_end",
                    json!({ "exit_code": step.exit_code, "reason": "requeue failed" }),
                    true,
                );
            }
        }
    }
    Next::Exit(step.exit_code)
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

/// `[nodes] exclude_at_start`: before the first step of an allocation,
/// leave out the nodes the node history lists (score at or above the
/// threshold): inside the allocation when spare nodes remain for the step,
/// else by one requeue with `ExcNodeList` (never twice for this reason).
#[allow(clippy::too_many_arguments)]
pub fn history_at_start(
    history: &[crate::node_history::NodeHistory],
    threshold: f64,
    job: &str,
    alloc_nodes: &[String],
    argv: &[std::ffi::OsString],
    records: &[Record],
    slurm: &dyn Slurm,
    journal: &mut Writer,
) -> AtStart {
    let listed: Vec<&crate::node_history::NodeHistory> =
        history.iter().filter(|h| h.score >= threshold).collect();
    let here: Vec<&&crate::node_history::NodeHistory> = listed
        .iter()
        .filter(|h| alloc_nodes.contains(&h.node))
        .collect();
    if here.is_empty() {
        journal.record(
            "node_history_checked",
            json!({ "listed": listed.iter().map(|h| h.node.as_str()).collect::<Vec<_>>(), "in_allocation": [] }),
            false,
        );
        return AtStart::Run;
    }
    let names: Vec<String> = here.iter().map(|h| h.node.clone()).collect();
    let evidence = |h: &crate::node_history::NodeHistory| {
        format!(
            "node history score {:.2} (threshold {threshold}): {}",
            h.score,
            h.events.last().map(|e| e.evidence.as_str()).unwrap_or("")
        )
    };
    let requested = crate::slurm::step::requested_nodes(argv);
    if let Some(k) = requested.filter(|_| crate::slurm::step::can_leave_out(argv)) {
        // The user's own `srun --exclude` leaves nodes out too.
        let theirs = crate::slurm::step::user_excluded_nodes(argv);
        let left = alloc_nodes
            .iter()
            .filter(|n| !names.contains(n) && !theirs.contains(n))
            .count() as u32;
        if left >= k {
            for h in &here {
                journal.record(
                    "node_excluded",
                    json!({ "excluded_node": h.node, "reason": "node_history", "evidence": evidence(h), "scope": "step" }),
                    true,
                );
            }
            return AtStart::LeaveOut {
                exclude: names,
                nodes: k,
            };
        }
    }
    let requeued_before = records
        .iter()
        .any(|r| r.kind == "requeue" && r.str("by") == Some("node_history"));
    let requeueable = slurm.show_job(job).is_ok_and(|i| i.requeue);
    if requeued_before || !requeueable {
        journal.record(
            "node_history_warning",
            json!({
                "nodes": names,
                "reason": if requeued_before { "requeued once for the node history already" }
                          else { "no spare node for the step and the job cannot be requeued" },
            }),
            true,
        );
        eprintln!(
            "resilio: the allocation holds node(s) the history lists ({}); running anyway",
            names.join(",")
        );
        return AtStart::Run;
    }
    let exclude = schedulable_exclusion(slurm, job, names, journal);
    if exclude.is_empty() {
        return AtStart::Run;
    }
    for h in here.iter().filter(|h| exclude.contains(&h.node)) {
        journal.record(
            "node_excluded",
            json!({ "excluded_node": h.node, "reason": "node_history", "evidence": evidence(h) }),
            true,
        );
    }
    let reason = format!(
        "node history lists {} in this allocation and no spare node remains for the step",
        exclude.join(",")
    );
    // Not a failure: a decision that costs no restart budget.
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
    // The requeue was refused: the job runs where it is rather than not at all.
    eprintln!("resilio: running job {job} on its allocation anyway");
    AtStart::Run
}

/// `scontrol requeue`, then the exclusion while Slurm tears the job down.
/// False when the job could not be requeued (said on stderr and journaled).
fn requeue(slurm: &dyn Slurm, job: &str, exclude: &[String], journal: &mut Writer) -> bool {
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
    let mut last_err = None;
    for _ in 0..20 {
        match slurm.exclude_more(job, exclude) {
            Ok(all) => {
                journal.record(
                    "exclusion_set",
                    json!({ "exc_node_list": crate::slurm::hostlist::compress(&all) }),
                    true,
                );
                return true;
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
        journal.record("exclusion_failed", json!({ "error": e.to_string() }), true);
    }
    // Requeued: the next attempt may land on the node again, which the
    // journal says.
    true
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

    fn verdict(class: Class, reason: &str) -> Verdict {
        Verdict {
            class,
            reason: reason.into(),
            evidence: None,
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
        let step = StepEnd {
            ended: chrono::Utc::now(),
            exit_code: 137,
            verdict: &v,
            tail: &[],
            node: "n1",
            pre_timeout: false,
        };
        let next = after_attempt(
            state.path(),
            "77",
            0,
            &step,
            3,
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
        let history = vec![crate::node_history::NodeHistory {
            node: "n2".into(),
            score: 3.0,
            failures_by_class: Default::default(),
            jobs: vec!["70".into()],
            last_seen: chrono::Utc::now(),
            events: Vec::new(),
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
        };
        let code = after_attempt(state.path(), "77", 0, &step, 3, None, &f, &mut w);
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

    #[test]
    fn user_error_is_not_requeued_and_crash_loop_stops() {
        let state = tempfile::tempdir().unwrap();
        let dir = journal::job_dir(state.path(), "77");
        rank_exit(&dir, 0, "n1", 0, "user_error", Some("KeyError: 'model'"), 3);
        let mut w = Writer::open(&dir, "batch.jsonl", 0, None, None);
        let v = verdict(Class::UserError, "exit 1");
        let f = fake(true);
        let step = StepEnd {
            ended: chrono::Utc::now(),
            exit_code: 1,
            verdict: &v,
            tail: &[],
            node: "n1",
            pre_timeout: false,
        };
        assert_eq!(
            after_attempt(state.path(), "77", 0, &step, 3, None, &f, &mut w),
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
            let step = StepEnd {
                ended: chrono::Utc::now(),
                exit_code: 137,
                verdict: &v,
                tail: &[],
                node: "n1",
                pre_timeout: false,
            };
            after_attempt(state.path(), "77", attempt, &step, 3, None, &f, &mut w);
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
        let step = StepEnd {
            ended: chrono::Utc::now(),
            exit_code: 1,
            verdict: &v,
            tail: &[],
            node: "n1",
            pre_timeout: false,
        };
        after_attempt(state.path(), "77", 0, &step, 3, None, &f, &mut w);
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
            };
            after_attempt(state.path(), "77", 0, &step, 3, None, &f, &mut w);
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
        let r = crate::report::build("77", &recs, 0, None);
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
        };
        let d = decide_local(&read(state.path()), 0, &step, 3, &[], &mut w).unwrap();
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
        let first = decide_local(&[], 0, &step, 3, &[], &mut quiet).unwrap();
        assert!(matches!(first.action, Action::RestartInPlace { .. }));
        let second = decide_local(
            &[],
            1,
            &step,
            3,
            std::slice::from_ref(&first.outcome),
            &mut quiet,
        )
        .unwrap();
        assert!(
            matches!(&second.action, Action::Stop { reason } if reason.starts_with("crash loop")),
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
        };
        let d = decide_local(&read(state.path()), 0, &step, 3, &[], &mut w).unwrap();
        assert!(
            matches!(&d.action, Action::Stop { reason } if reason.contains("health check") && reason.contains("ECC")),
            "{:?}",
            d.action
        );
    }
}
