//! A hang judged job-wide. When one rank stops, the others soon wait for it
//! at the next collective and stop too: every rank looks stalled. The rank
//! (and node) to blame is the one that stopped first. Pure: the coordinator
//! passes each rank's last progress and the evidence its agent gathered.
//!
//! Most ranks of a real job print nothing (only rank 0, or the last rank,
//! logs iterations). Such a *silent* rank is never judged by steps it does
//! not report: "never printed" is not evidence. Steps compare only ranks
//! that report them; everything else comes from the probes.
//!
//! Rules, in order:
//! 0. *Alone*: the only rank left to judge, when every other rank of the
//!    job finished cleanly (or the job has one rank), is blamed. A rank the
//!    coordinator never heard from keeps this rule from applying.
//! 1. *Behind*: among ranks that report steps, those whose last step is
//!    lower than the others' are blamed.
//! 2. *Stopped first*: among ranks that report steps, at the same step,
//!    those whose last progress is earlier than every other's by more than
//!    the tolerance.
//! 3. *Not waiting*: ranks (silent ones included) whose trainer was not
//!    waiting on a peer while others were; or, where the others' state is
//!    unknown, ranks shown not waiting (a stack in their own code, asleep,
//!    stopped): a rank proven not waiting is blamed over ranks nobody could
//!    read, never a rank shown waiting. The agents' probes say which:
//!    Python stacks (inside a `torch.distributed` collective or not)
//!    read by the built-in py-spy, else the system call each process is blocked
//!    in (`/proc/PID/task/*/syscall`: a socket read or poll is a peer), and
//!    the rank's recent output (NCCL watchdog, gloo and c10d timeouts, a lost
//!    peer). On GPUs, where NCCL spins instead of blocking, the stacks and
//!    the output can tell; the system call cannot.
//! 4. *Lost*: ranks whose agents went silent (marked lost) while every
//!    other rank is shown waiting on a peer. A lost rank's stale step and
//!    probe count in no rule before this one.
//! 5. *Undetermined*: nobody is blamed; the reason says what evidence was
//!    missing.
//!
//! Before all of them, *busy*: a rank not stalled, waiting on no peer, whose
//! trainer's CPU time moved over its probe works without a word (an
//! evaluation nobody announced) while others are shown waiting on a peer:
//! nobody is hung, the others wait for it. Where the probes cannot tell who
//! waits (ptrace refused), a stalled rank whose CPU time stood still on a
//! node without accelerators (a collective's wait blocks there) stands for
//! one shown waiting. (Where nobody is shown waiting or idle, as on GPUs
//! where NCCL spins and every rank burns CPU, it does not apply.)
//!
//! After *alone*, *working*: every live rank's probe read, none waiting on
//! a peer, and some shown in their own code with their CPU time moving:
//! the job is between collectives (a stall probed just as the evaluation
//! it waited for ended), nobody is hung. Both carry on within the
//! evaluation limit, and the next stall is judged afresh.

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
    /// Not waiting, shown by a stack outside any collective or a process
    /// asleep or stopped in its own code (running alone shows nothing:
    /// NCCL spins on a GPU).
    pub not_waiting_shown: bool,
    /// Reports no progress of its own (alive on the job's progress).
    pub silent: bool,
    /// Its trainer's CPU time moved over its probe, waiting on no peer:
    /// it works (an evaluation nobody announced), the others wait for it.
    pub busy: bool,
    /// Stalled with its CPU time still, where a collective's wait blocks
    /// (no accelerator) and the probe could not tell whether it waits:
    /// waiting or asleep, not working.
    pub idle: bool,
    /// Its agent went silent (the coordinator marked it lost): its last
    /// step is stale and its probe unknown. Its steps are not compared
    /// (a frozen agent's old step read as "behind" blamed a rank that
    /// trained on); it is blamed only when every other rank is shown
    /// waiting on a peer.
    pub lost: bool,
}

names! {
    /// The rule a hang verdict rests on (`hang.verdict.rule`).
    HangRule {
        /// A rank works without a word while the others wait: nobody is hung.
        Busy = "busy",
        /// No rank waits on a peer and some work in their own code: the
        /// stall is passing (a collective just left), nobody is hung.
        Working = "working",
        /// No rank waits on a peer, every one shown in its own code, none
        /// working: the wait just ended, looked at again once. (Also when
        /// the probes cannot tell, and a rank was found working at a look
        /// since the job last progressed: its work may have just ended.)
        Between = "between_collectives",
        /// A stalled rank stepped again before the judgment: the wait that
        /// stalled it is over.
        Progressed = "progressed",
        /// Every other rank finished: the stalled ones are finishing the run.
        Finishing = "finishing",
        /// The only rank heard from.
        Alone = "alone",
        /// Steps behind the others.
        Behind = "behind",
        /// Stopped stepping first.
        StoppedFirst = "stopped_first",
        /// Not waiting on a peer while others were.
        NotWaiting = "not_waiting",
        /// Gone silent while every other rank waits on a peer.
        Lost = "lost",
        /// No rank can be told from the others.
        Undetermined = "undetermined",
    }
}

