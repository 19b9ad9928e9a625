//! The rank agent: `resilio run -- COMMAND`.
//!
//! One event loop (a current-thread tokio runtime) owns all decisions:
//!
//! ```text
//! signals (TERM INT HUP USR1 USR2 CONT CHLD) ─┐
//! progress events (pumps, socket, file)  ─────┼─▶ loop ─▶ stall policy ─▶ journal, diagnostics, kill
//! timer (policy deadline, kill deadline)  ────┘
//! ```
//!
//! The pumps (one thread per output stream) only pass bytes through and
//! report steps; the socket listener and file watcher only report. Nothing
//! but the loop touches the trainer's processes.

use crate::config::Config;
use crate::context::{env_is_set, Identity};
use crate::coordinator::client::{Link, Note, Outbox, Target};
use crate::coordinator::protocol::{CommandKind, ExitInfo, RankState};
use crate::coordinator::Coordinator;
use crate::diagnostics::{self, Helpers};
use crate::error::{Error, Result, EXIT_STALLED};
use crate::journal::{self, Writer};
use crate::policy::failure;
use crate::policy::stall::{Phase, PhaseClass, Stall, StallPolicy};
use crate::process::{self, Exit};
use crate::progress::tracker::{Namer, StepRole, Tracker};
use crate::progress::{self, output, Event, Kind};
use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::json;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

/// What `resilio run` was asked to do.
pub struct RunOptions {
    /// The command and its arguments.
    pub argv: Vec<OsString>,
    /// The resolved configuration.
    pub config: Config,
    /// `--job-id`, if given.
    pub job_id: Option<String>,
}

/// Why the agent is stopping the trainer.
#[derive(Clone, Debug, PartialEq)]
enum StopReason {
    /// A signal from outside (forwarded), by name.
    Signal(&'static str),
    /// The stall policy fired.
    Stall,
    /// The coordinator stopped the step (another rank failed).
    Coordinator,
}

use crate::supervisor::Next;

/// Supervise one rank. Returns the exit code for resilio; an `Err` only
/// when the trainer could not be started.
pub fn run(opts: RunOptions) -> Result<i32> {
    let next = runtime()?.block_on(run_async(opts))?;
    match next {
        Next::Exit(code) => Ok(code),
        Next::Relaunch(r) => Ok(relaunch(&r)),
    }
}

/// The job-level supervisor relaunches the step inside the allocation by
/// starting over as itself (same pid, same arguments: Slurm still sees the
/// batch script's process) with the hand-over in `RESILIO_RELAUNCH`. Runs
/// once the runtime, the coordinator and every file of this attempt are gone.
fn relaunch(r: &crate::slurm::step::Relaunch) -> i32 {
    use std::os::unix::process::CommandExt;
    let err = match std::env::current_exe() {
        Ok(exe) => std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env(crate::slurm::step::ENV_RELAUNCH, r.encode())
            .exec(),
        Err(e) => e,
    };
    eprintln!("resilio: cannot relaunch the step inside the allocation: {err}");
    1
}

/// The current-thread runtime every resilio command runs its loop on.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("cannot start runtime: {e}")))
}

/// The local directory for the progress socket (short paths: sun_path is 108 bytes).
fn socket_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d).join("resilio");
        if std::fs::create_dir_all(&d).is_ok() {
            return d;
        }
    }
    let base = std::env::var_os("TMPDIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join(format!("resilio-{}", nix::unistd::getuid()))
}

fn make_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::metadata(dir)?;
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

struct Clock {
    t0: Instant,
    wall0: DateTime<Utc>,
}

impl Clock {
    fn wall(&self, at: Instant) -> DateTime<Utc> {
        let d = at.saturating_duration_since(self.t0);
        self.wall0 + chrono::Duration::from_std(d).unwrap_or_default()
    }
}

/// One counted progress observation, for the journal's sampled records.
struct Observed {
    /// When resilio saw it.
    at: Instant,
    /// The step's number after it (from the source that names the step).
    step: Option<u64>,
    /// The source that showed the progress.
    source: &'static str,
    /// Metrics sent with it (socket only).
    metrics: Vec<(String, f64)>,
}

/// Progress bookkeeping for the journal (sampled records).
struct ProgressLog {
    interval: Duration,
    last_written: Option<Instant>,
    /// Latest counted progress not yet written: (at, step, source, metrics).
    pending: Option<Observed>,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    /// When the named step last advanced (step intervals for the coordinator).
    last_named_at: Option<Instant>,
    /// A checkpoint phase in progress: when it began, steps seen then.
    /// When it began, and the step it is about: training went on meanwhile
    /// (an asynchronous save) only if the step's number moved past it.
    checkpoint_began: Option<(Instant, Option<u64>)>,
    /// Liveness and the step's name (`progress::tracker`).
    tracker: Tracker,
    /// Phase names not declared anywhere, each warned about once.
    unknown_phases: Vec<String>,
}

impl ProgressLog {
    fn record(journal: &mut Writer, clock: &Clock, p: &Observed, first: bool) {
        let mut data = json!({ "step": p.step, "source": p.source });
        if first {
            data["first"] = json!(true);
        }
        for (k, v) in &p.metrics {
            data["metrics"][k] = json!(v);
        }
        journal.record_at(clock.wall(p.at), "progress", data, false);
    }

    fn observe(&mut self, journal: &mut Writer, clock: &Clock, p: Observed) {
        let at = p.at;
        self.last_at = Some(at);
        if self.first_at.is_none() {
            self.first_at = Some(at);
            Self::record(journal, clock, &p, true);
            self.last_written = Some(at);
            self.pending = None;
        } else if self
            .last_written
            .is_none_or(|w| at.duration_since(w) >= self.interval)
        {
            Self::record(journal, clock, &p, false);
            self.last_written = Some(at);
            self.pending = None;
        } else {
            self.pending = Some(p);
        }
    }

    /// Write the last progress if it was held back by sampling.
    fn flush(&mut self, journal: &mut Writer, clock: &Clock) {
        if let Some(p) = self.pending.take() {
            Self::record(journal, clock, &p, false);
            self.last_written = Some(p.at);
        }
    }
}

