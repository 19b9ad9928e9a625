//! Restart storms across a state dir: the jobs that restarted more than a
//! threshold within a window, the failures behind them, and the nodes they
//! share; for an admin's cron job or node_exporter's textfile collector
//! (`resilio fleet`).
//!
//! [`restarts_of`] and [`storms`] are pure (the window's start is passed
//! in); [`scan`] reads the journals.

use crate::event::Event;
use crate::journal::Record;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One job's restarts within the window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobRestarts {
    pub job: String,
    /// Who owns its journal.
    pub owner: String,
    /// Attempts that began within the window after an earlier one
    /// (restarted in place, relaunched in the allocation, or requeued).
    pub restarts: u32,
    /// When the last of them began.
    pub last_restart: Option<DateTime<Utc>>,
    /// The failures decided on within the window, by class.
    pub failures: BTreeMap<String, u32>,
    /// The nodes its ranks ran on within the window.
    pub nodes: BTreeSet<String>,
}

/// A node that jobs in a storm share.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SharedNode {
    pub node: String,
    pub jobs: Vec<String>,
}

/// The state dir's restart storms.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Storms {
    pub window_s: u64,
    /// A job restarting more than this many times in the window is in a storm.
    pub threshold: u32,
    /// Jobs whose journals were written within the window (the others
    /// cannot have restarted in it).
    pub jobs_read: usize,
    /// Restarts of every job read, within the window.
    pub restarts: u32,
    /// The jobs in a storm, most restarts first.
    pub jobs: Vec<JobRestarts>,
    /// Nodes two or more jobs in a storm ran on.
    pub shared_nodes: Vec<SharedNode>,
    /// Every job's recoveries whose fault fell within the window, by
    /// failure class: each phase's p50/p99 ([`crate::analysis::recovery`]).
    pub recoveries_by_class: Vec<crate::analysis::recovery::ClassRecoveries>,
    /// Those recoveries themselves, for the histograms.
    #[serde(skip)]
    pub recoveries: Vec<crate::analysis::recovery::Recovery>,
}

/// `job`'s restarts since `since`, from its records.
pub fn restarts_of(
    job: &str,
    owner: &str,
    records: &[Record],
    since: DateTime<Utc>,
) -> JobRestarts {
    // Each attempt's first record: when it began. A job id used again
    // starts another run, whose attempts count apart.
    let mut began: BTreeMap<(Option<&str>, u32), DateTime<Utc>> = BTreeMap::new();
    let mut out = JobRestarts {
        job: job.into(),
        owner: owner.into(),
        ..JobRestarts::default()
    };
    for r in records {
        let first = began.entry((r.run(), r.attempt)).or_insert(r.ts);
        *first = (*first).min(r.ts);
        if r.ts < since {
            continue;
        }
        if let (Some(node), Some(_)) = (&r.node, r.rank) {
            out.nodes.insert(node.clone());
        }
        if let Some(Event::Decision(d)) = r.event() {
            let finished = matches!(d.decision, Some(crate::policy::restart::Action::Finish));
            if let (Some(class), false) = (d.outcome.class, finished) {
                *out.failures.entry(class.name().to_string()).or_default() += 1;
            }
        }
    }
    for (&(_, attempt), &at) in &began {
        if attempt > 0 && at >= since {
            out.restarts += 1;
            out.last_restart = out.last_restart.max(Some(at));
        }
    }
    out
}

