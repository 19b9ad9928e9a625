//! The effects that go through Slurm, with the fake handed in.

use super::*;
use crate::context::Identity;
use crate::coordinator::client::Outbox;
use crate::progress::output;
use crate::rank::progress_log::Clock;
use crate::slurm::fake::FakeSlurm;
use std::os::unix::process::CommandExt;
use std::sync::Arc;

/// A stand-in for the trainer: `sleep` in a process group of its own.
fn trainer() -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap()
}

/// An agent set up around `child`, as the job level runs `argv`.
fn rank(dir: &std::path::Path, child: &std::process::Child, argv: &[&str]) -> Box<Rank> {
    let launched = Instant::now();
    Box::new(Rank {
        cfg: crate::config::Config::default(),
        argv: argv.iter().map(Into::into).collect(),
        id: Identity {
            job: "77".into(),
            attempt: 0,
            rank: 0,
            world_size: 1,
            node: "n1".into(),
            run: crate::runs::RunKey {
                key: None,
                fresh: false,
            },
        },
        slurm: crate::slurm::SlurmContext::default(),
        clock: Clock {
            t0: launched,
            wall0: Utc::now(),
        },
        job_dir: dir.to_path_buf(),
        supervises_step: true,
        owns_job: true,
        checks_node: false,
        journal: journal::Writer::open(dir, "batch.jsonl", 0, None, Some("n1".into())),
        hosted: None,
        advice: None,
        outbox: Arc::new(Outbox::default()),
        link: None,
        relay: None,
        tx: crate::progress::Sender::new(),
        socket_ok: false,
        sock_path: dir.join("s.sock"),
        control_path: dir.join("s.ctl"),
        pid: nix::unistd::Pid::from_raw(child.id() as i32),
        launched,
        tail: output::Tail::new(1024),
        pumps: Vec::new(),
        file_watch: None,
        ckpt_watch: None,
    })
}

fn stop_record(dir: &std::path::Path) -> journal::Record {
    journal::read_job(dir)
        .unwrap()
        .records
        .into_iter()
        .find(|r| r.kind == "stop")
        .expect("a stop record")
}

/// Wait for `child` to end (by a signal) within a few seconds.
fn ended_by_signal(child: &mut std::process::Child) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    for _ in 0..300 {
        if let Some(st) = child.try_wait().unwrap() {
            return st.signal();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

#[test]
fn the_pre_timeout_stop_signals_srun_steps_through_slurm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = trainer();
    let fake = FakeSlurm::default();
    let (mut agent, _done) = Agent::new(rank(dir.path(), &child, &["srun", "train"]), &fake);
    assert!(agent.act(Order::StopForPreTimeout {
        checkpoint_step: Some(Some(7))
    }));
    assert_eq!(fake.calls(), vec!["signal_steps 77 SIGTERM".to_string()]);
    // Slurm delivered it: srun itself was not signalled.
    assert!(child.try_wait().unwrap().is_none());
    let r = stop_record(dir.path());
    assert_eq!(r.str("reason"), Some("pre_timeout"));
    assert_eq!(r.u64("checkpoint_step"), Some(7));
    assert_eq!(r.get("checkpoint_confirmed").cloned().unwrap(), true);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn when_slurm_refuses_the_pre_timeout_stop_goes_to_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = trainer();
    let fake = FakeSlurm::default();
    fake.fail("signal_steps", "scancel: error");
    let (mut agent, _done) = Agent::new(rank(dir.path(), &child, &["srun", "train"]), &fake);
    agent.act(Order::StopForPreTimeout {
        checkpoint_step: None,
    });
    assert_eq!(ended_by_signal(&mut child), Some(libc::SIGTERM));
    let r = stop_record(dir.path());
    assert_eq!(r.get("checkpoint_confirmed").cloned().unwrap(), false);
    // No step was confirmed: the record names none (absent means unknown).
    assert_eq!(r.u64("checkpoint_step"), None);
}

#[test]
fn a_trainer_the_script_runs_itself_is_stopped_without_slurm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = trainer();
    let fake = FakeSlurm::default();
    let (mut agent, _done) = Agent::new(rank(dir.path(), &child, &["python3", "train.py"]), &fake);
    agent.act(Order::StopForPreTimeout {
        checkpoint_step: None,
    });
    assert!(fake.calls().is_empty());
    assert_eq!(ended_by_signal(&mut child), Some(libc::SIGTERM));
}