async fn run_async(opts: RunOptions) -> Result<Next> {
    let cfg = opts.config;
    let mut id = Identity::from_env(opts.job_id.as_deref()).map_err(Error::Usage)?;
    // A malformed SLURM_* environment is Slurm's problem, not a reason to
    // refuse to run the trainer: warn and go on without the Slurm context.
    let slurm = crate::slurm::SlurmContext::from_env().unwrap_or_else(|e| {
        eprintln!("resilio: ignoring the Slurm environment: {e}");
        crate::slurm::SlurmContext::default()
    });
    let clock = Clock {
        t0: Instant::now(),
        wall0: Utc::now(),
    };
    let job_dir = journal::job_dir(&cfg.state_dir, &id.job);
    // In a batch script (in the job, not a task of a step), resilio is the
    // job-level supervisor: it wraps the steps, and decides after them.
    let batch_level = slurm.in_batch_script();
    // Attempts count steps: a relaunch inside the allocation hands its
    // attempt over; a fresh allocation continues after the journal's.
    let mut relaunched: Option<crate::slurm::step::Relaunch> = None;
    let mut earlier: Vec<journal::Record> = Vec::new();
    if batch_level {
        earlier = journal::read_job(&job_dir)
            .map(|j| crate::runs::of_key(j.records, id.run.key.as_deref()))
            .unwrap_or_default();
        if let Ok(text) = std::env::var(crate::slurm::step::ENV_RELAUNCH) {
            match crate::slurm::step::Relaunch::parse(&text) {
                Ok(r) => relaunched = Some(r),
                Err(e) => eprintln!("resilio: ignoring {e}"),
            }
        }
        id.attempt = match &relaunched {
            Some(r) => r.attempt,
            None => crate::supervisor::first_attempt_of_allocation(&earlier, slurm.restart_count),
        };
    }
    let mut journal = if batch_level {
        Writer::open(
            &job_dir,
            "batch.jsonl",
            id.attempt,
            None,
            Some(id.node.clone()),
        )
    } else {
        // One file per writer: a second concurrent step of the same job
        // (a monitor next to the training step) gets files of its own.
        let name = match slurm.step_id.as_deref() {
            Some(step) if step != "0" && slurm.in_step() => {
                format!("step{step}-rank-{}.jsonl", id.rank)
            }
            _ => format!("rank-{}.jsonl", id.rank),
        };
        Writer::open(
            &job_dir,
            &name,
            id.attempt,
            Some(id.rank),
            Some(id.node.clone()),
        )
    };
    journal.set_run(id.run.key.as_deref());
    if id.run.fresh && id.rank == 0 && relaunched.is_none() {
        crate::runs::warn_if_reused(&job_dir, &id.job, id.run.key.as_deref());
    }
    // The local launcher records the job's start and end itself.
    let single_rank_job = batch_level
        || (id.world_size == 1
            && !env_is_set(crate::coordinator::ENV_URL)
            && !env_is_set(crate::context::ENV_LAUNCHER));
    let mut monitor_errors: Vec<String> = Vec::new();

    // The coordinator: from the environment (the local launcher's, or the
    // batch-level one's), hosted here (batch level; rank 0 of a step nobody
    // else coordinates), or found from the job's files (the other ranks).
    let mut hosted: Option<Coordinator> = None;
    let mut advice = cfg.coordinator.policy.checkpoint_advised.then(|| {
        crate::coordinator::Advice::new(std::sync::Arc::new(crate::advice::JournalAdvice::new(
            &cfg.state_dir,
            &id.job,
        )))
    });
    let mut target: Option<Target> = None;
    if cfg.coordinator.enabled {
        let from_env = std::env::var(crate::coordinator::ENV_URL)
            .ok()
            .zip(std::env::var(crate::coordinator::ENV_TOKEN).ok())
            .filter(|(u, t)| !u.is_empty() && !t.is_empty());
        let multi_rank_step = slurm.in_step() && id.world_size > 1;
        if let Some((url, token)) = from_env {
            target = Some(Target::Known { url, token });
        } else if batch_level || (multi_rank_step && id.rank == 0) {
            let world = if batch_level {
                slurm.ntasks.unwrap_or(1)
            } else {
                id.world_size
            };
            let mut view = crate::coordinator::state::JobView::new(
                &id.job,
                world,
                id.attempt,
                cfg.coordinator.policy.clone(),
                Instant::now(),
            );
            // Stragglers flagged before this attempt: confirmation across restarts.
            if batch_level {
                view.seed_from_journal(&earlier);
            } else if id.attempt > 0 {
                if let Ok(j) = journal::read_job(&job_dir) {
                    view.seed_from_journal(&crate::runs::of_key(j.records, id.run.key.as_deref()));
                }
            }
            if let Some(r) = &relaunched {
                let ago = (Utc::now().timestamp_micros() - r.failed_at_us).max(0) as u64;
                let at = Instant::now()
                    .checked_sub(Duration::from_micros(ago))
                    .unwrap_or_else(Instant::now);
                let restarts = earlier.iter().filter(|r| r.kind == "restart").count() as u32;
                view.resume_after_failure(at, restarts);
            }
            let started = crate::coordinator::bind_address(&cfg.coordinator.bind, slurm.in_job())
                .map_err(std::io::Error::other)
                .and_then(|bind| {
                    let w = Writer::open(
                        &job_dir,
                        "coordinator.jsonl",
                        id.attempt,
                        None,
                        Some(id.node.clone()),
                    )
                    .with_run(id.run.key.as_deref());
                    Coordinator::start(view, bind, w, Some(&job_dir))
                });
            match started {
                Ok(c) => {
                    // `checkpoint_every = "advised"`: from the journal so
                    // far, and again every few minutes (see the loop).
                    if let Some(a) = advice.as_mut() {
                        a.poll(&c, Instant::now());
                    }
                    if !batch_level {
                        target = Some(Target::Known {
                            url: c.url.clone(),
                            token: c.token.clone(),
                        });
                    }
                    hosted = Some(c);
                }
                Err(e) => monitor_errors.push(format!("coordinator: {e}")),
            }
        } else if multi_rank_step {
            target = Some(Target::Files(job_dir.clone()));
        }
    }
    let outbox = std::sync::Arc::new(Outbox::default());
    let (notes_tx, mut notes_rx) = tokio::sync::mpsc::unbounded_channel::<Note>();
    let link = target.map(|t| Link::new(t, cfg.coordinator.report_interval));
    let linked = link.is_some();
    if let Some(l) = &link {
        outbox.update(|r| {
            r.v = crate::coordinator::protocol::VERSION;
            r.rank = id.rank;
            r.node = id.node.clone();
            r.attempt = id.attempt;
            r.phase = "train".into();
        });
        l.spawn(outbox.clone(), notes_tx.clone());
    }
    drop(notes_tx);
    let mut commands_handled = 0u64;

    // Signals are registered before the child exists so none is lost.
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

    if let Err(e) = process::set_subreaper() {
        monitor_errors.push(format!("cannot become child subreaper: {e}"));
    }

    let tx = progress::Sender::new();

    // The progress socket (fail open: without it, output and file still work).
    let sock_dir = socket_dir();
    let mut sock_path = sock_dir.join(format!(
        "{}.{}.{}.sock",
        id.job,
        id.rank,
        std::process::id()
    ));
    if sock_path.as_os_str().len() > 100 {
        sock_path = sock_dir.join(format!("{}.sock", std::process::id()));
    }
    let socket = make_private_dir(&sock_dir).and_then(|_| progress::socket::bind(&sock_path));
    let socket_ok = match socket.and_then(|sock| progress::socket::spawn_listener(sock, tx.clone()))
    {
        Ok(_) => true,
        Err(e) => {
            monitor_errors.push(format!("progress socket {}: {e}", sock_path.display()));
            false
        }
    };

    let mut env: Vec<(OsString, OsString)> = id
        .exported()
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    env.push(("RESILIO_STATE_DIR".into(), cfg.state_dir.clone().into()));
    if socket_ok {
        env.push(("RESILIO_SOCKET".into(), sock_path.clone().into()));
    }
    // Coordinated checkpoint requests reach the trainer through this file
    // (`checkpoint id=N step=S reason=R`, replaced whole); see docs/coordinator.md.
    let control_path = sock_path.with_extension("ctl");
    if linked {
        env.push(("RESILIO_CONTROL".into(), control_path.clone().into()));
    }
    if let Some(c) = &hosted {
        if batch_level {
            for (k, v) in c.env() {
                env.push((k.into(), v.into()));
            }
        }
    }
    if cfg.progress.python_unbuffered && !env_is_set("PYTHONUNBUFFERED") {
        env.push(("PYTHONUNBUFFERED".into(), "1".into()));
    }
    let torchrun = crate::slurm::env::trainer_env(&slurm, &id.job, id.attempt, &|k| env_is_set(k));
    env.extend(
        torchrun
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );

    let argv_text: Vec<String> = opts
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if single_rank_job {
        let mut data = json!({ "world_size": id.world_size, "mode": if batch_level { "batch" } else { "single" } });
        if batch_level {
            data["allocation"] = json!(slurm.restart_count);
            if let Some(r) = &relaunched {
                data["relaunch_in_allocation"] = json!({ "exclude": r.exclude, "nodes": r.nodes });
            }
        }
        // Durable at batch level: it maps the allocation to its attempts.
        journal.record("job_start", data, batch_level);
    }
    if batch_level && relaunched.is_none() {
        crate::supervisor::reconcile_previous(
            &earlier,
            &id.job,
            slurm.restart_count,
            &crate::slurm::SlurmCli::default(),
            &mut journal,
        );
    }
    // The site health check, once per node (local rank 0), before the trainer.
    let checks_node = !batch_level && slurm.localid.unwrap_or(0) == 0;
    if checks_node {
        if let Some(h) = crate::health::run(&cfg.health) {
            journal.record(
                "health_check",
                json!({ "when": "before_start", "result": &h }),
                true,
            );
            if !h.ok {
                let code = crate::health::EXIT_UNHEALTHY;
                let evidence = format!(
                    "health check failed ({}): {}",
                    h.status,
                    h.output.lines().next().unwrap_or("")
                );
                eprintln!(
                    "resilio: {evidence}; not starting the trainer on {}",
                    id.node
                );
                journal.record(
                    "rank_exit",
                    json!({ "exit_code": code, "cause": "unhealthy node", "class": failure::Class::Infrastructure,
                            "class_reason": "the node's health check failed", "evidence": evidence }),
                    true,
                );
                journal.record(
                    "failure",
                    json!({ "failure_kind": "health_check", "class": failure::Class::Infrastructure, "cause": "health check failed",
                            "evidence": evidence, "exit_code": code }),
                    true,
                );
                if single_rank_job {
                    journal.record("job_end", json!({ "exit_code": code }), true);
                }
                return Ok(Next::Exit(code));
            }
        }
    }
    // Nodes left out of the step: by a relaunch inside the allocation (the
    // blamed ones), or at the start from the node history (`[nodes]`).
    let mut step_out: Option<(Vec<String>, u32)> =
        relaunched.as_ref().map(|r| (r.exclude.clone(), r.nodes));
    if batch_level && relaunched.is_none() && cfg.nodes.exclude_at_start {
        let cli = crate::slurm::SlurmCli::default();
        let (history, _) =
            crate::node_history::build(&cfg.state_dir, Utc::now(), cfg.nodes.half_life, Some(&cli));
        // `earlier`: the journal as this allocation found it (read once above).
        match crate::supervisor::history_at_start(
            &history,
            cfg.nodes.threshold,
            &id.job,
            &slurm.job_nodes,
            &opts.argv,
            &earlier,
            &cli,
            &mut journal,
        ) {
            crate::supervisor::AtStart::Run => {}
            crate::supervisor::AtStart::LeaveOut { exclude, nodes } => {
                step_out = Some((exclude, nodes));
            }
            crate::supervisor::AtStart::Requeued => {
                if socket_ok {
                    let _ = std::fs::remove_file(&sock_path);
                }
                return Ok(Next::Exit(0));
            }
        }
    }
    drop(earlier);
    let argv = match &step_out {
        Some((exclude, nodes)) => crate::slurm::step::leave_out(&opts.argv, exclude, *nodes)
            .unwrap_or_else(|| {
                journal.record(
                    "monitor_error",
                    json!({ "error": "the step command cannot leave nodes out; run as it was" }),
                    false,
                );
                opts.argv.clone()
            }),
        None => opts.argv.clone(),
    };
    let spawned = match process::spawn(&argv, &env) {
        Ok(s) => s,
        Err(e) => {
            let code = e.exit_code();
            journal.record(
                "rank_exit",
                json!({ "exit_code": code, "cause": "spawn_failed", "error": e.to_string(), "argv": argv_text }),
                true,
            );
            journal.record(
                "failure",
                json!({ "cause": "spawn_failed", "exit_code": code, "detail": e.to_string() }),
                true,
            );
            if single_rank_job {
                journal.record("job_end", json!({ "exit_code": code }), true);
            }
            if socket_ok {
                let _ = std::fs::remove_file(&sock_path);
            }
            return Err(e);
        }
    };
    let pid = spawned.pid;
    let launched = Instant::now();
    outbox.update(|r| r.pid = pid.as_raw() as u32);

    let parser = output::Parser::new(
        cfg.progress.regex.clone(),
        cfg.progress.checkpoint_regex.clone(),
        cfg.progress.eval_regex.clone(),
    );
    let tail = output::Tail::new(64 * 1024);
    let mut pumps = Vec::new();
    for (pipe, fd, source) in [
        (spawned.stdout, 1, progress::Source::Stdout),
        (spawned.stderr, 2, progress::Source::Stderr),
    ] {
        match output::spawn_pump(
            pipe,
            fd,
            source,
            parser.clone(),
            tail.clone(),
            tx.clone(),
            crate::context::shares_output(),
        ) {
            Ok(h) => pumps.push(h),
            Err(e) => monitor_errors.push(format!("output pump: {e}")),
        }
    }
    let mut file_watch = None;
    let mut file_mode = None;
    if let Some(path) = &cfg.progress.file {
        file_mode = Some(progress::file::effective_mode(path, cfg.progress.file_poll).1);
        match progress::file::watch(
            path,
            cfg.progress.file_poll,
            cfg.progress.file_poll_interval,
            output::Parser::new(cfg.progress.regex.clone(), None, None),
            tx.clone(),
        ) {
            Ok(w) => file_watch = Some(w),
            Err(e) => monitor_errors.push(format!("progress file {}: {e}", path.display())),
        }
    }

    // Checkpoints the trainer saves on its own (rank 0 only: the directory
    // is usually shared, and one record per checkpoint is enough).
    let mut ckpt_watch = None;
    if let Some(dir) = cfg.checkpoint_watch_dir.as_ref().filter(|_| id.rank == 0) {
        match progress::checkpoint_dir::watch(
            dir,
            cfg.checkpoint_watch_regex.clone(),
            cfg.checkpoint_watch_poll,
            tx.clone(),
        ) {
            Ok(w) => ckpt_watch = Some(w),
            Err(e) => monitor_errors.push(format!("checkpoint directory {}: {e}", dir.display())),
        }
    }
    journal.record_at(
        clock.wall(launched),
        "rank_start",
        json!({
            "pid": pid.as_raw(),
            "argv": argv_text,
            "cwd": std::env::current_dir().ok(),
            "world_size": id.world_size,
            "startup_timeout_s": cfg.stall.startup_timeout.as_secs_f64(),
            "stall_timeout_s": cfg.stall.fixed_timeout.map(|d| d.as_secs_f64()),
            "stall_mode": if cfg.stall.fixed_timeout.is_some() { "fixed" } else { "adaptive" },
            "socket": socket_ok.then(|| sock_path.clone()),
            "progress_file": cfg.progress.file,
            "progress_file_watch": file_mode,
            "slurm_step": slurm.step_id,
            "step_nodes": (!slurm.step_nodes.is_empty()).then(|| crate::slurm::hostlist::compress(&slurm.step_nodes)),
            "torchrun_env": torchrun.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<std::collections::BTreeMap<_, _>>(),
        }),
        true,
    );
    for e in &monitor_errors {
        eprintln!("resilio: {e}; supervision continues without it");
        journal.record("monitor_error", json!({ "error": e }), false);
    }

    let helpers = Helpers::default();
    let mut policy = StallPolicy::new(cfg.stall.clone(), launched);
    let mut plog = ProgressLog {
        interval: cfg.journal_progress_interval,
        last_written: None,
        pending: None,
        first_at: None,
        last_at: None,
        last_named_at: None,
        checkpoint_began: None,
        tracker: Tracker::new(),
        unknown_phases: Vec::new(),
    };
    let mut faults = SourceFaults::default();

    let mut main_exit: Option<Exit> = None;
    let mut stop: Option<StopReason> = None;
    let mut stall: Option<Stall> = None;
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let mut killed_at: Option<Instant> = None;
    let mut stall_at: Option<Instant> = None;
    let mut stall_stop_sent = false;
    // Linked to a coordinator, a stalled rank is stopped on its word (after
    // the other ranks were probed as they stood), or when this runs out.
    let mut stall_stop_at: Option<Instant> = None;
    let mut coordinator_down = false;
    // This rank has lived on the job's progress (it reports none of its own).
    let mut silent_known = false;
    // A stop (signal or the coordinator's) came while diagnostics ran.
    let mut stop_asked = false;
    let mut main_exit_at: Option<Instant> = None;
    let mut drain_kill_at: Option<Instant> = None;
    let mut ints = 0u32;
    let (diag_tx, mut diag_rx) = tokio::sync::mpsc::unbounded_channel::<diagnostics::Diagnostics>();
    // Probes asked by the coordinator: (reason, verdict, py-spy dumps).
    let (probe_tx, mut probe_rx) = tokio::sync::mpsc::unbounded_channel::<(
        String,
        diagnostics::Probe,
        Vec<diagnostics::PySpyDump>,
    )>();
    // The stall's own probe, waiting for the stacks of its diagnostics.
    let mut stall_probe: Option<diagnostics::Probe> = None;
    let mut diag_pending = false;
    let grace = cfg.kill_grace;
    // resilio's own stops (a stall, a teardown): a hung trainer rarely
    // honours SIGTERM, and Lightning catches it and sleeps on.
    let stall_grace = cfg.stall_kill_grace.min(grace);
    // The grace of the stop under way, for the SIGKILL record.
    let mut grace_used = grace;
    let scratch = job_dir.join("diag");

    // Reaping scans /proc, so it runs only when a child may have changed
    // state (SIGCHLD, diagnostics done) and, while draining, once a second.
    let mut reap_due = true;
    let mut children_left = true;
    // Slurm's pre-timeout signal: (asked at, its wall time, stop-the-step deadline).
    let mut pre_timeout: Option<(Instant, DateTime<Utc>, Instant)> = None;
    // In a step, Slurm's process tracking delivers srun's signals to every
    // process of the step, the trainer included: forwarding would double them.
    let slurm_delivers = slurm.in_step() && !cfg.slurm_forward_signals;
    let mut pre_timeout_done = false;
    // The journal is read for the ranks' checkpoint_done at most once a
    // second (the loop may wake far more often, on every output line).
    let mut next_done_check = Instant::now();
    let mut pre_timeout_coordinated = false;
    let child_is_srun = opts
        .argv
        .first()
        .and_then(|p| std::path::Path::new(p).file_name())
        .is_some_and(|n| n == "srun");
    loop {
        if reap_due {
            reap_due = false;
            let skip = helpers.with(|h| h.clone());
            if main_exit.is_none() {
                if let Some(exit) = process::try_reap_main(pid) {
                    main_exit = Some(exit);
                    main_exit_at = Some(Instant::now());
                    // Remaining descendants get TERM now, KILL after the grace.
                    process::reap_orphans(pid, &skip);
                    if !process::live_children(&skip).is_empty() {
                        process::signal_tree(pid, Signal::SIGTERM, &skip);
                        drain_kill_at = Some(Instant::now() + grace);
                    }
                }
            }
            helpers.with(|h| process::reap_orphans(pid, h));
            if main_exit.is_some() {
                children_left = !process::live_children(&skip).is_empty();
            }
        }
        if main_exit.is_some() && !diag_pending && !children_left {
            break;
        }
        let skip = helpers.with(|h| h.clone());

        let monitoring = main_exit.is_none() && stop.is_none();
        let now = Instant::now();
        // While monitoring, wake at the stall deadline (steps are drained
        // then) and often enough to keep the journal's progress current;
        // while stopping or draining, once a second to reap.
        let step_wake = monitoring.then(|| {
            policy
                .deadline()
                .checked_sub(policy.min_future_limit())
                .unwrap_or(now)
        });
        tx.wake_for_steps_before(step_wake);
        // A step queued just before the threshold moved is drained now.
        let early = step_wake.is_some_and(|t| tx.has_steps_before(t));
        let waiting_checkpoint = batch_level && pre_timeout.is_some() && !pre_timeout_done;
        let mut wake = if monitoring && !waiting_checkpoint {
            let mut every = cfg
                .journal_progress_interval
                .max(Duration::from_millis(100));
            if linked {
                // The coordinator's report carries the latest step.
                every = every.min(cfg.coordinator.report_interval);
            }
            policy.deadline().min(now + every)
        } else {
            now + Duration::from_secs(1)
        };
        for t in [
            kill_at,
            drain_kill_at,
            stall_stop_at.filter(|_| !stall_stop_sent),
        ]
        .into_iter()
        .flatten()
        {
            wake = wake.min(t);
        }

        tokio::select! {
            // Signals first: a SIGCONT after a suspension must restart the
            // stall clock before the timer that expired meanwhile is judged.
            biased;
            _ = s_chld.recv() => reap_due = true,
            _ = s_term.recv() => {
                if diag_pending {
                    // The stall's evidence is being taken (srun stopping the
                    // step because a peer failed, say): the stop follows as
                    // soon as it is done, within the grace.
                    stop_asked = true;
                    journal.record("signal", json!({ "signal": "SIGTERM", "forwarded": false, "deferred": "stall diagnostics in progress" }), false);
                } else {
                    forward_unless(&mut journal, pid, Signal::SIGTERM, slurm_delivers);
                    kill_at.get_or_insert(Instant::now() + grace);
                }
                if stop.is_none() && main_exit.is_none() { stop = Some(StopReason::Signal("SIGTERM")); }
            }
            _ = s_int.recv() => {
                ints += 1;
                if ints >= 2 {
                    process::signal_tree(pid, Signal::SIGKILL, &skip);
                    killed = true;
                    journal.record("signal", json!({ "signal": "SIGINT", "forwarded": false, "action": "second SIGINT: SIGKILL" }), false);
                } else if diag_pending {
                    stop_asked = true;
                    journal.record("signal", json!({ "signal": "SIGINT", "forwarded": false, "deferred": "stall diagnostics in progress" }), false);
                } else {
                    forward_unless(&mut journal, pid, Signal::SIGINT, slurm_delivers);
                    kill_at.get_or_insert(Instant::now() + grace);
                }
                if stop.is_none() && main_exit.is_none() { stop = Some(StopReason::Signal("SIGINT")); }
            }
            _ = s_hup.recv() => forward_unless(&mut journal, pid, Signal::SIGHUP, slurm_delivers),
            _ = s_usr1.recv() => on_user_signal(Signal::SIGUSR1, &cfg, &slurm, batch_level, child_is_srun, &mut journal, pid, &mut pre_timeout),
            _ = s_usr2.recv() => on_user_signal(Signal::SIGUSR2, &cfg, &slurm, batch_level, child_is_srun, &mut journal, pid, &mut pre_timeout),
            _ = s_cont.recv() => {
                // Resumed after a suspension (scontrol suspend, gang
                // scheduling, Ctrl-Z): the time stopped is not a stall.
                policy.on_resume(Instant::now());
                forward_unless(&mut journal, pid, Signal::SIGCONT, slurm_delivers)
            }
            _ = tx.woken() => {}
            Some(note) = notes_rx.recv(), if linked => {
                match note {
                    Note::Unreachable { error } => {
                        coordinator_down = true;
                        eprintln!("resilio: coordinator unreachable ({error}); supervising this rank locally, retrying");
                        journal.record("coordinator_unreachable", json!({ "error": error }), false);
                    }
                    Note::Reachable { gap_s, failed_requests } => {
                        coordinator_down = false;
                        journal.record("coordinator_reachable", json!({ "gap_s": gap_s, "failed_requests": failed_requests }), false);
                    }
                    Note::Command(c) if c.seq > commands_handled && c.for_rank(id.rank, id.attempt) => {
                        commands_handled = c.seq;
                        outbox.update(|r| r.commands_seen = r.commands_seen.max(c.seq));
                        match c.kind {
                            CommandKind::Checkpoint { id: ck, step, reason } => {
                                let written = write_control(&control_path, &format!("checkpoint id={ck} step={step} reason={reason}\n"));
                                let signalled = cfg.coordinator.signal_trainer.then_some(cfg.checkpoint_signal).flatten();
                                if let Some(sig) = signalled {
                                    process::signal_group(pid, sig);
                                }
                                journal.record("checkpoint_requested", json!({
                                    "id": ck, "step": step, "reason": reason, "coordinated": true,
                                    "control_file": written.as_ref().ok().map(|_| &control_path),
                                    "control_error": written.err().map(|e| e.to_string()),
                                    "signal": signalled.map(|s| s.as_str()),
                                }), true);
                            }
                            CommandKind::Stop { reason } => {
                                if diag_pending {
                                    stop_asked = true;
                                } else if main_exit.is_none() && stall.is_some() && !stall_stop_sent {
                                    journal.record("stop_judged", json!({ "detail": reason }), false);
                                    stop_stalled(&mut journal, pid, &skip, stall_grace);
                                    stall_stop_sent = true;
                                    if kill_at.is_none() { grace_used = stall_grace; }
                                    kill_at.get_or_insert(Instant::now() + stall_grace);
                                } else if main_exit.is_none() && stop.is_none() {
                                    // The attempt failed elsewhere: this rank is most
                                    // likely blocked in a collective with the failed one.
                                    process::signal_group(pid, Signal::SIGTERM);
                                    journal.record("stop", json!({ "reason": "coordinator", "detail": reason, "signal": "SIGTERM", "grace_s": stall_grace.as_secs_f64() }), true);
                                    stop = Some(StopReason::Coordinator);
                                    if kill_at.is_none() { grace_used = stall_grace; }
                                    kill_at.get_or_insert(Instant::now() + stall_grace);
                                }
                            }
                            CommandKind::Diagnose { reason } => {
                                if main_exit.is_none() {
                                    // The system calls now, then py-spy stacks,
                                    // off the loop (py-spy takes a moment).
                                    let p = diagnostics::probe(&skip);
                                    let lines = tail.last_lines(cfg.diagnostics.tail_lines);
                                    let (dcfg, h, ptx, scratch) = (cfg.diagnostics.clone(), helpers.clone(), probe_tx.clone(), scratch.clone());
                                    let spawned = std::thread::Builder::new().name("probe".into()).spawn(move || {
                                        let (dumps, skipped) = diagnostics::dump_stacks(&dcfg, &h, &scratch);
                                        let p = diagnostics::with_stacks(p, &dumps, skipped.as_deref());
                                        let p = diagnostics::with_output(p, &lines);
                                        let _ = ptx.send((reason, p, dumps));
                                    });
                                    if spawned.is_err() {
                                        outbox.update(|r| r.probed = true);
                                        outbox.urgent.notify_one();
                                    }
                                }
                            }
                        }
                    }
                    Note::Command(_) => {}
                    Note::JobProgress { at } => {
                        // A rank with no progress of its own lives on the job's.
                        if plog.tracker.alive_count() == 0 && at > launched {
                            silent_known = true;
                            policy.on_peer_progress(at);
                            outbox.update(|r| {
                                if r.state == RankState::Starting {
                                    r.state = RankState::Running;
                                    r.silent = true;
                                }
                            });
                        }
                    }
                }
            }
            Some((reason, p, dumps)) = probe_rx.recv() => {
                journal.record("probe", json!({
                    "reason": reason, "probe": &p,
                    "py_spy": dumps.iter().map(|d| json!({"pid": d.pid, "ok": d.ok, "output": truncate(&d.output, 1500)})).collect::<Vec<_>>(),
                }), false);
                outbox.update(|r| {
                    r.waiting_on_peer = p.waiting_on_peer;
                    r.probe = Some(p.evidence.join("; "));
                    r.probed = true;
                });
                outbox.urgent.notify_one();
            }
            _ = std::future::ready(()), if early => {}
            Some(d) = diag_rx.recv(), if diag_pending => {
                diag_pending = false;
                reap_due = true;
                let tail_lines = tail.last_lines(cfg.diagnostics.tail_lines);
                if let Some(p) = stall_probe.take() {
                    let p = diagnostics::with_stacks(p, &d.py_spy, d.py_spy_skipped.as_deref());
                    let p = diagnostics::with_output(p, &tail_lines);
                    journal.record("probe", json!({ "reason": "stall", "probe": &p }), false);
                    outbox.update(|r| {
                        r.waiting_on_peer = p.waiting_on_peer;
                        r.probe = Some(p.evidence.join("; "));
                        r.probed = true;
                    });
                    outbox.urgent.notify_one();
                }
                let file = write_diag_file(&scratch, &id, &tail_lines, &d);
                journal.record("diagnostics", json!({
                    "tail": truncate_lines(&tail_lines, 3000),
                    "py_spy": d.py_spy.iter().map(|p| json!({"pid": p.pid, "ok": p.ok, "output": truncate(&p.output, 1500)})).collect::<Vec<_>>(),
                    "py_spy_skipped": d.py_spy_skipped,
                    "dump_signal": d.dump_signal,
                    "file": file,
                }), true);
                if main_exit.is_none() {
                    if linked && !coordinator_down && !stop_asked {
                        let wait = cfg.coordinator.policy.hang_wait + Duration::from_secs(5);
                        stall_stop_at = Some(Instant::now() + wait);
                        journal.record("stop_deferred", json!({ "reason": "stall", "until": "the coordinator's judgment", "max_wait_s": wait.as_secs_f64() }), false);
                    } else {
                        stop_stalled(&mut journal, pid, &skip, stall_grace);
                        stall_stop_sent = true;
                        if kill_at.is_none() { grace_used = stall_grace; }
                        kill_at.get_or_insert(Instant::now() + stall_grace);
                    }
                } else {
                    kill_at.get_or_insert(Instant::now() + grace);
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                if main_exit.is_some() || stop.is_some() {
                    reap_due = true;
                }
            }
        }

        if stall.is_none() {
            drain_events(
                &tx,
                &mut Sinks {
                    policy: &mut policy,
                    plog: &mut plog,
                    journal: &mut journal,
                    clock: &clock,
                    faults: &mut faults,
                    outbox: linked.then_some(&*outbox),
                },
            );
        }
        if let Some(c) = &hosted {
            // Effects for a host: this agent tears nothing down itself (the
            // coordinator's stop reaches every rank), so they are only drained.
            while c.effects.try_recv().is_ok() {}
            if let Some(a) = advice.as_mut() {
                a.poll(c, Instant::now());
            }
        }
        let now = Instant::now();
        // Woken long after the planned time: resilio itself was stopped
        // (suspend, SIGSTOP) or starved. Time it did not observe is not a
        // stall; the clock restarts (the SIGCONT may not be handled yet).
        if monitoring && now > wake + Duration::from_millis(1500) {
            policy.on_resume(now);
            journal.record(
                "resumed",
                json!({ "late_s": now.duration_since(wake).as_secs_f64() }),
                false,
            );
        }
        // The job-level supervisor does not judge hangs from srun's merged
        // output (ranks report on their own sockets): the rank agents do.
        // Fail open: a silent rank (it reports nothing; it lived on the job's
        // progress) whose coordinator is unreachable cannot know whether the
        // job progresses, and is not stopped for its silence meanwhile.
        if coordinator_down && silent_known {
            policy.on_peer_progress(now);
        }
        if main_exit.is_none() && stop.is_none() && !batch_level {
            if let Some(s) = policy.check(now) {
                on_stall(&s, &policy, &mut plog, &mut journal, &clock, &id, now);
                if linked {
                    // What the trainer is blocked on, before anything disturbs it.
                    // (Its verdict goes to the coordinator with the stacks
                    // the diagnostics take next.)
                    let p = diagnostics::probe(&helpers.with(|h| h.clone()));
                    outbox.update(|r| {
                        r.state = RankState::Stalled;
                        r.probe = Some(p.evidence.join("; "));
                    });
                    outbox.urgent.notify_one();
                    stall_probe = Some(p);
                }
                stop = Some(StopReason::Stall);
                stall_at = Some(now);
                stall = Some(s);
                diag_pending = true;
                let dcfg = cfg.diagnostics.clone();
                let h = helpers.clone();
                let dtx = diag_tx.clone();
                let scratch = scratch.clone();
                let spawned = std::thread::Builder::new()
                    .name("diagnostics".into())
                    .spawn(move || {
                        let _ = std::fs::create_dir_all(&scratch);
                        let d = diagnostics::gather(&dcfg, pid, &h, &scratch);
                        let _ = dtx.send(d);
                    });
                if spawned.is_err() {
                    // No thread to be had (the very limit the trainer may have
                    // hit): stop without diagnostics rather than not at all.
                    let _ = diag_tx.send(diagnostics::Diagnostics {
                        py_spy_skipped: Some("no thread available for diagnostics".into()),
                        ..Default::default()
                    });
                }
            }
        }
        if let (Some(c), Some(_), false) = (&hosted, pre_timeout, pre_timeout_coordinated) {
            pre_timeout_coordinated = true;
            // Besides the signal: the ranks' agents tell their trainers the step.
            match c.request_checkpoint("pre_timeout") {
                Ok((ck, step)) => journal.record(
                    "checkpoint_coordinated",
                    json!({ "id": ck, "step": step, "reason": "pre_timeout" }),
                    false,
                ),
                Err(e) => journal.record(
                    "checkpoint_coordinated",
                    json!({ "error": e, "reason": "pre_timeout" }),
                    false,
                ),
            }
        }
        if batch_level && main_exit.is_none() && !pre_timeout_done {
            if let Some((_, asked_wall, deadline)) =
                pre_timeout.filter(|p| now >= next_done_check || now >= p.2)
            {
                next_done_check = now + Duration::from_secs(1);
                let done = journal::read_job(&job_dir).ok().and_then(|j| {
                    j.records
                        .iter()
                        .find(|r| {
                            r.kind == "checkpoint_done"
                                && r.attempt == id.attempt
                                && r.ts >= asked_wall
                        })
                        .map(|r| r.u64("step"))
                });
                if done.is_some() || now >= deadline {
                    pre_timeout_done = true;
                    journal.record(
                        "stop",
                        json!({
                            "reason": "pre_timeout",
                            "signal": "SIGTERM",
                            "checkpoint_step": done.flatten(),
                            "checkpoint_confirmed": done.is_some(),
                        }),
                        true,
                    );
                    // Stop the step gently: SIGTERM to every process of its
                    // steps (the agents journal their ranks' ends); srun
                    // itself would cancel the step with SIGKILL.
                    let gentle = child_is_srun
                        && crate::slurm::Slurm::signal_steps(
                            &crate::slurm::SlurmCli::default(),
                            &id.job,
                            Signal::SIGTERM,
                        )
                        .is_ok();
                    if !gentle {
                        process::signal_group(pid, Signal::SIGTERM);
                    }
                    stop = Some(StopReason::Signal("pre-timeout"));
                    kill_at.get_or_insert(now + grace);
                }
            }
        }
        let due = |t: Option<Instant>| t.is_some_and(|t| now >= t);
        if due(stall_stop_at) && !stall_stop_sent && main_exit.is_none() {
            let skip = helpers.with(|h| h.clone());
            stop_stalled(&mut journal, pid, &skip, stall_grace);
            stall_stop_sent = true;
            if kill_at.is_none() {
                grace_used = stall_grace;
            }
            kill_at.get_or_insert(now + stall_grace);
        }
        if due(kill_at) || due(drain_kill_at) {
            let skip = helpers.with(|h| h.clone());
            if !killed {
                killed = true;
                killed_at = Some(now);
                journal.record(
                    "stop",
                    json!({ "signal": "SIGKILL", "after_grace_s": grace_used.as_secs_f64() }),
                    false,
                );
            }
            // Again each time round: a process can appear during the sweep.
            process::signal_tree(pid, Signal::SIGKILL, &skip);
        }
        // A descendant that survives SIGKILL (uninterruptible sleep in a
        // driver or a hung filesystem) must not keep resilio from reporting.
        if main_exit.is_some()
            && killed_at.is_some_and(|t| now.duration_since(t) > Duration::from_secs(10))
        {
            let skip = helpers.with(|h| h.clone());
            let left: Vec<i32> = process::live_children(&skip)
                .iter()
                .map(|p| p.pid)
                .collect();
            journal.record(
                "unkillable",
                json!({ "pids": left, "note": "still alive 10 s after SIGKILL; not waited for" }),
                true,
            );
            eprintln!("resilio: processes {left:?} survived SIGKILL; exiting without them");
            break;
        }
    }

    // Output: let the pumps finish what the pipes still hold.
    let deadline = Instant::now() + Duration::from_secs(2);
    for p in pumps {
        while !p.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if p.is_finished() {
            let _ = p.join();
        }
    }
    if stall.is_none() {
        drain_events(
            &tx,
            &mut Sinks {
                policy: &mut policy,
                plog: &mut plog,
                journal: &mut journal,
                clock: &clock,
                faults: &mut faults,
                outbox: linked.then_some(&*outbox),
            },
        );
    }
    drop(file_watch);
    drop(ckpt_watch);
    plog.flush(&mut journal, &clock);
    tx.close();
    if socket_ok {
        // Wake the listener thread so it sees the queue closed.
        if let Ok(s) = std::os::unix::net::UnixDatagram::unbound() {
            let _ = s.send_to(b"", &sock_path);
        }
        let _ = std::fs::remove_file(&sock_path);
    }
    let _ = std::fs::remove_file(&control_path);

    process::restore_terminal(pid);
    let exit = main_exit.expect("loop ends only after the main child exited");
    // The trainer ended on its own while the stall's evidence was being taken
    // (not by resilio's stop, nor by the dump signal): its own status stands.
    let by_dump_signal = matches!((exit, cfg.diagnostics.dump_signal), (Exit::Signal(s, _), Some(d)) if s == d as i32);
    if stall.is_some() && !stall_stop_sent && !by_dump_signal {
        journal.record(
            "stall_cancelled",
            json!({ "status": exit.describe(), "note": "the trainer exited on its own during stall diagnostics" }),
            true,
        );
        stall = None;
        stop = None;
    }
    let code = if stall.is_some() {
        EXIT_STALLED
    } else {
        exit.code()
    };
    let cause = match (&stop, exit) {
        (Some(StopReason::Stall), _) => "stalled".to_string(),
        (Some(StopReason::Signal(name)), _) => format!("stopped by {name}"),
        (Some(StopReason::Coordinator), _) => "stopped by the coordinator".into(),
        (None, Exit::Code(0)) => "completed".into(),
        (None, Exit::Code(_)) => "exited with error".into(),
        (None, Exit::Signal(..)) => "killed by signal".into(),
    };
    let stopped_on_request = matches!(stop, Some(StopReason::Signal(_) | StopReason::Coordinator));
    // After a failure, the health check again: a failing one blames the node.
    let after_check = if checks_node && exit.code() != 0 && !stopped_on_request {
        let h = crate::health::run(&cfg.health);
        if let Some(h) = &h {
            journal.record(
                "health_check",
                json!({ "when": "after_failure", "result": h }),
                true,
            );
        }
        h
    } else {
        None
    };
    let verdict = failure::classify(
        &failure::RankEnd {
            exit_code: exit.code(),
            signal: match exit {
                Exit::Signal(s, _) => Some(s),
                Exit::Code(_) => None,
            },
            stalled: stall.is_some(),
            stop_requested: stopped_on_request,
            health_check_failed: after_check.as_ref().is_some_and(|h| !h.ok),
            tail: tail.last_lines(cfg.diagnostics.tail_lines.max(20)),
        },
        &cfg.failure_patterns
            .clone()
            .unwrap_or_else(failure::Patterns::defaults),
    );
    let ended = Instant::now();
    journal.record_at(
        clock.wall(ended),
        "rank_exit",
        json!({
            "exit_code": code,
            "status": exit.describe(),
            "cause": cause,
            "failed_at": clock.wall(stall_at.filter(|_| stall.is_some()).or(main_exit_at).unwrap_or(ended)),
            "class": verdict.class,
            "class_reason": verdict.reason,
            "evidence": verdict.evidence,
            "steps_seen": policy.steps_seen(),
            "last_step": policy.last_step(),
            "first_step_s": plog.first_at.map(|t| t.duration_since(launched).as_secs_f64()),
            "last_progress_s": plog.last_at.map(|t| t.duration_since(launched).as_secs_f64()),
            "runtime_s": ended.duration_since(launched).as_secs_f64(),
            "malformed_messages": faults.malformed,
            "journal_lost_records": journal.dropped(),
        }),
        true,
    );
    if code != 0 && !stopped_on_request {
        let kind = if stall.is_some() {
            "stall"
        } else if matches!(exit, Exit::Signal(..)) {
            "signal"
        } else {
            "crash"
        };
        journal.record(
            "failure",
            json!({
                "failure_kind": kind,
                "cause": cause,
                "class": verdict.class,
                "class_reason": verdict.reason,
                "evidence": verdict.evidence,
                "exit_code": code,
                "detail": match &stall { Some(s) => format!("{} after {:.1}s without progress", s.kind.name(), s.timeout.as_secs_f64()), None => exit.describe() },
            }),
            true,
        );
    }
    if let Some(l) = &link {
        // The last report, sent now: the coordinator tears the step down on it.
        outbox.update(|r| {
            r.state = RankState::Exited;
            r.exit = Some(ExitInfo {
                code,
                class: verdict.class.name().to_string(),
                cause: cause.clone(),
                evidence: verdict.evidence.clone(),
                stopped: stopped_on_request,
            });
        });
        if let Err(e) = l.send(&outbox.snapshot(), Duration::from_secs(2)).await {
            journal.record(
                "coordinator_unreachable",
                json!({ "error": e, "note": "the exit was not reported" }),
                false,
            );
        }
    }
    if batch_level {
        let tail_lines = tail.last_lines(200);
        let step = crate::supervisor::StepEnd {
            ended: chrono::Utc::now(),
            exit_code: code,
            verdict: &verdict,
            tail: &tail_lines,
            node: &id.node,
            pre_timeout: pre_timeout.is_some(),
        };
        let cli = crate::slurm::SlurmCli::default();
        // The step can run again inside the allocation (see docs/slurm.md).
        let alloc = (cfg.restart_in_allocation && !slurm.job_nodes.is_empty()).then(|| {
            crate::policy::restart::Allocation {
                nodes: slurm.job_nodes.clone(),
                excluded: step_out.as_ref().map(|o| o.0.clone()).unwrap_or_default(),
                withheld: crate::slurm::step::user_excluded_nodes(&opts.argv),
                // The step's size as launched (the journal's count of nodes
                // that started a rank can miss a node that died early).
                step_nodes: step_out
                    .as_ref()
                    .map(|o| o.1)
                    .filter(|n| *n > 0)
                    .or_else(|| crate::slurm::step::requested_nodes(&opts.argv))
                    .unwrap_or(0),
                can_exclude: crate::slurm::step::can_leave_out(&opts.argv),
            }
        });
        return Ok(crate::supervisor::after_attempt(
            &cfg.state_dir,
            &id.job,
            id.attempt,
            &step,
            cfg.max_restarts,
            alloc,
            &cli,
            &mut journal,
        ));
    }
    if single_rank_job {
        journal.record("job_end", json!({ "exit_code": code }), true);
    }
    Ok(Next::Exit(code))
}

/// SIGUSR1/SIGUSR2. In a batch script, Slurm's pre-timeout signal becomes a
/// checkpoint request: the checkpoint signal goes to srun, which delivers it
/// to every process of the step (trainers included), or straight to a
/// trainer the script runs itself. In a step, the checkpoint signal is
/// journaled as a request (Slurm delivered it to the trainer already).
/// Anything else is forwarded (or, in a step, left to Slurm's delivery).
#[allow(clippy::too_many_arguments)]
fn on_user_signal(
    sig: Signal,
    cfg: &Config,
    slurm: &crate::slurm::SlurmContext,
    batch_level: bool,
    child_is_srun: bool,
    journal: &mut Writer,
    pid: Pid,
    pre_timeout: &mut Option<(Instant, DateTime<Utc>, Instant)>,
) {
    let slurm_delivers = slurm.in_step() && !cfg.slurm_forward_signals;
    if batch_level && sig == cfg.pre_timeout_signal {
        if let Some(ck) = cfg.checkpoint_signal {
            process::signal_group(pid, ck);
        }
        journal.record(
            "checkpoint_requested",
            json!({
                "reason": "pre_timeout",
                "received": sig.as_str(),
                "sent": cfg.checkpoint_signal.map(|s| s.as_str()),
                "via_srun": child_is_srun,
            }),
            true,
        );
        if pre_timeout.is_none() {
            let now = Instant::now();
            *pre_timeout = Some((now, Utc::now(), now + cfg.checkpoint_wait));
        }
        return;
    }
    if slurm.in_step() && Some(sig) == cfg.checkpoint_signal {
        journal.record(
            "checkpoint_requested",
            json!({ "reason": "signal", "received": sig.as_str(), "sent": if slurm_delivers { None } else { Some(sig.as_str()) } }),
            true,
        );
        if !slurm_delivers {
            process::signal_group(pid, sig);
        }
        return;
    }
    forward_unless(journal, pid, sig, slurm_delivers);
}

/// Forward `sig` to the trainer's group, unless Slurm delivers it to every
/// process of the step itself (then forwarding would deliver it twice).
fn forward_unless(journal: &mut Writer, pid: Pid, sig: Signal, slurm_delivers: bool) {
    if slurm_delivers {
        journal.record(
            "signal",
            json!({ "signal": sig.as_str(), "forwarded": false, "delivered_by": "slurm" }),
            false,
        );
    } else {
        forward(journal, pid, sig);
    }
}

fn forward(journal: &mut Writer, pid: Pid, sig: Signal) {
    process::signal_group(pid, sig);
    journal.record(
        "signal",
        json!({ "signal": sig.as_str(), "forwarded": true }),
        false,
    );
}

/// Faults of the progress sources: malformed messages counted by kind, and
/// failed sources already reported (each is said once).
#[derive(Default)]
struct SourceFaults {
    malformed: BTreeMap<&'static str, u64>,
    reported: Vec<String>,
}

/// Feed every queued event to the policy and the journal, oldest first.
struct Sinks<'a> {
    policy: &'a mut StallPolicy,
    plog: &'a mut ProgressLog,
    journal: &'a mut Writer,
    clock: &'a Clock,
    faults: &'a mut SourceFaults,
    /// The report for the coordinator, when linked.
    outbox: Option<&'a Outbox>,
}

