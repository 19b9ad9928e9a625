//! The rank's lifecycle as a pure machine: what the agent decides on a
//! signal, a coordinator's word, the end of diagnostics, the main child's
//! exit and the passing of time. It never sleeps, never reads the clock
//! (every `Instant` is handed in) and touches no process or file: it
//! returns [`Order`]s, which `rank::run` carries out.
//!
//! ```text
//! Monitoring ─ stall ─▶ Stalled: Diagnosing ─ done ─▶ Stopped (alone, coordinator lost, stop asked)
//!     │                    │  TERM/INT/stop wait   └──▶ AwaitingJudgment ─ stop_judged / wait over ─▶ Stopped
//!     │                    └─ trainer exits on its own ─▶ Diagnosed (the stall is cancelled)
//!     └─ TERM / INT / coordinator stop / pre-timeout ─▶ Stopping(reason)
//! beside the state: the main child's exit (TERM to what is left), SIGKILL
//! after the grace, given up 10 s after SIGKILL.
//! ```

pub use super::ending::{Ending, StopReason};
pub use actions::{Checked, Order, Sig};

mod actions;
mod judging;
mod signals;
use crate::policy::stall::{Stall, StallPolicy};
use crate::process::Exit;
use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

/// Where the rank's lifecycle stands (the trainer's exit, and the SIGKILL
/// deadlines, are kept beside it: the main child can exit in any state).
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    /// Watching the trainer's progress for a stall.
    Monitoring,
    /// Stopping the trainer for a reason other than a stall (SIGTERM sent
    /// or left to Slurm, SIGKILL after the grace).
    Stopping(StopReason),
    /// The stall policy fired at `at`.
    Stalled {
        stall: Stall,
        at: Instant,
        step: StallStep,
    },
}

/// How far the handling of a stall has come.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StallStep {
    /// Diagnostics are being taken; a stop asked meanwhile waits for them.
    Diagnosing { stop_asked: bool },
    /// Linked: the stop waits for the coordinator's judgment, until `until`.
    AwaitingJudgment { until: Instant },
    /// SIGTERM sent to the stalled trainer.
    Stopped,
    /// The trainer exited on its own before it was stopped.
    Diagnosed,
}

/// What the machine needs to know about the rank's setting (fixed for the run).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `kill_grace`: TERM to KILL for stops from outside.
    pub grace: Duration,
    /// resilio's own stops (a stall, a teardown): `stall_kill_grace`, at most `grace`.
    pub stall_grace: Duration,
    /// The child is a step whose ranks have agents of their own (the job
    /// level's srun): no stall is judged from its merged output, and the
    /// pre-timeout signal asks the step for a checkpoint.
    pub supervises_step: bool,
    /// Linked to a coordinator.
    pub linked: bool,
    /// This agent hosts the coordinator.
    pub hosts_coordinator: bool,
    /// In a step, Slurm delivers srun's signals to every process itself.
    pub slurm_delivers: bool,
    /// Inside a Slurm step.
    pub in_step: bool,
    /// How long a linked stalled rank waits for the coordinator's judgment.
    pub judgment_wait: Duration,
    /// Slurm's pre-timeout signal (batch level).
    pub pre_timeout_signal: Signal,
    /// The trainer's checkpoint signal, if any.
    pub checkpoint_signal: Option<Signal>,
    /// How long the pre-timeout checkpoint is waited for.
    pub checkpoint_wait: Duration,
    /// How often the loop wakes while monitoring (journal, report).
    pub progress_every: Duration,
    /// Observe mode: a stop is journaled as what would have been done,
    /// and the rank goes on being watched.
    pub observe: bool,
}

/// Slurm's pre-timeout signal: when it came, its wall time, and when the
/// step is stopped at the latest.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PreTimeout {
    asked_wall: DateTime<Utc>,
    deadline: Instant,
    done: bool,
    coordinated: bool,
}

/// When the loop wakes next.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// Steps before this wake the loop (they could bring the deadline forward).
    pub step_wake: Option<Instant>,
    /// The timer.
    pub wake: Instant,
}

