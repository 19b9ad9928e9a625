//! What the agent writes besides single records: the stall's record and
//! message, the diagnostics file, the control file, the stop of a stalled rank.

use super::lifecycle::Order;
use super::progress_log::{Clock, ProgressLog};
use crate::context::Identity;
use crate::event as ev;
use crate::journal::Writer;
use crate::policy::stall::{Stall, StallPolicy};
use crate::process;
use crate::rank::diagnostics;
use chrono::Utc;
use nix::unistd::Pid;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The stall, journaled (fsynced), and one line on stderr. `linked`: the
/// rank has a coordinator, and whether its trainer was found waiting on a
/// peer (the coordinator then judges which rank hung before any is stopped).
pub(crate) fn on_stall(
    s: &Stall,
    policy: &StallPolicy,
    plog: &mut ProgressLog,
    journal: &mut Writer,
    (clock, id): (&Clock, &Identity),
    now: Instant,
    (linked, idle_look): (Option<Option<bool>>, Option<super::busy::Idle>),
) {
    plog.flush(journal, clock);
    let idle = now.duration_since(s.since);
    journal.write_at(
        clock.wall(now),
        ev::Stall {
            stall_kind: s.kind.clone(),
            phase: policy.phase().name().to_string(),
            timeout_s: s.timeout.as_secs_f64(),
            idle_s: idle.as_secs_f64(),
            since: clock.wall(s.since),
            last_step: s.last_step,
            last_progress: plog.last_at.map(|t| clock.wall(t)),
            avoid: Some(s.kind.avoid()),
        },
        true,
    );
    let what = match s.last_step {
        Some(step) => format!("no progress since step {step}"),
        None => "no first step".to_string(),
    };
    // A rank found waiting on a peer is likely not the one that hung; one
    // found not working (no CPU time, no I/O, on a node where that means
    // something) needs no advice about evaluations.
    let avoid = match idle_look {
        Some(i) => format!(
            "its trainer was not working ({:.2}s of CPU and {:.2}s waiting for one in {:.1}s, no I/O)",
            i.cpu_s, i.wait_s, i.over_s
        ),
        None => s.kind.avoid(),
    };
    let next = match linked {
        None => format!("gathering diagnostics, then stopping it; {avoid}"),
        Some(Some(true)) => "it waits on a peer (in a collective): gathering diagnostics while the coordinator looks for the rank that hung".to_string(),
        Some(_) => format!(
            "gathering diagnostics while the coordinator judges which rank hung; {avoid}"
        ),
    };
    tracing::warn!(
        "rank {} on {} stalled: {what} for {} (limit {}, {}); {next}",
        id.rank,
        id.node,
        crate::duration::format(idle),
        crate::duration::format(s.timeout),
        s.kind.name(),
    );
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = s.len() - max;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    format!("...{}", &s[cut..])
}

pub(crate) fn truncate_lines(lines: &[String], max_total: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut total = 0;
    for l in lines.iter().rev() {
        let l = truncate(l, 300);
        total += l.len();
        if total > max_total {
            break;
        }
        out.push(l);
    }
    out.reverse();
    out
}

/// The diagnostics file of a stall (`why` "stall") or of a probe the
/// coordinator asked for (`why` "probe": a rank that did not stall itself,
/// perhaps the one blamed), in `dir`: `WHY-aN-rN-TIME.txt`.
pub(crate) fn write_diag_file(
    dir: &std::path::Path,
    why: &str,
    id: &Identity,
    tail: &[String],
    d: &diagnostics::Diagnostics,
) -> Option<PathBuf> {
    use std::fmt::Write as _;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "resilio {why} diagnostics: job {} attempt {} rank {} node {}",
        id.job, id.attempt, id.rank, id.node
    );
    let _ = writeln!(text, "\n== last {} lines of output ==", tail.len());
    for l in tail {
        let _ = writeln!(text, "{l}");
    }
    for p in &d.py_spy {
        let _ = writeln!(
            text,
            "\n== Python stacks of pid {} ({}) ==\n{}",
            p.pid,
            if p.ok { "ok" } else { "failed" },
            p.output
        );
    }
    if let Some(why) = &d.py_spy_skipped {
        let _ = writeln!(text, "\n== no stacks: {why} ==");
    }
    crate::journal::create_private_dir_all(dir).ok()?;
    let name = format!(
        "{why}-a{}-r{}-{}.txt",
        id.attempt,
        id.rank,
        Utc::now().format("%Y%m%dT%H%M%S%.3fZ")
    );
    let path = dir.join(name);
    let tmp = path.with_extension("tmp");
    crate::journal::write_private(&tmp, text.as_bytes()).ok()?;
    std::fs::rename(&tmp, &path).ok()?;
    Some(path)
}

