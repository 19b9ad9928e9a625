//! The coordinator and local mode (`resilio run --ntasks N`): real rank
//! agents, a real lockstep trainer (tests/fixtures/lockstep_trainer.py),
//! real HTTP on loopback.

use crate::common::*;
use resilio::journal::Record;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn ranks_of(recs: &[Record], kind: &str, attempt: u32) -> Vec<u32> {
    let mut v: Vec<u32> = recs
        .iter()
        .filter(|r| r.kind == kind && r.attempt == attempt)
        .filter_map(|r| r.rank)
        .collect();
    v.sort();
    v
}

#[test]
fn a_crash_of_rank_2_restarts_all_ranks_in_place_and_the_run_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let (out, _) = output_within(
        run_local(
            tmp.path(),
            "crash",
            4,
            &["--kill-grace", "3s"],
            &[
                "--total",
                "14",
                "--step-time",
                "0.1",
                "--ckpt-every",
                "4",
                "--ckpt-dir",
                ck.to_str().unwrap(),
                "--fault",
                "kill",
                "--fault-rank",
                "2",
                "--fault-step",
                "7",
            ],
        )
        .current_dir(tmp.path()),
        Duration::from_secs(90),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "crash");
    // Attempt 0: rank 2 died; the coordinator stopped the others at once.
    let teardown = kinds(&recs, "teardown");
    assert!(!teardown.is_empty(), "{recs:#?}");
    let j = one(&recs, "judgment");
    assert_eq!(j.u64("primary_rank"), Some(2), "{j:?}");
    assert_eq!(j.str("class"), Some("infrastructure"));
    let restart = one(&recs, "restart");
    assert_eq!(restart.get("in_place"), Some(&serde_json::json!(true)));
    // Every rank ran again, resumed from the checkpoint, and finished.
    assert_eq!(ranks_of(&recs, "rank_start", 1), vec![0, 1, 2, 3]);
    for r in kinds(&recs, "rank_exit").iter().filter(|r| r.attempt == 1) {
        assert_eq!(r.u64("exit_code"), Some(0), "{r:?}");
        assert_eq!(r.u64("last_step"), Some(14));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("resumed from checkpoint #4"), "{stdout}");
    // Each attempt had its own MASTER_PORT; the relaunch was timed.
    let ports: Vec<u64> = kinds(&recs, "launch")
        .iter()
        .filter_map(|r| r.u64("master_port"))
        .collect();
    assert_eq!(ports.len(), 2);
    assert_ne!(ports[0], ports[1]);
    let rel = one(&recs, "relaunched");
    assert_eq!(rel.attempt, 1);
    assert!(rel.f64("failure_to_first_step_s").unwrap() > 0.0);
    // Rank 2's death was seen within a second, not after a collective timeout.
    let died = kinds(&recs, "rank_exit")
        .into_iter()
        .find(|r| r.attempt == 0 && r.rank == Some(2))
        .unwrap()
        .ts;
    let stopped = teardown[0].ts;
    assert!(
        (stopped - died).num_milliseconds() < 1000,
        "{died} -> {stopped}"
    );
}

#[test]
fn a_hang_of_rank_1_is_blamed_on_rank_1_not_on_the_ranks_waiting_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let (out, _) = output_within(
        &mut run_local(
            tmp.path(),
            "hang",
            4,
            &[
                "--kill-grace",
                "3s",
                "--stall-timeout",
                "3s",
                "--max-restarts",
                "0",
            ],
            &[
                "--total",
                "30",
                "--step-time",
                "0.1",
                "--ckpt-dir",
                ck.to_str().unwrap(),
                "--fault",
                "hang",
                "--fault-rank",
                "1",
                "--fault-step",
                "6",
            ],
        ),
        Duration::from_secs(90),
    );
    let recs = records(tmp.path(), "hang");
    let h = one(&recs, "hang");
    let v = h.get("verdict").unwrap();
    assert_eq!(v["blamed_ranks"], serde_json::json!([1]), "{h:?}");
    let j = one(&recs, "judgment");
    assert_eq!(j.u64("primary_rank"), Some(1), "{j:?}");
    assert_eq!(j.str("class"), Some("hang"));
    // The waiting ranks are echoes, not causes.
    let secondary = j.get("secondary").unwrap().as_array().unwrap().len();
    assert_eq!(secondary, 3, "{j:?}");
    // Budget 0: no restart; the hang's exit code comes through.
    assert!(kinds(&recs, "restart").is_empty());
    assert_ne!(out.status.code(), Some(0));
}

