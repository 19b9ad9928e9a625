//! Stall (hang) detection for one rank.
//!
//! Before the first sign of progress the rank is judged against
//! `startup_timeout`. After it, against a fixed timeout when configured,
//! otherwise an adaptive one:
//!
//! ```text
//! timeout = max(floor, factor × percentile(recent time per step), 2 × longest gap seen)
//! ```
//!
//! Time per step is the time between two sightings of the named step over
//! the steps it moved (a bar redrawn after 21 steps in 20 s: 0.95 s a
//! step); the gap is the time between sightings itself, so that steps seen
//! only every so often (a log line every 50 steps) are never stopped
//! between two sightings.
//!
//! so that 0.5 s steps are caught within the floor while 5-minute steps are
//! given most of an hour, and a pause that happened once and recovered (an
//! epoch boundary, an unannounced evaluation) is not taken for a hang later.
//!
//! Phases come in two kinds:
//! - **inside a step** (`compute`, `comm`, `data`, `forward`, `backward`,
//!   `optimizer`, configured names, and any name not known): judged by the
//!   step limit, measured from the last progress. Declaring where you are
//!   never switches hang detection off: a hang inside `comm` is a hang.
//! - **long** (`checkpoint`, `save`, `eval`, `validation`, and configured
//!   names with their own timeouts): judged by their own limit, measured
//!   from the phase's start; intervals that span one are not learnt.
//!
//! Progress (any source's own counter advancing) restarts the clock; which
//! source names the step is decided elsewhere (`progress::tracker`): only
//! advances of the named step are learnt as step intervals. A rank that
//! reports nothing of its own (a silent rank: only rank 0 prints, as in
//! Megatron-LM or torchtitan) is kept alive by the job's progress, which its
//! agent hears from the coordinator, and keeps the startup allowance.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// A sighting is late when the time since the last one is more than this
/// many times what its steps took by the trainer's own account, plus
/// [`LATE_SLACK_S`] (output buffering, a slow reader).
const LATE_FACTOR: f64 = 4.0;
const LATE_SLACK_S: f64 = 1.0;

names! {
    /// How the step limit is set (`rank_start.stall_mode`).
    StallMode {
        /// Learnt from the step intervals.
        Adaptive = "adaptive",
        /// A fixed limit (`--stall-timeout`, `[stall] timeout`).
        Fixed = "fixed",
    }
}

/// Parameters of the stall policy.
#[derive(Clone, Debug, PartialEq)]
pub struct StallConfig {
    /// Allowed time from launch to the first step.
    pub startup_timeout: Duration,
    /// A fixed timeout between steps; `None` means adaptive.
    pub fixed_timeout: Option<Duration>,
    /// Adaptive: multiple of the step-interval percentile.
    pub adaptive_factor: f64,
    /// Adaptive: which percentile of recent intervals (0..=1).
    pub adaptive_percentile: f64,
    /// Adaptive: the timeout never goes below this.
    pub adaptive_floor: Duration,
    /// Adaptive: how many recent intervals are kept.
    pub adaptive_window: usize,
    /// Allowed duration of a `checkpoint` phase.
    pub checkpoint_timeout: Duration,
    /// Allowed duration of an `eval` phase (and `validation`).
    pub eval_timeout: Duration,
    /// Further phases inside a step (judged by the step limit), besides
    /// the built-in ones ([`IN_STEP_PHASES`]).
    pub in_step_phases: Vec<String>,
    /// Further long phases, each with its own limit (config
    /// `[stall.phase_timeouts]`); they also override the built-in ones.
    pub phase_timeouts: BTreeMap<String, Duration>,
}

/// The phase a rank found working without a word at its step limit is
/// put in (see [`StallPolicy::on_busy`]).
pub const BUSY: &str = "busy";

/// Phases inside a step, judged by the step limit.
pub const IN_STEP_PHASES: &[&str] = &[
    "compute",
    "comm",
    "data",
    "forward",
    "backward",
    "optimizer",
];

/// How a phase name is judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PhaseClass {
    /// `train` (or an empty name): back to stepping.
    Train,
    /// A phase inside a step; `known: false` for a name nobody declared
    /// (judged the same way; the agent warns once).
    InStep { known: bool },
    /// A long phase with its own limit.
    Long(Duration),
}

impl StallConfig {
    pub fn mode(&self) -> StallMode {
        match self.fixed_timeout {
            Some(_) => StallMode::Fixed,
            None => StallMode::Adaptive,
        }
    }
}

impl Default for StallConfig {
    fn default() -> Self {
        StallConfig {
            startup_timeout: Duration::from_secs(30 * 60),
            fixed_timeout: None,
            adaptive_factor: 10.0,
            adaptive_percentile: 0.99,
            adaptive_floor: Duration::from_secs(20),
            adaptive_window: 256,
            checkpoint_timeout: Duration::from_secs(30 * 60),
            eval_timeout: Duration::from_secs(30 * 60),
            in_step_phases: Vec::new(),
            phase_timeouts: BTreeMap::new(),
        }
    }
}

