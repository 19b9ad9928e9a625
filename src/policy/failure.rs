//! Failure classification: why did a rank end, and whose fault was it?
//!
//! [`classify`] judges one rank's end from its exit status, whether it was
//! stopped for a stall or by a signal from outside, and its last output lines
//! matched against pattern lists (defaults below, replaceable in config).
//! [`primary`] judges a set of rank failures together: failures cascade
//! (when one rank dies its peers fail seconds later with connection errors
//! and tracebacks of their own), so the first failure that is not a peer's
//! echo is the cause and the others are secondary. Both are pure functions.

use regex::Regex;
use serde::Serialize;

/// Whose fault a rank's end was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Exit 0.
    Clean,
    /// The user's own code or configuration (traceback, non-zero exit without
    /// an infrastructure signature). Not worth a requeue.
    UserError,
    /// The node, its GPUs or the fabric: blame the node, exclude, requeue.
    Infrastructure,
    /// The rank stopped making progress and was stopped (a hang).
    Hang,
    /// Failed because a peer failed first (connection closed, remote exited).
    Secondary,
    /// Stopped by Slurm or an operator (time limit, preemption, scancel).
    Preempted,
}

impl Class {
    /// Name as written in the journal.
    pub fn name(self) -> &'static str {
        match self {
            Class::Clean => "clean",
            Class::UserError => "user_error",
            Class::Infrastructure => "infrastructure",
            Class::Hang => "hang",
            Class::Secondary => "secondary",
            Class::Preempted => "preempted",
        }
    }

    /// Whether a restart may help (the failure was not in the user's code).
    pub fn retryable(self) -> bool {
        matches!(self, Class::Infrastructure | Class::Hang | Class::Preempted)
    }
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
    /// Its last output lines, oldest first.
    pub tail: Vec<String>,
}

/// Pattern lists, compiled.
#[derive(Clone, Debug)]
pub struct Patterns {
    pub infrastructure: Vec<Regex>,
    pub secondary: Vec<Regex>,
    pub user: Vec<Regex>,
}

/// Default infrastructure signatures (recorded samples: tests/fixtures/failures).
pub const DEFAULT_INFRA: &[&str] = &[
    r"Watchdog caught collective operation timeout",
    r"NCCL (?:error|WARN).*(?:unhandled system error|ncclSystemError|ncclInternalError)",
    r"ncclSystemError|ncclInternalError",
    r"NET/IB.*(?:error|Error)|ibv_\w+ failed|IBV_WC_\w+_ERR",
    r"\bXid\b.*\d+",
    r"(?i)uncorrectable ECC error|ECC error|fallen off the bus",
    r"CUDA error: (?:unknown error|an uncorrectable|uncorrectable)",
    r"(?i)\bunspecified launch failure\b|cudaErrorLaunchFailure",
    r"^Bus error|SIGBUS",
    r"(?i)NODE FAILURE|srun: error: Node failure",
];

/// Default signatures of a failure caused by a peer's failure.
pub const DEFAULT_SECONDARY: &[&str] = &[
    r"(?i)connection (?:closed|reset) by peer",
    r"(?i)remote process exited",
    r"DistNetworkError|RendezvousConnectionError|RendezvousClosedError",
    r"(?i)broken pipe",
    r"ncclRemoteError",
    r"(?i)NCCL communicator was aborted",
];

/// Default signatures of the user's own error.
pub const DEFAULT_USER: &[&str] = &[
    r"^Traceback \(most recent call last\):",
    r"^\w*(?:Error|Exception): ",
    r"OutOfMemoryError|CUDA out of memory",
    r"^AssertionError",
];

impl Patterns {
    /// Compile pattern sources; the error names the bad one.
    pub fn compile(
        infra: &[String],
        secondary: &[String],
        user: &[String],
    ) -> Result<Patterns, String> {
        Ok(Patterns {
            infrastructure: compile_list(infra, "infrastructure")?,
            secondary: compile_list(secondary, "secondary")?,
            user: compile_list(user, "user")?,
        })
    }

    /// The built-in defaults.
    pub fn defaults() -> Patterns {
        let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Patterns::compile(
            &own(DEFAULT_INFRA),
            &own(DEFAULT_SECONDARY),
            &own(DEFAULT_USER),
        )
        .expect("default patterns compile")
    }

