//! The report for humans.

use super::{secs, FailureRow, JobReport};
use std::fmt::Write as _;

/// The one-line summary: `ETTR 91.4%: 5.2% startup, 2.1% stalled, ...`.
pub fn summary_line(r: &JobReport) -> String {
    let mut parts: Vec<(f64, &str)> = r
        .lost_s
        .iter()
        .filter(|(_, v)| **v > 0.0005 * r.wall_s.max(1e-9))
        .map(|(k, v)| (*v, k.as_str()))
        .collect();
    parts.sort_by(|a, b| b.0.total_cmp(&a.0));
    let lost: Vec<String> = parts
        .iter()
        .map(|(v, k)| format!("{:.1}% {}", pct(*v, r.wall_s), k.replace('_', " ")))
        .collect();
    let failures = match r.failed_attempts {
        0 => String::new(),
        1 => " after 1 failure".into(),
        n => format!(" after {n} failures"),
    };
    // No step number read at all: the time could not be told productive.
    let ettr = if r.ettr_unknown {
        "ETTR unknown (no step number was read)".to_string()
    } else {
        format!("ETTR {:.1}%", 100.0 * r.ettr)
    };
    if lost.is_empty() {
        format!("{ettr}{failures}")
    } else {
        format!("{ettr}{failures}: {}", lost.join(", "))
    }
}

/// Where step numbers come from, when a trainer's are not read.
const STEPS_FROM: &str = "Lightning's Rich bar (its default when `rich` is installed) prints nothing to a pipe (export TTY_COMPATIBLE=1 so Rich draws it and resilio reads it, or use TQDMProgressBar or the resilio_client.lightning callback); the HF Trainer without its bar names steps at log level info (`--log_level info`); any trainer can send `step=N` on RESILIO_SOCKET; steps printed in a format of the trainer's own are read with `--progress-regex` (`[progress] regex`), e.g. `--progress-regex '^it (\\d+)/'` for `it 12/200 loss=...`";

/// The checkpoint that can be restored, checkpoints found incomplete, and
/// saves that take too much of the time between them.
fn render_checkpoint_health(s: &mut String, r: &JobReport) {
    let c = &r.checkpoints;
    let size = |b: u64| {
        if b >= 1 << 30 {
            format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
        } else {
            format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
        }
    };
    if let Some(l) = &c.last_restorable {
        let _ = writeln!(
            s,
            "last restorable checkpoint: step {}{}{} (attempt {}, {})",
            l.step.map_or("-".into(), |x| x.to_string()),
            l.path
                .as_ref()
                .map_or(String::new(), |p| format!(" in {p}")),
            l.size_bytes
                .map_or(String::new(), |b| format!(", {}", size(b))),
            l.attempt,
            l.ts.map_or("-".into(), |t| t.format("%H:%M:%S%.3fZ").to_string()),
        );
    } else if !c.incomplete.is_empty() || !c.suspect.is_empty() {
        let _ = writeln!(s, "last restorable checkpoint: none");
    }
    for i in &c.incomplete {
        let mut why = Vec::new();
        if !i.temp_names.is_empty() {
            why.push(format!(
                "temporary names left in it ({})",
                i.temp_names.join(", ")
            ));
        }
        if !i.changing.is_empty() {
            why.push(format!(
                "still written to after its marker ({})",
                i.changing.join(", ")
            ));
        }
        if let Some(earlier) = &i.same_as {
            why.push(format!(
                "stale: its files are byte for byte those of {earlier} (a save reported as new that wrote nothing new)"
            ));
        }
        let _ = writeln!(
            s,
            "  {}: step {}{}: {}",
            if i.same_as.is_some() && i.temp_names.is_empty() && i.changing.is_empty() {
                "not new"
            } else {
                "incomplete"
            },
            i.step.map_or("-".into(), |x| x.to_string()),
            i.path
                .as_ref()
                .map_or(String::new(), |p| format!(" in {p}")),
            why.join("; ")
        );
    }
    for b in &c.suspect {
        let _ = writeln!(
            s,
            "  suspect: step {}: attempt {} failed soon after restoring it ({}): neither it nor what that attempt saved is loaded again{}",
            b.step,
            b.attempt,
            b.why,
            b.saved_again_by.map_or(String::new(), |a| format!(
                "; saved again by attempt {a}, whole: that save is another checkpoint"
            ))
        );
    }
    if let (Some(share), Some(d), Some(iv)) = (c.warn_share, c.mean_duration_s, c.mean_interval_s) {
        if iv > 0.0 && d / iv > share {
            let _ = writeln!(
                s,
                "warning: a checkpoint takes {d:.1}s, {:.0}% of the {iv:.1}s between them (more than [checkpoint] warn_share {:.0}%): save less often or asynchronously",
                100.0 * d / iv,
                100.0 * share
            );
        }
    }
}

