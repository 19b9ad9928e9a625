//! Reports from the agents: each rank's latest state, a stall starting a
//! hang judgment, a crash tearing the step down (or, at exit, waiting a
//! moment for the others to finish).

use super::*;

impl JobView {
    /// One report from an agent (refused, and counted, if out of range).
    pub fn on_report(&mut self, r: Report, now: Instant) -> Vec<Effect> {
        if let Err(e) = self.check_report(&r) {
            self.rejected += 1;
            tracing::debug!("coordinator: report refused: {e}");
            return Vec::new();
        }
        self.on_checked_report(r, false, now)
    }

    /// One report that [`JobView::check_report`] passed (`relayed`: in a
    /// node relay's batch).
    pub fn on_checked_report(&mut self, r: Report, relayed: bool, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        self.reports += 1;
        if r.attempt < self.attempt {
            return out; // a straggling report of an earlier attempt
        }
        let prev = self.ranks.get(&r.rank);
        let stepped = r.step.is_some() && prev.is_none_or(|p| p.report.step != r.step);
        // Progress of any source (not only a new step number: Lightning's
        // bar between two optimizer steps) is when the rank was last alive.
        let last_step_at = match r.progress_age_s.filter(|a| a.is_finite()) {
            Some(age) => {
                let age = Duration::from_secs_f64(age.clamp(0.0, 1e6));
                Some(now.checked_sub(age).unwrap_or(now))
            }
            None => prev.and_then(|p| p.last_step_at),
        };
        let was_lost = prev.filter(|p| p.lost).map(|p| now.duration_since(p.heard));
        let prev_state = prev.map(|p| p.report.state);
        // A stalled rank past the step it stalled at: its wait is over.
        let stepped_on = match (prev.and_then(|p| p.report.step), r.step) {
            (Some(before), Some(now)) if prev_state == Some(RankState::Stalled) => {
                (now > before).then_some(now)
            }
            _ => None,
        };
        self.heard(&r, was_lost, stepped, last_step_at, now, &mut out);
        let rank = r.rank;
        let node = r.node.clone();
        let state = r.state;
        let exit = r.exit.clone();
        let checkpoints = r.checkpoints.clone();
        let probe_answered = Entry::answers(&r, self.probes_asked);
        let facts = self.set_entry(
            rank,
            Entry {
                report: r,
                heard: now,
                last_step_at,
                lost: false,
                probe_answered,
                relayed,
            },
        );
        // Coordinated checkpoint confirmations.
        if let Some(p) = self.pending.as_mut() {
            if checkpoints.contains(&p.step) && !p.confirmed.contains_key(&rank) {
                p.confirmed.insert(rank, now);
                if facts.live {
                    p.confirmed_live += 1;
                }
            }
        }
        self.settle_checkpoint(now, false, &mut out);

        if state == RankState::Stalled && prev_state != Some(RankState::Stalled) {
            self.stall_reported(rank, &node, now, &mut out);
        }
        if let Some(e) = &exit {
            let was_stalled = prev_state == Some(RankState::Stalled);
            self.on_exit(rank, &node, e, was_stalled, now, &mut out);
        }
        // Or its agent withdrew the stall (it found the trainer stepping or
        // working again; in observe mode every stall is let go, and judged).
        let back = prev_state == Some(RankState::Stalled)
            && state == RankState::Running
            && !self.cfg.observe;
        let passed = match (stepped_on, back) {
            (Some(step), _) => Some(format!("stepped again (step {step})")),
            (None, true) => Some("carried on (its agent found its trainer working again)".into()),
            _ => None,
        };
        if let Some(what) = passed {
            self.stall_passed(rank, what, &mut out);
        }
        if self.failing.as_ref().is_some_and(|f| !f.judged) && self.probes_complete() {
            self.judge_hang(now, &mut out);
        }
        out
    }

