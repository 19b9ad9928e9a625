//! Silent numerical failures: a loss (or grad norm) gone to NaN or Inf, and
//! loss spikes, from the figures the trainer prints or sends.
//!
//! A pure policy over the values as they come, one observation per step (a
//! figure seen twice for the same step counts once, and a figure printed
//! without a step belongs to the last step printed). A progress bar's
//! postfix (`loss=nan` after tqdm's `150/300 [...]`) is often set every few
//! steps and redrawn unchanged in between: where the trainer's values were
//! seen to repeat so (the median run of identical consecutive values, at
//! most [`MAX_REPEAT`]), a value repeated unchanged counts once per such run,
//! so that one NaN left on the bar by a skipped step is one observation,
//! while a loss that stays NaN through several refreshes is not missed.
//! fp16 training skips a
//! step now and then on an overflow (`grad norm: nan`, DeepSpeed's
//! `OVERFLOW! Skipping step`), so a non-finite value must persist for
//! `nan_steps` observations in a row; a spike is the loss above
//! `spike_factor` × the median of the last `spike_window` values for
//! `spike_steps` observations in a row. Each finding is said once per
//! attempt.

use std::collections::VecDeque;

names! {
    /// What to do about a finding (`[numerical] nan_action`, `spike_action`;
    /// `numerical.action`).
    Act {
        /// Journal it; the run goes on.
        Record = "record",
        /// Stop the rank; the job is not restarted (class `numerical`).
        Stop = "stop",
        /// Stop the rank; the job restarts (within its budget) from the last
        /// checkpoint taken before the bad values began, told which steps'
        /// data to skip (`RESILIO_ROLLBACK_STEP`, `RESILIO_SKIP_STEPS`).
        Rollback = "rollback",
    }

    /// What was found (`numerical.finding`).
    FindingKind {
        /// NaN or Inf for several reports in a row.
        Nan = "nan",
        /// The loss several times its running median for several reports.
        Spike = "spike",
    }

    /// The figure watched (`numerical.metric`).
    Metric {
        Loss = "loss",
        GradNorm = "grad_norm",
    }
}

/// How a rollback's evidence begins, for people (the `numerical` record's
/// `action` says it for the code).
pub const ROLLBACK: &str = "rollback: ";

/// `[numerical]`.
#[derive(Clone, Debug, PartialEq)]
pub struct NumericalConfig {
    /// Observations in a row with a non-finite loss or grad norm.
    pub nan_steps: u32,
    /// What a NaN/Inf does (default: stop, no retry).
    pub nan_action: Act,
    /// A spike is the loss above this many times the running median (0: off).
    pub spike_factor: f64,
    /// Observations in a row above it.
    pub spike_steps: u32,
    /// Values the running median is taken over.
    pub spike_window: usize,
    /// What a spike does (default: record).
    pub spike_action: Act,
}

impl Default for NumericalConfig {
    fn default() -> Self {
        NumericalConfig {
            nan_steps: 3,
            nan_action: Act::Stop,
            spike_factor: 3.0,
            spike_steps: 3,
            spike_window: 100,
            spike_action: Act::Record,
        }
    }
}

/// A finding, for the journal and the stop.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub kind: FindingKind,
    pub metric: Metric,
    /// The value that decided it (NaN, Inf, or the spiking loss).
    pub value: f64,
    /// The step it was seen at, when known.
    pub step: Option<u64>,
    /// Observations in a row.
    pub consecutive: u32,
    /// A spike's running median.
    pub baseline: Option<f64>,
    /// First step of the run of bad values.
    pub since_step: Option<u64>,
    pub act: Act,
}

impl Finding {
    /// One line for people: `loss nan since step 3030 (3 steps in a row)`.
    pub fn describe(&self) -> String {
        let since = self
            .since_step
            .map_or(String::new(), |s| format!(" since step {s}"));
        match self.kind {
            FindingKind::Spike => format!(
                "{} {:.4} is {:.1}x its running median {:.4}{since} ({} steps in a row)",
                self.metric,
                self.value,
                self.value / self.baseline.unwrap_or(f64::NAN),
                self.baseline.unwrap_or(f64::NAN),
                self.consecutive
            ),
            _ => format!(
                "{} {}{since} ({} steps in a row)",
                self.metric,
                if self.value.is_nan() {
                    "nan".into()
                } else {
                    self.value.to_string()
                },
                self.consecutive
            ),
        }
    }
}

/// The longest run of unchanged values taken for a bar's refresh interval.
pub const MAX_REPEAT: u32 = 20;

/// How many completed runs of unchanged values the refresh interval is
/// learnt from.
const RUNS_KEPT: usize = 15;

/// The watch over one rank's figures.
#[derive(Clone, Debug)]
pub struct NumericalWatch {
    cfg: NumericalConfig,
    /// The last step printed (with figures or without).
    seen_step: Option<u64>,
    /// The step of the last observation counted.
    last_step: Option<u64>,
    /// The last observation's values, bit for bit, and how many times in a
    /// row they came unchanged.
    last_bits: Option<(u64, u64)>,
    repeats: u32,
    /// Lengths of the last runs of unchanged finite values.
    runs: VecDeque<u32>,
    bad_run: u32,
    bad_since: Option<u64>,
    spike_run: u32,
    spike_since: Option<u64>,
    losses: VecDeque<f64>,
    said_nan: bool,
    said_spike: bool,
}

