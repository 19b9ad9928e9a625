//! The sampled progress log: which counted progress becomes a `progress`
//! record now, and which is held back until the next sample (or flushed
//! before a stall or the rank's end).

use crate::event as ev;
use crate::journal::Writer;
use crate::progress::tracker::Tracker;
use chrono::{DateTime, Utc};
use std::time::{Duration, Instant};

/// Monotonic instants to wall time, from one pair read at the start.
pub(crate) struct Clock {
    pub t0: Instant,
    pub wall0: DateTime<Utc>,
}

impl Clock {
    pub fn wall(&self, at: Instant) -> DateTime<Utc> {
        let d = at.saturating_duration_since(self.t0);
        self.wall0 + chrono::Duration::from_std(d).unwrap_or_default()
    }
}

/// One counted progress observation, for the journal's sampled records.
pub(crate) struct ProgressSample {
    /// When resilio saw it.
    pub at: Instant,
    /// The step's number after it (from the source that names the step).
    pub step: Option<u64>,
    /// The source that showed the progress.
    pub source: crate::progress::Source,
    /// Metrics sent with it (the socket's), or figures read from output.
    pub metrics: Vec<(String, f64)>,
}

/// Progress bookkeeping for the journal (sampled records).
pub(crate) struct ProgressLog {
    pub interval: Duration,
    pub last_written: Option<Instant>,
    /// Latest counted progress not yet written: (at, step, source, metrics).
    pub pending: Option<ProgressSample>,
    pub first_at: Option<Instant>,
    /// A step's number has been written: the first one always is, whatever
    /// the sampling (which checkpoint an attempt restored is read from it;
    /// trial 18: the first record named none, the first sampled step was
    /// 21 after a restore of 15, and 20 was taken for the restored one).
    pub step_written: bool,
    /// The trainer's first output was journaled (`first_output`).
    pub output_seen: bool,
    /// `checkpoint_loaded` records written (at most [`LOADS_WRITTEN`]).
    pub loads_written: u32,
    pub last_at: Option<Instant>,
    /// When the named step last advanced (step intervals for the coordinator).
    pub last_named_at: Option<Instant>,
    /// A checkpoint phase in progress: when it began, steps seen then.
    /// When it began, and the step it is about: training went on meanwhile
    /// (an asynchronous save) only if the step's number moved past it.
    pub checkpoint_began: Option<(Instant, Option<u64>)>,
    /// A synchronous save of this step began ([`Kind::SyncSave`]): a later
    /// step completes it.
    ///
    /// [`Kind::SyncSave`]: crate::progress::Kind::SyncSave
    pub sync_save: Option<u64>,
    /// Liveness and the step's name (`progress::tracker`).
    pub tracker: Tracker,
    /// Phase names not declared anywhere, each warned about once, up to
    /// [`UNKNOWN_PHASES_LISTED`] of them (a trainer that puts a counter in
    /// its phase names must not flood stderr and the journal).
    pub unknown_phases: std::collections::HashSet<String>,
    /// Unknown phase names beyond those listed.
    pub unknown_phases_unlisted: u64,
    /// Figures printed since the last step, for its record.
    pub figures: Vec<(String, f64)>,
    /// The files of the checkpoint whose `CheckpointDone` comes next.
    pub checkpoint_files: Option<crate::progress::checkpoint_dir::Files>,
    /// Metrics seen since the last record: name, sum, count (of a rate,
    /// [`RATES`], the sum of its reciprocals).
    sums: Vec<(String, f64, u32)>,
    /// The loss as printed since the last record: the first finite value,
    /// the last finite one, the lowest (the record's `loss` is their mean).
    loss_printed: Option<(f64, f64, f64)>,
}

/// Figures that are rates of work per second, each step the same work
/// (tokens or samples a step, its FLOPs): their mean over a record's steps
/// is harmonic, the rate of the steps' whole time. An arithmetic mean of
/// per-step rates is above it when step times vary (by about the square of
/// their relative spread), and the goodput made from it with it.
const RATES: &[&str] = &["tokens_per_s_device", "samples_per_s", "tflops", "mfu"];

