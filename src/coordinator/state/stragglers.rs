//! Straggler nodes across attempts: seeded from the journal, confirmed when
//! flagged again after a restart, left out after a checkpoint.

use super::*;
use crate::policy::straggler::StragglerScope;

impl JobView {
    /// One straggler window: flag or clear ranks and nodes, confirm a node
    /// flagged in an earlier attempt too, ask for a checkpoint, and leave a
    /// confirmed node out (after that checkpoint, if one is under way).
    pub(super) fn straggler_window(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let totals: Vec<Totals> = self
            .live()
            .filter(|(_, e)| e.report.state == RankState::Running)
            .map(|(r, e)| Totals {
                rank: *r,
                node: e.report.node.clone(),
                intervals: e.report.intervals,
                compute: e.report.compute,
            })
            .collect();
        let mut ask = false;
        let mut exclude_now = false;
        for c in self.straggler.on_window(&totals) {
            let confirmed = c.scope == StragglerScope::Node
                && c.flagged
                && self
                    .slow_nodes_by_attempt
                    .iter()
                    .any(|(a, ns)| *a < self.attempt && ns.contains(&c.node));
            if c.scope == StragglerScope::Node && c.flagged {
                self.slow_nodes_by_attempt
                    .entry(self.attempt)
                    .or_default()
                    .push(c.node.clone());
            }
            ask |= c.flagged;
            if confirmed
                && self.cfg.exclude_confirmed_stragglers
                && self.excluding.is_none()
                && self.failing.is_none()
            {
                let evidence = format!(
                    "{:.3}s per step against a median of {:.3}s ({}) for {} windows, in attempt {} and an earlier one",
                    c.value_s,
                    c.median_s,
                    match c.basis {
                        crate::policy::straggler::Basis::ComputeTime => "compute time",
                        crate::policy::straggler::Basis::StepInterval
                        | crate::policy::straggler::Basis::Unknown => "step interval",
                    },
                    c.windows,
                    self.attempt
                );
                self.excluding = Some((c.node.clone(), evidence));
                exclude_now = true;
            }
            out.push(journal(
                ev::Straggler {
                    scope: c.scope,
                    who: c.who.clone(),
                    straggler_node: c.node.clone(),
                    about_rank: (c.scope == StragglerScope::Rank)
                        .then(|| c.who.parse::<u32>().ok())
                        .flatten(),
                    flagged: c.flagged,
                    basis: c.basis,
                    value_s: c.value_s,
                    median_s: c.median_s,
                    ratio: c.ratio,
                    windows: c.windows,
                    confirmed_across_restart: confirmed,
                },
                true,
            ));
        }
        if ask && self.cfg.checkpoint_on_straggler && self.failing.is_none() {
            // (When one is under way already, the exclusion waits for it.)
            if let Ok((_, _, e)) = self.request_checkpoint("straggler", now) {
                out.extend(e);
            }
        }
        // Without a checkpoint to wait for, the node is left out at once.
        if exclude_now && self.pending.is_none() {
            self.exclude_straggler(None, now, out);
        }
        self.slowdown_window(&totals, now, out);
    }

