//! Reports computed from a job's journal alone (no live process needed):
//! `resilio report` (attempts, steps, stalls, exits, time accounting). The
//! timeline is [`crate::analysis::timeline`]'s.
//!
//! Time accounting (ETTR and where the rest went) is [`crate::analysis::accounting`]'s.

mod build;
mod fleet;
mod recoveries;
mod text;

pub use build::build;
pub use fleet::{advised_interval, apply_fleet};
pub use text::{render_text, skipped_notes, summary_line};

use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;

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
    /// Why the job was stopped, when it was (the decision's reason: the
    /// failure itself, a crash loop, the budget spent, no progress).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
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
pub struct FailureRow {
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
pub struct ExitRow {
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
    pub exits: Vec<ExitRow>,
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
pub struct JobReport {
    pub job: String,
    pub attempts: Vec<Attempt>,
    pub start: Option<DateTime<Utc>>,
    pub end: Option<DateTime<Utc>>,
    pub wall_s: f64,
    pub productive_s: f64,
    pub ettr: f64,
    pub lost_s: BTreeMap<String, f64>,
    pub failures: Vec<FailureRow>,
    /// Each failed attempt's judgment: who was blamed, what was decided.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub judgments: Vec<Judged>,
    /// No step number was read at all: no time could be told productive
    /// (the ETTR of 0 says nothing).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ettr_unknown: bool,
    /// Observe mode: what resilio would have done (nothing was done).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub observed: Vec<WouldHave>,
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
    /// Each recovery, phase by phase, and each phase's p50/p99 over them
    /// ([`crate::analysis::recovery`]). Absent when nothing was recovered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recoveries: Vec<crate::analysis::recovery::Recovery>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recovery_phases: Vec<crate::analysis::recovery::PhaseSpread>,
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
    /// Checkpoints not to count on: found incomplete (temporary names, files
    /// still written to) or stale (`same_as`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub incomplete: Vec<Restorable>,
    /// Checkpoints blamed for a failure soon after their restore
    /// (`policy::restore`): not loaded again, not restorable.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub suspect: Vec<SuspectCheckpoint>,
    /// Mean size of the checkpoints whose directory was watched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_size_bytes: Option<f64>,
    /// `[checkpoint] warn_share` where the report's reader set it: warn
    /// when a save takes more than this share of the interval.
    #[serde(skip)]
    pub warn_share: Option<f64>,
}

/// A checkpoint blamed for the failure that followed its restore.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SuspectCheckpoint {
    pub step: u64,
    /// The attempt that restored it and failed.
    pub attempt: u32,
    /// The failure, as `class: detail`.
    pub why: String,
    /// A later attempt saved this step again, and its files showed it whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved_again_by: Option<u32>,
}

/// One confirmed checkpoint.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Restorable {
    pub attempt: u32,
    pub step: Option<u64>,
    pub ts: Option<DateTime<Utc>>,
    pub source: Option<crate::event::ProgressVia>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub temp_names: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changing: Vec<String>,
    /// Stale: its files are byte for byte those of this earlier checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_as: Option<String>,
}

impl JobReport {
    /// What a restart costs besides the lost work (for the interval advice).
    pub(super) fn restart_cost(&self) -> f64 {
        if self.failed_attempts == 0 {
            return 0.0;
        }
        let b = |k: &str| self.lost_s.get(k).copied().unwrap_or(0.0);
        (b("stalled") + b("detection") + b("teardown") + b("restart") + b("queue_wait"))
            / self.failed_attempts as f64
            + b("startup") / self.attempts.len().max(1) as f64
    }
}

/// Observe mode's records: what would have been done, when, about which rank.
#[derive(Clone, Debug, Serialize)]
pub struct WouldHave {
    pub ts: DateTime<Utc>,
    pub attempt: u32,
    pub rank: Option<u32>,
    pub node: Option<String>,
    pub would: String,
    pub reason: String,
}

