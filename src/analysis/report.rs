//! Reports computed from a job's journal alone (no live process needed):
//! `resilio report` (attempts, steps, stalls, exits, time accounting). The
//! timeline is [`crate::analysis::timeline`]'s.
//!
//! Time accounting (ETTR and where the rest went) is [`crate::analysis::accounting`]'s.

use crate::event::Event;
use crate::journal::Record;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// One attempt's judgment: the rank and node judged the cause (none when
/// nobody could be blamed), and what was decided.
#[derive(Clone, Debug, Serialize)]
pub struct Judged {
    pub ts: DateTime<Utc>,
    pub attempt: u32,
    pub class: Option<String>,
    pub rank: Option<u32>,
    pub node: Option<String>,
    pub evidence: Option<String>,
    /// `restart_in_place`, `requeue`, `stop`, ... when a decision followed.
    pub decision: Option<String>,
    /// What the blamed rank's probe found (the coordinator's `hang`
    /// record: its state, its innermost Python frame).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blamed_probe: Option<String>,
    /// The blamed rank's diagnostics file of that attempt (its stacks in
    /// full): a probe's, else a stall's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blamed_stacks: Option<String>,
}

/// One failure, as listed in the report.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub ts: DateTime<Utc>,
    pub attempt: u32,
    pub kind: String,
    /// The verdict: infrastructure, user_error, hang, secondary (a peer's echo), ...
    pub class: Option<String>,
    pub node: Option<String>,
    pub rank: Option<u32>,
    pub cause: String,
    pub exit_code: Option<i64>,
    pub detail: Option<String>,
    /// Its place in the attempt's judgment: `primary` (the rank judged the
    /// cause), `echo` (a rank that failed because of it: stalled waiting
    /// for it, stopped with it), absent when no judgment names a rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
}

/// One rank's exit.
#[derive(Clone, Debug, Serialize)]
pub struct RankExit {
    pub rank: Option<u32>,
    pub node: Option<String>,
    pub exit_code: Option<i64>,
    pub cause: Option<String>,
    pub status: Option<String>,
}

/// One attempt (a launch of the job's ranks).
#[derive(Clone, Debug, Serialize)]
pub struct Attempt {
    pub attempt: u32,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// False when no rank_exit was recorded (resilio itself was killed).
    pub ended_cleanly: bool,
    pub ranks: Vec<u32>,
    pub nodes: Vec<String>,
    pub first_step_at: Option<DateTime<Utc>>,
    pub last_progress_at: Option<DateTime<Utc>>,
    pub last_step: Option<u64>,
    pub stalls: usize,
    pub exits: Vec<RankExit>,
    pub wall_s: f64,
    pub productive_s: f64,
    pub lost_s: BTreeMap<String, f64>,
    /// Step rate, tokens/s, TFLOP/s and MFU, where the trainer printed or
    /// sent figures or the run set `[throughput]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput: Option<crate::analysis::throughput::Throughput>,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub job: String,
    pub attempts: Vec<Attempt>,
    pub start: Option<DateTime<Utc>>,
    pub end: Option<DateTime<Utc>>,
    pub wall_s: f64,
    pub productive_s: f64,
    pub ettr: f64,
    pub lost_s: BTreeMap<String, f64>,
    pub failures: Vec<Failure>,
    /// Each failed attempt's judgment: who was blamed, what was decided.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub judgments: Vec<Judged>,
    /// No step number was read at all: no time could be told productive
    /// (the ETTR of 0 says nothing).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ettr_unknown: bool,
    /// Observe mode: what resilio would have done (nothing was done).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub observed: Vec<Observed>,
    pub stalls: usize,
    pub last_step: Option<u64>,
    pub exit_code: Option<i64>,
    /// Where the times came from.
    pub time_source: String,
    /// The job's wall time, stretch by stretch, each in one bucket.
    pub segments: Vec<crate::analysis::accounting::Segment>,
    /// Journal lines that did not parse (torn by a crash, garbled, or
    /// foreign), over all files; `skipped_lines` says where.
    pub bad_journal_lines: usize,
    /// Per journal file: lines skipped (the rest is accounted), files that
    /// hold no readable record or could not be read.
    pub skipped_lines: Vec<crate::journal::SkippedLines>,
    /// What the journal says that the figures leave out, and why (attempts
    /// dated out of their order, see [`crate::runs::reversed_attempts`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
    /// The run shown, when the job id was used for more than one run
    /// (`runs` lists them all; `--run` picks one).
    pub run: Option<crate::runs::RunInfo>,
    /// Every run of the job id, in the order they started.
    pub runs: Vec<crate::runs::RunInfo>,
    /// Checkpoints the trainer confirmed.
    pub checkpoints: Checkpoints,
    /// Mean time to failure observed in this job (wall time per failed attempt).
    pub mttf_s: Option<f64>,
    /// Mean time to failure for a job of this size, pooling this job's
    /// failures with the node history's (other jobs under the state dir).
    pub mttf_pooled_s: Option<f64>,
    pub fleet: Option<crate::analysis::node_history::FleetRate>,
    /// Attempts that ended in a failure (echoes of one failure count once).
    pub failed_attempts: usize,
    /// Relaunches without the queue (in place, or inside the allocation).
    pub restarts: usize,
    /// Trips back to Slurm's queue (by resilio, or by Slurm itself).
    pub requeues: usize,
    /// The checkpoint interval that would maximise ETTR, from this job's
    /// checkpoint cost and failure rate (Daly), when both are known.
    pub checkpoint_advice: Option<crate::policy::checkpoint_interval::Advice>,
    /// Stretches a rank's journal could not be written (a full disk), with
    /// the time of each counted as unexplained. Absent when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub journal_gaps: Vec<crate::analysis::accounting::JournalGap>,
    /// resilio's own parts that died during the job (the job-level
    /// supervisor, the local launcher), when and what carried on. Absent
    /// when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub supervisor_losses: Vec<SupervisorLoss>,
    /// Tokens kept per device-hour and ETTR × MFU, when throughput is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput: Option<crate::analysis::throughput::Goodput>,
    /// Whether the loss stayed healthy (no NaN/Inf, no spike), when the
    /// trainer printed or sent one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<crate::analysis::loss::LossHealth>,
}

