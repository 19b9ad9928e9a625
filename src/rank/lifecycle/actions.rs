//! What the machine and the loop share: the signals the agent handles, the
//! actions the machine returns, what the journal said of a checkpoint.

use crate::policy::stall::Stall;
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

/// The signals the agent handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sig {
    Term,
    Int,
    Hup,
    Usr1,
    Usr2,
    Cont,
    /// Any other signal that would end resilio ([`crate::process::STOP_SIGNALS`]:
    /// SIGQUIT, SIGALRM, ...): passed on as itself and handled like SIGTERM.
    Stop(Signal),
}

/// What the agent does; carried out in order by `rank::run`.
#[derive(Clone, Debug, PartialEq)]
pub enum Order {
    /// Forward the signal to the trainer's group and record it.
    Forward(Signal),
    /// Record that Slurm delivers the signal to the trainer itself.
    LeftToSlurm(Signal),
    /// Record a stop signal held back while the stall's diagnostics run.
    Deferred(Signal),
    /// A second SIGINT: SIGKILL the whole tree now, and record it.
    KillOnSecondInt,
    /// Slurm's pre-timeout signal in a batch script: the checkpoint signal
    /// to the trainers, and a `checkpoint_requested` record.
    PreTimeoutCheckpoint {
        received: Signal,
    },
    /// The checkpoint signal in a step: record the request, signal the
    /// trainer unless Slurm did.
    CheckpointSignal {
        received: Signal,
        forward: bool,
    },
    /// The stall policy fired at `at`: record it and start the diagnostics
    /// (and, when linked, the probe whose verdict goes to the coordinator).
    Stalled {
        stall: Stall,
        at: Instant,
    },
    /// The coordinator judged the stall: record `stop_judged`.
    StopJudged {
        detail: String,
    },
    /// SIGTERM to the stalled trainer's tree, `stop` recorded.
    StopStalled {
        grace: Duration,
    },
    /// The stop of a stalled rank waits for the coordinator's judgment.
    DeferStallStop {
        max_wait: Duration,
    },
    /// The step failed elsewhere: SIGTERM to the trainer's group.
    StopForCoordinator {
        detail: String,
        grace: Duration,
    },
    /// A numerical failure: SIGTERM to the trainer's group.
    StopForNumerical {
        detail: String,
        grace: Duration,
    },
    /// Probe the trainer now (the coordinator asks: a peer stalled).
    Probe {
        reason: String,
    },
    /// The coordinator asks for a checkpoint.
    Checkpoint {
        id: u64,
        step: u64,
        reason: String,
    },
    /// The rank lives on the job's progress (it reports none of its own).
    LiveOnJobProgress,
    /// The coordinator cannot be reached / is back.
    CoordinatorLost {
        error: String,
    },
    CoordinatorBack {
        gap_s: f64,
        failed_requests: u64,
    },
    /// The loop woke long after it planned: resilio was stopped or starved.
    Resumed {
        late: Duration,
    },
    /// The trainer was found stopped at its limit (Ctrl-Z, SIGSTOP): its
    /// clock restarts, and goes on restarting while it stays stopped.
    TrainerStopped,
    /// The stall is withdrawn: a peer works without a word (the coordinator).
    CarryOn {
        reason: String,
    },
    /// Observe mode: what would have been done, and why.
    Observed {
        would: String,
        reason: String,
    },
    /// Found working without a word at its step limit: busy and silent.
    BusySilent {
        cpu_s: f64,
        /// Seconds it was ready to run but waited for a CPU.
        cpu_wait_s: f64,
        /// Bytes it read and wrote meanwhile (a save to a slow file system
        /// works with little CPU).
        io_bytes: u64,
        window_s: f64,
        limit_s: f64,
        probe: String,
    },
    /// Ask the hosted coordinator for a checkpoint of every rank.
    CoordinateCheckpoint,
    /// The pre-timeout checkpoint is done or waited for long enough: stop the step.
    StopForPreTimeout {
        checkpoint_step: Option<Option<u64>>,
    },
    /// The main child exited and others live on: SIGTERM to them.
    TermRemaining,
    /// SIGKILL to the tree (again each time round); `record` the first time.
    Kill {
        record: Option<Duration>,
    },
    /// Processes survived SIGKILL for 10 s: record them and end without them.
    GiveUp,
}

/// What the journal said about the pre-timeout checkpoint (see [`Lifecycle::checkpoint_query`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Checked {
    /// Not looked at this time round.
    NotLooked,
    /// Looked, no `checkpoint_done` yet.
    NotDone,
    /// Done (at the step, if it said).
    Done(Option<u64>),
}
