//! The coordinator's view of a job: every rank's latest report, the
//! commands issued, and the cross-rank decisions. Pure: reports and the
//! current `Instant` in, journal records, commands and host effects out.
//! The HTTP server (`server.rs`) and the hosts (the local launcher, the
//! batch-level supervisor, rank 0's agent) are the I/O around it.

use super::protocol::*;

mod checkpoints;
mod checks;
mod entry;
mod judge;
mod reports;
mod status;
mod stragglers;
mod tally;

use crate::event::{self as ev, Event};
use crate::policy::hang::{HangVerdict, RankView};
use crate::policy::straggler::{StragglerConfig, StragglerPolicy, Totals};
pub use checks::*;
use entry::Entry;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tally::{RankFacts, Ranks, Tally};

/// How long a rank's abort with no signature waits for the others to finish
/// before the step is torn down.
pub const EXIT_CRASH_GRACE: Duration = Duration::from_secs(10);

/// Coordinator parameters (config `[coordinator]` and `[straggler]`).
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinatorConfig {
    pub straggler: StragglerConfig,
    /// Ask for a checkpoint when a straggler is flagged (before any exclusion).
    pub checkpoint_on_straggler: bool,
    /// Exclude a straggling node once confirmed (flagged again after a
    /// restart): checkpoint, then stop the step so that the job-level
    /// supervisor relaunches it without the node. Off: record and report.
    pub exclude_confirmed_stragglers: bool,
    /// After the first stall, how long to wait for the other ranks' probes.
    pub hang_wait: Duration,
    /// How far ahead of the fastest rank a coordinated checkpoint is placed.
    pub checkpoint_lead: Duration,
    /// How long ranks have to confirm a coordinated checkpoint.
    pub checkpoint_wait: Duration,
    /// Periodic coordinated checkpoints (`None`: off).
    pub checkpoint_every: Option<Duration>,
    /// Periodic checkpoints at the interval the accounting advises (Daly,
    /// from the measured checkpoint cost and failure rate), set by the host
    /// with [`JobView::set_checkpoint_every`] as soon as both are known.
    pub checkpoint_advised: bool,
    /// A rank not heard from for this long is reported lost.
    pub lost_after: Duration,
    /// The job's step time against its own baseline (`[slowdown]`).
    pub slowdown: crate::policy::slowdown::SlowdownConfig,
    /// Observe mode: a failed attempt is journaled as what would have been
    /// done (`observed`), and no rank is stopped.
    pub observe: bool,
    /// How long ranks found busy and silent keep the others' stalls from
    /// being a hang (the evaluation limit, `[stall] eval_timeout`).
    pub busy_limit: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            straggler: StragglerConfig::default(),
            checkpoint_on_straggler: true,
            exclude_confirmed_stragglers: false,
            hang_wait: Duration::from_secs(15),
            checkpoint_lead: Duration::from_secs(2),
            checkpoint_wait: Duration::from_secs(120),
            checkpoint_every: None,
            checkpoint_advised: false,
            lost_after: Duration::from_secs(30),
            observe: false,
            busy_limit: Duration::from_secs(30 * 60),
            slowdown: Default::default(),
        }
    }
}

/// What the host must do besides journaling.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// A journal record for the coordinator's journal.
    Journal { event: Box<Event>, durable: bool },
    /// The attempt failed; a stop went to every rank. The host tears the
    /// step down (if it launched it) and decides on a restart.
    Failed {
        rank: u32,
        node: String,
        reason: String,
        hang: Option<HangVerdict>,
    },
    /// A coordinated checkpoint was confirmed by every live rank, or its wait ran out.
    CheckpointSettled { id: u64, step: u64, complete: bool },
}

fn journal(event: impl Into<Event>, durable: bool) -> Effect {
    Effect::Journal {
        event: Box::new(event.into()),
        durable,
    }
}

struct Pending {
    id: u64,
    step: u64,
    reason: String,
    asked: Instant,
    deadline: Instant,
    confirmed: BTreeMap<u32, Instant>,
    /// How many of the confirmed ranks are live ([`RankFacts::live`]): the
    /// checkpoint is complete when that is every live rank.
    confirmed_live: usize,
}

struct Failing {
    rank: u32,
    judge_by: Instant,
    judged: bool,
}

/// A rank that aborted with no signature of its own (torch's threads at
/// interpreter exit, once training is done): the others get until `until`
/// to finish, then are probed, their answers awaited until `probed_until`.
#[derive(Clone)]
struct ExitCrash {
    rank: u32,
    node: String,
    reason: String,
    until: Instant,
    probed_until: Option<Instant>,
}

/// The coordinator's state for one job.
pub struct JobView {
    pub job: String,
    cfg: CoordinatorConfig,
    world_size: u32,
    /// Ranks are below this: the world size, unless the host could not
    /// tell it ([`JobView::world_size_unknown`]).
    rank_limit: u32,
    attempt: u32,
    started: Instant,
    ranks: Ranks,
    /// The sums over `ranks` a report needs, kept as entries change.
    tally: Tally,
    commands: Vec<Command>,
    seq: u64,
    /// The seq of the latest probe asked for (a stall's, an exit crash's).
    probes_asked: u64,
    straggler: StragglerPolicy,
    /// Slowdowns against the job's own step time, this attempt.
    slowdown: crate::policy::slowdown::SlowdownWatch,
    next_window: Instant,
    /// Nodes flagged as stragglers in each attempt (confirmation across restarts).
    slow_nodes_by_attempt: BTreeMap<u32, Vec<String>>,
    pending: Option<Pending>,
    last_checkpoint: Option<CheckpointStatus>,
    next_id: u64,
    next_periodic: Option<Instant>,
    /// The periodic interval in force (configured, or advised).
    periodic_every: Option<Duration>,
    failing: Option<Failing>,
    failed_at: Option<Instant>,
    /// When a rank was first found busy and silent while others stalled,
    /// since the job last progressed (an evaluation's limit counts from it).
    busy_since: Option<Instant>,
    /// When the ranks were last found between collectives (none waiting,
    /// none working): looked at again once, until the job progresses.
    between_at: Option<Instant>,
    /// A rank that aborted with no signature, given a moment before the
    /// step is torn down unless the others have finished.
    exit_crash: Option<ExitCrash>,
    /// Ranks that crashed at exit while the others were found still at
    /// work: finished, not failed (a later stall of the others is judged
    /// as finishing the run).
    pub(super) finishing: Vec<u32>,
    relaunch_measured: bool,
    /// A confirmed straggler node to exclude once the checkpoint settles: (node, evidence).
    excluding: Option<(String, String)>,
    pub restarts: u32,
    pub stalls: u64,
    pub checkpoints: u64,
    pub reports: u64,
    /// Batches of reports received from node relays.
    pub batches: u64,
    /// Reports and requests refused as out of range (400).
    pub rejected: u64,
    /// Time with at least one rank progressing, for the live ETTR estimate.
    progressing: Duration,
    last_tick: Option<(Instant, bool)>,
}

/// Change rank `rank`'s entry in place by `f`: the tally follows.
fn change_entry(
    tally: &mut Tally,
    pending: &mut Option<Pending>,
    rank: u32,
    e: &mut Entry,
    f: impl FnOnce(&mut Entry),
) {
    let before = RankFacts::of(e);
    f(e);
    retally(tally, pending, rank, Some(before), Some(RankFacts::of(e)));
}

/// A rank's facts changed: the tally, and the pending checkpoint's count
/// of live ranks among those that confirmed it.
fn retally(
    tally: &mut Tally,
    pending: &mut Option<Pending>,
    rank: u32,
    before: Option<RankFacts>,
    after: Option<RankFacts>,
) {
    tally.change(rank, before, after);
    let (was, is) = (
        before.is_some_and(|f| f.live),
        after.is_some_and(|f| f.live),
    );
    if let Some(p) = pending.as_mut().filter(|p| p.confirmed.contains_key(&rank)) {
        match (was, is) {
            (false, true) => p.confirmed_live += 1,
            (true, false) => p.confirmed_live -= 1,
            _ => {}
        }
    }
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(xs[xs.len() / 2])
}

