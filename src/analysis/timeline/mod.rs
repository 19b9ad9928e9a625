//! `resilio timeline`: one line per event that matters, grouped by attempt,
//! with time relative to the job's start and absolute UTC time, read from
//! the journal alone (plus Slurm's allocation times when known).

mod describe;

use describe::{describe, num};

use super::report::secs;
use crate::event::Event;
use crate::journal::Record;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

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
    let queued = queued_of(records, slurm);
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
        write_attempt(&mut s, t0, attempt, &recs, queued.get(&attempt));
    }
    s
}

/// Slurm's own view of each allocation's end and the next one's start
/// (the queue wait), by the attempt it is shown before.
fn queued_of(
    records: &[Record],
    slurm: Option<&crate::analysis::accounting::SlurmTimes>,
) -> BTreeMap<u32, Vec<(DateTime<Utc>, String)>> {
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
    queued
}

/// One attempt's lines: Slurm's queue wait before it, then its records.
fn write_attempt(
    s: &mut String,
    t0: DateTime<Utc>,
    attempt: u32,
    recs: &[&Record],
    queued: Option<&Vec<(DateTime<Utc>, String)>>,
) {
    let _ = writeln!(s, "attempt {attempt}:");
    for (at, text) in queued.into_iter().flatten() {
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
    for r in recs {
        if r.kind == "progress" {
            last_progress.insert(r.rank, r);
        }
    }
    for r in recs {
        let event = r.event();
        let text = match event {
            Some(Event::Progress(p))
                if p.first.is_none()
                    && last_progress
                        .get(&r.rank)
                        .is_some_and(|l| std::ptr::eq(*l, *r)) =>
            {
                Some(format!("last recorded step {}", num(p.step)))
            }
            _ => describe(r, event),
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
