//! The live job for `resilio status`, `GET /v1/status` and `/metrics`.
//! Bounded at any size: a job of more than [`STATUS_RANKS`] ranks lists
//! only the ranks worth a look (not running, in a long phase, stragglers,
//! silent, lost), at most that many, and counts the others by state; a
//! checkpoint's rank lists are cut at as many, with their counts.

use super::*;

impl JobView {
    pub fn status(&self, now: Instant, unauthorized: u64) -> Status {
        let (sr, sn) = self.straggler.flagged();
        let mut by_state: BTreeMap<String, u32> = BTreeMap::new();
        let mut figures: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let (mut heard, mut slowest, mut rates) = (0u32, None::<u64>, Vec::new());
        let all = self.ranks.len() <= STATUS_RANKS;
        let mut ranks: Vec<RankStatus> = Vec::new();
        for (r, e) in self.ranks.iter() {
            heard += 1;
            let state = if e.lost {
                "lost".to_string()
            } else {
                format!("{:?}", e.report.state).to_lowercase()
            };
            *by_state.entry(state).or_default() += 1;
            let status = self.rank_status(*r, e, &sr, now);
            for name in ["tokens_per_s_device", "mfu", "loss"] {
                if let Some(v) = e.report.figures.get(name) {
                    figures.entry(name).or_default().push(*v);
                }
            }
            if let Some(s) = status.step {
                slowest = Some(slowest.map_or(s, |m: u64| m.min(s)));
            }
            rates.extend(status.steps_per_s);
            let worth_a_look = e.lost
                || e.report.state != RankState::Running
                || e.report.long_phase
                || e.report.silent
                || status.straggler;
            if (all || worth_a_look) && ranks.len() < STATUS_RANKS {
                ranks.push(status);
            }
        }
        let figure = |name: &str| figures.get(name).cloned().unwrap_or_default();
        let pending = self.pending.as_ref().map(|p| {
            let missing: Vec<u32> = self
                .live()
                .map(|(r, _)| *r)
                .filter(|r| !p.confirmed.contains_key(r))
                .collect();
            bounded(CheckpointStatus {
                id: p.id,
                step: p.step,
                reason: p.reason.clone(),
                confirmed: p.confirmed.keys().copied().collect(),
                missing,
                age_s: now.duration_since(p.asked).as_secs_f64(),
                confirmed_count: 0,
                missing_count: 0,
            })
        });
        Status {
            tokens_per_s: median(figure("tokens_per_s_device")).map(|t| t * self.world_size as f64),
            mfu: median(figure("mfu")),
            loss: figure("loss").first().copied(),
            job: self.job.clone(),
            attempt: self.attempt,
            world_size: self.world_size,
            uptime_s: now.duration_since(self.started).as_secs_f64(),
            step: slowest,
            steps_per_s: median(rates),
            ranks_heard: heard,
            ranks_omitted: heard - ranks.len() as u32,
            ranks_by_state: by_state,
            ranks,
            straggler_ranks: sr,
            straggler_nodes: sn,
            last_checkpoint: self.last_checkpoint.clone().map(bounded),
            pending_checkpoint: pending,
            restarts: self.restarts,
            stalls: self.stalls,
            unauthorized,
        }
    }

    fn rank_status(&self, rank: u32, e: &Entry, stragglers: &[String], now: Instant) -> RankStatus {
        let mean = |(n, s): (u64, f64)| (n > 0).then(|| s / n as f64);
        RankStatus {
            rank,
            node: e.report.node.clone(),
            state: e.report.state,
            step: e.report.step,
            steps_per_s: mean(e.report.intervals)
                .filter(|m| *m > 0.0)
                .map(|m| 1.0 / m),
            mean_step_s: mean(e.report.intervals),
            mean_compute_s: mean(e.report.compute),
            phase: e.report.phase.clone(),
            progress_age_s: e.last_step_at.map(|t| now.duration_since(t).as_secs_f64()),
            last_report_age_s: now.duration_since(e.heard).as_secs_f64(),
            straggler: stragglers.contains(&rank.to_string()),
            silent: e.report.silent,
            lost: e.lost,
            figures: e.report.figures.clone(),
        }
    }
}

