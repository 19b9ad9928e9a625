//! The rank agent's loop: it waits on signals, progress, the coordinator's
//! notes, diagnostics and a timer, hands what came to the [`Lifecycle`],
//! and carries out the [`Order`]s it returns (signals to the trainer,
//! journal records, diagnostics threads, the coordinator's report).

use super::busy::{Busy, BUSY_SHARE};
use super::events::{drain_events, Sinks, SourceFaults};
use super::lifecycle::{Checked, Lifecycle, Order, Settings, Sig};
use super::progress_log::ProgressLog;
use super::records::{dump_record, truncate_lines, write_diag_file};
use super::supervised::{Inputs, Rank};
use super::Hooks;
use crate::coordinator::client::Note;
use crate::coordinator::protocol::RankState;
use crate::event as ev;
use crate::event::ProbeFinding;
use crate::journal;
use crate::policy::stall::StallPolicy;
use crate::process;
use crate::rank::diagnostics::{self, Diagnostics, PySpyDump};
use crate::slurm::Slurm;
use crate::util::cmd::Helpers;
use chrono::Utc;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// A probe the coordinator asked for: (reason, verdict, py-spy dumps).
/// A probe's reason, finding, stacks, and the command it answers (its seq).
type ProbeDone = (String, ProbeFinding, Vec<PySpyDump>, u64);

/// Where the diagnostics threads report back.
pub(crate) struct Done {
    diag: UnboundedReceiver<Diagnostics>,
    probe: UnboundedReceiver<ProbeDone>,
}

/// What woke the loop.
enum Woke {
    Child,
    Signal(Sig),
    Progress,
    Note(Note),
    Probe(ProbeDone),
    Diagnostics(Diagnostics),
    Timer,
}

/// The loop's state besides the lifecycle: the I/O side.
pub(crate) struct Agent<'a> {
    pub rank: Box<Rank>,
    pub lifecycle: Lifecycle,
    pub plog: ProgressLog,
    pub faults: SourceFaults,
    /// Loss gone to NaN, loss spikes (none for a step: its ranks' agents
    /// watch their own).
    pub numerical: Option<crate::policy::numerical::NumericalWatch>,
    pub(super) helpers: Helpers,
    pub(super) diag_tx: UnboundedSender<Diagnostics>,
    pub(super) probe_tx: UnboundedSender<ProbeDone>,
    /// The stall's own probe, waiting for the stacks of its diagnostics.
    pub(super) stall_probe: Option<ProbeFinding>,
    /// A look at whether the trainer is working, under way at its limit,
    /// and what the last one found.
    pub(super) busy: Busy,
    pub(super) scratch: PathBuf,
    /// Reaping scans /proc, so it runs only when a child may have changed
    /// state (SIGCHLD, diagnostics done) and, while draining, once a second.
    pub(super) reap_due: bool,
    pub(super) children_left: bool,
    pub(super) commands_handled: u64,
    /// The latest probe the coordinator asked for (its command's seq).
    pub(super) probe_asked: u64,
    pub(super) child_is_srun: bool,
    pub(crate) slurm_cli: &'a dyn Slurm,
    /// The local launcher of several ranks, while it lives (its agents
    /// get no death signal from it: they train on, see `watch_launcher`).
    pub(super) launcher: Option<nix::unistd::Pid>,
    /// It died: this agent says so in the journal, and rank 0's writes the
    /// `job_end`.
    pub(crate) launcher_lost: bool,
    /// Rank 0: when to say that its trainer has printed no step number yet
    /// (its hangs are then caught by the startup limit only).
    pub(super) no_step_warning: Option<Instant>,
    /// ProbeFinding diagnostics files written (at most [`PROBE_FILES`] a run).
    pub(super) probe_files: u32,
}

/// ProbeFinding diagnostics files one agent writes at most: a long evaluation
/// probed again and again, on thousands of ranks, must not fill the state
/// dir. The stacks stay in each `probe` record (cut to 1,500 characters).
pub const PROBE_FILES: u32 = 8;

