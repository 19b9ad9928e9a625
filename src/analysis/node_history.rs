//! Node history for admins (`resilio nodes`): failures blamed on each node
//! across every journal under the state dir, with a score that decays with
//! time so that a repaired node recovers.
//!
//! What counts against a node: a `failure` that names it (`blamed_node`, or
//! a rank's own infrastructure failure with evidence from its output), a
//! job-level `judgment` that blamed it, a failed `health_check` on it, a
//! flagged straggler, and, from Slurm's accounting (`sacct`, where it
//! exists), every job of any user that ended in NODE_FAIL on it. Slurm does
//! not say which node of a multi-node allocation failed, so such a failure
//! is shared among its nodes (`share` 1/N); jobs with a journal here are
//! counted from the journal alone. Peers' echoes (`secondary`), user errors
//! and preemptions never count.

use crate::event::{Class, Event};
use crate::journal::{self, Record};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One event held against a node.
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
}

/// A node's history.
#[derive(Clone, Debug, Serialize)]
pub struct NodeHistory {
    pub node: String,
    pub score: f64,
    pub failures_by_class: BTreeMap<String, u32>,
    pub jobs: Vec<String>,
    pub last_seen: DateTime<Utc>,
    pub events: Vec<NodeEvent>,
}

/// Weight of an event class in the score.
fn weight(class: &str) -> f64 {
    match class {
        "infrastructure" | "health_check" | "node_failure" => 1.0,
        "hang" => 0.5,
        "straggler" => 0.2,
        _ => 0.0,
    }
}

/// Events against nodes found in one job's records.
pub fn events_of<'a>(
    job: &str,
    records: impl IntoIterator<Item = &'a Record>,
) -> Vec<(String, NodeEvent)> {
    let mut out = Vec::new();
    let mut push = |node: &str, r: &Record, class: &str, evidence: String| {
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
                    let c = if f.failure_kind.as_deref() == Some("node_failure") {
                        "node_failure"
                    } else {
                        class
                    };
                    push(node, r, c, evidence);
                } else if class == "infrastructure" && r.rank.is_some() && f.evidence.is_some() {
                    // A rank's own infrastructure signature, on its own node.
                    if let Some(node) = &r.node {
                        push(node, r, class, evidence);
                    }
                }
            }
            Event::Judgment(j) if j.class == Some(Class::Hang) => {
                let evidence = j.evidence.clone().unwrap_or_default();
                for n in j.blamed_nodes.iter().flatten() {
                    push(n, r, "hang", evidence.clone());
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
                        );
                    }
                }
            }
            // A straggler record has no text of its own to give as evidence.
            Event::Straggler(x) if x.flagged != Some(false) => {
                if let Some(node) = x.straggler_node.as_deref().or(r.node.as_deref()) {
                    push(node, r, "straggler", String::new());
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
/// within `window` of `now`.
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
    for (root, job, modified) in all_jobs(state_dir) {
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
                .any(|(_, e)| e.class != "straggler" && weight(&e.class) > 0.0)
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
}

/// Build every node's history from all journals under `state_dir` (and
/// Slurm's NODE_FAIL records since a window of eight half-lives, when
/// `slurm` is given), scores decayed to `now` with `half_life`.
pub fn build(
    state_dir: &Path,
    now: DateTime<Utc>,
    half_life: std::time::Duration,
    slurm: Option<&dyn crate::slurm::Slurm>,
) -> (Vec<NodeHistory>, Sources) {
    let mut by_node: BTreeMap<String, Vec<NodeEvent>> = BTreeMap::new();
    let mut sources = Sources::default();
    let mut known = Vec::new();
    for (root, job, _) in all_jobs(state_dir) {
        let Ok(j) = journal::read_job(&journal::job_dir(&root, &job)) else {
            continue;
        };
        sources.journals += 1;
        for (node, ev) in events_of(&job, &j.records) {
            by_node.entry(node).or_default().push(ev);
        }
        known.push(job);
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
            let score = events
                .iter()
                .map(|e| {
                    let age = ((now - e.ts).num_milliseconds() as f64 / 1000.0).max(0.0);
                    weight(&e.class) * e.share * 0.5f64.powf(age / hl)
                })
                .sum();
            let mut failures_by_class = BTreeMap::new();
            let mut jobs: Vec<String> = Vec::new();
            for e in &events {
                *failures_by_class.entry(e.class.clone()).or_insert(0) += 1;
                if !jobs.contains(&e.job) {
                    jobs.push(e.job.clone());
                }
            }
            NodeHistory {
                node,
                score,
                failures_by_class,
                jobs,
                last_seen: events.last().map(|e| e.ts).unwrap_or(now),
                events,
            }
        })
        .collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.node.cmp(&b.node)));
    out
}

/// Nodes at or above `threshold`, as a Slurm hostlist expression.
/// The node history for node_exporter's textfile collector (Prometheus
/// text format): per node its score, whether it is listed at `threshold`,
/// its failures by class and its jobs; and the fleet's totals. `jobs`: how
/// many job journals were read.
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
                    u8::from(h.score >= threshold).to_string(),
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
                h.failures_by_class.iter().map(move |(c, n)| {
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
        for (c, n) in &h.failures_by_class {
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
                .filter(|h| h.score >= threshold)
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

pub fn exclude_list(history: &[NodeHistory], threshold: f64) -> String {
    let bad: Vec<&str> = history
        .iter()
        .filter(|h| h.score >= threshold)
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
    for h in history {
        let classes: Vec<String> = h
            .failures_by_class
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let last = h.events.last().map(|e| e.evidence.as_str()).unwrap_or("");
        let _ = writeln!(
            s,
            "{:<16} {:>6.2}{} {:<40} {:<20} {}",
            h.node,
            h.score,
            if h.score >= threshold { "*" } else { " " },
            classes.join(" "),
            h.last_seen.format("%Y-%m-%d %H:%M"),
            last.chars().take(100).collect::<String>()
        );
    }
    let _ = writeln!(
        s,
        "(* score >= {threshold}: in `resilio nodes --exclude-list`)"
    );
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
}
