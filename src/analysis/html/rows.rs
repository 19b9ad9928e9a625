//! The rows of the page and what is painted on them: each rank's (or
//! node's) states, attempt by attempt.

use super::MAX_RANK_ROWS;
use crate::analysis::report::JobReport;
use crate::event::Event;
use crate::journal::Record;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// From, to.
pub(super) type Interval = (DateTime<Utc>, DateTime<Utc>);

/// One painted stretch of a row.
pub(super) struct Span {
    pub(super) start: DateTime<Utc>,
    pub(super) end: DateTime<Utc>,
    pub(super) state: &'static str,
    pub(super) attempt: u32,
}

/// Which row a record belongs to.
pub(super) fn row_of(r: &Record, by_node: bool) -> Option<String> {
    if by_node {
        r.node.clone()
    } else {
        r.rank.map(|n| format!("rank {n}"))
    }
}

/// The spans of one rank in one attempt, from its own records.
/// A rank's states in one attempt. `others_from`: when another rank of the
/// attempt first made progress; a rank that never printed a step after it
/// (it prints nothing: rank 0 alone logs) is drawn `silent`, not `startup`.
fn rank_spans(recs: &[&Record], attempt: u32, others_from: Option<DateTime<Utc>>) -> Vec<Span> {
    let mut out = Vec::new();
    let Some(start) = recs
        .iter()
        .find(|r| r.kind == "rank_start")
        .map(|r| r.ts)
        .or_else(|| recs.iter().map(|r| r.ts).min())
    else {
        return out;
    };
    let end = recs
        .iter()
        .find(|r| r.kind == "rank_exit")
        .map(|r| r.ts)
        .unwrap_or_else(|| recs.iter().map(|r| r.ts).max().unwrap_or(start));
    let progress: Vec<DateTime<Utc>> = recs
        .iter()
        .filter(|r| r.kind == "progress")
        .map(|r| r.ts)
        .collect();
    let stall = recs.iter().find(|r| r.kind == "stall");
    let last = stall
        .and_then(|s| match s.event() {
            Some(Event::Stall(x)) => x.last_progress,
            _ => None,
        })
        .into_iter()
        .chain(progress.iter().copied())
        .max();
    let mut span = |a: DateTime<Utc>, b: DateTime<Utc>, state: &'static str| {
        if b > a {
            out.push(Span {
                start: a,
                end: b,
                state,
                attempt,
            });
        }
    };
    match (progress.iter().min(), last) {
        (Some(&first), Some(last)) => {
            span(start, first, "startup");
            span(first, last.max(first), "progressing");
            if stall.is_some() {
                span(last.max(first), end, "stalled");
            } else {
                span(last.max(first), end, "progressing");
            }
        }
        _ if stall.is_some() => span(start, end, "stalled"),
        _ => match others_from {
            Some(from) if from < end => {
                span(start, from.max(start), "startup");
                span(from.max(start), end, "silent");
            }
            _ => span(start, end, "startup"),
        },
    }
    for c in recs.iter() {
        let Some(Event::CheckpointDone(done)) = c.event() else {
            continue;
        };
        let d = done.duration_s.unwrap_or(0.0).max(0.0);
        let a = c.ts - chrono::Duration::microseconds((d * 1e6) as i64);
        span(a.max(start), c.ts, "checkpointing");
    }
    out
}

/// The rows, in order: ranks by number, or nodes by name (more than
/// [`MAX_RANK_ROWS`] ranks, or none); and whether they are nodes.
pub(super) fn rows_of(records: &[Record]) -> (bool, Vec<String>) {
    let ranks: std::collections::BTreeSet<u32> = records.iter().filter_map(|r| r.rank).collect();
    let by_node = ranks.len() > MAX_RANK_ROWS || ranks.is_empty();
    let mut rows: Vec<String> = if by_node {
        let mut v: Vec<String> = records.iter().filter_map(|r| r.node.clone()).collect();
        v.sort();
        v.dedup();
        v
    } else {
        ranks.iter().map(|r| format!("rank {r}")).collect()
    };
    rows.retain(|r| !r.is_empty());
    (by_node, rows)
}

/// Spans per row: each rank's (or each node's ranks') states per attempt,
/// and its time down between attempts.
pub(super) fn spans_of(
    records: &[Record],
    by_node: bool,
    report: &JobReport,
    t1: DateTime<Utc>,
) -> BTreeMap<String, Vec<Span>> {
    let mut per: BTreeMap<(String, Option<u32>, u32), Vec<&Record>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.rank.is_some()) {
        if let Some(row) = row_of(r, by_node) {
            per.entry((row, r.rank, r.attempt)).or_default().push(r);
        }
    }
    // When each attempt first made progress (any rank).
    let mut progressed: BTreeMap<u32, DateTime<Utc>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.kind == "progress") {
        let e = progressed.entry(r.attempt).or_insert(r.ts);
        *e = (*e).min(r.ts);
    }
    let mut spans: BTreeMap<String, Vec<Span>> = BTreeMap::new();
    for ((row, _, attempt), recs) in &per {
        spans.entry(row.clone()).or_default().extend(rank_spans(
            recs,
            *attempt,
            progressed.get(attempt).copied(),
        ));
    }
    // Down: a row between the end of its last span in one attempt and its
    // first in the next (or the job's end, when it never came back).
    for list in spans.values_mut() {
        list.sort_by_key(|s| s.start);
        let mut ends: BTreeMap<u32, Interval> = BTreeMap::new();
        for s in list.iter() {
            let e = ends.entry(s.attempt).or_insert((s.start, s.end));
            e.0 = e.0.min(s.start);
            e.1 = e.1.max(s.end);
        }
        let v: Vec<(u32, Interval)> = ends.into_iter().collect();
        for (i, (a, (_, end))) in v.iter().enumerate() {
            let until = v.get(i + 1).map_or(t1, |n| n.1 .0);
            let last_attempt = report.attempts.last().map(|x| x.attempt);
            if i + 1 < v.len() || Some(*a) != last_attempt {
                list.push(Span {
                    start: *end,
                    end: until,
                    state: "down",
                    attempt: *a,
                });
            }
        }
    }
    spans
}
