//! The job-level supervisor: `resilio run -- srun ...` in a batch script.
//!
//! It runs its step (srun) as the rank agent runs a trainer, with the same
//! child, loop and sources ([`crate::rank`]), and adds the job's part:
//!
//! - at the start: the attempt this allocation runs (a relaunch hands its
//!   own over), `job_start`, allocations Slurm ended alone
//!   ([`batch::reconcile_previous`]), spares that cannot replace a dead
//!   node, nodes left out from the node history or by a relaunch, the
//!   coordinator of the whole step, and the hand-over to the guardian;
//! - while the step runs ([`Hooks`]): a torn-down step whose only ranks
//!   left are silent is not waited for, a step that starts no rank is
//!   launch trouble, and a requeue by Slurm itself is seen at its SIGTERM;
//! - at the step's end: the judgment and decision ([`batch::after_attempt`]):
//!   finish, stop, requeue, or run the step again in the allocation (this
//!   process starting over as itself, [`relaunch`]).

use super::batch::{self, AtStart, Next};
use crate::config::Config;
use crate::error::Result;
use crate::event as ev;
use crate::journal::{self, Writer};
use crate::policy::failure;
use crate::process;
use crate::rank::{self, Agent, Base, Child, Finished, Hooks, Host, Setup, Who};
use crate::slurm::step::NextAttempt;
use crate::slurm::Slurm;
use chrono::Utc;
use nix::sys::signal::Signal;
use std::ffi::OsString;
use std::time::{Duration, Instant};

/// How long the ranks left of a torn-down step must be silent (their agents
/// report every second or two while they live) before the job-level
/// supervisor stops waiting for srun: srun itself waits until Slurm
/// declares their nodes failed (25 s and more; `SlurmdTimeout` plus a ping).
pub const SILENT_STEP: Duration = Duration::from_secs(8);

/// Supervise the step; returns resilio's exit code (a relaunch inside the
/// allocation does not return).
pub fn run(opts: rank::RunOptions, slurm: &dyn Slurm) -> Result<i32> {
    let next = crate::util::runtime()?.block_on(async {
        let (r, mut inputs, mut level) =
            match setup(opts.config, opts.argv, opts.job_id.as_deref(), slurm)? {
                (Setup::Ready(r, inputs), level) => (r, inputs, level),
                (Setup::Done(code), _) => return Ok::<Next, crate::error::Error>(Next::Exit(code)),
            };
        let (mut agent, mut done) = Agent::new(r, slurm);
        agent.run(&mut inputs, &mut done, &mut level).await;
        let fin = agent.finish().await;
        Ok(level.after_step(fin))
    })?;
    Ok(match next {
        Next::Exit(code) => code,
        Next::Relaunch(r) => relaunch(&r),
    })
}

/// The job-level supervisor relaunches the step inside the allocation by
/// starting over as itself (same pid, same arguments: Slurm still sees the
/// batch script's process) with the hand-over in `RESILIO_RELAUNCH`. Runs
/// once the runtime, the coordinator and every file of this attempt are gone.
pub fn relaunch(r: &NextAttempt) -> i32 {
    use std::os::unix::process::CommandExt;
    let mut cmd = crate::util::own_binary();
    cmd.args(crate::util::args_os().into_iter().skip(1))
        .env(crate::slurm::step::ENV_RELAUNCH, r.encode());
    if let Some((k, v)) = super::guardian::keep_across_exec() {
        cmd.env(k, v);
    }
    let err = cmd.exec();
    tracing::error!("cannot relaunch the step inside the allocation: {err}");
    1
}

/// What the job level keeps while its step runs.
pub(crate) struct Level {
    /// Nodes left out of the step, and the step's size then.
    step_out: Option<(Vec<String>, u32)>,
    /// srun was killed because only silent ranks were left of its
    /// torn-down step ([`SILENT_STEP`]).
    step_abandoned: bool,
    /// The step started no rank before `[run] step_start_timeout`, and
    /// srun was killed.
    step_start_missed: Option<Duration>,
    /// Slurm requeued the job itself (seen at its SIGTERM): the job level
    /// decides nothing more.
    requeued_by_slurm: bool,
}

