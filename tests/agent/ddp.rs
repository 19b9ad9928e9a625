//! Real torch.distributed training (gloo on the CPU,
//! tests/fixtures/ddp_hang.py) under `resilio run --ntasks N`, with real
//! py-spy: the common case in real training, where only rank 0 prints its
//! iterations and the other ranks say nothing, and one of them hangs in its
//! own code while its peers wait for it inside all_reduce.
//!
//! These tests need a Python with torch and py-spy, named by
//! `RESILIO_TEST_PYTHON` (py-spy beside it, or on PATH). tests/run.sh
//! installs one (tests/torch-venv.sh) and sets `RESILIO_REQUIRE_TORCH=1`,
//! under which a missing or broken one fails these tests. A plain `cargo
//! test` without `RESILIO_TEST_PYTHON` skips them and prints why; one that
//! sets it to something unusable fails.

use crate::common::*;
use resilio::journal::Record;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// A Python with torch (gloo) and the py-spy to use with it.
pub struct Torch {
    pub python: PathBuf,
    pub py_spy: PathBuf,
}

impl Torch {
    /// PATH for resilio: py-spy's directory first.
    pub(crate) fn path_env(&self) -> String {
        format!(
            "{}:{}",
            self.py_spy.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }
}

/// How the tests find torch: `Ok`, or why not and whether that is a failure.
fn find_torch() -> Result<Torch, (bool, String)> {
    let required = std::env::var("RESILIO_REQUIRE_TORCH").as_deref() == Ok("1");
    let Some(python) = std::env::var_os("RESILIO_TEST_PYTHON").filter(|p| !p.is_empty()) else {
        return Err((required, "RESILIO_TEST_PYTHON is not set".into()));
    };
    let python = PathBuf::from(python);
    let fail = |why: String| Err((true, why));
    let check = Command::new(&python)
        .args([
            "-c",
            "import torch, torch.distributed as d; assert d.is_gloo_available(), 'no gloo'; print(torch.__version__)",
        ])
        .output();
    match check {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return fail(format!(
                "RESILIO_TEST_PYTHON={} cannot use torch.distributed with gloo: {}",
                python.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Err(e) => {
            return fail(format!(
                "RESILIO_TEST_PYTHON={} does not run: {e}",
                python.display()
            ))
        }
    }
    let beside = python.parent().map(|d| d.join("py-spy"));
    let py_spy = match beside.filter(|p| p.is_file()) {
        Some(p) => p,
        None => match resilio::rank::diagnostics::which("py-spy") {
            Some(p) => p,
            None => {
                return fail(format!(
                    "no py-spy beside RESILIO_TEST_PYTHON={} nor on PATH",
                    python.display()
                ))
            }
        },
    };
    match Command::new(&py_spy).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(Torch { python, py_spy }),
        _ => fail(format!("{} --version fails", py_spy.display())),
    }
}

/// The torch to test with, or `None` (with the reason printed) when these
/// tests are to be skipped. Panics when they must run and cannot.
pub(crate) fn torch() -> Option<&'static Torch> {
    static FOUND: OnceLock<Result<Torch, (bool, String)>> = OnceLock::new();
    match FOUND.get_or_init(find_torch) {
        Ok(t) => Some(t),
        Err((true, why)) => panic!(
            "torch tests cannot run: {why} (RESILIO_REQUIRE_TORCH=1 is set by tests/run.sh; \
             `bash tests/torch-venv.sh` installs torch and py-spy and prints the virtualenv)"
        ),
        Err((false, why)) => {
            // Straight to stderr: the test harness does not capture this.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED (real torch.distributed test): {why}. To run it: \
                 export RESILIO_TEST_PYTHON=$(bash tests/torch-venv.sh)/bin/python"
            );
            None
        }
    }
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ddp_hang.py")
}

/// Unix seconds of a journal record.
fn unix(r: &Record) -> f64 {
    r.ts.timestamp_micros() as f64 / 1e6
}

/// `hang ATTEMPT RANK STEP UNIX_TIME` lines of the fixture's --hang-file.
fn hangs_started(path: &Path) -> Vec<(u32, u32, u64, f64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["hang", a, r, s, t] => Some((
                    a.parse().ok()?,
                    r.parse().ok()?,
                    s.parse().ok()?,
                    t.parse().ok()?,
                )),
                _ => None,
            }
        })
        .collect()
}

/// Records of `attempt` (any kind) whose JSON contains `needle`, as `kind/rank`.
fn mentions(recs: &[Record], attempt: u32, needle: &str) -> Vec<String> {
    recs.iter()
        .filter(|r| r.attempt == attempt)
        .filter(|r| serde_json::to_string(r).is_ok_and(|j| j.contains(needle)))
        .map(|r| {
            format!(
                "{}/{}",
                r.kind,
                r.rank.map_or("-".into(), |x| x.to_string())
            )
        })
        .collect()
}