    /// The job's step time against its baseline: a slowdown's start and
    /// end journaled, and its action (`[slowdown] action`) carried out.
    fn slowdown_window(&mut self, totals: &[Totals], now: Instant, out: &mut Vec<Effect>) {
        use crate::policy::slowdown::{Blame, SlowAction, SlowdownChange, SlowdownState};
        let Some(change) = self.slowdown.on_window(now, totals) else {
            return;
        };
        let action = self.cfg.slowdown.action;
        match change {
            SlowdownChange::Started {
                since,
                step_s,
                baseline_s,
                attribution,
            } => {
                let detail = format!(
                    "{step_s:.3}s per step against a baseline of {baseline_s:.3}s (+{:.0}%) for {:.0}s: {}",
                    100.0 * (step_s / baseline_s - 1.0),
                    now.saturating_duration_since(since).as_secs_f64(),
                    attribution.describe()
                );
                out.push(journal(
                    ev::Slowdown {
                        state: SlowdownState::Started,
                        step_s,
                        baseline_s,
                        ratio: Some(step_s / baseline_s),
                        slow_for_s: Some(now.saturating_duration_since(since).as_secs_f64()),
                        attribution: Some(attribution.kind),
                        ranks: Some(attribution.ranks.clone()),
                        straggler_node: attribution.node.clone(),
                        compute_ratio: attribution.compute_ratio,
                        action: Some(action),
                        detail: Some(detail.clone()),
                        ..Default::default()
                    },
                    true,
                ));
                let blamed = attribution
                    .node
                    .clone()
                    .filter(|_| matches!(attribution.kind, Blame::Rank | Blame::Node));
                if action == SlowAction::Exclude
                    && self.excluding.is_none()
                    && self.failing.is_none()
                {
                    if let Some(node) = blamed {
                        self.excluding = Some((node, format!("slowdown: {detail}")));
                    }
                }
                if action != SlowAction::Record && self.failing.is_none() {
                    if let Ok((_, _, e)) = self.request_checkpoint("slowdown", now) {
                        out.extend(e);
                    }
                }
                if self.excluding.is_some() && self.pending.is_none() {
                    self.exclude_straggler(None, now, out);
                }
            }
            SlowdownChange::Ended {
                step_s,
                baseline_s,
                lasted,
            } => out.push(journal(
                ev::Slowdown {
                    state: SlowdownState::Ended,
                    step_s,
                    baseline_s,
                    ratio: Some(step_s / baseline_s),
                    lasted_s: Some(lasted.as_secs_f64()),
                    ..Default::default()
                },
                true,
            )),
        }
    }

    /// Nodes flagged as stragglers in earlier attempts, from the journal
    /// (this view's host did not see them: a relaunch, a requeue).
    pub fn seed_from_journal(&mut self, records: &[crate::journal::Record]) {
        for (r, event) in crate::journal::events(records) {
            let crate::event::Event::Straggler(s) = event else {
                continue;
            };
            let node_flagged = s.scope == StragglerScope::Node && s.flagged;
            let (true, node) = (
                node_flagged && r.attempt < self.attempt,
                s.straggler_node.clone(),
            ) else {
                continue;
            };
            let e = self.slow_nodes_by_attempt.entry(r.attempt).or_default();
            if !e.contains(&node) {
                e.push(node);
            }
        }
    }

    /// Stop the step to leave a confirmed straggler node out of the next
    /// attempt (after the checkpoint, if one could be had).
    pub(super) fn exclude_straggler(
        &mut self,
        saved_step: Option<u64>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let Some((node, evidence)) = self.excluding.take() else {
            return;
        };
        if self.failing.is_some() {
            return;
        }
        let rank = self
            .ranks
            .iter()
            .find(|(_, e)| e.report.node == node)
            .map_or(u32::MAX, |(r, _)| *r);
        out.push(journal(
            ev::StragglerExclusion {
                straggler_node: node.clone(),
                about_rank: (rank != u32::MAX).then_some(rank),
                evidence: evidence.clone(),
                checkpoint_step: saved_step,
            },
            true,
        ));
        self.fail(
            rank,
            &node,
            format!("confirmed straggler node {node} left out: {evidence}"),
            None,
            now,
            out,
        );
    }

    /// Nodes flagged as stragglers in this attempt and an earlier one.
    pub fn confirmed_slow_nodes(&self) -> Vec<String> {
        let now = self
            .slow_nodes_by_attempt
            .get(&self.attempt)
            .cloned()
            .unwrap_or_default();
        now.into_iter()
            .filter(|n| {
                self.slow_nodes_by_attempt
                    .iter()
                    .any(|(a, ns)| *a < self.attempt && ns.contains(n))
            })
            .collect()
    }
}

#[cfg(test)]
mod straggler_exclusion_tests {
    use super::*;
    use crate::journal::{self, Writer};

