//! The rank as set up: its child running, the sources that watch it, its
//! journal, its coordinator link; what the loop waits on besides progress.

use super::progress_log::Clock;
use crate::config::Config;
use crate::context::Identity;
use crate::coordinator::client::{Link, Note, Outbox};
use crate::coordinator::{Coordinator, IntervalAdvisor};
use crate::journal::Writer;
use crate::process;
use crate::progress::{self, output};
use crate::slurm::SlurmContext;
use nix::unistd::Pid;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// The rank as set up, its trainer running.
pub(crate) struct Rank {
    pub cfg: Config,
    /// The command as given (before nodes were left out of it).
    pub argv: Vec<OsString>,
    pub id: Identity,
    pub slurm: SlurmContext,
    pub clock: Clock,
    pub job_dir: PathBuf,
    /// The child is a step whose ranks have agents of their own (the job
    /// level's srun): no stall or loss is judged from its merged output,
    /// and the pre-timeout signal asks the step for a checkpoint.
    pub supervises_step: bool,
    /// This process records the job's start and end (no launcher or job
    /// level does).
    pub owns_job: bool,
    /// This agent runs the node's health check (a rank's local rank 0).
    pub checks_node: bool,
    pub journal: Writer,
    pub hosted: Option<Coordinator>,
    pub advice: Option<IntervalAdvisor>,
    pub outbox: Arc<Outbox>,
    pub link: Option<Link>,
    /// The node's relay, when this agent runs it (`[coordinator] node_relay`).
    pub relay: Option<crate::coordinator::relay::Relay>,
    pub tx: progress::Sender,
    pub socket_ok: bool,
    pub sock_path: PathBuf,
    /// Coordinated checkpoint requests reach the trainer through this file.
    pub control_path: PathBuf,
    pub pid: Pid,
    pub launched: Instant,
    pub tail: Arc<output::Tail>,
    pub pumps: Vec<std::thread::JoinHandle<()>>,
    pub file_watch: Option<progress::file::WatchHandle>,
    pub ckpt_watch: Option<progress::checkpoint_dir::DirWatch>,
}

/// What the loop waits on besides the progress queue.
pub(crate) struct Inputs {
    pub signals: process::Signals,
    pub notes: UnboundedReceiver<Note>,
}