impl HangRule {
    /// A verdict that nobody is hung (a peer busy, ranks working with
    /// nobody waiting, the rest finishing): the stalled ranks carry on.
    pub fn carries_on(self) -> bool {
        matches!(
            self,
            HangRule::Busy
                | HangRule::Working
                | HangRule::Between
                | HangRule::Progressed
                | HangRule::Finishing
        )
    }
}

/// The judgment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HangVerdict {
    pub rule: HangRule,
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
    judge_with(ranks, tolerance_s, unseen, true)
}

/// [`judge`] without the verdicts that let the run carry on (*busy*,
/// *working*, *between collectives*): once they are spent (the evaluation
/// limit ran out; a second look between collectives with no progress
/// since), the rules judge as if nobody worked.
pub fn judge_again(ranks: &[RankView], tolerance_s: f64, unseen: u32) -> HangVerdict {
    judge_with(ranks, tolerance_s, unseen, false)
}

fn judge_with(ranks: &[RankView], tolerance_s: f64, unseen: u32, carry_on: bool) -> HangVerdict {
    let stalled_ranks: Vec<u32> = ranks.iter().filter(|r| r.stalled).map(|r| r.rank).collect();
    let working: Vec<&RankView> = ranks
        .iter()
        .filter(|r| r.busy && !r.stalled && !r.exited && r.waiting_on_peer != Some(true))
        .collect();
    let (rule, blamed, reason) = if ranks.is_empty() {
        (
            HangRule::Undetermined,
            vec![],
            "no ranks reported".to_string(),
        )
    } else if carry_on
        && !working.is_empty()
        && ranks.iter().any(|r| {
            r.waiting_on_peer == Some(true) || r.stalled && r.idle && r.waiting_on_peer.is_none()
        })
    {
        // Evidence before a kill: a rank that works without a word while
        // the others wait is busy and silent, not hung.
        let reason = format!(
            "rank(s) {} are working without a word (their CPU time or their reads and writes move, they wait on no peer): busy and silent, the others wait for them; {}",
            list(&working),
            nobody_hung_unless_idle(ranks)
        );
        (HangRule::Busy, vec![], reason)
    } else if let [only] = ranks {
        alone(only, unseen)
    } else if let Some(found) = working_with_nobody_waiting(ranks).filter(|_| carry_on) {
        found
    } else {
        // Steps compare only the ranks that report them.
        let stepping: Vec<&RankView> = ranks
            .iter()
            .filter(|r| !r.silent && !r.lost && r.last_step.is_some())
            .collect();
        // The victim is never blamed: a rank its probe shows waiting on a
        // peer (a stack in a collective, a socket read) is no culprit,
        // whatever its steps say (a stray `step=200` in a path it printed).
        behind(&stepping)
            .and_then(blamable)
            .or_else(|| stopped_first(&stepping, tolerance_s).and_then(blamable))
            .unwrap_or_else(|| by_probes(ranks, tolerance_s))
    };
    let (rule, blamed, reason) = match (rule, lost_while_others_wait(ranks)) {
        (HangRule::Undetermined, Some(found)) => found,
        (rule, _) => (rule, blamed, reason),
    };
    let mut nodes: Vec<String> = blamed.iter().map(|r| r.node.clone()).collect();
    nodes.sort();
    nodes.dedup();
    HangVerdict {
        rule,
        blamed_ranks: blamed.iter().map(|r| r.rank).collect(),
        blamed_nodes: nodes,
        stalled_ranks,
        reason,
    }
}

/// Every rank left is stalled and every other one finished (exit 0, or an
/// exit-time crash after which the rest were found still at work): past
/// its last collective, a stalled rank is finishing the run (a last save,
/// an upload), not hung. `finished`: the ranks that finished so; `ranks`:
/// the others. `None` when some rank failed or still runs.
pub fn finishing(ranks: &[RankView], finished: usize) -> Option<HangVerdict> {
    if finished == 0 || ranks.is_empty() || !ranks.iter().all(|r| r.stalled && !r.exited) {
        return None;
    }
    let left: Vec<&RankView> = ranks.iter().collect();
    Some(HangVerdict {
        rule: HangRule::Finishing,
        blamed_ranks: vec![],
        blamed_nodes: vec![],
        stalled_ranks: ranks.iter().map(|r| r.rank).collect(),
        reason: format!(
            "every other rank has finished: rank(s) {} are past their last collective, finishing the run (a last save or upload); nobody is hung",
            list(&left)
        ),
    })
}

