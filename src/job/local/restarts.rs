//! After an attempt of local mode: judge it, decide, and end the job or
//! restart every rank in place.

use super::super::act;
use super::super::batch::{self, StepEnd};
use super::super::decide::{self, Decision};
use super::super::judge::AgentEnd;
use crate::event as ev;
use crate::journal::{self};
use crate::policy::failure::{Class, Verdict};
use crate::policy::restart::Action;
use std::time::Instant;

use super::{Local, LocalAttempt, LocalRank, LocalRun};

impl Local {
    /// The attempt has ended: journal it, and either end the job (its exit
    /// code) or restart in place (`None`).
    pub(super) fn after_attempt(&self, run: &mut LocalRun, a: LocalAttempt) -> Option<i32> {
        if self.take_tty {
            for r in &a.ranks {
                crate::process::reclaim_terminal(r.pid);
            }
        }
        let ended = Instant::now();
        let codes: Vec<i32> = a.ranks.iter().filter_map(|r| r.exit).collect();
        // The job's status is the failure's, not the echo of resilio's own
        // teardown (SIGTERM, then SIGKILL after the grace) of the other ranks:
        // 124 for a hang, the culprit's code for a crash.
        let worst = [|c: i32| c != 0 && c != 143 && c != 137, |c: i32| c != 0]
            .iter()
            .find_map(|keep| a.ranks.iter().filter_map(|r| r.exit).find(|c| keep(*c)))
            .unwrap_or(0);
        let teardown_s = a.failed_at.map(|f| ended.duration_since(f).as_secs_f64());
        run.log.write(
            ev::AttemptEnd {
                exit_codes: codes,
                runtime_s: ended.duration_since(a.started).as_secs_f64(),
                teardown_s,
            },
            true,
        );
        if worst == 0 && a.failed_at.is_none() && run.stopped_from_outside.is_none() {
            act::job_end(&mut run.log, 0, "completed");
            return Some(0);
        }
        if let Some(s) = run.stopped_from_outside {
            act::job_end(&mut run.log, worst, &format!("stopped by {s}"));
            // One rank: the trainer's own status (it may end cleanly on
            // the signal), as a plain wrapper would exit. So for every rank
            // on a Ctrl-C (SIGINT): ranks that all ended cleanly on it exit 0.
            return Some(if worst == 0 && !self.single && s != "SIGINT" {
                128 + 15
            } else {
                worst
            });
        }
        let (code, reason) = self.after_failure(run, &a, worst, teardown_s)?;
        act::job_end(&mut run.log, code, &reason);
        Some(code)
    }

    /// Whether a rank that crashed at exit had finished: another rank of the
    /// attempt completed with exit 0, or the exits journaled so far make a
    /// finished attempt ([`crate::policy::failure::attempt_finished`]: a
    /// trainer reported the end of training, or every rank aborted at
    /// interpreter exit).
    pub(super) fn finished_at_exit(&self, run: &mut LocalRun, a: &LocalAttempt) -> bool {
        if a.ranks.iter().any(|r| r.exit == Some(0)) {
            return true;
        }
        let records = crate::runs::of_key(run.journal.refresh().to_vec(), run.log.run());
        let exits: Vec<(&journal::Record, &crate::event::RankExit)> = journal::events(&records)
            .filter(|(r, _)| r.attempt == run.attempt)
            .filter_map(|(r, e)| match e {
                crate::event::Event::RankExit(x) => Some((r, x)),
                _ => None,
            })
            .collect();
        crate::policy::failure::attempt_finished(&crate::analysis::accounting::exit_facts(&exits))
    }

