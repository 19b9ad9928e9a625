//! Progress events from the queue, carried into the stall policy, the
//! sampled progress log, the journal and the coordinator's report.

use super::progress_log::{Clock, ProgressLog, ProgressSample, LOADS_WRITTEN};
use crate::coordinator::client::Outbox;
use crate::coordinator::protocol::RankState;
use crate::event as ev;
use crate::journal::Writer;
use crate::policy::stall::{Phase, PhaseClass, StallPolicy};
use crate::progress::tracker::{Namer, Observation, StepRole};
use crate::progress::{self, Kind, ProgressEvent};
use std::collections::BTreeMap;
use std::time::Instant;

/// Faults of the progress sources: malformed messages counted by kind, and
/// failed sources already reported (each is said once).
#[derive(Default)]
pub(crate) struct SourceFaults {
    pub malformed: BTreeMap<&'static str, u64>,
    pub reported: Vec<String>,
}

/// Feed every queued event to the policy and the journal, oldest first.
pub(crate) struct Sinks<'a> {
    pub policy: &'a mut StallPolicy,
    pub plog: &'a mut ProgressLog,
    pub journal: &'a mut Writer,
    pub clock: &'a Clock,
    pub faults: &'a mut SourceFaults,
    /// The report for the coordinator, when linked.
    pub outbox: Option<&'a Outbox>,
    /// The numerical watch (none at the batch level), and what it found.
    pub numerical: Option<&'a mut crate::policy::numerical::NumericalWatch>,
    pub findings: &'a mut Vec<crate::policy::numerical::Finding>,
}

pub(crate) fn drain_events(tx: &progress::Sender, sinks: &mut Sinks<'_>) {
    for ev in tx.drain() {
        handle_event(ev, sinks);
    }
}

/// The kind of source, for the stall policy's phase ends.
fn origin(source: progress::Source) -> &'static str {
    Namer::of(source).map_or(source.name(), Namer::name)
}

fn handle_event(ev: ProgressEvent, k: &mut Sinks<'_>) {
    let (at, source) = (ev.at, ev.source);
    match ev.kind {
        Kind::Step {
            step,
            metrics,
            with_phase,
        } => on_step(k, at, source, step, metrics, with_phase, None),
        Kind::Activity { count } => on_step(
            k,
            at,
            source,
            Some(count),
            Vec::new(),
            None,
            Some(StepRole::Annotation),
        ),
        Kind::Phase { name, step } => on_phase(k, at, source, name, step),
        Kind::CheckpointDone { step } => on_checkpoint_done(k, at, source, step),
        Kind::SyncSave { step } => k.plog.sync_save = Some(step),
        Kind::CheckpointFiles(f) => k.plog.checkpoint_files = Some(f),
        Kind::Figures(f) => {
            if let Some(w) = k.numerical.as_deref_mut() {
                k.findings.extend(w.observe(None, &f));
            }
            k.plog.note_nonfinite(&f);
            crate::progress::figures::merge_named(&mut k.plog.figures, f)
        }
        Kind::FirstOutput { with_step } => {
            if !k.plog.output_seen {
                k.plog.output_seen = true;
                k.journal.write_at(
                    k.clock.wall(at),
                    ev::FirstOutput {
                        source: source.into(),
                        with_step: Some(with_step),
                    },
                    false,
                );
            }
        }
        Kind::CheckpointLoaded { line, step } => {
            // Before the attempt's first progress only: a load later on (an
            // evaluation's model) is no restore.
            if k.plog.first_at.is_none() && k.plog.loads_written < LOADS_WRITTEN {
                k.plog.loads_written += 1;
                k.journal.write_at(
                    k.clock.wall(at),
                    ev::CheckpointLoaded {
                        source: source.into(),
                        done: Some(progress::output::says_done(&line)),
                        line,
                        step,
                    },
                    false,
                );
            }
        }
        Kind::Malformed { fault, sample } => {
            let (journal, faults) = (&mut *k.journal, &mut *k.faults);
            let n = faults.malformed.entry(fault).or_insert(0);
            *n += 1;
            if *n == 1 {
                tracing::warn!(
                    "ignoring malformed progress message ({fault}): {sample:?}; further ones of this kind are only counted"
                );
                journal.write(
                    ev::MalformedMessage {
                        fault: fault.to_string(),
                        sample,
                    },
                    false,
                );
            }
        }
        Kind::SourceFailed(msg) => {
            let (journal, faults) = (&mut *k.journal, &mut *k.faults);
            if !faults.reported.contains(&msg) {
                tracing::warn!("{msg}; supervision continues without it");
                journal.write(ev::MonitorError { error: msg.clone() }, false);
                faults.reported.push(msg);
            }
        }
    }
}

