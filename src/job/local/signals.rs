//! The signals local mode handles, and what woke its supervising loop.

use crate::error::{Error, Result};
use nix::sys::signal::Signal;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// The signals the launcher handles.
pub(super) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    cont: tokio::signal::unix::Signal,
    chld: tokio::signal::unix::Signal,
    /// The other signals handled like SIGTERM ([`crate::process::STOP_SIGNALS`]).
    stop: tokio::sync::mpsc::UnboundedReceiver<Signal>,
}

/// What woke the supervising loop.
pub(super) enum Wake {
    /// A child changed state, or the periodic tick: look again.
    Look,
    Term,
    Int,
    /// Another signal that would end resilio (SIGQUIT, ...): a stop from
    /// outside like SIGTERM, passed on as itself.
    Stop(Signal),
    /// A signal passed on to every rank.
    Forward(Signal),
}

impl Signals {
    pub(super) fn install() -> Result<Signals> {
        let sig = |k: SignalKind| {
            signal(k).map_err(|e| Error::Other(format!("cannot install signal handler: {e}")))
        };
        Ok(Signals {
            term: sig(SignalKind::terminate())?,
            int: sig(SignalKind::interrupt())?,
            hup: sig(SignalKind::hangup())?,
            usr1: sig(SignalKind::user_defined1())?,
            usr2: sig(SignalKind::user_defined2())?,
            cont: sig(SignalKind::from_raw(libc::SIGCONT))?,
            chld: sig(SignalKind::child())?,
            stop: crate::process::stop_signals()
                .map_err(|e| Error::Other(format!("cannot install signal handler: {e}")))?,
        })
    }

    /// The next signal, or 100 ms without one.
    pub(super) async fn wait(&mut self) -> Wake {
        tokio::select! {
            _ = self.chld.recv() => Wake::Look,
            _ = self.term.recv() => Wake::Term,
            _ = self.int.recv() => Wake::Int,
            Some(s) = self.stop.recv() => Wake::Stop(s),
            _ = self.hup.recv() => Wake::Forward(Signal::SIGHUP),
            _ = self.usr1.recv() => Wake::Forward(Signal::SIGUSR1),
            _ = self.usr2.recv() => Wake::Forward(Signal::SIGUSR2),
            _ = self.cont.recv() => Wake::Forward(Signal::SIGCONT),
            _ = tokio::time::sleep(Duration::from_millis(100)) => Wake::Look,
        }
    }
}
