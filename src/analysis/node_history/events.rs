//! Events against nodes: from a job's journal, and from Slurm's accounting.

use super::class_counts;
use super::hang::{attempt_views, hang_blame};
use super::NodeEvent;
use crate::event::{Class, Event};
use crate::journal::Record;

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
            Event::Failure(f) => failure_blame(r, f, &mut push),
            Event::Judgment(j) if j.class == Class::Hang => {
                let evidence = j.evidence.clone();
                let view = views.get(&(r.run(), r.attempt));
                for n in &j.blamed_nodes {
                    if let Some((class, reason)) = hang_blame(j, n, view) {
                        push(n, r, class, evidence.clone(), reason);
                    }
                }
            }
            Event::HealthCheck(h) => health_check_blame(r, h, &mut push),
            // A straggler record has no text of its own to give as evidence.
            Event::Straggler(x) if x.flagged => {
                if let Some(node) = Some(x.straggler_node.as_str()) {
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

/// A `failure` record's blame: the node it names, else a rank's own
/// infrastructure failure with evidence from its output, on its own node.
fn failure_blame(
    r: &Record,
    f: &crate::event::Failure,
    push: &mut impl FnMut(&str, &Record, &str, String, String),
) {
    let class = f.class.map_or("", Class::name);
    let evidence = f.evidence.clone().unwrap_or_default();
    if let Some(node) = &f.blamed_node {
        let (c, reason) = if f.failure_kind == Some(crate::event::FailureKind::NodeFailure) {
            ("node_failure", "the node failed (Slurm)".to_string())
        } else if f.failure_kind == Some(crate::event::FailureKind::AgentDied) {
            // resilio's own part: a kill -9, the OOM killer, or a bug of
            // resilio's own tell nothing about the node.
            (
                "agent_died",
                "a rank's agent died and left no record: no evidence against the node".to_string(),
            )
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
                "the rank's infrastructure failure, with evidence from its output".to_string();
            push(node, r, class, evidence, reason);
        }
    }
}

/// A failed health check, on the node it ran on.
fn health_check_blame(
    r: &Record,
    h: &crate::event::HealthCheck,
    push: &mut impl FnMut(&str, &Record, &str, String, String),
) {
    let result = Some(&h.result);
    let failed = result.and_then(|v| v.ok) == Some(false);
    if failed {
        if let Some(node) = &r.node {
            let out = result.and_then(|v| v.output.as_deref()).unwrap_or("");
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