impl StallConfig {
    /// How the phase `name` (lower case) is judged.
    pub fn classify(&self, name: &str) -> PhaseClass {
        if let Some(t) = self.phase_timeouts.get(name) {
            return PhaseClass::Long(*t);
        }
        match name {
            "train" | "" => PhaseClass::Train,
            "checkpoint" | "save" | "checkpointing" | "saving" => {
                PhaseClass::Long(self.checkpoint_timeout)
            }
            "eval" | "evaluation" | "evaluate" | "validation" | "validate" | "val" => {
                PhaseClass::Long(self.eval_timeout)
            }
            // Busy and silent: found working (its CPU time moving, not
            // waiting on a peer) at the step limit: judged like an
            // evaluation nobody announced.
            BUSY => PhaseClass::Long(self.eval_timeout),
            n if IN_STEP_PHASES.contains(&n) || self.in_step_phases.iter().any(|p| p == n) => {
                PhaseClass::InStep { known: true }
            }
            _ => PhaseClass::InStep { known: false },
        }
    }
}

/// What the trainer is doing, as far as the policy knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Launched, no step seen yet.
    Startup,
    /// Stepping.
    Train,
    /// A long phase announced by the trainer (`checkpoint`, `eval`, ...),
    /// with its own limit.
    Named(String, Duration),
}

impl Phase {
    /// The phase's name as written in the journal.
    pub fn name(&self) -> &str {
        match self {
            Phase::Startup => "startup",
            Phase::Train => "train",
            Phase::Named(n, _) => n,
        }
    }
}

/// Which limit a stall broke; the journal's `stall.stall_kind`, written
/// as its [`name`](StallKind::name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StallKind {
    /// No first step within `startup_timeout`.
    Startup,
    /// No step within the (fixed or adaptive) step timeout.
    Step { adaptive: bool },
    /// A named phase lasted longer than its timeout.
    Phase(String),
    /// A word a later build wrote (read from a journal; never detected).
    Unknown(String),
}

/// A record built field by field starts with a word nobody wrote.
impl Default for StallKind {
    fn default() -> StallKind {
        StallKind::Unknown(String::new())
    }
}

impl StallKind {
    /// Short name for the journal: `startup`, `step_adaptive`,
    /// `step_fixed`, `phase_NAME`.
    pub fn name(&self) -> String {
        match self {
            StallKind::Startup => "startup".into(),
            StallKind::Step { adaptive: true } => "step_adaptive".into(),
            StallKind::Step { adaptive: false } => "step_fixed".into(),
            StallKind::Phase(p) => format!("phase_{p}"),
            StallKind::Unknown(w) => w.clone(),
        }
    }

    /// The kind a journal's word names.
    pub fn from_name(word: &str) -> StallKind {
        match word {
            "startup" => StallKind::Startup,
            "step_adaptive" => StallKind::Step { adaptive: true },
            "step_fixed" => StallKind::Step { adaptive: false },
            w => match w.strip_prefix("phase_") {
                Some(p) => StallKind::Phase(p.to_string()),
                None => StallKind::Unknown(w.to_string()),
            },
        }
    }
}

impl serde::Serialize for StallKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> serde::Deserialize<'de> for StallKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<StallKind, D::Error> {
        String::deserialize(d).map(|w| StallKind::from_name(&w))
    }
}

impl StallKind {
    /// Which knob or announcement would have given a trainer that was in
    /// fact busy (an evaluation, a save, a slow first step) the time it
    /// needed: said with every stall, so that a false stop says how to
    /// avoid the next one.
    pub fn avoid(&self) -> String {
        match self {
            StallKind::Startup => "if the trainer needs longer to its first step, raise --startup-timeout ([stall] startup_timeout)".into(),
            StallKind::Step { adaptive: true } => "if the trainer was busy without printing (an evaluation, a save), announce it (HF's `***** Running Evaluation *****`, `phase=eval` on RESILIO_SOCKET, resilio_client.phase(\"eval\")) so --eval-timeout applies, or raise --stall-floor ([stall] adaptive_floor) or set --stall-timeout".into(),
            StallKind::Step { adaptive: false } => "if the trainer was busy without printing (an evaluation, a save), announce it (HF's `***** Running Evaluation *****`, `phase=eval` on RESILIO_SOCKET) so --eval-timeout applies, or raise --stall-timeout".into(),
            StallKind::Phase(p) if p == BUSY => "it was found working without a word at its step limit and has worked the evaluation limit since: if that work needs longer, raise --eval-timeout ([stall] eval_timeout), or announce it".into(),
            StallKind::Phase(p) => match p.as_str() {
                "eval" | "evaluation" | "evaluate" | "validation" | "validate" | "val" => {
                    "if the evaluation needs longer, raise --eval-timeout ([stall] eval_timeout)".into()
                }
                "checkpoint" | "save" | "checkpointing" | "saving" => {
                    "if the save needs longer, raise --checkpoint-timeout ([stall] checkpoint_timeout)".into()
                }
                other => format!("if phase '{other}' needs longer, raise its limit in [stall.phase_timeouts]"),
            },
            StallKind::Unknown(_) => String::new(),
        }
    }
}

/// A detected stall.
#[derive(Clone, Debug, PartialEq)]
pub struct Stall {
    /// Which limit was broken.
    pub kind: StallKind,
    /// The limit in force.
    pub timeout: Duration,
    /// When the clock for that limit started (launch, last step, phase start).
    pub since: Instant,
    /// The last step seen, if any.
    pub last_step: Option<u64>,
}

