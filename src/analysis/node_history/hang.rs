//! What the probes say about a hang: the trainer's own code, a stopped
//! process, the kernel, or a wait on a peer; and so how a hang judgment's
//! blame of a node is held.

use super::{HANG_KERNEL, HANG_STOPPED, HANG_UNCONFIRMED, HANG_USER_CODE};
use crate::event::{Class, Event, Hang, Judgment};
use crate::journal::Record;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// What one attempt's coordinator and agents said about a hang: its last
/// job-wide verdict (`hang`) and each rank's last probe (`probe`), in words.
#[derive(Default)]
pub(super) struct AttemptView {
    hang: Option<(DateTime<Utc>, Hang)>,
    probes: BTreeMap<u32, (DateTime<Utc>, String)>,
}

impl AttemptView {
    /// What the probe of `rank` found: the verdict's copy, else the rank's
    /// own `probe` record.
    fn probe(&self, rank: u32) -> Option<&str> {
        self.hang
            .iter()
            .flat_map(|(_, h)| h.ranks.iter())
            .find(|x| x.rank == rank)
            .and_then(|x| x.probe.as_deref())
            .filter(|p| !p.is_empty())
            .or_else(|| self.probes.get(&rank).map(|(_, p)| p.as_str()))
    }
}

/// Each attempt's view, by (run key, attempt).
pub(super) fn attempt_views<'a>(
    records: &[&'a Record],
) -> BTreeMap<(Option<&'a str>, u32), AttemptView> {
    let mut out: BTreeMap<(Option<&str>, u32), AttemptView> = BTreeMap::new();
    // Only these two kinds: parsing every record twice would cost the
    // history, which reads every journal, its time.
    for r in records
        .iter()
        .filter(|r| r.kind == "hang" || r.kind == "probe")
    {
        match r.event() {
            Some(Event::Hang(h)) => {
                let v = out.entry((r.run(), r.attempt)).or_default();
                if v.hang.as_ref().is_none_or(|(ts, _)| *ts <= r.ts) {
                    v.hang = Some((r.ts, h.clone()));
                }
            }
            Some(Event::Probe(p)) => {
                let (Some(rank), Some(words)) = (r.rank, probe_words(&p.probe)) else {
                    continue;
                };
                let v = out.entry((r.run(), r.attempt)).or_default();
                let e = v.probes.entry(rank).or_insert((r.ts, String::new()));
                if e.0 <= r.ts {
                    *e = (r.ts, words);
                }
            }
            _ => {}
        }
    }
    out
}

/// A `probe` record's findings as the coordinator's report has them:
/// its evidence lines joined by "; ".
pub(super) fn probe_words(probe: &crate::event::ProbeFinding) -> Option<String> {
    (!probe.evidence.is_empty()).then(|| probe.evidence.join("; "))
}

/// What a rank's probe found it doing, from its words
/// (`rank::diagnostics`: `PID COMM: what` per process, the stacks' verdicts
/// `PID stack: ...`, a collective's timeout as `output: ...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sighting {
    /// In uninterruptible sleep (state D): a wait in the kernel or a driver.
    Kernel,
    /// Stopped (SIGSTOP, Slurm's suspend, a debugger).
    Stopped,
    /// Waiting on a peer (a socket, a collective): an echo of something else.
    Peer,
    /// In its own code: sleeping, reading a pipe or file, a stack not
    /// waiting on a peer.
    Own,
    /// Running on a CPU, and nothing more telling: its own code, or a
    /// collective spinning on a GPU (NCCL), or a device that hangs.
    Running,
    /// Nothing the probe could tell.
    Nothing,
}

/// The words of each finding, most telling first (a stack before a
/// system call).
const SEEN: &[(Sighting, &[&str])] = &[
    (Sighting::Kernel, &["uninterruptible sleep"]),
    (
        Sighting::Stopped,
        &["stopped (SIGSTOP", "stopped by a tracer"],
    ),
    (
        Sighting::Peer,
        &[
            "blocked reading socket fd",
            "blocked polling, with sockets open",
            "stack: waiting on a peer",
            "output: ",
        ],
    ),
    (
        Sighting::Own,
        &[
            "stack: not waiting in",
            ": sleeping",
            "blocked polling, no socket open",
            "(not a socket)",
        ],
    ),
    (
        Sighting::Running,
        &["running on a CPU", "not in a system call"],
    ),
];

