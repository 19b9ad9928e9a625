//! Every transition of the rank's lifecycle, on an injected clock.

use super::*;
use crate::coordinator::protocol::CommandKind;
use crate::policy::stall::StallConfig;
use chrono::TimeZone;

const STARTUP: Duration = Duration::from_secs(100);
const GRACE: Duration = Duration::from_secs(10);
const STALL_GRACE: Duration = Duration::from_secs(5);
const JUDGMENT: Duration = Duration::from_secs(35);
const CK_WAIT: Duration = Duration::from_secs(60);

fn settings() -> Settings {
    Settings {
        grace: GRACE,
        stall_grace: STALL_GRACE,
        supervises_step: false,
        linked: false,
        hosts_coordinator: false,
        slurm_delivers: false,
        in_step: false,
        judgment_wait: JUDGMENT,
        pre_timeout_signal: Signal::SIGUSR1,
        checkpoint_signal: Some(Signal::SIGUSR2),
        checkpoint_wait: CK_WAIT,
        progress_every: Duration::from_secs(1),
        observe: false,
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn wall() -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000, 0).unwrap()
}

/// A machine whose trainer was launched at `t0`.
fn machine(s: Settings) -> (Lifecycle, Instant) {
    let t0 = Instant::now();
    let cfg = StallConfig {
        startup_timeout: STARTUP,
        ..StallConfig::default()
    };
    (Lifecycle::new(s, StallPolicy::new(cfg, t0), t0), t0)
}

fn tick(m: &mut Lifecycle, at: Instant) -> Vec<Order> {
    m.tick(at, Checked::NotLooked)
}

fn stop(reason: &str) -> CommandKind {
    CommandKind::Stop {
        reason: reason.into(),
    }
}

/// A machine that has just declared a stall at `t0 + STARTUP`.
fn stalled(s: Settings) -> (Lifecycle, Instant) {
    let (mut m, t0) = machine(s);
    let at = t0 + STARTUP;
    let a = tick(&mut m, at);
    assert!(matches!(a.as_slice(), [Order::Stalled { .. }]), "{a:?}");
    (m, at)
}

fn linked() -> Settings {
    Settings {
        linked: true,
        ..settings()
    }
}

fn batch() -> Settings {
    Settings {
        supervises_step: true,
        ..settings()
    }
}

// ---- stall → probe → judged → stop → grace → kill

#[test]
fn monitoring_sees_no_stall_before_the_deadline() {
    let (mut m, t0) = machine(settings());
    assert!(tick(&mut m, t0 + secs(99)).is_empty());
    assert!(m.monitoring() && !m.stalled());
}

#[test]
fn the_deadline_declares_a_stall_and_starts_diagnostics() {
    let (m, _) = stalled(settings());
    assert!(m.stalled() && m.diagnosing() && m.stopping());
}

#[test]
fn a_stall_is_declared_once() {
    let (mut m, at) = stalled(settings());
    assert!(tick(&mut m, at + secs(1)).is_empty());
}

#[test]
fn alone_the_stalled_rank_is_stopped_when_diagnostics_are_done_then_killed_after_the_grace() {
    let (mut m, at) = stalled(settings());
    let t = at + secs(2);
    assert_eq!(
        m.on_diagnostics_done(t),
        vec![Order::StopStalled { grace: STALL_GRACE }]
    );
    assert!(!m.diagnosing());
    assert!(tick(&mut m, t + secs(4)).is_empty());
    assert_eq!(
        tick(&mut m, t + STALL_GRACE),
        vec![Order::Kill {
            record: Some(STALL_GRACE)
        }]
    );
    // Again each time round, recorded once.
    assert_eq!(
        tick(&mut m, t + STALL_GRACE + secs(1)),
        vec![Order::Kill { record: None }]
    );
}

fn step(m: &Lifecycle) -> StallStep {
    match m.state() {
        State::Stalled { step, .. } => *step,
        other => panic!("not stalled: {other:?}"),
    }
}

#[test]
fn the_stall_walks_through_its_steps() {
    let (mut m, at) = stalled(linked());
    assert_eq!(step(&m), StallStep::Diagnosing { stop_asked: false });
    m.on_diagnostics_done(at);
    assert_eq!(
        step(&m),
        StallStep::AwaitingJudgment {
            until: at + JUDGMENT
        }
    );
    m.on_command(stop("judged"), at + secs(1));
    assert_eq!(step(&m), StallStep::Stopped);
    m.on_main_exit(Exit::Signal(15, false), at + secs(2), false);
    assert_eq!(step(&m), StallStep::Stopped);
}

