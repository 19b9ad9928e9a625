//! What a reply and the per-report checks need to know about all the ranks
//! (the job's newest progress, whether a peer is in a long phase, how many
//! live ranks have answered a probe or confirmed a checkpoint), kept up to
//! date as each rank's entry changes: a report costs the same at 64 ranks
//! as at 65,536, never a walk over every rank.

use super::Entry;
use crate::coordinator::protocol::RankState;
use std::cell::{Cell, RefCell};
use std::collections::BinaryHeap;
use std::time::Instant;

/// What one rank's entry adds to the tally.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct RankFacts {
    /// Neither exited nor taken for lost.
    pub live: bool,
    /// When it last made progress (live ranks only).
    pub progress: Option<Instant>,
    /// Live, running, and in a long phase (an evaluation, a save).
    pub long_phase: bool,
    /// Live, and answered the latest ask for a probe (or showed whether it
    /// waits on a peer).
    pub answered: bool,
    /// Live, and its latest report came through its node's relay.
    pub relayed: bool,
}

impl RankFacts {
    /// A live rank's last progress (what [`RankFacts::of`] says of it).
    pub fn progress_of(e: &Entry) -> Option<Instant> {
        let live = e.report.state != RankState::Exited && !e.lost;
        e.last_step_at.filter(|_| live)
    }

    pub fn of(e: &Entry) -> RankFacts {
        let live = e.report.state != RankState::Exited && !e.lost;
        RankFacts {
            live,
            progress: Self::progress_of(e),
            long_phase: live && e.report.long_phase && e.report.state == RankState::Running,
            answered: live && e.probe_answered && {
                let p = e.probe_says();
                p.probed || p.waiting_on_peer.is_some()
            },
            relayed: live && e.relayed,
        }
    }
}

/// The sums over every rank's [`RankFacts`].
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Live ranks' last progress, newest first (a max-heap). A rank's
    /// earlier progress is left in when it moves, and dropped when it
    /// comes to the top ([`Tally::newest_progress`]) or at a compaction
    /// ([`Tally::compact`]): a report pushes one entry into a vector and
    /// never looks for the one it replaces. (An ordered set's removals and
    /// the nodes it allocated and freed took a fifth of the coordinator's
    /// time during a hang at 65,536 ranks, every rank's progress then
    /// standing at nearly the same time.)
    newest: RefCell<BinaryHeap<(Instant, u32)>>,
    pub live: usize,
    pub long_phase: usize,
    pub answered: usize,
    pub relayed: usize,
}

impl Tally {
    /// Rank `rank`'s facts went from `before` to `after` (`None`: no entry).
    pub fn change(&mut self, rank: u32, before: Option<RankFacts>, after: Option<RankFacts>) {
        let (b, a) = (before.unwrap_or_default(), after.unwrap_or_default());
        if b == a {
            return;
        }
        if b.progress != a.progress {
            if let Some(t) = a.progress {
                self.newest.get_mut().push((t, rank));
            }
        }
        let count = |n: &mut usize, was: bool, is: bool| match (was, is) {
            (false, true) => *n += 1,
            (true, false) => *n -= 1,
            _ => {}
        };
        count(&mut self.live, b.live, a.live);
        count(&mut self.long_phase, b.long_phase, a.long_phase);
        count(&mut self.answered, b.answered, a.answered);
        count(&mut self.relayed, b.relayed, a.relayed);
    }

    /// The newest progress of a live rank other than `but`, `progress`
    /// saying what each rank's is now ([`RankFacts::progress_of`]).
    /// Entries no longer a rank's progress are dropped as they come to the
    /// top.
    pub fn newest_progress(
        &self,
        but: Option<u32>,
        progress: impl Fn(u32) -> Option<Instant>,
    ) -> Option<Instant> {
        let mut heap = self.newest.borrow_mut();
        compact(&mut heap, self.live, &progress);
        // `but`'s own entry, held out while the next is looked for (a
        // copy of it, pushed twice, is dropped).
        let mut own = None;
        let found = loop {
            let Some(&(t, r)) = heap.peek() else {
                break None;
            };
            if progress(r) != Some(t) || own == Some((t, r)) {
                heap.pop();
            } else if Some(r) == but {
                own = heap.pop();
            } else {
                break Some(t);
            }
        };
        heap.extend(own);
        found
    }

    /// Drop the entries no longer a rank's progress once there are more
    /// than twice as many as live ranks (and a thousand): a walk over the
    /// heap, never over the ranks, once in as many reports as there are
    /// ranks (constant work per report, amortised). Done at each reply's
    /// [`Tally::newest_progress`] and at each tick.
    pub fn compact(&mut self, progress: impl Fn(u32) -> Option<Instant>) {
        compact(self.newest.get_mut(), self.live, &progress);
    }

    pub fn clear(&mut self) {
        *self = Tally::default();
    }
}

/// [`Tally::compact`] of `heap`, for `live` live ranks.
fn compact(
    heap: &mut BinaryHeap<(Instant, u32)>,
    live: usize,
    progress: &impl Fn(u32) -> Option<Instant>,
) {
    if heap.len() <= 2 * live + 1024 {
        return;
    }
    let mut now: Vec<(Instant, u32)> = std::mem::take(heap)
        .into_vec()
        .into_iter()
        .filter(|&(t, r)| progress(r) == Some(t))
        .collect();
    now.sort_unstable();
    now.dedup();
    *heap = BinaryHeap::from(now);
}

/// Every rank's entry, and how many entries the walks over them visited:
/// what the work-counting test reads (a report must not walk every rank;
/// a tick, a judgment or a status may). Ranks are dense (0 to the world
/// size, checked before they get here): a rank's entry is found by index.
/// A slot is a pointer, so that a token holder naming the highest rank of
/// a job of unknown size costs 8 MiB, not the entries of a million ranks.
#[derive(Default)]
pub(super) struct Ranks {
    slots: Vec<Option<Box<(u32, Entry)>>>,
    len: usize,
    visited: Cell<u64>,
}

