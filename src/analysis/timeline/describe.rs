//! Each record's line in the timeline: one small function per kind of
//! event, and the match that picks it.

use crate::event::{self as e, Event};
use crate::journal::Record;
use crate::names::or_unknown;

/// A record's line, from its event read once (`None`: a kind this build
/// does not know, or cannot read, which shows by name).
pub(super) fn describe(r: &Record, event: Option<&Event>) -> Option<String> {
    match event {
        Some(e) => describe_event(e),
        None => match r.kind.as_str() {
            "coordinator_reachable_again" => None,
            other => Some(other.to_string()),
        },
    }
}

/// A number, or `-` for one a record does not give.
pub(super) fn num(v: impl NumberText) -> String {
    v.number_text().unwrap_or_else(|| "-".to_string())
}

/// A field's number as text: a required field's always, an optional one's
/// when the record gives it.
pub(super) trait NumberText {
    fn number_text(&self) -> Option<String>;
}

macro_rules! number_text {
    ($($t:ty),*) => {$(
        impl NumberText for $t {
            fn number_text(&self) -> Option<String> {
                Some(self.to_string())
            }
        }
        impl NumberText for Option<$t> {
            fn number_text(&self) -> Option<String> {
                self.as_ref().map(ToString::to_string)
            }
        }
    )*};
}
number_text!(u32, u64, i32, usize);

/// A field's text, or `?` for one a record does not give.
fn text(v: &impl Said) -> &str {
    v.said().unwrap_or("?")
}

trait Said {
    fn said(&self) -> Option<&str>;
}

impl Said for String {
    fn said(&self) -> Option<&str> {
        Some(self)
    }
}

impl Said for Option<String> {
    fn said(&self) -> Option<&str> {
        self.as_deref()
    }
}

/// The line of an event this build knows (`None`: not shown).
fn describe_event(event: &Event) -> Option<String> {
    Some(match event {
        Event::JobStart(x) => job_start(x),
        Event::RankStart(x) => rank_start(x),
        Event::Progress(x) => return first_step(x),
        Event::Phase(x) => phase(x),
        Event::CheckpointDone(x) => checkpoint_done(x),
        Event::Stall(x) => stall(x),
        Event::Slowdown(x) => slowdown(x),
        Event::Numerical(x) => numerical(x),
        Event::Diagnostics(x) => diagnostics(x),
        Event::Stop(x) => stop(x),
        Event::Signal(x) => signal(x),
        Event::RankExit(x) => rank_exit(x),
        Event::StepExit(x) => step_exit(x),
        Event::Failure(x) => failure(x),
        Event::JobEnd(x) => job_end(x),
        Event::MonitorError(x) => monitor_error(x),
        Event::MalformedMessage(x) => malformed_message(x),
        Event::JournalGap(x) => journal_gap(x),
        Event::Hang(x) => hang(x),
        Event::Teardown(x) => teardown(x),
        Event::BusySilent(x) => busy_silent(x),
        Event::ProgressSource(x) => progress_source(x),
        Event::StallReported(x) => stall_reported(x),
        Event::Probe(x) => probe(x),
        Event::StopDeferred(_) => "stop deferred until the coordinator's judgment".into(),
        Event::Launch(x) => launch(x),
        Event::AttemptEnd(_) => "every rank of the attempt has exited".into(),
        Event::Judgment(x) => judgment(x),
        Event::Decision(x) => decision(x),
        Event::Restart(x) => restart(x),
        Event::Relaunched(x) => relaunched(x),
        Event::Straggler(x) => straggler(x),
        Event::CheckpointRequested(x) => checkpoint_requested(x),
        Event::CheckpointComplete(x) => checkpoint_complete(x),
        Event::CheckpointIncomplete(x) => checkpoint_incomplete(x),
        Event::CoordinatorUnreachable(x) => coordinator_unreachable(x),
        Event::CoordinatorReachable(x) => coordinator_reachable(x),
        Event::RelayStarted(x) => format!("relaying this node's reports on {}", text(&x.url)),
        Event::RelayBypassed(x) => format!(
            "node relay {} did not answer ({}): reporting straight to the coordinator",
            text(&x.url),
            text(&x.error)
        ),
        Event::CoordinatorStart(x) => coordinator_start(x),
        Event::NodeExcluded(x) => node_excluded(x),
        Event::Requeue(x) => requeue(x),
        Event::ExclusionSet(x) => exclusion_set(x),
        Event::StopJudged(_) => "stopping after the coordinator's judgment".into(),
        Event::LauncherLost(x) => launcher_lost(x),
        Event::StragglerExclusion(x) => straggler_exclusion(x),
        Event::CheckpointIntervalAdvised(x) => checkpoint_interval_advised(x),
        Event::FirstOutput(x) => format!("first output of the trainer ({})", x.source.name()),
        Event::CheckpointLoaded(x) => match (x.step, x.done) {
            (_, Some(false)) => format!("checkpoint load begun: {}", text(&x.line)),
            (Some(step), _) => format!("checkpoint of step {step} loaded: {}", text(&x.line)),
            (None, _) => format!("checkpoint loaded: {}", text(&x.line)),
        },
        Event::CoordinatorAttempt(_) | Event::NodeHistoryChecked(_) => return None,
        other => other.kind().to_string(),
    })
}