/// The most telling finding of a probe, and the words (one process's) that say it.
pub(super) fn seen_in(probe: &str) -> (Sighting, &str) {
    for (seen, words) in SEEN {
        for w in *words {
            if let Some(part) = probe.split("; ").find(|part| part.contains(w)) {
                return (*seen, part.trim());
            }
        }
    }
    (Sighting::Nothing, "")
}

/// Whether the hang judged in `attempt` on `node` (its primary rank
/// `rank`) was, by the probes, in the trainer's own code or a stopped
/// process: software, not the node. The job level then excludes no node
/// for it (another node would hang the same way), as the node history
/// holds nothing against it.
pub fn hang_is_software(records: &[Record], attempt: u32, rank: u32, node: &str) -> bool {
    let recs: Vec<&Record> = records.iter().filter(|r| r.attempt == attempt).collect();
    let views = attempt_views(&recs);
    let view = views
        .into_values()
        .max_by_key(|v| v.hang.as_ref().map(|(t, _)| *t));
    let j = Judgment {
        class: Class::Hang,
        primary_rank: Some(rank),
        primary_node: Some(node.to_string()),
        ..Default::default()
    };
    matches!(
        hang_blame(&j, node, view.as_ref()),
        Some((HANG_USER_CODE | HANG_STOPPED, _))
    )
}

/// How a hang judgment's blame of `node` is held: its class, and why.
/// `None`: the judgment blamed no rank.
pub(super) fn hang_blame(
    j: &Judgment,
    node: &str,
    view: Option<&AttemptView>,
) -> Option<(&'static str, String)> {
    let primary = j.primary_rank?;
    let empty = AttemptView::default();
    let view = view.unwrap_or(&empty);
    let hang = view.hang.as_ref().map(|(_, h)| h);
    let verdict = hang.map(|h| &h.verdict);
    let rule = verdict.map(|v| v.rule);
    // The ranks the job-wide verdict blamed on this node, else the judgment's own.
    let mut ranks: Vec<u32> = hang
        .iter()
        .flat_map(|h| h.ranks.iter())
        .filter(|x| x.node == node)
        .map(|x| x.rank)
        .filter(|r| verdict.is_some_and(|v| v.blamed_ranks.contains(r)))
        .collect();
    if ranks.is_empty()
        && j.primary_node
            .as_deref()
            .is_none_or(|p| p.is_empty() || p == node)
    {
        ranks.push(primary);
    }
    let found: Vec<(u32, Sighting, &str)> = ranks
        .iter()
        .map(|&r| {
            let (seen, words) = view.probe(r).map_or((Sighting::Nothing, ""), seen_in);
            (r, seen, words)
        })
        .collect();
    let first = |s: Sighting| found.iter().find(|(_, x, _)| *x == s);
    if let Some((r, _, words)) = first(Sighting::Kernel) {
        return Some((
            HANG_KERNEL,
            format!(
                "rank {r} was in uninterruptible sleep, a wait in the kernel or a driver ({words})"
            ),
        ));
    }
    if let Some((r, _, words)) = first(Sighting::Stopped) {
        return Some((
            HANG_STOPPED,
            format!("rank {r} was stopped ({words}): someone paused it, not the node"),
        ));
    }
    let ranks_list = ranks
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    // The verdict's rule, unless all it rested on was ranks running.
    let only_running = !found.is_empty() && found.iter().all(|(_, x, _)| *x == Sighting::Running);
    if rule == Some(crate::policy::hang::HangRule::NotWaiting) && !only_running {
        return Some((
            HANG_USER_CODE,
            format!("rank(s) {ranks_list} were not waiting on a peer while others were (rule not_waiting): the trainer's own code"),
        ));
    }
    if first(Sighting::Peer).is_none() {
        if let Some((r, _, words)) = first(Sighting::Own) {
            return Some((
                HANG_USER_CODE,
                format!("rank {r} was in its own code ({words}): the trainer's own code"),
            ));
        }
    }
    let how = rule.map_or("no job-wide hang verdict".to_string(), |r| {
        format!("rule {r}")
    });
    let probe = match first(Sighting::Peer) {
        Some((r, _, words)) => format!("rank {r} was waiting on a peer ({words})"),
        None if ranks.is_empty() => "no blamed rank ran on it".to_string(),
        None => format!("no probe of rank(s) {ranks_list} told what they were doing"),
    };
    Some((
        HANG_UNCONFIRMED,
        format!("cause unknown ({how}; {probe}){UNCONFIRMED}"),
    ))
}

/// The tail of an unconfirmed hang's reason, replaced once another job
/// corroborates it.
pub(super) const UNCONFIRMED: &str =
    ": held against the node only if it is implicated in another job too";