/// How many lines saying a checkpoint was loaded are journaled, before
/// the first progress (a trainer loading shard by shard says it often).
pub const LOADS_WRITTEN: u32 = 8;

/// How many distinct unknown phase names are warned about and journaled;
/// the rest are only counted (said once when the first is not listed).
pub const UNKNOWN_PHASES_LISTED: usize = 32;

impl ProgressLog {
    /// Write `p` as a `progress` record, its metrics the mean of every value
    /// seen since the previous record (a NaN among them makes it NaN,
    /// written `null`): a record every 10 s stands for all the steps in
    /// between, not only the last.
    fn write(&mut self, journal: &mut Writer, clock: &Clock, p: &ProgressSample, first: bool) {
        let sums = std::mem::take(&mut self.sums);
        let printed = self.loss_printed.take();
        let metrics = (!sums.is_empty()).then(|| {
            let mut m: std::collections::BTreeMap<String, serde_json::Value> = sums
                .into_iter()
                .map(|(k, sum, n)| {
                    let mean = if RATES.contains(&k.as_str()) {
                        // (Only rates of 0 seen: 0.)
                        if n == 0 {
                            0.0
                        } else {
                            f64::from(n) / sum
                        }
                    } else {
                        sum / f64::from(n.max(1))
                    };
                    (k, serde_json::json!(mean))
                })
                .collect();
            // The loss as printed, besides the mean: what the report shows.
            if let Some((first, last, min)) = printed {
                m.insert("loss_first".into(), serde_json::json!(first));
                m.insert("loss_last".into(), serde_json::json!(last));
                m.insert("loss_min".into(), serde_json::json!(min));
            }
            m
        });
        let event = ev::Progress {
            step: p.step,
            source: p.source.into(),
            metrics,
            first: first.then_some(true),
        };
        journal.write_at(clock.wall(p.at), event, false);
    }

    /// A NaN or Inf loss (or grad norm) printed without a new step (the
    /// same step's bar redrawn, a line of figures alone): the next record's
    /// mean is not finite either, as if it had come with a step.
    pub fn note_nonfinite(&mut self, metrics: &[(String, f64)]) {
        let bad: Vec<(String, f64)> = metrics
            .iter()
            .filter(|(k, v)| (k == "loss" || k == "grad_norm") && !v.is_finite())
            .cloned()
            .collect();
        if !bad.is_empty() {
            self.accumulate(&bad);
        }
    }

    /// Add one observation's metrics to the sums of the next record.
    fn accumulate(&mut self, metrics: &[(String, f64)]) {
        for (k, v) in metrics {
            if k == "loss" && v.is_finite() {
                let p = self.loss_printed.get_or_insert((*v, *v, *v));
                p.1 = *v;
                p.2 = p.2.min(*v);
            }
            // A rate's reciprocal (a NaN stays NaN; a rate of 0 or less
            // says nothing of the time its step took: left out).
            let (v, counted) = if RATES.contains(&k.as_str()) {
                if *v > 0.0 || v.is_nan() {
                    (1.0 / v, 1)
                } else {
                    (0.0, 0)
                }
            } else {
                (*v, 1)
            };
            match self.sums.iter_mut().find(|(n, _, _)| n == k) {
                Some((_, sum, n)) => {
                    *sum += v;
                    *n += counted;
                }
                None => self.sums.push((k.clone(), v, counted)),
            }
        }
    }

    pub fn observe(&mut self, journal: &mut Writer, clock: &Clock, p: ProgressSample) {
        let at = p.at;
        self.last_at = Some(at);
        self.accumulate(&p.metrics);
        let first_step = p.step.is_some() && !self.step_written;
        self.step_written |= p.step.is_some();
        if self.first_at.is_none() {
            self.first_at = Some(at);
            self.write(journal, clock, &p, true);
            self.last_written = Some(at);
            self.pending = None;
        } else if first_step
            || self
                .last_written
                .is_none_or(|w| at.duration_since(w) >= self.interval)
        {
            self.write(journal, clock, &p, false);
            self.last_written = Some(at);
            self.pending = None;
        } else {
            self.pending = Some(p);
        }
    }

