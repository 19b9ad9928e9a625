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

mod build;
mod events;
mod fleet;
mod hang;
mod render;
mod score;
mod trust;

pub use build::{build, Sources};
pub use events::{events_from_sacct, events_of};
pub use fleet::{fleet_rate, interruptions, FleetRate};
pub use hang::hang_is_software;
pub use render::{exclude_list, render, render_prometheus};
pub use score::from_events;
pub use trust::{vouch, Journaled};

use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;

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

#[cfg(test)]
mod tests {
    use super::hang::{seen_in, Sighting};
    use super::*;
    use crate::journal::Record;
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
            ..Default::default()
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

    /// A rank's agent that died without a word (kill -9, the OOM killer)
    /// is journaled as an infrastructure failure blamed on its node; the
    /// node history shows it, held against nothing (trial 14: one kill -9
    /// of an agent listed the node for exclusion).
    #[test]
    fn an_agents_death_is_shown_and_not_held_against_its_node() {
        let recs = vec![rec(
            "2026-11-01T00:00:00Z",
            "failure",
            None,
            "n1",
            json!({"class": "infrastructure", "failure_kind": "agent_died", "blamed_node": "n2", "cause": "the agent of rank 1 died", "evidence": "the agent of rank 1 was killed by SIGKILL and left no record"}),
        )];
        let ev = events_of("9", &recs);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0].0, "n2");
        assert!(!ev[0].1.counts, "{ev:?}");
        assert!(ev[0].1.reason.contains("no evidence against the node"));
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
                Sighting::Kernel,
            ),
            (
                "1 python3: sleeping; 2 python3: uninterruptible sleep (disk or driver)",
                Sighting::Kernel,
            ),
            (
                "1 python3: stopped (SIGSTOP or the like)",
                Sighting::Stopped,
            ),
            (
                "1 python3: sleeping; 2 python3: blocked reading socket fd 3",
                Sighting::Peer,
            ),
            (
                "1 python3: running on a CPU; output: Watchdog caught collective operation timeout",
                Sighting::Peer,
            ),
            (
                "1 python3: sleeping (paused by resilio's own py-spy)",
                Sighting::Own,
            ),
            (
                "1 python3: blocked reading fd 4 (not a socket)",
                Sighting::Own,
            ),
            (
                "1 python3: blocked on a lock or condition (futex); no stacks: py-spy not on PATH",
                Sighting::Nothing,
            ),
            ("1 python3: blocked in system call 16", Sighting::Nothing),
            // Running shows no code of its own: NCCL spins there too.
            ("1 python3: running on a CPU", Sighting::Running),
            (
                "1 python3: running on a CPU; 1 stack: not waiting in step (train.py:31)",
                Sighting::Own,
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

    /// A job resilio requeued: sacct's row of the job has only its last
    /// allocation; the earlier one is in its step's row (`J.0`), which
    /// vouches for an event there. Another job's id that merely begins
    /// the same (`2050`) vouches for nothing.
    #[test]
    fn the_earlier_allocation_of_a_requeued_job_is_vouched_for_by_its_steps() {
        let local = |t: &str| {
            t.parse::<DateTime<Utc>>()
                .unwrap()
                .with_timezone(&chrono::Local)
                .format("%Y-%m-%dT%H:%M:%S")
                .to_string()
        };
        let (t0, t1, t2) = (
            local("2026-11-20T10:00:00Z"),
            local("2026-11-20T10:05:00Z"),
            local("2026-11-20T11:00:00Z"),
        );
        let (alice, admin) = (1001, 5000);
        let mut step = acct("205.0", alice, &["n1", "n2"], &t0, &t1);
        step.uid = None;
        let rows = vec![
            acct("205", alice, &["n3", "n4"], &t1, &t2),
            step,
            acct("2050", alice, &["n7"], &t0, &t2),
        ];
        let journal = |node: &str| Journaled {
            job: "205".into(),
            uid: alice,
            events: vec![blame("205", node, "2026-11-20T10:03:00Z")],
        };
        let now: DateTime<Utc> = "2026-11-20T13:00:00Z".parse().unwrap();
        let (kept, dropped) = vouch(vec![journal("n2")], Ok(&rows), admin, now);
        assert_eq!(kept.len(), 1, "{dropped:?}");
        assert_eq!(kept[0].0, "n2");
        let (kept, _) = vouch(vec![journal("n7")], Ok(&rows), admin, now);
        assert!(kept.is_empty(), "another job's row vouched: {kept:?}");
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
