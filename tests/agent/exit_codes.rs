use crate::common::*;
use std::time::Duration;

fn run_cmd(args: &[&str]) -> std::process::Output {
    let state = tempfile::tempdir().unwrap();
    let mut c = resilio_run(state.path(), "codes");
    c.arg("--").args(args);
    output_within(&mut c, Duration::from_secs(20)).0
}

#[test]
fn the_childs_status_comes_through() {
    for code in [0, 1, 3, 42, 255] {
        let o = run_cmd(&["sh", "-c", &format!("exit {code}")]);
        assert_eq!(o.status.code(), Some(code));
    }
}

#[test]
fn death_by_signal_gives_128_plus_n() {
    assert_eq!(
        run_cmd(&["sh", "-c", "kill -9 $$"]).status.code(),
        Some(137)
    );
    assert_eq!(
        run_cmd(&["sh", "-c", "kill -SEGV $$"]).status.code(),
        Some(139)
    );
}

#[test]
fn not_found_is_127_and_not_executable_is_126() {
    let o = run_cmd(&["/nonexistent/train"]);
    assert_eq!(o.status.code(), Some(127));
    let err = stderr_of(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("/nonexistent/train") && err.contains("not found"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("train.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let o = run_cmd(&[script.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(126));
    assert_eq!(stderr_of(&o).lines().count(), 1);
    let o = run_cmd(&[dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(126));
}

#[test]
fn spawn_failure_is_journaled() {
    let state = tempfile::tempdir().unwrap();
    let mut c = resilio_run(state.path(), "nf");
    c.args(["--", "/nonexistent/train"]);
    output_within(&mut c, Duration::from_secs(20));
    let recs = records(state.path(), "nf");
    assert_eq!(one(&recs, "rank_exit").i64_field("exit_code"), Some(127));
    assert_eq!(one(&recs, "failure").str("cause"), Some("spawn_failed"));
}

trait I64Field {
    fn i64_field(&self, k: &str) -> Option<i64>;
}
impl I64Field for resilio::journal::Record {
    fn i64_field(&self, k: &str) -> Option<i64> {
        self.get(k).and_then(|v| v.as_i64())
    }
}

#[test]
fn usage_errors_are_one_line_and_exit_2() {
    let state = tempfile::tempdir().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["run"],
        vec!["run", "--stall-timeout", "5x", "--", "true"],
        vec!["run", "--startup-timeout", "", "--", "true"],
        vec!["run", "--stall-timeout", "0", "--", "true"],
        vec![
            "run",
            "--stall-timeout",
            "0s",
            "--ntasks",
            "2",
            "--",
            "true",
        ],
        vec!["run", "--startup-timeout", "0ms", "--", "true"],
        vec!["run", "--eval-timeout", "0", "--", "true"],
        vec!["run", "--checkpoint-timeout", "5x", "--", "true"],
        vec!["run", "--stall-floor", "-1s", "--", "true"],
        vec!["run", "--stall-timeout", "-5s", "--", "true"],
        vec!["run", "--kill-grace", "-1", "--", "true"],
        vec!["nodes", "--half-life", "0", "--no-sacct"],
        vec!["run", "--progress-regex", "(", "--", "true"],
        vec!["run", "--dump-signal", "SIGNOPE", "--", "true"],
        vec!["run", "--job-id", "../x", "--", "true"],
        vec!["run", "--no-such-flag", "--", "true"],
        vec!["frobnicate"],
    ];
    for args in cases {
        let mut c = std::process::Command::new(bin());
        c.env("RESILIO_STATE_DIR", state.path()).args(&args);
        let (o, _) = output_within(&mut c, Duration::from_secs(10));
        let err = stderr_of(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("resilio: "), "{args:?}: {err}");
        // A bad value names its flag.
        if let Some(flag) = args
            .iter()
            .find(|a| a.ends_with("-timeout") || a.ends_with("-floor"))
        {
            assert!(err.contains(&format!("{flag}: ")), "{args:?}: {err}");
        }
    }
}

/// A zero timeout would fire at once (a real trainer was killed after its
/// first step): a usage error naming the flag, or the file and line, and
/// the trainer never starts. A zero kill grace is kept: SIGKILL at once.
#[test]
fn zero_timeouts_are_usage_errors_and_nothing_starts() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let touch = ["--", "touch", marker.to_str().unwrap()];
    let mut c = resilio_run(dir.path(), "z1");
    c.args(["--stall-timeout", "0"]).args(touch);
    let (o, _) = output_within(&mut c, Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr_of(&o).trim_end(),
        "resilio: --stall-timeout: must be greater than zero (got '0'); 'adaptive' learns it from the steps"
    );
    let cfg = write_config(
        dir.path(),
        "[stall]\ncheckpoint_timeout = \"30m\"\neval_timeout = \"0s\"\n",
    );
    let mut c = resilio_run(dir.path(), "z2");
    c.args(["--config", cfg.to_str().unwrap()]).args(touch);
    let (o, _) = output_within(&mut c, Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr_of(&o).trim_end(),
        format!(
            "resilio: {}:3: stall.eval_timeout must be greater than zero",
            cfg.display()
        )
    );
    assert!(!marker.exists(), "nothing may start on a usage error");
    let mut c = resilio_run(dir.path(), "z3");
    c.args(["--kill-grace", "0"]).args(touch);
    let (o, _) = output_within(&mut c, Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(marker.exists());
}

#[test]
fn config_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "[stall]\nstartup_timeout = \"1m\"\nstall_timout = \"5s\"\n",
    );
    let mut c = resilio_run(dir.path(), "cfg");
    c.args(["--config", cfg.to_str().unwrap(), "--", "true"]);
    let (o, _) = output_within(&mut c, Duration::from_secs(10));
    let err = stderr_of(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains(&format!("{}:3:", cfg.display())), "{err}");
    assert!(err.contains("stall_timout"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    // The system-wide file is read too, with the same care.
    let sys = dir.path().join("system.toml");
    std::fs::write(&sys, "[run]\nkill_grace = \"5 parsecs\"\n").unwrap();
    let mut c = resilio_run(dir.path(), "cfg2");
    c.env("RESILIO_SYSTEM_CONFIG", &sys).args(["--", "true"]);
    let (o, _) = output_within(&mut c, Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr_of(&o).contains("system.toml:2:"),
        "{}",
        stderr_of(&o)
    );
}

#[test]
fn configuration_layers_system_then_user_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("system.toml");
    std::fs::write(
        &sys,
        "[stall]\ntimeout = \"60s\"\nstartup_timeout = \"7m\"\n",
    )
    .unwrap();
    let user = write_config(dir.path(), "[stall]\ntimeout = \"30s\"\n");
    let limits = |job: &str, opts: &[&str]| {
        let mut c = resilio_run(dir.path(), job);
        c.env("RESILIO_SYSTEM_CONFIG", &sys)
            .args(opts)
            .args(["--", "true"]);
        let (o, _) = output_within(&mut c, Duration::from_secs(10));
        assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
        let recs = records(dir.path(), job);
        let start = one(&recs, "rank_start");
        (start.f64("stall_timeout_s"), start.f64("startup_timeout_s"))
    };
    assert_eq!(limits("l1", &[]), (Some(60.0), Some(420.0)));
    assert_eq!(
        limits("l2", &["--config", user.to_str().unwrap()]),
        (Some(30.0), Some(420.0))
    );
    assert_eq!(
        limits(
            "l3",
            &["--config", user.to_str().unwrap(), "--stall-timeout", "2s"]
        ),
        (Some(2.0), Some(420.0))
    );
    assert_eq!(
        limits(
            "l4",
            &[
                "--config",
                user.to_str().unwrap(),
                "--stall-timeout",
                "adaptive"
            ]
        ),
        (None, Some(420.0))
    );
}

fn trainer_env_seen(extra: &[(&str, &str)], more: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut c = resilio_run(dir.path(), "env");
    for (k, v) in extra {
        c.env(k, v);
    }
    c.args(more).args([
        "--",
        "sh",
        "-c",
        "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $NODE_RANK $MASTER_ADDR $MASTER_PORT $RESILIO_JOB_ID\"",
    ]);
    let (o, _) = output_within(&mut c, Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

#[test]
fn one_local_rank_gets_no_torchrun_variables_and_several_get_them_all() {
    // One rank runs as without resilio: Lightning and the HF Trainer take
    // LOCAL_RANK for a launcher that started their processes.
    let seen = trainer_env_seen(&[], &[]);
    assert_eq!(seen, "env", "only resilio's own variables: {seen:?}");
    let seen = trainer_env_seen(&[("MASTER_PORT", "29555")], &[]);
    assert_eq!(seen, "29555 env", "a user's own is kept, nothing added");
    // Several ranks: torchrun's variables, one rendezvous for all.
    let seen = trainer_env_seen(&[], &["--ntasks", "2"]);
    let mut lines: Vec<Vec<&str>> = seen.lines().map(|l| l.split(' ').collect()).collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{seen}");
    for (r, f) in lines.iter().enumerate() {
        let r = r.to_string();
        assert_eq!(f[..6], [&r, &r, "2", "2", "0", "127.0.0.1"], "{seen}");
        assert!(f[6].parse::<u16>().unwrap() >= 20000, "{seen}");
        assert_eq!(f[6], lines[0][6], "one MASTER_PORT: {seen}");
    }
}

#[test]
fn one_local_rank_has_no_rendezvous_port_in_its_launch_record() {
    let dir = tempfile::tempdir().unwrap();
    for (job, more) in [("one", &[][..]), ("two", &["--ntasks", "2"][..])] {
        let mut c = resilio_run(dir.path(), job);
        c.args(more).args(["--", "true"]);
        let (o, _) = output_within(&mut c, Duration::from_secs(10));
        assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
        let recs = records(dir.path(), job);
        let launch = kinds(&recs, "launch");
        assert_eq!(launch.len(), 1, "{recs:#?}");
        let port = launch[0].u64("master_port");
        assert_eq!(port.is_some(), job == "two", "{:?}", launch[0]);
    }
}

#[test]
fn torchrun_variables_from_a_simulated_slurm_step_environment() {
    // SIMULATED: the SLURM_* variables of task 5 of a 2x3 step, set by the test
    // (the real cluster's srun is exercised in tests/slurm).
    let seen = trainer_env_seen(
        &[
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "5"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_NODELIST", "gpu[007-008]"),
            ("SLURM_STEP_NUM_TASKS", "6"),
            ("SLURM_STEP_TASKS_PER_NODE", "3(x2)"),
            ("RANK", "0"), // leaked from elsewhere: Slurm's value wins
        ],
        &[],
    );
    let f: Vec<&str> = seen.split(' ').collect();
    assert_eq!(f[..6], ["5", "2", "6", "3", "1", "gpu007"], "{seen}");
    assert_eq!(f[7], "env", "an explicit --job-id wins over SLURM_JOB_ID");
}

#[test]
fn a_ctrl_c_every_rank_ends_cleanly_on_exits_0_as_with_one_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let ready = tmp.path().join("ready");
    // Each rank says it is ready, then ends with 0 on SIGINT.
    let script = format!(
        "trap 'exit 0' INT; touch {}.${{RANK:-0}}; while :; do sleep 0.05; done",
        ready.display()
    );
    for n in ["1", "2"] {
        let mut c = resilio_run(tmp.path(), &format!("int{n}"));
        c.args([
            "--ntasks",
            n,
            "--max-restarts",
            "0",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        let child = c.spawn().unwrap();
        let ranks: u32 = n.parse().unwrap();
        assert!(wait_for(Duration::from_secs(20), || (0..ranks)
            .all(|r| tmp.path().join(format!("ready.{r}")).exists())));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let (o, _) = wait_output(child, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(0), "{n} rank(s): {}", stderr_of(&o));
        for r in 0..ranks {
            let _ = std::fs::remove_file(tmp.path().join(format!("ready.{r}")));
        }
    }
}

/// Usage errors say what to do in their one line: which argument is
/// missing, the flag or command meant, and `--` before a trainer's command.
#[test]
fn usage_errors_say_what_was_meant() {
    let state = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["template"],
            "missing <KIND> (see resilio template --help)",
        ),
        (&["completions"], "missing <SHELL>"),
        (
            &["run", "python3", "x.py"],
            "goes after `--`: resilio run [FLAGS] -- COMMAND",
        ),
        (
            &["run", "--stal-timeout", "5s", "--", "true"],
            "did you mean '--stall-timeout'?",
        ),
        (&["repor", "x"], "did you mean 'report'?"),
    ];
    for (args, want) in cases {
        let mut c = std::process::Command::new(bin());
        c.env("RESILIO_STATE_DIR", state.path()).args(*args);
        let (o, _) = output_within(&mut c, Duration::from_secs(10));
        let err = stderr_of(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `resilio status` and `resilio checkpoint` of a job with no journal: no
/// such job (3), as the README's table says, not "no coordinator" (5).
#[test]
fn status_of_a_job_without_a_journal_is_no_such_job() {
    let state = tempfile::tempdir().unwrap();
    for args in [["status", "nosuchjob"], ["checkpoint", "nosuchjob"]] {
        let mut c = std::process::Command::new(bin());
        c.env("RESILIO_STATE_DIR", state.path()).args(args);
        let (o, _) = output_within(&mut c, Duration::from_secs(10));
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", stderr_of(&o));
    }
}

/// `resilio run ... > >(tee out.log)`: bash forks the reader before it
/// execs resilio, so the reader is resilio's child from the start. It is
/// not resilio's to stop or wait for: the output reaches it, the exit code
/// comes through (trial 12 found the reader killed at once, the output
/// lost, and rank 0's agent dead of the broken pipe).
#[test]
fn a_process_substitution_reader_is_left_alone() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out.log"), dir.path().join("err.log"));
    let like = resilio_run(state.path(), "subst");
    let mut c = std::process::Command::new("bash");
    for (k, v) in like.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.arg("-c")
        .arg(
            r#"exec "$0" run --job-id subst -- sh -c 'sleep 0.5; echo out-line; echo err-line >&2; exit 3' \
                > >(sleep 1; cat > "$1") 2> >(cat > "$2")"#,
        )
        .arg(bin())
        .arg(&out)
        .arg(&err);
    let (o, _) = output_within(&mut c, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(3), "{}", stderr_of(&o));
    let has = |p: &std::path::Path, what: &str| {
        std::fs::read_to_string(p).is_ok_and(|t| t.contains(what))
    };
    assert!(
        wait_for(Duration::from_secs(10), || has(&out, "out-line")
            && has(&err, "err-line")),
        "out: {:?} err: {:?}",
        std::fs::read_to_string(&out),
        std::fs::read_to_string(&err)
    );
}

/// A stderr whose reader is gone: resilio's own lines are lost, and
/// nothing else (the exit code comes through; no panic, no 101).
#[test]
fn a_stderr_that_went_away_never_kills_resilio() {
    let state = tempfile::tempdir().unwrap();
    let (r, w) = nix::unistd::pipe().unwrap();
    drop(r);
    let mut c = resilio_run(state.path(), "epipe");
    c.env("RESILIO_LOG", "debug")
        .args(["--", "sh", "-c", "echo to-stderr >&2; exit 3"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(w));
    let (o, _) = wait_output(c.spawn().unwrap(), Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(3));
}
