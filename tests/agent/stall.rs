use crate::common::*;
use std::time::Duration;

fn stall_of(recs: &[resilio::journal::Record]) -> &resilio::journal::Record {
    one(recs, "stall")
}

/// Detection fires within 1 s of the timeout expiring.
fn assert_prompt(stall: &resilio::journal::Record) {
    let idle = stall.f64("idle_s").unwrap();
    let timeout = stall.f64("timeout_s").unwrap();
    assert!(
        idle >= timeout && idle - timeout < 1.0,
        "idle {idle} vs timeout {timeout}"
    );
}

#[test]
fn startup_timeout_before_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = run_trainer(
        dir.path(),
        "startup",
        &["--startup-timeout", "1s"],
        &["--startup", "60"],
    );
    let (o, took) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(124));
    assert!(took < Duration::from_secs(20));
    let recs = records(dir.path(), "startup");
    let s = stall_of(&recs);
    assert_eq!(s.str("stall_kind"), Some("startup"));
    assert_prompt(s);
    assert!(
        stderr_of(&o).contains("stalled: no first step"),
        "{}",
        stderr_of(&o)
    );
    let f = one(&recs, "failure");
    assert_eq!(f.str("failure_kind"), Some("stall"));
}

#[test]
fn fixed_stall_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = run_trainer(
        dir.path(),
        "fixed",
        &["--stall-timeout", "1s"],
        &["--steps", "5", "--then", "hang"],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(124));
    let recs = records(dir.path(), "fixed");
    let s = stall_of(&recs);
    assert_eq!(s.str("stall_kind"), Some("step_fixed"));
    assert_eq!(s.f64("timeout_s"), Some(1.0));
    assert_eq!(s.u64("last_step"), Some(5));
    assert_prompt(s);
    // Found asleep at its limit: no advice about silent evaluations.
    let err = stderr_of(&o);
    assert!(err.contains("its trainer was not working ("), "{err}");
    assert!(!err.contains("announce it"), "{err}");
}

#[test]
fn adaptive_timeout_learns_fast_steps() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "[stall]\nadaptive_floor = \"1s\"\n");
    let mut c = run_trainer(
        dir.path(),
        "adaptive",
        &["--config", cfg.to_str().unwrap()],
        &["--steps", "30", "--interval", "0.05", "--then", "hang"],
    );
    let (o, took) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(124));
    assert!(
        took < Duration::from_secs(20),
        "a 50 ms-step run is caught in seconds, took {took:?}"
    );
    let recs = records(dir.path(), "adaptive");
    let s = stall_of(&recs);
    assert_eq!(s.str("stall_kind"), Some("step_adaptive"));
    let t = s.f64("timeout_s").unwrap();
    assert!((1.0..5.0).contains(&t), "adaptive timeout {t}");
    assert_prompt(s);
}

#[test]
fn announced_checkpoint_is_not_a_stall() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = run_trainer(
        dir.path(),
        "ckpt",
        &["--stall-timeout", "1s"],
        &[
            "--steps",
            "10",
            "--checkpoint-at",
            "4",
            "--checkpoint-secs",
            "3",
        ],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let recs = records(dir.path(), "ckpt");
    assert!(kinds(&recs, "stall").is_empty());
    assert_eq!(one(&recs, "checkpoint_done").u64("step"), Some(4));
    assert!(kinds(&recs, "phase")
        .iter()
        .any(|r| r.str("phase") == Some("checkpoint")));
}

#[test]
fn checkpoint_line_in_the_output_is_not_a_stall() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = run_trainer(
        dir.path(),
        "ckpt-out",
        &["--stall-timeout", "1s"],
        &[
            "--steps",
            "8",
            "--checkpoint-at",
            "3",
            "--checkpoint-secs",
            "3",
            "--checkpoint-announce",
            "output",
        ],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(kinds(&records(dir.path(), "ckpt-out"), "stall").is_empty());
}

#[test]
fn a_checkpoint_that_never_ends_is_a_stall_of_its_phase() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "[stall]\ntimeout = \"1s\"\ncheckpoint_timeout = \"2s\"\n",
    );
    let mut c = run_trainer(
        dir.path(),
        "ckpt-hang",
        &["--config", cfg.to_str().unwrap()],
        &[
            "--steps",
            "5",
            "--checkpoint-at",
            "3",
            "--checkpoint-secs",
            "600",
        ],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(124));
    let recs = records(dir.path(), "ckpt-hang");
    let s = stall_of(&recs);
    assert_eq!(s.str("stall_kind"), Some("phase_checkpoint"));
    assert_eq!(s.f64("timeout_s"), Some(2.0));
    assert_prompt(s);
}

