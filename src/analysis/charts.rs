//! The charts under the HTML timeline's rows, on the same time axis: the
//! step rate (tokens/s where the run's throughput gives tokens), the loss,
//! and MFU, each a line per attempt, with the stalls, slowdowns,
//! checkpoints and numerical findings marked. Inline SVG, no script.

use crate::analysis::report::JobReport;
use crate::event::Event;
use crate::journal::Record;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::fmt::Write as _;

const CHART_H: f64 = 80.0;
const CHART_GAP: f64 = 34.0;

/// The colour of each chart's line.
pub const RATE: &str = "#1f6feb";
pub const LOSS: &str = "#9a3412";
pub const MFU: &str = "#0e7490";

/// One series: (time, value) points per attempt.
type Series = BTreeMap<u32, Vec<(DateTime<Utc>, f64)>>;

struct Chart {
    title: String,
    colour: &'static str,
    series: Series,
    /// Times at which the value was not finite (a NaN loss).
    bad: Vec<DateTime<Utc>>,
    percent: bool,
}

/// The rank whose records carry figures (often rank 0 only), else the lowest.
fn chart_rank(records: &[Record]) -> Option<u32> {
    let with_figures = records.iter().find_map(|r| match r.event() {
        Some(Event::Progress(p)) if p.metrics.as_ref().is_some_and(|m| !m.is_empty()) => r.rank,
        _ => None,
    });
    with_figures.or_else(|| {
        records
            .iter()
            .filter(|r| r.kind == "progress")
            .filter_map(|r| r.rank)
            .min()
    })
}

fn series(records: &[Record], report: &JobReport) -> Vec<Chart> {
    let Some(rank) = chart_rank(records) else {
        return Vec::new();
    };
    let (devices, tokens_per_step) = attempt_scales(report);
    let peak = records.iter().find_map(|r| match r.event() {
        Some(Event::RankStart(x)) => x.peak_tflops,
        _ => None,
    });
    let mut rate = Series::new();
    let mut loss = Series::new();
    let mut mfu = Series::new();
    let mut bad = Vec::new();
    let mut prev: BTreeMap<u32, (DateTime<Utc>, u64)> = BTreeMap::new();
    let mut tokens_known = true;
    for r in records.iter().filter(|r| r.rank == Some(rank)) {
        let Some(Event::Progress(p)) = r.event() else {
            continue;
        };
        let m = p.metrics.clone().unwrap_or_default();
        let get = |k: &str| m.get(k).and_then(|v| v.as_f64());
        if let Some(step) = p.step {
            if let Some((t0, s0)) = prev.get(&r.attempt) {
                let dt = (r.ts - *t0).num_microseconds().unwrap_or(0) as f64 / 1e6;
                if dt > 0.0 && step >= *s0 {
                    let steps = (step - s0) as f64 / dt;
                    let value = match (get("tokens_per_s_device"), tokens_per_step.get(&r.attempt))
                    {
                        (Some(t), _) => t * devices.get(&r.attempt).copied().unwrap_or(1.0),
                        (None, Some(t)) => steps * t,
                        (None, None) => {
                            tokens_known = false;
                            steps
                        }
                    };
                    rate.entry(r.attempt).or_default().push((r.ts, value));
                }
            }
            prev.insert(r.attempt, (r.ts, step));
        }
        match m.get("loss") {
            Some(v) if v.is_null() => bad.push(r.ts),
            Some(v) => {
                if let Some(x) = v.as_f64() {
                    loss.entry(r.attempt).or_default().push((r.ts, x));
                }
            }
            None => {}
        }
        let u = get("mfu").or_else(|| Some(get("tflops")? / peak.filter(|p| *p > 0.0)?));
        if let Some(u) = u {
            mfu.entry(r.attempt).or_default().push((r.ts, u));
        }
    }
    let mut out = Vec::new();
    if rate.values().any(|v| v.len() > 1) {
        out.push(Chart {
            title: if tokens_known && (rate_is_tokens(records) || !tokens_per_step.is_empty()) {
                "tokens/s".into()
            } else {
                "steps/s".into()
            },
            colour: RATE,
            series: rate,
            bad: Vec::new(),
            percent: false,
        });
    }
    if !loss.is_empty() || !bad.is_empty() {
        out.push(Chart {
            title: "loss".into(),
            colour: LOSS,
            series: loss,
            bad,
            percent: false,
        });
    }
    if !mfu.is_empty() {
        out.push(Chart {
            title: "MFU".into(),
            colour: MFU,
            series: mfu,
            bad: Vec::new(),
            percent: true,
        });
    }
    out
}

