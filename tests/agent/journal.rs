use crate::common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::process::Stdio;
use std::time::Duration;

#[test]
fn kill_9_at_any_moment_leaves_only_whole_records() {
    let dir = tempfile::tempdir().unwrap();
    // Record every step (no sampling) so the kill lands among many writes.
    let cfg = write_config(dir.path(), "[journal]\nprogress_interval = \"0s\"\n");
    let mut delays_ms = 7u64;
    for round in 0..25 {
        let mut c = run_trainer(
            dir.path(),
            "crash",
            &["--config", cfg.to_str().unwrap()],
            &[
                "--steps",
                "100000",
                "--interval",
                "0.001",
                "--report",
                if round % 2 == 0 { "stdout" } else { "socket" },
            ],
        );
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = c.spawn().unwrap();
        // Kill at a varying moment once this round's agent has started writing.
        let starts = |d: &std::path::Path| kinds(&records(d, "crash"), "rank_start").len();
        assert!(
            wait_for(Duration::from_secs(20), || starts(dir.path()) > round),
            "round {round} never started"
        );
        std::thread::sleep(Duration::from_millis(delays_ms));
        delays_ms = (delays_ms * 7919 + 13) % 300; // vary the moment of the kill
        kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
        let _ = wait_output(child, Duration::from_secs(10));
    }
    let jdir = resilio::journal::job_dir(dir.path(), "crash");
    let mut lines = 0;
    for entry in std::fs::read_dir(&jdir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            let text = std::fs::read(&path).unwrap();
            assert!(
                text.is_empty() || text.ends_with(b"\n") || {
                    // Only the very last line may be torn by the last kill; a reader skips it.
                    let last = text.rsplit(|&b| b == b'\n').next().unwrap();
                    serde_json::from_slice::<serde_json::Value>(last).is_err()
                }
            );
            for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let v: serde_json::Value = serde_json::from_slice(line).unwrap_or_else(|e| {
                    panic!(
                        "torn record in {}: {e}: {:?}",
                        path.display(),
                        String::from_utf8_lossy(line)
                    )
                });
                assert!(v["kind"].is_string() && v["ts"].is_string() && v["v"] == 1);
                lines += 1;
            }
        }
    }
    assert!(lines > 25, "expected many records, got {lines}");
    let recs = records(dir.path(), "crash");
    assert!(kinds(&recs, "rank_start").len() >= 25);
    // The report still works on a journal of killed runs.
    let o = std::process::Command::new(bin())
        .args([
            "report",
            "--json",
            "crash",
            "--state-dir",
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
}

#[test]
fn unwritable_state_dir_fails_open() {
    let dir = tempfile::tempdir().unwrap();
    // A regular file where the state dir should be: not writable even by root.
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "x").unwrap();
    let mut c = run_trainer(
        &blocker,
        "ro",
        &["--stall-timeout", "1s"],
        &["--steps", "3", "--then", "hang"],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(
        o.status.code(),
        Some(124),
        "supervision goes on without a journal"
    );
    let err = stderr_of(&o);
    assert_eq!(err.matches("cannot write journal").count(), 1, "{err}");
    assert!(err.contains("supervision continues"), "{err}");

    let mut c = run_trainer(&blocker, "ro2", &[], &["--steps", "3", "--exit-code", "5"]);
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(
        o.status.code(),
        Some(5),
        "the exit code still comes through"
    );
}

#[test]
fn ranks_of_one_job_write_their_own_files_and_read_merged() {
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..3)
        .map(|rank| {
            let mut c = run_trainer(
                dir.path(),
                "multi",
                &[],
                &["--steps", "20", "--interval", "0.02"],
            );
            c.env("RANK", rank.to_string()).env("WORLD_SIZE", "3");
            c.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    for c in children {
        let (o, _) = wait_output(c, Duration::from_secs(30));
        assert_eq!(o.status.code(), Some(0));
    }
    let jdir = resilio::journal::job_dir(dir.path(), "multi");
    let mut files: Vec<String> = std::fs::read_dir(&jdir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    files.sort();
    assert_eq!(files, ["rank-0.jsonl", "rank-1.jsonl", "rank-2.jsonl"]);
    let recs = records(dir.path(), "multi");
    assert!(
        recs.windows(2).all(|w| w[0].ts <= w[1].ts),
        "merged in time order"
    );
    let mut ranks: Vec<u32> = kinds(&recs, "rank_exit")
        .iter()
        .filter_map(|r| r.rank)
        .collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2]);
    assert!(
        kinds(&recs, "job_start").is_empty(),
        "a multi-rank job's start is not one agent's to record"
    );
}
