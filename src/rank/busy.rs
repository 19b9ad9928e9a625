//! At the stall limit, before a stall: is the trainer working? Its CPU time
//! and I/O are watched for a moment, with a probe at each look: working and
//! waiting on no peer is busy and silent (an evaluation nobody announced, a
//! long step), not hung.

use super::lifecycle::{Lifecycle, Order};
use crate::process;
use crate::rank::diagnostics::{self};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// How long the trainer's CPU time is watched at its step limit.
pub(super) const BUSY_WINDOW: Duration = Duration::from_millis(500);
/// The share of a core it must work meanwhile to be busy, not hung.
pub(super) const BUSY_SHARE: f64 = 0.2;

/// Working over a look of `window_s`: at least [`BUSY_SHARE`] of a core, on
/// a CPU or ready to run and waiting for one. The one rule of the step
/// limit's look, the coordinator's probe and their messages.
pub(super) fn worked(cpu_s: f64, wait_s: f64, window_s: f64) -> bool {
    crate::event::ProbeFinding::worked(cpu_s, wait_s, window_s, BUSY_SHARE)
}

/// A look at the step limit that found the trainer not working: seconds
/// on a CPU, seconds ready to run but waiting for one, over seconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Idle {
    pub cpu_s: f64,
    pub wait_s: f64,
    pub over_s: f64,
}

/// A look at the trainer's CPU time at its step limit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BusyLook {
    /// The wait it is about (the stall policy's anchor then).
    anchor: Instant,
    t0: Instant,
    /// What the trainer had worked ([`process::tree_work`]).
    work0: process::Work,
    /// Bytes the trainer had read and written ([`process::tree_io_bytes`]).
    io0: u64,
    /// Probes taken so far, and whether every one found it waiting on a
    /// peer (a healthy data-parallel rank is in a collective a good share
    /// of the time: one look may catch it there, several do not).
    looks: u32,
    always_waiting: bool,
}

/// How many times the trainer is probed during a busy look.
const BUSY_LOOKS: u32 = 5;

/// The look under way, and what the last one found.
#[derive(Debug, Default)]
pub(crate) struct Busy {
    look: Option<BusyLook>,
    /// The last look found the trainer not working: its CPU time (seconds
    /// worked, seconds watched), for the stall's probe.
    pub idle: Option<Idle>,
}

impl Busy {
    /// At the step limit, before a stall: is the trainer working? Its CPU
    /// time is taken, the stall held for [`BUSY_WINDOW`], then taken again.
    /// Working (at least [`BUSY_SHARE`] of a core) and waiting on no peer:
    /// busy and silent (an evaluation nobody announced, a long step). Else
    /// the stall goes ahead as it would have.
    pub(super) fn look(
        &mut self,
        lc: &mut Lifecycle,
        pid: Pid,
        skip: &[i32],
        now: Instant,
    ) -> Vec<Order> {
        if !lc.policy.busy_lookable() {
            self.look = None;
            return Vec::new();
        }
        let anchor = lc.policy.anchor();
        match self.look {
            Some(mut b) if b.anchor == anchor => {
                let p = diagnostics::probe(skip);
                b.looks += 1;
                b.always_waiting &= p.waiting_on_peer == Some(true);
                if b.looks < BUSY_LOOKS {
                    self.look = Some(b);
                    let next = b.t0 + BUSY_WINDOW * (b.looks + 1) / BUSY_LOOKS;
                    lc.policy.hold_until(next.max(now));
                    return Vec::new();
                }
                self.look = None;
                // Waiting on a peer at every look: its stall goes ahead,
                // and the coordinator judges the peer (working: busy and
                // silent, this stall withdrawn; else hung, whatever phase
                // it is in).
                if b.always_waiting {
                    return Vec::new();
                }
                // Ready to run but waiting for a CPU (more runnable threads
                // than cores) is work held back, not idleness.
                let (cpu_s, wait_s) = process::tree_work(pid.as_raw()).since(b.work0);
                let window_s = now.saturating_duration_since(b.t0).as_secs_f64();
                // Writing a save to a slow file system works as surely as
                // computing does, with little CPU time.
                let io = process::tree_io_bytes(pid.as_raw()).saturating_sub(b.io0);
                if !worked(cpu_s, wait_s, window_s)
                    && !crate::event::ProbeFinding::moved(io, window_s)
                {
                    self.idle = Some(Idle {
                        cpu_s,
                        wait_s,
                        over_s: window_s,
                    });
                    return Vec::new();
                }
                lc.busy_silent(now, (cpu_s, wait_s, io), window_s, p.evidence.join("; "))
            }
            _ => {
                self.idle = None;
                self.look = Some(BusyLook {
                    anchor,
                    t0: now,
                    work0: process::tree_work(pid.as_raw()),
                    io0: process::tree_io_bytes(pid.as_raw()),
                    looks: 0,
                    always_waiting: true,
                });
                lc.policy.hold_until(now + BUSY_WINDOW / BUSY_LOOKS);
                Vec::new()
            }
        }
    }
}
