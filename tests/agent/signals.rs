use crate::common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::process::Stdio;
use std::time::{Duration, Instant};

struct Live {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

/// Start resilio around a trainer that logs the signals it gets, and wait
/// until the trainer has installed its handlers.
fn start(extra_trainer: &[&str], opts: &[&str]) -> Live {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let log = dir.path().join("signals.log");
    let mut args = vec![
        "--ready-file",
        ready.to_str().unwrap(),
        "--signal-log",
        log.to_str().unwrap(),
        "--steps",
        "100000",
        "--interval",
        "0.05",
    ];
    args.extend_from_slice(extra_trainer);
    let mut c = run_trainer(dir.path(), "sig", opts, &args);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    assert!(
        wait_for(Duration::from_secs(15), || ready.exists()),
        "trainer never became ready"
    );
    Live { child, dir }
}

impl Live {
    fn signal(&self, s: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), s).unwrap();
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("signals.log")).unwrap_or_default()
    }
}

#[test]
fn every_listed_signal_is_forwarded_to_the_trainer() {
    let live = start(&[], &[]);
    for (sig, name) in [
        (Signal::SIGHUP, "SIGHUP"),
        (Signal::SIGUSR1, "SIGUSR1"),
        (Signal::SIGUSR2, "SIGUSR2"),
        (Signal::SIGCONT, "SIGCONT"),
    ] {
        live.signal(sig);
        assert!(
            wait_for(Duration::from_secs(10), || live.log().contains(name)),
            "{name} not forwarded; log: {}",
            live.log()
        );
    }
    // SIGTERM is forwarded too, and the trainer's clean exit is ours.
    live.signal(Signal::SIGTERM);
    let dir = live.dir;
    let (o, _) = wait_output(live.child, Duration::from_secs(20));
    assert!(std::fs::read_to_string(dir.path().join("signals.log"))
        .unwrap()
        .contains("SIGTERM"));
    assert_eq!(o.status.code(), Some(0));
    let recs = records(dir.path(), "sig");
    let forwarded: Vec<&str> = kinds(&recs, "signal")
        .iter()
        .filter_map(|r| r.str("signal"))
        .collect();
    assert!(
        forwarded.contains(&"SIGUSR1") && forwarded.contains(&"SIGTERM"),
        "{forwarded:?}"
    );
    assert_eq!(
        one(&recs, "rank_exit").str("cause"),
        Some("stopped by SIGTERM")
    );
    assert!(
        kinds(&recs, "failure").is_empty(),
        "a requested stop is not a failure"
    );
}

#[test]
fn sigquit_and_sigalrm_are_passed_on_and_end_the_rank_like_sigterm() {
    for (sig, name) in [(Signal::SIGQUIT, "SIGQUIT"), (Signal::SIGALRM, "SIGALRM")] {
        let live = start(&[], &[]);
        live.signal(sig);
        let dir = live.dir;
        let (o, _) = wait_output(live.child, Duration::from_secs(20));
        // The trainer got it, ended cleanly on it, and that is resilio's status.
        assert!(
            std::fs::read_to_string(dir.path().join("signals.log"))
                .unwrap()
                .contains(name),
            "{name}"
        );
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr_of(&o));
        let recs = records(dir.path(), "sig");
        let exit = one(&recs, "rank_exit");
        assert_eq!(
            exit.str("cause"),
            Some(format!("stopped by {name}").as_str())
        );
        assert!(kinds(&recs, "failure").is_empty(), "{name}: {recs:#?}");
    }
}

#[test]
fn sigquit_to_the_launcher_stops_every_rank_and_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("signals.log");
    // A child pid file per rank: the trainer is started through a shell.
    let script = format!(
        "exec python3 {} --steps 100000 --interval 0.05 --signal-log {} --group-child-pid-file {}/child-${{RANK:-0}}",
        trainer().display(),
        log.display(),
        dir.path().display()
    );
    let mut c = resilio_run(dir.path(), "quit");
    c.args([
        "--ntasks",
        "2",
        "--max-restarts",
        "3",
        "--kill-grace",
        "2s",
        "--",
        "sh",
        "-c",
    ])
    .arg(&script)
    .current_dir(dir.path())
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let pid_of = |rank: u32| -> Option<i32> {
        std::fs::read_to_string(dir.path().join(format!("child-{rank}")))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    assert!(wait_for(Duration::from_secs(20), || pid_of(0).is_some()
        && pid_of(1).is_some()));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGQUIT).unwrap();
    let (o, _) = wait_output(child, Duration::from_secs(30));
    let recs = records(dir.path(), "quit");
    // Stopped from outside: no restart, every rank ended on the signal.
    assert!(kinds(&recs, "restart").is_empty(), "{recs:#?}");
    let exits = kinds(&recs, "rank_exit");
    assert_eq!(exits.len(), 2, "{}", stderr_of(&o));
    for e in exits {
        assert_eq!(e.str("cause"), Some("stopped by SIGQUIT"), "{e:?}");
    }
    assert_eq!(
        one(&recs, "job_end").str("reason"),
        Some("stopped by SIGQUIT")
    );
    assert_eq!(
        std::fs::read_to_string(&log)
            .unwrap()
            .matches("SIGQUIT")
            .count(),
        2
    );
    // The children that ignored SIGTERM were killed with their ranks.
    for rank in 0..2 {
        let p = pid_of(rank).unwrap();
        assert!(
            wait_for(Duration::from_secs(5), || !pid_alive(p)),
            "rank {rank}'s child {p} outlived it"
        );
    }
}