/// The attempt, the journal as this allocation found it, and a relaunch's
/// hand-over.
fn attempt_of(who: &mut Who) -> (Vec<journal::Record>, Option<NextAttempt>) {
    // Attempts count steps: a relaunch inside the allocation hands its
    // attempt over; a fresh allocation continues after the journal's.
    let earlier = journal::read_job(&who.job_dir)
        .map(|j| crate::runs::of_key(j.records, who.id.run.key.as_deref()))
        .unwrap_or_default();
    let relaunched = std::env::var(crate::slurm::step::ENV_RELAUNCH)
        .ok()
        .and_then(|text| {
            NextAttempt::parse(&text)
                .map_err(|e| tracing::warn!("ignoring {e}"))
                .ok()
        });
    who.id.attempt = match &relaunched {
        Some(r) => r.attempt,
        None => batch::first_attempt_of_allocation(&earlier, who.slurm.restart_count),
    };
    (earlier, relaunched)
}

/// Set the job level up and start its step.
fn setup(
    cfg: Config,
    argv: Vec<OsString>,
    job_id: Option<&str>,
    slurm_cli: &dyn Slurm,
) -> Result<(Setup, Level)> {
    let mut who = Who::from_env(&cfg, job_id)?;
    let (earlier, relaunched) = attempt_of(&mut who);
    let journal = Writer::open(
        &who.job_dir,
        "batch.jsonl",
        who.id.attempt,
        None,
        Some(who.id.node.clone()),
    );
    let mut b = who.writing(journal, true, relaunched.is_none());
    let resumed = relaunched.as_ref().map(|r| {
        let ago = (Utc::now().timestamp_micros() - r.failed_at_us).max(0) as u64;
        let at = Instant::now()
            .checked_sub(Duration::from_micros(ago))
            .unwrap_or_else(Instant::now);
        let restarts = earlier.iter().filter(|r| r.kind == "restart").count() as u32;
        (at, restarts)
    });
    let host = Host {
        world: b.slurm.ntasks.unwrap_or(1),
        seed: earlier.clone(),
        resumed,
    };
    let state_dir = std::path::absolute(&cfg.state_dir).unwrap_or_else(|_| cfg.state_dir.clone());
    let parts = rank::prepare(&cfg, &b, Some(host), false, |hosted| {
        let mut env: rank::Env = hosted
            .map(|c| c.env())
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        // The job level decides after the steps: their agents do not.
        // Its value, the state dir, keeps the ranks' journals with this
        // one whatever the script exports later.
        env.push((super::step_level::ENV_JOB_LEVEL.into(), state_dir.into()));
        env
    })?;
    let mut level = Level {
        step_out: relaunched.as_ref().map(|r| (r.exclude.clone(), r.nodes)),
        step_abandoned: false,
        step_start_missed: None,
        requeued_by_slurm: false,
    };
    job_start(&mut b, relaunched.as_ref());
    if relaunched.is_none() {
        batch::reconcile_previous(
            &earlier,
            &b.id.job,
            b.slurm.restart_count,
            slurm_cli,
            &mut b.journal,
        );
        warn_about_spares(&cfg, &mut b, &argv, slurm_cli);
        if cfg.nodes.exclude_at_start {
            match leave_out_at_start(&cfg, &mut b, &argv, &earlier, slurm_cli) {
                AtStart::Run => {}
                AtStart::LeaveOut { exclude, nodes } => level.step_out = Some((exclude, nodes)),
                AtStart::Requeued => {
                    parts.remove_socket();
                    return Ok((Setup::Done(0), level));
                }
            }
        }
    }
    drop(earlier);
    let mut run_argv = step_argv(&argv, &level.step_out, &mut b.journal);
    if relaunched.is_some() {
        run_argv = crate::slurm::step::overlapping(&run_argv);
    }
    let guarded = super::guardian::guarded();
    let child = Child {
        argv,
        run_argv,
        checks_node: false,
        supervises_step: true,
        own_group: guarded,
    };
    let (state_dir, user_file) = (cfg.state_dir.clone(), cfg.user_file.clone());
    let setup = rank::start(cfg, b, parts, child, |spawned, b, hosted| {
        if guarded {
            hand_over(spawned, b, hosted.is_some(), state_dir, user_file);
        }
    })?;
    Ok((setup, level))
}

/// `job_start`, durable: it maps the allocation to its attempts.
fn job_start(b: &mut Base, relaunched: Option<&NextAttempt>) {
    let start = ev::JobStart {
        world_size: b.id.world_size,
        mode: ev::JobMode::Batch,
        allocation: Some(b.slurm.restart_count),
        relaunch_in_allocation: relaunched.map(|r| ev::RelaunchInAllocation {
            exclude: r.exclude.clone(),
            nodes: Some(r.nodes),
            ..Default::default()
        }),
        ..Default::default()
    };
    b.journal.write(start, true);
}

