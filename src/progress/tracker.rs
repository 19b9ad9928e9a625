//! Liveness and the step number: two questions, answered separately.
//!
//! - **Liveness.** Any source whose *own* counter advances shows that the
//!   trainer is alive: a new step number in the output, a new step on the
//!   socket, a progress file whose content changed. A repeat of a source's
//!   last number is not progress; numbers from another source never make a
//!   repeat.
//! - **The step's name.** Checkpoints, accounting and the coordinator need
//!   one step number. It comes from one source, the *namer*, chosen by rank:
//!   the socket once it carries step reports (a step with no phase, or with a
//!   phase inside a step), else the output, else the progress file. Lightning
//!   shows why: its bar counts batches while the callback sends optimizer
//!   steps, and only the second is the step a checkpoint is taken at. A step
//!   sent with a long phase (`phase=checkpoint step=10`) or a
//!   `checkpoint_done` names a checkpoint, not the trainer's step, and never
//!   makes the socket the namer. A change of namer is reported once, for the
//!   journal.
//!
//! Phases inside a step (`compute`, `comm`, ...) also give compute time: from
//! `phase=compute` to the next `comm` or `data` phase, used as `compute_s`
//! when the trainer never sends one itself.
//!
//! Pure: events and their times in, observations out.

use super::Source;
use std::time::Instant;

/// Which source names the step. Ordered: a higher one takes over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Namer {
    /// A progress file (Megatron's latest_checkpointed_iteration.txt and
    /// the like: often the last checkpoint, not the current step).
    File,
    /// Step lines in the trainer's stdout or stderr.
    Output,
    /// Step reports on `RESILIO_SOCKET`.
    Socket,
}

impl Namer {
    /// Name used in the journal.
    pub fn name(self) -> &'static str {
        match self {
            Namer::File => "file",
            Namer::Output => "output",
            Namer::Socket => "socket",
        }
    }

    /// The kind of source an event came from (`None`: a checkpoint directory).
    pub fn of(source: Source) -> Option<Namer> {
        match source {
            Source::Stdout | Source::Stderr => Some(Namer::Output),
            Source::Socket => Some(Namer::Socket),
            Source::File => Some(Namer::File),
            Source::CheckpointDir => None,
        }
    }
}

/// How a step arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepRole {
    /// A report of the trainer's step (a step line, `step=N`, `phase=compute
    /// step=N`): may name the step.
    Report,
    /// A step attached to a long phase (`phase=checkpoint step=N`): liveness
    /// only, it never makes its source the namer.
    Annotation,
}

/// What one step observation means.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// A source's own counter advanced: the trainer is alive.
    pub alive: bool,
    /// The named step advanced (an interval the stall policy may learn).
    pub named_advanced: bool,
    /// The named step after this observation.
    pub step: Option<u64>,
    /// The namer changed: (from, to).
    pub namer_changed: Option<(Option<Namer>, Namer)>,
}

/// Per-rank progress bookkeeping.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    output: Option<u64>,
    socket: Option<u64>,
    file: Option<u64>,
    /// Steps attached to long phases and checkpoints (their own counter, so
    /// that they never make a later step report look like a repeat).
    annotations: Option<u64>,
    namer: Option<Namer>,
    step: Option<u64>,
    alive_count: u64,
    compute_since: Option<Instant>,
    trainer_sends_compute: bool,
}

impl Tracker {
    /// A tracker with nothing seen.
    pub fn new() -> Self {
        Self::default()
    }

    /// The named step.
    pub fn step(&self) -> Option<u64> {
        self.step
    }

    /// The source naming the step, once one has.
    pub fn namer(&self) -> Option<Namer> {
        self.namer
    }

    /// How many liveness observations so far (0: the rank has shown no
    /// progress of its own; a silent rank).
    pub fn alive_count(&self) -> u64 {
        self.alive_count
    }

    fn counter(&mut self, source: Source, role: StepRole) -> Option<&mut Option<u64>> {
        if role == StepRole::Annotation {
            return Some(&mut self.annotations);
        }
        match source {
            Source::Stdout | Source::Stderr => Some(&mut self.output),
            Source::Socket => Some(&mut self.socket),
            Source::File => Some(&mut self.file),
            Source::CheckpointDir => None,
        }
    }

    /// A step (or, with `None`, progress without a number: a progress file
    /// that changed) seen from `source`.
    pub fn on_step(&mut self, source: Source, step: Option<u64>, role: StepRole) -> Observation {
        let mut advanced = step.is_none();
        if let (Some(n), Some(c)) = (step, self.counter(source, role)) {
            advanced = *c != Some(n);
            *c = Some(n);
        }
        let mut out = Observation {
            alive: advanced,
            named_advanced: false,
            step: self.step,
            namer_changed: None,
        };
        if !advanced {
            return out;
        }
        self.alive_count += 1;
        let candidate = Namer::of(source).filter(|_| step.is_some() && role == StepRole::Report);
        if let Some(c) = candidate {
            if self.namer.is_none_or(|n| c > n) {
                out.namer_changed = Some((self.namer, c));
                self.namer = Some(c);
            }
        }
        match (candidate, self.namer) {
            (Some(c), Some(n)) if c == n => {
                out.named_advanced = self.step != step;
                self.step = step;
            }
            // No source names steps at all (a file without numbers): every
            // sign of life is the step's clock.
            (_, None) => out.named_advanced = true,
            _ => {}
        }
        out.step = self.step;
        out
    }

    /// The trainer sent its own `compute_s`: phases no longer give one.
    pub fn on_compute_metric(&mut self) {
        self.trainer_sends_compute = true;
        self.compute_since = None;
    }