impl NumericalWatch {
    pub fn new(cfg: NumericalConfig) -> Self {
        NumericalWatch {
            cfg,
            seen_step: None,
            last_step: None,
            last_bits: None,
            repeats: 0,
            runs: VecDeque::new(),
            bad_run: 0,
            bad_since: None,
            spike_run: 0,
            spike_since: None,
            losses: VecDeque::new(),
            said_nan: false,
            said_spike: false,
        }
    }

    /// One report's figures at `step`; a finding the first time one holds.
    pub fn observe(&mut self, step: Option<u64>, metrics: &[(String, f64)]) -> Option<Finding> {
        let get = |name: &str| metrics.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        let (loss, grad) = (get("loss"), get("grad_norm"));
        self.seen_step = step.or(self.seen_step);
        if loss.is_none() && grad.is_none() {
            return None;
        }
        // Figures on their own belong to the last step printed.
        let step = step.or(self.seen_step);
        // The same step seen again (its line, then the bar, then the
        // socket): once.
        if step.is_some() && step == self.last_step {
            return None;
        }
        self.last_step = step.or(self.last_step);
        // Unchanged since the last observation (a bar's postfix redrawn):
        // a new observation only once per run the trainer's values showed.
        if !self.fresh(loss, grad) {
            return None;
        }
        let bad = [(Metric::Loss, loss), (Metric::GradNorm, grad)]
            .into_iter()
            .find_map(|(n, v)| v.filter(|v| !v.is_finite()).map(|v| (n, v)));
        match bad {
            Some((metric, value)) => {
                self.bad_run += 1;
                self.bad_since = self.bad_since.or(step);
                if self.bad_run >= self.cfg.nan_steps.max(1) && !self.said_nan {
                    self.said_nan = true;
                    return Some(Finding {
                        kind: FindingKind::Nan,
                        metric,
                        value,
                        step,
                        consecutive: self.bad_run,
                        baseline: None,
                        since_step: self.bad_since,
                        act: self.cfg.nan_action,
                    });
                }
                return None;
            }
            None => {
                self.bad_run = 0;
                self.bad_since = None;
            }
        }
        let loss = loss.filter(|l| l.is_finite())?;
        let found = self.spike(loss, step);
        self.losses.push_back(loss);
        while self.losses.len() > self.cfg.spike_window.max(1) {
            self.losses.pop_front();
        }
        found
    }

    /// Whether this observation's values count: changed since the last
    /// one, or unchanged for as many times as values usually stay so.
    fn fresh(&mut self, loss: Option<f64>, grad: Option<f64>) -> bool {
        let bits = (
            loss.map_or(u64::MAX, f64::to_bits),
            grad.map_or(u64::MAX, f64::to_bits),
        );
        if self.last_bits == Some(bits) {
            self.repeats += 1;
        } else {
            let finite = |b: u64| b == u64::MAX || f64::from_bits(b).is_finite();
            if let Some((l, g)) = self.last_bits {
                if finite(l) && finite(g) {
                    self.runs.push_back(self.repeats.min(MAX_REPEAT));
                    while self.runs.len() > RUNS_KEPT {
                        self.runs.pop_front();
                    }
                }
            }
            self.last_bits = Some(bits);
            self.repeats = 1;
        }
        let mut runs: Vec<u32> = self.runs.iter().copied().collect();
        runs.sort_unstable();
        let every = runs.get(runs.len() / 2).copied().unwrap_or(1).max(1);
        (self.repeats - 1).is_multiple_of(every)
    }