#[test]
fn a_rank_with_twice_the_compute_time_is_flagged_as_straggler_and_no_other() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(
        tmp.path(),
        "[coordinator]\nreport_interval = \"200ms\"\n[straggler]\nwindow = \"1s\"\nwindows = 2\ncheckpoint = false\n",
    );
    let ck = tmp.path().join("ck");
    let (out, _) = output_within(
        &mut run_local(
            tmp.path(),
            "slow",
            4,
            &["--config", cfg.to_str().unwrap()],
            &[
                "--total",
                "45",
                "--step-time",
                "0.08",
                "--ckpt-dir",
                ck.to_str().unwrap(),
                "--slow-rank",
                "3",
                "--slow-factor",
                "2",
            ],
        ),
        Duration::from_secs(90),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "slow");
    let flagged: Vec<&Record> = kinds(&recs, "straggler")
        .into_iter()
        .filter(|r| {
            r.get("flagged") == Some(&serde_json::json!(true)) && r.str("scope") == Some("rank")
        })
        .collect();
    assert_eq!(flagged.len(), 1, "{:#?}", kinds(&recs, "straggler"));
    assert_eq!(flagged[0].str("who"), Some("3"));
    assert_eq!(flagged[0].str("basis"), Some("compute_time"));
    let ratio = flagged[0].f64("ratio").unwrap();
    assert!((1.6..2.6).contains(&ratio), "{ratio}");
}

pub(crate) fn coordinator_of(state: &Path, job: &str) -> Option<(String, String)> {
    resilio::coordinator::discover_files(&resilio::journal::job_dir(state, job))
}

/// One raw HTTP/1.1 request (no client library: what an attacker would send).
pub(crate) fn http(
    url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    try_http(url, method, path, token, body).unwrap()
}

/// [`http`], an I/O error returned (a coordinator that went between two
/// attempts).
pub(crate) fn try_http(
    url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr)?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse()
        .unwrap_or(0);
    Ok((code, text))
}

