//! The job-wide hang judgment: once every live rank has been probed (or
//! the wait ran out), who hung first; the others are its echoes.

use super::*;
use crate::policy::hang;

impl JobView {
    pub(super) fn judge_hang(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let Some(first) = self.failing.as_ref().map(|f| f.rank) else {
            return;
        };
        let views = self.rank_views();
        let finished = self
            .ranks
            .values()
            .filter(|e| e.report.exit.as_ref().is_some_and(|x| x.code == 0))
            .count();
        let unseen = (self.world_size as usize).saturating_sub(views.len() + finished) as u32;
        // Ranks that crashed at exit while the rest were found still at
        // work finished too (`exit_crash_over`).
        let (crashed_done, views): (Vec<RankView>, Vec<RankView>) = views
            .into_iter()
            .partition(|w| w.exited && self.finishing.contains(&w.rank));
        let mut v = hang::finishing(&views, finished + crashed_done.len())
            .unwrap_or_else(|| hang::judge(&views, self.step_tolerance(), unseen));
        if v.rule == hang::HangRule::Undetermined && self.busy_before(now) {
            // A rank was found working at a look since the job last
            // progressed, and the probes cannot tell now (ptrace refused):
            // its work may have ended at this very check (its evaluation
            // done, the others not yet released). Looked at again once, as
            // ranks between collectives are.
            v = hang::HangVerdict {
                rule: hang::HangRule::Between,
                reason: format!(
                    "a rank was found working at an earlier look with no progress since, and now {}: its work may have just ended; looked at again at the next stall",
                    v.reason
                ),
                ..v
            };
        }
        if v.rule.carries_on() {
            if self.carry_on_while_busy(now, &views, &v) {
                out.push(self.hang_record(&views, &v, first));
                return;
            }
            // Spent: the rules judge as if nobody worked, and the reason
            // says why.
            let mut past = hang::judge_again(&views, self.step_tolerance(), unseen);
            past.reason = if v.rule == hang::HangRule::Between {
                format!(
                    "looked at again with no progress since: {}; {}",
                    v.reason, past.reason
                )
            } else {
                let since = self
                    .busy_since
                    .map_or(0.0, |t| now.duration_since(t).as_secs_f64());
                let busy: Vec<String> = views
                    .iter()
                    .filter(|w| w.busy && !w.exited)
                    .take(16)
                    .map(|w| w.rank.to_string())
                    .collect();
                format!(
                    "the evaluation limit ({}) ran out: rank(s) {} worked without a word while others stalled, {since:.0}s in all; {}",
                    crate::duration::format(self.cfg.busy_limit),
                    busy.join(","),
                    past.reason
                )
            };
            v = past;
        }
        out.push(self.hang_record(&views, &v, first));
        let rank = v.blamed_ranks.first().copied().unwrap_or(first);
        let node = self
            .ranks
            .get(&rank)
            .map(|e| e.report.node.clone())
            .unwrap_or_default();
        let reason = format!("hang: {}", v.reason);
        self.fail(rank, &node, reason, Some(v), now, out);
    }

    /// Rank `rank`, stalled, stepped again (to `step`) before the hang was
    /// judged: the judgment ends there (a `hang` record of rule
    /// `progressed`), and the ranks still stalled carry on. A peer's
    /// evaluation that ended a moment after the stall limit otherwise had
    /// the healthy run torn down (trial 26).
    pub(super) fn stall_passed(&mut self, rank: u32, what: String, out: &mut Vec<Effect>) {
        let Some(first) = self.failing.as_ref().filter(|f| !f.judged).map(|f| f.rank) else {
            return;
        };
        let views = self.rank_views();
        let v = hang::progressed(&views, rank, &what);
        out.push(self.hang_record(&views, &v, first));
        self.carry_on(v.stalled_ranks, v.reason);
    }

    /// Nobody is hung: the judgment ends, and the `stalled` ranks carry on,
    /// watched, told `reason`.
    fn carry_on(&mut self, stalled: Vec<u32>, reason: String) {
        self.failing = None;
        if !stalled.is_empty() {
            self.push(stalled, CommandKind::CarryOn { reason });
        }
    }

    /// What the hang policy sees of each rank still in the hang: every rank
    /// but those that finished cleanly (one that exited after the hang began
    /// is judged on its progress).
    fn rank_views(&self) -> Vec<RankView> {
        let t0 = self.started;
        self.ranks
            .iter()
            .filter(|(_, e)| e.report.exit.as_ref().is_none_or(|x| x.code != 0))
            .map(|(r, e)| (r, e, e.lost && e.report.state != RankState::Exited))
            .map(|(r, e, lost)| (r, e, lost, e.probe_says()))
            .map(|(r, e, lost, p)| RankView {
                rank: *r,
                node: e.report.node.clone(),
                last_step: e.report.step,
                last_progress: e.last_step_at.map(|t| t.duration_since(t0).as_secs_f64()),
                stalled: e.report.state == RankState::Stalled
                    || e.report
                        .exit
                        .as_ref()
                        .is_some_and(|x| x.class == crate::event::Class::Hang),
                exited: e.report.state == RankState::Exited,
                // A lost rank's probe is as stale as its step.
                waiting_on_peer: p.waiting_on_peer.filter(|_| !lost),
                not_waiting_shown: p.not_waiting_shown && !lost,
                silent: e.report.silent,
                busy: p.busy && !lost,
                idle: p.idle && !lost,
                lost,
            })
            .collect()
    }