/// Rank `rank`, stalled, stepped again or worked again (`what`) before the judgment:
/// the collective it waited in let go (a peer's evaluation ended a moment
/// after its limit). Nobody is hung; the stalled ranks carry on.
pub fn progressed(ranks: &[RankView], rank: u32, what: &str) -> HangVerdict {
    HangVerdict {
        rule: HangRule::Progressed,
        blamed_ranks: vec![],
        blamed_nodes: vec![],
        stalled_ranks: ranks.iter().filter(|r| r.stalled).map(|r| r.rank).collect(),
        reason: format!(
            "rank {rank} {what} before the judgment: the wait that stalled it is over, nobody is hung"
        ),
    }
}

/// A rule's finding: its name, the ranks it blames, why.
type RuleFinding<'a> = (HangRule, Vec<&'a RankView>, String);

/// A finding without the ranks shown waiting on a peer (never a culprit);
/// `None` when none is left.
fn blamable(f: RuleFinding<'_>) -> Option<RuleFinding<'_>> {
    let (rule, blamed, reason) = f;
    let kept: Vec<&RankView> = blamed
        .into_iter()
        .filter(|r| r.waiting_on_peer != Some(true))
        .collect();
    (!kept.is_empty()).then_some((rule, kept, reason))
}

/// Every live rank's probe read, none waiting on a peer, and some shown in
/// their own code with their CPU time moving: the job is between
/// collectives, working. A stall's probe that lands as a long evaluation
/// ends finds the waiting rank just released and the evaluating one just
/// done, neither waiting (CI, s45). Nobody is hung: the stalled ranks carry
/// on and the next stall is judged afresh (a rank hung asleep is found
/// once the workers reach the collective it never joins). Running alone
/// shows nothing (NCCL spins on a GPU without stacks): a stack or a state
/// in the trainer's own code must show the work.
fn working_with_nobody_waiting(ranks: &[RankView]) -> Option<RuleFinding<'_>> {
    let live: Vec<&RankView> = ranks.iter().filter(|r| !r.exited).collect();
    if live.is_empty() {
        return None;
    }
    // Every rank in a collective, some having worked their way into it
    // during the probe (their CPU time moved; only reported so where a
    // collective's wait blocks, without accelerators): the probes, a
    // moment apart, caught the last rank joining a collective that then
    // completes (HF's `store_flos` after a one-sided evaluation, trial 26).
    let joined: Vec<&RankView> = live.iter().copied().filter(|r| r.busy).collect();
    if live.iter().all(|r| r.waiting_on_peer == Some(true)) && !joined.is_empty() {
        let reason = format!(
            "every rank was waiting on a peer and rank(s) {} worked their way into the collective during the probe (their CPU time moved): it was just joined; looked at again at the next stall (twice with no progress between is a hang)",
            list(&joined)
        );
        return Some((HangRule::Between, vec![], reason));
    }
    if live.iter().any(|r| r.waiting_on_peer != Some(false)) {
        return None;
    }
    let working: Vec<&RankView> = live
        .iter()
        .copied()
        .filter(|r| r.busy && r.not_waiting_shown)
        .collect();
    if working.is_empty() {
        // Every rank shown in its own code, none working, none waiting: the
        // probes, taken a second apart, each caught a rank between two
        // collectives (a sleep in its step, a data loader's wait), the wait
        // that stalled them just over. Looked at again once: a job-wide
        // hang in the ranks' own code (a lock every rank waits on) shows
        // the same at the next stall, with no progress between.
        if live.iter().all(|r| r.not_waiting_shown) {
            let reason = format!(
                "no rank was waiting on a peer and rank(s) {} were shown in their own code, none working: between collectives, the wait just over; looked at again at the next stall (twice with no progress between is a hang)",
                list(&live)
            );
            return Some((HangRule::Between, vec![], reason));
        }
        return None;
    }
    let reason = format!(
        "no rank was waiting on a peer and rank(s) {} were working in their own code (their CPU time moves): between collectives; {}",
        list(&working),
        nobody_hung_unless_idle(ranks)
    );
    Some((HangRule::Working, vec![], reason))
}

/// The end of a verdict that lets the run carry on: nobody is hung, unless
/// some rank was shown neither waiting on a peer nor working (asleep in its
/// own code, say): then it is looked at again once the work is done (the
/// workers then wait for it, and the next stall blames it).
fn nobody_hung_unless_idle(ranks: &[RankView]) -> String {
    let idle: Vec<&RankView> = ranks
        .iter()
        .filter(|r| !r.exited && !r.busy && r.waiting_on_peer == Some(false) && r.not_waiting_shown)
        .collect();
    if idle.is_empty() {
        "nobody is hung".to_string()
    } else {
        format!(
            "rank(s) {} neither wait on a peer nor work: looked at again at the next stall, once the work is done",
            list(&idle)
        )
    }
}