    fn report(rank: u32, step: u64, compute_per_step: f64) -> Report {
        Report {
            v: VERSION,
            rank,
            node: format!("n{}", rank / 2),
            state: RankState::Running,
            step: Some(step),
            progress_age_s: Some(0.0),
            intervals: (step, step as f64 * 0.5),
            compute: (step, step as f64 * compute_per_step),
            attempt: 1,
            phase: "train".into(),
            ..Default::default()
        }
    }

    /// Attempt 1 of a 6-rank job on n0..n2 where rank 2 (on n1) computes
    /// twice as long; `flagged_before` says whether n1 was flagged in attempt 0.
    fn run(exclude: bool, flagged_before: bool) -> (JobView, Vec<Effect>) {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), "coordinator.jsonl", 0, None, None);
        let node = if flagged_before { "n1" } else { "n0" };
        w.write(
            ev::Straggler {
                scope: StragglerScope::Node,
                who: node.into(),
                straggler_node: node.into(),
                flagged: true,
                ..Default::default()
            },
            true,
        );
        let records = journal::read_job(dir.path()).unwrap().records;
        let t = Instant::now();
        let mut cfg = CoordinatorConfig::default();
        cfg.straggler.window = Duration::from_secs(5);
        cfg.straggler.windows = 2;
        cfg.exclude_confirmed_stragglers = exclude;
        let mut v = JobView::new("j", 6, 1, cfg, t);
        v.seed_from_journal(&records);
        let mut all = Vec::new();
        for k in 1..=4u64 {
            let now = t + Duration::from_secs(5 * k);
            for r in 0..6u32 {
                let mut x = report(r, 10 * k, if r == 2 { 0.8 } else { 0.4 });
                // Every rank saves the requested checkpoint once asked.
                if let Some(p) = &v.pending {
                    if 10 * k >= p.step {
                        x.checkpoints = vec![p.step];
                    }
                }
                all.extend(v.on_report(x, now));
            }
            all.extend(v.tick(now));
        }
        (v, all)
    }

    fn names(e: &[Effect]) -> Vec<&'static str> {
        e.iter()
            .map(|e| match e {
                Effect::Journal { event, .. } => event.kind(),
                Effect::Failed { .. } => "<failed>",
                Effect::CheckpointSettled { .. } => "<settled>",
            })
            .collect()
    }

    #[test]
    fn a_confirmed_straggler_node_is_left_out_after_the_checkpoint() {
        let (v, e) = run(true, true);
        let k = names(&e);
        let settled = k
            .iter()
            .position(|x| *x == "checkpoint_complete")
            .expect("checkpoint");
        let excl = k
            .iter()
            .position(|x| *x == "straggler_exclusion")
            .expect("exclusion");
        assert!(settled < excl, "{k:?}");
        assert!(k.contains(&"<failed>"), "{k:?}");
        let data = e
            .iter()
            .find_map(|e| match e {
                Effect::Journal { event, .. }
                    if matches!(**event, Event::StragglerExclusion(_)) =>
                {
                    Some((**event).clone().into_fields())
                }
                _ => None,
            })
            .unwrap();
        assert_eq!(data["straggler_node"], "n1");
        assert_eq!(data["about_rank"], 2);
        assert!(data["checkpoint_step"].as_u64().is_some(), "{data:?}");
        assert!(data["evidence"].as_str().unwrap().contains("compute time"));
        assert!(v
            .commands_for(0, 1, 0)
            .iter()
            .any(|c| matches!(c.kind, CommandKind::Stop { .. })));
    }

    #[test]
    fn an_unconfirmed_or_unconfigured_straggler_is_only_recorded() {
        for (exclude, before) in [(false, true), (true, false)] {
            let (v, e) = run(exclude, before);
            let k = names(&e);
            assert!(k.contains(&"straggler"), "{k:?}");
            assert!(!k.contains(&"straggler_exclusion"), "{k:?}");
            assert!(!k.contains(&"<failed>"), "{k:?}");
            assert!(!v
                .commands_for(0, 1, 0)
                .iter()
                .any(|c| matches!(c.kind, CommandKind::Stop { .. })));
        }
    }
}

#[cfg(test)]
mod slowdown_action_tests {
    use super::*;
    use crate::policy::slowdown::SlowAction;

