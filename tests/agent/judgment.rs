//! Judgments on what real trainers do at their edges (issue 23): a run that
//! finished and then crashed at exit is not trained again.

use crate::common::*;
use std::time::Duration;

/// The start of every script here: ten steps, 0.2 s each, printed by
/// rank 0 only (as the HF Trainer and Megatron-LM print), `r` its rank.
macro_rules! ten_steps {
    () => {
        r#"
import os, sys, time
r = int(os.environ.get("RANK", "0"))
for i in range(1, 11):
    if r == 0:
        print(f"step {i}", flush=True)
    time.sleep(0.2)
"#
    };
}

/// A two-rank run of `script` (with `args`) under `--max-restarts 2`: its
/// output and journal, and the temporary directory they are in.
fn two_ranks(
    script: &str,
    job: &str,
    args: &[&std::ffi::OsStr],
) -> (
    tempfile::TempDir,
    std::process::Output,
    Vec<resilio::journal::Record>,
) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t.py");
    std::fs::write(&path, script).unwrap();
    let mut c = resilio_run(tmp.path(), job);
    c.args(["--ntasks", "2", "--max-restarts", "2", "--", "python3"])
        .arg(&path)
        .args(args);
    let (out, _) = output_within(&mut c, Duration::from_secs(90));
    let recs = records(tmp.path(), job);
    (tmp, out, recs)
}

/// The run ended with the child's status (SIGABRT: 134), trained once, and
/// its report (returned) counts no failed attempt.
fn finished_once(
    dir: &std::path::Path,
    job: &str,
    out: &std::process::Output,
    recs: &[resilio::journal::Record],
) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(134), "{}", stderr_of(out));
    assert_eq!(
        kinds(recs, "rank_start").len(),
        2,
        "trained once, not again"
    );
    assert!(kinds(recs, "restart").is_empty());
    let o = std::process::Command::new(bin())
        .args(["report", "--json", job, "--state-dir"])
        .arg(dir)
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["failed_attempts"], 0, "{r}");
    r
}

/// The HF Trainer's way to end: its summary, the script's last line, then
/// torch's threads abort the interpreter at exit (`terminate called
/// without an active exception`, SIGABRT) on every rank.
const FINISHES_THEN_ABORTS: &str = concat!(
    ten_steps!(),
    r#"
if r == 0:
    print("{'train_runtime': '1.2', 'train_samples_per_second': '15.65', 'train_loss': '4.1', 'epoch': '1.0'}", flush=True)
    print("saved", flush=True)
sys.stderr.write("terminate called without an active exception\n")
sys.stderr.flush()
os.abort()
"#
);

#[test]
fn a_run_that_crashes_at_exit_after_reporting_the_end_of_training_is_not_run_again() {
    let (tmp, out, recs) = two_ranks(FINISHES_THEN_ABORTS, "fin", &[]);
    finished_once(tmp.path(), "fin", &out, &recs);
    let finished = kinds(&recs, "rank_exit")
        .into_iter()
        .filter(|r| r.str("class_reason") == Some(resilio::policy::failure::FINISHED_THEN_CRASHED))
        .count();
    assert_eq!(finished, 1, "rank 0's exit says it finished");
}

/// Rank 0 reports the end of training and aborts at exit at once; rank 1
/// saves for 14 s, longer than the 10 s given to an abort with no say of
/// its own, and exits 0.
const ONE_FINISHES_THEN_ABORTS_ONE_SAVES: &str = concat!(
    ten_steps!(),
    r#"
if r == 0:
    print("{'train_runtime': '1.2', 'train_samples_per_second': '15.65', 'train_loss': '4.1', 'epoch': '1.0'}", flush=True)
    sys.stderr.write("terminate called without an active exception\n")
    sys.stderr.flush()
    os.abort()
for i in range(14):
    print(f"saving shard {i}", flush=True)
    time.sleep(1)
"#
);

#[test]
fn a_rank_still_saving_when_another_finished_then_crashed_is_left_to_finish() {
    let (tmp, out, recs) = two_ranks(ONE_FINISHES_THEN_ABORTS_ONE_SAVES, "save", &[]);
    finished_once(tmp.path(), "save", &out, &recs);
    let saver = kinds(&recs, "rank_exit")
        .into_iter()
        .find(|r| r.rank == Some(1))
        .expect("rank 1's exit");
    assert_eq!(
        saver.u64("exit_code"),
        Some(0),
        "rank 1 finished its save: {saver:?}"
    );
    assert!(kinds(&recs, "teardown").is_empty(), "nothing torn down");
}