    /// Judge and decide from the ranks' journals, as the Slurm supervisor
    /// does: how the job ends, or `None` when it restarts in place.
    fn after_failure(
        &self,
        run: &mut LocalRun,
        a: &LocalAttempt,
        worst: i32,
        teardown_s: Option<f64>,
    ) -> Option<(i32, String)> {
        let records = crate::runs::of_key(run.journal.refresh().to_vec(), run.log.run());
        let fallback = fallback_verdict(worst, a.failure_note.as_deref());
        let agents: Vec<AgentEnd> = a.ranks.iter().filter_map(|r| r.end.clone()).collect();
        let step = StepEnd {
            ended: crate::util::clock::now(),
            exit_code: worst,
            verdict: &fallback,
            tail: &[],
            node: &self.node,
            pre_timeout: false,
            agents: &agents,
        };
        let decided = batch::decide_local(
            &self.job_dir,
            &records,
            run.attempt,
            &step,
            self.cfg.budget(),
            &run.remembered,
            &mut run.log,
        );
        if let Some(d) = &decided {
            run.remembered.push(d.outcome.clone());
        }
        // Of this attempt and those before, later decisions read only their
        // outcomes (every one of this run was decided here: `remembered`)
        // the confirmed checkpoints (a rollback's) and the rollback told to
        // the next attempt (which checkpoint it restored).
        run.journal.prune(run.attempt + 1, |r| {
            r.kind == "checkpoint_done" || r.kind == "rollback"
        });
        let code = exit_code(decided.as_ref(), &a.ranks, worst);
        let class = decided.as_ref().map(|d| d.outcome.class);
        match decided.map(|d| d.action) {
            Some(Action::RestartInPlace { reason }) if self.cfg.observe => {
                let would = crate::job::act::describe(&Action::RestartInPlace {
                    reason: reason.clone(),
                });
                tracing::warn!("observe mode: would {would}; nothing done");
                run.log.write(ev::Observed { would, reason }, true);
                Some((code, "observe mode: not restarted".into()))
            }
            Some(Action::RestartInPlace { reason }) => {
                self.restart_in_place(run, &reason, teardown_s);
                None
            }
            Some(Action::Stop { reason, .. }) => {
                // Said when a restart could have been expected. Not for a
                // budget of 0 (none was asked for), nor for one rank's own
                // error or a stop from outside in its first attempt: the
                // trainer's output, or the person who stopped it, tells.
                let self_evident = self.single
                    && run.attempt == 0
                    && matches!(
                        class,
                        Some(Class::UserError | Class::Preempted | Class::Numerical)
                    );
                if self.cfg.max_restarts > 0 && !self_evident {
                    tracing::warn!("not restarting: {reason}");
                }
                Some((code, reason))
            }
            // Never decided in local mode; the failure stands.
            Some(Action::Requeue { reason, .. } | Action::RestartInAllocation { reason, .. }) => {
                Some((code, reason))
            }
            // Nothing failed after all (a stalled trainer that finished on
            // its own while its stall was being judged): every rank's own
            // end says so.
            // (Unknown is only ever read from a journal, never decided.)
            Some(Action::Finish | Action::Unknown) | None if worst == 0 => {
                Some((0, "completed".into()))
            }
            // Judged finished though a rank's status was not 0: a rank
            // crashed at exit once training was done. Its status comes
            // through, as a plain launcher's would.
            Some(Action::Finish | Action::Unknown) | None => Some((
                code,
                "completed; a rank crashed at exit after training was done".into(),
            )),
        }
    }

    fn restart_in_place(&self, run: &mut LocalRun, reason: &str, teardown_s: Option<f64>) {
        run.attempt += 1;
        let attempt = run.attempt;
        if self.single {
            tracing::info!("restarting in place (attempt {attempt}): {reason}");
        } else {
            tracing::info!(
                "restarting all {} ranks in place (attempt {attempt}): {reason}",
                self.n
            );
        }
        run.log.write(
            ev::Restart {
                next_attempt: attempt,
                reason: reason.to_string(),
                in_place: Some(true),
                teardown_s,
                ..Default::default()
            },
            true,
        );
        run.log.set_attempt(attempt);
        if let Some(c) = &run.coordinator {
            c.new_attempt(attempt);
        }
    }
}

/// What the launcher saw itself, for when no rank journaled its end (an
/// unwritable journal, a command that could not be started).
fn fallback_verdict(worst: i32, failure_note: Option<&str>) -> Verdict {
    if matches!(worst, 126 | 127) {
        Verdict {
            class: Class::UserError,
            reason: "the command could not be started".into(),
            evidence: Some(format!(
                "exit code {worst}: command not found or not executable"
            )),
            ..Default::default()
        }
    } else {
        Verdict {
            class: Class::Infrastructure,
            reason: failure_note.unwrap_or("a rank failed").to_string(),
            evidence: None,
            ..Default::default()
        }
    }
}

/// The job's exit code after a failure ([`decide::failure_exit_code`]),
/// else the worst.
fn exit_code(d: Option<&Decision>, ranks: &[LocalRank], worst: i32) -> i32 {
    let fallback = if worst == 0 { 1 } else { worst };
    d.map_or(fallback, |d| {
        let primary = ranks.iter().find(|r| r.rank == d.primary.rank);
        decide::failure_exit_code(d, primary.and_then(|r| r.exit), fallback)
    })
}