impl JobView {
    pub fn new(
        job: &str,
        world_size: u32,
        attempt: u32,
        cfg: CoordinatorConfig,
        now: Instant,
    ) -> Self {
        JobView {
            job: job.to_string(),
            world_size,
            rank_limit: world_size,
            attempt,
            started: now,
            ranks: Ranks::default(),
            tally: Tally::default(),
            commands: Vec::new(),
            seq: 0,
            probes_asked: 0,
            straggler: StragglerPolicy::new(cfg.straggler.clone()),
            slowdown: crate::policy::slowdown::SlowdownWatch::new(cfg.slowdown.clone()),
            next_window: now + cfg.straggler.window,
            slow_nodes_by_attempt: BTreeMap::new(),
            pending: None,
            last_checkpoint: None,
            next_id: 1,
            next_periodic: cfg.checkpoint_every.map(|d| now + d),
            periodic_every: cfg.checkpoint_every,
            failing: None,
            failed_at: None,
            busy_since: None,
            between_at: None,
            exit_crash: None,
            finishing: Vec::new(),
            relaunch_measured: true,
            excluding: None,
            restarts: 0,
            stalls: 0,
            checkpoints: 0,
            reports: 0,
            batches: 0,
            rejected: 0,
            progressing: Duration::ZERO,
            last_tick: None,
            cfg,
        }
    }

    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Live ranks whose latest report came through a node relay.
    pub fn relayed_ranks(&self) -> usize {
        self.tally.relayed
    }

    /// Rank entries visited by walks over every rank since the view began:
    /// a report adds none (`tests/coordinator_work.rs` holds it), a tick,
    /// a judgment or a status walks them once.
    pub fn ranks_visited(&self) -> u64 {
        self.ranks.visited()
    }

    /// The latest command sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Commands for `rank` newer than `after`. A command to some ranks
    /// names only `rank` in the copy it gets (a probe of every other rank
    /// of a large job would otherwise go out whole in every reply).
    pub fn commands_for(&self, rank: u32, attempt: u32, after: u64) -> Vec<Command> {
        super::protocol::commands_for(&self.commands, rank, attempt, after)
    }

    /// Commands for any of `ranks` (ascending) newer than `after`, each
    /// naming only those of `ranks` it is for: what a node relay fans out.
    pub fn commands_for_ranks(&self, ranks: &[u32], attempt: u32, after: u64) -> Vec<Command> {
        let newer = self.commands.partition_point(|c| c.seq <= after);
        self.commands[newer..]
            .iter()
            .filter(|c| c.attempt == attempt)
            .filter_map(|c| {
                let mine = if c.ranks.is_empty() {
                    Vec::new()
                } else {
                    let m: Vec<u32> = ranks
                        .iter()
                        .copied()
                        .filter(|r| c.ranks.binary_search(r).is_ok())
                        .collect();
                    if m.is_empty() {
                        return None;
                    }
                    m
                };
                Some(Command {
                    seq: c.seq,
                    attempt: c.attempt,
                    ranks: mine,
                    kind: c.kind.clone(),
                })
            })
            .collect()
    }

    /// A node relay's batch: each report in range is taken as if it came
    /// alone; the others are refused (counted, the first one's reason
    /// kept). The reply holds the commands for the batch's ranks newer
    /// than the least any of them has seen, and each rank's job progress
    /// age.
    pub fn on_batch(&mut self, batch: BatchReport, now: Instant) -> (BatchReply, Vec<Effect>) {
        let mut effects = Vec::new();
        let mut reply = BatchReply::default();
        let mut ranks = Vec::with_capacity(batch.reports.len());
        let mut seen = u64::MAX;
        let mut attempt = None;
        self.batches += 1;
        for r in batch.reports {
            if let Err(e) = self.check_report(&r) {
                self.rejected += 1;
                reply.refused.get_or_insert(e.0);
                continue;
            }
            ranks.push(r.rank);
            seen = seen.min(r.commands_seen);
            attempt = attempt.max(Some(r.attempt));
            effects.extend(self.on_checked_report(r, true, now));
        }
        reply.job_progress_age_s = ranks
            .iter()
            .map(|r| self.job_progress_age_for(Some(*r), now))
            .collect();
        if let Some(a) = attempt {
            ranks.sort_unstable();
            ranks.dedup();
            reply.commands = self.commands_for_ranks(&ranks, a, seen);
        }
        (reply, effects)
    }

    /// Ask `ranks` for a probe: every probe taken before is no longer
    /// evidence (a rank answers anew, or says nothing).
    fn ask_probes(&mut self, ranks: Vec<u32>, reason: String) {
        self.push(ranks, CommandKind::Diagnose { reason });
        let asked = self.seq;
        self.probes_asked = asked;
        for (r, e) in self.ranks.iter_mut() {
            let answered = Entry::answers(&e.report, asked);
            if answered != e.probe_answered {
                change_entry(&mut self.tally, &mut self.pending, *r, e, |e| {
                    e.probe_answered = answered
                });
            }
        }
    }

    fn push(&mut self, mut ranks: Vec<u32>, kind: CommandKind) {
        // Sorted, so that `Command::for_rank` finds a rank by halving.
        ranks.sort_unstable();
        ranks.dedup();
        self.seq += 1;
        self.commands.push(Command {
            seq: self.seq,
            attempt: self.attempt,
            ranks,
            kind,
        });
    }

    /// This view starts a relaunch of a step that failed at `failed_at` (the
    /// previous attempt's supervisor is gone): the first step is timed from it.
    pub fn resume_after_failure(&mut self, failed_at: Instant, restarts: u32) {
        self.failed_at = Some(failed_at);
        self.relaunch_measured = false;
        self.restarts = restarts;
    }

    /// The host relaunched the step: a new attempt starts.
    pub fn new_attempt(&mut self, attempt: u32, now: Instant) -> Vec<Effect> {
        self.attempt = attempt;
        self.ranks.clear();
        self.tally.clear();
        self.failing = None;
        self.busy_since = None;
        self.between_at = None;
        self.pending = None;
        self.excluding = None;
        self.exit_crash = None;
        self.finishing.clear();
        self.restarts += 1;
        self.relaunch_measured = false;
        self.straggler.reset_totals();
        self.slowdown = crate::policy::slowdown::SlowdownWatch::new(self.cfg.slowdown.clone());
        self.next_window = now + self.cfg.straggler.window;
        vec![journal(
            ev::CoordinatorAttempt {
                restarts: self.restarts,
            },
            false,
        )]
    }

    fn live(&self) -> impl Iterator<Item = (&u32, &Entry)> {
        self.ranks
            .iter()
            .filter(|(_, e)| e.report.state != RankState::Exited && !e.lost)
    }

    /// Seconds since any live rank last made progress in this attempt. A
    /// rank in a long phase (a 45-minute evaluation on rank 0 while the
    /// others wait in a barrier) counts as progressing now: it is judged by
    /// that phase's own limit, and the silent ranks must outlast it.
    pub fn job_progress_age(&self, now: Instant) -> Option<f64> {
        self.job_progress_age_for(None, now)
    }

    /// [`Self::job_progress_age`] by the ranks other than `rank`: what a
    /// rank hears of the job in the replies to its reports (its own
    /// progress, seen here a report later than by its agent, must not look
    /// like a peer's).
    pub fn job_progress_age_for(&self, rank: Option<u32>, now: Instant) -> Option<f64> {
        let own = rank
            .and_then(|r| self.ranks.get(&r))
            .map(RankFacts::of)
            .unwrap_or_default();
        if self.tally.long_phase > usize::from(own.long_phase) {
            return Some(0.0);
        }
        self.tally
            .newest_progress(rank, |r| {
                self.ranks.get(&r).and_then(RankFacts::progress_of)
            })
            .map(|t| now.saturating_duration_since(t).as_secs_f64())
    }

    /// Rank `rank`'s entry is now `entry`: the tally follows (and a
    /// pending checkpoint's count of live confirmed ranks). Its new facts.
    fn set_entry(&mut self, rank: u32, entry: Entry) -> RankFacts {
        let after = RankFacts::of(&entry);
        let before = self.ranks.insert(rank, entry).map(|e| RankFacts::of(&e));
        retally(
            &mut self.tally,
            &mut self.pending,
            rank,
            before,
            Some(after),
        );
        after
    }