#[test]
fn a_stop_asked_during_diagnostics_is_remembered_in_the_step() {
    let (mut m, at) = stalled(linked());
    m.on_signal(Sig::Int, at, wall());
    assert_eq!(step(&m), StallStep::Diagnosing { stop_asked: true });
    let (mut m, at) = stalled(linked());
    m.on_command(stop("peer"), at);
    assert_eq!(step(&m), StallStep::Diagnosing { stop_asked: true });
}

#[test]
fn stops_from_outside_name_their_reason() {
    let (mut m, t0) = machine(linked());
    assert_eq!(m.state(), &State::Monitoring);
    m.on_signal(Sig::Int, t0, wall());
    assert_eq!(m.state(), &State::Stopping(StopReason::Signal("SIGINT")));
    // A later stop does not rename it.
    m.on_command(stop("x"), t0);
    m.on_signal(Sig::Term, t0, wall());
    assert_eq!(m.state(), &State::Stopping(StopReason::Signal("SIGINT")));
    let (mut m, t0) = machine(linked());
    m.on_command(stop("x"), t0);
    assert_eq!(m.state(), &State::Stopping(StopReason::Coordinator));
}

#[test]
fn linked_the_stop_waits_for_the_coordinators_judgment() {
    let (mut m, at) = stalled(linked());
    assert_eq!(
        m.on_diagnostics_done(at),
        vec![Order::DeferStallStop { max_wait: JUDGMENT }]
    );
    assert!(tick(&mut m, at + secs(10)).is_empty());
    assert_eq!(
        m.on_command(stop("rank 3 hung first"), at + secs(11)),
        vec![
            Order::StopJudged {
                detail: "rank 3 hung first".into()
            },
            Order::StopStalled { grace: STALL_GRACE }
        ]
    );
    assert_eq!(
        tick(&mut m, at + secs(11) + STALL_GRACE),
        vec![Order::Kill {
            record: Some(STALL_GRACE)
        }]
    );
    // The judgment's deadline no longer stops it again.
    assert_eq!(
        tick(&mut m, at + JUDGMENT),
        vec![Order::Kill { record: None }]
    );
}

#[test]
fn linked_without_a_judgment_the_stalled_rank_is_stopped_when_the_wait_runs_out() {
    let (mut m, at) = stalled(linked());
    m.on_diagnostics_done(at);
    let plan = m.plan(at + secs(1));
    assert!(plan.wake <= at + JUDGMENT);
    assert_eq!(
        tick(&mut m, at + JUDGMENT),
        vec![Order::StopStalled { grace: STALL_GRACE }]
    );
    assert!(tick(&mut m, at + JUDGMENT + secs(1)).is_empty());
}

#[test]
fn a_second_judgment_does_not_stop_twice() {
    let (mut m, at) = stalled(linked());
    m.on_diagnostics_done(at);
    m.on_command(stop("x"), at + secs(1));
    assert!(m.on_command(stop("x"), at + secs(2)).is_empty());
}

#[test]
fn linked_but_the_coordinator_lost_the_stalled_rank_stops_on_its_own() {
    let (mut m, at) = stalled(linked());
    assert_eq!(
        m.on_coordinator_lost("refused".into()),
        vec![Order::CoordinatorLost {
            error: "refused".into()
        }]
    );
    assert_eq!(
        m.on_diagnostics_done(at),
        vec![Order::StopStalled { grace: STALL_GRACE }]
    );
}

#[test]
fn a_stop_during_diagnostics_is_deferred_then_not_waited_for_judgment() {
    let (mut m, at) = stalled(linked());
    assert_eq!(
        m.on_signal(Sig::Term, at, wall()),
        vec![Order::Deferred(Signal::SIGTERM)]
    );
    // No kill deadline while the evidence is taken.
    assert!(tick(&mut m, at + GRACE + secs(1)).is_empty());
    assert_eq!(
        m.on_diagnostics_done(at + secs(20)),
        vec![Order::StopStalled { grace: STALL_GRACE }]
    );
}