/// Rank 1 aborts after the last step with no signature of its own (no end
/// of training printed); rank 0 writes its final save for 14 s, longer
/// than the 10 s moment given to the others: probed then, it is shown
/// outside any collective (writing a file, asleep between writes), left to
/// finish, and the run is not trained again.
const ONE_ABORTS_ONE_SAVES_LONG: &str = concat!(
    ten_steps!(),
    r#"
if r == 1:
    os.abort()
with open(sys.argv[1], "wb") as f:
    for i in range(28):
        f.write(os.urandom(1 << 16))
        f.flush()
        time.sleep(0.5)
print("saved", flush=True)
"#
);

#[test]
fn a_rank_saving_after_another_aborted_with_no_signature_is_left_to_finish() {
    let out_file = tempfile::tempdir().unwrap();
    let fin = out_file.path().join("final.bin");
    let (tmp, out, recs) = two_ranks(ONE_ABORTS_ONE_SAVES_LONG, "last", &[fin.as_os_str()]);
    finished_once(tmp.path(), "last", &out, &recs);
    assert!(
        stderr_of(&out).contains("left to finish"),
        "{}",
        stderr_of(&out)
    );
    assert!(kinds(&recs, "teardown").is_empty(), "nothing torn down");
    let size = std::fs::metadata(&fin).unwrap().len();
    assert_eq!(size, 28 << 16, "the final save was written whole");
}

/// torch 2.15's gloo DDP as seen on this machine: rank 1, which prints
/// nothing of its own, aborts at exit (no signature); rank 0, which printed
/// the steps, completes a moment later.
const ONE_COMPLETES_ONE_ABORTS: &str = concat!(
    ten_steps!(),
    r#"
if r == 1:
    os.abort()
time.sleep(1)
"#
);

#[test]
fn a_rank_aborting_at_exit_before_another_completes_is_no_failure_in_the_report() {
    let (tmp, out, recs) = two_ranks(ONE_COMPLETES_ONE_ABORTS, "abrt", &[]);
    let r = finished_once(tmp.path(), "abrt", &out, &recs);
    assert!(r["ettr"].as_f64().unwrap() > 0.1, "{r}");
    let end = one(&recs, "job_end");
    assert!(
        end.str("reason").unwrap().starts_with("completed"),
        "{end:?}"
    );
}

/// Steps every 0.1 s; after step 20, 8 s without a word: working
/// (`busy`: an evaluation nobody announced) or asleep (`sleep`: hung).
const SILENT_AFTER_20: &str = r#"
import sys, time
how = sys.argv[1]
for i in range(1, 41):
    print(f"step {i}", flush=True)
    time.sleep(0.1)
    if i == 20:
        t = time.time()
        if how == "busy":
            x = 0
            while time.time() - t < 8:
                x += 1
        else:
            time.sleep(8)
"#;

fn silent_after_20(how: &str) -> (std::process::Output, Vec<resilio::journal::Record>) {
    run_script(SILENT_AFTER_20, &["--stall-floor", "2s"], how)
}

/// One rank running `script` (python3, its argument `how`, also the job's
/// name) with `flags`, no restart and a 2 s kill grace: its output and
/// journal.
fn run_script(
    script: &str,
    flags: &[&str],
    how: &str,
) -> (std::process::Output, Vec<resilio::journal::Record>) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t.py");
    std::fs::write(&path, script).unwrap();
    let mut c = resilio_run(tmp.path(), how);
    c.args(flags)
        .args(["--max-restarts", "0", "--kill-grace", "2s"])
        .args(["--", "python3"])
        .arg(&path)
        .arg(how);
    let (out, _) = output_within(&mut c, Duration::from_secs(60));
    let recs = records(tmp.path(), how);
    (out, recs)
}

/// Evidence before a kill: at its 2 s limit the rank is working (its CPU
/// time moves, it waits on no peer): busy and silent, judged by the
/// evaluation limit, and the run completes.
#[test]
fn a_rank_working_without_a_word_past_its_limit_is_busy_not_hung() {
    let (out, recs) = silent_after_20("busy");
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(kinds(&recs, "stall").is_empty(), "never stopped");
    let busy = one(&recs, "busy_silent");
    assert!(busy.f64("cpu_s").unwrap() > 0.2, "{busy:?}");
    assert!(stderr_of(&out).contains("busy and silent"));
}

/// The same silence asleep is a hang, caught at its limit.
#[test]
fn a_rank_asleep_past_its_limit_is_hung() {
    let (out, recs) = silent_after_20("sleep");
    assert_eq!(out.status.code(), Some(124), "{}", stderr_of(&out));
    assert!(kinds(&recs, "busy_silent").is_empty());
    assert_eq!(kinds(&recs, "stall").len(), 1);
}