/// The jobs restarting more than `threshold` times, and the nodes two or
/// more of them share.
pub fn storms(jobs: Vec<JobRestarts>, threshold: u32, window: std::time::Duration) -> Storms {
    let jobs_read = jobs.len();
    let restarts = jobs.iter().map(|j| j.restarts).sum();
    let mut storming: Vec<JobRestarts> = jobs
        .into_iter()
        .filter(|j| j.restarts > threshold)
        .collect();
    storming.sort_by(|a, b| b.restarts.cmp(&a.restarts).then(a.job.cmp(&b.job)));
    let mut by_node: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for j in &storming {
        for n in &j.nodes {
            by_node.entry(n).or_default().push(j.job.clone());
        }
    }
    let shared_nodes = by_node
        .into_iter()
        .filter(|(_, jobs)| jobs.len() > 1)
        .map(|(node, jobs)| SharedNode {
            node: node.into(),
            jobs,
        })
        .collect();
    Storms {
        window_s: window.as_secs(),
        threshold,
        jobs_read,
        restarts,
        jobs: storming,
        shared_nodes,
        ..Storms::default()
    }
}

/// Read every job under `state_dir` (every user's, where it is shared)
/// written within `window` before `now`.
pub fn scan(
    state_dir: &Path,
    now: DateTime<Utc>,
    window: std::time::Duration,
    threshold: u32,
) -> Storms {
    let since = now - chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
    let mut recoveries = Vec::new();
    let jobs = crate::analysis::jobs::every_job(state_dir, Some(since.into()))
        .into_iter()
        .map(|j| {
            let owner = crate::state_dir::name_of(j.uid);
            let restarts = restarts_of(&j.job, &owner, &j.journal.records, since);
            for run in crate::runs::split(j.journal.records) {
                recoveries.extend(
                    crate::analysis::recovery::recoveries(&run.records)
                        .into_iter()
                        .filter(|r| r.fault >= since),
                );
            }
            restarts
        })
        .collect();
    let mut s = storms(jobs, threshold, window);
    s.recoveries_by_class = crate::analysis::recovery::by_class(&recoveries);
    s.recoveries = recoveries;
    s
}

/// The recoveries by class, for people: one line per class.
fn render_recoveries(s: &Storms) -> String {
    let mut out = String::new();
    if s.recoveries_by_class.is_empty() {
        return out;
    }
    let secs = |v: f64| crate::duration::format(std::time::Duration::from_secs_f64(v));
    out += "recoveries within the window, by failure class (n; each phase's p50/p99):\n";
    for c in &s.recoveries_by_class {
        let phases = crate::analysis::recovery::spread_line(&c.phases, secs);
        out += &format!("  {} ({}): {phases}\n", c.class, c.n);
    }
    out
}

/// `resilio_fleet_recovery_seconds`: one histogram per failure class and
/// phase (and `total`), over the recoveries within the window.
fn recovery_histograms(s: &Storms, out: &mut String) {
    use super::prometheus::esc;
    let mut groups: BTreeMap<(String, &str), Vec<f64>> = BTreeMap::new();
    for r in &s.recoveries {
        let class = r.class.clone().unwrap_or_else(|| "unknown".into());
        for (phase, v) in r.all_phases() {
            if let Some(v) = v {
                groups.entry((class.clone(), phase)).or_default().push(v);
            }
        }
        groups.entry((class, "total")).or_default().push(r.total_s);
    }
    *out += "# HELP resilio_fleet_recovery_seconds Seconds of each phase of the recoveries within the window, by failure class\n# TYPE resilio_fleet_recovery_seconds histogram\n";
    for ((class, phase), values) in groups {
        let labels = format!("class=\"{}\",phase=\"{}\"", esc(&class), esc(phase));
        for le in crate::coordinator::metrics::BUCKETS_S {
            let n = values.iter().filter(|v| **v <= le).count();
            *out += &format!("resilio_fleet_recovery_seconds_bucket{{{labels},le=\"{le}\"}} {n}\n");
        }
        *out += &format!(
            "resilio_fleet_recovery_seconds_bucket{{{labels},le=\"+Inf\"}} {}\n",
            values.len()
        );
        *out += &format!(
            "resilio_fleet_recovery_seconds_sum{{{labels}}} {}\n",
            values.iter().sum::<f64>()
        );
        *out += &format!(
            "resilio_fleet_recovery_seconds_count{{{labels}}} {}\n",
            values.len()
        );
    }
}

