//! Setting a rank up, in this order: identity and journal, the
//! coordinator (hosted or found), signal handlers, the progress socket, the
//! trainer's environment, the checks before the start (health, node
//! history), the trainer itself, and the sources that watch it.

use super::progress_log::Clock;
use super::records::{job_end, spawn_failed};
use super::sources::progress_socket;
use super::Next;
use crate::config::Config;
use crate::context::{env_is_set, Identity};
use crate::coordinator::client::{Link, Note, Outbox, Target};
use crate::coordinator::{Advice, Coordinator};
use crate::error::{Error, Result};
use crate::event as ev;
use crate::journal::{self, Writer};
use crate::policy::failure;
use crate::process;
use crate::progress::{self, output};
use crate::slurm::step::Relaunch;
use crate::slurm::{Slurm, SlurmContext};
use chrono::Utc;
use nix::unistd::Pid;
use serde_json::json;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

/// The rank as set up, its trainer running.
pub(crate) struct Rank {
    pub cfg: Config,
    /// The command as given (before nodes were left out of it).
    pub argv: Vec<OsString>,
    pub id: Identity,
    pub slurm: SlurmContext,
    pub clock: Clock,
    pub job_dir: PathBuf,
    /// The job-level supervisor in a batch script.
    pub batch_level: bool,
    /// This agent records the job's start and end (no launcher does).
    pub single_rank_job: bool,
    /// This agent runs the node's health check (local rank 0, not batch level).
    pub checks_node: bool,
    pub journal: Writer,
    pub hosted: Option<Coordinator>,
    pub advice: Option<Advice>,
    pub outbox: Arc<Outbox>,
    pub link: Option<Link>,
    pub tx: progress::Sender,
    pub socket_ok: bool,
    pub sock_path: PathBuf,
    /// Coordinated checkpoint requests reach the trainer through this file.
    pub control_path: PathBuf,
    /// Nodes left out of the step, and the step's size then.
    pub step_out: Option<(Vec<String>, u32)>,
    pub pid: Pid,
    pub launched: Instant,
    pub tail: Arc<output::Tail>,
    pub pumps: Vec<std::thread::JoinHandle<()>>,
    pub file_watch: Option<progress::file::WatchHandle>,
    pub ckpt_watch: Option<progress::checkpoint_dir::DirWatch>,
}

/// What the loop waits on besides the progress queue.
pub(crate) struct Inputs {
    pub signals: process::Signals,
    pub notes: UnboundedReceiver<Note>,
}

/// Set up the rank and start its trainer, or end early (an unhealthy node,
/// a requeue at the start).
pub(crate) enum Setup {
    Ready(Box<Rank>, Inputs),
    Done(Next),
}

/// Identity, Slurm context, journal.
struct Base {
    clock: Clock,
    id: Identity,
    slurm: SlurmContext,
    job_dir: PathBuf,
    batch_level: bool,
    relaunched: Option<Relaunch>,
    /// The journal as this allocation found it (batch level).
    earlier: Vec<journal::Record>,
    journal: Writer,
    single_rank_job: bool,
}