#[test]
fn a_coordinator_stop_during_diagnostics_is_deferred_too() {
    let (mut m, at) = stalled(linked());
    assert!(m.on_command(stop("peer failed"), at).is_empty());
    assert_eq!(
        m.on_diagnostics_done(at),
        vec![Order::StopStalled { grace: STALL_GRACE }]
    );
}

#[test]
fn a_stall_stays_the_cause_of_the_end() {
    let (mut m, at) = stalled(settings());
    m.on_diagnostics_done(at);
    m.on_main_exit(Exit::Signal(15, false), at + secs(1), false);
    let e = m.ending(None).unwrap();
    assert_eq!(e.stall.as_ref().map(|s| s.timeout), Some(STARTUP));
    assert_eq!(e.failed_at, Some(at));
    assert_eq!(e.code(), crate::error::EXIT_STALLED);
    assert_eq!(e.cause(), "stalled");
    assert!(!e.stopped_on_request());
}

#[test]
fn a_trainer_that_exits_during_diagnostics_keeps_its_own_status() {
    let (mut m, at) = stalled(settings());
    assert!(m
        .on_main_exit(Exit::Code(0), at + secs(1), false)
        .is_empty());
    assert!(!m.finished(false), "diagnostics still running");
    assert!(m.on_diagnostics_done(at + secs(2)).is_empty());
    assert!(m.finished(false));
    assert_eq!(step(&m), StallStep::Diagnosed);
    let e = m.ending(None).unwrap();
    assert!(e.stall_cancelled && e.stall.is_none() && e.stop.is_none());
    assert_eq!((e.code(), e.cause().as_str()), (0, "completed"));
    assert_eq!(e.failed_at, Some(at + secs(1)));
}

#[test]
fn death_by_the_dump_signal_is_still_the_stall() {
    let (mut m, at) = stalled(settings());
    m.on_main_exit(Exit::Signal(10, false), at + secs(1), false);
    let e = m.ending(Some(Signal::SIGUSR1)).unwrap();
    assert!(!e.stall_cancelled && e.stall.is_some());
}

#[test]
fn an_agent_supervising_a_step_judges_no_stall() {
    let (mut m, t0) = machine(batch());
    assert!(tick(&mut m, t0 + STARTUP * 3).is_empty());
    assert!(m.monitoring());
}

// ---- signals

#[test]
fn sigterm_is_forwarded_and_killed_after_the_grace() {
    let (mut m, t0) = machine(settings());
    let t = t0 + secs(5);
    assert_eq!(
        m.on_signal(Sig::Term, t, wall()),
        vec![Order::Forward(Signal::SIGTERM)]
    );
    assert!(m.stopping());
    assert_eq!(
        tick(&mut m, t + GRACE),
        vec![Order::Kill {
            record: Some(GRACE)
        }]
    );
    // Stopping: no stall is judged any more.
    assert_eq!(
        tick(&mut m, t0 + STARTUP + secs(1)),
        vec![Order::Kill { record: None }]
    );
    m.on_main_exit(Exit::Signal(9, false), t + GRACE, false);
    assert_eq!(m.ending(None).unwrap().cause(), "stopped by SIGTERM");
    assert!(m.ending(None).unwrap().stopped_on_request());
}

#[test]
fn sigterm_in_a_step_is_left_to_slurm() {
    let (mut m, t0) = machine(Settings {
        slurm_delivers: true,
        ..settings()
    });
    assert_eq!(
        m.on_signal(Sig::Term, t0, wall()),
        vec![Order::LeftToSlurm(Signal::SIGTERM)]
    );
    assert_eq!(
        tick(&mut m, t0 + GRACE),
        vec![Order::Kill {
            record: Some(GRACE)
        }]
    );
}

#[test]
fn a_second_sigterm_keeps_the_first_kill_deadline() {
    let (mut m, t0) = machine(settings());
    m.on_signal(Sig::Term, t0, wall());
    m.on_signal(Sig::Term, t0 + secs(8), wall());
    assert_eq!(
        tick(&mut m, t0 + GRACE),
        vec![Order::Kill {
            record: Some(GRACE)
        }]
    );
}

#[test]
fn sigint_twice_kills_at_once() {
    let (mut m, t0) = machine(settings());
    assert_eq!(
        m.on_signal(Sig::Int, t0, wall()),
        vec![Order::Forward(Signal::SIGINT)]
    );
    assert_eq!(
        m.on_signal(Sig::Int, t0 + secs(1), wall()),
        vec![Order::KillOnSecondInt]
    );
    // Already killed: the grace's SIGKILL is sent, not recorded again.
    assert_eq!(tick(&mut m, t0 + GRACE), vec![Order::Kill { record: None }]);
    m.on_main_exit(Exit::Signal(9, false), t0 + GRACE, false);
    assert_eq!(m.ending(None).unwrap().cause(), "stopped by SIGINT");
}

