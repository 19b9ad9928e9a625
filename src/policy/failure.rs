//! Failure classification: why did a rank end, and whose fault was it?
//!
//! [`classify`] judges one rank's end from its exit status, whether it was
//! stopped for a stall or by a signal from outside, and its last output lines
//! matched against pattern lists (defaults below, replaceable in config).
//! [`primary`] judges a set of rank failures together: failures cascade
//! (when one rank dies its peers fail seconds later with connection errors
//! and tracebacks of their own), so the first failure that is not a peer's
//! echo is the cause and the others are secondary. Both are pure functions.

use super::patterns::{LineClass, Patterns};
use super::traceback::{what_happened, without_rank_prefix};
use regex::Regex;
use serde::{Deserialize, Serialize};

/// Whose fault a rank's end was.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Exit 0.
    Clean,
    /// The user's own code or configuration, recognised by its signature
    /// (ImportError, KeyError, CUDA out of memory, ...). Not worth a requeue.
    UserError,
    /// The node, its GPUs or the fabric: blame the node, exclude, requeue.
    Infrastructure,
    /// The rank stopped making progress and was stopped (a hang).
    Hang,
    /// Failed because a peer failed first (connection closed, remote exited).
    Secondary,
    /// Stopped by Slurm or an operator (time limit, preemption, scancel).
    Preempted,
    /// The loss (or grad norm) went to NaN or Inf and stayed there
    /// (`policy::numerical`): a restart from the same checkpoint and data
    /// would diverge the same way, so it is not restarted.
    Numerical,
    /// A failure with no known signature (an unrecognised exception, a bare
    /// non-zero exit): maybe transient, so it gets one restart; the same
    /// failure again is taken for the user's code and stops (crash loop).
    /// A class name this build does not know (a later build's) reads as this.
    #[serde(other)]
    #[default]
    Unknown,
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Class {
    /// Name as written in the journal.
    pub fn name(self) -> &'static str {
        match self {
            Class::Clean => "clean",
            Class::UserError => "user_error",
            Class::Unknown => "unknown",
            Class::Infrastructure => "infrastructure",
            Class::Hang => "hang",
            Class::Secondary => "secondary",
            Class::Preempted => "preempted",
            Class::Numerical => "numerical",
        }
    }

    /// Whether a restart may help (the failure was not in the user's code).
    /// Every class is named here, so that a new one is decided, not
    /// defaulted (a retryable class is what the restart budget counts).
    pub fn retryable(self) -> bool {
        match self {
            Class::Infrastructure | Class::Hang | Class::Preempted | Class::Unknown => true,
            Class::Clean | Class::UserError | Class::Secondary | Class::Numerical => false,
        }
    }

    /// Every class, for tables and tests over all of them.
    pub const ALL: [Class; 8] = [
        Class::Clean,
        Class::UserError,
        Class::Infrastructure,
        Class::Hang,
        Class::Secondary,
        Class::Preempted,
        Class::Numerical,
        Class::Unknown,
    ];
}

/// How a rank ended, as far as classification needs to know.
#[derive(Clone, Debug, Default)]
pub struct RankEnd {
    /// Exit code (128+N for signal N).
    pub exit_code: i32,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// resilio stopped it for stalling.
    pub stalled: bool,
    /// A stop requested from outside (SIGTERM/SIGINT forwarded by resilio).
    pub stop_requested: bool,
    /// The site health check failed on its node.
    pub health_check_failed: bool,
    /// resilio stopped it for a numerical failure (what was seen).
    pub numerical: Option<String>,
    /// Its last output lines, oldest first.
    pub tail: Vec<String>,
}

/// The verdict on one rank.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub class: Class,
    /// Why, in words.
    pub reason: String,
    /// The output line that decided it, if one did.
    pub evidence: Option<String>,
    /// What the verdict rests on: the rank's own end, or something resilio
    /// itself saw in its place.
    #[serde(skip_serializing_if = "Grounds::is_rank")]
    pub grounds: Grounds,
}

/// What a verdict rests on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grounds {
    /// The rank's own exit, output and progress.
    #[default]
    Rank,
    /// The step started no rank: the job level's own view from the batch
    /// node. It tells no node, and is never the trainer's error.
    LaunchTrouble,
    /// The rank's agent died and left no record of its own.
    AgentDied,
}