fn base(cfg: &Config, job_id: Option<&str>) -> Result<Base> {
    let mut id = Identity::from_env(job_id).map_err(Error::Usage)?;
    let t0 = Instant::now();
    let clock = Clock {
        t0,
        wall0: crate::util::clock::at(t0),
    };
    // A malformed SLURM_* environment is Slurm's problem, not a reason to
    // refuse to run the trainer: warn and go on without the Slurm context.
    let slurm = SlurmContext::from_env().unwrap_or_else(|e| {
        tracing::warn!("ignoring the Slurm environment: {e}");
        SlurmContext::default()
    });
    let job_dir = journal::job_dir(&cfg.state_dir, &id.job);
    // In a batch script (in the job, not a task of a step), resilio is the
    // job-level supervisor: it wraps the steps, and decides after them.
    let batch_level = slurm.in_batch_script();
    // Attempts count steps: a relaunch inside the allocation hands its
    // attempt over; a fresh allocation continues after the journal's.
    let mut relaunched: Option<Relaunch> = None;
    let mut earlier: Vec<journal::Record> = Vec::new();
    if batch_level {
        earlier = journal::read_job(&job_dir)
            .map(|j| crate::runs::of_key(j.records, id.run.key.as_deref()))
            .unwrap_or_default();
        if let Ok(text) = std::env::var(crate::slurm::step::ENV_RELAUNCH) {
            match Relaunch::parse(&text) {
                Ok(r) => relaunched = Some(r),
                Err(e) => tracing::warn!("ignoring {e}"),
            }
        }
        id.attempt = match &relaunched {
            Some(r) => r.attempt,
            None => crate::job::batch::first_attempt_of_allocation(&earlier, slurm.restart_count),
        };
    }
    let mut journal = open_journal(&job_dir, &id, &slurm, batch_level);
    journal.set_run(id.run.key.as_deref());
    if id.run.fresh && id.rank == 0 && relaunched.is_none() {
        crate::runs::warn_if_reused(&job_dir, &id.job, id.run.key.as_deref());
    }
    // The local launcher records the job's start and end itself.
    let single_rank_job = batch_level
        || (id.world_size == 1
            && !env_is_set(crate::coordinator::ENV_URL)
            && !env_is_set(crate::context::ENV_LAUNCHER));
    Ok(Base {
        clock,
        id,
        slurm,
        job_dir,
        batch_level,
        relaunched,
        earlier,
        journal,
        single_rank_job,
    })
}

fn open_journal(job_dir: &Path, id: &Identity, slurm: &SlurmContext, batch_level: bool) -> Writer {
    if batch_level {
        return Writer::open(
            job_dir,
            "batch.jsonl",
            id.attempt,
            None,
            Some(id.node.clone()),
        );
    }
    // One file per writer: a second concurrent step of the same job
    // (a monitor next to the training step) gets files of its own.
    let name = match slurm.step_id.as_deref() {
        Some(step) if step != "0" && slurm.in_step() => {
            format!("step{step}-rank-{}.jsonl", id.rank)
        }
        _ => format!("rank-{}.jsonl", id.rank),
    };
    Writer::open(
        job_dir,
        &name,
        id.attempt,
        Some(id.rank),
        Some(id.node.clone()),
    )
}

/// The coordinator: from the environment (the local launcher's, or the
/// batch-level one's), hosted here (batch level; rank 0 of a step nobody
/// else coordinates), or found from the job's files (the other ranks).
fn coordinator(
    cfg: &Config,
    b: &Base,
    advice: &mut Option<Advice>,
    monitor_errors: &mut Vec<String>,
) -> (Option<Coordinator>, Option<Target>) {
    if !cfg.coordinator.enabled {
        return (None, None);
    }
    let from_env = std::env::var(crate::coordinator::ENV_URL)
        .ok()
        .zip(std::env::var(crate::coordinator::ENV_TOKEN).ok())
        .filter(|(u, t)| !u.is_empty() && !t.is_empty());
    let multi_rank_step = b.slurm.in_step() && b.id.world_size > 1;
    if let Some((url, token)) = from_env {
        (None, Some(Target::Known { url, token }))
    } else if b.batch_level || (multi_rank_step && b.id.rank == 0) {
        match host_coordinator(cfg, b) {
            Ok(c) => {
                // `checkpoint_every = "advised"`: from the journal so
                // far, and again every few minutes (see the loop).
                if let Some(a) = advice.as_mut() {
                    a.poll(&c, Instant::now());
                }
                let target = (!b.batch_level).then(|| Target::Known {
                    url: c.url.clone(),
                    token: c.token.clone(),
                });
                (Some(c), target)
            }
            Err(e) => {
                monitor_errors.push(format!("coordinator: {e}"));
                (None, None)
            }
        }
    } else if multi_rank_step {
        (None, Some(Target::Files(b.job_dir.clone())))
    } else {
        (None, None)
    }
}

