//! Every journal of a local run on a full disk.

use super::*;

/// `GET PATH` with the token, by hand; the status code and the body.
fn http_get(url: &str, path: &str, token: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text))
}

/// The coordinator an agent of the case was given (its environment).
fn coordinator_given(mark: &Marker) -> Option<(String, String)> {
    mark.live().into_iter().find_map(|p| {
        let env = std::fs::read(format!("/proc/{p}/environ")).ok()?;
        let var = |k: &str| {
            env.split(|b| *b == 0).find_map(|kv| {
                let kv = std::str::from_utf8(kv).ok()?;
                kv.strip_prefix(k)?.strip_prefix('=').map(str::to_string)
            })
        };
        Some((
            var("RESILIO_COORDINATOR")?,
            var("RESILIO_COORDINATOR_TOKEN")?,
        ))
    })
}

/// Case 3, the local-mode variant of the full disk: the journals of the
/// launcher, the coordinator and both ranks on a tmpfs that is full before
/// the run starts, a rank killed mid-run (a restart in place, judged with
/// no journal to read), and room again only later. Training must not
/// notice: the coordinator serves although its discovery files cannot be
/// written (it used not to start: "ranks supervise alone"), the run
/// restarts and completes, and once there is room each journal says what
/// it lost (`journal_gap`).
#[test]
fn a_full_disk_under_every_journal_of_a_local_run_costs_no_training() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = match Tmpfs::mount(&tmp.path().join("mnt"), "1m") {
        Ok(fs) => fs,
        Err(e) => {
            println!("skipped: cannot mount a tmpfs here ({e})");
            return;
        }
    };
    let mark = Marker::new("fulldisk");
    let (state, job) = (fs.0.join("state"), "fulldisk");
    std::fs::create_dir_all(&state).unwrap();
    let filler = fs.0.join("filler");
    fill(&filler);
    // The trainer's own checkpoints are on another disk: only resilio's is full.
    let ck = tmp.path().join("ck");
    let mut args = lockstep_args(30, &ck);
    args.extend(["--fault", "kill", "--fault-rank", "1", "--fault-step", "10"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = run_local(
        &state,
        job,
        2,
        &["--max-restarts", "1", "--kill-grace", "3s"],
        &args,
    );
    mark.on(&mut c)
        .current_dir(tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let child = c.spawn().unwrap();
    // The coordinator serves both ranks, full disk or not.
    let mut given = None;
    assert!(
        wait_for(Duration::from_secs(30), || {
            given = given.clone().or_else(|| coordinator_given(&mark));
            given.as_ref().is_some_and(|(url, token)| {
                http_get(url, "/v1/status", token).is_some_and(|(code, body)| {
                    code == 200 && body.matches("\"state\":\"running\"").count() == 2
                })
            })
        }),
        "no coordinator served the ranks"
    );
    // Room again once attempt 1 has saved past the failure (its step 10).
    let saved = || {
        std::fs::read_to_string(ck.join("latest"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    assert!(
        wait_for(Duration::from_secs(60), || saved().is_some_and(|s| s >= 10)),
        "attempt 1 never got past step 10"
    );
    std::fs::remove_file(&filler).unwrap();
    let (out, _) = wait_output(child, Duration::from_secs(60));
    let took = started.elapsed();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr_of(&out),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // The trainer's own record: a restart, resumed from its checkpoint, the end saved.
    let (attempts, resumed) = trainer_story(&stdout);
    assert_eq!((attempts, resumed), (vec![0, 1], vec![5, 5]), "{stdout}");
    assert_eq!(saved(), Some(30));
    // resilio said what it could not write, and that the coordinator served.
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(
        stderr.contains("it serves the ranks all the same"),
        "{stderr}"
    );
    assert!(!stderr.contains("ranks supervise alone"), "{stderr}");
    // The journal: what was written once there was room, each writer's gap
    // first, then attempt 1's end on both ranks and the job's.
    let recs = records(&state, job);
    let gaps = kinds(&recs, "journal_gap");
    assert!(!gaps.is_empty(), "{recs:#?}");
    for g in &gaps {
        assert!(g.u64("lost_records").unwrap() > 0, "{g:?}");
    }
    for rank in 0..2 {
        let exit = kinds(&recs, "rank_exit")
            .into_iter()
            .find(|r| r.attempt == 1 && r.rank == Some(rank))
            .unwrap_or_else(|| panic!("rank {rank}'s end: {recs:#?}"));
        assert_eq!(
            (exit.u64("exit_code"), exit.u64("last_step")),
            (Some(0), Some(30)),
            "{exit:?}"
        );
    }
    let end = one(&recs, "job_end");
    assert_eq!(end.u64("exit_code"), Some(0), "{end:?}");
    assert_journal_whole(&state, job);
    mark.assert_none_left(Duration::from_secs(10));
    println!(
        "{} journal gap(s), {} records lost; run took {took:?}",
        gaps.len(),
        gaps.iter()
            .filter_map(|g| g.u64("lost_records"))
            .sum::<u64>()
    );
}