/// The stall detector's state. Feed it events; ask it for its deadline.
#[derive(Clone, Debug)]
pub struct StallPolicy {
    cfg: StallConfig,
    launched: Instant,
    phase: Phase,
    /// Start of the current wait: last progress, or phase start/end.
    anchor: Instant,
    last_step: Option<u64>,
    /// When the named step last advanced (the start of the next interval),
    /// and to which step.
    last_step_at: Option<Instant>,
    learnt_step: Option<u64>,
    /// True when the gap since `last_step_at` crossed a phase (not learnt).
    gap_crossed_phase: bool,
    intervals: VecDeque<f64>,
    longest: f64,
    steps_seen: u64,
    /// The adaptive timeout, recomputed when an interval is learnt.
    adaptive: Option<Duration>,
    /// Scratch space for the percentile (no allocation per step).
    scratch: Vec<f64>,
    /// The step a long phase was entered at, and the source that announced
    /// it: only a later step ends it (see [`StallPolicy::on_progress`]).
    phase_step: Option<u64>,
    phase_from: &'static str,
    /// No stall before this (a look at whether the rank is working, under
    /// way at the limit); any progress drops it.
    hold: Option<Instant>,
    /// Busy and silent since a step limit: that limit, and when the trainer
    /// is looked at again. Still working then, it goes on (its evaluation's
    /// limit counted from the first look); found idle or waiting on a
    /// peer, its stall goes ahead (a peer hung while it finished a save).
    busy_look: Option<(Duration, Instant)>,
}

impl StallPolicy {
    /// A new rank launched at `now`.
    pub fn new(cfg: StallConfig, now: Instant) -> Self {
        StallPolicy {
            cfg,
            launched: now,
            phase: Phase::Startup,
            anchor: now,
            last_step: None,
            last_step_at: None,
            learnt_step: None,
            gap_crossed_phase: false,
            intervals: VecDeque::new(),
            longest: 0.0,
            steps_seen: 0,
            adaptive: None,
            scratch: Vec::new(),
            phase_step: None,
            phase_from: "",
            hold: None,
            busy_look: None,
        }
    }

    /// The start of the current wait (last progress, phase start).
    pub fn anchor(&self) -> Instant {
        self.anchor
    }

    /// Declare no stall before `until`: the agent is looking at whether the
    /// rank is working (its CPU time over a moment). Progress drops it.
    pub fn hold_until(&mut self, until: Instant) {
        self.hold = Some(until);
    }

    /// The rank was found working at its step limit without a word (its
    /// CPU time moved, it waits on no peer): busy and silent, judged from
    /// now by the limit of an evaluation nobody announced, never killed as
    /// hung at the step limit. A later step ends it as it ends any long
    /// phase. Only from stepping: a rank already busy, in a long phase or
    /// starting is judged by that limit.
    pub fn on_busy(&mut self, now: Instant) -> bool {
        if !self.busy_lookable() {
            return false;
        }
        self.hold = None;
        if self.busy() {
            if self.busy_look.is_some() && now >= self.anchor + self.current_limit().0 {
                // The evaluation's limit itself: a stall.
                return false;
            }
            match self.busy_look {
                // Looked at again, still working: the next look a step
                // limit on; the evaluation's limit keeps its start.
                Some((every, _)) => self.busy_look = Some((every, now + every)),
                // Found working again, and nothing else to go by: a new window.
                None => self.anchor = self.anchor.max(now),
            }
            return true;
        }
        let every = match self.phase {
            Phase::Train => Some(self.step_limit().0),
            _ => None,
        };
        self.on_phase(now, BUSY, None, "output");
        self.busy_look = every.map(|e| (e, now + e));
        true
    }

    /// Busy and silent (found working at a limit, nothing announced).
    pub fn busy(&self) -> bool {
        matches!(&self.phase, Phase::Named(n, _) if n == BUSY)
    }

    /// When a busy trainer is looked at again, if it is.
    fn busy_look_at(&self) -> Option<Instant> {
        self.busy_look.filter(|_| self.busy()).map(|(_, at)| at)
    }

    /// Whether the trainer's work counts at this limit: stepping, or at the
    /// startup limit (working before its first step: compiling, or a
    /// trainer that prints no step at all), or at the end of a busy window
    /// of a trainer that has shown no progress at all (its CPU time is all
    /// there is to go by).
    pub fn busy_lookable(&self) -> bool {
        match &self.phase {
            Phase::Train | Phase::Startup => true,
            Phase::Named(n, _) => {
                n == BUSY && (self.steps_seen == 0 || self.busy_look_at().is_some())
            }
        }
    }

    /// The parameters in force.
    pub fn config(&self) -> &StallConfig {
        &self.cfg
    }

    /// The current phase.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The last (named) step seen.
    pub fn last_step(&self) -> Option<u64> {
        self.last_step
    }

    /// How many progress events have counted.
    pub fn steps_seen(&self) -> u64 {
        self.steps_seen
    }

    /// When the rank was launched.
    pub fn launched(&self) -> Instant {
        self.launched
    }

    /// Progress: some source's own counter advanced (see
    /// `progress::tracker`); `from` names the source (`output`, `socket`,
    /// `file`). `step` is the named step after it; `learn` says the named
    /// step advanced, so the time since the previous advance is a step
    /// interval (unless a phase or a suspension lay between).
    ///
    /// A long phase ends when the named step moves past the step it began
    /// at, as seen by the source that announced it, or by two steps as seen
    /// by another: sources race (the step line printed just before
    /// `phase=eval` is sent may be read after it), and an output line or a
    /// batch counter during a save is life, not the save's end.
    pub fn on_progress(
        &mut self,
        now: Instant,
        step: Option<u64>,
        learn: bool,
        from: &'static str,
    ) {
        self.on_progress_timed(now, step, learn, from, None)
    }

