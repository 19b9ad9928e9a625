//! The failure rate of nodes across the other jobs, for the checkpoint
//! interval advice.

use super::events_of;
use crate::journal::{self, Record};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The failure rate of nodes across the other jobs under the state dir:
/// failures held against nodes, over node-seconds those jobs ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FleetRate {
    pub failures: f64,
    pub node_seconds: f64,
    /// Runs counted (a job id used more than once counts each run).
    pub jobs: usize,
}

/// [`FleetRate`] from every job but `except` whose journal was written
/// within `window` of `now`, of the user asking (or root): another user's
/// journals, anyone's to write, never change a user's own figures or the
/// checkpoint interval advised to their jobs.
pub fn fleet_rate(
    state_dir: &Path,
    except: &str,
    now: DateTime<Utc>,
    window: std::time::Duration,
) -> FleetRate {
    let mut rate = FleetRate::default();
    let since = std::time::SystemTime::now()
        .checked_sub(window)
        .unwrap_or(std::time::UNIX_EPOCH);
    let caller = nix::unistd::geteuid().as_raw();
    let own_roots = crate::state_dir::readable_roots(state_dir)
        .into_iter()
        .filter(|r| {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(r).is_ok_and(|m| m.uid() == caller || m.uid() == 0)
        });
    let own_jobs = own_roots.flat_map(|root| {
        journal::list_jobs(&root)
            .into_iter()
            .map(move |(job, t)| (root.clone(), job, t))
    });
    for (root, job, modified) in own_jobs {
        if job == except || modified < since {
            continue;
        }
        let Ok(j) = journal::read_job(&journal::job_dir(&root, &job)) else {
            continue;
        };
        // Each run of a job id used more than once on its own: the time
        // between runs is nobody's exposure.
        for run in crate::runs::split(j.records) {
            let records = run.records;
            let (Some(a), Some(b)) = (
                records.iter().map(|r| r.ts).min(),
                records.iter().map(|r| r.ts).max(),
            ) else {
                continue;
            };
            let mut nodes: Vec<&str> = records
                .iter()
                .filter(|r| r.rank.is_some())
                .filter_map(|r| r.node.as_deref())
                .collect();
            nodes.sort_unstable();
            nodes.dedup();
            let secs = ((b.min(now) - a).num_milliseconds() as f64 / 1e3).max(0.0);
            if nodes.is_empty() || secs <= 0.0 {
                continue;
            }
            rate.jobs += 1;
            rate.node_seconds += secs * nodes.len() as f64;
            rate.failures += interruptions(&job, &records) as f64;
        }
    }
    rate
}

/// How many attempts of a job a node fault ended: one per attempt however
/// many nodes were blamed or records say so (the rank's failure, the
/// job-wide judgment), so that the fleet's count is in the unit of the job's
/// own failed attempts that it is pooled with. A verdict written at a later
/// start (`about_attempt`) counts for the attempt it is about.
pub fn interruptions(job: &str, records: &[Record]) -> usize {
    let mut by_attempt: BTreeMap<u64, Vec<&Record>> = BTreeMap::new();
    for r in records {
        let about = u64::from(
            r.event()
                .and_then(|e| e.about_attempt())
                .unwrap_or(r.attempt),
        );
        by_attempt.entry(about).or_default().push(r);
    }
    by_attempt
        .values()
        .filter(|recs| {
            events_of(job, recs.iter().copied())
                .iter()
                .any(|(_, e)| e.counts && e.class != "straggler")
        })
        .count()
}
