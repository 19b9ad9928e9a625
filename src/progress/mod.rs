//! Progress sources: where a rank's steps come from.
//!
//! - [`output`]: the trainer's stdout/stderr, passed through byte for byte
//!   while a regex picks out steps (zero code change).
//! - [`socket`]: a Unix datagram socket (`RESILIO_SOCKET`) taking one-line
//!   `key=value` messages, protocol in `docs/progress-protocol.md`.
//! - [`file`]: a file the trainer rewrites, watched with inotify or polled.
//!
//! Each source turns what it sees into [`ProgressEvent`]s on one channel; the agent
//! feeds them to the [`tracker`] (liveness and the step's name), the stall
//! policy and the journal.

/// The highest step number resilio takes from a trainer: 2^53 - 1, exact
/// as a JSON number read as a double (the coordinator refuses reports above
/// it). A larger number from any source is not a step.
pub const MAX_STEP: u64 = (1 << 53) - 1;

pub mod checkpoint_dir;
pub mod figures;
pub mod file;
pub mod output;
pub mod patterns;
pub mod socket;
pub mod tracker;

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
    /// A complete checkpoint appeared in the watched checkpoint directory.
    CheckpointDir,
}

impl Source {
    /// Name used in the journal.
    pub fn name(self) -> &'static str {
        match self {
            Source::Stdout => "stdout",
            Source::Stderr => "stderr",
            Source::Socket => "socket",
            Source::File => "file",
            Source::CheckpointDir => "checkpoint_dir",
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
        /// Numbers sent with it: the socket's `key=value` fields
        /// (`loss`, `compute_s`, ...), or the figures printed on the
        /// step's line (`progress::figures`).
        metrics: Vec<(String, f64)>,
        /// The phase announced in the same message (`phase=comm step=12`),
        /// which decides whether the step reports the trainer's step or
        /// only names the step a long phase is about.
        with_phase: Option<String>,
    },
    /// Life that names no step (another bar's count, a log dict's epoch):
    /// a new count is progress, never the step's name nor an interval.
    Activity { count: u64 },
    /// The trainer entered a phase (`train`, `checkpoint`, `eval`, ...), at
    /// a step when the message named one.
    Phase { name: String, step: Option<u64> },
    /// The trainer finished a checkpoint (at a step, when it said which).
    CheckpointDone { step: Option<u64> },
    /// Follows the `checkpoint` phase of a synchronous save that named its
    /// step (HF's `Saving model checkpoint to out/checkpoint-25`): a later
    /// step completes it.
    SyncSave { step: u64 },
    /// What the watched checkpoint directory holds for the checkpoint whose
    /// `CheckpointDone` follows (its size, and names a save in progress
    /// leaves behind).
    CheckpointFiles(checkpoint_dir::Files),
    /// Figures printed without a step (`{'loss': 0.09, ...}`): no progress,
    /// they go with the next step's record.
    Figures(Vec<(String, f64)>),
    /// The stream's first output: the trainer's start-up is done, as far as
    /// its output shows (`with_step`: a step already in it, nothing said
    /// before the first step).
    FirstOutput { with_step: bool },
    /// The trainer said it loaded a checkpoint (a line of its output, before
    /// its first step; `restored` on the socket).
    CheckpointLoaded { line: String, step: Option<u64> },
    /// A message that could not be understood, with the kind of fault.
    Malformed { fault: &'static str, sample: String },
    /// A source failed and stopped (fail open: supervision goes on without it).
    SourceFailed(String),
}

/// One observation, stamped when it was made.
#[derive(Clone, Debug)]
pub struct ProgressEvent {
    /// When resilio saw it.
    pub at: Instant,
    /// Where from.
    pub source: Source,
    /// What.
    pub kind: Kind,
}

/// Events queued beyond this wake the agent even if none is urgent.
const WAKE_AT: usize = 1024;

/// Where sources put events: a queue the agent drains when it wakes.
///
/// A step does not wake the agent unless it could bring the stall deadline
/// forward (the agent publishes when that is, see
/// [`Sender::wake_for_steps_before`]): the policy only needs the steps, with
/// their own timestamps, by its next deadline, and the agent wakes at that
/// deadline anyway. So a trainer stepping 10 times a second costs one thread
/// wake per step (the source's own), not two. Everything else (phases,
/// checkpoints, faults) wakes the agent at once, as does a long queue.
#[derive(Clone, Default)]
pub struct Sender {
    inner: std::sync::Arc<Queue>,
}

struct Queue {
    queue: std::sync::Mutex<Vec<ProgressEvent>>,
    wake: tokio::sync::Notify,
    closed: std::sync::atomic::AtomicBool,
    base: Instant,
    /// Steps seen before this many nanoseconds after `base` wake the agent.
    step_wake_before: std::sync::atomic::AtomicU64,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            queue: Default::default(),
            wake: Default::default(),
            closed: Default::default(),
            base: Instant::now(),
            step_wake_before: std::sync::atomic::AtomicU64::new(u64::MAX),
        }
    }
}

impl Sender {
    /// A new, empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queue an event. Returns false once the agent has closed the queue.
    pub fn send(&self, ev: ProgressEvent) -> bool {
        if self.is_closed() {
            return false;
        }
        let urgent = match ev.kind {
            Kind::Step { .. } => {
                let at = ev.at.saturating_duration_since(self.inner.base).as_nanos() as u64;
                at < self
                    .inner
                    .step_wake_before
                    .load(std::sync::atomic::Ordering::Relaxed)
            }
            _ => true,
        };
        let len = {
            let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.push(ev);
            q.len()
        };
        if urgent || len >= WAKE_AT {
            self.inner.wake.notify_one();
        }
        true
    }

    /// Steps observed before `t` wake the agent; later ones wait to be
    /// drained. `None`: steps never wake it.
    pub fn wake_for_steps_before(&self, t: Option<Instant>) {
        let nanos = match t {
            Some(t) => t
                .saturating_duration_since(self.inner.base)
                .as_nanos()
                .min(u64::MAX as u128 - 1) as u64,
            None => 0,
        };
        self.inner
            .step_wake_before
            .store(nanos, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a queued step was observed before `t` (one that arrived
    /// while the agent was publishing a new threshold).
    pub fn has_steps_before(&self, t: Instant) -> bool {
        self.inner
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|e| e.at < t)
    }

    /// Take every queued event, oldest first.
    pub fn drain(&self) -> Vec<ProgressEvent> {
        std::mem::take(&mut *self.inner.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Resolves when an urgent event (or a long queue) is waiting.
    pub async fn woken(&self) {
        self.inner.wake.notified().await
    }

    /// Tell sources to stop.
    pub fn close(&self) {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the agent closed the queue.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(std::sync::atomic::Ordering::Relaxed)
    }
}
