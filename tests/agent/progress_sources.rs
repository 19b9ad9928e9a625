use crate::common::*;
use std::time::Duration;

fn last_step(recs: &[resilio::journal::Record]) -> Option<u64> {
    one(recs, "rank_exit").u64("last_step")
}

fn sources(recs: &[resilio::journal::Record]) -> Vec<String> {
    kinds(recs, "progress")
        .iter()
        .filter_map(|r| r.str("source").map(String::from))
        .collect()
}

#[test]
fn output_parsing_with_the_default_regex() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = run_trainer(
        dir.path(),
        "out",
        &["--stall-timeout", "1s"],
        &[
            "--steps",
            "12",
            "--format",
            " iteration {step:8d}/{total:8d} | lm loss: 2.0 |",
            "--then",
            "hang",
        ],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(124), "{}", stderr_of(&o));
    let recs = records(dir.path(), "out");
    assert_eq!(last_step(&recs), Some(12));
    assert!(sources(&recs).iter().all(|s| s == "stdout"));
    assert_eq!(kinds(&recs, "progress")[0].u64("step"), Some(1));
}

#[test]
fn output_parsing_with_a_custom_regex() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = run_trainer(
        dir.path(),
        "custom",
        &["--stall-timeout", "1s", "--progress-regex", r"upd#(\d+)"],
        &[
            "--steps",
            "7",
            "--format",
            "upd#{step} step 999",
            "--then",
            "hang",
        ],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(124));
    assert_eq!(last_step(&records(dir.path(), "custom")), Some(7));
}

#[test]
fn datagram_socket_steps_and_malformed_messages() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = run_trainer(
        dir.path(),
        "sock",
        &["--stall-timeout", "1s"],
        &[
            "--report",
            "socket",
            "--steps",
            "9",
            "--malformed",
            "3",
            "--then",
            "hang",
        ],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(124));
    let recs = records(dir.path(), "sock");
    assert_eq!(last_step(&recs), Some(9));
    assert!(
        sources(&recs).iter().all(|s| s == "socket"),
        "{:?}",
        sources(&recs)
    );
    // compute_s and loss are kept with the sampled progress.
    let first = kinds(&recs, "progress")[0];
    assert!(
        first
            .get("metrics")
            .and_then(|m| m.get("compute_s"))
            .is_some(),
        "{first:?}"
    );
    // Three malformed datagrams: logged once, counted three times, not fatal.
    let err = stderr_of(&o);
    assert_eq!(
        err.matches("malformed progress message").count(),
        1,
        "{err}"
    );
    let exit = one(&recs, "rank_exit");
    assert_eq!(
        exit.get("malformed_messages")
            .and_then(|m| m.get("bad_token"))
            .and_then(|v| v.as_u64()),
        Some(3)
    );
}

/// A trainer that puts a counter in its phase names: the first 32 unknown
/// names are warned about and journaled, the rest only counted.
#[test]
fn unknown_phase_names_do_not_flood_stderr_or_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let script = "import os, socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\nfor i in range(1, 201):\n    s.sendto(f'phase=eval_{i} step={i}'.encode(), os.environ['RESILIO_SOCKET'])\n";
    let (o, _) = output_within(
        resilio_run(dir.path(), "phases").args(["--", "python3", "-c", script]),
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let recs = records(dir.path(), "phases");
    let unknown = kinds(&recs, "unknown_phase");
    assert_eq!(unknown.len(), 33, "{unknown:#?}");
    assert_eq!(
        unknown.iter().filter(|r| r.get("phase").is_none()).count(),
        1
    );
    let err = stderr_of(&o);
    assert_eq!(err.matches("is not a known phase").count(), 32, "{err}");
    assert_eq!(err.matches("no longer listed").count(), 1, "{err}");
}

/// A trainer that reports steps on the socket and also prints a count in
/// another unit (Lightning's bar counts batches, `resilio_client` sends
/// optimizer steps): once the socket has spoken, its steps name the step,
/// and the output's numbers still count as signs of life.
#[test]
fn socket_steps_win_over_numbers_in_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = run_trainer(
        dir.path(),
        "both",
        &["--stall-timeout", "1s"],
        &[
            "--report",
            "both",
            "--output-scale",
            "4",
            "--steps",
            "9",
            "--then",
            "hang",
        ],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(124), "{}", stderr_of(&o));
    let recs = records(dir.path(), "both");
    assert_eq!(last_step(&recs), Some(9));
    let switched = kinds(&recs, "progress_source")
        .into_iter()
        .find(|r| r.str("steps_from") == Some("socket"))
        .expect("the socket takes the step's name");
    let after: Vec<_> = kinds(&recs, "progress")
        .into_iter()
        .filter(|r| r.ts >= switched.ts)
        .collect();
    assert!(!after.is_empty());
    // Whatever source showed the progress, the step is the socket's (the
    // output prints 4x the step: 36 for step 9).
    assert!(
        after.iter().all(|r| r.u64("step").is_some_and(|s| s <= 9)),
        "{after:?}"
    );
    assert_eq!(one(&recs, "stall").u64("last_step"), Some(9));
}