    fn first_match<'a>(list: &[Regex], tail: &'a [String]) -> Option<&'a str> {
        tail.iter()
            .find(|l| list.iter().any(|r| r.is_match(l)))
            .map(|s| s.as_str())
    }
}

/// Compile one list of patterns; the error names the bad one.
pub fn compile_list(list: &[String], what: &str) -> Result<Vec<Regex>, String> {
    list.iter()
        .map(|p| {
            Regex::new(p).map_err(|e| {
                format!(
                    "invalid {what} pattern '{p}': {}",
                    e.to_string().lines().last().unwrap_or("").trim()
                )
            })
        })
        .collect()
}

/// The verdict on one rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub class: Class,
    /// Why, in words.
    pub reason: String,
    /// The output line that decided it, if one did.
    pub evidence: Option<String>,
}

/// Classify one rank's end.
pub fn classify(end: &RankEnd, p: &Patterns) -> Verdict {
    let v = |class, reason: &str, evidence: Option<&str>| Verdict {
        class,
        reason: reason.to_string(),
        evidence: evidence.map(str::to_string),
    };
    if end.exit_code == 0 && !end.stalled {
        return v(Class::Clean, "exited 0", None);
    }
    if end.health_check_failed {
        return v(
            Class::Infrastructure,
            "the node's health check failed",
            None,
        );
    }
    if end.stalled {
        return v(Class::Hang, "stopped for making no progress", None);
    }
    if end.stop_requested {
        return v(
            Class::Preempted,
            "stopped on request (Slurm time limit, preemption or an operator)",
            None,
        );
    }
    if let Some(line) = Patterns::first_match(&p.infrastructure, &end.tail) {
        return v(
            Class::Infrastructure,
            "infrastructure signature in the output",
            Some(line),
        );
    }
    if let Some(line) = Patterns::first_match(&p.secondary, &end.tail) {
        return v(
            Class::Secondary,
            "a peer's failure (connection to another rank lost)",
            Some(line),
        );
    }
    match end.signal {
        Some(9) => {
            return v(
                Class::Infrastructure,
                "killed by SIGKILL (node, OOM killer or Slurm)",
                None,
            )
        }
        Some(7) => {
            return v(
                Class::Infrastructure,
                "killed by SIGBUS (memory or device fault)",
                None,
            )
        }
        _ => {}
    }
    if let Some(line) = Patterns::first_match(&p.user, &end.tail) {
        return v(Class::UserError, "the trainer's own error", Some(line));
    }
    v(
        Class::UserError,
        &format!(
            "exit code {} with no infrastructure signature",
            end.exit_code
        ),
        None,
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
    let causes: Vec<(usize, &RankFailure)> = failed
        .iter()
        .copied()
        .filter(|(_, f)| f.verdict.class != Class::Secondary)
        .filter(|(_, f)| !any_real || real(f.verdict.class))
        .collect();
    let (idx, why) = match earliest(&causes) {
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
    let class = match f.verdict.class {
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
    let why = if class == Class::Hang && hung_together > 1 {
        format!("{why}; {hung_together} ranks stalled together, the culprit cannot be told from progress alone: no node blamed")
    } else {
        why
    };
    if matches!(class, Class::Infrastructure | Class::Hang)
        && f.verdict.class != Class::Secondary
        && !(class == Class::Hang && hung_together > 1)
    {
        blamed_nodes.push(f.node.clone());
        // Infrastructure failures at (nearly) the same moment on other nodes
        // are blamed too: two bad nodes can fail together.
        for (_, other) in &causes {
            if other.verdict.class == Class::Infrastructure
                && (other.at - f.at).abs() < 1.0
                && !blamed_nodes.contains(&other.node)
            {
                blamed_nodes.push(other.node.clone());
            }
        }
    }
    Some(Judgment {
        primary: idx,
        why,
        class,
        blamed_nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(code: i32, tail: &[&str]) -> RankEnd {
        RankEnd {
            exit_code: code,
            signal: (code > 128).then_some(code - 128),
            tail: tail.iter().map(|s| s.to_string()).collect(),
            ..RankEnd::default()
        }
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
            (Class::UserError, Some("Traceback (most recent call last):"))
        );
        assert_eq!(classify(&end(3, &["bye"]), &p).class, Class::UserError);
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
        let mut h = end(124, &[]);
        h.stalled = true;
        assert_eq!(classify(&h, &p).class, Class::Hang);
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
            },
        }
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
}