/// For people (and cron's mail): the storms, or one line saying there is none.
pub fn render_text(s: &Storms) -> String {
    let window = crate::duration::format(std::time::Duration::from_secs(s.window_s));
    if s.jobs.is_empty() {
        return format!(
            "no restart storm in the last {window}: no job restarted more than {} time(s) ({} job(s) read, {} restart(s))\n{}",
            s.threshold,
            s.jobs_read,
            s.restarts,
            render_recoveries(s)
        );
    }
    let mut out = format!(
        "restart storms in the last {window}: {} job(s) restarted more than {} time(s) ({} job(s) read, {} restart(s))\n",
        s.jobs.len(),
        s.threshold,
        s.jobs_read,
        s.restarts
    );
    for j in &s.jobs {
        let failures: Vec<String> = j.failures.iter().map(|(c, n)| format!("{c} {n}")).collect();
        out += &format!(
            "  job {} ({}): {} restart(s), the last at {}; failures: {}; nodes: {}\n",
            j.job,
            j.owner,
            j.restarts,
            j.last_restart
                .map_or("?".into(), |t| t.format("%Y-%m-%d %H:%M:%SZ").to_string()),
            if failures.is_empty() {
                "none decided".into()
            } else {
                failures.join(", ")
            },
            if j.nodes.is_empty() {
                "?".into()
            } else {
                j.nodes.iter().cloned().collect::<Vec<_>>().join(",")
            }
        );
    }
    if !s.shared_nodes.is_empty() {
        out += "nodes shared by jobs in a storm:\n";
        for n in &s.shared_nodes {
            out += &format!("  {}: jobs {}\n", n.node, n.jobs.join(", "));
        }
    }
    out + &render_recoveries(s)
}