    /// A rank's exit. A crash with no stall being judged (or of a rank not
    /// stalled, with a failure of its own, while one is) tears the step
    /// down now, not after the collective timeout. An abort or a segfault
    /// with no signature of its own (torch's threads at interpreter exit,
    /// once training is done) gives the other ranks a moment to finish on
    /// their own first: tearing a finished run down would run it all again.
    fn on_exit(
        &mut self,
        rank: u32,
        node: &str,
        e: &ExitInfo,
        was_stalled: bool,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        // A rank that finished (exit 0, or an exit-time crash after its
        // trainer reported the end of training) is no failure, and
        // training is over for the others too: they finish on their
        // own, however long their last save takes.
        let finished = e.class == crate::event::Class::Clean;
        if finished {
            self.exit_crash = None;
        }
        let crashed = e.code != 0 && !e.stopped && !finished;
        let at_exit = matches!(e.code, 134 | 139) && e.class == crate::event::Class::Unknown;
        // A rank not stalled crashed with a failure of its own while a stall
        // is judged: the stall was its echo (the peer waited for the rank
        // that was crashing: an exception's unwinding can take seconds), so
        // the judgment ends and the crash is the failure. (Not a peer's
        // echo itself, nor a crash at exit, which waits for the rest.)
        if crashed
            && !at_exit
            && e.class != crate::event::Class::Secondary
            && self.failing.as_ref().is_some_and(|f| !f.judged)
            && !was_stalled
        {
            self.failing = None;
        }
        if crashed && self.failing.is_none() {
            let reason = format!(
                "rank {rank} on {node} exited {} ({}: {})",
                e.code, e.class, e.cause
            );
            if at_exit && self.exit_crash.is_none() {
                self.exit_crash = Some(ExitCrash {
                    rank,
                    node: node.to_string(),
                    reason,
                    until: now + EXIT_CRASH_GRACE,
                    probed_until: None,
                });
            } else if !at_exit {
                self.exit_crash = None;
                self.fail(rank, node, reason, None, now, out);
            }
        }
    }

    /// A rank heard from again after it was taken for lost, and the first
    /// step after a failure (the relaunch's measure).
    fn heard(
        &mut self,
        r: &Report,
        was_lost: Option<Duration>,
        stepped: bool,
        last_step_at: Option<Instant>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        if let Some(silent) = was_lost {
            out.push(journal(
                ev::RankHeardAgain {
                    about_rank: r.rank,
                    about_node: r.node.clone(),
                    silent_s: Some(silent.as_secs_f64()),
                },
                false,
            ));
        }
        if stepped && !self.relaunch_measured {
            self.relaunch_measured = true;
            if let Some(f) = self.failed_at {
                let took = last_step_at.unwrap_or(now).saturating_duration_since(f);
                out.push(journal(
                    ev::Relaunched {
                        failure_to_first_step_s: took.as_secs_f64(),
                        first_rank: r.rank,
                    },
                    true,
                ));
            }
        }
    }

    /// A rank's agent says it stalled: the first one starts a hang judgment
    /// and asks every live rank for a probe.
    fn stall_reported(&mut self, rank: u32, node: &str, now: Instant, out: &mut Vec<Effect>) {
        self.stalls += 1;
        out.push(journal(
            ev::StallReported {
                about_rank: rank,
                about_node: node.to_string(),
            },
            false,
        ));
        if self.failing.is_some() {
            return;
        }
        self.failing = Some(Failing {
            rank,
            judge_by: now + self.cfg.hang_wait,
            judged: false,
        });
        // The stalled rank too: its stall's probe was taken a moment before
        // the others' will be, and the wait may have ended meanwhile (a
        // barrier let go into a save that prints nothing: trial 28).
        let live: Vec<u32> = self.live().map(|(r, _)| *r).collect();
        self.ask_probes(live, format!("rank {rank} stalled"));
    }

    /// The moment given to the others after an abort with no signature ran
    /// out: they are probed. One still working (its CPU time moves, it waits
    /// on no peer) or shown elsewhere than in a collective (writing a file,
    /// asleep in its own code) is finishing a run that is over (a last
    /// save, an evaluation): the ranks are left to finish, crash, or stall
    /// on their own (their stall limits still hold). Ranks all waiting on a
    /// peer (the one that died), or that show nothing, are torn down.
    pub(super) fn exit_crash_over(
        &mut self,
        crash: ExitCrash,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let Some(until) = crash.probed_until else {
            let others: Vec<u32> = self.live().map(|(r, _)| *r).collect();
            self.ask_probes(
                others,
                format!(
                    "rank {} crashed at exit: is the rest finishing?",
                    crash.rank
                ),
            );
            self.exit_crash = Some(ExitCrash {
                probed_until: Some(now + self.cfg.hang_wait),
                ..crash
            });
            return;
        };
        if !self.probes_complete() && now < until {
            return;
        }
        self.exit_crash = None;
        let ExitCrash {
            rank, node, reason, ..
        } = crash;
        let working: Vec<u32> = self
            .live()
            .filter(|(_, e)| {
                let p = e.probe_says();
                p.busy || p.not_waiting_shown
            })
            .map(|(r, _)| *r)
            .collect();
        if working.is_empty() {
            self.fail(rank, &node, reason, None, now, out);
        } else {
            self.finishing.push(rank);
            tracing::info!(
                "{reason}, with no signature of its own; rank(s) {working:?} are still at work outside any collective (a last save or evaluation): left to finish"
            );
        }
    }

    /// Every live rank has answered the probe (a probe that could not tell
    /// is an answer too: waiting for it longer would tell nothing more).
    pub(super) fn probes_complete(&self) -> bool {
        self.tally.answered == self.tally.live
    }
}
