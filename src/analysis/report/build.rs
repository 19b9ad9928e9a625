//! The report built from a job's records: its attempts, failures,
//! judgments, checkpoints and the accounting of its time.

use super::{
    secs, Attempt, Checkpoints, ExitRow, FailureRow, JobReport, Judged, Restorable, SupervisorLoss,
    WouldHave,
};
use crate::event::Event;
use crate::journal::Record;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};

/// The parts of resilio above the ranks that died, one entry each (every
/// rank journals the launcher's loss: one entry lists them all).
fn supervisor_losses_of(events: &[(&Record, &Event)]) -> Vec<SupervisorLoss> {
    let mut out: Vec<SupervisorLoss> = Vec::new();
    for (r, e) in events {
        match e {
            Event::SupervisorLost(s) => out.push(SupervisorLoss {
                ts: r.ts,
                attempt: r.attempt,
                part: "supervisor".into(),
                pid: Some(s.supervisor_pid),
                status: Some(s.status.clone()),
                ranks: Vec::new(),
                note: Some(s.note.clone()),
            }),
            Event::LauncherLost(l) => {
                let same = out.iter_mut().find(|x| {
                    x.part == "launcher" && x.pid == Some(l.launcher_pid) && x.attempt == r.attempt
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
                        pid: Some(l.launcher_pid),
                        status: None,
                        ranks: r.rank.into_iter().collect(),
                        note: Some(l.note.clone()),
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

fn checkpoint_stats(records: &[Record]) -> Checkpoints {
    // One entry per (attempt, step): several ranks may confirm the same checkpoint.
    let mut done: Vec<(u32, Option<u64>, DateTime<Utc>)> = Vec::new();
    let mut durations = Vec::new();
    let mut started: BTreeMap<(Option<u32>, u32), DateTime<Utc>> = BTreeMap::new();
    let (mut last_restorable, mut incomplete, mut sizes) = (None, Vec::new(), Vec::new());
    // A step its files showed incomplete or stale is not restorable for
    // the trainer's word on it (trial 16b).
    let unsound = crate::journal::unsound_checkpoint_steps(records);
    let suspect = suspect_checkpoints(records);
    let blamed_list: Vec<crate::policy::restore::Blamed> = suspect
        .iter()
        .map(|b| crate::policy::restore::Blamed {
            step: b.step,
            by_attempt: b.attempt,
        })
        .collect();
    let blamed = |step: Option<u64>, saved_in: u32| {
        step.is_some_and(|s| crate::policy::restore::is_blamed(&blamed_list, s, saved_in))
    };
    for (r, e) in crate::journal::events(records) {
        match e {
            Event::Phase(p) if p.phase == "checkpoint" => {
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
                    source: Some(c.source),
                    path: c.path.clone(),
                    size_bytes: c.size_bytes,
                    temp_names: c.temp_names.clone().unwrap_or_default(),
                    changing: c.changing.clone().unwrap_or_default(),
                    same_as: c.same_as.clone(),
                };
                sizes.extend(c.size_bytes.map(|b| b as f64));
                if !c.whole() {
                    incomplete.push(one);
                } else if c.step.is_none_or(|s| !unsound.contains(&s)) && !blamed(c.step, r.attempt)
                {
                    // The same checkpoint said twice (the trainer's word,
                    // then its directory): the record with its files wins.
                    let same_step = last_restorable.as_ref().is_some_and(|l: &Restorable| {
                        l.step == one.step && l.attempt == one.attempt
                    });
                    if !same_step || one.path.is_some() {
                        last_restorable = Some(one);
                    }
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
        suspect: saved_again(records, suspect),
        mean_size_bytes: mean(&sizes),
        warn_share: None,
    }
}

/// The blamed checkpoints a later attempt saved again whole (the HF
/// Trainer's `checkpoint-20` after a rollback to 15): said, so that the
/// blame is not taken for the directory's present contents.
fn saved_again(
    records: &[Record],
    mut suspect: Vec<super::SuspectCheckpoint>,
) -> Vec<super::SuspectCheckpoint> {
    for b in &mut suspect {
        b.saved_again_by = crate::journal::events(records).find_map(|(r, e)| match e {
            Event::CheckpointDone(c)
                if c.step == Some(b.step)
                    && c.path.is_some()
                    && c.whole()
                    && r.attempt > b.attempt =>
            {
                Some(r.attempt)
            }
            _ => None,
        });
    }
    suspect
}

/// The checkpoints decisions blamed for the failure after their restore.
fn suspect_checkpoints(records: &[Record]) -> Vec<super::SuspectCheckpoint> {
    crate::journal::events(records)
        .filter_map(|(r, e)| match e {
            Event::Decision(d) => Some(super::SuspectCheckpoint {
                step: d.suspect_checkpoint?,
                attempt: d.about_attempt.unwrap_or(r.attempt),
                why: Some(&d.outcome).map_or(String::new(), |o| {
                    format!(
                        "{}: {}",
                        o.class.map_or("?", |c| c.name()),
                        o.detail.as_deref().unwrap_or("")
                    )
                }),
                saved_again_by: None,
            }),
            _ => None,
        })
        .fold(Vec::new(), |mut all: Vec<super::SuspectCheckpoint>, s| {
            // Blamed again (a trainer that loaded it although told): once.
            if !all.iter().any(|b| b.step == s.step) {
                all.push(s);
            }
            all
        })
}

fn attempt_of(records: &[&Record], attempt: u32) -> Attempt {
    let start = records
        .iter()
        .filter(|r| r.kind == "rank_start" || r.kind == "job_start")
        .map(|r| r.ts)
        .min()
        .unwrap_or(records[0].ts);
    let events: Vec<(&Record, &Event)> = records
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

    // Gathered unsorted, then sorted once: a set built from every record's
    // node compared strings a million times.
    let mut ranks: Vec<u32> = records.iter().filter_map(|r| r.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let nodes: BTreeSet<&str> = crate::analysis::notable::distinct_nodes(records.iter().copied())
        .into_iter()
        .collect();
    let world = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::RankStart(x) => Some(x.world_size),
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
        ranks,
        nodes: nodes.into_iter().map(str::to_string).collect(),
        first_step_at,
        last_progress_at,
        last_step,
        stalls: stalls.len(),
        exits: exits
            .iter()
            .map(|(r, x)| ExitRow {
                rank: r.rank,
                node: r.node.clone(),
                exit_code: Some(i64::from(x.exit_code)),
                cause: Some(x.cause.clone()),
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
) -> JobReport {
    let acc = crate::analysis::accounting::account(records, slurm);
    let mut attempts = accounted_attempts(records, &acc);
    let (start, end, wall) = (acc.start, acc.end, acc.wall_s);
    let mut productive = acc.productive_s;
    let mut lost = acc.lost_s.clone();
    take_slowdown(records, &mut attempts, &mut productive, &mut lost);
    let journal_gaps = crate::analysis::accounting::journal_gaps(records, &acc.segments);
    let events: Vec<(&Record, &Event)> = crate::journal::events(records).collect();
    let failures = failures_of(&events);
    let judgments = judgments_of(&events);
    let exit_code = exit_code_of(&events);
    let checkpoints = checkpoint_stats(records);
    let failed_attempts = failed_attempts_of(&attempts, &events, &failures);
    let mttf_s = (failed_attempts > 0).then(|| wall / failed_attempts as f64);
    let mut report = JobReport {
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
        recoveries: Vec::new(),
        recovery_phases: Vec::new(),
        bad_journal_lines: bad_lines,
        skipped_lines: Vec::new(),
        left_out: Vec::new(),
        run: None,
        runs: Vec::new(),
    };
    report.recoveries = crate::analysis::recovery::recoveries(records);
    report.recovery_phases = crate::analysis::recovery::spread(&report.recoveries);
    finish(&mut report);
    report
}

/// Each attempt, with its share of the accounted time.
fn accounted_attempts(
    records: &[Record],
    acc: &crate::analysis::accounting::Accounting,
) -> Vec<Attempt> {
    let mut by_attempt: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_attempt.entry(r.attempt).or_default().push(r);
    }
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
    attempts
}

/// Running slower than the job's own baseline: productive time, part of
/// which bought no steps. Its own bucket, out of productive time.
fn take_slowdown(
    records: &[Record],
    attempts: &mut [Attempt],
    productive: &mut f64,
    lost: &mut BTreeMap<String, f64>,
) {
    for (attempt, slow) in crate::analysis::throughput::slow_time(records) {
        let Some(a) = attempts.iter_mut().find(|a| a.attempt == attempt) else {
            continue;
        };
        let slow = slow.min(a.productive_s);
        a.productive_s -= slow;
        *a.lost_s.entry("slowdown".into()).or_insert(0.0) += slow;
        *productive -= slow;
        *lost.entry("slowdown".into()).or_insert(0.0) += slow;
    }
}

/// The job's exit code: its end's, else the last rank exit's.
fn exit_code_of(events: &[(&Record, &Event)]) -> Option<i64> {
    events
        .iter()
        .rev()
        .find_map(|(_, e)| match e {
            Event::JobEnd(x) => Some(x.exit_code),
            Event::RankExit(x) => Some(x.exit_code),
            _ => None,
        })
        .map(i64::from)
}

/// Attempts that ended in a failure (echoes of one failure count once).
fn failed_attempts_of(
    attempts: &[Attempt],
    events: &[(&Record, &Event)],
    failures: &[FailureRow],
) -> usize {
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
    attempts
        .iter()
        .filter(|a| !finished_then_crashed.contains(&a.attempt))
        .filter(|a| failures.iter().any(|f: &FailureRow| f.attempt == a.attempt))
        .count()
}

/// What is derived from the report's own figures: the goodput, the
/// checkpoint advice from this job alone, whether the ETTR is unknown.
fn finish(report: &mut JobReport) {
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
            report.restart_cost(),
            report.checkpoints.mean_interval_s,
        );
    }
    report.ettr_unknown =
        report.last_step.is_none() && report.ettr == 0.0 && !report.attempts.is_empty();
}

fn observed_of(events: &[(&Record, &Event)]) -> Vec<WouldHave> {
    events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::Observed(o) => Some(WouldHave {
                ts: r.ts,
                attempt: r.attempt,
                rank: r.rank,
                node: r.node.clone(),
                would: o.would.clone(),
                reason: o.reason.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// The failures, as listed in the report (a verdict written later counts
/// for the attempt it is about).
fn judgments_of(events: &[(&Record, &Event)]) -> Vec<Judged> {
    // Each attempt's first decision, in one pass.
    let mut decisions: std::collections::HashMap<u32, &crate::policy::restart::Action> =
        std::collections::HashMap::new();
    for (r, e) in events {
        if let Event::Decision(d) = e {
            if let Some(action) = d.decision.as_ref() {
                decisions
                    .entry(d.about_attempt.unwrap_or(r.attempt))
                    .or_insert(action);
            }
        }
    }
    let decision = |attempt: u32| decisions.get(&attempt).map(|a| a.name().to_string());
    let stop_reason = |attempt: u32| match decisions.get(&attempt) {
        Some(crate::policy::restart::Action::Stop { reason, .. }) => Some(reason.clone()),
        _ => None,
    };
    // The blamed rank's probe, from each attempt's last hang record (the
    // judged one: earlier ones found a peer busy and were withdrawn), and
    // its diagnostics files (its latest probe's, else its stall's).
    let mut probes: std::collections::HashMap<(u32, u32), String> = Default::default();
    let mut files: std::collections::HashMap<(u32, u32), String> = Default::default();
    let mut probe_files: std::collections::HashMap<(u32, u32), String> = Default::default();
    for (r, e) in events {
        match e {
            Event::Hang(h) => {
                // A verdict that let the run carry on closes its episode:
                // the files before it are not the judged stall's.
                let rule = h.verdict.rule;
                if rule.carries_on() {
                    files.retain(|(a, _), _| *a != r.attempt);
                    probe_files.retain(|(a, _), _| *a != r.attempt);
                }
                for k in &h.ranks {
                    match &k.probe {
                        Some(p) => probes.insert((r.attempt, k.rank), p.clone()),
                        None => probes.remove(&(r.attempt, k.rank)),
                    };
                }
            }
            Event::Probe(p) => {
                if let (Some(rank), Some(f)) = (r.rank, &p.file) {
                    probe_files.insert((r.attempt, rank), f.clone());
                }
            }
            Event::Diagnostics(d) => {
                if let (Some(rank), Some(f)) = (r.rank, &d.file) {
                    files.insert((r.attempt, rank), f.clone());
                }
            }
            _ => {}
        }
    }
    files.extend(probe_files);
    events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::Judgment(j) => Some(Judged {
                ts: r.ts,
                attempt: r.attempt,
                class: Some(j.class.name().to_string()),
                rank: j.primary_rank,
                node: j.primary_node.clone(),
                evidence: Some(j.evidence.clone()),
                decision: decision(r.attempt),
                stop_reason: stop_reason(r.attempt),
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

fn failures_of(events: &[(&Record, &Event)]) -> Vec<FailureRow> {
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
    let out: Vec<FailureRow> = events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::Failure(f) => Some(FailureRow {
                ts: r.ts,
                attempt: f.about_attempt.unwrap_or(r.attempt),
                kind: f
                    .failure_kind
                    .map_or_else(|| "failure".into(), |k| k.name().to_string()),
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
fn requeues_of(events: &[(&Record, &Event)]) -> usize {
    let mut a: Vec<u32> = events
        .iter()
        .filter_map(|(r, e)| match e {
            Event::Requeue(_) => Some(r.attempt),
            Event::Decision(d)
                if d.source == Some(crate::event::ToldBy::Sacct)
                    && matches!(
                        d.decision,
                        Some(crate::policy::restart::Action::Requeue { .. })
                    ) =>
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
