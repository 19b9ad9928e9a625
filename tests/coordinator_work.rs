//! The coordinator's work per report does not grow with the job: the pure
//! `JobView` driven as the server drives it (a report, the commands for its
//! rank, the job's progress age for the reply; a tick a second) through
//! steady training, a coordinated checkpoint and a hang judgment, at 64 and
//! at 65,536 ranks. Work is counted, not timed: rank entries visited by
//! walks over every rank (`JobView::ranks_visited`) and the bytes of the
//! commands each reply carries. A report that walked every rank, or a
//! reply that named every rank, would make the large job's figures about
//! a thousand times the small one's.

use resilio::coordinator::protocol::{CommandKind, RankState, Report, VERSION};
use resilio::coordinator::state::{CoordinatorConfig, JobView};
use std::time::{Duration, Instant};

/// Work per report in each phase: (walk visits, reply command bytes).
#[derive(Debug, Default, Clone, Copy)]
struct PerReport {
    visits: f64,
    reply_bytes: f64,
}

struct Driver {
    v: JobView,
    ranks: u32,
    now: Instant,
    step: u64,
    seen: Vec<u64>,
    reports: u64,
    ticks: u64,
    reply_bytes: u64,
}

impl Driver {
    fn new(ranks: u32) -> Driver {
        let now = Instant::now();
        let cfg = CoordinatorConfig {
            // No straggler or periodic work in the way of what is counted.
            hang_wait: Duration::from_secs(15),
            ..Default::default()
        };
        Driver {
            v: JobView::new("work", ranks, 0, cfg, now),
            ranks,
            now,
            step: 0,
            seen: vec![0; ranks as usize],
            reports: 0,
            ticks: 0,
            reply_bytes: 0,
        }
    }

    fn report(&self, rank: u32) -> Report {
        Report {
            v: VERSION,
            rank,
            node: format!("node{:05}", rank / 8),
            state: RankState::Running,
            step: Some(self.step),
            progress_age_s: Some(0.0),
            intervals: (self.step, self.step as f64),
            phase: "train".into(),
            commands_seen: self.seen[rank as usize],
            ..Default::default()
        }
    }

    /// One report as the server handles it: the report, then the reply.
    /// Stops at once when the walks exceed a few per report and a few per
    /// tick (a walk per report at 65,536 ranks would take hours to finish).
    fn send(&mut self, r: Report) {
        let budget = 8 * (self.reports + 1) + 8 * u64::from(self.ranks) * (self.ticks + 1);
        assert!(
            self.v.ranks_visited() <= budget,
            "{} rank visits after {} reports and {} ticks at {} ranks: a report walks every rank",
            self.v.ranks_visited(),
            self.reports,
            self.ticks,
            self.ranks
        );
        let rank = r.rank;
        self.v.check_report(&r).expect("a valid report");
        self.v.on_report(r, self.now);
        let commands = self.v.commands_for(rank, 0, self.seen[rank as usize]);
        let _ = self.v.job_progress_age_for(Some(rank), self.now);
        if let Some(last) = commands.last() {
            self.seen[rank as usize] = last.seq;
        }
        self.reply_bytes += serde_json::to_vec(&commands).unwrap().len() as u64;
        self.reports += 1;
    }

    /// A second of the job: every rank reports once, then a tick.
    fn round(&mut self, each: impl Fn(&Driver, u32) -> Report) {
        for rank in 0..self.ranks {
            let r = each(self, rank);
            self.send(r);
        }
        self.now += Duration::from_secs(1);
        self.v.tick(self.now);
        self.ticks += 1;
    }

    /// Work per report over `rounds` rounds.
    fn measure(&mut self, rounds: u32, each: impl Fn(&Driver, u32) -> Report) -> PerReport {
        let (v0, r0, b0) = (self.v.ranks_visited(), self.reports, self.reply_bytes);
        for _ in 0..rounds {
            self.round(&each);
        }
        let n = (self.reports - r0) as f64;
        PerReport {
            visits: (self.v.ranks_visited() - v0) as f64 / n,
            reply_bytes: (self.reply_bytes - b0) as f64 / n,
        }
    }
}

/// Steady training, a checkpoint asked and confirmed, a hang judged.
fn phases(ranks: u32) -> [PerReport; 3] {
    let mut d = Driver::new(ranks);
    // Every rank registers, then trains.
    d.round(|d, r| d.report(r));
    let mut steady = PerReport::default();
    for _ in 0..3 {
        d.step += 1;
        steady = d.measure(1, |d, r| d.report(r));
    }

    // A coordinated checkpoint: asked; a round at steps below it; then the
    // ranks confirm it one by one.
    let (_, at, _) = d.v.request_checkpoint("periodic", d.now).expect("asked");
    d.step += 1;
    let before = d.measure(1, |d, r| d.report(r));
    d.step = at;
    let confirmed = d.measure(1, |d, r| Report {
        checkpoints: vec![at],
        ..d.report(r)
    });
    let checkpoint = PerReport {
        visits: (before.visits + confirmed.visits) / 2.0,
        reply_bytes: (before.reply_bytes + confirmed.reply_bytes) / 2.0,
    };

    // A hang: the last rank stalls; every other rank is asked for a probe
    // and answers it (waiting on a peer) while the judgment waits.
    let last = ranks - 1;
    let stalled = Report {
        state: RankState::Stalled,
        progress_age_s: Some(600.0),
        ..d.report(last)
    };
    d.send(stalled);
    let hang = d.measure(1, |d, r| {
        if r == last {
            Report {
                state: RankState::Stalled,
                progress_age_s: Some(601.0),
                ..d.report(r)
            }
        } else {
            Report {
                probed: true,
                waiting_on_peer: Some(true),
                progress_age_s: Some(30.0),
                ..d.report(r)
            }
        }
    });
    // The probe reached the others, naming only each one.
    let probe = d.v.commands_for(0, 0, 0);
    assert!(
        probe
            .iter()
            .any(|c| matches!(c.kind, CommandKind::Diagnose { .. }) && c.ranks == [0]),
        "{probe:?}"
    );
    [steady, checkpoint, hang]
}

#[test]
fn a_report_costs_the_same_at_64_and_at_65536_ranks() {
    let small = phases(64);
    let large = phases(65_536);
    for (name, (s, l)) in ["training", "checkpoint", "hang"]
        .iter()
        .zip(small.iter().zip(large.iter()))
    {
        println!(
            "{name}: per report at 64 ranks {:.2} visits, {:.0} reply bytes; at 65,536 ranks {:.2} visits, {:.0} reply bytes",
            s.visits, s.reply_bytes, l.visits, l.reply_bytes
        );
        // A walk a tick (once a second per rank) is one visit a report at
        // any size; a walk a report would be 65,536.
        assert!(
            l.visits <= 3.0 * s.visits.max(1.0),
            "{name}: {:.1} rank visits per report at 65,536 ranks, {:.1} at 64",
            l.visits,
            s.visits
        );
        assert!(
            l.reply_bytes <= 2.0 * s.reply_bytes.max(16.0),
            "{name}: {:.0} reply bytes per report at 65,536 ranks, {:.0} at 64",
            l.reply_bytes,
            s.reply_bytes
        );
    }
}