    /// [`Self::on_progress`], with the time a step took by the trainer's
    /// own account (tqdm's rate, Megatron's elapsed time per iteration). A
    /// sighting whose steps, by that account, took far less than the time
    /// since the last sighting came late: the bar was redrawn long after
    /// (tqdm's monitor thread redraws a bar 10-20 s after its last frame,
    /// also when the trainer hung right after). Its gap is no step time,
    /// and the clock restarts from when the steps were done, not from now.
    pub fn on_progress_timed(
        &mut self,
        now: Instant,
        step: Option<u64>,
        learn: bool,
        from: &'static str,
        step_time: Option<f64>,
    ) {
        self.steps_seen += 1;
        let steps = match (self.learnt_step, step) {
            (Some(a), Some(b)) if b > a => (b - a) as f64,
            _ => 1.0,
        };
        // Only between two sightings while stepping: a gap with a phase in
        // it is long for its own reasons.
        let stepping = self.phase == Phase::Train && !self.gap_crossed_phase;
        let done_at = match (self.last_step_at, step_time) {
            (Some(prev), Some(t)) if learn && stepping && t.is_finite() && t >= 0.0 => {
                let claimed = steps * t;
                let gap = now.saturating_duration_since(prev).as_secs_f64();
                (gap > LATE_FACTOR * claimed + LATE_SLACK_S)
                    .then(|| prev + Duration::from_secs_f64(claimed.min(gap)))
            }
            _ => None,
        };
        if done_at.is_some() {
            // Not learnt: the gap says nothing of the steps' time.
            self.gap_crossed_phase = true;
        }
        if step.is_some() {
            self.last_step = step;
        }
        self.hold = None;
        // The clock runs from when the steps were done; the next gap is
        // measured from this sighting.
        self.anchor = self.anchor.max(done_at.unwrap_or(now));
        if let Phase::Named(..) = self.phase {
            let margin = if from == self.phase_from { 1 } else { 2 };
            let past = learn
                && match (step, self.phase_step) {
                    (Some(s), Some(p)) => s >= p.saturating_add(margin),
                    _ => true,
                };
            if !past {
                return;
            }
            self.gap_crossed_phase = true;
        }
        if learn {
            if let Some(prev) = self.last_step_at {
                if !self.gap_crossed_phase {
                    // Time per step: a bar redrawn after 21 steps in 20 s
                    // says 0.95 s a step. The gap itself is kept apart (the
                    // longest one seen): steps seen only every so often
                    // (a log line every 50 steps) must not be stopped
                    // between two sightings.
                    let gap = now.saturating_duration_since(prev).as_secs_f64();
                    if self.intervals.len() == self.cfg.adaptive_window.max(1) {
                        self.intervals.pop_front();
                    }
                    self.intervals.push_back(gap / steps);
                    self.longest = self.longest.max(gap);
                    self.adaptive = self.compute_adaptive();
                }
            }
            self.last_step_at = Some(now);
            self.learnt_step = step;
            self.gap_crossed_phase = false;
        }
        self.phase = Phase::Train;
    }

    /// The job progressed (another rank's progress, heard from the
    /// coordinator) at `at`. A rank with no progress of its own is alive as
    /// long as the job is: its wait restarts, under the startup allowance.
    /// Once the rank has shown progress of its own, this changes nothing.
    pub fn on_peer_progress(&mut self, at: Instant) {
        if self.steps_seen == 0 && self.phase == Phase::Startup {
            self.anchor = self.anchor.max(at);
        }
    }

    /// The trainer announced a phase, at `step` when its message named one.
    /// Returns how the name is judged.
    pub fn on_phase(
        &mut self,
        now: Instant,
        name: &str,
        step: Option<u64>,
        from: &'static str,
    ) -> PhaseClass {
        let class = self.cfg.classify(name);
        let next = match &class {
            PhaseClass::Long(t) => Phase::Named(name.to_string(), *t),
            // Inside a step (or back to training): the step clock keeps
            // running from the last progress, a long phase ends.
            PhaseClass::Train | PhaseClass::InStep { .. } => match self.phase {
                Phase::Named(..) if self.steps_seen == 0 => Phase::Startup,
                Phase::Named(..) => Phase::Train,
                ref p => p.clone(),
            },
        };
        if let Phase::Named(..) = next {
            self.phase_step = step.max(self.last_step);
            self.phase_from = from;
        }
        if next != self.phase {
            if matches!(self.phase, Phase::Named(..)) || matches!(next, Phase::Named(..)) {
                // The wait restarts at the phase boundary, and the step gap
                // that contains a long phase says nothing about step time.
                self.anchor = self.anchor.max(now);
                self.gap_crossed_phase = true;
            }
            self.phase = next;
        }
        class
    }

    /// The process was stopped and resumed (SIGCONT): the time it spent
    /// stopped is nobody's stall, and the gap is not a step interval.
    pub fn on_resume(&mut self, now: Instant) {
        self.anchor = self.anchor.max(now);
        self.gap_crossed_phase = true;
    }

    /// The adaptive step timeout from what has been learnt so far, or `None`
    /// while there is no interval to learn from.
    pub fn adaptive_timeout(&self) -> Option<Duration> {
        self.adaptive
    }

    fn compute_adaptive(&mut self) -> Option<Duration> {
        if self.intervals.is_empty() {
            return None;
        }
        // The percentile by selection, not a sort: this runs on every step.
        self.scratch.clear();
        self.scratch.extend(self.intervals.iter().copied());
        let n = self.scratch.len();
        let rank = ((n as f64) * self.cfg.adaptive_percentile).ceil() as usize;
        let (_, pct, _) = self
            .scratch
            .select_nth_unstable_by(rank.clamp(1, n) - 1, |a, b| a.total_cmp(b));
        let pct = *pct;
        let secs = (self.cfg.adaptive_factor * pct)
            .max(2.0 * self.longest)
            .max(self.cfg.adaptive_floor.as_secs_f64());
        Some(Duration::from_secs_f64(secs.min(1e9)))
    }