fn job_start(x: &e::JobStart) -> String {
    match &x.relaunch_in_allocation {
        Some(v) => {
            let out = &v.exclude;
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
    }
}

fn rank_start(x: &e::RankStart) -> String {
    format!(
        "launched pid {} ({} stall timeout): {}",
        x.pid,
        x.stall_mode,
        x.argv.join(" ")
    )
}

/// The first step of a rank (later steps are not lines of their own).
fn first_step(x: &e::Progress) -> Option<String> {
    let e::Progress {
        first: Some(_),
        step,
        source,
        ..
    } = x
    else {
        return None;
    };
    Some(format!("first step {} (from {})", num(*step), source))
}

fn phase(x: &e::Phase) -> String {
    format!("phase {} at step {}", text(&x.phase), num(x.step))
}

fn checkpoint_done(x: &e::CheckpointDone) -> String {
    match &x.same_as {
        Some(earlier) => format!(
            "checkpoint done at step {}, NOT NEW: its files are byte for byte those of {earlier}",
            num(x.step)
        ),
        None => format!("checkpoint done at step {}", num(x.step)),
    }
}

fn stall(x: &e::Stall) -> String {
    format!(
        "STALL ({}): no progress for {:.1}s, limit {:.1}s, last step {}",
        x.stall_kind.name(),
        x.idle_s,
        x.timeout_s,
        num(x.last_step)
    )
}

fn slowdown(x: &e::Slowdown) -> String {
    if x.state == crate::policy::slowdown::SlowdownState::Started {
        format!("SLOWDOWN: {} ({})", text(&x.detail), or_unknown(&x.action))
    } else {
        format!(
            "slowdown over after {:.0}s: {:.3}s per step, baseline {:.3}s",
            x.lasted_s.unwrap_or(0.0),
            x.step_s,
            x.baseline_s
        )
    }
}

fn numerical(x: &e::Numerical) -> String {
    format!(
        "NUMERICAL {}: {} ({})",
        x.finding,
        text(&x.detail),
        match x.action {
            Some(crate::policy::numerical::Act::Stop) => "stopping the rank, not restarted",
            Some(crate::policy::numerical::Act::Rollback) =>
                "stopping the rank, to run again from the checkpoint before it",
            _ => "recorded",
        }
    )
}

fn diagnostics(x: &e::Diagnostics) -> String {
    format!(
        "diagnostics: {} output lines, {} py-spy dump(s){}{}",
        x.tail.len(),
        x.py_spy.len(),
        x.dump_signal
            .as_ref()
            .map_or(String::new(), |s| format!(", sent {s}")),
        x.file
            .as_ref()
            .map_or(String::new(), |f| format!(" -> {f}"))
    )
}

fn stop(x: &e::Stop) -> String {
    format!(
        "stopping the rank: {}{}",
        text(&x.signal),
        x.reason
            .as_ref()
            .map_or(String::new(), |r| format!(" ({r})"))
    )
}

fn signal(x: &e::Signal) -> String {
    format!(
        "received {}{}",
        text(&x.signal),
        if x.forwarded {
            ", forwarded to the trainer"
        } else {
            ""
        }
    )
}

fn rank_exit(x: &e::RankExit) -> String {
    format!(
        "rank exited: {} ({}), exit code {}, last step {}",
        text(&x.cause),
        text(&x.status),
        x.exit_code,
        num(x.last_step)
    )
}

fn step_exit(x: &e::StepExit) -> String {
    format!(
        "the job level's command ended: {} ({}), exit code {}",
        text(&x.cause),
        text(&x.status),
        x.exit_code
    )
}

fn failure(x: &e::Failure) -> String {
    format!(
        "FAILURE {}: {}",
        x.failure_kind.map_or("?", |k| k.name()),
        x.detail.as_deref().or(x.cause.as_deref()).unwrap_or("?")
    )
}

fn job_end(x: &e::JobEnd) -> String {
    format!("job ended, exit code {}", x.exit_code)
}

fn monitor_error(x: &e::MonitorError) -> String {
    format!("monitoring degraded: {}", text(&x.error))
}

fn malformed_message(x: &e::MalformedMessage) -> String {
    format!("malformed progress message ({})", text(&x.fault))
}

fn journal_gap(x: &e::JournalGap) -> String {
    match (x.from, x.to) {
            (Some(from), Some(to)) => format!(
                "journal gap: {} record(s) lost since {} ({:.1}s: the journal could not be written, a full disk or another write error; unexplained time)",
                x.lost_records,
                from.format("%H:%M:%S%.3fZ"),
                crate::analysis::report::secs(from, to)
            ),
            _ => format!("journal gap: {} record(s) lost", x.lost_records),
        }
}

fn hang(x: &e::Hang) -> String {
    let v = &x.verdict;
    let blamed = v
        .blamed_ranks
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    // A verdict that nobody is hung (a peer busy, the rest finishing) is
    // a check that let the run carry on, not a hang.
    let what = if v.rule.carries_on() {
        "hang check, carried on"
    } else {
        "HANG judged job-wide"
    };
    format!(
        "{what} ({}): {}{}",
        v.rule,
        text(&v.reason),
        if blamed.is_empty() {
            String::new()
        } else {
            format!(" -> blamed rank(s) {blamed}")
        }
    )
}

/// The order (with its reason), then the launcher's stop of the ranks
/// left: the reason said once.
fn teardown(x: &e::Teardown) -> String {
    match x.ranks_left {
        Some(n) if x.first_rank.is_none() && x.about_node.is_none() => {
            format!("teardown: stopping the {n} rank(s) left")
        }
        _ => format!("teardown: {}", text(&x.reason)),
    }
}

fn busy_silent(x: &e::BusySilent) -> String {
    format!(
            "busy and silent at its step limit ({:.1}s of CPU, {:.1} MB of I/O in {:.1}s): judged by the evaluation limit ({:.0}s) from now",
            x.cpu_s,
            x.io_bytes.unwrap_or(0) as f64 / 1e6,
            x.window_s,
            x.limit_s
        )
}

fn progress_source(x: &e::ProgressSource) -> String {
    format!(
        "steps now named by the {}{}",
        x.steps_from,
        x.before
            .as_ref()
            .map_or(String::new(), |b| format!(" (before: the {b})"))
    )
}

fn stall_reported(x: &e::StallReported) -> String {
    format!("coordinator: rank {} reported a stall", x.about_rank)
}

fn probe(x: &e::Probe) -> String {
    format!(
        "probe ({}): {}",
        text(&x.reason),
        match x.probe.waiting_on_peer {
            Some(true) => "blocked on a peer",
            Some(false) => "not waiting on a peer",
            None => "unknown",
        }
    )
}

fn launch(x: &e::Launch) -> String {
    // One rank has no rendezvous (no torchrun variables): no port to show.
    match x.master_port {
        Some(port) => format!("launched {} rank(s), MASTER_PORT {port}", x.ranks),
        None => format!("launched {} rank(s)", x.ranks),
    }
}

fn judgment(x: &e::Judgment) -> String {
    if x.primary_rank.is_none() && x.primary_node.is_none() {
        format!(
            "judgment: {}, nobody blamed: {}",
            x.class.name(),
            text(&x.evidence)
        )
    } else {
        format!(
            "judgment: {} on rank {} ({}): {}",
            x.class.name(),
            num(x.primary_rank),
            text(&x.primary_node),
            text(&x.evidence)
        )
    }
}

fn decision(x: &e::Decision) -> String {
    match &x.decision {
        // Why the job stops: said nowhere else in the timeline.
        Some(crate::policy::restart::Action::Stop { reason, .. }) if !reason.is_empty() => {
            format!("decision: stop: {reason}")
        }
        d => format!(
            "decision: {}",
            d.as_ref().map_or("?", |d| d.name()).replace('_', " ")
        ),
    }
}

fn restart(x: &e::Restart) -> String {
    format!(
        "RESTART {} as attempt {}: {}",
        if x.in_allocation == Some(true) {
            "inside the allocation"
        } else {
            "in place"
        },
        x.next_attempt,
        text(&x.reason)
    )
}

fn relaunched(x: &e::Relaunched) -> String {
    format!(
        "first step {:.2}s after the failure",
        x.failure_to_first_step_s
    )
}

fn straggler(x: &e::Straggler) -> String {
    format!(
        "STRAGGLER {} {} {}: {:.3}s per step vs median {:.3}s ({})",
        x.scope,
        text(&x.who),
        if x.flagged { "flagged" } else { "recovered" },
        x.value_s,
        x.median_s,
        x.basis
    )
}

fn checkpoint_requested(x: &e::CheckpointRequested) -> String {
    format!(
        "checkpoint requested{} ({})",
        x.step.map_or(String::new(), |s| format!(" at step {s}")),
        text(&x.reason)
    )
}

fn checkpoint_complete(x: &e::CheckpointSettled) -> String {
    format!(
        "coordinated checkpoint #{} at step {}: every rank confirmed",
        num(x.id),
        num(x.step)
    )
}

fn checkpoint_incomplete(x: &e::CheckpointSettled) -> String {
    format!(
        "coordinated checkpoint #{} at step {}: ranks {} never confirmed",
        num(x.id),
        num(x.step),
        serde_json::to_string(&x.missing_ranks).unwrap_or_else(|_| "?".into())
    )
}

fn coordinator_unreachable(x: &e::CoordinatorUnreachable) -> String {
    format!("coordinator unreachable: {}", text(&x.error))
}

fn coordinator_reachable(x: &e::CoordinatorReachable) -> String {
    format!("coordinator reachable again after {:.1}s", x.gap_s)
}

fn coordinator_start(x: &e::CoordinatorStart) -> String {
    format!("coordinator listening on {}", text(&x.url))
}

fn node_excluded(x: &e::NodeExcluded) -> String {
    format!(
        "EXCLUDED {}{} ({}): {}",
        text(&x.excluded_node),
        match x.scope {
            Some(e::ExcludedFrom::Step) => " from the step",
            _ => " from the job",
        },
        text(&x.reason),
        x.evidence
    )
}

fn requeue(x: &e::Requeue) -> String {
    if x.by == Some(e::RequeueBy::Slurm) {
        format!("requeued by Slurm itself ({})", text(&x.state))
    } else {
        format!(
            "REQUEUE{}: {}",
            x.exclude
                .as_ref()
                .filter(|a| !a.is_empty())
                .map(|a| format!(" excluding {}", a.join(",")))
                .unwrap_or_default(),
            text(&x.reason)
        )
    }
}

fn exclusion_set(x: &e::ExclusionSet) -> String {
    format!("Slurm now keeps the job off {}", text(&x.exc_node_list))
}

fn launcher_lost(x: &e::LauncherLost) -> String {
    format!(
        "the launcher (pid {}) is gone: this rank trains on without it",
        x.launcher_pid
    )
}

fn straggler_exclusion(x: &e::StragglerExclusion) -> String {
    format!(
        "STRAGGLER node {} left out after the checkpoint at step {}: {}",
        text(&x.straggler_node),
        num(x.checkpoint_step),
        text(&x.evidence)
    )
}

fn checkpoint_interval_advised(x: &e::CheckpointIntervalAdvised) -> String {
    match x.interval_s {
        Some(i) => format!(
            "periodic checkpoints every {:.0}s (advised: cost {:.1}s, MTTF {:.0}s)",
            i,
            x.checkpoint_cost_s.unwrap_or(0.0),
            x.mttf_s.unwrap_or(0.0)
        ),
        None => format!("no periodic checkpoint advised yet: {}", text(&x.reason)),
    }
}