#[test]
fn sigquit_and_the_other_ending_signals_are_passed_on_and_stop_like_sigterm() {
    for sig in crate::process::STOP_SIGNALS {
        let (mut m, t0) = machine(settings());
        assert_eq!(
            m.on_signal(Sig::Stop(sig), t0, wall()),
            vec![Order::Forward(sig)],
            "{sig}"
        );
        assert!(!m.monitoring());
        // The trainer ignores it: SIGKILL after the grace, as for SIGTERM.
        assert_eq!(
            tick(&mut m, t0 + GRACE),
            vec![Order::Kill {
                record: Some(GRACE)
            }]
        );
        m.on_main_exit(Exit::Signal(9, false), t0 + GRACE, false);
        let e = m.ending(None).unwrap();
        assert_eq!(e.cause(), format!("stopped by {}", sig.as_str()));
        assert!(e.stopped_on_request());
    }
    // In a step, Slurm delivers it to the trainer itself.
    let (mut m, t0) = machine(Settings {
        slurm_delivers: true,
        ..settings()
    });
    assert_eq!(
        m.on_signal(Sig::Stop(Signal::SIGQUIT), t0, wall()),
        vec![Order::LeftToSlurm(Signal::SIGQUIT)]
    );
}

#[test]
fn sighup_is_forwarded_without_stopping() {
    let (mut m, t0) = machine(settings());
    assert_eq!(
        m.on_signal(Sig::Hup, t0, wall()),
        vec![Order::Forward(Signal::SIGHUP)]
    );
    assert!(m.monitoring());
}

#[test]
fn sigcont_restarts_the_stall_clock() {
    let (mut m, t0) = machine(settings());
    let resumed = t0 + secs(90);
    assert_eq!(
        m.on_signal(Sig::Cont, resumed, wall()),
        vec![Order::Forward(Signal::SIGCONT)]
    );
    assert!(tick(&mut m, t0 + STARTUP).is_empty());
    assert!(matches!(
        tick(&mut m, resumed + STARTUP).as_slice(),
        [Order::Stalled { .. }]
    ));
}

#[test]
fn user_signals_are_forwarded_outside_slurm() {
    let (mut m, t0) = machine(settings());
    assert_eq!(
        m.on_signal(Sig::Usr1, t0, wall()),
        vec![Order::Forward(Signal::SIGUSR1)]
    );
    assert_eq!(
        m.on_signal(Sig::Usr2, t0, wall()),
        vec![Order::Forward(Signal::SIGUSR2)]
    );
    assert!(m.monitoring());
}

#[test]
fn the_checkpoint_signal_in_a_step_is_a_request() {
    let (mut m, t0) = machine(Settings {
        in_step: true,
        slurm_delivers: true,
        ..settings()
    });
    assert_eq!(
        m.on_signal(Sig::Usr2, t0, wall()),
        vec![Order::CheckpointSignal {
            received: Signal::SIGUSR2,
            forward: false
        }]
    );
    assert_eq!(
        m.on_signal(Sig::Usr1, t0, wall()),
        vec![Order::LeftToSlurm(Signal::SIGUSR1)]
    );
    let (mut m, t0) = machine(Settings {
        in_step: true,
        ..settings()
    });
    assert_eq!(
        m.on_signal(Sig::Usr2, t0, wall()),
        vec![Order::CheckpointSignal {
            received: Signal::SIGUSR2,
            forward: true
        }]
    );
}

// ---- pre-timeout