/// The rank judged the cause, where it left no failure of its own (a
/// hung rank the coordinator stopped: only its waiting peers
/// stalled): listed from its judgment, so that the list centres on
/// it (not counted among the failure records).
fn judged_without_failure(r: &JobReport) -> Vec<FailureRow> {
    r.judgments
        .iter()
        .filter_map(|j| {
            let rank = j.rank?;
            let listed = r
                .failures
                .iter()
                .any(|f| f.attempt == j.attempt && f.rank == Some(rank));
            (!listed).then(|| FailureRow {
                ts: j.ts,
                attempt: j.attempt,
                kind: "judgment".into(),
                class: j.class.clone(),
                node: j.node.clone(),
                rank: Some(rank),
                cause: "judged the cause".into(),
                exit_code: None,
                detail: j.evidence.clone(),
                role: Some("primary"),
            })
        })
        .collect()
}

/// Whether the loss stayed healthy, when one was seen.
fn render_loss(s: &mut String, r: &JobReport) {
    if let Some(l) = &r.loss {
        let num = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.4}"));
        if l.healthy {
            let _ = writeln!(
                s,
                "loss: healthy (no NaN or Inf, no spike): first {}, last {}, lowest {}",
                num(l.first),
                num(l.last),
                num(l.min)
            );
        } else if l.findings.is_empty() {
            // NaN or Inf printed, but never for long enough to be a
            // finding (a skipped fp16 step, a NaN batch the trainer dropped).
            let _ = writeln!(
                s,
                "loss: {} record(s) with a NaN or Inf loss printed, not for long enough to be a finding: the run went on; first {}, last finite {}, lowest {}",
                l.nonfinite_records,
                num(l.first),
                num(l.last),
                num(l.min)
            );
        } else {
            let nonfinite = if l.nonfinite_records > 0 {
                format!("{} record(s) with a NaN or Inf loss; ", l.nonfinite_records)
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "loss: NOT healthy: {nonfinite}last finite {}",
                num(l.last)
            );
            for f in &l.findings {
                let _ = writeln!(s, "  {f}");
            }
        }
    }
}