/// How long rank 0 may print no step number before resilio says so (or
/// half the startup limit, when that is shorter).
pub const NO_STEP_WARNING: Duration = Duration::from_secs(5 * 60);

/// The lifecycle's settings from the configuration and the rank's setting.
fn settings(r: &Rank) -> Settings {
    let cfg = &r.cfg;
    let linked = r.link.is_some();
    let mut every = cfg
        .journal_progress_interval
        .max(Duration::from_millis(100));
    if linked {
        // The coordinator's report carries the latest step.
        every = every.min(cfg.coordinator.report_interval);
    }
    Settings {
        grace: cfg.kill_grace,
        // resilio's own stops (a stall, a teardown): a hung trainer rarely
        // honours SIGTERM, and Lightning catches it and sleeps on.
        stall_grace: cfg.stall_kill_grace.min(cfg.kill_grace),
        supervises_step: r.supervises_step,
        linked,
        hosts_coordinator: r.hosted.is_some(),
        // In a step, Slurm's process tracking delivers srun's signals to every
        // process of the step, the trainer included: forwarding would double them.
        slurm_delivers: r.slurm.in_step() && !cfg.slurm_forward_signals,
        in_step: r.slurm.in_step(),
        judgment_wait: cfg.coordinator.policy.hang_wait + Duration::from_secs(5),
        pre_timeout_signal: cfg.pre_timeout_signal,
        checkpoint_signal: cfg.checkpoint_signal,
        checkpoint_wait: cfg.checkpoint_wait,
        progress_every: every,
        observe: cfg.observe,
    }
}

impl<'a> Agent<'a> {
    pub fn new(r: Box<Rank>, slurm_cli: &'a dyn Slurm) -> (Self, Done) {
        let policy = StallPolicy::new(r.cfg.stall.clone(), r.launched);
        let lc = Lifecycle::new(settings(&r), policy, Instant::now());
        let (diag_tx, diag) = unbounded_channel();
        let (probe_tx, probe) = unbounded_channel();
        let child_is_srun = r
            .argv
            .first()
            .and_then(|p| std::path::Path::new(p).file_name())
            .is_some_and(|n| n == "srun");
        let numerical = (!r.supervises_step)
            .then(|| crate::policy::numerical::NumericalWatch::new(r.cfg.numerical.clone()));
        let agent = Agent {
            plog: ProgressLog::new(r.cfg.journal_progress_interval),
            scratch: r.job_dir.join("diag"),
            rank: r,
            lifecycle: lc,
            faults: SourceFaults::default(),
            numerical,
            helpers: Helpers::default(),
            diag_tx,
            probe_tx,
            stall_probe: None,
            busy: Busy::default(),
            reap_due: true,
            children_left: true,
            commands_handled: 0,
            probe_asked: 0,
            child_is_srun,
            slurm_cli,
            launcher: crate::context::shares_output().then(nix::unistd::getppid),
            launcher_lost: false,
            no_step_warning: None,
            probe_files: 0,
        };
        let mut agent = agent;
        if !agent.rank.supervises_step && agent.rank.id.rank == 0 {
            let within = NO_STEP_WARNING.min(agent.rank.cfg.stall.startup_timeout / 2);
            agent.no_step_warning = Some(agent.rank.launched + within);
        }
        (agent, Done { diag, probe })
    }

