//! What the journal says about each attempt, for the accounting: its
//! start and end, progress samples (time, step), checkpoints, and how it
//! failed. Exit records repeat what progress records say, so one lost line
//! does not lose the account.

use super::ns;
use crate::event::{Class, Event, RankExit};
use crate::journal::Record;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// What one attempt's records say, on the job's clock.
#[derive(Debug)]
pub(super) struct Marks {
    pub(super) attempt: u32,
    pub(super) allocation: Option<u32>,
    pub(super) start: DateTime<Utc>,
    pub(super) end: DateTime<Utc>,
    /// (time, step) of every progress sample, in time order.
    pub(super) samples: Vec<(DateTime<Utc>, u64)>,
    /// Checkpoints confirmed: (step, save began, save done, blocked training).
    pub(super) checkpoints: Vec<(u64, DateTime<Utc>, DateTime<Utc>, bool)>,
    pub(super) failed: bool,
    /// A stall was declared (a hang): when.
    pub(super) stall_declared: Option<DateTime<Utc>>,
    /// The first real failure (a rank's crash), when known.
    pub(super) crashed_at: Option<DateTime<Utc>>,
    /// resilio's first action on the failure (a teardown order).
    pub(super) acted_at: Option<DateTime<Utc>>,
    /// The attempt's end was recorded (a rank's or the job's end).
    pub(super) end_recorded: bool,
    /// The job went back to Slurm's queue after this attempt.
    pub(super) requeued: bool,
    /// The step was relaunched in place (local mode, or inside the allocation).
    pub(super) relaunched: bool,
}

/// A duration in seconds from a record, when it is one.
fn seconds(s: Option<f64>) -> Option<chrono::Duration> {
    s.filter(|s| s.is_finite() && (0.0..1e9).contains(s))
        .map(|s| chrono::Duration::nanoseconds((s * 1e9) as i64))
}

/// What a rank's exit record says about its progress, on the job's clock:
/// its launch, its first step's time, its last step (time, number), and
/// the mean time between the steps it counted. It repeats what the
/// progress records say, so the accounting survives losing one of them
/// (a garbled line in the journal).
struct ExitSummary {
    launch: Option<DateTime<Utc>>,
    first_at: Option<DateTime<Utc>>,
    last: Option<(DateTime<Utc>, u64)>,
    per_step_ns: Option<i64>,
}

fn exit_summary(r: &Record, x: &RankExit) -> ExitSummary {
    let launch = seconds(x.runtime_s).map(|d| r.ts - d);
    let first = seconds(x.first_step_s);
    let last = seconds(x.last_progress_s);
    let per_step_ns = match (first, last, x.steps_seen) {
        (Some(f), Some(l), Some(n)) if n >= 2 && l > f => {
            (l - f).num_nanoseconds().map(|d| d / (n as i64 - 1))
        }
        _ => None,
    };
    ExitSummary {
        launch,
        first_at: launch.zip(first).map(|(a, f)| a + f),
        last: launch
            .zip(last)
            .zip(x.last_step)
            .map(|((a, l), s)| (a + l, s)),
        per_step_ns,
    }
}

/// Mean time per step over (time, step) samples in time order.
fn step_time_of(samples: &[(DateTime<Utc>, u64)]) -> Option<i64> {
    let (t0, s0) = *samples.first()?;
    let (t1, s1) = samples.iter().copied().max_by_key(|(t, s)| (*s, *t))?;
    (s1 > s0).then(|| ns(t0, t1) / (s1 - s0) as i64)
}