/// The fixed stall limit the tests run with.
const STALL_S: f64 = 5.0;
/// Detection bound beyond the stall limit: the limit counts from rank 0's
/// last step line, which came up to one step before the hang began, and the
/// issue asks for the coordinator to act within about 1 s of the stall plus
/// the time py-spy takes (about 0.05 s a process here, 0.8 s with
/// --native). 5 s leaves room for a loaded 2-core machine.
const MARGIN_S: f64 = 5.0;

/// `resilio run --ntasks N` on the DDP fixture, rank `k` hanging at step 12
/// of 20 in attempt 0 only; checks blame, restart, completion and the
/// detection bound, and reports every failed check at once.
/// PATH with no directory that holds a `py-spy`: a node where nobody
/// installed it.
fn path_without_py_spy() -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty() && !Path::new(d).join("py-spy").exists())
        .collect::<Vec<_>>()
        .join(":")
}

fn ddp_hang_is_blamed_and_restarted(n: u32, k: u32) {
    ddp_hang_is_blamed(n, k, true)
}

fn ddp_hang_is_blamed(n: u32, k: u32, py_spy: bool) {
    let Some(t) = torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let job = format!("ddp{n}");
    let hang_file = tmp.path().join("hangs");
    let (steps, hang_step) = (20u64, 12u64);
    let mut cmd = resilio_run(tmp.path(), &job);
    cmd.env(
        "PATH",
        if py_spy {
            t.path_env()
        } else {
            path_without_py_spy()
        },
    )
    .current_dir(tmp.path())
    .args([
        "--ntasks",
        &n.to_string(),
        "--stall-timeout",
        &format!("{STALL_S}s"),
        "--kill-grace",
        "5s",
        "--max-restarts",
        "1",
        "--",
    ])
    .arg(&t.python)
    .arg(fixture())
    .args([
        "--steps",
        &steps.to_string(),
        "--step-time",
        "0.1",
        "--hang-rank",
        &k.to_string(),
        "--hang-step",
        &hang_step.to_string(),
        "--hang-file",
        hang_file.to_str().unwrap(),
    ]);
    let (out, took) = output_within(&mut cmd, Duration::from_secs(300));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = stderr_of(&out);
    let recs = records(tmp.path(), &job);

    let mut failed: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failed.push(what);
        }
    };
    // The fixture did hang where asked, once.
    let started = hangs_started(&hang_file);
    check(
        started.len() == 1 && started[0].0 == 0 && started[0].1 == k,
        format!("expected rank {k} to hang once, in attempt 0: {started:?}"),
    );
    let t_hang = started.first().map(|h| h.3);

    // The verdict blames rank k.
    let hangs = kinds(&recs, "hang");
    let verdict = hangs
        .iter()
        .find(|r| r.attempt == 0)
        .and_then(|h| h.get("verdict"));
    check(
        hangs.len() == 1 && verdict.is_some(),
        format!(
            "expected one hang record (attempt 0) with a verdict, got {}",
            hangs.len()
        ),
    );
    if let Some(v) = verdict {
        check(
            v["blamed_ranks"] == serde_json::json!([k]),
            format!(
                "the hang verdict blames {} instead of [{k}]: {v}",
                v["blamed_ranks"]
            ),
        );
        // A silent rank is not "never stepped": blame comes from evidence.
        let reason = v["reason"].as_str().unwrap_or("");
        check(
            !reason.contains("never stepped"),
            format!("the verdict's reason calls a silent rank 'never stepped': {reason}"),
        );
    }
    match kinds(&recs, "judgment").first() {
        Some(j) => {
            check(
                j.u64("primary_rank") == Some(k.into()) && j.str("class") == Some("hang"),
                format!(
                    "judgment: primary rank {:?} class {:?}, expected {k} and hang",
                    j.u64("primary_rank"),
                    j.str("class")
                ),
            );
        }
        None => check(false, "no judgment record".into()),
    }
    // The evidence is real py-spy stacks, kept in the journal: the hung
    // rank in its own code, the others inside torch.distributed's all_reduce.
    // Without py-spy, the system calls: the hung rank asleep, the others'
    // main thread waiting on gloo's busy runloop thread.
    let (own_code, in_collective) = if py_spy {
        (
            mentions(&recs, 0, "hang_forever ("),
            mentions(&recs, 0, "all_reduce (torch/distributed/"),
        )
    } else {
        (
            mentions(&recs, 0, ": sleeping"),
            mentions(&recs, 0, "in a gloo collective"),
        )
    };
    check(
        !own_code.is_empty(),
        format!(
            "no evidence of the hung rank in its own code in attempt 0's journal (py-spy {py_spy})"
        ),
    );
    check(
        !in_collective.is_empty(),
        format!(
            "no evidence of a rank waiting in all_reduce in attempt 0's journal (py-spy {py_spy})"
        ),
    );

    // Restarted once, and the run finished.
    check(
        kinds(&recs, "restart").len() == 1,
        format!(
            "expected one restart, got {}",
            kinds(&recs, "restart").len()
        ),
    );
    let mut started1: Vec<u32> = recs
        .iter()
        .filter(|r| r.kind == "rank_start" && r.attempt == 1)
        .filter_map(|r| r.rank)
        .collect();
    started1.sort();
    check(
        started1 == (0..n).collect::<Vec<_>>(),
        format!("attempt 1 started ranks {started1:?}"),
    );
    check(
        out.status.code() == Some(0),
        format!("exit status {:?}, expected 0", out.status.code()),
    );
    check(
        stdout.contains(&format!("step {steps}/{steps} ")),
        format!("no `step {steps}/{steps}` line in the output"),
    );
    for r in kinds(&recs, "rank_exit").iter().filter(|r| r.attempt == 1) {
        check(
            r.u64("exit_code") == Some(0),
            format!("attempt 1 rank {:?} exit {:?}", r.rank, r.get("exit_code")),
        );
    }

    // Detection: from the hang's start to the verdict, within the stall
    // limit plus the margin.
    let t_verdict = hangs.iter().find(|r| r.attempt == 0).map(|r| unix(r));
    let rel = |x: Option<f64>| match (x, t_hang) {
        (Some(x), Some(h)) => format!("{:+.2}s", x - h),
        _ => "-".into(),
    };
    let mut timeline = format!(
        "{n} ranks, rank {k} hung at step {hang_step}; run took {took:?}; times from the hang's start:\n"
    );
    for r in recs.iter().filter(|r| {
        [
            "stall",
            "diagnostics",
            "stop_deferred",
            "hang",
            "judgment",
            "teardown",
            "restart",
            "relaunched",
            "job_end",
        ]
        .contains(&r.kind.as_str())
    }) {
        timeline += &format!(
            "  {} attempt {} rank {:?}: {}\n",
            rel(Some(unix(r))),
            r.attempt,
            r.rank,
            r.kind
        );
    }
    if let Some(v) = verdict {
        timeline += &format!("  verdict: {v}\n");
    }
    if let Some(j) = kinds(&recs, "judgment").first() {
        timeline += &format!(
            "  judgment: class {:?}, primary rank {:?}, reason {:?}\n",
            j.str("class"),
            j.u64("primary_rank"),
            j.get("reason")
        );
    }
    timeline += &format!(
        "  py-spy stacks in the journal: hung rank's code in {own_code:?}, all_reduce in {in_collective:?}\n"
    );
    match (t_verdict, t_hang) {
        (Some(v), Some(h)) => {
            let took = v - h;
            timeline += &format!(
                "  detection: {took:.2}s (bound {:.1}s)\n",
                STALL_S + MARGIN_S
            );
            check(
                took <= STALL_S + MARGIN_S,
                format!(
                    "hang judged {took:.2}s after it began, beyond the stall limit {STALL_S}s + {MARGIN_S}s"
                ),
            );
        }
        _ => check(
            false,
            "no detection time (no hang start or no verdict)".into(),
        ),
    }
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        failed.is_empty(),
        "{} check(s) failed:\n  - {}\n{timeline}\n--- resilio stderr ---\n{stderr}\n--- stdout (last 25 lines) ---\n{}",
        failed.len(),
        failed.join("\n  - "),
        lines[lines.len().saturating_sub(25)..].join("\n")
    );
    // The times, with --nocapture.
    eprintln!("{timeline}");
}

