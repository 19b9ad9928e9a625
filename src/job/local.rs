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

use super::judge::{AgentEnd, AgentStatus};
use crate::config::Config;
use crate::coordinator::state::{Effect, JobView};
use crate::coordinator::Coordinator;
use crate::error::{Error, Result};
use crate::event as ev;
use crate::journal::{self, Writer};
use crate::policy::restart::AttemptOutcome;
use crate::util::cmd::own_group;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use crate::context::{shares_output, ENV_LAUNCHER, LAUNCHER_SINGLE};

mod command;
mod orphans;
mod restarts;
mod signals;
use crate::process::Signals;
use orphans::Orphans;
use signals::Wake;

/// What `resilio run --ntasks N` was asked to do.
pub struct LocalOptions {
    pub argv: Vec<OsString>,
    pub config: Config,
    pub job_id: Option<String>,
    pub ntasks: u32,
    /// Flags passed on to every rank's agent (`--config`, timeouts, ...).
    pub agent_args: Vec<OsString>,
    /// `--label`: each rank's output lines prefixed with its rank.
    pub label: bool,
}

pub fn run(opts: LocalOptions) -> Result<i32> {
    crate::util::runtime()?.block_on(run_async(opts))
}

async fn run_async(opts: LocalOptions) -> Result<i32> {
    let local = Local::new(opts)?;
    let mut log = local.writer("launcher.jsonl");
    let argv_text: Vec<String> = local
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    log.write(
        ev::JobStart {
            world_size: local.n,
            mode: ev::JobMode::Local,
            argv: Some(argv_text),
            max_restarts: Some(local.cfg.max_restarts),
            ..Default::default()
        },
        true,
    );
    let coordinator = local.start_coordinator(&mut log)?;
    let signals = Signals::install()?;
    // What a dead agent's trainer started comes here, not to init, to be
    // stopped (see `orphans`).
    if let Err(e) = crate::process::set_subreaper() {
        tracing::warn!("cannot become child subreaper: {e}");
    }
    let advice = local.cfg.coordinator.policy.checkpoint_advised.then(|| {
        crate::coordinator::IntervalAdvisor::new(std::sync::Arc::new(
            crate::analysis::advice::JournalAdvice::new(&local.cfg.state_dir, &local.job),
        ))
    });
    let mut run = LocalRun {
        log,
        coordinator,
        advice,
        signals,
        attempt: 0,
        stopped_from_outside: None,
        ints: 0,
        remembered: Vec::new(),
        orphans: Orphans::default(),
        journal: journal::Follow::new(&local.job_dir),
    };
    let final_code = loop {
        let mut a = local.start_attempt(&mut run);
        local.supervise(&mut run, &mut a).await;
        if let Some(code) = local.after_attempt(&mut run, a) {
            break code;
        }
    };
    run.coordinator = None;
    Ok(final_code)
}

struct LocalRank {
    rank: u32,
    pid: Pid,
    exit: Option<i32>,
    /// How its agent ended, for the judgment (an agent that died leaves no
    /// `rank_exit`).
    end: Option<AgentEnd>,
    /// This process SIGKILLed its agent (after the grace, a second Ctrl-C).
    killed_here: bool,
}

fn agent_status(status: WaitStatus) -> Option<AgentStatus> {
    match status {
        WaitStatus::Exited(_, c) => Some(AgentStatus::Code(c)),
        WaitStatus::Signaled(_, s, _) => Some(AgentStatus::Signal(s as i32)),
        _ => None,
    }
}

fn code_of(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, c) => Some(c),
        WaitStatus::Signaled(_, s, _) => Some(128 + s as i32),
        _ => None,
    }
}

/// What stays the same across the attempts of a local run.
struct Local {
    cfg: Config,
    argv: Vec<OsString>,
    agent_args: Vec<OsString>,
    /// `--label`.
    label: bool,
    /// Ranks.
    n: u32,
    /// One rank: what a plain wrapper promises (see the module's doc).
    single: bool,
    job: String,
    exe: std::path::PathBuf,
    node: String,
    job_dir: std::path::PathBuf,
    /// The run key, for the launcher and its ranks (handed down as RESILIO_RUN_ID).
    run_key: Option<String>,
    /// The journal can be written.
    journal_ok: bool,
    /// One rank: its agent's group takes the terminal (when this process
    /// has it) and hands it on to the trainer, as a plain wrapper would.
    take_tty: bool,
}

