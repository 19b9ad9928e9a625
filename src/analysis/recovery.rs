//! Each recovery, phase by phase, from the journal alone: where the seconds
//! between a fault and the training's return to where it was went.
//!
//! A recovery is a failed attempt followed by another. Its phases, each
//! from one boundary to the next:
//! - **detection**: the fault (a hung rank's last progress; a crash's
//!   exit) to resilio seeing it (the stall; the exit);
//! - **diagnosis**: to the job-wide verdict (a hang's; a crash's is its
//!   exit, so none);
//! - **teardown**: to every rank of the attempt having exited;
//! - **relaunch**: to every rank of the next attempt started (a requeue's
//!   wait in the queue is here);
//! - **start**: to its first step, in three parts where the journal shows
//!   them ([`START_PARTS`]): **init**, to the last rank's first output (the
//!   interpreter and the imports); **restore**, to the last line (or
//!   socket message) before the first step saying a checkpoint was loaded,
//!   0 when the attempt started from scratch; **first_step**, to the first
//!   step (the first batch's data, forward, backward);
//! - **rework**: to the step the failed attempt had reached.
//!
//! A boundary the journal does not show leaves its two phases unknown
//! (`None`), never guessed. Steps are the journal's (sampled): the step
//! reached again is placed between the samples around it, at their rate.

use crate::event::Event;
use crate::journal::Record;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;

/// The phases, in order, as the report names them.
pub const PHASES: [&str; 6] = [
    "detection",
    "diagnosis",
    "teardown",
    "relaunch",
    "start",
    "rework",
];

/// The parts of `start`, in order.
pub const START_PARTS: [&str; 3] = ["init", "restore", "first_step"];

/// Every phase a recovery is timed in, in order: [`PHASES`], with the
/// parts of `start` ([`START_PARTS`]) after it.
pub const ALL_PHASES: [&str; 9] = [
    "detection",
    "diagnosis",
    "teardown",
    "relaunch",
    "start",
    "init",
    "restore",
    "first_step",
    "rework",
];

/// One recovery.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recovery {
    /// The attempt that failed (the next one recovered).
    pub failed_attempt: u32,
    /// The judged class of its failure.
    pub class: Option<String>,
    /// What was decided: `restart_in_place`, `restart_in_allocation`, `requeue`.
    pub action: Option<String>,
    pub fault: DateTime<Utc>,
    /// Seconds of each phase, in [`PHASES`]' order (`None`: not shown by
    /// the journal).
    pub phases_s: [Option<f64>; 6],
    /// `start` in parts, in [`START_PARTS`]' order (`None`: not shown; they
    /// add up to `start` when all are shown).
    pub start_parts_s: [Option<f64>; 3],
    /// Why a part of start is not shown (`no checkpoint load shown`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_note: Option<&'static str>,
    /// The trainer's last word before its first step that it loaded a
    /// checkpoint (where `restore` ends), else that it began to (the
    /// restore's end is then not shown).
    pub loaded: Option<String>,
    /// From the fault to the step reached before it again (or, when never
    /// reached, to the last boundary seen).
    pub total_s: f64,
    /// The step the failed attempt had reached.
    pub step_before: Option<u64>,
    /// The first step of the next attempt (its checkpoint's, plus one).
    pub first_step: Option<u64>,
    /// The next attempt reached `step_before` again.
    pub caught_up: bool,
}

impl Recovery {
    /// Each phase of [`ALL_PHASES`] with its seconds (`None`: not shown).
    pub fn all_phases(&self) -> impl Iterator<Item = (&'static str, Option<f64>)> + '_ {
        let (before, after) = self.phases_s.split_at(5);
        ALL_PHASES.iter().copied().zip(
            before
                .iter()
                .chain(&self.start_parts_s)
                .chain(after)
                .copied(),
        )
    }

    /// The total is only a floor: the next attempt never got back to the
    /// step before (or never stepped), so the recovery went on past the
    /// last boundary seen.
    pub fn total_is_floor(&self) -> bool {
        !self.caught_up && (self.step_before.is_some() || self.first_step.is_none())
    }

    /// Where it ended, in words: `back at step 6`, `attempt 2 not back at
    /// step 6` (the attempt after the failure; a later one may have got
    /// further), `no step before`.
    pub fn back(&self) -> String {
        match (self.step_before, self.caught_up) {
            (Some(step), true) => format!("back at step {step}"),
            (Some(step), false) => format!(
                "attempt {} not back at step {step}",
                self.failed_attempt + 1
            ),
            (None, _) => "no step before".into(),
        }
    }
}

/// One phase's spread over the job's recoveries.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseSpread {
    pub phase: &'static str,
    /// Recoveries in which the phase was seen.
    pub n: usize,
    pub p50_s: f64,
    pub p99_s: f64,
}

/// Every recovery of a run's records.
pub fn recoveries(records: &[Record]) -> Vec<Recovery> {
    // One pass: each attempt's events (a recovery reads two attempts).
    let mut by: Attempts = BTreeMap::new();
    for (r, e) in crate::journal::events(records) {
        by.entry(r.attempt).or_default().push((r, e));
    }
    let last_attempt = by.keys().next_back().copied().unwrap_or(0);
    (0..last_attempt)
        .filter_map(|a| recovery_of(&by, a))
        .collect()
}