fn drain_events(tx: &progress::Sender, sinks: &mut Sinks<'_>) {
    for ev in tx.drain() {
        handle_event(ev, sinks);
    }
}

/// The kind of source, for the stall policy's phase ends.
fn origin(source: progress::Source) -> &'static str {
    Namer::of(source).map_or(source.name(), Namer::name)
}

fn handle_event(ev: Event, k: &mut Sinks<'_>) {
    let (policy, plog, journal, clock, faults) = (
        &mut *k.policy,
        &mut *k.plog,
        &mut *k.journal,
        k.clock,
        &mut *k.faults,
    );
    match ev.kind {
        Kind::Step {
            step,
            metrics,
            with_phase,
        } => {
            // A step sent with a long phase names what the phase is about
            // (`phase=checkpoint step=10`), not the trainer's step.
            let role = match with_phase.as_deref().map(|p| policy.config().classify(p)) {
                Some(PhaseClass::Long(_)) => StepRole::Annotation,
                _ => StepRole::Report,
            };
            let o = plog.tracker.on_step(ev.source, step, role);
            if let Some((from, to)) = o.namer_changed {
                journal.record_at(
                    clock.wall(ev.at),
                    "progress_source",
                    json!({
                        "steps_from": to.name(),
                        "before": from.map(|f| f.name()),
                        "reason": match to {
                            Namer::Socket => "the trainer reports its steps on RESILIO_SOCKET: they name the step; numbers in its output still count as progress",
                            Namer::Output => "steps read from the trainer's output name the step",
                            Namer::File => "the progress file names the step until the output or the socket does",
                        },
                    }),
                    false,
                );
            }
            let sent_compute = metrics.iter().any(|(k, _)| k == "compute_s");
            if sent_compute {
                plog.tracker.on_compute_metric();
            }
            if !o.alive && !sent_compute {
                return;
            }
            let prev = plog.last_named_at;
            if o.alive {
                policy.on_progress(ev.at, o.step, o.named_advanced, origin(ev.source));
            }
            if let Some(out) = k.outbox {
                // compute_s may come on the socket after the same step was
                // read from the output: counted once per step either way.
                let compute = metrics
                    .iter()
                    .find(|(k, _)| k == "compute_s")
                    .map(|(_, v)| *v)
                    .filter(|c| c.is_finite() && *c >= 0.0)
                    .filter(|_| out.take_compute_step(step));
                let last = policy.last_step();
                let stepped = o.named_advanced;
                let long = matches!(policy.phase(), Phase::Named(..));
                out.update(|r| {
                    if o.alive {
                        if r.state == RankState::Starting {
                            r.state = RankState::Running;
                        }
                        r.silent = false;
                        r.step = last;
                        r.long_phase = long;
                    }
                    if stepped {
                        if let Some(p) = prev {
                            r.intervals.0 += 1;
                            r.intervals.1 += ev.at.saturating_duration_since(p).as_secs_f64();
                        }
                    }
                    if let Some(c) = compute {
                        r.compute.0 += 1;
                        r.compute.1 += c;
                    }
                });
                if o.alive {
                    *out.last_step_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(ev.at);
                }
            }
            if o.named_advanced {
                plog.last_named_at = Some(ev.at);
            }
            if o.alive {
                plog.observe(
                    journal,
                    clock,
                    Observed {
                        at: ev.at,
                        step: o.step,
                        source: ev.source.name(),
                        metrics,
                    },
                );
            }
        }
        Kind::Phase { name, step } => {
            let before = policy.phase().clone();
            let class = policy.on_phase(ev.at, &name, step, origin(ev.source));
            match class {
                PhaseClass::InStep { known } => {
                    if !known && !plog.unknown_phases.contains(&name) {
                        eprintln!(
                            "resilio: phase '{name}' is not a known phase: judged by the step limit; declare it in [stall] in_step_phases, or give it a limit of its own in [stall.phase_timeouts]"
                        );
                        journal.record_at(
                            clock.wall(ev.at),
                            "unknown_phase",
                            json!({ "phase": name, "judged_as": "inside a step", "config": ["stall.in_step_phases", "stall.phase_timeouts"] }),
                            false,
                        );
                        plog.unknown_phases.push(name.clone());
                    }
                    if let Some(c) = plog.tracker.on_in_step_phase(ev.at, &name) {
                        if let Some(out) = k.outbox {
                            out.update(|r| {
                                r.compute.0 += 1;
                                r.compute.1 += c;
                            });
                        }
                    }
                }
                PhaseClass::Train | PhaseClass::Long(_) => plog.tracker.on_other_phase(),
            }
            if let Some(out) = k.outbox {
                let shown = match class {
                    PhaseClass::InStep { .. } => name.clone(),
                    _ => policy.phase().name().to_string(),
                };
                let long = matches!(policy.phase(), Phase::Named(..));
                out.update(|r| {
                    r.phase = shown;
                    r.long_phase = long;
                });
            }
            if policy.phase() != &before {
                if policy.phase().name() == "checkpoint" {
                    plog.checkpoint_began = Some((ev.at, step.max(policy.last_step())));
                }
                journal.record_at(
                    clock.wall(ev.at),
                    "phase",
                    json!({ "phase": policy.phase().name(), "source": ev.source.name(), "step": step.max(policy.last_step()) }),
                    false,
                );
            }
        }
        Kind::CheckpointDone { step } => {
            // Its duration, and whether training went on meanwhile (an
            // asynchronous save) or waited for it.
            let began = plog.checkpoint_began.take();
            journal.record_at(
                clock.wall(ev.at),
                "checkpoint_done",
                json!({
                    "step": step, "source": ev.source.name(),
                    "duration_s": began.map(|(t, _)| ev.at.saturating_duration_since(t).as_secs_f64()),
                    "blocked_training": began.map(|(_, at_step)| policy.last_step() <= at_step),
                }),
                true,
            );
            if policy.phase().name() == "checkpoint" {
                policy.on_phase(ev.at, "train", None, origin(ev.source));
            }
            if let (Some(o), Some(s)) = (k.outbox, step) {
                o.update(|r| {
                    r.phase = policy.phase().name().to_string();
                    r.long_phase = matches!(policy.phase(), Phase::Named(..));
                    r.checkpoints.push(s);
                    if r.checkpoints.len() > 16 {
                        r.checkpoints.remove(0);
                    }
                });
                o.urgent.notify_one();
            }
        }
        Kind::Malformed { fault, sample } => {
            let n = faults.malformed.entry(fault).or_insert(0);
            *n += 1;
            if *n == 1 {
                eprintln!(
                    "resilio: ignoring malformed progress message ({fault}): {sample:?}; further ones of this kind are only counted"
                );
                journal.record(
                    "malformed_message",
                    json!({ "fault": fault, "sample": sample }),
                    false,
                );
            }
        }
        Kind::SourceFailed(msg) => {
            if !faults.reported.contains(&msg) {
                eprintln!("resilio: {msg}; supervision continues without it");
                journal.record("monitor_error", json!({ "error": msg }), false);
                faults.reported.push(msg);
            }
        }
    }
}