    /// A phase inside a step began at `at`. Returns the compute time just
    /// measured (`compute` to the next `comm` or `data`), unless the trainer
    /// sends its own.
    pub fn on_in_step_phase(&mut self, at: Instant, name: &str) -> Option<f64> {
        if self.trainer_sends_compute {
            return None;
        }
        match name {
            "compute" | "forward" => {
                // `forward` starts the compute of a step that names its
                // parts; a `compute` already open keeps its start.
                if name == "compute" || self.compute_since.is_none() {
                    self.compute_since = Some(at);
                }
                None
            }
            "backward" | "optimizer" => None,
            "comm" | "data" => self
                .compute_since
                .take()
                .map(|t| at.saturating_duration_since(t).as_secs_f64()),
            _ => None,
        }
    }

    /// A long phase (or the end of the step's phases): an open compute
    /// interval is not compute time.
    pub fn on_other_phase(&mut self) {
        self.compute_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn output_steps_keep_counting_after_a_checkpoint_message_with_a_step() {
        let mut t = Tracker::new();
        for n in 1..=10 {
            assert!(t.on_step(Source::Stdout, Some(n), StepRole::Report).alive);
        }
        // `phase=checkpoint step=10` on the socket: liveness (the socket's own
        // counter moved) but not a namer.
        let o = t.on_step(Source::Socket, Some(10), StepRole::Annotation);
        assert!(o.alive && !o.named_advanced && o.namer_changed.is_none());
        for n in 11..=20 {
            let o = t.on_step(Source::Stdout, Some(n), StepRole::Report);
            assert!(o.alive && o.named_advanced, "step {n}");
        }
        assert_eq!(t.step(), Some(20));
        assert_eq!(t.namer(), Some(Namer::Output));
    }

    #[test]
    fn socket_step_reports_name_the_step_and_output_stays_liveness() {
        // Lightning: the bar counts batches (4 per optimizer step), the
        // callback sends optimizer steps.
        let mut t = Tracker::new();
        let o = t.on_step(Source::Stderr, Some(1), StepRole::Report);
        assert_eq!(o.namer_changed, Some((None, Namer::Output)));
        let o = t.on_step(Source::Socket, Some(1), StepRole::Report);
        assert_eq!(o.namer_changed, Some((Some(Namer::Output), Namer::Socket)));
        for batch in 2..=8 {
            let o = t.on_step(Source::Stderr, Some(batch), StepRole::Report);
            assert!(o.alive, "a new batch is progress");
            assert!(!o.named_advanced);
            assert_eq!(o.step, Some(1), "batches do not name the step");
        }
        let o = t.on_step(Source::Socket, Some(2), StepRole::Report);
        assert!(o.alive && o.named_advanced);
        assert_eq!(t.step(), Some(2));
        // The output never takes the name back.
        let o = t.on_step(Source::Stderr, Some(9), StepRole::Report);
        assert!(o.namer_changed.is_none());
    }

    #[test]
    fn repeats_are_per_source() {
        let mut t = Tracker::new();
        assert!(t.on_step(Source::Stdout, Some(5), StepRole::Report).alive);
        assert!(!t.on_step(Source::Stdout, Some(5), StepRole::Report).alive);
        assert!(!t.on_step(Source::Stderr, Some(5), StepRole::Report).alive);
        // The same number from another source is that source's progress.
        assert!(t.on_step(Source::Socket, Some(5), StepRole::Report).alive);
        assert!(!t.on_step(Source::Socket, Some(5), StepRole::Report).alive);
        // Numberless progress always counts, and names nothing.
        let o = t.on_step(Source::File, None, StepRole::Report);
        assert!(o.alive && !o.named_advanced);
        assert_eq!(t.alive_count(), 3);
    }

    #[test]
    fn a_file_names_the_step_only_without_output_or_socket() {
        let mut t = Tracker::new();
        t.on_step(Source::File, Some(100), StepRole::Report);
        assert_eq!(t.namer(), Some(Namer::File));
        t.on_step(Source::Stdout, Some(130), StepRole::Report);
        assert_eq!(t.namer(), Some(Namer::Output));
        let o = t.on_step(Source::File, Some(200), StepRole::Report);
        assert!(o.alive && !o.named_advanced);
        assert_eq!(t.step(), Some(130));
    }

    #[test]
    fn numberless_progress_is_the_step_clock_when_nothing_names_steps() {
        let mut t = Tracker::new();
        let o = t.on_step(Source::File, None, StepRole::Report);
        assert!(o.alive && o.named_advanced);
        assert_eq!(o.step, None);
    }

    #[test]
    fn compute_time_runs_from_compute_to_comm_or_data() {
        let t0 = Instant::now();
        let ms = |m: u64| t0 + Duration::from_millis(m);
        let mut t = Tracker::new();
        assert_eq!(t.on_in_step_phase(ms(0), "data"), None);
        assert_eq!(t.on_in_step_phase(ms(10), "compute"), None);
        assert_eq!(t.on_in_step_phase(ms(410), "comm"), Some(0.4));
        assert_eq!(
            t.on_in_step_phase(ms(500), "comm"),
            None,
            "once per compute"
        );
        t.on_in_step_phase(ms(600), "forward");
        t.on_in_step_phase(ms(700), "backward");
        t.on_in_step_phase(ms(800), "optimizer");
        let c = t.on_in_step_phase(ms(900), "data").unwrap();
        assert!((c - 0.3).abs() < 1e-9, "{c}");
        // A checkpoint in between voids the open interval.
        t.on_in_step_phase(ms(1000), "compute");
        t.on_other_phase();
        assert_eq!(t.on_in_step_phase(ms(2000), "comm"), None);
        // The trainer's own compute_s wins from then on.
        t.on_compute_metric();
        t.on_in_step_phase(ms(3000), "compute");
        assert_eq!(t.on_in_step_phase(ms(3100), "comm"), None);
    }
}