    /// Supervise until the main child and every descendant are gone.
    pub async fn run(&mut self, inp: &mut Inputs, done: &mut Done, hooks: &mut dyn Hooks) {
        loop {
            if self.reap_due {
                self.reap();
            }
            if self.lifecycle.finished(self.children_left) {
                break;
            }
            let plan = self.lifecycle.plan(Instant::now());
            self.rank.tx.wake_for_steps_before(plan.step_wake);
            // A step queued just before the threshold moved is drained now.
            let early = plan
                .step_wake
                .is_some_and(|t| self.rank.tx.has_steps_before(t));
            let (linked, diagnosing) = (self.rank.link.is_some(), self.lifecycle.diagnosing());
            let wake = hooks
                .tick_every(self)
                .map_or(plan.wake, |d| plan.wake.min(Instant::now() + d));
            let wake = self.no_step_warning.map_or(wake, |t| wake.min(t));
            // A reap put off while the stack reader ran is tried again soon.
            let wake = if self.reap_due {
                wake.min(Instant::now() + Duration::from_millis(50))
            } else {
                wake
            };
            let woke = tokio::select! {
                // Signals first: a SIGCONT after a suspension must restart the
                // stall clock before the timer that expired meanwhile is judged.
                biased;
                _ = inp.signals.chld.recv() => Woke::Child,
                _ = inp.signals.term.recv() => Woke::Signal(Sig::Term),
                _ = inp.signals.int.recv() => Woke::Signal(Sig::Int),
                _ = inp.signals.hup.recv() => Woke::Signal(Sig::Hup),
                _ = inp.signals.usr1.recv() => Woke::Signal(Sig::Usr1),
                _ = inp.signals.usr2.recv() => Woke::Signal(Sig::Usr2),
                _ = inp.signals.cont.recv() => Woke::Signal(Sig::Cont),
                Some(s) = inp.signals.stop.recv() => Woke::Signal(Sig::Stop(s)),
                _ = self.rank.tx.woken() => Woke::Progress,
                Some(note) = inp.notes.recv(), if linked => Woke::Note(note),
                Some(p) = done.probe.recv() => Woke::Probe(p),
                _ = std::future::ready(()), if early => Woke::Progress,
                Some(d) = done.diag.recv(), if diagnosing => Woke::Diagnostics(d),
                _ = tokio::time::sleep_until(wake.into()) => Woke::Timer,
            };
            if matches!(woke, Woke::Signal(Sig::Term)) {
                hooks.on_term(self);
            }
            self.on_woke(woke);
            self.watch_launcher();
            if !self.lifecycle.stalled() {
                self.drain();
            } else if self.lifecycle.judging() {
                // Its stall still looked into: the trainer's progress is
                // taken, and a step past the stall's withdraws it.
                self.drain();
                let acts = self.lifecycle.on_progress_while_stalled(Instant::now());
                if !self.carry_out(acts) {
                    break;
                }
            }
            if let Some(c) = &self.rank.hosted {
                // Effects for a host: this agent tears nothing down itself (the
                // coordinator's stop reaches every rank), so they are only drained.
                while c.effects.try_recv().is_ok() {}
                if let Some(a) = self.rank.advice.as_mut() {
                    a.poll(c, Instant::now());
                }
            }
            hooks.tick(self);
            let now = Instant::now();
            self.warn_of_no_step(now);
            if self.lifecycle.limit_reached(now) {
                // A trainer its user stopped at a terminal (Ctrl-Z) is
                // paused, not stalled. (One stopped by SIGSTOP and left so
                // holds the job up: that is judged as a hang.)
                let stopped = process::stopped_by_job_control(self.rank.pid);
                let mut acts = self.lifecycle.trainer_stopped(now, stopped);
                if !stopped {
                    let skip = self.skip();
                    acts.extend(
                        self.busy
                            .look(&mut self.lifecycle, self.rank.pid, &skip, now),
                    );
                }
                if !self.carry_out(acts) {
                    break;
                }
            }
            let checked = match self.lifecycle.checkpoint_query(now) {
                Some(since) => self.checkpoint_done_since(since),
                None => Checked::NotLooked,
            };
            let actions = self.lifecycle.tick(now, checked);
            if !self.carry_out(actions) {
                break;
            }
        }
    }