/// Hand the guardian the step just started (see [`super::guardian`]).
fn hand_over(
    spawned: &process::Spawned,
    b: &Base,
    hosts: bool,
    state_dir: std::path::PathBuf,
    config: Option<std::path::PathBuf>,
) {
    use std::os::fd::AsFd;
    let id = &b.id;
    let step = super::guardian::Handoff {
        step_pid: spawned.pid.as_raw(),
        job: id.job.clone(),
        attempt: id.attempt,
        job_dir: b.job_dir.clone(),
        node: id.node.clone(),
        run: id.run.key.clone(),
        coordinator: hosts.then(|| super::guardian::Rehost {
            job: id.job.clone(),
            world_size: id.world_size,
            state_dir,
            config,
        }),
    };
    super::guardian::hand_over(&step, spawned.stdout.as_fd(), spawned.stderr.as_fd());
}

/// Nodes left out of the step at the start, from the node history
/// (`[nodes]`), or the job requeued instead.
fn leave_out_at_start(
    cfg: &Config,
    b: &mut Base,
    argv: &[OsString],
    earlier: &[journal::Record],
    slurm_cli: &dyn Slurm,
) -> AtStart {
    let (history, _) = crate::analysis::node_history::build(
        &cfg.state_dir,
        Utc::now(),
        cfg.nodes.half_life,
        Some(slurm_cli),
    );
    // `earlier`: the journal as this allocation found it (read once above).
    batch::history_at_start(
        &history,
        cfg.nodes.threshold,
        &b.id.job,
        &b.slurm.job_nodes,
        argv,
        earlier,
        slurm_cli,
        &mut b.journal,
    )
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
        b.journal.write(ev::SetupWarning { warning: w }, true);
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
                        error: "the step command cannot leave nodes out; run as it was".into(),
                    },
                    false,
                );
                argv.to_vec()
            }),
        None => argv.to_vec(),
    }
}

impl Hooks for Level {
    /// Hosting the coordinator, the job level looks at its step once a
    /// second at least.
    fn tick_every(&self, a: &Agent<'_>) -> Option<Duration> {
        a.rank.hosted.is_some().then_some(Duration::from_secs(1))
    }

    fn tick(&mut self, a: &mut Agent<'_>) {
        self.abandon_silent_step(a);
        self.enforce_step_start(a);
    }

    fn on_term(&mut self, a: &mut Agent<'_>) {
        self.see_requeue_by_slurm(a);
    }
}

impl Level {
    /// Hosting the coordinator: a step torn down after a failure whose only
    /// ranks left have been silent for [`SILENT_STEP`] (their agents died
    /// with their nodes) is not waited for. srun is killed; the step's end
    /// is judged as usual (the silent ranks left no `rank_exit`: their
    /// agents died, their nodes are blamed) and it runs again at once (a
    /// relaunch overlaps the lingering step, see `slurm::step::overlapping`).
    fn abandon_silent_step(&mut self, a: &mut Agent<'_>) {
        if self.step_abandoned || a.lifecycle.main_exited() {
            return;
        }
        let Some(c) = &a.rank.hosted else {
            return;
        };
        let now = Instant::now();
        let Some(left) = c.with_view(|v| (v.only_silent_left(now, SILENT_STEP), Vec::new())) else {
            return;
        };
        self.step_abandoned = true;
        let (ranks, nodes): (Vec<u32>, Vec<String>) = left.into_iter().unzip();
        tracing::warn!(
            "the step was torn down and only silent ranks are left ({ranks:?} on {nodes:?}, nothing heard for {}s): srun is not waited for",
            SILENT_STEP.as_secs()
        );
        a.rank.journal.write(
            ev::StepAbandoned {
                ranks,
                nodes,
                silent_s: SILENT_STEP.as_secs_f64(),
                note:
                    "srun was killed rather than left waiting for Slurm to declare their nodes failed".into(),
            },
            true,
        );
        process::signal_group(a.rank.pid, Signal::SIGKILL);
    }

