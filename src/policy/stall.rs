//! Stall (hang) detection for one rank.
//!
//! Before the first step the rank is judged against `startup_timeout`. After
//! it, against a fixed timeout when configured, otherwise an adaptive one:
//!
//! ```text
//! timeout = max(floor, factor × percentile(recent step intervals), 2 × longest interval seen)
//! ```
//!
//! so that 0.5 s steps are caught within the floor while 5-minute steps are
//! given most of an hour, and a pause that happened once and recovered (an
//! epoch boundary, an unannounced evaluation) is not taken for a hang later.
//! While the trainer is in a named phase (`checkpoint`, `eval`, or any other
//! it announces) that phase's own timeout applies, measured from the phase's
//! start; intervals that span a phase are not learnt as step intervals.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

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
    /// Allowed duration of an `eval` phase (and any other named phase).
    pub eval_timeout: Duration,
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
    /// A named phase announced by the trainer (`checkpoint`, `eval`, ...).
    Named(String),
}

impl Phase {
    /// The phase's name as written in the journal.
    pub fn name(&self) -> &str {
        match self {
            Phase::Startup => "startup",
            Phase::Train => "train",
            Phase::Named(n) => n,
        }
    }
}

/// Which limit a stall broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StallKind {
    /// No first step within `startup_timeout`.
    Startup,
    /// No step within the (fixed or adaptive) step timeout.
    Step { adaptive: bool },
    /// A named phase lasted longer than its timeout.
    Phase(String),
}

impl StallKind {
    /// Short name for the journal.
    pub fn name(&self) -> String {
        match self {
            StallKind::Startup => "startup".into(),
            StallKind::Step { adaptive: true } => "step_adaptive".into(),
            StallKind::Step { adaptive: false } => "step_fixed".into(),
            StallKind::Phase(p) => format!("phase_{p}"),
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
    /// Start of the current wait: last step, or phase start/end.
    anchor: Instant,
    last_step: Option<u64>,
    last_step_at: Option<Instant>,
    /// True when the gap since `last_step_at` crossed a phase (not learnt).
    gap_crossed_phase: bool,
    intervals: VecDeque<f64>,
    longest: f64,
    steps_seen: u64,
    /// The adaptive timeout, recomputed when an interval is learnt.
    adaptive: Option<Duration>,
    /// Scratch space for the percentile (no allocation per step).
    scratch: Vec<f64>,
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
            gap_crossed_phase: false,
            intervals: VecDeque::new(),
            longest: 0.0,
            steps_seen: 0,
            adaptive: None,
            scratch: Vec::new(),
        }
    }

    /// The current phase.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The last step seen.
    pub fn last_step(&self) -> Option<u64> {
        self.last_step
    }

    /// How many distinct progress events have counted.
    pub fn steps_seen(&self) -> u64 {
        self.steps_seen
    }

    /// When the rank was launched.
    pub fn launched(&self) -> Instant {
        self.launched
    }

    /// Progress: a step number, or `None` for progress without a number
    /// (a progress file whose content changed). Returns whether it counted:
    /// a repeat of the last step number is not progress.
    pub fn on_progress(&mut self, now: Instant, step: Option<u64>) -> bool {
        if step.is_some() && step == self.last_step {
            return false;
        }
        if let Some(prev) = self.last_step_at {
            if !self.gap_crossed_phase && !matches!(self.phase, Phase::Named(_)) {
                let dt = now.saturating_duration_since(prev).as_secs_f64();
                if self.intervals.len() == self.cfg.adaptive_window.max(1) {
                    self.intervals.pop_front();
                }
                self.intervals.push_back(dt);
                self.longest = self.longest.max(dt);
                self.adaptive = self.compute_adaptive();
            }
        }
        if step.is_some() {
            self.last_step = step;
        }
        self.last_step_at = Some(now);
        self.gap_crossed_phase = false;
        self.anchor = now;
        self.phase = Phase::Train;
        self.steps_seen += 1;
        true
    }