/// One rank heard from: blamed if it is the job's only one.
fn alone(only: &RankView, unseen: u32) -> RuleFinding<'_> {
    if unseen > 0 {
        let reason = format!(
            "rank {} is the only rank the coordinator heard from ({unseen} other rank(s) never reported): nobody blamed",
            only.rank
        );
        return (HangRule::Undetermined, vec![], reason);
    }
    let steps = match (only.silent, only.last_step) {
        (false, Some(s)) => format!("at step {s}"),
        _ => "(it reports no steps of its own)".to_string(),
    };
    let reason = format!(
        "rank {} stopped {steps} with no other rank still running to compare it with",
        only.rank
    );
    (HangRule::Alone, vec![only], reason)
}

/// Ranks gone silent while every other live rank is shown waiting on a
/// peer: the ones the others wait for.
fn lost_while_others_wait(ranks: &[RankView]) -> Option<RuleFinding<'_>> {
    let lost: Vec<&RankView> = ranks.iter().filter(|r| r.lost && !r.exited).collect();
    let others: Vec<&RankView> = ranks.iter().filter(|r| !r.lost && !r.exited).collect();
    if lost.is_empty()
        || others.is_empty()
        || others.iter().any(|r| r.waiting_on_peer != Some(true))
    {
        return None;
    }
    let reason = format!(
        "rank(s) {} went silent (their agents stopped reporting) while every other rank waits on a peer",
        list(&lost)
    );
    Some((HangRule::Lost, lost, reason))
}

/// The ranks at the lowest step, when others got further.
fn behind<'a>(stepping: &[&'a RankView]) -> Option<RuleFinding<'a>> {
    let min = stepping.iter().filter_map(|r| r.last_step).min()?;
    let max = stepping.iter().filter_map(|r| r.last_step).max()?;
    if min >= max {
        return None;
    }
    let behind: Vec<&RankView> = stepping
        .iter()
        .copied()
        .filter(|r| r.last_step == Some(min))
        .collect();
    let reason = format!(
        "rank(s) {} stopped at step {min} while others reached step {max}",
        list(&behind),
    );
    Some((HangRule::Behind, behind, reason))
}

/// At the same step: the ranks whose last step came first, by more than the
/// tolerance.
fn stopped_first<'a>(stepping: &[&'a RankView], tolerance_s: f64) -> Option<RuleFinding<'a>> {
    let timed: Vec<&RankView> = stepping
        .iter()
        .copied()
        .filter(|r| r.last_progress.is_some())
        .collect();
    if timed.len() < 2 {
        return None;
    }
    let earliest = timed
        .iter()
        .filter_map(|r| r.last_progress)
        .fold(f64::INFINITY, f64::min);
    let first: Vec<&RankView> = timed
        .iter()
        .copied()
        .filter(|r| r.last_progress.is_some_and(|t| t - earliest <= tolerance_s))
        .collect();
    if first.len() == timed.len() {
        return None;
    }
    let next = timed
        .iter()
        .filter_map(|r| r.last_progress)
        .filter(|t| t - earliest > tolerance_s)
        .fold(f64::INFINITY, f64::min);
    let reason = format!(
        "rank(s) {} made their last step {:.1}s before any other rank",
        list(&first),
        next - earliest
    );
    Some((HangRule::StoppedFirst, first, reason))
}

/// Nothing in the steps: the probes decide (a rank not waiting on a peer
/// while others are), or nobody is blamed.
fn by_probes(ranks: &[RankView], tolerance_s: f64) -> RuleFinding<'_> {
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
            "rank(s) {} were not waiting on a peer while {} other rank(s) were (in a collective, or blocked reading from a peer)",
            list(&not_waiting),
            waiting
        );
        return (HangRule::NotWaiting, not_waiting, reason);
    }
    let unknown: Vec<&RankView> = live
        .iter()
        .copied()
        .filter(|r| r.waiting_on_peer.is_none())
        .collect();
    // Shown not waiting while every other rank waits or cannot be read.
    let shown: Vec<&RankView> = not_waiting
        .iter()
        .copied()
        .filter(|r| r.not_waiting_shown)
        .collect();
    if !shown.is_empty()
        && !unknown.is_empty()
        && shown.len() + unknown.len() + waiting == live.len()
    {
        let reason = format!(
            "rank(s) {} were shown not waiting on a peer (in their own code) while the probes could not tell what rank(s) {} were doing{}",
            list(&shown),
            list(&unknown),
            if waiting > 0 {
                format!(" and {waiting} rank(s) were waiting")
            } else {
                String::new()
            }
        );
        return (HangRule::NotWaiting, shown, reason);
    }
    let evidence = if !unknown.is_empty() {
        format!(
            "the probes could not tell what rank(s) {} were doing (stacks need ptrace allowed: kernel.yama.ptrace_scope, the same user, a dumpable process or CAP_SYS_PTRACE)",
            list(&unknown)
        )
    } else if waiting == 0 {
        no_rank_waiting(&live)
    } else {
        "every rank was waiting on a peer".to_string()
    };
    let silent = ranks.iter().filter(|r| r.silent).count();
    // (A silent rank reports no steps of its own: it is not said to have
    // stopped.)
    let reason = if silent > 0 {
        format!(
            "none of the {} ranks progressed ({silent} of them report no steps) and {evidence}: nobody blamed",
            ranks.len()
        )
    } else {
        format!(
            "all {} ranks stopped at the same step within {tolerance_s:.1}s and {evidence}: nobody blamed",
            ranks.len()
        )
    };
    (HangRule::Undetermined, vec![], reason)
}

