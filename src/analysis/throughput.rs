//! Useful work: throughput and MFU per attempt, and the job's goodput,
//! from the sampled `progress` records (their step numbers and the figures
//! the trainer printed or sent, `progress::figures`) and the run's
//! `[throughput]` settings written in `rank_start`.
//!
//! Pure functions over records; the report prints what they return.

use crate::event::Event;
use crate::journal::Record;
use serde::Serialize;
use std::collections::BTreeMap;

/// The run's own numbers for what the trainer does not print
/// (`[throughput]`, written in rank 0's `rank_start`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThroughputSettings {
    /// Tokens in one global step (global batch × sequence length).
    pub tokens_per_step: Option<f64>,
    /// Model FLOPs per token of training (about 6 × parameters for a dense transformer).
    pub flops_per_token: Option<f64>,
    /// Peak TFLOP/s of one device.
    pub peak_tflops: Option<f64>,
    /// Devices each rank drives.
    pub devices_per_rank: Option<u32>,
    /// The sequence length (tokens per sample).
    pub seq_len: Option<u64>,
}

/// One attempt's throughput, from its progress records.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Throughput {
    /// Steps per second, from the step numbers and times of the records.
    pub steps_per_s: Option<f64>,
    /// Seconds per step: as printed (median), else from the step rate.
    pub step_time_s: Option<f64>,
    /// Tokens per second of the whole job.
    pub tokens_per_s: Option<f64>,
    /// Samples per second of the whole job.
    pub samples_per_s: Option<f64>,
    /// Achieved TFLOP/s of one device.
    pub tflops_per_device: Option<f64>,
    /// Model FLOPs utilisation, a fraction of the device's peak.
    pub mfu: Option<f64>,
    /// Devices of the attempt (ranks × devices per rank).
    pub devices: u32,
    /// Where the figures came from: `printed`, `socket`, `settings`.
    pub from: Vec<String>,
    /// Steps per second between successive records, oldest first (the
    /// sparkline of `report`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rates: Vec<f64>,
}

/// The job's useful work.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Goodput {
    /// Tokens trained in productive time (time lost to failures, restarts
    /// and redone steps holds none).
    pub tokens_kept: f64,
    /// The allocation: wall time × devices, in hours.
    pub device_hours: f64,
    /// `tokens_kept / device_hours`.
    pub tokens_per_device_hour: f64,
    /// ETTR × MFU: the share of the allocation's peak FLOPs spent on
    /// kept training, when MFU is known.
    pub effective_mfu: Option<f64>,
}

/// One progress record of a rank: seconds since the epoch, step, metrics
/// (the record's own, borrowed: a million progress records are not copied).
type Sample<'a> = (f64, u64, Option<&'a BTreeMap<String, serde_json::Value>>);