/// Each attempt's devices, and its tokens per step where its throughput
/// gives both tokens and steps per second.
fn attempt_scales(report: &JobReport) -> (BTreeMap<u32, f64>, BTreeMap<u32, f64>) {
    let devices: BTreeMap<u32, f64> = report
        .attempts
        .iter()
        .filter_map(|a| Some((a.attempt, a.throughput.as_ref()?)))
        .map(|(a, t)| (a, f64::from(t.devices.max(1))))
        .collect();
    let tokens_per_step: BTreeMap<u32, f64> = report
        .attempts
        .iter()
        .filter_map(|a| {
            let t = a.throughput.as_ref()?;
            Some((a.attempt, t.tokens_per_s? / t.steps_per_s?))
        })
        .collect();
    (devices, tokens_per_step)
}

/// Whether every rate point is in tokens (the trainer printed tps, or the
/// run's throughput gives tokens per step).
fn rate_is_tokens(records: &[Record]) -> bool {
    records.iter().any(|r| match r.event() {
        Some(Event::Progress(p)) => p
            .metrics
            .as_ref()
            .is_some_and(|m| m.contains_key("tokens_per_s_device")),
        _ => false,
    })
}

fn number(v: f64, percent: bool) -> String {
    if percent {
        format!("{:.0}%", 100.0 * v)
    } else if v.abs() >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v.abs() >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if v.abs() >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// What every chart marks: stalls, slowdowns, checkpoints, findings.
#[derive(Default)]
struct ChartMarks {
    stalls: Vec<DateTime<Utc>>,
    checkpoints: Vec<DateTime<Utc>>,
    numerical: Vec<DateTime<Utc>>,
    /// Slowdowns, from when they began to when they were over (`None`:
    /// not over, drawn to the job's end).
    slow: Vec<(DateTime<Utc>, Option<DateTime<Utc>>)>,
}

fn marks_of(records: &[Record]) -> ChartMarks {
    let mut m = ChartMarks::default();
    for r in records {
        match r.event() {
            Some(Event::Stall(_)) => m.stalls.push(r.ts),
            Some(Event::CheckpointDone(_)) => m.checkpoints.push(r.ts),
            Some(Event::Numerical(_)) => m.numerical.push(r.ts),
            Some(Event::Slowdown(s))
                if s.state == crate::policy::slowdown::SlowdownState::Started =>
            {
                let back =
                    chrono::Duration::milliseconds((s.slow_for_s.unwrap_or(0.0) * 1000.0) as i64);
                m.slow.push((r.ts - back, None));
            }
            Some(Event::Slowdown(_)) => {
                if let Some(open) = m.slow.iter_mut().rev().find(|s| s.1.is_none()) {
                    open.1 = Some(r.ts);
                }
            }
            _ => {}
        }
    }
    m
}

/// The charts, from `top` down, with `x` mapping time to the timeline's
/// axis; their SVG and height (0 when there is nothing to chart).
pub fn render(
    records: &[Record],
    report: &JobReport,
    x: &dyn Fn(DateTime<Utc>) -> f64,
    top: f64,
    label_w: f64,
    plot_w: f64,
) -> (String, f64) {
    let charts = series(records, report);
    if charts.is_empty() {
        return (String::new(), 0.0);
    }
    let marks = marks_of(records);
    let end = report.end;
    let mut h = String::new();
    let mut y = top;
    for c in &charts {
        let values: Vec<f64> = c.series.values().flatten().map(|(_, v)| *v).collect();
        let (mut lo, mut hi) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(*v), b.max(*v))
            });
        if c.title != "loss" {
            lo = lo.min(0.0);
        }
        if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
            hi = lo + 1.0;
        }
        let yv = |v: f64| y + CHART_H - CHART_H * (v - lo) / (hi - lo);
        let _ = writeln!(
            h,
            "<g class=\"chart\"><text x=\"4\" y=\"{:.1}\">{}</text><text x=\"4\" y=\"{:.1}\" class=\"meta\">{} .. {}</text>\
             <rect x=\"{label_w}\" y=\"{y:.1}\" width=\"{plot_w}\" height=\"{CHART_H}\" fill=\"#fcfcfc\" stroke=\"#ddd\"/>",
            y + 14.0,
            c.title,
            y + 30.0,
            number(lo, c.percent),
            number(hi, c.percent)
        );
        write_marks(&mut h, &marks, x, y, end);
        write_lines(&mut h, c, x, &yv, y);
        h.push_str("</g>\n");
        y += CHART_H + CHART_GAP;
    }
    (h, y - top)
}

