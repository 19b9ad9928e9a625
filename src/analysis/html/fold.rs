//! A job of many nodes on one page: past [`MAX_NODE_ROWS`] nodes, the nodes
//! worth a look (judged, blamed, flagged, excluded, stalled) keep a row
//! each and every other node is folded into one row, whose spans are the
//! union of theirs and whose marks are at most one of a kind a second.
//! Without it, a job of 16,384 nodes made a page of 160 MB.

use super::marks::TimelineMark;
use super::rows::Span;
use crate::journal::Record;
use std::collections::{BTreeMap, BTreeSet};

/// Above this many node rows, the nodes not worth a look share one row.
pub use crate::analysis::notable::MAX_NODES as MAX_NODE_ROWS;

/// The nodes kept, and the row the others share.
pub(super) struct Fold {
    shown: BTreeSet<String>,
    pub(super) label: String,
}

impl Fold {
    /// A fold for `rows` (node names), when there are too many.
    pub(super) fn of(records: &[Record], by_node: bool, rows: &[String]) -> Option<Fold> {
        if !by_node || rows.len() <= MAX_NODE_ROWS {
            return None;
        }
        let worth = crate::analysis::notable::worth_a_look(records);
        let shown: BTreeSet<String> = rows
            .iter()
            .filter(|r| worth.contains(*r))
            .take(MAX_NODE_ROWS - 1)
            .cloned()
            .collect();
        let label = format!("{} other nodes", rows.len() - shown.len());
        Some(Fold { shown, label })
    }

    fn row(&self, name: &str) -> String {
        if self.shown.contains(name) {
            name.to_string()
        } else {
            self.label.clone()
        }
    }

    /// The rows: the nodes kept, in their order, then the shared one.
    pub(super) fn rows(&self, rows: &[String]) -> Vec<String> {
        let mut out: Vec<String> = rows
            .iter()
            .filter(|r| self.shown.contains(*r))
            .cloned()
            .collect();
        out.push(self.label.clone());
        out
    }

    /// Each row's spans, the folded nodes' on the shared row; on every row,
    /// the spans of one state in one attempt less than `pixel` apart made
    /// one (at most one span of a state an attempt per pixel).
    pub(super) fn spans(
        &self,
        spans: BTreeMap<String, Vec<Span>>,
        pixel: chrono::Duration,
    ) -> BTreeMap<String, Vec<Span>> {
        let mut out: BTreeMap<String, Vec<Span>> = BTreeMap::new();
        for (row, list) in spans {
            out.entry(self.row(&row)).or_default().extend(list);
        }
        for list in out.values_mut() {
            *list = coalesce(std::mem::take(list), pixel);
        }
        out
    }

    /// The marks, the folded nodes' on the shared row, at most one of a
    /// kind (and colour) a second there.
    pub(super) fn marks(&self, marks: Vec<TimelineMark>) -> Vec<TimelineMark> {
        let mut seen: BTreeSet<(&'static str, bool, i64)> = BTreeSet::new();
        let mut out = Vec::with_capacity(marks.len().min(4096));
        for mut m in marks {
            if let Some(row) = &m.row {
                let row = self.row(row);
                if row == self.label && !seen.insert((m.kind, m.echo, m.at.timestamp())) {
                    continue;
                }
                m.row = Some(row);
            }
            out.push(m);
        }
        out
    }
}

/// Spans of one state in one attempt less than `pixel` apart, made one.
fn coalesce(mut list: Vec<Span>, pixel: chrono::Duration) -> Vec<Span> {
    list.sort_by(|a, b| (a.attempt, a.state, a.start).cmp(&(b.attempt, b.state, b.start)));
    let mut out: Vec<Span> = Vec::new();
    for s in list {
        match out.last_mut() {
            Some(l) if l.attempt == s.attempt && l.state == s.state && s.start <= l.end + pixel => {
                l.end = l.end.max(s.end);
            }
            _ => out.push(s),
        }
    }
    out.sort_by_key(|s: &Span| s.start);
    out
}