fn on_step(
    k: &mut Sinks<'_>,
    at: Instant,
    source: progress::Source,
    step: Option<u64>,
    metrics: Vec<(String, f64)>,
    with_phase: Option<String>,
    role: Option<StepRole>,
) {
    if role.is_none() {
        if let Some(w) = k.numerical.as_deref_mut() {
            k.findings.extend(w.observe(step, &metrics));
        }
    }
    // A synchronous save (HF's) returned once a later step is printed.
    if role.is_none() && with_phase.is_none() {
        if let (Some(saved), Some(s)) = (k.plog.sync_save, step) {
            if s > saved {
                k.plog.sync_save = None;
                on_checkpoint_done(k, at, source, Some(saved));
            }
        }
    }
    let (policy, plog, journal, clock) = (&mut *k.policy, &mut *k.plog, &mut *k.journal, k.clock);
    // A step sent with a long phase names what the phase is about
    // (`phase=checkpoint step=10`), not the trainer's step; activity
    // (another bar, a log dict's epoch) names nothing.
    let role =
        role.unwrap_or_else(
            || match with_phase.as_deref().map(|p| policy.config().classify(p)) {
                Some(PhaseClass::Long(_)) => StepRole::Annotation,
                _ => StepRole::Report,
            },
        );
    let o = plog.tracker.on_step(source, step, role);
    if let Some((from, to)) = o.namer_changed {
        note_namer(journal, clock, at, from, to);
    }
    let sent_compute = metrics.iter().any(|(k, _)| k == "compute_s");
    if sent_compute {
        plog.tracker.on_compute_metric();
    }
    if !o.alive && !sent_compute {
        plog.note_nonfinite(&metrics);
        return;
    }
    let prev = plog.last_named_at;
    if o.alive {
        // The trainer's own account of a step's time (tqdm's rate,
        // Megatron's time per iteration), when this line gave one.
        let step_time = metrics
            .iter()
            .find(|(k, _)| k == "step_time_s")
            .map(|(_, v)| *v)
            .filter(|_| role == StepRole::Report);
        policy.on_progress_timed(at, o.step, o.named_advanced, origin(source), step_time);
    }
    if let Some(out) = k.outbox {
        to_outbox(out, policy, &o, prev, at, step, &metrics);
    }
    if o.named_advanced {
        plog.last_named_at = Some(at);
    }
    if o.alive {
        let mut metrics = metrics;
        crate::progress::figures::merge_named(&mut metrics, std::mem::take(&mut plog.figures));
        plog.observe(
            journal,
            clock,
            ProgressSample {
                at,
                step: o.step,
                source,
                metrics,
            },
        );
    }
}

/// The namer changed: say which source names the step now, and why.
fn note_namer(journal: &mut Writer, clock: &Clock, at: Instant, from: Option<Namer>, to: Namer) {
    let reason = match to {
        Namer::Socket => "the trainer reports its steps on RESILIO_SOCKET: they name the step; numbers in its output still count as progress",
        Namer::Output => "steps read from the trainer's output name the step",
        Namer::File => "the progress file names the step until the output or the socket does",
    };
    journal.write_at(
        clock.wall(at),
        ev::ProgressSource {
            steps_from: to.into(),
            before: from.map(Into::into),
            reason: reason.into(),
        },
        false,
    );
}

/// The step into the report for the coordinator: the state, the step, the
/// intervals and compute time, the trainer's figures.
fn to_outbox(
    out: &Outbox,
    policy: &StallPolicy,
    o: &Observation,
    prev: Option<Instant>,
    at: Instant,
    step: Option<u64>,
    metrics: &[(String, f64)],
) {
    // compute_s may come on the socket after the same step was
    // read from the output: counted once per step either way.
    let compute = metrics
        .iter()
        .find(|(k, _)| k == "compute_s")
        .map(|(_, v)| *v)
        .filter(|c| c.is_finite() && *c >= 0.0)
        .filter(|_| out.take_compute_step(step));
    let last = policy.last_step();
    let stepped = o.named_advanced;
    let long = matches!(policy.phase(), Phase::Named(..));
    out.update(|r| {
        if o.alive {
            if r.state == RankState::Starting {
                r.state = RankState::Running;
            }
            r.silent = false;
            r.step = last;
            r.long_phase = long;
        }
        if stepped {
            if let Some(p) = prev {
                r.intervals.0 += 1;
                r.intervals.1 += at.saturating_duration_since(p).as_secs_f64();
            }
        }
        if let Some(c) = compute {
            r.compute.0 += 1;
            r.compute.1 += c;
        }
        for (name, v) in metrics {
            let known = crate::progress::figures::NAMES.contains(&name.as_str())
                || r.figures.contains_key(name)
                || r.figures.len() < crate::coordinator::protocol::MAX_FIGURES;
            if v.is_finite() && known && crate::progress::figures::is_name(name) {
                r.figures.insert(name.clone(), *v);
            }
        }
    });
    if o.alive {
        *out.last_step_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }
}