/// A run's events, by attempt.
type Attempts<'a> = BTreeMap<u32, Vec<(&'a Record, &'a Event)>>;

/// The events of attempt `a`.
fn of<'b, 'a: 'b>(
    by: &'b Attempts<'a>,
    a: u32,
) -> impl Iterator<Item = (&'a Record, &'a Event)> + 'b {
    by.get(&a).into_iter().flatten().copied()
}

/// The spread of each phase (nearest-rank percentiles).
pub fn spread(recoveries: &[Recovery]) -> Vec<PhaseSpread> {
    ALL_PHASES
        .iter()
        .enumerate()
        .filter_map(|(i, &phase)| {
            spread_of(
                phase,
                recoveries
                    .iter()
                    .filter_map(|r| r.all_phases().nth(i).and_then(|(_, v)| v))
                    .collect(),
            )
        })
        .collect()
}

/// Spreads in words, `detection 0ms/0ms, first step 201ms/1.2s`, each
/// figure written by `secs`.
pub fn spread_line(spreads: &[PhaseSpread], secs: impl Fn(f64) -> String) -> String {
    let each: Vec<String> = spreads
        .iter()
        .map(|p| {
            format!(
                "{} {}/{}",
                p.phase.replace('_', " "),
                secs(p.p50_s),
                secs(p.p99_s)
            )
        })
        .collect();
    each.join(", ")
}

/// The recoveries of one failure class: how many, and each phase's spread
/// (and the whole's, as `total`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassRecoveries {
    pub class: String,
    pub n: usize,
    pub phases: Vec<PhaseSpread>,
}

/// [`spread`] by failure class (the judged class; `unknown` when none was
/// judged), classes by name.
pub fn by_class(recoveries: &[Recovery]) -> Vec<ClassRecoveries> {
    let mut classes: BTreeMap<&str, Vec<Recovery>> = BTreeMap::new();
    for r in recoveries {
        classes
            .entry(r.class.as_deref().unwrap_or("unknown"))
            .or_default()
            .push(r.clone());
    }
    classes
        .into_iter()
        .map(|(class, rs)| {
            let mut phases = spread(&rs);
            phases.extend(spread_of("total", rs.iter().map(|r| r.total_s).collect()));
            ClassRecoveries {
                class: class.to_string(),
                n: rs.len(),
                phases,
            }
        })
        .collect()
}

/// The p50 and p99 (nearest rank) of `values`; `None` when there are none.
fn spread_of(phase: &'static str, mut values: Vec<f64>) -> Option<PhaseSpread> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let at = |q: f64| values[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    Some(PhaseSpread {
        phase,
        n,
        p50_s: at(0.5),
        p99_s: at(0.99),
    })
}

fn recovery_of(by: &Attempts<'_>, failed: u32) -> Option<Recovery> {
    let of = |a: u32| of(by, a);
    // The failed attempt's judgment and decision (a restart of some kind).
    let judgment = of(failed).find_map(|(_, e)| match e {
        Event::Judgment(j) => Some(j),
        _ => None,
    });
    let action = of(failed).find_map(|(_, e)| match e {
        Event::Decision(d) => d.decision.as_ref(),
        _ => None,
    });
    let restarted = action.is_some_and(|a| {
        !matches!(
            a,
            crate::policy::restart::Action::Stop { .. } | crate::policy::restart::Action::Finish
        )
    });
    let next_started = of(failed + 1).any(|(_, e)| matches!(e, Event::RankStart(_)));
    if !restarted || !next_started {
        return None;
    }
    let primary = judgment.and_then(|j| j.primary_rank);
    let (fault, detected) = fault_and_detection(by, failed, primary)?;
    let verdict = of(failed)
        .filter_map(|(r, e)| matches!(e, Event::Hang(_)).then_some(r.ts))
        .find(|t| *t >= detected)
        .unwrap_or(detected);
    let torn_down = of(failed)
        .find_map(|(r, e)| matches!(e, Event::AttemptEnd(_)).then_some(r.ts))
        .or_else(|| {
            of(failed)
                .filter_map(|(r, e)| matches!(e, Event::RankExit(_)).then_some(r.ts))
                .max()
        });
    let relaunched = of(failed + 1)
        .filter_map(|(r, e)| matches!(e, Event::RankStart(_)).then_some(r.ts))
        .max();
    let (first, step_before, back) = steps_around(by, failed);
    let start = start_parts(by, failed + 1, relaunched, first);
    let bounds = [
        Some(fault),
        Some(detected),
        Some(verdict),
        torn_down,
        relaunched,
        first.map(|(t, _)| t),
        back,
    ];
    let mut phases_s = [None; 6];
    for (i, p) in phases_s.iter_mut().enumerate() {
        if let (Some(a), Some(b)) = (bounds[i], bounds[i + 1]) {
            *p = Some(((b - a).num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0));
        }
    }
    // The last boundary seen: a start's part too (an attempt that never
    // stepped still took its init and restore).
    let end = bounds
        .iter()
        .rev()
        .flatten()
        .next()
        .copied()
        .into_iter()
        .chain(start.last)
        .max()
        .unwrap_or(fault);
    Some(Recovery {
        failed_attempt: failed,
        class: judgment.map(|j| j.class).map(|c| c.name().to_string()),
        action: action.map(|a| a.name().to_string()),
        fault,
        phases_s,
        start_parts_s: start.parts,
        start_note: start.note,
        loaded: start.loaded,
        total_s: ((end - fault).num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0),
        step_before,
        first_step: first.map(|(_, s)| s),
        caught_up: back.is_some(),
    })
}