    /// Four ranks on n0 and n1, 10 steps per 5 s window: 0.5 s per step,
    /// then from window 5 on 1 s per step, rank 3 (on n1) computing 0.9 s
    /// where it computed 0.4. Every rank saves a requested checkpoint.
    fn run(action: SlowAction) -> Vec<Effect> {
        let t = Instant::now();
        let mut cfg = CoordinatorConfig::default();
        cfg.straggler.window = Duration::from_secs(5);
        cfg.checkpoint_on_straggler = false;
        cfg.slowdown.threshold = 0.3;
        cfg.slowdown.sustain = Duration::from_secs(10);
        cfg.slowdown.baseline_windows = 4;
        cfg.slowdown.warmup_windows = 1;
        cfg.slowdown.action = action;
        let mut v = JobView::new("j", 4, 0, cfg, t);
        let mut totals = [((0u64, 0.0f64), (0u64, 0.0f64)); 4];
        let mut all = Vec::new();
        for k in 1..=9u64 {
            let now = t + Duration::from_secs(5 * k);
            let slow = k >= 5;
            for r in 0..4u32 {
                let (iv, cp) = &mut totals[r as usize];
                iv.0 += 10;
                iv.1 += 10.0 * if slow { 1.0 } else { 0.5 };
                cp.0 += 10;
                cp.1 += 10.0 * if slow && r == 3 { 0.9 } else { 0.4 };
                let mut x = Report {
                    v: VERSION,
                    rank: r,
                    node: format!("n{}", r / 2),
                    state: RankState::Running,
                    step: Some(10 * k),
                    progress_age_s: Some(0.0),
                    intervals: *iv,
                    compute: *cp,
                    attempt: 0,
                    phase: "train".into(),
                    ..Default::default()
                };
                if let Some(p) = &v.pending {
                    if 10 * k >= p.step {
                        x.checkpoints = vec![p.step];
                    }
                }
                all.extend(v.on_report(x, now));
            }
            all.extend(v.tick(now));
        }
        all
    }

    fn kinds(e: &[Effect]) -> Vec<&'static str> {
        e.iter()
            .map(|e| match e {
                Effect::Journal { event, .. } => event.kind(),
                Effect::Failed { .. } => "<failed>",
                Effect::CheckpointSettled { .. } => "<settled>",
            })
            .collect()
    }

    #[test]
    fn a_slowdown_blamed_on_one_node_asks_a_checkpoint_then_leaves_the_node_out() {
        let e = run(SlowAction::Exclude);
        let k = kinds(&e);
        let at = |kind: &str| {
            k.iter()
                .position(|x| *x == kind)
                .unwrap_or_else(|| panic!("no {kind}: {k:?}"))
        };
        assert!(at("slowdown") < at("checkpoint_requested"), "{k:?}");
        assert!(
            at("checkpoint_complete") < at("straggler_exclusion"),
            "{k:?}"
        );
        assert!(k.contains(&"<failed>"), "{k:?}");
        let s = e
            .iter()
            .find_map(|e| match e {
                Effect::Journal { event, .. } if matches!(**event, Event::Slowdown(_)) => {
                    Some((**event).clone().into_fields())
                }
                _ => None,
            })
            .unwrap();
        assert_eq!(s["attribution"], "rank", "{s:?}");
        assert_eq!(s["straggler_node"], "n1", "{s:?}");
        assert_eq!(s["action"], "exclude");
    }

    #[test]
    fn the_checkpoint_action_only_asks_for_a_checkpoint_and_record_does_nothing_more() {
        let k = kinds(&run(SlowAction::Checkpoint));
        assert!(
            k.contains(&"slowdown") && k.contains(&"checkpoint_requested"),
            "{k:?}"
        );
        assert!(
            !k.contains(&"straggler_exclusion") && !k.contains(&"<failed>"),
            "{k:?}"
        );
        let k = kinds(&run(SlowAction::Record));
        assert!(k.contains(&"slowdown"), "{k:?}");
        assert!(
            !k.contains(&"checkpoint_requested") && !k.contains(&"<failed>"),
            "{k:?}"
        );
    }
}