    fn spike(&mut self, loss: f64, step: Option<u64>) -> Option<Finding> {
        // A baseline needs some history: a quarter of the window, at least 8.
        let enough = (self.cfg.spike_window / 4).max(8);
        if self.cfg.spike_factor <= 0.0 || self.losses.len() < enough {
            return None;
        }
        let mut v: Vec<f64> = self.losses.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let median = v[v.len() / 2];
        if median > 0.0 && loss > self.cfg.spike_factor * median {
            self.spike_run += 1;
            self.spike_since = self.spike_since.or(step);
            if self.spike_run >= self.cfg.spike_steps.max(1) && !self.said_spike {
                self.said_spike = true;
                return Some(Finding {
                    kind: FindingKind::Spike,
                    metric: Metric::Loss,
                    value: loss,
                    step,
                    consecutive: self.spike_run,
                    baseline: Some(median),
                    since_step: self.spike_since,
                    act: self.cfg.spike_action,
                });
            }
        } else {
            self.spike_run = 0;
            self.spike_since = None;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(loss: f64) -> Vec<(String, f64)> {
        vec![("loss".into(), loss)]
    }

    #[test]
    fn nan_must_persist_and_is_said_once() {
        let mut w = NumericalWatch::new(NumericalConfig::default());
        assert_eq!(w.observe(Some(1), &m(2.0)), None);
        // One fp16 overflow step: not yet.
        assert_eq!(w.observe(Some(2), &m(f64::NAN)), None);
        assert_eq!(w.observe(Some(3), &m(1.9)), None);
        assert_eq!(w.observe(Some(4), &m(f64::NAN)), None);
        assert_eq!(w.observe(Some(5), &m(f64::INFINITY)), None);
        // The same step again does not count twice.
        assert_eq!(w.observe(Some(5), &m(f64::NAN)), None);
        let f = w.observe(Some(6), &m(f64::NAN)).unwrap();
        assert_eq!(
            (f.kind, f.act, f.consecutive, f.since_step),
            (FindingKind::Nan, Act::Stop, 3, Some(4))
        );
        assert_eq!(f.describe(), "loss nan since step 4 (3 steps in a row)");
        assert_eq!(w.observe(Some(7), &m(f64::NAN)), None);
    }

    #[test]
    fn a_bar_redrawing_one_nan_is_one_observation() {
        // tqdm's postfix set every 10 steps, frames every 2: the values
        // repeat five times. The trainer skipped one NaN step (its log line
        // and the bar say nan), and the bar kept showing it.
        let mut w = NumericalWatch::new(NumericalConfig::default());
        let mut step = 0;
        for refresh in 0..6 {
            for _ in 0..5 {
                step += 2;
                assert_eq!(w.observe(Some(step), &m(2.0 - refresh as f64 * 0.1)), None);
            }
        }
        // The log line of step 62, its frame redrawn, then stale frames.
        assert_eq!(w.observe(Some(62), &m(f64::NAN)), None);
        assert_eq!(w.observe(None, &m(f64::NAN)), None);
        for s in [64, 66, 68, 70] {
            assert_eq!(w.observe(Some(s), &m(f64::NAN)), None, "step {s}");
        }
        // Refreshed: finite again.
        assert_eq!(w.observe(Some(72), &m(1.4)), None);
        // A loss that stays NaN through refreshes is found: the third run.
        let mut found = None;
        for s in (74..120).step_by(2) {
            if let Some(f) = w.observe(Some(s), &m(f64::NAN)) {
                found = Some((s, f));
                break;
            }
        }
        let (at, f) = found.expect("a NaN that persists");
        assert_eq!(
            (f.kind, f.consecutive, f.since_step),
            (FindingKind::Nan, 3, Some(74))
        );
        assert_eq!(at, 94, "once per run of five: 74, 84, 94");
    }

    #[test]
    fn figures_without_a_step_belong_to_the_last_step_printed() {
        let mut w = NumericalWatch::new(NumericalConfig::default());
        // A bar names the step, the loss comes in a line of its own.
        for s in 1..=2 {
            assert_eq!(w.observe(Some(s), &[]), None);
            assert_eq!(w.observe(None, &m(f64::NAN)), None, "step {s}");
            // Said again for the same step: not counted.
            assert_eq!(w.observe(None, &m(f64::NAN)), None);
        }
        assert_eq!(w.observe(Some(3), &[]), None);
        let f = w.observe(None, &m(f64::NAN)).unwrap();
        assert_eq!((f.consecutive, f.since_step, f.step), (3, Some(1), Some(3)));
    }

    #[test]
    fn grad_norm_nan_counts_too() {
        let mut w = NumericalWatch::new(NumericalConfig {
            nan_steps: 1,
            ..Default::default()
        });
        let f = w
            .observe(
                Some(9),
                &[("grad_norm".into(), f64::NAN), ("loss".into(), 2.0)],
            )
            .unwrap();
        assert_eq!(f.metric, Metric::GradNorm);
    }

    #[test]
    fn a_spike_is_above_k_times_the_running_median_for_several_steps() {
        let mut w = NumericalWatch::new(NumericalConfig::default());
        for s in 0..40 {
            assert_eq!(w.observe(Some(s), &m(2.0 - s as f64 * 0.01)), None);
        }
        // One high value: noise, not a spike.
        assert_eq!(w.observe(Some(40), &m(30.0)), None);
        assert_eq!(w.observe(Some(41), &m(1.6)), None);
        assert_eq!(w.observe(Some(42), &m(30.0)), None);
        assert_eq!(w.observe(Some(43), &m(31.0)), None);
        let f = w.observe(Some(44), &m(32.0)).unwrap();
        assert_eq!(
            (f.kind, f.act, f.since_step),
            (FindingKind::Spike, Act::Record, Some(42))
        );
        assert!(f.baseline.unwrap() < 2.0);
    }

    #[test]
    fn no_history_no_spike_and_factor_zero_is_off() {
        let mut w = NumericalWatch::new(NumericalConfig::default());
        for s in 0..5 {
            assert_eq!(w.observe(Some(s), &m(100.0 * (s + 1) as f64)), None);
        }
        let mut off = NumericalWatch::new(NumericalConfig {
            spike_factor: 0.0,
            ..Default::default()
        });
        for s in 0..50 {
            assert_eq!(
                off.observe(Some(s), &m(if s > 30 { 1e6 } else { 1.0 })),
                None
            );
        }
    }
}
