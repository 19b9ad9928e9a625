//! Progress sources: where a rank's steps come from.
//!
//! - [`output`]: the trainer's stdout/stderr, passed through byte for byte
//!   while a regex picks out steps (zero code change).
//! - [`socket`]: a Unix datagram socket (`RESILIO_SOCKET`) taking one-line
//!   `key=value` messages, protocol in `docs/progress-protocol.md`.
//! - [`file`]: a file the trainer rewrites, watched with inotify or polled.
//!
//! Each source turns what it sees into [`Event`]s on one channel; the agent
//! feeds them to the stall policy and the journal.

pub mod file;
pub mod output;
pub mod socket;

use std::time::Instant;

/// Which source an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Parsed from stdout.
    Stdout,
    /// Parsed from stderr.
    Stderr,
    /// A datagram on `RESILIO_SOCKET`.
    Socket,
    /// The watched progress file.
    File,
}

impl Source {
    /// Name used in the journal.
    pub fn name(self) -> &'static str {
        match self {
            Source::Stdout => "stdout",
            Source::Stderr => "stderr",
            Source::Socket => "socket",
            Source::File => "file",
        }
    }
}

/// What a source saw.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// The trainer advanced: a step number, or `None` when the source carries
    /// no number (a progress file whose content changed).
    Step {
        step: Option<u64>,
        /// Extra numeric fields (`loss`, `compute_s`, ...), socket only.
        metrics: Vec<(String, f64)>,
    },
    /// The trainer entered a phase (`train`, `checkpoint`, `eval`, ...).
    Phase(String),
    /// The trainer finished a checkpoint (at a step, when it said which).
    CheckpointDone { step: Option<u64> },
    /// A message that could not be understood, with the kind of fault.
    Malformed { fault: &'static str, sample: String },
    /// A source failed and stopped (fail open: supervision goes on without it).
    SourceFailed(String),
}

/// One observation, stamped when it was made.
#[derive(Clone, Debug)]
pub struct Event {
    /// When resilio saw it.
    pub at: Instant,
    /// Where from.
    pub source: Source,
    /// What.
    pub kind: Kind,
}

/// The sending half every source gets.
pub type Sender = tokio::sync::mpsc::UnboundedSender<Event>;