    fn fail(
        &mut self,
        rank: u32,
        node: &str,
        reason: String,
        hang: Option<HangVerdict>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        self.failing = Some(Failing {
            rank,
            judge_by: now,
            judged: true,
        });
        self.failed_at = Some(now);
        if self.cfg.observe {
            out.push(journal(
                ev::Observed {
                    would: format!("stop every rank of the attempt (rank {rank} on {node} first)"),
                    reason,
                },
                true,
            ));
            return;
        }
        out.push(journal(
            ev::Teardown {
                reason: reason.clone(),
                first_rank: Some(rank),
                about_node: Some(node.to_string()),
                ranks_left: None,
            },
            true,
        ));
        self.push(
            Vec::new(),
            CommandKind::Stop {
                reason: reason.clone(),
            },
        );
        out.push(Effect::Failed {
            rank,
            node: node.to_string(),
            reason,
            hang,
        });
    }

    /// Time-driven decisions: straggler windows, hang judgment, checkpoint
    /// deadlines and periodic checkpoints, lost ranks. Call about once a second.
    pub fn tick(&mut self, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        let progressing = self
            .live()
            .any(|(_, e)| e.report.state == RankState::Running);
        if let Some((t, was)) = self.last_tick {
            if was {
                self.progressing += now.saturating_duration_since(t);
            }
        }
        self.last_tick = Some((now, progressing));
        let ranks = &self.ranks;
        self.tally
            .compact(|r| ranks.get(&r).and_then(RankFacts::progress_of));

        if self
            .failing
            .as_ref()
            .is_some_and(|f| !f.judged && now >= f.judge_by)
        {
            self.judge_hang(now, &mut out);
        }
        if let Some(crash) = self.exit_crash.clone() {
            if self.failing.is_some() || self.live().next().is_none() {
                self.exit_crash = None;
            } else if now >= crash.until {
                self.exit_crash_over(crash, now, &mut out);
            }
        }
        if self.pending.as_ref().is_some_and(|p| now >= p.deadline) {
            self.settle_checkpoint(now, true, &mut out);
        }
        if now >= self.next_window {
            self.next_window = now + self.cfg.straggler.window;
            self.straggler_window(now, &mut out);
        }
        if let (Some(t), Some(every)) = (self.next_periodic, self.periodic_every) {
            if now >= t {
                self.next_periodic = Some(now + every);
                if self.failing.is_none() {
                    if let Ok((_, _, e)) = self.request_checkpoint("periodic", now) {
                        out.extend(e);
                    }
                }
            }
        }
        self.mark_lost(now, &mut out);
        out
    }

    /// A torn-down step whose only ranks left have gone silent: the attempt
    /// failed at least `silent_after` ago, some ranks have not exited, and
    /// none of those was heard from for `silent_after`. Their agents died
    /// with their nodes (or lost the network): srun would wait for Slurm to
    /// declare those nodes failed. The silent ranks and their nodes.
    pub fn only_silent_left(
        &self,
        now: Instant,
        silent_after: Duration,
    ) -> Option<Vec<(u32, String)>> {
        let torn_down = self.failing.as_ref().is_some_and(|f| f.judged);
        let since = self.failed_at?;
        if !torn_down || now.saturating_duration_since(since) < silent_after {
            return None;
        }
        let left: Vec<(u32, String, Instant)> = self
            .ranks
            .iter()
            .filter(|(_, e)| e.report.state != RankState::Exited)
            .map(|(r, e)| (*r, e.report.node.clone(), e.heard))
            .collect();
        let silent = !left.is_empty()
            && left
                .iter()
                .all(|(_, _, heard)| now.saturating_duration_since(*heard) >= silent_after);
        silent.then(|| left.into_iter().map(|(r, n, _)| (r, n)).collect())
    }

    /// Whether any rank has reported in this view (its step has started).
    pub fn heard_from_any(&self) -> bool {
        !self.ranks.is_empty()
    }

    /// Whether the step is over as far as the coordinator can tell: every
    /// rank below the world size has reported its exit, or has not been
    /// heard from for `silent_after` (a rank that never reported, since the
    /// view started). `Some(the silent ranks and their nodes)`, `None`
    /// while a rank is still heard from. What the one-prefix form's host
    /// waits for before it decides.
    pub fn step_over(&self, now: Instant, silent_after: Duration) -> Option<Vec<(u32, String)>> {
        let mut silent = Vec::new();
        for rank in 0..self.world_size {
            let (heard, node) = match self.ranks.get(&rank) {
                Some(e) if e.report.state == RankState::Exited => continue,
                Some(e) => (e.heard, e.report.node.clone()),
                None => (self.started, String::new()),
            };
            if now.saturating_duration_since(heard) < silent_after {
                return None;
            }
            silent.push((rank, node));
        }
        Some(silent)
    }

    /// Ranks not heard from for `lost_after`, once each.
    fn mark_lost(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let lost_after = self.cfg.lost_after;
        for (r, e) in self.ranks.iter_mut() {
            if !e.lost
                && e.report.state != RankState::Exited
                && now.duration_since(e.heard) >= lost_after
            {
                change_entry(&mut self.tally, &mut self.pending, *r, e, |e| e.lost = true);
                out.push(journal(
                    ev::RankLost {
                        about_rank: *r,
                        about_node: e.report.node.clone(),
                        silent_s: now.duration_since(e.heard).as_secs_f64(),
                    },
                    true,
                ));
            }
        }
    }