    /// The trainer announced a phase (`train` ends any named phase).
    pub fn on_phase(&mut self, now: Instant, name: &str) {
        let next = match name {
            "train" | "" => {
                if self.steps_seen == 0 {
                    Phase::Startup
                } else {
                    Phase::Train
                }
            }
            other => Phase::Named(other.to_string()),
        };
        if next == self.phase {
            return;
        }
        if matches!(self.phase, Phase::Named(_)) || matches!(next, Phase::Named(_)) {
            // The wait restarts at the phase boundary, and the step gap that
            // contains a phase says nothing about step time.
            self.anchor = now;
            self.gap_crossed_phase = true;
        }
        self.phase = next;
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

    /// The limit in force now and what breaking it would be called.
    pub fn current_limit(&self) -> (Duration, StallKind) {
        match &self.phase {
            Phase::Startup => (self.cfg.startup_timeout, StallKind::Startup),
            Phase::Named(name) => {
                let t = if name == "checkpoint" {
                    self.cfg.checkpoint_timeout
                } else {
                    self.cfg.eval_timeout
                };
                // A phase never shortens what a step may take (steps logged
                // 40 minutes apart outlast a 30-minute phase allowance).
                let step_limit = match self.cfg.fixed_timeout {
                    Some(f) => f,
                    None => self.adaptive.unwrap_or(Duration::ZERO),
                };
                (t.max(step_limit), StallKind::Phase(name.clone()))
            }
            Phase::Train => match self.cfg.fixed_timeout {
                Some(t) => (t, StallKind::Step { adaptive: false }),
                // One step seen and no interval yet: the second step may
                // still carry warm-up (compilation, autotuning), so the
                // startup allowance applies until an interval is learnt.
                None => match self.adaptive_timeout() {
                    Some(t) => (t, StallKind::Step { adaptive: true }),
                    None => (self.cfg.startup_timeout, StallKind::Step { adaptive: true }),
                },
            },
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
        self.anchor + self.current_limit().0
    }

    /// `Some(stall)` once `now` has reached the deadline.
    pub fn check(&self, now: Instant) -> Option<Stall> {
        if now < self.deadline() {
            return None;
        }
        let (timeout, kind) = self.current_limit();
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
            p.on_progress(t, Some(start + i));
        }
        t
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
    fn slow_steps_are_not_killed_falsely() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        // 5-minute steps with +-20% jitter never trip the detector.
        let mut t = t0 + secs(100.0);
        for i in 0..20u64 {
            let jitter = if i % 2 == 0 { 240.0 } else { 360.0 };
            t += secs(jitter);
            assert!(p.check(t).is_none(), "false stall at step {i}");
            p.on_progress(t, Some(i));
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
        p.on_progress(t, Some(50));
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
        p.on_progress(t0 + secs(10.0), Some(1));
        assert!(p.check(t0 + secs(609.0)).is_none());
        assert!(p.check(t0 + secs(610.0)).is_some());
    }

    #[test]
    fn checkpoint_phase_has_its_own_timeout_and_is_not_learnt() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let t = steps(&mut p, t0, 0, 50, 0.5);
        p.on_phase(t + secs(0.1), "checkpoint");
        // A 200 s save is far beyond the 5 s step timeout but within 300 s.
        assert!(p.check(t + secs(200.0)).is_none());
        assert_eq!(p.phase(), &Phase::Named("checkpoint".into()));
        p.on_progress(t + secs(200.0), Some(50));
        assert_eq!(p.phase(), &Phase::Train);
        // The 200 s gap was not learnt: the step timeout is still the floor.
        assert_eq!(p.adaptive_timeout(), Some(secs(5.0)));
        // And a save that never ends is a stall of the checkpoint phase.
        p.on_phase(t + secs(201.0), "checkpoint");
        let s = p.check(t + secs(501.0)).unwrap();
        assert_eq!(s.kind, StallKind::Phase("checkpoint".into()));
        assert_eq!(s.timeout, secs(300.0));
    }

    #[test]
    fn eval_phase_then_train_restarts_the_step_clock() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let t = steps(&mut p, t0, 0, 20, 0.5);
        p.on_phase(t, "eval");
        assert!(p.check(t + secs(119.0)).is_none());
        p.on_phase(t + secs(100.0), "train");
        assert_eq!(p.phase(), &Phase::Train);
        // The step clock starts at the end of the phase.
        assert!(p.check(t + secs(104.9)).is_none());
        assert!(p.check(t + secs(105.0)).is_some());
        // An eval that never ends trips the eval timeout.
        let mut q = StallPolicy::new(cfg(), t0);
        q.on_phase(t0 + secs(1.0), "eval");
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
        q.on_phase(t, "eval");
        assert!(
            q.check(t + secs(121.0)).is_none(),
            "eval timeout is 120 s, the step limit is longer"
        );
    }

    #[test]
    fn repeated_step_numbers_are_not_progress() {
        let t0 = Instant::now();
        let mut p = StallPolicy::new(cfg(), t0);
        let t = steps(&mut p, t0, 0, 20, 0.5);
        assert!(!p.on_progress(t + secs(3.0), Some(19)));
        assert!(
            p.check(t + secs(5.0)).is_some(),
            "a repeated step does not reset the clock"
        );
        // Progress without a number always counts.
        assert!(p.on_progress(t + secs(4.0), None));
        assert_eq!(p.last_step(), Some(19));
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
            q.on_progress(t + secs(dt), Some(1000));
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
        p.on_progress(t + secs(7.0), Some(1000));
        assert_eq!(p.adaptive_timeout(), Some(secs(14.0)));
    }
}
