//! Each node's score: its events weighed and decayed with time.

use super::hang::UNCONFIRMED;
use super::{weight, NodeEvent, NodeHistory, HANG, HANG_UNCONFIRMED};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// A hang of unknown cause is held against its node (as `hang`, 0.5) once
/// the node is implicated in two different jobs: by such hangs, or by a
/// failure held against it (a straggler is not a failure, and a NODE_FAIL
/// Slurm shared among several nodes does not name this one). One job's
/// hangs alone are more likely that job's own.
fn corroborate(events: &mut [NodeEvent]) {
    let implicating: Vec<String> = events
        .iter()
        .filter(|e| {
            e.class == HANG_UNCONFIRMED || (e.counts && e.class != "straggler" && e.share >= 1.0)
        })
        .map(|e| e.job.clone())
        .collect();
    for e in events.iter_mut().filter(|e| e.class == HANG_UNCONFIRMED) {
        if let Some(other) = implicating.iter().find(|j| **j != e.job) {
            let cause = e.reason.strip_suffix(UNCONFIRMED).unwrap_or(&e.reason);
            e.reason = format!("{cause}; the node is implicated in job {other} too");
            e.class = HANG.to_string();
            e.counts = true;
        }
    }
}

/// Score and summarise events per node.
pub fn from_events(
    by_node: BTreeMap<String, Vec<NodeEvent>>,
    now: DateTime<Utc>,
    half_life: std::time::Duration,
) -> Vec<NodeHistory> {
    let hl = half_life.as_secs_f64().max(1.0);
    let mut out: Vec<NodeHistory> = by_node
        .into_iter()
        .map(|(node, mut events)| {
            events.sort_by_key(|e| e.ts);
            corroborate(&mut events);
            let score = events
                .iter()
                .filter(|e| e.counts)
                .map(|e| {
                    let age = ((now - e.ts).num_milliseconds() as f64 / 1000.0).max(0.0);
                    weight(&e.class) * e.share * 0.5f64.powf(age / hl)
                })
                // (+ 0.0: an empty sum of f64 is -0.0, printed `-0.00`.)
                .sum::<f64>()
                + 0.0;
            let mut failures_by_class = BTreeMap::new();
            let mut jobs: Vec<String> = Vec::new();
            for e in &events {
                *failures_by_class.entry(e.class.clone()).or_insert(0) += 1;
                if e.counts && !jobs.contains(&e.job) {
                    jobs.push(e.job.clone());
                }
            }
            let mut owners: Vec<&str> = events
                .iter()
                .filter(|e| e.counts)
                .map(|e| e.owner.as_str())
                .collect();
            owners.sort_unstable();
            owners.dedup();
            let listable = owners.len() >= 2 || events.iter().any(|e| e.counts && e.trusted);
            NodeHistory {
                node,
                score,
                failures_by_class,
                jobs,
                last_seen: events.last().map(|e| e.ts).unwrap_or(now),
                listable,
                events,
            }
        })
        .collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.node.cmp(&b.node)));
    out
}