#[test]
fn an_operator_checkpoint_lands_at_the_same_step_on_every_rank_and_strangers_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let mut cmd = run_local(
        tmp.path(),
        "ckpt",
        4,
        &[],
        &[
            "--total",
            "80",
            "--step-time",
            "0.1",
            "--ckpt-every",
            "1000",
            "--ckpt-dir",
            ck.to_str().unwrap(),
        ],
    );
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let state = tmp.path();
    assert!(wait_for(Duration::from_secs(20), || coordinator_of(
        state, "ckpt"
    )
    .is_some()));
    let (url, token) = coordinator_of(state, "ckpt").unwrap();
    // The token file is private.
    use std::os::unix::fs::PermissionsExt;
    let mode =
        std::fs::metadata(resilio::journal::job_dir(state, "ckpt").join("coordinator.token"))
            .unwrap()
            .permissions()
            .mode();
    assert_eq!(mode & 0o777, 0o600);
    // Wait for every rank to be stepping.
    let status = || {
        Command::new(bin())
            .args(["status", "--json", "--state-dir"])
            .arg(state)
            .arg("ckpt")
            .output()
            .unwrap()
    };
    assert!(wait_for(Duration::from_secs(30), || {
        let o = status();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        v["ranks"].as_array().is_some_and(|r| r.len() == 4) && v["step"].as_u64().unwrap_or(0) >= 5
    }));
    // Strangers: no token, a wrong token.
    let body = r#"{"v":1,"rank":0,"node":"x","attempt":0,"pid":1,"state":"running","step":999999,"progress_age_s":0,"intervals":[0,0],"compute":[0,0],"phase":"train","checkpoints":[],"exit":null,"waiting_on_peer":null,"probe":null,"commands_seen":0}"#;
    assert_eq!(http(&url, "POST", "/v1/report", None, body).0, 401);
    assert_eq!(
        http(&url, "POST", "/v1/report", Some("not-the-token"), body).0,
        401
    );
    assert_eq!(http(&url, "POST", "/v1/checkpoint", None, "{}").0, 401);
    // The operator asks for a checkpoint.
    let o = Command::new(bin())
        .args(["checkpoint", "--json", "--state-dir"])
        .arg(state)
        .arg("ckpt")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let step = answer["step"].as_u64().unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || {
            kinds(&records(state, "ckpt"), "checkpoint_complete").len() == 1
        }),
        "{:#?}",
        records(state, "ckpt")
    );
    let recs = records(state, "ckpt");
    let done = one(&recs, "checkpoint_complete");
    assert_eq!(done.u64("step"), Some(step));
    assert_eq!(
        done.get("confirmed_ranks"),
        Some(&serde_json::json!([0, 1, 2, 3]))
    );
    // Every rank saved at that same step.
    for r in 0..4 {
        assert!(
            ck.join(format!("requested-rank{r}-step{step}")).exists(),
            "rank {r}"
        );
        let mine: Vec<u64> = kinds(&recs, "checkpoint_done")
            .iter()
            .filter(|x| x.rank == Some(r))
            .filter_map(|x| x.u64("step"))
            .collect();
        assert_eq!(mine, vec![step], "rank {r}");
    }
    // Status and metrics (with the token) tell the same story.
    let text = Command::new(bin())
        .args(["status", "--state-dir"])
        .arg(state)
        .arg("ckpt")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains("RANK") && text.contains(&format!("at step {step}")),
        "{text}"
    );
    assert!(
        text.contains("refused for a missing or wrong token: 3"),
        "{text}"
    );
    let (code, metrics) = http(&url, "GET", "/metrics", Some(&token), "");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("resilio_unauthorized_requests_total{job=\"ckpt\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("resilio_checkpoints_total{job=\"ckpt\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("resilio_step{job=\"ckpt\",rank=\"3\""),
        "{metrics}"
    );
    assert_eq!(http(&url, "GET", "/metrics", None, "").0, 401);
    let (out, _) = wait_output(child, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    // The stranger's fake step never reached the view.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("999999"));
}

/// A standalone coordinator for `job` (`extra`: more options) and the URL
/// it printed.
fn standalone_coordinator(
    state: &Path,
    job: &str,
    extra: &[&str],
) -> (std::process::Child, String) {
    let mut coord = Command::new(bin())
        .args(["__coordinator", "--job-id", job, "--world-size", "2"])
        .args(extra)
        .arg("--state-dir")
        .arg(state)
        .env("RESILIO_SYSTEM_CONFIG", "")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut one_byte = [0u8; 1];
    let mut so = coord.stdout.take().unwrap();
    while !line.ends_with('\n') {
        if so.read(&mut one_byte).unwrap() == 0 {
            break;
        }
        line.push(one_byte[0] as char);
    }
    (coord, line.trim().to_string())
}

/// Two ranks (the test trainer, `steps` steps 0.1 s apart) whose agents
/// report to the coordinator at `url`.
fn linked_ranks(
    state: &Path,
    job: &str,
    url: &str,
    token: &str,
    steps: &str,
) -> Vec<std::process::Child> {
    (0..2)
        .map(|r| {
            run_trainer(state, job, &[], &["--steps", steps, "--interval", "0.1"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("RESILIO_COORDINATOR", url)
                .env("RESILIO_COORDINATOR_TOKEN", token)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

#[test]
fn killing_the_coordinator_does_not_kill_training() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut coord, url) = standalone_coordinator(tmp.path(), "orphan", &[]);
    let token = coordinator_of(tmp.path(), "orphan").unwrap().1;
    let ranks = linked_ranks(tmp.path(), "orphan", &url, &token, "30");
    // Both ranks report, then the coordinator dies hard.
    assert!(wait_for(Duration::from_secs(20), || {
        let (c, body) = http(&url, "GET", "/v1/status", Some(&token), "");
        c == 200 && body.matches("\"state\":\"running\"").count() == 2
    }));
    coord.kill().unwrap();
    coord.wait().unwrap();
    for r in ranks {
        let (out, _) = wait_output(r, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        assert!(
            stderr_of(&out).contains("coordinator unreachable"),
            "{}",
            stderr_of(&out)
        );
    }
    let recs = records(tmp.path(), "orphan");
    for r in 0..2 {
        assert!(
            kinds(&recs, "coordinator_unreachable")
                .iter()
                .any(|x| x.rank == Some(r)),
            "{recs:#?}"
        );
    }
    for r in kinds(&recs, "rank_exit") {
        assert_eq!(r.u64("last_step"), Some(30));
    }
}

#[test]
fn a_coordinator_that_comes_back_picks_up_the_ranks_again() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut first, url) = standalone_coordinator(tmp.path(), "back", &[]);
    let token = coordinator_of(tmp.path(), "back").unwrap().1;
    let ranks = linked_ranks(tmp.path(), "back", &url, &token, "120");
    assert!(wait_for(
        Duration::from_secs(20),
        || crate::status::running_steps(&url, &token).len() == 2
    ));
    // It dies hard, and the ranks lose it.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(wait_for(Duration::from_secs(20), || {
        kinds(&records(tmp.path(), "back"), "coordinator_unreachable").len() == 2
    }));
    // A new one takes over: same address, same token.
    let (mut second, url2) = standalone_coordinator(tmp.path(), "back", &["--take-over"]);
    assert_eq!(url2, url, "the address it took over");
    assert_eq!(coordinator_of(tmp.path(), "back").unwrap().1, token);
    // The ranks report to it again, with steps that move on.
    let mut seen = Vec::new();
    assert!(
        wait_for(Duration::from_secs(20), || {
            seen = crate::status::running_steps(&url, &token);
            seen.len() == 2 && seen.iter().all(|s| *s > 0)
        }),
        "{seen:?}"
    );
    for r in ranks {
        let (out, _) = wait_output(r, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    }
    let recs = records(tmp.path(), "back");
    for r in 0..2 {
        assert!(
            kinds(&recs, "coordinator_reachable")
                .iter()
                .any(|x| x.rank == Some(r)),
            "{recs:#?}"
        );
    }
    for r in kinds(&recs, "rank_exit") {
        assert_eq!(r.u64("last_step"), Some(120));
    }
    let starts = kinds(&recs, "coordinator_start");
    assert_eq!(starts.len(), 2, "{starts:#?}");
    assert_eq!(starts[1].u64("took_over_from"), Some(u64::from(first.id())));
    // Its exit reports arrived at the second one.
    let (c, body) = http(&url, "GET", "/v1/status", Some(&token), "");
    assert_eq!(c, 200);
    assert_eq!(body.matches("\"state\":\"exited\"").count(), 2, "{body}");
    // A live coordinator is never taken over.
    let third = Command::new(bin())
        .args([
            "__coordinator",
            "--job-id",
            "back",
            "--take-over",
            "--state-dir",
        ])
        .arg(tmp.path())
        .env("RESILIO_SYSTEM_CONFIG", "")
        .output()
        .unwrap();
    assert_eq!(third.status.code(), Some(2), "{}", stderr_of(&third));
    assert!(
        stderr_of(&third).contains("still running"),
        "{}",
        stderr_of(&third)
    );
    second.kill().unwrap();
    second.wait().unwrap();
}

#[test]
fn the_same_unexplained_crash_twice_is_a_crash_loop_and_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let (out, _) = output_within(
        &mut run_local(
            tmp.path(),
            "loop",
            2,
            &["--kill-grace", "2s"],
            &[
                "--total",
                "20",
                "--step-time",
                "0.05",
                "--ckpt-dir",
                ck.to_str().unwrap(),
                "--fault",
                "exit",
                "--fault-rank",
                "1",
                "--fault-step",
                "3",
                "--fault-attempts",
                "all",
            ],
        ),
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "loop");
    assert_eq!(
        kinds(&recs, "restart").len(),
        1,
        "one restart, then the loop is seen"
    );
    let end = one(&recs, "job_end");
    assert!(end.str("reason").unwrap().contains("crash loop"), "{end:?}");
}

