//! The page written out, section by section: its head, the accounting,
//! the legend and time axis, the job's bar, the rows and the marks.

use super::marks::TimelineMark;
use super::rows::Span;
use super::{colour, esc, human, secs, Page, LABEL_W, PLOT_W, ROW_GAP, ROW_H};
use crate::analysis::report::JobReport;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The page's head and style, its title, the summary and what the
/// report says about the runs and the journal.
pub(super) fn write_head(h: &mut String, p: &Page) {
    let (report, title, t0, t1, rows, by_node) =
        (p.report, &p.title, p.t0, p.t1, &p.rows, p.by_node);
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>{}</title>\n<style>\n\
         body{{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#1d1d1f;background:#fff}}\n\
         h1{{font-size:20px;margin:0 0 4px}} .summary{{font-size:16px;font-weight:600;margin:4px 0}}\n\
         .meta{{color:#555}}\n\
         .buckets{{display:flex;flex-wrap:wrap;gap:4px 18px;margin:10px 0;padding:0;list-style:none}}\n\
         .sw{{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-1px;margin-right:6px}}\n\
         svg text{{font:12px system-ui,sans-serif;fill:#333}} svg .axis{{stroke:#999;stroke-width:1}}\n\
         svg .grid{{stroke:#eee;stroke-width:1}} svg .action{{stroke:#555;stroke-width:1;stroke-dasharray:3 3}}\n\
         </style></head><body>\n",
        esc(title)
    );
    let _ = writeln!(h, "<h1>{}</h1>", esc(title));
    let _ = writeln!(
        h,
        "<p class=\"summary\">{}</p>",
        esc(&crate::analysis::report::summary_line(report))
    );
    let _ = writeln!(
        h,
        "<p class=\"meta\">{} to {}, wall {}, {} attempt(s), {} row(s){}; times: {}</p>",
        t0.format("%Y-%m-%d %H:%M:%S%.3fZ"),
        t1.format("%H:%M:%S%.3fZ"),
        human(report.wall_s),
        report.attempts.len(),
        rows.len(),
        if by_node { " (one per node)" } else { "" },
        esc(&report.time_source)
    );
    // Other runs of the job id, journal lines skipped.
    let run_note = report
        .run
        .as_ref()
        .and_then(|r| crate::runs::note(&report.job, &report.runs, r.index.saturating_sub(1)));
    for note in run_note.into_iter().chain(
        crate::analysis::report::skipped_notes(
            &report.skipped_lines,
            report.bad_journal_lines,
            &report.left_out,
        )
        .into_iter()
        .filter(|l| !l.is_empty()),
    ) {
        let _ = writeln!(h, "<p class=\"meta\">{}</p>", esc(note.trim_start()));
    }
}

/// The accounting buckets, each with its share of the wall time.
pub(super) fn write_buckets(h: &mut String, report: &JobReport) {
    h.push_str("<ul class=\"buckets\">");
    let mut buckets: Vec<(&str, f64)> = vec![("productive", report.productive_s)];
    for b in &crate::analysis::accounting::BUCKETS[1..] {
        buckets.push((b, report.lost_s.get(*b).copied().unwrap_or(0.0)));
    }
    for (b, v) in &buckets {
        let _ = write!(
            h,
            "<li><span class=\"sw\" style=\"background:{}\"></span>{} {:.1}%</li>",
            colour(b),
            esc(&b.replace('_', " ")),
            if report.wall_s > 0.0 {
                100.0 * v / report.wall_s
            } else {
                0.0
            }
        );
    }
    h.push_str("</ul>\n");
}

/// The SVG's start: the legend of row states and the time axis.
pub(super) fn write_svg_top(h: &mut String, p: &Page) {
    let (width, height, title, total, plot_top) =
        (p.width, p.height, &p.title, p.total, p.plot_top);
    let _ = writeln!(
        h,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" role=\"img\" aria-label=\"{}\">",
        esc(title)
    );
    // Legend of row states.
    let mut lx = LABEL_W;
    for s in [
        "startup",
        "silent",
        "progressing",
        "checkpointing",
        "stalled",
        "down",
        "queued",
    ] {
        let _ = writeln!(
            h,
            "<rect x=\"{lx:.1}\" y=\"20\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1}\" y=\"30\">{s}</text>",
            colour(s),
            lx + 16.0
        );
        lx += 120.0;
    }
    let _ = writeln!(
        h,
        "<text x=\"{:.1}\" y=\"60\">failure ▼  stall ●  straggler ◆  supervisor action ┆ (hover for cause and evidence)</text>",
        LABEL_W
    );
    // Time axis with about ten ticks.
    let step = nice_step(total / 10.0);
    let axis_y = plot_top - 20.0;
    let _ = writeln!(
        h,
        "<line class=\"axis\" x1=\"{LABEL_W}\" y1=\"{axis_y}\" x2=\"{:.1}\" y2=\"{axis_y}\"/>",
        LABEL_W + PLOT_W
    );
    let mut k = 0.0;
    while k <= total + 1e-9 {
        let px = LABEL_W + PLOT_W * k / total;
        let _ = writeln!(
            h,
            "<line class=\"grid\" x1=\"{px:.1}\" y1=\"{axis_y}\" x2=\"{px:.1}\" y2=\"{:.1}\"/><text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">+{}</text>",
            height - 30.0,
            axis_y - 6.0,
            human(k)
        );
        k += step;
    }
}

/// The job's accounting as one bar, and where each attempt began.
pub(super) fn write_job_bar(h: &mut String, p: &Page) {
    let (report, t0, job_row_y) = (p.report, p.t0, p.job_row_y);
    let x = |t: DateTime<Utc>| p.x(t);
    // The job's accounting, one bar.
    let _ = writeln!(
        h,
        "<text x=\"4\" y=\"{:.1}\">job (ETTR {:.1}%)</text>",
        job_row_y + 14.0,
        100.0 * report.ettr
    );
    for s in &report.segments {
        let _ = writeln!(
            h,
            "<rect x=\"{:.2}\" y=\"{job_row_y:.1}\" width=\"{:.2}\" height=\"{ROW_H}\" fill=\"{}\"><title>{}: {} from +{} ({}{})</title></rect>",
            x(s.start),
            (x(s.end) - x(s.start)).max(0.5),
            colour(s.bucket),
            esc(&s.bucket.replace('_', " ")),
            human(secs(s.start, s.end)),
            human(secs(t0, s.start)),
            s.start.format("%H:%M:%S%.3fZ"),
            s.attempt.map_or(String::new(), |a| format!(", attempt {a}"))
        );
    }
    // Where each attempt began.
    for a in &report.attempts {
        let px = x(a.start);
        let _ = writeln!(
            h,
            "<line x1=\"{px:.2}\" y1=\"{:.1}\" x2=\"{px:.2}\" y2=\"{job_row_y:.1}\" stroke=\"#333\"/><text x=\"{:.2}\" y=\"{:.1}\">attempt {}</text>",
            job_row_y - 14.0,
            px + 3.0,
            job_row_y - 4.0,
            a.attempt
        );
    }
}

/// A row per rank (or node): its states, and the time queued.
pub(super) fn write_rows(
    h: &mut String,
    p: &Page,
    spans: &BTreeMap<String, Vec<Span>>,
    queued: &[&crate::analysis::accounting::Segment],
) {
    let rows = &p.rows;
    let x = |t: DateTime<Utc>| p.x(t);
    let row_y = |name: &str| p.row_y(name);
    // Rows.
    for name in rows {
        let y = row_y(name).expect("row");
        let _ = writeln!(
            h,
            "<text x=\"4\" y=\"{:.1}\">{}</text><rect x=\"{LABEL_W}\" y=\"{y:.1}\" width=\"{PLOT_W}\" height=\"{ROW_H}\" fill=\"#fafafa\"/>",
            y + 14.0,
            esc(name)
        );
        let list = spans.get(name).map(|v| v.as_slice()).unwrap_or(&[]);
        // Lower states first; checkpointing and stalled paint over them.
        for layer in [
            &["down"][..],
            &["startup", "silent", "progressing"],
            &["checkpointing", "stalled"],
        ] {
            for s in list.iter().filter(|s| layer.contains(&s.state)) {
                let _ = writeln!(
                    h,
                    "<rect x=\"{:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{ROW_H}\" fill=\"{}\"><title>{name}, attempt {}: {} for {} from {}</title></rect>",
                    x(s.start),
                    (x(s.end) - x(s.start)).max(0.5),
                    colour(s.state),
                    s.attempt,
                    s.state,
                    human(secs(s.start, s.end)),
                    s.start.format("%H:%M:%S%.3fZ")
                );
            }
        }
        for q in queued {
            let _ = writeln!(
                h,
                "<rect x=\"{:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{ROW_H}\" fill=\"{}\"><title>queued: {} waiting for Slurm to start the job again</title></rect>",
                x(q.start),
                (x(q.end) - x(q.start)).max(0.5),
                colour("queued"),
                human(secs(q.start, q.end))
            );
        }
    }
}

/// The marks, on top: failures, stalls, stragglers on their rows; the
/// supervisor's actions across all rows.
pub(super) fn write_marks(h: &mut String, p: &Page, marks: &[TimelineMark]) {
    let (rows, first_row_y, job_row_y) = (&p.rows, p.first_row_y, p.job_row_y);
    let x = |t: DateTime<Utc>| p.x(t);
    let row_y = |name: &str| p.row_y(name);
    // Marks on top.
    let bottom = first_row_y + rows.len() as f64 * (ROW_H + ROW_GAP);
    for m in marks {
        let px = x(m.at);
        let title = esc(&m.title);
        match (m.kind, m.row.as_deref().and_then(row_y)) {
            ("action", _) | (_, None) => {
                let _ = writeln!(
                    h,
                    "<line class=\"action\" x1=\"{px:.2}\" y1=\"{job_row_y:.1}\" x2=\"{px:.2}\" y2=\"{bottom:.1}\"><title>{title}</title></line><line x1=\"{px:.2}\" y1=\"{job_row_y:.1}\" x2=\"{px:.2}\" y2=\"{bottom:.1}\" stroke=\"transparent\" stroke-width=\"7\"><title>{title}</title></line>"
                );
            }
            ("failure", Some(y)) => {
                let _ = writeln!(
                    h,
                    "<path d=\"M{:.2} {:.1} L{:.2} {:.1} L{px:.2} {:.1} Z\" fill=\"{}\" stroke=\"#fff\" stroke-width=\"1\"><title>{title}</title></path>",
                    px - 7.0,
                    y - 4.0,
                    px + 7.0,
                    y - 4.0,
                    y + 10.0,
                    if m.echo { "#8a8a8a" } else { "#c0151b" },
                );
            }
            ("stall", Some(y)) => {
                let _ = writeln!(
                    h,
                    "<circle cx=\"{px:.2}\" cy=\"{:.1}\" r=\"6\" fill=\"#e8741c\" stroke=\"#fff\"><title>{title}</title></circle>",
                    y + ROW_H / 2.0
                );
            }
            (_, Some(y)) => {
                let c = y + ROW_H / 2.0;
                let _ = writeln!(
                    h,
                    "<path d=\"M{px:.2} {:.1} L{:.2} {c:.1} L{px:.2} {:.1} L{:.2} {c:.1} Z\" fill=\"#6b3fa0\" stroke=\"#fff\"><title>{title}</title></path>",
                    c - 7.0,
                    px + 7.0,
                    c + 7.0,
                    px - 7.0
                );
            }
        }
    }
}

/// A tick step of 1, 2 or 5 times a power of ten (seconds).
pub(super) fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let n = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    n * p
}
