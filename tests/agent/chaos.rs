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
//! - here: a trainer stopped with SIGSTOP past the stall timeout, and the
//!   wall clock stepped under resilio (libfaketime).
//!
//! CI runs them as root (tests/run.sh, which installs libfaketime); a case
//! that cannot run here prints `skipped: ...` and returns.

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
        .env("RESILIO_SYSTEM_CONFIG", "/nonexistent/resilio.toml")
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

/// Case 1: a trainer stopped with SIGSTOP and left stopped, past the stall
/// timeout. A SIGTERM to a stopped process stays pending; the rank must be
/// stopped all the same (SIGKILL after the grace), judged a hang of that
/// rank, and the run restarted in place from the trainer's checkpoint.
#[test]
fn a_sigstopped_trainer_is_judged_a_hang_stopped_and_the_run_resumes_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = Marker::new("sigstop");
    let (state, job, ck) = (tmp.path(), "sigstop", tmp.path().join("ck"));
    let args = lockstep_args(30, &ck);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cfg = every_step_journaled(state);
    let mut c = run_local(
        state,
        job,
        2,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--stall-timeout",
            "2s",
            "--kill-grace",
            "3s",
            "--max-restarts",
            "2",
        ],
        &args,
    );
    mark.on(&mut c)
        .current_dir(state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let child = c.spawn().unwrap();
    // Rank 1 steps past its first checkpoint; then its trainer is stopped.
    let mut trainer = None;
    assert!(
        wait_for(Duration::from_secs(30), || {
            let recs = records(state, job);
            trainer = recs
                .iter()
                .find(|r| r.kind == "rank_start" && r.rank == Some(1) && r.attempt == 0)
                .and_then(|r| r.get("pid")?.as_i64());
            trainer.is_some() && step_of(state, job, 1, 0).is_some_and(|s| s >= 8)
        }),
        "rank 1 never got to step 8: {:#?}",
        records(state, job)
    );
    let trainer = trainer.unwrap() as i32;
    // Its whole group (the trainer is its group's leader).
    kill(Pid::from_raw(-trainer), Signal::SIGSTOP).unwrap();
    let stopped_at = Instant::now();
    let stopped_step = step_of(state, job, 1, 0).unwrap();
    assert!(wait_for(Duration::from_secs(2), || {
        std::fs::read_to_string(format!("/proc/{trainer}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('T')
        })
    }));
    // Left stopped: resilio must end it itself, within the stall timeout,
    // the diagnostics and the grace (2 s + 3 s), with some slack.
    assert!(
        wait_for(Duration::from_secs(20), || !pid_alive(trainer)),
        "the stopped trainer {trainer} was left alive"
    );
    let ended_after = stopped_at.elapsed();
    let (out, took) = wait_output(child, Duration::from_secs(90));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}\n{stdout}", stderr_of(&out));
    let recs = records(state, job);
    // The journal: a stall of rank 1, judged a hang of rank 1 (the other
    // rank only waited for it), one restart in place, a whole attempt 1.
    assert!(
        kinds(&recs, "stall")
            .iter()
            .any(|s| s.rank == Some(1) && s.attempt == 0),
        "{recs:#?}"
    );
    let h = one(&recs, "hang");
    assert_eq!(
        h.get("verdict").unwrap()["blamed_ranks"],
        serde_json::json!([1]),
        "{h:?}"
    );
    let j = one(&recs, "judgment");
    assert_eq!(
        (j.str("class"), j.u64("primary_rank")),
        (Some("hang"), Some(1)),
        "{j:?}"
    );
    let restart = one(&recs, "restart");
    assert_eq!(restart.get("in_place"), Some(&serde_json::json!(true)));
    let exit0 = kinds(&recs, "rank_exit")
        .into_iter()
        .find(|r| r.attempt == 0 && r.rank == Some(1))
        .expect("rank 1's exit in attempt 0");
    // Stopped as it was: SIGCONT after the SIGTERM let it act on the
    // SIGTERM at once (a stopped process keeps it pending), not at the
    // SIGKILL after the grace.
    assert_eq!(
        exit0.str("status"),
        Some("signal 15 (SIGTERM)"),
        "{exit0:?}"
    );
    assert!(
        ended_after < Duration::from_millis(4500),
        "ended {ended_after:?} after SIGSTOP: the grace was waited out"
    );
    assert!(
        !kinds(&recs, "stop")
            .iter()
            .any(|s| s.str("signal") == Some("SIGKILL")),
        "{recs:#?}"
    );
    // Its probe saw it stopped: not waiting on a peer, whatever system
    // call it was stopped in.
    let probed = kinds(&recs, "probe")
        .into_iter()
        .filter(|p| p.rank == Some(1) && p.attempt == 0)
        .map(|p| p.get("probe").unwrap()["evidence"].to_string())
        .collect::<Vec<_>>();
    assert!(
        !probed.is_empty() && probed.iter().all(|e| e.contains("stopped (SIGSTOP")),
        "{probed:?}"
    );
    for r in kinds(&recs, "rank_exit").iter().filter(|r| r.attempt == 1) {
        assert_eq!(
            (r.u64("exit_code"), r.u64("last_step")),
            (Some(0), Some(30)),
            "{r:?}"
        );
    }
    // The trainer's own record: two attempts, the second resumed from the
    // last checkpoint before the stop (steps kept), and it saved the end.
    let (attempts, resumed) = trainer_story(&stdout);
    assert_eq!(attempts, vec![0, 1], "{stdout}");
    let kept = stopped_step / 5 * 5;
    assert_eq!(resumed.len(), 2, "both ranks resumed: {stdout}");
    for r in &resumed {
        // The stop may land just after the progress record of a checkpoint step.
        assert!(
            *r == kept || *r == kept + 5,
            "resumed from #{r}, stopped at step {stopped_step}: {stdout}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(ck.join("latest")).unwrap().trim(),
        "30"
    );
    mark.assert_none_left(Duration::from_secs(10));
    println!(
        "stopped at step {stopped_step}; trainer ended {ended_after:?} after SIGSTOP; \
         run took {took:?} ({:?} in all); resumed from {resumed:?}",
        started.elapsed()
    );
}