/// An `observed` record says it would have done `what`.
fn would_have(recs: &[resilio::journal::Record], what: &str) {
    let observed: Vec<&str> = kinds(recs, "observed")
        .iter()
        .filter_map(|r| r.str("would"))
        .collect();
    assert!(observed.iter().any(|w| w.starts_with(what)), "{observed:?}");
}

/// Observe mode: the same 8 s asleep past a 2 s limit is journaled as the
/// stop that would have been, and the run goes on to complete; the report
/// says what would have been done.
#[test]
fn observe_mode_journals_the_stop_it_would_have_made_and_lets_the_run_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("t.py");
    std::fs::write(&script, SILENT_AFTER_20).unwrap();
    let mut c = resilio_run(tmp.path(), "obs");
    c.args(["--observe", "--stall-floor", "2s", "--max-restarts", "2"])
        .args(["--", "python3"])
        .arg(&script)
        .arg("sleep");
    let (out, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "obs");
    assert!(!kinds(&recs, "stall").is_empty(), "detected as usual");
    would_have(&recs, "stop this rank (stalled)");
    assert!(kinds(&recs, "stop").is_empty(), "nothing stopped");
    assert!(kinds(&recs, "restart").is_empty(), "nothing restarted");
    assert!(stderr_of(&out).contains("observe mode: would stop this rank"));
    let r = std::process::Command::new(bin())
        .args(["report", "obs", "--state-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(
        text.contains("observe mode: what resilio would have done")
            && text.contains("would stop this rank"),
        "{text}"
    );
}

/// Observe mode, a rank that fails on its own: the restart it would have
/// made is journaled, none is made, and its exit status comes through.
#[test]
fn observe_mode_journals_the_restart_it_would_have_made() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("t.py");
    std::fs::write(
        &script,
        "import sys, time\nfor i in range(1, 6):\n    print(f'step {i}', flush=True)\n    time.sleep(0.1)\nsys.exit(3)\n",
    )
    .unwrap();
    let mut c = resilio_run(tmp.path(), "obs2");
    c.args(["--observe", "--max-restarts", "2", "--", "python3"])
        .arg(&script);
    let (out, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "obs2");
    assert_eq!(kinds(&recs, "rank_start").len(), 1, "run once");
    would_have(&recs, "restart every rank in place");
}

/// Two ranks that wait for each other at every step over TCP (as in a
/// collective); rank 0 prints the steps, rank 1 is silent. After step 20
/// rank 1 works 8 s without a word (`busy`) or sleeps (`sleep`) while rank 0
/// waits for it.
const PEER_SILENT_AFTER_20: &str = r#"
import os, socket, sys, time
how = sys.argv[1]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, port)); l.listen(1); peer, _ = l.accept()
else:
    for _ in range(300):
        try:
            peer = socket.create_connection((addr, port)); break
        except OSError:
            time.sleep(0.1)
for i in range(1, 41):
    time.sleep(0.1)
    if rank == 1 and i == 21:
        t = time.time()
        if how == "busy":
            x = 0
            while time.time() - t < 8:
                x += 1
        else:
            time.sleep(8)
    peer.sendall(b"x")
    if not peer.recv(1):
        sys.exit(1)
    if rank == 0:
        print(f"step {i}", flush=True)
"#;

fn peer_silent_after_20(how: &str) -> (std::process::Output, Vec<resilio::journal::Record>) {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("t.py");
    std::fs::write(&script, PEER_SILENT_AFTER_20).unwrap();
    let job = format!("peer-{how}");
    let mut c = resilio_run(tmp.path(), &job);
    c.args([
        "--ntasks",
        "2",
        "--stall-floor",
        "2s",
        "--max-restarts",
        "0",
    ])
    .args(["--kill-grace", "2s", "--", "python3"])
    .arg(&script)
    .arg(how);
    let (out, _) = output_within(&mut c, Duration::from_secs(90));
    let recs = records(tmp.path(), &job);
    (out, recs)
}

/// Evidence before a kill, across ranks: rank 0 waits at its limit for rank
/// 1, which works without a word; the coordinator's probe finds rank 1's
/// CPU time moving: busy and silent, nobody hung, rank 0's stall withdrawn.
#[test]
fn a_peer_working_without_a_word_is_waited_for_not_blamed() {
    let (out, recs) = peer_silent_after_20("busy");
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let verdicts: Vec<String> = kinds(&recs, "hang")
        .iter()
        .filter_map(|h| h.get("verdict").map(|v| v["rule"].to_string()))
        .collect();
    assert!(
        !verdicts.is_empty() && verdicts.iter().all(|r| r == "\"busy\""),
        "{verdicts:?}"
    );
    assert!(!kinds(&recs, "stall_withdrawn").is_empty());
    assert!(kinds(&recs, "teardown").is_empty(), "nothing torn down");
}