#[test]
fn pre_timeout_asks_for_a_checkpoint_then_stops_the_step_when_it_is_done() {
    let (mut m, t0) = machine(batch());
    assert_eq!(
        m.on_signal(Sig::Usr1, t0, wall()),
        vec![Order::PreTimeoutCheckpoint {
            received: Signal::SIGUSR1
        }]
    );
    // Waiting for the checkpoint: the loop wakes once a second.
    assert_eq!(m.plan(t0).wake, t0 + secs(1));
    assert_eq!(m.checkpoint_query(t0), Some(wall()));
    assert!(m.tick(t0, Checked::NotDone).is_empty());
    // At most once a second.
    assert_eq!(m.checkpoint_query(t0 + Duration::from_millis(500)), None);
    let t = t0 + secs(3);
    m.plan(t);
    assert!(m.checkpoint_query(t).is_some());
    assert_eq!(
        m.tick(t, Checked::Done(Some(120))),
        vec![Order::StopForPreTimeout {
            checkpoint_step: Some(Some(120))
        }]
    );
    assert_eq!(m.checkpoint_query(t + secs(5)), None);
    m.plan(t + GRACE);
    assert_eq!(
        tick(&mut m, t + GRACE),
        vec![Order::Kill {
            record: Some(GRACE)
        }]
    );
    m.on_main_exit(Exit::Code(143), t + GRACE, false);
    let e = m.ending(None).unwrap();
    assert!(e.pre_timeout && e.stopped_on_request());
    assert_eq!(e.cause(), "stopped by pre-timeout");
}

#[test]
fn pre_timeout_stops_the_step_at_the_deadline_without_a_checkpoint() {
    let (mut m, t0) = machine(batch());
    m.on_signal(Sig::Usr1, t0, wall());
    let t = t0 + CK_WAIT;
    assert!(m.checkpoint_query(t).is_some());
    assert_eq!(
        m.tick(t, Checked::NotDone),
        vec![Order::StopForPreTimeout {
            checkpoint_step: None
        }]
    );
}

#[test]
fn a_second_pre_timeout_signal_keeps_the_first_deadline() {
    let (mut m, t0) = machine(batch());
    m.on_signal(Sig::Usr1, t0, wall());
    m.on_signal(
        Sig::Usr1,
        t0 + secs(30),
        wall() + chrono::Duration::seconds(30),
    );
    assert_eq!(m.checkpoint_query(t0 + CK_WAIT), Some(wall()));
}

#[test]
fn an_agent_hosting_its_step_coordinates_the_pre_timeout_checkpoint_once() {
    let (mut m, t0) = machine(Settings {
        hosts_coordinator: true,
        ..batch()
    });
    m.on_signal(Sig::Usr1, t0, wall());
    assert_eq!(tick(&mut m, t0), vec![Order::CoordinateCheckpoint]);
    assert!(tick(&mut m, t0 + secs(1)).is_empty());
}

#[test]
fn no_pre_timeout_after_the_main_child_exited() {
    let (mut m, t0) = machine(batch());
    m.on_signal(Sig::Usr1, t0, wall());
    m.on_main_exit(Exit::Code(0), t0 + secs(1), false);
    assert_eq!(m.checkpoint_query(t0 + CK_WAIT), None);
}

// ---- the coordinator's commands, and its loss

#[test]
fn a_coordinator_stop_tears_a_running_rank_down() {
    let (mut m, t0) = machine(linked());
    assert_eq!(
        m.on_command(stop("rank 1 failed"), t0),
        vec![Order::StopForCoordinator {
            detail: "rank 1 failed".into(),
            grace: STALL_GRACE
        }]
    );
    assert!(m.stopping());
    assert_eq!(
        tick(&mut m, t0 + STALL_GRACE),
        vec![Order::Kill {
            record: Some(STALL_GRACE)
        }]
    );
    m.on_main_exit(Exit::Signal(15, false), t0 + secs(1), false);
    assert_eq!(
        m.ending(None).unwrap().cause(),
        "stopped by the coordinator"
    );
}

/// A stop after a SIGTERM sends nothing more; but the teardown is
/// resilio's, so the kill comes after its stall grace, not the whole kill
/// grace (the launcher's SIGTERM came first; Lightning ignores SIGTERM, and
/// a restart waited 30 s: trial 27).
#[test]
fn a_coordinator_stop_after_a_signal_or_the_exit_does_nothing() {
    let (mut m, t0) = machine(linked());
    m.on_signal(Sig::Term, t0, wall());
    assert!(m.on_command(stop("x"), t0 + secs(1)).is_empty());
    assert!(!tick(&mut m, t0 + secs(1) + STALL_GRACE - secs(1))
        .iter()
        .any(|o| matches!(o, Order::Kill { .. })));
    let a = tick(&mut m, t0 + secs(1) + STALL_GRACE);
    assert!(a.iter().any(|o| matches!(o, Order::Kill { .. })), "{a:?}");
    let (mut m, t0) = machine(linked());
    m.on_main_exit(Exit::Code(1), t0, false);
    assert!(m.on_command(stop("x"), t0).is_empty());
}