/// The rank's lifecycle. The stall policy is part of it (its clock is the
/// same injected one); progress reaches the policy through `policy`.
pub struct Lifecycle {
    s: Settings,
    pub policy: StallPolicy,
    state: State,
    main_exit: Option<(Exit, Instant)>,
    kill_at: Option<Instant>,
    killed: bool,
    killed_at: Option<Instant>,
    /// The grace of the stop under way, for the SIGKILL record.
    grace_used: Duration,
    coordinator_down: bool,
    /// This rank has lived on the job's progress (it reports none of its own).
    silent_known: bool,
    drain_kill_at: Option<Instant>,
    ints: u32,
    pre_timeout: Option<PreTimeout>,
    /// The journal is read for checkpoint_done at most once a second.
    next_done_check: Instant,
    /// The last plan: its wake, and whether the rank was being monitored then.
    planned: Option<(Instant, bool)>,
    /// The trainer was found stopped, and not yet running again.
    trainer_was_stopped: bool,
    /// The coordinator said to carry on while diagnostics were taken.
    carry_on: Option<String>,
    /// The coordinator asked for a probe while the stall's diagnostics
    /// were taken: answered once they are done.
    probe_after_diagnostics: Option<String>,
}

impl Lifecycle {
    /// A rank whose trainer was launched at `policy.launched()`; `now` starts the clocks.
    pub fn new(s: Settings, policy: StallPolicy, now: Instant) -> Self {
        Lifecycle {
            grace_used: s.grace,
            s,
            policy,
            state: State::Monitoring,
            main_exit: None,
            kill_at: None,
            killed: false,
            killed_at: None,
            coordinator_down: false,
            silent_known: false,
            drain_kill_at: None,
            ints: 0,
            pre_timeout: None,
            next_done_check: now,
            planned: None,
            trainer_was_stopped: false,
            carry_on: None,
            probe_after_diagnostics: None,
        }
    }

    /// Watching the trainer for stalls (not stopping it, and it lives).
    pub fn monitoring(&self) -> bool {
        self.main_exit.is_none() && self.state == State::Monitoring
    }

    /// Where the lifecycle stands.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The main child exited, or a stop is under way: reap once a second.
    pub fn stopping(&self) -> bool {
        !self.monitoring()
    }

    /// The stall's diagnostics are running.
    pub fn diagnosing(&self) -> bool {
        matches!(
            self.state,
            State::Stalled {
                step: StallStep::Diagnosing { .. },
                ..
            }
        )
    }

    /// A stall was declared (progress is no longer taken).
    pub fn stalled(&self) -> bool {
        matches!(self.state, State::Stalled { .. })
    }

    /// The main child's exit has been seen.
    pub fn main_exited(&self) -> bool {
        self.main_exit.is_some()
    }

    /// The loop may end: the main child is gone, diagnostics are done and no child is left.
    pub fn finished(&self, children_left: bool) -> bool {
        self.main_exit.is_some() && !self.diagnosing() && !children_left
    }

    /// The stall's step, when stalled.
    fn stall_step(&mut self) -> Option<&mut StallStep> {
        match &mut self.state {
            State::Stalled { step, .. } => Some(step),
            _ => None,
        }
    }

    fn stop_stalled(&mut self, now: Instant, out: &mut Vec<Order>) {
        if self.s.observe {
            // Watched on: the clock restarts, a later stall is judged again.
            out.push(Order::Observed {
                would: format!(
                    "stop this rank (stalled): SIGTERM, then SIGKILL after {}",
                    crate::duration::format(self.s.stall_grace)
                ),
                reason: self.stall_reason(),
            });
            self.state = State::Monitoring;
            self.policy.on_resume(now);
            return;
        }
        out.push(Order::StopStalled {
            grace: self.s.stall_grace,
        });
        if let Some(step) = self.stall_step() {
            *step = StallStep::Stopped;
        }
        if self.kill_at.is_none() {
            self.grace_used = self.s.stall_grace;
        }
        self.kill_at.get_or_insert(now + self.s.stall_grace);
    }