/// libfaketime, multi-threaded build first (resilio runs tokio's threads);
/// Debian's `faketime` package (tests/run.sh installs it).
fn libfaketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// Every line of every journal file is a whole JSON record with a time.
fn assert_journal_whole(state: &Path, job: &str) {
    let dir = resilio::journal::job_dir(state, job);
    let j = resilio::journal::read_job(&dir).unwrap();
    assert_eq!(j.bad_lines, 0, "{:?}", j.skipped);
    for f in &j.files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            text.ends_with('\n'),
            "{} ends in a partial line",
            f.display()
        );
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: {e}: {line}", f.display()));
            assert!(v["ts"].is_string() && v["kind"].is_string(), "{line}");
        }
    }
}

/// Case 4: the wall clock steps (an NTP step: +1 h, or -10 min) under
/// resilio while two ranks train. libfaketime is preloaded into resilio
/// (the launcher with its coordinator, and the agents), not into the
/// trainers (`env -u LD_PRELOAD`); its offset is read from a file on every
/// call, rewritten mid-run. CLOCK_MONOTONIC stays real
/// (`FAKETIME_DONT_FAKE_MONOTONIC=1`), as it does on Linux when the wall
/// clock is stepped. Nothing may take the step for a stall, a hang or a
/// straggler; the run completes; every record is whole; and the report
/// counts neither an hour of work nor an hour lost (nor a negative span).
#[test]
fn a_wall_clock_step_under_resilio_is_no_stall_and_costs_no_time_in_the_report() {
    let Some(lib) = libfaketime() else {
        println!("skipped: libfaketime not found (Debian package faketime)");
        return;
    };
    for (job, offset) in [("clockfwd", "+3600"), ("clockback", "-600")] {
        let tmp = tempfile::tempdir().unwrap();
        let mark = Marker::new(job);
        let (state, ck) = (tmp.path(), tmp.path().join("ck"));
        let clock = tmp.path().join("faketime");
        std::fs::write(&clock, "+0\n").unwrap();
        // Short limits, so that time taken from the wall clock would show:
        // a 2 s stall timeout, straggler windows of 1 s.
        let cfg = write_config(
            state,
            "[journal]\nprogress_interval = \"0s\"\n\
             [coordinator]\nreport_interval = \"200ms\"\n\
             [straggler]\nwindow = \"1s\"\nwindows = 2\ncheckpoint = false\n",
        );
        let mut c = resilio_run(state, job);
        c.args([
            "--ntasks",
            "2",
            "--max-restarts",
            "0",
            "--stall-timeout",
            "2s",
        ])
        .arg("--config")
        .arg(&cfg)
        .args(["--", "env", "-u", "LD_PRELOAD", "python3"])
        .arg(lockstep())
        .args(lockstep_args(60, &ck))
        .env("LD_PRELOAD", &lib)
        .env("FAKETIME_TIMESTAMP_FILE", &clock)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .current_dir(state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        mark.on(&mut c);
        let started = Instant::now();
        let child = c.spawn().unwrap();
        assert!(
            wait_for(Duration::from_secs(30), || step_of(state, job, 0, 0)
                .is_some_and(|s| s >= 20)),
            "{job}: rank 0 never got to step 20"
        );
        std::fs::write(&clock, format!("{offset}\n")).unwrap();
        // The step is real to a process under libfaketime...
        let faked = Command::new("date")
            .arg("+%s")
            .env("LD_PRELOAD", &lib)
            .env("FAKETIME_TIMESTAMP_FILE", &clock)
            .env("FAKETIME_NO_CACHE", "1")
            .output()
            .unwrap();
        let faked: i64 = String::from_utf8_lossy(&faked.stdout)
            .trim()
            .parse()
            .unwrap();
        let real = chrono::Utc::now().timestamp();
        let want: i64 = offset.parse().unwrap();
        assert!(
            (faked - real - want).abs() <= 2,
            "{job}: date says {faked}, now is {real}"
        );
        // ...and resilio (launcher and agents) runs under it, the trainers not.
        let (mut ours, mut trainers) = (0, 0);
        for p in mark.live() {
            let maps = std::fs::read_to_string(format!("/proc/{p}/maps")).unwrap_or_default();
            let exe = std::fs::read_link(format!("/proc/{p}/exe")).unwrap_or_default();
            if exe.file_name().is_some_and(|n| n == "resilio") {
                assert!(
                    maps.contains("libfaketime"),
                    "{job}: resilio {p} without libfaketime"
                );
                ours += 1;
            } else if exe.to_string_lossy().contains("python") {
                assert!(
                    !maps.contains("libfaketime"),
                    "{job}: trainer {p} under libfaketime"
                );
                trainers += 1;
            }
        }
        assert_eq!(
            (ours, trainers),
            (3, 2),
            "{job}: launcher, 2 agents, 2 trainers"
        );
        let (out, _) = wait_output(child, Duration::from_secs(60));
        let took = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{job}: {}", stderr_of(&out));
        let recs = records(state, job);
        // No stall, hang, straggler or failure taken from it.
        for kind in ["stall", "hang", "judgment", "failure", "restart", "resumed"] {
            assert!(kinds(&recs, kind).is_empty(), "{job}: {kind}: {recs:#?}");
        }
        assert!(
            !kinds(&recs, "straggler")
                .iter()
                .any(|r| r.get("flagged") == Some(&serde_json::json!(true))),
            "{job}: {:#?}",
            kinds(&recs, "straggler")
        );
        for r in kinds(&recs, "rank_exit") {
            assert_eq!(
                (r.u64("exit_code"), r.u64("last_step")),
                (Some(0), Some(60)),
                "{job}: {r:?}"
            );
        }
        assert_journal_whole(state, job);
        // The trainer's own record: one attempt, nothing resumed, the end saved.
        let (attempts, resumed) = trainer_story(&stdout);
        assert_eq!((attempts, resumed), (vec![0], vec![]), "{job}: {stdout}");
        assert_eq!(
            std::fs::read_to_string(ck.join("latest")).unwrap().trim(),
            "60"
        );
        // The report: the wall time is the run's, and mostly productive.
        let rep = report_json(state, job);
        let wall = rep["wall_s"].as_f64().unwrap();
        let productive = rep["productive_s"].as_f64().unwrap();
        assert!(
            wall > 3.0 && wall <= took.as_secs_f64() + 1.0,
            "{job}: wall {wall} s for a run of {took:?}: {rep:#}"
        );
        assert!(productive > 0.5 * wall, "{job}: {rep:#}");
        for (bucket, s) in rep["lost_s"].as_object().unwrap() {
            let s = s.as_f64().unwrap();
            assert!((0.0..5.0).contains(&s), "{job}: {bucket} {s} s: {rep:#}");
        }
        mark.assert_none_left(Duration::from_secs(10));
        println!(
            "{job} ({offset} s): run {took:?}; report: wall {wall:.1} s, productive {productive:.1} s"
        );
    }
}
