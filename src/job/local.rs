//! Local mode: `resilio run --ntasks N -- COMMAND` launches N ranks on this
//! machine, each under its own rank agent (`resilio run -- COMMAND` with the
//! torchrun variables), with the coordinator in this process. When a rank
//! fails, the others are stopped at once, the attempt is judged and, within
//! the restart budget, every rank is relaunched in place with a fresh
//! MASTER_PORT. The journal is the same as under Slurm, so `resilio report`
//! and `resilio timeline` read it the same way.
//!
//! A plain `resilio run -- COMMAND` outside Slurm is local mode with one
//! rank. One rank keeps what a plain wrapper promises: stdin and the
//! terminal go to the trainer (its agent's group takes the terminal's
//! foreground, and the trainer's group takes it from there), output is
//! passed through unbuffered, every signal reaches the trainer once, a
//! user's own MASTER_ADDR/MASTER_PORT are kept, and a stop from outside
//! exits with the trainer's own status.

use crate::config::Config;
use crate::coordinator::state::{Effect, JobView};
use crate::coordinator::Coordinator;
use crate::error::{Error, Result};
use crate::job::batch::{self as supervisor, StepEnd};
use crate::journal::{self, Writer};
use crate::policy::failure::{Class, Verdict};
use crate::policy::restart::Action;
use crate::util::cmd::own_group;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde_json::json;
use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

pub use crate::context::{shares_output, ENV_LAUNCHER, LAUNCHER_SINGLE};

/// What `resilio run --ntasks N` was asked to do.
pub struct LocalOptions {
    pub argv: Vec<OsString>,
    pub config: Config,
    pub job_id: Option<String>,
    pub ntasks: u32,
    /// Flags passed on to every rank's agent (`--config`, timeouts, ...).
    pub agent_args: Vec<OsString>,
}

pub fn run(opts: LocalOptions) -> Result<i32> {
    crate::agent::runtime()?.block_on(run_async(opts))
}

/// A port free right now, for MASTER_PORT: from 20000..32000, below Linux's
/// ephemeral range, so that no outgoing connection can take it between this
/// check and the trainer's bind (the kernel's own pick, from the ephemeral
/// range, could be). Starts at a place that differs per process and call.
fn free_port() -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let start = (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) % 12_000;
    (0..12_000u64)
        .map(|k| 20_000 + ((start + k) % 12_000) as u16)
        .find(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok())
        .unwrap_or(29_500)
}

struct Rank {
    rank: u32,
    pid: Pid,
    exit: Option<i32>,
}

fn code_of(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, c) => Some(c),
        WaitStatus::Signaled(_, s, _) => Some(128 + s as i32),
        _ => None,
    }
}