    /// Write the last progress if it was held back by sampling.
    pub fn flush(&mut self, journal: &mut Writer, clock: &Clock) {
        if let Some(p) = self.pending.take() {
            self.write(journal, clock, &p, false);
            self.last_written = Some(p.at);
        }
    }
}

impl ProgressLog {
    /// Nothing seen yet; a record at most every `interval` (the first always).
    pub fn new(interval: Duration) -> Self {
        ProgressLog {
            interval,
            last_written: None,
            pending: None,
            first_at: None,
            step_written: false,
            output_seen: false,
            loads_written: 0,
            last_at: None,
            last_named_at: None,
            checkpoint_began: None,
            sync_save: None,
            figures: Vec::new(),
            checkpoint_files: None,
            sums: Vec::new(),
            loss_printed: None,
            tracker: Tracker::new(),
            unknown_phases: Default::default(),
            unknown_phases_unlisted: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One observation: ms after the start, step, metrics.
    type Observed = (u64, Option<u64>, Vec<(String, f64)>);

    /// The `progress` records written for `samples`; with `flush`, the one
    /// held back by the sampling too.
    fn written(samples: Vec<Observed>, flush: bool) -> Vec<serde_json::Value> {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = Writer::open(tmp.path(), "rank-0.jsonl", 1, Some(0), None);
        let t0 = Instant::now();
        let clock = Clock {
            t0,
            wall0: Utc::now(),
        };
        let mut log = ProgressLog::new(Duration::from_secs(3600));
        for (ms, step, metrics) in samples {
            let sample = ProgressSample {
                at: t0 + Duration::from_millis(ms),
                step,
                source: crate::progress::Source::Stdout,
                metrics,
            };
            log.observe(&mut w, &clock, sample);
        }
        if flush {
            log.flush(&mut w, &clock);
        }
        drop(w);
        std::fs::read_to_string(tmp.path().join("rank-0.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["kind"] == "progress")
            .collect()
    }

    /// The first step named is written whatever the sampling, even when
    /// the first progress named none (HF's figures before its first step):
    /// which checkpoint an attempt restored is read from it.
    #[test]
    fn the_first_step_named_is_always_written() {
        let samples = [(0, None), (10, Some(16)), (20, Some(17)), (30, Some(18))];
        let steps: Vec<Option<u64>> = written(
            samples
                .into_iter()
                .map(|(ms, step)| (ms, step, Vec::new()))
                .collect(),
            false,
        )
        .iter()
        .map(|v| v["step"].as_u64())
        .collect();
        assert_eq!(steps, [None, Some(16)]);
    }

    #[test]
    fn a_records_rates_are_the_rate_of_its_steps_whole_time() {
        // The same tokens a step at 100 tokens/s, then 50, then a bad 0:
        // 2 steps' tokens in 3 of the first one's time, 66.7 tokens/s.
        let samples = [
            (0, 1, 100.0, 4.0),
            (10, 2, 100.0, 3.0),
            (20, 3, 50.0, 2.0),
            (30, 4, 0.0, 1.0),
        ];
        let records = written(
            samples
                .into_iter()
                .map(|(ms, step, tps, loss)| {
                    let m = vec![("tokens_per_s_device".into(), tps), ("loss".into(), loss)];
                    (ms, Some(step), m)
                })
                .collect(),
            true,
        );
        let last = records.last().unwrap();
        let m = &last["metrics"];
        assert!(
            (m["tokens_per_s_device"].as_f64().unwrap() - 200.0 / 3.0).abs() < 1e-9,
            "{last}"
        );
        // Not a rate: the plain mean.
        assert_eq!(m["loss"].as_f64(), Some(2.0), "{last}");
    }
}