impl Grounds {
    pub fn is_rank(&self) -> bool {
        *self == Grounds::Rank
    }
}

/// How the evidence of a step that started no rank begins (for people;
/// the verdict's [`Grounds::LaunchTrouble`] says it for the code).
pub const LAUNCH_TROUBLE: &str = "launch trouble:";

impl Verdict {
    /// A step that started no rank within `limit` of srun's start.
    pub fn launch_trouble(limit: std::time::Duration) -> Verdict {
        Verdict {
            class: Class::Infrastructure,
            reason: "the step started no rank".into(),
            evidence: Some(format!(
                "{LAUNCH_TROUBLE} no rank of the step reported within {}s of srun's start",
                limit.as_secs()
            )),
            grounds: Grounds::LaunchTrouble,
        }
    }
}

/// Lines a trainer prints when its training is over: the HF Trainer's
/// final summary (`{'train_runtime': '122.7', ...}`), Lightning's
/// ``Trainer.fit` stopped: `max_steps=60` reached.``.
const FINISHED_LINES: &str = r#"^\s*\{.*['"]train_runtime['"]\s*:|`Trainer\.fit` stopped: `max_(?:steps|epochs)=\d+` reached"#;

/// The reason of a rank that crashed after its trainer reported the end of
/// training (torch's threads at interpreter exit, a process group never
/// destroyed): finished, never run again.
pub const FINISHED_THEN_CRASHED: &str =
    "finished: the trainer reported the end of training, then crashed at exit (not run again)";

/// The reason of a rank that exited 0.
pub const EXITED_0: &str = "exited 0";

/// The reason of a rank whose last words were torch's at interpreter exit
/// (`terminate called without an active exception`: a joinable thread of
/// its process group destroyed at teardown) and that aborted (134).
pub const EXIT_TIME_ABORT: &str =
    "aborted at interpreter exit (terminate called without an active exception: torch's threads at teardown)";

/// Whether the tail's last words are torch's at interpreter exit.
fn aborted_at_teardown(end: &RankEnd) -> Option<&str> {
    let last = end.tail.iter().rev().find(|l| !l.trim().is_empty())?;
    (end.exit_code == 134 && last.contains("terminate called without an active exception"))
        .then_some(last.as_str())
}

/// An abort or a segfault with no signature of its own: torch's threads at
/// interpreter exit (`terminate called without an active exception`) once
/// training is done, or a crash like any other.
pub fn exit_time_crash(code: Option<i32>, class: Option<Class>) -> bool {
    matches!(code, Some(134) | Some(139)) && matches!(class, None | Some(Class::Unknown))
}

/// Whether an attempt finished, from its ranks' exits (code, class, class
/// reason): a trainer reported the end of training before crashing at exit,
/// or a rank completed (exit 0) and every other non-zero exit is an
/// exit-time crash or a stop. A data-parallel rank completes only once every
/// rank has done its last collective, so the crashes came after the work.
pub fn attempt_finished(exits: &[(Option<i32>, Option<Class>, Option<&str>)]) -> bool {
    if exits
        .iter()
        .any(|(_, _, why)| *why == Some(FINISHED_THEN_CRASHED))
    {
        return true;
    }
    // Every rank ended with torch's teardown abort (or exit 0): they all
    // got past their last collective, together.
    let teardown = |why: &Option<&str>| *why == Some(EXIT_TIME_ABORT);
    if exits.iter().any(|(_, _, why)| teardown(why))
        && exits.iter().all(|(code, class, why)| {
            teardown(why) || (*code == Some(0) && matches!(class, None | Some(Class::Clean)))
        })
    {
        return true;
    }
    let completed = exits
        .iter()
        .any(|(code, class, _)| *code == Some(0) && matches!(class, None | Some(Class::Clean)));
    let crashed = exits.iter().any(|(c, k, _)| exit_time_crash(*c, *k));
    completed
        && crashed
        && exits.iter().all(|(code, class, _)| {
            code.unwrap_or(0) == 0
                || exit_time_crash(*code, *class)
                || matches!(class, Some(Class::Clean | Class::Preempted))
        })
}

/// The line of `tail` saying training is over, if any.
pub fn finished_line(tail: &[String]) -> Option<&str> {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| Regex::new(FINISHED_LINES).expect("finished lines"));
    tail.iter()
        .rev()
        .find(|l| re.is_match(l))
        .map(String::as_str)
}

