//! A hang judged job-wide. When one rank stops, the others soon wait for it
//! at the next collective and stop too: every rank looks stalled. The rank
//! (and node) to blame is the one that stopped first. Pure: the coordinator
//! passes each rank's last progress and the evidence its agent gathered.
//!
//! Rules, in order:
//! 0. *Alone*: the only rank left to judge, when every other rank of the
//!    job finished cleanly (or the job has one rank), is blamed. A rank the
//!    coordinator never heard from keeps this rule from applying.
//! 1. *Behind*: ranks whose last step is lower than the others' are blamed.
//! 2. *Stopped first*: at the same step, ranks whose last progress is
//!    earlier than every other rank's by more than the tolerance.
//! 3. *Not waiting*: at the same step and time (lockstep), ranks whose
//!    processes were not blocked on a peer (a network read or poll) while the
//!    others were. This comes from the agents' probe of the trainer's threads
//!    (`/proc/PID/task/*/syscall`); on GPUs, where NCCL spins instead of
//!    blocking, it says nothing, and rule 4 applies.
//! 4. *Undetermined*: nobody is blamed; every stalled rank is named.

use serde::Serialize;

/// What the coordinator knows about one rank when it judges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankView {
    pub rank: u32,
    pub node: String,
    pub last_step: Option<u64>,
    /// Seconds on a common clock when its last step was seen.
    pub last_progress: Option<f64>,
    /// Its agent judged it stalled.
    pub stalled: bool,
    /// Its trainer is gone (exit or stop): judged on what it did before.
    pub exited: bool,
    /// From the agent's probe: blocked on a peer (`Some(true)`), busy or
    /// blocked on something else (`Some(false)`), unknown (`None`).
    pub waiting_on_peer: Option<bool>,
}

/// The judgment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HangVerdict {
    /// alone | behind | stopped_first | not_waiting | undetermined
    pub rule: &'static str,
    pub blamed_ranks: Vec<u32>,
    pub blamed_nodes: Vec<String>,
    /// Every rank its agent called stalled (the other view).
    pub stalled_ranks: Vec<u32>,
    pub reason: String,
}

/// Judge. `tolerance_s`: how much earlier a last step must be to count as
/// "first" (the coordinator passes about one typical step interval).
/// `unseen`: ranks of the job neither in `ranks` nor finished cleanly (the
/// coordinator never heard from them).
pub fn judge(ranks: &[RankView], tolerance_s: f64, unseen: u32) -> HangVerdict {
    let stalled_ranks: Vec<u32> = ranks.iter().filter(|r| r.stalled).map(|r| r.rank).collect();
    let verdict = |rule, blamed: Vec<&RankView>, reason: String| {
        let mut nodes: Vec<String> = blamed.iter().map(|r| r.node.clone()).collect();
        nodes.sort();
        nodes.dedup();
        HangVerdict {
            rule,
            blamed_ranks: blamed.iter().map(|r| r.rank).collect(),
            blamed_nodes: nodes,
            stalled_ranks: stalled_ranks.clone(),
            reason,
        }
    };
    if ranks.is_empty() {
        return verdict("undetermined", vec![], "no ranks reported".into());
    }
    if let [only] = ranks {
        if unseen > 0 {
            let reason = format!(
                "rank {} is the only rank the coordinator heard from ({unseen} other rank(s) never reported): nobody blamed",
                only.rank
            );
            return verdict("undetermined", vec![], reason);
        }
        let reason = format!(
            "rank {} stopped at step {} with no other rank still running to compare it with",
            only.rank,
            only.last_step
                .map_or("none (never stepped)".into(), |s| s.to_string()),
        );
        return verdict("alone", vec![only], reason);
    }
    // A rank that never stepped is "behind" everyone that did.
    let key = |r: &RankView| r.last_step.map_or(0, |s| s + 1);
    let min = ranks.iter().map(key).min().unwrap_or(0);
    let max = ranks.iter().map(key).max().unwrap_or(0);
    if min < max {
        let behind: Vec<&RankView> = ranks.iter().filter(|r| key(r) == min).collect();
        let best = ranks.iter().filter_map(|r| r.last_step).max();
        let reason = format!(
            "rank(s) {} stopped at step {} while others reached step {}",
            list(&behind),
            behind[0]
                .last_step
                .map_or("none (never stepped)".into(), |s| s.to_string()),
            best.map_or("-".into(), |s| s.to_string())
        );
        return verdict("behind", behind, reason);
    }
    let times: Vec<f64> = ranks.iter().filter_map(|r| r.last_progress).collect();
    if times.len() == ranks.len() && ranks.len() > 1 {
        let earliest = times.iter().copied().fold(f64::INFINITY, f64::min);
        let first: Vec<&RankView> = ranks
            .iter()
            .filter(|r| r.last_progress.is_some_and(|t| t - earliest <= tolerance_s))
            .collect();
        if first.len() < ranks.len() {
            let next = ranks
                .iter()
                .filter_map(|r| r.last_progress)
                .filter(|t| t - earliest > tolerance_s)
                .fold(f64::INFINITY, f64::min);
            let reason = format!(
                "rank(s) {} made their last step {:.1}s before any other rank",
                list(&first),
                next - earliest
            );
            return verdict("stopped_first", first, reason);
        }
    }
    // Ranks gone without a probe (a peer's echo, say) cannot say: judge the
    // rest. A rank probed before it was stopped still counts.
    let live: Vec<&RankView> = ranks
        .iter()
        .filter(|r| !r.exited || r.waiting_on_peer.is_some())
        .collect();
    let not_waiting: Vec<&RankView> = live
        .iter()
        .copied()
        .filter(|r| r.waiting_on_peer == Some(false))
        .collect();
    let waiting = live
        .iter()
        .filter(|r| r.waiting_on_peer == Some(true))
        .count();
    if !not_waiting.is_empty() && waiting > 0 && not_waiting.len() < live.len() {
        let reason = format!(
            "all ranks stopped together; rank(s) {} were not waiting on a peer while {} rank(s) were blocked reading from one",
            list(&not_waiting),
            waiting
        );
        return verdict("not_waiting", not_waiting, reason);
    }
    verdict(
        "undetermined",
        vec![],
        format!(
            "all {} ranks stopped at the same step within {:.1}s and the probes cannot tell who waits for whom: nobody blamed",
            ranks.len(),
            tolerance_s
        ),
    )
}

