//! Which journals' events to believe: another user's journal only where
//! Slurm's accounting agrees.

use super::NodeEvent;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// One job's journal as read for the history: whose it is, what it says.
pub struct Journaled {
    pub job: String,
    /// The owner of the job's directory (each file in it is its, see
    /// [`journal::read_job`]).
    pub uid: u32,
    pub events: Vec<(String, NodeEvent)>,
}

/// Slack around an allocation's start and end within which its journal's
/// events are believed (clocks, a judgment written as the job ends).
const ALLOCATION_SLACK_SECS: i64 = 600;

/// Which journals' events to believe, and why the others were left out.
///
/// A journal is anyone's to write under a shared state dir, and its owner
/// can say anything in it, so:
/// - a job Slurm's accounting knows (`acct`) is believed only where the
///   accounting agrees: the journal's owner is the job's user, and each event
///   is on a node of one of the job's allocations, within that allocation's
///   time;
/// - a job the accounting does not know (a run outside Slurm, sacct not
///   available or not asked) is believed only from the user asking
///   (`caller`) or root: another user's is left out.
///
/// Believed events get their owner's name, and `trusted` when Slurm, root or
/// the caller said so (see [`NodeHistory::listable`]). Returns the events
/// kept and, by reason, how many were left out.
pub fn vouch(
    journals: Vec<Journaled>,
    acct: std::result::Result<&[crate::slurm::AcctRecord], &str>,
    caller: u32,
    now: DateTime<Utc>,
) -> (Vec<(String, NodeEvent)>, BTreeMap<String, usize>) {
    use crate::analysis::accounting::slurm_time;
    let mut kept = Vec::new();
    let mut dropped: BTreeMap<String, usize> = BTreeMap::new();
    let slack = chrono::Duration::seconds(ALLOCATION_SLACK_SECS);
    for j in journals {
        let rows: Vec<&crate::slurm::AcctRecord> = match acct {
            // The job's rows and its steps' (`J.0`, `J.batch`): a job
            // requeued by resilio keeps only its last allocation in its own
            // row, the earlier ones in their steps'.
            Ok(rows) => rows
                .iter()
                .filter(|r| {
                    r.job_id == j.job
                        || r.job_id
                            .strip_prefix(j.job.as_str())
                            .is_some_and(|rest| rest.starts_with('.'))
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        let own = j.uid == caller || j.uid == 0;
        let owner = crate::state_dir::name_of(j.uid);
        let mut drop = |why: String, n: usize| {
            if n > 0 {
                *dropped.entry(why).or_default() += n;
            }
        };
        if rows.is_empty() {
            if own {
                kept.extend(j.events.into_iter().map(|(node, mut e)| {
                    e.owner = owner.clone();
                    e.trusted = true;
                    (node, e)
                }));
            } else {
                drop(
                    match acct {
                        Err(e) => format!(
                            "another user's journal Slurm's accounting could not confirm ({e})"
                        ),
                        Ok(_) => "another user's journal of a job Slurm's accounting does not know"
                            .into(),
                    },
                    j.events.len(),
                );
            }
            continue;
        }
        if rows.iter().any(|r| r.uid.is_some()) && !rows.iter().any(|r| r.uid == Some(j.uid)) {
            drop(
                "a journal whose owner is not the job's user in Slurm's accounting".into(),
                j.events.len(),
            );
            continue;
        }
        for (node, mut e) in j.events {
            let ran_there = rows.iter().any(|r| {
                let (Some(start), end) = (slurm_time(&r.start), slurm_time(&r.end)) else {
                    return false;
                };
                r.nodes.contains(&node)
                    && e.ts >= start - slack
                    && e.ts <= end.unwrap_or(now) + slack
            });
            if ran_there {
                e.owner = owner.clone();
                e.trusted = own;
                kept.push((node, e));
            } else {
                drop(
                    "an event on a node or at a time outside the job's allocations in Slurm's accounting"
                        .into(),
                    1,
                );
            }
        }
    }
    (kept, dropped)
}
