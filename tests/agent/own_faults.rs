//! Faults of resilio's own parts in local mode (`resilio run --ntasks N`):
//! an agent killed with SIGKILL is its rank's failure (never a stop from
//! outside), the run restarts in place, and nothing the dead agent's
//! trainer started outlives it.

use crate::common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// `resilio run --ntasks 2` of the lockstep trainer, each trainer first
/// starting a `sleep 1000` of its own (its pid written to
/// `DIR/sleep-RANK-ATTEMPT`).
fn with_sleeping_child(state: &Path, job: &str, dir: &Path) -> Command {
    let mut c = resilio_run(state, job);
    let script = format!(
        "sleep 1000 & echo $! > {dir}/sleep-${{RANK:-0}}-$RESILIO_ATTEMPT; exec python3 {trainer} \
         --total 30 --step-time 0.1 --ckpt-every 5 --ckpt-dir {dir}/ck",
        dir = dir.display(),
        trainer = lockstep().display(),
    );
    c.args(["--ntasks", "2", "--max-restarts", "3", "--kill-grace", "3s"])
        .args(["--", "sh", "-c", &script])
        .current_dir(dir);
    c
}

fn sleep_pid(dir: &Path, rank: u32, attempt: u32) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("sleep-{rank}-{attempt}")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Kills every recorded `sleep` when the test ends, passed or not.
struct Sleepers<'a>(&'a Path);

impl Drop for Sleepers<'_> {
    fn drop(&mut self) {
        for rank in 0..2 {
            for attempt in 0..4 {
                if let Some(p) = sleep_pid(self.0, rank, attempt) {
                    let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                }
            }
        }
    }
}

#[test]
fn a_killed_agent_is_its_ranks_failure_the_run_restarts_in_place_and_leaves_no_process() {
    let tmp = tempfile::tempdir().unwrap();
    let _cleanup = Sleepers(tmp.path());
    let child = with_sleeping_child(tmp.path(), "agentdies", tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Rank 1 trains, then its agent is killed with SIGKILL.
    let mut agent = None;
    assert!(wait_for(Duration::from_secs(30), || {
        let recs = records(tmp.path(), "agentdies");
        let training = recs
            .iter()
            .any(|r| r.kind == "progress" && r.rank == Some(1) && r.attempt == 0);
        agent = kinds(&recs, "launch")
            .first()
            .and_then(|l| l.get("agent_pids")?.as_array()?.get(1)?.as_i64());
        training && agent.is_some() && sleep_pid(tmp.path(), 1, 0).is_some()
    }));
    let sleeper = sleep_pid(tmp.path(), 1, 0).unwrap();
    assert!(pid_alive(sleeper));
    kill(Pid::from_raw(agent.unwrap() as i32), Signal::SIGKILL).unwrap();
    // The dead agent's trainer's own child does not outlive it.
    assert!(
        wait_for(Duration::from_secs(15), || !pid_alive(sleeper)),
        "sleep {sleeper} outlived its rank's agent"
    );
    let (out, _) = wait_output(child, Duration::from_secs(90));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "agentdies");
    let j = one(&recs, "judgment");
    assert_eq!(
        (j.str("class"), j.u64("primary_rank")),
        (Some("infrastructure"), Some(1)),
        "{j:?}"
    );
    assert!(
        j.str("evidence")
            .is_some_and(|e| e.contains("the agent of rank 1 died (signal 9)")),
        "{j:?}"
    );
    let secondary = j.get("secondary").unwrap().to_string();
    assert!(
        secondary.contains("rank 0") && secondary.contains("secondary"),
        "{j:?}"
    );
    // The launcher tore the attempt down for the agent's death.
    assert_eq!(
        kinds(&recs, "teardown")
            .first()
            .and_then(|t| t.str("reason")),
        Some("the agent of rank 1 died (SIGKILL)")
    );
    let failure = one(&recs, "failure");
    assert_eq!(failure.str("failure_kind"), Some("agent_died"));
    let restart = one(&recs, "restart");
    assert_eq!(restart.get("in_place"), Some(&serde_json::json!(true)));
    for r in kinds(&recs, "rank_exit").iter().filter(|r| r.attempt == 1) {
        assert_eq!(r.u64("last_step"), Some(30), "{r:?}");
    }
    // The report counts the failed attempt.
    let report = Command::new(bin())
        .args(["report", "agentdies"])
        .env("RESILIO_STATE_DIR", tmp.path())
        .env("RESILIO_SYSTEM_CONFIG", "")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(text.contains("(1 failed;"), "{text}");
    // Every sleep of every attempt is gone.
    for rank in 0..2 {
        for attempt in 0..2 {
            if let Some(p) = sleep_pid(tmp.path(), rank, attempt) {
                assert!(
                    wait_for(Duration::from_secs(10), || !pid_alive(p)),
                    "sleep of rank {rank} attempt {attempt} left running"
                );
            }
        }
    }
}

/// Kills the given agents when the test ends, passed or not (their
/// trainers die with them).
struct Agents(Vec<i32>);

impl Drop for Agents {
    fn drop(&mut self) {
        for p in &self.0 {
            if pid_alive(*p) {
                let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
            }
        }
    }
}

#[test]
fn a_killed_launcher_leaves_the_ranks_training_and_the_journal_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let mut launcher = run_local(
        tmp.path(),
        "nolauncher",
        2,
        &[],
        &[
            "--total",
            "40",
            "--step-time",
            "0.1",
            "--ckpt-every",
            "10",
            "--ckpt-dir",
            ck.to_str().unwrap(),
        ],
    )
    .current_dir(tmp.path())
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut pids: Vec<i32> = Vec::new();
    assert!(wait_for(Duration::from_secs(30), || {
        let recs = records(tmp.path(), "nolauncher");
        pids = kinds(&recs, "launch")
            .first()
            .and_then(|l| l.get("agent_pids")?.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.as_i64().map(|p| p as i32))
            .collect();
        let training = |rank| {
            recs.iter()
                .any(|r| r.kind == "progress" && r.rank == Some(rank))
        };
        pids.len() == 2 && training(0) && training(1)
    }));
    let agents = Agents(pids);
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    // The ranks train on to the end, on their own.
    assert!(
        wait_for(Duration::from_secs(60), || agents
            .0
            .iter()
            .all(|p| !pid_alive(*p))),
        "the agents never ended"
    );
    let recs = records(tmp.path(), "nolauncher");
    let exits = kinds(&recs, "rank_exit");
    assert_eq!(exits.len(), 2, "{recs:#?}");
    for e in exits {
        assert_eq!(
            (e.u64("exit_code"), e.u64("last_step")),
            (Some(0), Some(40)),
            "{e:?}"
        );
    }
    let mut lost: Vec<u32> = kinds(&recs, "launcher_lost")
        .iter()
        .filter_map(|r| r.rank)
        .collect();
    lost.sort();
    assert_eq!(lost, [0, 1]);
    let end = one(&recs, "job_end");
    assert_eq!((end.rank, end.u64("exit_code")), (Some(0), Some(0)));
    assert!(kinds(&recs, "restart").is_empty());
    // The dead coordinator's files are not taken for a live one.
    let dir = resilio::journal::job_dir(tmp.path(), "nolauncher");
    assert!(dir.join(resilio::coordinator::INFO_FILE).exists());
    assert_eq!(resilio::coordinator::discover_files(&dir), None);
}
