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
            "3s",
            "--kill-grace",
            "5s",
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
    // the diagnostics and the grace (3 s + 5 s), with some slack.
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
        ended_after < Duration::from_millis(6500),
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
        // a 3 s stall timeout, straggler windows of 1 s.
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
            "3s",
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

/// `ip ARGS`, its failure as text.
fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// A network namespace joined to this one by a veth pair: the host side
/// `ADDR.1/30`, the namespace side `ADDR.2/30`. Deleted when dropped (the
/// pair goes with its host side), passed or not.
struct Netns {
    name: String,
    host_if: String,
    host_addr: String,
}

impl Netns {
    fn create(tag: u32) -> Result<Netns, String> {
        let id = std::process::id();
        // 10.213.X.(4k)/30, X and k from the pid and the tag: unique per
        // test and run, within a private range.
        let (x, k) = ((id >> 5) % 256, (id % 32) * 2 + tag % 2);
        let n = Netns {
            name: format!("rchaos{id}-{tag}"),
            host_if: format!("rc{id}{tag}h"),
            host_addr: format!("10.213.{x}.{}", 4 * k + 1),
        };
        let ns_if = format!("rc{id}{tag}n");
        let ns_addr = format!("10.213.{x}.{}/30", 4 * k + 2);
        ip(&["netns", "add", &n.name])?;
        ip(&[
            "link", "add", &n.host_if, "type", "veth", "peer", "name", &ns_if, "netns", &n.name,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", n.host_addr),
            "dev",
            &n.host_if,
        ])?;
        ip(&["link", "set", &n.host_if, "up"])?;
        for args in [
            vec!["addr", "add", ns_addr.as_str(), "dev", ns_if.as_str()],
            vec!["link", "set", ns_if.as_str(), "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut all = vec!["netns", "exec", n.name.as_str(), "ip"];
            all.extend(args);
            ip(&all)?;
        }
        Ok(n)
    }

    /// The link down (`false`) or up again (`true`), from the host side:
    /// both ends stay, packets between them go nowhere.
    fn link(&self, up: bool) {
        ip(&["link", "set", &self.host_if, if up { "up" } else { "down" }]).unwrap();
    }

    /// `cmd` run inside the namespace (its environment kept).
    fn exec(&self, cmd: &Command) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// A standalone coordinator (`resilio __coordinator`) bound to `bind`; its
/// URL and token.
fn standalone_coordinator(
    state: &Path,
    job: &str,
    world: u32,
    bind: &str,
    cfg: &Path,
    mark: &Marker,
) -> (std::process::Child, String, String) {
    use std::io::Read;
    let mut c = Command::new(bin());
    c.args(["__coordinator", "--job-id", job, "--world-size"])
        .arg(world.to_string())
        .args(["--bind", bind, "--config"])
        .arg(cfg)
        .arg("--state-dir")
        .arg(state)
        .env("RESILIO_SYSTEM_CONFIG", "/nonexistent")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = mark.on(&mut c).spawn().unwrap();
    let mut so = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") && so.read(&mut byte).unwrap_or(0) == 1 {
        line.push(byte[0]);
    }
    let url = String::from_utf8_lossy(&line).trim().to_string();
    let token = resilio::coordinator::discover_files(&resilio::journal::job_dir(state, job))
        .map(|(_, t)| t)
        .expect("coordinator.token");
    (child, url, token)
}

/// Case 2: a node partitioned from the coordinator. A standalone
/// coordinator listens on the host side of a veth pair; rank 0's agent runs
/// on the host, rank 1's inside a network namespace behind the pair; each
/// trains on its own (the fake trainer needs no peer). Mid-run the link
/// goes down while every process lives. docs/coordinator.md: the cut-off
/// agent fails open (keeps supervising and training, journals
/// `coordinator_unreachable`, and `coordinator_reachable` with the gap once
/// it is back); the coordinator journals `rank_lost` for the rank it no
/// longer hears after `lost_after`, and `rank_heard_again` when it does.
/// Once with the link restored mid-run, once left cut to the end.
#[test]
fn a_rank_cut_off_from_the_coordinator_trains_on_is_marked_lost_and_is_picked_up_again() {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: network namespaces need root");
        return;
    }
    for (tag, restore) in [(0u32, true), (1, false)] {
        let job = if restore {
            "cut-restored"
        } else {
            "cut-for-good"
        };
        let tmp = tempfile::tempdir().unwrap();
        let mark = Marker::new(job);
        let net = match Netns::create(tag) {
            Ok(n) => n,
            Err(e) => {
                println!("skipped: cannot make a network namespace here ({e})");
                return;
            }
        };
        let state = tmp.path();
        let cfg = write_config(
            state,
            "[journal]\nprogress_interval = \"0s\"\n\
             [coordinator]\nreport_interval = \"200ms\"\nlost_after = \"2s\"\n",
        );
        let (mut coord, url, token) =
            standalone_coordinator(state, job, 2, &format!("{}:0", net.host_addr), &cfg, &mark);
        assert!(url.contains(&net.host_addr), "{url}");
        let steps = "150";
        let agent = |rank: u32| {
            let mut c = run_trainer(
                state,
                job,
                &["--config", cfg.to_str().unwrap()],
                &["--steps", steps, "--interval", "0.1"],
            );
            c.env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("RESILIO_COORDINATOR", &url)
                .env("RESILIO_COORDINATOR_TOKEN", &token);
            mark.on(&mut c);
            c
        };
        let spawn = |mut c: Command| {
            c.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let started = Instant::now();
        let host_rank = spawn(agent(0));
        let cut_rank = spawn(net.exec(&agent(1)));
        let coord_recs = |kind: &str| -> Vec<u32> {
            records(state, job)
                .iter()
                .filter(|r| r.kind == kind && r.rank.is_none())
                .filter_map(|r| r.u64("about_rank").map(|r| r as u32))
                .collect()
        };
        let rank_recs = |kind: &str, rank: u32| {
            records(state, job)
                .iter()
                .filter(|r| r.kind == kind && r.rank == Some(rank))
                .count()
        };
        // Both ranks train and report across the link.
        let running = || {
            let st = Command::new(bin())
                .args(["status", "--json", "--state-dir"])
                .arg(state)
                .arg(job)
                .env("RESILIO_SYSTEM_CONFIG", "/nonexistent")
                .output()
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap_or_default();
            v["ranks"].as_array().map_or(0, |r| {
                r.iter()
                    .filter(|r| r["step"].as_u64().unwrap_or(0) >= 5)
                    .count()
            })
        };
        assert!(
            wait_for(Duration::from_secs(30), || running() == 2),
            "{job}: both ranks never reported: {:#?}",
            records(state, job)
        );
        // The cut.
        net.link(false);
        let cut_at = Instant::now();
        let cut_step = step_of(state, job, 1, 0).unwrap();
        assert!(
            wait_for(Duration::from_secs(20), || coord_recs("rank_lost") == [1]
                && rank_recs("coordinator_unreachable", 1) == 1),
            "{job}: {:#?}",
            records(state, job)
        );
        let lost_after = cut_at.elapsed();
        // Rank 1 trains on, cut off.
        let on = step_of(state, job, 1, 0).unwrap();
        assert!(
            wait_for(Duration::from_secs(10), || step_of(state, job, 1, 0)
                .is_some_and(|s| s >= on + 10)),
            "{job}: rank 1 stopped training when cut off"
        );
        let mut back_after = None;
        let mut outage = Duration::ZERO;
        if restore {
            net.link(true);
            let up_at = Instant::now();
            outage = up_at - cut_at;
            assert!(
                wait_for(Duration::from_secs(40), || coord_recs("rank_heard_again")
                    == [1]
                    && rank_recs("coordinator_reachable", 1) == 1),
                "{job}: rank 1 was not picked up again: {:#?}",
                records(state, job)
            );
            back_after = Some(up_at.elapsed());
        }
        let outs: Vec<_> = [host_rank, cut_rank]
            .into_iter()
            .map(|c| wait_output(c, Duration::from_secs(60)).0)
            .collect();
        let took = started.elapsed();
        for (r, o) in outs.iter().enumerate() {
            assert_eq!(o.status.code(), Some(0), "{job} rank {r}: {}", stderr_of(o));
        }
        assert!(
            stderr_of(&outs[1]).contains("coordinator unreachable"),
            "{}",
            stderr_of(&outs[1])
        );
        let _ = kill(Pid::from_raw(coord.id() as i32), Signal::SIGTERM);
        let _ = wait_output_of(&mut coord);
        let recs = records(state, job);
        // The trainers' own record: every step, on both ranks.
        for r in kinds(&recs, "rank_exit") {
            assert_eq!(
                (r.u64("exit_code"), r.u64("last_step")),
                (Some(0), Some(150)),
                "{job}: {r:?}"
            );
        }
        assert_eq!(kinds(&recs, "rank_exit").len(), 2);
        // The journal: only rank 1 was lost, and said so once; nothing
        // was taken for a stall or a failure.
        assert_eq!(coord_recs("rank_lost"), [1], "{job}");
        let lost = kinds(&recs, "rank_lost")[0];
        assert!(lost.f64("silent_s").unwrap() >= 2.0, "{lost:?}");
        assert_eq!(rank_recs("coordinator_unreachable", 0), 0, "{job}");
        for kind in ["stall", "failure", "hang"] {
            assert!(kinds(&recs, kind).is_empty(), "{job}: {kind}: {recs:#?}");
        }
        if restore {
            // Both sides measure the whole silence: from the last report
            // that got through (at most a report interval before the cut).
            let outage = outage.as_secs_f64() - 0.5;
            assert_eq!(coord_recs("rank_heard_again"), [1]);
            let heard = kinds(&recs, "rank_heard_again")[0];
            let silent = heard.f64("silent_s").unwrap();
            assert!(
                silent >= outage && silent < 60.0,
                "{heard:?}, cut {outage} s"
            );
            let back = kinds(&recs, "coordinator_reachable")[0];
            let gap = back.f64("gap_s").unwrap();
            assert!(gap >= outage && gap < 60.0, "{back:?}, cut {outage} s");
            assert!(back.u64("failed_requests").unwrap() >= 1, "{back:?}");
        } else {
            assert!(coord_recs("rank_heard_again").is_empty(), "{job}");
            assert_eq!(rank_recs("coordinator_reachable", 1), 0, "{job}");
        }
        drop(net);
        mark.assert_none_left(Duration::from_secs(10));
        println!(
            "{job}: cut at step {cut_step}; lost and unreachable {lost_after:?} after the cut \
             ({:?}); picked up again {back_after:?} after the link came back; run took {took:?}",
            kinds(&recs, "coordinator_unreachable")[0].str("error")
        );
    }
}

/// Wait for a child that was told to end (bounded; SIGKILL after 10 s).
fn wait_output_of(c: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            let _ = c.kill();
            return c.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A tmpfs mounted for a case, unmounted (lazily) when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755")])
            .arg("tmpfs")
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
        }
        Ok(Tmpfs(at.to_path_buf()))
    }

    /// Fill it up (a file of zeros until ENOSPC); the file's path.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 4096];
        while f.write(&block).is_ok_and(|n| n > 0) {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// `GET PATH` with the token, by hand; the status code and the body.
fn http_get(url: &str, path: &str, token: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text))
}

