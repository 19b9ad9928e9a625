//! Coordinated checkpoints: one step for every rank, a little ahead of the
//! fastest; settled when every live rank confirms or the wait runs out;
//! periodic ones on the advised interval.

use super::*;

impl JobView {
    /// The periodic checkpoint interval in force.
    pub fn checkpoint_every(&self) -> Option<Duration> {
        self.periodic_every
    }

    /// Set (or clear) the periodic checkpoint interval. The first one comes
    /// `every` from now; a changed interval keeps the schedule's anchor (the
    /// last periodic checkpoint, or when the interval was first set), so a
    /// revised advice does not postpone a checkpoint that is already due.
    pub fn set_checkpoint_every(&mut self, every: Option<Duration>, now: Instant) {
        self.next_periodic = match (every, self.periodic_every, self.next_periodic) {
            (Some(new), Some(old), Some(next)) => Some(
                next.checked_sub(old)
                    .map_or(now, |anchor| anchor + new)
                    .max(now),
            ),
            (Some(new), ..) => Some(now + new),
            (None, ..) => None,
        };
        self.periodic_every = every;
    }

    /// Ask every rank for a checkpoint a little ahead of the fastest one.
    /// A request already pending is returned instead of a second one.
    pub fn request_checkpoint(
        &mut self,
        reason: &str,
        now: Instant,
    ) -> Result<(u64, u64, Vec<Effect>), String> {
        if let Some(p) = &self.pending {
            return Ok((p.id, p.step, Vec::new()));
        }
        if self.failing.is_some() {
            return Err("the attempt is failing; no checkpoint can be coordinated".into());
        }
        let live: Vec<&Entry> = self.live().map(|(_, e)| e).collect();
        let fastest = live.iter().filter_map(|e| e.report.step).max();
        let Some(fastest) = fastest else {
            return Err("no rank has made a step yet".into());
        };
        // Steps the fastest rank makes during the lead time, at least 2.
        let mean = median(
            live.iter()
                .filter(|e| e.report.intervals.0 > 0)
                .map(|e| e.report.intervals.1 / e.report.intervals.0 as f64)
                .collect(),
        );
        let lead = match mean {
            Some(m) if m > 0.0 => (self.cfg.checkpoint_lead.as_secs_f64() / m).ceil() as u64,
            _ => 2,
        }
        .clamp(2, MAX_LEAD);
        let step = fastest.saturating_add(lead);
        let id = self.next_id;
        self.next_id += 1;
        self.pending = Some(Pending {
            id,
            step,
            reason: reason.to_string(),
            asked: now,
            deadline: now + self.cfg.checkpoint_wait,
            confirmed: BTreeMap::new(),
            confirmed_live: 0,
        });
        self.push(
            Vec::new(),
            CommandKind::Checkpoint {
                id,
                step,
                reason: reason.to_string(),
            },
        );
        let effects = vec![journal(
            ev::CheckpointRequested {
                id: Some(id),
                step: Some(step),
                reason: reason.to_string(),
                fastest_step: Some(fastest),
                coordinated: Some(true),
                ..Default::default()
            },
            true,
        )];
        Ok((id, step, effects))
    }

