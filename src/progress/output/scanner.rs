//! The line scanner: complete lines out of each read, the steps, phases,
//! epochs and figures in them.

use super::figures::{self, Figures};
use super::*;
use std::sync::atomic::Ordering;

/// Splits a byte stream into complete lines (`\n` or `\r` terminated) for the parser.
#[derive(Debug, Default)]
pub struct LineScanner {
    carry: Vec<u8>,
    overflow: bool,
    /// The training bar's total: the first unlabelled bar's.
    bar_total: Option<u64>,
    /// The step regex or a bar named a step: a log dict's epoch never does.
    steps_named: bool,
    /// A per-epoch bar's epochs: the one shown last, the steps of the
    /// epochs before it, and its longest total so far.
    epochs: Option<Epochs>,
}

/// Steps counted across a per-epoch bar's epochs ([`Mark::EpochBar`]).
#[derive(Clone, Copy, Debug, Default)]
struct Epochs {
    epoch: u64,
    before: u64,
    longest: u64,
}

impl Epochs {
    /// The step of `count` in `epoch` of a bar of `total`: the epochs seen
    /// before it count their longest total (the last one is shorter when
    /// training ends at `max_steps` inside it); epochs never seen (the
    /// first one shown after a resume, one skipped) count this one's.
    fn step(this: &mut Option<Epochs>, epoch: u64, count: u64, total: u64) -> u64 {
        let e = match *this {
            Some(mut e) if epoch > e.epoch => {
                e.before = e
                    .before
                    .saturating_add(e.longest)
                    .saturating_add((epoch - e.epoch - 1).saturating_mul(total));
                e.epoch = epoch;
                e.longest = total;
                e
            }
            Some(mut e) if epoch == e.epoch => {
                e.longest = e.longest.max(total);
                e
            }
            // The first epoch shown, or one before it (another run).
            _ => Epochs {
                epoch,
                before: epoch.saturating_mul(total),
                longest: total,
            },
        };
        *this = Some(e);
        e.before
            .saturating_add(count)
            .min(crate::progress::MAX_STEP)
    }
}

impl LineScanner {
    /// Feed one read's bytes; returns the marks found in the lines it completed.
    ///
    /// A partial line left at the end is looked at too: a step it already
    /// names ([`Parser::partial_step`], a tqdm frame) is reported now, not
    /// when the next frame ends it.
    ///
    /// Before them, until the first step, a line saying a checkpoint was
    /// loaded ([`Mark::Loaded`]; one split across two reads is missed).
    pub fn feed(&mut self, parser: &Parser, chunk: &[u8]) -> Vec<Mark> {
        let loaded = if parser.settled.load(Ordering::Relaxed) {
            None
        } else {
            parser.loads.last(chunk)
        };
        let marks = self.feed_marks(parser, chunk);
        match loaded {
            None => marks,
            Some(line) => std::iter::once(Mark::Loaded(line)).chain(marks).collect(),
        }
    }

    fn feed_marks(&mut self, parser: &Parser, chunk: &[u8]) -> Vec<Mark> {
        let mut marks = self.feed_lines(parser, chunk);
        if !chunk.is_empty()
            && !self.overflow
            && !self.carry.is_empty()
            && !matches!(chunk.last(), Some(b'\n' | b'\r'))
        {
            if let Some(m) = parser.partial_step(&self.carry) {
                // A whole bar frame (it ends with its `]`) gives its rate
                // too: the trainer's own account of a step's time.
                if self.carry.ends_with(b"]") && figures::may_hold(&self.carry) {
                    let f = figures::of_line(&self.carry, true);
                    if !f.is_empty() {
                        marks.push(Mark::Figures(Seen(f)));
                    }
                }
                marks.push(m);
                marks = compact(marks);
            }
        }
        self.resolve(parser, marks)
    }

    /// Bars made steps (the training bar, known by its total: the first
    /// bar's) or activity (another bar: HF's evaluation bar); a log dict's
    /// epoch the step it names (epoch × steps per epoch, when announced and
    /// no bar names the steps) or activity.
    fn resolve(&mut self, parser: &Parser, mut marks: Vec<Mark>) -> Vec<Mark> {
        let per_epoch = parser.announced.load(Ordering::Relaxed);
        // A step the step regex or a bar named wins: the epoch is then
        // life, as without the announcement.
        self.steps_named |= marks
            .iter()
            .any(|m| matches!(m, Mark::Step(_) | Mark::Bar { .. } | Mark::EpochBar { .. }));
        if self.steps_named || marks.iter().any(|m| matches!(m, Mark::Epoch(_))) {
            parser.settled.store(true, Ordering::Relaxed);
        }
        for m in marks.iter_mut() {
            if let Mark::Epoch(e) = *m {
                let step = match (self.bar_total, self.steps_named) {
                    (None, false) => ((e as f64 / 1e6) * per_epoch as f64).round() as u64,
                    _ => 0,
                };
                *m = if step > 0 {
                    Mark::Step(step)
                } else {
                    Mark::Activity(e)
                };
                continue;
            }
            if let Mark::EpochBar {
                epoch,
                count,
                total,
            } = *m
            {
                *m = Mark::Step(Epochs::step(&mut self.epochs, epoch, count, total));
                continue;
            }
            if let Mark::Bar { count, total } = *m {
                // A bar that shows no total (`26/?`: Lightning's after a
                // resume) is life, never the step's name.
                if total == 0 {
                    *m = Mark::Activity(count);
                    continue;
                }
                let training = *self.bar_total.get_or_insert(total);
                // A bar at 0 has done no step yet (and after a resume the
                // HF Trainer draws 0 before it jumps to where it resumed).
                *m = if total == training && count > 0 {
                    Mark::Step(count)
                } else {
                    Mark::Activity(count)
                };
            }
        }
        settle_activity(marks)
    }

