//! `resilio timeline`: one line per event that matters, grouped by attempt,
//! with time relative to the job's start and absolute UTC time, read from
//! the journal alone (plus Slurm's allocation times when known).

use super::report::secs;
use crate::event::Event;
use crate::journal::Record;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// A record's line, from its event read once (`None`: a kind this build
/// does not know, or cannot read, which shows by name).
fn describe(r: &Record, event: Option<&Event>) -> Option<String> {
    match event {
        Some(e) => describe_event(e),
        None => match r.kind.as_str() {
            "coordinator_reachable_again" => None,
            other => Some(other.to_string()),
        },
    }
}

/// A number or `-`.
fn num<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".to_string(), |v| v.to_string())
}

fn text(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("?")
}

fn describe_event(event: &Event) -> Option<String> {
    use crate::event as e;
    Some(match event {
        Event::JobStart(x) => match &x.relaunch_in_allocation {
            Some(v) => {
                let out: Vec<&str> = v
                    .get("exclude")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                if out.is_empty() {
                    "step relaunched inside the allocation".into()
                } else {
                    format!(
                        "step relaunched inside the allocation, leaving out {}",
                        out.join(",")
                    )
                }
            }
            None => "job started".into(),
        },
        Event::RankStart(x) => format!(
            "launched pid {} ({} stall timeout): {}",
            x.pid.unwrap_or(0),
            text(&x.stall_mode),
            x.argv.as_deref().unwrap_or_default().join(" ")
        ),
        Event::Progress(e::Progress {
            first: Some(_),
            step,
            source,
            ..
        }) => format!("first step {} (from {})", num(*step), text(source)),
        Event::Progress(_) => return None,
        Event::Phase(x) => format!("phase {} at step {}", text(&x.phase), num(x.step)),
        Event::CheckpointDone(x) => format!("checkpoint done at step {}", num(x.step)),
        Event::Stall(x) => format!(
            "STALL ({}): no progress for {:.1}s, limit {:.1}s, last step {}",
            text(&x.stall_kind),
            x.idle_s.unwrap_or(0.0),
            x.timeout_s.unwrap_or(0.0),
            num(x.last_step)
        ),
        Event::Slowdown(x) if x.state.as_deref() == Some("started") => format!(
            "SLOWDOWN: {} ({})",
            text(&x.detail),
            text(&x.action)
        ),
        Event::Slowdown(x) => format!(
            "slowdown over after {:.0}s: {:.3}s per step, baseline {:.3}s",
            x.lasted_s.unwrap_or(0.0),
            x.step_s.unwrap_or(0.0),
            x.baseline_s.unwrap_or(0.0)
        ),
        Event::Numerical(x) => format!(
            "NUMERICAL {}: {} ({})",
            text(&x.finding),
            text(&x.detail),
            match x.action.as_deref() {
                Some("stop") => "stopping the rank, not restarted",
                _ => "recorded",
            }
        ),
        Event::Diagnostics(x) => format!(
            "diagnostics: {} output lines, {} py-spy dump(s){}{}",
            x.tail.as_ref().map_or(0, Vec::len),
            x.py_spy.as_ref().map_or(0, Vec::len),
            x.dump_signal
                .as_ref()
                .map_or(String::new(), |s| format!(", sent {s}")),
            x.file
                .as_ref()
                .map_or(String::new(), |f| format!(" -> {f}"))
        ),
        Event::Stop(x) => format!(
            "stopping the rank: {}{}",
            text(&x.signal),
            x.reason
                .as_ref()
                .map_or(String::new(), |r| format!(" ({r})"))
        ),
        Event::Signal(x) => format!(
            "received {}{}",
            text(&x.signal),
            if x.forwarded == Some(true) {
                ", forwarded to the trainer"
            } else {
                ""
            }
        ),
        Event::RankExit(x) => format!(
            "rank exited: {} ({}), exit code {}, last step {}",
            text(&x.cause),
            text(&x.status),
            x.exit_code.unwrap_or(-1),
            num(x.last_step)
        ),
        Event::Failure(x) => format!(
            "FAILURE {}: {}",
            text(&x.failure_kind),
            x.detail.as_deref().or(x.cause.as_deref()).unwrap_or("?")
        ),
        Event::JobEnd(x) => format!("job ended, exit code {}", x.exit_code.unwrap_or(-1)),
        Event::MonitorError(x) => format!("monitoring degraded: {}", text(&x.error)),
        Event::MalformedMessage(x) => format!("malformed progress message ({})", text(&x.fault)),
        Event::JournalGap(x) => match (x.from, x.to) {
            (Some(from), Some(to)) => format!(
                "journal gap: {} record(s) lost since {} ({:.1}s: the journal could not be written, a full disk or another write error; unexplained time)",
                x.lost_records.unwrap_or(0),
                from.format("%H:%M:%S%.3fZ"),
                crate::analysis::report::secs(from, to)
            ),
            _ => format!("journal gap: {} record(s) lost", x.lost_records.unwrap_or(0)),
        },
        Event::Hang(x) => {
            let v = x.verdict.clone().unwrap_or_default();
            let blamed = v
                .blamed_ranks
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            format!(
                "HANG judged job-wide ({}): {}{}",
                text(&v.rule),
                text(&v.reason),
                if blamed.is_empty() {
                    String::new()
                } else {
                    format!(" -> blamed rank(s) {blamed}")
                }
            )
        }
        // The order (with its reason), then the launcher's stop of the ranks
        // left: the reason said once.
        Event::Teardown(x) => match x.ranks_left {
            Some(n) if x.first_rank.is_none() && x.about_node.is_none() => {
                format!("teardown: stopping the {n} rank(s) left")
            }
            _ => format!("teardown: {}", text(&x.reason)),
        },
        Event::BusySilent(x) => format!(
            "busy and silent at its step limit ({:.1}s of CPU, {:.1} MB of I/O in {:.1}s): judged by the evaluation limit ({:.0}s) from now",
            x.cpu_s.unwrap_or(0.0),
            x.io_bytes.unwrap_or(0) as f64 / 1e6,
            x.window_s.unwrap_or(0.0),
            x.limit_s.unwrap_or(0.0)
        ),
        Event::ProgressSource(x) => format!(
            "steps now named by the {}{}",
            text(&x.steps_from),
            x.before
                .as_ref()
                .map_or(String::new(), |b| format!(" (before: the {b})"))
        ),
        Event::StallReported(x) => {
            format!("coordinator: rank {} reported a stall", num(x.about_rank))
        }
        Event::Probe(x) => format!(
            "probe ({}): {}",
            text(&x.reason),
            match x
                .probe
                .as_ref()
                .and_then(|p| p.get("waiting_on_peer"))
                .and_then(Value::as_bool)
            {
                Some(true) => "blocked on a peer",
                Some(false) => "not waiting on a peer",
                None => "unknown",
            }
        ),
        Event::StopDeferred(_) => "stop deferred until the coordinator's judgment".into(),
        Event::Launch(x) => format!(
            "launched {} rank(s), MASTER_PORT {}",
            num(x.ranks),
            num(x.master_port)
        ),
        Event::AttemptEnd(_) => "every rank of the attempt has exited".into(),
        Event::Judgment(x) if x.primary_rank.is_none() && x.primary_node.is_none() => format!(
            "judgment: {}, nobody blamed: {}",
            x.class.map_or("?", |c| c.name()),
            text(&x.evidence)
        ),
        Event::Judgment(x) => format!(
            "judgment: {} on rank {} ({}): {}",
            x.class.map_or("?", |c| c.name()),
            num(x.primary_rank),
            text(&x.primary_node),
            text(&x.evidence)
        ),
        Event::Decision(x) => format!(
            "decision: {}",
            x.decision
                .as_ref()
                .and_then(|d| d.action.as_deref())
                .unwrap_or("?")
                .replace('_', " ")
        ),
        Event::Restart(x) => format!(
            "RESTART {} as attempt {}: {}",
            if x.in_allocation == Some(true) {
                "inside the allocation"
            } else {
                "in place"
            },
            num(x.next_attempt),
            text(&x.reason)
        ),
        Event::Relaunched(x) => format!(
            "first step {:.2}s after the failure",
            x.failure_to_first_step_s.unwrap_or(0.0)
        ),
        Event::Straggler(x) => format!(
            "STRAGGLER {} {} {}: {:.3}s per step vs median {:.3}s ({})",
            text(&x.scope),
            text(&x.who),
            if x.flagged == Some(true) {
                "flagged"
            } else {
                "recovered"
            },
            x.value_s.unwrap_or(0.0),
            x.median_s.unwrap_or(0.0),
            text(&x.basis)
        ),
        Event::CheckpointRequested(x) => format!(
            "checkpoint requested{} ({})",
            x.step.map_or(String::new(), |s| format!(" at step {s}")),
            text(&x.reason)
        ),
        Event::CheckpointComplete(x) => format!(
            "coordinated checkpoint #{} at step {}: every rank confirmed",
            num(x.id),
            num(x.step)
        ),
        Event::CheckpointIncomplete(x) => format!(
            "coordinated checkpoint #{} at step {}: ranks {} never confirmed",
            num(x.id),
            num(x.step),
            x.missing_ranks.as_ref().map_or("?".into(), |m| {
                serde_json::to_string(m).unwrap_or_else(|_| "?".into())
            })
        ),
        Event::CoordinatorUnreachable(x) => {
            format!("coordinator unreachable: {}", text(&x.error))
        }
        Event::CoordinatorReachable(x) => format!(
            "coordinator reachable again after {:.1}s",
            x.gap_s.unwrap_or(0.0)
        ),
        Event::CoordinatorStart(x) => format!("coordinator listening on {}", text(&x.url)),
        Event::NodeExcluded(x) => format!(
            "EXCLUDED {}{} ({}): {}",
            text(&x.excluded_node),
            match x.scope.as_deref() {
                Some("step") => " from the step",
                _ => " from the job",
            },
            text(&x.reason),
            x.evidence.as_deref().unwrap_or("")
        ),
        Event::Requeue(x) if x.by.as_deref() == Some("slurm") => {
            format!("requeued by Slurm itself ({})", text(&x.state))
        }
        Event::Requeue(x) => format!(
            "REQUEUE{}: {}",
            x.exclude
                .as_ref()
                .filter(|a| !a.is_empty())
                .map(|a| format!(" excluding {}", a.join(",")))
                .unwrap_or_default(),
            text(&x.reason)
        ),
        Event::ExclusionSet(x) => {
            format!("Slurm now keeps the job off {}", text(&x.exc_node_list))
        }
        Event::StopJudged(_) => "stopping after the coordinator's judgment".into(),
        Event::LauncherLost(x) => format!(
            "the launcher (pid {}) is gone: this rank trains on without it",
            num(x.launcher_pid)
        ),
        Event::StragglerExclusion(x) => format!(
            "STRAGGLER node {} left out after the checkpoint at step {}: {}",
            text(&x.straggler_node),
            num(x.checkpoint_step),
            text(&x.evidence)
        ),
        Event::CheckpointIntervalAdvised(x) => {
            let f = |k: &str| x.advice.get(k).and_then(Value::as_f64);
            match f("interval_s") {
                Some(i) => format!(
                    "periodic checkpoints every {:.0}s (advised: cost {:.1}s, MTTF {:.0}s)",
                    i,
                    f("checkpoint_cost_s").unwrap_or(0.0),
                    f("mttf_s").unwrap_or(0.0)
                ),
                None => format!(
                    "no periodic checkpoint advised yet: {}",
                    x.advice
                        .get("reason")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                ),
            }
        }
        Event::CoordinatorAttempt(_) | Event::NodeHistoryChecked(_) => return None,
        other => other.kind().to_string(),
    })
}