/// A part of resilio above the ranks that died during the job.
#[derive(Clone, Debug, Serialize)]
pub struct SupervisorLoss {
    pub ts: DateTime<Utc>,
    pub attempt: u32,
    /// `supervisor` (the job-level supervisor under Slurm) or `launcher`
    /// (the local launcher of several ranks).
    pub part: String,
    pub pid: Option<i32>,
    /// How it ended, where known (`signal 9 (SIGKILL)`).
    pub status: Option<String>,
    /// The ranks that saw it go (local launcher).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<u32>,
    pub note: Option<String>,
}

/// The parts of resilio above the ranks that died, one entry each (every
/// rank journals the launcher's loss: one entry lists them all).
fn supervisor_losses_of(events: &[(&Record, Event)]) -> Vec<SupervisorLoss> {
    let mut out: Vec<SupervisorLoss> = Vec::new();
    for (r, e) in events {
        match e {
            Event::SupervisorLost(s) => out.push(SupervisorLoss {
                ts: r.ts,
                attempt: r.attempt,
                part: "supervisor".into(),
                pid: s.supervisor_pid,
                status: s.status.clone(),
                ranks: Vec::new(),
                note: s.note.clone(),
            }),
            Event::LauncherLost(l) => {
                let same = out.iter_mut().find(|x| {
                    x.part == "launcher" && x.pid == l.launcher_pid && x.attempt == r.attempt
                });
                match same {
                    Some(x) => {
                        x.ts = x.ts.min(r.ts);
                        x.ranks.extend(r.rank);
                    }
                    None => out.push(SupervisorLoss {
                        ts: r.ts,
                        attempt: r.attempt,
                        part: "launcher".into(),
                        pid: l.launcher_pid,
                        status: None,
                        ranks: r.rank.into_iter().collect(),
                        note: l.note.clone(),
                    }),
                }
            }
            _ => {}
        }
    }
    for x in &mut out {
        x.ranks.sort_unstable();
        x.ranks.dedup();
    }
    out
}

/// Checkpoint statistics.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Checkpoints {
    pub count: usize,
    /// Mean time from `phase=checkpoint` to `checkpoint_done`, where both were seen.
    pub mean_duration_s: Option<f64>,
    /// Mean time between successive confirmed checkpoints.
    pub mean_interval_s: Option<f64>,
    /// The last checkpoint that can be restored: confirmed, and whole
    /// where its files were looked at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_restorable: Option<Restorable>,
    /// Checkpoints whose directory still held temporary names when found.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub incomplete: Vec<Restorable>,
    /// Mean size of the checkpoints whose directory was watched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_size_bytes: Option<f64>,
    /// `[checkpoint] warn_share` where the report's reader set it: warn
    /// when a save takes more than this share of the interval.
    #[serde(skip)]
    pub warn_share: Option<f64>,
}

/// One confirmed checkpoint.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Restorable {
    pub attempt: u32,
    pub step: Option<u64>,
    pub ts: Option<DateTime<Utc>>,
    pub source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub temp_names: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changing: Vec<String>,
}

fn checkpoint_stats(records: &[Record]) -> Checkpoints {
    // One entry per (attempt, step): several ranks may confirm the same checkpoint.
    let mut done: Vec<(u32, Option<u64>, DateTime<Utc>)> = Vec::new();
    let mut durations = Vec::new();
    let mut started: BTreeMap<(Option<u32>, u32), DateTime<Utc>> = BTreeMap::new();
    let (mut last_restorable, mut incomplete, mut sizes) = (None, Vec::new(), Vec::new());
    for (r, e) in crate::journal::events(records) {
        match e {
            Event::Phase(p) if p.phase.as_deref() == Some("checkpoint") => {
                started.insert((r.rank, r.attempt), r.ts);
            }
            Event::CheckpointDone(c) => {
                if let Some(t0) = started.remove(&(r.rank, r.attempt)) {
                    durations.push(secs(t0, r.ts));
                }
                let one = Restorable {
                    attempt: r.attempt,
                    step: c.step,
                    ts: Some(r.ts),
                    source: c.source.clone(),
                    path: c.path.clone(),
                    size_bytes: c.size_bytes,
                    temp_names: c.temp_names.clone().unwrap_or_default(),
                    changing: c.changing.clone().unwrap_or_default(),
                };
                sizes.extend(c.size_bytes.map(|b| b as f64));
                if c.complete == Some(false) {
                    incomplete.push(one);
                } else {
                    last_restorable = Some(one);
                }
                let key = (r.attempt, c.step);
                if !done.iter().any(|(a, s, _)| (*a, *s) == key) {
                    done.push((key.0, key.1, r.ts));
                }
            }
            _ => {}
        }
    }
    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let intervals: Vec<f64> = done
        .windows(2)
        .filter(|w| w[0].0 == w[1].0)
        .map(|w| secs(w[0].2, w[1].2))
        .collect();
    Checkpoints {
        count: done.len(),
        mean_duration_s: mean(&durations),
        mean_interval_s: mean(&intervals),
        last_restorable,
        incomplete,
        mean_size_bytes: mean(&sizes),
        warn_share: None,
    }
}