    /// The live ETTR estimate: time with ranks progressing over uptime.
    pub fn live_ettr(&self, now: Instant) -> f64 {
        let up = now.duration_since(self.started).as_secs_f64();
        if up <= 0.0 {
            0.0
        } else {
            (self.progressing.as_secs_f64() / up).min(1.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(rank: u32, step: u64, state: RankState) -> Report {
        Report {
            v: VERSION,
            rank,
            node: format!("n{}", rank / 2),
            state,
            step: Some(step),
            progress_age_s: Some(0.0),
            intervals: (step, step as f64 * 0.5),
            phase: "train".into(),
            ..Default::default()
        }
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

    fn view(now: Instant) -> JobView {
        JobView::new("j1", 4, 0, CoordinatorConfig::default(), now)
    }

    /// The journal records among `e` of `kind`, with their fields.
    fn records_of(e: Vec<Effect>, kind: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
        e.into_iter()
            .filter_map(|e| match e {
                Effect::Journal { event, .. } if event.kind() == kind => Some(event.into_fields()),
                _ => None,
            })
            .collect()
    }

    /// A job of two ranks, both running at `step` at `t`.
    /// A stalled rank's answer to the coordinator's latest ask: its look
    /// taken then (here, what its stall's probe showed).
    fn answer_stalled(v: &mut JobView, mut r: Report, now: Instant) -> Vec<Effect> {
        r.probe_seq = v.probes_asked;
        v.on_report(r, now)
    }

    fn two_running(step: u64, t: Instant) -> JobView {
        let mut v = JobView::new("j1", 2, 0, CoordinatorConfig::default(), t);
        for r in 0..2 {
            v.on_report(report(r, step, RankState::Running), t);
        }
        v
    }

    /// Rank `rank` was told to carry on by a command after seq `after`.
    fn told_to_carry_on(v: &JobView, rank: u32, after: u64) -> bool {
        v.commands_for(rank, 0, after)
            .iter()
            .any(|c| matches!(c.kind, CommandKind::CarryOn { .. }))
    }

    #[test]
    fn a_rank_not_heard_from_is_lost_once_and_heard_again_after_its_silence() {
        let t = Instant::now();
        let mut v = view(t);
        for r in 0..4 {
            v.on_report(report(r, 10, RankState::Running), t);
        }
        let s = |n: u64| t + Duration::from_secs(n);
        // Rank 1 goes quiet (a partition); the others report on.
        for r in [0, 2, 3] {
            v.on_report(report(r, 20, RankState::Running), s(29));
        }
        assert!(records_of(v.tick(s(29)), "rank_lost").is_empty());
        let lost = records_of(v.tick(s(30)), "rank_lost");
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert_eq!(
            (lost[0]["about_rank"].clone(), lost[0]["silent_s"].clone()),
            (json!(1), json!(30.0))
        );
        // Said once.
        assert!(records_of(v.tick(s(45)), "rank_lost").is_empty());
        // Back after 50 s of silence.
        let back = records_of(
            v.on_report(report(1, 30, RankState::Running), s(50)),
            "rank_heard_again",
        );
        assert_eq!(back.len(), 1, "{back:?}");
        assert_eq!(
            (back[0]["about_rank"].clone(), back[0]["silent_s"].clone()),
            (json!(1), json!(50.0))
        );
        assert!(records_of(
            v.on_report(report(1, 31, RankState::Running), s(51)),
            "rank_heard_again"
        )
        .is_empty());
    }

    #[test]
    fn an_abort_with_no_signature_gives_the_others_a_moment_to_finish() {
        let t = Instant::now();
        let abort = |rank| {
            let mut x = report(rank, 60, RankState::Exited);
            x.exit = Some(ExitInfo {
                code: 134,
                class: crate::event::Class::Unknown,
                cause: "killed by signal".into(),
                ..Default::default()
            });
            x
        };
        let mut v = JobView::new("j1", 2, 0, CoordinatorConfig::default(), t);
        for r in 0..2 {
            v.on_report(report(r, 60, RankState::Running), t);
        }
        // Rank 1 aborts at exit; rank 0 finishes within the grace: no teardown.
        assert!(kinds(&v.on_report(abort(1), t)).is_empty());
        assert!(kinds(&v.tick(t + Duration::from_secs(5))).is_empty());
        let mut done = report(0, 60, RankState::Exited);
        done.exit = Some(ExitInfo::default());
        v.on_report(done, t + Duration::from_secs(6));
        assert!(
            !kinds(&v.tick(t + EXIT_CRASH_GRACE + Duration::from_secs(1))).contains(&"<failed>")
        );
        // Rank 0 still running after the grace: it is probed; waiting on
        // its dead peer, the step is torn down.
        // (Each view's first command is its probe: seq 1.)
        let probed = |busy: bool| {
            let mut x = report(0, 60, RankState::Running);
            x.probed = true;
            x.probe_seq = 1;
            x.busy = busy;
            x.waiting_on_peer = Some(!busy);
            x
        };
        let late = t + EXIT_CRASH_GRACE + Duration::from_secs(1);
        let mut v = JobView::new("j1", 2, 0, CoordinatorConfig::default(), t);
        for r in 0..2 {
            v.on_report(report(r, 60, RankState::Running), t);
        }
        v.on_report(abort(1), t);
        assert!(!kinds(&v.tick(late)).contains(&"<failed>"), "probed first");
        assert!(v
            .commands_for(0, 0, 0)
            .iter()
            .any(|c| matches!(c.kind, CommandKind::Diagnose { .. })));
        v.on_report(probed(false), late);
        let e = v.tick(late + Duration::from_millis(100));
        assert_eq!(kinds(&e), vec!["teardown", "<failed>"]);
        // Working (a last save): left to finish, never torn down.
        let mut v = JobView::new("j1", 2, 0, CoordinatorConfig::default(), t);
        for r in 0..2 {
            v.on_report(report(r, 60, RankState::Running), t);
        }
        v.on_report(abort(1), t);
        v.tick(late);
        v.on_report(probed(true), late);
        for s in 0..120 {
            let e = v.tick(late + Duration::from_secs(s));
            assert!(!kinds(&e).contains(&"<failed>"), "{s}s: {:?}", kinds(&e));
        }
        // Asleep or writing a file (shown outside any collective): left too.
        let mut v = JobView::new("j1", 2, 0, CoordinatorConfig::default(), t);
        for r in 0..2 {
            v.on_report(report(r, 60, RankState::Running), t);
        }
        v.on_report(abort(1), t);
        v.tick(late);
        let mut asleep = probed(false);
        asleep.waiting_on_peer = Some(false);
        asleep.not_waiting_shown = true;
        v.on_report(asleep, late);
        assert!(!kinds(&v.tick(late + Duration::from_secs(30))).contains(&"<failed>"));
        // No answer at all (an agent that cannot probe): torn down when the
        // wait for the probes runs out.
        let mut v = JobView::new("j1", 2, 0, CoordinatorConfig::default(), t);
        for r in 0..2 {
            v.on_report(report(r, 60, RankState::Running), t);
        }
        v.on_report(abort(1), t);
        v.tick(late);
        let wait = CoordinatorConfig::default().hang_wait;
        let e = v.tick(late + wait + Duration::from_millis(1));
        assert_eq!(kinds(&e), vec!["teardown", "<failed>"]);
    }

    #[test]
    fn a_rank_that_finished_then_crashed_at_exit_leaves_the_others_to_finish() {
        let t = Instant::now();
        let finished = |rank, code| {
            let mut x = report(rank, 60, RankState::Exited);
            x.exit = Some(ExitInfo {
                code,
                class: crate::event::Class::Clean,
                cause: "killed by signal".into(),
                ..Default::default()
            });
            x
        };
        let mut v = JobView::new("j1", 2, 0, CoordinatorConfig::default(), t);
        for r in 0..2 {
            v.on_report(report(r, 60, RankState::Running), t);
        }
        // Rank 0 reported the end of training, then aborted at exit (134):
        // rank 1, still saving, is never torn down.
        assert!(kinds(&v.on_report(finished(0, 134), t)).is_empty());
        v.on_report(
            report(1, 60, RankState::Running),
            t + Duration::from_secs(20),
        );
        assert!(kinds(&v.tick(t + Duration::from_secs(30))).is_empty());
        // An abort with no say of its own, then a peer that finished: over.
        let mut v = JobView::new("j1", 3, 0, CoordinatorConfig::default(), t);
        for r in 0..3 {
            v.on_report(report(r, 60, RankState::Running), t);
        }
        let mut abort = report(2, 60, RankState::Exited);
        abort.exit = Some(ExitInfo {
            code: 134,
            class: crate::event::Class::Unknown,
            cause: "killed by signal".into(),
            ..Default::default()
        });
        v.on_report(abort, t);
        v.on_report(finished(0, 0), t + Duration::from_secs(1));
        v.on_report(
            report(1, 60, RankState::Running),
            t + Duration::from_secs(20),
        );
        assert!(kinds(&v.tick(t + Duration::from_secs(30))).is_empty());
    }

    #[test]
    fn a_crash_stops_every_rank_at_once() {
        let t = Instant::now();
        let mut v = view(t);
        for r in 0..4 {
            v.on_report(report(r, 10, RankState::Running), t);
        }
        let mut crash = report(2, 10, RankState::Exited);
        crash.exit = Some(ExitInfo {
            code: 1,
            class: crate::event::Class::UserError,
            cause: "exited with error".into(),
            ..Default::default()
        });
        let e = v.on_report(crash, t + Duration::from_millis(10));
        assert_eq!(kinds(&e), vec!["teardown", "<failed>"]);
        let cmds = v.commands_for(0, 0, 0);
        assert!(matches!(
            cmds.last().unwrap().kind,
            CommandKind::Stop { .. }
        ));
        // A rank stopped by that teardown is not a second failure.
        let mut echo = report(0, 10, RankState::Exited);
        echo.exit = Some(ExitInfo {
            code: 143,
            stopped: true,
            ..Default::default()
        });
        assert!(kinds(&v.on_report(echo, t + Duration::from_millis(20))).is_empty());
        // The relaunch is timed from the failure to the first new step.
        v.new_attempt(1, t + Duration::from_secs(1));
        // (at the step's own time: reported 0.5 s after it was made)
        let mut first = report(0, 11, RankState::Running);
        first.attempt = 1;
        first.progress_age_s = Some(0.5);
        let e = v.on_report(first, t + Duration::from_secs(3));
        match &e[0] {
            Effect::Journal { event, .. } => {
                let (kind, data) = (event.kind(), event.clone().into_fields());
                assert_eq!(kind, "relaunched");
                let s = data["failure_to_first_step_s"].as_f64().unwrap();
                assert!((s - 2.49).abs() < 1e-6, "{s}");
            }
            other => panic!("{other:?}"),
        }
        // Commands of the old attempt do not reach the new one.
        assert!(v.commands_for(0, 1, 0).is_empty());
    }

    #[test]
    fn a_torn_down_step_whose_only_ranks_left_are_silent_can_be_left() {
        let t = Instant::now();
        let quiet = Duration::from_secs(10);
        let mut v = view(t);
        for r in 0..4 {
            v.on_report(report(r, 10, RankState::Running), t);
        }
        // Nothing failed: silence alone is a matter for `lost_after`.
        assert_eq!(v.only_silent_left(t + Duration::from_secs(60), quiet), None);
        // Rank 2 crashes at t+1; ranks 0 and 3 are stopped and exit; rank 1
        // (its node died with its agent) is never heard from after t.
        let exited = |r: u32, code: i32, stopped: bool| {
            let mut x = report(r, 10, RankState::Exited);
            x.exit = Some(ExitInfo {
                code,
                stopped,
                class: crate::event::Class::Unknown,
                cause: "x".into(),
                ..Default::default()
            });
            x
        };
        let t1 = t + Duration::from_secs(1);
        v.on_report(exited(2, 1, false), t1);
        v.on_report(exited(0, 143, true), t1 + Duration::from_secs(1));
        // Rank 3 is still being stopped and reporting: not yet.
        v.on_report(
            report(3, 10, RankState::Running),
            t1 + Duration::from_secs(8),
        );
        assert_eq!(
            v.only_silent_left(t1 + Duration::from_secs(12), quiet),
            None
        );
        v.on_report(exited(3, 143, true), t1 + Duration::from_secs(13));
        // Teardown began 10 s ago, but rank 1 was heard 11 s ago: not before
        // the teardown is 10 s old.
        assert_eq!(v.only_silent_left(t1 + Duration::from_secs(9), quiet), None);
        assert_eq!(
            v.only_silent_left(t1 + Duration::from_secs(13), quiet),
            Some(vec![(1, "n0".to_string())])
        );
        // Everyone exited: srun ends by itself, nothing to leave.
        v.on_report(exited(1, 143, true), t1 + Duration::from_secs(14));
        assert_eq!(
            v.only_silent_left(t1 + Duration::from_secs(30), quiet),
            None
        );
    }

    #[test]
    fn the_step_is_over_when_every_rank_exited_or_went_silent() {
        let t = Instant::now();
        let quiet = Duration::from_secs(8);
        let s = |n: u64| t + Duration::from_secs(n);
        let mut v = view(t);
        // Rank 3 never reports: silent only once the view is 8 s old.
        for r in 0..3 {
            v.on_report(report(r, 10, RankState::Running), s(1));
        }
        assert_eq!(v.step_over(s(5), quiet), None);
        let exited = |r: u32| {
            let mut x = report(r, 10, RankState::Exited);
            x.exit = Some(ExitInfo {
                code: 1,
                ..Default::default()
            });
            x
        };
        v.on_report(exited(0), s(6));
        v.on_report(exited(2), s(6));
        // Rank 1 still reports (a trainer being stopped): not over, however old.
        v.on_report(report(1, 10, RankState::Running), s(20));
        assert_eq!(v.step_over(s(21), quiet), None);
        // Rank 1 exits; rank 3 was never heard from.
        v.on_report(exited(1), s(22));
        assert_eq!(v.step_over(s(22), quiet), Some(vec![(3, String::new())]));
        // A rank gone quiet with its node is silent after 8 s.
        let mut w = view(t);
        for r in 0..4 {
            w.on_report(report(r, 10, RankState::Running), s(1));
        }
        for r in [0, 2, 3] {
            w.on_report(exited(r), s(3));
        }
        assert_eq!(w.step_over(s(8), quiet), None);
        assert_eq!(w.step_over(s(9), quiet), Some(vec![(1, "n0".to_string())]));
        w.on_report(exited(1), s(10));
        assert_eq!(w.step_over(s(10), quiet), Some(Vec::new()));
    }

    #[test]
    fn a_rank_stalled_after_the_others_finished_is_finishing_its_run() {
        let t = Instant::now();
        let mut v = JobView::new("j1", 2, 0, CoordinatorConfig::default(), t);
        for r in 0..2 {
            v.on_report(report(r, 60, RankState::Running), t);
        }
        // Rank 1 completed; rank 0 writes its final save without a word
        // and stalls at its step limit: carried on, never torn down.
        let mut done = report(1, 60, RankState::Exited);
        done.exit = Some(ExitInfo::default());
        v.on_report(done, t + Duration::from_secs(1));
        let mut saving = report(0, 60, RankState::Stalled);
        saving.waiting_on_peer = Some(true);
        let e = v.on_report(saving.clone(), t + Duration::from_secs(21));
        assert_eq!(kinds(&e), vec!["stall_reported"], "{e:?}");
        let e = answer_stalled(&mut v, saving, t + Duration::from_secs(22));
        assert_eq!(kinds(&e), vec!["hang"], "{e:?}");
        let hang = records_of(e, "hang");
        assert_eq!(hang[0]["verdict"]["rule"], "finishing", "{hang:?}");
        assert!(told_to_carry_on(&v, 0, 0));
    }

    /// Trial 19: rank 1 was found busy in a long evaluation (the stall
    /// withdrawn); at the next stall it hung, asleep. Its report still
    /// carried that busy probe: the hang was withdrawn again at once, and
    /// caught a window later. A probe answers one ask only.
    #[test]
    fn a_probe_from_an_earlier_stall_is_no_evidence_about_this_one() {
        let t = Instant::now();
        let mut v = JobView::new("j1", 2, 0, CoordinatorConfig::default(), t);
        for r in 0..2 {
            v.on_report(report(r, 25, RankState::Running), t);
        }
        let stall = |at: u64| {
            let mut s0 = report(0, 25, RankState::Stalled);
            s0.waiting_on_peer = Some(true);
            s0.probed = true;
            s0.progress_age_s = Some(at as f64);
            s0
        };
        let answer = |seq: u64, busy: bool| {
            let mut x = report(1, 25, RankState::Running);
            x.probed = true;
            x.probe_seq = seq;
            x.busy = busy;
            x.waiting_on_peer = Some(false);
            x
        };
        let at = |s: u64| t + Duration::from_secs(s);
        // The evaluation: rank 1 found busy, the stall withdrawn.
        assert_eq!(
            kinds(&v.on_report(stall(20), at(20))),
            vec!["stall_reported"]
        );
        let ask = v.commands_for(1, 0, 0)[0].seq;
        assert!(kinds(&answer_stalled(&mut v, stall(20), at(20))).is_empty());
        let e = v.on_report(answer(ask, true), at(21));
        let hang = records_of(e, "hang");
        assert_eq!(hang[0]["verdict"]["rule"], "busy", "{hang:?}");
        v.on_report(report(0, 50, RankState::Running), at(40));
        // The next stall: rank 1's report still says busy, from the ask
        // before. Nothing is judged on it.
        assert_eq!(
            kinds(&v.on_report(stall(25), at(65))),
            vec!["stall_reported"]
        );
        let again = v.commands_for(1, 0, ask)[0].seq;
        assert!(again > ask);
        assert!(kinds(&answer_stalled(&mut v, stall(25), at(65))).is_empty());
        assert!(kinds(&v.on_report(answer(ask, true), at(65))).is_empty());
        assert!(kinds(&v.tick(at(66))).is_empty());
        // Its answer to this ask: asleep, not working. Blamed.
        let e = v.on_report(answer(again, false), at(66));
        assert_eq!(kinds(&e), vec!["hang", "teardown", "<failed>"]);
        let hang = records_of(e, "hang");
        assert_eq!(hang[0]["verdict"]["rule"], "not_waiting", "{hang:?}");
        assert_eq!(hang[0]["verdict"]["blamed_ranks"], serde_json::json!([1]));
    }

    /// An evaluation's limit counts from the first busy verdict since the
    /// job last progressed: a run evaluating for a few minutes every hour
    /// is never torn down for the evaluations of hours before (the limit
    /// once counted from the first busy verdict of the job).
    #[test]
    fn each_evaluation_has_its_own_limit() {
        let t = Instant::now();
        let cfg = CoordinatorConfig {
            busy_limit: Duration::from_secs(600),
            ..Default::default()
        };
        let mut v = JobView::new("j1", 2, 0, cfg, t);
        let at = |s: u64| t + Duration::from_secs(s);
        // Rank 0 prints steps; rank 1 is silent.
        let silent = |state| {
            let mut x = report(1, 0, state);
            (x.step, x.progress_age_s, x.silent) = (None, None, true);
            x
        };
        v.on_report(report(0, 25, RankState::Running), t);
        v.on_report(silent(RankState::Running), t);
        let mut asked = 0;
        // One stall of rank 0 while rank 1 evaluates, `since` seconds after
        // rank 0's last step at `last`: what the coordinator did.
        let mut stall = |v: &mut JobView, step: u64, last: Instant, now: Instant| {
            // Carried on before: watched on, then stalled again.
            let mut on = report(0, step, RankState::Running);
            let before = now - Duration::from_secs(15);
            on.progress_age_s = Some(before.duration_since(last).as_secs_f64());
            v.on_report(on, before);
            let mut s0 = report(0, step, RankState::Stalled);
            (s0.waiting_on_peer, s0.probed) = (Some(true), true);
            s0.progress_age_s = Some(now.duration_since(last).as_secs_f64());
            assert_eq!(kinds(&v.on_report(s0.clone(), now)), vec!["stall_reported"]);
            asked = v.commands_for(1, 0, asked)[0].seq;
            assert!(answer_stalled(v, s0, now).is_empty());
            let mut busy = silent(RankState::Running);
            (busy.probed, busy.probe_seq, busy.busy) = (true, asked, true);
            busy.waiting_on_peer = Some(false);
            v.on_report(busy, now)
        };
        // An evaluation on rank 1 every hour: ten stalls of rank 0, every
        // 30 s (five minutes), within the limit.
        for hour in 0..4u64 {
            let (h, step) = (hour * 3600, 25 + hour * 100);
            for s in 0..10u64 {
                let e = stall(&mut v, step, at(h), at(h + 30 + s * 30));
                assert_eq!(kinds(&e), vec!["hang"], "hour {hour}, stall {s}");
                assert_eq!(records_of(e, "hang")[0]["verdict"]["rule"], "busy");
            }
            // The evaluation ends: rank 0 steps on.
            v.on_report(report(0, step + 100, RankState::Running), at(h + 3600));
        }
        // One evaluation past its limit is still stopped.
        let last = at(4 * 3600);
        let mut end = Vec::new();
        let stopped = (0..25u64).find(|s| {
            end = stall(&mut v, 425, last, at(4 * 3600 + 30 + s * 30));
            kinds(&end).contains(&"<failed>")
        });
        assert_eq!(stopped.map(|s| s * 30), Some(600));
        // Judged as if nobody worked, and said so: never "nobody is hung".
        let hang = records_of(end, "hang");
        let reason = hang[0]["verdict"]["reason"].as_str().unwrap().to_string();
        assert_eq!(hang[0]["verdict"]["rule"], "not_waiting", "{reason}");
        assert!(
            reason.starts_with(
                "the evaluation limit (10m00s) ran out: rank(s) 1 worked without a word"
            ),
            "{reason}"
        );
        assert!(!reason.contains("nobody is hung"), "{reason}");
    }

    /// The stall of a rank just released from the collective it waited
    /// in, probed as the rank it waited for ends its evaluation: neither
    /// waits, the one works in its own code. Carried on, not torn down.
    #[test]
    fn a_stall_probed_as_the_evaluation_ends_carries_on() {
        let t = Instant::now();
        let mut v = two_running(25, t);
        let at = |s: u64| t + Duration::from_secs(s);
        let mut s0 = report(0, 25, RankState::Stalled);
        (s0.waiting_on_peer, s0.not_waiting_shown, s0.probed) = (Some(false), true, true);
        s0.progress_age_s = Some(20.0);
        assert_eq!(
            kinds(&v.on_report(s0.clone(), at(20))),
            vec!["stall_reported"]
        );
        let ask = v.commands_for(1, 0, 0)[0].seq;
        assert!(answer_stalled(&mut v, s0, at(20)).is_empty());
        let mut done = report(1, 25, RankState::Running);
        (done.probed, done.probe_seq, done.busy) = (true, ask, true);
        (done.waiting_on_peer, done.not_waiting_shown) = (Some(false), true);
        let e = v.on_report(done, at(21));
        assert_eq!(kinds(&e), vec!["hang"]);
        assert_eq!(records_of(e, "hang")[0]["verdict"]["rule"], "working");
        assert!(told_to_carry_on(&v, 0, ask));
    }

    /// Trial 28: rank 0's stall was declared as the barrier it waited in
    /// let go (its probe: not working, at the barrier), and it went into a
    /// save that prints nothing. Rank 1, probed a second later, waited in
    /// the next collective for it: rank 0 was blamed, a healthy run torn
    /// down. The stalled rank is asked too, and the judgment waits for its
    /// look of now (saving, working: its agent withdraws the stall).
    #[test]
    fn a_stalled_rank_is_judged_on_a_look_taken_beside_the_others() {
        let t = Instant::now();
        let at = |s: u64| t + Duration::from_secs(s);
        let stall = || {
            let mut s0 = report(0, 25, RankState::Stalled);
            (s0.waiting_on_peer, s0.probed) = (Some(false), true);
            s0.progress_age_s = Some(10.0);
            s0
        };
        let waiting = |ask: u64| {
            let mut r1 = report(1, 25, RankState::Running);
            (r1.probed, r1.probe_seq, r1.waiting_on_peer) = (true, ask, Some(true));
            r1.progress_age_s = Some(11.0);
            r1
        };
        let mut v = two_running(25, t);
        v.on_report(stall(), at(10));
        let ask = v.commands_for(0, 0, 0)[0].seq;
        // Rank 1's answer alone judges nothing: rank 0's is awaited.
        assert!(kinds(&v.on_report(waiting(ask), at(11))).is_empty());
        // Its answer: working in its own code; its agent withdrew the stall.
        let mut saving = report(0, 25, RankState::Running);
        (saving.waiting_on_peer, saving.not_waiting_shown) = (Some(false), true);
        (saving.probed, saving.busy) = (true, true);
        let e = answer_stalled(&mut v, saving, at(11));
        let hang = records_of(e, "hang");
        assert_eq!(hang[0]["verdict"]["rule"], "progressed", "{hang:?}");
        assert!(v.failing.is_none());
        // Its answer: still at the barrier, not working. Judged at once.
        let mut v = two_running(25, t);
        v.on_report(stall(), at(10));
        let ask = v.commands_for(0, 0, 0)[0].seq;
        assert!(kinds(&v.on_report(waiting(ask), at(11))).is_empty());
        let e = answer_stalled(&mut v, stall(), at(10));
        let hang = records_of(e, "hang");
        assert_eq!(hang[0]["verdict"]["rule"], "not_waiting", "{hang:?}");
        // Its answer never comes (its agent is stuck): judged at the wait's
        // end on its stall's probe, the others' answers beside it.
        let mut v = two_running(25, t);
        v.on_report(stall(), at(10));
        let ask = v.commands_for(0, 0, 0)[0].seq;
        assert!(kinds(&v.on_report(waiting(ask), at(11))).is_empty());
        let e = v.tick(at(10) + CoordinatorConfig::default().hang_wait);
        let hang = records_of(e, "hang");
        assert_eq!(hang[0]["verdict"]["rule"], "not_waiting", "{hang:?}");
    }

    /// A rank raised while its peer waited for it; the exception's
    /// unwinding outlasted the peer's step limit (a loaded node), so the
    /// peer stalled first. The crash, not a hang, is the failure: the
    /// judgment ends there (it waited for the stalled rank's answer, and
    /// came to "undetermined" after the teardown). A peer's echo (a lost
    /// connection) does not end it.
    #[test]
    fn a_crash_while_a_stall_is_judged_is_the_failure() {
        let t = Instant::now();
        let at = |s: u64| t + Duration::from_secs(s);
        let crash = |class| {
            let mut x = report(1, 25, RankState::Exited);
            x.exit = Some(ExitInfo {
                code: 1,
                class,
                cause: "RuntimeError: injected".into(),
                ..Default::default()
            });
            x
        };
        let mut v = two_running(25, t);
        let mut s0 = report(0, 25, RankState::Stalled);
        (s0.waiting_on_peer, s0.probed) = (Some(true), true);
        v.on_report(s0.clone(), at(10));
        let e = v.on_report(crash(crate::event::Class::Unknown), at(11));
        assert_eq!(kinds(&e), vec!["teardown", "<failed>"], "{e:?}");
        assert!(matches!(
            e[1],
            Effect::Failed {
                rank: 1,
                hang: None,
                ..
            }
        ));
        // A peer's echo: the judgment goes on, and follows the answers.
        let mut v = two_running(25, t);
        v.on_report(s0.clone(), at(10));
        let e = v.on_report(crash(crate::event::Class::Secondary), at(11));
        assert!(kinds(&e).is_empty(), "{e:?}");
        let e = answer_stalled(&mut v, s0, at(10));
        assert_eq!(kinds(&e)[0], "hang", "{e:?}");
    }

    /// CI, ptrace refused (no stacks, no system calls): rank 1 evaluated
    /// alone and was found working at three checks; its evaluation ended at
    /// the fourth, whose probes could tell nothing (rank 1 no longer
    /// working, rank 0 idle): the healthy run was torn down, nobody blamed.
    /// Looked at again once; the same again with no progress is a hang.
    #[test]
    fn probes_that_cannot_tell_after_a_busy_look_are_looked_at_again_once() {
        let t = Instant::now();
        let at = |s: u64| t + Duration::from_secs(s);
        let mut v = two_running(50, t);
        let check = |v: &mut JobView, now: u64, busy: bool| {
            let mut s0 = report(0, 50, RankState::Stalled);
            (s0.probed, s0.idle) = (true, true);
            s0.progress_age_s = Some(now as f64);
            v.on_report(s0.clone(), at(now));
            let ask = v.commands_for(1, 0, 0).last().unwrap().seq;
            answer_stalled(v, s0, at(now));
            let mut r1 = report(1, 50, RankState::Running);
            (r1.probed, r1.probe_seq, r1.busy) = (true, ask, busy);
            r1.progress_age_s = Some(now as f64);
            let e = v.on_report(r1, at(now));
            let mut back = report(0, 50, RankState::Running);
            back.progress_age_s = Some(now as f64 + 1.0);
            v.on_report(back, at(now + 1));
            e
        };
        let e = check(&mut v, 4, true);
        assert_eq!(records_of(e, "hang")[0]["verdict"]["rule"], "busy");
        let e = check(&mut v, 8, false);
        let hang = records_of(e.clone(), "hang");
        assert_eq!(kinds(&e), vec!["hang"], "{hang:?}");
        assert_eq!(hang[0]["verdict"]["rule"], "between_collectives");
        let e = check(&mut v, 12, false);
        assert_eq!(kinds(&e), vec!["hang", "teardown", "<failed>"]);
        let hang = records_of(e, "hang");
        assert_eq!(hang[0]["verdict"]["rule"], "undetermined", "{hang:?}");
        // Never found busy: a hang at once.
        let mut v = two_running(50, t);
        let e = check(&mut v, 4, false);
        assert_eq!(kinds(&e), vec!["hang", "teardown", "<failed>"]);
    }

    /// Trial 26: probes a second apart each caught a rank between two
    /// collectives (a sleep in its step), neither waiting nor working: the
    /// healthy run was torn down, twice, then stopped as a crash loop.
    /// Looked at again once; twice with no progress between is a hang.
    #[test]
    fn ranks_between_collectives_are_looked_at_again_once_per_progress() {
        let t = Instant::now();
        let mut v = two_running(5, t);
        let at = |s: u64| t + Duration::from_secs(s);
        let mut asked = 0;
        let mut check = |v: &mut JobView, step: u64, last: u64, now: u64| {
            let mut on = report(0, step, RankState::Running);
            on.progress_age_s = Some((now - 1 - last) as f64);
            v.on_report(on, at(now - 1));
            let mut s0 = report(0, step, RankState::Stalled);
            (s0.waiting_on_peer, s0.not_waiting_shown, s0.probed) = (Some(false), true, true);
            s0.progress_age_s = Some((now - last) as f64);
            v.on_report(s0.clone(), at(now));
            asked = v.commands_for(1, 0, asked)[0].seq;
            answer_stalled(v, s0, at(now));
            let mut r1 = report(1, step, RankState::Running);
            (r1.probed, r1.probe_seq) = (true, asked);
            (r1.waiting_on_peer, r1.not_waiting_shown) = (Some(false), true);
            r1.progress_age_s = Some((now - last) as f64);
            v.on_report(r1, at(now))
        };
        let e = check(&mut v, 5, 0, 11);
        assert_eq!(kinds(&e), vec!["hang"]);
        assert_eq!(
            records_of(e, "hang")[0]["verdict"]["rule"],
            "between_collectives"
        );
        // The job stepped on; the next evaluation does the same: again.
        for r in 0..2 {
            v.on_report(report(r, 10, RankState::Running), at(20));
        }
        let e = check(&mut v, 10, 20, 31);
        assert_eq!(kinds(&e), vec!["hang"]);
        // The same again with no progress since: a hang, nobody blamed.
        let e = check(&mut v, 10, 20, 42);
        assert_eq!(kinds(&e), vec!["hang", "teardown", "<failed>"]);
        let hang = records_of(e, "hang");
        assert_eq!(hang[0]["verdict"]["rule"], "undetermined", "{hang:?}");
        let reason = hang[0]["verdict"]["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("looked at again with no progress since"),
            "{reason}"
        );
    }

    /// Trial 26: rank 1's evaluation ended a moment after rank 0's stall
    /// limit; rank 0 stepped on while the others' probes were taken, and
    /// the healthy run was torn down (undetermined, or rank 0 blamed). A
    /// stalled rank's step ends the judgment.
    #[test]
    fn a_stalled_rank_stepping_again_ends_the_judgment() {
        let t = Instant::now();
        let mut v = two_running(25, t);
        let at = |s: u64| t + Duration::from_secs(s);
        let mut s0 = report(0, 25, RankState::Stalled);
        (s0.waiting_on_peer, s0.not_waiting_shown, s0.probed) = (Some(false), true, true);
        s0.progress_age_s = Some(10.0);
        assert_eq!(
            kinds(&v.on_report(s0.clone(), at(10))),
            vec!["stall_reported"]
        );
        let ask = v.commands_for(1, 0, 0)[0].seq;
        // Still stalled, at its step: nothing yet.
        assert!(kinds(&v.on_report(s0.clone(), at(10))).is_empty());
        // Its agent has not withdrawn the stall yet, but the step moved.
        let mut on = s0;
        (on.step, on.progress_age_s) = (Some(26), Some(0.1));
        let e = v.on_report(on, at(11));
        assert_eq!(kinds(&e), vec!["hang"]);
        let hang = records_of(e, "hang");
        assert_eq!(hang[0]["verdict"]["rule"], "progressed", "{hang:?}");
        assert!(told_to_carry_on(&v, 0, ask));
        // Rank 1's answer comes later: nothing is judged on it.
        let mut late = report(1, 25, RankState::Running);
        (late.probed, late.probe_seq) = (true, ask);
        late.waiting_on_peer = Some(false);
        assert!(kinds(&v.on_report(late, at(12))).is_empty());
        assert!(kinds(&v.tick(at(40))).is_empty());
        // Its agent withdrew the stall (its trainer works again, in a save
        // that prints nothing): the same.
        let mut v = JobView::new("j1", 2, 0, CoordinatorConfig::default(), t);
        for r in 0..2 {
            v.on_report(report(r, 25, RankState::Running), t);
        }
        let mut s0 = report(0, 25, RankState::Stalled);
        s0.progress_age_s = Some(10.0);
        v.on_report(s0, at(10));
        let mut back = report(0, 25, RankState::Running);
        back.progress_age_s = Some(11.0);
        let e = v.on_report(back, at(11));
        let hang = records_of(e, "hang");
        assert_eq!(hang[0]["verdict"]["rule"], "progressed", "{hang:?}");
        assert!(hang[0]["verdict"]["reason"]
            .as_str()
            .unwrap()
            .contains("found its trainer working again"));
        // A judged hang is not undone by a late step.
        let mut v = two_running(25, t);
        let mut s0 = report(0, 25, RankState::Stalled);
        (s0.waiting_on_peer, s0.probed) = (Some(true), true);
        v.on_report(s0.clone(), at(10));
        let ask = v.commands_for(1, 0, 0)[0].seq;
        answer_stalled(&mut v, s0.clone(), at(10));
        let mut hung = report(1, 25, RankState::Running);
        (hung.probed, hung.probe_seq) = (true, ask);
        (hung.waiting_on_peer, hung.not_waiting_shown) = (Some(false), true);
        assert_eq!(
            kinds(&v.on_report(hung, at(11))),
            vec!["hang", "teardown", "<failed>"]
        );
        s0.step = Some(26);
        assert!(kinds(&v.on_report(s0, at(12))).is_empty());
    }

    #[test]
    fn a_stall_asks_the_others_to_probe_and_blames_the_one_not_waiting() {
        let t = Instant::now();
        let mut v = view(t);
        for r in 0..4 {
            v.on_report(report(r, 10, RankState::Running), t);
        }
        // Reports carry the age of each rank's last progress: all at `t`.
        let mut s0 = report(0, 10, RankState::Stalled);
        s0.waiting_on_peer = Some(true);
        s0.progress_age_s = Some(30.0);
        let e = v.on_report(s0.clone(), t + Duration::from_secs(30));
        assert_eq!(kinds(&e), vec!["stall_reported"]);
        let diag = v.commands_for(1, 0, 0);
        assert!(matches!(diag[0].kind, CommandKind::Diagnose { .. }));
        // The stalled rank too: a look taken beside the others', its
        // stall's probe being a moment older (trial 28).
        assert_eq!(v.commands_for(0, 0, 0)[0].seq, diag[0].seq);
        assert!(answer_stalled(&mut v, s0, t + Duration::from_secs(30)).is_empty());
        for (r, waiting) in [(1, false), (2, true)] {
            let mut x = report(r, 10, RankState::Running);
            x.waiting_on_peer = Some(waiting);
            x.probe_seq = diag[0].seq;
            x.progress_age_s = Some(31.0);
            assert!(!kinds(&v.on_report(x, t + Duration::from_secs(31))).contains(&"hang"));
        }
        let mut x = report(3, 10, RankState::Running);
        x.waiting_on_peer = Some(true);
        x.probe_seq = diag[0].seq;
        x.progress_age_s = Some(31.0);
        let e = v.on_report(x, t + Duration::from_secs(31));
        assert_eq!(kinds(&e), vec!["hang", "teardown", "<failed>"]);
        match &e[2] {
            Effect::Failed { rank, hang, .. } => {
                assert_eq!(*rank, 1);
                assert_eq!(
                    hang.as_ref().unwrap().rule,
                    crate::policy::hang::HangRule::NotWaiting
                );
                assert_eq!(hang.as_ref().unwrap().stalled_ranks, vec![0]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_jobs_progress_keeps_silent_ranks_alive_through_a_long_phase() {
        let t = Instant::now();
        let mut v = view(t);
        let mut r0 = report(0, 10, RankState::Running);
        r0.progress_age_s = Some(0.0);
        v.on_report(r0.clone(), t);
        assert_eq!(v.job_progress_age(t + Duration::from_secs(5)), Some(5.0));
        // Rank 0 evaluates for 45 minutes: its own limit judges it.
        r0.long_phase = true;
        r0.progress_age_s = Some(60.0);
        v.on_report(r0.clone(), t + Duration::from_secs(60));
        assert_eq!(v.job_progress_age(t + Duration::from_secs(2700)), Some(0.0));
        // Back to steps that stopped: the age counts again.
        r0.long_phase = false;
        r0.progress_age_s = Some(0.0);
        v.on_report(r0, t + Duration::from_secs(2700));
        assert_eq!(
            v.job_progress_age(t + Duration::from_secs(2710)),
            Some(10.0)
        );
        // Rank 0 hears of the others' progress only: none but its own.
        assert_eq!(
            v.job_progress_age_for(Some(0), t + Duration::from_secs(2710)),
            None
        );
        assert_eq!(
            v.job_progress_age_for(Some(1), t + Duration::from_secs(2710)),
            Some(10.0)
        );
    }

    #[test]
    fn a_stall_without_probes_is_judged_when_the_wait_runs_out() {
        let t = Instant::now();
        let mut v = view(t);
        v.on_report(report(0, 10, RankState::Running), t);
        v.on_report(report(1, 7, RankState::Running), t);
        v.on_report(
            report(1, 7, RankState::Stalled),
            t + Duration::from_secs(20),
        );
        assert!(!kinds(&v.tick(t + Duration::from_secs(30))).contains(&"hang"));
        let e = v.tick(t + Duration::from_secs(36));
        assert!(kinds(&e).contains(&"hang"));
        assert!(e
            .iter()
            .any(|e| matches!(e, Effect::Failed { rank: 1, .. })));
    }

    #[test]
    fn a_coordinated_checkpoint_lands_ahead_and_settles_when_all_confirm() {
        let t = Instant::now();
        let mut v = view(t);
        for r in 0..3 {
            v.on_report(report(r, 20 + r as u64, RankState::Running), t);
        }
        // 0.5 s steps, 2 s lead: 4 steps ahead of the fastest (22).
        let (id, step, e) = v.request_checkpoint("operator", t).unwrap();
        assert_eq!((id, step), (1, 26));
        assert_eq!(kinds(&e), vec!["checkpoint_requested"]);
        // Asking again returns the pending one.
        assert_eq!(v.request_checkpoint("operator", t).unwrap().0, 1);
        for r in 0..2 {
            let mut x = report(r, 27, RankState::Running);
            x.checkpoints = vec![26];
            assert!(kinds(&v.on_report(x, t + Duration::from_secs(3))).is_empty());
        }
        let mut x = report(2, 27, RankState::Running);
        x.checkpoints = vec![26];
        let e = v.on_report(x, t + Duration::from_secs(4));
        assert_eq!(kinds(&e), vec!["checkpoint_complete", "<settled>"]);
        // A rank that never confirms is named when the wait runs out.
        let (_, step, _) = v
            .request_checkpoint("operator", t + Duration::from_secs(5))
            .unwrap();
        let mut x = report(0, 40, RankState::Running);
        x.checkpoints = vec![26, step];
        v.on_report(x, t + Duration::from_secs(6));
        let e = v.tick(t + Duration::from_secs(200));
        let Effect::Journal { event, .. } = &e[0] else {
            panic!()
        };
        let (kind, data) = (event.kind(), event.clone().into_fields());
        assert_eq!(kind, "checkpoint_incomplete");
        assert_eq!(data["missing_ranks"], json!([1, 2]));
    }

    #[test]
    fn stragglers_are_flagged_from_reports_and_trigger_a_checkpoint() {
        let t = Instant::now();
        let mut cfg = CoordinatorConfig::default();
        cfg.straggler.window = Duration::from_secs(5);
        cfg.straggler.windows = 2;
        let mut v = JobView::new("j", 4, 0, cfg, t);
        let mut flagged = Vec::new();
        for k in 1..=3u64 {
            let now = t + Duration::from_secs(5 * k);
            for r in 0..4u32 {
                let mut x = report(r, 10 * k, RankState::Running);
                let c = if r == 1 { 0.8 } else { 0.4 };
                x.compute = (10 * k, 10.0 * k as f64 * c);
                v.on_report(x, now);
            }
            for e in v.tick(now) {
                if let Effect::Journal { event, .. } = e {
                    let who = event.clone().into_fields().get("who").cloned();
                    flagged.push((event.kind(), who.unwrap_or_default()));
                }
            }
        }
        assert!(flagged.contains(&("straggler", json!("1"))), "{flagged:?}");
        assert!(flagged.iter().any(|(k, _)| *k == "checkpoint_requested"));
        assert_eq!(v.status(t, 0).straggler_ranks, vec!["1".to_string()]);
    }
}
