//! Node history for admins (`resilio nodes`): failures blamed on each node
//! across every journal under the state dir, with a score that decays with
//! time so that a repaired node recovers.
//!
//! Only the infrastructure is held against a node. What counts, and its
//! weight when new (the class as `resilio nodes` shows it):
//! - `infrastructure` (1.0): a `failure` that names the node
//!   (`blamed_node`), or a rank's own infrastructure failure with evidence
//!   from its output (Xid, ECC, NCCL network errors);
//! - `node_failure` (1.0): Slurm said the node failed; from Slurm's
//!   accounting (`sacct`, where it exists) every job of any user that ended
//!   in NODE_FAIL on it. Slurm does not say which node of a multi-node
//!   allocation failed, so such a failure is shared among its nodes
//!   (`share` 1/N); jobs with a journal here are counted from the journal
//!   alone;
//! - `health_check` (1.0): a failed health check on the node;
//! - `hang_kernel` (1.0): a hang whose blamed rank was in uninterruptible
//!   sleep (state D: a wait in the kernel or a driver) when it was probed;
//! - `hang` (0.5): a hang of unknown cause (the coordinator blamed the rank
//!   by its steps, or there was no job-wide verdict, and no probe said what
//!   it was doing), on a node implicated in another job too;
//! - `straggler` (0.2): a flagged straggler.
//!
//! Seen and shown, but never held against the node (`counts: false`):
//! `hang_user_code` (the probe found the blamed rank in its own code:
//! sleeping, running, not waiting on a peer, or the coordinator's
//! `not_waiting` rule), `hang_stopped` (its process was stopped: SIGSTOP,
//! Slurm's suspend, a debugger) and `hang_unconfirmed` (a hang of unknown
//! cause no other job corroborates). Peers' echoes (`secondary`), user
//! errors, preemptions and judgments that blamed nobody are not events at
//! all.

use crate::event::{Class, Event, Hang, Judgment};
use crate::journal::{self, Record};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One event seen on a node: held against it (`counts`) or only shown.
#[derive(Clone, Debug, Serialize)]
pub struct NodeEvent {
    pub ts: DateTime<Utc>,
    pub job: String,
    pub class: String,
    pub evidence: String,
    /// The node's share of the blame (1/N for a NODE_FAIL of an N-node
    /// allocation Slurm recorded without naming the node).
    pub share: f64,
    /// `journal` or `sacct`.
    pub source: &'static str,
    /// Held against the node: in its score.
    pub counts: bool,
    /// Why it counts or not, in words.
    pub reason: String,
    /// Whose journal said so (a user name, `uid N`), or `slurm`.
    pub owner: String,
    /// Said by Slurm, the admin (root) or the user asking: enough alone
    /// to list the node. Any other user's word lists a node only with
    /// another user's (see [`NodeHistory::listable`]).
    pub trusted: bool,
}

/// A node's history.
#[derive(Clone, Debug, Serialize)]
pub struct NodeHistory {
    pub node: String,
    pub score: f64,
    /// Every event seen, by class, those not held against the node included
    /// (their classes have weight 0: `hang_user_code`, ...).
    pub failures_by_class: BTreeMap<String, u32>,
    /// The jobs with events held against the node.
    pub jobs: Vec<String>,
    pub last_seen: DateTime<Utc>,
    pub events: Vec<NodeEvent>,
    /// Its score may list it (`--exclude-list`, `--drain`, exclusion at a
    /// job's start): what is held against it comes from Slurm, the admin,
    /// the user asking, or at least two users. One user's jobs alone never
    /// list a node: anyone can write a journal that blames one.
    pub listable: bool,
}

impl NodeHistory {
    /// Listed at `threshold`: scored at or above it, and [`Self::listable`].
    pub fn listed(&self, threshold: f64) -> bool {
        self.score >= threshold && self.listable
    }

    /// The evidence of the latest event held against the node that has
    /// any (a straggler has none); "" when none has.
    pub fn last_evidence(&self) -> &str {
        self.events
            .iter()
            .rev()
            .find(|e| e.counts && !e.evidence.is_empty())
            .map_or("", |e| e.evidence.as_str())
    }
}

/// A hang whose blamed rank waited in the kernel (state D).
pub const HANG_KERNEL: &str = "hang_kernel";
/// A hang of unknown cause, corroborated by another job on the node.
pub const HANG: &str = "hang";
/// A hang in the trainer's own code.
pub const HANG_USER_CODE: &str = "hang_user_code";
/// A hang of a process someone stopped.
pub const HANG_STOPPED: &str = "hang_stopped";
/// A hang of unknown cause no other job corroborates (yet).
pub const HANG_UNCONFIRMED: &str = "hang_unconfirmed";

/// Weight of an event class in the score (0: shown, never held against a node).
fn weight(class: &str) -> f64 {
    match class {
        "infrastructure" | "health_check" | "node_failure" | HANG_KERNEL => 1.0,
        HANG => 0.5,
        "straggler" => 0.2,
        _ => 0.0,
    }
}

/// Whether events of `class` are held against a node.
pub fn class_counts(class: &str) -> bool {
    weight(class) > 0.0
}

/// What one attempt's coordinator and agents said about a hang: its last
/// job-wide verdict (`hang`) and each rank's last probe (`probe`), in words.
#[derive(Default)]
struct AttemptView {
    hang: Option<(DateTime<Utc>, Hang)>,
    probes: BTreeMap<u32, (DateTime<Utc>, String)>,
}

impl AttemptView {
    /// What the probe of `rank` found: the verdict's copy, else the rank's
    /// own `probe` record.
    fn probe(&self, rank: u32) -> Option<&str> {
        self.hang
            .iter()
            .flat_map(|(_, h)| h.ranks.iter().flatten())
            .find(|x| x.rank == rank)
            .and_then(|x| x.probe.as_deref())
            .filter(|p| !p.is_empty())
            .or_else(|| self.probes.get(&rank).map(|(_, p)| p.as_str()))
    }
}