pub(crate) fn secs(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    ((b - a).num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0)
}

fn attempt_of(records: &[&Record], attempt: u32) -> Attempt {
    let start = records
        .iter()
        .filter(|r| r.kind == "rank_start" || r.kind == "job_start")
        .map(|r| r.ts)
        .min()
        .unwrap_or(records[0].ts);
    let events: Vec<(&Record, Event)> = records
        .iter()
        .filter_map(|r| Some((*r, r.event()?)))
        .collect();
    let exits: Vec<(&Record, &crate::event::RankExit)> = events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::RankExit(x) => Some((*r, x)),
            _ => None,
        })
        .collect();
    let last_ts = records.iter().map(|r| r.ts).max().unwrap_or(start);
    let end = exits
        .iter()
        .map(|(r, _)| r.ts)
        .max()
        .unwrap_or(last_ts)
        .max(start);
    let progress_at = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Progress(_)))
        .map(|(r, _)| r.ts);
    let first_step_at = progress_at.clone().min();
    let stalls: Vec<&crate::event::Stall> = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Stall(s) => Some(s),
            _ => None,
        })
        .collect();
    let last_progress_at = progress_at
        .chain(stalls.iter().filter_map(|s| s.last_progress))
        .max();
    let last_step = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Progress(p) => p.step,
            Event::Stall(s) => s.last_step,
            Event::RankExit(x) => x.last_step,
            _ => None,
        })
        .max();

    let ranks: BTreeSet<u32> = records.iter().filter_map(|r| r.rank).collect();
    let nodes: BTreeSet<String> = records.iter().filter_map(|r| r.node.clone()).collect();
    let world = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::RankStart(x) => x.world_size,
            _ => None,
        })
        .max()
        .unwrap_or(ranks.len() as u32);
    Attempt {
        throughput: crate::analysis::throughput::of_attempt(records, world),
        attempt,
        start,
        end,
        ended_cleanly: !exits.is_empty(),
        ranks: ranks.into_iter().collect(),
        nodes: nodes.into_iter().collect(),
        first_step_at,
        last_progress_at,
        last_step,
        stalls: stalls.len(),
        exits: exits
            .iter()
            .map(|(r, x)| RankExit {
                rank: r.rank,
                node: r.node.clone(),
                exit_code: x.exit_code.map(i64::from),
                cause: x.cause.clone(),
                status: x.status.clone(),
            })
            .collect(),
        wall_s: secs(start, end),
        productive_s: 0.0,
        lost_s: BTreeMap::new(),
    }
}

