//! The chaos suite: resilio's own faults, and faults of the machine it runs
//! on, must never cost training (issue 13). Each case runs the local mode
//! (or standalone agents linked to a standalone coordinator) with real
//! processes, is bounded by hard timeouts, cleans up after itself even when
//! an assertion fails (Drop guards kill every process carrying the case's
//! marker, and undo mounts, namespaces and links), and asserts three
//! things: what the trainer's own record shows (steps kept by its
//! checkpoint, attempts made), what the journal says, and that no process
//! of the case is left (a scan of `/proc` for its unique marker, an
//! environment variable every process of the case inherits).
//!
//! The suite, with the cases that live elsewhere:
//! - an agent killed with SIGKILL: its rank's failure, restarted in place,
//!   nothing its trainer started outlives it
//!   (`own_faults::a_killed_agent_is_its_ranks_failure_...`);
//! - the launcher (and the coordinator in it) killed with SIGKILL: the ranks
//!   train on alone and journal `launcher_lost`
//!   (`own_faults::a_killed_launcher_leaves_the_ranks_training_...`);
//! - a standalone coordinator killed: the agents fail open
//!   (`coordinator::killing_the_coordinator_does_not_kill_training`);
//! - a full disk under one agent's journal (a real tmpfs): a journaled gap,
//!   training unaffected
//!   (`runtime_dirs::a_full_disk_costs_a_gap_that_is_journaled_...`);
//! - here: a trainer stopped with SIGSTOP past the stall timeout, a node cut
//!   off from the coordinator (a network namespace whose link goes down
//!   while every process lives), every journal of a local run (launcher,
//!   coordinator, ranks) on a disk full from the start, with a restart in
//!   between, and the wall clock stepped under resilio (libfaketime).
//!
//! CI runs them as root (tests/run.sh, which installs libfaketime); a case
//! that cannot run here (no root for namespaces, no libfaketime) prints
//! `skipped: ...` and returns.

mod clock_step;
mod full_disk;
mod partition;
mod sigstop;

use crate::common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that marks every process of a case.
const MARK: &str = "RESILIO_CHAOS_MARK";

/// A case's marker: unique per test and run; every process the case starts
/// inherits it. Dropping it kills whatever still carries it (an assertion
/// failed half-way), so that no case leaves processes to the next.
struct Marker(String);

impl Marker {
    fn new(case: &str) -> Marker {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        Marker(format!("{case}-{}-{nanos}", std::process::id()))
    }

    /// Mark a command (and so everything it starts).
    fn on<'a>(&self, c: &'a mut Command) -> &'a mut Command {
        c.env(MARK, &self.0)
    }

    /// Live processes carrying the marker (zombies have no environment left).
    fn live(&self) -> Vec<i32> {
        let needle = format!("{MARK}={}", self.0);
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
            })
            .filter(|pid| pid_alive(*pid))
            .collect()
    }

    /// Assert that nothing of the case is left (given `limit` to go).
    fn assert_none_left(&self, limit: Duration) {
        let mut left = Vec::new();
        let gone = wait_for(limit, || {
            left = self.live();
            left.is_empty()
        });
        let what: Vec<String> = left
            .iter()
            .map(|p| {
                let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                format!("{p}: {}", String::from_utf8_lossy(&cmd).replace('\0', " "))
            })
            .collect();
        assert!(gone, "processes left behind: {what:#?}");
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        for _ in 0..20 {
            let left = self.live();
            if left.is_empty() {
                return;
            }
            for p in left {
                // Stopped ones too: SIGKILL needs no SIGCONT.
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `resilio report JOB --json`.
fn report_json(state: &Path, job: &str) -> serde_json::Value {
    let mut c = Command::new(bin());
    c.env("RESILIO_STATE_DIR", state)
        .env("RESILIO_SYSTEM_CONFIG", "")
        .args(["report", job, "--json"]);
    let (o, _) = output_within(&mut c, Duration::from_secs(20));
    assert!(o.status.success(), "{}", stderr_of(&o));
    serde_json::from_slice(&o.stdout).expect("report --json")
}

/// The lockstep trainer's arguments: `total` steps of 0.1 s, a checkpoint
/// every 5 steps in `ck`.
fn lockstep_args(total: u32, ck: &Path) -> Vec<String> {
    [
        "--total",
        &total.to_string(),
        "--step-time",
        "0.1",
        "--ckpt-every",
        "5",
        "--ckpt-dir",
        ck.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

/// A configuration that journals every step (progress records are
/// sampled otherwise), so that a case can act at a step it chose.
fn every_step_journaled(dir: &Path) -> PathBuf {
    write_config(dir, "[journal]\nprogress_interval = \"0s\"\n")
}

/// The highest step a rank's progress records show in an attempt.
fn step_of(state: &Path, job: &str, rank: u32, attempt: u32) -> Option<u64> {
    records(state, job)
        .iter()
        .filter(|r| r.kind == "progress" && r.rank == Some(rank) && r.attempt == attempt)
        .filter_map(|r| r.u64("step"))
        .max()
}

/// The attempts the trainer itself announced on stdout ("rank R/W on
/// NODE, attempt A, ...") and the checkpoints it resumed from.
fn trainer_story(stdout: &str) -> (Vec<u32>, Vec<u64>) {
    let mut attempts: Vec<u32> = stdout
        .lines()
        .filter_map(|l| {
            l.split(", attempt ")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    attempts.dedup();
    attempts.sort();
    attempts.dedup();
    let resumed = stdout
        .lines()
        .filter_map(|l| {
            l.split("resumed from checkpoint #")
                .nth(1)?
                .trim()
                .parse()
                .ok()
        })
        .collect();
    (attempts, resumed)
}

/// Every line of every journal file is a whole JSON record with a time.
fn assert_journal_whole(state: &Path, job: &str) {
    let dir = resilio::journal::job_dir(state, job);
    let j = resilio::journal::read_job(&dir).unwrap();
    assert_eq!(j.bad_lines, 0, "{:?}", j.skipped);
    for f in &j.files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "{} ends in a partial line: {text:?}",
            f.display()
        );
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: {e}: {line}", f.display()));
            assert!(v["ts"].is_string() && v["kind"].is_string(), "{line}");
        }
    }
}
