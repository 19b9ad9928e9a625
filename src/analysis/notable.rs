//! A job of many nodes, shown whole: past [`MAX_NODES`] nodes, the views
//! (the HTML timeline's rows, the text timeline's lines) keep the nodes
//! worth a look apart and fold every other node's records together.

use crate::event::{Class, Event};
use crate::journal::Record;
use std::collections::BTreeSet;

/// Above this many nodes, the nodes not worth a look are folded together.
pub const MAX_NODES: usize = 256;

/// The nodes the journal singles out: judged the cause, blamed by a
/// failure that is no echo, flagged as a straggler, excluded, or stalled.
pub fn worth_a_look<'a>(records: impl IntoIterator<Item = &'a Record>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in records.into_iter().filter(|r| {
        matches!(
            r.kind.as_str(),
            "judgment" | "failure" | "straggler" | "node_excluded" | "stall"
        )
    }) {
        let node = match r.event() {
            Some(Event::Judgment(j)) => j.primary_node.clone(),
            Some(Event::Failure(f)) if f.class != Some(Class::Secondary) => {
                f.blamed_node.clone().or(r.node.clone())
            }
            Some(Event::Straggler(s)) if s.flagged => Some(s.straggler_node.clone()),
            Some(Event::NodeExcluded(x)) => Some(x.excluded_node.clone()),
            Some(Event::Stall(_)) => r.node.clone(),
            _ => None,
        };
        out.extend(node);
    }
    out
}

/// The distinct nodes of `records`. Each rank's records name the same node
/// (but for a journal that lies): a record whose node is its rank's last
/// one is not hashed again (1.3 million hashed node names cost a report of
/// 131,072 ranks a tenth of a second per look).
pub fn distinct_nodes<'a>(
    records: impl IntoIterator<Item = &'a Record>,
) -> std::collections::HashSet<&'a str> {
    /// Ranks above this are hashed every time (a journal can name any).
    const MAX_RANK_CACHED: u32 = 1 << 20;
    let mut out = std::collections::HashSet::new();
    let mut last: Vec<Option<&'a str>> = Vec::new();
    for r in records {
        let Some(node) = r.node.as_deref() else {
            continue;
        };
        let Some(rank) = r.rank.filter(|&k| k < MAX_RANK_CACHED) else {
            out.insert(node);
            continue;
        };
        let k = rank as usize;
        if last.len() <= k {
            last.resize(k + 1, None);
        }
        if last[k] != Some(node) {
            last[k] = Some(node);
            out.insert(node);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_distinct_nodes_are_every_node_named_whatever_the_ranks_say() {
        let rec = |rank: Option<u32>, node: Option<&str>| Record {
            rank,
            node: node.map(str::to_string),
            ..Default::default()
        };
        let records = [
            rec(Some(0), Some("a")),
            rec(Some(1), Some("a")),
            rec(Some(0), Some("a")),
            // A rank that moves, and back.
            rec(Some(0), Some("b")),
            rec(Some(0), Some("a")),
            rec(None, Some("c")),
            rec(Some(5), None),
            rec(Some(u32::MAX), Some("d")),
            rec(Some(3_000_000), Some("e")),
        ];
        let mut got: Vec<&str> = distinct_nodes(&records).into_iter().collect();
        got.sort();
        assert_eq!(got, ["a", "b", "c", "d", "e"]);
    }
}
