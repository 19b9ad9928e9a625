//! Whether a run's loss stayed healthy: its values in the `progress`
//! records (a value that was not finite is `null` there) and the
//! `numerical` findings (`policy::numerical`).

use crate::event::Event;
use crate::journal::Record;
use serde::Serialize;

/// The loss over the whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LossHealth {
    /// No NaN/Inf and no spike was found.
    pub healthy: bool,
    pub first: Option<f64>,
    pub last: Option<f64>,
    pub min: Option<f64>,
    /// Progress records whose loss was not finite.
    pub nonfinite_records: usize,
    /// Each finding, in words, with its attempt and action.
    pub findings: Vec<String>,
}

/// The run's loss health, or `None` when no loss was ever seen.
pub fn health(records: &[Record]) -> Option<LossHealth> {
    let mut h = LossHealth::default();
    let mut seen = false;
    for r in records {
        match r.event() {
            Some(Event::Progress(p)) => {
                let Some(v) = p.metrics.as_ref().and_then(|m| m.get("loss")) else {
                    continue;
                };
                seen = true;
                match v.as_f64() {
                    Some(x) => {
                        h.first.get_or_insert(x);
                        h.last = Some(x);
                        h.min = Some(h.min.map_or(x, |m: f64| m.min(x)));
                    }
                    None => h.nonfinite_records += 1,
                }
            }
            Some(Event::Numerical(n)) => {
                seen = true;
                h.findings.push(format!(
                    "attempt {} rank {}: {} {} ({})",
                    r.attempt,
                    r.rank.map_or("-".into(), |x| x.to_string()),
                    n.finding.as_deref().unwrap_or("?"),
                    n.detail.as_deref().unwrap_or(""),
                    n.action.as_deref().unwrap_or("record"),
                ));
            }
            _ => {}
        }
    }
    h.healthy = h.findings.is_empty() && h.nonfinite_records == 0;
    seen.then_some(h)
}