/// Build the report from a job's merged records (ordered by time), with
/// Slurm's allocation times when the job ran under Slurm.
pub fn build(
    job: &str,
    records: &[Record],
    bad_lines: usize,
    slurm: Option<&crate::analysis::accounting::SlurmTimes>,
) -> Report {
    let mut by_attempt: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_attempt.entry(r.attempt).or_default().push(r);
    }
    let acc = crate::analysis::accounting::account(records, slurm);
    let mut attempts: Vec<Attempt> = by_attempt
        .iter()
        .map(|(a, recs)| attempt_of(recs, *a))
        .collect();
    for a in attempts.iter_mut() {
        if let Some(b) = acc.by_attempt.get(&a.attempt) {
            a.productive_s = b.get("productive").copied().unwrap_or(0.0);
            a.lost_s = b
                .iter()
                .filter(|(k, _)| k.as_str() != "productive")
                .map(|(k, v)| (k.clone(), *v))
                .collect();
        }
    }
    let (start, end, wall) = (acc.start, acc.end, acc.wall_s);
    let mut productive = acc.productive_s;
    let mut lost = acc.lost_s.clone();
    // Running slower than the job's own baseline: productive time, part of
    // which bought no steps. Its own bucket, out of productive time.
    for (attempt, slow) in crate::analysis::throughput::slow_time(records) {
        let Some(a) = attempts.iter_mut().find(|a| a.attempt == attempt) else {
            continue;
        };
        let slow = slow.min(a.productive_s);
        a.productive_s -= slow;
        *a.lost_s.entry("slowdown".into()).or_insert(0.0) += slow;
        productive -= slow;
        *lost.entry("slowdown".into()).or_insert(0.0) += slow;
    }
    let journal_gaps = crate::analysis::accounting::journal_gaps(records, &acc.segments);
    let events: Vec<(&Record, Event)> = crate::journal::events(records).collect();
    let failures = failures_of(&events);
    let judgments = judgments_of(&events);
    let exit_code = events
        .iter()
        .rev()
        .find_map(|(_, e)| match e {
            Event::JobEnd(x) => Some(x.exit_code),
            Event::RankExit(x) => Some(x.exit_code),
            _ => None,
        })
        .flatten()
        .map(i64::from);
    let checkpoints = checkpoint_stats(records);
    // An attempt whose trainer reported the end of training and then
    // crashed at exit finished: its failure records are that crash.
    let finished_then_crashed: Vec<u32> = attempts
        .iter()
        .map(|a| a.attempt)
        .filter(|&attempt| {
            let exits: Vec<(&Record, &crate::event::RankExit)> = events
                .iter()
                .filter_map(|(r, e)| match e {
                    Event::RankExit(x) if r.attempt == attempt => Some((*r, x)),
                    _ => None,
                })
                .collect();
            crate::policy::failure::attempt_finished(&crate::analysis::accounting::exit_facts(
                &exits,
            ))
        })
        .collect();
    let failed_attempts = attempts
        .iter()
        .filter(|a| !finished_then_crashed.contains(&a.attempt))
        .filter(|a| failures.iter().any(|f: &Failure| f.attempt == a.attempt))
        .count();
    let mttf_s = (failed_attempts > 0).then(|| wall / failed_attempts as f64);
    let mut report = Report {
        job: job.to_string(),
        checkpoints,
        mttf_s,
        mttf_pooled_s: None,
        fleet: None,
        failed_attempts,
        restarts: records.iter().filter(|r| r.kind == "restart").count(),
        requeues: requeues_of(&events),
        start,
        end,
        wall_s: wall,
        productive_s: productive,
        ettr: if wall > 0.0 { productive / wall } else { 0.0 },
        lost_s: lost,
        failures,
        judgments,
        ettr_unknown: false,
        observed: observed_of(&events),
        stalls: attempts.iter().map(|a| a.stalls).sum(),
        last_step: attempts.iter().filter_map(|a| a.last_step).max(),
        exit_code,
        attempts,
        time_source: acc.time_source,
        segments: acc.segments,
        checkpoint_advice: None,
        journal_gaps,
        supervisor_losses: supervisor_losses_of(&events),
        goodput: None,
        loss: crate::analysis::loss::health(records),
        bad_journal_lines: bad_lines,
        skipped_lines: Vec::new(),
        left_out: Vec::new(),
        run: None,
        runs: Vec::new(),
    };
    let per_attempt: Vec<(f64, Option<&crate::analysis::throughput::Throughput>)> = report
        .attempts
        .iter()
        .map(|a| (a.productive_s, a.throughput.as_ref()))
        .collect();
    report.goodput = crate::analysis::throughput::goodput(&per_attempt, report.wall_s);
    // The advice from this job alone (apply_fleet pools it with the history).
    if let (Some(d), Some(m)) = (report.checkpoints.mean_duration_s, report.mttf_s) {
        report.checkpoint_advice = crate::policy::checkpoint_interval::advise(
            d,
            m,
            restart_cost(&report),
            report.checkpoints.mean_interval_s,
        );
    }
    report.ettr_unknown =
        report.last_step.is_none() && report.ettr == 0.0 && !report.attempts.is_empty();
    report
}

/// Observe mode's records: what would have been done, when, about which rank.
#[derive(Clone, Debug, Serialize)]
pub struct Observed {
    pub ts: DateTime<Utc>,
    pub attempt: u32,
    pub rank: Option<u32>,
    pub node: Option<String>,
    pub would: String,
    pub reason: String,
}

fn observed_of(events: &[(&Record, Event)]) -> Vec<Observed> {
    events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::Observed(o) => Some(Observed {
                ts: r.ts,
                attempt: r.attempt,
                rank: r.rank,
                node: r.node.clone(),
                would: o.would.clone().unwrap_or_default(),
                reason: o.reason.clone().unwrap_or_default(),
            }),
            _ => None,
        })
        .collect()
}

/// The failures, as listed in the report (a verdict written later counts
/// for the attempt it is about).
fn judgments_of(events: &[(&Record, Event)]) -> Vec<Judged> {
    // Each attempt's first decision, in one pass.
    let mut decisions: std::collections::HashMap<u32, String> = std::collections::HashMap::new();
    for (r, e) in events {
        if let Event::Decision(d) = e {
            if let Some(action) = d.decision.as_ref().and_then(|x| x.action.clone()) {
                decisions
                    .entry(d.about_attempt.unwrap_or(r.attempt))
                    .or_insert(action);
            }
        }
    }
    let decision = |attempt: u32| decisions.get(&attempt).cloned();
    // The blamed rank's probe, from each attempt's hang record, and its
    // diagnostics files (probes' first, then stalls').
    let mut probes: std::collections::HashMap<(u32, u32), String> = Default::default();
    let mut files: std::collections::HashMap<(u32, u32), String> = Default::default();
    for (r, e) in events {
        match e {
            Event::Hang(h) => {
                for k in h.ranks.iter().flatten() {
                    if let Some(p) = &k.probe {
                        probes
                            .entry((r.attempt, k.rank))
                            .or_insert_with(|| p.clone());
                    }
                }
            }
            Event::Probe(p) => {
                if let (Some(rank), Some(f)) = (r.rank, &p.file) {
                    files.insert((r.attempt, rank), f.clone());
                }
            }
            Event::Diagnostics(d) => {
                if let (Some(rank), Some(f)) = (r.rank, &d.file) {
                    files.entry((r.attempt, rank)).or_insert_with(|| f.clone());
                }
            }
            _ => {}
        }
    }
    events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::Judgment(j) => Some(Judged {
                ts: r.ts,
                attempt: r.attempt,
                class: j.class.map(|c| c.name().to_string()),
                rank: j.primary_rank,
                node: j.primary_node.clone(),
                evidence: j.evidence.clone().or_else(|| j.reason.clone()),
                decision: decision(r.attempt),
                blamed_probe: j
                    .primary_rank
                    .and_then(|k| probes.get(&(r.attempt, k)).cloned()),
                blamed_stacks: j
                    .primary_rank
                    .and_then(|k| files.get(&(r.attempt, k)).cloned()),
            }),
            _ => None,
        })
        .collect()
}

