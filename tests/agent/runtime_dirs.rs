//! The runtime directory of the progress sockets (checked, replaced when
//! squatted, stale sockets removed), the journal's modes, and a journal on a
//! full disk (a small tmpfs).

use crate::common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

fn uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// A socket-only trainer under `resilio run`, its runtime directories
/// under `tmpdir` (`TMPDIR`, no `XDG_RUNTIME_DIR`, as in a Slurm job).
fn socket_run(state: &Path, job: &str, tmpdir: &Path, steps: &str) -> std::process::Command {
    let mut c = run_trainer(
        state,
        job,
        &["--startup-timeout", "8s"],
        &["--report", "socket", "--steps", steps, "--interval", "0.02"],
    );
    c.env("TMPDIR", tmpdir).env_remove("XDG_RUNTIME_DIR");
    c
}

/// The socket the rank was given (its `rank_start` record).
fn socket_of(state: &Path, job: &str) -> Option<PathBuf> {
    records(state, job)
        .iter()
        .find(|r| r.kind == "rank_start")
        .and_then(|r| r.str("socket").map(PathBuf::from))
}

fn assert_reported_on_the_socket(state: &Path, job: &str, o: &std::process::Output) {
    assert!(o.status.success(), "{}", stderr_of(o));
    let recs = records(state, job);
    let exit = one(&recs, "rank_exit");
    assert_eq!(exit.u64("last_step"), Some(20), "{recs:#?}");
    assert!(kinds(&recs, "stall").is_empty(), "{recs:#?}");
    assert!(
        kinds(&recs, "progress")
            .iter()
            .any(|r| r.str("source") == Some("socket")),
        "{recs:#?}"
    );
}

#[test]
fn a_squatted_socket_directory_is_replaced_and_the_trainer_still_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let usual = tmp.path().join(format!("resilio-{}", uid()));
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o777)).unwrap();
    // Squats: a symbolic link to a directory anyone can write, and (as
    // root, who can play another user) a 0777 directory of nobody's.
    type Squat<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let mut squats: Vec<Squat> = vec![(
        "symlink",
        Box::new(|| std::os::unix::fs::symlink(&elsewhere, &usual).unwrap()),
    )];
    if nix::unistd::geteuid().is_root() {
        squats.push((
            "another owner",
            Box::new(|| {
                std::fs::create_dir(&usual).unwrap();
                std::fs::set_permissions(&usual, std::fs::Permissions::from_mode(0o777)).unwrap();
                std::os::unix::fs::chown(&usual, Some(65534), Some(65534)).unwrap();
            }),
        ));
    } else {
        println!("not root: the squat by another owner is not tried (chown needs root)");
    }
    for (i, (what, squat)) in squats.iter().enumerate() {
        squat();
        let job = format!("squat{i}");
        let (o, _) = output_within(
            &mut socket_run(tmp.path(), &job, tmp.path(), "20"),
            Duration::from_secs(30),
        );
        assert_reported_on_the_socket(tmp.path(), &job, &o);
        let sock = socket_of(tmp.path(), &job).expect("RESILIO_SOCKET given");
        let dir = sock.parent().unwrap();
        assert_ne!(dir, usual, "{what}");
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(&format!("resilio-{}-", uid())),
            "{what}: {}",
            sock.display()
        );
        let meta = std::fs::symlink_metadata(dir).unwrap();
        assert!(meta.is_dir() && meta.uid() == uid() && mode(dir) == 0o700);
        assert!(
            stderr_of(&o).contains("is not used"),
            "{what}: {}",
            stderr_of(&o)
        );
        // Nothing was made in the squatter's directory.
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        // Said once, and no monitor_error: the socket worked.
        assert_eq!(stderr_of(&o).matches("is not used").count(), 1);
        assert!(kinds(&records(tmp.path(), &job), "monitor_error").is_empty());
        let _ = std::fs::remove_file(&usual);
        let _ = std::fs::remove_dir(&usual);
    }
    // The fallback directories are empty now (each agent removed its
    // socket); once older than a minute, the next agent removes them.
    let fallbacks = || -> Vec<PathBuf> {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("resilio-{}-", uid()))
            })
            .collect()
    };
    assert_eq!(fallbacks().len(), squats.len());
    for d in fallbacks() {
        let ok = std::process::Command::new("touch")
            .args(["-m", "-d", "2 minutes ago"])
            .arg(&d)
            .status()
            .unwrap();
        assert!(ok.success());
    }
    // Our own directory left too open is closed again and used.
    std::fs::create_dir(&usual).unwrap();
    std::fs::set_permissions(&usual, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (o, _) = output_within(
        &mut socket_run(tmp.path(), "own", tmp.path(), "20"),
        Duration::from_secs(30),
    );
    assert_reported_on_the_socket(tmp.path(), "own", &o);
    assert_eq!(
        socket_of(tmp.path(), "own").unwrap().parent(),
        Some(usual.as_path())
    );
    assert_eq!(mode(&usual), 0o700);
    assert!(!stderr_of(&o).contains("is not used"), "{}", stderr_of(&o));
    assert_eq!(fallbacks(), Vec::<PathBuf>::new());
}

