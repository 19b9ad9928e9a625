//! The effects that carry the lifecycle's actions out: signals to the
//! trainer or through Slurm, journal records, diagnostics threads, probes,
//! checkpoint requests, the coordinator's report.

use super::busy::{worked, BUSY_SHARE, BUSY_WINDOW};
use super::lifecycle::Order;
use super::records::{on_stall, record_of, stop_stalled, write_control};
use super::run::Agent;
use crate::coordinator::protocol::RankState;
use crate::event as ev;
use crate::event::ProbeFinding;
use crate::process;
use crate::rank::diagnostics::{self, Diagnostics};
use nix::sys::signal::Signal;
use std::time::Instant;

impl Agent<'_> {
    /// Carry the actions out, in order; `false`: the loop ends (given up).
    pub(super) fn carry_out(&mut self, actions: Vec<Order>) -> bool {
        for a in actions {
            if !self.act(a) {
                return false;
            }
        }
        true
    }

    pub(super) fn act(&mut self, a: Order) -> bool {
        let pid = self.rank.pid;
        if let Some((event, durable)) = record_of(&a) {
            self.rank.journal.write(event, durable);
        }
        match a {
            Order::Forward(sig) => process::signal_group(pid, sig),
            Order::KillOnSecondInt => process::signal_tree(pid, Signal::SIGKILL, &self.skip()),
            Order::PreTimeoutCheckpoint { received } => self.pre_timeout_checkpoint(received),
            Order::CheckpointSignal { received, forward } => {
                self.checkpoint_signal(received, forward)
            }
            Order::Stalled { stall, at } => self.stalled(&stall, at),
            Order::StopStalled { grace } => {
                let skip = self.skip();
                stop_stalled(&mut self.rank.journal, pid, &skip, grace);
            }
            Order::StopForCoordinator { .. } | Order::StopForNumerical { .. } => {
                process::terminate(pid, None)
            }
            Order::Probe { reason } => self.probe(reason),
            Order::Checkpoint { id, step, reason } => self.checkpoint(id, step, reason),
            Order::LiveOnJobProgress => self.live_on_job_progress(),
            Order::CoordinatorLost { error } => tracing::warn!(
                "coordinator unreachable ({error}); supervising this rank locally, retrying"
            ),
            Order::CoordinateCheckpoint => self.coordinate_checkpoint(),
            Order::StopForPreTimeout { checkpoint_step } => {
                self.stop_for_pre_timeout(checkpoint_step)
            }
            Order::TermRemaining => process::signal_tree(pid, Signal::SIGTERM, &self.skip()),
            Order::Kill { .. } => process::signal_tree(pid, Signal::SIGKILL, &self.skip()),
            Order::GiveUp => {
                self.give_up();
                return false;
            }
            Order::LeftToSlurm(_)
            | Order::Deferred(_)
            | Order::StopJudged { .. }
            | Order::DeferStallStop { .. }
            | Order::CoordinatorBack { .. }
            | Order::Resumed { .. }
            | Order::TrainerStopped => {}
            Order::CarryOn { reason } => {
                tracing::warn!(
                    "rank {}: stall withdrawn: {reason}; watched on",
                    self.rank.id.rank
                );
                self.rank.outbox.update(|r| r.state = RankState::Running);
                self.rank.outbox.urgent.notify_one();
            }
            Order::Observed { would, .. } => {
                tracing::warn!(
                    "observe mode: would {would}; nothing done, rank {} watched on",
                    self.rank.id.rank
                );
                self.rank.outbox.update(|r| r.state = RankState::Running);
                self.rank.outbox.urgent.notify_one();
            }
            Order::BusySilent {
                cpu_s,
                cpu_wait_s,
                io_bytes,
                window_s,
                ..
            } => {
                let how = if worked(cpu_s, 0.0, window_s) {
                    format!("{cpu_s:.2}s of CPU in {window_s:.1}s")
                } else if worked(cpu_s, cpu_wait_s, window_s) {
                    format!("{cpu_s:.2}s of CPU and {cpu_wait_s:.2}s ready to run but waiting for one, in {window_s:.1}s: the node's CPUs are oversubscribed")
                } else {
                    format!(
                        "{:.1} MB read and written in {window_s:.1}s",
                        io_bytes as f64 / 1e6
                    )
                };
                tracing::warn!(
                    "rank {} on {}: no progress for the step limit, but working ({how}, waiting on no peer): busy and silent, judged by the evaluation limit ({}) from now",
                    self.rank.id.rank,
                    self.rank.id.node,
                    crate::duration::format(self.lifecycle.policy.current_limit().0)
                );
                self.rank.outbox.update(|r| {
                    r.phase = crate::policy::stall::BUSY.into();
                    r.long_phase = true;
                });
                self.rank.outbox.urgent.notify_one();
            }
        }
        true
    }

    /// The checkpoint signal in a step: a request, recorded; the trainer
    /// signalled unless Slurm did.
    fn checkpoint_signal(&mut self, received: Signal, forward: bool) {
        self.rank.journal.write(
            ev::CheckpointRequested {
                reason: "signal".into(),
                received: Some(received.as_str().into()),
                sent: forward.then(|| received.as_str().into()),
                ..Default::default()
            },
            true,
        );
        if forward {
            process::signal_group(self.rank.pid, received);
        }
    }

    fn live_on_job_progress(&self) {
        self.rank.outbox.update(|r| {
            if r.state == RankState::Starting {
                r.state = RankState::Running;
                r.silent = true;
            }
        });
    }

    /// Descendants survived SIGKILL for 10 s (uninterruptible sleep in a
    /// driver, a hung filesystem): recorded, not waited for.
    fn give_up(&mut self) {
        let left: Vec<i32> = process::live_children(&self.skip())
            .iter()
            .map(|p| p.pid)
            .collect();
        self.rank.journal.write(
            ev::Unkillable {
                pids: left.clone(),
                note: "still alive 10 s after SIGKILL; not waited for".into(),
            },
            true,
        );
        tracing::warn!("processes {left:?} survived SIGKILL; exiting without them");
    }

    /// In a batch script, Slurm's pre-timeout signal: the checkpoint signal
    /// goes to srun (which delivers it to every process of the step) or
    /// straight to a trainer the script runs itself.
    fn pre_timeout_checkpoint(&mut self, received: Signal) {
        let cfg = &self.rank.cfg;
        if let Some(ck) = cfg.checkpoint_signal {
            process::signal_group(self.rank.pid, ck);
        }
        self.rank.journal.write(
            ev::CheckpointRequested {
                reason: "pre_timeout".into(),
                received: Some(received.as_str().into()),
                sent: cfg.checkpoint_signal.map(|s| s.as_str().into()),
                via_srun: Some(self.child_is_srun),
                ..Default::default()
            },
            true,
        );
    }

    /// The stall policy fired: record it, probe (when linked) and take the
    /// diagnostics on a thread of their own.
    fn stalled(&mut self, s: &crate::policy::stall::Stall, now: Instant) {
        let r = &mut *self.rank;
        // What the trainer is blocked on, before anything disturbs it.
        // (Its verdict goes to the coordinator with the stacks the
        // diagnostics take next.)
        // The look at its limit found it not working: its CPU time goes with
        // the probe.
        let idle = self.busy.idle.take();
        let probe = r.link.is_some().then(|| ProbeFinding {
            cpu: idle.map(|i| (i.cpu_s, i.over_s)),
            cpu_wait_s: idle.map(|i| i.wait_s),
            ..diagnostics::probe(&self.helpers.with(|h| h.clone()))
        });
        on_stall(
            s,
            &self.lifecycle.policy,
            &mut self.plog,
            &mut r.journal,
            (&r.clock, &r.id),
            now,
            (
                probe.as_ref().map(|p| p.waiting_on_peer),
                idle.filter(|_| !crate::device::accelerators_here()),
            ),
        );
        if let Some(p) = probe {
            r.outbox.update(|r| {
                r.state = RankState::Stalled;
                r.probe = Some(p.evidence.join("; "));
            });
            r.outbox.urgent.notify_one();
            self.stall_probe = Some(p);
        }
        let dcfg = r.cfg.diagnostics.clone();
        let h = self.helpers.clone();
        let dtx = self.diag_tx.clone();
        let scratch = self.scratch.clone();
        let pid = r.pid;
        let spawned = std::thread::Builder::new()
            .name("diagnostics".into())
            .spawn(move || {
                let _ = crate::journal::create_private_dir_all(&scratch);
                let d = diagnostics::gather(&dcfg, pid, &h, &scratch);
                let _ = dtx.send(d);
            });
        if spawned.is_err() {
            // No thread to be had (the very limit the trainer may have
            // hit): stop without diagnostics rather than not at all.
            let _ = self.diag_tx.send(Diagnostics {
                py_spy_skipped: Some("no thread available for diagnostics".into()),
                ..Default::default()
            });
        }
    }

    /// The coordinator asks for a probe: the system calls now, then py-spy
    /// stacks, off the loop (py-spy takes a moment).
    fn probe(&mut self, reason: String) {
        let p = diagnostics::probe(&self.skip());
        let lines = self
            .rank
            .tail
            .last_lines(self.rank.cfg.diagnostics.tail_lines);
        let (dcfg, h, ptx, scratch) = (
            self.rank.cfg.diagnostics.clone(),
            self.helpers.clone(),
            self.probe_tx.clone(),
            self.scratch.clone(),
        );
        let trainer = self.rank.pid.as_raw();
        let asked = self.probe_asked;
        let spawned = std::thread::Builder::new()
            .name("probe".into())
            .spawn(move || {
                // The trainer's CPU time over the probe (half a second at least):
                // a rank not waiting that works is busy, not hung.
                let work = || (Instant::now(), process::tree_work(trainer));
                let (t0, work0) = work();
                let io0 = process::tree_io_bytes(trainer);
                let (dumps, skipped) = diagnostics::dump_stacks(&dcfg, &h, &scratch);
                if let Some(rest) = BUSY_WINDOW.checked_sub(t0.elapsed()) {
                    std::thread::sleep(rest);
                }
                let measure = |p: &mut crate::event::ProbeFinding, t: Instant, before| {
                    let (cpu, waited) = process::tree_work(trainer).since(before);
                    p.cpu = Some((cpu, t.elapsed().as_secs_f64()));
                    p.cpu_wait_s = Some(waited);
                };
                let mut p = p;
                measure(&mut p, t0, work0);
                // The first look spans the stack read, which stops every
                // thread of the trainer and lets them go: on a loaded node
                // they then wait for a CPU, a wait the read caused. Only CPU
                // time settles it; else the second look decides.
                if p.waiting_on_peer == Some(false) && !p.busy_on_cpu(BUSY_SHARE) {
                    // Evidence before a kill: a second look, clear of the
                    // stack read (which holds the trainer while it reads)
                    // and of a moment's want of a core.
                    let (t1, work1) = work();
                    std::thread::sleep(BUSY_WINDOW);
                    measure(&mut p, t1, work1);
                    // Waiting on a peer by now: it worked its way into a
                    // collective meanwhile (the end of a long evaluation).
                    let later = diagnostics::probe(&h.with(|x| x.clone()));
                    if later.waiting_on_peer == Some(true) {
                        p.reached_peer = true;
                        p.evidence.push(format!(
                            "waiting on a peer {:.1}s later: it worked its way into a collective during the probe",
                            t0.elapsed().as_secs_f64()
                        ));
                    }
                }
                // Its I/O over the whole probe (the stack read moves none).
                let moved = process::tree_io_bytes(trainer).saturating_sub(io0);
                let over = t0.elapsed().as_secs_f64();
                p.io = Some((moved, over));
                if crate::event::ProbeFinding::moved(moved, over) {
                    p.evidence.push(format!(
                        "read and wrote {:.1} MB in {over:.1}s",
                        moved as f64 / 1e6
                    ));
                }
                let p = diagnostics::with_stacks(p, &dumps, skipped.as_deref());
                let p = diagnostics::with_output(p, &lines);
                let _ = ptx.send((reason, p, dumps, asked));
            });
        if spawned.is_err() {
            self.rank.outbox.update(|r| {
                r.probed = true;
                r.probe_seq = asked;
            });
            self.rank.outbox.urgent.notify_one();
        }
    }

    /// A coordinated checkpoint: the control file, and the checkpoint
    /// signal when configured.
    fn checkpoint(&mut self, ck: u64, step: u64, reason: String) {
        let r = &mut *self.rank;
        let control_path = &r.control_path;
        let written = write_control(
            control_path,
            &format!("checkpoint id={ck} step={step} reason={reason}\n"),
        );
        let signalled = r
            .cfg
            .coordinator
            .signal_trainer
            .then_some(r.cfg.checkpoint_signal)
            .flatten();
        if let Some(sig) = signalled {
            process::signal_group(r.pid, sig);
        }
        r.journal.write(
            ev::CheckpointRequested {
                id: Some(ck),
                step: Some(step),
                reason: reason.to_string(),
                coordinated: Some(true),
                control_file: written
                    .as_ref()
                    .ok()
                    .map(|_| control_path.to_string_lossy().into_owned()),
                control_error: written.err().map(|e| e.to_string()),
                signal: signalled.map(|s| s.as_str().into()),
                ..Default::default()
            },
            true,
        );
    }

    /// Besides the signal: the ranks' agents tell their trainers the step.
    fn coordinate_checkpoint(&mut self) {
        let Some(c) = &self.rank.hosted else {
            return;
        };
        match c.request_checkpoint("pre_timeout") {
            Ok((ck, step)) => self.rank.journal.write(
                ev::CheckpointCoordinated {
                    id: Some(ck),
                    step: Some(step),
                    reason: "pre_timeout".into(),
                    error: None,
                },
                false,
            ),
            Err(e) => self.rank.journal.write(
                ev::CheckpointCoordinated {
                    error: Some(e.to_string()),
                    reason: "pre_timeout".into(),
                    ..Default::default()
                },
                false,
            ),
        }
    }

    fn stop_for_pre_timeout(&mut self, done: Option<Option<u64>>) {
        self.rank.journal.write(
            ev::Stop {
                reason: Some("pre_timeout".into()),
                signal: "SIGTERM".into(),
                checkpoint_step: done.flatten(),
                checkpoint_confirmed: Some(done.is_some()),
                ..Default::default()
            },
            true,
        );
        // Stop the step gently: SIGTERM to every process of its
        // steps (the agents journal their ranks' ends); srun
        // itself would cancel the step with SIGKILL.
        let gentle = self.child_is_srun
            && self
                .slurm_cli
                .signal_steps(&self.rank.id.job, Signal::SIGTERM)
                .is_ok();
        if !gentle {
            process::signal_group(self.rank.pid, Signal::SIGTERM);
        }
    }
}