impl Ranks {
    pub fn get(&self, rank: &u32) -> Option<&Entry> {
        self.slots
            .get(*rank as usize)
            .and_then(|s| s.as_deref().map(|(_, e)| e))
    }

    pub fn insert(&mut self, rank: u32, entry: Entry) -> Option<Entry> {
        let i = rank as usize;
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, || None);
        }
        match &mut self.slots[i] {
            Some(slot) => Some(std::mem::replace(&mut slot.1, entry)),
            empty => {
                *empty = Some(Box::new((rank, entry)));
                self.len += 1;
                None
            }
        }
    }

    pub fn clear(&mut self) {
        self.slots.clear();
        self.len = 0;
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// A walk over every entry, ascending by rank, counted.
    pub fn iter(&self) -> impl Iterator<Item = (&u32, &Entry)> + '_ {
        let visited = &self.visited;
        self.slots
            .iter()
            .filter_map(|s| s.as_deref().map(|(r, e)| (r, e)))
            .inspect(move |_| visited.set(visited.get() + 1))
    }

    pub fn values(&self) -> impl Iterator<Item = &Entry> + '_ {
        self.iter().map(|(_, e)| e)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&u32, &mut Entry)> + '_ {
        let visited = &self.visited;
        self.slots
            .iter_mut()
            .filter_map(|s| s.as_deref_mut().map(|(r, e)| (&*r, e)))
            .inspect(move |_| visited.set(visited.get() + 1))
    }

    /// Entries visited by walks so far.
    pub fn visited(&self) -> u64 {
        self.visited.get()
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::coordinator::protocol::{ExitInfo, Report, VERSION};
    use std::time::Duration;

    /// What the tally stands for, by walking every rank as the code did.
    fn walked(v: &JobView, rank: Option<u32>, now: Instant) -> (Option<f64>, bool, Option<usize>) {
        let live = || {
            v.ranks
                .iter()
                .filter(|(_, e)| e.report.state != RankState::Exited && !e.lost)
        };
        let others = || live().filter(move |(r, _)| Some(**r) != rank);
        let age =
            if others().any(|(_, e)| e.report.long_phase && e.report.state == RankState::Running) {
                Some(0.0)
            } else {
                others()
                    .filter_map(|(_, e)| e.last_step_at)
                    .max()
                    .map(|t| now.saturating_duration_since(t).as_secs_f64())
            };
        let probed = live().all(|(_, e)| {
            let p = e.probe_says();
            e.report.probe_seq >= v.probes_asked && (p.probed || p.waiting_on_peer.is_some())
        });
        let missing = v
            .pending
            .as_ref()
            .map(|p| live().filter(|(r, _)| !p.confirmed.contains_key(r)).count());
        (age, probed, missing)
    }

    fn counted(v: &JobView, rank: Option<u32>, now: Instant) -> (Option<f64>, bool, Option<usize>) {
        (
            v.job_progress_age_for(rank, now),
            v.probes_complete(),
            v.pending.as_ref().map(|p| v.tally.live - p.confirmed_live),
        )
    }

    /// A pseudo-random walk of reports (running, stalled, exited, in a long
    /// phase, probed, confirming), ticks that take silent ranks for lost,
    /// checkpoints asked and settled, and a new attempt: after every move
    /// the tally answers what a walk over every rank answers.
    #[test]
    fn the_tally_answers_what_a_walk_would() {
        let t0 = Instant::now();
        let cfg = CoordinatorConfig {
            lost_after: Duration::from_secs(5),
            hang_wait: Duration::from_secs(1000),
            ..Default::default()
        };
        let mut v = JobView::new("tally", 12, 0, cfg, t0);
        let mut now = t0;
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut step = 1;
        for i in 0..4000 {
            let rank = next(12) as u32;
            let state = match next(10) {
                0 => RankState::Stalled,
                1 => RankState::Exited,
                _ => RankState::Running,
            };
            let ckpt = v.pending.as_ref().map(|p| p.step);
            let asked = v.probes_asked;
            let r = Report {
                v: VERSION,
                rank,
                node: format!("n{}", rank / 4),
                attempt: v.attempt(),
                state,
                step: Some(step),
                progress_age_s: (next(4) > 0).then(|| next(30) as f64),
                phase: "train".into(),
                long_phase: next(6) == 0,
                probed: next(3) == 0,
                waiting_on_peer: (next(4) == 0).then_some(true),
                probe_seq: if next(3) == 0 { asked } else { 0 },
                checkpoints: ckpt.filter(|_| next(2) == 0).into_iter().collect(),
                exit: (state == RankState::Exited).then(|| ExitInfo {
                    code: 0,
                    class: crate::event::Class::Clean,
                    ..Default::default()
                }),
                ..Default::default()
            };
            v.on_report(r, now);
            match next(40) {
                0..=4 => {
                    now += Duration::from_secs(1 + next(4));
                    v.tick(now);
                }
                5 => {
                    v.failing = None;
                    let _ = v.request_checkpoint("test", now);
                }
                6 if i % 7 == 0 => {
                    v.new_attempt(v.attempt() + 1, now);
                }
                _ => {}
            }
            step += next(2);
            // Progress left behind is dropped, not kept for ever.
            assert!(v.tally.newest.borrow().len() <= 2 * v.tally.live + 1025);
            for who in [None, Some(rank), Some(next(12) as u32)] {
                assert_eq!(
                    counted(&v, who, now),
                    walked(&v, who, now),
                    "move {i}, rank {who:?}"
                );
            }
        }
    }
}