#[test]
fn a_probe_is_taken_while_the_trainer_lives() {
    let (mut m, t0) = machine(linked());
    let probe = || CommandKind::Diagnose {
        reason: "rank 2 stalled".into(),
    };
    assert_eq!(
        m.on_command(probe(), t0),
        vec![Order::Probe {
            reason: "rank 2 stalled".into()
        }]
    );
    m.on_main_exit(Exit::Code(0), t0, false);
    assert!(m.on_command(probe(), t0).is_empty());
}

#[test]
fn an_operator_checkpoint_reaches_the_trainer() {
    let (mut m, t0) = machine(linked());
    let a = m.on_command(
        CommandKind::Checkpoint {
            id: 4,
            step: 300,
            reason: "operator".into(),
        },
        t0,
    );
    assert_eq!(
        a,
        vec![Order::Checkpoint {
            id: 4,
            step: 300,
            reason: "operator".into()
        }]
    );
    assert!(m.monitoring());
}

#[test]
fn a_silent_rank_lives_on_the_jobs_progress() {
    let (mut m, t0) = machine(linked());
    assert_eq!(
        m.on_job_progress(t0 + secs(90), false),
        vec![Order::LiveOnJobProgress]
    );
    assert!(tick(&mut m, t0 + STARTUP + secs(10)).is_empty());
}

#[test]
fn a_rank_with_progress_of_its_own_or_news_from_before_its_start_ignores_the_job() {
    let (mut m, t0) = machine(linked());
    assert!(m.on_job_progress(t0 + secs(90), true).is_empty());
    assert!(m.on_job_progress(t0, false).is_empty());
    assert!(matches!(
        tick(&mut m, t0 + STARTUP).as_slice(),
        [Order::Stalled { .. }]
    ));
}

#[test]
fn a_silent_rank_that_lost_the_coordinator_is_not_stopped_for_its_silence() {
    let (mut m, t0) = machine(linked());
    m.on_job_progress(t0 + secs(1), false);
    m.on_coordinator_lost("timeout".into());
    let late = t0 + STARTUP * 2;
    assert!(tick(&mut m, late).is_empty());
    assert_eq!(
        m.on_coordinator_back(12.5, 3),
        vec![Order::CoordinatorBack {
            gap_s: 12.5,
            failed_requests: 3
        }]
    );
    assert!(tick(&mut m, late + STARTUP - secs(1)).is_empty());
    assert!(matches!(
        tick(&mut m, late + STARTUP).as_slice(),
        [Order::Stalled { .. }]
    ));
}

#[test]
fn a_rank_with_progress_of_its_own_stalls_even_with_the_coordinator_lost() {
    let (mut m, t0) = machine(linked());
    m.on_coordinator_lost("timeout".into());
    assert!(matches!(
        tick(&mut m, t0 + STARTUP).as_slice(),
        [Order::Stalled { .. }]
    ));
}

// ---- the main child's exit, draining, the loop's timing

#[test]
fn an_exit_with_descendants_left_terms_them_then_kills_after_the_grace() {
    let (mut m, t0) = machine(settings());
    assert_eq!(
        m.on_main_exit(Exit::Code(0), t0, true),
        vec![Order::TermRemaining]
    );
    assert!(!m.finished(true));
    assert_eq!(m.plan(t0).wake, t0 + secs(1));
    assert_eq!(
        tick(&mut m, t0 + GRACE),
        vec![Order::Kill {
            record: Some(GRACE)
        }]
    );
    assert!(m.finished(false));
    let e = m.ending(None).unwrap();
    assert_eq!((e.code(), e.cause().as_str()), (0, "completed"));
}

#[test]
fn descendants_that_survive_sigkill_are_given_up_on() {
    let (mut m, t0) = machine(settings());
    m.on_main_exit(Exit::Code(1), t0, true);
    tick(&mut m, t0 + GRACE);
    assert_eq!(
        tick(&mut m, t0 + GRACE + secs(10)),
        vec![Order::Kill { record: None }]
    );
    assert_eq!(
        tick(&mut m, t0 + GRACE + secs(11)),
        vec![Order::Kill { record: None }, Order::GiveUp]
    );
}

