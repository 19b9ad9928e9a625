//! The wall clock stepped under resilio (libfaketime).

use super::*;

/// libfaketime, multi-threaded build first (resilio runs tokio's threads);
/// Debian's `faketime` package (tests/run.sh installs it).
fn libfaketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// Case 4: the wall clock steps (an NTP step: +1 h, or -10 min) under
/// resilio while two ranks train. libfaketime is preloaded into resilio
/// (the launcher with its coordinator, and the agents), not into the
/// trainers (`env -u LD_PRELOAD`); its offset is read from a file on every
/// call, rewritten mid-run. CLOCK_MONOTONIC stays real
/// (`FAKETIME_DONT_FAKE_MONOTONIC=1`), as it does on Linux when the wall
/// clock is stepped. Nothing may take the step for a stall, a hang or a
/// straggler; the run completes; every record is whole; and the report
/// counts neither an hour of work nor an hour lost (nor a negative span).
#[test]
fn a_wall_clock_step_under_resilio_is_no_stall_and_costs_no_time_in_the_report() {
    let Some(lib) = libfaketime() else {
        println!("skipped: libfaketime not found (Debian package faketime)");
        return;
    };
    for (job, offset) in [("clockfwd", "+3600"), ("clockback", "-600")] {
        let tmp = tempfile::tempdir().unwrap();
        let mark = Marker::new(job);
        let (state, ck) = (tmp.path(), tmp.path().join("ck"));
        let clock = tmp.path().join("faketime");
        std::fs::write(&clock, "+0\n").unwrap();
        // Short limits, so that time taken from the wall clock would show:
        // a 3 s stall timeout, straggler windows of 1 s.
        let cfg = write_config(
            state,
            "[journal]\nprogress_interval = \"0s\"\n\
             [coordinator]\nreport_interval = \"200ms\"\n\
             [straggler]\nwindow = \"1s\"\nwindows = 2\ncheckpoint = false\n",
        );
        let mut c = resilio_run(state, job);
        c.args([
            "--ntasks",
            "2",
            "--max-restarts",
            "0",
            "--stall-timeout",
            "3s",
        ])
        .arg("--config")
        .arg(&cfg)
        .args(["--", "env", "-u", "LD_PRELOAD", "python3"])
        .arg(lockstep())
        .args(lockstep_args(60, &ck))
        .env("LD_PRELOAD", &lib)
        .env("FAKETIME_TIMESTAMP_FILE", &clock)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .current_dir(state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        mark.on(&mut c);
        let started = Instant::now();
        let child = c.spawn().unwrap();
        assert!(
            wait_for(Duration::from_secs(30), || step_of(state, job, 0, 0)
                .is_some_and(|s| s >= 20)),
            "{job}: rank 0 never got to step 20"
        );
        std::fs::write(&clock, format!("{offset}\n")).unwrap();
        // The step is real to a process under libfaketime...
        let faked = Command::new("date")
            .arg("+%s")
            .env("LD_PRELOAD", &lib)
            .env("FAKETIME_TIMESTAMP_FILE", &clock)
            .env("FAKETIME_NO_CACHE", "1")
            .output()
            .unwrap();
        let faked: i64 = String::from_utf8_lossy(&faked.stdout)
            .trim()
            .parse()
            .unwrap();
        let real = chrono::Utc::now().timestamp();
        let want: i64 = offset.parse().unwrap();
        assert!(
            (faked - real - want).abs() <= 2,
            "{job}: date says {faked}, now is {real}"
        );
        // ...and resilio (launcher and agents) runs under it, the trainers not.
        let (mut ours, mut trainers) = (0, 0);
        for p in mark.live() {
            let maps = std::fs::read_to_string(format!("/proc/{p}/maps")).unwrap_or_default();
            let exe = std::fs::read_link(format!("/proc/{p}/exe")).unwrap_or_default();
            if exe.file_name().is_some_and(|n| n == "resilio") {
                assert!(
                    maps.contains("libfaketime"),
                    "{job}: resilio {p} without libfaketime"
                );
                ours += 1;
            } else if exe.to_string_lossy().contains("python") {
                assert!(
                    !maps.contains("libfaketime"),
                    "{job}: trainer {p} under libfaketime"
                );
                trainers += 1;
            }
        }
        assert_eq!(
            (ours, trainers),
            (3, 2),
            "{job}: launcher, 2 agents, 2 trainers"
        );
        let (out, _) = wait_output(child, Duration::from_secs(60));
        let took = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{job}: {}", stderr_of(&out));
        let recs = records(state, job);
        // No stall, hang, straggler or failure taken from it.
        for kind in ["stall", "hang", "judgment", "failure", "restart", "resumed"] {
            assert!(kinds(&recs, kind).is_empty(), "{job}: {kind}: {recs:#?}");
        }
        assert!(
            !kinds(&recs, "straggler")
                .iter()
                .any(|r| r.get("flagged") == Some(&serde_json::json!(true))),
            "{job}: {:#?}",
            kinds(&recs, "straggler")
        );
        for r in kinds(&recs, "rank_exit") {
            assert_eq!(
                (r.u64("exit_code"), r.u64("last_step")),
                (Some(0), Some(60)),
                "{job}: {r:?}"
            );
        }
        assert_journal_whole(state, job);
        // The trainer's own record: one attempt, nothing resumed, the end saved.
        let (attempts, resumed) = trainer_story(&stdout);
        assert_eq!((attempts, resumed), (vec![0], vec![]), "{job}: {stdout}");
        assert_eq!(
            std::fs::read_to_string(ck.join("latest")).unwrap().trim(),
            "60"
        );
        // The report: the wall time is the run's, and mostly productive.
        let rep = report_json(state, job);
        let wall = rep["wall_s"].as_f64().unwrap();
        let productive = rep["productive_s"].as_f64().unwrap();
        assert!(
            wall > 3.0 && wall <= took.as_secs_f64() + 1.0,
            "{job}: wall {wall} s for a run of {took:?}: {rep:#}"
        );
        assert!(productive > 0.5 * wall, "{job}: {rep:#}");
        for (bucket, s) in rep["lost_s"].as_object().unwrap() {
            let s = s.as_f64().unwrap();
            assert!((0.0..5.0).contains(&s), "{job}: {bucket} {s} s: {rep:#}");
        }
        mark.assert_none_left(Duration::from_secs(10));
        println!(
            "{job} ({offset} s): run {took:?}; report: wall {wall:.1} s, productive {productive:.1} s"
        );
    }
}