/// `start` of attempt `a` in parts ([`START_PARTS`]), from its relaunch
/// and its first step (when, which); where a part is not shown, why; the
/// line that said a checkpoint was loaded; the last boundary seen. Only
/// what came before the first step counts; the boundaries are kept in
/// order (a rank that printed before the last one started).
fn start_parts(
    by: &Attempts<'_>,
    a: u32,
    relaunched: Option<DateTime<Utc>>,
    first: Option<(DateTime<Utc>, u64)>,
) -> StartParts {
    let first_at = first.map(|(t, _)| t);
    let before_first = |t: &DateTime<Utc>| first_at.is_none_or(|f| *t <= f);
    // The last rank's first output, of those that said something before
    // their first step (a first output that held a step says nothing of
    // the start-up).
    let outputs: Vec<(DateTime<Utc>, bool)> = of(by, a)
        .filter_map(|(r, e)| match e {
            Event::FirstOutput(o) => Some((r.ts, o.with_step == Some(true))),
            _ => None,
        })
        .filter(|(t, _)| before_first(t))
        .collect();
    let initialised = outputs.iter().filter(|o| !o.1).map(|o| o.0).max();
    // The last load said before the first step: done (its end), else one
    // begun (`Loading the checkpoint ...`), whose end is not shown.
    let loads: Vec<(DateTime<Utc>, Option<String>, bool)> = of(by, a)
        .filter_map(|(r, e)| match e {
            Event::CheckpointLoaded(c) => Some((r.ts, Some(c.line.clone()), c.done != Some(false))),
            _ => None,
        })
        .filter(|(t, _, _)| before_first(t))
        .collect();
    let done = loads.iter().filter(|l| l.2).max_by_key(|l| l.0);
    let begun = loads.iter().max_by_key(|l| l.0);
    let at_least = |t: Option<DateTime<Utc>>, low: Option<DateTime<Utc>>| match (t, low) {
        (Some(t), Some(low)) => Some(t.max(low)),
        (t, _) => t,
    };
    let mut initialised = at_least(initialised, relaunched);
    let mut note = None;
    let restored = match done {
        // Said before the last rank's first output (a trainer quiet until
        // its first step, or a rank that printed late): the load is inside
        // what init would be, the two are not told apart.
        Some((t, _, _)) if initialised.is_none_or(|i| *t < i) => {
            initialised = None;
            note = Some("init and restore not told apart: the load was said before the last rank's first output");
            at_least(Some(*t), relaunched)
        }
        Some((t, _, _)) => Some(*t),
        // Nothing said of a load, and the first step is the first there
        // is: nothing was loaded (a restart from scratch).
        None if begun.is_none() && initialised.is_some() && first.is_some_and(|(_, s)| s <= 1) => {
            initialised
        }
        None => {
            note = Some(match (begun, initialised) {
                (_, None) if outputs.is_empty() => "not split: no first output in the journal",
                (_, None) => "not split: nothing was said before the first step",
                (Some(_), Some(_)) => "a checkpoint load began, its end not shown",
                (None, Some(_)) => "no checkpoint load shown",
            });
            None
        }
    };
    if first_at.is_none() && note.is_none() {
        note = Some("no first step");
    }
    let bounds = [relaunched, initialised, restored, first_at];
    let mut parts = [None; 3];
    for (i, p) in parts.iter_mut().enumerate() {
        if let (Some(x), Some(y)) = (bounds[i], bounds[i + 1]) {
            *p = Some(seconds(y - x));
        }
    }
    StartParts {
        parts,
        note,
        loaded: done.or(begun).and_then(|(_, line, _)| line.clone()),
        last: bounds.iter().rev().flatten().next().copied(),
    }
}

/// What [`start_parts`] found.
struct StartParts {
    parts: [Option<f64>; 3],
    note: Option<&'static str>,
    loaded: Option<String>,
    /// The latest boundary of start seen.
    last: Option<DateTime<Utc>>,
}

/// A span in seconds, never below 0.
fn seconds(d: chrono::TimeDelta) -> f64 {
    (d.num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0)
}