#[test]
fn plain_ends_have_their_causes() {
    for (exit, code, cause) in [
        (Exit::Code(0), 0, "completed"),
        (Exit::Code(3), 3, "exited with error"),
        (Exit::Signal(9, false), 137, "killed by signal"),
    ] {
        let (mut m, t0) = machine(settings());
        m.on_main_exit(exit, t0, false);
        let e = m.ending(None).unwrap();
        assert_eq!((e.code(), e.cause().as_str()), (code, cause));
        assert_eq!(e.failed_at, Some(t0));
        assert!(!e.stopped_on_request() && !e.pre_timeout);
    }
}

#[test]
fn no_ending_before_the_exit() {
    let (m, _) = machine(settings());
    assert!(m.ending(None).is_none());
    assert!(!m.finished(false));
}

#[test]
fn the_plan_wakes_at_the_deadline_or_to_keep_the_journal_current() {
    let (mut m, t0) = machine(settings());
    let p = m.plan(t0);
    assert_eq!(p.wake, t0 + secs(1));
    assert!(p.step_wake.is_some());
    let p = m.plan(t0 + STARTUP - Duration::from_millis(300));
    assert_eq!(p.wake, t0 + STARTUP);
    m.on_signal(Sig::Term, t0, wall());
    assert_eq!(m.plan(t0).step_wake, None);
}

#[test]
fn a_late_wake_while_monitoring_restarts_the_clock() {
    let (mut m, t0) = machine(settings());
    let wake = m.plan(t0 + secs(50)).wake;
    let now = wake + secs(60);
    assert_eq!(tick(&mut m, now), vec![Order::Resumed { late: secs(60) }]);
    // The time not observed is not a stall.
    assert_eq!(m.policy.deadline(), now + STARTUP);
    // A little late is not a suspension.
    let wake = m.plan(now).wake;
    assert!(tick(&mut m, wake + secs(1)).is_empty());
}

#[test]
fn observing_a_stalled_rank_is_journaled_as_a_stop_that_would_have_been_and_watched_on() {
    let (mut m, at) = stalled(Settings {
        observe: true,
        ..settings()
    });
    let out = m.on_diagnostics_done(at);
    assert!(
        matches!(&out[..], [Order::Observed { would, reason }]
            if would.starts_with("stop this rank (stalled)") && reason.contains("step")),
        "{out:?}"
    );
    assert!(m.monitoring(), "watched on, never stopped");
    // The clock restarted: no stall again at once.
    assert!(tick(&mut m, at + secs(1)).is_empty());
    // A numerical failure is observed too.
    let out = m.on_numerical("loss nan".into(), at + secs(2));
    assert!(matches!(&out[..], [Order::Observed { .. }]), "{out:?}");
    assert!(m.monitoring());
}

/// Trial 28: a stalled rank's own probe was taken as its barrier let go,
/// and the verdict compared it with the others' a second later, by when it
/// was saving. It answers the coordinator's ask with a look of now too:
/// once its diagnostics are done (not during them: the probe could catch
/// the trainer in its dump handler), at once when they are.
#[test]
fn a_stalled_rank_answers_the_coordinators_probe_once_its_diagnostics_are_done() {
    let (mut m, at) = stalled(linked());
    let diagnose = CommandKind::Diagnose {
        reason: "rank 0 stalled".into(),
    };
    let probe = || Order::Probe {
        reason: "rank 0 stalled".into(),
    };
    assert!(m.on_command(diagnose.clone(), at).is_empty());
    let out = m.on_diagnostics_done(at + secs(1));
    assert!(out.contains(&probe()), "{out:?}");
    assert!(m.awaiting_judgment());
    // Asked again while awaiting the verdict: at once.
    assert_eq!(m.on_command(diagnose.clone(), at + secs(2)), vec![probe()]);
    // Told to carry on during the diagnostics: it still answers.
    let (mut m, at) = stalled(linked());
    m.on_command(diagnose.clone(), at);
    m.on_command(
        CommandKind::CarryOn {
            reason: "busy".into(),
        },
        at,
    );
    let out = m.on_diagnostics_done(at + secs(1));
    assert!(out.contains(&probe()) && m.monitoring(), "{out:?}");
    // A stop asked during the diagnostics stands, with no probe.
    let (mut m, at) = stalled(linked());
    m.on_command(diagnose.clone(), at);
    m.on_command(stop("teardown"), at);
    let out = m.on_diagnostics_done(at + secs(1));
    assert!(!out.contains(&probe()), "{out:?}");
    // Monitoring, it probes.
    let (mut m, at) = machine(linked());
    assert_eq!(m.on_command(diagnose, at), vec![probe()]);
}