/// A numeric metric of a sample.
fn metric(m: Option<&BTreeMap<String, serde_json::Value>>, name: &str) -> Option<f64> {
    m?.get(name)?.as_f64()
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The settings of an attempt: the first `rank_start` that has them.
pub fn settings_of(records: &[&Record]) -> ThroughputSettings {
    let mut s = ThroughputSettings::default();
    for r in records {
        if let Some(Event::RankStart(x)) = r.event() {
            s.tokens_per_step = s.tokens_per_step.or(x.tokens_per_step);
            s.flops_per_token = s.flops_per_token.or(x.flops_per_token);
            s.peak_tflops = s.peak_tflops.or(x.peak_tflops);
            s.devices_per_rank = s.devices_per_rank.or(x.devices_per_rank);
            s.seq_len = s.seq_len.or(x.seq_len);
        }
    }
    s
}

/// Names that make an attempt's throughput worth reporting (a loss alone
/// does not).
const THROUGHPUT_FIGURES: &[&str] = &[
    "step_time_s",
    "tokens_per_s_device",
    "samples_per_s",
    "tflops",
    "mfu",
    "tokens",
    "samples",
];

/// One attempt's throughput, or `None` when nothing about it is known
/// beyond its step numbers (no figure printed or sent, no settings).
pub fn of_attempt(records: &[&Record], world: u32) -> Option<Throughput> {
    let settings = settings_of(records);
    let has_figure = |m: Option<&BTreeMap<String, serde_json::Value>>| {
        THROUGHPUT_FIGURES.iter().any(|f| metric(m, f).is_some())
    };
    let any_settings = settings.tokens_per_step.is_some()
        || settings.flops_per_token.is_some()
        || settings.seq_len.is_some();
    // Asked of the records before they are sorted by rank: an attempt of
    // 131,072 ranks with neither costs no per-rank list.
    let any_figures = || {
        records.iter().any(|r| match r.event() {
            Some(Event::Progress(p)) => p.step.is_some() && has_figure(p.metrics.as_ref()),
            _ => false,
        })
    };
    if !any_settings && !any_figures() {
        return None;
    }
    let by_rank = samples_by_rank(records);
    let has_figures = |recs: &[Sample]| recs.iter().any(|(_, _, m)| has_figure(*m));
    // The rank that prints figures (often rank 0 only), else the lowest.
    let (_, recs) = by_rank
        .iter()
        .find(|(_, v)| has_figures(v))
        .or_else(|| by_rank.iter().next())?;
    let world = world.max(by_rank.len() as u32).max(1);
    let devices = world * settings.devices_per_rank.unwrap_or(1).max(1);
    let figure = |name: &str| {
        median(
            recs.iter()
                .filter_map(|(_, _, m)| metric(*m, name))
                .collect(),
        )
    };
    let (rates, steps_per_s) = step_rates(recs);
    let mut from = Vec::new();
    let mut note = |what: &str| {
        if !from.iter().any(|f| f == what) {
            from.push(what.to_string());
        }
    };
    let socket_tokens = socket_tokens(&by_rank, world);
    let step_time_s = figure("step_time_s").or_else(|| steps_per_s.map(|r| 1.0 / r));
    let rate = steps_per_s.or_else(|| step_time_s.map(|t| 1.0 / t));
    let tokens_per_s = tokens_per_s(&figure, socket_tokens, &settings, rate, devices, &mut note);
    let samples_per_s = figure("samples_per_s")
        .or_else(|| Some(figure("global_batch_size")? * rate?))
        .or_else(|| Some(figure("samples")? * world as f64 * rate?));
    let (tflops_per_device, mfu) =
        device_figures(&figure, tokens_per_s, &settings, devices, &mut note);
    Some(Throughput {
        steps_per_s,
        step_time_s,
        tokens_per_s,
        samples_per_s,
        tflops_per_device,
        mfu,
        devices,
        from,
        rates,
    })
}

/// Each rank's progress: (ts, step, metrics).
fn samples_by_rank<'a>(records: &[&'a Record]) -> BTreeMap<u32, Vec<Sample<'a>>> {
    let mut by_rank: BTreeMap<u32, Vec<Sample<'a>>> = BTreeMap::new();
    for r in records {
        let Some(Event::Progress(p)) = r.event() else {
            continue;
        };
        let Some(step) = p.step else { continue };
        let metrics = p.metrics.as_ref();
        let t = r.ts.timestamp_micros() as f64 / 1e6;
        by_rank
            .entry(r.rank.unwrap_or(0))
            .or_default()
            .push((t, step, metrics));
    }
    by_rank
}