fn on_stall(
    s: &Stall,
    policy: &StallPolicy,
    plog: &mut ProgressLog,
    journal: &mut Writer,
    clock: &Clock,
    id: &Identity,
    now: Instant,
) {
    plog.flush(journal, clock);
    let idle = now.duration_since(s.since);
    journal.record_at(
        clock.wall(now),
        "stall",
        json!({
            "stall_kind": s.kind.name(),
            "phase": policy.phase().name(),
            "timeout_s": s.timeout.as_secs_f64(),
            "idle_s": idle.as_secs_f64(),
            "since": clock.wall(s.since),
            "last_step": s.last_step,
            "last_progress": plog.last_at.map(|t| clock.wall(t)),
        }),
        true,
    );
    let what = match s.last_step {
        Some(step) => format!("no progress since step {step}"),
        None => "no first step".to_string(),
    };
    eprintln!(
        "resilio: rank {} on {} stalled: {what} for {} (limit {}, {}); gathering diagnostics, then stopping it",
        id.rank,
        id.node,
        crate::duration::format(idle),
        crate::duration::format(s.timeout),
        s.kind.name()
    );
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = s.len() - max;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    format!("...{}", &s[cut..])
}

fn truncate_lines(lines: &[String], max_total: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut total = 0;
    for l in lines.iter().rev() {
        let l = truncate(l, 300);
        total += l.len();
        if total > max_total {
            break;
        }
        out.push(l);
    }
    out.reverse();
    out
}

