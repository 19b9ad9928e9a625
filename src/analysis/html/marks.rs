//! The marks on the rows: failures, stalls, stragglers, the judged cause,
//! the supervisor's actions, each with its tooltip.

use super::rows::row_of;
use crate::event::{Class, Event};
use crate::journal::Record;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A point event on a row (or on every row when `row` is `None`).
pub(super) struct TimelineMark {
    pub(super) at: DateTime<Utc>,
    pub(super) row: Option<String>,
    pub(super) kind: &'static str,
    pub(super) title: String,
    /// A peer's echo of another failure (drawn grey).
    pub(super) echo: bool,
}

/// A mark's tooltip: the record's own fields that say what happened, as
/// written (whatever its kind).
fn tooltip_of(r: &Record, event: &Event) -> String {
    let mut t = format!("{} {}", r.ts.format("%H:%M:%S%.3fZ"), r.kind);
    for key in [
        "class",
        "cause",
        "why",
        "reason",
        "evidence",
        "excluded_node",
        "straggler_node",
        "exit_code",
        "failure_to_first_step_s",
    ] {
        if let Some(v) = r.get(key) {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let _ = write!(t, "\n{key}: {v}");
        }
    }
    if let Event::Decision(crate::event::Decision {
        decision: Some(action),
        ..
    }) = event
    {
        let _ = write!(t, "\ndecision: {}", action.name().replace('_', " "));
        if let Some(why) = action.reason() {
            let _ = write!(t, " ({why})");
        }
    }
    t
}

/// Marks: failures on their rows; the supervisor's actions on every row;
/// the judged cause on the blamed rank's row. A failure of another rank
/// than the one judged the cause is its echo (grey).
pub(super) fn marks_of(records: &[Record], by_node: bool, rows: &[String]) -> Vec<TimelineMark> {
    let judged: BTreeMap<u32, (Option<u32>, Option<String>)> = records
        .iter()
        .filter_map(|r| match r.event() {
            Some(Event::Judgment(j)) => Some((r.attempt, (j.primary_rank, j.primary_node.clone()))),
            _ => None,
        })
        .collect();
    let mut marks: Vec<TimelineMark> = Vec::new();
    for r in records {
        let Some(event) = r.event() else { continue };
        let mut class = None;
        let (kind, row) = match &event {
            Event::Failure(f) => {
                class = f.class;
                let about = f.about_attempt.unwrap_or(r.attempt);
                if let Some((Some(primary), _)) = judged.get(&about) {
                    if r.rank.is_some_and(|k| k != *primary) {
                        class = Some(Class::Secondary);
                    }
                }
                let row = if by_node {
                    f.blamed_node.clone().or(r.node.clone())
                } else {
                    r.rank.map(|n| format!("rank {n}"))
                };
                ("failure", row)
            }
            Event::Stall(_) => ("stall", row_of(r, by_node)),
            Event::Straggler(x) if x.flagged => {
                let row = if by_node || x.scope == crate::policy::straggler::StragglerScope::Node {
                    Some(x.straggler_node.clone())
                } else {
                    x.about_rank.map(|n| format!("rank {n}"))
                };
                ("straggler", row.filter(|row| rows.contains(row)))
            }
            Event::Judgment(j) => {
                class = Some(j.class);
                let blamed = if by_node {
                    j.primary_node.clone()
                } else {
                    j.primary_rank.map(|n| format!("rank {n}"))
                };
                if let Some(row) = blamed.filter(|row| rows.contains(row)) {
                    marks.push(TimelineMark {
                        at: r.ts,
                        row: Some(row),
                        kind: "failure",
                        title: format!("judged the cause: {}", tooltip_of(r, event)),
                        echo: false,
                    });
                }
                ("action", None)
            }
            Event::Decision(_)
            | Event::Teardown(_)
            | Event::NodeExcluded(_)
            | Event::Restart(_)
            | Event::Requeue(_)
            | Event::Relaunched(_)
            | Event::StragglerExclusion(_) => ("action", None),
            _ => continue,
        };
        marks.push(TimelineMark {
            at: r.ts,
            row,
            kind,
            title: tooltip_of(r, event),
            echo: matches!(class, Some(Class::Secondary | Class::Preempted)),
        });
    }
    marks
}