#[test]
fn sockets_left_by_an_agent_killed_with_9_are_removed_by_the_next_one() {
    let tmp = tempfile::tempdir().unwrap();
    let usual = tmp.path().join(format!("resilio-{}", uid()));
    // An agent killed with -9 in the middle of its run.
    let mut c = socket_run(tmp.path(), "killed", tmp.path(), "100000");
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = c.spawn().unwrap();
    assert!(wait_for(Duration::from_secs(20), || socket_of(
        tmp.path(),
        "killed"
    )
    .is_some()));
    let left = socket_of(tmp.path(), "killed").unwrap();
    assert_eq!(left.parent(), Some(usual.as_path()));
    // The agent is the pid in the socket's name (`resilio run` launched it).
    let agent: i32 = left
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .rsplit('.')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = wait_output(child, Duration::from_secs(20));
    assert!(wait_for(Duration::from_secs(10), || !pid_alive(agent)));
    assert!(left.exists(), "the kill left its socket");
    // A live socket of another agent (this test, bound and alive).
    let live = usual.join(format!("other.0.{}.sock", std::process::id()));
    let _held = std::os::unix::net::UnixDatagram::bind(&live).unwrap();
    let (o, _) = output_within(
        &mut socket_run(tmp.path(), "next", tmp.path(), "20"),
        Duration::from_secs(30),
    );
    assert_reported_on_the_socket(tmp.path(), "next", &o);
    assert!(
        !left.exists(),
        "stale socket {} not removed",
        left.display()
    );
    assert!(live.exists(), "a live socket was removed");
    // The next agent removed its own on the way out too.
    let next = socket_of(tmp.path(), "next").unwrap();
    assert!(!next.exists());
}

#[test]
fn journals_are_private() {
    let tmp = tempfile::tempdir().unwrap();
    // A state dir resilio makes itself.
    let state = tmp.path().join("state");
    let (o, _) = output_within(
        &mut run_trainer(&state, "priv", &[], &["--steps", "3", "--interval", "0.01"]),
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    let job = resilio::journal::job_dir(&state, "priv");
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("jobs")), 0o700);
    assert_eq!(mode(&job), 0o700);
    let files: Vec<PathBuf> = std::fs::read_dir(&job)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    assert!(!files.is_empty());
    for f in files {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
    // A stall's diagnostics too (they hold output lines and stacks).
    let (o, _) = output_within(
        &mut run_trainer(
            &state,
            "privs",
            &["--stall-timeout", "1s"],
            &["--steps", "3", "--interval", "0.01", "--then", "hang"],
        ),
        Duration::from_secs(40),
    );
    assert_eq!(o.status.code(), Some(124), "{}", stderr_of(&o));
    let diag = resilio::journal::job_dir(&state, "privs").join("diag");
    assert_eq!(mode(&diag), 0o700);
    let files: Vec<PathBuf> = std::fs::read_dir(&diag)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!files.is_empty());
    for f in files {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
    // The local launcher's directory and files too.
    let ck = tmp.path().join("ck");
    let (o, _) = output_within(
        &mut run_local(
            &state,
            "privl",
            2,
            &[],
            &[
                "--total",
                "3",
                "--step-time",
                "0.01",
                "--ckpt-dir",
                ck.to_str().unwrap(),
            ],
        ),
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    let job = resilio::journal::job_dir(&state, "privl");
    assert_eq!(mode(&job), 0o700);
    for e in std::fs::read_dir(&job).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "jsonl") {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }
}

