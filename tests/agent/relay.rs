//! The node relay (`[coordinator] node_relay`): real agents of a local
//! job, rank 0's relaying for the node, real HTTP on loopback, and a relay
//! frozen mid-run (SIGSTOP) to show that the ranks fail open.

use crate::common::*;
use crate::coordinator::{coordinator_of, http};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// A `/metrics` counter of the live coordinator of `job`.
fn counter(state: &Path, job: &str, name: &str) -> Option<f64> {
    let (url, token) = coordinator_of(state, job)?;
    let (code, text) = http(&url, "GET", "/metrics", Some(&token), "");
    (code == 200).then_some(())?;
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn relay_run(tmp: &Path, job: &str, opts: &[&str], args: &[&str]) -> std::process::Command {
    let cfg = write_config(tmp, "[coordinator]\nnode_relay = \"on\"\n");
    let mut all = vec!["--config", cfg.to_str().unwrap()];
    all.extend_from_slice(opts);
    let mut c = run_local(tmp, job, 4, &all, args);
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn a_relayed_node_is_heard_in_batches_and_the_hang_is_still_blamed_on_the_hung_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path();
    let ck = state.join("ck");
    let mut cmd = relay_run(
        state,
        "relayhang",
        &[
            "--kill-grace",
            "3s",
            "--stall-timeout",
            "4s",
            "--max-restarts",
            "0",
        ],
        &[
            "--total",
            "60",
            "--step-time",
            "0.1",
            "--ckpt-dir",
            ck.to_str().unwrap(),
            "--fault",
            "hang",
            "--fault-rank",
            "1",
            "--fault-step",
            "25",
        ],
    );
    let child = cmd.spawn().unwrap();
    // The coordinator hears the ranks through the relay, in batches.
    let batched = wait_for(Duration::from_secs(30), || {
        counter(state, "relayhang", "resilio_relayed_ranks").is_some_and(|n| n >= 4.0)
            && counter(state, "relayhang", "resilio_ranks").is_some_and(|n| n == 4.0)
    });
    let out = child.wait_with_output().unwrap();
    assert!(
        batched,
        "no batch reached the coordinator: {}",
        stderr_of(&out)
    );
    let recs = records(state, "relayhang");
    let started = kinds(&recs, "relay_started");
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0].rank, Some(0));
    assert!(kinds(&recs, "relay_bypassed").is_empty());
    // The probes went out through the relay and came back: the hung rank,
    // not the ranks waiting for it, is blamed.
    let h = one(&recs, "hang");
    assert_eq!(
        h.get("verdict").unwrap()["blamed_ranks"],
        serde_json::json!([1]),
        "{h:?}"
    );
    let j = one(&recs, "judgment");
    assert_eq!(j.u64("primary_rank"), Some(1), "{j:?}");
    assert_ne!(out.status.code(), Some(0));
    // The relay took its announcement away.
    let dir = resilio::journal::job_dir(state, "relayhang");
    assert!(!dir
        .join(resilio::coordinator::relay::file_name(
            &started[0].node.clone().unwrap()
        ))
        .exists());
}

#[test]
fn ranks_whose_relay_stops_answering_report_straight_to_the_coordinator_and_train_on() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path();
    let ck = state.join("ck");
    let mut cmd = relay_run(
        state,
        "relaystop",
        &["--kill-grace", "3s", "--stall-timeout", "6s"],
        &[
            "--total",
            "160",
            "--step-time",
            "0.1",
            "--ckpt-dir",
            ck.to_str().unwrap(),
        ],
    );
    let child = cmd.spawn().unwrap();
    let dir = resilio::journal::job_dir(state, "relaystop");
    let announcement = || {
        std::fs::read_dir(&dir)
            .ok()?
            .filter_map(|e| e.ok())
            .find(|e| e.file_name().to_string_lossy().starts_with("relay-"))
            .and_then(|e| std::fs::read(e.path()).ok())
            .and_then(|b| {
                serde_json::from_slice::<resilio::coordinator::relay::Announcement>(&b).ok()
            })
    };
    assert!(wait_for(Duration::from_secs(30), || {
        announcement().is_some()
            && counter(state, "relaystop", "resilio_relayed_ranks").is_some_and(|n| n >= 4.0)
    }));
    // Freeze the agent that relays (rank 0's): its relay answers nobody.
    let pid = nix::unistd::Pid::from_raw(announcement().unwrap().pid as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_secs(5));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(state, "relaystop");
    let mut bypassed: Vec<u32> = kinds(&recs, "relay_bypassed")
        .iter()
        .filter_map(|r| r.rank)
        .collect();
    bypassed.sort();
    bypassed.dedup();
    // Rank 0's agent hosts the relay and was frozen with it: its own
    // request may time out as both resume, and it may say so.
    bypassed.retain(|r| *r != 0);
    let summary: Vec<String> = recs
        .iter()
        .map(|r| format!("{} {} {:?}", r.ts, r.kind, r.rank))
        .collect();
    assert_eq!(bypassed, [1, 2, 3], "{summary:#?}");
    // They were heard directly meanwhile: nothing was judged, nobody restarted.
    assert!(kinds(&recs, "judgment").is_empty(), "{recs:#?}");
    assert!(kinds(&recs, "restart").is_empty());
    for r in kinds(&recs, "rank_exit") {
        assert_eq!(r.u64("exit_code"), Some(0), "{r:?}");
        assert_eq!(r.u64("last_step"), Some(160), "{r:?}");
    }
}