#[test]
fn sending_never_fails_when_resilio_is_gone() {
    // The documented client code, run with no resilio behind the socket.
    let o = std::process::Command::new("python3")
        .arg(trainer())
        .args([
            "--report",
            "socket",
            "--steps",
            "5",
            "--interval",
            "0.01",
            "--checkpoint-at",
            "2",
        ])
        .env("RESILIO_SOCKET", "/nonexistent/resilio.sock")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    // A socket file with no reader behind it (ECONNREFUSED).
    drop(std::os::unix::net::UnixDatagram::bind(&sock).unwrap());
    let o = std::process::Command::new("python3")
        .arg(trainer())
        .args(["--report", "socket", "--steps", "5", "--interval", "0.01"])
        .env("RESILIO_SOCKET", &sock)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
}

fn progress_file_run(poll: &str) {
    let dir = tempfile::tempdir().unwrap();
    let pf = dir.path().join("latest_checkpointed_iteration.txt");
    std::fs::write(&pf, "5000\n").unwrap(); // a previous run's value: the baseline, not progress
    let cfg = write_config(
        dir.path(),
        &format!(
            "[progress]\nfile = {:?}\nfile_poll = \"{poll}\"\nfile_poll_interval = \"50ms\"\n[stall]\ntimeout = \"1500ms\"\n",
            pf
        ),
    );
    let job = format!("file-{poll}");
    let mut c = run_trainer(
        dir.path(),
        &job,
        &["--config", cfg.to_str().unwrap()],
        &[
            "--report",
            "file",
            "--progress-file",
            pf.to_str().unwrap(),
            "--steps",
            "8",
            "--interval",
            "0.2",
            "--then",
            "hang",
        ],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(124), "{}", stderr_of(&o));
    let recs = records(dir.path(), &job);
    assert_eq!(last_step(&recs), Some(8));
    assert!(sources(&recs).iter().all(|s| s == "file"));
    let start = one(&recs, "rank_start");
    let mode = start.str("progress_file_watch").unwrap();
    assert!(
        mode.starts_with(if poll == "always" {
            "polling"
        } else {
            "inotify"
        }),
        "{mode}"
    );
}

#[test]
fn progress_file_watched_with_inotify() {
    progress_file_run("auto");
}

#[test]
fn progress_file_polled() {
    progress_file_run("always");
}

#[test]
fn checkpoints_the_trainer_saves_on_its_own_are_recorded_only_when_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    std::fs::create_dir_all(ck.join("checkpoint-1")).unwrap();
    std::fs::write(ck.join("checkpoint-1/trainer_state.json"), b"{}").unwrap();
    let cfg = write_config(
        tmp.path(),
        &format!(
            "[checkpoint]\nwatch_dir = \"{}\"\nwatch_poll = \"200ms\"\n",
            ck.display()
        ),
    );
    // Saved as HF does: files into a temporary directory, renamed when whole;
    // then a save that never finishes (no trainer_state.json).
    let script = format!(
        "import os, time\nck = {:?}\nos.makedirs(ck + '/tmp-checkpoint-3')\nopen(ck + '/tmp-checkpoint-3/model.safetensors', 'w').write('x')\nopen(ck + '/tmp-checkpoint-3/trainer_state.json', 'w').write('x')\ntime.sleep(0.5)\nos.rename(ck + '/tmp-checkpoint-3', ck + '/checkpoint-3')\nos.makedirs(ck + '/checkpoint-6')\nopen(ck + '/checkpoint-6/model.safetensors', 'w').write('x')\ntime.sleep(1.0)\n",
        ck.to_str().unwrap()
    );
    let (out, _) = output_within(
        resilio_run(tmp.path(), "ckdir").args([
            "--config",
            cfg.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &script,
        ]),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "ckdir");
    let done: Vec<(Option<u64>, Option<&str>)> = kinds(&recs, "checkpoint_done")
        .iter()
        .map(|r| (r.u64("step"), r.str("source")))
        .collect();
    assert_eq!(done, vec![(Some(3), Some("checkpoint_dir"))], "{recs:#?}");
}