/// Why nobody waiting on a peer tells nothing, by what the probes showed:
/// ranks in their own code (not working), ranks merely running (no stack
/// read: NCCL ranks spinning on a GPU look so).
fn no_rank_waiting(live: &[&RankView]) -> String {
    let (shown, running): (Vec<&RankView>, Vec<&RankView>) =
        live.iter().copied().partition(|r| r.not_waiting_shown);
    let mut parts = Vec::new();
    if !shown.is_empty() {
        parts.push(format!(
            "rank(s) {} were shown outside any collective (in their own code, asleep or stopped) and not working",
            list(&shown)
        ));
    }
    if !running.is_empty() {
        parts.push(format!(
            "rank(s) {} were running with no stack to say where (as NCCL ranks spinning on a GPU look)",
            list(&running)
        ));
    }
    format!("no rank was waiting on a peer: {}", parts.join("; "))
}

/// The ranks, as `1,3` (up to [`LISTED`] of them, in the given order);
/// more as runs of consecutive ranks, at most [`LISTED`] runs and a count
/// (`0-911,16800-16807,... (131,071 ranks)`): a verdict over 131,072 ranks
/// would otherwise name every one of them in its reason, a record of a
/// megabyte.
fn list(rs: &[&RankView]) -> String {
    if rs.len() <= LISTED {
        return rs
            .iter()
            .map(|r| r.rank.to_string())
            .collect::<Vec<_>>()
            .join(",");
    }
    let mut ranks: Vec<u32> = rs.iter().map(|r| r.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for r in &ranks {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == *r => *end = *r,
            _ => runs.push((*r, *r)),
        }
    }
    let mut text: Vec<String> = runs
        .iter()
        .take(LISTED)
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    if runs.len() > LISTED {
        text.push("...".into());
    }
    format!("{} ({} ranks)", text.join(","), ranks.len())
}