fn failures_of(events: &[(&Record, Event)]) -> Vec<Failure> {
    // Each attempt's judged primary rank, where the judgment names one.
    let primary: Vec<(u32, u32)> = events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::Judgment(j) => Some((r.attempt, j.primary_rank?)),
            _ => None,
        })
        .collect();
    let role = |attempt: u32, rank: Option<u32>| -> Option<&'static str> {
        let (_, p) = primary.iter().find(|(a, _)| *a == attempt)?;
        Some(if rank == Some(*p) { "primary" } else { "echo" })
    };
    let out: Vec<Failure> = events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::Failure(f) => Some(Failure {
                ts: r.ts,
                attempt: f.about_attempt.unwrap_or(r.attempt),
                kind: f.failure_kind.clone().unwrap_or_else(|| "failure".into()),
                class: f.class.map(|c| c.name().to_string()),
                node: f.blamed_node.clone().or_else(|| r.node.clone()),
                rank: r.rank,
                cause: f.cause.clone().unwrap_or_else(|| "unknown".into()),
                exit_code: f.exit_code.map(i64::from),
                detail: f.detail.clone(),
                role: role(f.about_attempt.unwrap_or(r.attempt), r.rank),
            }),
            _ => None,
        })
        .collect();
    out
}

/// Trips back to the queue: resilio's requeues, and Slurm's own seen in
/// its records (one per attempt).
fn requeues_of(events: &[(&Record, Event)]) -> usize {
    let mut a: Vec<u32> = events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::Requeue(_) => Some(r.attempt),
            Event::Decision(d)
                if d.source.as_deref() == Some("sacct")
                    && d.decision.as_ref().and_then(|x| x.action.as_deref()) == Some("requeue") =>
            {
                Some(d.about_attempt.unwrap_or(r.attempt))
            }
            _ => None,
        })
        .collect();
    a.sort_unstable();
    a.dedup();
    a.len()
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

/// What a restart costs besides the lost work (for the interval advice).
fn restart_cost(r: &Report) -> f64 {
    if r.failed_attempts == 0 {
        return 0.0;
    }
    let b = |k: &str| r.lost_s.get(k).copied().unwrap_or(0.0);
    (b("stalled") + b("detection") + b("teardown") + b("restart") + b("queue_wait"))
        / r.failed_attempts as f64
        + b("startup") / r.attempts.len().max(1) as f64
}

/// Pool this job's failure rate with the fleet's (the node history of the
/// other jobs) for a job of this job's size, and advise on that.
pub fn apply_fleet(r: &mut Report, fleet: crate::analysis::node_history::FleetRate) {
    let nodes = r
        .attempts
        .iter()
        .map(|a| a.nodes.len())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let failures = r.failed_attempts as f64 + fleet.failures;
    let exposure = nodes * r.wall_s + fleet.node_seconds;
    if failures > 0.0 && exposure > 0.0 {
        // Failures per node-second, for `nodes` nodes.
        let mttf = exposure / failures / nodes;
        r.mttf_pooled_s = Some(mttf);
        if let Some(d) = r.checkpoints.mean_duration_s {
            r.checkpoint_advice = crate::policy::checkpoint_interval::advise(
                d,
                mttf,
                restart_cost(r),
                r.checkpoints.mean_interval_s,
            );
        }
    }
    r.fleet = Some(fleet);
}

/// The periodic checkpoint interval to use now (`[coordinator]
/// checkpoint_every = "advised"`): Daly's interval from the job's journal so
/// far and `fleet` (the node history's failure rate, see
/// [`crate::analysis::node_history::fleet_rate`]), with the journal record's data
/// saying why.
pub fn advised_interval(
    state_dir: &std::path::Path,
    job: &str,
    fleet: crate::analysis::node_history::FleetRate,
) -> (Option<std::time::Duration>, Value) {
    // The run going on is the latest (a job id used again starts another).
    let records = crate::journal::read_job(&crate::journal::job_dir(state_dir, job))
        .ok()
        .and_then(|j| crate::runs::split(j.records).pop())
        .map(|r| r.records)
        .unwrap_or_default();
    if records.is_empty() {
        return (
            None,
            serde_json::json!({ "reason": "nothing measured yet" }),
        );
    }
    let mut r = build(job, &records, 0, None);
    apply_fleet(&mut r, fleet);
    match &r.checkpoint_advice {
        Some(a) => (
            Some(std::time::Duration::from_secs_f64(a.optimal_s.max(1.0))),
            serde_json::json!({
                "interval_s": a.optimal_s, "checkpoint_cost_s": a.checkpoint_cost_s,
                "mttf_s": a.mtbf_s, "expected_ettr": a.ettr_at_optimal,
                "pooled_with_node_history": r.mttf_pooled_s.is_some(),
            }),
        ),
        None => (
            None,
            serde_json::json!({
                "interval_s": null,
                "reason": if r.checkpoints.mean_duration_s.is_none() {
                    "no checkpoint cost measured yet (phase=checkpoint then checkpoint_done)"
                } else {
                    "no failure rate known yet"
                },
            }),
        ),
    }
}