    /// Rank 0's trainer has printed no step number for a while (though it
    /// may print other things): its hangs are caught by the startup limit
    /// only, and no time counts as productive. Said once, with what gives
    /// steps.
    fn warn_of_no_step(&mut self, now: Instant) {
        if self.no_step_warning.is_none_or(|t| now < t) {
            return;
        }
        self.no_step_warning = None;
        if self.plog.tracker.step().is_some() || self.lifecycle.stalled() {
            return;
        }
        let waited = crate::duration::format(now.saturating_duration_since(self.rank.launched));
        let limit = crate::duration::format(self.rank.cfg.stall.startup_timeout);
        let warning = format!(
            "rank 0 has printed no step number in {waited}: a hang is caught only by the startup limit ({limit}), and the report counts no time as productive. Lightning's Rich bar (its default when `rich` is installed) prints nothing to a pipe: export TTY_COMPATIBLE=1 (Rich then draws it, and resilio reads it), or use TQDMProgressBar or the resilio_client.lightning callback; the HF Trainer without its bar names its steps at log level info (`--log_level info`); any trainer can send `step=N` on RESILIO_SOCKET; steps printed in a format of the trainer's own are read with `--progress-regex` (`[progress] regex`), e.g. `--progress-regex '^it (\\d+)/'` for `it 12/200 loss=...`"
        );
        tracing::warn!("{warning}");
        self.rank.journal.write(ev::SetupWarning { warning }, false);
    }

    /// The local launcher died when this process was re-parented (to a
    /// subreaper or init): journal it once, and train on.
    pub(super) fn watch_launcher(&mut self) {
        let Some(pid) = self.launcher else {
            return;
        };
        if nix::unistd::getppid() == pid {
            return;
        }
        self.launcher = None;
        self.launcher_lost = true;
        tracing::warn!(
            "the launcher (pid {pid}) is gone: rank {} trains on without it (no restarts; the ranks' own stall detection stays)",
            self.rank.id.rank
        );
        self.rank.journal.write(
            ev::LauncherLost {
                launcher_pid: pid.as_raw(),
                note: "the rank trains on without the launcher and its coordinator".into(),
            },
            true,
        );
    }

    fn on_woke(&mut self, woke: Woke) {
        let actions = match woke {
            Woke::Child => {
                self.reap_due = true;
                Vec::new()
            }
            Woke::Signal(s) => {
                self.lifecycle
                    .on_signal(s, Instant::now(), crate::util::clock::now())
            }
            Woke::Progress => Vec::new(),
            Woke::Note(n) => self.on_note(n),
            Woke::Probe((reason, p, dumps, asked)) => {
                self.reap_due = true;
                // The whole stacks in a file of their own, as a stall's: the
                // rank probed may be the one the coordinator blames. Not for a
                // rank found waiting on a peer (a victim), nor past a few.
                let worth = !dumps.is_empty()
                    && p.waiting_on_peer != Some(true)
                    && self.probe_files < PROBE_FILES;
                let file = worth
                    .then(|| {
                        self.probe_files += 1;
                        let tail = self
                            .rank
                            .tail
                            .last_lines(self.rank.cfg.diagnostics.tail_lines);
                        let d = Diagnostics {
                            py_spy: dumps.clone(),
                            ..Default::default()
                        };
                        write_diag_file(&self.scratch, "probe", &self.rank.id, &tail, &d)
                    })
                    .flatten();
                self.rank.journal.write(
                    ev::Probe {
                        reason: reason.to_string(),
                        probe: p.clone(),
                        py_spy: Some(dumps.iter().map(dump_record).collect()),
                        file: file.map(|f| f.to_string_lossy().into_owned()),
                    },
                    false,
                );
                self.report_probe(&p, Some(asked));
                // Its own stall's look of now, beside the others': shown
                // working in its own code, the wait that stalled it is over.
                // (Running with no stack to say where is not enough: NCCL
                // spins in its collectives.)
                if p.waiting_on_peer == Some(false) && p.not_waiting_shown && p.busy(BUSY_SHARE) {
                    let how = match p.cpu {
                        _ if p.reached_peer => "into a collective by the probe's end".to_string(),
                        Some((cpu, over)) => format!(
                            "in its own code, {cpu:.2}s of CPU and {:.2}s ready to run in {over:.1}s",
                            p.cpu_wait_s.unwrap_or(0.0)
                        ),
                        None => "in its own code".to_string(),
                    };
                    self.lifecycle.on_work_while_stalled(Instant::now(), how)
                } else {
                    Vec::new()
                }
            }
            Woke::Diagnostics(d) => {
                self.reap_due = true;
                self.record_diagnostics(&d);
                self.lifecycle.on_diagnostics_done(Instant::now())
            }
            Woke::Timer => {
                if self.lifecycle.stopping() {
                    self.reap_due = true;
                }
                Vec::new()
            }
        };
        self.carry_out(actions);
    }

