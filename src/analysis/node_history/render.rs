//! The node history shown: for humans, as an exclude list, for Prometheus.

use super::{class_counts, NodeHistory};
use crate::analysis::prometheus::{esc, family};
use std::collections::BTreeMap;

/// The node history for node_exporter's textfile collector (Prometheus
/// text format): per node its score, whether it is listed at `threshold`,
/// its failures by class (those held against it; the others apart) and its
/// jobs; and the fleet's totals. `jobs`: how many job journals were read.
pub fn render_prometheus(history: &[NodeHistory], threshold: f64, jobs: usize) -> String {
    let mut out = String::new();
    node_families(&mut out, history, threshold);
    fleet_families(&mut out, history, threshold, jobs);
    out
}

/// A node's label.
fn node(h: &NodeHistory) -> String {
    format!("node=\"{}\"", esc(&h.node))
}

/// Per node: its score, whether it is listed, its failures by class (those
/// held against it; the others apart) and its jobs.
fn node_families(out: &mut String, history: &[NodeHistory], threshold: f64) {
    family(
        out,
        "node_score",
        "gauge",
        "Failures held against the node, each 1.0 when new and halving every half-life",
        history
            .iter()
            .map(|h| (format!("{{{}}}", node(h)), format!("{:.4}", h.score)))
            .collect(),
    );
    family(
        out,
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
        out,
        "node_failures",
        "gauge",
        "Failures held against the node, by class",
        by_class(history, true),
    );
    family(
        out,
        "node_seen_not_counted",
        "gauge",
        "Events seen on the node but not held against it (hangs in the trainer's own code, unconfirmed hangs), by class",
        by_class(history, false),
    );
    family(
        out,
        "node_jobs",
        "gauge",
        "Jobs in which the node had failures held against it",
        history
            .iter()
            .map(|h| (format!("{{{}}}", node(h)), h.jobs.len().to_string()))
            .collect(),
    );
}

/// The fleet's totals: failures by class, nodes listed, journals read.
fn fleet_families(out: &mut String, history: &[NodeHistory], threshold: f64, jobs: usize) {
    let mut by_class: BTreeMap<&str, u32> = BTreeMap::new();
    for h in history {
        for (c, n) in h.failures_by_class.iter().filter(|(c, _)| class_counts(c)) {
            *by_class.entry(c).or_default() += n;
        }
    }
    family(
        out,
        "fleet_failures",
        "gauge",
        "Failures held against any node, by class",
        by_class
            .iter()
            .map(|(c, n)| (format!("{{class=\"{}\"}}", esc(c)), n.to_string()))
            .collect(),
    );
    family(
        out,
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
        out,
        "fleet_jobs",
        "gauge",
        "Job journals read",
        vec![(String::new(), jobs.to_string())],
    );
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

/// Each node's failures by class: those held against it (`counted`), or
/// those only seen on it.
fn by_class(history: &[NodeHistory], counted: bool) -> Vec<(String, String)> {
    history
        .iter()
        .flat_map(|h| {
            h.failures_by_class
                .iter()
                .filter(move |(c, _)| class_counts(c) == counted)
                .map(move |(c, n)| {
                    (
                        format!("{{{},class=\"{}\"}}", node(h), esc(c)),
                        n.to_string(),
                    )
                })
        })
        .collect()
}
