//! The coordinator's view of a job: every rank's latest report, the
//! commands issued, and the cross-rank decisions. Pure: reports and the
//! current `Instant` in, journal records, commands and host effects out.
//! The HTTP server (`server.rs`) and the hosts (the local launcher, the
//! batch-level supervisor, rank 0's agent) are the I/O around it.

use super::protocol::*;
use crate::event::{self as ev, Event};
use crate::policy::hang::{self, HangVerdict, RankView};
use crate::policy::straggler::{StragglerConfig, StragglerPolicy, Totals};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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
        }
    }
}

/// What the host must do besides journaling.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// A journal record for the coordinator's journal.
    Journal { event: Event, durable: bool },
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
        event: event.into(),
        durable,
    }
}

struct Entry {
    report: Report,
    heard: Instant,
    last_step_at: Option<Instant>,
    lost: bool,
}

struct Pending {
    id: u64,
    step: u64,
    reason: String,
    asked: Instant,
    deadline: Instant,
    confirmed: BTreeMap<u32, Instant>,
}

struct Failing {
    rank: u32,
    judge_by: Instant,
    judged: bool,
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
    ranks: BTreeMap<u32, Entry>,
    commands: Vec<Command>,
    seq: u64,
    straggler: StragglerPolicy,
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
    relaunch_measured: bool,
    /// A confirmed straggler node to exclude once the checkpoint settles: (node, evidence).
    excluding: Option<(String, String)>,
    pub restarts: u32,
    pub stalls: u64,
    pub checkpoints: u64,
    pub reports: u64,
    /// Reports and requests refused as out of range (400).
    pub rejected: u64,
    /// Time with at least one rank progressing, for the live ETTR estimate.
    progressing: Duration,
    last_tick: Option<(Instant, bool)>,
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(xs[xs.len() / 2])
}

/// The highest step a report may carry: 2^53 - 1, exact in a JSON number
/// read as a double (the Python client, Prometheus) and far from wrapping
/// when a checkpoint's lead is added to it.
pub const MAX_STEP: u64 = (1 << 53) - 1;
/// How far a rank's step may jump above its last reported one in one report
/// (2^40: steps counted in tokens or samples jump far, never this far).
pub const MAX_STEP_JUMP: u64 = 1 << 40;
/// The rank bound when the host could not tell the job's world size (a batch
/// script without `SLURM_NTASKS`): far beyond any real job, far below the
/// ids a stranger would make up.
pub const MAX_RANKS: u32 = 1 << 20;
/// The most checkpoint steps a report may list (agents send at most 16).
pub const MAX_CHECKPOINTS: usize = 64;
/// The longest `POST /v1/checkpoint` reason, in bytes.
pub const MAX_REASON: usize = 1024;
/// The longest long poll (`wait_s` above it is cut to it).
pub const MAX_WAIT_S: f64 = 60.0;
/// The most steps a coordinated checkpoint is placed ahead of the fastest rank.
const MAX_LEAD: u64 = 1 << 32;

/// A request the coordinator refuses (400): the one-line reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid(pub String);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn seconds(name: &str, x: f64) -> Result<(), Invalid> {
    if x.is_finite() && x >= 0.0 {
        Ok(())
    } else {
        Err(Invalid(format!(
            "{name} must be a finite, non-negative number of seconds (got {x})"
        )))
    }
}

/// A long poll's wait: finite and non-negative, at most [`MAX_WAIT_S`].
pub fn poll_wait(wait_s: Option<f64>) -> Result<Duration, Invalid> {
    let w = wait_s.unwrap_or(20.0);
    seconds("wait_s", w)?;
    Duration::try_from_secs_f64(w.min(MAX_WAIT_S)).map_err(|e| Invalid(format!("wait_s: {e}")))
}

