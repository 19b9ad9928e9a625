//! A plain `resilio run -- COMMAND` outside Slurm is local mode with one
//! rank: restarts in place within `--max-restarts`, a coordinator that
//! `resilio status` and `resilio checkpoint` reach, "restart in place" (never
//! "requeue") in every record and report, and the original failure text
//! (never the digit-masked signature) wherever people read it.

use crate::common::*;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

fn timeline(state: &std::path::Path, job: &str) -> String {
    let o = Command::new(bin())
        .args(["timeline", job, "--state-dir", state.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// A trainer killed by SIGKILL in its first attempt (an infrastructure
/// failure: the OOM killer, a node) is restarted in place and completes.
#[test]
fn a_single_rank_killed_once_is_restarted_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("killed-once");
    let script = format!(
        "for i in 1 2 3; do echo \"step $i\"; sleep 0.05; done; \
         if [ ! -e {m} ]; then touch {m}; kill -9 $$; fi; \
         for i in 4 5 6; do echo \"step $i\"; sleep 0.05; done",
        m = marker.display()
    );
    let mut c = resilio_run(tmp.path(), "killed");
    c.args(["--max-restarts", "1", "--", "sh", "-c", &script]);
    let (o, _) = output_within(&mut c, Duration::from_secs(60));
    let err = stderr_of(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("resilio: restarting in place (attempt 1): infrastructure: killed by SIGKILL"),
        "{err}"
    );
    assert!(
        !err.contains("ranks"),
        "one rank is no 'all 1 ranks': {err}"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.matches("step 1\n").count(), 2, "{out}");
    assert!(out.ends_with("step 6\n"), "{out}");

    let recs = records(tmp.path(), "killed");
    assert_eq!(kinds(&recs, "rank_start").len(), 2);
    let restart = one(&recs, "restart");
    assert_eq!(
        restart.get("in_place").and_then(|v| v.as_bool()),
        Some(true)
    );
    let d = one(&recs, "decision");
    assert_eq!(d.get("decision").unwrap()["action"], "restart_in_place");
    assert!(kinds(&recs, "requeue").is_empty());
    let end = one(&recs, "job_end");
    assert_eq!(end.str("reason"), Some("completed"));

    let t = timeline(tmp.path(), "killed");
    assert!(t.contains("decision: restart in place"), "{t}");
    assert!(t.contains("RESTART in place as attempt 1"), "{t}");
    let report = Command::new(bin())
        .args([
            "report",
            "killed",
            "--state-dir",
            tmp.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&report.stdout).into_owned();
    assert!(
        report.contains("1 restart(s) without the queue)"),
        "{report}"
    );
    for text in [&t, &err, &report] {
        assert!(!text.to_lowercase().contains("requeue"), "{text}");
    }
}

/// The budget holds: `--max-restarts 0` is one attempt, and after the
/// restarts are spent resilio exits with the last attempt's status.
#[test]
fn the_restart_budget_holds_and_the_last_status_comes_through() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = resilio_run(tmp.path(), "zero");
    c.args([
        "--max-restarts",
        "0",
        "--",
        "sh",
        "-c",
        "echo step 1; kill -9 $$",
    ]);
    let (o, _) = output_within(&mut c, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(137));
    assert_eq!(
        stderr_of(&o),
        "",
        "a budget of 0 asks for no restart: nothing to say"
    );
    assert_eq!(kinds(&records(tmp.path(), "zero"), "rank_start").len(), 1);

    // Killed in every attempt, one step further each time (no crash loop):
    // two restarts, then the third attempt's status.
    let counter = tmp.path().join("n");
    let script = format!(
        "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}; \
         i=0; while [ $i -le $n ]; do echo \"step $i\"; i=$((i+1)); done; kill -9 $$",
        c = counter.display()
    );
    let mut c = resilio_run(tmp.path(), "spent");
    c.args(["--max-restarts", "2", "--", "sh", "-c", &script]);
    let (o, _) = output_within(&mut c, Duration::from_secs(60));
    let err = stderr_of(&o);
    assert_eq!(o.status.code(), Some(137), "{err}");
    assert!(
        err.contains("not restarting: restart budget exhausted"),
        "{err}"
    );
    let recs = records(tmp.path(), "spent");
    assert_eq!(kinds(&recs, "rank_start").len(), 3);
    assert_eq!(kinds(&recs, "restart").len(), 2);
}

/// Restarts that bring no progress stop the job, whatever their failures
/// look like: attempt 0 reaches step 10; then a kill at step 6, an
/// unexplained exception at step 7 and a kill at step 8 (none the same
/// failure at the same step, so no crash loop) make three restarts in a
/// row with no step beyond 10 and no checkpoint: exit 93, and the journal
/// says why. The same run saving a checkpoint in one of them goes on.
#[test]
fn restarts_that_bring_no_progress_stop_with_their_own_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    let script = |counter: &std::path::Path, save: bool| {
        format!(
            "n=$(cat {c} 2>/dev/null || echo 0); echo $((n+1)) > {c}; \
             steps() {{ i=1; while [ $i -le $1 ]; do echo \"step $i\"; i=$((i+1)); done; }}; \
             case $n in \
               0) steps 10; kill -9 $$ ;; \
               1) steps 6; kill -9 $$ ;; \
               2) steps 7; {save} echo 'RuntimeError: worker pool went away' >&2; exit 1 ;; \
               3) steps 8; kill -9 $$ ;; \
               *) steps 12; exit 0 ;; \
             esac",
            c = counter.display(),
            save = if save {
                "echo 'Saving model checkpoint to ckpt/checkpoint-7'; echo 'step 8';"
            } else {
                ""
            }
        )
    };
    let mut c = resilio_run(tmp.path(), "stuck");
    let s = script(&tmp.path().join("n"), false);
    c.args(["--max-restarts", "6", "--", "sh", "-c", &s]);
    let (o, _) = output_within(&mut c, Duration::from_secs(90));
    let err = stderr_of(&o);
    assert_eq!(o.status.code(), Some(93), "{err}");
    let why = "no progress: 3 restarts in a row brought no checkpoint and no step beyond step 10 (attempt 1: infrastructure, attempt 2: unknown, attempt 3: infrastructure)";
    assert!(err.contains(why), "{err}");
    let recs = records(tmp.path(), "stuck");
    assert_eq!(kinds(&recs, "rank_start").len(), 4);
    let last = kinds(&recs, "decision").last().cloned().unwrap();
    assert_eq!(last.fields()["decision"]["no_progress"], true, "{last:?}");
    assert_eq!(
        last.fields()["outcome"]["new_checkpoint"],
        false,
        "{last:?}"
    );
    let end = one(&recs, "job_end");
    assert!(end.str("reason").unwrap().contains(why), "{end:?}");
    assert_eq!(end.fields()["exit_code"], 93, "{end:?}");

    // A checkpoint saved in attempt 2 (confirmed by the step after it) is
    // progress: attempt 3 is the first restart without any since, and
    // attempt 4 finishes.
    let mut c = resilio_run(tmp.path(), "saved");
    let s = script(&tmp.path().join("m"), true);
    c.args(["--max-restarts", "6", "--", "sh", "-c", &s]);
    let (o, _) = output_within(&mut c, Duration::from_secs(90));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert_eq!(kinds(&records(tmp.path(), "saved"), "rank_start").len(), 5);
}

/// The failure signature masks digits to recognise the same failure again;
/// people read the original line, in stderr, the timeline and the report.
#[test]
fn people_read_the_original_failure_text_never_the_masked_signature() {
    let tmp = tempfile::tempdir().unwrap();
    let line = "RuntimeError: worker 3 lost 1234 batches";
    let script = format!(
        "echo step 1; echo step 2; echo 'Traceback (most recent call last):' >&2; echo '{line}' >&2; exit 1"
    );
    let mut c = resilio_run(tmp.path(), "masked");
    c.args(["--", "sh", "-c", &script]);
    let (o, _) = output_within(&mut c, Duration::from_secs(60));
    let err = stderr_of(&o);
    // An unexplained failure gets one restart; the same again is a crash loop.
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("restarting in place (attempt 1): unknown: {line}")),
        "{err}"
    );
    assert!(err.contains("crash loop") && err.contains(line), "{err}");
    let t = timeline(tmp.path(), "masked");
    assert!(t.contains(line), "{t}");
    let html = Command::new(bin())
        .args([
            "timeline",
            "masked",
            "--html",
            "-",
            "--state-dir",
            tmp.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let html = String::from_utf8_lossy(&html.stdout).into_owned();
    let report = Command::new(bin())
        .args([
            "report",
            "masked",
            "--state-dir",
            tmp.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&report.stdout).into_owned();
    for (what, text) in [
        ("stderr", &err),
        ("timeline", &t),
        ("html", &html),
        ("report", &report),
    ] {
        assert!(
            !text.contains("worker # lost #") && !text.contains("step #"),
            "masked text in the {what}: {text}"
        );
    }
}

/// `resilio status` and `resilio checkpoint` reach the coordinator of a
/// plain single-rank run.
#[test]
fn status_and_checkpoint_work_for_a_single_rank_run() {
    let tmp = tempfile::tempdir().unwrap();
    let ready = tmp.path().join("ready");
    let mut c = run_trainer(
        tmp.path(),
        "live",
        &[],
        &[
            "--steps",
            "100000",
            "--interval",
            "0.05",
            "--ready-file",
            ready.to_str().unwrap(),
        ],
    );
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    assert!(wait_for(Duration::from_secs(20), || ready.exists()));
    let state = tmp.path().to_str().unwrap();
    let ask = |args: &[&str]| {
        Command::new(bin())
            .args(args)
            .args(["--state-dir", state])
            .output()
            .unwrap()
    };
    // The rank has reported at least one step.
    let mut status = String::new();
    assert!(
        wait_for(Duration::from_secs(20), || {
            let o = ask(&["status", "live", "--json"]);
            status = String::from_utf8_lossy(&o.stdout).into_owned();
            o.status.success()
                && serde_json::from_str::<serde_json::Value>(&status)
                    .is_ok_and(|v| v["ranks"][0]["step"].as_u64().is_some())
        }),
        "status never showed a step: {status}"
    );
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["world_size"], 1, "{v}");
    assert_eq!(v["ranks"].as_array().map(Vec::len), Some(1), "{v}");
    // Without a job id: the latest job, this one.
    let o = ask(&["status"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("job live "));

    // This trainer never reads a request: said plainly, with how to.
    // Not confirmed: its own exit code, for a script (trial 14).
    let o = ask(&["checkpoint", "live", "--wait", "2s"]);
    assert_eq!(o.status.code(), Some(6), "{}", stderr_of(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("every rank is asked to save at step"), "{out}");
    assert!(
        out.contains(
            "no rank confirmed it within 2.0s: the trainer does not seem to read checkpoint requests"
        ) && out.contains("resilio_client.checkpoint_requested()"),
        "{out}"
    );
    assert!(wait_for(Duration::from_secs(10), || {
        kinds(&records(tmp.path(), "live"), "checkpoint_requested")
            .iter()
            .any(|r| r.get("coordinated").and_then(|c| c.as_bool()) == Some(true))
    }));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (o, _) = wait_output(child, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(143), "{}", stderr_of(&o));
    // Gone with the run: no live coordinator.
    let o = ask(&["status", "live"]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr_of(&o));
}

/// Ctrl-C on a terminal reaches the trainer (its group has the terminal's
/// foreground) and is a stop, never a reason to restart.
#[test]
fn ctrl_c_on_a_terminal_stops_and_is_not_restarted() {
    let tmp = tempfile::tempdir().unwrap();
    let inner = format!(
        "RESILIO_STATE_DIR={} RESILIO_SYSTEM_CONFIG= {} run --job-id cc -- python3 -c 'import time; print(\"ready\", flush=True); time.sleep(60)'; echo rc=$?",
        tmp.path().display(),
        bin()
    );
    let mut child = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let mut wait_text = |want: &str, limit: Duration| {
        let deadline = std::time::Instant::now() + limit;
        while !String::from_utf8_lossy(&seen).contains(want) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(b) => seen.extend(b),
                Err(_) => return (false, String::from_utf8_lossy(&seen).into_owned()),
            }
        }
        (true, String::from_utf8_lossy(&seen).into_owned())
    };
    let (ok, out) = wait_text("ready", Duration::from_secs(30));
    assert!(ok, "{out}");
    stdin.write_all(b"\x03").unwrap();
    stdin.flush().unwrap();
    let (ok, out) = wait_text("rc=", Duration::from_secs(30));
    assert!(ok, "{out}");
    let out = out.replace('\r', "");
    assert!(out.contains("rc=130"), "{out}");
    assert!(!out.contains("restarting"), "{out}");
    drop(stdin);
    let _ = child.wait();
    let recs = records(tmp.path(), "cc");
    assert_eq!(kinds(&recs, "rank_start").len(), 1);
    assert!(kinds(&recs, "restart").is_empty());
}

/// resilio's own diagnostics are `tracing` events, one plain line each:
/// `info` and up by default, `-v` adds `debug`, `RESILIO_LOG` overrides.
#[test]
fn diagnostics_follow_v_and_resilio_log() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |job: &str, opts: &[&str], env: Option<&str>| {
        let mut c = resilio_run(tmp.path(), job);
        c.args(opts)
            .args(["--max-restarts", "1", "--", "sh", "-c", "exit 3"]);
        if let Some(v) = env {
            c.env("RESILIO_LOG", v);
        }
        let (o, _) = output_within(&mut c, Duration::from_secs(60));
        assert_eq!(o.status.code(), Some(3), "{}", stderr_of(&o));
        stderr_of(&o)
    };
    let restart = "resilio: restarting in place (attempt 1): ";
    let launched = "resilio: debug: attempt 0: 1 rank agent(s) started";
    let plain = run("log-plain", &[], None);
    assert!(plain.contains(restart), "{plain}");
    assert!(!plain.contains("resilio: debug:"), "{plain}");
    let verbose = run("log-v", &["-v"], None);
    assert!(verbose.contains(restart), "{verbose}");
    assert!(verbose.contains(launched), "{verbose}");
    let off = run("log-off", &["-v"], Some("off"));
    assert!(!off.contains("resilio:"), "{off}");
}