    /// Hosting the coordinator: a step none of whose ranks has reported
    /// `[run] step_start_timeout` after srun's start never started (a node
    /// that cannot start tasks, a step waiting behind resources it will not
    /// get). srun is killed and the attempt is judged launch trouble (see
    /// [`Self::after_step`]), never the trainer's crash loop.
    fn enforce_step_start(&mut self, a: &mut Agent<'_>) {
        let limit = a.rank.cfg.step_start_timeout;
        if limit.is_zero()
            || self.step_start_missed.is_some()
            || a.lifecycle.main_exited()
            || a.rank.launched.elapsed() < limit
        {
            return;
        }
        let Some(c) = &a.rank.hosted else {
            return;
        };
        if c.with_view(|v| (v.heard_from_any(), Vec::new())) {
            return;
        }
        self.step_start_missed = Some(limit);
        tracing::warn!(
            "no rank of the step reported within {}s of srun's start: srun is killed, and the attempt judged launch trouble",
            limit.as_secs()
        );
        a.rank.journal.write(
            ev::StepStartTimeout {
                after_s: limit.as_secs_f64(),
                note: "srun was killed: the step started no rank ([run] step_start_timeout)".into(),
            },
            true,
        );
        process::signal_group(a.rank.pid, Signal::SIGKILL);
    }

    /// At a SIGTERM: did Slurm requeue the job itself (a node failure
    /// without `--no-kill`, a preemption)? Then, while the job is still
    /// being torn down, the failed nodes are excluded from its next
    /// allocation (and its node count lowered where its spares were spent:
    /// `[run] shrink_after_node_failure`), and nothing else is decided.
    fn see_requeue_by_slurm(&mut self, a: &mut Agent<'_>) {
        if self.requeued_by_slurm {
            return;
        }
        let slurm_cli = a.slurm_cli;
        let r = &mut *a.rank;
        let Ok(info) = slurm_cli.show_job(&r.id.job) else {
            return;
        };
        if !super::decide::requeued_by_slurm(&info, r.slurm.restart_count) {
            return;
        }
        self.requeued_by_slurm = true;
        let held = &r.slurm.job_nodes;
        let failed: Vec<String> = slurm_cli
            .node_states(held)
            .map(|v| {
                v.into_iter()
                    .filter(|n| n.is_failed())
                    .map(|n| n.name)
                    .collect()
            })
            .unwrap_or_default();
        let left_out = self
            .step_out
            .as_ref()
            .map(|o| o.0.clone())
            .unwrap_or_default();
        let step_nodes = self
            .step_out
            .as_ref()
            .map(|o| o.1)
            .filter(|n| *n > 0)
            .or_else(|| crate::slurm::step::requested_nodes(&r.argv));
        let plan = super::decide::after_slurm_requeue(
            held,
            &failed,
            &left_out,
            step_nodes,
            // What the job holds (while Slurm tears it down, `NumNodes`
            // counts only the nodes left).
            info.num_nodes.max(held.len() as u32),
            r.slurm.ntasks,
            r.cfg.shrink_after_node_failure,
        );
        super::act::after_slurm_requeue(plan, &info, &r.id.job, slurm_cli, &mut r.journal);
    }

    /// Judge the step and decide (requeue, relaunch, stop).
    fn after_step(&self, fin: Finished<'_>) -> Next {
        let code = fin.ending.code();
        if self.requeued_by_slurm {
            // Slurm decided (and the exclusion is set): the next allocation
            // runs the job again.
            return Next::Exit(code);
        }
        let slurm_cli = fin.agent.slurm_cli;
        let mut agent = fin.agent;
        let r = &mut *agent.rank;
        let mut tail_lines = r.tail.last_lines(200);
        // A step that started no rank: launch trouble, whatever srun said
        // about the tasks it never ran.
        let launch = self.step_start_missed.map(failure::Verdict::launch_trouble);
        if launch.is_some() {
            tail_lines.clear();
        }
        let step = batch::StepEnd {
            ended: crate::util::clock::now(),
            exit_code: code,
            verdict: launch.as_ref().unwrap_or(&fin.verdict),
            tail: &tail_lines,
            node: &r.id.node,
            pre_timeout: fin.ending.pre_timeout,
            agents: &[],
        };
        let alloc = batch::allocation(&r.cfg, &r.slurm.job_nodes, &r.argv, self.step_out.as_ref());
        batch::after_attempt(
            &r.cfg.state_dir,
            &r.id.job,
            r.id.attempt,
            &step,
            r.cfg.budget(),
            r.cfg.observe,
            alloc,
            slurm_cli,
            &mut r.journal,
        )
    }
}