/// The throughput section: one line per attempt that has figures, its
/// step rate as a sparkline, then the goodput.
fn render_throughput(s: &mut String, r: &JobReport) {
    use crate::analysis::throughput::sparkline;
    if r.attempts.iter().all(|a| a.throughput.is_none()) {
        return;
    }
    let _ = writeln!(
        s,
        "\nthroughput (median over the attempt; step rate over time):"
    );
    let num = |v: Option<f64>, unit: &str| match v {
        Some(x) if x >= 1e6 => format!("{:.3}M {unit}", x / 1e6),
        Some(x) if x >= 100.0 => format!("{x:.0} {unit}"),
        Some(x) => format!("{x:.3} {unit}"),
        None => format!("- {unit}"),
    };
    for a in &r.attempts {
        let Some(t) = &a.throughput else { continue };
        // Only what is known: a trainer that prints its step time alone
        // gets that and its step rate.
        let mut parts = vec![num(t.step_time_s, "s/step")];
        if t.tokens_per_s.is_some() {
            parts.push(num(t.tokens_per_s, "tokens/s"));
        }
        if t.samples_per_s.is_some() {
            parts.push(num(t.samples_per_s, "samples/s"));
        }
        if t.tflops_per_device.is_some() {
            parts.push(num(t.tflops_per_device, "TFLOP/s per device"));
        }
        if let Some(m) = t.mfu {
            parts.push(format!("MFU {:.1}%", 100.0 * m));
        }
        let _ = writeln!(
            s,
            "  #{}  {}  on {} device(s){}  {}",
            a.attempt,
            parts.join("  "),
            t.devices,
            if t.from.is_empty() {
                String::new()
            } else {
                format!(" ({})", t.from.join(", "))
            },
            sparkline(&t.rates, 24),
        );
    }
    if let Some(g) = &r.goodput {
        let _ = writeln!(
            s,
            "goodput: {} tokens kept in {:.2} device-hours allocated: {} tokens per device-hour{}",
            num(Some(g.tokens_kept), "").trim_end(),
            g.device_hours,
            num(Some(g.tokens_per_device_hour), "").trim_end(),
            g.effective_mfu.map_or(String::new(), |m| format!(
                "; ETTR {:.1}% x MFU = {:.1}% of the devices' peak spent on kept training",
                100.0 * r.ettr,
                100.0 * m
            ))
        );
    }
}

/// Render the report for humans.
pub fn render_text(r: &JobReport) -> String {
    let mut s = String::new();
    render_header(&mut s, r);
    render_accounting(&mut s, r);
    render_attempts(&mut s, r);
    render_throughput(&mut s, r);
    render_loss(&mut s, r);
    render_checkpoints(&mut s, r);
    render_failures(&mut s, r);
    render_judgments(&mut s, r);
    super::recoveries::render_recoveries(&mut s, r);
    render_observed(&mut s, r);
    render_journal_gaps(&mut s, r);
    render_supervisor_losses(&mut s, r);
    for line in skipped_notes(&r.skipped_lines, r.bad_journal_lines, &r.left_out) {
        let _ = writeln!(s, "{line}");
    }
    s
}

/// The heading: the job, its run, the summary, its times and counts.
fn render_header(s: &mut String, r: &JobReport) {
    let _ = writeln!(s, "job {}", r.job);
    if let Some(note) = r
        .run
        .as_ref()
        .and_then(|run| crate::runs::note(&r.job, &r.runs, run.index.saturating_sub(1)))
    {
        let _ = writeln!(s, "{note}");
    }
    let _ = writeln!(s, "{}", summary_line(r));
    if let (Some(a), Some(b)) = (r.start, r.end) {
        let _ = writeln!(
            s,
            "wall {:.1}s  productive {:.1}s  from {} to {}  (times: {})",
            r.wall_s,
            r.productive_s,
            a.format("%Y-%m-%d %H:%M:%S%.3fZ"),
            b.format("%H:%M:%S%.3fZ"),
            r.time_source
        );
    }
    let _ = writeln!(
        s,
        "attempts {} ({} failed; {} restart(s) without the queue{})  stalls {}  failure records {}  last step {}  exit code {}",
        r.attempts.len(),
        r.failed_attempts,
        r.restarts,
        // Local mode never requeues: no "0 requeue(s)" there.
        if r.requeues > 0 {
            format!(", {} requeue(s)", r.requeues)
        } else {
            String::new()
        },
        r.stalls,
        r.failures.len(),
        r.last_step.map_or("-".into(), |v| v.to_string()),
        r.exit_code.map_or("-".into(), |v| v.to_string()),
    );
    if r.ettr_unknown {
        if r.failed_attempts > 0 && r.failed_attempts >= r.attempts.len() {
            // Every attempt failed: most likely before its first step
            // (trial 16: the progress bar blamed for a crash at start).
            let _ = writeln!(
                s,
                "note: every attempt failed before a step number was read (see the failures), so no time counts as productive; if the trainer did take steps: {STEPS_FROM}"
            );
        } else {
            let _ = writeln!(
                s,
                "note: no step number was read from the trainer, so no time counts as productive: {STEPS_FROM}"
            );
        }
    }
}