#[test]
fn a_real_ddp_hang_of_rank_1_of_2_with_only_rank_0_printing_is_blamed_on_rank_1_and_restarted() {
    ddp_hang_is_blamed_and_restarted(2, 1);
}

#[test]
fn a_real_ddp_hang_of_rank_2_of_4_with_only_rank_0_printing_is_blamed_on_rank_2_and_restarted() {
    ddp_hang_is_blamed_and_restarted(4, 2);
}

#[test]
fn without_py_spy_a_real_ddp_hang_of_rank_1_of_2_is_blamed_on_rank_1_from_the_system_calls() {
    // rank 0 waits in gloo's all_reduce (its main thread on a futex, a
    // pt_gloo_runloop thread busy), rank 1 sleeps in its own code.
    ddp_hang_is_blamed(2, 1, false);
}

/// A port nobody listens on right now, below the ephemeral range.
fn free_port() -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let start = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 10_000;
    (0..10_000u64)
        .map(|k| 33_000 - 10_000 + ((start + k) % 10_000) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port")
}

/// Kills the fixture's ranks whatever happens to the test.
struct Ranks(Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Two ranks of the fixture, without resilio, rank 1 hanging at step 3.
fn two_ranks(t: &Torch, dir: &Path, sync: &str) -> (Ranks, PathBuf) {
    let port = free_port().to_string();
    let hang_file = dir.join(format!("hang-{sync}"));
    let ranks = (0..2)
        .map(|r| {
            Command::new(&t.python)
                .arg(fixture())
                .args(["--steps", "50", "--step-time", "0.05", "--sync", sync])
                .args(["--hang-rank", "1", "--hang-step", "3", "--hang-file"])
                .arg(&hang_file)
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("RESILIO_ATTEMPT", "0")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn the fixture")
        })
        .collect();
    (Ranks(ranks), hang_file)
}

fn py_spy_dump(t: &Torch, pid: u32, native: bool) -> String {
    let mut c = Command::new(&t.py_spy);
    c.arg("dump");
    if native {
        c.arg("--native");
    }
    let o = c.args(["--pid", &pid.to_string()]).output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits (with a deadline) until rank 0's py-spy stack shows `waiting`,
/// then returns the plain and the --native dumps of both ranks.
fn dumps_once_waiting(t: &Torch, ranks: &Ranks, hang_file: &Path, waiting: &str) -> [String; 4] {
    let started = wait_for(Duration::from_secs(120), || hang_file.exists());
    assert!(
        started,
        "rank 1 never reached its hang (torch import or rendezvous failed?)"
    );
    let (r0, r1) = (ranks.0[0].id(), ranks.0[1].id());
    let mut last = String::new();
    let waits = wait_for(Duration::from_secs(30), || {
        last = py_spy_dump(t, r0, false);
        last.contains(waiting)
    });
    assert!(waits, "rank 0 never showed {waiting:?}; last dump:\n{last}");
    [
        last,
        py_spy_dump(t, r0, true),
        py_spy_dump(t, r1, false),
        py_spy_dump(t, r1, true),
    ]
}

/// Pins down the stack text a classifier works from: real py-spy on a real
/// rank waiting in gloo's all_reduce, and on a rank sleeping in its own code.
#[test]
fn real_py_spy_shows_a_rank_waiting_in_all_reduce_and_a_rank_sleeping_in_its_own_code() {
    let Some(t) = torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (ranks, hang_file) = two_ranks(t, tmp.path(), "all_reduce");
    let [r0, r0_native, r1, r1_native] = dumps_once_waiting(
        t,
        &ranks,
        &hang_file,
        "all_reduce (torch/distributed/distributed_c10d.py:",
    );
    eprintln!("rank 0:\n{r0}\nrank 0 --native:\n{r0_native}\nrank 1:\n{r1}\nrank 1 --native:\n{r1_native}");
    // Waiting rank: torch.distributed's all_reduce, through c10d's logger
    // wrapper, under the trainer's own call.
    for needle in [
        "all_reduce (torch/distributed/distributed_c10d.py:",
        "wrapper (torch/distributed/c10d_logger.py:",
        "average_gradients (ddp_hang.py:",
    ] {
        assert!(
            r0.contains(needle),
            "{needle:?} not in rank 0's dump:\n{r0}"
        );
    }
    assert!(r0_native.contains("c10d::Work::wait"), "{r0_native}");
    // Hung rank: its own code, nothing of torch.distributed.
    assert!(r1.contains("hang_forever (ddp_hang.py:"), "{r1}");
    assert!(!r1.contains("torch/distributed"), "{r1}");
    assert!(
        r1_native.contains("clock_nanosleep") && r1_native.contains("time_sleep"),
        "{r1_native}"
    );
}

/// The same with DistributedDataParallel, whose all-reduce runs inside
/// `loss.backward()`: in Python frames the waiting rank is in autograd's
/// backward, and only --native shows the reducer waiting.
#[test]
fn real_py_spy_shows_a_ddp_rank_waiting_in_backward_for_a_sleeping_peer() {
    let Some(t) = torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (ranks, hang_file) = two_ranks(t, tmp.path(), "ddp");
    let [r0, r0_native, r1, _] = dumps_once_waiting(
        t,
        &ranks,
        &hang_file,
        "_engine_run_backward (torch/autograd/graph.py:",
    );
    eprintln!("rank 0:\n{r0}\nrank 0 --native:\n{r0_native}\nrank 1:\n{r1}");
    assert!(r0.contains("backward (torch/_tensor.py:"), "{r0}");
    assert!(!r0.contains("torch/distributed"), "{r0}");
    assert!(
        r0_native.contains("c10d::Reducer::finalize_backward"),
        "{r0_native}"
    );
    assert!(r1.contains("hang_forever (ddp_hang.py:"), "{r1}");
}
