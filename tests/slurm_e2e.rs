//! End-to-end tests on a real Slurm cluster (slurmctld and four slurmd on
//! this machine, started by tests/slurm/testbed.sh): a lockstep multi-rank
//! trainer (tests/fixtures/lockstep_trainer.py) under
//! `resilio run -- srun resilio run -- python3 trainer.py`, with faults
//! injected by rank, step and attempt.

#[path = "support/status.rs"]
mod status;
#[path = "support/timing.rs"]
mod timing;

use resilio::journal::{self, Record};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

static UP: Once = Once::new();
/// One job at a time: the cluster has four nodes and each job takes three.
static SERIAL: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn testbed() {
    UP.call_once(|| {
        let o = Command::new("bash")
            .arg(root().join("tests/slurm/testbed.sh"))
            .arg("up")
            .output()
            .expect("run testbed.sh");
        assert!(
            o.status.success(),
            "testbed up failed:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    });
}

fn run(cmd: &str, args: &[&str]) -> String {
    let o = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        o.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct Job {
    id: String,
    dir: tempfile::TempDir,
}

impl Drop for Job {
    fn drop(&mut self) {
        // A failed test leaves the job's output and journal for a look, and
        // no job running.
        if std::thread::panicking() {
            let _ = Command::new("scancel").arg(&self.id).status();
            let kept = self.dir.path().with_extension("kept");
            if std::fs::rename(self.dir.path(), &kept).is_ok() {
                eprintln!("job {} files kept in {}", self.id, kept.display());
            }
        }
    }
}

impl Job {
    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    fn records(&self) -> Vec<Record> {
        journal::read_job(&journal::job_dir(&self.state_dir(), &self.id))
            .map(|j| j.records)
            .unwrap_or_default()
    }
    fn output(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("job-{}.out", self.id)))
            .unwrap_or_default()
    }
    fn show(&self) -> resilio::slurm::JobInfo {
        resilio::slurm::commands::parse_show_job(&run("scontrol", &["-o", "show", "job", &self.id]))
            .unwrap()
    }
    /// Wait for a final state (not a requeue's transient ones).
    fn wait_final(&self, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let info = self.show();
            if [
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT",
                "OUT_OF_MEMORY",
                "BOOT_FAIL",
                "DEADLINE",
            ]
            .contains(&info.state.as_str())
            {
                return info.state;
            }
            if Instant::now() > deadline {
                let _ = Command::new("scancel").arg(&self.id).status();
                panic!(
                    "job {} still {} after {limit:?}; output:\n{}",
                    self.id,
                    info.state,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    /// Wait (2 min at most) until the job's output shows `text`.
    fn wait_output(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.output().contains(text) {
            assert!(
                Instant::now() < deadline,
                "never showed {text:?}: {}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    /// What marks this job's processes: its directory, in every command line.
    fn marker(&self) -> String {
        self.dir.path().display().to_string()
    }
    /// No process of the job is left (20 s to go).
    fn assert_nothing_left(&self) {
        let gone = Instant::now() + Duration::from_secs(20);
        while !pids_with(&self.marker()).is_empty() {
            assert!(
                Instant::now() < gone,
                "left running: {:?}",
                pids_with(&self.marker())
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    /// The process of task `rank` of the job's first step whose command
    /// line `is` says it is the one (an agent, a trainer).
    fn task_process(&self, rank: u32, is: impl Fn(&[u8]) -> bool) -> i32 {
        let rank = rank.to_string();
        pids_with(&self.marker())
            .into_iter()
            .map(|(p, _)| p)
            .find(|p| {
                is(&std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default())
                    && env_of(*p, "SLURM_PROCID").as_deref() == Some(rank.as_str())
                    && env_of(*p, "SLURM_STEP_ID").as_deref() == Some("0")
            })
            .unwrap_or_else(|| panic!("no such process of task {rank}"))
    }
    /// The job-level supervisor: the batch script's process is the
    /// guardian, and the supervisor is its child with the same command
    /// line (`resilio run ... -- srun ...`).
    fn supervisor(&self) -> i32 {
        let bin = env!("CARGO_BIN_EXE_resilio");
        let procs = pids_with(&self.marker());
        let supers: Vec<i32> = procs
            .iter()
            .filter(|(pid, _)| {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cmd.starts_with(bin.as_bytes())
                    && String::from_utf8_lossy(&cmd).contains("\0srun\0")
            })
            .map(|(p, _)| *p)
            .collect();
        procs
            .iter()
            .find(|(p, pp)| supers.contains(p) && supers.contains(pp))
            .unwrap_or_else(|| panic!("no supervisor under a guardian: {procs:?} {supers:?}"))
            .0
    }
    /// Wait for the job's end, which must be COMPLETED; its journal.
    fn completed(&self, limit: Duration) -> Vec<Record> {
        let state = self.wait_final(limit);
        let recs = self.records();
        assert_eq!(state, "COMPLETED", "{}\n{recs:#?}", self.output());
        recs
    }
    fn kinds(&self, kind: &str) -> Vec<Record> {
        self.records()
            .into_iter()
            .filter(|r| r.kind == kind)
            .collect()
    }
}

/// Submit a 3-node job running the lockstep trainer with `trainer_args`.
fn submit(resilio_opts: &str, trainer_args: &str) -> Job {
    submit_with("-t 10", resilio_opts, trainer_args)
}

/// The same with other sbatch options (`-t 2 --signal=B:USR1@100`).
fn submit_with(sbatch_opts: &str, resilio_opts: &str, trainer_args: &str) -> Job {
    submit_nodes(3, "", sbatch_opts, resilio_opts, trainer_args)
}

/// A job of `nodes` nodes whose step is `srun <srun_opts> ...`.
fn submit_nodes(
    nodes: u32,
    srun_opts: &str,
    sbatch_opts: &str,
    resilio_opts: &str,
    trainer_args: &str,
) -> Job {
    submit_seeded(
        nodes,
        srun_opts,
        sbatch_opts,
        resilio_opts,
        trainer_args,
        &[],
    )
}

/// The same, with an earlier job in the state dir whose journal blamed
/// each node of `blamed` for two infrastructure failures, one and two hours ago.
fn submit_seeded(
    nodes: u32,
    srun_opts: &str,
    sbatch_opts: &str,
    resilio_opts: &str,
    trainer_args: &str,
    blamed: &[&str],
) -> Job {
    testbed();
    let dir = job_dir();
    if !blamed.is_empty() {
        let jd = journal::job_dir(&dir.path().join("state"), "earlier-1");
        std::fs::create_dir_all(&jd).unwrap();
        let mut lines = String::new();
        for node in blamed {
            for k in 0..2 {
                let ts = (chrono::Utc::now() - chrono::Duration::hours(1 + k)).to_rfc3339();
                lines += &format!(
                    "{{\"v\":1,\"ts\":\"{ts}\",\"kind\":\"failure\",\"attempt\":{k},\"class\":\"infrastructure\",\"blamed_node\":\"{node}\",\"cause\":\"XID 79\",\"evidence\":\"NVRM: Xid 79: GPU has fallen off the bus (recorded sample)\"}}\n"
                );
            }
        }
        std::fs::write(jd.join("batch.jsonl"), lines).unwrap();
    }
    let body = format!(
        "exec {BIN} run {resilio_opts} -- srun {srun_opts} --kill-on-bad-exit=1 {}",
        agent_and_trainer(dir.path(), trainer_args)
    );
    sbatch_in(dir, nodes, sbatch_opts, &body)
}

const BIN: &str = env!("CARGO_BIN_EXE_resilio");

/// A fresh directory for a job's files, under /var/tmp.
fn job_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("resilio-e2e-")
        .tempdir_in("/var/tmp")
        .unwrap()
}

/// `resilio run ... -- python3 lockstep_trainer.py ...`: a rank agent and
/// the fixture trainer, checkpointing under `dir`.
fn agent_and_trainer(dir: &Path, trainer_args: &str) -> String {
    format!(
        "{BIN} run --stall-timeout 4s --kill-grace 2s -- python3 {} --ckpt-dir {}/ckpt {trainer_args}",
        root().join("tests/fixtures/lockstep_trainer.py").display(),
        dir.display()
    )
}

/// Submit a batch script of `nodes` nodes, one task each, requeueable,
/// its output and state dir in `dir`, ending with `body`.
fn sbatch_in(dir: tempfile::TempDir, nodes: u32, sbatch_opts: &str, body: &str) -> Job {
    sbatch_in_with(dir, nodes, sbatch_opts, body, &[])
}

/// [`sbatch_in`] with more options on sbatch's command line.
fn sbatch_in_with(
    dir: tempfile::TempDir,
    nodes: u32,
    sbatch_opts: &str,
    body: &str,
    cli: &[&str],
) -> Job {
    let d = dir.path().display();
    let script = format!(
        "#!/bin/bash\n\
         #SBATCH -N {nodes}\n#SBATCH --ntasks-per-node=1\n#SBATCH --requeue\n#SBATCH --open-mode=append\n\
         #SBATCH -o {d}/job-%j.out\n#SBATCH {sbatch_opts}\n\
         export RESILIO_STATE_DIR={d}/state\n{body}\n"
    );
    let path = dir.path().join("job.sbatch");
    std::fs::write(&path, script).unwrap();
    let mut args = vec!["--parsable"];
    args.extend_from_slice(cli);
    args.push(path.to_str().unwrap());
    let out = run("sbatch", &args);
    let id = out.trim().split(';').next().unwrap().to_string();
    Job { id, dir }
}

fn rank_nodes(recs: &[Record], attempt: u32) -> Vec<(u32, String)> {
    let mut v: Vec<(u32, String)> = recs
        .iter()
        .filter(|r| r.kind == "rank_start" && r.attempt == attempt && r.rank.is_some())
        .map(|r| (r.rank.unwrap(), r.node.clone().unwrap_or_default()))
        .collect();
    v.sort();
    v
}

fn lock() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn node_failure_excludes_the_node_requeues_and_resumes() {
    let _g = lock();
    let job = submit(
        "",
        "--total 20 --step-time 0.2 --fault kill --fault-rank 1 --fault-step 8 --fault-attempts 0",
    );
    let state = job.wait_final(Duration::from_secs(240));
    let recs = job.records();
    assert_eq!(
        state,
        "COMPLETED",
        "output:\n{}\njournal: {recs:#?}",
        job.output()
    );
    let first = rank_nodes(&recs, 0);
    assert_eq!(first.len(), 3, "{first:?}");
    let bad = first.iter().find(|(r, _)| *r == 1).unwrap().1.clone();
    let judgment = job.kinds("judgment");
    assert_eq!(
        judgment[0].str("class"),
        Some("infrastructure"),
        "{judgment:?}"
    );
    assert_eq!(judgment[0].u64("primary_rank"), Some(1));
    assert_eq!(judgment[0].str("primary_node"), Some(bad.as_str()));
    let excluded = job.kinds("node_excluded");
    assert_eq!(excluded.len(), 1);
    assert_eq!(excluded[0].str("excluded_node"), Some(bad.as_str()));
    assert_eq!(job.kinds("requeue").len(), 1);
    let second = rank_nodes(&recs, 1);
    assert_eq!(second.len(), 3, "{second:?}");
    assert!(
        second.iter().all(|(_, n)| *n != bad),
        "attempt 1 ran on the excluded node {bad}: {second:?}"
    );
    assert!(job.show().excluded.contains(&bad));
    assert_eq!(job.show().restarts, 1);
    // Order in the journal: failure -> node_excluded -> requeue -> the next attempt's start.
    let order: Vec<String> = recs
        .iter()
        .filter(|r| {
            ["judgment", "node_excluded", "requeue"].contains(&r.kind.as_str())
                || (r.kind == "rank_start" && r.attempt == 1)
        })
        .map(|r| r.kind.clone())
        .collect();
    assert_eq!(
        order[..3],
        ["judgment", "node_excluded", "requeue"],
        "{order:?}"
    );
    assert!(
        job.output().contains("resumed from checkpoint #5"),
        "{}",
        job.output()
    );
    let end = job.kinds("job_end");
    assert_eq!(
        end.last()
            .unwrap()
            .get("exit_code")
            .and_then(|v| v.as_i64()),
        Some(0)
    );
    // Secondary failures of the peers were recorded, not blamed.
    assert!(!judgment[0]
        .get("secondary")
        .unwrap()
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn a_crash_restarts_inside_the_allocation_on_the_remaining_nodes() {
    let _g = lock();
    // Four nodes for a three-node step: one spare.
    let job = submit_nodes(
        4,
        "-N 3 -n 3",
        "-t 10",
        "",
        "--total 20 --step-time 0.2 --fault kill --fault-rank 2 --fault-step 8 --fault-attempts 0",
    );
    let state = job.wait_final(Duration::from_secs(240));
    let recs = job.records();
    assert_eq!(
        state,
        "COMPLETED",
        "output:\n{}\njournal: {recs:#?}",
        job.output()
    );
    // Never back to the queue.
    assert_eq!(job.show().restarts, 0);
    assert!(job.kinds("requeue").is_empty(), "{recs:#?}");
    let first = rank_nodes(&recs, 0);
    assert_eq!(first.len(), 3, "{first:?}");
    let bad = first.iter().find(|(r, _)| *r == 2).unwrap().1.clone();
    let d = job.kinds("decision");
    assert_eq!(
        d[0].get("decision").unwrap()["action"],
        "restart_in_allocation",
        "{d:?}"
    );
    let excluded = job.kinds("node_excluded");
    assert_eq!(excluded.len(), 1, "{excluded:?}");
    assert_eq!(excluded[0].str("excluded_node"), Some(bad.as_str()));
    assert_eq!(excluded[0].str("scope"), Some("step"));
    // Attempt 1 ran in the same allocation, on three nodes, none of them the bad one.
    let second = rank_nodes(&recs, 1);
    assert_eq!(second.len(), 3, "{second:?}");
    assert!(
        second.iter().all(|(_, n)| *n != bad),
        "attempt 1 ran on the excluded node {bad}: {second:?}"
    );
    // The relaunch was timed from the failure to the first new step.
    let relaunched = job.kinds("relaunched");
    assert_eq!(relaunched.len(), 1, "{recs:#?}");
    assert_eq!(relaunched[0].attempt, 1);
    let s = relaunched[0].f64("failure_to_first_step_s").unwrap();
    assert!(s > 0.0, "{s}");
    assert!(
        job.output().contains("resumed from checkpoint #5"),
        "{}",
        job.output()
    );
    let end = job.kinds("job_end");
    assert_eq!(
        end.last()
            .unwrap()
            .get("exit_code")
            .and_then(|v| v.as_i64()),
        Some(0)
    );
    // The report sees two attempts in one allocation.
    let out = Command::new(env!("CARGO_BIN_EXE_resilio"))
        .args(["timeline", &job.id])
        .env("RESILIO_STATE_DIR", job.state_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("inside the allocation"), "{text}");
}

#[test]
fn a_straggling_node_confirmed_after_a_restart_is_left_out() {
    let _g = lock();
    // n2 computes 2.5x longer in every attempt. Attempt 0 flags it (record and
    // checkpoint only) and then crashes on an unrelated, unexplained error
    // (nobody blamed: relaunched on the same nodes). Attempt 1 flags n2 again:
    // confirmed, so after a checkpoint the step is stopped and relaunched
    // without n2, on the spare node.
    let conf = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        conf.path(),
        "[straggler]\nwindow = \"1s\"\nwindows = 2\nmin_samples = 2\nexclude = true\n",
    )
    .unwrap();
    let job = submit_nodes(
        4,
        "-N 3 -n 3",
        "-t 10",
        &format!("--config {}", conf.path().display()),
        "--total 60 --step-time 0.2 --slow-node n2 --slow-factor 2.5 \
         --fault exit --fault-rank 0 --fault-step 15 --fault-attempts 0",
    );
    let state = job.wait_final(Duration::from_secs(240));
    let recs = job.records();
    assert_eq!(
        state,
        "COMPLETED",
        "output:\n{}\njournal: {recs:#?}",
        job.output()
    );
    assert_eq!(job.show().restarts, 0);
    let flagged = |attempt: u32| {
        recs.iter()
            .filter(|r| r.kind == "straggler" && r.attempt == attempt)
            .filter(|r| {
                r.str("scope") == Some("node")
                    && r.get("flagged").and_then(|f| f.as_bool()) == Some(true)
            })
            .map(|r| {
                (
                    r.str("straggler_node").unwrap_or("").to_string(),
                    r.get("confirmed_across_restart").and_then(|c| c.as_bool()),
                )
            })
            .collect::<Vec<_>>()
    };
    // What the straggler windows said, for a failure's message (the whole
    // journal is cut short in CI's log).
    let said: Vec<String> = recs
        .iter()
        .filter(|r| {
            matches!(
                r.kind.as_str(),
                "straggler" | "straggler_exclusion" | "decision"
            )
        })
        .map(|r| format!("attempt {} {}: {:?}", r.attempt, r.kind, r.fields()))
        .collect();
    let said = said.join("\n");
    // n2 flagged in attempt 0 (a window short of samples may clear and
    // flag it again), never another node; in attempt 1 confirmed at once.
    let first = flagged(0);
    assert!(!first.is_empty(), "n2 never flagged in attempt 0:\n{said}");
    assert!(
        first.iter().all(|f| *f == ("n2".to_string(), Some(false))),
        "{said}"
    );
    let second = flagged(1);
    assert_eq!(
        second.first(),
        Some(&("n2".to_string(), Some(true))),
        "{said}"
    );
    assert!(second.iter().all(|(n, _)| n == "n2"), "{said}");
    // Attempt 0 ended on the crash, not on the straggler: nobody blamed.
    let d = job.kinds("decision");
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(d[0].get("outcome").unwrap()["class"], "unknown");
    // Attempt 1: checkpoint first, then the exclusion.
    let excl: Vec<&Record> = recs
        .iter()
        .filter(|r| r.kind == "straggler_exclusion")
        .collect();
    assert_eq!(excl.len(), 1, "{recs:#?}");
    assert_eq!(excl[0].attempt, 1);
    assert_eq!(excl[0].str("straggler_node"), Some("n2"));
    assert!(excl[0].u64("checkpoint_step").is_some(), "{:?}", excl[0]);
    let j = job.kinds("judgment");
    assert_eq!(j[1].str("class"), Some("infrastructure"), "{j:?}");
    assert_eq!(j[1].str("primary_node"), Some("n2"), "{j:?}");
    assert_eq!(
        d[1].get("decision").unwrap()["action"],
        "restart_in_allocation"
    );
    let third = rank_nodes(&recs, 2);
    assert_eq!(third.len(), 3, "{third:?}");
    assert!(third.iter().all(|(_, n)| n != "n2"), "{third:?}");
    assert!(flagged(2).is_empty(), "{recs:#?}");
}

/// ETTR against an independent account on the real cluster: two failures
/// (an unexplained exit, relaunched inside the allocation; then a SIGKILL
/// on a full allocation, requeued excluding the node) and a queue wait;
/// and the two recoveries, phase by phase.
/// The trainer's own step times (a side file resilio never reads) give the
/// productive time; Slurm's own records give the wall time.
#[test]
fn ettr_agrees_with_the_trainers_own_account_across_a_requeue() {
    let _g = lock();
    let side = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
    let job = submit(
        "",
        &format!(
            "--total 160 --step-time 0.25 --ckpt-every 10 \
             --fault-plan 0:exit:1:25,1:kill:2:47 --timing-file {}",
            side.path().display()
        ),
    );
    let state = job.wait_final(Duration::from_secs(300));
    let recs = job.records();
    assert_eq!(
        state,
        "COMPLETED",
        "output:\n{}\njournal: {recs:#?}",
        job.output()
    );
    assert_eq!(job.show().restarts, 1, "one requeue");
    assert_eq!(timing::attempts(side.path()), [0, 1, 2]);
    // Slurm's record of the job, from outside: first start to last end.
    // Slurm's database catches up with the controller a little later.
    let mut rows = Vec::new();
    for _ in 0..60 {
        rows = resilio::slurm::commands::parse_sacct(&run(
            "sacct",
            &[
                "-D",
                "-X",
                "-n",
                "-P",
                "-j",
                &job.id,
                "-o",
                "JobID,State,ExitCode,NodeList,Submit,Start,End",
            ],
        ));
        if rows.len() == 2
            && rows
                .iter()
                .all(|r| resilio::analysis::accounting::slurm_time(&r.end).is_some())
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let times: Vec<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)> = rows
        .iter()
        .filter_map(|r| {
            Some((
                resilio::analysis::accounting::slurm_time(&r.start)?,
                resilio::analysis::accounting::slurm_time(&r.end)?,
            ))
        })
        .collect();
    assert_eq!(times.len(), 2, "{rows:?}");
    let outside_wall = (times.iter().map(|t| t.1).max().unwrap()
        - times.iter().map(|t| t.0).min().unwrap())
    .num_milliseconds() as f64
        / 1e3;
    let expected = timing::productive_s(side.path());

    let o = Command::new(env!("CARGO_BIN_EXE_resilio"))
        .args(["report", &job.id, "--json"])
        .env("RESILIO_STATE_DIR", job.state_dir())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let wall = r["wall_s"].as_f64().unwrap();
    let productive = r["productive_s"].as_f64().unwrap();
    eprintln!(
        "wall: resilio {wall:.3}s, sacct {outside_wall:.3}s; productive: resilio {productive:.3}s, trainer {expected:.3}s; {}",
        r["lost_s"]
    );
    assert!(
        r["time_source"].as_str().unwrap().starts_with("sacct"),
        "{}",
        r["time_source"]
    );
    // Slurm prints whole seconds: its end may lie up to 1 s before the
    // journal's last record, which resilio then takes.
    assert!(
        (wall - outside_wall).abs() <= 0.01 * outside_wall + 1.0,
        "wall: resilio {wall:.3}s, sacct {outside_wall:.3}s"
    );
    assert!(
        (productive - expected).abs() <= 0.01 * outside_wall,
        "productive: resilio {productive:.3}s, trainer's own {expected:.3}s, wall {outside_wall:.3}s\n{}",
        r["lost_s"]
    );
    assert_eq!(r["failed_attempts"], 2);
    // Each recovery phase by phase, on the real cluster: the relaunch
    // inside the allocation takes a moment, the requeue's holds Slurm's
    // queue; start in its parts (to the trainer's first line, to its
    // `resumed from checkpoint #N`, to its first step), adding up to start.
    let rec = r["recoveries"].as_array().expect("recoveries");
    assert_eq!(rec.len(), 2, "{rec:#?}");
    let relaunch = |v: &serde_json::Value| v["phases_s"][3].as_f64();
    assert_eq!(rec[0]["action"], "restart_in_allocation", "{rec:#?}");
    assert!(relaunch(&rec[0]).is_some_and(|s| s < 5.0), "{rec:#?}");
    assert_eq!(rec[1]["action"], "requeue", "{rec:#?}");
    assert!(relaunch(&rec[1]).is_some_and(|s| s > 5.0), "{rec:#?}");
    for v in rec {
        let parts: Vec<f64> = v["start_parts_s"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(serde_json::Value::as_f64)
            .collect();
        assert_eq!(parts.len(), 3, "{v:#}");
        let start = v["phases_s"][4].as_f64().unwrap();
        assert!((parts.iter().sum::<f64>() - start).abs() < 1e-3, "{v:#}");
        assert!(
            v["loaded"]
                .as_str()
                .is_some_and(|l| l.contains("resumed from checkpoint")),
            "{v:#}"
        );
        assert_eq!(v["caught_up"], true, "{v:#}");
    }
    let lost = |k: &str| r["lost_s"][k].as_f64().unwrap();
    // The requeue waited in the queue (the testbed's hold-off is ~11 s).
    assert!(lost("queue_wait") > 5.0, "{}", r["lost_s"]);
    assert!(lost("rework") > 1.0);
    assert!(lost("restart") > 0.0);
    let text = String::from_utf8_lossy(
        &Command::new(env!("CARGO_BIN_EXE_resilio"))
            .args(["report", &job.id])
            .env("RESILIO_STATE_DIR", job.state_dir())
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(
        text.contains("queue wait") && text.contains("after 2 failures"),
        "{text}"
    );
    assert!(
        text.contains("(2 failed; 1 restart(s) without the queue, 1 requeue(s))"),
        "{text}"
    );
    // The timeline tells the story, Slurm's queue included.
    let text = String::from_utf8_lossy(
        &Command::new(env!("CARGO_BIN_EXE_resilio"))
            .args(["timeline", &job.id])
            .env("RESILIO_STATE_DIR", job.state_dir())
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    let order = [
        "FAILURE",
        "RESTART inside the allocation as attempt 1",
        "step relaunched inside the allocation",
        "FAILURE signal",
        "judgment: infrastructure",
        "EXCLUDED",
        "REQUEUE excluding",
        "Slurm now keeps the job off",
        "allocation 0 ended (sacct)",
        "in the queue (sacct)",
        "first step",
    ];
    let mut at = 0;
    for want in order {
        let found = text[at..]
            .find(want)
            .unwrap_or_else(|| panic!("{want:?} missing after offset {at}:\n{text}"));
        at += found + want.len();
    }
}

#[test]
fn nodes_the_history_lists_are_left_out_at_start() {
    let _g = lock();
    testbed();
    let conf = tempfile::NamedTempFile::new().unwrap();
    // Above what Slurm's own NODE_FAIL records score on this cluster (the
    // node-crash test adds one per run, and a testbed kept up across runs
    // keeps them): only the seeded history lists a node.
    let empty = tempfile::tempdir_in("/var/tmp").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_resilio"))
        .args(["nodes", "--json", "--state-dir"])
        .arg(empty.path())
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let from_slurm = listed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["score"].as_f64())
        .fold(0.0, f64::max);
    let threshold = (from_slurm + 1.0).max(1.5);
    std::fs::write(
        conf.path(),
        format!("[nodes]\nexclude_at_start = true\nthreshold = {threshold}\n"),
    )
    .unwrap();
    let opts = format!("--config {}", conf.path().display());
    // A spare node: the step runs on three of four, without n2.
    let job = submit_seeded(
        4,
        "-N 3 -n 3",
        "-t 10",
        &opts,
        "--total 10 --step-time 0.1",
        &["n2"],
    );
    let recs = job.completed(Duration::from_secs(120));
    assert_eq!(job.show().restarts, 0);
    let ex = job.kinds("node_excluded");
    assert_eq!(ex.len(), 1, "{recs:#?}");
    assert_eq!(
        (ex[0].str("excluded_node"), ex[0].str("reason")),
        (Some("n2"), Some("node_history"))
    );
    assert!(ex[0]
        .str("evidence")
        .unwrap()
        .starts_with("node history score"));
    let first = rank_nodes(&recs, 0);
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(first.iter().all(|(_, n)| n != "n2"), "{first:?}");
    drop(job);

    // No spare node: one requeue with ExcNodeList, then the job runs elsewhere.
    let job = submit_seeded(3, "", "-t 10", &opts, "--total 10 --step-time 0.1", &["n1"]);
    let recs = job.completed(Duration::from_secs(180));
    assert_eq!(job.show().restarts, 1);
    assert!(job.show().excluded.contains(&"n1".to_string()));
    let rq = job.kinds("requeue");
    assert_eq!(rq[0].str("by"), Some("node_history"), "{rq:?}");
    assert!(
        rank_nodes(&recs, 0).is_empty(),
        "no step ran on the listed node"
    );
    let second = rank_nodes(&recs, 1);
    assert_eq!(second.len(), 3, "{recs:#?}");
    assert!(second.iter().all(|(_, n)| n != "n1"), "{second:?}");
    // Not a failure: no budget spent, nothing blamed on the job.
    let o = Command::new(env!("CARGO_BIN_EXE_resilio"))
        .args(["report", &job.id, "--json"])
        .env("RESILIO_STATE_DIR", job.state_dir())
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["failed_attempts"], 0, "{r}");
}

#[test]
fn user_code_error_is_not_requeued() {
    let _g = lock();
    let job = submit(
        "",
        "--total 20 --step-time 0.2 --fault traceback --fault-rank 1 --fault-step 6 --fault-attempts all",
    );
    let state = job.wait_final(Duration::from_secs(180));
    assert_eq!(state, "FAILED", "{}", job.output());
    assert_eq!(job.show().restarts, 0);
    let judgment = job.kinds("judgment");
    assert_eq!(judgment[0].str("class"), Some("user_error"), "{judgment:?}");
    assert_eq!(judgment[0].u64("primary_rank"), Some(1));
    assert!(job.kinds("requeue").is_empty());
    let end = job.kinds("job_end");
    assert!(
        end[0].str("reason").unwrap().starts_with("user error"),
        "{end:?}"
    );
    assert!(job.output().contains("KeyError: 'model'"));
}

#[test]
fn a_crash_loop_stops_requeueing() {
    let _g = lock();
    let job = submit(
        "--max-restarts 3",
        "--total 20 --step-time 0.2 --fault kill --fault-rank 1 --fault-step 8 --fault-attempts all",
    );
    let state = job.wait_final(Duration::from_secs(300));
    assert_eq!(state, "FAILED", "{}", job.output());
    assert_eq!(
        job.show().restarts,
        1,
        "one requeue, then the loop is recognised"
    );
    let decisions = job.kinds("decision");
    assert_eq!(decisions.len(), 2);
    let last = job.kinds("job_end");
    assert!(
        last.last()
            .unwrap()
            .str("reason")
            .unwrap()
            .starts_with("crash loop"),
        "{last:?}"
    );
}

/// Rank 1 hangs asleep in the trainer's own code: detected, diagnosed,
/// judged software (its probe), so no node is left out (any node would
/// hang the same way) and the step runs again inside the allocation on
/// the same nodes, with no trip back to the queue.
#[test]
fn a_hang_in_the_trainers_own_code_is_diagnosed_and_run_again_leaving_no_node_out() {
    let _g = lock();
    let job = submit(
        "",
        "--total 20 --step-time 0.2 --fault hang --fault-rank 1 --fault-step 8 --fault-attempts 0",
    );
    let state = job.wait_final(Duration::from_secs(240));
    assert_eq!(state, "COMPLETED", "{}", job.output());
    let recs = job.records();
    // Lockstep: the peers wait in the collective and stall with the hung rank;
    // every rank that declared a stall gathered its diagnostics before it was
    // stopped, even when srun was already tearing the step down.
    let stalled: Vec<Option<u32>> = recs
        .iter()
        .filter(|r| r.kind == "stall" && r.attempt == 0)
        .map(|r| r.rank)
        .collect();
    assert!(!stalled.is_empty());
    for rank in &stalled {
        assert!(
            recs.iter()
                .any(|r| r.kind == "diagnostics" && r.attempt == 0 && r.rank == *rank),
            "rank {rank:?} stalled without diagnostics: {recs:#?}"
        );
    }
    let judgment = job.kinds("judgment");
    assert_eq!(judgment[0].str("class"), Some("hang"), "{judgment:?}");
    assert_eq!(judgment[0].u64("primary_rank"), Some(1), "{judgment:?}");
    let d = job.kinds("decision");
    assert_eq!(
        d[0].get("decision").unwrap()["action"],
        "restart_in_allocation",
        "{d:?}"
    );
    assert!(job.kinds("node_excluded").is_empty(), "{recs:#?}");
    assert!(job.kinds("requeue").is_empty(), "{recs:#?}");
    assert_eq!(job.show().restarts, 0);
    assert!(job.show().excluded.is_empty());
    assert_eq!(rank_nodes(&recs, 1), rank_nodes(&recs, 0));
    // The job level is no rank, and the ranks' own lines in srun's output
    // ("no progress since step N") are no progress: the hang's time is
    // stalled time in the report, not rework (trials 8 and 9).
    assert!(
        recs.iter().all(|r| r.rank.is_some()
            || !matches!(r.kind.as_str(), "rank_exit" | "failure")
            || r.str("failure_kind") == Some("agent_died")),
        "the job level wrote a rank's end: {recs:#?}"
    );
    assert_eq!(job.kinds("step_exit").len(), 2, "{recs:#?}");
    let rep = resilio::analysis::report::build(&job.id, &recs, 0, None);
    let lost = |k: &str| rep.lost_s.get(k).copied().unwrap_or(0.0);
    assert!(
        lost("stalled") > 1.5 && lost("rework") < lost("stalled"),
        "stalled {}, rework {}: {}",
        lost("stalled"),
        lost("rework"),
        resilio::analysis::report::render_text(&rep)
    );
}

#[test]
fn time_limit_checkpoints_then_requeues() {
    let _g = lock();
    // A 2-minute limit with USR1 to the batch script 100 s before it (Slurm
    // checks every ~30 s, so it lands 20-50 s into the run); 60 s of work.
    let job = submit_with(
        "-t 2 --signal=B:USR1@100",
        "",
        "--total 120 --step-time 0.5 --ckpt-every 1000",
    );
    let recs = job.completed(Duration::from_secs(420));
    assert!(job.show().restarts >= 1);
    let first: Vec<&Record> = recs.iter().filter(|r| r.attempt == 0).collect();
    let pos = |kind: &str| first.iter().position(|r| r.kind == kind);
    let asked =
        pos("checkpoint_requested").expect("checkpoint requested on the pre-timeout signal");
    let done = pos("checkpoint_done").expect("checkpoint_done after the request");
    let stop = first
        .iter()
        .position(|r| r.kind == "stop" && r.str("reason") == Some("pre_timeout"))
        .expect("step stopped for the requeue");
    let requeue = pos("requeue").expect("requeued");
    assert!(
        asked < done && done < stop && stop < requeue,
        "order: {asked} {done} {stop} {requeue}"
    );
    assert_eq!(
        first[stop]
            .get("checkpoint_confirmed")
            .and_then(|v| v.as_bool()),
        Some(true)
    );
    // The ranks were asked with SIGUSR2, not NCCL's SIGUSR1, and ended
    // journaled (stopped gently, not killed with the step).
    let asked_ranks = first
        .iter()
        .filter(|r| {
            r.kind == "checkpoint_requested"
                && r.rank.is_some()
                && r.str("received") == Some("SIGUSR2")
        })
        .count();
    assert_eq!(asked_ranks, 3);
    assert_eq!(
        first
            .iter()
            .filter(|r| r.kind == "rank_exit" && r.rank.is_some())
            .count(),
        3
    );
    let judgment = first.iter().find(|r| r.kind == "judgment").unwrap();
    assert_eq!(judgment.str("class"), Some("preempted"));
    assert!(job
        .output()
        .contains("checkpoint requested: saving at step"));
    assert!(job.output().contains("resumed from checkpoint #"));
}

/// Start a node killed with `kill-node` again, once slurmctld has seen it
/// die (a slurmd back before that registers only later: the node would
/// come back long after), and wait until it is back in service: responding
/// (no `*`) and neither down nor drained. It may show `mix` for a while
/// after a `--no-kill` job: the resized job's old step still counts there.
fn restart_node(node: &str) {
    let state = || {
        run("sinfo", &["-h", "-n", node, "-o", "%t"])
            .trim()
            .to_string()
    };
    let seen = Instant::now() + Duration::from_secs(60);
    while !state().starts_with("down") && Instant::now() < seen {
        std::thread::sleep(Duration::from_millis(500));
    }
    testbed_cmd(&["start-node", node]);
    let back = Instant::now() + Duration::from_secs(120);
    let serving = |s: &str| {
        !s.is_empty()
            && !s.ends_with('*')
            && !["down", "drain", "fail", "unk"]
                .iter()
                .any(|b| s.starts_with(b))
    };
    while !serving(&state()) {
        assert!(
            Instant::now() < back,
            "{node} did not come back: {}",
            state()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn testbed_cmd(args: &[&str]) {
    let o = Command::new("bash")
        .arg(root().join("tests/slurm/testbed.sh"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "testbed {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_node_crash_is_recorded_from_slurms_own_records() {
    let _g = lock();
    let job = submit("", "--total 60 --step-time 0.4");
    job.wait_output("step 5/60");
    let nodes = rank_nodes(&job.records(), 0);
    // The batch script's node (rank 0's, the allocation's first): the
    // job-level supervisor dies with it, so Slurm requeues the job by
    // itself, and the next allocation learns what happened from sacct.
    let victim = nodes
        .iter()
        .find(|(r, _)| *r == 0)
        .expect("rank 0 started")
        .1
        .clone();
    // Crash the node: its slurmd, stepds and tasks at once.
    testbed_cmd(&["kill-node", &victim]);
    let state = job.wait_final(Duration::from_secs(360));
    restart_node(&victim);
    let recs = job.records();
    assert_eq!(state, "COMPLETED", "{}\n{recs:#?}", job.output());
    assert!(job.show().restarts >= 1);
    // The next attempt recorded attempt 0 as Slurm saw it, with the failed node.
    let prev: Vec<&Record> = recs
        .iter()
        .filter(|r| r.kind == "previous_attempt" && r.u64("about_attempt") == Some(0))
        .collect();
    assert_eq!(prev.len(), 1, "{recs:#?}");
    let failed: Vec<&str> = prev[0]
        .get("failed_nodes")
        .and_then(|v| v.as_array())
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(failed, [victim.as_str()], "{:?}", prev[0]);
    assert!(rank_nodes(&recs, 1).iter().all(|(_, n)| *n != victim));
    // And the report blames it.
    let r = resilio::analysis::report::build(&job.id, &recs, 0, None);
    assert!(
        r.failures
            .iter()
            .any(|f| f.node.as_deref() == Some(victim.as_str())),
        "{:?}",
        r.failures
    );
}

#[test]
fn nodes_drain_on_the_real_cluster() {
    let _g = lock();
    testbed();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let mut w = journal::Writer::open(
        &journal::job_dir(dir.path(), "900"),
        "rank-1.jsonl",
        0,
        Some(1),
        Some("n4".into()),
    );
    w.record(
        "failure",
        serde_json::json!({ "class": "infrastructure", "evidence": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus." }),
        true,
    );
    let bin = env!("CARGO_BIN_EXE_resilio");
    let state = dir.path().to_str().unwrap();
    use std::os::unix::fs::PermissionsExt;
    // Journals are private (0600 in 0700 directories): open these up so
    // that user nobody can read them, as a site admin's reader would.
    let job = journal::job_dir(dir.path(), "900");
    for (p, mode) in [
        (dir.path().to_path_buf(), 0o755),
        (dir.path().join("jobs"), 0o755),
        (job.clone(), 0o755),
        (job.join("rank-1.jsonl"), 0o644),
    ] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    // Refused clearly without permission (as user nobody, who can read the journals).
    let o = Command::new("runuser")
        .args([
            "-u",
            "nobody",
            "--",
            bin,
            "nodes",
            "--exclude-list",
            "--no-sacct",
            "--state-dir",
            state,
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "n4",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = Command::new("runuser")
        .args([
            "-u",
            "nobody",
            "--",
            bin,
            "nodes",
            "--drain",
            "--no-sacct",
            "--state-dir",
            state,
        ])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot drain n4"));
    // As root it drains, with the evidence as the reason.
    let o = Command::new(bin)
        .args(["nodes", "--drain", "--no-sacct", "--state-dir", state])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let info = run("sinfo", &["-h", "-n", "n4", "-o", "%t|%E"]);
    let _ = Command::new("scontrol")
        .args(["update", "NodeName=n4", "State=RESUME"])
        .status();
    assert!(info.starts_with("drain"), "{info}");
    assert!(info.contains("resilio: score"), "{info}");
}

#[test]
fn the_adapter_against_the_real_cluster() {
    let _g = lock();
    testbed();
    use resilio::slurm::{Slurm, SlurmCli};
    let cli = SlurmCli::default();
    // A pending job (its start an hour away) can have its exclusions changed.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let out = run(
        "sbatch",
        &[
            "--parsable",
            "--requeue",
            "-N1",
            "--begin=now+1hour",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ],
    );
    let id = out.trim().to_string();
    let all = cli.exclude_more(&id, &["n3".into(), "n4".into()]).unwrap();
    assert_eq!(all, ["n3", "n4"]);
    let info = cli.show_job(&id).unwrap();
    assert_eq!(info.excluded, ["n3", "n4"]);
    assert_eq!(info.state, "PENDING");
    assert!(info.requeue);
    let q = cli.queue(&id).unwrap();
    assert_eq!(q[0].state, "PENDING");
    let _ = Command::new("scancel").arg(&id).status();
    // Errors from Slurm come back as one line.
    let err = cli.requeue("999999").unwrap_err().to_string();
    assert!(err.contains("scontrol requeue 999999 failed"), "{err}");
    drop(dir);
    // srun gives each task its node and the torchrun variables.
    let out = run(
        "srun",
        &[
            "-N4",
            "--ntasks-per-node=1",
            env!("CARGO_BIN_EXE_resilio"),
            "run",
            "--",
            "sh",
            "-c",
            "echo $RANK $WORLD_SIZE $NODE_RANK $MASTER_ADDR $(hostname)",
        ],
    );
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 4, "{out}");
    for (i, l) in lines.iter().enumerate() {
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(f[0], i.to_string(), "{out}");
        assert_eq!(f[1], "4");
        assert_eq!(f[3], "n1");
        assert_eq!(f[4], format!("n{}", i + 1), "{out}");
    }
}

#[allow(dead_code)]
fn exists(p: &Path) -> bool {
    p.exists()
}

/// The steps of the running ranks, as the job's coordinator (found from
/// its files) reports them; empty when none answers.
fn status_steps(job_dir: &Path) -> Vec<u64> {
    resilio::coordinator::discover_files(job_dir)
        .map(|(url, token)| status::running_steps(&url, &token))
        .unwrap_or_default()
}

/// Processes whose command line holds `marker` (the job's own directory).
fn pids_with(marker: &str) -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmd).contains(marker) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        out.push((pid, ppid));
    }
    out
}

#[test]
fn killing_the_job_level_supervisor_leaves_the_step_training_and_the_journal_says_so() {
    let _g = lock();
    let job = submit("", "--total 60 --step-time 0.3");
    job.wait_output("step 5/60");
    // The batch script's process is the guardian; the supervisor is its
    // child with the same command line (`resilio run ... -- srun ...`).
    let supervisor = job.supervisor();
    Command::new("kill")
        .args(["-9", &supervisor.to_string()])
        .status()
        .unwrap();
    // A coordinator comes back at the same address, and the ranks report
    // to it: all three running, at steps past the kill.
    let jd = journal::job_dir(&job.state_dir(), &job.id);
    let mut seen = Vec::new();
    let back = Instant::now() + Duration::from_secs(15);
    while seen.len() < 3 {
        assert!(Instant::now() < back, "no coordinator came back: {seen:?}");
        std::thread::sleep(Duration::from_millis(300));
        seen = status_steps(&jd).into_iter().filter(|s| *s > 5).collect();
    }
    let state = job.wait_final(Duration::from_secs(120));
    let recs = job.records();
    let out = job.output();
    // Training went on to its end: the trainer's own account.
    assert_eq!(state, "COMPLETED", "{out}\n{recs:#?}");
    for r in 0..3 {
        assert!(
            out.contains(&format!("rank {r} finished at step 60")),
            "{out}"
        );
    }
    assert_eq!(job.show().restarts, 0);
    // The journal says what happened, and who ended the job.
    let lost = job.kinds("supervisor_lost");
    assert_eq!(lost.len(), 1, "{recs:#?}");
    assert_eq!(lost[0].u64("supervisor_pid"), Some(supervisor as u64));
    assert_eq!(lost[0].get("step_running"), Some(&serde_json::json!(true)));
    assert!(lost[0].str("status").is_some_and(|s| s.contains("SIGKILL")));
    // A coordinator took over at the same address, and the ranks found it.
    let starts = job.kinds("coordinator_start");
    assert_eq!(starts.len(), 2, "{starts:#?}");
    assert_eq!(starts[0].str("url"), starts[1].str("url"));
    assert_eq!(
        starts[1].u64("took_over_from"),
        Some(supervisor as u64),
        "{starts:#?}"
    );
    let end = job.kinds("job_end");
    assert_eq!(end.len(), 1, "{recs:#?}");
    assert_eq!(end[0].u64("exit_code"), Some(0));
    for r in job.kinds("rank_exit") {
        if r.rank.is_some() {
            assert_eq!(r.u64("last_step"), Some(60), "{r:?}");
        }
    }
    // The report says so too.
    let rep = resilio::analysis::report::build(&job.id, &recs, 0, None);
    assert_eq!(rep.supervisor_losses.len(), 1);
    assert_eq!(rep.last_step, Some(60));
    assert!(resilio::analysis::report::render_text(&rep)
        .contains("the job-level supervisor (and the coordinator in it) (pid"));
    // Nothing of the job is left running.
    job.assert_nothing_left();
}

/// The value of `key` in the environment of process `pid`.
fn env_of(pid: i32, key: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{key}=")).map(str::to_string)
    })
}

#[test]
fn killing_a_rank_agent_relaunches_the_step_on_the_spare_node() {
    let _g = lock();
    let job = submit_nodes(4, "-N 3 -n 3", "-t 10", "", "--total 60 --step-time 0.3");
    job.wait_output("step 8/60");
    // Rank 1's agent: the `resilio run` of the step's task 1.
    let agent = job.task_process(1, |cmd| {
        cmd.starts_with(env!("CARGO_BIN_EXE_resilio").as_bytes())
            && !String::from_utf8_lossy(cmd).contains("\0srun\0")
    });
    let victim = env_of(agent, "SLURMD_NODENAME").expect("its node");
    Command::new("kill")
        .args(["-9", &agent.to_string()])
        .status()
        .unwrap();
    let state = job.wait_final(Duration::from_secs(180));
    let recs = job.records();
    let out = job.output();
    assert_eq!(state, "COMPLETED", "{out}\n{recs:#?}");
    // The trainer's own account: it resumed from a checkpoint and finished.
    assert!(out.contains("resumed from checkpoint #"), "{out}");
    for r in 0..3 {
        assert!(
            out.contains(&format!("rank {r} finished at step 60")),
            "{out}"
        );
    }
    assert_eq!(job.show().restarts, 0, "relaunched inside the allocation");
    // The journal: rank 1's agent died, its node was blamed and left out.
    let f: Vec<&Record> = recs
        .iter()
        .filter(|r| r.kind == "failure" && r.attempt == 0)
        .collect();
    assert!(
        f.iter().any(|r| r.str("failure_kind") == Some("agent_died")
            && r.str("class") == Some("infrastructure")),
        "{f:#?}"
    );
    let j = job.kinds("judgment");
    assert_eq!(j[0].str("primary_node"), Some(victim.as_str()), "{j:?}");
    assert_eq!(j[0].u64("primary_rank"), Some(1), "{j:?}");
    let d = job.kinds("decision");
    assert_eq!(
        d[0].get("decision").unwrap()["action"],
        "restart_in_allocation",
        "{d:?}"
    );
    let second = rank_nodes(&recs, 1);
    assert_eq!(second.len(), 3, "{second:?}");
    assert!(second.iter().all(|(_, n)| *n != victim), "{second:?}");
    assert!(job
        .kinds("judgment")
        .iter()
        .all(|j| j.str("class") != Some("preempted")));
    // A spare without `--no-kill` is warned about at the start.
    let w = job.kinds("setup_warning");
    assert_eq!(w.len(), 1, "{recs:#?}");
    assert!(w[0].str("warning").unwrap().contains("--no-kill"));
    // Nothing of the job is left running.
    job.assert_nothing_left();
}

#[test]
fn a_sigstopped_trainer_is_judged_a_hang_of_its_rank_and_the_step_runs_again() {
    let _g = lock();
    let job = submit_nodes(4, "-N 3 -n 3", "-t 10", "", "--total 40 --step-time 0.3");
    job.wait_output("step 8/40");
    // Rank 1's trainer (the python process of task 1, not its agent).
    let trainer = job.task_process(1, |cmd| {
        String::from_utf8_lossy(cmd).contains("lockstep_trainer.py\0")
            && !cmd.starts_with(env!("CARGO_BIN_EXE_resilio").as_bytes())
            && !cmd.starts_with(b"srun")
    });
    Command::new("kill")
        .args(["-STOP", &trainer.to_string()])
        .status()
        .unwrap();
    let state = job.wait_final(Duration::from_secs(240));
    let recs = job.records();
    let out = job.output();
    assert_eq!(state, "COMPLETED", "{out}\n{recs:#?}");
    assert!(out.contains("resumed from checkpoint #"), "{out}");
    for r in 0..3 {
        assert!(
            out.contains(&format!("rank {r} finished at step 40")),
            "{out}"
        );
    }
    let j = job.kinds("judgment");
    assert_eq!(j[0].str("class"), Some("hang"), "{j:?}");
    assert_eq!(j[0].u64("primary_rank"), Some(1), "{j:?}");
    let d = job.kinds("decision");
    assert!(
        ["restart_in_allocation", "requeue"].contains(
            &d[0].get("decision").unwrap()["action"]
                .as_str()
                .unwrap_or("")
        ),
        "{d:?}"
    );
    assert!(!pid_alive(trainer), "the stopped trainer is gone");
    job.assert_nothing_left();
}

fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

#[test]
fn a_node_crash_with_a_spare_is_relaunched_on_the_spare_within_seconds() {
    let _g = lock();
    // The README's shape: 4 nodes for a 3-node step, one spare; `--no-kill`
    // keeps the allocation when Slurm declares the dead node failed.
    let job = submit_nodes(
        4,
        "-N 3 -n 3",
        "-t 10 --no-kill",
        "",
        "--total 150 --step-time 0.2",
    );
    job.wait_output("step 10/150");
    let victim = rank_nodes(&job.records(), 0)
        .into_iter()
        .find(|(r, _)| *r == 1)
        .expect("rank 1 started")
        .1;
    let crashed = chrono::Utc::now();
    testbed_cmd(&["kill-node", &victim]);
    let state = job.wait_final(Duration::from_secs(240));
    restart_node(&victim);
    let recs = job.records();
    let out = job.output();
    assert_eq!(state, "COMPLETED", "{out}\n{recs:#?}");
    assert_eq!(job.show().restarts, 0, "no trip through the queue");
    assert!(job.kinds("setup_warning").is_empty(), "{recs:#?}");
    // srun was not waited for: only the dead node's rank was left, silent.
    let ab = job.kinds("step_abandoned");
    assert_eq!(ab.len(), 1, "{recs:#?}");
    assert_eq!(
        ab[0].get("nodes"),
        Some(&serde_json::json!([victim.clone()]))
    );
    let d = job.kinds("decision");
    assert_eq!(
        d[0].get("decision").unwrap()["action"],
        "restart_in_allocation",
        "{d:?}"
    );
    let second = rank_nodes(&recs, 1);
    assert_eq!(second.len(), 3, "{second:?}");
    assert!(second.iter().all(|(_, n)| *n != victim), "{second:?}");
    // Within seconds: the first step of the relaunch, counted from the crash.
    let first = recs
        .iter()
        .filter(|r| r.kind == "progress" && r.attempt == 1)
        .map(|r| r.ts)
        .min()
        .expect("the relaunch made progress");
    let took = (first - crashed).num_milliseconds() as f64 / 1000.0;
    assert!(
        took < 20.0,
        "{took}s from the crash to the first step after it"
    );
    eprintln!("node crash to the first step on the spare: {took:.1}s");
    // The trainer's own account.
    assert!(out.contains("resumed from checkpoint #"), "{out}");
    for r in 0..3 {
        assert!(
            out.contains(&format!("rank {r} finished at step 150")),
            "{out}"
        );
    }
}

#[test]
fn a_node_crash_without_a_spare_is_requeued_without_the_node_before_slurm_notices() {
    let _g = lock();
    let job = submit("", "--total 60 --step-time 0.4");
    job.wait_output("step 5/60");
    let victim = rank_nodes(&job.records(), 0)
        .into_iter()
        .find(|(r, _)| *r == 1)
        .expect("rank 1 started")
        .1;
    testbed_cmd(&["kill-node", &victim]);
    let state = job.wait_final(Duration::from_secs(360));
    restart_node(&victim);
    let recs = job.records();
    assert_eq!(state, "COMPLETED", "{}\n{recs:#?}", job.output());
    // resilio stopped waiting for the dead node's rank, blamed the node and
    // requeued without it (Slurm would have requeued with it only after
    // declaring the node down, and the job would have waited for it).
    assert_eq!(job.kinds("step_abandoned").len(), 1, "{recs:#?}");
    let j = job.kinds("judgment");
    assert_eq!(j[0].str("primary_node"), Some(victim.as_str()), "{j:?}");
    assert_eq!(job.kinds("requeue").len(), 1, "{recs:#?}");
    assert!(job.show().restarts >= 1);
    assert!(rank_nodes(&recs, 1).iter().all(|(_, n)| *n != victim));
    assert!(job.output().contains("resumed from checkpoint #"));
}

/// `resilio template` for each framework: the script passes `sbatch
/// --test-only`, and runs on the testbed (one node and a spare, the fixture
/// trainer as the command) through a crash that is recovered.
#[test]
fn templates_of_every_kind_submit_and_recover_a_crash() {
    let _g = lock();
    testbed();
    let bin = env!("CARGO_BIN_EXE_resilio");
    let trainer = root().join("tests/fixtures/lockstep_trainer.py");
    let dir = tempfile::Builder::new()
        .prefix("resilio-e2e-tpl-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let path = format!(
        "{}:{}",
        Path::new(bin).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kinds = ["ddp", "megatron", "lightning", "accelerate"];
    let mut jobs = Vec::new();
    for kind in kinds {
        let script = dir.path().join(format!("{kind}.sbatch"));
        let ckpt = dir.path().join(format!("ckpt-{kind}"));
        let o = Command::new(bin)
            .args(["template", kind, "--nodes", "1", "--spares", "1"])
            .args([
                "--gpus-per-node",
                "0",
                "--time",
                "10",
                "--signal-lead",
                "60",
            ])
            .args(["--job-name", &format!("tpl-{kind}"), "--state-dir"])
            .arg(dir.path().join("state"))
            .arg("-o")
            .arg(&script)
            .args(["--", "python3"])
            .arg(&trainer)
            .arg("--ckpt-dir")
            .arg(&ckpt)
            .args(["--total", "30", "--step-time", "0.2", "--fault", "exit"])
            .args([
                "--fault-rank",
                "0",
                "--fault-step",
                "8",
                "--fault-attempts",
                "0",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = std::fs::read_to_string(&script).unwrap();
        for l in text.lines().filter(|l| l.starts_with("#SBATCH")) {
            assert!(l.contains(" # "), "uncommented: {l}");
        }
        let test = Command::new("sbatch")
            .arg("--test-only")
            .arg(&script)
            .current_dir(dir.path())
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            test.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&test.stderr)
        );
        let sub = Command::new("sbatch")
            .arg("--parsable")
            .arg(&script)
            .current_dir(dir.path())
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            sub.status.success(),
            "{}",
            String::from_utf8_lossy(&sub.stderr)
        );
        let id = String::from_utf8_lossy(&sub.stdout)
            .trim()
            .split(';')
            .next()
            .unwrap()
            .to_string();
        jobs.push((kind, id));
    }
    let state = dir.path().join("state");
    let deadline = Instant::now() + Duration::from_secs(300);
    for (kind, id) in &jobs {
        let out = || {
            std::fs::read_to_string(dir.path().join(format!("tpl-{kind}-{id}.out")))
                .unwrap_or_default()
        };
        loop {
            let st = run("scontrol", &["-o", "show", "job", id]);
            let info = resilio::slurm::commands::parse_show_job(&st).unwrap();
            if ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"].contains(&info.state.as_str()) {
                assert_eq!(info.state, "COMPLETED", "{kind}: {}", out());
                break;
            }
            if Instant::now() > deadline {
                for (_, j) in &jobs {
                    let _ = Command::new("scancel").arg(j).status();
                }
                panic!("{kind}: still {} : {}", info.state, out());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let recs = journal::read_job(&journal::job_dir(&state, id))
            .map(|j| j.records)
            .unwrap_or_default();
        let d: Vec<&Record> = recs.iter().filter(|r| r.kind == "decision").collect();
        assert_eq!(
            d[0].get("decision").unwrap()["action"],
            "restart_in_allocation",
            "{kind}: {d:?}"
        );
        assert!(
            out().contains("resumed from checkpoint #"),
            "{kind}: {}",
            out()
        );
        assert!(
            out().contains("rank 0 finished at step 30"),
            "{kind}: {}",
            out()
        );
    }
}

#[test]
fn a_crash_after_the_supervisor_died_is_still_relaunched() {
    let _g = lock();
    let job = submit_nodes(
        4,
        "-N 3 -n 3",
        "-t 10",
        "",
        "--total 60 --step-time 0.3 --fault exit --fault-rank 0 --fault-step 25 --fault-attempts 0",
    );
    job.wait_output("step 5/60");
    let supervisor = job.supervisor();
    Command::new("kill")
        .args(["-9", &supervisor.to_string()])
        .status()
        .unwrap();
    let state = job.wait_final(Duration::from_secs(180));
    let recs = job.records();
    let out = job.output();
    assert_eq!(state, "COMPLETED", "{out}\n{recs:#?}");
    assert_eq!(job.kinds("supervisor_lost").len(), 1, "{recs:#?}");
    // The crash at step 25 was judged and the step relaunched, by the guardian.
    let d = job.kinds("decision");
    assert_eq!(
        d[0].get("decision").unwrap()["action"],
        "restart_in_allocation",
        "{d:?}"
    );
    assert!(rank_nodes(&recs, 1).len() == 3, "{recs:#?}");
    assert!(out.contains("resumed from checkpoint #"), "{out}");
    for r in 0..3 {
        assert!(
            out.contains(&format!("rank {r} finished at step 60")),
            "{out}"
        );
    }
    job.assert_nothing_left();
}

/// The one-prefix form: a batch script whose only resilio is the rank
/// agent, `srun <srun_opts> resilio run -- python3 trainer.py ...` (no
/// job-level `resilio run`, no `exec`).
fn submit_one_prefix(nodes: u32, srun_opts: &str, trainer_args: &str) -> Job {
    testbed();
    let dir = job_dir();
    let body = format!(
        "srun {srun_opts} {}",
        agent_and_trainer(dir.path(), trainer_args)
    );
    sbatch_in(dir, nodes, "-t 10", &body)
}

/// The records of `kind` about `attempt`.
fn of_attempt<'a>(recs: &'a [Record], kind: &str, attempt: u32) -> Vec<&'a Record> {
    recs.iter()
        .filter(|r| r.kind == kind && r.attempt == attempt)
        .collect()
}

#[test]
fn one_prefix_a_crash_is_judged_and_requeued_without_the_node_and_status_sees_the_job() {
    let _g = lock();
    let job = submit_one_prefix(
        3,
        "",
        "--total 40 --step-time 0.25 --fault kill --fault-rank 1 --fault-step 15 --fault-attempts 0",
    );
    job.wait_output("step 5/40");
    // Rank 0's agent hosts the coordinator: `resilio status` sees every rank.
    let jd = journal::job_dir(&job.state_dir(), &job.id);
    let deadline = Instant::now() + Duration::from_secs(30);
    while status_steps(&jd).len() < 3 {
        assert!(Instant::now() < deadline, "status: {:?}", status_steps(&jd));
        std::thread::sleep(Duration::from_millis(200));
    }
    // And a site's Prometheus finds it and scrapes it without the token.
    let target = job.state_dir().join(format!("prometheus/{}.json", job.id));
    let t: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&target).expect("target registered")).unwrap();
    let addr = t[0]["targets"][0].as_str().unwrap().to_string();
    let body = {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            c,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    };
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("resilio_ranks{"), "{body}");
    let recs = job.completed(Duration::from_secs(240));
    let bad = rank_nodes(&recs, 0)
        .into_iter()
        .find(|(r, _)| *r == 1)
        .unwrap()
        .1;
    let j = of_attempt(&recs, "judgment", 0);
    assert_eq!(j.len(), 1, "{recs:#?}");
    assert_eq!(j[0].str("class"), Some("infrastructure"));
    assert_eq!(j[0].u64("primary_rank"), Some(1));
    assert_eq!(j[0].str("primary_node"), Some(bad.as_str()));
    assert_eq!(of_attempt(&recs, "requeue", 0).len(), 1, "{recs:#?}");
    let info = job.show();
    assert_eq!(info.restarts, 1);
    assert!(info.excluded.contains(&bad), "{:?}", info.excluded);
    let second = rank_nodes(&recs, 1);
    assert_eq!(second.len(), 3, "{second:?}");
    assert!(second.iter().all(|(_, n)| *n != bad), "{second:?}");
    assert!(job.output().contains("resumed from checkpoint #"));
    assert!(job.output().contains("step 40/40"));
}

#[test]
fn one_prefix_two_ranks_failing_at_once_get_exactly_one_decision() {
    let _g = lock();
    // Ranks 1 and 2 exit 1 at the same step (no signature: one restart);
    // srun --kill-on-bad-exit would kill the deciding agent if the failed
    // ranks' agents left before the decision.
    let job = submit_one_prefix(
        3,
        "--kill-on-bad-exit=1",
        "--total 30 --step-time 0.25 --fault-plan 0:exit:1:12,0:exit:2:12",
    );
    let recs = job.completed(Duration::from_secs(240));
    let failed: Vec<u32> = of_attempt(&recs, "rank_exit", 0)
        .iter()
        .filter(|r| r.str("class") == Some("unknown"))
        .filter_map(|r| r.rank)
        .collect();
    assert_eq!(failed.len(), 2, "both ranks failed on their own: {recs:#?}");
    for kind in ["judgment", "decision", "requeue"] {
        assert_eq!(
            of_attempt(&recs, kind, 0).len(),
            1,
            "exactly one {kind}: {recs:#?}"
        );
    }
    assert_eq!(job.show().restarts, 1);
    assert_eq!(rank_nodes(&recs, 1).len(), 3);
    assert!(of_attempt(&recs, "decision", 1).len() <= 1);
    assert!(job.output().contains("step 30/30"));
}

#[test]
fn one_prefix_the_hosting_node_dies_and_the_job_is_still_requeued_without_it() {
    let _g = lock();
    let job = submit_one_prefix(3, "", "--total 60 --step-time 0.4");
    job.wait_output("step 5/60");
    // Rank 0's node: the coordinator's host, and the batch script's node.
    let victim = rank_nodes(&job.records(), 0)
        .into_iter()
        .find(|(r, _)| *r == 0)
        .expect("rank 0 started")
        .1;
    testbed_cmd(&["kill-node", &victim]);
    let state = job.wait_final(Duration::from_secs(360));
    restart_node(&victim);
    let recs = job.records();
    assert_eq!(state, "COMPLETED", "{}\n{recs:#?}", job.output());
    assert!(job.show().restarts >= 1);
    // Another rank's agent decided: rank 0's agent died with its node.
    let j = of_attempt(&recs, "judgment", 0);
    assert_eq!(j.len(), 1, "{recs:#?}");
    assert_eq!(j[0].str("primary_node"), Some(victim.as_str()), "{j:?}");
    assert_eq!(of_attempt(&recs, "requeue", 0).len(), 1, "{recs:#?}");
    assert!(rank_nodes(&recs, 1).iter().all(|(_, n)| *n != victim));
    assert!(job.output().contains("resumed from checkpoint #"));
}

#[test]
fn one_prefix_a_hang_is_judged_job_wide_and_requeued() {
    let _g = lock();
    let job = submit_one_prefix(
        3,
        "",
        "--total 20 --step-time 0.2 --fault hang --fault-rank 1 --fault-step 8 --fault-attempts 0",
    );
    let recs = job.completed(Duration::from_secs(240));
    // The coordinator (rank 0's agent) judged the hang across the ranks.
    assert_eq!(
        of_attempt(&recs, "hang", 0).len(),
        1,
        "one job-wide hang judgment: {recs:#?}"
    );
    let j = of_attempt(&recs, "judgment", 0);
    assert_eq!(j.len(), 1, "{recs:#?}");
    assert_eq!(j[0].str("class"), Some("hang"), "{j:?}");
    assert_eq!(of_attempt(&recs, "requeue", 0).len(), 1);
    assert_eq!(job.show().restarts, 1);
    assert!(job.output().contains("step 20/20"));
}

#[test]
fn a_step_that_starts_no_rank_is_launch_trouble_and_runs_again() {
    let _g = lock();
    testbed();
    let dir = job_dir();
    let conf = dir.path().join("resilio.toml");
    std::fs::write(&conf, "[run]\nstep_start_timeout = \"8s\"\n").unwrap();
    // A step started first holds the CPU of every node of the allocation,
    // so the training step waits for resources it never gets ("step
    // creation temporarily disabled"). The relaunch overlaps it.
    let body = format!(
        "srun -N 3 -n 3 sleep 600 &\nsleep 2\n\
         exec {BIN} run --config {} -- srun -N 3 -n 3 --kill-on-bad-exit=1 {}",
        conf.display(),
        agent_and_trainer(dir.path(), "--total 15 --step-time 0.2")
    );
    let job = sbatch_in(dir, 3, "-t 10", &body);
    let recs = job.completed(Duration::from_secs(240));
    let timeout = of_attempt(&recs, "step_start_timeout", 0);
    assert_eq!(timeout.len(), 1, "{recs:#?}");
    assert_eq!(timeout[0].f64("after_s"), Some(8.0));
    assert!(rank_nodes(&recs, 0).is_empty(), "attempt 0 started no rank");
    let j = of_attempt(&recs, "judgment", 0);
    assert_eq!(j.len(), 1, "{recs:#?}");
    assert_eq!(j[0].str("class"), Some("infrastructure"));
    assert!(
        j[0].str("evidence")
            .unwrap_or("")
            .starts_with("launch trouble:"),
        "{j:?}"
    );
    let d = of_attempt(&recs, "decision", 0);
    assert_eq!(
        d[0].get("decision")
            .and_then(|x| x.get("action"))
            .and_then(|a| a.as_str()),
        Some("restart_in_allocation"),
        "{d:?}"
    );
    assert_eq!(rank_nodes(&recs, 1).len(), 3);
    assert!(job.output().contains("step 15/15"));
}

#[test]
fn when_slurm_requeues_the_job_itself_the_failed_node_stays_out_and_spent_spares_are_dropped() {
    let _g = lock();
    // Four nodes for a three-node step, without --no-kill: when a node dies
    // Slurm ends the allocation and requeues the job itself, for four
    // nodes, of which three are left. resilio sees the requeue at Slurm's
    // SIGTERM, excludes the dead node and lowers the count to three.
    let conf = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(conf.path(), "[run]\nshrink_after_node_failure = true\n").unwrap();
    let job = submit_nodes(
        4,
        "-N 3 -n 3",
        "-t 10",
        &format!("--config {}", conf.path().display()),
        "--total 150 --step-time 0.3",
    );
    job.wait_output("step 5/150");
    let victim = rank_nodes(&job.records(), 0)
        .into_iter()
        .find(|(r, _)| *r == 1)
        .expect("rank 1 started")
        .1;
    testbed_cmd(&["kill-node", &victim]);
    let state = job.wait_final(Duration::from_secs(420));
    restart_node(&victim);
    let recs = job.records();
    assert_eq!(state, "COMPLETED", "{}\n{recs:#?}", job.output());
    let by_slurm: Vec<Record> = job
        .kinds("requeue")
        .into_iter()
        .filter(|r| r.str("by") == Some("slurm"))
        .collect();
    assert_eq!(by_slurm.len(), 1, "{recs:#?}");
    let excluded: Vec<&str> = by_slurm[0]
        .get("exclude")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(excluded, [victim.as_str()], "{by_slurm:?}");
    let lowered = job.kinds("node_count_lowered");
    assert_eq!(lowered.len(), 1, "{recs:#?}");
    assert_eq!(
        (lowered[0].u64("from"), lowered[0].u64("to")),
        (Some(4), Some(3))
    );
    let info = job.show();
    assert!(info.excluded.contains(&victim), "{info:?}");
    assert_eq!(info.num_nodes, 3);
    let last = recs.iter().map(|r| r.attempt).max().unwrap();
    let nodes = rank_nodes(&recs, last);
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert!(nodes.iter().all(|(_, n)| *n != victim), "{nodes:?}");
    assert!(job.output().contains("step 150/150"));
}

static PLUGIN: Once = Once::new();

/// The SPANK plugin built and installed on the testbed (plugstack.conf,
/// off unless a job asks for it).
fn plugin() {
    testbed();
    PLUGIN.call_once(|| testbed_cmd(&["plugin", BIN]));
}

/// The testbed restarted with Slurm's task/affinity plugin (CPU binding),
/// for as long as this lives; then as before, the plugin installed again.
struct Affinity;

impl Affinity {
    fn on() -> Affinity {
        plugin();
        testbed_cmd(&["down"]);
        let o = Command::new("bash")
            .arg(root().join("tests/slurm/testbed.sh"))
            .arg("up")
            .env("TESTBED_TASK_PLUGIN", "task/affinity")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        testbed_cmd(&["plugin", BIN]);
        Affinity
    }
}

impl Drop for Affinity {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(root().join("tests/slurm/testbed.sh"))
            .arg("down")
            .status();
        testbed_cmd(&["up"]);
        testbed_cmd(&["plugin", BIN]);
    }
}

/// `srun --label ... sh -c SCRIPT`, two tasks on one node, each bound to a
/// CPU of its own; its lines by task.
fn srun_lines(extra: &[&str], state: &Path, script: &str) -> Vec<String> {
    let o = Command::new("srun")
        .args(["-N", "1", "-n", "2", "--cpu-bind=map_cpu:0,1", "--label"])
        .args(extra)
        .args(["sh", "-c", script])
        .env("RESILIO_STATE_DIR", state)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "srun {extra:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let mut lines: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

#[test]
fn srun_resilio_runs_each_task_under_an_agent_with_its_cpus_and_cgroup_unchanged() {
    let _g = lock();
    let _affinity = Affinity::on();
    let dir = job_dir();
    let script = "grep Cpus_allowed_list /proc/self/status; cat /proc/self/cgroup; \
                  echo \"agent=${RESILIO_JOB_ID:-none} socket=${RESILIO_SOCKET:+yes}\"";
    let plain = srun_lines(&[], dir.path(), script);
    let wrapped = srun_lines(&["--resilio"], dir.path(), script);
    let (binding, marks): (Vec<&String>, Vec<&String>) =
        wrapped.iter().partition(|l| !l.contains("agent="));
    let plain_binding: Vec<&String> = plain.iter().filter(|l| !l.contains("agent=")).collect();
    // Cpus_allowed_list and /proc/self/cgroup of every task, the same; and
    // the binding is real: each task on a CPU of its own.
    for (task, cpu) in [("0", "0"), ("1", "1")] {
        let line = format!("{task}: Cpus_allowed_list:\t{cpu}");
        assert!(plain.contains(&line), "{line:?} in {plain:#?}");
    }
    assert_eq!(
        binding, plain_binding,
        "with the plugin:\n{wrapped:#?}\nwithout:\n{plain:#?}"
    );
    // Without --resilio nothing wraps the task; with it, an agent does.
    assert!(
        plain.iter().any(|l| l.ends_with("agent=none socket=")),
        "{plain:?}"
    );
    assert_eq!(marks.len(), 2, "{wrapped:?}");
    assert!(
        marks
            .iter()
            .all(|l| !l.contains("agent=none") && l.ends_with("socket=yes")),
        "{marks:?}"
    );
    // Each task's raw wait status, from the plugin's task_exit.
    let job = marks[0]
        .split("agent=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let exits = dir.path().join(format!("jobs/{job}/task-exit"));
    let mut files: Vec<String> = std::fs::read_dir(&exits)
        .unwrap_or_else(|e| panic!("{}: {e}", exits.display()))
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    files.sort();
    assert_eq!(files, ["raw_status=0\n", "raw_status=0\n"]);
    // A bad option is refused before anything runs.
    let o = Command::new("srun")
        .args(["-N", "1", "--resilio=retries=3", "true"])
        .env("RESILIO_STATE_DIR", dir.path())
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("unknown key 'retries'"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn srun_resilio_in_a_batch_script_judges_a_crash_and_a_hang_and_requeues() {
    let _g = lock();
    plugin();
    let trainer = root().join("tests/fixtures/lockstep_trainer.py");
    for (fault, class) in [("kill", "infrastructure"), ("hang", "hang")] {
        let dir = job_dir();
        let body = format!(
            "srun --resilio=stall-timeout=4s,kill-grace=2s python3 {} --ckpt-dir {}/ckpt \
             --total 20 --step-time 0.2 --fault {fault} --fault-rank 1 --fault-step 8 --fault-attempts 0",
            trainer.display(),
            dir.path().display()
        );
        let job = sbatch_in(dir, 3, "-t 10", &body);
        let recs = job.completed(Duration::from_secs(240));
        let j = of_attempt(&recs, "judgment", 0);
        assert_eq!(j.len(), 1, "{fault}: {recs:#?}");
        assert_eq!(j[0].str("class"), Some(class), "{fault}: {j:?}");
        assert_eq!(
            of_attempt(&recs, "requeue", 0).len(),
            1,
            "{fault}: {recs:#?}"
        );
        assert_eq!(rank_nodes(&recs, 1).len(), 3, "{fault}");
        assert!(job.output().contains("step 20/20"), "{fault}");
    }
}

#[test]
fn sbatch_resilio_puts_a_plain_srun_under_the_job_level_through_a_crash_and_a_hang() {
    let _g = lock();
    plugin();
    let trainer = root().join("tests/fixtures/lockstep_trainer.py");
    for (fault, class) in [("kill", "infrastructure"), ("hang", "hang")] {
        let dir = job_dir();
        let conf = dir.path().join("resilio.toml");
        std::fs::write(&conf, "[stall]\ntimeout = \"4s\"\nkill_grace = \"2s\"\n").unwrap();
        // No resilio in the script: the batch script runs under the job
        // level, and srun's tasks under rank agents.
        let body = format!(
            "srun python3 {} --ckpt-dir {}/ckpt \
             --total 20 --step-time 0.2 --fault {fault} --fault-rank 1 --fault-step 8 --fault-attempts 0",
            trainer.display(),
            dir.path().display()
        );
        // The job level starts before the script: its state dir comes
        // with the submission, not from an `export` inside the script.
        let opts = format!(
            "-t 10\n#SBATCH --resilio=config={}\n#SBATCH --export=ALL,RESILIO_STATE_DIR={}/state",
            conf.display(),
            dir.path().display()
        );
        let job = sbatch_in(dir, 3, &opts, &body);
        let recs = job.completed(Duration::from_secs(240));
        // The job level ran (batch.jsonl's job_start) and decided.
        assert!(
            recs.iter().any(|r| r.kind == "job_start"
                && r.rank.is_none()
                && r.str("mode") == Some("batch")),
            "{fault}: {recs:#?}"
        );
        let j = of_attempt(&recs, "judgment", 0);
        assert_eq!(j.len(), 1, "{fault}: {recs:#?}");
        assert_eq!(j[0].str("class"), Some(class), "{fault}: {j:?}");
        assert!(
            rank_nodes(&recs, 0).len() == 3,
            "{fault}: every task under an agent"
        );
        assert!(job.output().contains("step 20/20"), "{fault}");
    }
}

/// `#SBATCH --resilio` with RESILIO_STATE_DIR exported inside the script,
/// after the job level started with another: the ranks journal where the
/// job level reads, and its judgment sees their evidence (trial 6: the
/// journal was split, a GPU failure judged "unknown" and the script rerun
/// on the same node).
#[test]
fn a_state_dir_exported_inside_the_script_keeps_the_ranks_with_the_job_level() {
    let _g = lock();
    plugin();
    let trainer = root().join("tests/fixtures/lockstep_trainer.py");
    let dir = job_dir();
    let elsewhere = dir.path().join("elsewhere");
    let body = format!(
        "export RESILIO_STATE_DIR={}\nsrun python3 {} --ckpt-dir {}/ckpt \
         --total 20 --step-time 0.2 --fault traceback --fault-rank 1 --fault-step 8 --fault-attempts all",
        elsewhere.display(),
        trainer.display(),
        dir.path().display()
    );
    let opts = format!(
        "-t 10\n#SBATCH --resilio\n#SBATCH --export=ALL,RESILIO_STATE_DIR={}/state",
        dir.path().display()
    );
    let job = sbatch_in(dir, 2, &opts, &body);
    let state = job.wait_final(Duration::from_secs(240));
    assert_eq!(state, "FAILED", "{}", job.output());
    let recs = job.records();
    // Every rank's records are with the job level's, none elsewhere.
    assert_eq!(rank_nodes(&recs, 0).len(), 2, "{recs:#?}");
    let j = of_attempt(&recs, "judgment", 0);
    assert_eq!(j.len(), 1, "{recs:#?}");
    assert_eq!(j[0].str("class"), Some("user_error"), "{j:?}");
    assert_eq!(j[0].u64("primary_rank"), Some(1), "{j:?}");
    assert!(
        !elsewhere.join("jobs").exists(),
        "the ranks journaled under the exported state dir"
    );
    assert!(
        job.output().contains("differs from the job level's"),
        "{}",
        job.output()
    );
}

/// The bare `--resilio`, in the script (`#SBATCH --resilio`) and on
/// sbatch's command line: the script runs under the job level and its
/// plain `srun` under rank agents. (Slurm hands the option on to the
/// script's srun as the literal value "(null)", which the plugin used to
/// refuse: every srun failed.)
#[test]
fn a_bare_sbatch_resilio_puts_a_plain_srun_under_agents_in_the_script_and_on_the_command_line() {
    let _g = lock();
    plugin();
    let trainer = root().join("tests/fixtures/lockstep_trainer.py");
    for in_script in [true, false] {
        let dir = job_dir();
        let body = format!(
            "srun python3 {} --ckpt-dir {}/ckpt --total 10 --step-time 0.2",
            trainer.display(),
            dir.path().display()
        );
        let export = format!(
            "--export=ALL,RESILIO_STATE_DIR={}/state",
            dir.path().display()
        );
        let (opts, cli) = if in_script {
            (
                format!("-t 10\n#SBATCH --resilio\n#SBATCH {export}"),
                vec![],
            )
        } else {
            (format!("-t 10\n#SBATCH {export}"), vec!["--resilio"])
        };
        let job = sbatch_in_with(dir, 3, &opts, &body, &cli);
        let recs = job.completed(Duration::from_secs(180));
        let out = job.output();
        assert!(!out.contains("(null)"), "in script {in_script}: {out}");
        assert!(
            recs.iter().any(|r| r.kind == "job_start"
                && r.rank.is_none()
                && r.str("mode") == Some("batch")),
            "in script {in_script}: the job level ran: {recs:#?}"
        );
        assert_eq!(
            rank_nodes(&recs, 0).len(),
            3,
            "in script {in_script}: every task under an agent:\n{out}"
        );
        assert!(out.contains("step 10/10"), "in script {in_script}: {out}");
        assert!(recs.iter().all(|r| r.kind != "judgment"), "{recs:#?}");
    }
}

/// An unprivileged user for the tests that need one (made once, kept).
fn test_user() -> (String, u32) {
    named_test_user("resilio-e2e")
}

/// A system user of that name (made once), and its uid.
fn named_test_user(name: &str) -> (String, u32) {
    let id = |user: &str| {
        Command::new("id")
            .args(["-u", user])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<u32>()
                    .ok()
            })
    };
    if id(name).is_none() {
        let o = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/bin/sh", name])
            .output()
            .expect("useradd");
        assert!(
            o.status.success() || id(name).is_some(),
            "useradd: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    (name.to_string(), id(name).expect("the test user's uid"))
}

/// The test user, and a directory of theirs to work in.
fn user_home() -> (String, u32, tempfile::TempDir) {
    let (user, uid) = test_user();
    let dir = job_dir();
    std::os::unix::fs::chown(dir.path(), Some(uid), None).unwrap();
    (user, uid, dir)
}

/// `runuser -u USER -- ARGS` in `dir`; its output, asserted successful.
fn as_user(user: &str, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> String {
    let o = Command::new("runuser")
        .args(["-u", user, "--"])
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .output()
        .expect("runuser");
    assert!(
        o.status.success(),
        "{args:?} as {user}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The plugin's task_exit runs as root in slurmstepd, on a state dir the
/// user chooses. An unprivileged user who plants symlinks for the next
/// job ids (`jobs/ID -> a root directory`) must not make root create (or
/// chown) anything there; the user's own task-exit files are written, and
/// are the user's.
#[test]
fn the_plugin_writes_task_exit_files_as_the_user_and_never_through_a_planted_symlink() {
    let _g = lock();
    plugin();
    let (user, uid, dir) = user_home();
    let home = dir.path();
    // Root's directory, which the user's symlinks point at.
    let target = job_dir();
    let wrap_cmd = |sd: &Path, cmd: &str| {
        let sd = sd.display().to_string();
        let out = as_user(
            &user,
            home,
            &[("RESILIO_STATE_DIR", &sd)],
            &[
                "sbatch",
                "--parsable",
                "-N",
                "1",
                "-t",
                "5",
                "-o",
                "/dev/null",
                "--wrap",
                cmd,
            ],
        );
        out.trim().split(';').next().unwrap().to_string()
    };
    let wrap = |sd: &Path| wrap_cmd(sd, "srun --resilio true");
    let wait = |id: &str| {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let info = resilio::slurm::commands::parse_show_job(&run(
                "scontrol",
                &["-o", "show", "job", id],
            ))
            .unwrap();
            if ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"].contains(&info.state.as_str()) {
                return info.state;
            }
            assert!(Instant::now() < deadline, "job {id}: {}", info.state);
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    // The user's own state dir: the files are written, and the user's.
    let own = home.join("own");
    as_user(&user, home, &[], &["mkdir", own.to_str().unwrap()]);
    let id = wrap(&own);
    assert_eq!(wait(&id), "COMPLETED");
    let file = own.join(format!("jobs/{id}/task-exit/0.0"));
    let meta = std::fs::metadata(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), uid);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "raw_status=0\n");
    // A site-wide state dir: the user's own part of it, next to the journals.
    let shared = home.join("shared");
    std::fs::create_dir(&shared).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_resilio"))
        .args(["admin", "init-state-dir"])
        .arg(&shared)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id = wrap(&shared);
    assert_eq!(wait(&id), "COMPLETED");
    let file = shared.join(format!("users/{user}/jobs/{id}/task-exit/0.0"));
    let meta = std::fs::metadata(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), uid);
    assert!(!shared.join("jobs").exists());
    // In a requeued allocation step ids start at 0 again: its files carry
    // the requeue count instead of replacing the first allocation's.
    let id = wrap_cmd(&own, "SLURM_RESTART_COUNT=2 srun --resilio sh -c 'exit 3'");
    assert_eq!(wait(&id), "FAILED");
    let file = own.join(format!("jobs/{id}/task-exit/0.0.r2"));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display())),
        "raw_status=768\n"
    );
    // The next job ids, planted as links to root's directory.
    let sd = home.join("planted");
    as_user(
        &user,
        home,
        &[],
        &["mkdir", "-p", sd.join("jobs").to_str().unwrap()],
    );
    let next: u64 = id.parse::<u64>().unwrap() + 1;
    for j in next..next + 20 {
        let link = sd.join(format!("jobs/{j}"));
        as_user(
            &user,
            home,
            &[],
            &[
                "ln",
                "-s",
                target.path().to_str().unwrap(),
                link.to_str().unwrap(),
            ],
        );
    }
    let id = wrap(&sd);
    assert!(id.parse::<u64>().unwrap() < next + 20, "job {id}");
    assert_eq!(wait(&id), "COMPLETED");
    let planted: Vec<_> = std::fs::read_dir(target.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        planted.is_empty(),
        "root wrote through the user's symlink: {planted:?}"
    );
}

/// A loss that goes to NaN and stays there, under the job level on the
/// cluster: the rank's agent stops it (exit 65), the job level judges it
/// numerical and ends the job without a requeue.
#[test]
fn a_loss_gone_to_nan_ends_the_job_without_a_requeue() {
    let _g = lock();
    testbed();
    let dir = job_dir();
    let body = format!(
        "exec {BIN} run -- srun --kill-on-bad-exit=1 {BIN} run --kill-grace 2s -- python3 {} --style nanogpt --steps 3000 --step-time 0.05 --nan-at 40",
        root().join("tests/fixtures/throughput_trainer.py").display()
    );
    let job = sbatch_in(dir, 2, "-t 10", &body);
    let state = job.wait_final(Duration::from_secs(180));
    assert_eq!(state, "FAILED", "{}", job.output());
    assert_eq!(job.show().restarts, 0);
    assert!(job.kinds("requeue").is_empty());
    let n = job.kinds("numerical");
    assert_eq!(n.len(), 1, "{n:?}");
    assert_eq!(n[0].str("finding"), Some("nan"));
    assert_eq!(n[0].u64("since_step"), Some(40));
    let judgment = job.kinds("judgment");
    assert_eq!(judgment[0].str("class"), Some("numerical"), "{judgment:?}");
    assert_eq!(judgment[0].u64("primary_rank"), Some(0));
    let end = job.kinds("job_end");
    let last = end.last().unwrap();
    assert!(
        last.str("reason").unwrap().starts_with("numerical failure"),
        "{end:?}"
    );
    // The rank itself ended 65, and so did the job (the batch script's
    // code, as Slurm keeps it), not srun's code for the task it stopped.
    let exits = job.kinds("rank_exit");
    assert!(
        exits
            .iter()
            .any(|r| r.rank == Some(0) && r.get("exit_code").and_then(|v| v.as_i64()) == Some(65)),
        "{exits:?}"
    );
    assert_eq!(
        last.get("exit_code").and_then(|v| v.as_i64()),
        Some(65),
        "{end:?}"
    );
    let shown = run("scontrol", &["-o", "show", "job", &job.id]);
    assert!(shown.contains(" ExitCode=65:0 "), "{shown}");
}

/// A checkpoint that loads into NaN losses, under the job level on the
/// cluster: after a crash at step 45, the step relaunched inside the
/// allocation restores the newest checkpoint (40, saved corrupt) and its
/// loss is NaN at once; the checkpoint is blamed, the next relaunch is told
/// to load the one before it (30) through `RESILIO_ROLLBACK_STEP`, and the
/// job completes.
#[test]
fn a_checkpoint_that_loads_into_nan_is_not_loaded_again() {
    let _g = lock();
    testbed();
    let dir = job_dir();
    let d = dir.path().display().to_string();
    std::fs::write(
        dir.path().join("c.toml"),
        format!("[checkpoint]\nwatch_dir = \"{d}/ck\"\nwatch_poll = \"200ms\"\n"),
    )
    .unwrap();
    let body = format!(
        "exec {BIN} run --config {d}/c.toml -- srun --kill-on-bad-exit=1 {BIN} run --config {d}/c.toml --kill-grace 2s -- python3 {} --style nanogpt --steps 80 --step-time 0.05 --ckpt-every 10 --corrupt-at 40 --crash-at 45 --fault-once {d}/once --ckpt-dir {d}/ck --record {d}/record.json",
        root().join("tests/fixtures/throughput_trainer.py").display()
    );
    let job = sbatch_in(dir, 1, "-t 10", &body);
    let state = job.wait_final(Duration::from_secs(240));
    assert_eq!(state, "COMPLETED", "{}", job.output());
    let decisions = job.kinds("decision");
    assert_eq!(decisions.len(), 2, "{decisions:#?}");
    let d1 = &decisions[1];
    assert_eq!(d1.fields()["suspect_checkpoint"], 40, "{d1:?}");
    assert_eq!(
        d1.fields()["decision"]["action"],
        "restart_in_allocation",
        "{d1:?}"
    );
    let rb = job.kinds("rollback");
    assert_eq!(rb.len(), 1, "{rb:?}");
    assert_eq!(rb[0].u64("checkpoint_step"), Some(30), "{rb:?}");
    let mine: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(job.dir.path().join("record.json")).unwrap())
            .unwrap();
    assert_eq!(mine["resumed_from"], 30, "{mine}");
}

/// A journal file in `state`'s job `job` whose rank `rank` on `node`
/// failed with a GPU error, given to `uid` (as if that user wrote it).
fn plant_failure(state: &Path, job: &str, rank: u32, node: &str, uid: u32) {
    let mut w = journal::Writer::open(
        &journal::job_dir(state, job),
        &format!("rank-{rank}.jsonl"),
        0,
        Some(rank),
        Some(node.into()),
    );
    w.record(
        "failure",
        serde_json::json!({ "class": "infrastructure", "evidence": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus." }),
        true,
    );
    drop(w);
    let o = Command::new("chown")
        .args(["-R", &format!("{uid}")])
        .arg(state)
        .output()
        .unwrap();
    assert!(o.status.success());
}

/// Anyone can write a journal that blames a node. On the real cluster,
/// root's `resilio nodes` believes another user's journal only where
/// Slurm's accounting agrees (the job is that user's, and ran on the
/// blamed node then), says how many events it left out and why, and one
/// user's jobs alone never list a node.
#[test]
fn a_journal_blaming_a_node_is_believed_only_where_slurm_agrees() {
    let _g = lock();
    testbed();
    let (user, uid, dir) = user_home();
    let home = dir.path();
    // A real job of the user's on n2, and one of root's on n3.
    let user_job = as_user(
        &user,
        home,
        &[],
        &[
            "sbatch",
            "--parsable",
            "--wait",
            "-N1",
            "-w",
            "n2",
            "-t",
            "5",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ],
    );
    let user_job = user_job.trim().split(';').next().unwrap().to_string();
    let root_job = run(
        "sbatch",
        &[
            "--parsable",
            "--wait",
            "-N1",
            "-w",
            "n3",
            "-t",
            "5",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ],
    );
    let root_job = root_job.trim().split(';').next().unwrap().to_string();
    // slurmdbd records a job a moment after it ends; the first job of a
    // user new to Slurm is listed as root's (UID 0) for about a second
    // before its own user appears (seen here: 5|0|root, then 5|994|rtest1).
    let deadline = Instant::now() + Duration::from_secs(60);
    let want = format!("{user_job}|{user}\n{root_job}|root");
    while run(
        "sacct",
        &[
            "-a",
            "-X",
            "-n",
            "-P",
            "-o",
            "JobIDRaw,User",
            "-j",
            &format!("{user_job},{root_job}"),
        ],
    )
    .trim()
        != want
    {
        assert!(Instant::now() < deadline, "sacct never listed the jobs");
        std::thread::sleep(Duration::from_millis(500));
    }
    // A shared state dir, as the admin sets it up.
    let shared = home.join("shared");
    std::fs::create_dir(&shared).unwrap();
    let bin = env!("CARGO_BIN_EXE_resilio");
    let o = Command::new(bin)
        .args(["admin", "init-state-dir"])
        .arg(&shared)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The user's journals (written here, then given to the user): each
    // blames a node with a GPU failure.
    let mine = shared.join("users").join(&user);
    for (job, node) in [
        (user_job.as_str(), "n2"), // Slurm agrees
        (root_job.as_str(), "n3"), // root's job, not the user's
        ("999999", "n4"),          // no such job
        ("local-made-up", "n1"),   // a run outside Slurm
    ] {
        plant_failure(&mine, job, 0, node, uid);
    }
    // And one more of the user's real job, but on a node it never had.
    plant_failure(&mine, &user_job, 1, "n4", uid);

    let o = Command::new(bin)
        .args(["nodes", "--json", "--state-dir"])
        .arg(&shared)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let history: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let journal_events: Vec<(String, String, String, bool)> = history
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| {
            let node = n["node"].as_str().unwrap().to_string();
            n["events"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|e| e["source"] == "journal")
                .map(move |e| {
                    (
                        node.clone(),
                        e["job"].as_str().unwrap().to_string(),
                        e["owner"].as_str().unwrap().to_string(),
                        e["trusted"].as_bool().unwrap(),
                    )
                })
        })
        .collect();
    assert_eq!(
        journal_events,
        [("n2".to_string(), user_job.clone(), user.clone(), false)],
        "{history:#}\nsacct: {}\nls: {}\n{}",
        // What Slurm and the disk said, for a failure seen once in CI.
        run(
            "sacct",
            &[
                "-a",
                "-D",
                "-n",
                "-P",
                "-o",
                "JobIDRaw,UID,User,Submit,Start,End,NodeList",
                "-j",
                &format!("{user_job},{root_job}")
            ],
        ),
        String::from_utf8_lossy(
            &Command::new("ls")
                .args(["-lnR"])
                .arg(&shared)
                .output()
                .unwrap()
                .stdout
        ),
        String::from_utf8_lossy(
            &Command::new(bin)
                .args(["nodes", "--state-dir"])
                .arg(&shared)
                .output()
                .unwrap()
                .stdout
        )
    );
    // The user's word alone does not list n2 (Slurm's own NODE_FAIL
    // records of earlier tests might).
    let n2 = history
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == "n2")
        .unwrap();
    let from_slurm = n2["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["source"] == "sacct");
    assert_eq!(n2["listable"].as_bool(), Some(from_slurm), "{n2:#}");
    let o = Command::new(bin)
        .args(["nodes", "--state-dir"])
        .arg(&shared)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "left out: 1 event(s): a journal whose owner is not the job's user in Slurm's accounting",
        "left out: 1 event(s): an event on a node or at a time outside the job's allocations",
        // Job 999999 and the run outside Slurm.
        "left out: 2 event(s): another user's journal of a job Slurm's accounting does not know",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    // Another user makes a directory of the user's job id: root's report
    // of that job reads the directory of the job's user in Slurm's
    // accounting, not the planted one (nor refuses for the ambiguity).
    let (other, other_uid) = named_test_user("resilio-e2e2");
    let theirs = shared.join("users").join(&other);
    plant_failure(&theirs, &user_job, 0, "n1", other_uid);
    let o = Command::new(bin)
        .args(["report", &user_job, "--json", "--state-dir"])
        .arg(&shared)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let nodes: Vec<&str> = r["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["node"].as_str())
        .collect();
    assert!(nodes.contains(&"n2") && !nodes.contains(&"n1"), "{r:#}");
}

#[test]
fn a_step_of_two_nodes_heard_through_each_nodes_relay_blames_the_hung_rank() {
    let _g = lock();
    testbed();
    let dir = job_dir();
    let cfg = dir.path().join("relay.toml");
    std::fs::write(&cfg, "[coordinator]\nnode_relay = \"on\"\n").unwrap();
    let ranks = agent_and_trainer(
        dir.path(),
        "--total 24 --step-time 0.2 --fault hang --fault-rank 3 --fault-step 8 --fault-attempts 0",
    )
    .replacen(" run ", &format!(" run --config {} ", cfg.display()), 1);
    let body = format!(
        "exec {BIN} run --config {} -- srun --kill-on-bad-exit=1 {ranks}",
        cfg.display()
    );
    // Two nodes of two ranks: ranks 0 and 1 on the first, 2 and 3 on the
    // second; rank 3, which hangs, is heard through rank 2's relay.
    let job = sbatch_in_with(dir, 2, "-t 10", &body, &["--ntasks-per-node=2"]);
    let state = job.wait_final(Duration::from_secs(240));
    assert_eq!(state, "COMPLETED", "{}", job.output());
    let recs = job.records();
    let mut relays: Vec<(u32, String)> = recs
        .iter()
        .filter(|r| r.kind == "relay_started" && r.attempt == 0)
        .map(|r| (r.rank.unwrap(), r.node.clone().unwrap_or_default()))
        .collect();
    relays.sort();
    let nodes = rank_nodes(&recs, 0);
    assert_eq!(nodes.len(), 4, "{nodes:?}");
    assert_eq!(
        relays,
        [(0, nodes[0].1.clone()), (2, nodes[2].1.clone())],
        "one relay a node, run by its first rank: {nodes:?}"
    );
    assert_ne!(nodes[0].1, nodes[2].1);
    assert!(job.kinds("relay_bypassed").is_empty(), "{recs:#?}");
    let judgment = job.kinds("judgment");
    assert_eq!(judgment[0].str("class"), Some("hang"), "{judgment:?}");
    assert_eq!(judgment[0].u64("primary_rank"), Some(3), "{judgment:?}");
    let d = job.kinds("decision");
    assert_eq!(
        d[0].get("decision").unwrap()["action"],
        "restart_in_allocation",
        "{d:?}"
    );
    // The relaunch found its relays again and finished.
    assert_eq!(
        recs.iter()
            .filter(|r| r.kind == "relay_started" && r.attempt == 1)
            .count(),
        2
    );
    for r in recs
        .iter()
        .filter(|r| r.kind == "rank_exit" && r.attempt == 1)
    {
        assert_eq!(r.u64("exit_code"), Some(0), "{r:?}");
    }
}