/// Each exit's code, class and class reason, as
/// [`crate::policy::failure::attempt_finished`] takes them.
pub(crate) fn exit_facts<'a>(
    exits: &[(&Record, &'a RankExit)],
) -> Vec<(Option<i32>, Option<Class>, Option<&'a str>)> {
    exits
        .iter()
        .map(|(_, x)| (Some(x.exit_code), x.class, x.class_reason.as_deref()))
        .collect()
}

fn marks(attempt: u32, recs: &[&Record]) -> Marks {
    let events: Vec<(&Record, &Event)> =
        recs.iter().filter_map(|r| Some((*r, r.event()?))).collect();
    let exits: Vec<(&Record, &RankExit)> = events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::RankExit(x) => Some((*r, x)),
            _ => None,
        })
        .collect();
    let summaries: Vec<ExitSummary> = exits.iter().map(|(r, x)| exit_summary(r, x)).collect();
    let starts = recs
        .iter()
        .filter(|r| r.kind == "rank_start" || r.kind == "job_start" || r.kind == "launch")
        .map(|r| r.ts)
        .chain(summaries.iter().filter_map(|x| x.launch));
    let start = starts
        .min()
        .unwrap_or_else(|| recs.iter().map(|r| r.ts).min().expect("non-empty"));
    let end = recs.iter().map(|r| r.ts).max().expect("non-empty");
    let allocation = events.iter().find_map(|(_, e)| match e {
        Event::JobStart(j) => j.allocation,
        _ => None,
    });
    let samples = samples(&events, &summaries);
    let checkpoints = checkpoints(&events);
    let bad_exit = |x: &RankExit| x.exit_code != 0 && x.class != Some(Class::Clean);
    // A requeue that Slurm refused leaves the attempt running: its
    // decision did not end the attempt.
    let requeue_refused = recs.iter().any(|r| r.kind == "requeue_failed");
    // A trainer that reported the end of training and crashed at exit
    // finished the attempt: its ranks' exit-time crashes are no failure.
    let finished_then_crashed = crate::policy::failure::attempt_finished(&exit_facts(&exits));
    let failed = !finished_then_crashed
        && (events.iter().any(|(_, e)| match e {
            Event::Failure(_) => true,
            Event::Decision(d) => !requeue_refused && !finished(d),
            _ => false,
        }) || exits.iter().any(|(_, x)| bad_exit(x)));
    let stall_declared = recs
        .iter()
        .filter(|r| r.kind == "stall")
        .map(|r| r.ts)
        .min();
    // The first failure that is not a peer's echo nor a requested stop.
    let failed_at = |(r, x): &&(&Record, &RankExit)| x.failed_at.unwrap_or(r.ts);
    let crashed_at = exits
        .iter()
        .filter(|(_, x)| bad_exit(x))
        .filter(|(_, x)| {
            !matches!(
                x.class,
                Some(Class::Secondary | Class::Preempted | Class::Hang)
            )
        })
        .map(|e| failed_at(&e))
        .min()
        .or_else(|| {
            exits
                .iter()
                .filter(|(_, x)| bad_exit(x))
                .map(|e| failed_at(&e))
                .min()
        });
    let acted_at = recs
        .iter()
        .filter(|r| r.kind == "teardown" || r.kind == "straggler_exclusion")
        .map(|r| r.ts)
        .min();
    let end_recorded = !exits.is_empty()
        || recs
            .iter()
            .any(|r| matches!(r.kind.as_str(), "job_end" | "decision" | "attempt_end"));
    let requeued = !requeue_refused && recs.iter().any(|r| r.kind == "requeue");
    let relaunched = recs.iter().any(|r| r.kind == "restart");
    Marks {
        attempt,
        allocation,
        start,
        end,
        samples,
        checkpoints,
        failed,
        stall_declared,
        crashed_at,
        acted_at,
        end_recorded,
        requeued,
        relaunched,
    }
}