/// The same wait for a peer asleep in its own code: rank 1 blamed.
#[test]
fn a_peer_asleep_while_the_others_wait_is_blamed() {
    let (out, recs) = peer_silent_after_20("sleep");
    assert_ne!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let h = one(&recs, "hang");
    let v = h.get("verdict").unwrap();
    assert_eq!(v["blamed_ranks"], serde_json::json!([1]), "{v}");
}

/// Rank 1 aborts at interpreter exit as soon as training is done; rank 0
/// still finishes its last evaluation for 2 s and exits 0. The abort gives
/// rank 0 its moment: nothing is torn down, nothing run again.
#[test]
fn a_rank_aborting_at_exit_while_its_peer_finishes_does_not_stop_the_peer() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("t.py");
    std::fs::write(
        &script,
        "import os, sys, time\nr = int(os.environ['RANK'])\nfor i in range(1, 6):\n    if r == 0:\n        print(f'step {i}', flush=True)\n    time.sleep(0.2)\nif r == 1:\n    sys.stderr.write('terminate called without an active exception\\n'); sys.stderr.flush(); os.abort()\ntime.sleep(2)\nprint('done', flush=True)\n",
    )
    .unwrap();
    let mut c = resilio_run(tmp.path(), "abort1");
    c.args(["--ntasks", "2", "--max-restarts", "2", "--", "python3"])
        .arg(&script);
    let (out, _) = output_within(&mut c, Duration::from_secs(60));
    let recs = records(tmp.path(), "abort1");
    assert!(kinds(&recs, "teardown").is_empty(), "{}", stderr_of(&out));
    assert!(kinds(&recs, "restart").is_empty(), "{}", stderr_of(&out));
    assert_eq!(kinds(&recs, "rank_start").len(), 2, "run once");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("done"),
        "rank 0 finished"
    );
}

/// Ten steps, then a final save written slowly (64 KiB and an fsync every
/// 0.2 s for 8 s) without a word; with `done` rank 1 completes first.
const SLOW_FINAL_SAVE: &str = concat!(
    ten_steps!(),
    r#"
if r == 1:
    sys.exit(0)
with open(sys.argv[1], "wb") as f:
    for i in range(40):
        f.write(os.urandom(1 << 16))
        f.flush()
        os.fsync(f.fileno())
        time.sleep(0.2)
"#
);

/// A final save on a slow file system, past a 2 s step limit: the trainer
/// moves bytes (little CPU time), so it is at work, never stopped; with two
/// ranks the other one has completed, and the stalled saver is finishing.
#[test]
fn a_slow_final_save_past_the_step_limit_is_never_stopped() {
    for ranks in ["1", "2"] {
        let tmp = tempfile::tempdir().unwrap();
        let script = tmp.path().join("t.py");
        std::fs::write(&script, SLOW_FINAL_SAVE).unwrap();
        let job = format!("save{ranks}");
        let mut c = resilio_run(tmp.path(), &job);
        c.args([
            "--ntasks",
            ranks,
            "--stall-floor",
            "2s",
            "--max-restarts",
            "1",
        ])
        .args(["--", "python3"])
        .arg(&script)
        .arg(tmp.path().join("final.bin"));
        let (out, _) = output_within(&mut c, Duration::from_secs(60));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{ranks} rank(s): {}",
            stderr_of(&out)
        );
        let recs = records(tmp.path(), &job);
        assert!(kinds(&recs, "restart").is_empty(), "{ranks} rank(s)");
        let size = std::fs::metadata(tmp.path().join("final.bin"))
            .unwrap()
            .len();
        assert_eq!(
            size,
            40 << 16,
            "{ranks} rank(s): the save was written whole"
        );
    }
}

/// A trainer that prints no step at all (Lightning's Rich bar on a pipe)
/// and works past its startup limit: busy and silent, watched on, its run
/// completes; asleep instead, it is stopped at the limit.
const NO_STEPS_WORKING: &str = r#"
import sys, time
print("training, with a bar nobody can read", flush=True)
t = time.time()
x = 0
while time.time() - t < 8:
    if sys.argv[1] == "busy":
        x += 1
    else:
        time.sleep(0.1)
"#;

#[test]
fn a_trainer_working_past_its_startup_limit_without_a_step_is_busy_not_hung() {
    for how in ["busy", "asleep"] {
        let (out, recs) = run_script(NO_STEPS_WORKING, &["--startup-timeout", "3s"], how);
        if how == "busy" {
            assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
            assert!(kinds(&recs, "stall").is_empty(), "never stopped");
            one(&recs, "busy_silent");
        } else {
            assert_eq!(out.status.code(), Some(124), "{}", stderr_of(&out));
            assert!(kinds(&recs, "busy_silent").is_empty());
        }
    }
}
