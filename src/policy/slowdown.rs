//! Slowdowns: the job's step time against its own recent past. Pure: the
//! coordinator feeds every rank's cumulative totals at the end of each
//! straggler window (the same [`Totals`] as [`crate::policy::straggler`]).
//!
//! Each window the job's step time is the median over the ranks of their
//! mean step interval in that window. Its baseline is the median of the
//! last `baseline_windows` normal windows (after `warmup_windows`, which
//! hold start-up effects). A window is slow when its step time is above the
//! baseline by more than `threshold`; slow windows for `sustain` make a
//! slowdown, and the first normal window ends it. The baseline does not
//! move while the job is slow.
//!
//! Attribution, from the ranks' `compute_s` when they send it (lockstep
//! training waits for the slowest rank, so step intervals are equal on
//! every rank and only compute time tells who holds the others back):
//! - `rank` / `node`: one rank's compute time rose (or every rank of one
//!   node's): a straggler;
//! - `all_ranks`: every rank computes slower (the model, the data mix, a
//!   shared filesystem, thermal throttling across the job);
//! - `waiting`: compute time did not rise: the time went to communication
//!   or input (data loading), outside computation;
//! - `unknown`: no rank sends `compute_s`.

use super::straggler::Totals;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

names! {
    /// What a slowdown does besides its record (`[slowdown] action`,
    /// `slowdown.action`).
    SlowAction {
        /// Journal it (and show it in the report).
        Record = "record",
        /// Ask every rank for a coordinated checkpoint.
        Checkpoint = "checkpoint",
        /// When one node is to blame and a spare can take its place: a
        /// checkpoint, then the step relaunched without it (as a confirmed
        /// straggler is).
        Exclude = "exclude",
    }

    /// Who or what a slowdown is blamed on (`slowdown.attribution`); no
    /// rank sending `compute_s` is `unknown`.
    Blame {
        /// One rank's compute time rose.
        Rank = "rank",
        /// The ranks of one node, and only they.
        Node = "node",
        /// Several ranks, not one node's.
        Ranks = "ranks",
        /// Every rank computes slower.
        AllRanks = "all_ranks",
        /// Compute time did not rise: communication or input.
        Waiting = "waiting",
    }

    /// A slowdown's record: it began or ended (`slowdown.state`).
    SlowdownState {
        Started = "started",
        Ended = "ended",
    }
}

/// `[slowdown]`.
#[derive(Clone, Debug, PartialEq)]
pub struct SlowdownConfig {
    /// Slower than the baseline by more than this fraction (0.15 = 15%); 0: off.
    pub threshold: f64,
    /// For this long.
    pub sustain: Duration,
    /// Normal windows the baseline is the median of.
    pub baseline_windows: usize,
    /// Windows at the start of an attempt that never count.
    pub warmup_windows: u32,
    /// Steps a rank must report in a window for it to count.
    pub min_samples: u64,
    pub action: SlowAction,
}

impl Default for SlowdownConfig {
    fn default() -> Self {
        SlowdownConfig {
            threshold: 0.15,
            sustain: Duration::from_secs(300),
            baseline_windows: 20,
            warmup_windows: 2,
            min_samples: 3,
            action: SlowAction::Record,
        }
    }
}

/// Who or what a slowdown is blamed on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Attribution {
    pub kind: Blame,
    /// The ranks whose compute time rose.
    pub ranks: Vec<u32>,
    /// Their node, when they share one.
    pub node: Option<String>,
    /// Their compute time now over their baseline (the highest).
    pub compute_ratio: Option<f64>,
}

impl Attribution {
    /// In words.
    pub fn describe(&self) -> String {
        let ratio = self
            .compute_ratio
            .map_or(String::new(), |r| format!(" ({r:.2}x its compute time)"));
        match self.kind {
            Blame::Rank => format!(
                "rank {} on {}{ratio}",
                self.ranks.first().copied().unwrap_or_default(),
                self.node.as_deref().unwrap_or("?")
            ),
            Blame::Node => format!("node {}{ratio}", self.node.as_deref().unwrap_or("?")),
            Blame::Ranks => format!("ranks {:?}{ratio}", self.ranks),
            Blame::AllRanks => format!("every rank computes slower{ratio}"),
            Blame::Waiting => {
                "compute time is unchanged: the time went to communication or input (data loading)"
                    .into()
            }
            _ => "no rank sends compute_s: the slow rank, if one, cannot be told".into(),
        }
    }
}