    pub(super) fn settle_checkpoint(
        &mut self,
        now: Instant,
        timed_out: bool,
        out: &mut Vec<Effect>,
    ) {
        let Some(p) = &self.pending else { return };
        // Every live rank confirmed: counted as reports come (a report
        // costs the same at any size), the missing listed once, here.
        let complete = self.tally.live == p.confirmed_live && !p.confirmed.is_empty();
        if !complete && !timed_out {
            return;
        }
        let missing: Vec<u32> = self
            .ranks
            .iter()
            .filter(|(r, e)| RankFacts::of(e).live && !p.confirmed.contains_key(r))
            .map(|(r, _)| *r)
            .collect();
        let p = self.pending.take().expect("checked");
        let confirmed: Vec<u32> = p.confirmed.keys().copied().collect();
        let last = p
            .confirmed
            .values()
            .max()
            .copied()
            .unwrap_or(now)
            .duration_since(p.asked);
        let settled = ev::CheckpointSettled {
            id: p.id,
            step: p.step,
            reason: p.reason.clone(),
            confirmed_ranks: confirmed.clone(),
            missing_ranks: missing.clone(),
            request_to_last_confirmation_s: last.as_secs_f64(),
        };
        out.push(journal(
            if complete {
                Event::CheckpointComplete(settled)
            } else {
                Event::CheckpointIncomplete(settled)
            },
            true,
        ));
        if complete {
            self.checkpoints += 1;
        }
        self.last_checkpoint = Some(CheckpointStatus {
            confirmed_count: confirmed.len(),
            missing_count: missing.len(),
            id: p.id,
            step: p.step,
            reason: p.reason.clone(),
            confirmed,
            missing,
            age_s: 0.0,
        });
        out.push(Effect::CheckpointSettled {
            id: p.id,
            step: p.step,
            complete,
        });
        if self.excluding.is_some() {
            self.exclude_straggler(Some(p.step).filter(|_| complete), now, out);
        }
    }
}

#[cfg(test)]
mod periodic_tests {
    use super::*;

    #[test]
    fn an_advised_interval_drives_periodic_checkpoints() {
        let t = Instant::now();
        let cfg = CoordinatorConfig {
            checkpoint_advised: true,
            ..Default::default()
        };
        let mut v = JobView::new("j", 1, 0, cfg, t);
        let mut r = Report {
            v: VERSION,
            rank: 0,
            node: "n1".into(),
            state: RankState::Running,
            step: Some(10),
            progress_age_s: Some(0.0),
            phase: "train".into(),
            ..Default::default()
        };
        // The rank reports before each tick (else it would be lost).
        let mut at = |v: &mut JobView, secs: u64, step: u64, saved: Option<u64>| {
            r.step = Some(step);
            r.checkpoints = saved.into_iter().collect();
            let now = t + Duration::from_secs(secs);
            v.on_report(r.clone(), now);
            v.tick(now).iter().any(|e| {
                matches!(e, Effect::Journal { event, .. } if matches!(**event, Event::CheckpointRequested(_)))
            })
        };
        // Nothing advised yet: no periodic checkpoint, however long.
        assert!(!at(&mut v, 7200, 10, None));
        v.set_checkpoint_every(
            Some(Duration::from_secs(300)),
            t + Duration::from_secs(7200),
        );
        assert!(!at(&mut v, 7499, 11, None));
        assert!(at(&mut v, 7501, 12, None));
        // Saved; the next one is an interval later.
        let s = v.pending.as_ref().unwrap().step;
        assert!(!at(&mut v, 7502, s, Some(s)));
        assert!(v.pending.is_none());
        assert!(!at(&mut v, 7700, s + 1, Some(s)));
        assert!(at(&mut v, 7802, s + 2, Some(s)));
        let s = v.pending.as_ref().unwrap().step;
        assert!(!at(&mut v, 7803, s, Some(s)));
        // Revised advice keeps the anchor (7802): 7802 + 600, not 7900 + 600.
        v.set_checkpoint_every(
            Some(Duration::from_secs(600)),
            t + Duration::from_secs(7900),
        );
        assert!(!at(&mut v, 8401, s + 1, Some(s)));
        assert!(at(&mut v, 8403, s + 2, Some(s)));
        let s = v.pending.as_ref().unwrap().step;
        assert!(!at(&mut v, 8404, s, Some(s)));
        // A shorter interval that is already overdue fires at once.
        v.set_checkpoint_every(
            Some(Duration::from_secs(100)),
            t + Duration::from_secs(8600),
        );
        assert!(at(&mut v, 8600, s + 1, Some(s)));
        // Cleared: none any more.
        let s = v.pending.as_ref().unwrap().step;
        assert!(!at(&mut v, 8601, s, Some(s)));
        v.set_checkpoint_every(None, t + Duration::from_secs(8602));
        assert!(!at(&mut v, 20000, s + 1, Some(s)));
    }
}