fn host_coordinator(cfg: &Config, b: &Base) -> std::io::Result<Coordinator> {
    let id = &b.id;
    let world = if b.batch_level {
        b.slurm.ntasks.unwrap_or(1)
    } else {
        id.world_size
    };
    let mut policy = cfg.coordinator.policy.clone();
    policy.observe = cfg.observe;
    policy.busy_limit = cfg.stall.eval_timeout;
    let mut view =
        crate::coordinator::state::JobView::new(&id.job, world, id.attempt, policy, Instant::now());
    // Stragglers flagged before this attempt: confirmation across restarts.
    if b.batch_level {
        view.seed_from_journal(&b.earlier);
    } else if id.attempt > 0 {
        if let Ok(j) = journal::read_job(&b.job_dir) {
            view.seed_from_journal(&crate::runs::of_key(j.records, id.run.key.as_deref()));
        }
    }
    if let Some(r) = &b.relaunched {
        let ago = (Utc::now().timestamp_micros() - r.failed_at_us).max(0) as u64;
        let at = Instant::now()
            .checked_sub(Duration::from_micros(ago))
            .unwrap_or_else(Instant::now);
        let restarts = b.earlier.iter().filter(|r| r.kind == "restart").count() as u32;
        view.resume_after_failure(at, restarts);
    }
    crate::coordinator::bind_address(&cfg.coordinator.bind, b.slurm.in_job())
        .map_err(std::io::Error::other)
        .and_then(|bind| {
            let w = Writer::open(
                &b.job_dir,
                "coordinator.jsonl",
                id.attempt,
                None,
                Some(id.node.clone()),
            )
            .with_run(id.run.key.as_deref());
            let mut c = Coordinator::start(view, bind, w, Some(&b.job_dir))?;
            if cfg.coordinator.site_metrics && b.slurm.in_job() {
                if let Err(e) = c.serve_site_metrics(&cfg.state_dir, &id.job, &id.node) {
                    tracing::warn!("no read-only metrics listener for the site: {e}");
                }
            }
            Ok(c)
        })
}

/// The coordinator's link and the report it carries; the hosted
/// coordinator and its checkpoint advice.
fn connect(cfg: &Config, b: &Base, monitor_errors: &mut Vec<String>) -> Linked {
    let mut advice = cfg.coordinator.policy.checkpoint_advised.then(|| {
        Advice::new(Arc::new(crate::analysis::advice::JournalAdvice::new(
            &cfg.state_dir,
            &b.id.job,
        )))
    });
    let (hosted, target) = coordinator(cfg, b, &mut advice, monitor_errors);
    let outbox = Arc::new(Outbox::default());
    let (notes_tx, notes_rx) = tokio::sync::mpsc::unbounded_channel::<Note>();
    let link = target.map(|t| Link::new(t, cfg.coordinator.report_interval));
    if let Some(l) = &link {
        outbox.update(|r| {
            r.v = crate::coordinator::protocol::VERSION;
            r.rank = b.id.rank;
            r.node = b.id.node.clone();
            r.attempt = b.id.attempt;
            r.phase = "train".into();
        });
        l.spawn(outbox.clone(), notes_tx.clone());
    }
    drop(notes_tx);
    Linked {
        hosted,
        advice,
        outbox,
        link,
        notes: notes_rx,
    }
}

struct Linked {
    hosted: Option<Coordinator>,
    advice: Option<Advice>,
    outbox: Arc<Outbox>,
    link: Option<Link>,
    notes: UnboundedReceiver<Note>,
}

/// Signals are registered before the child exists so none is lost; then
/// resilio becomes the child subreaper (orphans of the trainer are its to reap).
fn signals(notes: UnboundedReceiver<Note>, monitor_errors: &mut Vec<String>) -> Result<Inputs> {
    let inputs = Inputs {
        signals: process::Signals::install()?,
        notes,
    };
    if let Err(e) = process::set_subreaper() {
        monitor_errors.push(format!("cannot become child subreaper: {e}"));
    }
    Ok(inputs)
}