/// A slowdown began or ended.
#[derive(Clone, Debug, PartialEq)]
pub enum SlowdownChange {
    Started {
        /// The end of its first slow window.
        since: Instant,
        step_s: f64,
        baseline_s: f64,
        attribution: Attribution,
    },
    Ended {
        step_s: f64,
        baseline_s: f64,
        /// From `since` to now.
        lasted: Duration,
    },
}

/// One rank in one window.
struct Window {
    node: String,
    step_s: Option<f64>,
    compute_s: Option<f64>,
}

/// The slowdown watch of one attempt.
#[derive(Debug)]
pub struct SlowdownWatch {
    cfg: SlowdownConfig,
    prev: BTreeMap<u32, Totals>,
    windows: u32,
    /// The job's step time in the last normal windows.
    normal: VecDeque<f64>,
    /// Each rank's compute time in its last normal windows.
    normal_compute: BTreeMap<u32, VecDeque<f64>>,
    slow_since: Option<Instant>,
    active: Option<(Instant, f64)>,
}

fn median(v: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = v.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

impl SlowdownWatch {
    pub fn new(cfg: SlowdownConfig) -> Self {
        SlowdownWatch {
            cfg,
            prev: BTreeMap::new(),
            windows: 0,
            normal: VecDeque::new(),
            normal_compute: BTreeMap::new(),
            slow_since: None,
            active: None,
        }
    }

    /// Whether a slowdown is under way.
    pub fn active(&self) -> bool {
        self.active.is_some()
    }

    /// The end of one window, with every running rank's totals.
    pub fn on_window(&mut self, now: Instant, totals: &[Totals]) -> Option<SlowdownChange> {
        let ranks = self.window(totals);
        self.windows += 1;
        if self.cfg.threshold <= 0.0 || self.windows <= self.cfg.warmup_windows {
            return None;
        }
        // No steps in the window: a stall (the stall policy's), not a slowdown.
        let step = median(ranks.values().filter_map(|w| w.step_s))?;
        let keep = self.cfg.baseline_windows.max(1);
        let Some(baseline) = self.baseline() else {
            self.remember(step, &ranks, keep);
            return None;
        };
        if step > baseline * (1.0 + self.cfg.threshold) {
            let since = *self.slow_since.get_or_insert(now);
            let sustained =
                now.saturating_duration_since(since) + Duration::from_nanos(1) > self.cfg.sustain;
            if self.active.is_none() && sustained {
                self.active = Some((since, baseline));
                return Some(SlowdownChange::Started {
                    since,
                    step_s: step,
                    baseline_s: baseline,
                    attribution: self.attribute(&ranks),
                });
            }
            return None;
        }
        self.slow_since = None;
        let ended = self
            .active
            .take()
            .map(|(since, baseline)| SlowdownChange::Ended {
                step_s: step,
                baseline_s: baseline,
                lasted: now.saturating_duration_since(since),
            });
        self.remember(step, &ranks, keep);
        ended
    }

    /// Each rank's means over the window, from the totals' differences.
    fn window(&mut self, totals: &[Totals]) -> BTreeMap<u32, Window> {
        let mut out = BTreeMap::new();
        for t in totals {
            let p = self.prev.get(&t.rank).cloned().unwrap_or_default();
            let mean = |now: (u64, f64), before: (u64, f64)| {
                let (n, s) = (now.0.saturating_sub(before.0), now.1 - before.1);
                (n >= self.cfg.min_samples && s >= 0.0).then(|| s / n as f64)
            };
            out.insert(
                t.rank,
                Window {
                    node: t.node.clone(),
                    step_s: mean(t.intervals, p.intervals),
                    compute_s: mean(t.compute, p.compute),
                },
            );
            self.prev.insert(t.rank, t.clone());
        }
        out
    }

    fn baseline(&self) -> Option<f64> {
        (self.normal.len() >= 3)
            .then(|| median(self.normal.iter().copied()))
            .flatten()
    }

    fn remember(&mut self, step: f64, ranks: &BTreeMap<u32, Window>, keep: usize) {
        self.normal.push_back(step);
        while self.normal.len() > keep {
            self.normal.pop_front();
        }
        for (r, w) in ranks {
            if let Some(c) = w.compute_s {
                let h = self.normal_compute.entry(*r).or_default();
                h.push_back(c);
                while h.len() > keep {
                    h.pop_front();
                }
            }
        }
    }

    fn attribute(&self, ranks: &BTreeMap<u32, Window>) -> Attribution {
        // Each rank's compute time now over its own baseline.
        let ratios: Vec<(u32, &str, f64)> = ranks
            .iter()
            .filter_map(|(r, w)| {
                let base = median(self.normal_compute.get(r)?.iter().copied())?;
                let now = w.compute_s?;
                (base > 0.0).then(|| (*r, w.node.as_str(), now / base))
            })
            .collect();
        if ratios.is_empty() {
            return Attribution {
                kind: Blame::Unknown,
                ranks: Vec::new(),
                node: None,
                compute_ratio: None,
            };
        }
        let rose: Vec<&(u32, &str, f64)> = ratios
            .iter()
            .filter(|(_, _, x)| *x > 1.0 + self.cfg.threshold)
            .collect();
        let top = rose
            .iter()
            .map(|(_, _, x)| *x)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        let ids: Vec<u32> = rose.iter().map(|(r, _, _)| *r).collect();
        let nodes: std::collections::BTreeSet<&str> = rose.iter().map(|(_, n, _)| *n).collect();
        let node_of_all = |node: &str| {
            ratios.iter().filter(|(_, n, _)| *n == node).count() == rose.len()
                && ratios.iter().any(|(_, n, _)| *n != node)
        };
        let (kind, node) = if rose.is_empty() {
            (Blame::Waiting, None)
        } else if rose.len() == ratios.len() && ratios.len() > 1 {
            (Blame::AllRanks, None)
        } else if rose.len() == 1 {
            (Blame::Rank, Some(rose[0].1.to_string()))
        } else if nodes.len() == 1 && node_of_all(rose[0].1) {
            (Blame::Node, Some(rose[0].1.to_string()))
        } else if rose.len() == ratios.len() {
            (Blame::AllRanks, None)
        } else {
            (
                Blame::Ranks,
                (nodes.len() == 1).then(|| rose[0].1.to_string()),
            )
        };
        Attribution {
            kind,
            ranks: ids,
            node,
            compute_ratio: top,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four ranks on two nodes; `step` and `compute` per rank this window.
    struct Feed {
        totals: Vec<Totals>,
    }

    impl Feed {
        fn new() -> Self {
            Feed {
                totals: (0..4)
                    .map(|r| Totals {
                        rank: r,
                        node: format!("n{}", r / 2),
                        ..Default::default()
                    })
                    .collect(),
            }
        }

        /// Ten steps of `step` s per rank, each computing `compute(rank)`.
        fn window(&mut self, step: f64, compute: impl Fn(u32) -> Option<f64>) -> Vec<Totals> {
            for t in self.totals.iter_mut() {
                t.intervals.0 += 10;
                t.intervals.1 += 10.0 * step;
                if let Some(c) = compute(t.rank) {
                    t.compute.0 += 10;
                    t.compute.1 += 10.0 * c;
                }
            }
            self.totals.clone()
        }
    }

    fn cfg() -> SlowdownConfig {
        SlowdownConfig {
            sustain: Duration::from_secs(60),
            ..Default::default()
        }
    }

    /// Feed `n` windows 30 s apart from `t`; the changes, with their window.
    fn run(
        w: &mut SlowdownWatch,
        f: &mut Feed,
        t: &mut Instant,
        n: usize,
        step: f64,
        compute: impl Fn(u32) -> Option<f64> + Copy,
    ) -> Vec<(usize, SlowdownChange)> {
        let mut out = Vec::new();
        for i in 0..n {
            *t += Duration::from_secs(30);
            if let Some(c) = w.on_window(*t, &f.window(step, compute)) {
                out.push((i, c));
            }
        }
        out
    }

    #[test]
    fn one_slow_rank_is_found_from_its_compute_time_after_the_sustain() {
        let (mut w, mut f, mut t) = (SlowdownWatch::new(cfg()), Feed::new(), Instant::now());
        assert!(run(&mut w, &mut f, &mut t, 10, 1.0, |_| Some(0.8)).is_empty());
        // Rank 3 computes twice as long; every rank waits for it.
        let changes = run(&mut w, &mut f, &mut t, 6, 1.8, |r| {
            Some(if r == 3 { 1.6 } else { 0.8 })
        });
        assert_eq!(changes.len(), 1, "{changes:?}");
        // Slow from the first window; 60 s sustained at the third.
        let (
            i,
            SlowdownChange::Started {
                step_s,
                baseline_s,
                attribution,
                ..
            },
        ) = &changes[0]
        else {
            panic!("{changes:?}")
        };
        assert_eq!(*i, 2);
        assert_eq!((*step_s, *baseline_s), (1.8, 1.0));
        assert_eq!(attribution.kind, Blame::Rank);
        assert_eq!(attribution.ranks, vec![3]);
        assert_eq!(attribution.node.as_deref(), Some("n1"));
        assert_eq!(attribution.compute_ratio, Some(2.0));
        assert!(w.active());
        // Back to normal: it ends, and is said once.
        let changes = run(&mut w, &mut f, &mut t, 2, 1.0, |_| Some(0.8));
        assert!(
            matches!(changes.as_slice(), [(0, SlowdownChange::Ended { lasted, .. })] if *lasted == Duration::from_secs(180))
        );
    }

    #[test]
    fn a_slow_node_every_rank_and_waiting_are_told_apart() {
        let attribution = |compute: fn(u32) -> Option<f64>| {
            let (mut w, mut f, mut t) = (SlowdownWatch::new(cfg()), Feed::new(), Instant::now());
            run(&mut w, &mut f, &mut t, 8, 1.0, |_| Some(0.8));
            match run(&mut w, &mut f, &mut t, 4, 1.5, compute).first() {
                Some((_, SlowdownChange::Started { attribution, .. })) => attribution.clone(),
                other => panic!("{other:?}"),
            }
        };
        let a = attribution(|r| Some(if r >= 2 { 1.3 } else { 0.8 }));
        assert_eq!((a.kind, a.node.as_deref()), (Blame::Node, Some("n1")));
        assert_eq!(attribution(|_| Some(1.3)).kind, Blame::AllRanks);
        assert_eq!(attribution(|_| Some(0.8)).kind, Blame::Waiting);
        assert_eq!(attribution(|_| None).kind, Blame::Unknown);
    }

    #[test]
    fn short_dips_warmup_and_stalls_are_not_slowdowns() {
        let (mut w, mut f, mut t) = (SlowdownWatch::new(cfg()), Feed::new(), Instant::now());
        // Slow warm-up windows do not make the baseline.
        assert!(run(&mut w, &mut f, &mut t, 2, 5.0, |_| None).is_empty());
        assert!(run(&mut w, &mut f, &mut t, 6, 1.0, |_| None).is_empty());
        // A checkpoint's slow window, then normal again.
        assert!(run(&mut w, &mut f, &mut t, 2, 3.0, |_| None).is_empty());
        assert!(run(&mut w, &mut f, &mut t, 2, 1.0, |_| None).is_empty());
        // No steps at all in a window (a stall): nothing.
        t += Duration::from_secs(30);
        assert_eq!(w.on_window(t, &f.totals.clone()), None);
        // Within the threshold: nothing.
        assert!(run(&mut w, &mut f, &mut t, 10, 1.1, |_| None).is_empty());
        assert!(!w.active());
    }
}
