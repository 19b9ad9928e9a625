//! What a dead agent leaves behind. The launcher is child subreaper: when
//! an agent dies (`kill -9`, the OOM killer, a crash), its trainer gets the
//! agent's pdeathsig and every process the trainer started is re-parented
//! to the launcher instead of init. Any child of the launcher that is not
//! a running agent is such an orphan: its process group and its own
//! descendants get SIGTERM, then SIGKILL after the grace, and it is reaped.

use crate::process;
use nix::sys::signal::Signal;
use nix::unistd::{getpgrp, Pid};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Orphans seen, with when each gets SIGKILL.
#[derive(Default)]
pub(super) struct Orphans {
    kill_at: BTreeMap<i32, Instant>,
    /// Outlived SIGKILL (stuck in the kernel): not waited for again.
    given_up: BTreeSet<i32>,
}

impl Orphans {
    /// Reap the orphans that ended, signal the ones alive. `agents`: the
    /// pids of the agents not reaped yet (never touched here); `at_once`:
    /// SIGKILL without the grace (a second Ctrl-C).
    pub(super) fn sweep(&mut self, agents: &[i32], grace: Duration, at_once: bool) {
        let first = agents.first().copied().unwrap_or(0);
        process::reap_orphans(Pid::from_raw(first), agents);
        let live = process::live_children(agents);
        let now = Instant::now();
        self.kill_at
            .retain(|pid, _| live.iter().any(|p| p.pid == *pid));
        self.given_up
            .retain(|pid| live.iter().any(|p| p.pid == *pid));
        for p in live
            .iter()
            .filter(|p| p.state != 'Z' && !self.given_up.contains(&p.pid))
        {
            let due = *self.kill_at.entry(p.pid).or_insert_with(|| {
                tracing::debug!("pid {} ({}) outlived its agent: stopping it", p.pid, p.comm);
                signal(p, agents, Signal::SIGTERM);
                now + grace
            });
            if at_once || now >= due {
                signal(p, agents, Signal::SIGKILL);
            }
        }
    }

    /// Orphans still being stopped (the attempt is over only when none is).
    /// One that outlives SIGKILL by 5 s (stuck in the kernel) is given up.
    pub(super) fn pending(&mut self) -> bool {
        let now = Instant::now();
        let given_up = &mut self.given_up;
        self.kill_at.retain(|pid, due| {
            let keep = now < *due + Duration::from_secs(5);
            if !keep {
                tracing::warn!("pid {pid} outlived SIGKILL: left behind");
                given_up.insert(*pid);
            }
            keep
        });
        !self.kill_at.is_empty()
    }
}

/// `sig` to an orphan's process group (the dead trainer's, unless it is
/// this process's own or an agent's), to the orphan and to its descendants.
fn signal(p: &process::ProcInfo, agents: &[i32], sig: Signal) {
    if p.pgid != getpgrp().as_raw() && !agents.contains(&p.pgid) && p.pgid > 1 {
        process::signal_group(Pid::from_raw(p.pgid), sig);
    }
    let _ = nix::sys::signal::kill(Pid::from_raw(p.pid), sig);
    for d in process::descendants(p.pid) {
        let _ = nix::sys::signal::kill(Pid::from_raw(d.pid), sig);
    }
}