/// Replace the control file whole (temporary file, then rename), so the
/// trainer never reads half a request.
pub(crate) fn write_control(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("ctl.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Stop a stalled rank: SIGTERM (and SIGCONT, for a stopped trainer) to its
/// whole tree (KILL follows after the grace).
pub(crate) fn stop_stalled(journal: &mut Writer, pid: Pid, skip: &[i32], grace: Duration) {
    process::terminate(pid, Some(skip));
    journal.write(
        ev::Stop {
            reason: Some("stall".into()),
            signal: "SIGTERM".into(),
            grace_s: Some(grace.as_secs_f64()),
            ..Default::default()
        },
        false,
    );
}

/// The journal record an action of the lifecycle makes, when it makes one
/// (durable or not): one place that says what each action leaves behind.
pub(crate) fn record_of(a: &Order) -> Option<(ev::Event, bool)> {
    let signal = |s: &str| ev::Signal {
        signal: s.into(),
        forwarded: false,
        ..Default::default()
    };
    Some(match a {
        Order::Forward(sig) => (
            ev::Signal {
                forwarded: true,
                ..signal(sig.as_str())
            }
            .into(),
            false,
        ),
        Order::LeftToSlurm(sig) => (
            ev::Signal {
                delivered_by: Some("slurm".into()),
                ..signal(sig.as_str())
            }
            .into(),
            false,
        ),
        Order::Deferred(sig) => (
            ev::Signal {
                deferred: Some("stall diagnostics in progress".into()),
                ..signal(sig.as_str())
            }
            .into(),
            false,
        ),
        Order::KillOnSecondInt => (
            ev::Signal {
                action: Some("second SIGINT: SIGKILL".into()),
                ..signal("SIGINT")
            }
            .into(),
            false,
        ),
        Order::StopJudged { detail } => (
            ev::StopJudged {
                detail: detail.clone(),
            }
            .into(),
            false,
        ),
        Order::DeferStallStop { max_wait } => (
            ev::StopDeferred {
                reason: "stall".into(),
                until: "the coordinator's judgment".into(),
                max_wait_s: max_wait.as_secs_f64(),
            }
            .into(),
            false,
        ),
        Order::StopForCoordinator { detail, grace } | Order::StopForNumerical { detail, grace } => {
            (
                ev::Stop {
                    reason: Some(
                        if matches!(a, Order::StopForNumerical { .. }) {
                            "numerical"
                        } else {
                            "coordinator"
                        }
                        .into(),
                    ),
                    detail: Some(detail.clone()),
                    signal: "SIGTERM".into(),
                    grace_s: Some(grace.as_secs_f64()),
                    ..Default::default()
                }
                .into(),
                true,
            )
        }
        Order::CoordinatorLost { error } => (
            ev::CoordinatorUnreachable {
                error: error.to_string(),
                note: None,
            }
            .into(),
            false,
        ),
        Order::CoordinatorBack {
            gap_s,
            failed_requests,
        } => (
            ev::CoordinatorReachable {
                gap_s: *gap_s,
                failed_requests: *failed_requests,
            }
            .into(),
            false,
        ),
        Order::Resumed { late } => (
            ev::Resumed {
                late_s: Some(late.as_secs_f64()),
                ..Default::default()
            }
            .into(),
            false,
        ),
        Order::CarryOn { reason } => (
            ev::StallWithdrawn {
                reason: reason.clone(),
            }
            .into(),
            true,
        ),
        Order::Observed { would, reason } => (
            ev::Observed {
                would: would.clone(),
                reason: reason.clone(),
            }
            .into(),
            true,
        ),
        Order::BusySilent {
            cpu_s,
            cpu_wait_s,
            io_bytes,
            window_s,
            limit_s,
            probe,
        } => (
            ev::BusySilent {
                cpu_s: *cpu_s,
                cpu_wait_s: Some(*cpu_wait_s),
                io_bytes: Some(*io_bytes),
                window_s: *window_s,
                limit_s: *limit_s,
                probe: probe.clone(),
            }
            .into(),
            false,
        ),
        Order::TrainerStopped => (
            ev::Resumed {
                trainer_stopped: Some(true),
                ..Default::default()
            }
            .into(),
            false,
        ),
        Order::Kill {
            record: Some(grace),
        } => (
            ev::Stop {
                signal: "SIGKILL".into(),
                after_grace_s: Some(grace.as_secs_f64()),
                ..Default::default()
            }
            .into(),
            false,
        ),
        _ => return None,
    })
}

/// One py-spy dump as journaled (its output cut to 1,500 bytes).
pub(crate) fn dump_record(d: &diagnostics::PySpyDump) -> ev::StackDump {
    ev::StackDump {
        pid: d.pid,
        ok: d.ok,
        output: truncate(&d.output, 1500),
    }
}

/// The trainer could not be started: the rank's end, recorded.
pub(crate) fn spawn_failed(
    journal: &mut Writer,
    e: &crate::error::Error,
    argv_text: &[String],
    single_rank_job: bool,
) {
    let code = e.exit_code();
    journal.write(
        ev::RankExit {
            exit_code: code,
            cause: "spawn_failed".into(),
            error: Some(e.to_string()),
            argv: Some(argv_text.to_vec()),
            ..Default::default()
        },
        true,
    );
    journal.write(
        ev::Failure {
            cause: Some("spawn_failed".into()),
            exit_code: Some(code),
            detail: Some(e.to_string()),
            ..Default::default()
        },
        true,
    );
    if single_rank_job {
        journal.write(job_end(code), true);
    }
}

/// A `job_end` with only its exit code (a single-rank job's own end).
pub(crate) fn job_end(code: i32) -> ev::JobEnd {
    ev::JobEnd {
        exit_code: code,
        reason: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;

    fn kind(a: Order) -> Option<(&'static str, bool)> {
        record_of(&a).map(|(e, durable)| (e.kind(), durable))
    }

    #[test]
    fn each_action_leaves_its_record() {
        let d = Duration::from_secs(5);
        assert_eq!(
            kind(Order::Forward(Signal::SIGUSR1)),
            Some(("signal", false))
        );
        assert_eq!(
            kind(Order::LeftToSlurm(Signal::SIGTERM)),
            Some(("signal", false))
        );
        assert_eq!(
            kind(Order::Deferred(Signal::SIGTERM)),
            Some(("signal", false))
        );
        assert_eq!(kind(Order::KillOnSecondInt), Some(("signal", false)));
        assert_eq!(
            kind(Order::StopJudged { detail: "x".into() }),
            Some(("stop_judged", false))
        );
        assert_eq!(
            kind(Order::DeferStallStop { max_wait: d }),
            Some(("stop_deferred", false))
        );
        assert_eq!(
            kind(Order::StopForCoordinator {
                detail: "x".into(),
                grace: d
            }),
            Some(("stop", true))
        );
        assert_eq!(
            kind(Order::CoordinatorLost { error: "e".into() }),
            Some(("coordinator_unreachable", false))
        );
        assert_eq!(kind(Order::Resumed { late: d }), Some(("resumed", false)));
        assert_eq!(kind(Order::Kill { record: Some(d) }), Some(("stop", false)));
        // Carried out with records of their own (or none).
        assert_eq!(kind(Order::Kill { record: None }), None);
        assert_eq!(kind(Order::TermRemaining), None);
        assert_eq!(kind(Order::GiveUp), None);
        assert_eq!(kind(Order::LiveOnJobProgress), None);
    }

    #[test]
    fn a_forwarded_signal_says_so_and_one_left_to_slurm_says_who() {
        let fields = |a: Order| record_of(&a).unwrap().0.into_fields();
        let f = fields(Order::Forward(Signal::SIGUSR1));
        assert_eq!(f["signal"], "SIGUSR1");
        assert_eq!(f["forwarded"], true);
        let f = fields(Order::LeftToSlurm(Signal::SIGTERM));
        assert_eq!(f["forwarded"], false);
        assert_eq!(f["delivered_by"], "slurm");
    }
}
