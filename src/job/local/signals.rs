//! The signals local mode handles, and what woke its supervising loop.

use crate::process::Signals;
use nix::sys::signal::Signal;
use std::time::Duration;

/// What woke the supervising loop.
pub(super) enum Wake {
    /// A child changed state, or the periodic tick: look again.
    Look,
    Term,
    Int,
    /// Another signal that would end resilio (SIGQUIT, ...): a stop from
    /// outside like SIGTERM, passed on as itsignals.
    Stop(Signal),
    /// A signal passed on to every rank.
    Forward(Signal),
}

/// The next signal, or 100 ms without one.
pub(super) async fn wait(signals: &mut Signals) -> Wake {
    tokio::select! {
        _ = signals.chld.recv() => Wake::Look,
        _ = signals.term.recv() => Wake::Term,
        _ = signals.int.recv() => Wake::Int,
        Some(s) = signals.stop.recv() => Wake::Stop(s),
        _ = signals.hup.recv() => Wake::Forward(Signal::SIGHUP),
        _ = signals.usr1.recv() => Wake::Forward(Signal::SIGUSR1),
        _ = signals.usr2.recv() => Wake::Forward(Signal::SIGUSR2),
        _ = signals.cont.recv() => Wake::Forward(Signal::SIGCONT),
        _ = tokio::time::sleep(Duration::from_millis(100)) => Wake::Look,
    }
}
