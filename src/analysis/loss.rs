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
    /// The loss as printed: the first value, the last finite one, the lowest.
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
                let Some(m) = p.metrics.as_ref() else {
                    continue;
                };
                let Some(v) = m.get("loss") else {
                    continue;
                };
                seen = true;
                // The values as printed (first, last finite, lowest) where
                // the record has them; else its mean of the interval.
                let num = |k: &str| m.get(k).and_then(|v| v.as_f64());
                let mean = v.as_f64();
                if let Some(x) = num("loss_first").or(mean) {
                    h.first.get_or_insert(x);
                }
                if let Some(x) = num("loss_last").or(mean) {
                    h.last = Some(x);
                }
                if let Some(x) = num("loss_min").or(mean) {
                    h.min = Some(h.min.map_or(x, |m: f64| m.min(x)));
                }
                if mean.is_none() {
                    h.nonfinite_records += 1;
                }
            }
            Some(Event::Numerical(n)) => {
                seen = true;
                h.findings.push(format!(
                    "attempt {} rank {}: {} {} ({})",
                    r.attempt,
                    r.rank.map_or("-".into(), |x| x.to_string()),
                    n.finding.name(),
                    n.detail.as_str(),
                    n.action.unwrap_or(crate::policy::numerical::Act::Record),
                ));
            }
            _ => {}
        }
    }
    h.healthy = h.findings.is_empty() && h.nonfinite_records == 0;
    seen.then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn progress(t: i64, metrics: serde_json::Value) -> Record {
        Record {
            v: 1,
            ts: chrono::DateTime::from_timestamp(1_800_000_000 + t, 0).unwrap(),
            kind: "progress".into(),
            attempt: 0,
            rank: Some(0),
            node: Some("n1".into()),
            data: json!({ "step": t, "metrics": metrics })
                .as_object()
                .cloned()
                .unwrap(),
            ..Default::default()
        }
    }

    #[test]
    fn the_loss_is_shown_as_printed_not_as_the_records_means() {
        // Printed 3.42 .. 2.97, lowest 1.04 in between; the records hold
        // the means of their intervals (the second one's mean is NaN).
        let recs = [
            progress(
                0,
                json!({"loss": 3.37, "loss_first": 3.42, "loss_last": 3.30, "loss_min": 3.30}),
            ),
            progress(
                10,
                json!({"loss": null, "loss_first": 3.1, "loss_last": 2.97, "loss_min": 1.04}),
            ),
        ];
        let h = health(&recs).unwrap();
        assert_eq!(
            (h.first, h.last, h.min),
            (Some(3.42), Some(2.97), Some(1.04))
        );
        assert_eq!(h.nonfinite_records, 1);
        // Records of earlier builds (means only) read as before.
        let h = health(&[progress(0, json!({"loss": 2.5}))]).unwrap();
        assert_eq!((h.first, h.last, h.min), (Some(2.5), Some(2.5), Some(2.5)));
    }
}
