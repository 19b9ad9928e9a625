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
            "  attempt {} {} -> {}: {}; total {}{}, {back}",
            v.failed_attempt,
            v.class.as_deref().unwrap_or("?"),
            v.action.as_deref().unwrap_or("?").replace('_', " "),
            phases.join(", "),
            if v.total_is_floor() { "at least " } else { "" },
            secs(v.total_s),
        );
        if let Some(line) = &v.loaded {
            let _ = writeln!(s, "    loaded: {line}");
        }
    }
    let spread = crate::analysis::recovery::spread_line(&r.recovery_phases, secs);
    let _ = writeln!(s, "  p50/p99: {spread}");
    let _ = writeln!(
        s,
        "  start = init (to the last rank's first output) + restore (to the trainer's last word before its first step that a checkpoint was loaded, pretrained weights too; 0 when it said none and started at step 1) + first step"
    );
}

/// `start`'s parts, in parentheses: ` (init 3.1s, restore 2.2s, first step
/// 1.7s)`; parts not told apart in one piece, and why.
fn start_in_parts(v: &crate::analysis::recovery::Recovery) -> String {
    let secs = |v: f64| crate::duration::format(std::time::Duration::from_secs_f64(v));
    let rest = |known: f64| v.phases_s[4].map(|start| secs((start - known).max(0.0)));
    let note = v.start_note.unwrap_or("");
    let text = match v.start_parts_s {
        [Some(i), Some(r), Some(f)] => {
            format!(
                "init {}, restore {}, first step {}",
                secs(i),
                secs(r),
                secs(f)
            )
        }
        [Some(i), Some(r), None] => format!("init {}, restore {}; {note}", secs(i), secs(r)),
        [Some(i), None, None] => match rest(i) {
            Some(rest) => format!("init {}, then {rest} to the first step: {note}", secs(i)),
            None => format!("init {}; {note}", secs(i)),
        },
        [None, None, Some(f)] => match rest(f) {
            Some(rest) => format!("init and restore {rest}, first step {}: {note}", secs(f)),
            None => format!("first step {}: {note}", secs(f)),
        },
        _ => note.to_string(),
    };
    format!(" ({text})")
}