/// The run's moving parts, carried from attempt to attempt.
struct LocalRun {
    log: Writer,
    coordinator: Option<Coordinator>,
    /// `checkpoint_every = "advised"`: re-evaluated at each attempt's start
    /// and every few minutes while it runs.
    advice: Option<crate::coordinator::IntervalAdvisor>,
    signals: Signals,
    attempt: u32,
    /// A stop from outside (the signal's name): no restart follows.
    stopped_from_outside: Option<&'static str>,
    ints: u32,
    /// Outcomes decided here, for when the journal cannot be read back.
    remembered: Vec<AttemptOutcome>,
    /// What dead agents left behind, being stopped.
    orphans: Orphans,
    /// The job's journal, read as it grows (each line once; of attempts
    /// decided, only their decisions and checkpoints kept): the cost of a
    /// restart stays flat however many came before.
    journal: journal::Follow,
}

/// One attempt while it is supervised.
struct LocalAttempt {
    ranks: Vec<LocalRank>,
    started: Instant,
    failed_at: Option<Instant>,
    failure_note: Option<String>,
    kill_at: Option<Instant>,
    teardown_sent: bool,
    /// A rank aborted or segfaulted (torch's threads at interpreter exit,
    /// once training is done): the others may finish until then.
    exit_crash_until: Option<Instant>,
}

impl LocalAttempt {
    fn running(&self) -> impl Iterator<Item = &LocalRank> {
        self.ranks.iter().filter(|r| r.exit.is_none())
    }

    /// Pass `s` on to every rank still running.
    fn forward(&self, s: Signal) {
        for r in self.running() {
            let _ = kill(r.pid, s);
        }
    }

    /// SIGKILL every rank's whole group.
    fn kill_groups(&mut self) {
        for r in self.ranks.iter_mut().filter(|r| r.exit.is_none()) {
            r.killed_here = true;
            let _ = kill(Pid::from_raw(-r.pid.as_raw()), Signal::SIGKILL);
        }
    }
}