    fn on_note(&mut self, note: Note) -> Vec<Order> {
        match note {
            Note::Unreachable { error } => self.lifecycle.on_coordinator_lost(error),
            Note::Reachable {
                gap_s,
                failed_requests,
            } => self.lifecycle.on_coordinator_back(gap_s, failed_requests),
            Note::Command(c)
                if c.seq > self.commands_handled
                    && c.for_rank(self.rank.id.rank, self.rank.id.attempt) =>
            {
                self.commands_handled = c.seq;
                if matches!(
                    c.kind,
                    crate::coordinator::protocol::CommandKind::Diagnose { .. }
                ) {
                    self.probe_asked = c.seq;
                }
                self.rank
                    .outbox
                    .update(|r| r.commands_seen = r.commands_seen.max(c.seq));
                self.lifecycle.on_command(c.kind, Instant::now())
            }
            Note::Command(_) => Vec::new(),
            Note::RelayBypassed { url, error } => {
                self.rank
                    .journal
                    .write(crate::event::RelayBypassed { url, error }, false);
                Vec::new()
            }
            Note::JobProgress { at } => {
                // Another rank prints the steps (Megatron-LM's last rank).
                self.no_step_warning = None;
                let own = self.plog.tracker.alive_count() != 0;
                self.lifecycle.on_job_progress(at, own)
            }
        }
    }

    /// The probe's verdict in the coordinator's report, sent at once;
    /// `asked`: the seq of the coordinator's command it answers (`None`:
    /// the rank's own, at its stall).
    fn report_probe(&self, p: &ProbeFinding, asked: Option<u64>) {
        self.rank.outbox.update(|r| {
            if let Some(seq) = asked {
                r.probe_seq = seq;
            }
            r.waiting_on_peer = p.waiting_on_peer;
            // Without accelerators a collective's wait blocks (gloo): CPU
            // time over the probe is work in the trainer's own code, shown
            // as surely as a stack there (py-spy reads no frames of an
            // interpreter shutting down), and a rank found in a collective
            // that worked its way into it (its CPU time moved) just joined.
            let cpu_only = !crate::device::accelerators_here();
            let worked = p.busy(BUSY_SHARE);
            r.not_waiting_shown =
                p.not_waiting_shown || (cpu_only && worked && p.waiting_on_peer == Some(false));
            // (In a collective, CPU time alone: the time its threads waited
            // for a CPU may be the stack read's doing.)
            r.busy = match p.waiting_on_peer {
                Some(true) => cpu_only && p.busy_on_cpu(BUSY_SHARE),
                _ => worked,
            };
            r.idle = r.state == RankState::Stalled
                && p.waiting_on_peer.is_none()
                && p.cpu.is_some()
                && !p.busy(BUSY_SHARE)
                && !crate::device::accelerators_here();
            r.probe = Some(p.evidence.join("; "));
            r.probed = true;
        });
        self.rank.outbox.urgent.notify_one();
    }