pub(crate) fn secs(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    ((b - a).num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Record;
    use serde_json::{json, Value};

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
            ..Default::default()
        }
    }

    /// A run whose every attempt failed before a step is told so, not
    /// pointed at its progress bar alone (trial 16); one that completed
    /// without a step number gets the progress bar's advice.
    #[test]
    fn no_step_read_is_explained_by_failures_at_start_when_every_attempt_failed() {
        let crashed = |a: u32, t: f64| {
            vec![
                rec(t, "rank_start", a, json!({})),
                rec(
                    t + 1.0,
                    "rank_exit",
                    a,
                    json!({"exit_code": 1, "class": "unknown"}),
                ),
                rec(
                    t + 1.0,
                    "failure",
                    a,
                    json!({"cause": "exited with error", "class": "unknown", "exit_code": 1}),
                ),
                rec(
                    t + 1.1,
                    "decision",
                    a,
                    json!({"decision": {"action": if a == 0 { "restart_in_place" } else { "stop" }, "reason": "x"},
                           "outcome": {"class": "unknown", "signature": "unknown: x"}}),
                ),
            ]
        };
        let recs: Vec<Record> = crashed(0, 0.0).into_iter().chain(crashed(1, 2.0)).collect();
        let text = render_text(&build("j", &recs, 0, None));
        assert!(
            text.contains("note: every attempt failed before a step number was read (see the failures), so no time counts as productive; if the trainer did take steps: Lightning's"),
            "{text}"
        );
        let quiet = vec![
            rec(0.0, "rank_start", 0, json!({})),
            rec(
                5.0,
                "rank_exit",
                0,
                json!({"exit_code": 0, "class": "clean"}),
            ),
        ];
        let text = render_text(&build("j", &quiet, 0, None));
        assert!(
            text.contains("note: no step number was read from the trainer, so no time counts as productive: Lightning's"),
            "{text}"
        );
        assert!(text.contains("read with `--progress-regex`"), "{text}");
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

    /// Trial 19: rank 1 was found busy in one stall (a withdrawn verdict)
    /// and asleep in the next, which was judged: the report showed the
    /// busy probe as the evidence of the blame.
    #[test]
    fn the_blamed_ranks_probe_is_the_judged_verdicts_not_a_withdrawn_ones() {
        let hang = |t: f64, rule: &str, probe: &str, file: &str| {
            let mut p = rec(
                t - 0.1,
                "probe",
                0,
                json!({"reason": "rank 0 stalled", "file": file}),
            );
            p.rank = Some(1);
            [
                p,
                rec(
                    t,
                    "hang",
                    0,
                    json!({"verdict": {"rule": rule, "blamed_ranks": []},
                           "ranks": [{"rank": 1, "probe": probe}]}),
                ),
            ]
        };
        // A busy evaluation first: rank 1 found working, the stall withdrawn.
        let busy_first = || {
            let mut recs = vec![rec(0.0, "rank_start", 0, json!({}))];
            recs.extend(hang(
                10.0,
                "busy",
                "9 python: running; matmul (t.py:16)",
                "busy.txt",
            ));
            recs
        };
        let judged = || {
            rec(
                41.0,
                "judgment",
                0,
                json!({"class": "hang", "primary_rank": 1, "primary_node": "n2"}),
            )
        };
        let mut recs = busy_first();
        recs.extend(hang(
            40.0,
            "not_waiting",
            "9 python: sleeping (t.py:19)",
            "asleep.txt",
        ));
        recs.push(judged());
        let r = build("j", &recs, 0, None);
        assert_eq!(
            r.judgments[0].blamed_probe.as_deref(),
            Some("9 python: sleeping (t.py:19)")
        );
        assert_eq!(r.judgments[0].blamed_stacks.as_deref(), Some("asleep.txt"));
        // Rank 1 stalled itself in the judged stall (no probe asked of it,
        // no probe file): its stall's diagnostics, written after the
        // verdict, are the stacks, never the busy episode's probe file.
        let mut recs = busy_first();
        recs.push(rec(
            40.0,
            "hang",
            0,
            json!({"verdict": {"rule": "not_waiting", "blamed_ranks": [1]},
                   "ranks": [{"rank": 1, "probe": "9 python: sleeping"}]}),
        ));
        recs.push(judged());
        let mut d = rec(41.1, "diagnostics", 0, json!({"file": "stall.txt"}));
        d.rank = Some(1);
        recs.push(d);
        let r = build("j", &recs, 0, None);
        assert_eq!(r.judgments[0].blamed_stacks.as_deref(), Some("stall.txt"));
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