    /// The step limit in force: fixed, adaptive, or (before an interval is
    /// learnt) the startup allowance.
    fn step_limit(&self) -> (Duration, StallKind) {
        match self.cfg.fixed_timeout {
            Some(t) => (t, StallKind::Step { adaptive: false }),
            // One step seen and no interval yet: the second step may still
            // carry warm-up (compilation, autotuning), so the startup
            // allowance applies until an interval is learnt.
            None => match self.adaptive_timeout() {
                Some(t) => (t, StallKind::Step { adaptive: true }),
                None => (self.cfg.startup_timeout, StallKind::Step { adaptive: true }),
            },
        }
    }

    /// The limit in force now and what breaking it would be called.
    pub fn current_limit(&self) -> (Duration, StallKind) {
        match &self.phase {
            Phase::Startup => (self.cfg.startup_timeout, StallKind::Startup),
            Phase::Named(name, t) => {
                // A long phase never shortens what a step may take (steps
                // logged 40 minutes apart outlast a 30-minute allowance).
                let step_limit = match self.cfg.fixed_timeout {
                    Some(f) => f,
                    None => self.adaptive.unwrap_or(Duration::ZERO),
                };
                ((*t).max(step_limit), StallKind::Phase(name.clone()))
            }
            Phase::Train => self.step_limit(),
        }
    }

    /// A lower bound of the step limit after any further progress: the fixed
    /// timeout, or the adaptive floor raised by twice the longest interval
    /// seen (which never decreases). A step at time `t` can only bring the
    /// deadline forward if `t + min_future_limit() < deadline()`; the agent
    /// uses this to be woken by such steps only.
    pub fn min_future_limit(&self) -> Duration {
        match self.cfg.fixed_timeout {
            Some(t) => t,
            None => self
                .cfg
                .adaptive_floor
                .max(Duration::from_secs_f64((2.0 * self.longest).min(1e9))),
        }
    }

    /// When a stall will be declared if nothing happens before.
    pub fn deadline(&self) -> Instant {
        let d = self.anchor + self.current_limit().0;
        let d = self.busy_look_at().map_or(d, |at| d.min(at));
        self.hold.map_or(d, |h| d.max(h))
    }