fn write_diag_file(
    dir: &std::path::Path,
    id: &Identity,
    tail: &[String],
    d: &diagnostics::Diagnostics,
) -> Option<PathBuf> {
    use std::fmt::Write as _;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "resilio stall diagnostics: job {} attempt {} rank {} node {}",
        id.job, id.attempt, id.rank, id.node
    );
    let _ = writeln!(text, "\n== last {} lines of output ==", tail.len());
    for l in tail {
        let _ = writeln!(text, "{l}");
    }
    for p in &d.py_spy {
        let _ = writeln!(
            text,
            "\n== py-spy dump --pid {} ({}) ==\n{}",
            p.pid,
            if p.ok { "ok" } else { "failed" },
            p.output
        );
    }
    if let Some(why) = &d.py_spy_skipped {
        let _ = writeln!(text, "\n== py-spy not run: {why} ==");
    }
    std::fs::create_dir_all(dir).ok()?;
    let name = format!(
        "stall-a{}-r{}-{}.txt",
        id.attempt,
        id.rank,
        Utc::now().format("%Y%m%dT%H%M%S%.3fZ")
    );
    let path = dir.join(name);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).ok()?;
    std::fs::rename(&tmp, &path).ok()?;
    Some(path)
}

/// Replace the control file whole (temporary file, then rename), so the
/// trainer never reads half a request.
fn write_control(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("ctl.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Stop a stalled rank: SIGTERM to its whole tree (KILL follows after the grace).
fn stop_stalled(journal: &mut Writer, pid: Pid, skip: &[i32], grace: Duration) {
    process::signal_tree(pid, Signal::SIGTERM, skip);
    journal.record(
        "stop",
        json!({ "reason": "stall", "signal": "SIGTERM", "grace_s": grace.as_secs_f64() }),
        false,
    );
}