async fn run_async(opts: LocalOptions) -> Result<i32> {
    let cfg = opts.config;
    let n = opts.ntasks.max(1);
    let job = match opts.job_id {
        Some(j) => j,
        None => format!(
            "local-{}-{}",
            chrono::Utc::now().format("%Y%m%d-%H%M%S"),
            std::process::id()
        ),
    };
    journal::validate_job_id(&job).map_err(Error::Usage)?;
    let exe = std::env::current_exe()
        .map_err(|e| Error::Other(format!("cannot find own binary: {e}")))?;
    let node = nix::unistd::gethostname()
        .ok()
        .and_then(|h| {
            h.to_str()
                .map(|s| s.split('.').next().unwrap_or(s).to_string())
        })
        .unwrap_or_else(|| "localhost".into());
    let single = n == 1;
    let job_dir = journal::job_dir(&cfg.state_dir, &job);
    // One run key for the launcher and its ranks (handed down as RESILIO_RUN_ID).
    let run = crate::runs::resolve(&job, &|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
    if run.fresh {
        crate::runs::warn_if_reused(&job_dir, &job, run.key.as_deref());
    }
    // An unwritable state dir: the rank's agent says so (once) and
    // supervises without a journal; this process writes none either.
    let journal_ok = std::fs::create_dir_all(&job_dir).is_ok()
        && nix::unistd::access(&job_dir, nix::unistd::AccessFlags::W_OK).is_ok();
    let writer = |name: &str| {
        if journal_ok {
            Writer::open(&job_dir, name, 0, None, Some(node.clone())).with_run(run.key.as_deref())
        } else {
            Writer::disabled()
        }
    };
    let mut log = writer("launcher.jsonl");
    let argv_text: Vec<String> = opts
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    log.record(
        "job_start",
        json!({ "world_size": n, "mode": "local", "argv": argv_text, "max_restarts": cfg.max_restarts }),
        true,
    );

    let coordinator = if cfg.coordinator.enabled {
        let bind =
            crate::coordinator::bind_address(&cfg.coordinator.bind, false).map_err(Error::Usage)?;
        let view = JobView::new(&job, n, 0, cfg.coordinator.policy.clone(), Instant::now());
        let w = writer("coordinator.jsonl");
        match Coordinator::start(view, bind, w, journal_ok.then_some(job_dir.as_path())) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("resilio: coordinator: {e}; ranks supervise alone");
                log.record(
                    "monitor_error",
                    json!({ "error": format!("coordinator: {e}") }),
                    false,
                );
                None
            }
        }
    } else {
        None
    };

    let sig = |k: SignalKind| {
        signal(k).map_err(|e| Error::Other(format!("cannot install signal handler: {e}")))
    };
    let mut s_term = sig(SignalKind::terminate())?;
    let mut s_int = sig(SignalKind::interrupt())?;
    let mut s_hup = sig(SignalKind::hangup())?;
    let mut s_usr1 = sig(SignalKind::user_defined1())?;
    let mut s_usr2 = sig(SignalKind::user_defined2())?;
    let mut s_cont = sig(SignalKind::from_raw(libc::SIGCONT))?;
    let mut s_chld = sig(SignalKind::child())?;
    // One rank: its agent's group takes the terminal (when this process
    // has it) and hands it on to the trainer, as a plain wrapper would.
    let take_tty = single && crate::process::owns_terminal();
    // A user's own rendezvous address is kept for one rank (nothing else
    // on this machine joins it).
    let keep_master = |k: &str| single && std::env::var_os(k).is_some_and(|v| !v.is_empty());
    // Outcomes decided here, for when the journal cannot be read back.
    let mut remembered: Vec<crate::policy::restart::AttemptOutcome> = Vec::new();

    let grace = cfg.kill_grace;
    let mut attempt = 0u32;
    let mut stopped_from_outside: Option<&'static str> = None;
    let mut ints = 0u32;
    let final_code;
    let mut advice = cfg.coordinator.policy.checkpoint_advised.then(|| {
        crate::coordinator::Advice::new(std::sync::Arc::new(crate::advice::JournalAdvice::new(
            &cfg.state_dir,
            &job,
        )))
    });
    loop {
        // `checkpoint_every = "advised"`: evaluated at each attempt's start
        // and every few minutes while it runs.
        if let (Some(c), Some(a)) = (&coordinator, advice.as_mut()) {
            a.now();
            a.poll(c, Instant::now());
        }
        let port = free_port();
        let started = Instant::now();
        let mut ranks: Vec<Rank> = Vec::new();
        let mut spawn_error = None;
        for r in 0..n {
            let mut cmd = Command::new(&exe);
            cmd.arg("run")
                .args(&opts.agent_args)
                .arg("--")
                .args(&opts.argv)
                .envs([
                    ("RANK", r.to_string()),
                    ("LOCAL_RANK", r.to_string()),
                    ("WORLD_SIZE", n.to_string()),
                    ("LOCAL_WORLD_SIZE", n.to_string()),
                    ("GROUP_RANK", "0".into()),
                    ("TORCHELASTIC_RESTART_COUNT", attempt.to_string()),
                    ("RESILIO_JOB_ID", job.clone()),
                    ("RESILIO_ATTEMPT", attempt.to_string()),
                    (
                        "RESILIO_STATE_DIR",
                        cfg.state_dir.to_string_lossy().into_owned(),
                    ),
                    (
                        ENV_LAUNCHER,
                        if single { LAUNCHER_SINGLE } else { "1" }.into(),
                    ),
                ])
                .envs(run.key.iter().map(|k| (crate::runs::ENV_RUN, k)))
                // Ranks run in process groups of their own (so a Ctrl-C
                // reaches them once, through the launcher). Several ranks
                // are not in the terminal's foreground, so none may read
                // it; one rank gets stdin and the terminal.
                .stdin(if single {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                });
            // The launcher gone (even by SIGKILL): the agents stop their ranks.
            own_group(&mut cmd, Signal::SIGTERM, take_tty);
            if !keep_master("MASTER_ADDR") {
                cmd.env("MASTER_ADDR", "127.0.0.1");
            }
            if !keep_master("MASTER_PORT") {
                cmd.env("MASTER_PORT", port.to_string());
            }
            if let Some(c) = &coordinator {
                cmd.envs(c.env());
            }
            match cmd.spawn() {
                Ok(child) => ranks.push(Rank {
                    rank: r,
                    pid: Pid::from_raw(child.id() as i32),
                    exit: None,
                }),
                Err(e) => {
                    spawn_error = Some(format!("cannot start the agent of rank {r}: {e}"));
                    break;
                }
            }
        }
        log.record(
            "launch",
            json!({
                "ranks": n, "master_port": port,
                "agent_pids": ranks.iter().map(|r| r.pid.as_raw()).collect::<Vec<_>>(),
            }),
            true,
        );

        // Supervise the attempt until every agent is gone.
        let mut failed_at: Option<Instant> = None;
        let mut failure_note: Option<String> = None;
        let mut kill_at: Option<Instant> = None;
        if let Some(e) = spawn_error {
            eprintln!("resilio: {e}");
            failure_note = Some(e);
            failed_at = Some(Instant::now());
        }
        let mut teardown_sent = false;
        loop {
            // Reap.
            for r in ranks.iter_mut().filter(|r| r.exit.is_none()) {
                if let Ok(st) = waitpid(r.pid, Some(WaitPidFlag::WNOHANG)) {
                    if let Some(c) = code_of(st) {
                        r.exit = Some(c);
                        if c != 0 && failed_at.is_none() && stopped_from_outside.is_none() {
                            failed_at = Some(Instant::now());
                            failure_note = Some(format!("rank {} exited {c}", r.rank));
                        }
                    }
                }
            }
            if let (Some(c), Some(a)) = (&coordinator, advice.as_mut()) {
                a.poll(c, Instant::now());
            }
            if let Some(c) = &coordinator {
                while let Ok(e) = c.effects.try_recv() {
                    if let Effect::Failed { reason, .. } = e {
                        if failed_at.is_none() {
                            failed_at = Some(Instant::now());
                            failure_note = Some(reason);
                        }
                    }
                }
            }
            if ranks.iter().all(|r| r.exit.is_some()) {
                break;
            }
            let now = Instant::now();
            if (failed_at.is_some() || stopped_from_outside.is_some()) && !teardown_sent {
                // Stop every rank now (the coordinator's stop went out too);
                // the agents give their trainers the grace, then kill. One
                // rank failed alone: its agent is ending it already (after
                // a stall, once the diagnostics are taken, and not at all
                // when the trainer finishes on its own meanwhile).
                teardown_sent = true;
                if !single {
                    for r in ranks.iter().filter(|r| r.exit.is_none()) {
                        let _ = kill(r.pid, Signal::SIGTERM);
                    }
                    kill_at = Some(now + grace + Duration::from_secs(5));
                }
                if let Some(note) = &failure_note {
                    log.record(
                        "teardown",
                        json!({ "reason": note, "ranks_left": ranks.iter().filter(|r| r.exit.is_none()).count() }),
                        true,
                    );
                }
            }
            if kill_at.is_some_and(|t| now >= t) {
                for r in ranks.iter().filter(|r| r.exit.is_none()) {
                    let _ = kill(Pid::from_raw(-r.pid.as_raw()), Signal::SIGKILL);
                }
            }
            let forward = |ranks: &[Rank], s: Signal| {
                for r in ranks.iter().filter(|r| r.exit.is_none()) {
                    let _ = kill(r.pid, s);
                }
            };
            tokio::select! {
                _ = s_chld.recv() => {}
                _ = s_term.recv() => { stopped_from_outside.get_or_insert("SIGTERM"); forward(&ranks, Signal::SIGTERM); teardown_sent = true; kill_at.get_or_insert(Instant::now() + grace + Duration::from_secs(5)); }
                _ = s_int.recv() => {
                    ints += 1;
                    stopped_from_outside.get_or_insert("SIGINT");
                    // One rank: its agent counts them (a second one kills
                    // the trainer's whole group at once, and reaps it).
                    if ints >= 2 && !single {
                        for r in ranks.iter().filter(|r| r.exit.is_none()) {
                            let _ = kill(Pid::from_raw(-r.pid.as_raw()), Signal::SIGKILL);
                        }
                    } else {
                        forward(&ranks, Signal::SIGINT);
                    }
                    teardown_sent = true;
                    kill_at.get_or_insert(Instant::now() + grace + Duration::from_secs(5));
                }
                _ = s_hup.recv() => forward(&ranks, Signal::SIGHUP),
                _ = s_usr1.recv() => forward(&ranks, Signal::SIGUSR1),
                _ = s_usr2.recv() => forward(&ranks, Signal::SIGUSR2),
                _ = s_cont.recv() => forward(&ranks, Signal::SIGCONT),
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        if take_tty {
            for r in &ranks {
                crate::process::reclaim_terminal(r.pid);
            }
        }
        let ended = Instant::now();
        let codes: Vec<i32> = ranks.iter().filter_map(|r| r.exit).collect();
        // The job's status is the failure's, not the echo of resilio's own
        // teardown (SIGTERM, then SIGKILL after the grace) of the other ranks:
        // 124 for a hang, the culprit's code for a crash.
        let worst = [|c: i32| c != 0 && c != 143 && c != 137, |c: i32| c != 0]
            .iter()
            .find_map(|keep| ranks.iter().filter_map(|r| r.exit).find(|c| keep(*c)))
            .unwrap_or(0);
        log.record(
            "attempt_end",
            json!({
                "exit_codes": codes,
                "runtime_s": ended.duration_since(started).as_secs_f64(),
                "teardown_s": failed_at.map(|f| ended.duration_since(f).as_secs_f64()),
            }),
            true,
        );
        if worst == 0 && failed_at.is_none() && stopped_from_outside.is_none() {
            log.record(
                "job_end",
                json!({ "exit_code": 0, "reason": "completed" }),
                true,
            );
            final_code = 0;
            break;
        }
        if let Some(s) = stopped_from_outside {
            log.record(
                "job_end",
                json!({ "exit_code": worst, "reason": format!("stopped by {s}") }),
                true,
            );
            // One rank: the trainer's own status (it may end cleanly on
            // the signal), as a plain wrapper would exit.
            final_code = if worst == 0 && !single {
                128 + 15
            } else {
                worst
            };
            break;
        }
        // Judge and decide from the ranks' journals, as the Slurm supervisor does.
        let records = journal::read_job(&job_dir)
            .map(|j| crate::runs::of_key(j.records, log.run()))
            .unwrap_or_default();
        // What the launcher saw itself, when no rank journaled its end
        // (an unwritable journal, a command that could not be started).
        let fallback = if matches!(worst, 126 | 127) {
            Verdict {
                class: Class::UserError,
                reason: "the command could not be started".into(),
                evidence: Some(format!(
                    "exit code {worst}: command not found or not executable"
                )),
            }
        } else {
            Verdict {
                class: Class::Infrastructure,
                reason: failure_note
                    .clone()
                    .unwrap_or_else(|| "a rank failed".into()),
                evidence: None,
            }
        };
        let step = StepEnd {
            ended: chrono::Utc::now(),
            exit_code: worst,
            verdict: &fallback,
            tail: &[],
            node: &node,
            pre_timeout: false,
        };
        let decided = supervisor::decide_local(
            &records,
            attempt,
            &step,
            cfg.max_restarts,
            &remembered,
            &mut log,
        );
        if let Some(d) = &decided {
            remembered.push(d.outcome.clone());
        }
        let code = decided
            .as_ref()
            .and_then(|d| {
                // A hang ends as a stall does (124, as timeout(1)), even when
                // the culprit was stopped by the coordinator, not by its agent.
                if d.outcome.class == Class::Hang {
                    return Some(crate::error::EXIT_STALLED);
                }
                ranks
                    .iter()
                    .find(|r| r.rank == d.primary.rank)
                    .and_then(|r| r.exit)
                    .filter(|c| *c != 0)
            })
            .unwrap_or(if worst == 0 { 1 } else { worst });
        let class = decided.as_ref().map(|d| d.outcome.class);
        // How the job ends, unless it restarts.
        let end: Option<(i32, String)> = match decided.map(|d| d.action) {
            Some(Action::RestartInPlace { reason }) => {
                attempt += 1;
                if single {
                    eprintln!("resilio: restarting in place (attempt {attempt}): {reason}");
                } else {
                    eprintln!(
                        "resilio: restarting all {n} ranks in place (attempt {attempt}): {reason}"
                    );
                }
                log.record(
                    "restart",
                    json!({ "next_attempt": attempt, "reason": reason, "in_place": true,
                            "teardown_s": failed_at.map(|f| ended.duration_since(f).as_secs_f64()) }),
                    true,
                );
                log.set_attempt(attempt);
                if let Some(c) = &coordinator {
                    c.new_attempt(attempt);
                }
                None
            }
            Some(Action::Stop { reason }) => {
                // Said when a restart could have been expected. Not for a
                // budget of 0 (none was asked for), nor for one rank's own
                // error or a stop from outside in its first attempt: the
                // trainer's output, or the person who stopped it, tells.
                let self_evident = single
                    && attempt == 0
                    && matches!(class, Some(Class::UserError | Class::Preempted));
                if cfg.max_restarts > 0 && !self_evident {
                    eprintln!("resilio: not restarting: {reason}");
                }
                Some((code, reason))
            }
            // Never decided in local mode; the failure stands.
            Some(Action::Requeue { reason, .. } | Action::RestartInAllocation { reason, .. }) => {
                Some((code, reason))
            }
            // Nothing failed after all (a stalled trainer that finished on
            // its own while its stall was being judged): every rank's own
            // end says so.
            Some(Action::Finish) | None if worst == 0 => Some((0, "completed".into())),
            Some(Action::Finish) | None => Some((code, "failed".into())),
        };
        if let Some((code, reason)) = end {
            log.record(
                "job_end",
                json!({ "exit_code": code, "reason": reason }),
                true,
            );
            final_code = code;
            break;
        }
    }
    drop(coordinator);
    Ok(final_code)
}