    /// `Some(stall)` once `now` has reached the deadline.
    pub fn check(&self, now: Instant) -> Option<Stall> {
        if now < self.deadline() {
            return None;
        }
        let (limit, kind) = self.current_limit();
        // A busy trainer looked at again and found neither working nor
        // anything else: the limit broken is the step limit it was busy since.
        let timeout = match self.busy_look {
            Some((every, at)) if self.busy() && now >= at && now < self.anchor + limit => every,
            _ => limit,
        };
        Some(Stall {
            kind,
            timeout,
            since: self.anchor,
            last_step: self.last_step,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_kind_is_written_and_read_as_its_journal_word() {
        for (kind, word) in [
            (StallKind::Startup, "startup"),
            (StallKind::Step { adaptive: true }, "step_adaptive"),
            (StallKind::Step { adaptive: false }, "step_fixed"),
            (StallKind::Phase("eval".into()), "phase_eval"),
            (StallKind::Unknown("later_word".into()), "later_word"),
        ] {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{word}\""));
            assert_eq!(serde_json::from_str::<StallKind>(&json).unwrap(), kind);
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn cfg() -> StallConfig {
        StallConfig {
            startup_timeout: secs(600.0),
            adaptive_floor: secs(5.0),
            checkpoint_timeout: secs(300.0),
            eval_timeout: secs(120.0),
            ..StallConfig::default()
        }
    }

    /// Drive `n` steps `dt` apart starting at `t`; return the time of the last.
    fn steps(p: &mut StallPolicy, t0: Instant, start: u64, n: u64, dt: f64) -> Instant {
        let mut t = t0;
        for i in 0..n {
            t = t0 + secs(dt * i as f64);
            assert!(p.check(t).is_none(), "false stall at step {}", start + i);
            p.on_progress(t, Some(start + i), true, "output");
        }
        t
    }

    #[test]
    fn every_stall_says_which_knob_would_have_avoided_it() {
        assert!(StallKind::Phase(BUSY.into())
            .avoid()
            .contains("--eval-timeout"));
        assert!(StallKind::Startup.avoid().contains("--startup-timeout"));
        let adaptive = StallKind::Step { adaptive: true }.avoid();
        assert!(adaptive.contains("--stall-floor") && adaptive.contains("Running Evaluation"));
        assert!(StallKind::Step { adaptive: false }
            .avoid()
            .contains("--stall-timeout"));
        assert!(StallKind::Phase("eval".into())
            .avoid()
            .contains("--eval-timeout"));
        assert!(StallKind::Phase("save".into())
            .avoid()
            .contains("--checkpoint-timeout"));
        assert!(StallKind::Phase("warmup".into())
            .avoid()
            .contains("phase_timeouts"));
    }

    #[test]
    fn a_rank_found_working_at_its_limit_gets_an_evaluations_time() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let last = steps(&mut p, t0, 1, 20, 0.5);
        let limit = last + secs(5.0);
        assert_eq!(p.deadline(), limit);
        // The agent looks for a second: no stall meanwhile.
        p.hold_until(limit + secs(1.0));
        assert!(p.check(limit + secs(0.5)).is_none());
        // Working: an unannounced evaluation's limit from now, looked at
        // again every step limit (5 s here).
        assert!(p.on_busy(limit + secs(1.0)));
        assert_eq!(p.phase().name(), BUSY);
        assert!(p.check(limit + secs(5.9)).is_none());
        assert!(p.busy_lookable());
        let s = p.check(limit + secs(6.0)).expect("looked at again");
        assert_eq!(
            (s.kind, s.timeout),
            (StallKind::Phase(BUSY.into()), secs(5.0))
        );
        // Still working at every look: the evaluation's limit holds, from
        // the first.
        let mut t = 6.0;
        while t < 120.0 {
            p.hold_until(limit + secs(t + 0.5));
            assert!(p.check(limit + secs(t + 0.4)).is_none());
            assert!(p.on_busy(limit + secs(t + 0.5)), "{t}");
            t += 5.5;
        }
        let s = p
            .check(limit + secs(121.0))
            .expect("the evaluation's limit holds");
        assert_eq!(s.kind, StallKind::Phase(BUSY.into()));
        assert_eq!(s.timeout, secs(120.0));
        // Only from stepping: busy again at that limit is a stall.
        assert!(!p.on_busy(limit + secs(121.0)));
        // A later step ends it.
        p.on_progress(limit + secs(30.0), Some(21), true, "output");
        assert_eq!(p.phase(), &Phase::Train);
    }

    #[test]
    fn startup_timeout_applies_before_first_step() {
        let t0 = Instant::now();
        let p = StallPolicy::new(cfg(), t0);
        assert!(p.check(t0 + secs(599.9)).is_none());
        let s = p
            .check(t0 + secs(600.0))
            .expect("stall at the startup timeout");
        assert_eq!(s.kind, StallKind::Startup);
        assert_eq!(s.last_step, None);
        assert_eq!(p.deadline(), t0 + secs(600.0));
    }

    #[test]
    fn fast_steps_are_caught_within_the_floor() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let last = steps(&mut p, t0 + secs(30.0), 1, 100, 0.5);
        assert_eq!(
            p.adaptive_timeout(),
            Some(secs(5.0)),
            "10 x 0.5 s = 5 s = floor"
        );
        assert!(p.check(last + secs(4.9)).is_none());
        let s = p.check(last + secs(5.0)).expect("stall");
        assert_eq!(s.kind, StallKind::Step { adaptive: true });
        assert_eq!(s.last_step, Some(100));
        assert_eq!(s.since, last);
    }

    #[test]
    fn time_per_step_is_learnt_from_sightings_that_cover_several_steps() {
        // The HF Trainer's bar: a frame every 0.1 s for 21 steps, then the
        // bar redrawn 18.7 s later at step 25 (tqdm's monitor thread, the
        // rank after it hung). Learnt as 4.7 s a step, not 18.7 s.
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let mut t = t0;
        for step in (1..=21).step_by(2) {
            t += secs(0.12);
            p.on_progress(t, Some(step), true, "output");
        }
        p.on_progress(t + secs(18.7), Some(25), true, "output");
        let limit = p.adaptive_timeout().unwrap().as_secs_f64();
        assert!((limit - 46.75).abs() < 0.01, "{limit}");
        // Sightings 50 steps and 5 s apart (0.1 s a step): the limit stays
        // above the gap between two sightings.
        let mut p = StallPolicy::new(cfg(), t0);
        let mut t = t0;
        for i in 1..=20u64 {
            t += secs(5.0);
            assert!(p.check(t).is_none(), "false stall at sighting {i}");
            p.on_progress(t, Some(50 * i), true, "output");
        }
        assert_eq!(p.adaptive_timeout(), Some(secs(10.0)), "2 x the 5 s gap");
    }

    #[test]
    fn a_bar_redrawn_late_is_neither_a_step_interval_nor_a_fresh_start() {
        // HF's bar at 14 it/s (0.07 s a step) drawn every 0.14 s up to step
        // 24; rank 1 hangs after step 25 and tqdm's monitor thread redraws
        // the bar at 25 18.3 s later. By the bar's own rate step 25 was done
        // 0.07 s after step 24: the clock runs from then, the floor holds.
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let mut t = t0;
        for step in (2..=24).step_by(2) {
            t += secs(0.14);
            p.on_progress_timed(t, Some(step), true, "output", Some(0.07));
        }
        let before = p.adaptive_timeout();
        p.on_progress_timed(t + secs(18.3), Some(25), true, "output", Some(0.07));
        assert_eq!(p.adaptive_timeout(), before, "the late gap is not learnt");
        assert_eq!(p.last_step(), Some(25));
        assert_eq!(
            p.deadline(),
            t + secs(0.07) + secs(5.0),
            "from when 25 was done"
        );
        // The trainer goes on: the next sighting is measured from the late
        // one, not from when its steps were done (no cascade of lateness).
        p.on_progress_timed(t + secs(18.4), Some(26), true, "output", Some(0.07));
        assert_eq!(p.deadline(), t + secs(18.4) + secs(5.0));
        // After a phase the gap is long for its own reasons: not late.
        p.on_phase(t + secs(19.0), "checkpoint", None, "socket");
        p.on_progress_timed(t + secs(25.0), Some(28), true, "output", Some(0.07));
        p.on_progress_timed(t + secs(25.1), Some(29), true, "output", Some(0.07));
        assert_eq!(p.deadline(), t + secs(25.1) + secs(5.0));
        // A slow step the bar's rate owns up to is learnt as usual.
        let mut p = StallPolicy::new(cfg(), t0);
        p.on_progress_timed(t0 + secs(1.0), Some(1), true, "output", Some(0.07));
        p.on_progress_timed(t0 + secs(4.0), Some(2), true, "output", Some(1.9));
        assert_eq!(p.adaptive_timeout(), Some(secs(30.0)), "10 x 3 s");
    }

    #[test]
    fn slow_steps_are_not_killed_falsely() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        // 5-minute steps with +-20% jitter never trip the detector.
        let mut t = t0 + secs(100.0);
        for i in 0..20u64 {
            let jitter = if i % 2 == 0 { 240.0 } else { 360.0 };
            t += secs(jitter);
            assert!(p.check(t).is_none(), "false stall at step {i}");
            p.on_progress(t, Some(i), true, "output");
        }
        assert!(p.adaptive_timeout().unwrap() >= secs(3600.0));
    }