impl Local {
    fn new(opts: LocalOptions) -> Result<Local> {
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
        let job_dir = journal::job_dir(&opts.config.state_dir, &job);
        let run = crate::runs::resolve(&job, &|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
        if run.fresh {
            crate::runs::starting_fresh(&job_dir, &job, run.key.as_deref());
        }
        // An unwritable state dir: the rank's agent says so (once) and
        // supervises without a journal; this process writes none either.
        let journal_ok = journal::create_private_dir_all(&job_dir).is_ok()
            && nix::unistd::access(&job_dir, nix::unistd::AccessFlags::W_OK).is_ok();
        Ok(Local {
            cfg: opts.config,
            argv: opts.argv,
            agent_args: opts.agent_args,
            label: opts.label,
            n,
            single: n == 1,
            job,
            exe,
            node,
            job_dir,
            run_key: run.key,
            journal_ok,
            take_tty: n == 1 && crate::process::owns_terminal(),
        })
    }

    fn writer(&self, name: &str) -> Writer {
        if self.journal_ok {
            Writer::open(&self.job_dir, name, 0, None, Some(self.node.clone()))
                .with_run(self.run_key.as_deref())
        } else {
            Writer::disabled()
        }
    }

    /// The job's coordinator, in this process; `None` when it is turned
    /// off or cannot start (the ranks supervise alone).
    fn start_coordinator(&self, log: &mut Writer) -> Result<Option<Coordinator>> {
        let cfg = &self.cfg;
        if !cfg.coordinator.enabled {
            return Ok(None);
        }
        let bind =
            crate::coordinator::bind_address(&cfg.coordinator.bind, false).map_err(Error::Usage)?;
        let mut policy = cfg.coordinator.policy.clone();
        policy.observe = cfg.observe;
        policy.busy_limit = cfg.stall.eval_timeout;
        let view = JobView::new(&self.job, self.n, 0, policy, Instant::now());
        let w = self.writer("coordinator.jsonl");
        let dir = self.journal_ok.then_some(self.job_dir.as_path());
        match Coordinator::start(view, bind, w, dir) {
            Ok(c) => {
                if let Some(d) = dir {
                    c.watch_recoveries(std::sync::Arc::new(
                        crate::analysis::recovery::JournalRecoveries::new(d),
                    ));
                }
                Ok(Some(c))
            }
            Err(e) => {
                tracing::warn!("coordinator: {e}; ranks supervise alone");
                log.write(
                    ev::MonitorError {
                        error: format!("coordinator: {e}"),
                    },
                    false,
                );
                Ok(None)
            }
        }
    }

    /// Start every rank's agent for the run's current attempt.
    fn start_attempt(&self, run: &mut LocalRun) -> LocalAttempt {
        if let (Some(c), Some(a)) = (&run.coordinator, run.advice.as_mut()) {
            a.now();
            a.poll(c, Instant::now());
        }
        // A rendezvous for several ranks only (see `rank_command`).
        let port = (!self.single).then(command::free_port);
        let started = Instant::now();
        let mut ranks: Vec<LocalRank> = Vec::new();
        let mut spawn_error = None;
        for r in 0..self.n {
            let mut cmd = self.rank_command(r, run.attempt, port, run.coordinator.as_ref());
            match cmd.spawn() {
                Ok(child) => ranks.push(LocalRank {
                    rank: r,
                    pid: Pid::from_raw(child.id() as i32),
                    exit: None,
                    end: None,
                    killed_here: false,
                }),
                Err(e) => {
                    spawn_error = Some(format!("cannot start the agent of rank {r}: {e}"));
                    break;
                }
            }
        }
        tracing::debug!(
            "attempt {}: {} rank agent(s) started (pids {:?}), MASTER_PORT {port:?}",
            run.attempt,
            ranks.len(),
            ranks.iter().map(|r| r.pid.as_raw()).collect::<Vec<_>>()
        );
        run.log.write(
            ev::Launch {
                ranks: self.n,
                master_port: port,
                agent_pids: ranks.iter().map(|r| r.pid.as_raw()).collect(),
            },
            true,
        );
        let mut a = LocalAttempt {
            ranks,
            started,
            failed_at: None,
            failure_note: None,
            kill_at: None,
            teardown_sent: false,
            exit_crash_until: None,
        };
        if let Some(e) = spawn_error {
            tracing::warn!("{e}");
            a.failure_note = Some(e);
            a.failed_at = Some(Instant::now());
        }
        a
    }

    /// Supervise the attempt until every agent is gone.
    async fn supervise(&self, run: &mut LocalRun, a: &mut LocalAttempt) {
        loop {
            self.look(run, a);
            if a.ranks.iter().all(|r| r.exit.is_some()) && !run.orphans.pending() {
                return;
            }
            let now = Instant::now();
            if a.exit_crash_until.is_some_and(|t| now >= t) && a.failed_at.is_none() {
                a.exit_crash_until = None;
                // A rank whose trainer reported the end of training before
                // it crashed (its agent journaled it clean) finished: the
                // others finish on their own, however long their last
                // save takes.
                if !self.finished_at_exit(run, a) {
                    a.failed_at = Some(now);
                }
            }
            if (a.failed_at.is_some() || run.stopped_from_outside.is_some()) && !a.teardown_sent {
                self.tear_down(run, a, now);
            }
            if a.kill_at.is_some_and(|t| now >= t) {
                a.kill_groups();
            }
            let wake = signals::wait(&mut run.signals).await;
            self.on_wake(run, a, wake);
        }
    }

    /// Reap the agents that ended, and hear the coordinator: the first
    /// failure is noted (not after a stop from outside).
    fn look(&self, run: &mut LocalRun, a: &mut LocalAttempt) {
        for r in a.ranks.iter_mut().filter(|r| r.exit.is_none()) {
            if let Ok(st) = waitpid(r.pid, Some(WaitPidFlag::WNOHANG)) {
                if let Some(c) = code_of(st) {
                    r.exit = Some(c);
                    r.end = agent_status(st).map(|status| AgentEnd {
                        rank: r.rank,
                        status: if r.killed_here {
                            AgentStatus::KilledHere
                        } else {
                            status
                        },
                        at: crate::util::clock::now(),
                    });
                    let at_exit = matches!(st, WaitStatus::Exited(_, 134 | 139));
                    if at_exit && a.failed_at.is_none() && run.stopped_from_outside.is_none() {
                        // An abort with no say of its own may be the end of
                        // a finished run: the others get a moment first. The
                        // coordinator, when there is one, judges it (it
                        // probes the others: one still working is left to
                        // finish) and stops the ranks itself.
                        if run.coordinator.is_none() {
                            a.exit_crash_until.get_or_insert(
                                Instant::now() + crate::coordinator::state::EXIT_CRASH_GRACE,
                            );
                        }
                        a.failure_note
                            .get_or_insert_with(|| format!("rank {} exited {c}", r.rank));
                    } else if c != 0 && a.failed_at.is_none() && run.stopped_from_outside.is_none()
                    {
                        a.failed_at = Some(Instant::now());
                        // An agent exits with its trainer's status; one
                        // killed by a signal died itself.
                        a.failure_note = Some(match st {
                            WaitStatus::Signaled(_, s, _) if !r.killed_here => {
                                format!("the agent of rank {} died ({})", r.rank, s.as_str())
                            }
                            _ => format!("rank {} exited {c}", r.rank),
                        });
                    }
                }
            }
        }
        let agents: Vec<i32> = a.running().map(|r| r.pid.as_raw()).collect();
        run.orphans
            .sweep(&agents, self.cfg.kill_grace, run.ints >= 2);
        if let (Some(c), Some(adv)) = (&run.coordinator, run.advice.as_mut()) {
            adv.poll(c, Instant::now());
        }
        if let Some(c) = &run.coordinator {
            while let Ok(e) = c.effects.try_recv() {
                if let Effect::Failed { reason, .. } = e {
                    if a.failed_at.is_none() {
                        a.failed_at = Some(Instant::now());
                        a.failure_note = Some(reason);
                    }
                }
            }
        }
    }

    /// Stop every rank now (the coordinator's stop went out too); the
    /// agents give their trainers the grace, then kill. One rank failed
    /// alone: its agent is ending it already (after a stall, once the
    /// diagnostics are taken, and not at all when the trainer finishes on
    /// its own meanwhile).
    fn tear_down(&self, run: &mut LocalRun, a: &mut LocalAttempt, now: Instant) {
        a.teardown_sent = true;
        if self.cfg.observe {
            if let Some(note) = &a.failure_note {
                run.log.write(
                    ev::Observed {
                        would: "stop every rank of the attempt".into(),
                        reason: note.clone(),
                    },
                    true,
                );
            }
            return;
        }
        if !self.single {
            a.forward(Signal::SIGTERM);
            a.kill_at = Some(now + self.cfg.kill_grace + Duration::from_secs(5));
        }
        if let Some(note) = &a.failure_note {
            run.log.write(
                ev::Teardown {
                    reason: note.clone(),
                    ranks_left: Some(a.running().count() as u32),
                    ..Default::default()
                },
                true,
            );
        }
    }

    fn on_wake(&self, run: &mut LocalRun, a: &mut LocalAttempt, wake: Wake) {
        let kill_at = Instant::now() + self.cfg.kill_grace + Duration::from_secs(5);
        match wake {
            Wake::Look => {}
            Wake::Term => {
                run.stopped_from_outside.get_or_insert("SIGTERM");
                a.forward(Signal::SIGTERM);
                a.teardown_sent = true;
                a.kill_at.get_or_insert(kill_at);
            }
            Wake::Stop(s) => {
                run.stopped_from_outside.get_or_insert(s.as_str());
                a.forward(s);
                a.teardown_sent = true;
                a.kill_at.get_or_insert(kill_at);
            }
            Wake::Int => {
                run.ints += 1;
                run.stopped_from_outside.get_or_insert("SIGINT");
                // One rank: its agent counts them (a second one kills
                // the trainer's whole group at once, and reaps it).
                if run.ints >= 2 && !self.single {
                    a.kill_groups();
                } else {
                    a.forward(Signal::SIGINT);
                }
                a.teardown_sent = true;
                a.kill_at.get_or_insert(kill_at);
            }
            Wake::Forward(s) => a.forward(s),
        }
    }
}