/// The one-line summary: `ETTR 91.4%: 5.2% startup, 2.1% stalled, ...`.
pub fn summary_line(r: &Report) -> String {
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

/// Why a report may have no step numbers, and what gives them.
const NO_STEPS_HINT: &str = "no step number was read from the trainer, so no time counts as productive: Lightning's Rich bar (its default when `rich` is installed) prints nothing to a pipe (export TTY_COMPATIBLE=1 so Rich draws it and resilio reads it, or use TQDMProgressBar or the resilio_client.lightning callback); the HF Trainer without its bar names steps at log level info (`--log_level info`); any trainer can send `step=N` on RESILIO_SOCKET";

/// Render the report for humans.
/// The checkpoint that can be restored, checkpoints found incomplete, and
/// saves that take too much of the time between them.
fn render_checkpoint_health(s: &mut String, r: &Report) {
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
    } else if !c.incomplete.is_empty() {
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
        let _ = writeln!(
            s,
            "  incomplete: step {}{}: {}",
            i.step.map_or("-".into(), |x| x.to_string()),
            i.path
                .as_ref()
                .map_or(String::new(), |p| format!(" in {p}")),
            why.join("; ")
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
fn judged_without_failure(r: &Report) -> Vec<Failure> {
    r.judgments
        .iter()
        .filter_map(|j| {
            let rank = j.rank?;
            let listed = r
                .failures
                .iter()
                .any(|f| f.attempt == j.attempt && f.rank == Some(rank));
            (!listed).then(|| Failure {
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
fn render_loss(s: &mut String, r: &Report) {
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
            let _ = writeln!(
                s,
                "loss: NOT healthy: {} record(s) with a NaN or Inf loss; last finite {}",
                l.nonfinite_records,
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
fn render_throughput(s: &mut String, r: &Report) {
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

pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
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
        let _ = writeln!(s, "note: {NO_STEPS_HINT}");
    }
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
    render_throughput(&mut s, r);
    render_loss(&mut s, r);
    if r.checkpoints.count > 0 {
        let _ = writeln!(
            s,
            "\ncheckpoints: {} confirmed, mean duration {}, mean interval {}",
            r.checkpoints.count,
            r.checkpoints
                .mean_duration_s
                .map_or("-".into(), |d| format!("{d:.1}s")),
            r.checkpoints
                .mean_interval_s
                .map_or("-".into(), |d| format!("{d:.1}s")),
        );
    }
    render_checkpoint_health(&mut s, r);
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
        let mut all: Vec<&Failure> = r.failures.iter().chain(&judged).collect();
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
            if let (Some(k), Some(p)) = (j.rank, &j.blamed_probe) {
                let _ = writeln!(s, "    rank {k}'s probe: {}", crate::util::clip(p, 300));
            }
            if let Some(f) = &j.blamed_stacks {
                let _ = writeln!(s, "    its diagnostics: {f}");
            }
        }
    }
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
    for line in skipped_notes(&r.skipped_lines, r.bad_journal_lines, &r.left_out) {
        let _ = writeln!(s, "{line}");
    }
    s
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(t: f64, kind: &str, attempt: u32, data: Value) -> Record {
        let base: DateTime<Utc> = "2026-11-22T00:00:00Z".parse().unwrap();
        Record {
            v: 1,
            ts: base + chrono::Duration::microseconds((t * 1e6) as i64),
            kind: kind.into(),
            attempt,
            rank: Some(0),
            node: Some("n1".into()),
            data: data.as_object().cloned().unwrap_or_default(),
        }
    }

    #[test]
    fn the_failure_list_centres_on_the_rank_the_judgment_names() {
        let mut waited = rec(
            10.0,
            "failure",
            0,
            json!({"cause": "stall", "class": "hang"}),
        );
        waited.rank = Some(0);
        let mut hung = rec(
            10.1,
            "failure",
            0,
            json!({"cause": "stall", "class": "hang"}),
        );
        hung.rank = Some(1);
        let recs = vec![
            rec(0.0, "rank_start", 0, json!({})),
            waited,
            hung,
            rec(
                11.0,
                "judgment",
                0,
                json!({"class": "hang", "primary_rank": 1}),
            ),
        ];
        let r = build("j", &recs, 0, None);
        let roles: Vec<_> = r.failures.iter().map(|f| (f.rank, f.role)).collect();
        assert_eq!(roles, [(Some(0), Some("echo")), (Some(1), Some("primary"))]);
        let text = render_text(&r);
        assert!(text.contains("* the rank judged the cause"), "{text}");
        assert!(text.contains("  * "), "{text}");
    }

    #[test]
    fn the_report_names_the_rank_a_judgment_blamed_even_with_no_failure_of_its_own() {
        // Rank 1 hung and was stopped by the coordinator (no failure record
        // of its own); rank 0, waiting for it, stalled.
        let mut waited = rec(
            10.0,
            "failure",
            0,
            json!({"cause": "stall", "class": "hang"}),
        );
        waited.rank = Some(0);
        let recs = vec![
            rec(0.0, "rank_start", 0, json!({})),
            waited,
            rec(
                11.0,
                "judgment",
                0,
                json!({"class": "hang", "primary_rank": 1, "primary_node": "n2",
                       "evidence": "rank(s) 1 were not waiting on a peer while 1 rank(s) were"}),
            ),
            rec(
                11.1,
                "decision",
                0,
                json!({"decision": {"action": "restart_in_place"}}),
            ),
        ];
        let r = build("j", &recs, 0, None);
        assert_eq!(r.judgments.len(), 1);
        assert_eq!(r.judgments[0].rank, Some(1));
        // The failures centre on it too: listed from the judgment (not
        // counted as a failure record).
        assert_eq!(r.failures.len(), 1);
        let text = render_text(&r);
        assert!(!text.contains("judged the cause, judged"), "{text}");
        assert!(
            text.contains("* 00:00:11.000 attempt 0 rank 1 node n2: hang judgment (judged the cause): rank(s) 1 were not waiting"),
            "{text}"
        );
        let text = render_text(&r);
        assert!(
            text.contains(
                "attempt 0: hang on rank 1 (n2) -> restart in place: rank(s) 1 were not waiting"
            ),
            "{text}"
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["judgments"][0]["rank"], 1, "{v}");
    }

    #[test]
    fn a_save_taking_a_large_share_of_the_interval_is_warned_about() {
        let mut recs = vec![rec(0.0, "rank_start", 0, json!({}))];
        for (i, t) in [10.0, 30.0, 50.0].iter().enumerate() {
            recs.push(rec(*t, "phase", 0, json!({"phase": "checkpoint"})));
            recs.push(rec(
                t + 5.0,
                "checkpoint_done",
                0,
                json!({"step": 10 * (i + 1)}),
            ));
        }
        recs.push(rec(60.0, "rank_exit", 0, json!({"exit_code": 0})));
        let mut r = build("j", &recs, 0, None);
        assert_eq!(r.checkpoints.mean_duration_s, Some(5.0));
        assert_eq!(r.checkpoints.mean_interval_s, Some(20.0));
        assert_eq!(
            r.checkpoints.last_restorable.as_ref().unwrap().step,
            Some(30)
        );
        r.checkpoints.warn_share = Some(0.1);
        let text = render_text(&r);
        assert!(
            text.contains("warning: a checkpoint takes 5.0s, 25% of the 20.0s between them"),
            "{text}"
        );
        r.checkpoints.warn_share = Some(0.3);
        assert!(!render_text(&r).contains("warning: a checkpoint"));
    }

    #[test]
    fn buckets_add_up_to_wall_time() {
        let recs = vec![
            rec(0.0, "rank_start", 0, json!({})),
            rec(10.0, "progress", 0, json!({"step": 1, "first": true})),
            rec(50.0, "progress", 0, json!({"step": 40})),
            rec(
                60.0,
                "stall",
                0,
                json!({"last_step": 40, "last_progress": "2026-11-22T00:00:52Z"}),
            ),
            rec(
                65.0,
                "rank_exit",
                0,
                json!({"exit_code": 124, "cause": "stalled"}),
            ),
            rec(
                65.0,
                "failure",
                0,
                json!({"failure_kind": "stall", "cause": "stalled"}),
            ),
            rec(100.0, "rank_start", 1, json!({})),
            rec(105.0, "progress", 1, json!({"step": 41, "first": true})),
            rec(200.0, "progress", 1, json!({"step": 100})),
            rec(
                201.0,
                "rank_exit",
                1,
                json!({"exit_code": 0, "cause": "completed"}),
            ),
        ];
        let r = build("j", &recs, 0, None);
        assert_eq!(r.wall_s, 201.0);
        assert_eq!(r.attempts.len(), 2);
        // Step 1 began one mean step time (42 s / 39 steps) before it was
        // reported; step 40 survived (attempt 1 resumed at 41); the hang
        // began at the last step (52 s) and was declared at 60 s.
        let step0 = 42.0 / 39.0;
        let step1 = 95.0 / 59.0;
        let near = |a: f64, b: f64| (a - b).abs() < 1e-3;
        assert!(
            near(
                r.productive_s,
                (50.0 - (10.0 - step0)) + (200.0 - (105.0 - step1))
            ),
            "{r:#?}"
        );
        assert!(near(r.lost_s["startup"], 10.0 - step0 + 5.0 - step1));
        assert!(near(r.lost_s["rework"], 2.0));
        assert!(near(r.lost_s["stalled"], 8.0));
        assert!(near(r.lost_s["teardown"], 5.0));
        assert!(near(r.lost_s["queue_wait"], 35.0));
        assert!(near(r.lost_s["after_last_step"], 1.0));
        let total: f64 = r.productive_s + r.lost_s.values().sum::<f64>();
        assert!((total - r.wall_s).abs() < 1e-9);
        assert_eq!(r.lost_s["unexplained"], 0.0);
        assert_eq!(r.failures.len(), 1);
        assert_eq!(r.last_step, Some(100));
        assert_eq!(r.exit_code, Some(0));
        let line = summary_line(&r);
        assert!(
            line.starts_with("ETTR 68.5% after 1 failure: 17.4% queue wait"),
            "{line}"
        );
        assert_eq!(r.mttf_s, Some(201.0));
        assert!(r.checkpoint_advice.is_none(), "no checkpoint cost measured");
    }

    #[test]
    fn the_deaths_of_resilios_own_parts_are_listed_once_each() {
        let lost = |t: f64, rank: u32| {
            let mut r = rec(
                t,
                "launcher_lost",
                0,
                json!({"launcher_pid": 7, "note": "n"}),
            );
            r.rank = Some(rank);
            r
        };
        let recs = vec![
            rec(0.0, "rank_start", 0, json!({})),
            lost(5.0, 1),
            lost(4.0, 0),
            rec(
                9.0,
                "supervisor_lost",
                1,
                json!({"supervisor_pid": 42, "status": "signal 9 (SIGKILL)", "step_running": true}),
            ),
        ];
        let r = build("j", &recs, 0, None);
        assert_eq!(r.supervisor_losses.len(), 2, "{:?}", r.supervisor_losses);
        assert_eq!(r.supervisor_losses[0].ranks, [0, 1]);
        assert_eq!(r.supervisor_losses[0].ts, recs[2].ts);
        let text = render_text(&r);
        assert!(text.contains("attempt 0: the local launcher (and the coordinator in it) (pid 7) died, seen by ranks [0, 1]: n"), "{text}");
        assert!(text.contains("attempt 1: the job-level supervisor (and the coordinator in it) (pid 42) died (signal 9 (SIGKILL))"), "{text}");
        // None: no section, and nothing in the JSON.
        let quiet = build("j", &recs[..1], 0, None);
        assert!(!render_text(&quiet).contains("own faults"));
        assert!(!serde_json::to_string(&quiet)
            .unwrap()
            .contains("supervisor_losses"));
    }

    #[test]
    fn checkpoint_statistics_and_advice() {
        let recs = vec![
            rec(0.0, "rank_start", 0, json!({})),
            rec(1.0, "progress", 0, json!({"step": 1, "first": true})),
            rec(
                100.0,
                "phase",
                0,
                json!({"phase": "checkpoint", "step": 100}),
            ),
            rec(110.0, "checkpoint_done", 0, json!({"step": 100})),
            rec(
                300.0,
                "phase",
                0,
                json!({"phase": "checkpoint", "step": 300}),
            ),
            rec(310.0, "checkpoint_done", 0, json!({"step": 300})),
            rec(400.0, "rank_exit", 0, json!({"exit_code": 137})),
            rec(
                400.0,
                "failure",
                0,
                json!({"failure_kind": "crash", "cause": "x"}),
            ),
        ];
        let r = build("j", &recs, 0, None);
        assert_eq!(r.checkpoints.count, 2);
        assert_eq!(r.checkpoints.mean_duration_s, Some(10.0));
        assert_eq!(r.checkpoints.mean_interval_s, Some(200.0));
        let a = r.checkpoint_advice.clone().unwrap();
        assert_eq!((a.checkpoint_cost_s, a.mtbf_s), (10.0, 400.0));
        assert!(render_text(&r).contains("checkpoint interval advice"));
    }

    #[test]
    fn the_failure_rate_pools_this_job_with_the_node_history() {
        let mut recs = vec![
            rec(0.0, "rank_start", 0, json!({})),
            rec(1.0, "progress", 0, json!({"step": 1, "first": true})),
            rec(10.0, "phase", 0, json!({"phase": "checkpoint", "step": 10})),
            rec(12.0, "checkpoint_done", 0, json!({"step": 10})),
            rec(50.0, "rank_exit", 0, json!({"exit_code": 137})),
            rec(
                50.0,
                "failure",
                0,
                json!({"failure_kind": "crash", "cause": "x"}),
            ),
            rec(60.0, "rank_start", 1, json!({})),
            rec(100.0, "rank_exit", 1, json!({"exit_code": 0})),
        ];
        // A second rank on another node: a 2-node job.
        let mut other = rec(0.0, "rank_start", 0, json!({}));
        other.rank = Some(1);
        other.node = Some("n2".into());
        recs.push(other);
        recs.sort_by_key(|r| r.ts);
        let mut r = build("j", &recs, 0, None);
        assert_eq!(r.mttf_s, Some(100.0));
        let alone = r.checkpoint_advice.clone().unwrap();
        // 9 failures in 1,800 node-seconds elsewhere: with this job's 1 in
        // 2 x 100, 10 in 2,000 node-seconds, so 100 s for 2 nodes.
        apply_fleet(
            &mut r,
            crate::analysis::node_history::FleetRate {
                failures: 9.0,
                node_seconds: 1800.0,
                jobs: 4,
            },
        );
        assert!((r.mttf_pooled_s.unwrap() - 100.0).abs() < 1e-9);
        let pooled = r.checkpoint_advice.clone().unwrap();
        assert_eq!(pooled.mtbf_s, 100.0);
        assert_eq!(pooled.checkpoint_cost_s, alone.checkpoint_cost_s);
        // A healthier fleet lengthens the advised interval.
        apply_fleet(
            &mut r,
            crate::analysis::node_history::FleetRate {
                failures: 0.0,
                node_seconds: 99_800.0,
                jobs: 40,
            },
        );
        let healthy = r.checkpoint_advice.clone().unwrap();
        assert!(healthy.mtbf_s > 10_000.0 && healthy.optimal_s > pooled.optimal_s);
        assert!(render_text(&r).contains("node history of 40 other job(s)"));
    }

    #[test]
    fn an_attempt_without_exit_record_ends_at_its_last_record() {
        let recs = vec![
            rec(0.0, "rank_start", 0, json!({})),
            rec(2.0, "progress", 0, json!({"step": 1, "first": true})),
            rec(9.0, "progress", 0, json!({"step": 8})),
        ];
        let r = build("j", &recs, 1, None);
        assert!(!r.attempts[0].ended_cleanly);
        assert_eq!(r.wall_s, 9.0);
        // Steps 1..8 at 1 s each from 1.0; the end is not recorded but
        // nothing followed: the run's steps stand.
        assert!((r.productive_s - 8.0).abs() < 1e-9, "{r:#?}");
        assert!(render_text(&r).contains("no exit recorded"));
        assert!(
            crate::analysis::timeline::render("j", &recs, None).contains("last recorded step 8")
        );
    }
}