    /// The coordinator cannot be reached.
    pub fn on_coordinator_lost(&mut self, error: String) -> Vec<Order> {
        self.coordinator_down = true;
        vec![Order::CoordinatorLost { error }]
    }

    /// The coordinator answers again.
    pub fn on_coordinator_back(&mut self, gap_s: f64, failed_requests: u64) -> Vec<Order> {
        self.coordinator_down = false;
        vec![Order::CoordinatorBack {
            gap_s,
            failed_requests,
        }]
    }

    /// A numerical failure to stop for: SIGTERM now, SIGKILL after
    /// `kill_grace` (the trainer's own grace: it may save what it can).
    pub fn on_numerical(&mut self, detail: String, now: Instant) -> Vec<Order> {
        if !self.monitoring() {
            return Vec::new();
        }
        if self.s.observe {
            return vec![Order::Observed {
                would: "stop this rank (numerical): SIGTERM".into(),
                reason: detail,
            }];
        }
        self.state = State::Stopping(StopReason::Numerical(detail.clone()));
        if self.kill_at.is_none() {
            self.grace_used = self.s.grace;
        }
        self.kill_at.get_or_insert(now + self.s.grace);
        vec![Order::StopForNumerical {
            detail,
            grace: self.s.grace,
        }]
    }

    /// A command of the coordinator for this rank (new, in order).
    pub fn on_command(
        &mut self,
        kind: crate::coordinator::protocol::CommandKind,
        now: Instant,
    ) -> Vec<Order> {
        use crate::coordinator::protocol::CommandKind;
        let mut out = Vec::new();
        match kind {
            CommandKind::Checkpoint { id, step, reason } => {
                out.push(Order::Checkpoint { id, step, reason })
            }
            CommandKind::Stop { reason } => {
                let (alive, monitoring) = (self.main_exit.is_none(), self.monitoring());
                let on_signal = matches!(self.state, State::Stopping(StopReason::Signal(_)));
                match self.stall_step() {
                    Some(StallStep::Diagnosing { stop_asked }) => *stop_asked = true,
                    Some(step) if alive && *step != StallStep::Stopped => {
                        out.push(Order::StopJudged { detail: reason });
                        self.stop_stalled(now, &mut out);
                    }
                    _ if monitoring => {
                        // The attempt failed elsewhere: this rank is most
                        // likely blocked in a collective with the failed one.
                        out.push(Order::StopForCoordinator {
                            detail: reason,
                            grace: self.s.stall_grace,
                        });
                        self.state = State::Stopping(StopReason::Coordinator);
                        if self.kill_at.is_none() {
                            self.grace_used = self.s.stall_grace;
                        }
                        self.kill_at.get_or_insert(now + self.s.stall_grace);
                    }
                    // Stopping on a SIGTERM already (the launcher's, tearing
                    // the attempt down, came first): the teardown is
                    // resilio's, and so is its grace (a trainer that ignores
                    // SIGTERM, as Lightning does, held a restart for the
                    // whole kill grace: trial 27).
                    _ if alive && on_signal => {
                        let by = now + self.s.stall_grace;
                        if self.kill_at.is_none_or(|k| k > by) {
                            self.kill_at = Some(by);
                            self.grace_used = self.s.stall_grace;
                        }
                    }
                    _ => {}
                }
            }
            CommandKind::CarryOn { reason } => {
                let step = self.stall_step().map(|s| *s);
                match step {
                    // Told while its diagnostics are still taken: once done.
                    Some(StallStep::Diagnosing { .. }) => self.carry_on = Some(reason),
                    Some(StallStep::AwaitingJudgment { .. }) if self.main_exit.is_none() => {
                        out.extend(self.carry_on_now(reason, now))
                    }
                    _ => {}
                }
            }
            CommandKind::Diagnose { reason } if self.main_exit.is_none() => {
                // A rank stalled itself answers too, with a look taken now
                // beside the others' (its stall's probe is a moment older:
                // the barrier it waited in may have let it go into a save).
                // Not during its diagnostics: the probe could catch the
                // trainer in its own dump signal's handler (writing, not
                // waiting); once they are done.
                match self.stall_step().map(|s| *s) {
                    None | Some(StallStep::AwaitingJudgment { .. }) => {
                        out.push(Order::Probe { reason })
                    }
                    Some(StallStep::Diagnosing { .. }) => {
                        self.probe_after_diagnostics = Some(reason)
                    }
                    Some(StallStep::Stopped | StallStep::Diagnosed) => {}
                }
            }
            CommandKind::Diagnose { .. } => {}
        }
        out
    }