/// The coordinator an agent of the case was given (its environment).
fn coordinator_given(mark: &Marker) -> Option<(String, String)> {
    mark.live().into_iter().find_map(|p| {
        let env = std::fs::read(format!("/proc/{p}/environ")).ok()?;
        let var = |k: &str| {
            env.split(|b| *b == 0).find_map(|kv| {
                let kv = std::str::from_utf8(kv).ok()?;
                kv.strip_prefix(k)?.strip_prefix('=').map(str::to_string)
            })
        };
        Some((
            var("RESILIO_COORDINATOR")?,
            var("RESILIO_COORDINATOR_TOKEN")?,
        ))
    })
}

/// Case 3, the local-mode variant of the full disk: the journals of the
/// launcher, the coordinator and both ranks on a tmpfs that is full before
/// the run starts, a rank killed mid-run (a restart in place, judged with
/// no journal to read), and room again only later. Training must not
/// notice: the coordinator serves although its discovery files cannot be
/// written (it used not to start: "ranks supervise alone"), the run
/// restarts and completes, and once there is room each journal says what
/// it lost (`journal_gap`).
#[test]
fn a_full_disk_under_every_journal_of_a_local_run_costs_no_training() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = match Tmpfs::mount(&tmp.path().join("mnt"), "1m") {
        Ok(fs) => fs,
        Err(e) => {
            println!("skipped: cannot mount a tmpfs here ({e})");
            return;
        }
    };
    let mark = Marker::new("fulldisk");
    let (state, job) = (fs.0.join("state"), "fulldisk");
    std::fs::create_dir_all(&state).unwrap();
    let filler = fs.fill();
    // The trainer's own checkpoints are on another disk: only resilio's is full.
    let ck = tmp.path().join("ck");
    let mut args = lockstep_args(30, &ck);
    args.extend(["--fault", "kill", "--fault-rank", "1", "--fault-step", "10"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = run_local(
        &state,
        job,
        2,
        &["--max-restarts", "1", "--kill-grace", "3s"],
        &args,
    );
    mark.on(&mut c)
        .current_dir(tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let child = c.spawn().unwrap();
    // The coordinator serves both ranks, full disk or not.
    let mut given = None;
    assert!(
        wait_for(Duration::from_secs(30), || {
            given = given.clone().or_else(|| coordinator_given(&mark));
            given.as_ref().is_some_and(|(url, token)| {
                http_get(url, "/v1/status", token).is_some_and(|(code, body)| {
                    code == 200 && body.matches("\"state\":\"running\"").count() == 2
                })
            })
        }),
        "no coordinator served the ranks"
    );
    // Room again once attempt 1 has saved past the failure (its step 10).
    let saved = || {
        std::fs::read_to_string(ck.join("latest"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    assert!(
        wait_for(Duration::from_secs(60), || saved().is_some_and(|s| s >= 10)),
        "attempt 1 never got past step 10"
    );
    std::fs::remove_file(&filler).unwrap();
    let (out, _) = wait_output(child, Duration::from_secs(60));
    let took = started.elapsed();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr_of(&out),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // The trainer's own record: a restart, resumed from its checkpoint, the end saved.
    let (attempts, resumed) = trainer_story(&stdout);
    assert_eq!((attempts, resumed), (vec![0, 1], vec![5, 5]), "{stdout}");
    assert_eq!(saved(), Some(30));
    // resilio said what it could not write, and that the coordinator served.
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(
        stderr.contains("it serves the ranks all the same"),
        "{stderr}"
    );
    assert!(!stderr.contains("ranks supervise alone"), "{stderr}");
    // The journal: what was written once there was room, each writer's gap
    // first, then attempt 1's end on both ranks and the job's.
    let recs = records(&state, job);
    let gaps = kinds(&recs, "journal_gap");
    assert!(!gaps.is_empty(), "{recs:#?}");
    for g in &gaps {
        assert!(g.u64("lost_records").unwrap() > 0, "{g:?}");
    }
    for rank in 0..2 {
        let exit = kinds(&recs, "rank_exit")
            .into_iter()
            .find(|r| r.attempt == 1 && r.rank == Some(rank))
            .unwrap_or_else(|| panic!("rank {rank}'s end: {recs:#?}"));
        assert_eq!(
            (exit.u64("exit_code"), exit.u64("last_step")),
            (Some(0), Some(30)),
            "{exit:?}"
        );
    }
    let end = one(&recs, "job_end");
    assert_eq!(end.u64("exit_code"), Some(0), "{end:?}");
    assert_journal_whole(&state, job);
    mark.assert_none_left(Duration::from_secs(10));
    println!(
        "{} journal gap(s), {} records lost; run took {took:?}",
        gaps.len(),
        gaps.iter()
            .filter_map(|g| g.u64("lost_records"))
            .sum::<u64>()
    );
}