#[test]
fn local_ranks_lines_do_not_cut_into_each_other() {
    let tmp = tempfile::tempdir().unwrap();
    // Each rank writes every line in two pieces, 20 ms apart (print, flush, print).
    let script = "import os, sys, time\nr = os.environ['RANK']\nfor i in range(15):\n    sys.stdout.write(f'rank {r} line {i} begins'); sys.stdout.flush(); time.sleep(0.02)\n    sys.stdout.write(' and ends\\n'); sys.stdout.flush()\n";
    let (out, _) = output_within(
        resilio_run(tmp.path(), "lines").args(["--ntasks", "3", "--", "python3", "-c", script]),
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 45, "{text}");
    for l in lines {
        assert!(
            l.starts_with("rank ")
                && l.ends_with(" begins and ends")
                && l.matches("rank").count() == 1,
            "cut line: {l:?}"
        );
    }
}

#[test]
fn label_prefixes_each_line_with_its_rank_as_srun_does() {
    let tmp = tempfile::tempdir().unwrap();
    // Lines in pieces, an empty line, and stderr too.
    let script = "import os, sys, time\nr = os.environ['RANK']\nfor i in range(5):\n    sys.stdout.write(f'rank {r} line {i} begins'); sys.stdout.flush(); time.sleep(0.02)\n    sys.stdout.write(' and ends\\n'); sys.stdout.flush()\nsys.stdout.write('\\n'); sys.stderr.write(f'err {r}\\n')\n";
    let (out, _) = output_within(
        resilio_run(tmp.path(), "label")
            .args(["--ntasks", "11", "--label", "--", "python3", "-c", script]),
        Duration::from_secs(90),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for r in 0..11u32 {
        // Right-aligned to the widest rank, as srun --label writes them.
        let p = format!("{r:>2}: ");
        let mine: Vec<&str> = text.lines().filter(|l| l.starts_with(&p)).collect();
        assert_eq!(mine.len(), 6, "rank {r}: {mine:?}\n{text}");
        for i in 0..5 {
            assert!(mine.contains(&format!("{p}rank {r} line {i} begins and ends").as_str()));
        }
        assert!(
            mine.contains(&p.as_str().trim_end()) || mine.contains(&p.as_str()),
            "{mine:?}"
        );
        assert!(
            stderr_of(&out).contains(&format!("{p}err {r}\n")),
            "{}",
            stderr_of(&out)
        );
    }
    assert_eq!(text.lines().count(), 66, "{text}");
    // Only with --ntasks (local mode).
    let (bad, _) = output_within(
        resilio_run(tmp.path(), "label2").args(["--label", "--", "true"]),
        Duration::from_secs(10),
    );
    assert_eq!(bad.status.code(), Some(2), "{}", stderr_of(&bad));
}

/// `checkpoint_every = "advised"`: nothing is known in attempt 0; once a
/// checkpoint's cost and a failure were measured, attempt 1 checkpoints
/// periodically at Daly's interval.
#[test]
fn the_advised_interval_drives_periodic_checkpoints_after_a_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let conf = write_config(
        tmp.path(),
        "[coordinator]\ncheckpoint_every = \"advised\"\n",
    );
    let (out, _) = output_within(
        run_local(
            tmp.path(),
            "advised",
            2,
            &["--config", conf.to_str().unwrap(), "--kill-grace", "3s"],
            &[
                "--total",
                "60",
                "--step-time",
                "0.1",
                "--ckpt-every",
                "5",
                "--ckpt-dir",
                ck.to_str().unwrap(),
                "--fault",
                "kill",
                "--fault-rank",
                "1",
                "--fault-step",
                "12",
            ],
        )
        .current_dir(tmp.path()),
        Duration::from_secs(90),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "advised");
    let advised: Vec<&Record> = kinds(&recs, "checkpoint_interval_advised");
    assert_eq!(advised.len(), 2, "{advised:?}");
    assert_eq!(advised[0].attempt, 0);
    assert!(
        advised[0].get("interval_s").unwrap().is_null(),
        "{:?}",
        advised[0]
    );
    assert!(advised[0].str("reason").is_some());
    assert_eq!(advised[1].attempt, 1);
    let every = advised[1].f64("interval_s").unwrap();
    assert!(every > 0.0, "{:?}", advised[1]);
    assert!(advised[1].f64("checkpoint_cost_s").unwrap() > 0.0);
    let periodic = |a: u32| {
        recs.iter()
            .filter(|r| r.kind == "checkpoint_requested" && r.attempt == a)
            .filter(|r| r.str("reason") == Some("periodic"))
            .count()
    };
    assert_eq!(periodic(0), 0);
    assert!(periodic(1) >= 1, "{recs:#?}");
}

