//! What a node relay holds, as a pure value: the latest report of each of
//! its node's ranks not yet passed on, the commands for them, and the job
//! progress age each was last told. I/O lives in [`super`].

use crate::coordinator::protocol::{BatchReply, BatchReport, Command, Reply, Report, MAX_BATCH};
use std::collections::BTreeMap;
use std::time::Instant;

/// How many commands a relay keeps (the newest; a job sends a handful
/// per attempt).
pub const KEPT_COMMANDS: usize = 256;

struct Held {
    report: Report,
    at: Instant,
    /// Passed on in a batch already (a relay never repeats a report: a
    /// rank whose agent went silent is seen silent by the coordinator).
    sent: bool,
}

/// The relay's state.
#[derive(Default)]
pub struct Book {
    attempt: u32,
    held: BTreeMap<u32, Held>,
    /// Ascending by `seq`, each naming only this node's ranks it is for.
    commands: Vec<Command>,
    /// Per rank: the job progress age the coordinator last gave, and when.
    ages: BTreeMap<u32, (f64, Instant)>,
    /// Why the coordinator did not answer the last batch, until one gets
    /// through.
    pub upstream_down: Option<String>,
}

/// A report that must not wait for the next batch: the rank's state,
/// exit, probe, phase or checkpoints changed (what an agent sends at once).
pub fn urgent(before: Option<&Report>, now: &Report) -> bool {
    let Some(b) = before else { return true };
    b.state != now.state
        || b.exit.is_some() != now.exit.is_some()
        || b.probed != now.probed
        || b.probe_seq != now.probe_seq
        || b.waiting_on_peer != now.waiting_on_peer
        || b.busy != now.busy
        || b.idle != now.idle
        || b.phase != now.phase
        || b.long_phase != now.long_phase
        || b.checkpoints != now.checkpoints
        || b.commands_seen != now.commands_seen
        || (b.step.is_none() && now.step.is_some())
}

impl Book {
    /// The attempt the node's ranks are in (the newest reported).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The ranks heard from in this attempt, ascending.
    pub fn ranks(&self) -> Vec<u32> {
        self.held.keys().copied().collect()
    }

    /// The newest command held.
    pub fn last_seq(&self) -> u64 {
        self.commands.last().map_or(0, |c| c.seq)
    }

    /// A rank's report; true when it should go on at once.
    pub fn take(&mut self, r: Report, now: Instant) -> bool {
        if r.attempt > self.attempt || self.held.is_empty() {
            if r.attempt > self.attempt {
                // A new attempt: what the old one's ranks said is moot.
                self.held.clear();
                self.ages.clear();
                self.commands.retain(|c| c.attempt >= r.attempt);
            }
            self.attempt = self.attempt.max(r.attempt);
        }
        let urgent = urgent(self.held.get(&r.rank).map(|h| &h.report), &r);
        self.held.insert(
            r.rank,
            Held {
                report: r,
                at: now,
                sent: false,
            },
        );
        urgent
    }

    /// What a rank is told when it reports: the commands for it newer than
    /// it has seen, and the job's progress age as last heard, aged since.
    pub fn answer(&self, rank: u32, attempt: u32, seen: u64, now: Instant) -> Reply {
        Reply {
            commands: self.commands_for(rank, attempt, seen),
            job_progress_age_s: self
                .ages
                .get(&rank)
                .map(|(age, at)| age + now.saturating_duration_since(*at).as_secs_f64()),
        }
    }

    /// Commands for `rank` newer than `after`.
    pub fn commands_for(&self, rank: u32, attempt: u32, after: u64) -> Vec<Command> {
        crate::coordinator::protocol::commands_for(&self.commands, rank, attempt, after)
    }

    /// The reports not passed on yet, in batches of at most [`MAX_BATCH`],
    /// each report's progress age grown by the time it was held. They
    /// count as sent; [`Book::unsent`] puts them back if the batch fails.
    pub fn batches(&mut self, node: &str, now: Instant) -> Vec<BatchReport> {
        let mut out: Vec<BatchReport> = Vec::new();
        for h in self.held.values_mut().filter(|h| !h.sent) {
            h.sent = true;
            let mut r = h.report.clone();
            let held = now.saturating_duration_since(h.at).as_secs_f64();
            r.progress_age_s = r.progress_age_s.map(|a| a + held);
            match out.last_mut() {
                Some(b) if b.reports.len() < MAX_BATCH => b.reports.push(r),
                _ => out.push(BatchReport {
                    v: crate::coordinator::protocol::VERSION,
                    node: node.to_string(),
                    reports: vec![r],
                }),
            }
        }
        out
    }

    /// A batch did not get through: its reports go again with the next one
    /// (unless a newer report of the rank came meanwhile).
    pub fn unsent(&mut self, batch: &BatchReport, why: String) {
        for r in &batch.reports {
            if let Some(h) = self.held.get_mut(&r.rank) {
                if h.report.commands_seen == r.commands_seen && h.report.step == r.step {
                    h.sent = false;
                }
            }
        }
        self.upstream_down = Some(why);
    }