/// Each attempt's view, by (run key, attempt).
fn attempt_views<'a>(records: &[&'a Record]) -> BTreeMap<(Option<&'a str>, u32), AttemptView> {
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
                    v.hang = Some((r.ts, h));
                }
            }
            Some(Event::Probe(p)) => {
                let (Some(rank), Some(words)) = (r.rank, p.probe.as_ref().and_then(probe_words))
                else {
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
fn probe_words(probe: &serde_json::Value) -> Option<String> {
    let lines: Vec<&str> = probe
        .get("evidence")?
        .as_array()?
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// What a rank's probe found it doing, from its words
/// (`rank::diagnostics`: `PID COMM: what` per process, the stacks' verdicts
/// `PID stack: ...`, a collective's timeout as `output: ...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
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
const SEEN: &[(Seen, &[&str])] = &[
    (Seen::Kernel, &["uninterruptible sleep"]),
    (Seen::Stopped, &["stopped (SIGSTOP", "stopped by a tracer"]),
    (
        Seen::Peer,
        &[
            "blocked reading socket fd",
            "blocked polling, with sockets open",
            "stack: waiting on a peer",
            "output: ",
        ],
    ),
    (
        Seen::Own,
        &[
            "stack: not waiting in",
            ": sleeping",
            "blocked polling, no socket open",
            "(not a socket)",
        ],
    ),
    (Seen::Running, &["running on a CPU", "not in a system call"]),
];

/// The most telling finding of a probe, and the words (one process's) that say it.
fn seen_in(probe: &str) -> (Seen, &str) {
    for (seen, words) in SEEN {
        for w in *words {
            if let Some(part) = probe.split("; ").find(|part| part.contains(w)) {
                return (*seen, part.trim());
            }
        }
    }
    (Seen::Nothing, "")
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
        class: Some(Class::Hang),
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
fn hang_blame(
    j: &Judgment,
    node: &str,
    view: Option<&AttemptView>,
) -> Option<(&'static str, String)> {
    let primary = j.primary_rank?;
    let empty = AttemptView::default();
    let view = view.unwrap_or(&empty);
    let hang = view.hang.as_ref().map(|(_, h)| h);
    let verdict = hang.and_then(|h| h.verdict.as_ref());
    let rule = verdict.and_then(|v| v.rule.as_deref());
    // The ranks the job-wide verdict blamed on this node, else the judgment's own.
    let mut ranks: Vec<u32> = hang
        .iter()
        .flat_map(|h| h.ranks.iter().flatten())
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
    let found: Vec<(u32, Seen, &str)> = ranks
        .iter()
        .map(|&r| {
            let (seen, words) = view.probe(r).map_or((Seen::Nothing, ""), seen_in);
            (r, seen, words)
        })
        .collect();
    let first = |s: Seen| found.iter().find(|(_, x, _)| *x == s);
    if let Some((r, _, words)) = first(Seen::Kernel) {
        return Some((
            HANG_KERNEL,
            format!(
                "rank {r} was in uninterruptible sleep, a wait in the kernel or a driver ({words})"
            ),
        ));
    }
    if let Some((r, _, words)) = first(Seen::Stopped) {
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
    let only_running = !found.is_empty() && found.iter().all(|(_, x, _)| *x == Seen::Running);
    if rule == Some("not_waiting") && !only_running {
        return Some((
            HANG_USER_CODE,
            format!("rank(s) {ranks_list} were not waiting on a peer while others were (rule not_waiting): the trainer's own code"),
        ));
    }
    if first(Seen::Peer).is_none() {
        if let Some((r, _, words)) = first(Seen::Own) {
            return Some((
                HANG_USER_CODE,
                format!("rank {r} was in its own code ({words}): the trainer's own code"),
            ));
        }
    }
    let how = rule.map_or("no job-wide hang verdict".to_string(), |r| {
        format!("rule {r}")
    });
    let probe = match first(Seen::Peer) {
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
const UNCONFIRMED: &str = ": held against the node only if it is implicated in another job too";

/// Events against nodes found in one job's records.
pub fn events_of<'a>(
    job: &str,
    records: impl IntoIterator<Item = &'a Record>,
) -> Vec<(String, NodeEvent)> {
    let records: Vec<&Record> = records.into_iter().collect();
    let views = attempt_views(&records);
    let mut out = Vec::new();
    let mut push = |node: &str, r: &Record, class: &str, evidence: String, reason: String| {
        if crate::slurm::hostlist::valid_node_name(node) {
            out.push((
                node.to_string(),
                NodeEvent {
                    ts: r.ts,
                    job: job.to_string(),
                    class: class.to_string(),
                    evidence,
                    share: 1.0,
                    source: "journal",
                    counts: class_counts(class),
                    reason,
                    // Whose: set by [`vouch`] for journals read from disk.
                    owner: String::new(),
                    trusted: true,
                },
            ));
        }
    };
    for r in records {
        let Some(event) = r.event() else { continue };
        match &event {
            Event::Failure(f) => {
                let class = f.class.map_or("", Class::name);
                let evidence = f.evidence.clone().unwrap_or_default();
                if let Some(node) = &f.blamed_node {
                    let (c, reason) = if f.failure_kind.as_deref() == Some("node_failure") {
                        ("node_failure", "the node failed (Slurm)".to_string())
                    } else {
                        (
                            class,
                            format!("a failure of class {class} blamed on the node"),
                        )
                    };
                    push(node, r, c, evidence, reason);
                } else if class == "infrastructure" && r.rank.is_some() && f.evidence.is_some() {
                    // A rank's own infrastructure signature, on its own node.
                    if let Some(node) = &r.node {
                        let reason =
                            "the rank's infrastructure failure, with evidence from its output"
                                .to_string();
                        push(node, r, class, evidence, reason);
                    }
                }
            }
            Event::Judgment(j) if j.class == Some(Class::Hang) => {
                let evidence = j.evidence.clone().unwrap_or_default();
                let view = views.get(&(r.run(), r.attempt));
                for n in j.blamed_nodes.iter().flatten() {
                    if let Some((class, reason)) = hang_blame(j, n, view) {
                        push(n, r, class, evidence.clone(), reason);
                    }
                }
            }
            Event::HealthCheck(h) => {
                let result = h.result.as_ref();
                let failed =
                    result.and_then(|v| v.get("ok")).and_then(|v| v.as_bool()) == Some(false);
                if failed {
                    if let Some(node) = &r.node {
                        let out = result
                            .and_then(|v| v.get("output"))
                            .and_then(|v| v.as_str())
                            .unwrap_or("");
                        push(
                            node,
                            r,
                            "health_check",
                            out.lines().next().unwrap_or("").to_string(),
                            "the node's health check failed".to_string(),
                        );
                    }
                }
            }
            // A straggler record has no text of its own to give as evidence.
            Event::Straggler(x) if x.flagged != Some(false) => {
                if let Some(node) = x.straggler_node.as_deref().or(r.node.as_deref()) {
                    push(
                        node,
                        r,
                        "straggler",
                        String::new(),
                        "flagged as a straggler (slow, not necessarily broken: 0.2)".to_string(),
                    );
                }
            }
            _ => {}
        }
    }
    // The same failure can be journaled by a rank and by the supervisor: keep one per (node, job, attempt-second, class).
    out.sort_by(|a, b| (a.0.as_str(), a.1.ts).cmp(&(b.0.as_str(), b.1.ts)));
    out.dedup_by(|b, a| {
        a.0 == b.0
            && a.1.job == b.1.job
            && a.1.class == b.1.class
            && (b.1.ts - a.1.ts).num_seconds().abs() < 60
    });
    out
}

/// Events from Slurm's accounting: allocations that ended in NODE_FAIL,
/// except those of `known` jobs (their journals say more).
pub fn events_from_sacct(
    rows: &[crate::slurm::AcctRecord],
    known: &[String],
) -> Vec<(String, NodeEvent)> {
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.state.starts_with("NODE_FAIL")) {
        let base = r.job_id.split(['.', '_', '+']).next().unwrap_or("");
        if known.iter().any(|k| k == base) || r.nodes.is_empty() {
            continue;
        }
        let Some(ts) = crate::analysis::accounting::slurm_time(&r.end)
            .or_else(|| crate::analysis::accounting::slurm_time(&r.start))
        else {
            continue;
        };
        let share = 1.0 / r.nodes.len() as f64;
        for node in r
            .nodes
            .iter()
            .filter(|n| crate::slurm::hostlist::valid_node_name(n))
        {
            out.push((
                node.clone(),
                NodeEvent {
                    ts,
                    job: r.job_id.clone(),
                    class: "node_failure".into(),
                    evidence: format!(
                        "sacct: job {} NODE_FAIL on {}",
                        r.job_id,
                        crate::slurm::hostlist::compress(&r.nodes)
                    ),
                    share,
                    source: "sacct",
                    counts: true,
                    reason: if r.nodes.len() > 1 {
                        format!(
                            "Slurm ended the job in NODE_FAIL without naming the node: shared among its {} nodes",
                            r.nodes.len()
                        )
                    } else {
                        "Slurm ended the job in NODE_FAIL".to_string()
                    },
                    owner: "slurm".into(),
                    trusted: true,
                },
            ));
        }
    }
    out
}

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

/// Every job this user may read under `state_dir`: with a site-wide state
/// dir, every user's directory (all of them for root), see [`crate::state_dir`].
fn all_jobs(state_dir: &Path) -> Vec<(std::path::PathBuf, String, std::time::SystemTime)> {
    crate::state_dir::readable_roots(state_dir)
        .into_iter()
        .flat_map(|root| {
            journal::list_jobs(&root)
                .into_iter()
                .map(move |(job, t)| (root.clone(), job, t))
        })
        .collect()
}

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
            Ok(rows) => rows.iter().filter(|r| r.job_id == j.job).collect(),
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
    use std::os::unix::fs::MetadataExt;
    let mut by_node: BTreeMap<String, Vec<NodeEvent>> = BTreeMap::new();
    let mut sources = Sources::default();
    let mut journals = Vec::new();
    for (root, job, _) in all_jobs(state_dir) {
        let dir = journal::job_dir(&root, &job);
        let Ok(uid) = std::fs::symlink_metadata(&dir).map(|m| m.uid()) else {
            continue;
        };
        let Ok(j) = journal::read_job(&dir) else {
            continue;
        };
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

/// The node history for node_exporter's textfile collector (Prometheus
/// text format): per node its score, whether it is listed at `threshold`,
/// its failures by class (those held against it; the others apart) and its
/// jobs; and the fleet's totals. `jobs`: how many job journals were read.
pub fn render_prometheus(history: &[NodeHistory], threshold: f64, jobs: usize) -> String {
    let esc = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
        out += &format!("# HELP resilio_{name} {help}\n# TYPE resilio_{name} {kind}\n");
        for (labels, value) in rows {
            out += &format!("resilio_{name}{labels} {value}\n");
        }
    };
    let node = |h: &NodeHistory| format!("node=\"{}\"", esc(&h.node));
    family(
        "node_score",
        "gauge",
        "Failures held against the node, each 1.0 when new and halving every half-life",
        history
            .iter()
            .map(|h| (format!("{{{}}}", node(h)), format!("{:.4}", h.score)))
            .collect(),
    );
    family(
        "node_listed",
        "gauge",
        "1 when the node's score is at or above the threshold (resilio nodes --exclude-list)",
        history
            .iter()
            .map(|h| {
                (
                    format!("{{{},threshold=\"{threshold}\"}}", node(h)),
                    u8::from(h.listed(threshold)).to_string(),
                )
            })
            .collect(),
    );
    family(
        "node_failures",
        "gauge",
        "Failures held against the node, by class",
        history
            .iter()
            .flat_map(|h| {
                h.failures_by_class
                    .iter()
                    .filter(|(c, _)| class_counts(c))
                    .map(move |(c, n)| {
                        (
                            format!("{{{},class=\"{}\"}}", node(h), esc(c)),
                            n.to_string(),
                        )
                    })
            })
            .collect(),
    );
    family(
        "node_seen_not_counted",
        "gauge",
        "Events seen on the node but not held against it (hangs in the trainer's own code, unconfirmed hangs), by class",
        history
            .iter()
            .flat_map(|h| {
                h.failures_by_class
                    .iter()
                    .filter(|(c, _)| !class_counts(c))
                    .map(move |(c, n)| {
                        (
                            format!("{{{},class=\"{}\"}}", node(h), esc(c)),
                            n.to_string(),
                        )
                    })
            })
            .collect(),
    );
    family(
        "node_jobs",
        "gauge",
        "Jobs in which the node had failures held against it",
        history
            .iter()
            .map(|h| (format!("{{{}}}", node(h)), h.jobs.len().to_string()))
            .collect(),
    );
    let mut by_class: BTreeMap<&str, u32> = BTreeMap::new();
    for h in history {
        for (c, n) in h.failures_by_class.iter().filter(|(c, _)| class_counts(c)) {
            *by_class.entry(c).or_default() += n;
        }
    }
    family(
        "fleet_failures",
        "gauge",
        "Failures held against any node, by class",
        by_class
            .iter()
            .map(|(c, n)| (format!("{{class=\"{}\"}}", esc(c)), n.to_string()))
            .collect(),
    );
    family(
        "fleet_nodes_listed",
        "gauge",
        "Nodes at or above the threshold",
        vec![(
            String::new(),
            history
                .iter()
                .filter(|h| h.listed(threshold))
                .count()
                .to_string(),
        )],
    );
    family(
        "fleet_jobs",
        "gauge",
        "Job journals read",
        vec![(String::new(), jobs.to_string())],
    );
    out
}

/// Nodes at or above `threshold`, as a Slurm hostlist expression.
pub fn exclude_list(history: &[NodeHistory], threshold: f64) -> String {
    let bad: Vec<&str> = history
        .iter()
        .filter(|h| h.listed(threshold))
        .map(|h| h.node.as_str())
        .collect();
    crate::slurm::hostlist::compress(&bad)
}

/// Render the table for humans.
pub fn render(history: &[NodeHistory], threshold: f64) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if history.is_empty() {
        return "no node has failures on record\n".into();
    }
    let _ = writeln!(
        s,
        "{:<16} {:>6}  {:<40} {:<20} last evidence",
        "node", "score", "failures by class", "last seen"
    );
    let mut shown_apart = false;
    for h in history {
        let classes: Vec<String> = h
            .failures_by_class
            .iter()
            .map(|(k, v)| {
                if class_counts(k) {
                    format!("{k}={v}")
                } else {
                    shown_apart = true;
                    format!("({k}={v})")
                }
            })
            .collect();
        // What the node is held for; else why what was seen is not held.
        let last = match h.last_evidence() {
            "" if h.events.iter().all(|e| !e.counts) => h
                .events
                .last()
                .map(|e| format!("not counted: {}", e.reason))
                .unwrap_or_default(),
            e => e.to_string(),
        };
        let _ = writeln!(
            s,
            "{:<16} {:>6.2}{} {:<40} {:<20} {}",
            h.node,
            h.score,
            if h.listed(threshold) {
                "*"
            } else if h.score >= threshold {
                "!"
            } else {
                " "
            },
            classes.join(" "),
            h.last_seen.format("%Y-%m-%d %H:%M"),
            crate::util::clip(&last, 100)
        );
    }
    let _ = writeln!(
        s,
        "(* score >= {threshold}: in `resilio nodes --exclude-list`)"
    );
    if history.iter().any(|h| !h.listable && h.score >= threshold) {
        let _ = writeln!(
            s,
            "(! score >= {threshold}, not listed: one user's jobs alone implicate it)"
        );
    }
    if shown_apart {
        let _ = writeln!(
            s,
            "((class=n): seen on the node, not held against it; `--json` says why)"
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(ts: &str, kind: &str, rank: Option<u32>, node: &str, data: serde_json::Value) -> Record {
        Record {
            v: 1,
            ts: ts.parse().unwrap(),
            kind: kind.into(),
            attempt: 0,
            rank,
            node: Some(node.into()),
            data: data.as_object().cloned().unwrap(),
        }
    }

    #[test]
    fn the_textfile_collector_gets_every_node_and_the_fleet() {
        let node = |name: &str, score: f64, classes: &[(&str, u32)]| NodeHistory {
            node: name.into(),
            score,
            failures_by_class: classes.iter().map(|(c, n)| (c.to_string(), *n)).collect(),
            jobs: vec!["1".into(), "2".into()],
            last_seen: Utc::now(),
            events: Vec::new(),
            listable: true,
        };
        let h = vec![
            node("gpu01", 1.5, &[("infrastructure", 2)]),
            node("gpu\"02", 0.2, &[("straggler", 1), ("infrastructure", 1)]),
        ];
        let t = render_prometheus(&h, 0.9, 7);
        for line in [
            "# TYPE resilio_node_score gauge",
            "resilio_node_score{node=\"gpu01\"} 1.5000",
            "resilio_node_listed{node=\"gpu01\",threshold=\"0.9\"} 1",
            "resilio_node_listed{node=\"gpu\\\"02\",threshold=\"0.9\"} 0",
            "resilio_node_failures{node=\"gpu01\",class=\"infrastructure\"} 2",
            "resilio_node_jobs{node=\"gpu01\"} 2",
            "resilio_fleet_failures{class=\"infrastructure\"} 3",
            "resilio_fleet_failures{class=\"straggler\"} 1",
            "resilio_fleet_nodes_listed 1",
            "resilio_fleet_jobs 7",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in:\n{t}");
        }
        // Every sample line belongs to a family declared before it.
        let mut declared = Vec::new();
        for l in t.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                declared.push(rest.split(' ').next().unwrap().to_string());
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap();
                assert!(declared.iter().any(|d| d == name), "{l}");
            }
        }
    }

    #[test]
    fn an_attempt_is_one_interruption_however_many_nodes_it_blames() {
        let at = |attempt: u32, mut r: Record| {
            r.attempt = attempt;
            r
        };
        let recs = vec![
            // Attempt 0: a hang judged on two nodes, and one node's own
            // infrastructure failure: one interruption.
            at(
                0,
                rec(
                    "2026-11-01T00:00:00Z",
                    "judgment",
                    None,
                    "n1",
                    json!({"class": "hang", "blamed_nodes": ["n2", "n3"]}),
                ),
            ),
            at(
                0,
                rec(
                    "2026-11-01T00:00:01Z",
                    "failure",
                    Some(1),
                    "n2",
                    json!({"class": "infrastructure", "evidence": "Xid 79"}),
                ),
            ),
            // Attempt 1: the user's own bug: no node fault.
            at(
                1,
                rec(
                    "2026-11-01T01:00:00Z",
                    "failure",
                    Some(0),
                    "n1",
                    json!({"class": "user_code", "evidence": "KeyError"}),
                ),
            ),
            // Written at attempt 3's start about attempt 2: a node failure.
            at(
                3,
                rec(
                    "2026-11-01T02:00:00Z",
                    "failure",
                    None,
                    "n1",
                    json!({"class": "infrastructure", "failure_kind": "node_failure",
                           "blamed_node": "n4", "about_attempt": 2}),
                ),
            ),
        ];
        assert_eq!(interruptions("7", &recs), 2);
    }

    #[test]
    fn only_node_faults_count_and_scores_decay() {
        let recs = vec![
            rec(
                "2026-11-01T00:00:00Z",
                "failure",
                Some(1),
                "n2",
                json!({"class": "infrastructure", "evidence": "Xid 79"}),
            ),
            rec(
                "2026-11-01T00:00:01Z",
                "failure",
                Some(0),
                "n1",
                json!({"class": "secondary", "evidence": "Connection reset by peer"}),
            ),
            rec(
                "2026-11-01T00:00:02Z",
                "failure",
                None,
                "n1",
                json!({"class": "infrastructure", "blamed_node": "n3", "failure_kind": "node_failure", "evidence": "sacct NODE_FAIL"}),
            ),
            rec(
                "2026-11-01T00:00:03Z",
                "failure",
                Some(4),
                "n4",
                json!({"class": "user_error", "evidence": "KeyError"}),
            ),
            rec(
                "2026-11-01T00:00:04Z",
                "health_check",
                Some(0),
                "n5",
                json!({"result": {"ok": false, "output": "GPU 2 ECC"}}),
            ),
        ];
        let mut by_node: BTreeMap<String, Vec<NodeEvent>> = BTreeMap::new();
        for (n, e) in events_of("j1", &recs) {
            by_node.entry(n).or_default().push(e);
        }
        assert_eq!(by_node.keys().collect::<Vec<_>>(), ["n2", "n3", "n5"]);
        let week = std::time::Duration::from_secs(7 * 86400);
        let fresh = from_events(
            by_node.clone(),
            "2026-11-01T00:00:05Z".parse().unwrap(),
            week,
        );
        assert!(fresh.iter().all(|h| (h.score - 1.0).abs() < 1e-3));
        assert_eq!(exclude_list(&fresh, 0.9), "n[2-3,5]");
        let later = from_events(by_node, "2026-11-15T00:00:05Z".parse().unwrap(), week);
        assert!(
            later.iter().all(|h| (h.score - 0.25).abs() < 1e-3),
            "two half-lives later"
        );
        assert_eq!(exclude_list(&later, 0.9), "");
        assert!(render(&later, 0.9).contains("node_failure=1"));
        // Each says why it counts.
        assert!(later
            .iter()
            .flat_map(|h| &h.events)
            .all(|e| e.counts && !e.reason.is_empty()));
    }

    /// Attempt `attempt` of a run: a record with both set.
    fn of(run: &str, attempt: u32, mut r: Record) -> Record {
        r.attempt = attempt;
        r.data.insert("run".into(), json!(run));
        r
    }

    /// The coordinator's job-wide verdict: `rule`, blaming `blamed` (rank,
    /// node, its probe's words) while rank 0 on n9 waited on a socket.
    fn hang(ts: &str, rule: &str, blamed: (u32, &str, Option<&str>)) -> Record {
        let (rank, node, probe) = blamed;
        rec(
            ts,
            "hang",
            None,
            "n9",
            json!({
                "verdict": {"rule": rule, "blamed_ranks": [rank], "blamed_nodes": [node],
                            "reason": "rank(s) behind"},
                "ranks": [
                    {"rank": 0, "node": "n9", "probe": "100 python3: blocked reading socket fd 5; no stacks: py-spy not on PATH"},
                    {"rank": rank, "node": node, "probe": probe},
                ],
            }),
        )
    }

    /// The job level's judgment of a hang that blamed `rank` on `node`.
    fn hang_judgment(ts: &str, rank: u32, node: &str) -> Record {
        rec(
            ts,
            "judgment",
            None,
            "n9",
            json!({"class": "hang", "primary_rank": rank, "primary_node": node,
                   "blamed_nodes": [node], "evidence": format!("rank {rank} hung")}),
        )
    }

    #[test]
    fn a_hang_in_the_trainers_own_code_or_a_stopped_process_is_software() {
        let at = "2026-11-10T00:00:00Z";
        let own = [hang(
            at,
            "not_waiting",
            (
                1,
                "n2",
                Some("7 python: sleeping; stack: not waiting in step (train.py:9)"),
            ),
        )];
        assert!(hang_is_software(&own, 0, 1, "n2"));
        let stopped = [hang(
            at,
            "behind",
            (1, "n2", Some("7 python: stopped (SIGSTOP or the like)")),
        )];
        assert!(hang_is_software(&stopped, 0, 1, "n2"));
        // A wait in the kernel, or nothing the probe could tell: the node
        // may be at fault.
        let kernel = [hang(
            at,
            "not_waiting",
            (1, "n2", Some("7 python: uninterruptible sleep (D)")),
        )];
        assert!(!hang_is_software(&kernel, 0, 1, "n2"));
        let unknown = [hang(at, "behind", (1, "n2", None))];
        assert!(!hang_is_software(&unknown, 0, 1, "n2"));
        assert!(!hang_is_software(&[], 0, 1, "n2"));
    }

    fn history(jobs: &[(&str, Vec<Record>)], now: &str) -> Vec<NodeHistory> {
        let mut by_node: BTreeMap<String, Vec<NodeEvent>> = BTreeMap::new();
        for (job, recs) in jobs {
            for (n, e) in events_of(job, recs) {
                by_node.entry(n).or_default().push(e);
            }
        }
        let week = std::time::Duration::from_secs(7 * 86400);
        from_events(by_node, now.parse().unwrap(), week)
    }

    fn node<'a>(h: &'a [NodeHistory], name: &str) -> &'a NodeHistory {
        h.iter()
            .find(|x| x.node == name)
            .unwrap_or_else(|| panic!("{name} not in {h:#?}"))
    }

    #[test]
    fn hangs_in_the_trainers_own_code_are_shown_and_never_held_against_the_node() {
        // Two jobs a day apart hang on n1 in their own code: the verdict's
        // rule says so in one, the rank's probe (its stack) in the other.
        let j1 = vec![
            of(
                "r1",
                0,
                hang(
                    "2026-11-01T00:00:00Z",
                    "not_waiting",
                    (
                        1,
                        "n1",
                        Some("4242 python3: sleeping; no stacks: py-spy not on PATH"),
                    ),
                ),
            ),
            of("r1", 0, hang_judgment("2026-11-01T00:00:01Z", 1, "n1")),
        ];
        let j2 = vec![
            of(
                "r2",
                0,
                hang(
                    "2026-11-02T00:00:00Z",
                    "behind",
                    (3, "n1", Some("4300 python3: running on a CPU; 4300 stack: not waiting in step (train.py:31)")),
                ),
            ),
            of("r2", 0, hang_judgment("2026-11-02T00:00:01Z", 3, "n1")),
        ];
        let h = history(&[("j1", j1), ("j2", j2)], "2026-11-02T00:01:00Z");
        let n1 = node(&h, "n1");
        assert_eq!(n1.score, 0.0);
        assert_eq!(exclude_list(&h, 0.9), "");
        assert_eq!(n1.failures_by_class.get(HANG_USER_CODE), Some(&2));
        assert!(n1.jobs.is_empty(), "no job's failure is held against it");
        assert!(n1.events.iter().all(|e| !e.counts));
        assert!(
            n1.events[0].reason.contains("rule not_waiting"),
            "{:?}",
            n1.events[0]
        );
        assert!(
            n1.events[1].reason.contains("not waiting in step"),
            "{:?}",
            n1.events[1]
        );
        // Shown apart in the table, and with its reason in --json.
        let t = render(&h, 0.9);
        assert!(t.contains("(hang_user_code=2)"), "{t}");
        assert!(t.contains("not counted: "), "{t}");
        let j = serde_json::to_value(&h).unwrap();
        assert_eq!(j[0]["events"][0]["counts"], json!(false));
        // Nor in the textfile collector's count of failures.
        let p = render_prometheus(&h, 0.9, 2);
        assert!(!p.contains("resilio_node_failures{node=\"n1\""), "{p}");
        assert!(
            p.contains("resilio_node_seen_not_counted{node=\"n1\",class=\"hang_user_code\"} 2"),
            "{p}"
        );
        // And no attempt of theirs is an interruption of the fleet's.
        let j1 = vec![
            hang(
                "2026-11-01T00:00:00Z",
                "not_waiting",
                (1, "n1", Some("4242 python3: sleeping")),
            ),
            hang_judgment("2026-11-01T00:00:01Z", 1, "n1"),
        ];
        assert_eq!(interruptions("j1", &j1), 0);
    }

    #[test]
    fn a_judgment_that_blamed_nobody_is_nothing() {
        let recs = vec![
            hang(
                "2026-11-01T00:00:00Z",
                "undetermined",
                (
                    1,
                    "n1",
                    Some("4242 python3: uninterruptible sleep (disk or driver)"),
                ),
            ),
            // Ranks that stalled together: no node blamed.
            rec(
                "2026-11-01T00:00:01Z",
                "judgment",
                None,
                "n9",
                json!({"class": "hang", "primary_rank": 1, "primary_node": "n1", "blamed_nodes": []}),
            ),
            // A node named, but no rank.
            rec(
                "2026-11-01T00:00:02Z",
                "judgment",
                None,
                "n9",
                json!({"class": "hang", "primary_node": "n1", "blamed_nodes": ["n1"]}),
            ),
        ];
        assert!(events_of("j1", &recs).is_empty());
        assert!(history(&[("j1", recs)], "2026-11-01T00:01:00Z").is_empty());
    }

    #[test]
    fn a_rank_stuck_in_the_kernel_counts_as_infrastructure() {
        // The verdict's copy of the probe says so...
        let j1 = vec![
            hang(
                "2026-11-03T00:00:00Z",
                "not_waiting",
                (1, "n1", Some("4242 python3: uninterruptible sleep (disk or driver); no stacks: py-spy not on PATH")),
            ),
            hang_judgment("2026-11-03T00:00:01Z", 1, "n1"),
        ];
        // ... or, where the verdict has none, the rank's own probe record.
        let j2 = vec![
            hang("2026-11-03T00:00:00Z", "stopped_first", (2, "n2", None)),
            rec(
                "2026-11-03T00:00:00Z",
                "probe",
                Some(2),
                "n2",
                json!({"reason": "stall", "probe": {"waiting_on_peer": false,
                       "evidence": ["77 python3: uninterruptible sleep (disk or driver)"]}}),
            ),
            hang_judgment("2026-11-03T00:00:01Z", 2, "n2"),
        ];
        let h = history(&[("j1", j1.clone()), ("j2", j2)], "2026-11-03T00:01:00Z");
        for n in ["n1", "n2"] {
            let x = node(&h, n);
            assert_eq!(x.failures_by_class.get(HANG_KERNEL), Some(&1), "{x:#?}");
            assert!(x.events[0].counts);
            assert!(
                x.events[0].reason.contains("uninterruptible sleep"),
                "{x:#?}"
            );
        }
        assert!((node(&h, "n2").score - 1.0).abs() < 1e-3);
        assert_eq!(exclude_list(&h, 0.9), "n[1-2]");
        assert_eq!(interruptions("j1", &j1), 1);
    }

    #[test]
    fn a_hang_of_unknown_cause_counts_only_when_another_job_implicates_the_node() {
        // Job 1: two attempts blame n1 by steps alone, no probe either way.
        let j1 = vec![
            of(
                "r1",
                0,
                hang("2026-11-01T00:00:00Z", "behind", (1, "n1", None)),
            ),
            of("r1", 0, hang_judgment("2026-11-01T00:00:01Z", 1, "n1")),
            of(
                "r1",
                1,
                hang("2026-11-01T01:00:00Z", "stopped_first", (1, "n1", None)),
            ),
            of("r1", 1, hang_judgment("2026-11-01T01:00:01Z", 1, "n1")),
        ];
        let now = "2026-11-02T00:00:00Z";
        let h = history(&[("j1", j1.clone())], now);
        let n1 = node(&h, "n1");
        assert_eq!(n1.score, 0.0, "one job's hangs are likelier its own");
        assert_eq!(n1.failures_by_class.get(HANG_UNCONFIRMED), Some(&2));
        assert!(n1.events.iter().all(|e| !e.counts));
        assert!(render(&h, 0.9).contains("(hang_unconfirmed=2)"));
        // Job 2, without a coordinator (no job-wide verdict): n1 again.
        let j2 = vec![hang_judgment("2026-11-01T12:00:00Z", 0, "n1")];
        let h = history(&[("j1", j1.clone()), ("j2", j2)], now);
        let n1 = node(&h, "n1");
        assert_eq!(n1.failures_by_class.get(HANG), Some(&3), "{n1:#?}");
        assert!(n1
            .events
            .iter()
            .all(|e| e.counts && e.reason.contains("implicated in job")));
        assert!(
            n1.score > 1.35 && n1.score <= 1.5,
            "three halves, a day old at most: {}",
            n1.score
        );
        assert_eq!(exclude_list(&h, 0.9), "n1");
        assert_eq!(n1.jobs, ["j1", "j2"]);
        // An infrastructure failure of another job implicates it too; a
        // straggler does not.
        let xid = vec![rec(
            "2026-11-01T12:00:00Z",
            "failure",
            Some(0),
            "n1",
            json!({"class": "infrastructure", "evidence": "Xid 79"}),
        )];
        let slow = vec![rec(
            "2026-11-01T12:00:00Z",
            "straggler",
            None,
            "n9",
            json!({"straggler_node": "n1", "flagged": true}),
        )];
        let h = history(&[("j1", j1.clone()), ("j3", slow)], now);
        assert_eq!(
            node(&h, "n1").failures_by_class.get(HANG_UNCONFIRMED),
            Some(&2)
        );
        let h = history(&[("j1", j1), ("j4", xid)], now);
        let n1 = node(&h, "n1");
        assert_eq!(n1.failures_by_class.get(HANG), Some(&2));
        assert!(n1.score > 1.8 && n1.score <= 2.0, "{}", n1.score);
    }

    #[test]
    fn a_hang_is_read_with_the_verdict_of_its_own_run_and_attempt() {
        // A job id used twice: the first run's verdict (user code) says
        // nothing of the second run's hang at the same attempt number.
        let recs = vec![
            of(
                "first",
                0,
                hang(
                    "2026-11-01T00:00:00Z",
                    "not_waiting",
                    (1, "n1", Some("9 python3: sleeping")),
                ),
            ),
            of("first", 0, hang_judgment("2026-11-01T00:00:01Z", 1, "n1")),
            of("second", 0, hang_judgment("2026-11-05T00:00:01Z", 1, "n1")),
        ];
        let classes: Vec<String> = events_of("j1", &recs)
            .into_iter()
            .map(|(_, e)| e.class)
            .collect();
        assert_eq!(classes, [HANG_USER_CODE, HANG_UNCONFIRMED]);
    }

    #[test]
    fn probe_words_are_read_most_telling_first() {
        for (words, want) in [
            (
                "1 python3: uninterruptible sleep (disk or driver)",
                Seen::Kernel,
            ),
            (
                "1 python3: sleeping; 2 python3: uninterruptible sleep (disk or driver)",
                Seen::Kernel,
            ),
            ("1 python3: stopped (SIGSTOP or the like)", Seen::Stopped),
            (
                "1 python3: sleeping; 2 python3: blocked reading socket fd 3",
                Seen::Peer,
            ),
            (
                "1 python3: running on a CPU; output: Watchdog caught collective operation timeout",
                Seen::Peer,
            ),
            (
                "1 python3: sleeping (paused by resilio's own py-spy)",
                Seen::Own,
            ),
            ("1 python3: blocked reading fd 4 (not a socket)", Seen::Own),
            (
                "1 python3: blocked on a lock or condition (futex); no stacks: py-spy not on PATH",
                Seen::Nothing,
            ),
            ("1 python3: blocked in system call 16", Seen::Nothing),
            // Running shows no code of its own: NCCL spins there too.
            ("1 python3: running on a CPU", Seen::Running),
            (
                "1 python3: running on a CPU; 1 stack: not waiting in step (train.py:31)",
                Seen::Own,
            ),
        ] {
            assert_eq!(seen_in(words).0, want, "{words}");
        }
    }
}

#[cfg(test)]
mod sacct_tests {
    use super::*;
    use crate::slurm::AcctRecord;

    fn row(job: &str, state: &str, nodes: &[&str], end: &str) -> AcctRecord {
        AcctRecord {
            job_id: job.into(),
            state: state.into(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            start: end.into(),
            end: end.into(),
            ..Default::default()
        }
    }

    #[test]
    fn node_failures_from_sacct_are_shared_and_journaled_jobs_not_counted_twice() {
        let rows = vec![
            row("100", "NODE_FAIL", &["n3"], "2026-11-20T10:00:00"),
            row("101", "NODE_FAIL", &["n3", "n4"], "2026-11-21T10:00:00"),
            row("102", "NODE_FAIL", &["n5"], "2026-11-21T11:00:00"),
            row("103", "COMPLETED", &["n6"], "2026-11-21T11:00:00"),
        ];
        let ev = events_from_sacct(&rows, &["102".to_string()]);
        let of = |n: &str| {
            ev.iter()
                .filter(|(x, _)| x == n)
                .map(|(_, e)| e.share)
                .collect::<Vec<_>>()
        };
        assert_eq!(of("n3"), [1.0, 0.5]);
        assert_eq!(of("n4"), [0.5]);
        assert!(of("n5").is_empty(), "job 102 has a journal");
        assert!(of("n6").is_empty());
        assert!(ev
            .iter()
            .all(|(_, e)| e.source == "sacct" && e.class == "node_failure"));

        // Through build(): a fake Slurm's answer joins the journals'.
        let state = tempfile::tempdir().unwrap();
        let f = crate::slurm::fake::FakeSlurm::default();
        *f.node_fail_rows.lock().unwrap() = rows;
        let now: DateTime<Utc> = "2026-11-22T00:00:00Z".parse().unwrap();
        let (h, src) = build(
            state.path(),
            now,
            std::time::Duration::from_secs(7 * 86400),
            Some(&f),
        );
        assert_eq!(src.sacct_node_failures, Some(4));
        let n3 = h.iter().find(|x| x.node == "n3").unwrap();
        let n4 = h.iter().find(|x| x.node == "n4").unwrap();
        assert!(n3.score > n4.score && n4.score > 0.0);
        assert!(
            f.calls()
                .iter()
                .any(|c| c.starts_with("node_failures 2026-09-27")),
            "{:?}",
            f.calls()
        );
        // Without sacct: said so, nothing invented.
        f.fail("node_failures", "sacct: command not found");
        let (h, src) = build(
            state.path(),
            now,
            std::time::Duration::from_secs(7 * 86400),
            Some(&f),
        );
        assert!(h.is_empty() && src.sacct_error.is_some());
    }

    fn blame(job: &str, node: &str, ts: &str) -> (String, NodeEvent) {
        (
            node.to_string(),
            NodeEvent {
                ts: ts.parse().unwrap(),
                job: job.into(),
                class: "infrastructure".into(),
                evidence: "Xid 79".into(),
                share: 1.0,
                source: "journal",
                counts: true,
                reason: String::new(),
                owner: String::new(),
                trusted: true,
            },
        )
    }

    fn acct(job: &str, uid: u32, nodes: &[&str], start: &str, end: &str) -> AcctRecord {
        AcctRecord {
            job_id: job.into(),
            state: "COMPLETED".into(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            start: start.into(),
            end: end.into(),
            uid: Some(uid),
            ..Default::default()
        }
    }

    #[test]
    fn another_users_journal_is_believed_only_where_slurm_agrees_and_alone_lists_no_node() {
        // Slurm prints local time; the events are UTC.
        let local = |t: &str| {
            t.parse::<DateTime<Utc>>()
                .unwrap()
                .with_timezone(&chrono::Local)
                .format("%Y-%m-%dT%H:%M:%S")
                .to_string()
        };
        let (t0, t1) = (local("2026-11-20T10:00:00Z"), local("2026-11-20T12:00:00Z"));
        let (alice, bob, admin) = (1001, 1002, 5000);
        let rows = vec![
            acct("200", alice, &["n1"], &t0, &t1),
            acct("201", alice, &["n1"], &t0, &t1),
            acct("202", bob, &["n1"], &t0, &t1),
            acct("203", alice, &["n1"], &t0, &t1),
            acct("204", bob, &["n1", "n9"], &t0, "Unknown"),
        ];
        let j = |job: &str, uid: u32, ev: Vec<(String, NodeEvent)>| Journaled {
            job: job.into(),
            uid,
            events: ev,
        };
        let one =
            |job: &str, uid: u32, node: &str, ts: &str| j(job, uid, vec![blame(job, node, ts)]);
        let now: DateTime<Utc> = "2026-11-20T13:00:00Z".parse().unwrap();
        let journals = || {
            vec![
                // Slurm agrees: alice's job, on n1, in its time.
                one("200", alice, "n1", "2026-11-20T11:00:00Z"),
                // A node the job never had.
                one("201", alice, "n7", "2026-11-20T11:00:00Z"),
                // Bob's job, in a journal alice owns.
                one("202", alice, "n1", "2026-11-20T11:00:00Z"),
                // Years after the job ended.
                one("203", alice, "n1", "2030-01-01T00:00:00Z"),
                // Bob's running job (no end yet), on n9.
                one("204", bob, "n9", "2026-11-20T12:30:00Z"),
                // Runs outside Slurm: another user's, and the caller's own.
                one("local-1", alice, "n5", "2026-11-20T11:00:00Z"),
                one("local-2", admin, "n6", "2026-11-20T11:00:00Z"),
            ]
        };
        let (kept, dropped) = vouch(journals(), Ok(&rows), admin, now);
        let on: Vec<(&str, &str, bool)> = kept
            .iter()
            .map(|(n, e)| (n.as_str(), e.job.as_str(), e.trusted))
            .collect();
        assert_eq!(
            on,
            [
                ("n1", "200", false),
                ("n9", "204", false),
                ("n6", "local-2", true)
            ]
        );
        let reasons: Vec<(&str, usize)> = dropped.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(
            reasons,
            [
                ("a journal whose owner is not the job's user in Slurm's accounting", 1),
                ("an event on a node or at a time outside the job's allocations in Slurm's accounting", 2),
                ("another user's journal of a job Slurm's accounting does not know", 1),
            ]
        );
        // Without sacct: only the caller's (and root's) own.
        let (kept, dropped) = vouch(journals(), Err("sacct: command not found"), admin, now);
        assert_eq!(kept.len(), 1);
        assert_eq!(dropped.values().sum::<usize>(), 6);
        assert!(dropped
            .keys()
            .all(|k| k.contains("sacct: command not found")));

        // One user's verified blame alone never lists a node; two users' do.
        let hl = std::time::Duration::from_secs(7 * 86400);
        let scored = |evs: Vec<(String, NodeEvent)>| {
            let mut by: BTreeMap<String, Vec<NodeEvent>> = BTreeMap::new();
            for (n, e) in evs {
                by.entry(n).or_default().push(e);
            }
            from_events(by, now, hl)
        };
        let alice_only = vouch(
            vec![
                one("200", alice, "n1", "2026-11-20T11:00:00Z"),
                one("201", alice, "n1", "2026-11-20T11:30:00Z"),
            ],
            Ok(&rows),
            admin,
            now,
        )
        .0;
        let h = scored(alice_only.clone());
        assert!(h[0].score >= 1.0 && !h[0].listable && !h[0].listed(1.0));
        assert_eq!(exclude_list(&h, 1.0), "");
        assert!(render(&h, 1.0).contains("not listed: one user's jobs alone"));
        let mut both = alice_only;
        both.extend(
            vouch(
                vec![one("204", bob, "n1", "2026-11-20T12:30:00Z")],
                Ok(&rows),
                admin,
                now,
            )
            .0,
        );
        let h = scored(both);
        assert!(h[0].listed(1.0));
        assert_eq!(exclude_list(&h, 1.0), "n1");
        // The admin's (or Slurm's) word alone lists it.
        let h = scored(vec![blame("local-2", "n6", "2026-11-20T11:00:00Z")]);
        assert!(h[0].listed(0.5));
    }
}