    /// The job's freshest progress (from the coordinator's reply). A rank
    /// with no progress of its own (`own_progress` false) lives on it.
    pub fn on_job_progress(&mut self, at: Instant, own_progress: bool) -> Vec<Order> {
        if own_progress || at <= self.policy.launched() {
            return Vec::new();
        }
        self.silent_known = true;
        self.policy.on_peer_progress(at);
        vec![Order::LiveOnJobProgress]
    }

    /// The stall's diagnostics are done (and recorded).
    pub fn on_diagnostics_done(&mut self, now: Instant) -> Vec<Order> {
        let mut out = Vec::new();
        let stop_asked = matches!(
            self.stall_step(),
            Some(StallStep::Diagnosing { stop_asked: true })
        );
        if let Some(reason) = self.probe_after_diagnostics.take() {
            if self.main_exit.is_none() && !stop_asked {
                out.push(Order::Probe { reason });
            }
        }
        // Told to carry on (or stepped again) while the diagnostics were
        // taken; a stop asked for meanwhile (the coordinator tore the
        // attempt down) wins.
        if let Some(reason) = self
            .carry_on
            .take()
            .filter(|_| self.main_exit.is_none() && !stop_asked)
        {
            out.extend(self.carry_on_now(reason, now));
            return out;
        }
        if self.main_exit.is_none() {
            // Observe mode stops nothing, so waits for no judgment: the
            // stop that would have been is journaled now.
            if self.s.linked && !self.coordinator_down && !stop_asked && !self.s.observe {
                let wait = self.s.judgment_wait;
                if let Some(step) = self.stall_step() {
                    *step = StallStep::AwaitingJudgment { until: now + wait };
                }
                out.push(Order::DeferStallStop { max_wait: wait });
            } else {
                self.stop_stalled(now, &mut out);
            }
        } else {
            if let Some(step) = self.stall_step() {
                *step = StallStep::Diagnosed;
            }
            self.kill_at.get_or_insert(now + self.s.grace);
        }
        out
    }

    /// The main child exited; `others_alive`: descendants remain (they get
    /// TERM now, KILL after the grace).
    pub fn on_main_exit(&mut self, exit: Exit, now: Instant, others_alive: bool) -> Vec<Order> {
        self.main_exit = Some((exit, now));
        if others_alive {
            self.drain_kill_at = Some(now + self.s.grace);
            vec![Order::TermRemaining]
        } else {
            Vec::new()
        }
    }

    /// When to wake next (and remember it, to see a late wake in `tick`).
    pub fn plan(&mut self, now: Instant) -> Plan {
        let monitoring = self.monitoring();
        let p = &self.policy;
        // While monitoring, wake at the stall deadline (steps are drained
        // then) and often enough to keep the journal's progress current;
        // while stopping or draining, once a second to reap.
        // While its stall is looked into, every step wakes it: one past the
        // stall's withdraws it before the verdict.
        let judging = self.judging();
        let step_wake = monitoring
            .then(|| {
                p.deadline()
                    .checked_sub(p.min_future_limit())
                    .unwrap_or(now)
            })
            .or_else(|| judging.then(|| now + Duration::from_secs(3600)));
        let waiting_checkpoint =
            self.s.supervises_step && self.pre_timeout.is_some_and(|p| !p.done);
        let mut wake = if monitoring && !waiting_checkpoint {
            p.deadline().min(now + self.s.progress_every)
        } else {
            now + Duration::from_secs(1)
        };
        let stall_stop = match self.state {
            State::Stalled {
                step: StallStep::AwaitingJudgment { until },
                ..
            } => Some(until),
            _ => None,
        };
        for t in [self.kill_at, self.drain_kill_at, stall_stop]
            .into_iter()
            .flatten()
        {
            wake = wake.min(t);
        }
        self.planned = Some((wake, monitoring));
        Plan { step_wake, wake }
    }

