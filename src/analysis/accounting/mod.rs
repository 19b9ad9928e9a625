//! Where a job's wall time went: ETTR and its badput, as contiguous
//! segments from the job's first start to its end, each in one bucket, so
//! that the buckets add up to the wall time exactly.
//!
//! Pure: the journal's records (and, when the job ran under Slurm, the
//! start and end of each allocation as Slurm recorded them) in, segments
//! out. Per attempt, on the job's own clock (the earliest or latest of its
//! ranks):
//!
//! ```text
//! start ─startup─ first step begins ─productive─ last surviving step ─rework─ failure
//!   ─(stalled: a hang, until declared)─ ─detection─ resilio acts ─teardown─ attempt end
//!   ─restart─ next attempt (same allocation)
//!   ─restart─ allocation end ─queue_wait─ next allocation ─startup─ next attempt (requeue)
//! ```
//!
//! - A step survived when a later checkpoint saved it or the run finished
//!   with it. Which step a failed attempt's successor resumed after is read
//!   from the successor's first step (and the checkpoints journaled before
//!   it); without a successor, from the attempt's last checkpoint.
//! - The first step's own compute time counts as productive: its start is
//!   the first step's completion minus the attempt's mean step time.
//! - Checkpoints that blocked training (`checkpoint_done.blocked_training`,
//!   or a `phase=checkpoint` without it) are carved out of productive and
//!   rework time into `checkpoint`.
//! - Time the records cannot place (an attempt whose supervisor was killed
//!   with no end recorded) is `unexplained`.
//! - So is the span of a journal gap (`journal_gap` with `from` and `to`:
//!   records lost to a full disk or another write error) where it would
//!   otherwise be productive, rework or after the last step: the journal does
//!   not say what happened then. [`journal_gaps`] lists them for the notes.

mod marks;
pub(crate) use marks::exit_facts;

use crate::journal::Record;
use chrono::{DateTime, Utc};
use marks::{attempt_marks, Marks};
use serde::Serialize;
use std::collections::BTreeMap;

/// The buckets, in the order of a failure's story. `productive` is first.
pub const BUCKETS: [&str; 11] = [
    "productive",
    "startup",
    "checkpoint",
    "rework",
    "stalled",
    "detection",
    "teardown",
    "restart",
    "queue_wait",
    "after_last_step",
    "unexplained",
];

/// How far the journal may reach outside Slurm's allocation times (their
/// one-second resolution, the clocks of the nodes against the controller's,
/// a long KillWait). A reused job id is hours or days away.
const SLURM_SLACK_S: i64 = 600;

/// The allocations Slurm's records place where the journal says the job was
/// not: the journal's attempts in one begin before it started or end after
/// it ended, by more than [`SLURM_SLACK_S`]. By allocation index, with why.
fn mismatched_allocations(
    attempts: &[Marks],
    allocs: &BTreeMap<u32, RecordedAllocation>,
) -> Vec<(u32, String)> {
    let slack = chrono::Duration::seconds(SLURM_SLACK_S);
    let fmt = |t: DateTime<Utc>| t.format("%Y-%m-%d %H:%M:%S").to_string();
    let mut out: Vec<(u32, String)> = Vec::new();
    for m in attempts {
        let index = m.allocation.unwrap_or(m.attempt);
        let Some(a) = allocs.get(&index) else {
            continue;
        };
        if out.iter().any(|(i, _)| *i == index) {
            continue;
        }
        let why = if m.start + slack < a.start {
            format!(
                "attempt {} began at {} before allocation {index} started at {}; job id reused?",
                m.attempt,
                fmt(m.start),
                fmt(a.start)
            )
        } else if let Some(e) = a.end.filter(|e| m.end > *e + slack) {
            format!(
                "attempt {} ran until {} after allocation {index} ended at {}; job id reused?",
                m.attempt,
                fmt(m.end),
                fmt(e)
            )
        } else {
            continue;
        };
        out.push((index, why));
    }
    out
}

/// One allocation of the job as Slurm recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedAllocation {
    pub start: DateTime<Utc>,
    /// `None` while it runs.
    pub end: Option<DateTime<Utc>>,
}

/// Slurm's record of the job's allocations, by index (Slurm's requeue
/// count: 0 for the first). `scontrol` knows only the current one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmTimes {
    /// `sacct` or `scontrol`.
    pub source: String,
    pub allocations: BTreeMap<u32, RecordedAllocation>,
}

/// One stretch of wall time in one bucket.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Segment {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub bucket: &'static str,
    /// The attempt it belongs to (`None`: between allocations).
    pub attempt: Option<u32>,
}

/// The result.
#[derive(Clone, Debug, Serialize)]
pub struct Accounting {
    pub start: Option<DateTime<Utc>>,
    pub end: Option<DateTime<Utc>>,
    pub wall_s: f64,
    pub productive_s: f64,
    /// Every bucket but `productive`, in seconds.
    pub lost_s: BTreeMap<String, f64>,
    /// Per attempt: every bucket including `productive`.
    pub by_attempt: BTreeMap<u32, BTreeMap<String, f64>>,
    pub segments: Vec<Segment>,
    /// Where the times came from: `journal`, or `sacct`/`scontrol` (allocation bounds) + journal.
    pub time_source: String,
}

/// A stretch of time a rank's journal could not be written.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JournalGap {
    pub rank: Option<u32>,
    pub node: Option<String>,
    pub attempt: u32,
    pub lost_records: u64,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Of it, the time counted as `unexplained`.
    pub unexplained_s: f64,
}