/// The step line printed just before `phase=checkpoint step=N` was sent may
/// be read after the datagram (two sources, two threads): it neither ends
/// the save nor makes it look asynchronous. Here the datagram comes first
/// on purpose, under a 1 s step limit and a 2 s save.
#[test]
fn a_step_line_read_after_the_checkpoint_message_does_not_end_the_save() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = run_trainer(
        dir.path(),
        "race",
        &["--stall-timeout", "1s"],
        &[
            "--steps",
            "8",
            "--interval",
            "0.1",
            "--checkpoint-at",
            "4",
            "--checkpoint-secs",
            "2",
            "--announce-first",
        ],
    );
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let recs = records(dir.path(), "race");
    assert!(kinds(&recs, "stall").is_empty(), "{recs:#?}");
    let done = one(&recs, "checkpoint_done");
    assert_eq!(done.get("blocked_training"), Some(&true.into()), "{done:?}");
    assert!(done.f64("duration_s").unwrap() >= 1.9, "{done:?}");
}

/// Megatron-LM's save lines as it prints them (it needs a GPU, so the
/// lines are printed here by a stand-in): the `saving checkpoint` line
/// opens the save, `successfully saved checkpoint from iteration N` ends it
/// as a confirmed checkpoint of step N, with its duration, and a 2 s save
/// under a 1 s step limit is no stall.
const MEGATRON_SAVES: &str = r#"
import time
for i in range(1, 9):
    print(f" [2026-11-26 12:00:0{i}] iteration {i:8d}/       8 | consumed samples: {8 * i} | lm loss: 7.1E+00 |", flush=True)
    time.sleep(0.1)
    if i == 4:
        print(f"saving checkpoint at iteration {i:7d} to /ckpt in torch_dist format", flush=True)
        time.sleep(2)
        print(f"  successfully saved checkpoint from iteration {i:7d} to /ckpt [ t 1/1, p 1/1 ]", flush=True)
"#;

#[test]
fn megatrons_save_lines_make_a_confirmed_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("t.py");
    std::fs::write(&script, MEGATRON_SAVES).unwrap();
    let mut c = resilio_run(dir.path(), "mega");
    c.args(["--stall-timeout", "1s", "--", "python3"])
        .arg(&script);
    let (o, _) = output_within(&mut c, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let recs = records(dir.path(), "mega");
    assert!(kinds(&recs, "stall").is_empty(), "{recs:#?}");
    let done = one(&recs, "checkpoint_done");
    assert_eq!(done.u64("step"), Some(4), "{done:?}");
    assert_eq!(done.str("source"), Some("stdout"), "{done:?}");
    assert!(done.f64("duration_s").unwrap() >= 1.9, "{done:?}");
    assert_eq!(done.get("blocked_training"), Some(&true.into()), "{done:?}");
}

/// A trainer that prints, but never a step number (Lightning's Rich bar on
/// a pipe): rank 0 says so once, at half the startup limit here, with what
/// gives steps; one that prints steps hears nothing of it.
#[test]
fn a_trainer_printing_no_step_number_is_told_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("t.py");
    std::fs::write(
        &script,
        "import sys, time\nfor i in range(10):\n    print(sys.argv[1].format(i), flush=True)\n    time.sleep(0.5)\n",
    )
    .unwrap();
    let run = |job: &str, line: &str| {
        let mut c = resilio_run(dir.path(), job);
        c.args(["--startup-timeout", "6s", "--", "python3"])
            .arg(&script)
            .arg(line);
        let (o, _) = output_within(&mut c, Duration::from_secs(40));
        assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
        (stderr_of(&o), records(dir.path(), job))
    };
    let (err, recs) = run("rich", "Epoch 0/0 rendering {}");
    let warned = one(&recs, "setup_warning");
    assert!(
        warned.str("warning").unwrap().contains("no step number"),
        "{warned:?}"
    );
    // And the one flag that reads a format of the trainer's own.
    assert!(
        warned.str("warning").unwrap().contains("--progress-regex"),
        "{warned:?}"
    );
    assert_eq!(err.matches("no step number").count(), 1, "{err}");
    let (err, recs) = run("steps", "step {} loss 1.0");
    assert!(kinds(&recs, "setup_warning").is_empty(), "{recs:?}");
    assert!(!err.contains("no step number"), "{err}");
}