    /// Whether to read the journal for the pre-timeout checkpoint now (at
    /// most once a second, and at the deadline): the wall time it was
    /// asked at, `checkpoint_done` records from then on count.
    pub fn checkpoint_query(&mut self, now: Instant) -> Option<DateTime<Utc>> {
        if !self.s.supervises_step || self.main_exit.is_some() {
            return None;
        }
        let p = self.pre_timeout.filter(|p| !p.done)?;
        if now < self.next_done_check && now < p.deadline {
            return None;
        }
        self.next_done_check = now + Duration::from_secs(1);
        Some(p.asked_wall)
    }

    /// Whether the stall limit is reached at `now` (the loop then looks
    /// at whether the trainer is stopped before [`Self::tick`]).
    pub fn limit_reached(&self, now: Instant) -> bool {
        self.monitoring() && !self.s.supervises_step && now >= self.policy.deadline()
    }

    /// The trainer is stopped (Ctrl-Z at a terminal, SIGSTOP, `scontrol
    /// suspend` of its tasks): the time it spends stopped is nobody's
    /// stall, and its clock restarts. Recorded once per stop; `false` when
    /// it is found running again.
    pub fn trainer_stopped(&mut self, now: Instant, stopped: bool) -> Vec<Order> {
        if !stopped {
            self.trainer_was_stopped = false;
            return Vec::new();
        }
        self.policy.on_resume(now);
        if std::mem::replace(&mut self.trainer_was_stopped, true) {
            Vec::new()
        } else {
            vec![Order::TrainerStopped]
        }
    }

    /// The coordinator found a peer working without a word: the stall is
    /// withdrawn, the rank watched on with its clock restarted.
    fn carry_on_now(&mut self, reason: String, now: Instant) -> Vec<Order> {
        self.state = State::Monitoring;
        self.policy.on_resume(now);
        vec![Order::CarryOn { reason }]
    }

    /// The stall under way, in words (observe mode's record).
    fn stall_reason(&self) -> String {
        match &self.state {
            State::Stalled { stall, .. } => format!(
                "{} (limit {}, last step {})",
                stall.kind.name(),
                crate::duration::format(stall.timeout),
                stall.last_step.map_or("-".to_string(), |s| s.to_string())
            ),
            _ => "stalled".into(),
        }
    }

    /// The trainer was found working at its step limit (`cpu_s` of CPU in
    /// `window_s`), waiting on no peer (`probe`): busy and silent, given an
    /// evaluation's limit ([`StallPolicy::on_busy`]). Nothing when it is not
    /// stepping (starting, already busy, in a long phase).
    pub fn busy_silent(
        &mut self,
        now: Instant,
        (cpu_s, cpu_wait_s, io_bytes): (f64, f64, u64),
        window_s: f64,
        probe: String,
    ) -> Vec<Order> {
        // Looked at again while busy, still working: said once already.
        let again = self.policy.busy();
        if !self.policy.on_busy(now) || again {
            return Vec::new();
        }
        vec![Order::BusySilent {
            cpu_s,
            cpu_wait_s,
            io_bytes,
            window_s,
            limit_s: self.policy.current_limit().0.as_secs_f64(),
            probe,
        }]
    }

