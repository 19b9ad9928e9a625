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

/// The colours of `start`'s parts ([`START_PARTS`]), none of them
/// start's own (which draws parts not told apart).
const PART_COLOURS: [&str; 3] = ["#98df8a", "#2ca02c", "#17becf"];

/// A recovery's segments, left to right: name, colour, seconds (`None`:
/// not shown). `start` is drawn in its parts where they are shown, parts
/// not told apart as one piece in start's colour.
fn segments(r: &Recovery) -> Vec<(&'static str, &'static str, Option<f64>)> {
    let mut out = Vec::new();
    for ((phase, colour), secs) in PHASES.iter().zip(PHASE_COLOURS).zip(r.phases_s) {
        if *phase != "start" {
            out.push((*phase, colour, secs));
            continue;
        }
        let part = |i: usize| (START_PARTS[i], PART_COLOURS[i], r.start_parts_s[i]);
        let rest = |known: f64| secs.map(|s| (s - known).max(0.0));
        match r.start_parts_s {
            [Some(_), Some(_), _] => out.extend([part(0), part(1), part(2)]),
            [Some(i), None, None] => out.extend([part(0), ("restore+first_step", colour, rest(i))]),
            [None, None, Some(f)] => out.extend([("init+restore", colour, rest(f)), part(2)]),
            _ => out.push((*phase, colour, secs)),
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
            "<li><span class=\"sw\" style=\"background:{colour}\"></span>{}</li>",
            phase.replace('_', " ")
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
        let mut unseen: Vec<String> = Vec::new();
        for (phase, colour, secs) in segments(r) {
            let phase = phase.replace('_', " ");
            let Some(secs) = secs else {
                unseen.push(phase);
                continue;
            };
            let w = BAR_W * secs / longest;
            // Milliseconds under a second, as the text report gives them.
            let _ = writeln!(
                h,
                "<rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{BAR_H}\" fill=\"{colour}\"><title>attempt {} {}: {phase} {}</title></rect>",
                w.max(0.5),
                r.failed_attempt,
                esc(r.class.as_deref().unwrap_or("?")),
                crate::duration::format(std::time::Duration::from_secs_f64(secs))
            );
            x += w;
        }
        let mut said = Vec::new();
        if !unseen.is_empty() {
            said.push(format!("{} not shown", unseen.join(", ")));
        }
        said.extend(r.start_note.map(str::to_string));
        let back = r.back();
        let _ = writeln!(
            h,
            "<text x=\"{:.1}\" y=\"{:.1}\">{}{} total, {back}{}</text>",
            x + 6.0,
            y + BAR_H - 3.0,
            if r.total_is_floor() { "at least " } else { "" },
            human(r.total_s),
            if said.is_empty() {
                String::new()
            } else {
                format!(" ({})", esc(&said.join("; ")))
            }
        );
    }
    h.push_str("</svg>\n");
    let spread = crate::analysis::recovery::spread_line(&report.recovery_phases, human);
    let _ = writeln!(
        h,
        "<p class=\"meta\">p50/p99 over {} recover{}: {}. Start = init (to the last rank's first output) + restore (to the trainer's last word before its first step that a checkpoint was loaded, pretrained weights too; 0 when it said none and started at step 1) + first step.</p>",
        recoveries.len(),
        if recoveries.len() == 1 { "y" } else { "ies" },
        esc(&spread)
    );
}
