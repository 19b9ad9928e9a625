//! What a site installs and an admin runs: man pages, shell completions,
//! and `resilio config check` before a configuration is deployed.

use crate::common::*;
use std::process::{Command, Stdio};

fn resilio(args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .env("RESILIO_SYSTEM_CONFIG", "")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn man_pages_one_per_subcommand_and_no_hidden_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let out = resilio(&["man", "--dir", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    for page in [
        "resilio",
        "resilio-run",
        "resilio-report",
        "resilio-timeline",
        "resilio-nodes",
        "resilio-fleet",
        "resilio-status",
        "resilio-checkpoint",
        "resilio-template",
        "resilio-config",
        "resilio-completions",
        "resilio-man",
    ] {
        let text = std::fs::read_to_string(tmp.path().join(format!("{page}.1")))
            .unwrap_or_else(|e| panic!("{page}.1: {e}"));
        assert!(text.contains(".TH"), "{page}: {text}");
    }
    let run = std::fs::read_to_string(tmp.path().join("resilio-run.1")).unwrap();
    assert!(run.contains("stall\\-timeout"), "{run}");
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains("__")), "{names:?}");
    // `man` itself reads them, where it is installed.
    if let Ok(m) = Command::new("man")
        .arg("-l")
        .arg(tmp.path().join("resilio-run.1"))
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
    {
        if m.status.success() {
            assert!(String::from_utf8_lossy(&m.stdout).contains("resilio-run"));
        }
    }
}