#[test]
fn diagnostics_before_the_kill_with_py_spy_and_faulthandler() {
    let dir = tempfile::tempdir().unwrap();
    // Real py-spy (from the virtualenv tests/run.sh installs; skipped with
    // a message without it, a failure when tests/run.sh requires it).
    let Some(t) = crate::ddp::torch() else {
        return;
    };
    let path = t.path_env();

    let mut c = run_trainer(
        dir.path(),
        "diag",
        &["--stall-timeout", "1s", "--dump-signal", "SIGUSR2"],
        &["--steps", "3", "--then", "hang", "--faulthandler"],
    );
    c.env("PATH", path);
    let (o, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(124));
    let recs = records(dir.path(), "diag");
    let d = one(&recs, "diagnostics");
    let spy = d.get("py_spy").and_then(|v| v.as_array()).unwrap();
    assert_eq!(spy.len(), 1, "{d:?}");
    // A real stack: the main thread, inside the trainer's own code.
    let dump = spy[0]["output"].as_str().unwrap();
    assert!(spy[0]["ok"].as_bool().unwrap(), "{dump}");
    assert!(
        dump.contains("\"MainThread\"") && dump.contains("(trainer.py:"),
        "{dump}"
    );
    // The stall's probe read that stack: not waiting on a peer.
    let probe = kinds(&recs, "probe")
        .into_iter()
        .find(|p| p.str("reason") == Some("stall"))
        .expect("the stall's probe");
    assert_eq!(
        probe.get("probe").unwrap()["stacks"],
        serde_json::json!(true),
        "{probe:?}"
    );
    assert_eq!(d.str("dump_signal"), Some("SIGUSR2"));
    // faulthandler's dump went to the trainer's stderr: passed through and kept in the tail.
    assert!(
        stderr_of(&o).contains("most recent call first"),
        "{}",
        stderr_of(&o)
    );
    let tail: Vec<&str> = d
        .get("tail")
        .and_then(|v| v.as_array())
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        tail.iter().any(|l| l.contains("waiting in all_reduce")),
        "{tail:?}"
    );
    assert!(
        tail.iter().any(|l| l.contains("most recent call first")),
        "{tail:?}"
    );
    let file = d.str("file").unwrap();
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains("(trainer.py:") && text.contains("waiting in all_reduce"));
    // Order: stall, then diagnostics, then the stop, then the exit.
    let order: Vec<&str> = recs
        .iter()
        .map(|r| r.kind.as_str())
        .filter(|k| ["stall", "diagnostics", "stop", "rank_exit"].contains(k))
        .collect();
    assert_eq!(order, ["stall", "diagnostics", "stop", "rank_exit"]);
}

#[test]
fn a_trainer_that_ends_on_its_own_during_diagnostics_keeps_its_status() {
    let dir = tempfile::tempdir().unwrap();
    // The diagnostics last 3 s (the dump signal, then its wait); the
    // trainer's silence lasts 2 s, then it finishes.
    let cfg = dir.path().join("resilio.toml");
    std::fs::write(&cfg, "[diagnostics]\ndump_wait = \"3s\"\n").unwrap();
    let mut c = resilio_run(dir.path(), "late");
    c.arg("--config").arg(&cfg).args([
        "--stall-timeout",
        "1s",
        "--dump-signal",
        "SIGUSR2",
        "--",
        "python3",
        "-c",
        "import faulthandler, signal, time\nfaulthandler.register(signal.SIGUSR2)\nfor i in range(5):\n    print(f'step {i}', flush=True); time.sleep(0.1)\ntime.sleep(2)\nprint('saved')",
    ]);
    let (o, _) = output_within(&mut c, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let recs = records(dir.path(), "late");
    assert_eq!(kinds(&recs, "stall").len(), 1);
    assert_eq!(kinds(&recs, "stall_cancelled").len(), 1);
    assert_eq!(one(&recs, "rank_exit").str("class"), Some("clean"));
    assert!(kinds(&recs, "failure").is_empty());
}

/// A trainer of `steps` 0.1 s steps under a 1 s stall limit, started and
/// ready: resilio's process and the trainer's pid.
fn started_with_1s_limit(
    dir: &std::path::Path,
    job: &str,
    steps: u32,
) -> (std::process::Child, i32) {
    let ready = dir.join("ready");
    let mut c = run_trainer(
        dir,
        job,
        &["--stall-timeout", "1s"],
        &[
            "--steps",
            &steps.to_string(),
            "--interval",
            "0.1",
            "--ready-file",
            ready.to_str().unwrap(),
        ],
    );
    c.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    assert!(wait_for(Duration::from_secs(15), || ready.exists()));
    let trainer = std::fs::read_to_string(&ready)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (child, trainer)
}

#[test]
fn a_suspended_and_resumed_job_is_not_a_stall() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let (child, trainer) = started_with_1s_limit(dir.path(), "suspend", 40);
    std::thread::sleep(Duration::from_millis(500));
    // As `scontrol suspend` does: stop everything, wait, continue everything.
    // Outside Slurm, resilio is the launcher and the rank's agent (the
    // trainer's parent): both are stopped, as the trainer is.
    let me = Pid::from_raw(child.id() as i32);
    let agent = std::fs::read_to_string(format!("/proc/{trainer}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .map(Pid::from_raw)
        .unwrap();
    for p in [me, agent, Pid::from_raw(-trainer)] {
        kill(p, Signal::SIGSTOP).unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    for p in [Pid::from_raw(-trainer), agent, me] {
        kill(p, Signal::SIGCONT).unwrap();
    }
    let (o, _) = wait_output(child, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(kinds(&records(dir.path(), "suspend"), "stall").is_empty());
}

/// Ctrl-Z at a terminal stops the trainer's process group (it holds the
/// foreground), not resilio: the time it spends stopped is its user's
/// pause, never a stall; `fg` continues it and the run completes.
#[test]
fn a_trainer_stopped_at_its_terminal_and_continued_is_not_a_stall() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let (child, trainer) = started_with_1s_limit(dir.path(), "ctrlz", 30);
    std::thread::sleep(Duration::from_millis(500));
    // The terminal's SIGTSTP goes to the foreground group: the trainer's.
    kill(Pid::from_raw(-trainer), Signal::SIGTSTP).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    kill(Pid::from_raw(-trainer), Signal::SIGCONT).unwrap();
    let (o, _) = wait_output(child, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let recs = records(dir.path(), "ctrlz");
    assert!(kinds(&recs, "stall").is_empty(), "a pause is no stall");
    assert!(
        kinds(&recs, "resumed")
            .iter()
            .any(|r| r.get("trainer_stopped") == Some(&serde_json::json!(true))),
        "the pause is journaled"
    );
}