/// Render the timeline: one line per event that matters, grouped by attempt,
/// with time relative to the job's start and absolute UTC time.
pub fn render(
    job: &str,
    records: &[Record],
    slurm: Option<&crate::analysis::accounting::SlurmTimes>,
) -> String {
    render_with_notes(job, records, slurm, &[])
}

/// The same with notes (other runs of the job id, skipped journal lines)
/// printed under the heading.
pub fn render_with_notes(
    job: &str,
    records: &[Record],
    slurm: Option<&crate::analysis::accounting::SlurmTimes>,
    notes: &[String],
) -> String {
    let mut s = String::new();
    let Some(t0) = records.iter().map(|r| r.ts).min() else {
        return format!("job {job}: no records\n");
    };
    // Slurm's own view of each allocation's end and the next one's start
    // (the queue wait), shown before the attempt that followed.
    let mut queued: BTreeMap<u32, Vec<(DateTime<Utc>, String)>> = BTreeMap::new();
    if let Some(st) = slurm {
        let alloc_of = |a: u32| {
            records
                .iter()
                .filter(|r| r.attempt == a)
                .find_map(|r| match r.event() {
                    Some(Event::JobStart(j)) => j.allocation,
                    _ => None,
                })
                .unwrap_or(a)
        };
        let attempts: BTreeSet<u32> = records.iter().map(|r| r.attempt).collect();
        let mut seen = BTreeSet::new();
        for a in attempts {
            let k = alloc_of(a);
            if k == 0 || !seen.insert(k) {
                continue;
            }
            if let (Some(prev), Some(next)) = (st.allocations.get(&(k - 1)), st.allocations.get(&k))
            {
                let v = queued.entry(a).or_default();
                if let Some(e) = prev.end {
                    v.push((e, format!("allocation {} ended ({})", k - 1, st.source)));
                    v.push((
                        next.start,
                        format!(
                            "allocation {k} started after {:.1}s in the queue ({})",
                            secs(e, next.start),
                            st.source
                        ),
                    ));
                } else {
                    v.push((
                        next.start,
                        format!("allocation {k} started ({})", st.source),
                    ));
                }
            }
        }
    }
    let _ = writeln!(
        s,
        "job {job}, times relative to {}",
        t0.format("%Y-%m-%d %H:%M:%S%.3fZ")
    );
    for n in notes {
        let _ = writeln!(s, "{n}");
    }
    let mut by_attempt: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_attempt.entry(r.attempt).or_default().push(r);
    }
    for (attempt, recs) in by_attempt {
        let _ = writeln!(s, "attempt {attempt}:");
        for (at, text) in queued.get(&attempt).into_iter().flatten() {
            let _ = writeln!(
                s,
                "  {:>+10.3}s  {}  {:<10} {}",
                (*at - t0).num_milliseconds() as f64 / 1e3,
                at.format("%H:%M:%S%.3fZ"),
                "slurm",
                text
            );
        }
        // The last progress of each rank, shown once, just before what followed it.
        let mut last_progress: BTreeMap<Option<u32>, &Record> = BTreeMap::new();
        for r in &recs {
            if r.kind == "progress" {
                last_progress.insert(r.rank, r);
            }
        }
        for r in &recs {
            let event = r.event();
            let text = match &event {
                Some(Event::Progress(p))
                    if p.first.is_none()
                        && last_progress
                            .get(&r.rank)
                            .is_some_and(|l| std::ptr::eq(*l, *r)) =>
                {
                    Some(format!("last recorded step {}", num(p.step)))
                }
                _ => describe(r, event.as_ref()),
            };
            let Some(text) = text else { continue };
            let who = format!(
                "{}{}",
                r.rank.map_or(String::new(), |v| format!("r{v}")),
                r.node.as_ref().map_or(String::new(), |n| format!("@{n}"))
            );
            let _ = writeln!(
                s,
                "  {:>+10.3}s  {}  {:<10} {}",
                secs(t0, r.ts),
                r.ts.format("%H:%M:%S%.3fZ"),
                who,
                text
            );
        }
    }
    s
}
