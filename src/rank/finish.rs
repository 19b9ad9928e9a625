//! The child's end: the last output and progress, `rank_exit` and
//! `failure`, the last report to the coordinator.

use super::lifecycle::Ending;
use super::run::Agent;
use super::Finished;
use crate::coordinator::protocol::{ExitInfo, RankState};
use crate::event as ev;
use crate::policy::failure;
use crate::process::{self, Exit};
use std::time::{Duration, Instant};

impl<'a> Agent<'a> {
    /// Let the pumps finish what the pipes still hold, take the last
    /// events, and remove the socket and the control file.
    fn wind_down(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        for p in std::mem::take(&mut self.rank.pumps) {
            while !p.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if p.is_finished() {
                let _ = p.join();
            }
        }
        if let Some(w) = &self.rank.ckpt_watch {
            w.finish(Instant::now() + Duration::from_secs(2));
        }
        self.drain_last();
        let r = &mut *self.rank;
        r.file_watch = None;
        r.ckpt_watch = None;
        self.plog.flush(&mut r.journal, &r.clock);
        r.tx.close();
        if r.socket_ok {
            // Wake the listener thread so it sees the queue closed.
            if let Ok(s) = std::os::unix::net::UnixDatagram::unbound() {
                let _ = s.send_to(b"", &r.sock_path);
            }
            let _ = std::fs::remove_file(&r.sock_path);
        }
        let _ = std::fs::remove_file(&r.control_path);
        process::restore_terminal(r.pid);
    }

    /// Record how the child ended and report it; what comes after is the
    /// role's ([`Finished`]).
    pub async fn finish(mut self) -> Finished<'a> {
        self.wind_down();
        self.watch_launcher();
        let dump_signal = self.rank.cfg.diagnostics.dump_signal;
        let ending = self
            .lifecycle
            .ending(dump_signal)
            .expect("loop ends only after the main child exited");
        if ending.stall_cancelled {
            self.rank.journal.write(
                ev::StallCancelled {
                    status: ending.exit.describe(),
                    note: "the trainer exited on its own during stall diagnostics".into(),
                },
                true,
            );
        }
        let verdict = self.verdict(&ending);
        self.rank_exit(&ending, &verdict);
        let reported = self.report_exit(&ending, &verdict).await;
        Finished {
            agent: self,
            ending,
            verdict,
            reported,
        }
    }

    /// The failure's class; after a failure, the health check again (a
    /// failing one blames the node).
    fn verdict(&mut self, e: &Ending) -> failure::Verdict {
        let r = &mut *self.rank;
        let after_check = if r.checks_node && e.exit.code() != 0 && !e.stopped_on_request() {
            let h = crate::rank::health::run(&r.cfg.health);
            if let Some(h) = &h {
                r.journal.write(
                    ev::HealthCheck {
                        when: ev::HealthWhen::AfterFailure,
                        result: h.into(),
                    },
                    true,
                );
            }
            h
        } else {
            None
        };
        failure::classify(
            &failure::RankEnd {
                exit_code: e.exit.code(),
                signal: match e.exit {
                    Exit::Signal(s, _) => Some(s),
                    Exit::Code(_) => None,
                },
                stalled: e.stall.is_some(),
                stop_requested: e.stopped_on_request(),
                health_check_failed: after_check.as_ref().is_some_and(|h| !h.ok),
                numerical: e.numerical().map(str::to_string),
                tail: r.tail.last_lines(r.cfg.diagnostics.tail_lines.max(20)),
            },
            &r.cfg.patterns(),
        )
    }

    /// `rank_exit`, and `failure` for a failure of the rank's own.
    fn rank_exit(&mut self, e: &Ending, verdict: &failure::Verdict) {
        let (code, cause) = (e.code(), e.cause());
        let ended = Instant::now();
        let r = &mut *self.rank;
        if r.supervises_step {
            // The step's end, not a rank's: each rank's agent records its
            // own, and the job level judges the attempt from them.
            let runtime_s = ended.duration_since(r.launched).as_secs_f64();
            r.journal.write_at(
                r.clock.wall(ended),
                ev::StepExit {
                    exit_code: code,
                    status: e.exit.describe(),
                    cause,
                    runtime_s,
                },
                true,
            );
            return;
        }
        let (policy, plog, launched) = (&self.lifecycle.policy, &self.plog, r.launched);
        let lost = r.journal.dropped();
        let since_launch = |t: Instant| t.duration_since(launched).as_secs_f64();
        r.journal.write_at(
            r.clock.wall(ended),
            ev::RankExit {
                exit_code: code,
                status: Some(e.exit.describe()),
                cause: cause.clone(),
                failed_at: Some(r.clock.wall(e.failed_at.unwrap_or(ended))),
                class: Some(verdict.class),
                class_reason: Some(verdict.reason.clone()),
                evidence: verdict.evidence.clone(),
                steps_seen: Some(policy.steps_seen()),
                last_step: policy.last_step(),
                first_step_s: plog.first_at.map(since_launch),
                last_progress_s: plog.last_at.map(since_launch),
                runtime_s: Some(since_launch(ended)),
                malformed_messages: Some(
                    self.faults
                        .malformed
                        .iter()
                        .map(|(k, v)| (k.to_string(), *v))
                        .collect(),
                ),
                journal_lost_records: Some(lost),
                ..Default::default()
            },
            true,
        );
        if code == 0 || e.stopped_on_request() {
            return;
        }
        let kind = if e.stall.is_some() {
            ev::FailureKind::Stall
        } else if e.numerical().is_some() {
            ev::FailureKind::Numerical
        } else if matches!(e.exit, Exit::Signal(..)) {
            ev::FailureKind::Signal
        } else {
            ev::FailureKind::Crash
        };
        let detail = match (&e.stall, e.numerical()) {
            (Some(s), _) => format!(
                "{} after {:.1}s without progress",
                s.kind.name(),
                s.timeout.as_secs_f64()
            ),
            (None, Some(n)) => n.to_string(),
            (None, None) => e.exit.describe(),
        };
        r.journal.write(
            ev::Failure {
                failure_kind: Some(kind),
                cause: Some(cause),
                class: Some(verdict.class),
                class_reason: Some(verdict.reason.clone()),
                evidence: verdict.evidence.clone(),
                exit_code: Some(code),
                detail: Some(detail),
                ..Default::default()
            },
            true,
        );
    }

    /// The last report, sent now: the coordinator tears the step down on it.
    /// Whether it reached the coordinator.
    async fn report_exit(&mut self, e: &Ending, verdict: &failure::Verdict) -> bool {
        let r = &mut *self.rank;
        let Some(l) = &r.link else {
            return false;
        };
        r.outbox.update(|o| {
            o.state = RankState::Exited;
            o.exit = Some(ExitInfo {
                code: e.code(),
                class: verdict.class,
                cause: e.cause(),
                evidence: verdict.evidence.clone(),
                stopped: e.stopped_on_request(),
            });
        });
        match l.send(&r.outbox.snapshot(), Duration::from_secs(2)).await {
            Ok(_) => true,
            Err(err) => {
                r.journal.write(
                    ev::CoordinatorUnreachable {
                        error: err.to_string(),
                        note: Some("the exit was not reported".into()),
                    },
                    false,
                );
                false
            }
        }
    }
}
