//! Every node's history, from all journals under the state dir (and
//! Slurm's NODE_FAIL records).

use super::trust::{vouch, Journaled};
use super::{events_from_sacct, events_of, from_events, NodeEvent, NodeHistory};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Where a history came from.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sources {
    pub journals: usize,
    /// NODE_FAIL allocations from sacct (`None`: sacct not asked or not available).
    pub sacct_node_failures: Option<usize>,
    pub sacct_error: Option<String>,
    /// Events read from journals but left out, by why (see [`vouch`]).
    pub dropped: BTreeMap<String, usize>,
    /// What the journal reader left out, by what (`journal files not read
    /// ...`, `records dated ...`): a count of those.
    pub unread: BTreeMap<String, usize>,
}

/// Build every node's history from all journals under `state_dir` that
/// [`vouch`] believes (and Slurm's NODE_FAIL records since a window of
/// eight half-lives, when `slurm` is given), scores decayed to `now` with
/// `half_life`.
pub fn build(
    state_dir: &Path,
    now: DateTime<Utc>,
    half_life: std::time::Duration,
    slurm: Option<&dyn crate::slurm::Slurm>,
) -> (Vec<NodeHistory>, Sources) {
    let mut by_node: BTreeMap<String, Vec<NodeEvent>> = BTreeMap::new();
    let mut sources = Sources::default();
    let mut journals = Vec::new();
    for crate::analysis::jobs::OwnedJournal {
        job,
        uid,
        journal: j,
    } in crate::analysis::jobs::every_job(state_dir, None)
    {
        sources.journals += 1;
        // What the reader left out, said here too (a report names each file).
        for f in &j.skipped {
            let mut note = |why: &str, n: usize| {
                if n > 0 {
                    *sources.unread.entry(why.to_string()).or_default() += n;
                }
            };
            note(
                "journal files not read (a symbolic link, FIFO or device, another owner's, not a journal)",
                usize::from(f.error.is_some()),
            );
            note("records dated more than a day ahead", f.future);
            note("records of a copied journal file", f.duplicates);
        }
        journals.push(Journaled {
            events: events_of(&job, &j.records),
            job,
            uid,
        });
    }
    // Slurm's word on the journals' jobs (Slurm's ids only: a run outside
    // Slurm has nothing to ask about).
    let ids: Vec<String> = journals
        .iter()
        .filter(|j| !j.events.is_empty() && crate::slurm::validate_job_id(&j.job).is_ok())
        .map(|j| j.job.clone())
        .collect();
    let acct: std::result::Result<Vec<crate::slurm::AcctRecord>, String> = match slurm {
        None => Err("sacct not asked".into()),
        Some(_) if ids.is_empty() => Ok(Vec::new()),
        Some(s) => s.jobs_accounting(&ids).map_err(|e| e.to_string()),
    };
    let caller = nix::unistd::geteuid().as_raw();
    let (kept, dropped) = vouch(
        journals,
        acct.as_deref().map_err(String::as_str),
        caller,
        now,
    );
    for (why, n) in dropped {
        *sources.dropped.entry(why).or_default() += n;
    }
    // Jobs whose journal is believed are counted from it, not from sacct.
    let mut known: Vec<String> = kept.iter().map(|(_, e)| e.job.clone()).collect();
    known.sort_unstable();
    known.dedup();
    for (node, ev) in kept {
        by_node.entry(node).or_default().push(ev);
    }
    if let Some(s) = slurm {
        let window =
            chrono::Duration::from_std(half_life * 8).unwrap_or(chrono::Duration::days(56));
        match s.node_failures(now - window) {
            Ok(rows) => {
                sources.sacct_node_failures = Some(rows.len());
                for (node, ev) in events_from_sacct(&rows, &known) {
                    by_node.entry(node).or_default().push(ev);
                }
            }
            Err(e) => sources.sacct_error = Some(e.to_string()),
        }
    }
    (from_events(by_node, now, half_life), sources)
}