    fn feed_lines(&mut self, parser: &Parser, chunk: &[u8]) -> Vec<Mark> {
        // The announcement comes once, before the first step; until it has
        // come, one literal search of each read (a split line is missed:
        // the epochs stay activity).
        // The same holds for the load lines ([`LineScanner::feed`]).
        if !parser.settled.load(Ordering::Relaxed) {
            if parser.announced.load(Ordering::Relaxed) == 0 {
                if let Some(n) = parser.per_epoch_in(chunk) {
                    parser.announced.store(n, Ordering::Relaxed);
                }
            }
            // Nor past the start of the output.
            let read = parser
                .looked
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            if read > ANNOUNCEMENT_WITHIN {
                parser.settled.store(true, Ordering::Relaxed);
            }
        }
        let Some(last_nl) = chunk.iter().rposition(|&b| b == b'\n' || b == b'\r') else {
            self.push_carry(chunk);
            return Vec::new();
        };
        let (complete, rest) = chunk.split_at(last_nl + 1);
        let mut marks = Vec::new();
        if !self.carry.is_empty() || self.overflow {
            // Finish the carried line with the head of this chunk.
            let head_end = complete
                .iter()
                .position(|&b| b == b'\n' || b == b'\r')
                .map_or(complete.len(), |p| p + 1);
            if !self.overflow {
                self.carry.extend_from_slice(&complete[..head_end]);
                marks.extend(parser.scan(&self.carry));
            }
            self.carry.clear();
            self.overflow = false;
            marks.extend(parser.scan(&complete[head_end..]));
        } else {
            marks.extend(parser.scan(complete));
        }
        self.push_carry(rest);
        compact(marks)
    }

    /// Scan whatever partial line is left at end of stream.
    pub fn finish(&mut self, parser: &Parser) -> Vec<Mark> {
        let marks = if self.overflow {
            Vec::new()
        } else {
            parser.scan(&self.carry)
        };
        self.carry.clear();
        self.resolve(parser, marks)
    }

    fn push_carry(&mut self, bytes: &[u8]) {
        if self.overflow {
            return;
        }
        if self.carry.len() + bytes.len() > MAX_CARRY {
            self.carry.clear();
            self.overflow = true;
        } else {
            self.carry.extend_from_slice(bytes);
        }
    }
}

/// Activity at most once on each side of the phase marker, last on its
/// side: a bar that is not the training bar is life, as a log dict's epoch
/// is, and when a read shows both, the one printed last says it (as
/// [`compact`] keeps one activity of several).
fn settle_activity(marks: Vec<Mark>) -> Vec<Mark> {
    let is_activity = |m: &Mark| matches!(m, Mark::Activity(_));
    let marker = marks
        .iter()
        .position(|m| matches!(m, Mark::Phase(_) | Mark::SyncSave(_)))
        .unwrap_or(marks.len());
    let settled = |side: &[Mark]| {
        side.iter().filter(|m| is_activity(m)).count() <= 1
            && side
                .iter()
                .position(is_activity)
                .is_none_or(|i| i + 1 == side.len())
    };
    let after = (marker + 1).min(marks.len());
    if settled(&marks[..marker]) && settled(&marks[after..]) {
        return marks;
    }
    let side = |part: &[Mark]| {
        let last = part.iter().rfind(|m| is_activity(m)).cloned();
        let mut out: Vec<Mark> = part.iter().filter(|m| !is_activity(m)).cloned().collect();
        out.extend(last);
        out
    };
    let mut out = side(&marks[..marker]);
    out.extend(marks.get(marker).cloned());
    out.extend(side(&marks[after..]));
    out
}

/// What several scans of one read said, as one scan of the whole would
/// ([`Parser::scan`]): the figures first (the newest value of each), then
/// the last step before the last phase marker, the marker, and the last
/// step after it, in order. Whether a step after the marker ends the phase
/// is the stall policy's to say (a redraw of the same step does not).
fn compact(marks: Vec<Mark>) -> Vec<Mark> {
    if marks.len() <= 1 {
        return marks;
    }
    let mut seen = Figures::new();
    for m in marks.iter().rev() {
        if let Mark::Figures(Seen(f)) = m {
            figures::merge(&mut seen, f.clone());
        }
    }
    let activity = marks
        .iter()
        .rfind(|m| matches!(m, Mark::Activity(_) | Mark::Epoch(_)))
        .cloned();
    let last_phase = marks
        .iter()
        .rposition(|m| matches!(m, Mark::Phase(_) | Mark::SyncSave(_)));
    let figures = (!seen.is_empty()).then_some(Mark::Figures(Seen(seen)));
    // The steps, the marker and a completed save, in the order printed (a
    // save that completed before the last step: training waited for it).
    let last_of = |from: usize, to: usize, f: &dyn Fn(&Mark) -> bool| {
        marks[from..to].iter().rposition(f).map(|i| from + i)
    };
    let split = last_phase.unwrap_or(marks.len());
    let step = |m: &Mark| matches!(m, Mark::Step(_) | Mark::Bar { .. } | Mark::EpochBar { .. });
    let mut kept: Vec<usize> = [
        last_of(0, split, &step),
        last_phase,
        last_of((split + 1).min(marks.len()), marks.len(), &step),
        last_of(0, marks.len(), &|m| matches!(m, Mark::CheckpointDone(_))),
    ]
    .into_iter()
    .flatten()
    .collect();
    kept.sort_unstable();
    figures
        .into_iter()
        .chain(kept.into_iter().map(|i| marks[i].clone()))
        .chain(activity)
        .collect()
}