/// When the attempt's fault happened and when resilio saw it: the primary
/// rank's stall (its last progress, the stall), else its exit (both).
fn fault_and_detection(
    by: &Attempts<'_>,
    failed: u32,
    primary: Option<u32>,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let of = || of(by, failed);
    let is_primary = |r: &Record| primary.is_none() || r.rank == primary;
    // The stall that set the judgment off: the last before the judged hang
    // record (one withdrawn before it, a peer found busy, is not this
    // fault's), the primary's own, else, where a hang was judged, any
    // rank's (the primary prints nothing: a peer stalled waiting for it).
    let judged = of()
        .filter_map(|(r, e)| matches!(e, Event::Hang(_)).then_some(r.ts))
        .last();
    // A hang before the attempt's first step (a startup stall: a load
    // that never returned) has no last progress: its fault is the hung
    // rank's last sign of life the journal shows (its start, its first
    // output, its word of a load), else the stall.
    let life = |rank: Option<u32>, until: DateTime<Utc>| {
        of().filter(|(r, _)| r.rank == rank && r.ts <= until)
            .filter_map(|(r, e)| {
                matches!(
                    e,
                    Event::RankStart(_) | Event::FirstOutput(_) | Event::CheckpointLoaded(_)
                )
                .then_some(r.ts)
            })
            .max()
    };
    let stalls: Vec<(&Record, DateTime<Utc>)> = of()
        .filter_map(|(r, e)| match e {
            Event::Stall(s) => Some((
                r,
                s.last_progress
                    .or_else(|| life(primary.or(r.rank), r.ts))
                    .unwrap_or(r.ts),
            )),
            _ => None,
        })
        .filter(|(r, _)| judged.is_none_or(|t| r.ts <= t))
        .collect();
    let stall = stalls
        .iter()
        .rev()
        .find(|(r, _)| is_primary(r))
        .or_else(|| stalls.last().filter(|_| judged.is_some()))
        .map(|(r, last)| (*last, r.ts));
    stall
        .or_else(|| {
            of().find_map(|(r, e)| match e {
                Event::RankExit(_) | Event::Failure(_) if is_primary(r) => Some((r.ts, r.ts)),
                _ => None,
            })
        })
        // The primary left no record of its own (its agent was killed):
        // the teardown it set off is when it was seen.
        .or_else(|| of().find_map(|(r, e)| matches!(e, Event::Teardown(_)).then_some((r.ts, r.ts))))
        .or_else(|| of().find_map(|(r, e)| matches!(e, Event::Failure(_)).then_some((r.ts, r.ts))))
}

/// The next attempt's first step (when, which), the step the failed one
/// had reached (the ranks' own last step, or the progress), and when the
/// next attempt reached it again.
#[allow(clippy::type_complexity)]
fn steps_around(
    by: &Attempts<'_>,
    failed: u32,
) -> (
    Option<(DateTime<Utc>, u64)>,
    Option<u64>,
    Option<DateTime<Utc>>,
) {
    let of = |a: u32| of(by, a);
    let steps = |a: u32| {
        of(a).filter_map(|(r, e)| match e {
            Event::Progress(p) => p.step.map(|s| (r.ts, s)),
            _ => None,
        })
    };
    let first = steps(failed + 1).min_by_key(|(t, _)| *t);
    // Where the job was: the furthest any attempt up to the failed one got
    // (a failure before an attempt's first step leaves the job where the
    // attempt before it was).
    let step_before = (0..=failed)
        .flat_map(of)
        .filter_map(|(_, e)| match e {
            Event::RankExit(x) => x.last_step,
            Event::Progress(p) => p.step,
            _ => None,
        })
        .max();
    // Progress is sampled: the step reached again is placed between the
    // samples around it, at the rate they show (the first sample at or
    // past it would count up to a sampling period of rework too many).
    let mut after: Vec<(DateTime<Utc>, u64)> = steps(failed + 1).collect();
    after.sort();
    let back = step_before.and_then(|before| {
        let i = after.iter().position(|(_, s)| *s >= before)?;
        let (t2, s2) = after[i];
        Some(match i.checked_sub(1).map(|j| after[j]) {
            Some((t1, s1)) if s1 < before && s2 > s1 => {
                let share = (before - s1) as f64 / (s2 - s1) as f64;
                t1 + chrono::Duration::microseconds(
                    ((t2 - t1).num_microseconds().unwrap_or(0) as f64 * share) as i64,
                )
            }
            _ => t2,
        })
    });
    (first, step_before, back)
}

/// The coordinator's `/metrics` source: the recoveries of the latest run
/// in a job's journal directory.
pub struct JournalRecoveries {
    dir: std::path::PathBuf,
}

impl JournalRecoveries {
    pub fn new(job_dir: &std::path::Path) -> JournalRecoveries {
        JournalRecoveries {
            dir: job_dir.to_path_buf(),
        }
    }
}

impl crate::coordinator::recoveries::RecoverySource for JournalRecoveries {
    fn recoveries(&self) -> Option<Vec<crate::coordinator::recoveries::RecoveryFigures>> {
        let j = crate::journal::read_job(&self.dir).ok()?;
        let run = crate::runs::split(j.records).pop()?;
        Some(
            recoveries(&run.records)
                .iter()
                .map(Recovery::figures)
                .collect(),
        )
    }
}