/// Classify one rank's end.
pub fn classify(end: &RankEnd, p: &Patterns) -> Verdict {
    if let Some(v) = by_state(end).or_else(|| after_training(end)) {
        return v;
    }
    let strongest = p.strongest(&end.tail);
    by_output(strongest)
        .or_else(|| by_signal(end.signal))
        .unwrap_or_else(|| unexplained(end, p, strongest.map(|(_, line)| line)))
}

fn verdict(class: Class, reason: &str, evidence: Option<&str>) -> Verdict {
    Verdict {
        class,
        reason: reason.to_string(),
        evidence: evidence.map(str::to_string),
        ..Default::default()
    }
}

/// What resilio itself saw or did decides first: a failed health check, a
/// numerical stop, a clean exit, a stall, a stop from outside.
fn by_state(end: &RankEnd) -> Option<Verdict> {
    if end.health_check_failed {
        return Some(verdict(
            Class::Infrastructure,
            "the node's health check failed",
            None,
        ));
    }
    // A numerical stop stands even when the trainer ended on its own as it
    // was stopped (it ran on to its last step meanwhile): resilio's exit
    // code says numerical, and a clean verdict beside it was judged a
    // crash of the node (blamed, excluded).
    if let Some(seen) = &end.numerical {
        // What was seen says which (a NaN or Inf run, or a spike rolled back).
        let reason = if seen.starts_with(super::numerical::ROLLBACK) {
            "stopped for a rollback: its loss or grad norm spiked (see the evidence)"
        } else {
            "stopped: its loss or grad norm went to NaN or Inf, or spiked (see the evidence)"
        };
        return Some(verdict(Class::Numerical, reason, Some(seen)));
    }
    if end.exit_code == 0 && !end.stalled {
        return Some(verdict(Class::Clean, EXITED_0, None));
    }
    if end.stalled {
        return Some(verdict(Class::Hang, "stopped for making no progress", None));
    }
    // Death by SIGTERM, SIGINT or SIGHUP is a stop from outside (Slurm's
    // teardown, an operator) even when resilio did not see the signal itself.
    if end.stop_requested || matches!(end.signal, Some(1) | Some(2) | Some(15)) {
        return Some(verdict(
            Class::Preempted,
            "stopped on request (Slurm time limit, preemption or an operator)",
            None,
        ));
    }
    None
}

/// Training is over: what follows is an exit-time crash, reported and never
/// a reason to train again.
fn after_training(end: &RankEnd) -> Option<Verdict> {
    if let Some(done) = finished_line(&end.tail) {
        let last = end.tail.last().map_or(done, String::as_str);
        return Some(Verdict {
            class: Class::Clean,
            reason: FINISHED_THEN_CRASHED.to_string(),
            evidence: Some(format!(
                "exit code {} after {}; last line: {}",
                end.exit_code,
                done.chars().take(120).collect::<String>(),
                last.chars().take(200).collect::<String>()
            )),
            ..Default::default()
        });
    }
    aborted_at_teardown(end).map(|line| verdict(Class::Unknown, EXIT_TIME_ABORT, Some(line)))
}

/// The strongest known signature in the rank's last lines, if any but a
/// generic exception.
fn by_output(strongest: Option<(LineClass, &str)>) -> Option<Verdict> {
    let (class, reason) = match strongest? {
        (LineClass::Infrastructure, _) => (
            Class::Infrastructure,
            "infrastructure signature in the output",
        ),
        (LineClass::Ambiguous, _) => (
            Class::Unknown,
            "an error as often the GPU's or its driver's as the code's (one restart; the same again at the same step stops)",
        ),
        (LineClass::User, _) => (Class::UserError, "the trainer's own error"),
        (LineClass::Secondary, _) => (
            Class::Secondary,
            "a peer's failure (connection to another rank lost)",
        ),
        _ => return None,
    };
    Some(verdict(class, reason, strongest.map(|(_, line)| line)))
}

/// A fatal signal that names its cause.
fn by_signal(signal: Option<i32>) -> Option<Verdict> {
    let reason = match signal? {
        9 => "killed by SIGKILL (node, OOM killer or Slurm)",
        7 => "killed by SIGBUS (memory or device fault)",
        _ => return None,
    };
    Some(verdict(Class::Infrastructure, reason, None))
}