/// A checkpoint's rank lists cut at [`STATUS_RANKS`], with their counts.
fn bounded(mut c: CheckpointStatus) -> CheckpointStatus {
    c.confirmed_count = c.confirmed.len();
    c.missing_count = c.missing.len();
    c.confirmed.truncate(STATUS_RANKS);
    c.missing.truncate(STATUS_RANKS);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rank: u32, state: RankState) -> Report {
        Report {
            v: VERSION,
            rank,
            node: format!("n{}", rank / 8),
            state,
            step: Some(10 + u64::from(rank % 3)),
            progress_age_s: Some(0.0),
            intervals: (10, 5.0),
            phase: "train".into(),
            ..Default::default()
        }
    }

    /// Trial 13: a lost rank was counted lost and listed `running`.
    #[test]
    fn a_lost_rank_is_listed_lost() {
        let t = Instant::now();
        let mut v = JobView::new("j", 2, 0, CoordinatorConfig::default(), t);
        v.on_report(report(0, RankState::Running), t);
        v.on_report(report(1, RankState::Running), t);
        let later = t + Duration::from_secs(45);
        v.on_report(report(0, RankState::Running), later);
        v.tick(later);
        let st = v.status(later, 0);
        assert_eq!(st.ranks_by_state.get("lost"), Some(&1), "{st:?}");
        let r1 = st.ranks.iter().find(|r| r.rank == 1).unwrap();
        assert!(r1.lost, "{r1:?}");
        assert!(!st.ranks[0].lost);
        assert!(crate::status::render_status(&st).contains("lost"));
    }

    #[test]
    fn a_large_job_lists_the_ranks_worth_a_look_and_counts_the_rest() {
        let t = Instant::now();
        let mut v = JobView::new("big", 1000, 0, CoordinatorConfig::default(), t);
        for rank in 0..1000 {
            v.on_report(
                Report {
                    long_phase: rank == 9,
                    ..report(rank, RankState::Running)
                },
                t,
            );
        }
        let (_, step, _) = v.request_checkpoint("test", t).unwrap();
        for rank in 0..600 {
            let r = report(rank, RankState::Running);
            v.on_report(
                Report {
                    checkpoints: vec![step],
                    long_phase: rank == 9,
                    ..r
                },
                t,
            );
        }
        // One rank finished (exit 0), one stalled.
        let exit = ExitInfo {
            class: crate::event::Class::Clean,
            ..Default::default()
        };
        v.on_report(
            Report {
                exit: Some(exit),
                ..report(13, RankState::Exited)
            },
            t,
        );
        v.on_report(report(11, RankState::Stalled), t);
        let st = v.status(t, 0);
        let listed: Vec<u32> = st.ranks.iter().map(|r| r.rank).collect();
        assert_eq!(listed, [9, 11, 13], "{listed:?}");
        assert_eq!((st.ranks_heard, st.ranks_omitted), (1000, 997));
        assert_eq!(st.ranks_by_state.get("running"), Some(&998));
        assert_eq!(st.ranks_by_state.get("stalled"), Some(&1));
        assert_eq!(st.ranks_by_state.get("exited"), Some(&1));
        assert_eq!(st.step, Some(10));
        let p = st.pending_checkpoint.expect("pending");
        assert_eq!((p.confirmed_count, p.missing_count), (600, 400));
        assert_eq!(
            (p.confirmed.len(), p.missing.len()),
            (STATUS_RANKS, STATUS_RANKS)
        );
        let text = crate::status::render_status(&v.status(t, 0));
        assert!(text.contains("ranks 1000/1000"), "{text}");
        assert!(text.contains("997 more ranks not listed"), "{text}");
        assert!(
            text.contains("waiting for ranks [600, 601") && text.contains("and 144 more"),
            "{text}"
        );
        assert!(text.lines().count() < 20, "{text}");
    }

    #[test]
    fn a_small_job_lists_every_rank() {
        let t = Instant::now();
        let mut v = JobView::new("small", 4, 0, CoordinatorConfig::default(), t);
        for rank in 0..4 {
            v.on_report(report(rank, RankState::Running), t);
        }
        let st = v.status(t, 0);
        assert_eq!(st.ranks.len(), 4);
        assert_eq!(st.ranks_omitted, 0);
        assert!(!crate::status::render_status(&st).contains("not listed"));
    }
}
