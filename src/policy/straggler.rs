//! Straggler detection across ranks and nodes. Pure: the coordinator feeds
//! each rank's cumulative totals at the end of every window; the policy
//! answers which ranks and nodes became (or stopped being) stragglers.
//!
//! Each window, a rank's time per step is the mean of what it reported in
//! that window: its compute time (`compute_s`) when the ranks send it, its
//! step interval otherwise. A rank is slow in a window when that time is
//! above the median of the *other* ranks by more than `margin`; it is
//! flagged after `windows` slow windows in a row, and cleared after as many
//! normal ones. Nodes are judged the same way on the median of their ranks.
//!
//! Why compute time matters: in lockstep training (DDP, FSDP, Megatron) every
//! rank waits for the slowest at each collective, so step intervals are equal
//! on every rank and a slow GPU cannot be told from them. Only the time a rank
//! spends computing (before it waits) shows which one holds the others back.

use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Parameters (config `[straggler]`).
#[derive(Clone, Debug, PartialEq)]
pub struct StragglerConfig {
    /// Length of one comparison window.
    pub window: Duration,
    /// Slow means above the others' median by more than this fraction (0.2 = 20%).
    pub margin: f64,
    /// Consecutive slow windows before flagging (and normal ones before clearing).
    pub windows: u32,
    /// Steps a rank must report in a window for it to count.
    pub min_samples: u64,
}

impl Default for StragglerConfig {
    fn default() -> Self {
        StragglerConfig {
            window: Duration::from_secs(30),
            margin: 0.2,
            windows: 3,
            min_samples: 3,
        }
    }
}

/// Cumulative totals one rank has reported so far (never reset within an attempt).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Totals {
    pub rank: u32,
    pub node: String,
    /// Step intervals: count and sum in seconds.
    pub intervals: (u64, f64),
    /// Compute times reported by the trainer (`compute_s`): count and sum.
    pub compute: (u64, f64),
}

names! {
    /// Which measure a judgment used (`straggler.basis`).
    Basis {
        ComputeTime = "compute_time",
        StepInterval = "step_interval",
    }

    /// What a straggler is: one rank, or a node's ranks together
    /// (`straggler.scope`).
    StragglerScope {
        Rank = "rank",
        Node = "node",
    }
}

/// A change of straggler status.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StragglerChange {
    pub scope: StragglerScope,
    /// The rank number or the node name.
    pub who: String,
    /// The node of the rank (or the node itself).
    pub node: String,
    /// True: became a straggler; false: recovered.
    pub flagged: bool,
    pub basis: Basis,
    /// This one's mean time per step in the last window, seconds.
    pub value_s: f64,
    /// The others' median in the last window, seconds.
    pub median_s: f64,
    /// value / median.
    pub ratio: f64,
    /// Consecutive windows that decided it.
    pub windows: u32,
}

#[derive(Default)]
struct Streak {
    slow: u32,
    normal: u32,
    flagged: bool,
}

