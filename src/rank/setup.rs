//! Setting a rank up, in this order: identity and journal, the
//! coordinator (hosted or found), signal handlers, the progress socket, the
//! trainer's environment, the checks before the start (health, node
//! history), the trainer itself, and the sources that watch it.

use super::progress_log::Clock;
use super::records::{job_end, spawn_failed};
use super::sources::progress_socket;
use super::supervised::{Inputs, Rank};
use crate::config::Config;
use crate::context::{env_is_set, Identity};
use crate::coordinator::client::{Link, Note, Outbox, Target};
use crate::coordinator::{Coordinator, IntervalAdvisor};
use crate::error::{Error, Result};
use crate::event as ev;
use crate::journal::{self, Writer};
use crate::policy::failure;
use crate::process;
use crate::progress::{self, output};
use crate::slurm::SlurmContext;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// Set the agent up and start its child, or end early with an exit code
/// (an unhealthy node; at the job level, a requeue at the start).
pub(crate) enum Setup {
    Ready(Box<Rank>, Inputs),
    Done(i32),
}

/// Who this process is: identity, Slurm context, the job's directory.
pub(crate) struct Who {
    pub clock: Clock,
    pub id: Identity,
    pub slurm: SlurmContext,
    pub job_dir: PathBuf,
}

impl Who {
    pub(crate) fn from_env(cfg: &Config, job_id: Option<&str>) -> Result<Who> {
        let id = Identity::from_env(job_id).map_err(Error::Usage)?;
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
        Ok(Who {
            clock,
            id,
            slurm,
            job_dir,
        })
    }

    /// Who, writing `journal`; a fresh run's first writer warns when the
    /// job's directory already holds another run.
    pub(crate) fn writing(self, mut journal: Writer, owns_job: bool, first: bool) -> Base {
        let id = self.id;
        journal.set_run(id.run.key.as_deref());
        if id.run.fresh && id.rank == 0 && first {
            crate::runs::starting_fresh(&self.job_dir, &id.job, id.run.key.as_deref());
        }
        Base {
            clock: self.clock,
            id,
            slurm: self.slurm,
            job_dir: self.job_dir,
            journal,
            owns_job,
        }
    }
}

/// Who this process is, and the journal it writes.
pub(crate) struct Base {
    pub clock: Clock,
    pub id: Identity,
    pub slurm: SlurmContext,
    pub job_dir: PathBuf,
    pub journal: Writer,
    /// This process records the job's start and end.
    pub owns_job: bool,
}

/// A rank's identity and journal. One file per writer: a second concurrent
/// step of the same job (a monitor next to the training step) gets files
/// of its own.
fn rank_base(cfg: &Config, job_id: Option<&str>) -> Result<Base> {
    let who = Who::from_env(cfg, job_id)?;
    let (id, slurm) = (&who.id, &who.slurm);
    let name = match slurm.step_id.as_deref() {
        Some(step) if step != "0" && slurm.in_step() => {
            format!("step{step}-rank-{}.jsonl", id.rank)
        }
        _ => format!("rank-{}.jsonl", id.rank),
    };
    let journal = Writer::open(
        &who.job_dir,
        &name,
        id.attempt,
        Some(id.rank),
        Some(id.node.clone()),
    );
    // A launcher (local, or a coordinator's) records the job's start and end.
    let owns_job = id.world_size == 1
        && !env_is_set(crate::coordinator::ENV_URL)
        && !env_is_set(crate::context::ENV_LAUNCHER);
    Ok(who.writing(journal, owns_job, true))
}

/// A coordinator this process hosts: for how many ranks, the journal it
/// learns earlier attempts from, and the failure it resumes after (a
/// relaunch inside the allocation: when, and the restarts so far).
pub(crate) struct Host {
    pub world: u32,
    pub seed: Vec<journal::Record>,
    pub resumed: Option<(Instant, u32)>,
}