#[test]
fn a_double_ctrl_c_to_the_launcher_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("signals.log");
    // Trainers that ignore SIGINT, each with a child that ignores it too
    // (a shell's background job).
    let script = format!(
        "sleep 1000 & echo $! > {}/child-${{RANK:-0}}; exec python3 {} --steps 100000 --interval 0.05 --signal-log {} --ignore INT --ready-file {0}/ready-${{RANK:-0}}",
        dir.path().display(),
        trainer().display(),
        log.display(),
    );
    let mut c = resilio_run(dir.path(), "ctrlc");
    c.args(["--ntasks", "2", "--kill-grace", "60s", "--", "sh", "-c"])
        .arg(&script)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let pid_of = |rank: u32| -> Option<i32> {
        std::fs::read_to_string(dir.path().join(format!("child-{rank}")))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let ready = |rank: u32| dir.path().join(format!("ready-{rank}")).exists();
    assert!(wait_for(Duration::from_secs(20), || pid_of(0).is_some()
        && pid_of(1).is_some()
        && ready(0)
        && ready(1)));
    let launcher = Pid::from_raw(child.id() as i32);
    kill(launcher, Signal::SIGINT).unwrap();
    assert!(wait_for(
        Duration::from_secs(10),
        || std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("SIGINT")
            .count()
            == 2
    ));
    assert!(pid_alive(pid_of(0).unwrap()) && pid_alive(pid_of(1).unwrap()));
    kill(launcher, Signal::SIGINT).unwrap();
    // Not the 60 s grace: the second Ctrl-C kills at once.
    let _ = wait_output(child, Duration::from_secs(30));
    let left: Vec<i32> = (0..2)
        .filter_map(pid_of)
        .filter(|p| !wait_for(Duration::from_secs(5), || !pid_alive(*p)))
        .collect();
    for p in &left {
        let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
    }
    assert!(left.is_empty(), "{left:?} outlived a double Ctrl-C");
}

#[test]
fn sigint_is_forwarded() {
    let live = start(&[], &[]);
    live.signal(Signal::SIGINT);
    let dir = live.dir;
    let (o, _) = wait_output(live.child, Duration::from_secs(20));
    assert!(std::fs::read_to_string(dir.path().join("signals.log"))
        .unwrap()
        .contains("SIGINT"));
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn sigterm_then_sigkill_after_the_grace() {
    let live = start(&["--ignore", "TERM"], &["--kill-grace", "1500ms"]);
    let t = Instant::now();
    live.signal(Signal::SIGTERM);
    let (o, _) = wait_output(live.child, Duration::from_secs(30));
    let took = t.elapsed();
    assert_eq!(o.status.code(), Some(137), "SIGKILL after the grace");
    assert!(
        took >= Duration::from_millis(1400),
        "killed before the grace: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "grace not enforced: {took:?}"
    );
}

#[test]
fn a_second_sigint_kills_at_once() {
    let live = start(&["--ignore", "INT"], &["--kill-grace", "60s"]);
    live.signal(Signal::SIGINT);
    assert!(wait_for(Duration::from_secs(10), || live
        .log()
        .contains("SIGINT")));
    let t = Instant::now();
    live.signal(Signal::SIGINT);
    let (o, _) = wait_output(live.child, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(137));
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "second SIGINT must not wait for the 60 s grace"
    );
}

#[test]
fn no_descendant_outlives_resilio() {
    let dir = tempfile::tempdir().unwrap();
    let orphan = dir.path().join("orphan.pid");
    let group_child = dir.path().join("group.pid");
    // The trainer leaves a setsid'd sleeper (outside its process group) and
    // a child that ignores SIGTERM, then exits 0.
    let mut c = run_trainer(
        dir.path(),
        "orphans",
        &["--kill-grace", "1s"],
        &[
            "--orphan-pid-file",
            orphan.to_str().unwrap(),
            "--group-child-pid-file",
            group_child.to_str().unwrap(),
            "--steps",
            "3",
        ],
    );
    let (o, took) = output_within(&mut c, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    for f in [&orphan, &group_child] {
        let pid: i32 = std::fs::read_to_string(f).unwrap().trim().parse().unwrap();
        assert!(
            !pid_alive(pid),
            "pid {pid} from {} outlived resilio",
            f.display()
        );
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} left as zombie"
        );
    }
    assert!(
        took >= Duration::from_millis(900),
        "the TERM-ignoring child needed the grace"
    );
}

#[test]
fn killing_resilio_takes_the_trainer_with_it() {
    let live = start(&[], &[]);
    let trainer_pid: i32 = std::fs::read_to_string(live.dir.path().join("ready"))
        .unwrap()
        .parse()
        .unwrap();
    live.signal(Signal::SIGKILL);
    let _ = wait_output(live.child, Duration::from_secs(10));
    assert!(
        wait_for(Duration::from_secs(10), || !pid_alive(trainer_pid)),
        "trainer {trainer_pid} survived resilio's SIGKILL"
    );
}