fn on_phase(
    k: &mut Sinks<'_>,
    at: Instant,
    source: progress::Source,
    name: String,
    step: Option<u64>,
) {
    let (policy, plog, journal, clock) = (&mut *k.policy, &mut *k.plog, &mut *k.journal, k.clock);
    let before = policy.phase().clone();
    let class = policy.on_phase(at, &name, step, origin(source));
    match class {
        PhaseClass::InStep { known } => {
            let listed = plog.unknown_phases.len() >= super::progress_log::UNKNOWN_PHASES_LISTED;
            if !known && listed && !plog.unknown_phases.contains(&name) {
                plog.unknown_phases_unlisted += 1;
                if plog.unknown_phases_unlisted == 1 {
                    tracing::warn!(
                        "more than {} phase names are not known phases: the others are judged by the step limit too, and no longer listed",
                        super::progress_log::UNKNOWN_PHASES_LISTED
                    );
                    journal.write_at(
                        clock.wall(at),
                        ev::UnknownPhase {
                            phase: None,
                            judged_as: "inside a step".into(),
                            config: None,
                        },
                        false,
                    );
                }
            } else if !known && !plog.unknown_phases.contains(&name) {
                tracing::warn!(
                    "phase '{name}' is not a known phase: judged by the step limit; declare it in [stall] in_step_phases, or give it a limit of its own in [stall.phase_timeouts]"
                );
                journal.write_at(
                    clock.wall(at),
                    ev::UnknownPhase {
                        phase: Some(name.clone()),
                        judged_as: "inside a step".into(),
                        config: Some(vec![
                            "stall.in_step_phases".into(),
                            "stall.phase_timeouts".into(),
                        ]),
                    },
                    false,
                );
                plog.unknown_phases.insert(name.clone());
            }
            if let Some(c) = plog.tracker.on_in_step_phase(at, &name) {
                if let Some(out) = k.outbox {
                    out.update(|r| {
                        r.compute.0 += 1;
                        r.compute.1 += c;
                    });
                }
            }
        }
        PhaseClass::Train | PhaseClass::Long(_) => plog.tracker.on_other_phase(),
    }
    if let Some(out) = k.outbox {
        let shown = match class {
            PhaseClass::InStep { .. } => name.clone(),
            _ => policy.phase().name().to_string(),
        };
        let long = matches!(policy.phase(), Phase::Named(..));
        out.update(|r| {
            r.phase = shown;
            r.long_phase = long;
        });
    }
    if policy.phase() != &before {
        if policy.phase().name() == "checkpoint" {
            plog.checkpoint_began = Some((at, step.max(policy.last_step())));
        }
        journal.write_at(
            clock.wall(at),
            ev::Phase {
                phase: policy.phase().name().to_string(),
                source: source.into(),
                step: step.max(policy.last_step()),
            },
            false,
        );
    }
}

fn on_checkpoint_done(k: &mut Sinks<'_>, at: Instant, source: progress::Source, step: Option<u64>) {
    let (policy, plog, journal, clock) = (&mut *k.policy, &mut *k.plog, &mut *k.journal, k.clock);
    // Its duration, and whether training went on meanwhile (an
    // asynchronous save) or waited for it.
    let began = plog.checkpoint_began.take();
    let files = plog
        .checkpoint_files
        .take()
        .filter(|f| f.step == step && source == progress::Source::CheckpointDir);
    journal.write_at(
        clock.wall(at),
        ev::CheckpointDone {
            step,
            source: source.into(),
            duration_s: began.map(|(t, _)| at.saturating_duration_since(t).as_secs_f64()),
            blocked_training: began.map(|(_, at_step)| policy.last_step() <= at_step),
            complete: files.as_ref().map(|f| f.complete()),
            path: files.as_ref().map(|f| f.path.clone()),
            size_bytes: files.as_ref().map(|f| f.bytes),
            files: files.as_ref().map(|f| f.files),
            temp_names: files.as_ref().and_then(|f| names(&f.temp_names)),
            changing: files.as_ref().and_then(|f| names(&f.changing)),
            same_as: files.as_ref().and_then(|f| f.same_as.clone()),
        },
        true,
    );
    if policy.phase().name() == "checkpoint" {
        policy.on_phase(at, "train", None, origin(source));
    }
    if let (Some(o), Some(s)) = (k.outbox, step) {
        o.update(|r| {
            r.phase = policy.phase().name().to_string();
            r.long_phase = matches!(policy.phase(), Phase::Named(..));
            r.checkpoints.push(s);
            if r.checkpoints.len() > 16 {
                r.checkpoints.remove(0);
            }
        });
        o.urgent.notify_one();
    }
}

/// A list of names for a record: absent when empty.
fn names(v: &[String]) -> Option<Vec<String>> {
    (!v.is_empty()).then(|| v.to_vec())
}