/// Where the time went, bucket by bucket.
fn render_accounting(s: &mut String, r: &JobReport) {
    let _ = writeln!(s, "\ntime accounting:");
    let _ = writeln!(
        s,
        "  {:<18} {:>10.1}s {:>6.1}%",
        "productive",
        r.productive_s,
        pct(r.productive_s, r.wall_s)
    );
    for k in &crate::analysis::accounting::BUCKETS[1..] {
        let v = r.lost_s.get(*k).copied().unwrap_or(0.0);
        let _ = writeln!(s, "  {:<18} {:>10.1}s {:>6.1}%", k, v, pct(v, r.wall_s));
    }
    if let Some(v) = r.lost_s.get("slowdown") {
        let _ = writeln!(
            s,
            "  {:<18} {:>10.1}s {:>6.1}%  (productive time that bought no steps: slower than the job's baseline)",
            "slowdown",
            v,
            pct(*v, r.wall_s)
        );
    }
}

/// One line per attempt, its exits.
fn render_attempts(s: &mut String, r: &JobReport) {
    let _ = writeln!(s, "\nattempts:");
    for a in &r.attempts {
        // The rank the attempt's judgment blamed, marked: its own exit may
        // look like a bystander's (stopped by the coordinator).
        let blamed = r
            .judgments
            .iter()
            .find(|j| j.attempt == a.attempt)
            .and_then(|j| j.rank);
        let exits: Vec<String> = a
            .exits
            .iter()
            .map(|e| {
                format!(
                    "rank {} {}",
                    e.rank.map_or("?".into(), |v| v.to_string()),
                    e.cause.clone().unwrap_or_default()
                ) + &e
                    .exit_code
                    .map_or(String::new(), |c| format!(" (exit {c})"))
                    + if e.rank.is_some() && e.rank == blamed {
                        ", judged the cause"
                    } else {
                        ""
                    }
            })
            .collect();
        let _ = writeln!(
            s,
            "  #{} {} ranks {:?} on {}  {:.1}s  last step {}  stalls {}  {}",
            a.attempt,
            a.start.format("%H:%M:%S%.3f"),
            a.ranks,
            a.nodes.join(","),
            a.wall_s,
            a.last_step.map_or("-".into(), |v| v.to_string()),
            a.stalls,
            if a.ended_cleanly {
                exits.join("; ")
            } else {
                "no exit recorded (resilio was killed?)".into()
            }
        );
    }
}

/// The checkpoints confirmed, their health and the interval advised.
fn render_checkpoints(s: &mut String, r: &JobReport) {
    if r.checkpoints.count > 0 {
        let _ = writeln!(
            s,
            "\ncheckpoints: {} confirmed{}, mean duration {}, mean interval {}",
            r.checkpoints.count,
            match r.checkpoints.incomplete.len() + r.checkpoints.suspect.len() {
                0 => String::new(),
                n => format!(" ({n} of them not to count on, below)"),
            },
            r.checkpoints
                .mean_duration_s
                .map_or("-".into(), |d| format!("{d:.1}s")),
            r.checkpoints
                .mean_interval_s
                .map_or("-".into(), |d| format!("{d:.1}s")),
        );
    }
    render_checkpoint_health(s, r);
    if let Some(a) = &r.checkpoint_advice {
        let _ = writeln!(
            s,
            "checkpoint interval advice: every {:.0}s (Daly; Young {:.0}s) for MTTF {:.0}s{} and cost {:.1}s: expected ETTR {:.1}%{}",
            a.optimal_s,
            a.young_s,
            a.mtbf_s,
            match &r.fleet {
                Some(f) if r.mttf_pooled_s.is_some() && f.jobs > 0 => format!(
                    " (this job with the node history of {} other job(s): {:.0} failure(s) in {:.0} node-hours)",
                    f.jobs,
                    f.failures,
                    f.node_seconds / 3600.0
                ),
                _ => " (this job)".into(),
            },
            a.checkpoint_cost_s,
            100.0 * a.ettr_at_optimal,
            match (a.current_s, a.ettr_at_current) {
                (Some(c), Some(e)) => format!(" (now every {c:.0}s: {:.1}%)", 100.0 * e),
                _ => String::new(),
            }
        );
    }
}

