//! The job-wide hang judgment: once every live rank has been probed (or
//! the wait ran out), who hung first; the others are its echoes.

use super::*;
use crate::policy::hang;

impl JobView {
    pub(super) fn judge_hang(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let Some(first) = self.failing.as_ref().map(|f| f.rank) else {
            return;
        };
        let t0 = self.started;
        let views: Vec<RankView> = self
            .ranks
            .iter()
            .filter(|(_, e)| {
                // A rank that exited after the hang began is judged on its
                // progress; one that finished cleanly is not part of it.
                e.report.exit.as_ref().is_none_or(|x| x.code != 0)
            })
            .map(|(r, e)| RankView {
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
                waiting_on_peer: e.report.waiting_on_peer,
                not_waiting_shown: e.report.not_waiting_shown,
                silent: e.report.silent,
                busy: e.report.busy,
                idle: e.report.idle,
            })
            .collect();
        let intervals: Vec<f64> = self
            .ranks
            .values()
            .filter(|e| e.report.intervals.0 > 0)
            .map(|e| e.report.intervals.1 / e.report.intervals.0 as f64)
            .collect();
        let tolerance = median(intervals).map_or(0.5, |m| (0.5 * m).max(0.25));
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
        let v = hang::finishing(&views, finished + crashed_done.len())
            .unwrap_or_else(|| hang::judge(&views, tolerance, unseen));
        let ranks = views
            .iter()
            .map(|w| ev::HangRank {
                rank: w.rank,
                node: w.node.clone(),
                last_step: w.last_step,
                last_progress_s: w.last_progress,
                stalled: w.stalled,
                exited: w.exited,
                waiting_on_peer: w.waiting_on_peer,
                silent: w.silent,
                probe: self.ranks.get(&w.rank).and_then(|e| e.report.probe.clone()),
                ..Default::default()
            })
            .collect();
        out.push(journal(
            ev::Hang {
                verdict: Some((&v).into()),
                first_reported_by: Some(first),
                ranks: Some(ranks),
            },
            true,
        ));
        if v.rule == "busy" || v.rule == "finishing" {
            let since = *self.busy_since.get_or_insert(now);
            if now.saturating_duration_since(since) < self.cfg.busy_limit {
                // Nobody is hung: the stalled ranks wait for a working one.
                // They carry on, watched; the next stall is judged afresh
                // (until the busy ranks have worked an evaluation's limit).
                let stalled: Vec<u32> =
                    views.iter().filter(|w| w.stalled).map(|w| w.rank).collect();
                self.failing = None;
                if !stalled.is_empty() {
                    self.push(
                        stalled,
                        CommandKind::CarryOn {
                            reason: v.reason.clone(),
                        },
                    );
                }
                return;
            }
        }
        let (rank, node) = match v.blamed_ranks.first() {
            Some(r) => (
                *r,
                self.ranks
                    .get(r)
                    .map(|e| e.report.node.clone())
                    .unwrap_or_default(),
            ),
            None => (
                first,
                self.ranks
                    .get(&first)
                    .map(|e| e.report.node.clone())
                    .unwrap_or_default(),
            ),
        };
        let reason = format!("hang: {}", v.reason);
        self.fail(rank, &node, reason, Some(v), now, out);
    }
}