/// Nothing explains the end: an unknown exception (quoted by its last line)
/// or a bare exit code.
fn unexplained(end: &RankEnd, p: &Patterns, generic: Option<&str>) -> Verdict {
    let Some(line) = generic else {
        // The signal by name: a segfault and an abort are different
        // failures, whatever their numbers (trial 16).
        let signal = end
            .signal
            .or((129..=128 + 64)
                .contains(&end.exit_code)
                .then(|| end.exit_code - 128))
            .and_then(|n| nix::sys::signal::Signal::try_from(n).ok())
            .map_or(String::new(), |s| format!(" ({})", s.as_str()));
        return verdict(
            Class::Unknown,
            &format!(
                "exit code {}{signal} with no known signature (one restart; the same again stops)",
                end.exit_code
            ),
            None,
        );
    };
    // The last exception line says more than the traceback header.
    let last = what_happened(&end.tail)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find(|l| {
            p.line_class(l) == Some(LineClass::Generic)
                && !without_rank_prefix(l).starts_with("Traceback")
        })
        .map_or(line, |s| s.as_str());
    verdict(
        Class::Unknown,
        "an exception no pattern explains (one restart; the same again stops)",
        Some(last),
    )
}

/// One failed rank in a cross-rank judgment.
#[derive(Clone, Debug)]
pub struct RankFailure {
    pub rank: u32,
    pub node: String,
    /// Seconds (any epoch, same for all) when the failure was observed.
    pub at: f64,
    pub verdict: Verdict,
}

/// The cross-rank judgment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Judgment {
    /// Index (into the input) of the failure judged primary.
    pub primary: usize,
    /// Why that one.
    pub why: String,
    /// The class of the job's failure as a whole.
    pub class: Class,
    /// Nodes to blame (only for infrastructure failures and hangs).
    pub blamed_nodes: Vec<String>,
    /// The primary failure names its culprit. False for a hang nobody
    /// could be blamed for (the coordinator's verdict, or ranks that
    /// stalled together): the primary rank is only the first to report.
    pub culprit: bool,
}

/// The reason given to every hung rank when the coordinator's job-wide
/// judgment blamed nobody: "nobody blamed" stays so to the report and the
/// node history.
pub const NOBODY_BLAMED: &str = "hung, nobody blamed (the coordinator's job-wide judgment)";

/// The primary failure's node, and the nodes of infrastructure failures
/// at (nearly) the same moment: two bad nodes can fail together.
fn nodes_failing_with(f: &RankFailure, causes: &[(usize, &RankFailure)]) -> Vec<String> {
    let mut nodes = vec![f.node.clone()];
    for (_, other) in causes {
        if other.verdict.class == Class::Infrastructure
            && (other.at - f.at).abs() < 1.0
            && !nodes.contains(&other.node)
        {
            nodes.push(other.node.clone());
        }
    }
    nodes
}

/// A rank lost a connection before any rank was stopped: with no real
/// failure anywhere, that is its own error (an object store's reset), not
/// an echo of the stops that followed it (trial 13).
fn lost_connection_first(failed: &[(usize, &RankFailure)]) -> bool {
    let first = |c: Class| {
        failed
            .iter()
            .filter(|(_, f)| f.verdict.class == c)
            .map(|(_, f)| f.at)
            .min_by(f64::total_cmp)
    };
    matches!(
        (first(Class::Secondary), first(Class::Preempted)),
        (Some(s), Some(p)) if s < p
    )
}