/// The journal gaps whose span is known (`from` and `to`: written by this
/// build and later), in time order, each with the time of it `segments`
/// count as unexplained.
pub fn journal_gaps(records: &[Record], segments: &[Segment]) -> Vec<JournalGap> {
    let mut out: Vec<JournalGap> = crate::journal::events(records)
        .filter_map(|(r, e)| match e {
            crate::event::Event::JournalGap(g) => {
                let (from, to) = (g.from?, g.to?);
                (from < to).then(|| JournalGap {
                    rank: r.rank,
                    node: r.node.clone(),
                    attempt: r.attempt,
                    lost_records: g.lost_records,
                    from,
                    to,
                    unexplained_s: segments
                        .iter()
                        .filter(|s| s.bucket == "unexplained")
                        .map(|s| ns(s.start.max(from), s.end.min(to)).max(0))
                        .sum::<i64>() as f64
                        / 1e9,
                })
            }
            _ => None,
        })
        .collect();
    out.sort_by_key(|g| g.from);
    out
}

/// The spans of the journal gaps, overlaps merged.
fn gap_spans(records: &[Record]) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    merged(
        journal_gaps(records, &[])
            .into_iter()
            .map(|g| (g.from, g.to)),
    )
}

/// Intervals sorted and overlaps merged.
fn merged(
    v: impl Iterator<Item = (DateTime<Utc>, DateTime<Utc>)>,
) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    let mut v: Vec<_> = v.collect();
    v.sort();
    let mut out: Vec<(DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    for (a, b) in v {
        match out.last_mut() {
            Some(l) if a <= l.1 => l.1 = l.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Nanoseconds from `a` to `b` (journal times carry nanoseconds: summing
/// truncated microseconds would not add up to the wall time exactly).
fn ns(a: DateTime<Utc>, b: DateTime<Utc>) -> i64 {
    (b - a).num_nanoseconds().unwrap_or(0)
}

/// The same for sums that must add up, whatever timestamps a damaged
/// journal holds: no overflow (a span of more than 292 years), and a
/// difference of nanoseconds since the epoch, so that spans end to end add
/// up exactly even across a leap second (`23:59:60`, which chrono's own
/// subtraction counts so that they do not).
fn ns_wide(a: DateTime<Utc>, b: DateTime<Utc>) -> i128 {
    let at = |t: DateTime<Utc>| {
        i128::from(t.timestamp()) * 1_000_000_000 + i128::from(t.timestamp_subsec_nanos())
    };
    at(b) - at(a)
}

/// Adds segments with a cursor that never goes back: every boundary is
/// clamped to the previous one, so segments are contiguous, and to the
/// wall time's end (a time a record names, such as a rank's `failed_at`,
/// can lie after the last record), so they tile the wall time.
struct Track {
    cursor: DateTime<Utc>,
    end: DateTime<Utc>,
    segments: Vec<Segment>,
    /// Blocking checkpoint intervals (carved out of productive and rework).
    checkpoints: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// Journal gaps (carved out of productive, rework and after the last
    /// step, into unexplained; before checkpoints).
    gaps: Vec<(DateTime<Utc>, DateTime<Utc>)>,
}

impl Track {
    fn to(&mut self, until: DateTime<Utc>, bucket: &'static str, attempt: Option<u32>) {
        let until = until.min(self.end);
        if until <= self.cursor {
            return;
        }
        let from = self.cursor;
        let overlapping = |v: &[(DateTime<Utc>, DateTime<Utc>)], on: bool| -> Vec<_> {
            v.iter()
                .filter(|(a, b)| on && *b > from && *a < until)
                .copied()
                .collect()
        };
        let checkpoints = overlapping(&self.checkpoints, matches!(bucket, "productive" | "rework"));
        let gaps = overlapping(
            &self.gaps,
            matches!(bucket, "productive" | "rework" | "after_last_step"),
        );
        // Cut at every boundary inside; each piece takes the first of: a
        // gap, a checkpoint, the bucket (push joins equal neighbours).
        let mut cuts: Vec<DateTime<Utc>> = vec![from, until];
        for (a, b) in checkpoints.iter().chain(&gaps) {
            cuts.extend([(*a).clamp(from, until), (*b).clamp(from, until)]);
        }
        cuts.sort();
        cuts.dedup();
        let within = |v: &[(DateTime<Utc>, DateTime<Utc>)], p: DateTime<Utc>, q: DateTime<Utc>| {
            v.iter().any(|(a, b)| *a <= p && q <= *b)
        };
        for w in cuts.windows(2) {
            let (p, q) = (w[0], w[1]);
            let piece = if within(&gaps, p, q) {
                "unexplained"
            } else if within(&checkpoints, p, q) {
                "checkpoint"
            } else {
                bucket
            };
            self.push(p, q, piece, attempt);
        }
        self.cursor = until;
    }

    fn push(
        &mut self,
        a: DateTime<Utc>,
        b: DateTime<Utc>,
        bucket: &'static str,
        attempt: Option<u32>,
    ) {
        if b <= a {
            return;
        }
        match self.segments.last_mut() {
            Some(l) if l.bucket == bucket && l.attempt == attempt && l.end == a => l.end = b,
            _ => self.segments.push(Segment {
                start: a,
                end: b,
                bucket,
                attempt,
            }),
        }
    }
}

/// Slurm's records of the job, less the allocations that contradict the
/// journal (a job id reused after a controller's state was reset names
/// somebody else's allocation), with a note saying which were set aside.
/// Used by the report and the timeline alike.
pub fn consistent_slurm_times(
    records: &[Record],
    slurm: &SlurmTimes,
) -> (SlurmTimes, Option<String>) {
    consistent(&attempt_marks(records), slurm)
}

fn consistent(attempts: &[Marks], slurm: &SlurmTimes) -> (SlurmTimes, Option<String>) {
    let mut kept = slurm.clone();
    let mut notes = Vec::new();
    for (index, why) in mismatched_allocations(attempts, &slurm.allocations) {
        kept.allocations.remove(&index);
        notes.push(why);
    }
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    (kept, note)
}

/// Account for a job from its merged records (any order).
pub fn account(records: &[Record], slurm: Option<&SlurmTimes>) -> Accounting {
    let attempts = attempt_marks(records);
    let no_allocs = BTreeMap::new();
    let checked = slurm.map(|s| consistent(&attempts, s));
    let slurm = checked.as_ref().map(|c| &c.0);
    let mismatch = checked.as_ref().and_then(|c| c.1.clone());
    let allocs = Allocs(slurm.map_or(&no_allocs, |s| &s.allocations));
    let time_source = time_source_of(slurm, mismatch.as_deref());
    let (Some(first), Some(last)) = (attempts.first(), attempts.last()) else {
        return Accounting {
            start: None,
            end: None,
            wall_s: 0.0,
            productive_s: 0.0,
            lost_s: BUCKETS[1..].iter().map(|b| (b.to_string(), 0.0)).collect(),
            by_attempt: BTreeMap::new(),
            segments: Vec::new(),
            time_source,
        };
    };
    // The first and last records of any attempt: a journal whose attempts
    // are not in time order (a clock stepped back, records written by hand)
    // still tiles from its first moment to its last.
    let earliest = attempts
        .iter()
        .map(|m| m.start)
        .min()
        .unwrap_or(first.start);
    let start = allocs.start(first).map_or(earliest, |s| s.min(earliest));
    let latest = attempts.iter().map(|m| m.end).max().unwrap_or(last.end);
    let end = allocs.end(last).map_or(latest, |e| e.max(latest));
    let mut t = Track {
        cursor: start,
        end,
        segments: Vec::new(),
        checkpoints: blocking_checkpoints(&attempts),
        gaps: gap_spans(records),
    };
    for (i, m) in attempts.iter().enumerate() {
        let next = attempts.get(i + 1);
        t.to(m.start, "startup", Some(m.attempt));
        match m.first_step() {
            None => never_stepped(&mut t, m),
            Some(first) => stepped(&mut t, m, first, next),
        }
        if let Some(n) = next {
            between(&mut t, m, n, &allocs);
        }
    }
    t.to(end, "after_last_step", Some(last.attempt));
    totals(t.segments, start, end, time_source)
}

/// Where the times came from, in words.
fn time_source_of(slurm: Option<&SlurmTimes>, mismatch: Option<&str>) -> String {
    match (slurm, mismatch) {
        (Some(s), None) if !s.allocations.is_empty() => {
            format!("{} (allocation start and end) and the journal", s.source)
        }
        (Some(s), Some(why)) if !s.allocations.is_empty() => format!(
            "{} (allocation start and end) and the journal; not used: {why}",
            s.source
        ),
        (_, Some(why)) => format!("journal (Slurm's records were not used: {why})"),
        _ => "journal".to_string(),
    }
}

/// Slurm's allocations, looked up by an attempt's allocation: recorded by
/// the batch-level supervisor, else Slurm's requeue count, which was the
/// attempt number.
struct Allocs<'a>(&'a BTreeMap<u32, RecordedAllocation>);

impl Allocs<'_> {
    fn of(&self, m: &Marks) -> Option<&RecordedAllocation> {
        self.0.get(&m.allocation.unwrap_or(m.attempt))
    }
    fn start(&self, m: &Marks) -> Option<DateTime<Utc>> {
        self.of(m).map(|a| a.start)
    }
    fn end(&self, m: &Marks) -> Option<DateTime<Utc>> {
        self.of(m).and_then(|a| a.end)
    }
}

/// The checkpoints that blocked training, overlaps merged (ranks confirm
/// the same checkpoint).
fn blocking_checkpoints(attempts: &[Marks]) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    merged(
        attempts
            .iter()
            .flat_map(|m| m.checkpoints.iter().filter(|c| c.3).map(|c| (c.1, c.2))),
    )
}

/// An attempt that never stepped: startup until the failure was acted on.
fn never_stepped(t: &mut Track, m: &Marks) {
    let a = Some(m.attempt);
    let stop = m.stall_declared.or(m.crashed_at).unwrap_or(m.end);
    t.to(stop, "startup", a);
    if let Some(acted) = m.acted_at.filter(|_| m.failed) {
        t.to(acted, "detection", a);
    }
    let tail = if !m.end_recorded {
        "unexplained"
    } else if m.failed {
        "teardown"
    } else {
        "after_last_step"
    };
    t.to(m.end, tail, a);
}

/// An attempt that stepped, its first step `(time, number)`.
fn stepped(
    t: &mut Track,
    m: &Marks,
    (first_at, first_no): (DateTime<Utc>, u64),
    next: Option<&Marks>,
) {
    let a = Some(m.attempt);
    let began = m
        .step_time_ns()
        .map_or(first_at, |st| first_at - chrono::Duration::nanoseconds(st));
    t.to(began, "startup", a);
    let last = m.last_progress().unwrap_or(first_at);
    // An attempt with no recorded end that was followed by
    // another was ended by something: judged like a failure.
    let failed = m.failed || (!m.end_recorded && next.is_some());
    if !failed {
        t.to(last, "productive", a);
        let tail = if m.end_recorded {
            "after_last_step"
        } else {
            "unexplained"
        };
        t.to(m.end, tail, a);
        return;
    }
    // The last step whose result survived.
    let saved = |upto: Option<u64>| {
        m.checkpoints
            .iter()
            .map(|c| c.0)
            .filter(|s| upto.is_none_or(|u| *s <= u))
            .max()
    };
    let survived = match next.and_then(|n| n.first_step()) {
        Some((_, resumed)) => saved(Some(resumed)).max(resumed.checked_sub(1)),
        None => saved(None),
    };
    let survived_at = survived
        .filter(|s| *s >= first_no)
        .and_then(|s| m.completed(s));
    if let Some(at) = survived_at {
        t.to(at.min(last), "productive", a);
    }
    // A hang begins at the last step; a crash when it happened.
    let hung =
        m.stall_declared.is_some() && m.crashed_at.is_none_or(|c| Some(c) >= m.stall_declared);
    if hung {
        t.to(last, "rework", a);
        let declared = m.stall_declared.expect("hung");
        t.to(declared, "stalled", a);
        t.to(m.acted_at.unwrap_or(declared), "detection", a);
    } else {
        let failed_at = m.crashed_at.unwrap_or(last).max(last);
        t.to(failed_at, "rework", a);
        if let Some(acted) = m.acted_at {
            t.to(acted, "detection", a);
        }
    }
    let tail = if m.end_recorded {
        "teardown"
    } else {
        "unexplained"
    };
    t.to(m.end, tail, a);
}

/// From attempt `m`'s end to `n`'s start: a restart in the same
/// allocation, or the queue.
fn between(t: &mut Track, m: &Marks, n: &Marks, allocs: &Allocs<'_>) {
    let same_allocation =
        m.relaunched || (!m.requeued && m.allocation.is_some() && m.allocation == n.allocation);
    if same_allocation {
        let gap = if m.end_recorded {
            "restart"
        } else {
            "unexplained"
        };
        t.to(n.start, gap, Some(n.attempt));
        return;
    }
    match (allocs.end(m), allocs.start(n)) {
        (Some(e), Some(s)) => {
            t.to(e, "restart", Some(m.attempt));
            t.to(s, "queue_wait", None);
        }
        // Without Slurm's times the gap is the queue's, with
        // Slurm's teardown and the batch script's start in it.
        _ => t.to(n.start, "queue_wait", None),
    }
}

/// The segments summed per bucket, and per attempt.
fn totals(
    segments: Vec<Segment>,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    time_source: String,
) -> Accounting {
    let mut total: BTreeMap<String, i128> = BUCKETS.iter().map(|b| (b.to_string(), 0)).collect();
    let mut by_attempt: BTreeMap<u32, BTreeMap<String, f64>> = BTreeMap::new();
    for s in &segments {
        let d = ns_wide(s.start, s.end);
        *total.entry(s.bucket.to_string()).or_default() += d;
        if let Some(a) = s.attempt {
            *by_attempt
                .entry(a)
                .or_default()
                .entry(s.bucket.to_string())
                .or_default() += d as f64 / 1e9;
        }
    }
    let wall_ns = ns_wide(start, end);
    debug_assert_eq!(
        total.values().sum::<i128>(),
        wall_ns,
        "segments tile the wall time"
    );
    let productive = total.remove("productive").unwrap_or(0);
    Accounting {
        start: Some(start),
        end: Some(end),
        wall_s: wall_ns as f64 / 1e9,
        productive_s: productive as f64 / 1e9,
        lost_s: total
            .into_iter()
            .map(|(k, v)| (k, v as f64 / 1e9))
            .collect(),
        by_attempt,
        segments,
        time_source,
    }
}

/// Slurm's times from `sacct -D` rows (one per allocation), in the local
/// time zone Slurm prints.
pub fn from_sacct(rows: &[crate::slurm::AcctRecord]) -> Option<SlurmTimes> {
    let mut allocations: Vec<RecordedAllocation> = rows
        .iter()
        .filter_map(|r| {
            Some(RecordedAllocation {
                start: slurm_time(&r.start)?,
                end: slurm_time(&r.end),
            })
        })
        .collect();
    allocations.sort_by_key(|a| a.start);
    (!allocations.is_empty()).then(|| SlurmTimes {
        source: "sacct".into(),
        allocations: (0..).zip(allocations).collect(),
    })
}

/// Slurm's times from `scontrol show job`: the current allocation only.
pub fn from_show_job(info: &crate::slurm::JobInfo) -> Option<SlurmTimes> {
    let start = slurm_time(&info.start_time)?;
    let mut allocations = BTreeMap::new();
    allocations.insert(
        info.restarts,
        RecordedAllocation {
            start,
            // A live job's EndTime is its time limit, a projection.
            end: slurm_time(&info.end_time)
                .filter(|e| *e >= start && *e <= Utc::now())
                .filter(|_| !still_running(&info.state)),
        },
    );
    Some(SlurmTimes {
        source: "scontrol".into(),
        allocations,
    })
}

/// A job state whose EndTime is not yet an end.
fn still_running(state: &str) -> bool {
    [
        "RUNNING",
        "PENDING",
        "SUSPENDED",
        "CONFIGURING",
        "REQUEUE",
        "RESIZING",
    ]
    .iter()
    .any(|s| state.starts_with(s))
}

/// Slurm's times for a job that ran under Slurm: `sacct -D` where
/// accounting exists, else `scontrol show job`; `None` for local jobs or
/// when neither answers.
pub fn slurm_times(job: &str, slurm: &dyn crate::slurm::Slurm) -> Option<SlurmTimes> {
    if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    slurm
        .accounting(job)
        .ok()
        .and_then(|rows| from_sacct(&rows))
        .or_else(|| slurm.show_job(job).ok().and_then(|i| from_show_job(&i)))
}

/// A time as Slurm prints it (`2026-11-22T07:25:21`, local time); `None`
/// for `Unknown`, `None`, or anything else.
pub fn slurm_time(text: &str) -> Option<DateTime<Utc>> {
    use chrono::TimeZone;
    let naive = chrono::NaiveDateTime::parse_from_str(text.trim(), "%Y-%m-%dT%H:%M:%S").ok()?;
    chrono::Local
        .from_local_datetime(&naive)
        .earliest()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// A record at `t` seconds after a fixed origin.
    fn rec(t: f64, attempt: u32, kind: &str, data: Value) -> Record {
        let origin: DateTime<Utc> = "2026-11-22T00:00:00Z".parse().unwrap();
        Record {
            v: 1,
            ts: origin + chrono::Duration::microseconds((t * 1e6) as i64),
            kind: kind.into(),
            attempt,
            rank: Some(0),
            node: Some("n1".into()),
            data: data.as_object().cloned().unwrap_or_default(),
            ..Default::default()
        }
    }

    fn steps(a: u32, from: u64, to: u64, t0: f64, dt: f64) -> Vec<Record> {
        (from..=to)
            .map(|s| {
                rec(
                    t0 + (s - from + 1) as f64 * dt,
                    a,
                    "progress",
                    json!({ "step": s }),
                )
            })
            .collect()
    }

    fn sum(acc: &Accounting) -> f64 {
        acc.productive_s + acc.lost_s.values().sum::<f64>()
    }

    /// A crash after a checkpoint, then a resumed run to the end, journaled
    /// as the agent does: progress sampled (the first step, every 10th, the
    /// last), and each rank's exit summing its progress up.
    fn sampled_crash_and_resume() -> Vec<Record> {
        let exit =
            |t: f64, a: u32, code: i64, run: f64, first: f64, last: f64, step: u64, n: u64| {
                rec(
                    t,
                    a,
                    "rank_exit",
                    json!({ "exit_code": code, "runtime_s": run, "first_step_s": first,
                        "last_progress_s": last, "last_step": step, "steps_seen": n }),
                )
            };
        let sample = |t: f64, a: u32, s: u64| rec(t, a, "progress", json!({ "step": s }));
        vec![
            rec(0.0, 0, "rank_start", json!({})),
            // Step s is done at 2 + s.
            sample(3.0, 0, 1),
            sample(13.0, 0, 11),
            rec(22.0, 0, "checkpoint_done", json!({ "step": 20 })),
            sample(23.0, 0, 21),
            sample(27.0, 0, 25),
            exit(28.0, 0, 1, 28.0, 3.0, 27.0, 25, 25),
            rec(28.0, 0, "failure", json!({ "failure_kind": "crash" })),
            rec(30.0, 1, "rank_start", json!({})),
            // Resumed after step 20: step s is done at 12 + s.
            sample(33.0, 1, 21),
            sample(43.0, 1, 31),
            sample(52.0, 1, 40),
            exit(53.0, 1, 0, 23.0, 3.0, 22.0, 40, 20),
        ]
    }

    #[test]
    fn attempts_out_of_time_order_still_tile_the_wall_time() {
        // Attempt 1 recorded an hour before attempt 0 (a clock stepped back,
        // a journal written by hand): no panic, and the buckets add up.
        let recs = vec![
            rec(3600.0, 0, "failure", json!({ "class": "infrastructure" })),
            rec(0.0, 1, "failure", json!({ "class": "infrastructure" })),
        ];
        let mut sorted = recs.clone();
        sorted.sort_by_key(|r| r.ts);
        let a = account(&sorted, None);
        let sum: f64 = a.productive_s + a.lost_s.values().sum::<f64>();
        assert!((sum - a.wall_s).abs() < 1e-6, "{a:?}");
        assert!((a.wall_s - 3600.0).abs() < 1e-6, "{a:?}");
    }

    #[test]
    fn times_named_after_the_last_record_still_tile_the_wall_time() {
        // Found by fuzzing (fuzz/corpus/journal/regress-failed-at-after-end):
        // a rank's exit naming a failure hours after the record itself.
        let (one, _) = crate::journal::parse_file(
            br#"{"v":1,"ts":"2026-1-2T1:9:2Z","kind":"rank_exit","attempt":0,"exit_code":3,"failed_at":"2026-1-2T8:0:2Z"}"#,
        );
        let a = account(&one, None);
        assert_eq!(a.wall_s, 0.0, "{a:?}");
        assert_eq!(sum(&a), 0.0, "{a:?}");
        // Records centuries apart (more nanoseconds than an i64 holds).
        let mut far = rec(0.0, 0, "rank_start", json!({}));
        far.ts = "2398-11-23T18:09:20Z".parse().unwrap();
        let recs = vec![rec(0.0, 0, "rank_start", json!({})), far];
        let a = account(&recs, None);
        assert!(a.wall_s > 372.0 * 365.0 * 86400.0, "{a:?}");
        assert!((sum(&a) - a.wall_s).abs() < 1.0, "{a:?}");
        // A leap second (fuzz/corpus/journal/regress-leap-second).
        let (recs, _) = crate::journal::parse_file(
            br#"{"v":1,"ts":"22-1-2T1:0:2Z","kind":"rank_exit","attempt":0,"exit_code":1}
{"v":1,"ts":"2-1-3T8:1:8Z","kind":"","attempt":0}
{"v":1,"ts":"26-1-3T1:0:60Z","kind":"","attempt":0}"#,
        );
        let mut recs = recs;
        recs.sort_by_key(|r| r.ts);
        let a = account(&recs, None);
        assert!((sum(&a) - a.wall_s).abs() < 1e-6, "{a:?}");
    }

    #[test]
    fn losing_any_progress_sample_leaves_the_accounting_as_it_was() {
        let full = sampled_crash_and_resume();
        let whole = account(&full, None);
        // Steps 1..20 survived (1 s each, from 2.0 to 22.0), and 21..40
        // again; 21..25 and the time to the crash at 28.0 were lost.
        assert!((whole.productive_s - 40.0).abs() < 1e-6, "{whole:#?}");
        assert!((whole.lost_s["rework"] - 6.0).abs() < 1e-6, "{whole:#?}");
        for (i, r) in full.iter().enumerate() {
            if r.kind != "progress" {
                continue;
            }
            let mut less = full.clone();
            less.remove(i);
            let acc = account(&less, None);
            assert!(
                (acc.wall_s - whole.wall_s).abs() < 1e-9,
                "without {r:?}: {acc:#?}"
            );
            for (bucket, v) in &whole.lost_s {
                assert!(
                    (acc.lost_s[bucket] - v).abs() < 1e-3,
                    "without step {:?}: {bucket} {} != {v}",
                    r.u64("step"),
                    acc.lost_s[bucket]
                );
            }
            assert!((acc.productive_s - whole.productive_s).abs() < 1e-3);
        }
        // A lost checkpoint record: the resumed step still says what survived.
        let mut less = full.clone();
        less.retain(|r| r.kind != "checkpoint_done");
        let acc = account(&less, None);
        assert!(
            (acc.productive_s - whole.productive_s).abs() < 1e-3,
            "{acc:#?}"
        );
    }

    #[test]
    fn a_clean_run_is_startup_productive_and_shutdown() {
        let mut r = vec![rec(0.0, 0, "rank_start", json!({}))];
        r.extend(steps(0, 1, 10, 2.0, 1.0)); // step 1 done at 3.0, step 10 at 12.0
        r.push(rec(
            13.0,
            0,
            "rank_exit",
            json!({ "exit_code": 0, "class": "clean" }),
        ));
        let acc = account(&r, None);
        assert!((acc.wall_s - 13.0).abs() < 1e-9);
        // Step 1 began at 2.0 (done at 3.0, 1 s per step): 10 s productive.
        assert!((acc.productive_s - 10.0).abs() < 1e-6, "{acc:#?}");
        assert!((acc.lost_s["startup"] - 2.0).abs() < 1e-6);
        assert!((acc.lost_s["after_last_step"] - 1.0).abs() < 1e-6);
        assert!((sum(&acc) - acc.wall_s).abs() < 1e-9);
    }

    #[test]
    fn a_verdict_written_at_the_next_start_judges_the_attempt_it_is_about() {
        // Attempt 0 dies with its node (no end recorded); attempt 1's start
        // reconciles with Slurm and journals the failure and decision about
        // attempt 0, then runs cleanly from step 1.
        let mut r = vec![rec(0.0, 0, "rank_start", json!({}))];
        r.extend(steps(0, 1, 5, 1.0, 1.0)); // step 5 done at 6
        r.push(rec(20.0, 1, "job_start", json!({})));
        r.push(rec(
            20.1,
            1,
            "failure",
            json!({ "about_attempt": 0, "class": "infrastructure", "cause": "node failure" }),
        ));
        r.push(rec(
            20.2,
            1,
            "decision",
            json!({ "about_attempt": 0, "decision": { "action": "requeue" } }),
        ));
        r.push(rec(20.5, 1, "rank_start", json!({})));
        r.extend(steps(1, 1, 5, 21.0, 1.0)); // step 5 done at 26
        r.push(rec(
            27.0,
            1,
            "rank_exit",
            json!({ "exit_code": 0, "class": "clean" }),
        ));
        let acc = account(&r, None);
        let a0 = &acc.by_attempt[&0];
        let a1 = &acc.by_attempt[&1];
        // Attempt 0 saved nothing: its steps are rework, not productive.
        assert_eq!(
            a0.get("productive").copied().unwrap_or(0.0),
            0.0,
            "{acc:#?}"
        );
        assert!((a0["rework"] - 5.0).abs() < 1e-6, "{acc:#?}");
        // Attempt 1 is a clean run: five productive seconds, no rework.
        assert!((a1["productive"] - 5.0).abs() < 1e-6, "{acc:#?}");
        assert_eq!(a1.get("rework").copied().unwrap_or(0.0), 0.0, "{acc:#?}");
        assert!((sum(&acc) - acc.wall_s).abs() < 1e-9);
    }

    #[test]
    fn a_requeue_slurm_refused_does_not_end_the_attempt() {
        // The node history asked for a requeue at start; Slurm refused it and
        // the run went ahead in the same attempt.
        let mut r = vec![
            rec(0.0, 0, "job_start", json!({})),
            rec(
                0.1,
                0,
                "decision",
                json!({ "decision": { "action": "requeue" }, "outcome": { "class": "clean" } }),
            ),
            rec(0.2, 0, "requeue", json!({ "by": "node_history" })),
            rec(
                0.3,
                0,
                "requeue_failed",
                json!({ "error": "not permitted" }),
            ),
            rec(0.5, 0, "rank_start", json!({})),
        ];
        r.extend(steps(0, 1, 10, 1.0, 1.0));
        r.push(rec(
            12.0,
            0,
            "rank_exit",
            json!({ "exit_code": 0, "class": "clean" }),
        ));
        let acc = account(&r, None);
        assert!((acc.productive_s - 10.0).abs() < 1e-6, "{acc:#?}");
        assert_eq!(acc.lost_s["rework"], 0.0);
        assert_eq!(acc.lost_s["teardown"], 0.0);
    }

    #[test]
    fn a_crash_loses_the_steps_after_the_checkpoint_and_a_requeue_waits_in_the_queue() {
        // Attempt 0 (allocation 0): steps 1..8 at 1 s, checkpoint of step 5
        // (save 5.0..5.5 s after... blocking 0.5 s), crash at 10.5, teardown
        // order at 10.7, end at 11.0. Allocation 0 ends at 12, allocation 1
        // starts at 20; attempt 1 resumes at step 6 and finishes at step 10.
        let mut r = vec![
            rec(0.5, 0, "job_start", json!({ "allocation": 0 })),
            rec(1.0, 0, "rank_start", json!({})),
        ];
        r.extend(steps(0, 1, 8, 1.0, 1.0)); // step s done at 1+s
        r.push(rec(
            6.5,
            0,
            "checkpoint_done",
            json!({ "step": 5, "duration_s": 0.5, "blocked_training": true }),
        ));
        r.push(rec(
            10.8,
            0,
            "rank_exit",
            json!({ "exit_code": 137, "class": "infrastructure", "failed_at": "2026-11-22T00:00:10.500Z" }),
        ));
        r.push(rec(10.7, 0, "teardown", json!({})));
        r.push(rec(11.0, 0, "requeue", json!({})));
        r.push(rec(21.0, 1, "job_start", json!({ "allocation": 1 })));
        r.push(rec(21.0, 1, "rank_start", json!({})));
        r.extend(steps(1, 6, 10, 22.0, 1.0)); // step 6 done at 23, 10 at 27
        r.push(rec(
            27.5,
            1,
            "rank_exit",
            json!({ "exit_code": 0, "class": "clean" }),
        ));
        r.push(rec(27.6, 1, "job_end", json!({ "exit_code": 0 })));
        let slurm = SlurmTimes {
            source: "sacct".into(),
            allocations: [
                RecordedAllocation {
                    start: "2026-11-22T00:00:00Z".parse().unwrap(),
                    end: Some("2026-11-22T00:00:12Z".parse().unwrap()),
                },
                RecordedAllocation {
                    start: "2026-11-22T00:00:20Z".parse().unwrap(),
                    end: Some("2026-11-22T00:00:28Z".parse().unwrap()),
                },
            ]
            .into_iter()
            .enumerate()
            .map(|(i, a)| (i as u32, a))
            .collect(),
        };
        let acc = account(&r, Some(&slurm));
        let b = |k: &str| acc.lost_s[k];
        assert!((acc.wall_s - 28.0).abs() < 1e-9);
        // Attempt 0: step 1 began at 1.0; step 5 done at 6.0 (the save began
        // then): 5 s survived, the save blocked 0.5 s; steps 6..8 and the
        // crash until 10.5 are rework (4.0 s).
        // Attempt 1: step 6 began at 22.0, step 10 done at 27.0: 5 s.
        assert!(
            (acc.productive_s - 10.0).abs() < 1e-6,
            "{:#?}",
            acc.segments
        );
        assert!((b("checkpoint") - 0.5).abs() < 1e-6);
        assert!((b("rework") - 4.0).abs() < 1e-6, "{:#?}", acc.segments);
        assert!((b("detection") - 0.2).abs() < 1e-6);
        assert!((b("teardown") - 0.3).abs() < 1e-6);
        assert!((b("restart") - 1.0).abs() < 1e-6); // 11.0 .. allocation end 12.0
        assert!((b("queue_wait") - 8.0).abs() < 1e-6);
        // 0..1 before attempt 0, 20..22 before attempt 1.
        assert!((b("startup") - 3.0).abs() < 1e-6);
        assert!((b("after_last_step") - 1.0).abs() < 1e-6);
        assert_eq!(b("unexplained"), 0.0);
        assert!((sum(&acc) - acc.wall_s).abs() < 1e-9);
        assert_eq!(
            acc.time_source,
            "sacct (allocation start and end) and the journal"
        );
    }

    #[test]
    fn a_hang_is_stalled_until_declared_and_a_relaunch_restarts_in_place() {
        let mut r = vec![rec(0.0, 0, "rank_start", json!({}))];
        r.extend(steps(0, 1, 4, 0.0, 1.0)); // last step at 4.0
        r.push(rec(10.0, 0, "stall", json!({ "last_step": 4 })));
        r.push(rec(12.0, 0, "teardown", json!({})));
        r.push(rec(
            13.0,
            0,
            "rank_exit",
            json!({ "exit_code": 124, "class": "hang" }),
        ));
        r.push(rec(13.0, 0, "restart", json!({ "next_attempt": 1 })));
        r.push(rec(13.5, 1, "rank_start", json!({})));
        r.extend(steps(1, 1, 3, 14.0, 1.0)); // no checkpoint: restarted from step 1
        r.push(rec(
            17.5,
            1,
            "rank_exit",
            json!({ "exit_code": 0, "class": "clean" }),
        ));
        let acc = account(&r, None);
        let b = |k: &str| acc.lost_s[k];
        // Nothing of attempt 0 survived: all of its steps are rework.
        assert!((b("rework") - 4.0).abs() < 1e-6, "{:#?}", acc.segments);
        assert!((b("stalled") - 6.0).abs() < 1e-6);
        assert!((b("detection") - 2.0).abs() < 1e-6);
        assert!((b("teardown") - 1.0).abs() < 1e-6);
        assert!((b("restart") - 0.5).abs() < 1e-6, "{:#?}", acc.segments);
        assert!((acc.productive_s - 3.0).abs() < 1e-6);
        assert_eq!(b("queue_wait"), 0.0);
        assert!((sum(&acc) - acc.wall_s).abs() < 1e-9);
    }

    #[test]
    fn a_journal_gap_is_unexplained_not_productive_nor_after_the_last_step() {
        // Steps 1..20, one a second; the journal lost what was written from
        // 5.5 to 12.5, and again from 19.5 past the last step to 23.0.
        let base = || {
            let mut r = vec![rec(0.0, 0, "rank_start", json!({}))];
            r.extend(steps(0, 1, 20, 0.0, 1.0));
            r.push(rec(
                24.0,
                0,
                "rank_exit",
                json!({ "exit_code": 0, "class": "clean" }),
            ));
            r
        };
        let without = account(&base(), None);
        let origin: DateTime<Utc> = "2026-11-22T00:00:00Z".parse().unwrap();
        let at = |t: f64| origin + chrono::Duration::milliseconds((t * 1e3) as i64);
        let gap = |from: f64, to: f64, lost: u64| {
            rec(
                to,
                0,
                "journal_gap",
                json!({ "lost_records": lost, "from": at(from), "to": at(to) }),
            )
        };
        let mut r = base();
        r.push(gap(5.5, 12.5, 7));
        r.push(gap(19.5, 23.0, 2));
        // A gap of an earlier build (no span) changes nothing.
        r.push(rec(2.0, 0, "journal_gap", json!({ "lost_records": 3 })));
        let acc = account(&r, None);
        assert!((acc.wall_s - without.wall_s).abs() < 1e-9);
        assert!((sum(&acc) - acc.wall_s).abs() < 1e-9);
        assert!(
            (without.productive_s - acc.productive_s - 7.5).abs() < 1e-6,
            "{:#?}",
            acc.segments
        );
        assert!(
            (without.lost_s["after_last_step"] - acc.lost_s["after_last_step"] - 3.0).abs() < 1e-6,
            "{:#?}",
            acc.segments
        );
        assert!((acc.lost_s["unexplained"] - 10.5).abs() < 1e-6);
        let gaps = journal_gaps(&r, &acc.segments);
        assert_eq!(gaps.len(), 2);
        assert_eq!((gaps[0].lost_records, gaps[0].rank), (7, Some(0)));
        assert!((gaps[0].unexplained_s - 7.0).abs() < 1e-6);
        assert!((gaps[1].unexplained_s - 3.5).abs() < 1e-6);
    }

    #[test]
    fn a_killed_supervisor_leaves_unexplained_time() {
        let mut r = vec![rec(0.0, 0, "rank_start", json!({}))];
        r.extend(steps(0, 1, 4, 0.0, 1.0));
        r.push(rec(6.0, 0, "probe", json!({})));
        r.push(rec(8.0, 1, "rank_start", json!({})));
        r.extend(steps(1, 5, 6, 8.0, 1.0));
        r.push(rec(
            10.5,
            1,
            "rank_exit",
            json!({ "exit_code": 0, "class": "clean" }),
        ));
        let acc = account(&r, None);
        // Attempt 0 has no end: 4.0..6.0 is unexplained; with nothing
        // recorded about a relaunch, the gap to attempt 1 is taken for a
        // requeue's (Slurm requeued the job after a node failure).
        assert!(
            (acc.lost_s["unexplained"] - 2.0).abs() < 1e-6,
            "{:#?}",
            acc.segments
        );
        assert!((acc.lost_s["queue_wait"] - 2.0).abs() < 1e-6);
        assert!((sum(&acc) - acc.wall_s).abs() < 1e-9);
    }

    #[test]
    fn an_attempt_killed_before_its_first_step_leaves_unexplained_time() {
        // Attempt 0 hangs in startup: declared at 5.0, diagnostics until
        // 7.0, then its supervisor is killed (no exit, no end recorded).
        let mut r = vec![
            rec(0.0, 0, "rank_start", json!({})),
            rec(5.0, 0, "stall", json!({})),
            rec(7.0, 0, "probe", json!({})),
            rec(9.0, 1, "rank_start", json!({})),
        ];
        r.extend(steps(1, 1, 3, 9.0, 1.0));
        r.push(rec(
            12.5,
            1,
            "rank_exit",
            json!({ "exit_code": 0, "class": "clean" }),
        ));
        let acc = account(&r, None);
        let b = |k: &str| acc.lost_s[k];
        assert!((b("startup") - 5.0).abs() < 1e-6, "{:#?}", acc.segments);
        assert!((b("unexplained") - 2.0).abs() < 1e-6, "{:#?}", acc.segments);
        // Nothing recorded about a relaunch: the gap is taken for a requeue's.
        assert!((b("queue_wait") - 2.0).abs() < 1e-6);
        assert_eq!(b("teardown"), 0.0);
        assert!((acc.productive_s - 3.0).abs() < 1e-6);
        assert!((sum(&acc) - acc.wall_s).abs() < 1e-9);
    }

    #[test]
    fn slurm_records_of_a_reused_job_id_are_not_used() {
        let mut r = vec![rec(0.0, 0, "rank_start", json!({}))];
        r.extend(steps(0, 1, 4, 0.0, 1.0));
        r.push(rec(
            4.5,
            0,
            "rank_exit",
            json!({ "exit_code": 0, "class": "clean" }),
        ));
        // The allocation Slurm now has under this id began two hours later.
        let later = SlurmTimes {
            source: "sacct".into(),
            allocations: [(
                0,
                RecordedAllocation {
                    start: "2026-11-22T02:00:00Z".parse().unwrap(),
                    end: Some("2026-11-22T02:00:30Z".parse().unwrap()),
                },
            )]
            .into_iter()
            .collect(),
        };
        let acc = account(&r, Some(&later));
        assert!((acc.wall_s - 4.5).abs() < 1e-6, "{}", acc.wall_s);
        assert!(
            acc.time_source.contains("job id reused"),
            "{}",
            acc.time_source
        );
        // An allocation that holds the journal (within the slack) is used.
        let own = SlurmTimes {
            source: "sacct".into(),
            allocations: [(
                0,
                RecordedAllocation {
                    start: "2026-11-21T23:59:59Z".parse().unwrap(),
                    end: Some("2026-11-22T00:00:06Z".parse().unwrap()),
                },
            )]
            .into_iter()
            .collect(),
        };
        let acc = account(&r, Some(&own));
        assert!((acc.wall_s - 7.0).abs() < 1e-6, "{}", acc.wall_s);
        assert!(acc.time_source.starts_with("sacct"), "{}", acc.time_source);
        // Judged allocation by allocation: the one that holds the journal is
        // kept, the one that does not is set aside (the timeline uses the same).
        let mixed = SlurmTimes {
            source: "sacct".into(),
            allocations: [
                (0, own.allocations[&0].clone()),
                (1, later.allocations[&0].clone()),
            ]
            .into_iter()
            .collect(),
        };
        let mut r2 = r.clone();
        r2.push(rec(5.0, 1, "rank_start", json!({})));
        r2.push(rec(
            5.5,
            1,
            "rank_exit",
            json!({ "exit_code": 0, "class": "clean" }),
        ));
        let (kept, note) = consistent_slurm_times(&r2, &mixed);
        assert_eq!(kept.allocations.keys().copied().collect::<Vec<_>>(), [0]);
        assert!(note.unwrap().contains("allocation 1"));
    }

    #[test]
    fn a_running_jobs_projected_end_is_not_its_end() {
        let fmt = |t: DateTime<Utc>| {
            t.with_timezone(&chrono::Local)
                .format("%Y-%m-%dT%H:%M:%S")
                .to_string()
        };
        let now = Utc::now();
        let mut info = crate::slurm::JobInfo {
            state: "RUNNING".into(),
            start_time: fmt(now - chrono::Duration::seconds(60)),
            end_time: fmt(now + chrono::Duration::seconds(3600)),
            ..Default::default()
        };
        let t = from_show_job(&info).unwrap();
        assert_eq!(t.allocations[&0].end, None);
        // Even a past EndTime is not an end while the job runs.
        info.end_time = fmt(now - chrono::Duration::seconds(10));
        assert_eq!(from_show_job(&info).unwrap().allocations[&0].end, None);
        info.state = "COMPLETED".into();
        assert!(from_show_job(&info).unwrap().allocations[&0].end.is_some());
    }

    #[test]
    fn slurm_times_parse_in_local_time() {
        assert!(slurm_time("Unknown").is_none());
        assert!(slurm_time("None").is_none());
        let t = slurm_time("2026-11-22T07:25:21").unwrap();
        assert_eq!(
            t.with_timezone(&chrono::Local)
                .format("%H:%M:%S")
                .to_string(),
            "07:25:21"
        );
    }
}