/// The failures, centred on the rank judged the cause.
fn render_failures(s: &mut String, r: &JobReport) {
    let judged = judged_without_failure(r);
    if !r.failures.is_empty() {
        let _ = writeln!(
            s,
            "\nfailures:{}",
            if r.failures
                .iter()
                .chain(&judged)
                .any(|f| f.role == Some("primary"))
            {
                " (* the rank judged the cause; the others are its echoes)"
            } else if r.failures.iter().any(|f| f.role.is_some()) {
                " (echoes of the rank judged the cause: see judgments)"
            } else {
                ""
            }
        );
        let mut all: Vec<&FailureRow> = r.failures.iter().chain(&judged).collect();
        all.sort_by_key(|f| f.ts);
        for f in all {
            let _ = writeln!(
                s,
                "  {}{} attempt {} rank {} node {}: {} {} ({}){}",
                match f.role {
                    Some("primary") => "* ",
                    Some(_) => "  ",
                    None => "",
                },
                f.ts.format("%H:%M:%S%.3f"),
                f.attempt,
                f.rank.map_or("-".into(), |v| v.to_string()),
                f.node.clone().unwrap_or_else(|| "?".into()),
                f.class.as_deref().unwrap_or(""),
                f.kind,
                f.cause,
                f.detail
                    .as_ref()
                    .map_or(String::new(), |d| format!(": {d}"))
            );
        }
    }
}

/// Each failed attempt's judgment: who was blamed, what was decided.
fn render_judgments(s: &mut String, r: &JobReport) {
    if !r.judgments.is_empty() {
        let _ = writeln!(s, "\njudgments:");
        for j in &r.judgments {
            let blamed = match (j.rank, &j.node) {
                (Some(k), Some(n)) => format!(" on rank {k} ({n})"),
                (Some(k), None) => format!(" on rank {k}"),
                (None, Some(n)) => format!(" on node {n}"),
                (None, None) => ", nobody blamed".into(),
            };
            let _ = writeln!(
                s,
                "  {} attempt {}: {}{}{}{}",
                j.ts.format("%H:%M:%S%.3f"),
                j.attempt,
                j.class.as_deref().unwrap_or("?"),
                blamed,
                j.decision
                    .as_ref()
                    .map_or(String::new(), |d| format!(" -> {}", d.replace('_', " "))),
                j.evidence.as_ref().map_or(String::new(), |e| format!(
                    ": {}",
                    crate::util::clip(e, 400)
                ))
            );
            if let Some(why) = &j.stop_reason {
                let _ = writeln!(s, "    stopped: {}", crate::util::clip(why, 400));
            }
            if let (Some(k), Some(p)) = (j.rank, &j.blamed_probe) {
                let _ = writeln!(s, "    rank {k}'s probe: {}", crate::util::clip(p, 300));
            }
            if let Some(f) = &j.blamed_stacks {
                let _ = writeln!(s, "    its diagnostics: {f}");
            }
        }
    }
}

