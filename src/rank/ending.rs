//! How a rank ended, as the lifecycle saw it: the exit code resilio
//! returns, the `cause` of `rank_exit`, whether it was stopped on request.

use crate::policy::stall::Stall;
use crate::process::Exit;
use std::time::Instant;

/// Why the agent is stopping the trainer.
#[derive(Clone, Debug, PartialEq)]
pub enum StopReason {
    /// A signal from outside (forwarded), by name.
    Signal(&'static str),
    /// The stall policy fired.
    Stall,
    /// The coordinator stopped the step (another rank failed).
    Coordinator,
    /// Its loss went to NaN or Inf (`policy::numerical`): what was seen.
    Numerical(String),
}

/// How the rank ended, for `rank_exit` and `failure`.
#[derive(Clone, Debug, PartialEq)]
pub struct Ending {
    pub exit: Exit,
    /// The stall that stopped it (none if the trainer ended on its own meanwhile).
    pub stall: Option<Stall>,
    /// The trainer exited on its own during the stall's diagnostics.
    pub stall_cancelled: bool,
    pub stop: Option<StopReason>,
    /// When it failed: the stall, or the main child's exit.
    pub failed_at: Option<Instant>,
    /// Slurm's pre-timeout signal came.
    pub pre_timeout: bool,
}

impl Ending {
    /// resilio's exit code.
    pub fn code(&self) -> i32 {
        if self.stall.is_some() {
            crate::error::EXIT_STALLED
        } else if self.numerical().is_some() {
            crate::error::EXIT_NUMERICAL
        } else {
            self.exit.code()
        }
    }

    /// The `cause` of `rank_exit`.
    pub fn cause(&self) -> String {
        match (&self.stop, self.exit) {
            (Some(StopReason::Stall), _) => "stalled".to_string(),
            (Some(StopReason::Signal(name)), _) => format!("stopped by {name}"),
            (Some(StopReason::Coordinator), _) => "stopped by the coordinator".into(),
            (Some(StopReason::Numerical(_)), _) => "stopped: numerical failure".into(),
            (None, Exit::Code(0)) => "completed".into(),
            (None, Exit::Code(_)) => "exited with error".into(),
            (None, Exit::Signal(..)) => "killed by signal".into(),
        }
    }

    /// What the numerical failure it was stopped for was.
    pub fn numerical(&self) -> Option<&str> {
        match &self.stop {
            Some(StopReason::Numerical(d)) => Some(d),
            _ => None,
        }
    }

    /// Stopped by a signal from outside or by the coordinator (not a failure of its own).
    pub fn stopped_on_request(&self) -> bool {
        matches!(
            self.stop,
            Some(StopReason::Signal(_) | StopReason::Coordinator)
        )
    }
}