/// The policy's memory between windows.
pub struct StragglerPolicy {
    cfg: StragglerConfig,
    prev: BTreeMap<u32, Totals>,
    ranks: BTreeMap<String, Streak>,
    nodes: BTreeMap<String, Streak>,
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

/// For each value, the median of all the others, in O(n log n) for all of
/// them (a median of the others taken one value at a time is O(n^2 log n):
/// at 131,072 ranks, a minute and a half of the coordinator's core at
/// every window). The others of a value are the sorted values with its
/// place left out; which of equal values is left out changes nothing.
fn medians_of_the_others(values: &[f64]) -> Vec<Option<f64>> {
    let n = values.len();
    if n < 2 {
        return vec![None; n];
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let sorted: Vec<f64> = order.iter().map(|&i| values[i]).collect();
    let mut place = vec![0; n];
    for (p, &i) in order.iter().enumerate() {
        place[i] = p;
    }
    // The k-th of the others of the value at sorted place `p`.
    let kth = |p: usize, k: usize| if k < p { sorted[k] } else { sorted[k + 1] };
    let m = n - 1;
    place
        .into_iter()
        .map(|p| {
            Some(if m % 2 == 1 {
                kth(p, m / 2)
            } else {
                (kth(p, m / 2 - 1) + kth(p, m / 2)) / 2.0
            })
        })
        .collect()
}

impl StragglerPolicy {
    pub fn new(cfg: StragglerConfig) -> Self {
        StragglerPolicy {
            cfg,
            prev: BTreeMap::new(),
            ranks: BTreeMap::new(),
            nodes: BTreeMap::new(),
        }
    }

    pub fn config(&self) -> &StragglerConfig {
        &self.cfg
    }

    /// Ranks and nodes currently flagged.
    pub fn flagged(&self) -> (Vec<String>, Vec<String>) {
        let f = |m: &BTreeMap<String, Streak>| {
            m.iter()
                .filter(|(_, s)| s.flagged)
                .map(|(k, _)| k.clone())
                .collect()
        };
        (f(&self.ranks), f(&self.nodes))
    }

    /// Forget the previous totals (a new attempt starts counting from zero).
    /// Streaks are kept: a node slow before a restart and after it is the
    /// "persisting across a restart" confirmation.
    pub fn reset_totals(&mut self) {
        self.prev.clear();
    }

    /// Close a window with every live rank's cumulative totals.
    pub fn on_window(&mut self, totals: &[Totals]) -> Vec<StragglerChange> {
        let min = self.cfg.min_samples.max(1);
        let mut compute = Vec::new();
        let mut interval = Vec::new();
        for t in totals {
            let p = self.prev.get(&t.rank);
            let d = |now: (u64, f64), before: Option<(u64, f64)>| {
                let (n0, s0) = before.unwrap_or((0, 0.0));
                // Totals that went backwards: the rank restarted; count anew.
                if now.0 < n0 {
                    now
                } else {
                    (now.0 - n0, now.1 - s0)
                }
            };
            let dc = d(t.compute, p.map(|p| p.compute));
            let di = d(t.intervals, p.map(|p| p.intervals));
            if dc.0 >= min {
                compute.push((t, dc.1 / dc.0 as f64));
            }
            if di.0 >= min {
                interval.push((t, di.1 / di.0 as f64));
            }
        }
        for t in totals {
            self.prev.insert(t.rank, t.clone());
        }
        // Compute time when most measurable ranks send it.
        let (basis, values) = if compute.len() >= 2 && compute.len() * 2 >= interval.len() {
            (Basis::ComputeTime, compute)
        } else {
            (Basis::StepInterval, interval)
        };
        let mut out = Vec::new();
        if values.len() < 2 {
            return out;
        }
        // Ranks that send compute time, in a window where too few sent
        // enough: the window is short, not a lockstep verdict (their equal
        // intervals would clear a slow node flagged on compute time).
        let senders = totals.iter().filter(|t| t.compute.0 > 0).count();
        if basis == Basis::StepInterval && senders >= 2 && senders * 2 >= totals.len() {
            return out;
        }
        let rank_values: Vec<(String, String, f64)> = values
            .iter()
            .map(|(t, v)| (t.rank.to_string(), t.node.clone(), *v))
            .collect();
        self.judge(StragglerScope::Rank, &rank_values, basis, &mut out);
        let mut per_node: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for (t, v) in &values {
            per_node.entry(&t.node).or_default().push(*v);
        }
        let node_values: Vec<(String, String, f64)> = per_node
            .into_iter()
            .filter_map(|(n, vs)| median(vs).map(|m| (n.to_string(), n.to_string(), m)))
            .collect();
        if node_values.len() >= 2 {
            self.judge(StragglerScope::Node, &node_values, basis, &mut out);
        }
        out
    }

    fn judge(
        &mut self,
        scope: StragglerScope,
        values: &[(String, String, f64)],
        basis: Basis,
        out: &mut Vec<StragglerChange>,
    ) {
        let need = self.cfg.windows.max(1);
        let streaks = if scope == StragglerScope::Rank {
            &mut self.ranks
        } else {
            &mut self.nodes
        };
        let medians = medians_of_the_others(&values.iter().map(|x| x.2).collect::<Vec<_>>());
        for ((who, node, v), m) in values.iter().zip(medians) {
            let Some(m) = m else { continue };
            let slow = m > 0.0 && *v > m * (1.0 + self.cfg.margin);
            let s = streaks.entry(who.clone()).or_default();
            if slow {
                s.slow += 1;
                s.normal = 0;
            } else {
                s.normal += 1;
                s.slow = 0;
            }
            let change = if !s.flagged && s.slow >= need {
                s.flagged = true;
                Some((true, s.slow))
            } else if s.flagged && s.normal >= need {
                s.flagged = false;
                Some((false, s.normal))
            } else {
                None
            };
            if let Some((flagged, windows)) = change {
                out.push(StragglerChange {
                    scope,
                    who: who.clone(),
                    node: node.clone(),
                    flagged,
                    basis,
                    value_s: *v,
                    median_s: m,
                    ratio: if m > 0.0 { v / m } else { 0.0 },
                    windows,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_the_others_is_each_values_median_of_all_but_it() {
        // Against the median of the others taken one at a time, on lists
        // of every length to 40 with ties (values from a few levels).
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % 9
        };
        for n in 0..40 {
            let values: Vec<f64> = (0..n).map(|_| 0.1 * next() as f64).collect();
            let one_at_a_time: Vec<Option<f64>> = (0..n)
                .map(|i| {
                    let others = values
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, v)| *v)
                        .collect();
                    median(others)
                })
                .collect();
            assert_eq!(medians_of_the_others(&values), one_at_a_time, "{values:?}");
        }
    }

    /// Four ranks on two nodes; rank 3 on node b computes `slow`x longer.
    /// Steps are in lockstep: every rank's interval is the slowest's.
    fn window(k: u64, slow: f64, with_compute: bool) -> Vec<Totals> {
        let steps = 10 * k;
        (0..4u32)
            .map(|r| {
                let c = if r == 3 { 0.2 * slow } else { 0.2 };
                Totals {
                    rank: r,
                    node: if r < 2 { "a" } else { "b" }.into(),
                    intervals: (steps, steps as f64 * 0.2 * slow + 0.05 * steps as f64),
                    compute: if with_compute {
                        (steps, steps as f64 * c)
                    } else {
                        (0, 0.0)
                    },
                }
            })
            .collect()
    }

    #[test]
    fn a_rank_with_twice_the_compute_time_is_flagged_after_three_windows() {
        let mut p = StragglerPolicy::new(StragglerConfig::default());
        assert!(p.on_window(&window(1, 2.0, true)).is_empty());
        assert!(p.on_window(&window(2, 2.0, true)).is_empty());
        let c = p.on_window(&window(3, 2.0, true));
        let ranks: Vec<&StragglerChange> = c
            .iter()
            .filter(|c| c.scope == StragglerScope::Rank)
            .collect();
        assert_eq!(ranks.len(), 1, "{c:?}");
        assert_eq!(ranks[0].who, "3");
        assert!(ranks[0].flagged);
        assert_eq!(ranks[0].basis, Basis::ComputeTime);
        assert!((ranks[0].ratio - 2.0).abs() < 1e-9);
        // Node b's median (ranks 2 and 3: 0.2 and 0.4) is 0.3 against 0.2.
        let nodes: Vec<&StragglerChange> = c
            .iter()
            .filter(|c| c.scope == StragglerScope::Node)
            .collect();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].who, "b");
        assert_eq!(p.flagged(), (vec!["3".to_string()], vec!["b".to_string()]));
        // Nothing new while it stays slow.
        assert!(p.on_window(&window(4, 2.0, true)).is_empty());
    }

    #[test]
    fn a_window_short_of_compute_samples_neither_flags_nor_clears() {
        let mut p = StragglerPolicy::new(StragglerConfig {
            windows: 2,
            min_samples: 2,
            ..Default::default()
        });
        p.on_window(&window(1, 2.0, true));
        assert!(p.on_window(&window(2, 2.0, true)).iter().any(|c| c.flagged));
        // Two windows where only rank 0 sent two compute times (the others
        // one each): the equal lockstep intervals say nothing.
        let mut t = window(2, 2.0, true);
        for k in 0..2 {
            for x in t.iter_mut() {
                x.intervals.0 += 2;
                x.intervals.1 += 2.0 * 0.45;
                let n = if x.rank == 0 { 2 } else { 1 };
                x.compute.0 += n;
                x.compute.1 += n as f64 * if x.rank == 3 { 0.4 } else { 0.2 };
            }
            let c = p.on_window(&t);
            assert!(c.is_empty(), "window {k}: {c:?}");
        }
        assert_eq!(p.flagged().1, vec!["b".to_string()]);
        // A window where every rank sent enough still judges.
        for x in t.iter_mut() {
            x.compute.0 += 2;
            x.compute.1 += 0.4;
            x.intervals.0 += 2;
            x.intervals.1 += 0.9;
        }
        let c = p.on_window(&t);
        assert!(c.is_empty(), "{c:?}");
        assert!(p
            .on_window(&{
                for x in t.iter_mut() {
                    x.compute.0 += 2;
                    x.compute.1 += 0.4;
                }
                t.clone()
            })
            .iter()
            .any(|c| c.who == "b" && !c.flagged));
    }

    #[test]
    fn lockstep_intervals_alone_flag_nobody() {
        let mut p = StragglerPolicy::new(StragglerConfig::default());
        for k in 1..=6 {
            assert!(p.on_window(&window(k, 2.0, false)).is_empty());
        }
    }

    #[test]
    fn without_compute_time_a_slow_interval_is_used() {
        let mut p = StragglerPolicy::new(StragglerConfig {
            windows: 2,
            ..Default::default()
        });
        let w = |k: u64| -> Vec<Totals> {
            (0..3u32)
                .map(|r| Totals {
                    rank: r,
                    node: format!("n{r}"),
                    intervals: (5 * k, 5.0 * k as f64 * if r == 1 { 1.5 } else { 1.0 }),
                    compute: (0, 0.0),
                })
                .collect()
        };
        assert!(p.on_window(&w(1)).is_empty());
        let c = p.on_window(&w(2));
        assert!(c.iter().any(|c| c.scope == StragglerScope::Rank
            && c.who == "1"
            && c.basis == Basis::StepInterval));
    }

    #[test]
    fn noise_within_the_margin_and_short_blips_are_not_flagged() {
        let mut p = StragglerPolicy::new(StragglerConfig::default());
        let mut t = window(0, 1.0, true);
        for k in 1..=9u64 {
            for x in t.iter_mut() {
                // 15% slower than the others on odd windows, and 3x for one window.
                let f = if x.rank == 1 {
                    if k == 4 {
                        3.0
                    } else if k % 2 == 1 {
                        1.15
                    } else {
                        1.0
                    }
                } else {
                    1.0
                };
                x.compute.0 += 10;
                x.compute.1 += 10.0 * 0.2 * f;
                x.intervals.0 += 10;
                x.intervals.1 += 10.0 * 0.25;
            }
            assert!(p.on_window(&t).is_empty(), "window {k}");
        }
    }

    #[test]
    fn a_recovered_rank_is_cleared_and_a_restart_counts_anew() {
        let mut p = StragglerPolicy::new(StragglerConfig {
            windows: 1,
            ..Default::default()
        });
        assert!(p.on_window(&window(1, 2.0, true))[0].flagged);
        // The attempt restarts: totals drop to a fresh count, all equal now.
        p.reset_totals();
        let c = p.on_window(&window(1, 1.0, true));
        assert!(c.iter().any(|c| c.who == "3" && !c.flagged), "{c:?}");
        // Too few steps in a window: not judged.
        let mut q = StragglerPolicy::new(StragglerConfig::default());
        assert!(q.on_window(&window(0, 2.0, true)).is_empty());
    }
}