fn list(rs: &[&RankView]) -> String {
    rs.iter()
        .map(|r| r.rank.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(rank: u32, step: Option<u64>, at: f64, waiting: Option<bool>) -> RankView {
        RankView {
            rank,
            node: format!("n{}", rank / 2),
            last_step: step,
            last_progress: step.map(|_| at),
            stalled: true,
            exited: false,
            waiting_on_peer: waiting,
        }
    }

    #[test]
    fn the_only_rank_left_is_blamed() {
        let v = judge(&[view(3, Some(18), 5.0, None)], 0.5, 0);
        assert_eq!(v.rule, "alone");
        assert_eq!(v.blamed_ranks, vec![3]);
        assert_eq!(v.blamed_nodes, vec!["n1".to_string()]);
        assert!(v.reason.contains("step 18"), "{}", v.reason);
        // A rank that never reported may be the one that hung: nobody blamed.
        let v = judge(&[view(3, Some(18), 5.0, None)], 0.5, 1);
        assert_eq!(v.rule, "undetermined");
        assert!(v.blamed_ranks.is_empty());
    }

    #[test]
    fn a_rank_behind_the_others_is_blamed() {
        let v = judge(
            &[
                view(0, Some(10), 100.0, None),
                view(1, Some(9), 99.0, None),
                view(2, Some(10), 100.0, None),
            ],
            0.5,
            0,
        );
        assert_eq!(v.rule, "behind");
        assert_eq!(v.blamed_ranks, vec![1]);
        assert_eq!(v.blamed_nodes, vec!["n0".to_string()]);
        assert_eq!(v.stalled_ranks, vec![0, 1, 2]);
        // Never stepped counts as behind.
        let v = judge(
            &[view(0, Some(1), 1.0, None), view(1, None, 0.0, None)],
            0.5,
            0,
        );
        assert_eq!(v.blamed_ranks, vec![1]);
    }

    #[test]
    fn at_the_same_step_the_first_to_stop_is_blamed() {
        let v = judge(
            &[
                view(0, Some(10), 100.0, None),
                view(1, Some(10), 97.0, None),
                view(2, Some(10), 100.1, None),
            ],
            0.5,
            0,
        );
        assert_eq!(v.rule, "stopped_first");
        assert_eq!(v.blamed_ranks, vec![1]);
    }

    #[test]
    fn in_lockstep_the_rank_not_waiting_on_a_peer_is_blamed() {
        let ranks: Vec<RankView> = (0..4)
            .map(|r| view(r, Some(10), 100.0 + r as f64 * 0.01, Some(r != 1)))
            .collect();
        let v = judge(&ranks, 0.5, 0);
        assert_eq!(v.rule, "not_waiting");
        assert_eq!(v.blamed_ranks, vec![1]);
        assert_eq!(v.blamed_nodes, vec!["n0".to_string()]);
    }

    #[test]
    fn without_evidence_nobody_is_blamed() {
        // GPUs: everyone spins in NCCL, nobody looks blocked.
        let ranks: Vec<RankView> = (0..4)
            .map(|r| view(r, Some(10), 100.0, Some(false)))
            .collect();
        let v = judge(&ranks, 0.5, 0);
        assert_eq!(v.rule, "undetermined");
        assert!(v.blamed_ranks.is_empty() && v.blamed_nodes.is_empty());
        assert_eq!(v.stalled_ranks.len(), 4);
        // A culprit already stopped still counts by its probe.
        let mut ranks: Vec<RankView> = (0..3)
            .map(|r| view(r, Some(10), 100.0, Some(r != 2)))
            .collect();
        ranks[2].exited = true;
        assert_eq!(judge(&ranks, 0.5, 0).blamed_ranks, vec![2]);
        // A missing probe: undetermined as well.
        let mut ranks: Vec<RankView> = (0..3)
            .map(|r| view(r, Some(10), 100.0, Some(true)))
            .collect();
        ranks[1].waiting_on_peer = None;
        assert_eq!(judge(&ranks, 0.5, 0).rule, "undetermined");
    }
}
