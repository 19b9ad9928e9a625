//! The report's recoveries, in text: each one's phases (start in its
//! parts), then each phase's p50/p99 over them.

use super::JobReport;
use std::fmt::Write as _;

/// Each recovery's phases, then each phase's p50/p99 over them.
pub(super) fn render_recoveries(s: &mut String, r: &JobReport) {
    use crate::analysis::recovery::PHASES;
    if r.recoveries.is_empty() {
        return;
    }
    let secs = |v: f64| crate::duration::format(std::time::Duration::from_secs_f64(v));
    let _ = writeln!(
        s,
        "\nrecoveries (from the fault to the step reached before it; ? where the journal does not show it):"
    );
    for v in &r.recoveries {
        let phases: Vec<String> = PHASES
            .iter()
            .zip(v.phases_s)
            .map(|(name, p)| {
                let mut phase = format!("{name} {}", p.map_or("?".into(), secs));
                if *name == "start" {
                    phase += &start_in_parts(v);
                }
                phase
            })
            .collect();
        let back = v.back();
        let _ = writeln!(
            s,
            "  attempt {} {} -> {}: {}; total {}, {back}",
            v.failed_attempt,
            v.class.as_deref().unwrap_or("?"),
            v.action.as_deref().unwrap_or("?").replace('_', " "),
            phases.join(", "),
            secs(v.total_s),
        );
        if let Some(line) = &v.loaded {
            let _ = writeln!(s, "    loaded: {line}");
        }
    }
    let spread: Vec<String> = r
        .recovery_phases
        .iter()
        .map(|p| {
            format!(
                "{} {}/{}",
                p.phase.replace('_', " "),
                secs(p.p50_s),
                secs(p.p99_s)
            )
        })
        .collect();
    let _ = writeln!(s, "  p50/p99: {}", spread.join(", "));
    let _ = writeln!(
        s,
        "  start = init (to the trainer's first output) + restore (to its word that it loaded a checkpoint; 0 from scratch) + first step"
    );
}

/// `start`'s parts, in parentheses, where the journal shows any: ` (init
/// 3.1s, restore 2.2s, first step 1.7s)`; a load not shown leaves what
/// follows the first output in one piece.
fn start_in_parts(v: &crate::analysis::recovery::Recovery) -> String {
    let secs = |v: f64| crate::duration::format(std::time::Duration::from_secs_f64(v));
    let [init, restore, first] = v.start_parts_s;
    let part = |name: &str, p: Option<f64>| format!("{name} {}", p.map_or("?".into(), secs));
    match (init, restore, first) {
        (None, None, None) => " (not split: no first output in the journal)".into(),
        (Some(i), None, None) => match v.phases_s[4] {
            Some(start) => format!(
                " (init {}, then {} to the first step: {})",
                secs(i),
                secs((start - i).max(0.0)),
                if v.loaded.is_some() {
                    "a checkpoint load began, its end not shown"
                } else {
                    "no checkpoint load shown"
                }
            ),
            None => format!(" (init {}, no first step)", secs(i)),
        },
        _ => format!(
            " ({}, {}, {})",
            part("init", init),
            part("restore", restore),
            part("first step", first)
        ),
    }
}
