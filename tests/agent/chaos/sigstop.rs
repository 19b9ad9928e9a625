//! A trainer stopped with SIGSTOP and left stopped.

use super::*;

/// Case 1: a trainer stopped with SIGSTOP and left stopped, past the stall
/// timeout. A SIGTERM to a stopped process stays pending; the rank must be
/// stopped all the same (SIGKILL after the grace), judged a hang of that
/// rank, and the run restarted in place from the trainer's checkpoint.
#[test]
fn a_sigstopped_trainer_is_judged_a_hang_stopped_and_the_run_resumes_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = Marker::new("sigstop");
    let (state, job, ck) = (tmp.path(), "sigstop", tmp.path().join("ck"));
    let args = lockstep_args(30, &ck);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cfg = every_step_journaled(state);
    let mut c = run_local(
        state,
        job,
        2,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--stall-timeout",
            "3s",
            "--kill-grace",
            "5s",
            "--max-restarts",
            "2",
        ],
        &args,
    );
    mark.on(&mut c)
        .current_dir(state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let child = c.spawn().unwrap();
    // Rank 1 steps past its first checkpoint; then its trainer is stopped.
    let mut trainer = None;
    assert!(
        wait_for(Duration::from_secs(30), || {
            let recs = records(state, job);
            trainer = recs
                .iter()
                .find(|r| r.kind == "rank_start" && r.rank == Some(1) && r.attempt == 0)
                .and_then(|r| r.get("pid")?.as_i64());
            trainer.is_some() && step_of(state, job, 1, 0).is_some_and(|s| s >= 8)
        }),
        "rank 1 never got to step 8: {:#?}",
        records(state, job)
    );
    let trainer = trainer.unwrap() as i32;
    // Its whole group (the trainer is its group's leader).
    kill(Pid::from_raw(-trainer), Signal::SIGSTOP).unwrap();
    let stopped_at = Instant::now();
    let stopped_step = step_of(state, job, 1, 0).unwrap();
    assert!(wait_for(Duration::from_secs(2), || {
        std::fs::read_to_string(format!("/proc/{trainer}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('T')
        })
    }));
    // Left stopped: resilio must end it itself, within the stall timeout,
    // the diagnostics and the grace (3 s + 5 s), with some slack.
    assert!(
        wait_for(Duration::from_secs(20), || !pid_alive(trainer)),
        "the stopped trainer {trainer} was left alive"
    );
    let ended_after = stopped_at.elapsed();
    let (out, took) = wait_output(child, Duration::from_secs(90));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}\n{stdout}", stderr_of(&out));
    let recs = records(state, job);
    // The journal: a stall of rank 1, judged a hang of rank 1 (the other
    // rank only waited for it), one restart in place, a whole attempt 1.
    assert!(
        kinds(&recs, "stall")
            .iter()
            .any(|s| s.rank == Some(1) && s.attempt == 0),
        "{recs:#?}"
    );
    let h = one(&recs, "hang");
    assert_eq!(
        h.get("verdict").unwrap()["blamed_ranks"],
        serde_json::json!([1]),
        "{h:?}"
    );
    let j = one(&recs, "judgment");
    assert_eq!(
        (j.str("class"), j.u64("primary_rank")),
        (Some("hang"), Some(1)),
        "{j:?}"
    );
    let restart = one(&recs, "restart");
    assert_eq!(restart.get("in_place"), Some(&serde_json::json!(true)));
    let exit0 = kinds(&recs, "rank_exit")
        .into_iter()
        .find(|r| r.attempt == 0 && r.rank == Some(1))
        .expect("rank 1's exit in attempt 0");
    // Stopped as it was: SIGCONT after the SIGTERM let it act on the
    // SIGTERM at once (a stopped process keeps it pending), not at the
    // SIGKILL after the grace.
    assert_eq!(
        exit0.str("status"),
        Some("signal 15 (SIGTERM)"),
        "{exit0:?}"
    );
    assert!(
        ended_after < Duration::from_millis(6500),
        "ended {ended_after:?} after SIGSTOP: the grace was waited out"
    );
    assert!(
        !kinds(&recs, "stop")
            .iter()
            .any(|s| s.str("signal") == Some("SIGKILL")),
        "{recs:#?}"
    );
    // Its probe saw it stopped: not waiting on a peer, whatever system
    // call it was stopped in.
    let probed = kinds(&recs, "probe")
        .into_iter()
        .filter(|p| p.rank == Some(1) && p.attempt == 0)
        .map(|p| p.get("probe").unwrap()["evidence"].to_string())
        .collect::<Vec<_>>();
    assert!(
        !probed.is_empty() && probed.iter().all(|e| e.contains("stopped (SIGSTOP")),
        "{probed:?}"
    );
    for r in kinds(&recs, "rank_exit").iter().filter(|r| r.attempt == 1) {
        assert_eq!(
            (r.u64("exit_code"), r.u64("last_step")),
            (Some(0), Some(30)),
            "{r:?}"
        );
    }
    // The trainer's own record: two attempts, the second resumed from the
    // last checkpoint before the stop (steps kept), and it saved the end.
    let (attempts, resumed) = trainer_story(&stdout);
    assert_eq!(attempts, vec![0, 1], "{stdout}");
    let kept = stopped_step / 5 * 5;
    assert_eq!(resumed.len(), 2, "both ranks resumed: {stdout}");
    for r in &resumed {
        // The stop may land just after the progress record of a checkpoint step.
        assert!(
            *r == kept || *r == kept + 5,
            "resumed from #{r}, stopped at step {stopped_step}: {stdout}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(ck.join("latest")).unwrap().trim(),
        "30"
    );
    mark.assert_none_left(Duration::from_secs(10));
    println!(
        "stopped at step {stopped_step}; trainer ended {ended_after:?} after SIGSTOP; \
         run took {took:?} ({:?} in all); resumed from {resumed:?}",
        started.elapsed()
    );
}
