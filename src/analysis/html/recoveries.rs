//! Each recovery as a stacked bar under the timeline: its phases left to
//! right (detection, diagnosis, teardown, relaunch, start, rework; start as
//! init, restore and first step where the journal shows all three), every
//! bar on one scale (the longest recovery's), a phase the journal does not
//! show left out and named; then each phase's p50/p99 over the job.

use super::{esc, human, LABEL_W};
use crate::analysis::recovery::{Recovery, PHASES, START_PARTS};
use crate::analysis::report::JobReport;
use std::fmt::Write as _;

/// Width of the longest recovery's bar.
const BAR_W: f64 = 700.0;
const BAR_H: f64 = 16.0;
const BAR_GAP: f64 = 8.0;

/// Each phase's colour, in [`PHASES`]' order.
const PHASE_COLOURS: [&str; 6] = [
    "#d62728", "#ff7f0e", "#8c564b", "#9467bd", "#1f77b4", "#bcbd22",
];

/// The colours of `start`'s parts ([`START_PARTS`]): shades of its own.
const PART_COLOURS: [&str; 3] = ["#aec7e8", "#1f77b4", "#17becf"];

/// A recovery's segments, left to right: name, colour, seconds (`None`:
/// not shown). `start` is drawn in its parts when all three are shown.
fn segments(r: &Recovery) -> Vec<(&'static str, &'static str, Option<f64>)> {
    let mut out = Vec::new();
    for ((phase, colour), secs) in PHASES.iter().zip(PHASE_COLOURS).zip(r.phases_s) {
        if *phase == "start" && r.start_parts_s.iter().all(Option::is_some) {
            out.extend(
                START_PARTS
                    .iter()
                    .zip(PART_COLOURS)
                    .zip(r.start_parts_s)
                    .map(|((p, c), v)| (*p, c, v)),
            );
        } else {
            out.push((*phase, colour, secs));
        }
    }
    out
}

/// The section, or nothing when the job had no recovery.
pub(super) fn write_recoveries(h: &mut String, report: &JobReport) {
    let recoveries = &report.recoveries;
    if recoveries.is_empty() {
        return;
    }
    let longest = recoveries.iter().map(|r| r.total_s).fold(1e-3, f64::max);
    h.push_str("<h2 style=\"font-size:16px;margin:18px 0 4px\">Recoveries: from the fault to the step reached before it</h2>\n<ul class=\"buckets\">");
    for (phase, colour) in PHASES
        .iter()
        .zip(PHASE_COLOURS)
        .chain(START_PARTS.iter().zip(PART_COLOURS))
    {
        let _ = write!(
            h,
            "<li><span class=\"sw\" style=\"background:{colour}\"></span>{phase}</li>"
        );
    }
    h.push_str("</ul>\n");
    let height = recoveries.len() as f64 * (BAR_H + BAR_GAP) + BAR_GAP;
    let width = LABEL_W + 40.0 + BAR_W + 260.0;
    let _ = writeln!(
        h,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"recoveries\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" role=\"img\" aria-label=\"recoveries, phase by phase\">"
    );
    for (i, r) in recoveries.iter().enumerate() {
        let y = BAR_GAP + i as f64 * (BAR_H + BAR_GAP);
        let _ = writeln!(
            h,
            "<text x=\"4\" y=\"{:.1}\">attempt {} {}</text>",
            y + BAR_H - 3.0,
            r.failed_attempt,
            esc(r.class.as_deref().unwrap_or("?"))
        );
        let mut x = LABEL_W + 40.0;
        let mut unseen = Vec::new();
        for (phase, colour, secs) in segments(r) {
            let Some(secs) = secs else {
                unseen.push(phase);
                continue;
            };
            let w = BAR_W * secs / longest;
            let _ = writeln!(
                h,
                "<rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{BAR_H}\" fill=\"{colour}\"><title>attempt {} {}: {phase} {}</title></rect>",
                w.max(0.5),
                r.failed_attempt,
                esc(r.class.as_deref().unwrap_or("?")),
                human(secs)
            );
            x += w;
        }
        let back = r.back();
        let _ = writeln!(
            h,
            "<text x=\"{:.1}\" y=\"{:.1}\">{} total, {back}{}</text>",
            x + 6.0,
            y + BAR_H - 3.0,
            human(r.total_s),
            if unseen.is_empty() {
                String::new()
            } else {
                format!(" ({} not shown)", unseen.join(", "))
            }
        );
    }
    h.push_str("</svg>\n");
    let spread: Vec<String> = report
        .recovery_phases
        .iter()
        .map(|p| {
            format!(
                "{} {}/{}",
                p.phase.replace('_', " "),
                human(p.p50_s),
                human(p.p99_s)
            )
        })
        .collect();
    let _ = writeln!(
        h,
        "<p class=\"meta\">p50/p99 over {} recover{}: {}. Start = init (to the trainer's first output) + restore (to its word that it loaded a checkpoint; 0 from scratch) + first step.</p>",
        recoveries.len(),
        if recoveries.len() == 1 { "y" } else { "ies" },
        esc(&spread.join(", "))
    );
}