/// Steps per second between successive samples, and over them all.
fn step_rates(recs: &[Sample<'_>]) -> (Vec<f64>, Option<f64>) {
    let mut rates = Vec::new();
    for w in recs.windows(2) {
        let (dt, ds) = (w[1].0 - w[0].0, w[1].1 as f64 - w[0].1 as f64);
        if dt > 0.0 && ds >= 0.0 {
            rates.push(ds / dt);
        }
    }
    let steps_per_s = match (recs.first(), recs.last()) {
        (Some(a), Some(b)) if b.0 > a.0 && b.1 > a.1 => Some((b.1 - a.1) as f64 / (b.0 - a.0)),
        _ => None,
    };
    (rates, steps_per_s)
}

/// Tokens per step of the job from the socket: each rank's own, summed
/// (ranks that do not send count as the ones that do).
fn socket_tokens(by_rank: &BTreeMap<u32, Vec<Sample>>, world: u32) -> Option<f64> {
    let per_rank: Vec<f64> = by_rank
        .values()
        .filter_map(|v| {
            median(
                v.iter()
                    .filter_map(|(_, _, m)| metric(*m, "tokens"))
                    .collect(),
            )
        })
        .collect();
    (!per_rank.is_empty())
        .then(|| per_rank.iter().sum::<f64>() / per_rank.len() as f64 * world as f64)
}

/// Tokens per second of the whole job: printed per device, else from the
/// socket's tokens, the settings' or the printed batch size, at `rate`
/// steps per second. `note` is told where it came from.
fn tokens_per_s(
    figure: &impl Fn(&str) -> Option<f64>,
    socket_tokens: Option<f64>,
    settings: &ThroughputSettings,
    rate: Option<f64>,
    devices: u32,
    note: &mut impl FnMut(&str),
) -> Option<f64> {
    if let Some(t) = figure("tokens_per_s_device") {
        note("printed");
        Some(t * devices as f64)
    } else if let (Some(t), Some(r)) = (socket_tokens, rate) {
        note("socket");
        Some(t * r)
    } else if let (Some(t), Some(r)) = (settings.tokens_per_step, rate) {
        note("settings");
        Some(t * r)
    } else if let (Some(b), Some(l), Some(r)) =
        (figure("global_batch_size"), settings.seq_len, rate)
    {
        note("printed");
        note("settings");
        Some(b * l as f64 * r)
    } else {
        None
    }
}

/// One device's TFLOP/s and MFU: printed, else from the tokens per second
/// and the settings. `note` is told where they came from.
fn device_figures(
    figure: &impl Fn(&str) -> Option<f64>,
    tokens_per_s: Option<f64>,
    settings: &ThroughputSettings,
    devices: u32,
    note: &mut impl FnMut(&str),
) -> (Option<f64>, Option<f64>) {
    let tflops_per_device = if let Some(t) = figure("tflops") {
        note("printed");
        Some(t)
    } else if let (Some(tok), Some(f)) = (tokens_per_s, settings.flops_per_token) {
        note("settings");
        Some(tok / devices as f64 * f / 1e12)
    } else {
        None
    };
    let mfu = if let Some(m) = figure("mfu") {
        note("printed");
        Some(m)
    } else if let (Some(t), Some(p)) = (tflops_per_device, settings.peak_tflops) {
        note("settings");
        (p > 0.0).then(|| t / p)
    } else {
        None
    };
    (tflops_per_device, mfu)
}

/// Goodput from each attempt's productive seconds and throughput, over the
/// job's wall time.
pub fn goodput(attempts: &[(f64, Option<&Throughput>)], wall_s: f64) -> Option<Goodput> {
    let devices = attempts
        .iter()
        .filter_map(|(_, t)| t.map(|t| t.devices))
        .max()?;
    let mut tokens = 0.0;
    let mut known = false;
    let (mut mfu_time, mut mfu_known) = (0.0, false);
    for (productive, t) in attempts {
        let Some(t) = t else { continue };
        if let Some(r) = t.tokens_per_s {
            tokens += productive * r;
            known = true;
        }
        if let Some(m) = t.mfu {
            mfu_time += productive * m;
            mfu_known = true;
        }
    }
    if !known && !mfu_known {
        return None;
    }
    let device_hours = wall_s * devices as f64 / 3600.0;
    Some(Goodput {
        tokens_kept: tokens,
        device_hours,
        tokens_per_device_hour: if device_hours > 0.0 {
            tokens / device_hours
        } else {
            0.0
        },
        effective_mfu: (mfu_known && wall_s > 0.0).then(|| mfu_time / wall_s),
    })
}

/// Productive time lost to running slower than the baseline, by attempt:
/// each slowdown from its first slow window to its end (or the attempt's
/// last record), times the share of steps it cost (1 - baseline/step).
pub fn slow_time(records: &[Record]) -> BTreeMap<u32, f64> {
    let mut out = BTreeMap::new();
    let mut open: BTreeMap<u32, (chrono::DateTime<chrono::Utc>, f64)> = BTreeMap::new();
    let mut last_ts: BTreeMap<u32, chrono::DateTime<chrono::Utc>> = BTreeMap::new();
    let cost =
        |from: chrono::DateTime<chrono::Utc>, to: chrono::DateTime<chrono::Utc>, ratio: f64| {
            let secs = (to - from).num_microseconds().unwrap_or(0) as f64 / 1e6;
            secs.max(0.0) * (1.0 - 1.0 / ratio.max(1.0))
        };
    for r in records {
        last_ts.insert(r.attempt, r.ts);
        let Some(Event::Slowdown(s)) = r.event() else {
            continue;
        };
        match s.state {
            crate::policy::slowdown::SlowdownState::Started => {
                let back =
                    chrono::Duration::milliseconds((s.slow_for_s.unwrap_or(0.0) * 1000.0) as i64);
                open.insert(r.attempt, (r.ts - back, s.ratio.unwrap_or(1.0)));
            }
            crate::policy::slowdown::SlowdownState::Ended => {
                if let Some((from, ratio)) = open.remove(&r.attempt) {
                    *out.entry(r.attempt).or_insert(0.0) += cost(from, r.ts, ratio);
                }
            }
            _ => {}
        }
    }
    for (attempt, (from, ratio)) in open {
        if let Some(to) = last_ts.get(&attempt) {
            *out.entry(attempt).or_insert(0.0) += cost(from, *to, ratio);
        }
    }
    out
}

/// A one-line sparkline of `values` in at most `width` characters (each
/// the mean of its share of the values), scaled to their maximum.
pub fn sparkline(values: &[f64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() || width == 0 {
        return String::new();
    }
    let cells = v.len().min(width);
    let means: Vec<f64> = (0..cells)
        .map(|i| {
            let (a, b) = (
                i * v.len() / cells,
                ((i + 1) * v.len() / cells).max(i * v.len() / cells + 1),
            );
            v[a..b].iter().sum::<f64>() / (b - a) as f64
        })
        .collect();
    let max = means.iter().copied().fold(0.0, f64::max);
    means
        .iter()
        .map(|m| {
            if max <= 0.0 {
                BARS[0]
            } else {
                BARS[((m / max) * 7.0).round().clamp(0.0, 7.0) as usize]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Record;

    fn progress(rank: u32, secs: i64, step: u64, metrics: &str) -> Record {
        let line = format!(
            r#"{{"v":1,"ts":"2026-11-25T10:00:{:02}.000Z","kind":"progress","attempt":0,"rank":{rank},"step":{step},"source":"stdout","metrics":{{{metrics}}}}}"#,
            secs
        );
        serde_json::from_str(&line).unwrap()
    }

    fn start(fields: &str) -> Record {
        serde_json::from_str(&format!(
            r#"{{"v":1,"ts":"2026-11-25T10:00:00.000Z","kind":"rank_start","attempt":0,"rank":0{fields}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn printed_figures_give_the_jobs_tokens_and_mfu() {
        // torchtitan on 8 devices: tps per device, tflops, mfu.
        let recs = [
            start(""),
            progress(
                0,
                10,
                100,
                r#""tokens_per_s_device":1000,"tflops":300,"mfu":0.3"#,
            ),
            progress(
                0,
                20,
                200,
                r#""tokens_per_s_device":1000,"tflops":310,"mfu":0.31"#,
            ),
            progress(
                0,
                30,
                300,
                r#""tokens_per_s_device":1200,"tflops":320,"mfu":0.32"#,
            ),
        ];
        let refs: Vec<&Record> = recs.iter().collect();
        let t = of_attempt(&refs, 8).unwrap();
        assert_eq!(t.steps_per_s, Some(10.0));
        assert_eq!(t.tokens_per_s, Some(8000.0));
        assert_eq!(t.tflops_per_device, Some(310.0));
        assert_eq!(t.mfu, Some(0.31));
        assert_eq!(t.devices, 8);
        assert_eq!(t.rates, vec![10.0, 10.0]);
    }

    #[test]
    fn settings_give_tokens_tflops_and_mfu_from_the_step_rate() {
        let recs = [
            start(
                r#","tokens_per_step":4096,"flops_per_token":6e9,"peak_tflops":100,"devices_per_rank":1"#,
            ),
            progress(0, 0, 0, ""),
            progress(0, 10, 20, ""),
        ];
        let refs: Vec<&Record> = recs.iter().collect();
        let t = of_attempt(&refs, 2).unwrap();
        assert_eq!(t.steps_per_s, Some(2.0));
        assert_eq!(t.tokens_per_s, Some(8192.0));
        // 8192 tokens/s over 2 devices × 6e9 FLOPs = 24.576 TFLOP/s each.
        assert!((t.tflops_per_device.unwrap() - 24.576).abs() < 1e-9);
        assert!((t.mfu.unwrap() - 0.24576).abs() < 1e-9);
        assert_eq!(t.from, vec!["settings".to_string()]);
    }

    #[test]
    fn megatrons_global_batch_and_the_sequence_length_give_tokens() {
        let recs = [
            start(r#","seq_len":2048"#),
            progress(0, 0, 0, r#""global_batch_size":128,"step_time_s":2.0"#),
            progress(0, 10, 5, r#""global_batch_size":128,"step_time_s":2.0"#),
        ];
        let refs: Vec<&Record> = recs.iter().collect();
        let t = of_attempt(&refs, 8).unwrap();
        assert_eq!(t.tokens_per_s, Some(128.0 * 2048.0 * 0.5));
        assert_eq!(t.samples_per_s, Some(64.0));
    }

    #[test]
    fn the_sockets_tokens_per_rank_and_step_make_the_jobs_tokens() {
        // Two of four ranks send `tokens=` (2048 each per step): the others
        // count as they do; 2 steps/s.
        let recs = [
            start(""),
            progress(0, 0, 0, r#""tokens":2048,"samples":2"#),
            progress(0, 10, 20, r#""tokens":2048,"samples":2"#),
            progress(1, 0, 0, r#""tokens":2048"#),
            progress(1, 10, 20, r#""tokens":2048"#),
        ];
        let refs: Vec<&Record> = recs.iter().collect();
        let t = of_attempt(&refs, 4).unwrap();
        assert_eq!(t.tokens_per_s, Some(2048.0 * 4.0 * 2.0));
        assert_eq!(t.samples_per_s, Some(2.0 * 4.0 * 2.0));
        assert_eq!(t.from, vec!["socket".to_string()]);
    }

    #[test]
    fn steps_alone_are_not_throughput() {
        let recs = [
            start(""),
            progress(0, 0, 0, r#""loss":2.0"#),
            progress(0, 10, 20, ""),
        ];
        let refs: Vec<&Record> = recs.iter().collect();
        assert_eq!(of_attempt(&refs, 1), None);
    }

    #[test]
    fn goodput_counts_tokens_in_productive_time_over_the_allocation() {
        let t = Throughput {
            tokens_per_s: Some(1000.0),
            mfu: Some(0.4),
            devices: 4,
            ..Default::default()
        };
        // 3600 s allocated, 1800 s productive.
        let g = goodput(&[(1800.0, Some(&t))], 3600.0).unwrap();
        assert_eq!(g.tokens_kept, 1.8e6);
        assert_eq!(g.device_hours, 4.0);
        assert_eq!(g.tokens_per_device_hour, 4.5e5);
        assert_eq!(g.effective_mfu, Some(0.2));
    }

    #[test]
    fn sparkline_scales_to_the_maximum() {
        assert_eq!(sparkline(&[1.0, 2.0, 4.0, 8.0], 10), "▂▃▅█");
        assert_eq!(sparkline(&[8.0, 8.0, 0.0, 0.0], 2), "█▁");
        assert_eq!(sparkline(&[], 5), "");
    }
}
