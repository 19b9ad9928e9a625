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