/// Trial 26: a peer's evaluation ended a moment after this rank's limit; the
/// trainer stepped on while its stall was judged, and the healthy run was
/// torn down for a hang (a crash loop, when the next evaluation did the
/// same). A step past the stall's withdraws it.
#[test]
fn a_step_while_the_stall_is_judged_withdraws_it() {
    let (mut m, at) = stalled(linked());
    // Nothing stepped yet: the stall stands.
    assert!(m.on_progress_while_stalled(at).is_empty());
    m.on_diagnostics_done(at);
    assert!(m.judging());
    m.policy.on_progress(at + secs(1), Some(1), true, "stdout");
    let a = m.on_progress_while_stalled(at + secs(1));
    assert!(
        matches!(a.as_slice(), [Order::CarryOn { reason }] if reason.contains("step 1")),
        "{a:?}"
    );
    assert!(m.monitoring() && !m.judging());
    // The judgment's deadline no longer stops it.
    assert!(tick(&mut m, at + JUDGMENT).is_empty());
}

/// Trial 28: the stall was declared as the barrier it waited in let go,
/// and the trainer went into a save that prints nothing. Its look of now,
/// taken for the coordinator, finds it working: the stall is withdrawn.
/// Only a step limit's stall: past startup's limit or a long phase's, a
/// trainer may work and still be stuck (a loop that never ends).
#[test]
fn work_found_while_a_step_stall_is_judged_withdraws_it() {
    let how = || "in its own code, 0.40s of CPU".to_string();
    let (mut m, t0) = machine(linked());
    m.policy.on_progress(t0 + secs(1), Some(5), true, "stdout");
    let at = t0 + secs(3600);
    assert!(matches!(
        tick(&mut m, at).first(),
        Some(Order::Stalled { .. })
    ));
    // Not while its diagnostics are taken (nothing asked it yet).
    assert!(m.on_work_while_stalled(at, how()).is_empty());
    m.on_diagnostics_done(at);
    let a = m.on_work_while_stalled(at + secs(1), how());
    assert!(
        matches!(a.as_slice(), [Order::CarryOn { reason }] if reason.contains("0.40s of CPU")),
        "{a:?}"
    );
    assert!(m.monitoring());
    // Startup's limit: the verdict stands.
    let (mut m, at) = stalled(linked());
    m.on_diagnostics_done(at);
    assert!(m.on_work_while_stalled(at + secs(1), how()).is_empty());
    assert!(m.awaiting_judgment());
}

#[test]
fn a_step_during_the_diagnostics_withdraws_the_stall_once_they_are_done() {
    let (mut m, at) = stalled(linked());
    m.policy.on_progress(at + secs(1), Some(1), true, "stdout");
    assert!(m.on_progress_while_stalled(at + secs(1)).is_empty());
    let a = m.on_diagnostics_done(at + secs(2));
    assert!(matches!(a.as_slice(), [Order::CarryOn { .. }]), "{a:?}");
    assert!(m.monitoring());
    // A teardown the coordinator asked for meanwhile still stands.
    let (mut m, at) = stalled(linked());
    m.policy.on_progress(at + secs(1), Some(1), true, "stdout");
    m.on_progress_while_stalled(at + secs(1));
    assert!(m
        .on_command(stop("rank 3 hung first"), at + secs(1))
        .is_empty());
    assert_eq!(
        m.on_diagnostics_done(at + secs(2)),
        vec![Order::StopStalled { grace: STALL_GRACE }]
    );
}

#[test]
fn the_step_the_stall_was_at_does_not_withdraw_it() {
    let (mut m, t0) = machine(linked());
    m.policy.on_progress(t0 + secs(1), Some(5), true, "stdout");
    let at = t0 + secs(3600);
    let a = tick(&mut m, at);
    let Some(Order::Stalled { .. }) = a.first() else {
        panic!("{a:?}")
    };
    m.on_diagnostics_done(at);
    // A bar redrawn at the same step (tqdm's monitor thread) is no step.
    m.policy.on_progress(at + secs(1), Some(5), true, "stderr");
    assert!(m.on_progress_while_stalled(at + secs(1)).is_empty());
    assert!(m.judging());
}
