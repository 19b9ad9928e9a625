//! A node cut off from the coordinator (a network namespace).

use super::*;

/// `ip ARGS`, its failure as text.
fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// A network namespace joined to this one by a veth pair: the host side
/// `ADDR.1/30`, the namespace side `ADDR.2/30`. Deleted when dropped (the
/// pair goes with its host side), passed or not.
struct Netns {
    name: String,
    host_if: String,
    host_addr: String,
}

impl Netns {
    fn create(tag: u32) -> Result<Netns, String> {
        let id = std::process::id();
        // 10.213.X.(4k)/30, X and k from the pid and the tag: unique per
        // test and run, within a private range.
        let (x, k) = ((id >> 5) % 256, (id % 32) * 2 + tag % 2);
        let n = Netns {
            name: format!("rchaos{id}-{tag}"),
            host_if: format!("rc{id}{tag}h"),
            host_addr: format!("10.213.{x}.{}", 4 * k + 1),
        };
        let ns_if = format!("rc{id}{tag}n");
        let ns_addr = format!("10.213.{x}.{}/30", 4 * k + 2);
        ip(&["netns", "add", &n.name])?;
        ip(&[
            "link", "add", &n.host_if, "type", "veth", "peer", "name", &ns_if, "netns", &n.name,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", n.host_addr),
            "dev",
            &n.host_if,
        ])?;
        ip(&["link", "set", &n.host_if, "up"])?;
        for args in [
            vec!["addr", "add", ns_addr.as_str(), "dev", ns_if.as_str()],
            vec!["link", "set", ns_if.as_str(), "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut all = vec!["netns", "exec", n.name.as_str(), "ip"];
            all.extend(args);
            ip(&all)?;
        }
        Ok(n)
    }

    /// The link down (`false`) or up again (`true`), from the host side:
    /// both ends stay, packets between them go nowhere.
    fn link(&self, up: bool) {
        ip(&["link", "set", &self.host_if, if up { "up" } else { "down" }]).unwrap();
    }

    /// `cmd` run inside the namespace (its environment kept).
    fn exec(&self, cmd: &Command) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// A standalone coordinator (`resilio __coordinator`) bound to `bind`; its
/// URL and token.
fn standalone_coordinator(
    state: &Path,
    job: &str,
    world: u32,
    bind: &str,
    cfg: &Path,
    mark: &Marker,
) -> (std::process::Child, String, String) {
    use std::io::Read;
    let mut c = Command::new(bin());
    c.args(["__coordinator", "--job-id", job, "--world-size"])
        .arg(world.to_string())
        .args(["--bind", bind, "--config"])
        .arg(cfg)
        .arg("--state-dir")
        .arg(state)
        .env("RESILIO_SYSTEM_CONFIG", "")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = mark.on(&mut c).spawn().unwrap();
    let mut so = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") && so.read(&mut byte).unwrap_or(0) == 1 {
        line.push(byte[0]);
    }
    let url = String::from_utf8_lossy(&line).trim().to_string();
    let token = resilio::coordinator::discover_files(&resilio::journal::job_dir(state, job))
        .map(|(_, t)| t)
        .expect("coordinator.token");
    (child, url, token)
}

/// Case 2: a node partitioned from the coordinator. A standalone
/// coordinator listens on the host side of a veth pair; rank 0's agent runs
/// on the host, rank 1's inside a network namespace behind the pair; each
/// trains on its own (the fake trainer needs no peer). Mid-run the link
/// goes down while every process lives. docs/coordinator.md: the cut-off
/// agent fails open (keeps supervising and training, journals
/// `coordinator_unreachable`, and `coordinator_reachable` with the gap once
/// it is back); the coordinator journals `rank_lost` for the rank it no
/// longer hears after `lost_after`, and `rank_heard_again` when it does.
/// Once with the link restored mid-run, once left cut to the end.
#[test]
fn a_rank_cut_off_from_the_coordinator_trains_on_is_marked_lost_and_is_picked_up_again() {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: network namespaces need root");
        return;
    }
    for (tag, restore) in [(0u32, true), (1, false)] {
        let job = if restore {
            "cut-restored"
        } else {
            "cut-for-good"
        };
        let tmp = tempfile::tempdir().unwrap();
        let mark = Marker::new(job);
        let net = match Netns::create(tag) {
            Ok(n) => n,
            Err(e) => {
                println!("skipped: cannot make a network namespace here ({e})");
                return;
            }
        };
        let state = tmp.path();
        let cfg = write_config(
            state,
            "[journal]\nprogress_interval = \"0s\"\n\
             [coordinator]\nreport_interval = \"200ms\"\nlost_after = \"2s\"\n",
        );
        let (mut coord, url, token) =
            standalone_coordinator(state, job, 2, &format!("{}:0", net.host_addr), &cfg, &mark);
        assert!(url.contains(&net.host_addr), "{url}");
        let steps = "150";
        let agent = |rank: u32| {
            let mut c = run_trainer(
                state,
                job,
                &["--config", cfg.to_str().unwrap()],
                &["--steps", steps, "--interval", "0.1"],
            );
            c.env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("RESILIO_COORDINATOR", &url)
                .env("RESILIO_COORDINATOR_TOKEN", &token);
            mark.on(&mut c);
            c
        };
        let spawn = |mut c: Command| {
            c.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let started = Instant::now();
        let host_rank = spawn(agent(0));
        let cut_rank = spawn(net.exec(&agent(1)));
        let coord_recs = |kind: &str| -> Vec<u32> {
            records(state, job)
                .iter()
                .filter(|r| r.kind == kind && r.rank.is_none())
                .filter_map(|r| r.u64("about_rank").map(|r| r as u32))
                .collect()
        };
        let rank_recs = |kind: &str, rank: u32| {
            records(state, job)
                .iter()
                .filter(|r| r.kind == kind && r.rank == Some(rank))
                .count()
        };
        // Both ranks train and report across the link.
        let running = || {
            let st = Command::new(bin())
                .args(["status", "--json", "--state-dir"])
                .arg(state)
                .arg(job)
                .env("RESILIO_SYSTEM_CONFIG", "")
                .output()
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap_or_default();
            v["ranks"].as_array().map_or(0, |r| {
                r.iter()
                    .filter(|r| r["step"].as_u64().unwrap_or(0) >= 5)
                    .count()
            })
        };
        assert!(
            wait_for(Duration::from_secs(30), || running() == 2),
            "{job}: both ranks never reported: {:#?}",
            records(state, job)
        );
        // The cut.
        net.link(false);
        let cut_at = Instant::now();
        let cut_step = step_of(state, job, 1, 0).unwrap();
        assert!(
            wait_for(Duration::from_secs(20), || coord_recs("rank_lost") == [1]
                && rank_recs("coordinator_unreachable", 1) == 1),
            "{job}: {:#?}",
            records(state, job)
        );
        let lost_after = cut_at.elapsed();
        // Rank 1 trains on, cut off.
        let on = step_of(state, job, 1, 0).unwrap();
        assert!(
            wait_for(Duration::from_secs(10), || step_of(state, job, 1, 0)
                .is_some_and(|s| s >= on + 10)),
            "{job}: rank 1 stopped training when cut off"
        );
        let mut back_after = None;
        let mut outage = Duration::ZERO;
        if restore {
            net.link(true);
            let up_at = Instant::now();
            outage = up_at - cut_at;
            assert!(
                wait_for(Duration::from_secs(40), || coord_recs("rank_heard_again")
                    == [1]
                    && rank_recs("coordinator_reachable", 1) == 1),
                "{job}: rank 1 was not picked up again: {:#?}",
                records(state, job)
            );
            back_after = Some(up_at.elapsed());
        }
        let outs: Vec<_> = [host_rank, cut_rank]
            .into_iter()
            .map(|c| wait_output(c, Duration::from_secs(60)).0)
            .collect();
        let took = started.elapsed();
        for (r, o) in outs.iter().enumerate() {
            assert_eq!(o.status.code(), Some(0), "{job} rank {r}: {}", stderr_of(o));
        }
        assert!(
            stderr_of(&outs[1]).contains("coordinator unreachable"),
            "{}",
            stderr_of(&outs[1])
        );
        let _ = kill(Pid::from_raw(coord.id() as i32), Signal::SIGTERM);
        let _ = wait_output_of(&mut coord);
        let recs = records(state, job);
        // The trainers' own record: every step, on both ranks.
        for r in kinds(&recs, "rank_exit") {
            assert_eq!(
                (r.u64("exit_code"), r.u64("last_step")),
                (Some(0), Some(150)),
                "{job}: {r:?}"
            );
        }
        assert_eq!(kinds(&recs, "rank_exit").len(), 2);
        // The journal: only rank 1 was lost, and said so once; nothing
        // was taken for a stall or a failure.
        assert_eq!(coord_recs("rank_lost"), [1], "{job}");
        let lost = kinds(&recs, "rank_lost")[0];
        assert!(lost.f64("silent_s").unwrap() >= 2.0, "{lost:?}");
        assert_eq!(rank_recs("coordinator_unreachable", 0), 0, "{job}");
        for kind in ["stall", "failure", "hang"] {
            assert!(kinds(&recs, kind).is_empty(), "{job}: {kind}: {recs:#?}");
        }
        if restore {
            // Both sides measure the whole silence: from the last report
            // that got through (at most a report interval before the cut).
            let outage = outage.as_secs_f64() - 0.5;
            assert_eq!(coord_recs("rank_heard_again"), [1]);
            let heard = kinds(&recs, "rank_heard_again")[0];
            let silent = heard.f64("silent_s").unwrap();
            assert!(
                silent >= outage && silent < 60.0,
                "{heard:?}, cut {outage} s"
            );
            let back = kinds(&recs, "coordinator_reachable")[0];
            let gap = back.f64("gap_s").unwrap();
            assert!(gap >= outage && gap < 60.0, "{back:?}, cut {outage} s");
            assert!(back.u64("failed_requests").unwrap() >= 1, "{back:?}");
        } else {
            assert!(coord_recs("rank_heard_again").is_empty(), "{job}");
            assert_eq!(rank_recs("coordinator_reachable", 1), 0, "{job}");
        }
        drop(net);
        mark.assert_none_left(Duration::from_secs(10));
        println!(
            "{job}: cut at step {cut_step}; lost and unreachable {lost_after:?} after the cut \
             ({:?}); picked up again {back_after:?} after the link came back; run took {took:?}",
            kinds(&recs, "coordinator_unreachable")[0].str("error")
        );
    }
}

/// Wait for a child that was told to end (bounded; SIGKILL after 10 s).
fn wait_output_of(c: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            let _ = c.kill();
            return c.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
