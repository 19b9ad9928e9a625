//! What a site installs and an admin runs: man pages, shell completions,
//! and `resilio config check` before a configuration is deployed.

use crate::common::*;
use std::process::{Command, Stdio};

fn resilio(args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .env("RESILIO_SYSTEM_CONFIG", "/nonexistent")
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