/// Observe mode: what resilio would have done.
fn render_observed(s: &mut String, r: &JobReport) {
    if !r.observed.is_empty() {
        let _ = writeln!(
            s,
            "\nobserve mode: what resilio would have done (nothing was done):"
        );
        for o in &r.observed {
            let _ = writeln!(
                s,
                "  {} attempt {}{}: would {} ({})",
                o.ts.format("%H:%M:%S%.3f"),
                o.attempt,
                match (o.rank, &o.node) {
                    (Some(k), Some(n)) => format!(" rank {k} on {n}"),
                    (Some(k), None) => format!(" rank {k}"),
                    _ => String::new(),
                },
                o.would,
                o.reason
            );
        }
    }
}

/// Stretches the journal could not be written.
fn render_journal_gaps(s: &mut String, r: &JobReport) {
    if !r.journal_gaps.is_empty() {
        let _ = writeln!(
            s,
            "\njournal gaps (records lost: the journal could not be written, a full disk or another write error; what happened then is not known, so the time is counted as unexplained):"
        );
        for g in &r.journal_gaps {
            let _ = writeln!(
                s,
                "  attempt {} rank {} node {}: {} record(s) lost from {} to {} ({:.1}s; {:.1}s of it unexplained)",
                g.attempt,
                g.rank.map_or("-".into(), |v| v.to_string()),
                g.node.as_deref().unwrap_or("?"),
                g.lost_records,
                g.from.format("%H:%M:%S%.3f"),
                g.to.format("%H:%M:%S%.3f"),
                secs(g.from, g.to),
                g.unexplained_s,
            );
        }
    }
}

/// resilio's own parts that died during the job.
fn render_supervisor_losses(s: &mut String, r: &JobReport) {
    if !r.supervisor_losses.is_empty() {
        let _ = writeln!(s, "\nresilio's own faults (the ranks trained on):");
        for l in &r.supervisor_losses {
            let what = match l.part.as_str() {
                "launcher" => "the local launcher (and the coordinator in it)",
                _ => "the job-level supervisor (and the coordinator in it)",
            };
            let _ = writeln!(
                s,
                "  {} attempt {}: {what}{} died{}{}{}",
                l.ts.format("%H:%M:%S%.3f"),
                l.attempt,
                l.pid.map_or(String::new(), |p| format!(" (pid {p})")),
                l.status
                    .as_ref()
                    .map_or(String::new(), |st| format!(" ({st})")),
                if l.ranks.is_empty() {
                    String::new()
                } else {
                    format!(", seen by ranks {:?}", l.ranks)
                },
                l.note.as_ref().map_or(String::new(), |n| format!(": {n}")),
            );
        }
    }
}

/// What the reports say about journal lines they skipped and records they
/// left out: a blank line, a heading, and one line per file or reason.
pub fn skipped_notes(
    skipped: &[crate::journal::SkippedLines],
    bad_lines: usize,
    left_out: &[String],
) -> Vec<String> {
    if skipped.is_empty() && bad_lines == 0 && left_out.is_empty() {
        return Vec::new();
    }
    let records_out: usize = skipped.iter().map(|f| f.duplicates + f.future).sum();
    let mut parts = Vec::new();
    if bad_lines > 0 || records_out == 0 {
        parts.push(format!("{bad_lines} unreadable line(s) skipped"));
    }
    if records_out > 0 {
        parts.push(format!("{records_out} record(s) left out"));
    }
    if !left_out.is_empty() {
        parts.push(format!("{} attempt(s) left out", left_out.len()));
    }
    match skipped.iter().filter(|f| f.records == 0).count() {
        0 => {}
        n => parts.push(format!("{n} file(s) with no readable record")),
    }
    let mut out = vec![
        String::new(),
        format!("journal: {}, the rest accounted:", parts.join(", ")),
    ];
    out.extend(skipped.iter().map(|f| format!("  {}", f.describe())));
    out.extend(left_out.iter().map(|l| format!("  {l}")));
    out
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}