/// A checkpoint's reason: short, one line, printable (it is journaled and
/// written into every trainer's control file).
pub fn check_reason(reason: &str) -> Result<(), Invalid> {
    if reason.len() > MAX_REASON {
        return Err(Invalid(format!(
            "reason is {} bytes long; at most {MAX_REASON}",
            reason.len()
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err(Invalid("reason must not hold control characters".into()));
    }
    Ok(())
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
            ranks: BTreeMap::new(),
            commands: Vec::new(),
            seq: 0,
            straggler: StragglerPolicy::new(cfg.straggler.clone()),
            next_window: now + cfg.straggler.window,
            slow_nodes_by_attempt: BTreeMap::new(),
            pending: None,
            last_checkpoint: None,
            next_id: 1,
            next_periodic: cfg.checkpoint_every.map(|d| now + d),
            periodic_every: cfg.checkpoint_every,
            failing: None,
            failed_at: None,
            relaunch_measured: true,
            excluding: None,
            restarts: 0,
            stalls: 0,
            checkpoints: 0,
            reports: 0,
            rejected: 0,
            progressing: Duration::ZERO,
            last_tick: None,
            cfg,
        }
    }

    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The bound on rank ids: the world size, or [`MAX_RANKS`] when it is not known.
    pub fn rank_limit(&self) -> u32 {
        self.rank_limit
    }

    /// The world size given is a guess (the host could not tell it): ranks
    /// are accepted below [`MAX_RANKS`] instead.
    pub fn world_size_unknown(&mut self) {
        self.rank_limit = self.rank_limit.max(MAX_RANKS);
    }

    fn check_rank(&self, rank: u32) -> Result<(), Invalid> {
        if rank < self.rank_limit {
            Ok(())
        } else if self.rank_limit == self.world_size {
            Err(Invalid(format!(
                "rank {rank} is out of range: the job has {} rank(s)",
                self.world_size
            )))
        } else {
            Err(Invalid(format!(
                "rank {rank} is out of range: at most {} ranks",
                self.rank_limit
            )))
        }
    }

    /// Attempts are started by the coordinator's host only (the launcher's
    /// restart in place, the job-level supervisor's relaunch, a new
    /// allocation's host): an agent reporting a later attempt is not believed.
    /// An earlier attempt is accepted (and its report ignored): a rank of the
    /// attempt being torn down still reports, and polls for its stop.
    fn check_attempt(&self, attempt: u32) -> Result<(), Invalid> {
        if attempt <= self.attempt {
            Ok(())
        } else {
            Err(Invalid(format!(
                "attempt {attempt} is not started: the current attempt is {}",
                self.attempt
            )))
        }
    }

    /// Every field of a report in range, before anything in the view changes.
    pub fn check_report(&self, r: &Report) -> Result<(), Invalid> {
        self.check_rank(r.rank)?;
        self.check_attempt(r.attempt)?;
        if let Some(a) = r.progress_age_s {
            seconds("progress_age_s", a)?;
        }
        seconds("intervals (sum)", r.intervals.1)?;
        seconds("compute (sum)", r.compute.1)?;
        if let Some(step) = r.step {
            if step > MAX_STEP {
                return Err(Invalid(format!("step {step} is above {MAX_STEP}")));
            }
            let last = self
                .ranks
                .get(&r.rank)
                .filter(|e| e.report.attempt == r.attempt)
                .and_then(|e| e.report.step);
            if let Some(last) = last.filter(|l| step > l.saturating_add(MAX_STEP_JUMP)) {
                return Err(Invalid(format!(
                    "step {step} jumps more than {MAX_STEP_JUMP} above the rank's last step {last}"
                )));
            }
        }
        if r.checkpoints.len() > MAX_CHECKPOINTS {
            return Err(Invalid(format!(
                "{} checkpoint steps listed; at most {MAX_CHECKPOINTS}",
                r.checkpoints.len()
            )));
        }
        if let Some(c) = r.checkpoints.iter().find(|c| **c > MAX_STEP) {
            return Err(Invalid(format!("checkpoint step {c} is above {MAX_STEP}")));
        }
        Ok(())
    }

    /// A long poll's rank and attempt, and its wait.
    pub fn check_poll(
        &self,
        rank: u32,
        attempt: u32,
        wait_s: Option<f64>,
    ) -> Result<Duration, Invalid> {
        self.check_rank(rank)?;
        self.check_attempt(attempt)?;
        poll_wait(wait_s)
    }

    /// The latest command sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Commands for `rank` newer than `after`.
    pub fn commands_for(&self, rank: u32, attempt: u32, after: u64) -> Vec<Command> {
        self.commands
            .iter()
            .filter(|c| c.seq > after && c.for_rank(rank, attempt))
            .cloned()
            .collect()
    }

    fn push(&mut self, ranks: Vec<u32>, kind: CommandKind) {
        self.seq += 1;
        self.commands.push(Command {
            seq: self.seq,
            attempt: self.attempt,
            ranks,
            kind,
        });
    }

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

    /// Nodes flagged as stragglers in earlier attempts, from the journal
    /// (this view's host did not see them: a relaunch, a requeue).
    pub fn seed_from_journal(&mut self, records: &[crate::journal::Record]) {
        for (r, event) in crate::journal::events(records) {
            let crate::event::Event::Straggler(s) = event else {
                continue;
            };
            let node_flagged = s.scope.as_deref() == Some("node") && s.flagged == Some(true);
            let (true, Some(node)) = (node_flagged && r.attempt < self.attempt, s.straggler_node)
            else {
                continue;
            };
            let e = self.slow_nodes_by_attempt.entry(r.attempt).or_default();
            if !e.contains(&node) {
                e.push(node);
            }
        }
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
        self.failing = None;
        self.pending = None;
        self.excluding = None;
        self.restarts += 1;
        self.relaunch_measured = false;
        self.straggler.reset_totals();
        self.next_window = now + self.cfg.straggler.window;
        vec![journal(
            ev::CoordinatorAttempt {
                restarts: Some(self.restarts),
            },
            false,
        )]
    }

    fn live(&self) -> impl Iterator<Item = (&u32, &Entry)> {
        self.ranks
            .iter()
            .filter(|(_, e)| e.report.state != RankState::Exited && !e.lost)
    }

    /// One report from an agent.
    pub fn on_report(&mut self, r: Report, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        if let Err(e) = self.check_report(&r) {
            self.rejected += 1;
            tracing::debug!("coordinator: report refused: {e}");
            return out;
        }
        self.reports += 1;
        if r.attempt < self.attempt {
            return out; // a straggling report of an earlier attempt
        }
        let prev = self.ranks.get(&r.rank);
        let stepped = r.step.is_some() && prev.is_none_or(|p| p.report.step != r.step);
        // Progress of any source (not only a new step number: Lightning's
        // bar between two optimizer steps) is when the rank was last alive.
        let last_step_at = match r.progress_age_s.filter(|a| a.is_finite()) {
            Some(age) => {
                let age = Duration::from_secs_f64(age.clamp(0.0, 1e6));
                Some(now.checked_sub(age).unwrap_or(now))
            }
            None => prev.and_then(|p| p.last_step_at),
        };
        let was_lost = prev.is_some_and(|p| p.lost);
        let prev_state = prev.map(|p| p.report.state);
        if was_lost {
            out.push(journal(
                ev::RankHeardAgain {
                    about_rank: Some(r.rank),
                    about_node: Some(r.node.clone()),
                    silent_s: None,
                },
                false,
            ));
        }
        if stepped && !self.relaunch_measured {
            self.relaunch_measured = true;
            if let Some(f) = self.failed_at {
                let took = last_step_at.unwrap_or(now).saturating_duration_since(f);
                out.push(journal(
                    ev::Relaunched {
                        failure_to_first_step_s: Some(took.as_secs_f64()),
                        first_rank: Some(r.rank),
                    },
                    true,
                ));
            }
        }
        let rank = r.rank;
        let node = r.node.clone();
        let state = r.state;
        let exit = r.exit.clone();
        let checkpoints = r.checkpoints.clone();
        self.ranks.insert(
            rank,
            Entry {
                report: r,
                heard: now,
                last_step_at,
                lost: false,
            },
        );
        // Coordinated checkpoint confirmations.
        if let Some(p) = self.pending.as_mut() {
            if checkpoints.contains(&p.step) && !p.confirmed.contains_key(&rank) {
                p.confirmed.insert(rank, now);
            }
        }
        self.settle_checkpoint(now, false, &mut out);

        if state == RankState::Stalled && prev_state != Some(RankState::Stalled) {
            self.stalls += 1;
            out.push(journal(
                ev::StallReported {
                    about_rank: Some(rank),
                    about_node: Some(node.clone()),
                },
                false,
            ));
            if self.failing.is_none() {
                self.failing = Some(Failing {
                    rank,
                    judge_by: now + self.cfg.hang_wait,
                    judged: false,
                });
                let others: Vec<u32> = self
                    .live()
                    .map(|(r, _)| *r)
                    .filter(|r| *r != rank)
                    .collect();
                if !others.is_empty() {
                    self.push(
                        others,
                        CommandKind::Diagnose {
                            reason: format!("rank {rank} stalled"),
                        },
                    );
                }
            }
        }
        if let Some(e) = &exit {
            if e.code != 0 && !e.stopped && self.failing.as_ref().is_none_or(|f| !f.judged) {
                let stall_pending = self.failing.is_some();
                if !stall_pending {
                    // A crash: tear the step down now, not after the collective timeout.
                    let reason = format!(
                        "rank {rank} on {node} exited {} ({}: {})",
                        e.code, e.class, e.cause
                    );
                    self.fail(rank, &node, reason, None, now, &mut out);
                }
            }
        }
        if self.failing.as_ref().is_some_and(|f| !f.judged) && self.probes_complete() {
            self.judge_hang(now, &mut out);
        }
        out
    }

    /// Every live rank has answered the probe (a probe that could not tell
    /// is an answer too: waiting for it longer would tell nothing more).
    fn probes_complete(&self) -> bool {
        self.live()
            .all(|(_, e)| e.report.probed || e.report.waiting_on_peer.is_some())
    }

    /// Seconds since any live rank last made progress in this attempt. A
    /// rank in a long phase (a 45-minute evaluation on rank 0 while the
    /// others wait in a barrier) counts as progressing now: it is judged by
    /// that phase's own limit, and the silent ranks must outlast it.
    pub fn job_progress_age(&self, now: Instant) -> Option<f64> {
        if self
            .live()
            .any(|(_, e)| e.report.long_phase && e.report.state == RankState::Running)
        {
            return Some(0.0);
        }
        self.live()
            .filter_map(|(_, e)| e.last_step_at)
            .max()
            .map(|t| now.saturating_duration_since(t).as_secs_f64())
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
        out.push(journal(
            ev::Teardown {
                reason: Some(reason.clone()),
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

    fn judge_hang(&mut self, now: Instant, out: &mut Vec<Effect>) {
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
                    || e.report.exit.as_ref().is_some_and(|x| x.class == "hang"),
                exited: e.report.state == RankState::Exited,
                waiting_on_peer: e.report.waiting_on_peer,
                silent: e.report.silent,
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
        let v = hang::judge(&views, tolerance, unseen);
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
                reason: Some(reason.to_string()),
                fastest_step: Some(fastest),
                coordinated: Some(true),
                ..Default::default()
            },
            true,
        )];
        Ok((id, step, effects))
    }

    fn settle_checkpoint(&mut self, now: Instant, timed_out: bool, out: &mut Vec<Effect>) {
        let Some(p) = &self.pending else { return };
        let live: Vec<u32> = self
            .ranks
            .iter()
            .filter(|(_, e)| !e.lost)
            .filter(|(r, e)| e.report.state != RankState::Exited || p.confirmed.contains_key(r))
            .map(|(r, _)| *r)
            .collect();
        let missing: Vec<u32> = live
            .iter()
            .copied()
            .filter(|r| !p.confirmed.contains_key(r))
            .collect();
        let complete = missing.is_empty() && !p.confirmed.is_empty();
        if !complete && !timed_out {
            return;
        }
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
            id: Some(p.id),
            step: Some(p.step),
            reason: Some(p.reason.clone()),
            confirmed_ranks: Some(confirmed.clone()),
            missing_ranks: Some(missing.clone()),
            request_to_last_confirmation_s: Some(last.as_secs_f64()),
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

    /// Stop the step to leave a confirmed straggler node out of the next
    /// attempt (after the checkpoint, if one could be had).
    fn exclude_straggler(&mut self, saved_step: Option<u64>, now: Instant, out: &mut Vec<Effect>) {
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
                straggler_node: Some(node.clone()),
                about_rank: (rank != u32::MAX).then_some(rank),
                evidence: Some(evidence.clone()),
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

        if self
            .failing
            .as_ref()
            .is_some_and(|f| !f.judged && now >= f.judge_by)
        {
            self.judge_hang(now, &mut out);
        }
        if self.pending.as_ref().is_some_and(|p| now >= p.deadline) {
            self.settle_checkpoint(now, true, &mut out);
        }
        if now >= self.next_window {
            self.next_window = now + self.cfg.straggler.window;
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
                let confirmed = c.scope == "node"
                    && c.flagged
                    && self
                        .slow_nodes_by_attempt
                        .iter()
                        .any(|(a, ns)| *a < self.attempt && ns.contains(&c.node));
                if c.scope == "node" && c.flagged {
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
                            crate::policy::straggler::Basis::StepInterval => "step interval",
                        },
                        c.windows,
                        self.attempt
                    );
                    self.excluding = Some((c.node.clone(), evidence));
                    exclude_now = true;
                }
                out.push(journal(
                    ev::Straggler {
                        scope: Some(c.scope.to_string()),
                        who: Some(c.who.clone()),
                        straggler_node: Some(c.node.clone()),
                        about_rank: (c.scope == "rank")
                            .then(|| c.who.parse::<u32>().ok())
                            .flatten(),
                        flagged: Some(c.flagged),
                        basis: Some(c.basis.name().to_string()),
                        value_s: Some(c.value_s),
                        median_s: Some(c.median_s),
                        ratio: Some(c.ratio),
                        windows: Some(c.windows),
                        confirmed_across_restart: Some(confirmed),
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
                self.exclude_straggler(None, now, &mut out);
            }
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
        let lost_after = self.cfg.lost_after;
        for (r, e) in self.ranks.iter_mut() {
            if !e.lost
                && e.report.state != RankState::Exited
                && now.duration_since(e.heard) >= lost_after
            {
                e.lost = true;
                out.push(journal(
                    ev::RankLost {
                        about_rank: Some(*r),
                        about_node: Some(e.report.node.clone()),
                        silent_s: Some(now.duration_since(e.heard).as_secs_f64()),
                    },
                    true,
                ));
            }
        }
        out
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

    /// The live ETTR estimate: time with ranks progressing over uptime.
    pub fn live_ettr(&self, now: Instant) -> f64 {
        let up = now.duration_since(self.started).as_secs_f64();
        if up <= 0.0 {
            0.0
        } else {
            (self.progressing.as_secs_f64() / up).min(1.0)
        }
    }

    pub fn status(&self, now: Instant, unauthorized: u64) -> Status {
        let (sr, sn) = self.straggler.flagged();
        let ranks: Vec<RankStatus> = self
            .ranks
            .iter()
            .map(|(r, e)| {
                let mean = |(n, s): (u64, f64)| (n > 0).then(|| s / n as f64);
                let heard = now.duration_since(e.heard).as_secs_f64();
                RankStatus {
                    rank: *r,
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
                    last_report_age_s: heard,
                    straggler: sr.contains(&r.to_string()),
                    silent: e.report.silent,
                }
            })
            .collect();
        let pending = self.pending.as_ref().map(|p| CheckpointStatus {
            id: p.id,
            step: p.step,
            reason: p.reason.clone(),
            confirmed: p.confirmed.keys().copied().collect(),
            missing: self
                .live()
                .map(|(r, _)| *r)
                .filter(|r| !p.confirmed.contains_key(r))
                .collect(),
            age_s: now.duration_since(p.asked).as_secs_f64(),
        });
        Status {
            job: self.job.clone(),
            attempt: self.attempt,
            world_size: self.world_size,
            uptime_s: now.duration_since(self.started).as_secs_f64(),
            step: ranks.iter().filter_map(|r| r.step).min(),
            steps_per_s: median(ranks.iter().filter_map(|r| r.steps_per_s).collect()),
            ranks,
            straggler_ranks: sr,
            straggler_nodes: sn,
            last_checkpoint: self.last_checkpoint.clone(),
            pending_checkpoint: pending,
            restarts: self.restarts,
            stalls: self.stalls,
            unauthorized,
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
            class: "user_error".into(),
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
        let e = v.on_report(s0, t + Duration::from_secs(30));
        assert_eq!(kinds(&e), vec!["stall_reported"]);
        let diag = v.commands_for(1, 0, 0);
        assert!(matches!(diag[0].kind, CommandKind::Diagnose { .. }));
        assert!(
            v.commands_for(0, 0, 0).is_empty(),
            "not to the stalled rank"
        );
        for (r, waiting) in [(1, false), (2, true)] {
            let mut x = report(r, 10, RankState::Running);
            x.waiting_on_peer = Some(waiting);
            x.progress_age_s = Some(31.0);
            assert!(!kinds(&v.on_report(x, t + Duration::from_secs(31))).contains(&"hang"));
        }
        let mut x = report(3, 10, RankState::Running);
        x.waiting_on_peer = Some(true);
        x.progress_age_s = Some(31.0);
        let e = v.on_report(x, t + Duration::from_secs(31));
        assert_eq!(kinds(&e), vec!["hang", "teardown", "<failed>"]);
        match &e[2] {
            Effect::Failed { rank, hang, .. } => {
                assert_eq!(*rank, 1);
                assert_eq!(hang.as_ref().unwrap().rule, "not_waiting");
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
                matches!(
                    e,
                    Effect::Journal {
                        event: Event::CheckpointRequested(_),
                        ..
                    }
                )
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
                scope: Some("node".into()),
                who: Some(node.into()),
                straggler_node: Some(node.into()),
                flagged: Some(true),
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
                Effect::Journal {
                    event: event @ Event::StragglerExclusion(_),
                    ..
                } => Some(event.clone().into_fields()),
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
mod range_tests {
    use super::*;

    fn report(rank: u32, step: u64) -> Report {
        Report {
            v: VERSION,
            rank,
            node: "n0".into(),
            state: RankState::Running,
            step: Some(step),
            progress_age_s: Some(0.0),
            intervals: (step, step as f64 * 0.5),
            phase: "train".into(),
            ..Default::default()
        }
    }

    /// Two real ranks at steps 10 and 12; what a token holder then sends
    /// must be refused with a reason and leave the view as it was.
    fn refused(bad: Report, why: &str) {
        let t = Instant::now();
        let mut v = JobView::new("j", 2, 0, CoordinatorConfig::default(), t);
        v.on_report(report(0, 10), t);
        v.on_report(report(1, 12), t);
        let before = v.status(t, 0);
        let e = v.check_report(&bad).unwrap_err();
        assert!(e.0.contains(why), "{e}");
        assert!(!e.0.contains('\n'), "one line: {e}");
        assert!(v.on_report(bad, t).is_empty());
        assert_eq!(v.status(t, 0), before);
        assert_eq!((v.rejected, v.reports), (1, 2));
        // The real ranks are still heard.
        let e = v.on_report(report(0, 11), t);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(v.status(t, 0).ranks[0].step, Some(11));
    }

    #[test]
    fn ranks_beyond_the_world_size_are_refused() {
        for rank in [2, 50, 99, u32::MAX] {
            refused(report(rank, 1), "out of range");
        }
    }

    #[test]
    fn an_unknown_world_size_still_bounds_ranks() {
        let t = Instant::now();
        let mut v = JobView::new("j", 1, 0, CoordinatorConfig::default(), t);
        v.world_size_unknown();
        assert_eq!(v.check_report(&report(3, 1)), Ok(()));
        assert_eq!(v.check_report(&report(MAX_RANKS - 1, 1)), Ok(()));
        assert!(v.check_report(&report(MAX_RANKS, 1)).is_err());
        assert!(v.check_report(&report(u32::MAX, 1)).is_err());
    }

    #[test]
    fn a_later_attempt_cannot_take_the_view_over() {
        let mut r = report(0, 10);
        r.attempt = u32::MAX;
        refused(r.clone(), "not started");
        r.attempt = 1;
        refused(r, "not started");
    }

    #[test]
    fn durations_must_be_finite_and_not_negative() {
        for x in [f64::NAN, f64::INFINITY, -1.0, f64::NEG_INFINITY] {
            let mut r = report(0, 10);
            r.progress_age_s = Some(x);
            refused(r, "progress_age_s");
            let mut r = report(0, 10);
            r.intervals.1 = x;
            refused(r, "intervals");
            let mut r = report(0, 10);
            r.compute = (3, x);
            refused(r, "compute");
        }
    }

    #[test]
    fn steps_stay_within_bounds() {
        refused(report(0, u64::MAX), "above");
        refused(report(0, MAX_STEP + 1), "above");
        // Rank 0 was at 10: a jump of more than MAX_STEP_JUMP is refused...
        refused(report(0, 11 + MAX_STEP_JUMP), "jumps");
        let mut r = report(0, 10);
        r.checkpoints = vec![u64::MAX];
        refused(r, "checkpoint step");
        let mut r = report(0, 10);
        r.checkpoints = vec![1; MAX_CHECKPOINTS + 1];
        refused(r, "checkpoint steps listed");
        // ...one of exactly MAX_STEP_JUMP is not, nor a step going back
        // (a counter reset by the trainer), nor a first report far ahead (a
        // resume from a late checkpoint).
        let t = Instant::now();
        let mut v = JobView::new("j", 2, 0, CoordinatorConfig::default(), t);
        v.on_report(report(0, 10), t);
        assert_eq!(v.check_report(&report(0, 10 + MAX_STEP_JUMP)), Ok(()));
        assert_eq!(v.check_report(&report(0, 3)), Ok(()));
        assert_eq!(v.check_report(&report(1, MAX_STEP)), Ok(()));
    }

    #[test]
    fn the_highest_steps_do_not_wrap_a_checkpoint() {
        let t = Instant::now();
        let mut v = JobView::new("j", 1, 0, CoordinatorConfig::default(), t);
        // A step time too small to be true: the lead is capped.
        let mut r = report(0, MAX_STEP);
        r.intervals = (1_000_000, 1e-300);
        assert!(v.on_report(r, t).is_empty());
        let (_, step, _) = v.request_checkpoint("operator", t).unwrap();
        assert!(step > MAX_STEP && step <= MAX_STEP + MAX_LEAD, "{step}");
    }

    #[test]
    fn an_earlier_attempt_is_heard_but_changes_nothing() {
        let t = Instant::now();
        let mut v = JobView::new("j", 2, 3, CoordinatorConfig::default(), t);
        let mut r = report(0, 10);
        r.attempt = 2;
        assert_eq!(v.check_report(&r), Ok(()));
        assert!(v.on_report(r, t).is_empty());
        assert!(v.status(t, 0).ranks.is_empty());
        assert_eq!(v.attempt(), 3);
    }

    #[test]
    fn a_long_polls_values_are_checked() {
        let t = Instant::now();
        let v = JobView::new("j", 2, 1, CoordinatorConfig::default(), t);
        assert_eq!(v.check_poll(1, 1, None), Ok(Duration::from_secs(20)));
        assert_eq!(
            v.check_poll(1, 0, Some(0.5)),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(v.check_poll(0, 1, Some(1e300)), Ok(Duration::from_secs(60)));
        for w in [f64::NAN, -1.0, f64::INFINITY] {
            assert!(v
                .check_poll(0, 1, Some(w))
                .unwrap_err()
                .0
                .contains("wait_s"));
        }
        assert!(v.check_poll(2, 1, None).is_err());
        assert!(v.check_poll(0, 2, None).is_err());
    }

    #[test]
    fn a_checkpoint_reason_is_one_short_line() {
        assert_eq!(check_reason("operator"), Ok(()));
        assert_eq!(check_reason("disk maintenance at 3pm"), Ok(()));
        assert!(check_reason("x\ncheckpoint id=9 step=1").is_err());
        assert!(check_reason("\u{1b}[2J").is_err());
        assert!(check_reason(&"x".repeat(MAX_REASON + 1)).is_err());
    }
}