/// The coordinator's `/metrics` gives the job's recoveries as histograms
/// by failure class and phase: after rank 1 is killed at step 8 and every
/// rank restarts in place, a scrape once the job is back past step 8 shows
/// one recovery of class `infrastructure`, each phase the journal shows,
/// and its total.
#[test]
fn metrics_give_the_recoveries_by_class_and_phase() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let mut cmd = run_local(
        tmp.path(),
        "rec",
        2,
        &["--max-restarts", "2"],
        &[
            "--total",
            "150",
            "--step-time",
            "0.1",
            "--ckpt-every",
            "4",
            "--fault",
            "kill",
            "--fault-rank",
            "1",
            "--fault-step",
            "8",
            "--ckpt-dir",
            ck.to_str().unwrap(),
        ],
    );
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let state = tmp.path();
    let histogram = |metrics: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with("resilio_recovery_seconds"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let mut last = String::new();
    let back = wait_for(Duration::from_secs(60), || {
        let Some((url, token)) = coordinator_of(state, "rec") else {
            return false;
        };
        let Ok((code, metrics)) = try_http(&url, "GET", "/metrics", Some(&token), "") else {
            return false;
        };
        last = metrics;
        code == 200
            && last.contains(
                "resilio_recovery_seconds_count{job=\"rec\",class=\"infrastructure\",phase=\"rework\"} 1",
            )
    });
    assert!(back, "{last}");
    let lines = histogram(&last);
    for phase in ["detection", "teardown", "relaunch", "start", "total"] {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!(
                "resilio_recovery_seconds_count{{job=\"rec\",class=\"infrastructure\",phase=\"{phase}\"}} 1"
            ))),
            "{phase}: {lines:#?}"
        );
    }
    assert!(
        lines.contains(
            &"resilio_recovery_seconds_bucket{le=\"60.0\",job=\"rec\",class=\"infrastructure\",phase=\"total\"} 1".to_string()
        ),
        "{lines:#?}"
    );
    let (out, _) = wait_output(child, Duration::from_secs(90));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}