    /// How far apart two ranks' last steps may be and still count as the
    /// same moment: half the median step interval, at least 0.25 s.
    fn step_tolerance(&self) -> f64 {
        let intervals: Vec<f64> = self
            .ranks
            .values()
            .filter(|e| e.report.intervals.0 > 0)
            .map(|e| e.report.intervals.1 / e.report.intervals.0 as f64)
            .collect();
        median(intervals).map_or(0.5, |m| (0.5 * m).max(0.25))
    }

    /// The `hang` record: the verdict and every judged rank's evidence; past
    /// [`STATUS_RANKS`] ranks, the evidence of those worth a look (blamed,
    /// stalled, exited, not seen waiting on a peer), at most that many, and
    /// how many were left out (a job of 131,072 ranks would otherwise write
    /// a record of 15 MB, durably, while its ranks wait for the verdict).
    fn hang_record(&self, views: &[RankView], v: &hang::HangVerdict, first: u32) -> Effect {
        let listed: Vec<&RankView> = if views.len() <= STATUS_RANKS {
            views.iter().collect()
        } else {
            let worth = |w: &&RankView| {
                v.blamed_ranks.contains(&w.rank)
                    || w.rank == first
                    || w.stalled
                    || w.exited
                    || w.waiting_on_peer != Some(true)
            };
            let (mut blamed, others): (Vec<&RankView>, Vec<&RankView>) = views
                .iter()
                .filter(worth)
                .partition(|w| v.blamed_ranks.contains(&w.rank) || w.rank == first);
            blamed.extend(others);
            blamed.truncate(STATUS_RANKS);
            blamed.sort_by_key(|w| w.rank);
            blamed
        };
        let omitted = (views.len() - listed.len()) as u32;
        let ranks = listed
            .into_iter()
            .map(|w| ev::HangRank {
                rank: w.rank,
                node: w.node.clone(),
                last_step: w.last_step,
                last_progress_s: w.last_progress,
                stalled: w.stalled,
                exited: w.exited,
                waiting_on_peer: w.waiting_on_peer,
                silent: w.silent,
                // Only a probe about this stall is its evidence.
                probe: self
                    .ranks
                    .get(&w.rank)
                    .filter(|e| e.probe_fresh())
                    .and_then(|e| e.report.probe.clone()),
                ..Default::default()
            })
            .collect();
        journal(
            ev::Hang {
                verdict: v.into(),
                first_reported_by: first,
                ranks,
                ranks_omitted: (omitted > 0).then_some(omitted),
            },
            true,
        )
    }

    /// Nobody is hung: the stalled ranks wait for a working one. They carry
    /// on, watched, and the next stall is judged afresh, until the busy
    /// ranks have worked an evaluation's limit: from the first such verdict
    /// since the job last progressed (each evaluation of a long run has its
    /// own). False once that is spent.
    /// When the job last progressed (`None`: never).
    fn progressed_at(&self, now: Instant) -> Option<Instant> {
        self.job_progress_age(now)
            .map(|age| now.checked_sub(Duration::from_secs_f64(age)).unwrap_or(now))
    }

    /// A rank was found busy at a look since the job last progressed.
    fn busy_before(&self, now: Instant) -> bool {
        let progressed = self.progressed_at(now);
        self.busy_since
            .is_some_and(|since| progressed.is_none_or(|p| p <= since))
    }

    fn carry_on_while_busy(
        &mut self,
        now: Instant,
        views: &[RankView],
        v: &hang::HangVerdict,
    ) -> bool {
        let progressed = self.progressed_at(now);
        if v.rule == hang::HangRule::Between {
            // Once per progress: a second look between collectives with no
            // progress since is a hang in the ranks' own code.
            if self
                .between_at
                .is_some_and(|t| progressed.is_none_or(|p| p <= t))
            {
                return false;
            }
            self.between_at = Some(now);
        } else {
            let since = match self.busy_since {
                Some(since) if progressed.is_none_or(|p| p <= since) => since,
                _ => *self.busy_since.insert(now),
            };
            if now.saturating_duration_since(since) >= self.cfg.busy_limit {
                return false;
            }
        }
        let stalled: Vec<u32> = views.iter().filter(|w| w.stalled).map(|w| w.rank).collect();
        self.carry_on(stalled, v.reason.clone());
        true
    }
}