    /// Time passed: `now`, after the events of this round were handled;
    /// `checked` is the answer to [`Self::checkpoint_query`].
    pub fn tick(&mut self, now: Instant, checked: Checked) -> Vec<Order> {
        let mut out = Vec::new();
        // Woken long after the planned time: resilio itself was stopped
        // (suspend, SIGSTOP) or starved. Time it did not observe is not a
        // stall; the clock restarts (the SIGCONT may not be handled yet).
        if let Some((wake, true)) = self.planned {
            if now > wake + Duration::from_millis(1500) {
                self.policy.on_resume(now);
                out.push(Order::Resumed {
                    late: now.duration_since(wake),
                });
            }
        }
        // Fail open: a silent rank (it reports nothing; it lived on the job's
        // progress) whose coordinator is unreachable cannot know whether the
        // job progresses, and is not stopped for its silence meanwhile.
        if self.coordinator_down && self.silent_known {
            self.policy.on_peer_progress(now);
        }
        // The job-level supervisor does not judge hangs from srun's merged
        // output (ranks report on their own sockets): the rank agents do.
        if self.monitoring() && !self.s.supervises_step {
            if let Some(s) = self.policy.check(now) {
                self.state = State::Stalled {
                    stall: s.clone(),
                    at: now,
                    step: StallStep::Diagnosing { stop_asked: false },
                };
                out.push(Order::Stalled { stall: s, at: now });
            }
        }
        self.pre_timeout_tick(now, checked, &mut out);
        self.deadlines_tick(now, &mut out);
        out
    }

    fn pre_timeout_tick(&mut self, now: Instant, checked: Checked, out: &mut Vec<Order>) {
        let hosts = self.s.hosts_coordinator;
        if let Some(p) = self
            .pre_timeout
            .as_mut()
            .filter(|p| hosts && !p.coordinated)
        {
            // Besides the signal: the ranks' agents tell their trainers the step.
            p.coordinated = true;
            out.push(Order::CoordinateCheckpoint);
        }
        let Some(p) = self.pre_timeout.as_mut() else {
            return;
        };
        let done = match checked {
            Checked::NotLooked => return,
            Checked::NotDone => None,
            Checked::Done(step) => Some(step),
        };
        if p.done || self.main_exit.is_some() || (done.is_none() && now < p.deadline) {
            return;
        }
        p.done = true;
        out.push(Order::StopForPreTimeout {
            checkpoint_step: done,
        });
        self.state = State::Stopping(StopReason::Signal("pre-timeout"));
        self.kill_at.get_or_insert(now + self.s.grace);
    }

    fn deadlines_tick(&mut self, now: Instant, out: &mut Vec<Order>) {
        let due = |t: Option<Instant>| t.is_some_and(|t| now >= t);
        let judgment_due = matches!(self.state, State::Stalled { step: StallStep::AwaitingJudgment { until }, .. } if now >= until);
        if judgment_due && self.main_exit.is_none() {
            self.stop_stalled(now, out);
        }
        if due(self.kill_at) || due(self.drain_kill_at) {
            let mut record = None;
            if !self.killed {
                self.killed = true;
                self.killed_at = Some(now);
                record = Some(self.grace_used);
            }
            // Again each time round: a process can appear during the sweep.
            out.push(Order::Kill { record });
        }
        // A descendant that survives SIGKILL (uninterruptible sleep in a
        // driver or a hung filesystem) must not keep resilio from reporting.
        if self.main_exit.is_some()
            && self
                .killed_at
                .is_some_and(|t| now.duration_since(t) > Duration::from_secs(10))
        {
            out.push(Order::GiveUp);
        }
    }

    /// How the rank ended, once the main child has. A trainer that ended on
    /// its own while the stall's evidence was being taken (not by resilio's
    /// stop, nor by the diagnostics' `dump_signal`) keeps its own status.
    pub fn ending(&self, dump_signal: Option<Signal>) -> Option<Ending> {
        let (exit, exited_at) = self.main_exit?;
        let by_dump_signal =
            matches!((exit, dump_signal), (Exit::Signal(s, _), Some(d)) if s == d as i32);
        let mut e = Ending {
            exit,
            stall: None,
            stall_cancelled: false,
            stop: None,
            failed_at: Some(exited_at),
            pre_timeout: self.pre_timeout.is_some(),
        };
        match &self.state {
            State::Monitoring => {}
            State::Stopping(reason) => e.stop = Some(reason.clone()),
            State::Stalled { step, .. } if *step != StallStep::Stopped && !by_dump_signal => {
                e.stall_cancelled = true;
            }
            State::Stalled { stall, at, .. } => {
                e.stall = Some(stall.clone());
                e.stop = Some(StopReason::Stall);
                e.failed_at = Some(*at);
            }
        }
        Some(e)
    }
}

#[cfg(test)]
mod tests;