/// The coordinator: from the environment (the local launcher's, or the
/// job level's), hosted here (`host`: the job level; rank 0 of a step
/// nobody else coordinates), or found from the job's files (the other
/// ranks). `link_hosted`: this process reports to the one it hosts.
fn coordinator(
    cfg: &Config,
    b: &Base,
    host: Option<Host>,
    link_hosted: bool,
    advice: &mut Option<IntervalAdvisor>,
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
    } else if let Some(h) = host {
        match host_coordinator(cfg, b, h) {
            Ok(c) => {
                // `checkpoint_every = "advised"`: from the journal so
                // far, and again every few minutes (see the loop).
                if let Some(a) = advice.as_mut() {
                    a.poll(&c, Instant::now());
                }
                let target = link_hosted.then(|| Target::Known {
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

/// The node's relay: the first local rank runs it; every rank of the node
/// reports through it while it answers.
fn node_relay(
    cfg: &Config,
    b: &Base,
    link: Link,
    monitor_errors: &mut Vec<String>,
) -> (Link, Option<crate::coordinator::relay::Relay>) {
    let launcher_local_rank = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.trim().parse().ok());
    let position = crate::coordinator::relay::position(
        cfg.coordinator.node_relay,
        &b.slurm,
        b.id.world_size,
        launcher_local_rank,
    );
    let Some(local) = position else {
        return (link, None);
    };
    let relay = (local == 0)
        .then(|| {
            crate::coordinator::relay::start(
                link.clone(),
                &b.job_dir,
                &b.id.node,
                b.id.attempt,
                cfg.coordinator.report_interval,
            )
            .map_err(|e| monitor_errors.push(format!("node relay: {e}")))
            .ok()
        })
        .flatten();
    let via =
        crate::coordinator::client::Via::new(b.job_dir.clone(), b.id.node.clone(), b.id.attempt);
    (link.through(via), relay)
}

fn host_coordinator(cfg: &Config, b: &Base, h: Host) -> std::io::Result<Coordinator> {
    let id = &b.id;
    let mut policy = cfg.coordinator.policy.clone();
    policy.observe = cfg.observe;
    policy.busy_limit = cfg.stall.eval_timeout;
    let mut view = crate::coordinator::state::JobView::new(
        &id.job,
        h.world,
        id.attempt,
        policy,
        Instant::now(),
    );
    // Stragglers flagged before this attempt: confirmation across restarts.
    view.seed_from_journal(&h.seed);
    if let Some((at, restarts)) = h.resumed {
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
            c.watch_recoveries(Arc::new(crate::analysis::recovery::JournalRecoveries::new(
                &b.job_dir,
            )));
            if cfg.coordinator.site_metrics && b.slurm.in_job() {
                if let Err(e) = c.serve_site_metrics(&cfg.state_dir, &id.job, &id.node) {
                    tracing::warn!("no read-only metrics listener for the site: {e}");
                }
            }
            Ok(c)
        })
}

/// What an agent has before its child starts: the coordinator's link and
/// the report it carries, the hosted coordinator and its checkpoint advice,
/// signals, the progress socket, the child's environment.
pub(crate) struct Parts {
    pub hosted: Option<Coordinator>,
    pub advice: Option<IntervalAdvisor>,
    pub outbox: Arc<Outbox>,
    pub link: Option<Link>,
    pub relay: Option<crate::coordinator::relay::Relay>,
    pub inputs: Inputs,
    pub tx: progress::Sender,
    pub socket_ok: bool,
    pub sock_path: PathBuf,
    pub control_path: PathBuf,
    pub env: Env,
    pub torchrun: Vec<(&'static str, String)>,
    /// What supervision goes on without, said once the child started.
    pub monitor_errors: Vec<String>,
}

impl Parts {
    /// The child will not start: the socket goes.
    pub(crate) fn remove_socket(&self) {
        if self.socket_ok {
            let _ = std::fs::remove_file(&self.sock_path);
        }
    }
}

/// The parts, in this order: coordinator, signals, socket, environment.
/// `extra`: the role's own variables for the child, given the coordinator
/// it hosts.
pub(crate) fn prepare(
    cfg: &Config,
    b: &Base,
    host: Option<Host>,
    link_hosted: bool,
    extra: impl FnOnce(Option<&Coordinator>) -> Env,
) -> Result<Parts> {
    let mut monitor_errors: Vec<String> = Vec::new();
    let mut advice = cfg.coordinator.policy.checkpoint_advised.then(|| {
        IntervalAdvisor::new(Arc::new(crate::analysis::advice::JournalAdvice::new(
            &cfg.state_dir,
            &b.id.job,
        )))
    });
    let (hosted, target) = coordinator(cfg, b, host, link_hosted, &mut advice, &mut monitor_errors);
    let outbox = Arc::new(Outbox::default());
    let (notes_tx, notes_rx) = tokio::sync::mpsc::unbounded_channel::<Note>();
    let link = target.map(|t| Link::new(t, cfg.coordinator.report_interval));
    let (link, relay) = match link {
        Some(l) => {
            let (l, r) = node_relay(cfg, b, l, &mut monitor_errors);
            (Some(l), r)
        }
        None => (None, None),
    };
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
    let inputs = signals(notes_rx, &mut monitor_errors)?;
    let tx = progress::Sender::new();
    let (sock_path, socket_ok) = progress_socket(&b.id, &tx, &mut monitor_errors);
    let control_path = sock_path.with_extension("ctl");
    let extra = extra(hosted.as_ref());
    let (env, torchrun) = trainer_env(
        cfg,
        b,
        socket_ok.then_some(sock_path.as_path()),
        link.is_some().then_some(control_path.as_path()),
        extra,
    );
    Ok(Parts {
        hosted,
        advice,
        outbox,
        link,
        relay,
        inputs,
        tx,
        socket_ok,
        sock_path,
        control_path,
        env,
        torchrun,
        monitor_errors,
    })
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
pub(crate) type Env = Vec<(OsString, OsString)>;

/// The trainer's environment, and the torchrun variables among it.
fn trainer_env(
    cfg: &Config,
    b: &Base,
    socket: Option<&Path>,
    control: Option<&Path>,
    extra: Env,
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
    env.extend(extra);
    if cfg.progress.python_unbuffered && !env_is_set("PYTHONUNBUFFERED") {
        env.push(("PYTHONUNBUFFERED".into(), "1".into()));
    }
    let torchrun = crate::slurm::env::trainer_env(&b.slurm, b.id.attempt, &|k| env_is_set(k));
    env.extend(
        torchrun
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    (env, torchrun)
}

/// A rollback the decision left for this attempt (`[numerical]`): the
/// checkpoint to restart from and the steps whose data to skip.
fn rollback_env(b: &Base) -> Env {
    let mut env = Env::new();
    if let Some(rb) = journal::rollback_for(&b.job_dir, b.id.attempt) {
        if let Some(s) = rb.checkpoint_step {
            env.push(("RESILIO_ROLLBACK_STEP".into(), s.to_string().into()));
        }
        if let Some(s) = rb.skip_steps() {
            env.push(("RESILIO_SKIP_STEPS".into(), s.into()));
        }
    }
    env
}

/// How the child is started and what the agent is to it.
pub(crate) struct Child {
    /// The command as given.
    pub argv: Vec<OsString>,
    /// The command as run (nodes left out of it, say).
    pub run_argv: Vec<OsString>,
    pub checks_node: bool,
    pub supervises_step: bool,
    /// Kept out of the agent's process group (a guardian above holds it).
    pub own_group: bool,
}

/// Start the child and the sources that watch it; `rank_start` is written.
/// `started`: the role's look at the child just started (its pid, the read
/// ends of its output), before anything reads them.
pub(crate) fn start(
    cfg: Config,
    mut b: Base,
    mut parts: Parts,
    child: Child,
    started: impl FnOnce(&process::Spawned, &Base, Option<&Coordinator>),
) -> Result<Setup> {
    let argv_text = text_of(&child.argv);
    let ckpt_watch =
        super::sources::checkpoint_watch(&cfg, b.id.rank, &parts.tx, &mut parts.monitor_errors);
    let spawned = match process::spawn(&child.run_argv, &parts.env, child.own_group) {
        Ok(s) => s,
        Err(e) => {
            spawn_failed(&mut b.journal, &e, &argv_text, b.owns_job);
            parts.remove_socket();
            return Err(e);
        }
    };
    let launched = Instant::now();
    started(&spawned, &b, parts.hosted.as_ref());
    parts.outbox.update(|r| r.pid = spawned.pid.as_raw() as u32);
    let Parts {
        hosted,
        advice,
        outbox,
        link,
        relay,
        inputs,
        tx,
        socket_ok,
        sock_path,
        control_path,
        torchrun,
        monitor_errors,
        ..
    } = parts;
    let mut monitor_errors = monitor_errors;
    let mut rank = Rank {
        clock: b.clock,
        pid: spawned.pid,
        launched,
        tail: output::Tail::new(64 * 1024),
        pumps: Vec::new(),
        file_watch: None,
        ckpt_watch,
        cfg,
        argv: child.argv,
        id: b.id,
        slurm: b.slurm,
        job_dir: b.job_dir,
        supervises_step: child.supervises_step,
        owns_job: b.owns_job,
        checks_node: child.checks_node,
        journal: b.journal,
        hosted,
        advice,
        outbox,
        link,
        relay,
        tx,
        socket_ok,
        sock_path,
        control_path,
    };
    let file_mode = rank.watch(spawned.stdout, spawned.stderr, &mut monitor_errors);
    rank.rank_start(&argv_text, file_mode, &torchrun);
    rank.monitor_errors(&monitor_errors);
    if let Some(r) = &rank.relay {
        rank.journal
            .write(ev::RelayStarted { url: r.url.clone() }, false);
    }
    Ok(Setup::Ready(Box::new(rank), inputs))
}

/// Set a rank up and start its trainer.
pub(crate) fn setup(cfg: Config, argv: Vec<OsString>, job_id: Option<&str>) -> Result<Setup> {
    let mut b = rank_base(&cfg, job_id)?;
    let multi_rank_step = b.slurm.in_step() && b.id.world_size > 1;
    // Rank 0 of a step nobody else coordinates hosts the step's coordinator.
    let host = (multi_rank_step && b.id.rank == 0).then(|| Host {
        world: b.id.world_size,
        seed: if b.id.attempt > 0 {
            journal::read_job(&b.job_dir)
                .map(|j| crate::runs::of_key(j.records, b.id.run.key.as_deref()))
                .unwrap_or_default()
        } else {
            Vec::new()
        },
        resumed: None,
    });
    let rollback = rollback_env(&b);
    let parts = prepare(&cfg, &b, host, true, |_| rollback)?;
    if b.owns_job {
        let start = ev::JobStart {
            world_size: b.id.world_size,
            mode: ev::JobMode::Single,
            ..Default::default()
        };
        b.journal.write(start, false);
    }
    let checks_node = b.slurm.localid.unwrap_or(0) == 0;
    if checks_node {
        if let Some(code) = health_before_start(&cfg, &mut b) {
            parts.remove_socket();
            return Ok(Setup::Done(code));
        }
    }
    let child = Child {
        run_argv: argv.clone(),
        argv,
        checks_node,
        supervises_step: false,
        own_group: false,
    };
    start(cfg, b, parts, child, |_, _, _| {})
}

fn text_of(argv: &[OsString]) -> Vec<String> {
    argv.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// The node's health check before the trainer (once per node: local rank
/// 0). `Some(code)`: the node is unhealthy, the trainer not started.
fn health_before_start(cfg: &Config, b: &mut Base) -> Option<i32> {
    let (id, journal) = (&b.id, &mut b.journal);
    let h = crate::rank::health::run(&cfg.health)?;
    journal.write(
        ev::HealthCheck {
            when: ev::HealthWhen::BeforeStart,
            result: (&h).into(),
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
            exit_code: code,
            cause: "unhealthy node".into(),
            class: Some(failure::Class::Infrastructure),
            class_reason: Some("the node's health check failed".into()),
            evidence: Some(evidence.clone()),
            ..Default::default()
        },
        true,
    );
    journal.write(
        ev::Failure {
            failure_kind: Some(ev::FailureKind::HealthCheck),
            class: Some(failure::Class::Infrastructure),
            cause: Some("health check failed".into()),
            evidence: Some(evidence),
            exit_code: Some(code),
            ..Default::default()
        },
        true,
    );
    if b.owns_job {
        journal.write(job_end(code), true);
    }
    Some(code)
}

impl Rank {
    /// What supervision goes on without, said once at the start.
    fn monitor_errors(&mut self, errors: &[String]) {
        for e in errors {
            tracing::warn!("{e}; supervision continues without it");
            self.journal
                .write(ev::MonitorError { error: e.clone() }, false);
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
            pid: self.pid.as_raw(),
            argv: argv_text.to_vec(),
            cwd: std::env::current_dir().ok().map(|d| path(&d)),
            world_size: self.id.world_size,
            startup_timeout_s: cfg.stall.startup_timeout.as_secs_f64(),
            stall_timeout_s: cfg.stall.fixed_timeout.map(|d| d.as_secs_f64()),
            stall_mode: cfg.stall.mode(),
            socket: self.socket_ok.then(|| path(&self.sock_path)),
            progress_file: cfg.progress.file.as_deref().map(path),
            progress_file_watch: file_mode,
            slurm_step: slurm.step_id.clone(),
            step_nodes: (!slurm.step_nodes.is_empty())
                .then(|| crate::slurm::hostlist::compress(&slurm.step_nodes)),
            torchrun_env: torchrun
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
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