/// Variables for the trainer's environment.
type Env = Vec<(OsString, OsString)>;

/// The trainer's environment, and the torchrun variables among it.
fn trainer_env(
    cfg: &Config,
    b: &Base,
    hosted: Option<&Coordinator>,
    socket: Option<&Path>,
    control: Option<&Path>,
) -> (Env, Vec<(&'static str, String)>) {
    let mut env: Vec<(OsString, OsString)> =
        b.id.exported()
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
    env.push(("RESILIO_STATE_DIR".into(), cfg.state_dir.clone().into()));
    if let Some(s) = socket {
        env.push(("RESILIO_SOCKET".into(), s.into()));
    }
    // Coordinated checkpoint requests reach the trainer through this file
    // (`checkpoint id=N step=S reason=R`, replaced whole); see docs/coordinator.md.
    if let Some(c) = control {
        env.push(("RESILIO_CONTROL".into(), c.into()));
    }
    if let Some(c) = hosted.filter(|_| b.batch_level) {
        for (k, v) in c.env() {
            env.push((k.into(), v.into()));
        }
    }
    if b.batch_level {
        // The job level decides after the steps: their agents do not.
        // Its value, the state dir, keeps the ranks' journals with this
        // one whatever the script exports later.
        env.push((
            crate::job::step_level::ENV_JOB_LEVEL.into(),
            std::path::absolute(&cfg.state_dir)
                .unwrap_or_else(|_| cfg.state_dir.clone())
                .into(),
        ));
    }
    // A rollback the decision left for this attempt (`[numerical]`): the
    // checkpoint to restart from and the steps whose data to skip.
    if let Some(rb) =
        crate::journal::rollback_for(&b.job_dir, b.id.attempt).filter(|_| !b.batch_level)
    {
        if let Some(s) = rb.checkpoint_step {
            env.push(("RESILIO_ROLLBACK_STEP".into(), s.to_string().into()));
        }
        if let Some(s) = rb.skip_steps() {
            env.push(("RESILIO_SKIP_STEPS".into(), s.into()));
        }
    }
    if cfg.progress.python_unbuffered && !env_is_set("PYTHONUNBUFFERED") {
        env.push(("PYTHONUNBUFFERED".into(), "1".into()));
    }
    let torchrun =
        crate::slurm::env::trainer_env(&b.slurm, &b.id.job, b.id.attempt, &|k| env_is_set(k));
    env.extend(
        torchrun
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    (env, torchrun)
}

/// Set the rank up and start the trainer.
pub(crate) fn setup(
    cfg: Config,
    argv: Vec<OsString>,
    job_id: Option<&str>,
    slurm_cli: &dyn Slurm,
) -> Result<Setup> {
    let mut b = base(&cfg, job_id)?;
    let mut monitor_errors: Vec<String> = Vec::new();
    let Linked {
        hosted,
        advice,
        outbox,
        link,
        notes,
    } = connect(&cfg, &b, &mut monitor_errors);
    let inputs = signals(notes, &mut monitor_errors)?;
    let tx = progress::Sender::new();
    let (sock_path, socket_ok) = progress_socket(&b.id, &tx, &mut monitor_errors);
    let control_path = sock_path.with_extension("ctl");
    let (env, torchrun) = trainer_env(
        &cfg,
        &b,
        hosted.as_ref(),
        socket_ok.then_some(sock_path.as_path()),
        link.is_some().then_some(control_path.as_path()),
    );
    let remove_socket = || {
        if socket_ok {
            let _ = std::fs::remove_file(&sock_path);
        }
    };
    let checks_node = !b.batch_level && b.slurm.localid.unwrap_or(0) == 0;
    if let Some(code) = before_start(&cfg, &mut b, checks_node, slurm_cli) {
        return Ok(Setup::Done(Next::Exit(code)));
    }
    let relaunch = b.relaunched.is_some();
    if b.batch_level && !relaunch {
        warn_about_spares(&cfg, &mut b, &argv, slurm_cli);
    }
    let step_out = match leave_out(&cfg, &mut b, &argv, slurm_cli) {
        Ok(out) => out,
        Err(next) => {
            remove_socket();
            return Ok(Setup::Done(next));
        }
    };
    let Base {
        clock,
        id,
        slurm,
        job_dir,
        batch_level,
        mut journal,
        single_rank_job,
        ..
    } = b;
    let mut run_argv = step_argv(&argv, &step_out, &mut journal);
    if relaunch {
        run_argv = crate::slurm::step::overlapping(&run_argv);
    }
    let argv_text = text_of(&argv);
    let guarded = batch_level && crate::job::guardian::guarded();
    let spawned = match process::spawn(&run_argv, &env, guarded) {
        Ok(s) => s,
        Err(e) => {
            spawn_failed(&mut journal, &e, &argv_text, single_rank_job);
            remove_socket();
            return Err(e);
        }
    };
    let launched = Instant::now();
    if guarded {
        use std::os::fd::AsFd;
        let step = crate::job::guardian::Handoff {
            step_pid: spawned.pid.as_raw(),
            job: id.job.clone(),
            attempt: id.attempt,
            job_dir: job_dir.clone(),
            node: id.node.clone(),
            run: id.run.key.clone(),
            coordinator: hosted.as_ref().map(|_| crate::job::guardian::Rehost {
                job: id.job.clone(),
                world_size: id.world_size,
                state_dir: cfg.state_dir.clone(),
                config: cfg.user_file.clone(),
            }),
        };
        crate::job::guardian::hand_over(&step, spawned.stdout.as_fd(), spawned.stderr.as_fd());
    }
    outbox.update(|r| r.pid = spawned.pid.as_raw() as u32);
    let mut rank = Rank {
        clock,
        pid: spawned.pid,
        launched,
        tail: output::Tail::new(64 * 1024),
        pumps: Vec::new(),
        file_watch: None,
        ckpt_watch: None,
        cfg,
        argv,
        id,
        slurm,
        job_dir,
        batch_level,
        single_rank_job,
        checks_node,
        journal,
        hosted,
        advice,
        outbox,
        link,
        tx,
        socket_ok,
        sock_path,
        control_path,
        step_out,
    };
    let file_mode = rank.watch(spawned.stdout, spawned.stderr, &mut monitor_errors);
    rank.rank_start(&argv_text, file_mode, &torchrun);
    rank.monitor_errors(&monitor_errors);
    Ok(Setup::Ready(Box::new(rank), inputs))
}

fn text_of(argv: &[OsString]) -> Vec<String> {
    argv.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// `job_start` (when this agent owns the job), the reconciliation of
/// undecided attempts (batch level), and the node's health check before
/// the trainer. `Some(code)`: the node is unhealthy, the trainer not started.
fn before_start(
    cfg: &Config,
    b: &mut Base,
    checks_node: bool,
    slurm_cli: &dyn Slurm,
) -> Option<i32> {
    let (id, journal) = (&b.id, &mut b.journal);
    if b.single_rank_job {
        let start = ev::JobStart {
            world_size: Some(id.world_size),
            mode: Some(if b.batch_level { "batch" } else { "single" }.into()),
            allocation: b.batch_level.then_some(b.slurm.restart_count),
            relaunch_in_allocation: b
                .relaunched
                .as_ref()
                .filter(|_| b.batch_level)
                .map(|r| json!({ "exclude": r.exclude, "nodes": r.nodes })),
            ..Default::default()
        };
        // Durable at batch level: it maps the allocation to its attempts.
        journal.write(start, b.batch_level);
    }
    if b.batch_level && b.relaunched.is_none() {
        crate::job::batch::reconcile_previous(
            &b.earlier,
            &id.job,
            b.slurm.restart_count,
            slurm_cli,
            journal,
        );
    }
    // The site health check, once per node (local rank 0), before the trainer.
    if !checks_node {
        return None;
    }
    let h = crate::rank::health::run(&cfg.health)?;
    journal.write(
        ev::HealthCheck {
            when: Some("before_start".into()),
            result: serde_json::to_value(&h).ok(),
        },
        true,
    );
    if h.ok {
        return None;
    }
    let code = crate::rank::health::EXIT_UNHEALTHY;
    let evidence = format!(
        "health check failed ({}): {}",
        h.status,
        h.output.lines().next().unwrap_or("")
    );
    tracing::warn!("{evidence}; not starting the trainer on {}", id.node);
    journal.write(
        ev::RankExit {
            exit_code: Some(code),
            cause: Some("unhealthy node".into()),
            class: Some(failure::Class::Infrastructure),
            class_reason: Some("the node's health check failed".into()),
            evidence: Some(evidence.clone()),
            ..Default::default()
        },
        true,
    );
    journal.write(
        ev::Failure {
            failure_kind: Some("health_check".into()),
            class: Some(failure::Class::Infrastructure),
            cause: Some("health check failed".into()),
            evidence: Some(evidence),
            exit_code: Some(code),
            ..Default::default()
        },
        true,
    );
    if b.single_rank_job {
        journal.write(job_end(code), true);
    }
    Some(code)
}

/// Nodes left out of the step: by a relaunch inside the allocation (the
/// blamed ones), or at the start from the node history (`[nodes]`).
/// `Err`: the job was requeued instead.
fn leave_out(
    cfg: &Config,
    b: &mut Base,
    argv: &[OsString],
    slurm_cli: &dyn Slurm,
) -> std::result::Result<Option<(Vec<String>, u32)>, Next> {
    let mut step_out = b.relaunched.as_ref().map(|r| (r.exclude.clone(), r.nodes));
    if b.batch_level && b.relaunched.is_none() && cfg.nodes.exclude_at_start {
        let (history, _) = crate::analysis::node_history::build(
            &cfg.state_dir,
            Utc::now(),
            cfg.nodes.half_life,
            Some(slurm_cli),
        );
        // `earlier`: the journal as this allocation found it (read once above).
        match crate::job::batch::history_at_start(
            &history,
            cfg.nodes.threshold,
            &b.id.job,
            &b.slurm.job_nodes,
            argv,
            &b.earlier,
            slurm_cli,
            &mut b.journal,
        ) {
            crate::job::batch::AtStart::Run => {}
            crate::job::batch::AtStart::LeaveOut { exclude, nodes } => {
                step_out = Some((exclude, nodes));
            }
            crate::job::batch::AtStart::Requeued => return Err(Next::Exit(0)),
        }
    }
    b.earlier = Vec::new();
    Ok(step_out)
}

/// At an allocation's start: spare nodes that cannot replace a dead one.
fn warn_about_spares(cfg: &Config, b: &mut Base, argv: &[OsString], slurm_cli: &dyn Slurm) {
    let step_nodes = crate::slurm::step::requested_nodes(argv);
    let relaunch_here = cfg.restart_in_allocation && crate::slurm::step::can_leave_out(argv);
    if !relaunch_here || step_nodes.is_none_or(|n| b.slurm.job_nodes.len() <= n as usize) {
        return;
    }
    let script = b
        .slurm
        .job_id
        .as_deref()
        .and_then(|j| slurm_cli.batch_script(j).ok());
    let env_no_kill = std::env::var_os("SBATCH_NO_KILL").is_some_and(|v| !v.is_empty());
    if let Some(w) = crate::slurm::step::spares_without_no_kill(
        b.slurm.job_nodes.len(),
        step_nodes,
        relaunch_here,
        script.as_deref(),
        env_no_kill,
    ) {
        tracing::warn!("{w}");
        b.journal.write(ev::SetupWarning { warning: Some(w) }, true);
    }
}

/// The command to run: as given, or with the nodes left out.
fn step_argv(
    argv: &[OsString],
    step_out: &Option<(Vec<String>, u32)>,
    journal: &mut Writer,
) -> Vec<OsString> {
    match step_out {
        Some((exclude, nodes)) => crate::slurm::step::leave_out(argv, exclude, *nodes)
            .unwrap_or_else(|| {
                journal.write(
                    ev::MonitorError {
                        error: Some(
                            "the step command cannot leave nodes out; run as it was".into(),
                        ),
                    },
                    false,
                );
                argv.to_vec()
            }),
        None => argv.to_vec(),
    }
}

impl Rank {
    /// What supervision goes on without, said once at the start.
    fn monitor_errors(&mut self, errors: &[String]) {
        for e in errors {
            tracing::warn!("{e}; supervision continues without it");
            self.journal.write(
                ev::MonitorError {
                    error: Some(e.clone()),
                },
                false,
            );
        }
    }

    /// The `rank_start` record (rank 0's carries `[throughput]`).
    fn rank_start(
        &mut self,
        argv_text: &[String],
        file_mode: Option<String>,
        torchrun: &[(&'static str, String)],
    ) {
        let (cfg, slurm) = (&self.cfg, &self.slurm);
        let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
        let start = ev::RankStart {
            pid: Some(self.pid.as_raw()),
            argv: Some(argv_text.to_vec()),
            cwd: std::env::current_dir().ok().map(|d| path(&d)),
            world_size: Some(self.id.world_size),
            startup_timeout_s: Some(cfg.stall.startup_timeout.as_secs_f64()),
            stall_timeout_s: cfg.stall.fixed_timeout.map(|d| d.as_secs_f64()),
            stall_mode: Some(
                if cfg.stall.fixed_timeout.is_some() {
                    "fixed"
                } else {
                    "adaptive"
                }
                .into(),
            ),
            socket: self.socket_ok.then(|| path(&self.sock_path)),
            progress_file: cfg.progress.file.as_deref().map(path),
            progress_file_watch: file_mode,
            slurm_step: slurm.step_id.clone(),
            step_nodes: (!slurm.step_nodes.is_empty())
                .then(|| crate::slurm::hostlist::compress(&slurm.step_nodes)),
            torchrun_env: Some(
                torchrun
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
            ),
            ..Default::default()
        };
        let start = if self.id.rank == 0 {
            with_throughput(start, &cfg.throughput)
        } else {
            start
        };
        self.journal
            .write_at(self.clock.wall(self.launched), start, true);
    }
}

/// Rank 0's `rank_start` with the run's `[throughput]` settings, the peak
/// looked up from the GPU's name when asked (`peak_tflops = "auto"`; no
/// nvidia-smi or an unknown device: no peak).
fn with_throughput(mut start: ev::RankStart, t: &crate::config::ThroughputConfig) -> ev::RankStart {
    use crate::config::Peak;
    start.tokens_per_step = (t.tokens_per_step > 0).then_some(t.tokens_per_step as f64);
    start.flops_per_token = if t.flops_per_token > 0.0 {
        Some(t.flops_per_token)
    } else {
        (t.parameters > 0.0).then_some(6.0 * t.parameters)
    };
    start.seq_len = (t.seq_len > 0).then_some(t.seq_len);
    start.devices_per_rank = (t.devices_per_rank != 1).then_some(t.devices_per_rank);
    match t.peak_tflops {
        Peak::Tflops(v) => start.peak_tflops = Some(v),
        Peak::Off => {}
        Peak::Auto => {
            if let Some(name) = crate::device::gpu_name() {
                start.peak_tflops = crate::device::peak_tflops(&name);
                start.device = Some(name);
            }
        }
    }
    start
}