/// Prometheus text format, for node_exporter's textfile collector.
pub fn render_prometheus(s: &Storms) -> String {
    use super::prometheus::{esc, family};
    let mut out = String::new();
    family(
        &mut out,
        "fleet_storming_jobs",
        "gauge",
        "Jobs that restarted more than the threshold within the window",
        vec![(String::new(), s.jobs.len().to_string())],
    );
    family(
        &mut out,
        "fleet_window_restarts",
        "gauge",
        "Restarts of every job within the window",
        vec![(String::new(), s.restarts.to_string())],
    );
    family(
        &mut out,
        "fleet_job_restarts",
        "gauge",
        "Restarts within the window of each job in a storm",
        s.jobs
            .iter()
            .map(|j| {
                (
                    format!("{{job=\"{}\",user=\"{}\"}}", esc(&j.job), esc(&j.owner)),
                    j.restarts.to_string(),
                )
            })
            .collect(),
    );
    family(
        &mut out,
        "fleet_storm_node_jobs",
        "gauge",
        "Jobs in a storm that ran on the node within the window (nodes of two or more)",
        s.shared_nodes
            .iter()
            .map(|n| {
                (
                    format!("{{node=\"{}\"}}", esc(&n.node)),
                    n.jobs.len().to_string(),
                )
            })
            .collect(),
    );
    recovery_histograms(s, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn rec(
        kind: &str,
        attempt: u32,
        rank: Option<u32>,
        node: &str,
        at: i64,
        data: Value,
    ) -> Record {
        Record {
            v: 1,
            ts: DateTime::from_timestamp(1_800_000_000 + at, 0).unwrap(),
            kind: kind.into(),
            attempt,
            rank,
            node: Some(node.into()),
            data: data.as_object().cloned().unwrap_or_default(),
            ..Default::default()
        }
    }

    /// A job of `attempts` attempts a minute apart from `start`, each
    /// failing with `class` on `node` but the last.
    fn job(start: i64, attempts: u32, node: &str, class: &str) -> Vec<Record> {
        let mut v = Vec::new();
        for a in 0..attempts {
            let at = start + 60 * a as i64;
            v.push(rec("rank_start", a, Some(0), node, at, json!({})));
            v.push(rec("rank_start", a, Some(1), "n9", at, json!({})));
            if a + 1 < attempts {
                v.push(rec(
                    "decision",
                    a,
                    None,
                    "n0",
                    at + 30,
                    json!({ "outcome": { "class": class, "signature": "x" }, "decision": { "action": "restart_in_place", "reason": "r" } }),
                ));
            }
        }
        v
    }

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn a_jobs_restarts_are_the_attempts_begun_in_the_window() {
        // Attempts at 0, 60, ..., 300: five restarts, four since 120.
        let r = restarts_of("7", "alice", &job(0, 6, "n1", "hang"), at(120));
        assert_eq!(r.restarts, 4);
        assert_eq!(r.last_restart, Some(at(300)));
        // Decisions at 150, 210, 270 (the one at 90 is before the window).
        assert_eq!(r.failures, BTreeMap::from([("hang".to_string(), 3)]));
        assert_eq!(
            r.nodes,
            BTreeSet::from(["n1".to_string(), "n9".to_string()])
        );
        // Nothing in the window: no restart, no node.
        let old = restarts_of("7", "alice", &job(0, 6, "n1", "hang"), at(1000));
        assert_eq!((old.restarts, old.nodes.len()), (0, 0));
        // A job id used again: the second run's first attempt is no restart.
        let mut two = job(0, 2, "n1", "hang");
        two.extend(job(500, 1, "n1", "hang"));
        for r in &mut two[5..] {
            r.data.insert("run".into(), json!("second"));
        }
        assert_eq!(restarts_of("7", "a", &two, at(0)).restarts, 1);
    }

    #[test]
    fn jobs_past_the_threshold_are_named_with_the_nodes_they_share() {
        let w = std::time::Duration::from_secs(3600);
        let jobs = vec![
            restarts_of("10", "alice", &job(0, 6, "n1", "infrastructure"), at(0)),
            restarts_of("11", "bob", &job(0, 5, "n1", "hang"), at(0)),
            restarts_of("12", "carol", &job(0, 4, "n2", "hang"), at(0)),
            restarts_of("13", "dave", &job(0, 1, "n1", "hang"), at(0)),
        ];
        let s = storms(jobs, 3, w);
        let named: Vec<(&str, u32)> = s
            .jobs
            .iter()
            .map(|j| (j.job.as_str(), j.restarts))
            .collect();
        assert_eq!(named, [("10", 5), ("11", 4)]);
        assert_eq!((s.jobs_read, s.restarts), (4, 5 + 4 + 3));
        let shared: Vec<(&str, usize)> = s
            .shared_nodes
            .iter()
            .map(|n| (n.node.as_str(), n.jobs.len()))
            .collect();
        assert_eq!(shared, [("n1", 2), ("n9", 2)]);
        let text = render_text(&s);
        assert!(
            text.starts_with("restart storms in the last 1h00m: 2 job(s)"),
            "{text}"
        );
        assert!(text.contains("job 10 (alice): 5 restart(s)"), "{text}");
        assert!(text.contains("failures: infrastructure 5"), "{text}");
        assert!(text.contains("  n1: jobs 10, 11"), "{text}");
        let prom = render_prometheus(&s);
        assert!(prom.contains("resilio_fleet_storming_jobs 2\n"), "{prom}");
        assert!(prom.contains("resilio_fleet_job_restarts{job=\"10\",user=\"alice\"} 5\n"));
        assert!(prom.contains("resilio_fleet_storm_node_jobs{node=\"n1\"} 2\n"));
        assert!(prom.contains("resilio_fleet_window_restarts 12\n"));
        // None past the threshold: one line, and zero in the metrics.
        let calm = storms(
            vec![restarts_of("13", "d", &job(0, 2, "n1", "hang"), at(0))],
            3,
            w,
        );
        assert!(render_text(&calm).starts_with("no restart storm in the last 1h00m"));
        assert!(render_prometheus(&calm).contains("resilio_fleet_storming_jobs 0\n"));
    }
}
