//! `resilio timeline JOB --html FILE`: one self-contained HTML file (inline
//! SVG and CSS; no script, no network). The ETTR summary on top, the job's
//! time accounting as one bar, then a row per rank (per node for jobs of
//! more than [`MAX_RANK_ROWS`] ranks) with time on the x axis: startup,
//! silent, progressing, checkpointing, stalled, down, queued; failure
//! markers (the judged cause on the blamed rank's row, others grey) and
//! the supervisor's actions, each with a tooltip giving cause and evidence;
//! under them the charts of [`crate::analysis::charts`] (step rate, loss, MFU).

use crate::analysis::report::Report;
use crate::event::{Class, Event};
use crate::journal::Record;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Above this many ranks, rows are nodes.
pub const MAX_RANK_ROWS: usize = 32;

const LABEL_W: f64 = 150.0;
const PLOT_W: f64 = 1000.0;
const ROW_H: f64 = 20.0;
const ROW_GAP: f64 = 6.0;

/// The colour of a state or an accounting bucket.
fn colour(state: &str) -> &'static str {
    match state {
        "productive" | "progressing" => "#2e9d4f",
        "startup" => "#8fa9c9",
        "silent" => "#b9d9c2",
        "checkpoint" | "checkpointing" => "#2f6fd6",
        "rework" => "#e0a526",
        "stalled" => "#e8741c",
        "detection" => "#c9452b",
        "teardown" => "#9e3b57",
        "restart" => "#7d5ba6",
        "queue_wait" | "queued" => "#b7a3d9",
        "down" => "#d9d9d9",
        "after_last_step" => "#a0a0a0",
        _ => "#f2c0c0", // unexplained
    }
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// From, to.
type Interval = (DateTime<Utc>, DateTime<Utc>);

/// One painted stretch of a row.
struct Span {
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    state: &'static str,
    attempt: u32,
}

/// A point event on a row (or on every row when `row` is `None`).
struct Mark {
    at: DateTime<Utc>,
    row: Option<String>,
    kind: &'static str,
    title: String,
    /// A peer's echo of another failure (drawn grey).
    echo: bool,
}

fn secs(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    (b - a).num_microseconds().unwrap_or(0) as f64 / 1e6
}

fn human(s: f64) -> String {
    if s < 120.0 {
        format!("{s:.1}s")
    } else if s < 7200.0 {
        format!("{:.1}m", s / 60.0)
    } else {
        format!("{:.1}h", s / 3600.0)
    }
}

/// Which row a record belongs to.
fn row_of(r: &Record, by_node: bool) -> Option<String> {
    if by_node {
        r.node.clone()
    } else {
        r.rank.map(|n| format!("rank {n}"))
    }
}

/// The spans of one rank in one attempt, from its own records.
/// A rank's states in one attempt. `others_from`: when another rank of the
/// attempt first made progress; a rank that never printed a step after it
/// (it prints nothing: rank 0 alone logs) is drawn `silent`, not `startup`.
fn rank_spans(recs: &[&Record], attempt: u32, others_from: Option<DateTime<Utc>>) -> Vec<Span> {
    let mut out = Vec::new();
    let Some(start) = recs
        .iter()
        .find(|r| r.kind == "rank_start")
        .map(|r| r.ts)
        .or_else(|| recs.iter().map(|r| r.ts).min())
    else {
        return out;
    };
    let end = recs
        .iter()
        .find(|r| r.kind == "rank_exit")
        .map(|r| r.ts)
        .unwrap_or_else(|| recs.iter().map(|r| r.ts).max().unwrap_or(start));
    let progress: Vec<DateTime<Utc>> = recs
        .iter()
        .filter(|r| r.kind == "progress")
        .map(|r| r.ts)
        .collect();
    let stall = recs.iter().find(|r| r.kind == "stall");
    let last = stall
        .and_then(|s| match s.event() {
            Some(Event::Stall(x)) => x.last_progress,
            _ => None,
        })
        .into_iter()
        .chain(progress.iter().copied())
        .max();
    let mut span = |a: DateTime<Utc>, b: DateTime<Utc>, state: &'static str| {
        if b > a {
            out.push(Span {
                start: a,
                end: b,
                state,
                attempt,
            });
        }
    };
    match (progress.iter().min(), last) {
        (Some(&first), Some(last)) => {
            span(start, first, "startup");
            span(first, last.max(first), "progressing");
            if stall.is_some() {
                span(last.max(first), end, "stalled");
            } else {
                span(last.max(first), end, "progressing");
            }
        }
        _ if stall.is_some() => span(start, end, "stalled"),
        _ => match others_from {
            Some(from) if from < end => {
                span(start, from.max(start), "startup");
                span(from.max(start), end, "silent");
            }
            _ => span(start, end, "startup"),
        },
    }
    for c in recs.iter() {
        let Some(Event::CheckpointDone(done)) = c.event() else {
            continue;
        };
        let d = done.duration_s.unwrap_or(0.0).max(0.0);
        let a = c.ts - chrono::Duration::microseconds((d * 1e6) as i64);
        span(a.max(start), c.ts, "checkpointing");
    }
    out
}