    fn record_diagnostics(&mut self, d: &Diagnostics) {
        let tail_lines = self
            .rank
            .tail
            .last_lines(self.rank.cfg.diagnostics.tail_lines);
        if let Some(p) = self.stall_probe.take() {
            let p = diagnostics::with_stacks(p, &d.py_spy, d.py_spy_skipped.as_deref());
            let p = diagnostics::with_output(p, &tail_lines);
            self.rank.journal.write(
                ev::Probe {
                    reason: "stall".into(),
                    probe: p.clone(),
                    py_spy: None,
                    file: None,
                },
                false,
            );
            self.report_probe(&p, None);
        }
        let file = write_diag_file(&self.scratch, "stall", &self.rank.id, &tail_lines, d);
        self.rank.journal.write(
            ev::Diagnostics {
                tail: truncate_lines(&tail_lines, 3000),
                py_spy: d.py_spy.iter().map(dump_record).collect(),
                py_spy_skipped: d.py_spy_skipped.clone(),
                dump_signal: d.dump_signal.clone(),
                file: file.map(|f| f.to_string_lossy().into_owned()),
            },
            true,
        );
    }

    fn drain(&mut self) {
        let linked = self.rank.link.is_some();
        let r = &mut *self.rank;
        let mut findings = Vec::new();
        drain_events(
            &r.tx,
            &mut Sinks {
                policy: &mut self.lifecycle.policy,
                plog: &mut self.plog,
                journal: &mut r.journal,
                clock: &r.clock,
                faults: &mut self.faults,
                outbox: linked.then_some(&*r.outbox),
                numerical: self.numerical.as_mut(),
                findings: &mut findings,
            },
        );
        for f in findings {
            self.numerical_finding(f);
        }
    }

    /// A numerical failure: journaled; stopped for when so configured.
    fn numerical_finding(&mut self, f: crate::policy::numerical::Finding) {
        use crate::policy::numerical::Act;
        let detail = f.describe();
        let value = if f.value.is_nan() {
            "nan".to_string()
        } else {
            f.value.to_string()
        };
        self.rank.journal.write(
            ev::Numerical {
                finding: f.kind,
                metric: f.metric,
                value,
                step: f.step,
                since_step: f.since_step,
                consecutive: f.consecutive,
                baseline: f.baseline,
                action: Some(f.act),
                detail: detail.clone(),
            },
            true,
        );
        tracing::warn!("numerical failure: {detail}");
        let evidence = match f.act {
            Act::Record | Act::Unknown => return,
            Act::Stop => detail,
            Act::Rollback => format!("{}{detail}", crate::policy::numerical::ROLLBACK),
        };
        let actions = self.lifecycle.on_numerical(evidence, Instant::now());
        self.carry_out(actions);
    }

    /// Drain the last events (unless a stall stopped taking them).
    pub fn drain_last(&mut self) {
        if !self.lifecycle.stalled() {
            self.drain();
        }
    }

    pub(super) fn skip(&self) -> Vec<i32> {
        self.helpers.with(|h| h.clone())
    }

    fn reap(&mut self) {
        // Not while our own stack reader holds a process: its tracing stop
        // would be reported here, not to the reader (a moment later).
        if super::stacks::tracing_now() {
            return;
        }
        self.reap_due = false;
        let (pid, skip) = (self.rank.pid, self.skip());
        if !self.lifecycle.main_exited() {
            if let Some(exit) = process::try_reap_main(pid) {
                let now = Instant::now();
                // Remaining descendants get TERM now, KILL after the grace.
                process::reap_orphans(pid, &skip);
                let others = !process::live_children(&skip).is_empty();
                let actions = self.lifecycle.on_main_exit(exit, now, others);
                self.carry_out(actions);
            }
        }
        self.helpers.with(|h| process::reap_orphans(pid, h));
        if self.lifecycle.main_exited() {
            self.children_left = !process::live_children(&skip).is_empty();
        }
    }

    /// The ranks' `checkpoint_done` since the pre-timeout signal, from the journal.
    fn checkpoint_done_since(&self, since: chrono::DateTime<Utc>) -> Checked {
        let attempt = self.rank.id.attempt;
        let done = journal::read_job(&self.rank.job_dir).ok().and_then(|j| {
            j.records
                .iter()
                .find(|r| r.kind == "checkpoint_done" && r.attempt == attempt && r.ts >= since)
                .map(|r| r.u64("step"))
        });
        match done {
            Some(step) => Checked::Done(step),
            None => Checked::NotDone,
        }
    }
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