/// Progress samples (time, step) in time order: progress records, a
/// stall's own account of the last step, and each rank's last step as its
/// exit recorded it.
fn samples(events: &[(&Record, &Event)], summaries: &[ExitSummary]) -> Vec<(DateTime<Utc>, u64)> {
    let mut samples: Vec<(DateTime<Utc>, u64)> = events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::Progress(p) => Some((r.ts, p.step?)),
            Event::Stall(s) => Some((s.last_progress?, s.last_step?)),
            _ => None,
        })
        .chain(summaries.iter().filter_map(|x| x.last))
        .collect();
    samples.sort();
    // A first step the exit records saw before any sample: its own sample
    // was lost. Its number is estimated back from the next sample at the
    // attempt's step rate (else the rate the exit records counted).
    let first_seen = summaries.iter().filter_map(|x| x.first_at).min();
    if let (Some(tf), Some(&(t0, s0))) = (first_seen, samples.first()) {
        if ns(tf, t0) > 1_000_000 {
            let per_step = step_time_of(&samples)
                .or_else(|| summaries.iter().find_map(|x| x.per_step_ns))
                .filter(|p| *p > 0);
            let before = per_step.map_or(0, |p| (ns(tf, t0) as f64 / p as f64).round() as u64);
            samples.insert(0, (tf, s0.saturating_sub(before)));
        }
    }
    samples
}

/// Confirmed checkpoints: (step, began, done, whether training waited).
fn checkpoints(events: &[(&Record, &Event)]) -> Vec<(u64, DateTime<Utc>, DateTime<Utc>, bool)> {
    let mut checkpoints = Vec::new();
    for (r, e) in events {
        let Event::CheckpointDone(c) = e else {
            continue;
        };
        let Some(step) = c.step else { continue };
        let dur = c.duration_s.unwrap_or(0.0).max(0.0);
        let began = r.ts - chrono::Duration::microseconds((dur * 1e6) as i64);
        let blocked = c.blocked_training.unwrap_or(dur > 0.0);
        checkpoints.push((step, began, r.ts, blocked));
    }
    checkpoints
}

impl Marks {
    pub(super) fn first_step(&self) -> Option<(DateTime<Utc>, u64)> {
        self.samples.first().copied()
    }

    pub(super) fn last_progress(&self) -> Option<DateTime<Utc>> {
        self.samples.iter().map(|s| s.0).max()
    }

    /// Mean time per step over the attempt's samples.
    pub(super) fn step_time_ns(&self) -> Option<i64> {
        step_time_of(&self.samples)
    }

    /// When the attempt completed `step`: the start of a checkpoint of that
    /// step, else interpolated between progress samples.
    pub(super) fn completed(&self, step: u64) -> Option<DateTime<Utc>> {
        if let Some(c) = self.checkpoints.iter().find(|c| c.0 == step) {
            return Some(c.1);
        }
        let mut before: Option<(DateTime<Utc>, u64)> = None;
        for &(t, s) in &self.samples {
            if s == step {
                return Some(t);
            }
            if s > step {
                return match before {
                    Some((tb, sb)) if s > sb => {
                        let f = (step - sb) as f64 / (s - sb) as f64;
                        Some(tb + chrono::Duration::nanoseconds((ns(tb, t) as f64 * f) as i64))
                    }
                    _ => Some(t),
                };
            }
            before = Some((t, s));
        }
        before.map(|b| b.0)
    }
}

/// A decision to finish (nothing failed).
fn finished(d: &crate::event::Decision) -> bool {
    matches!(d.decision, Some(crate::policy::restart::Action::Finish))
}

/// Each attempt's marks, from the job's merged records.
pub(super) fn attempt_marks(records: &[Record]) -> Vec<Marks> {
    // Verdicts written later about an earlier attempt (the next start's
    // reconciliation with Slurm) judge that attempt; their times do not
    // belong to it.
    let mut by: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    let mut judged_later: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for r in records {
        match r.event().and_then(|e| e.about_attempt()) {
            Some(about) if about != r.attempt => {
                judged_later.entry(about).or_default().push(r);
            }
            _ => by.entry(r.attempt).or_default().push(r),
        }
    }
    by.iter()
        .map(|(a, rs)| {
            let mut m = marks(*a, rs);
            let later = judged_later.get(a).map_or(&[][..], |v| v.as_slice());
            m.failed |= later.iter().any(|r| match r.event() {
                Some(Event::Failure(_)) => true,
                Some(Event::Decision(d)) => !finished(d),
                _ => false,
            });
            m
        })
        .collect()
}