/// The marks on one chart at `y`: slowdowns shaded (to `end` when not
/// over), stalls, checkpoints and findings as dashed lines.
fn write_marks(
    h: &mut String,
    marks: &ChartMarks,
    x: &dyn Fn(DateTime<Utc>) -> f64,
    y: f64,
    end: Option<DateTime<Utc>>,
) {
    for (from, to) in &marks.slow {
        let (a, b) = (x(*from), x(to.or(end).unwrap_or(*from)));
        let _ = writeln!(
            h,
            "<rect x=\"{a:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{CHART_H}\" fill=\"#f59e0b\" fill-opacity=\"0.18\"><title>slowdown</title></rect>",
            (b - a).max(1.0)
        );
    }
    for (t, colour, what) in marks
        .stalls
        .iter()
        .map(|t| (t, "#e8741c", "stall"))
        .chain(
            marks
                .checkpoints
                .iter()
                .map(|t| (t, "#2563eb", "checkpoint")),
        )
        .chain(marks.numerical.iter().map(|t| (t, "#c0151b", "numerical")))
    {
        let px = x(*t);
        let _ = writeln!(
            h,
            "<line x1=\"{px:.2}\" y1=\"{y:.1}\" x2=\"{px:.2}\" y2=\"{:.1}\" stroke=\"{colour}\" stroke-width=\"1\" stroke-dasharray=\"2 2\"><title>{what}</title></line>",
            y + CHART_H
        );
    }
}

/// One chart's lines, a line per attempt (a dot for a single point), and
/// its non-finite values as crosses, with `yv` mapping values to its axis.
fn write_lines(
    h: &mut String,
    c: &Chart,
    x: &dyn Fn(DateTime<Utc>) -> f64,
    yv: &dyn Fn(f64) -> f64,
    y: f64,
) {
    for (attempt, points) in &c.series {
        let pts: Vec<String> = points
            .iter()
            .map(|(t, v)| format!("{:.2},{:.2}", x(*t), yv(*v)))
            .collect();
        if pts.len() == 1 {
            let _ = writeln!(
                h,
                "<circle cx=\"{}\" r=\"2.5\" fill=\"{}\"><title>attempt {attempt}</title></circle>",
                pts[0].replacen(',', "\" cy=\"", 1),
                c.colour
            );
        } else {
            let _ = writeln!(
                h,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"3\"><title>{}, attempt {attempt}</title></polyline>",
                pts.join(" "),
                c.colour,
                c.title
            );
        }
    }
    for t in &c.bad {
        let (px, py) = (x(*t), y + 8.0);
        let _ = writeln!(
            h,
            "<path d=\"M{:.1} {:.1} L{:.1} {:.1} M{:.1} {:.1} L{:.1} {:.1}\" stroke=\"#c0151b\" stroke-width=\"2\"><title>NaN or Inf</title></path>",
            px - 4.0,
            py - 4.0,
            px + 4.0,
            py + 4.0,
            px - 4.0,
            py + 4.0,
            px + 4.0,
            py - 4.0
        );
    }
}