/// A mark's tooltip: the record's own fields that say what happened, as
/// written (whatever its kind).
fn tooltip_of(r: &Record) -> String {
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
    if let Some(d) = r.get("decision") {
        let action = d.get("action").and_then(Value::as_str).unwrap_or("?");
        let _ = write!(t, "\ndecision: {}", action.replace('_', " "));
        if let Some(why) = d.get("reason").and_then(Value::as_str) {
            let _ = write!(t, " ({why})");
        }
    }
    t
}

/// Render the page.
pub fn render(job: &str, records: &[Record], report: &Report) -> String {
    render_with(job, records, report, true)
}

/// [`render`], with or without the charts under the rows (the frozen
/// journals' pages were made before there were any).
pub fn render_with(job: &str, records: &[Record], report: &Report, charts: bool) -> String {
    let (Some(t0), Some(t1)) = (report.start, report.end) else {
        return format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>resilio: job {0}</title></head><body><p>job {0}: no records</p></body></html>\n",
            esc(job)
        );
    };
    let total = secs(t0, t1).max(1e-3);
    let x = |t: DateTime<Utc>| LABEL_W + PLOT_W * (secs(t0, t).clamp(0.0, total) / total);

    let ranks: std::collections::BTreeSet<u32> = records.iter().filter_map(|r| r.rank).collect();
    let by_node = ranks.len() > MAX_RANK_ROWS || ranks.is_empty();
    // Rows, in order: ranks by number, or nodes by name.
    let mut rows: Vec<String> = if by_node {
        let mut v: Vec<String> = records.iter().filter_map(|r| r.node.clone()).collect();
        v.sort();
        v.dedup();
        v
    } else {
        ranks.iter().map(|r| format!("rank {r}")).collect()
    };
    rows.retain(|r| !r.is_empty());

    // Spans per row: each rank's (or each node's ranks') states per attempt.
    let mut per: BTreeMap<(String, Option<u32>, u32), Vec<&Record>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.rank.is_some()) {
        if let Some(row) = row_of(r, by_node) {
            per.entry((row, r.rank, r.attempt)).or_default().push(r);
        }
    }
    // When each attempt first made progress (any rank).
    let mut progressed: BTreeMap<u32, DateTime<Utc>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.kind == "progress") {
        let e = progressed.entry(r.attempt).or_insert(r.ts);
        *e = (*e).min(r.ts);
    }
    let mut spans: BTreeMap<String, Vec<Span>> = BTreeMap::new();
    for ((row, _, attempt), recs) in &per {
        spans.entry(row.clone()).or_default().extend(rank_spans(
            recs,
            *attempt,
            progressed.get(attempt).copied(),
        ));
    }
    // Down: a row between the end of its last span in one attempt and its
    // first in the next (or the job's end, when it never came back).
    for list in spans.values_mut() {
        list.sort_by_key(|s| s.start);
        let mut ends: BTreeMap<u32, Interval> = BTreeMap::new();
        for s in list.iter() {
            let e = ends.entry(s.attempt).or_insert((s.start, s.end));
            e.0 = e.0.min(s.start);
            e.1 = e.1.max(s.end);
        }
        let v: Vec<(u32, Interval)> = ends.into_iter().collect();
        for (i, (a, (_, end))) in v.iter().enumerate() {
            let until = v.get(i + 1).map_or(t1, |n| n.1 .0);
            let last_attempt = report.attempts.last().map(|x| x.attempt);
            if i + 1 < v.len() || Some(*a) != last_attempt {
                list.push(Span {
                    start: *end,
                    end: until,
                    state: "down",
                    attempt: *a,
                });
            }
        }
    }
    let queued: Vec<&crate::analysis::accounting::Segment> = report
        .segments
        .iter()
        .filter(|s| s.bucket == "queue_wait")
        .collect();

    // Marks: failures on their rows; the supervisor's actions on every row;
    // the judged cause on the blamed rank's row. A failure of another rank
    // than the one judged the cause is its echo (grey).
    let judged: BTreeMap<u32, (Option<u32>, Option<String>)> = records
        .iter()
        .filter_map(|r| match r.event() {
            Some(Event::Judgment(j)) => Some((r.attempt, (j.primary_rank, j.primary_node))),
            _ => None,
        })
        .collect();
    let mut marks: Vec<Mark> = Vec::new();
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
            Event::Straggler(x) if x.flagged == Some(true) => {
                let row = if by_node || x.scope.as_deref() == Some("node") {
                    x.straggler_node.clone()
                } else {
                    x.about_rank.map(|n| format!("rank {n}"))
                };
                ("straggler", row.filter(|row| rows.contains(row)))
            }
            Event::Judgment(j) => {
                class = j.class;
                let blamed = if by_node {
                    j.primary_node.clone()
                } else {
                    j.primary_rank.map(|n| format!("rank {n}"))
                };
                if let Some(row) = blamed.filter(|row| rows.contains(row)) {
                    marks.push(Mark {
                        at: r.ts,
                        row: Some(row),
                        kind: "failure",
                        title: format!("judged the cause: {}", tooltip_of(r)),
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
        marks.push(Mark {
            at: r.ts,
            row,
            kind,
            title: tooltip_of(r),
            echo: matches!(class, Some(Class::Secondary | Class::Preempted)),
        });
    }

    let plot_top = 150.0;
    let job_row_y = plot_top;
    let first_row_y = job_row_y + ROW_H + 3.0 * ROW_GAP;
    let rows_end = first_row_y + rows.len() as f64 * (ROW_H + ROW_GAP);
    let (chart_svg, chart_h) = if charts {
        super::charts::render(records, report, &x, rows_end + 20.0, LABEL_W, PLOT_W)
    } else {
        (String::new(), 0.0)
    };
    let height = rows_end + chart_h + 40.0;
    let width = LABEL_W + PLOT_W + 20.0;
    let row_y = |name: &str| {
        rows.iter()
            .position(|r| r == name)
            .map(|i| first_row_y + i as f64 * (ROW_H + ROW_GAP))
    };

    let mut h = String::new();
    let title = format!("resilio timeline: job {job}");
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
        esc(&title)
    );
    let _ = writeln!(h, "<h1>{}</h1>", esc(&title));
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

    let _ = writeln!(
        h,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" role=\"img\" aria-label=\"{}\">",
        esc(&title)
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
    // Rows.
    for name in &rows {
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
        for q in &queued {
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
    // Marks on top.
    let bottom = first_row_y + rows.len() as f64 * (ROW_H + ROW_GAP);
    for m in &marks {
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
    h.push_str(&chart_svg);
    h.push_str("</svg>\n");
    let _ = writeln!(
        h,
        "<p class=\"meta\">generated by resilio {} from the journal of job {}</p>\n</body></html>",
        env!("CARGO_PKG_VERSION"),
        esc(job)
    );
    h
}

/// A tick step of 1, 2 or 5 times a power of ten (seconds).
fn nice_step(raw: f64) -> f64 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Rank 1 prints nothing (rank 0 alone logs) and hangs; rank 0 stalls
    /// waiting for it; the judgment blames rank 1: rank 1's row is silent,
    /// not starting, and bears the judged cause; rank 0's stall is its echo.
    #[test]
    fn the_blamed_silent_rank_bears_the_cause_and_the_waiting_rank_its_echo() {
        let mut r = vec![
            rec(0.0, "rank_start", 0, Some(0), json!({})),
            rec(0.0, "rank_start", 0, Some(1), json!({})),
            rec(1.0, "progress", 0, Some(0), json!({ "step": 1 })),
            rec(5.0, "progress", 0, Some(0), json!({ "step": 5 })),
            rec(9.0, "stall", 0, Some(0), json!({ "last_step": 5 })),
            rec(
                9.5,
                "failure",
                0,
                Some(0),
                json!({ "cause": "stalled", "class": "hang" }),
            ),
            rec(
                9.6,
                "judgment",
                0,
                None,
                json!({ "class": "hang", "primary_rank": 1, "primary_node": "n2" }),
            ),
        ];
        for rank in 0..2 {
            r.push(rec(
                10.0,
                "rank_exit",
                0,
                Some(rank),
                json!({ "exit_code": 124 }),
            ));
        }
        let report = crate::analysis::report::build("8", &r, 0, None);
        let h = render("8", &r, &report);
        assert!(h.contains("rank 1, attempt 0: silent"), "{h}");
        let cause = h.find("judged the cause").expect("the judged cause marked");
        // Drawn on rank 1's row (its y), in the cause's colour.
        let row1 = h.find(">rank 1</text>").unwrap();
        // The mark: `<path d="M x y ..." fill="..."><title>judged ...`.
        let path = &h[h[..cause].rfind("<path").unwrap()..cause];
        let mark_y: f64 = path["<path d=\"M".len()..]
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert!(!path.contains("#8a8a8a"), "not grey: {path}");
        let label = &h[h[..row1].rfind("<text").unwrap()..row1];
        let y = label.find(" y=\"").unwrap() + 4;
        let row_y: f64 = label[y..y + label[y..].find('"').unwrap()].parse().unwrap();
        assert!(
            (mark_y - row_y).abs() < ROW_H,
            "mark at {mark_y}, row at {row_y}"
        );
        assert_eq!(
            h.matches("judged the cause").count(),
            1,
            "one cause, on the blamed row"
        );
    }

    fn rec(t: f64, kind: &str, attempt: u32, rank: Option<u32>, data: Value) -> Record {
        let base: DateTime<Utc> = "2026-11-22T00:00:00Z".parse().unwrap();
        Record {
            v: 1,
            ts: base + chrono::Duration::microseconds((t * 1e6) as i64),
            kind: kind.into(),
            attempt,
            rank,
            node: Some(format!("n{}", rank.unwrap_or(0) + 1)),
            data: data.as_object().cloned().unwrap_or_default(),
        }
    }

    #[test]
    fn the_page_is_self_contained_and_shows_every_state_and_failure() {
        let mut r = Vec::new();
        for rank in 0..2 {
            r.push(rec(0.0, "rank_start", 0, Some(rank), json!({})));
            r.push(rec(1.0, "progress", 0, Some(rank), json!({ "step": 1 })));
            r.push(rec(5.0, "progress", 0, Some(rank), json!({ "step": 5 })));
            r.push(rec(
                4.0,
                "checkpoint_done",
                0,
                Some(rank),
                json!({ "step": 4, "duration_s": 0.5 }),
            ));
        }
        r.push(rec(9.0, "stall", 0, Some(1), json!({ "last_step": 5 })));
        r.push(rec(
            9.5,
            "failure",
            0,
            Some(1),
            json!({ "cause": "stalled", "class": "hang", "evidence": "no step for 4s <&>" }),
        ));
        for rank in 0..2 {
            r.push(rec(
                10.0,
                "rank_exit",
                0,
                Some(rank),
                json!({ "exit_code": 124 }),
            ));
        }
        r.push(rec(10.5, "requeue", 0, None, json!({ "reason": "hang" })));
        for rank in 0..2 {
            r.push(rec(30.0, "rank_start", 1, Some(rank), json!({})));
            r.push(rec(31.0, "progress", 1, Some(rank), json!({ "step": 5 })));
            r.push(rec(40.0, "progress", 1, Some(rank), json!({ "step": 14 })));
            r.push(rec(
                41.0,
                "rank_exit",
                1,
                Some(rank),
                json!({ "exit_code": 0 }),
            ));
        }
        r.sort_by_key(|x| x.ts);
        let report = crate::analysis::report::build("7", &r, 0, None);
        let h = render("7", &r, &report);
        assert!(h.starts_with("<!doctype html>"));
        assert!(!h.contains("<script"));
        assert!(!h.contains("src="), "nothing fetched");
        assert!(h.contains(&crate::analysis::report::summary_line(&report)));
        for state in [
            "startup",
            "progressing",
            "checkpointing",
            "stalled",
            "down",
            "queued",
        ] {
            assert!(h.contains(colour(state)), "{state}");
        }
        assert!(h.contains("rank 0") && h.contains("rank 1"));
        // The failure's tooltip carries its evidence, escaped.
        assert!(h.contains("evidence: no step for 4s &lt;&amp;&gt;"), "{h}");
        assert!(h.contains("class: hang"));
    }

    #[test]
    fn big_jobs_get_a_row_per_node() {
        let mut r = Vec::new();
        for rank in 0..64u32 {
            let mut x = rec(0.0, "rank_start", 0, Some(rank), json!({}));
            x.node = Some(format!("gpu{:03}", rank / 8));
            r.push(x);
        }
        let report = crate::analysis::report::build("8", &r, 0, None);
        let h = render("8", &r, &report);
        assert!(h.contains("gpu007") && !h.contains("rank 63"));
        assert!(h.contains("(one per node)"));
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(130.0), 200.0);
    }
}