/// How many ranks (or runs of ranks) a verdict's reason names.
const LISTED: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_names_a_few_ranks_each_and_many_as_runs_with_a_count() {
        let views = |ranks: &[u32]| -> Vec<RankView> {
            ranks
                .iter()
                .map(|r| RankView {
                    rank: *r,
                    ..Default::default()
                })
                .collect()
        };
        let text = |ranks: &[u32]| list(&views(ranks).iter().collect::<Vec<_>>());
        assert_eq!(text(&[3, 1]), "3,1");
        assert_eq!(
            text(&(0..16).collect::<Vec<_>>()),
            (0..16).map(|r| r.to_string()).collect::<Vec<_>>().join(",")
        );
        assert_eq!(text(&(0..17).collect::<Vec<_>>()), "0-16 (17 ranks)");
        let many: Vec<u32> = (0..131_072).filter(|r| *r != 65_536).collect();
        assert_eq!(text(&many), "0-65535,65537-131071 (131071 ranks)");
        let scattered: Vec<u32> = (0..100).map(|r| r * 2).collect();
        let t = text(&scattered);
        assert!(
            t.starts_with("0,2,4,") && t.ends_with(",30,... (100 ranks)"),
            "{t}"
        );
    }

    /// Trial 13: rank 0's agent froze at step 28 (marked lost) while its
    /// trainer trained on with the others to step 39; rank 2 then hung
    /// (asleep in its own code), ranks 1 and 3 wait on it. The stale step
    /// is no evidence: rank 2 is blamed, not rank 0.
    #[test]
    fn a_lost_ranks_stale_step_is_not_behind() {
        let mut frozen = view(0, Some(28), 10.0, None);
        frozen.lost = true;
        let mut hung = view(2, Some(39), 20.0, Some(false));
        hung.stalled = true;
        hung.not_waiting_shown = true;
        let ranks = vec![
            frozen.clone(),
            view(1, Some(39), 20.0, Some(true)),
            hung,
            view(3, Some(39), 20.0, Some(true)),
        ];
        let v = judge(&ranks, 0.5, 0);
        assert_eq!(v.rule, HangRule::NotWaiting, "{v:?}");
        assert_eq!(v.blamed_ranks, [2]);
        // Every other rank waits on a peer: the silent one is the cause.
        let ranks = vec![
            frozen,
            view(1, Some(39), 20.0, Some(true)),
            view(2, Some(39), 20.0, Some(true)),
        ];
        let v = judge(&ranks, 0.5, 0);
        assert_eq!(v.rule, HangRule::Lost, "{v:?}");
        assert_eq!(v.blamed_ranks, [0]);
    }

    fn view(rank: u32, step: Option<u64>, at: f64, waiting: Option<bool>) -> RankView {
        RankView {
            rank,
            node: format!("n{}", rank / 2),
            last_step: step,
            last_progress: step.map(|_| at),
            stalled: true,
            exited: false,
            waiting_on_peer: waiting,
            not_waiting_shown: waiting == Some(false),
            silent: false,
            busy: false,
            idle: false,
            lost: false,
        }
    }

    #[test]
    fn a_rank_stalled_after_every_other_one_finished_is_finishing() {
        let saving = view(0, Some(60), 10.0, Some(false));
        let v = finishing(std::slice::from_ref(&saving), 1).expect("finishing");
        assert_eq!(v.rule, HangRule::Finishing);
        assert!(v.blamed_ranks.is_empty());
        // Nobody finished: a hang like any other.
        assert!(finishing(std::slice::from_ref(&saving), 0).is_none());
        // Another rank failed, or still runs: judged as usual.
        let mut crashed = view(1, Some(60), 10.0, None);
        crashed.exited = true;
        assert!(finishing(&[saving.clone(), crashed], 1).is_none());
        let mut running = view(1, Some(60), 10.0, None);
        running.stalled = false;
        assert!(finishing(&[saving, running], 1).is_none());
    }

    #[test]
    fn the_only_rank_left_is_blamed() {
        let v = judge(&[view(3, Some(18), 5.0, None)], 0.5, 0);
        assert_eq!(v.rule, HangRule::Alone);
        assert_eq!(v.blamed_ranks, vec![3]);
        assert_eq!(v.blamed_nodes, vec!["n1".to_string()]);
        assert!(v.reason.contains("step 18"), "{}", v.reason);
        // A rank that never reported may be the one that hung: nobody blamed.
        let v = judge(&[view(3, Some(18), 5.0, None)], 0.5, 1);
        assert_eq!(v.rule, HangRule::Undetermined);
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
        assert_eq!(v.rule, HangRule::Behind);
        assert_eq!(v.blamed_ranks, vec![1]);
        assert_eq!(v.blamed_nodes, vec!["n0".to_string()]);
        assert_eq!(v.stalled_ranks, vec![0, 1, 2]);
        // Never printing a step is not being behind.
        let v = judge(
            &[view(0, Some(1), 1.0, Some(true)), view(1, None, 0.0, None)],
            0.5,
            0,
        );
        assert_eq!(v.rule, HangRule::Undetermined);
        assert!(
            v.reason.contains("could not tell what rank(s) 1"),
            "{}",
            v.reason
        );
    }

    #[test]
    fn a_rank_shown_waiting_is_never_blamed_for_its_steps() {
        // Rank 1 printed one stray `step=200` (a checkpoint path) and then
        // nothing; its stack waits in a broadcast. Rank 0 hung in its own
        // code at step 330. `behind` would blame rank 1: the probes win.
        let v = judge(
            &[
                view(0, Some(330), 100.0, Some(false)),
                view(1, Some(200), 10.0, Some(true)),
            ],
            0.5,
            0,
        );
        assert_eq!(v.blamed_ranks, vec![0], "{}", v.reason);
        assert_eq!(v.rule, HangRule::NotWaiting);
    }

    #[test]
    fn a_rank_working_without_a_word_while_the_others_wait_is_busy_not_hung() {
        // Rank 1 (silent) computes an evaluation nobody announced; rank 0
        // waits for it in a collective and reached its limit.
        let mut working = view(1, None, 0.0, Some(false));
        (working.silent, working.stalled, working.busy) = (true, false, true);
        let v = judge(
            &[view(0, Some(30), 10.0, Some(true)), working.clone()],
            0.5,
            0,
        );
        assert_eq!(v.rule, HangRule::Busy);
        assert!(v.blamed_ranks.is_empty(), "{}", v.reason);
        // Nobody shown waiting (NCCL spinning: every rank burns CPU, no
        // stack says where): no verdict that anybody works.
        let mut spinning = view(0, Some(30), 10.0, Some(false));
        (spinning.not_waiting_shown, spinning.busy) = (false, true);
        let mut spinning_too = working.clone();
        spinning_too.not_waiting_shown = false;
        let v = judge(&[spinning, spinning_too], 0.5, 0);
        assert_eq!(v.rule, HangRule::Undetermined, "{}", v.reason);
        // Not working (asleep in its own code): the usual evidence.
        working.busy = false;
        let v = judge(&[view(0, Some(30), 10.0, Some(true)), working], 0.5, 0);
        assert_eq!((v.rule, v.blamed_ranks), (HangRule::NotWaiting, vec![1]));
    }

    /// CI, s45: rank 1 of an HF Trainer computed 12 s alone while rank 0
    /// waited in the evaluation's collective; rank 0's third stall was
    /// probed as that ended: rank 0 just released, rank 1 just done, both
    /// in their own code, neither waiting. The healthy run was torn down
    /// as a hang nobody could be blamed for.
    #[test]
    fn ranks_working_between_collectives_with_nobody_waiting_are_not_hung() {
        let released = view(0, Some(25), 10.0, Some(false));
        let mut done = view(1, None, 0.0, Some(false));
        (done.silent, done.stalled, done.busy) = (true, false, true);
        let v = judge(&[released.clone(), done.clone()], 0.5, 0);
        assert_eq!(v.rule, HangRule::Working, "{}", v.reason);
        assert!(v.rule.carries_on());
        assert!(v.blamed_ranks.is_empty());
        assert!(v.reason.contains("rank(s) 1 were working"), "{}", v.reason);
        // Rank 0 was shown in its own code, not working: not said to be fine.
        assert!(
            v.reason
                .contains("rank(s) 0 neither wait on a peer nor work")
                && !v.reason.contains("nobody is hung"),
            "{}",
            v.reason
        );
        // A rank asleep while another works, nobody waiting: the worker
        // has not reached the collective yet; looked at again, not blamed.
        let mut asleep = released.clone();
        asleep.silent = true;
        assert_eq!(
            judge(&[asleep, done.clone()], 0.5, 0).rule,
            HangRule::Working
        );
        // Running with no stack to show where (NCCL spinning on a GPU):
        // no evidence of work, nobody blamed, and the reason says what the
        // probes saw.
        let mut spinning = done.clone();
        spinning.not_waiting_shown = false;
        let v = judge(&[released.clone(), spinning.clone()], 0.5, 0);
        assert_eq!(v.rule, HangRule::Undetermined, "{}", v.reason);
        assert!(
            v.reason
                .contains("rank(s) 0 were shown outside any collective")
                && v.reason.contains("rank(s) 1 were running with no stack"),
            "{}",
            v.reason
        );
        // A rank shown waiting: the busy rule's ground, not this one.
        let waiting = view(0, Some(25), 10.0, Some(true));
        assert_eq!(judge(&[waiting, done.clone()], 0.5, 0).rule, HangRule::Busy);
        // Every rank in a collective, one having worked its way into it
        // during the probe: just joined, looked at again.
        let mut joined = view(1, None, 0.0, Some(true));
        (joined.silent, joined.stalled, joined.busy) = (true, false, true);
        let v = judge(
            &[view(0, Some(25), 10.0, Some(true)), joined.clone()],
            0.5,
            0,
        );
        assert_eq!(v.rule, HangRule::Between, "{}", v.reason);
        assert!(
            v.reason.contains("rank(s) 1 worked their way into"),
            "{}",
            v.reason
        );
        // Nobody moved (a communication hang: gloo blocks): undetermined.
        joined.busy = false;
        let v = judge(&[view(0, Some(25), 10.0, Some(true)), joined], 0.5, 0);
        assert_eq!(v.rule, HangRule::Undetermined, "{}", v.reason);
        // A rank whose probe is missing may be the one waiting, or hung:
        // this rule does not guess.
        let unknown = view(2, Some(25), 10.0, None);
        assert_ne!(
            judge(&[released.clone(), done.clone(), unknown], 0.5, 0).rule,
            HangRule::Working
        );
        // Nobody working, every rank shown in its own code: the wait just
        // over, looked at again (once: the coordinator counts).
        let mut still = done;
        still.busy = false;
        let v = judge(&[released.clone(), still.clone()], 0.5, 0);
        assert_eq!(v.rule, HangRule::Between, "{}", v.reason);
        assert!(v.rule.carries_on());
        // Past that, judged without it: undetermined, and the reason says
        // what the probes showed, not GPUs.
        let v = judge_again(&[released, still], 0.5, 0);
        assert_eq!(v.rule, HangRule::Undetermined);
        assert!(!v.reason.contains("GPU"), "{}", v.reason);
        assert!(
            v.reason
                .contains("rank(s) 0,1 were shown outside any collective"),
            "{}",
            v.reason
        );
    }

    #[test]
    fn with_ptrace_refused_a_working_rank_while_a_stalled_one_idles_is_busy_not_hung() {
        // Nobody may read a stack or a system call. Rank 1 (silent) computes
        // an evaluation alone; rank 0 stalled with its CPU time still, on a
        // node without accelerators: it waits (or sleeps), it does not work.
        let mut working = view(1, None, 0.0, None);
        (working.silent, working.stalled, working.busy) = (true, false, true);
        let mut idle = view(0, Some(30), 10.0, None);
        idle.idle = true;
        let v = judge(&[idle.clone(), working.clone()], 0.5, 0);
        assert_eq!(v.rule, HangRule::Busy, "{}", v.reason);
        assert!(v.blamed_ranks.is_empty());
        // Its CPU time not known still (an accelerator's node, where NCCL
        // spins): the evidence is missing, nobody blamed, nothing held.
        idle.idle = false;
        let v = judge(&[idle.clone(), working.clone()], 0.5, 0);
        assert_eq!(v.rule, HangRule::Undetermined, "{}", v.reason);
        // Idle but shown not waiting (a stack in its own code): the stack
        // wins over the CPU time; nobody shown waiting, no busy verdict.
        idle.idle = true;
        idle.waiting_on_peer = Some(false);
        let v = judge(&[idle, working], 0.5, 0);
        assert_ne!(v.rule, HangRule::Busy, "{}", v.reason);
    }

    #[test]
    fn a_rank_shown_not_waiting_is_blamed_over_ranks_nobody_could_read() {
        // HF-like: only rank 0 prints; rank 1 asleep in its own code at
        // step 30, rank 0 waiting in a collective the probe could not read.
        let mut hung = view(1, None, 0.0, Some(false));
        hung.silent = true;
        let v = judge(&[view(0, Some(30), 10.0, None), hung.clone()], 0.5, 0);
        assert_eq!(v.rule, HangRule::NotWaiting);
        assert_eq!(v.blamed_ranks, vec![1], "{}", v.reason);
        assert!(
            v.reason.contains("could not tell what rank(s) 0"),
            "{}",
            v.reason
        );
        // Merely running shows nothing (NCCL spins on a GPU): nobody blamed,
        // least of all the rank that could not be read.
        hung.not_waiting_shown = false;
        let v = judge(&[view(0, Some(30), 10.0, None), hung.clone()], 0.5, 0);
        assert_eq!(v.rule, HangRule::Undetermined);
        assert!(v.blamed_ranks.is_empty());
        // A rank shown waiting is never blamed, whatever the others show.
        hung.not_waiting_shown = true;
        let v = judge(
            &[
                view(0, Some(30), 10.0, Some(true)),
                view(2, Some(30), 10.0, None),
                hung,
            ],
            0.5,
            0,
        );
        assert_eq!(v.blamed_ranks, vec![1], "{}", v.reason);
    }

    #[test]
    fn a_silent_rank_is_judged_by_its_probe_not_by_steps_it_never_reported() {
        // Real DDP, only rank 0 prints: rank 0 waits in all_reduce at step
        // 11, rank 1 (silent) hangs in its own code.
        let mut silent = view(1, None, 0.0, Some(false));
        silent.silent = true;
        let v = judge(
            &[view(0, Some(11), 50.0, Some(true)), silent.clone()],
            0.5,
            0,
        );
        assert_eq!(v.rule, HangRule::NotWaiting);
        assert_eq!(v.blamed_ranks, vec![1]);
        assert!(!v.reason.contains("never"), "{}", v.reason);
        // The printing rank hung; the silent one waits for it.
        let mut waiting = silent.clone();
        waiting.waiting_on_peer = Some(true);
        let v = judge(
            &[view(0, Some(11), 50.0, Some(false)), waiting.clone()],
            0.5,
            0,
        );
        assert_eq!(v.blamed_ranks, vec![0]);
        // Two printers stopped together with a silent culprit: steps do not
        // decide, the probe does.
        let ranks = [
            view(0, Some(11), 50.0, Some(true)),
            silent.clone(),
            view(2, Some(11), 50.1, Some(true)),
            waiting.clone(),
        ];
        assert_eq!(judge(&ranks, 0.5, 0).blamed_ranks, vec![1]);
        // No probe could tell: the verdict says so plainly.
        let mut unknown = silent;
        unknown.waiting_on_peer = None;
        let v = judge(&[view(0, Some(11), 50.0, None), unknown], 0.5, 0);
        assert_eq!(v.rule, HangRule::Undetermined);
        assert!(
            v.reason.contains("stacks need ptrace allowed"),
            "{}",
            v.reason
        );
        assert!(
            v.reason.contains("1 of them report no steps"),
            "{}",
            v.reason
        );
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
        assert_eq!(v.rule, HangRule::StoppedFirst);
        assert_eq!(v.blamed_ranks, vec![1]);
    }

    #[test]
    fn in_lockstep_the_rank_not_waiting_on_a_peer_is_blamed() {
        let ranks: Vec<RankView> = (0..4)
            .map(|r| view(r, Some(10), 100.0 + r as f64 * 0.01, Some(r != 1)))
            .collect();
        let v = judge(&ranks, 0.5, 0);
        assert_eq!(v.rule, HangRule::NotWaiting);
        assert_eq!(v.blamed_ranks, vec![1]);
        assert_eq!(v.blamed_nodes, vec!["n0".to_string()]);
    }

    #[test]
    fn without_evidence_nobody_is_blamed() {
        // GPUs: everyone spins in NCCL, nobody looks blocked (nor is shown
        // anywhere without stacks).
        let ranks: Vec<RankView> = (0..4)
            .map(|r| RankView {
                not_waiting_shown: false,
                ..view(r, Some(10), 100.0, Some(false))
            })
            .collect();
        let v = judge(&ranks, 0.5, 0);
        assert_eq!(v.rule, HangRule::Undetermined);
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
        assert_eq!(judge(&ranks, 0.5, 0).rule, HangRule::Undetermined);
    }
}