    /// The coordinator's reply to `batch`.
    pub fn on_reply(&mut self, batch: &BatchReport, reply: BatchReply, now: Instant) {
        self.upstream_down = None;
        for (r, age) in batch.reports.iter().zip(reply.job_progress_age_s) {
            match age.filter(|a| a.is_finite() && *a >= 0.0) {
                Some(a) => {
                    self.ages.insert(r.rank, (a, now));
                }
                None => {
                    self.ages.remove(&r.rank);
                }
            }
        }
        self.add_commands(reply.commands);
    }

    /// Commands from the coordinator (a reply or the long poll); true when
    /// any was new.
    pub fn add_commands(&mut self, commands: Vec<Command>) -> bool {
        let mut new = false;
        for c in commands {
            if c.attempt < self.attempt {
                continue;
            }
            match self.commands.binary_search_by_key(&c.seq, |k| k.seq) {
                Ok(_) => {}
                Err(at) => {
                    self.commands.insert(at, c);
                    new = true;
                }
            }
        }
        if self.commands.len() > KEPT_COMMANDS {
            let cut = self.commands.len() - KEPT_COMMANDS;
            self.commands.drain(..cut);
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::protocol::{CommandKind, RankState};
    use std::time::Duration;

    fn report(rank: u32, step: u64) -> Report {
        Report {
            v: 1,
            rank,
            node: "n1".into(),
            state: RankState::Running,
            step: Some(step),
            progress_age_s: Some(0.5),
            phase: "train".into(),
            ..Default::default()
        }
    }

    fn stop(seq: u64, ranks: Vec<u32>) -> Command {
        Command {
            seq,
            attempt: 0,
            ranks,
            kind: CommandKind::Stop { reason: "x".into() },
        }
    }

    #[test]
    fn each_report_goes_once_aged_by_its_wait_and_again_only_if_the_batch_failed() {
        let t = Instant::now();
        let mut b = Book::default();
        assert!(
            b.take(report(3, 10), t),
            "the first report of a rank goes at once"
        );
        assert!(
            !b.take(report(3, 11), t),
            "a new step alone waits for the batch"
        );
        assert!(b.take(report(2, 11), t));
        let later = t + Duration::from_millis(700);
        let sent = b.batches("n1", later);
        assert_eq!(sent.len(), 1);
        let ranks: Vec<u32> = sent[0].reports.iter().map(|r| r.rank).collect();
        assert_eq!(ranks, [2, 3]);
        assert_eq!(sent[0].reports[1].step, Some(11));
        assert!((sent[0].reports[1].progress_age_s.unwrap() - 1.2).abs() < 1e-9);
        assert!(
            b.batches("n1", later).is_empty(),
            "nothing new, nothing sent"
        );
        b.unsent(&sent[0], "refused".into());
        assert_eq!(b.upstream_down.as_deref(), Some("refused"));
        assert_eq!(b.batches("n1", later)[0].reports.len(), 2);
        let mut stalled = report(3, 11);
        stalled.state = RankState::Stalled;
        assert!(b.take(stalled, later), "a stall goes at once");
    }

    #[test]
    fn a_rank_gets_the_commands_for_it_and_the_job_age_it_was_given() {
        let t = Instant::now();
        let mut b = Book::default();
        b.take(report(0, 1), t);
        b.take(report(1, 1), t);
        let batch = b.batches("n1", t).remove(0);
        b.on_reply(
            &batch,
            BatchReply {
                commands: vec![stop(2, vec![1]), stop(1, vec![])],
                job_progress_age_s: vec![Some(3.0), None],
                refused: None,
            },
            t,
        );
        assert!(b.upstream_down.is_none());
        assert!(
            !b.add_commands(vec![stop(2, vec![1])]),
            "a command held already"
        );
        let later = t + Duration::from_secs(1);
        let r0 = b.answer(0, 0, 0, later);
        assert_eq!(r0.commands.iter().map(|c| c.seq).collect::<Vec<_>>(), [1]);
        assert_eq!(r0.job_progress_age_s, Some(4.0));
        let r1 = b.answer(1, 0, 1, later);
        assert_eq!(r1.commands.len(), 1);
        assert_eq!(r1.commands[0].ranks, [1]);
        assert_eq!(r1.job_progress_age_s, None);
        assert!(b.answer(1, 0, 2, later).commands.is_empty());
        // A new attempt forgets the old one's commands.
        let mut next = report(0, 1);
        next.attempt = 1;
        b.take(next, later);
        assert_eq!(b.ranks(), [0]);
        assert!(b.answer(0, 1, 0, later).commands.is_empty());
    }

    #[test]
    fn a_node_of_more_ranks_than_a_batch_holds_sends_several() {
        let t = Instant::now();
        let mut b = Book::default();
        for r in 0..(MAX_BATCH as u32 + 3) {
            b.take(report(r, 1), t);
        }
        let sizes: Vec<usize> = b.batches("n1", t).iter().map(|b| b.reports.len()).collect();
        assert_eq!(sizes, [MAX_BATCH, 3]);
    }
}