#[test]
fn completions_for_each_shell() {
    for (shell, mark) in [
        ("bash", "_resilio()"),
        ("zsh", "#compdef resilio"),
        ("fish", "complete -c resilio"),
    ] {
        let out = resilio(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", stderr_of(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(mark), "{shell}: {text}");
        assert!(text.contains("template"), "{shell}");
    }
    assert_eq!(resilio(&["completions", "tcsh"]).status.code(), Some(2));
}

#[test]
fn config_check_says_ok_or_names_the_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good.toml");
    std::fs::write(
        &good,
        "[run]\nkill_grace = \"5s\"\n[stall]\ntimeout = \"10m\"\n",
    )
    .unwrap();
    let out = resilio(&["config", "check", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: "));
    let bad = tmp.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[run]\nkill_grace = \"5s\"\n\n[stall]\ntimeout = \"0s\"\n",
    )
    .unwrap();
    let out = resilio(&["config", "check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_of(&out);
    assert!(err.contains(&format!("{}:", bad.display())), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // The system file is checked too: an admin's typo names that file.
    let out = Command::new(bin())
        .args(["config", "check"])
        .env("RESILIO_SYSTEM_CONFIG", &bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("bad.toml:"), "{}", stderr_of(&out));
}

#[test]
fn path_mistakes_are_usage_errors_and_help_lists_only_what_applies() {
    let tmp = tempfile::tempdir().unwrap();
    let jd = resilio::journal::job_dir(tmp.path(), "j1");
    std::fs::create_dir_all(&jd).unwrap();
    std::fs::write(
        jd.join("rank-0.jsonl"),
        "{\"v\":1,\"ts\":\"2026-11-23T18:00:00Z\",\"kind\":\"rank_start\",\"attempt\":0,\"rank\":0}\n",
    )
    .unwrap();
    let out = resilio(&[
        "timeline",
        "--state-dir",
        tmp.path().to_str().unwrap(),
        "--html",
        "/nonexistent/dir/x.html",
        "j1",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert_eq!(stderr_of(&out).lines().count(), 1, "{}", stderr_of(&out));
    let status = String::from_utf8_lossy(&resilio(&["status", "--help"]).stdout).into_owned();
    assert!(!status.contains("--reason"), "{status}");
    let ckpt = String::from_utf8_lossy(&resilio(&["checkpoint", "--help"]).stdout).into_owned();
    assert!(ckpt.contains("--reason"), "{ckpt}");
}

#[test]
fn a_system_config_that_is_named_but_missing_is_an_error_and_empty_means_none() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("site/resilio.toml");
    for args in [
        &["config", "check"][..],
        &["config", "show"][..],
        &["run", "--job-id", "m", "--", "true"][..],
    ] {
        let out = Command::new(bin())
            .args(args)
            .env("RESILIO_SYSTEM_CONFIG", &missing)
            .env("RESILIO_STATE_DIR", tmp.path().join("state"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr_of(&out));
        let err = stderr_of(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("RESILIO_SYSTEM_CONFIG") && err.contains(&*missing.to_string_lossy()),
            "{args:?}: {err}"
        );
    }
    // Set empty: no system configuration at all, and the run goes ahead.
    let out = Command::new(bin())
        .args(["run", "--job-id", "e", "--", "sh", "-c", "exit 3"])
        .env("RESILIO_SYSTEM_CONFIG", "")
        .env("RESILIO_STATE_DIR", tmp.path().join("state"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
}

#[test]
fn config_show_prints_every_key_with_the_layer_that_set_it() {
    let tmp = tempfile::tempdir().unwrap();
    let sys = tmp.path().join("sys.toml");
    std::fs::write(
        &sys,
        "# site\n[run]\nkill_grace = \"10s\"\nstate_dir = \"/shared/site\"\n",
    )
    .unwrap();
    let user = tmp.path().join("user.toml");
    std::fs::write(
        &user,
        "[run]\nmax_restarts = 7\n\n[stall.phase_timeouts]\ncheckpoint = \"20m\"\n",
    )
    .unwrap();
    let show = |env_state: Option<&str>| {
        let mut c = Command::new(bin());
        c.args(["config", "show", user.to_str().unwrap()])
            .env("RESILIO_SYSTEM_CONFIG", &sys)
            .env_remove("RESILIO_STATE_DIR")
            .stdin(Stdio::null());
        if let Some(d) = env_state {
            c.env("RESILIO_STATE_DIR", d);
        }
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let text = show(None);
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
            .to_string()
    };
    let sys_at = |n: usize| format!("# {}:{n}", sys.display());
    assert!(
        line("kill_grace").contains("\"10s\""),
        "{}",
        line("kill_grace")
    );
    assert!(
        line("kill_grace").ends_with(&sys_at(3)),
        "{}",
        line("kill_grace")
    );
    assert!(
        line("state_dir").ends_with(&sys_at(4)),
        "{}",
        line("state_dir")
    );
    assert!(line("max_restarts").starts_with("max_restarts = 7 "));
    assert!(line("max_restarts").ends_with(&format!("# {}:2", user.display())));
    assert!(line("phase_timeouts").contains("20m"));
    assert!(line("step_start_timeout").ends_with("\"5m\"  # built-in default"));
    // Long built-in values are shown, not hidden: the progress regex.
    assert!(line("regex").contains("iteration"), "{}", line("regex"));
    // Every section of the documented file, in its order.
    let headers: Vec<&str> = text.lines().filter(|l| l.starts_with('[')).collect();
    let documented: Vec<&str> = include_str!("../../conf/resilio.toml")
        .lines()
        .filter(|l| l.starts_with('[') && !l.contains('.'))
        .collect();
    assert_eq!(headers, documented);
    // The output is TOML that resilio itself accepts.
    let again = tmp.path().join("again.toml");
    std::fs::write(&again, &text).unwrap();
    let out = resilio(&["config", "check", again.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}\n{text}", stderr_of(&out));
    // The environment's state dir wins over every file, and says so.
    let text = show(Some("/tmp/from-env"));
    let sd = text
        .lines()
        .find(|l| l.starts_with("state_dir = "))
        .unwrap();
    assert_eq!(sd, "state_dir = \"/tmp/from-env\"  # $RESILIO_STATE_DIR");
}

#[test]
fn the_environments_state_dir_wins_over_the_system_files() {
    // A job level passes its state dir to its steps in RESILIO_STATE_DIR;
    // a site's `[run] state_dir` must not split the job's journal.
    let tmp = tempfile::tempdir().unwrap();
    let site = tmp.path().join("site");
    let mine = tmp.path().join("mine");
    let sys = tmp.path().join("sys.toml");
    std::fs::write(
        &sys,
        format!("[run]\nstate_dir = {:?}\n", site.display().to_string()),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["run", "--job-id", "env1", "--", "true"])
        .env("RESILIO_SYSTEM_CONFIG", &sys)
        .env("RESILIO_STATE_DIR", &mine)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(resilio::journal::job_dir(&mine, "env1").is_dir());
    assert!(!site.exists());
}