#[test]
fn a_full_disk_costs_a_gap_that_is_journaled_and_reported_then_writing_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = match Tmpfs::mount(&tmp.path().join("mnt"), "1m") {
        Ok(fs) => fs,
        Err(e) => {
            println!("skipped: cannot mount a tmpfs here ({e})");
            return;
        }
    };
    let state = fs.0.join("state");
    // Every step journaled, so that the full disk costs records.
    let cfg = write_config(tmp.path(), "[journal]\nprogress_interval = \"0s\"\n");
    let mut c = run_trainer(
        &state,
        "full",
        &["--config", cfg.to_str().unwrap()],
        &["--steps", "150", "--interval", "0.02"],
    );
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let steps = |state: &Path| {
        records(state, "full")
            .iter()
            .filter_map(|r| (r.kind == "progress").then(|| r.u64("step")).flatten())
            .max()
    };
    assert!(wait_for(Duration::from_secs(20), || steps(&state)
        .is_some_and(|s| s >= 5)));
    // The disk fills up while the trainer goes on; some steps later it has
    // room again (the trainer's steps are not timed: it goes on regardless).
    let filler = fs.0.join("filler");
    fill(&filler);
    let full_at = steps(&state).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    std::fs::remove_file(&filler).unwrap();
    let (o, _) = wait_output(child, Duration::from_secs(30));
    assert!(o.status.success(), "{}", stderr_of(&o));
    let recs = records(&state, "full");
    let gaps = kinds(&recs, "journal_gap");
    assert_eq!(gaps.len(), 1, "{}", stderr_of(&o));
    let gap = gaps[0];
    let lost = gap.u64("lost_records").unwrap();
    assert!(lost > 0);
    let (from, to) = (gap.str("from").unwrap(), gap.str("to").unwrap());
    assert!(from < to);
    // Writing resumed: the records after the gap go on to the end.
    let after: Vec<u64> = recs
        .iter()
        .filter(|r| r.kind == "progress" && r.ts > gap.ts)
        .filter_map(|r| r.u64("step"))
        .collect();
    assert!(after.len() > 10, "{after:?}");
    assert_eq!(one(&recs, "rank_exit").u64("last_step"), Some(150));
    assert!(*after.first().unwrap() > full_at);
    println!(
        "{lost} records lost from {from} to {to}; {} progress records after",
        after.len()
    );
    // Said on stderr: the journal failed, then was written again.
    let err = stderr_of(&o);
    assert!(err.contains("cannot write journal"), "{err}");
    assert!(err.contains("written again"), "{err}");
    // The report and the timeline name it.
    let mut c = std::process::Command::new(bin());
    c.env("RESILIO_STATE_DIR", &state).args(["report", "full"]);
    let (o, _) = output_within(&mut c, Duration::from_secs(20));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert!(text.contains("journal gaps"), "{text}");
    assert!(
        text.contains(&format!("{lost} record(s) lost from")),
        "{text}"
    );
    let unexplained: f64 = text
        .lines()
        .find(|l| l.trim_start().starts_with("unexplained"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.trim_end_matches('s').parse().ok())
        .unwrap();
    assert!(unexplained > 0.0, "{text}");
    let mut c = std::process::Command::new(bin());
    c.env("RESILIO_STATE_DIR", &state)
        .args(["timeline", "full"]);
    let (o, _) = output_within(&mut c, Duration::from_secs(20));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.contains("journal gap:"), "{text}");
    assert!(text.contains("unexplained"), "{text}");
}