impl Recovery {
    /// As `/metrics` shows it: the phases the journal shows, and the total.
    pub fn figures(&self) -> crate::coordinator::recoveries::RecoveryFigures {
        crate::coordinator::recoveries::RecoveryFigures {
            class: self.class.clone().unwrap_or_else(|| "unknown".into()),
            phases: self
                .all_phases()
                .filter_map(|(p, v)| v.map(|v| (p, v)))
                .chain(std::iter::once(("total", self.total_s)))
                .collect(),
            step_before: self.step_before,
            caught_up: self.caught_up,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn a_recovery_not_caught_up_names_the_attempt_that_was_not() {
        let mut r = Recovery {
            failed_attempt: 1,
            class: None,
            action: None,
            fault: DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
            phases_s: [None; 6],
            start_parts_s: [None; 3],
            start_note: None,
            loaded: None,
            total_s: 1.0,
            step_before: Some(24),
            first_step: Some(21),
            caught_up: false,
        };
        assert_eq!(r.back(), "attempt 2 not back at step 24");
        r.caught_up = true;
        assert_eq!(r.back(), "back at step 24");
        r.step_before = None;
        assert_eq!(r.back(), "no step before");
    }

    #[test]
    fn recoveries_are_spread_by_failure_class_with_their_total() {
        let one = |class: Option<&str>, detection: f64, total: f64| Recovery {
            failed_attempt: 0,
            class: class.map(str::to_string),
            action: None,
            fault: DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
            phases_s: [Some(detection), None, Some(0.1), None, None, None],
            start_parts_s: [None; 3],
            start_note: None,
            loaded: None,
            total_s: total,
            step_before: None,
            first_step: None,
            caught_up: false,
        };
        let by = by_class(&[
            one(Some("hang"), 30.0, 90.0),
            one(Some("infrastructure"), 1.0, 20.0),
            one(Some("hang"), 10.0, 40.0),
            one(None, 2.0, 5.0),
        ]);
        let names: Vec<(&str, usize)> = by.iter().map(|c| (c.class.as_str(), c.n)).collect();
        assert_eq!(names, [("hang", 2), ("infrastructure", 1), ("unknown", 1)]);
        let hang: Vec<(&str, usize, f64, f64)> = by[0]
            .phases
            .iter()
            .map(|p| (p.phase, p.n, p.p50_s, p.p99_s))
            .collect();
        // Phases not shown are left out, never taken for zero.
        assert_eq!(
            hang,
            [
                ("detection", 2, 10.0, 30.0),
                ("teardown", 2, 0.1, 0.1),
                ("total", 2, 40.0, 90.0)
            ]
        );
    }

    fn rec(kind: &str, attempt: u32, rank: Option<u32>, ms: i64, data: Value) -> Record {
        Record {
            v: 1,
            ts: DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap(),
            kind: kind.into(),
            attempt,
            rank,
            node: Some("n1".into()),
            data: data.as_object().cloned().unwrap_or_default(),
            ..Default::default()
        }
    }

    /// A hang of rank 1 at step 18 (its last progress at 10 s), seen at
    /// 12.5 s, judged at 13 s, torn down at 13.2 s, relaunched at 13.5 s;
    /// the next attempt's first step 11 at 14.5 s, then steps 14 and 19
    /// sampled at 15 s and 16 s.
    fn hang_and_back() -> Vec<Record> {
        let last = DateTime::from_timestamp_millis(1_800_000_010_000).unwrap();
        vec![
            rec("rank_start", 0, Some(0), 0, json!({})),
            rec("rank_start", 0, Some(1), 0, json!({})),
            rec("progress", 0, Some(1), 10_000, json!({ "step": 18 })),
            rec(
                "stall",
                0,
                Some(0),
                12_400,
                json!({ "last_progress": last, "last_step": 18 }),
            ),
            rec(
                "stall",
                0,
                Some(1),
                12_500,
                json!({ "last_progress": last, "last_step": 18 }),
            ),
            rec("hang", 0, None, 13_000, json!({})),
            rec("rank_exit", 0, Some(1), 13_100, json!({ "last_step": 18 })),
            rec("attempt_end", 0, None, 13_200, json!({})),
            rec(
                "judgment",
                0,
                None,
                13_210,
                json!({ "class": "hang", "primary_rank": 1 }),
            ),
            rec(
                "decision",
                0,
                None,
                13_220,
                json!({ "decision": { "action": "restart_in_place", "reason": "" } }),
            ),
            rec("rank_start", 1, Some(0), 13_400, json!({})),
            rec("rank_start", 1, Some(1), 13_500, json!({})),
            rec(
                "progress",
                1,
                Some(0),
                14_500,
                json!({ "step": 11, "first": true }),
            ),
            rec("progress", 1, Some(0), 15_000, json!({ "step": 14 })),
            rec("progress", 1, Some(0), 16_000, json!({ "step": 19 })),
        ]
    }

    #[test]
    fn a_hangs_recovery_is_timed_phase_by_phase() {
        let r = recoveries(&hang_and_back());
        assert_eq!(r.len(), 1);
        let r = &r[0];
        let got: Vec<Option<f64>> = r
            .phases_s
            .iter()
            .map(|p| p.map(|s| (s * 1000.0).round() / 1000.0))
            .collect();
        assert_eq!(
            got,
            [
                Some(2.5),
                Some(0.5),
                Some(0.2),
                Some(0.3),
                Some(1.0),
                Some(1.3)
            ]
        );
        // Step 18 between the samples of step 14 (15 s) and 19 (16 s): at 15.8 s.
        assert!((r.total_s - 5.8).abs() < 1e-9, "{}", r.total_s);
        assert_eq!(
            (r.step_before, r.first_step, r.caught_up),
            (Some(18), Some(11), true)
        );
        assert_eq!(r.class.as_deref(), Some("hang"));
        assert_eq!(r.action.as_deref(), Some("restart_in_place"));
    }

    /// The next attempt's start in parts: relaunched at 13.5 s, rank 0's
    /// first output at 13.6 s and rank 1's at 13.8 s (init ends at the last
    /// one), the checkpoint loaded at 14.1 s and 14.2 s (restore ends at the
    /// last load before the first step; one after it is not the restore),
    /// the first step at 14.5 s.
    #[test]
    fn start_is_split_at_the_first_output_and_the_checkpoints_load() {
        let parts = |extra: Vec<Record>| {
            let mut records = hang_and_back();
            records.extend(extra);
            records.sort_by_key(|r| r.ts);
            let r = recoveries(&records).remove(0);
            let rounded: Vec<Option<f64>> = r
                .start_parts_s
                .iter()
                .map(|p| p.map(|s| (s * 1000.0).round() / 1000.0))
                .collect();
            (rounded, r.loaded, r.phases_s[4])
        };
        let out = |rank, ms| {
            rec(
                "first_output",
                1,
                Some(rank),
                ms,
                json!({ "source": "stdout" }),
            )
        };
        let load = |rank, ms, line: &str| {
            rec(
                "checkpoint_loaded",
                1,
                Some(rank),
                ms,
                json!({ "source": "stdout", "line": line }),
            )
        };
        let (got, loaded, start) = parts(vec![
            out(0, 13_600),
            out(1, 13_800),
            load(1, 14_100, "loading checkpoint 10"),
            load(
                0,
                14_200,
                "Restored all states from the checkpoint at /ck/10",
            ),
            load(0, 15_500, "loaded checkpoint for evaluation"),
        ]);
        assert_eq!(got, [Some(0.3), Some(0.4), Some(0.3)]);
        assert_eq!(
            loaded.as_deref(),
            Some("Restored all states from the checkpoint at /ck/10")
        );
        // The parts add up to start.
        assert_eq!(start, Some(1.0));
        // No load said: what follows the first output is not split.
        let (got, loaded, _) = parts(vec![out(0, 13_600), out(1, 13_800)]);
        assert_eq!((got, loaded), (vec![Some(0.3), None, None], None));
        // A rank that printed before the last rank started: init is 0, not
        // negative, and the parts still add up.
        let (got, _, _) = parts(vec![
            out(0, 13_450),
            load(0, 14_000, "resumed from checkpoint"),
        ]);
        assert_eq!(got, [Some(0.0), Some(0.5), Some(0.5)]);
        // An older journal: no first output, nothing split.
        let (got, _, _) = parts(Vec::new());
        assert_eq!(got, [None, None, None]);
        // A load begun (`Loading the checkpoint ...`) and never said done:
        // its end is not known, so neither is the restore.
        let begun = |rank, ms, line: &str| {
            rec(
                "checkpoint_loaded",
                1,
                Some(rank),
                ms,
                json!({ "source": "stdout", "line": line, "done": false }),
            )
        };
        let (got, loaded, _) = parts(vec![
            out(0, 13_600),
            begun(0, 13_700, "Loading the checkpoint at step 10."),
        ]);
        assert_eq!(got, [Some(0.1), None, None]);
        assert_eq!(
            loaded.as_deref(),
            Some("Loading the checkpoint at step 10.")
        );
        // Begun, then done: the restore ends at the done one.
        let (got, loaded, _) = parts(vec![
            out(0, 13_600),
            begun(0, 13_700, "Loading the checkpoint at step 10."),
            load(0, 14_300, "Finished loading the checkpoint in 0.6 seconds."),
        ]);
        assert_eq!(got, [Some(0.1), Some(0.7), Some(0.2)]);
        assert_eq!(
            loaded.as_deref(),
            Some("Finished loading the checkpoint in 0.6 seconds.")
        );
    }

    /// Trial 20: a load said before the last rank's first output (a trainer
    /// quiet until its first step that sends `restored=N`; a rank that
    /// printed late) is not a 0 s restore: init and restore are one piece.
    /// A trainer that says nothing before its first step is not split.
    #[test]
    fn a_load_before_the_last_first_output_is_not_told_apart_from_init() {
        let with = |extra: Vec<Record>| {
            let mut records = hang_and_back();
            records.extend(extra);
            records.sort_by_key(|r| r.ts);
            recoveries(&records).remove(0)
        };
        let out = |rank, ms, with_step: bool| {
            rec(
                "first_output",
                1,
                Some(rank),
                ms,
                json!({ "source": "stdout", "with_step": with_step }),
            )
        };
        let restored = |rank, ms| {
            rec(
                "checkpoint_loaded",
                1,
                Some(rank),
                ms,
                json!({ "source": "socket", "line": "restored=10", "step": 10, "done": true }),
            )
        };
        // Quiet: the socket's word at 14.2 s, the first output is the first
        // step's line.
        let r = with(vec![restored(0, 14_200), out(0, 14_500, true)]);
        assert_eq!(r.start_parts_s[..2], [None, None]);
        assert!((r.start_parts_s[2].unwrap() - 0.3).abs() < 1e-9, "{r:?}");
        assert!(r
            .start_note
            .unwrap()
            .starts_with("init and restore not told apart"));
        // Late: rank 0 printed and loaded, rank 1's first output after that.
        let r = with(vec![
            out(0, 13_600, false),
            restored(0, 13_900),
            out(1, 14_000, false),
        ]);
        assert_eq!(r.start_parts_s[..2], [None, None]);
        assert!(r
            .start_note
            .unwrap()
            .starts_with("init and restore not told apart"));
        // Nothing said before the first step, no load: not split.
        let r = with(vec![out(0, 14_500, true), out(1, 14_500, true)]);
        assert_eq!(r.start_parts_s, [None, None, None]);
        assert_eq!(
            r.start_note,
            Some("not split: nothing was said before the first step")
        );
    }

    /// Trial 20 D0: a rank that hangs after its load, before the attempt's
    /// first step: the fault is its last sign of life (its word of the
    /// load), not the startup stall that caught it 15 s later; the job's
    /// step before is the earlier attempt's; the total counts the init and
    /// restore of an attempt that never stepped.
    #[test]
    fn a_hang_before_the_first_step_is_timed_from_the_hung_ranks_last_word() {
        let mut records: Vec<Record> = hang_and_back()
            .into_iter()
            .filter(|r| !(r.attempt == 1 && r.kind == "progress"))
            .collect();
        records.extend([
            rec(
                "first_output",
                1,
                Some(1),
                13_700,
                json!({ "with_step": false }),
            ),
            rec(
                "checkpoint_loaded",
                1,
                Some(1),
                14_000,
                json!({ "line": "loaded checkpoint 10", "done": true }),
            ),
            rec("stall", 1, Some(0), 29_000, json!({ "mode": "startup" })),
            rec("hang", 1, None, 29_100, json!({})),
            rec("attempt_end", 1, None, 29_300, json!({})),
            rec(
                "judgment",
                1,
                None,
                29_310,
                json!({ "class": "hang", "primary_rank": 1 }),
            ),
            rec(
                "decision",
                1,
                None,
                29_320,
                json!({ "decision": { "action": "restart_in_place", "reason": "" } }),
            ),
            rec("rank_start", 2, Some(0), 29_500, json!({})),
            rec("rank_start", 2, Some(1), 29_500, json!({})),
            rec(
                "progress",
                2,
                Some(0),
                30_500,
                json!({ "step": 11, "first": true }),
            ),
            rec("progress", 2, Some(0), 31_500, json!({ "step": 19 })),
        ]);
        records.sort_by_key(|r| r.ts);
        let r = recoveries(&records);
        assert_eq!(r.len(), 2);
        // Attempt 0's recovery: attempt 1 never stepped; its init (13.5 to
        // 13.7 s) and restore (to 14 s) are in the total.
        assert_eq!(r[0].phases_s[4], None);
        assert_eq!(r[0].start_note, Some("no first step"));
        assert!(r[0].total_is_floor());
        assert!(!r[1].total_is_floor());
        let end = r[0].fault + chrono::Duration::milliseconds(4_000);
        assert_eq!(
            r[0].fault + chrono::Duration::microseconds((r[0].total_s * 1e6) as i64),
            end
        );
        // Attempt 1's: the fault at rank 1's word of its load (14 s), seen
        // at the stall (29 s); the job had been at step 18.
        assert!(
            (r[1].phases_s[0].unwrap() - 15.0).abs() < 1e-9,
            "{:?}",
            r[1]
        );
        assert_eq!(r[1].step_before, Some(18));
        assert!(r[1].caught_up);
    }

    /// An attempt that starts from scratch (its first step is 1) and says
    /// no load: the restore took no time.
    #[test]
    fn a_restart_from_scratch_restores_nothing() {
        let mut records: Vec<Record> = hang_and_back()
            .into_iter()
            .map(|mut r| {
                if r.attempt == 1 && r.kind == "progress" {
                    let step = r.data["step"].as_u64().unwrap() - 10;
                    r.data.insert("step".into(), json!(step));
                }
                r
            })
            .collect();
        records.push(rec(
            "first_output",
            1,
            Some(0),
            13_900,
            json!({ "source": "stderr" }),
        ));
        records.sort_by_key(|r| r.ts);
        let r = recoveries(&records).remove(0);
        assert_eq!(r.first_step, Some(1));
        let rounded: Vec<Option<f64>> = r
            .start_parts_s
            .iter()
            .map(|p| p.map(|s| (s * 1000.0).round() / 1000.0))
            .collect();
        assert_eq!(rounded, [Some(0.4), Some(0.0), Some(0.6)]);
    }

    /// Trial 19 pass 2: rank 1 prints nothing (the HF Trainer's other
    /// rank), so only rank 0 stalled; an earlier stall of rank 0 was
    /// withdrawn (rank 1 busy). Detection runs from the job's last progress
    /// to the stall that was judged, not from rank 1's exit (it said 0 ms).
    #[test]
    fn a_silent_ranks_hang_is_timed_from_the_stall_its_peer_raised() {
        let mut v = hang_and_back();
        v.retain(|r| !(r.kind == "stall" && r.rank == Some(1)));
        let early = DateTime::from_timestamp_millis(1_800_000_001_000).unwrap();
        v.insert(
            2,
            rec(
                "stall",
                0,
                Some(0),
                5_000,
                json!({ "last_progress": early, "last_step": 5 }),
            ),
        );
        v.insert(3, rec("hang", 0, None, 5_500, json!({})));
        let r = &recoveries(&v)[0];
        let got: Vec<Option<f64>> = r.phases_s[..2]
            .iter()
            .map(|p| p.map(|s| (s * 1000.0).round() / 1000.0))
            .collect();
        // The stall at 12.4 s (last progress 10 s), judged at 13 s.
        assert_eq!(got, [Some(2.4), Some(0.6)]);
    }

    #[test]
    fn what_the_journal_does_not_show_is_unknown_and_a_stop_is_no_recovery() {
        // No attempt_end nor the failed rank's exit: teardown and relaunch unknown.
        let mut v = hang_and_back();
        v.retain(|r| r.kind != "attempt_end" && r.kind != "rank_exit");
        let r = &recoveries(&v)[0];
        assert_eq!((r.phases_s[2], r.phases_s[3]), (None, None));
        assert!(r.phases_s[4].is_some());
        // Never back at step 18: no rework, the total to the first step.
        let mut v = hang_and_back();
        v.pop();
        let r = &recoveries(&v)[0];
        assert_eq!((r.phases_s[5], r.caught_up), (None, false));
        assert_eq!(r.total_s, 4.5);
        // A crash: detected as it happened, no diagnosis.
        let crash = vec![
            rec("rank_start", 0, Some(0), 0, json!({})),
            rec("progress", 0, Some(0), 1_000, json!({ "step": 5 })),
            rec("rank_exit", 0, Some(0), 2_000, json!({ "last_step": 5 })),
            rec(
                "judgment",
                0,
                None,
                2_100,
                json!({ "class": "infrastructure", "primary_rank": 0 }),
            ),
            rec(
                "decision",
                0,
                None,
                2_100,
                json!({ "decision": { "action": "requeue", "reason": "" } }),
            ),
            rec("rank_start", 1, Some(0), 60_000, json!({})),
        ];
        let r = &recoveries(&crash)[0];
        assert_eq!(&r.phases_s[..2], &[Some(0.0), Some(0.0)]);
        assert_eq!(r.phases_s[3], Some(58.0));
        assert_eq!((r.phases_s[4], r.phases_s[5]), (None, None));
        // An agent killed: its rank left no record, the teardown it set off
        // is when it was seen.
        let mut killed = hang_and_back();
        killed.retain(|r| !(r.attempt == 0 && r.rank == Some(1) && r.kind != "rank_start"));
        killed.retain(|r| r.kind != "hang");
        killed.insert(
            5,
            rec(
                "teardown",
                0,
                None,
                12_900,
                json!({ "reason": "the agent of rank 1 died" }),
            ),
        );
        let r = &recoveries(&killed)[0];
        assert_eq!(
            r.fault,
            DateTime::from_timestamp_millis(1_800_000_012_900).unwrap()
        );
        assert_eq!(&r.phases_s[..3], &[Some(0.0), Some(0.0), Some(0.3)]);
        // Stopped: nothing recovered.
        let mut stop = hang_and_back();
        stop.retain(|r| r.attempt == 0 && r.kind != "decision");
        stop.push(rec(
            "decision",
            0,
            None,
            13_220,
            json!({ "decision": { "action": "stop", "reason": "" } }),
        ));
        assert!(recoveries(&stop).is_empty());
    }

    #[test]
    fn each_phase_spreads_over_the_recoveries_seen() {
        let mk = |d: f64, rework: Option<f64>| Recovery {
            failed_attempt: 0,
            class: None,
            action: None,
            fault: DateTime::from_timestamp(0, 0).unwrap(),
            phases_s: [Some(d), Some(0.0), Some(1.0), Some(2.0), Some(3.0), rework],
            start_parts_s: [None; 3],
            start_note: None,
            loaded: None,
            total_s: 0.0,
            step_before: None,
            first_step: None,
            caught_up: false,
        };
        let v: Vec<Recovery> = (1..=10)
            .map(|i| mk(i as f64, (i % 2 == 0).then_some(1.0)))
            .collect();
        let s = spread(&v);
        assert_eq!(
            s[0],
            PhaseSpread {
                phase: "detection",
                n: 10,
                p50_s: 5.0,
                p99_s: 10.0
            }
        );
        assert_eq!(s[5].n, 5);
        assert!(spread(&[]).is_empty());
    }
}