    #[test]
    fn a_pause_seen_once_is_tolerated_again() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let t = steps(&mut p, t0, 0, 50, 0.2);
        // An unannounced 4 s pause (an epoch boundary) stays under the 5 s
        // floor; once survived...
        let t = t + secs(4.0);
        p.on_progress(t, Some(50), true, "output");
        let t = steps(&mut p, t + secs(0.2), 51, 300, 0.2);
        // ...the next one of that length is allowed (2 x longest seen).
        assert!(p.check(t + secs(7.9)).is_none());
        assert!(p.check(t + secs(8.0)).is_some());
    }

    #[test]
    fn fixed_timeout_overrides_adaptive() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(
            StallConfig {
                fixed_timeout: Some(secs(42.0)),
                ..cfg()
            },
            t0,
        );
        let last = steps(&mut p, t0, 0, 10, 0.1);
        assert!(p.check(last + secs(41.9)).is_none());
        let s = p.check(last + secs(42.0)).unwrap();
        assert_eq!(s.kind, StallKind::Step { adaptive: false });
        assert_eq!(s.timeout, secs(42.0));
    }

    #[test]
    fn one_step_then_silence_uses_the_startup_allowance() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        p.on_progress(t0 + secs(10.0), Some(1), true, "output");
        assert!(p.check(t0 + secs(609.0)).is_none());
        assert!(p.check(t0 + secs(610.0)).is_some());
    }

    #[test]
    fn checkpoint_phase_has_its_own_timeout_and_is_not_learnt() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let t = steps(&mut p, t0, 0, 50, 0.5);
        p.on_phase(t + secs(0.1), "checkpoint", None, "output");
        // A 200 s save is far beyond the 5 s step timeout but within 300 s.
        assert!(p.check(t + secs(200.0)).is_none());
        assert_eq!(p.phase(), &Phase::Named("checkpoint".into(), secs(300.0)));
        p.on_progress(t + secs(200.0), Some(50), true, "output");
        assert_eq!(p.phase(), &Phase::Train);
        // The 200 s gap was not learnt: the step timeout is still the floor.
        assert_eq!(p.adaptive_timeout(), Some(secs(5.0)));
        // And a save that never ends is a stall of the checkpoint phase.
        p.on_phase(t + secs(201.0), "checkpoint", None, "output");
        let s = p.check(t + secs(501.0)).unwrap();
        assert_eq!(s.kind, StallKind::Phase("checkpoint".into()));
        assert_eq!(s.timeout, secs(300.0));
    }

    #[test]
    fn eval_phase_then_train_restarts_the_step_clock() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let t = steps(&mut p, t0, 0, 20, 0.5);
        p.on_phase(t, "eval", None, "output");
        assert!(p.check(t + secs(119.0)).is_none());
        p.on_phase(t + secs(100.0), "train", None, "output");
        assert_eq!(p.phase(), &Phase::Train);
        // The step clock starts at the end of the phase.
        assert!(p.check(t + secs(104.9)).is_none());
        assert!(p.check(t + secs(105.0)).is_some());
        // An eval that never ends trips the eval timeout.
        let mut q = StallPolicy::new(cfg(), t0);
        q.on_phase(t0 + secs(1.0), "eval", None, "output");
        assert_eq!(
            q.check(t0 + secs(121.0)).unwrap().kind,
            StallKind::Phase("eval".into())
        );
    }

    #[test]
    fn a_resume_restarts_the_clock_and_phases_never_shorten_the_step_limit() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let t = steps(&mut p, t0, 0, 20, 0.5);
        // Suspended for an hour, resumed: no stall at once.
        let back = t + secs(3600.0);
        p.on_resume(back);
        assert!(p.check(back + secs(1.0)).is_none());
        assert!(p.check(back + secs(5.0)).is_some());
        // Steps 40 minutes apart: an eval phase gets at least the step limit.
        let mut q = StallPolicy::new(
            StallConfig {
                startup_timeout: secs(3.0 * 3600.0),
                ..cfg()
            },
            t0,
        );
        let t = steps(&mut q, t0, 0, 4, 2400.0);
        q.on_phase(t, "eval", None, "output");
        assert!(
            q.check(t + secs(121.0)).is_none(),
            "eval timeout is 120 s, the step limit is longer"
        );
    }

    #[test]
    fn a_step_can_bring_the_deadline_forward_only_below_the_bound() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        // Startup: a first step may shorten the deadline a lot.
        assert!(t0 + secs(1.0) + p.min_future_limit() < p.deadline());
        let t = steps(&mut p, t0, 0, 100, 0.5);
        let before = p.deadline();
        let bound = p.min_future_limit();
        // At the floor, no later step can bring the deadline forward.
        for dt in [0.1, 0.5, 2.0] {
            let mut q = p.clone();
            q.on_progress(t + secs(dt), Some(1000), true, "output");
            assert!(q.deadline() >= before.min(t + secs(dt) + bound));
            assert!(q.deadline() >= t + secs(dt) + bound);
        }
    }

    #[test]
    fn percentile_ignores_rare_outliers_but_longest_still_counts() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(
            StallConfig {
                adaptive_floor: secs(0.0),
                ..cfg()
            },
            t0,
        );
        let t = steps(&mut p, t0, 0, 200, 1.0);
        assert_eq!(p.adaptive_timeout(), Some(secs(10.0)));
        p.on_progress(t + secs(7.0), Some(1000), true, "output");
        assert_eq!(p.adaptive_timeout(), Some(secs(14.0)));
    }

    #[test]
    fn a_hang_inside_a_step_phase_is_caught_at_the_step_limit() {
        // phase=compute step=N, phase=comm step=N, ... then a hang in comm.
        let t0 = Instant::now();
        let mut p = StallPolicy::new(
            StallConfig {
                fixed_timeout: Some(secs(1.5)),
                ..cfg()
            },
            t0,
        );
        let mut t = t0;
        for n in 0..10u64 {
            t = t0 + secs(0.2 * n as f64);
            p.on_progress(t, Some(n), true, "output");
            assert_eq!(
                p.on_phase(t, "compute", None, "output"),
                PhaseClass::InStep { known: true }
            );
            assert_eq!(
                p.on_phase(t + secs(0.1), "comm", None, "output"),
                PhaseClass::InStep { known: true }
            );
        }
        assert_eq!(
            p.phase(),
            &Phase::Train,
            "in-step phases keep the step clock"
        );
        assert!(p.check(t + secs(1.4)).is_none());
        let s = p.check(t + secs(1.5)).expect("a hang in comm is a stall");
        assert_eq!(s.kind, StallKind::Step { adaptive: false });
        assert_eq!(s.since, t, "measured from the last progress, not the phase");
    }

    #[test]
    fn unknown_phases_get_the_step_limit_and_configured_ones_their_own() {
        let mut c = cfg();
        c.phase_timeouts
            .insert("warmup_compile".into(), secs(900.0));
        c.in_step_phases.push("pipeline_bubble".into());
        assert_eq!(
            c.classify("frobnicate"),
            PhaseClass::InStep { known: false }
        );
        assert_eq!(
            c.classify("pipeline_bubble"),
            PhaseClass::InStep { known: true }
        );
        assert_eq!(c.classify("warmup_compile"), PhaseClass::Long(secs(900.0)));
        assert_eq!(c.classify("save"), PhaseClass::Long(secs(300.0)));
        assert_eq!(c.classify("validation"), PhaseClass::Long(secs(120.0)));
        assert_eq!(c.classify("train"), PhaseClass::Train);
        let t0 = Instant::now();
        let mut p = StallPolicy::new(c, t0);
        let t = steps(&mut p, t0, 0, 20, 0.5);
        p.on_phase(t, "frobnicate", None, "output");
        assert!(
            p.check(t + secs(5.0)).is_some(),
            "unknown: the 5 s step floor"
        );
        p.on_phase(t, "warmup_compile", None, "output");
        assert!(p.check(t + secs(899.0)).is_none());
        assert_eq!(
            p.check(t + secs(900.0)).unwrap().kind,
            StallKind::Phase("warmup_compile".into())
        );
        // An in-step phase ends a long one: the step clock starts there.
        p.on_phase(t + secs(100.0), "compute", None, "output");
        assert_eq!(p.phase(), &Phase::Train);
        assert!(p.check(t + secs(104.9)).is_none());
        assert!(p.check(t + secs(105.0)).is_some());
    }

    #[test]
    fn a_silent_rank_lives_on_the_jobs_progress() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        // The job keeps stepping for an hour; this rank prints nothing.
        for m in 1..=60u64 {
            let at = t0 + secs(60.0 * m as f64);
            assert!(p.check(at).is_none(), "minute {m}");
            p.on_peer_progress(at);
        }
        assert_eq!(p.phase(), &Phase::Startup);
        // The job stops: the startup allowance runs from its last progress.
        let last = t0 + secs(3600.0);
        assert!(p.check(last + secs(599.0)).is_none());
        assert_eq!(
            p.check(last + secs(600.0)).unwrap().kind,
            StallKind::Startup
        );
        // A rank with progress of its own is judged on it alone.
        let mut q = StallPolicy::new(cfg(), t0);
        let t = steps(&mut q, t0, 0, 20, 0.5);
        q.on_peer_progress(t + secs(4.0));
        assert!(q.check(t + secs(5.0)).is_some());
    }

    #[test]
    fn progress_that_names_no_step_restarts_the_clock_without_being_learnt() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let t = steps(&mut p, t0, 0, 50, 0.5);
        // Output lines keep coming (batches) between named steps 30 s apart.
        let mut at = t;
        for _ in 0..120 {
            at += secs(0.5);
            assert!(p.check(at).is_none());
            p.on_progress(at, Some(49), false, "output");
        }
        assert_eq!(p.adaptive_timeout(), Some(secs(5.0)), "nothing learnt");
        assert!(p.check(at + secs(5.0)).is_some());
    }
}
