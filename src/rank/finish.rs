//! The rank's end: the last output and progress, `rank_exit` and
//! `failure`, the last report to the coordinator, and at batch level the
//! job-level decision.

use super::lifecycle::Ending;
use super::run::Agent;
use super::Next;
use crate::coordinator::protocol::{ExitInfo, RankState};
use crate::event as ev;
use crate::policy::failure;
use crate::process::{self, Exit};
use std::time::{Duration, Instant};

impl Agent<'_> {
    /// Let the pumps finish what the pipes still hold, take the last
    /// events, and remove the socket and the control file.
    fn wind_down(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        for p in std::mem::take(&mut self.r.pumps) {
            while !p.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if p.is_finished() {
                let _ = p.join();
            }
        }
        self.drain_last();
        let r = &mut *self.r;
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

    /// Record how the rank ended and report it; at batch level, decide what
    /// comes after the step.
    pub async fn finish(mut self) -> Next {
        self.wind_down();
        self.watch_launcher();
        let dump_signal = self.r.cfg.diagnostics.dump_signal;
        let e = self
            .lc
            .ending(dump_signal)
            .expect("loop ends only after the main child exited");
        if e.stall_cancelled {
            self.r.journal.write(
                ev::StallCancelled {
                    status: Some(e.exit.describe()),
                    note: Some("the trainer exited on its own during stall diagnostics".into()),
                },
                true,
            );
        }
        let verdict = self.verdict(&e);
        self.rank_exit(&e, &verdict);
        let reported = self.report_exit(&e, &verdict).await;
        let code = e.code();
        if self.r.batch_level {
            return self.after_step(&e, &verdict);
        }
        let role = self.step_role();
        if role != crate::job::step_level::Role::None {
            return self
                .decide_for_step(role, code, &verdict, e.pre_timeout, reported)
                .await;
        }
        if self.r.single_rank_job {
            self.r.journal.write(
                ev::JobEnd {
                    exit_code: Some(code),
                    reason: None,
                },
                true,
            );
        } else if self.launcher_lost && self.r.id.rank == 0 {
            // The launcher that would have ended the job is gone: the
            // journal gets its end from rank 0, the rank whose end a
            // torchrun job's status follows.
            self.r.journal.write(
                ev::JobEnd {
                    exit_code: Some(code),
                    reason: Some(format!(
                        "rank 0 ended (exit code {code}) after the launcher died"
                    )),
                },
                true,
            );
        }
        Next::Exit(code)
    }

    /// The failure's class; after a failure, the health check again (a
    /// failing one blames the node).
    fn verdict(&mut self, e: &Ending) -> failure::Verdict {
        let r = &mut *self.r;
        let after_check = if r.checks_node && e.exit.code() != 0 && !e.stopped_on_request() {
            let h = crate::rank::health::run(&r.cfg.health);
            if let Some(h) = &h {
                r.journal.write(
                    ev::HealthCheck {
                        when: Some("after_failure".into()),
                        result: serde_json::to_value(h).ok(),
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
        let r = &mut *self.r;
        let (policy, plog, launched) = (&self.lc.policy, &self.plog, r.launched);
        let lost = r.journal.dropped();
        let since_launch = |t: Instant| t.duration_since(launched).as_secs_f64();
        r.journal.write_at(
            r.clock.wall(ended),
            ev::RankExit {
                exit_code: Some(code),
                status: Some(e.exit.describe()),
                cause: Some(cause.clone()),
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
            "stall"
        } else if e.numerical().is_some() {
            "numerical"
        } else if matches!(e.exit, Exit::Signal(..)) {
            "signal"
        } else {
            "crash"
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
                failure_kind: Some(kind.into()),
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
        let r = &mut *self.r;
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
                        error: Some(err.to_string()),
                        note: Some("the exit was not reported".into()),
                    },
                    false,
                );
                false
            }
        }
    }

    /// Batch level: judge the step and decide (requeue, relaunch, stop).
    fn after_step(&mut self, e: &Ending, verdict: &failure::Verdict) -> Next {
        if self.requeued_by_slurm {
            // Slurm decided (and the exclusion is set): the next allocation
            // runs the job again.
            return Next::Exit(e.code());
        }
        let r = &mut *self.r;
        let mut tail_lines = r.tail.last_lines(200);
        // A step that started no rank: launch trouble, whatever srun said
        // about the tasks it never ran.
        let launch = self.step_start_missed.map(failure::Verdict::launch_trouble);
        if launch.is_some() {
            tail_lines.clear();
        }
        let step = crate::job::batch::StepEnd {
            ended: crate::util::clock::now(),
            exit_code: e.code(),
            verdict: launch.as_ref().unwrap_or(verdict),
            tail: &tail_lines,
            node: &r.id.node,
            pre_timeout: e.pre_timeout,
            agents: &[],
        };
        let alloc = allocation(&r.cfg, &r.slurm.job_nodes, &r.argv, r.step_out.as_ref());
        crate::job::batch::after_attempt(
            &r.cfg.state_dir,
            &r.id.job,
            r.id.attempt,
            &step,
            r.cfg.max_restarts,
            r.cfg.observe,
            alloc,
            self.slurm_cli,
            &mut r.journal,
        )
    }
}

/// The allocation a failed step can run again in (see docs/slurm.md), or
/// none when relaunching inside it is off or there is no allocation.
/// `step_out`: the nodes this step already left out, and its size.
pub(crate) fn allocation(
    cfg: &crate::config::Config,
    job_nodes: &[String],
    argv: &[std::ffi::OsString],
    step_out: Option<&(Vec<String>, u32)>,
) -> Option<crate::policy::restart::Allocation> {
    (cfg.restart_in_allocation && !job_nodes.is_empty()).then(|| {
        crate::policy::restart::Allocation {
            nodes: job_nodes.to_vec(),
            excluded: step_out.map(|o| o.0.clone()).unwrap_or_default(),
            withheld: crate::slurm::step::user_excluded_nodes(argv),
            // The step's size as launched (the journal's count of nodes
            // that started a rank can miss a node that died early).
            step_nodes: step_out
                .map(|o| o.1)
                .filter(|n| *n > 0)
                .or_else(|| crate::slurm::step::requested_nodes(argv))
                .unwrap_or(0),
            can_exclude: crate::slurm::step::can_leave_out(argv),
        }
    })
}