/// Judge failures across ranks: the earliest failure that is not a peer's
/// echo is primary; its class is the job's. Secondary failures are never
/// blamed and never make the job look like a user error. Returns `None`
/// when nothing failed.
pub fn primary(failures: &[RankFailure]) -> Option<Judgment> {
    let failed: Vec<(usize, &RankFailure)> = failures
        .iter()
        .enumerate()
        .filter(|(_, f)| f.verdict.class != Class::Clean)
        .collect();
    if failed.is_empty() {
        return None;
    }
    let earliest = |xs: &[(usize, &RankFailure)]| -> Option<usize> {
        xs.iter()
            .min_by(|a, b| a.1.at.total_cmp(&b.1.at).then(a.0.cmp(&b.0)))
            .map(|(i, _)| *i)
    };
    // A rank stopped from outside (srun tearing the step down after another
    // rank failed) is an echo too, unless nothing else failed.
    let real = |c: Class| !matches!(c, Class::Secondary | Class::Preempted);
    let any_real = failed.iter().any(|(_, f)| real(f.verdict.class));
    let lost_connection_first = !any_real && lost_connection_first(&failed);
    let causes: Vec<(usize, &RankFailure)> = failed
        .iter()
        .copied()
        .filter(|(_, f)| (f.verdict.class == Class::Secondary) == lost_connection_first)
        .filter(|(_, f)| lost_connection_first || !any_real || real(f.verdict.class))
        .collect();
    let (idx, why) = match earliest(&causes) {
        Some(i) if lost_connection_first => (
            i,
            "a lost connection came before any rank was stopped, and nothing else failed: unexplained (one restart)".to_string(),
        ),
        Some(i) => {
            let n_sec = failed.len() - causes.len();
            (
                i,
                format!(
                    "earliest of {} failure(s) that is not a peer's echo ({} secondary)",
                    causes.len(),
                    n_sec
                ),
            )
        }
        None => (
            earliest(&failed).expect("non-empty"),
            "every failure looks like a lost peer: the earliest is taken as the cause".to_string(),
        ),
    };
    let f = &failures[idx];
    // All ranks secondary: a peer vanished without a trace (node crash, kill -9):
    // treat as infrastructure on the earliest rank's view.
    // A lost connection before the stops, nothing else: unexplained (one
    // restart, no node blamed).
    let class = match f.verdict.class {
        Class::Secondary if lost_connection_first => Class::Unknown,
        Class::Secondary => Class::Infrastructure,
        c => c,
    };
    let mut blamed_nodes = Vec::new();
    // Ranks waiting in a collective stall together with the one that hung:
    // when several ranks hung within seconds, progress alone cannot tell the
    // culprit, and nobody is blamed (the restart still happens).
    let hung_together = causes
        .iter()
        .filter(|(_, o)| o.verdict.class == Class::Hang && (o.at - f.at).abs() < 10.0)
        .count();
    let nobody = class == Class::Hang && f.verdict.reason == NOBODY_BLAMED;
    let why = if nobody {
        format!("{why}; the coordinator's job-wide judgment blamed nobody: no rank or node blamed")
    } else if class == Class::Hang && hung_together > 1 {
        format!("{why}; {hung_together} ranks stalled together, the culprit cannot be told from progress alone: no node blamed")
    } else {
        why
    };
    // A step that started no rank tells no node: it is the job level's
    // own view, from the batch node.
    let launch_trouble = f.verdict.grounds == Grounds::LaunchTrouble;
    if matches!(class, Class::Infrastructure | Class::Hang)
        && f.verdict.class != Class::Secondary
        && !(class == Class::Hang && hung_together > 1)
        && !nobody
        && !launch_trouble
    {
        blamed_nodes = nodes_failing_with(f, &causes);
    }
    Some(Judgment {
        primary: idx,
        culprit: !(nobody || (class == Class::Hang && hung_together > 1)),
        why,
        class,
        blamed_nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_is_named_as_the_journal_writes_it_and_decided_for_a_restart() {
        let mut names: Vec<&str> = Class::ALL.iter().map(|c| c.name()).collect();
        for c in Class::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), c.name(), "{c:?}");
            let back: Class = serde_json::from_value(c.name().into()).unwrap();
            assert_eq!(back, c);
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Class::ALL.len());
        let retried: Vec<&str> = Class::ALL
            .into_iter()
            .filter(|c| c.retryable())
            .map(Class::name)
            .collect();
        assert_eq!(retried, ["infrastructure", "hang", "preempted", "unknown"]);
    }

    fn end(code: i32, tail: &[&str]) -> RankEnd {
        RankEnd {
            exit_code: code,
            signal: (code > 128).then_some(code - 128),
            tail: tail.iter().map(|s| s.to_string()).collect(),
            ..RankEnd::default()
        }
    }

    #[test]
    fn every_rank_aborting_with_torchs_last_words_finished() {
        let mut e = end(
            134,
            &[
                "[rank0]: step 60",
                "terminate called without an active exception",
            ],
        );
        e.signal = Some(6);
        let v = classify(&e, &Patterns::defaults());
        assert_eq!(v.reason, EXIT_TIME_ABORT, "{v:?}");
        let u = Some(Class::Unknown);
        let t = Some(EXIT_TIME_ABORT);
        assert!(attempt_finished(&[(Some(134), u, t), (Some(134), u, t)]));
        assert!(attempt_finished(&[
            (Some(134), u, t),
            (Some(0), Some(Class::Clean), None)
        ]));
        // Another rank failed otherwise: not finished.
        assert!(!attempt_finished(&[(Some(134), u, t), (Some(1), u, None)]));
        // The words followed by more output are not last words.
        let mut e = end(
            134,
            &[
                "terminate called without an active exception",
                "Traceback (most recent call last):",
            ],
        );
        e.signal = Some(6);
        assert_ne!(classify(&e, &Patterns::defaults()).reason, EXIT_TIME_ABORT);
    }

    #[test]
    fn an_attempt_with_a_rank_completed_and_another_aborted_at_exit_finished() {
        let u = Some(Class::Unknown);
        let c = Some(Class::Clean);
        assert!(attempt_finished(&[
            (Some(0), c, Some(EXITED_0)),
            (Some(134), u, None)
        ]));
        assert!(attempt_finished(&[
            (Some(139), u, None),
            (Some(0), c, None)
        ]));
        // No rank completed: a crash like any other.
        assert!(!attempt_finished(&[
            (Some(134), u, None),
            (Some(143), Some(Class::Preempted), None)
        ]));
        // A crash with a say of its own is no exit-time crash.
        assert!(!attempt_finished(&[
            (Some(0), c, None),
            (Some(1), Some(Class::UserError), None)
        ]));
        assert!(!attempt_finished(&[(Some(0), c, None), (Some(0), c, None)]));
        assert!(attempt_finished(&[
            (Some(134), c, Some(FINISHED_THEN_CRASHED)),
            (Some(143), Some(Class::Preempted), None)
        ]));
    }

    #[test]
    fn a_crash_after_the_trainer_reported_the_end_of_training_is_finished() {
        let end = RankEnd {
            exit_code: 134,
            signal: Some(6),
            tail: vec![
                "{'train_runtime': '122.7', 'train_samples_per_second': '15.65', 'train_loss': '4.1', 'epoch': '1.0'}".into(),
                "done".into(),
                "terminate called without an active exception".into(),
            ],
            ..Default::default()
        };
        let v = classify(&end, &Patterns::defaults());
        assert_eq!(v.class, Class::Clean, "{v:?}");
        assert_eq!(v.reason, FINISHED_THEN_CRASHED);
        assert!(v.evidence.unwrap().contains("terminate called"));
        let lightning = RankEnd {
            exit_code: 139,
            signal: Some(11),
            tail: vec!["`Trainer.fit` stopped: `max_steps=60` reached.".into()],
            ..Default::default()
        };
        assert_eq!(
            classify(&lightning, &Patterns::defaults()).class,
            Class::Clean
        );
        // A summary-like dict mid-training is no end (no train_runtime).
        let mid = RankEnd {
            exit_code: 134,
            signal: Some(6),
            tail: vec!["{'loss': '5.471', 'epoch': '0.5'}".into()],
            ..Default::default()
        };
        assert_ne!(classify(&mid, &Patterns::defaults()).class, Class::Clean);
    }

    #[test]
    fn a_ranks_exception_is_told_by_its_last_line_not_the_traceback_header() {
        let end = RankEnd {
            exit_code: 1,
            tail: vec![
                "[rank1]: Traceback (most recent call last):".into(),
                "[rank1]:   File \"train.py\", line 3, in <module>".into(),
                "[rank1]: RuntimeError: injected failure on rank 1 at step 70".into(),
            ],
            ..Default::default()
        };
        let v = classify(&end, &Patterns::defaults());
        assert_eq!(
            v.evidence.as_deref(),
            Some("[rank1]: RuntimeError: injected failure on rank 1 at step 70")
        );
    }

    /// Trial 13: the source line Python quotes names a ValueError in a
    /// comment; what happened is a connection reset. The code is not
    /// evidence; a real ValueError's own line still is.
    #[test]
    fn a_tracebacks_quoted_source_is_not_what_happened() {
        let tail = |last: &str| RankEnd {
            exit_code: 1,
            tail: vec![
                "[rank1]: Traceback (most recent call last):".into(),
                "[rank1]:   File \"/w/train.py\", line 41, in <module>".into(),
                "[rank1]:     x = fetch_shard(i)  # a bad shard raises ValueError".into(),
                "[rank1]:         ^^^^^^^^^^^^^^".into(),
                last.into(),
            ],
            ..Default::default()
        };
        let p = Patterns::defaults();
        let v = classify(
            &tail("[rank1]: ConnectionResetError: [Errno 104] Connection reset by peer"),
            &p,
        );
        assert_ne!(v.class, Class::UserError, "{v:?}");
        assert!(
            v.evidence
                .as_deref()
                .unwrap_or("")
                .contains("ConnectionResetError"),
            "{v:?}"
        );
        let v = classify(&tail("[rank1]: ValueError: bad shard 7"), &p);
        assert_eq!(v.class, Class::UserError, "{v:?}");
        assert_eq!(
            v.evidence.as_deref(),
            Some("[rank1]: ValueError: bad shard 7")
        );
    }

    #[test]
    fn an_illegal_memory_access_gets_one_restart_not_a_user_error_verdict() {
        let end = RankEnd {
            exit_code: 1,
            tail: vec![
                "Traceback (most recent call last):".into(),
                "RuntimeError: CUDA error: an illegal memory access was encountered".into(),
            ],
            ..Default::default()
        };
        let v = classify(&end, &Patterns::defaults());
        assert_eq!(v.class, Class::Unknown, "{v:?}");
        assert!(v.class.retryable());
        assert!(
            v.reason.contains("the same again at the same step stops"),
            "{v:?}"
        );
    }

    #[test]
    fn a_numerical_stop_stands_when_the_trainer_ended_cleanly_meanwhile() {
        let p = Patterns::defaults();
        let mut e = end(0, &[]);
        e.numerical = Some("loss nan since step 41 (3 steps in a row)".into());
        let v = classify(&e, &p);
        assert_eq!(v.class, Class::Numerical, "{v:?}");
        assert_eq!(v.evidence.as_deref(), e.numerical.as_deref());
        // A failed health check still says the node.
        e.health_check_failed = true;
        assert_eq!(classify(&e, &p).class, Class::Infrastructure);
    }

    #[test]
    fn single_rank_verdicts() {
        let p = Patterns::defaults();
        assert_eq!(classify(&end(0, &[]), &p).class, Class::Clean);
        assert_eq!(classify(&end(137, &[]), &p).class, Class::Infrastructure);
        assert_eq!(classify(&end(135, &[]), &p).class, Class::Infrastructure);
        let u = classify(
            &end(
                1,
                &["Traceback (most recent call last):", "KeyError: 'model'"],
            ),
            &p,
        );
        assert_eq!(
            (u.class, u.evidence.as_deref()),
            (Class::UserError, Some("KeyError: 'model'"))
        );
        let g = classify(
            &end(
                1,
                &[
                    "Traceback (most recent call last):",
                    "MyOwnError: bad batch",
                ],
            ),
            &p,
        );
        assert_eq!(
            (g.class, g.evidence.as_deref()),
            (Class::Unknown, Some("MyOwnError: bad batch"))
        );
        assert_eq!(classify(&end(3, &["bye"]), &p).class, Class::Unknown);
        let s = classify(
            &end(
                1,
                &[
                    "Traceback (most recent call last):",
                    "RuntimeError: Connection closed by peer [10.0.0.2]:5555",
                ],
            ),
            &p,
        );
        assert_eq!(
            s.class,
            Class::Secondary,
            "a traceback caused by a lost peer is not the user's error"
        );
        let mut e = end(143, &[]);
        e.stop_requested = true;
        assert_eq!(classify(&e, &p).class, Class::Preempted);
        assert_eq!(
            classify(&end(143, &[]), &p).class,
            Class::Preempted,
            "killed by SIGTERM from outside"
        );
        let mut h = end(124, &[]);
        h.stalled = true;
        assert_eq!(classify(&h, &p).class, Class::Hang);
    }

    /// Trial 13: rank 1's object store reset its connection (it looks like
    /// a lost peer); rank 0 was then stopped by the teardown. Not "stopped
    /// from outside" (no restart), not a node's fault: unexplained, one
    /// restart, no node blamed. Every rank seeing a lost peer stays a
    /// vanished peer (infrastructure).
    #[test]
    fn a_lost_connection_before_the_stops_is_unexplained_not_an_outside_stop() {
        let j = primary(&[
            fail(0, "n1", 12.0, Class::Preempted),
            fail(1, "n2", 11.0, Class::Secondary),
        ])
        .unwrap();
        assert_eq!(j.class, Class::Unknown, "{j:?}");
        assert_eq!(j.primary, 1);
        assert!(j.blamed_nodes.is_empty(), "{j:?}");
        let j = primary(&[
            fail(0, "n1", 12.0, Class::Secondary),
            fail(1, "n2", 11.0, Class::Secondary),
        ])
        .unwrap();
        assert_eq!(j.class, Class::Infrastructure, "{j:?}");
        // A stop from outside first stays a stop from outside.
        let j = primary(&[
            fail(0, "n1", 10.0, Class::Preempted),
            fail(1, "n2", 11.0, Class::Secondary),
        ])
        .unwrap();
        assert_eq!(j.class, Class::Preempted, "{j:?}");
    }

    fn fail(rank: u32, node: &str, at: f64, class: Class) -> RankFailure {
        RankFailure {
            rank,
            node: node.into(),
            at,
            verdict: Verdict {
                class,
                reason: String::new(),
                evidence: None,
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_step_that_started_no_rank_blames_no_node() {
        let mut f = fail(u32::MAX, "n1", 3.0, Class::Infrastructure);
        f.verdict = Verdict::launch_trouble(std::time::Duration::from_secs(8));
        let j = primary(&[f]).unwrap();
        assert_eq!(j.class, Class::Infrastructure);
        assert!(j.blamed_nodes.is_empty(), "{:?}", j.blamed_nodes);
    }

    #[test]
    fn the_first_real_failure_is_the_cause_and_echoes_are_not_blamed() {
        let j = primary(&[
            fail(0, "n1", 12.0, Class::Secondary),
            fail(3, "n2", 10.0, Class::Infrastructure),
            fail(1, "n1", 12.5, Class::UserError),
            fail(2, "n3", 12.1, Class::Secondary),
        ])
        .unwrap();
        assert_eq!(j.primary, 1);
        assert_eq!(j.class, Class::Infrastructure);
        assert_eq!(j.blamed_nodes, ["n2"]);
        // A user error that happened first makes the job a user error, even if
        // peers then fail with infrastructure-looking echoes.
        let j = primary(&[
            fail(0, "n1", 5.0, Class::UserError),
            fail(1, "n2", 6.0, Class::Secondary),
        ])
        .unwrap();
        assert_eq!((j.primary, j.class), (0, Class::UserError));
        assert!(j.blamed_nodes.is_empty());
        // Only echoes: a peer vanished (node crash): infrastructure, nobody blamed from echoes.
        let j = primary(&[
            fail(0, "n1", 5.0, Class::Secondary),
            fail(1, "n2", 4.0, Class::Secondary),
        ])
        .unwrap();
        assert_eq!((j.primary, j.class), (1, Class::Infrastructure));
        assert!(j.blamed_nodes.is_empty());
        assert!(primary(&[fail(0, "n1", 1.0, Class::Clean)]).is_none());
    }

    #[test]
    fn the_evidence_is_the_exceptions_line_not_its_quoted_source() {
        for prefix in ["", "[rank1]: "] {
            let e = end(
                1,
                &[
                    &format!("{prefix}Traceback (most recent call last):"),
                    &format!("{prefix}  File \"/w/pl_train.py\", line 40, in training_step"),
                    &format!("{prefix}    raise RuntimeError(\"CUDA error: an illegal memory access was encountered\")"),
                    &format!("{prefix}RuntimeError: CUDA error: an illegal memory access was encountered"),
                    "one more line",
                ],
            );
            let v = classify(&e, &Patterns::defaults());
            assert_eq!(
                v.evidence.as_deref(),
                Some(format!("{prefix}RuntimeError: CUDA error: an illegal memory access was encountered").as_str()),
                "{v:?}"
            );
        }
        // Two lines as strong, neither quoted source: the first.
        let e = end(
            1,
            &[
                "NCCL error: unhandled system error",
                "NCCL error: remote process exited",
            ],
        );
        let v = classify(&e, &Patterns::defaults());
        assert_eq!(
            v.evidence.as_deref(),
            Some("NCCL error: unhandled system error"),
            "{v:?}"
        );
    }
}
