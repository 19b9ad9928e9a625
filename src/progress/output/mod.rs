//! Output passthrough and step parsing.
//!
//! One thread per stream reads the trainer's pipe, writes every byte to
//! resilio's own stdout/stderr at once (no buffering beyond what one `read`
//! returns), keeps a bounded tail for diagnostics, and scans complete lines
//! for steps and phase markers. Only the last step of each read is reported:
//! lines that arrive in one read arrived at the same moment.
//!
//! If resilio's own output is gone (EPIPE, closed fd), the thread keeps
//! draining the pipe so the trainer never blocks on a full pipe: fail open.

use super::figures::{self, Figures};
use super::{Kind, ProgressEvent, Sender, Source};
use regex::bytes::Regex;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

mod loads;
pub use loads::says_done;
mod not_steps;
mod pump;
mod scanner;
mod tail;

use not_steps::{an_error_line, in_a_name, names_a_restore, not_the_trainers};

pub use pump::{labelled, spawn_pump, take_stderr_mid_line, write_all_fd, Lines};
pub use scanner::LineScanner;
pub use tail::Tail;

/// Longest partial line carried between reads; longer lines are not scanned.
const MAX_CARRY: usize = 16 * 1024;
/// Read size, and the most passed on at a time.
const CHUNK: usize = 256 * 1024;
/// Pipe buffer asked for (fewer context switches under heavy output). As
/// large as a chunk: larger measured slower (cache), see `benches/agent.rs`.
const PIPE_SIZE: usize = CHUNK;

/// Pulls steps and phase markers out of output text.
///
/// Only the last step and the last phase marker of a piece of text matter
/// (lines read together arrived together), so with the default regexes a
/// literal prefilter (SIMD substring search) finds candidate lines and the
/// full regexes run only on candidates, from the last one backwards, until
/// a step is found. Text without candidates costs one prefilter pass; this
/// is what keeps passthrough near `cat` speed. A custom regex disables the
/// prefilter (its literals are unknown) and is run over the whole text.
#[derive(Clone, Debug)]
pub struct Parser {
    step: Regex,
    checkpoint: Option<Regex>,
    eval: Option<Regex>,
    prefilter: Option<Regex>,
    /// The phase markers' literals alone, to find a marker before the last
    /// step of a read (see [`Parser::scan`]).
    phase_prefilter: Option<Regex>,
    epoch: Regex,
    per_epoch: Regex,
    /// The steps per epoch the trainer announced (0: not yet), shared by
    /// the clones of a rank's parser: HF logs its banner to stderr and
    /// prints its log dicts to stdout.
    announced: Arc<AtomicU64>,
    /// A step or a log dict's epoch was seen on either stream: the
    /// announcement, which comes before them, is no longer looked for.
    settled: Arc<AtomicBool>,
    /// Bytes searched for the announcement.
    looked: Arc<AtomicU64>,
    /// Completion lines of checkpoint saves (with the default regexes).
    done: Option<Regex>,
    /// A synchronous save's banner that names its step (with the default
    /// regexes): HF's `Saving model checkpoint to out/checkpoint-25`.
    sync_save: Option<Regex>,
    /// A line saying a checkpoint was loaded ([`loads`]), looked for until
    /// the first step.
    loads: loads::Loads,
}

/// What one piece of text said, in order of appearance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// The figures (loss, throughput, ...) printed with or after the
    /// step that follows, or with no step (`{'loss': ...}` on its own line).
    Figures(Seen),
    Step(u64),
    Phase(&'static str),
    /// A frame of an unlabelled bar (`  5%|▌   | 120/2400 [`): its count and
    /// total. The line scanner makes it a [`Mark::Step`] when it is the
    /// training bar (the first bar seen, by its total), else an
    /// [`Mark::Activity`] (HF's evaluation bar under the training bar).
    Bar {
        count: u64,
        total: u64,
    },
    /// A frame of a per-epoch bar (Lightning's `Epoch 2:  25%|... | 5/20 [`):
    /// the line scanner makes it the step the epochs so far and this count
    /// make (the last epoch's bar is shorter: it ends at `max_steps`).
    EpochBar {
        epoch: u64,
        count: u64,
        total: u64,
    },
    /// Life that names no step: another bar's count, or the `epoch` of a log
    /// dict (`{'loss': '4.7', ..., 'epoch': '0.3125'}`, HF with
    /// `disable_tqdm`) in millionths. A new value is progress; it names
    /// nothing and is never a step interval.
    Activity(u64),
    /// A log dict's `epoch`, in millionths: the line scanner makes it the
    /// step it names when the trainer printed its steps per epoch (HF's
    /// `Num update steps per epoch = 32`) and no bar names the steps, else
    /// [`Mark::Activity`].
    Epoch(u64),
    /// A checkpoint save completed, as the trainer says: Megatron-LM's (and
    /// NeMo's, through Megatron core) `successfully saved checkpoint from
    /// iteration     100 to /ckpt`, asynchronous saves included (printed
    /// when the save is finalised).
    CheckpointDone(u64),
    /// The checkpoint marker of a synchronous save that names its step
    /// (HF's `Saving model checkpoint to out/checkpoint-25`): the
    /// checkpoint phase, and the save of step 25 is complete once a later
    /// step is printed (the Trainer trains on only after `save` returned).
    SyncSave(u64),
    /// A line saying a checkpoint was loaded, before the first step
    /// ([`loads`]).
    Loaded(String),
}

/// Figures read from output ([`crate::progress::figures`]), compared bit
/// for bit (a NaN loss equals itself here).
#[derive(Clone, Debug, Default)]
pub struct Seen(pub Figures);

impl PartialEq for Seen {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|((a, x), (b, y))| a == b && x.to_bits() == y.to_bits())
    }
}

impl Eq for Seen {}

/// How many lines without a step are searched for figures, from the last.
const FIGURE_LINES: usize = 8;

/// Substrings of which every match of the default regexes contains one
/// (case variants as trainers print them: `step`, `Step`, `STEP`, ...).
/// A line whose keyword has another case (`sTep 5`, `[Batch=3/10]`,
/// `NUM_UPDATES=9`) matches the default regex but has no literal: with the
/// default regexes it is not read (found by fuzzing). Kept so: an ASCII
/// case-insensitive prefilter measured 65 times slower (0.5 GB/s against
/// 33 GB/s on output without steps), and trainers print these words as
/// listed. Public for the fuzz target, which compares the two paths.
pub const DEFAULT_LITERALS: &[&str] = &[
    "step",
    "Step",
    "STEP",
    "iter",
    "Iter",
    "ITER",
    "num_updates",
    "batch=",
    "%|",
    // Lightning's Rich bar (`Epoch 0/9 ━━╸━━ 5/12 0:00:00`).
    "Epoch ",
    // Lightning's bar after a resume (`Training: |   | 26/? [`).
    "Training: ",
    "aving",
    "AVING",
    "save_checkpoint",
    "valuat",
    "VALUAT",
    "alidation",
    "ALIDATION",
    // Lines with figures but no step (`{'loss': 0.09, ...}`): figures only.
    "loss",
    // Log dicts with an epoch and no step (HF with disable_tqdm).
    "'epoch'",
    "\"epoch\"",
];

/// A log dict's epoch: HF's `{'loss': '4.709', ..., 'epoch': '0.3125'}`
/// (transformers 5 quotes the values, 4 does not).
const EPOCH_REGEX: &str =
    r#"(?m)^\s*\{.*['"]epoch['"]\s*:\s*['"]?(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)['"]?\s*[,}]"#;

/// The steps per epoch a trainer announces at its start: the HF Trainer's
/// banner (`  Num update steps per epoch = 32`, transformers 5 at log level
/// info, as the HF example scripts set it), accelerate and diffusers
/// scripts' alike.
const PER_EPOCH_REGEX: &str = r"(?:steps|Steps|STEPS) per epoch\s*[=:]\s*(\d[\d,]{0,12})";

/// The output an announcement of the steps per epoch is looked for in: the
/// start of the run (HF's banner follows the model's loading messages).
const ANNOUNCEMENT_WITHIN: u64 = 16 << 20;

/// A save's completion line; group 1 is the checkpoint's step.
const CHECKPOINT_DONE_REGEX: &str = r"successfully saved checkpoint from iteration\s+(\d{1,15})";

/// The Hugging Face Trainer's save banner (at log level info), whose
/// directory names the step; its saves are synchronous. Group 1: the step.
const SYNC_SAVE_REGEX: &str =
    r"Saving model checkpoint to (?:[^\r\n]*/)?checkpoint-(\d{1,15})(?:/|\s|$)";

/// A step as the step regex found it: the number, the total when it came
/// from an unlabelled bar (0: a bar that shows no total, `26/?`), and, for
/// a per-epoch counter (Lightning's `Epoch 2: ... 5/20 [`), the epoch and
/// the bar's total (the number is then epoch × total + count).
type Count = (u64, Option<u64>, Option<(u64, u64)>);

fn mark_of((n, total, epoch): Count) -> Mark {
    match (total, epoch) {
        (_, Some((epoch, per_epoch))) => Mark::EpochBar {
            epoch,
            count: n - epoch * per_epoch,
            total: per_epoch,
        },
        (Some(total), None) => Mark::Bar { count: n, total },
        (None, None) => Mark::Step(n),
    }
}

/// The literals of [`DEFAULT_LITERALS`] that only phase markers contain.
const PHASE_LITERALS: &[&str] = &[
    "aving",
    "AVING",
    "save_checkpoint",
    "valuat",
    "VALUAT",
    "alidation",
    "ALIDATION",
];

impl Parser {
    /// A parser from the step regex and optional phase regexes.
    pub fn new(step: Regex, checkpoint: Option<Regex>, eval: Option<Regex>) -> Self {
        use crate::progress::patterns::{
            DEFAULT_CHECKPOINT_REGEX, DEFAULT_EVAL_REGEX, DEFAULT_PROGRESS_REGEX,
        };
        let is =
            |re: &Option<Regex>, default: &str| re.as_ref().is_none_or(|r| r.as_str() == default);
        let defaults = step.as_str() == DEFAULT_PROGRESS_REGEX
            && is(&checkpoint, DEFAULT_CHECKPOINT_REGEX)
            && is(&eval, DEFAULT_EVAL_REGEX);
        super::figures::prepare();
        let prefilter = defaults.then(|| {
            let alternation: Vec<String> =
                DEFAULT_LITERALS.iter().map(|l| regex::escape(l)).collect();
            Regex::new(&alternation.join("|")).expect("literal prefilter")
        });
        let phase_prefilter = defaults.then(|| {
            let alternation: Vec<String> =
                PHASE_LITERALS.iter().map(|l| regex::escape(l)).collect();
            Regex::new(&alternation.join("|")).expect("phase prefilter")
        });
        Parser {
            step,
            checkpoint,
            eval,
            prefilter,
            phase_prefilter,
            epoch: Regex::new(EPOCH_REGEX).expect("epoch regex"),
            per_epoch: Regex::new(PER_EPOCH_REGEX).expect("per epoch regex"),
            announced: Arc::new(AtomicU64::new(0)),
            settled: Arc::new(AtomicBool::new(false)),
            looked: Arc::new(AtomicU64::new(0)),
            done: defaults
                .then(|| Regex::new(CHECKPOINT_DONE_REGEX).expect("checkpoint done regex")),
            sync_save: defaults.then(|| Regex::new(SYNC_SAVE_REGEX).expect("sync save regex")),
            loads: loads::Loads::new(),
        }
    }

    /// The steps per epoch announced in `text`, if any.
    fn per_epoch_in(&self, text: &[u8]) -> Option<u64> {
        let c = self.per_epoch.captures_iter(text).last()?;
        let digits: String = std::str::from_utf8(c.get(1)?.as_bytes())
            .ok()?
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        digits.parse().ok().filter(|n| *n > 0)
    }

    /// The last log dict's epoch in `text`, in millionths.
    fn last_epoch(&self, text: &[u8]) -> Option<u64> {
        let c = self.epoch.captures_iter(text).last()?;
        let e: f64 = std::str::from_utf8(c.get(1)?.as_bytes())
            .ok()?
            .parse()
            .ok()?;
        (e.is_finite() && (0.0..1e9).contains(&e)).then(|| (e * 1e6).round() as u64)
    }

    /// The step named by one match: `epoch` × `per_epoch` + `batch` when
    /// those three groups took part (a per-epoch counter made global), else
    /// group `step`, else the first group that took part in the match, else
    /// the first run of digits in the whole match. Returns the step, the
    /// offset of its digits and, for a bar, its total.
    fn step_of(&self, caps: &regex::bytes::Captures<'_>) -> Option<(u64, usize, Count)> {
        if let (Some(e), Some(b), Some(t)) = (
            caps.name("epoch"),
            caps.name("batch"),
            caps.name("per_epoch"),
        ) {
            let num = |m: regex::bytes::Match<'_>| -> Option<u64> {
                std::str::from_utf8(m.as_bytes()).ok()?.trim().parse().ok()
            };
            let (epoch, per_epoch) = (num(e)?, num(t)?);
            let step = epoch.checked_mul(per_epoch)?.checked_add(num(b)?)?;
            return (step <= crate::progress::MAX_STEP).then_some((
                step,
                e.start(),
                (step, None, Some((epoch, per_epoch))),
            ));
        }
        let m = caps
            .name("step")
            .or_else(|| caps.iter().skip(1).flatten().next())
            .or_else(|| caps.get(0))?;
        let bytes = m.as_bytes();
        let start = bytes.iter().position(u8::is_ascii_digit)?;
        let end = bytes[start..]
            .iter()
            .position(|b| !b.is_ascii_digit())
            .map_or(bytes.len(), |e| start + e);
        let step: u64 = std::str::from_utf8(&bytes[start..end]).ok()?.parse().ok()?;
        let total = match caps.name("bar_total") {
            Some(t) => std::str::from_utf8(t.as_bytes()).ok()?.parse().ok(),
            None => caps.name("open_count").map(|_| 0),
        };
        (step <= crate::progress::MAX_STEP).then_some((
            step,
            m.start() + start,
            (step, total, None),
        ))
    }

    /// The last step in `text` with the start of the line it is on. Lines
    /// Slurm writes itself (`srun: ...`, `slurmstepd: ... *** STEP 27.0 ON n1
    /// CANCELLED`) and lines of the ranks' own agents (`resilio: rank 0 on
    /// n1 stalled: no progress since step 12`), both seen by the job-level
    /// `resilio run -- srun`, are no training progress, whatever they look
    /// like.
    fn last_step(&self, text: &[u8]) -> Option<(usize, Count)> {
        let mut last = None;
        for caps in self.step.captures_iter(text) {
            if let Some((_, at, count)) = self.step_of(&caps) {
                let ls = line_start(text, at);
                let line = &text[ls..];
                let before = &text[ls..at];
                if not_the_trainers(before)
                    || in_a_name(text, at)
                    || an_error_line(line)
                    || names_a_restore(before)
                {
                    continue;
                }
                last = Some((ls, count));
            }
        }
        last
    }

    /// The last phase marker in `text` with its start offset.
    fn last_phase(&self, text: &[u8]) -> Option<(usize, &'static str)> {
        let mut phase: Option<(usize, &'static str)> = None;
        for (re, name) in [(&self.checkpoint, "checkpoint"), (&self.eval, "eval")] {
            if let Some(m) = re.as_ref().and_then(|re| re.find_iter(text).last()) {
                if phase.is_none_or(|(at, _)| m.start() > at) {
                    phase = Some((m.start(), name));
                }
            }
        }
        phase
    }

    /// Scan complete text: the last step, then the last phase marker if it
    /// is on the step's line or after it (`saving checkpoint at step 10`
    /// enters the checkpoint phase at step 10; a marker followed by later
    /// steps is over already).
    ///
    /// A log dict's epoch after the last step comes last, as activity.
    pub fn scan(&self, text: &[u8]) -> Vec<Mark> {
        let (step, phase, seen, epoch, done) = match &self.prefilter {
            None => {
                let step = self.last_step(text);
                let seen = figures_from(text, step.map(|(at, _)| at));
                let epoch = self.last_epoch(&text[step.map_or(0, |(at, _)| at)..]);
                (step, self.last_phase(text), seen, epoch, self.done_in(text))
            }
            Some(pf) => self.scan_candidates(pf, text),
        };
        let mut marks = Vec::new();
        if !seen.is_empty() {
            marks.push(Mark::Figures(Seen(seen)));
        }
        let phase_mark = |p_at: usize, p: &'static str| self.phase_mark(text, p_at, p);
        match (step, phase) {
            (Some((s_line, s)), Some((p_at, p))) if p_at >= s_line => {
                marks.push(mark_of(s));
                marks.push(phase_mark(p_at, p));
            }
            (Some((_, s)), Some((p_at, p))) => {
                // The marker came before the last step's line. Whether that
                // step ends the phase is the stall policy's to say: a bar
                // redrawn at the step the phase began at (tqdm's training
                // bar under HF's evaluation banner) does not, a later step
                // does. So the step before the marker, if this text has
                // one, then the marker, then the last step, in order.
                if let Some(before) = self.count_in(&text[..line_start(text, p_at)]) {
                    marks.push(mark_of(before));
                }
                marks.push(phase_mark(p_at, p));
                marks.push(mark_of(s));
            }
            (Some((_, s)), None) => marks.push(mark_of(s)),
            (None, Some((p_at, p))) => marks.push(phase_mark(p_at, p)),
            (None, None) => {}
        }
        if let Some((at, saved)) = done {
            // In the order printed: a save that completed before the last
            // step's line goes before that step (training waited for it).
            let last = marks.iter().rposition(|m| {
                matches!(m, Mark::Step(_) | Mark::Bar { .. } | Mark::EpochBar { .. })
            });
            match (last, step) {
                (Some(i), Some((s_line, _))) if at < s_line => {
                    marks.insert(i, Mark::CheckpointDone(saved))
                }
                _ => marks.push(Mark::CheckpointDone(saved)),
            }
        }
        if let Some(e) = epoch {
            marks.push(Mark::Epoch(e));
        }
        marks
    }

    /// Candidate lines (those with a prefilter hit), walked from the last.
    /// The text is searched in windows from its end, so a read that ends
    /// with a step line costs a few kilobytes of search, not the whole read.
    #[allow(clippy::type_complexity)]
    fn scan_candidates(
        &self,
        pf: &Regex,
        text: &[u8],
    ) -> (
        Option<(usize, Count)>,
        Option<(usize, &'static str)>,
        Figures,
        Option<u64>,
        Option<(usize, u64)>,
    ) {
        const WINDOW: usize = 4096;
        let mut phase: Option<(usize, &'static str)> = None;
        let mut done: Option<(usize, u64)> = None;
        let mut epoch: Option<u64> = None;
        let mut seen = Figures::new();
        let mut looked = 0;
        let mut lines: Vec<(usize, usize)> = Vec::new();
        let mut end = text.len();
        while end > 0 {
            // The window starts at a line start, so no line is split.
            let start = line_start(text, end.saturating_sub(WINDOW));
            let window = &text[start..end];
            lines.clear();
            let mut pos = 0;
            while let Some(m) = pf.find_at(window, pos) {
                let ls = line_start(window, m.start());
                let le = memchr_eol(&window[m.end()..]).map_or(window.len(), |p| m.end() + p);
                lines.push((start + ls, start + le));
                pos = le.max(m.end());
                if pos >= window.len() {
                    break;
                }
            }
            for &(ls, le) in lines.iter().rev() {
                let line = &text[ls..le];
                if phase.is_none() {
                    phase = self.last_phase(line).map(|(at, p)| (ls + at, p));
                }
                if done.is_none() {
                    done = self.done_in(line).map(|(at, n)| (ls + at, n));
                }
                let step = self.last_step(line);
                if epoch.is_none() && step.is_none() {
                    epoch = self.last_epoch(line);
                }
                if looked < FIGURE_LINES {
                    looked += 1;
                    if figures::may_hold(line) {
                        figures::merge(&mut seen, figures::of_line(line, step.is_some()));
                    }
                }
                if let Some((_, s)) = step {
                    // A marker shortly before the step (in the window
                    // searched: an evaluation banner and the bar's redraw)
                    // is kept in order; one further back is over already.
                    if phase.is_none() {
                        phase = self
                            .phase_before(&text[start..ls])
                            .map(|(at, p)| (start + at, p));
                    }
                    // So is a save confirmed shortly before it.
                    if done.is_none() {
                        done = self
                            .done_in(&text[start..ls])
                            .map(|(at, n)| (start + at, n));
                    }
                    return (Some((ls, s)), phase, seen, epoch, done);
                }
            }
            if start == 0 {
                break;
            }
            end = start;
        }
        (None, phase, seen, epoch, done)
    }

    /// The mark of the phase marker at `at` in `text`: a synchronous save
    /// that names its step ([`Mark::SyncSave`]) when its line is one, else
    /// the phase. (Only the marker's own line is searched.)
    fn phase_mark(&self, text: &[u8], at: usize, phase: &'static str) -> Mark {
        if phase == "checkpoint" {
            if let Some(re) = &self.sync_save {
                let ls = line_start(text, at);
                let le = memchr_eol(&text[at..]).map_or(text.len(), |p| at + p);
                if let Some(n) = re
                    .captures(&text[ls..le])
                    .and_then(|c| std::str::from_utf8(c.get(1)?.as_bytes()).ok()?.parse().ok())
                {
                    return Mark::SyncSave(n);
                }
            }
        }
        Mark::Phase(phase)
    }

    /// The last save completion line in `text`: its offset and step.
    fn done_in(&self, text: &[u8]) -> Option<(usize, u64)> {
        let c = self.done.as_ref()?.captures_iter(text).last()?;
        let n = std::str::from_utf8(c.get(1)?.as_bytes())
            .ok()?
            .parse()
            .ok()?;
        Some((c.get(0)?.start(), n))
    }

    /// The step a line still being written already names, if its digits are
    /// followed by something. tqdm draws each frame as `\r` and the frame,
    /// with no line end: the frame is complete when written, and the next
    /// one may come seconds later (tqdm's monitor thread), or never (a hung
    /// trainer). A number at the very end may still grow (`step 12` of
    /// `step 120`) and is not taken; the patterns that read bars need the
    /// `[` after the total, so a bar cut short names nothing.
    pub fn partial_step(&self, partial: &[u8]) -> Option<Mark> {
        if let Some(pf) = &self.prefilter {
            if !pf.is_match(partial) {
                return None;
            }
        }
        let mut last = None;
        for caps in self.step.captures_iter(partial) {
            let Some((_, at, count)) = self.step_of(&caps) else {
                continue;
            };
            let digits = partial[at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if at + digits >= partial.len() || in_a_name(partial, at) {
                continue;
            }
            let before = &partial[line_start(partial, at)..at];
            if not_the_trainers(before) || names_a_restore(before) {
                continue;
            }
            last = Some(mark_of(count));
        }
        last
    }

    /// The last phase marker in `text` (the part of a read before its last
    /// step), found by the phase literals first: one pass of literal search
    /// over text without markers.
    fn phase_before(&self, text: &[u8]) -> Option<(usize, &'static str)> {
        let pf = self.phase_prefilter.as_ref()?;
        let mut lines: Vec<usize> = Vec::new();
        for m in pf.find_iter(text) {
            let ls = line_start(text, m.start());
            if lines.last() != Some(&ls) {
                lines.push(ls);
            }
        }
        lines.iter().rev().find_map(|&ls| {
            let le = memchr_eol(&text[ls..]).map_or(text.len(), |p| ls + p);
            self.last_phase(&text[ls..le]).map(|(at, p)| (ls + at, p))
        })
    }

    /// The step in one line, if any (used by tests and the progress file).
    pub fn step_in(&self, line: &[u8]) -> Option<u64> {
        self.count_in(line).map(|(n, _, _)| n)
    }

    fn count_in(&self, text: &[u8]) -> Option<Count> {
        match &self.prefilter {
            None => self.last_step(text).map(|(_, s)| s),
            Some(pf) => self.scan_candidates(pf, text).0.map(|(_, s)| s),
        }
    }
}

/// Figures in the step's line and the lines after it, or, with no step,
/// in the last [`FIGURE_LINES`] lines (newest first).
fn figures_from(text: &[u8], step_line: Option<usize>) -> Figures {
    let from = step_line.unwrap_or(0);
    let mut seen = Figures::new();
    let lines = text[from..]
        .split(|&b| b == b'\n' || b == b'\r')
        .filter(|l| !l.is_empty());
    let lines: Vec<&[u8]> = lines.collect();
    let n = lines.len();
    for (i, line) in lines.iter().enumerate().rev().take(FIGURE_LINES) {
        if figures::may_hold(line) {
            let on_step = step_line.is_some() && i == 0;
            figures::merge(&mut seen, figures::of_line(line, on_step));
        }
    }
    let _ = n;
    seen
}

/// Start of the line containing offset `at`.
fn line_start(text: &[u8], at: usize) -> usize {
    text[..at]
        .iter()
        .rposition(|&b| b == b'\n' || b == b'\r')
        .map_or(0, |p| p + 1)
}

/// Offset of the first line end in `text`.
fn memchr_eol(text: &[u8]) -> Option<usize> {
    text.iter().position(|&b| b == b'\n' || b == b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::patterns::{
        DEFAULT_CHECKPOINT_REGEX, DEFAULT_EVAL_REGEX, DEFAULT_PROGRESS_REGEX,
    };

    fn parser() -> Parser {
        Parser::new(
            Regex::new(DEFAULT_PROGRESS_REGEX).unwrap(),
            Some(Regex::new(DEFAULT_CHECKPOINT_REGEX).unwrap()),
            Some(Regex::new(DEFAULT_EVAL_REGEX).unwrap()),
        )
    }

    #[test]
    fn labels_go_before_each_line_across_writes() {
        let mut at = true;
        let mut out = labelled(b"1: ", b"step 1\nstep", &mut at);
        out.extend(labelled(b"1: ", b" 2\n\nx", &mut at));
        assert_eq!(out, b"1: step 1\n1: step 2\n1: \n1: x");
        assert!(!at);
        assert!(labelled(b"1: ", b"", &mut at).is_empty());
    }

    #[test]
    fn a_line_resuming_from_a_step_is_no_step() {
        let p = parser();
        for line in [
            &b"Resuming training from checkpoint with epoch 0 and global step 20"[..],
            b"  Continuing training from global step 20",
            b"[INFO] restored model at step 20",
            b"  Will skip to saved global_step 20",
        ] {
            assert_eq!(p.step_in(line), None, "{}", String::from_utf8_lossy(line));
            assert_eq!(p.partial_step(line), None);
        }
        // The words after the step say nothing of it.
        assert_eq!(
            p.step_in(b"step 21 | loss 2.0 | resumed 1 min ago"),
            Some(21)
        );
        assert_eq!(p.step_in(b"{'loss': 2.0, 'step': 21}"), Some(21));
    }

    #[test]
    fn a_step_in_a_file_name_is_no_step() {
        let p = parser();
        assert_eq!(
            p.step_in(b"Restoring states from the checkpoint path at /ck/epoch=3-step=200.ckpt"),
            None
        );
        assert_eq!(p.step_in(b"loading global_step200.pt"), None);
        assert_eq!(p.step_in(b"step=200. loss 2.1"), Some(200));
        assert_eq!(p.step_in(b"step 200.5% done"), Some(200));
    }

    #[test]
    fn slurms_own_messages_are_no_step_even_glued_to_a_frame() {
        let p = parser();
        assert_eq!(
            p.step_in(b"srun: launch/slurm: _step_signal: Terminating StepId=15.0"),
            None
        );
        assert_eq!(
            p.step_in(b" 70/150 [00:10<00:10, 7.0it/s]srun: launch/slurm: _step_signal: Terminating StepId=15.0"),
            None
        );
        assert_eq!(
            p.step_in(
                b"slurmstepd: error: *** STEP 15.0 ON n1 CANCELLED AT 2026-11-26T18:52:54 ***"
            ),
            None
        );
        assert_eq!(p.step_in(b"step 12 loss 2.0 (srun_steps 3)"), Some(12));
    }

    /// The job level reads srun's output, the ranks' agents' own lines among
    /// it: a stall's "no progress since step 12" is no step 12 done then
    /// (it turned a hang's stalled time into rework in the report).
    #[test]
    fn a_rank_agents_own_lines_are_no_step() {
        let p = parser();
        for line in [
            &b"resilio: rank 0 on n1 stalled: no progress since step 12 for 20.5s (limit 20.0s, step_adaptive)"[..],
            b"0: resilio: rank 0 on n1 stalled: no progress since step 12 for 20.5s",
            b" 70/150 [00:10<00:10, 7.0it/s]resilio: rank 1 last step 70",
        ] {
            assert_eq!(p.step_in(line), None, "{}", String::from_utf8_lossy(line));
        }
        assert_eq!(p.step_in(b"step 13 loss 2.0 (resilio_steps 3)"), Some(13));
    }

    #[test]
    fn an_error_message_naming_a_step_is_no_step() {
        let p = parser();
        for line in [
            &b"RuntimeError: injected failure in data pipeline at step 120"[..],
            b"[rank1]: RuntimeError: injected failure at step 120",
            b"torch.distributed.DistBackendError: step 7 lost its peer",
            b"UserWarning: step 3 took longer than expected",
            b"  File \"train.py\", line 40, in step 12",
            b"Traceback (most recent call last): step 9",
        ] {
            assert_eq!(p.step_in(line), None, "{}", String::from_utf8_lossy(line));
        }
        // Progress lines that merely mention an error are still progress.
        assert_eq!(p.step_in(b"step 120/300 | loss 0.25 | errors 0"), Some(120));
        assert_eq!(p.step_in(b"[rank0]: step 12 loss 2.0"), Some(12));
        assert_eq!(p.step_in(b"INFO: step 14 loss 2.0"), Some(14));
    }

    #[test]
    fn a_format_spec_in_a_quoted_source_line_is_no_step() {
        // A traceback quotes the line that raised (trial: "last step 5").
        let p = parser();
        assert_eq!(
            p.step_in(b"    print(f\"step {step:05d} loss {loss:.3f}\")"),
            None
        );
        assert_eq!(p.step_in(b"    log(f'step={step:6}')"), None);
        assert_eq!(p.step_in(b"step 5"), Some(5));
        assert_eq!(p.step_in(b"{'step': 12}"), Some(12));
        assert_eq!(p.step_in(b"{\"step\":12}"), Some(12));
        assert_eq!(p.step_in(b"{step:12}"), None);
    }

    #[test]
    fn numbers_beyond_the_step_bound_are_not_steps() {
        let p = parser();
        assert_eq!(
            p.step_in(b"step 9007199254740991"),
            Some(crate::progress::MAX_STEP)
        );
        assert_eq!(p.step_in(b"step 9007199254740992"), None);
        assert_eq!(p.step_in(b"step 99999999999999999999999"), None);
    }

    #[test]
    fn lines_split_across_reads_are_joined() {
        let p = parser();
        let mut s = LineScanner::default();
        assert!(s.feed(&p, b"noise\n iterat").is_empty());
        assert_eq!(
            s.feed(&p, b"ion      120/  10000 | loss 2.0\n"),
            vec![Mark::Figures(Seen(vec![("loss", 2.0)])), Mark::Step(120)]
        );
        assert_eq!(s.feed(&p, b"step 7\nstep 8\nstep 9"), vec![Mark::Step(8)]);
        assert_eq!(s.finish(&p), vec![Mark::Step(9)]);
    }

    #[test]
    fn phase_and_step_keep_their_order() {
        let p = parser();
        let mut s = LineScanner::default();
        assert_eq!(
            s.feed(&p, b"step 10\nsaving checkpoint at iteration 10\n"),
            // Megatron's save line names no "N/M" iteration: no step in it.
            vec![Mark::Step(10), Mark::Phase("checkpoint")]
        );
        assert_eq!(
            s.feed(&p, b"saving checkpoint for step: 10\n"),
            // A marker on the step's own line enters the phase at that step.
            vec![Mark::Step(10), Mark::Phase("checkpoint")]
        );
        assert_eq!(
            s.feed(&p, b"Saving model checkpoint to /x\nstep 11\n"),
            // The marker, then the later step (which ends the phase: the
            // stall policy's call, see policy::stall).
            vec![Mark::Phase("checkpoint"), Mark::Step(11)]
        );
        assert_eq!(
            s.feed(&p, b"Running Evaluation\n"),
            vec![Mark::Phase("eval")]
        );
    }

    #[test]
    fn one_read_reports_one_step_on_each_side_of_a_phase_marker() {
        // Found by fuzzing (fuzz/corpus/output_lines/regress-two-steps-one-read):
        // the carried line and the rest of the read each had a step.
        let p = parser();
        let mut s = LineScanner::default();
        assert!(s.feed(&p, b"step 5").is_empty());
        assert_eq!(s.feed(&p, b"\nstep 5426\n"), vec![Mark::Step(5426)]);
        assert!(s.feed(&p, b"Saving checkpoint").is_empty());
        assert_eq!(
            s.feed(&p, b"\nstep 5427\n"),
            vec![Mark::Phase("checkpoint"), Mark::Step(5427)]
        );
        assert_eq!(
            s.feed(
                &p,
                b"step 5 x\nstep 6 x\nSaving checkpoint\nstep 7 x\nstep 8\n"
            ),
            vec![Mark::Step(6), Mark::Phase("checkpoint"), Mark::Step(8)]
        );
        assert!(s.feed(&p, b"step 5428").is_empty());
        assert_eq!(
            s.feed(&p, b"\nSaving checkpoint\n"),
            vec![Mark::Step(5428), Mark::Phase("checkpoint")]
        );
    }

    /// Frames of the HF Trainer's tqdm bar as they reach a pipe: each is
    /// `\r` and the frame, with no line end.
    fn frame(step: u64, elapsed: &str) -> Vec<u8> {
        format!(
            "\r 35%|\u{2588}\u{2588}\u{2588}\u{258c}      | {step}/60 [{elapsed}<00:02, 15.20it/s]"
        )
        .into_bytes()
    }

    /// The marks without the figures (tqdm's rate, read as step time).
    fn no_figures(marks: Vec<Mark>) -> Vec<Mark> {
        marks
            .into_iter()
            .filter(|m| !matches!(m, Mark::Figures(_)))
            .collect()
    }

    #[test]
    fn a_bar_frame_is_a_step_when_it_is_written_not_when_the_next_one_ends_it() {
        let p = parser();
        let mut s = LineScanner::default();
        // With the bar's rate: the trainer's own account of a step's time.
        assert_eq!(
            s.feed(&p, &frame(21, "00:01")),
            vec![
                Mark::Figures(Seen(vec![("step_time_s", 1.0 / 15.2)])),
                Mark::Step(21)
            ]
        );
        // tqdm's monitor thread redraws the bar 20 s later: read at once.
        assert_eq!(
            no_figures(s.feed(&p, &frame(25, "00:20"))),
            vec![Mark::Step(25)]
        );
        // A frame cut short names nothing until its `[` is there (the `\r`
        // ends the last frame: a repeat of its step).
        assert_eq!(
            no_figures(s.feed(&p, b"\r 36%|\xe2\x96\x88  | 2")),
            vec![Mark::Step(25)]
        );
        assert!(s.feed(&p, b"6/60").is_empty());
        assert_eq!(s.feed(&p, b" [00:21<00:02]"), vec![Mark::Step(26)]);
        // A number at the end of a line still being written may grow.
        let mut s = LineScanner::default();
        assert!(s.feed(&p, b"step 12").is_empty());
        assert_eq!(s.feed(&p, b"0 loss"), vec![Mark::Step(120)]);
        assert_eq!(
            s.feed(&p, b" 2.5\n"),
            vec![Mark::Figures(Seen(vec![("loss", 2.5)])), Mark::Step(120)]
        );
    }

    #[test]
    fn a_redraw_of_the_training_bar_after_an_evaluation_banner_keeps_the_order() {
        // HF: the eval banner between two frames of the training bar at the
        // same step. The marks keep their order, so the stall policy sees
        // the redraw of step 30 after the phase began (a repeat, no end).
        let p = parser();
        let mut s = LineScanner::default();
        assert_eq!(
            no_figures(s.feed(&p, &frame(30, "00:02"))),
            vec![Mark::Step(30)]
        );
        let mut read = b"\n***** Running Evaluation *****\n  Num examples = 64\n".to_vec();
        read.extend(frame(30, "00:03"));
        read.extend(frame(30, "00:04"));
        assert_eq!(
            no_figures(s.feed(&p, &read)),
            vec![Mark::Step(30), Mark::Phase("eval"), Mark::Step(30)]
        );
    }

    #[test]
    fn another_bar_under_the_training_bar_is_activity_not_steps() {
        // HF's evaluation bar (position 1, ending in ESC [A) under the
        // training bar, as transformers 5.24 draws them into a pipe.
        let p = parser();
        let mut s = LineScanner::default();
        let train = |n: u64| {
            format!(
                "\r 40%|\u{2588}\u{2588}\u{2588}\u{2588}      | {n}/60 [00:01<00:02, 14.54it/s]"
            )
        };
        assert_eq!(
            no_figures(s.feed(&p, train(24).as_bytes())),
            vec![Mark::Step(24)]
        );
        let eval = "\n  0%|          | 0/4 [00:00<?, ?it/s]\u{1b}[A";
        // (The newline ends frame 24: a repeat, the later bar's frame wins.)
        assert_eq!(
            no_figures(s.feed(&p, eval.as_bytes())),
            vec![Mark::Activity(0)]
        );
        let eval = "\r 50%|\u{2588}\u{2588}\u{2588}\u{2588}\u{2588}     | 2/4 [00:00<00:00,  2.63it/s]\u{1b}[A";
        assert_eq!(
            no_figures(s.feed(&p, eval.as_bytes())),
            vec![Mark::Activity(2)]
        );
        assert_eq!(
            no_figures(s.feed(&p, train(25).as_bytes())),
            vec![Mark::Step(25)]
        );
    }

    #[test]
    fn a_log_dict_names_its_step_when_the_steps_per_epoch_were_announced() {
        // HF at log level info (the example scripts'), disable_tqdm=True:
        // the banner on stderr, the log dicts on stdout.
        let p = parser();
        let mut s = LineScanner::default();
        let banner = "[transformers] ***** Running training *****\n[transformers]   Num examples = 256\n[transformers]   Num Epochs = 2\n[transformers]   Num update steps per epoch = 32\n[transformers]   Total optimization steps = 60\n";
        assert!(no_figures(LineScanner::default().feed(&p.clone(), banner.as_bytes())).is_empty());
        let dict =
            |e: &str| format!("{{'loss': '4.709', 'grad_norm': '0.6669', 'epoch': '{e}'}}\n");
        for (e, step) in [("0.1562", 5), ("1.094", 35), ("1.875", 60)] {
            assert_eq!(
                no_figures(s.feed(&p, dict(e).as_bytes())),
                vec![Mark::Step(step)],
                "epoch {e}"
            );
        }
        // transformers 4's unquoted floats, thousands in the banner.
        let p = parser();
        let mut s = LineScanner::default();
        s.feed(&p, b"  Num update steps per epoch = 1,250\n");
        assert_eq!(
            no_figures(s.feed(&p, b"{'loss': 2.1, 'learning_rate': 4e-05, 'epoch': 0.4}\n")),
            vec![Mark::Step(500)]
        );
        // A bar names the steps: the epochs stay activity.
        let p = parser();
        let mut s = LineScanner::default();
        s.feed(&p, b"  Num update steps per epoch = 32\n");
        s.feed(
            &p,
            " 40%|\u{2588}\u{2588}\u{2588}\u{2588}      | 24/60 [00:01<00:02, 14.54it/s]\n"
                .as_bytes(),
        );
        assert_eq!(
            no_figures(s.feed(&p, dict("0.75").as_bytes())),
            vec![Mark::Activity(750_000)]
        );
    }

    #[test]
    fn megatrons_save_completion_line_is_a_checkpoint_done() {
        // Megatron-LM's lines as its training.py and checkpointing.py print
        // them (`print_rank_0('  successfully saved checkpoint from
        // iteration {:7d} to {}'...)`).
        let p = parser();
        let mut s = LineScanner::default();
        let text = " [2026-11-26 12:00:00] iteration      100/    1000 | consumed samples: 800 | lm loss: 7.1E+00 |\nsaving checkpoint at iteration     100 to /ckpt in torch_dist format\n  successfully saved checkpoint from iteration     100 to /ckpt [ t 1/1, p 1/1 ]\n";
        assert_eq!(
            no_figures(s.feed(&p, text.as_bytes())),
            vec![
                Mark::Step(100),
                Mark::Phase("checkpoint"),
                Mark::CheckpointDone(100)
            ]
        );
        // An asynchronous save is finalised iterations later.
        let text = " [2026-11-26 12:00:09] iteration      103/    1000 | consumed samples: 824 |\n  successfully saved checkpoint from iteration     100 to /ckpt [ t 1/1, p 1/1 ]\n";
        assert_eq!(
            no_figures(s.feed(&p, text.as_bytes())),
            vec![Mark::Step(103), Mark::CheckpointDone(100)]
        );
        // Loading is no save.
        assert!(no_figures(s.feed(
            &p,
            b"  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 100\n"
        ))
        .iter()
        .all(|m| !matches!(m, Mark::CheckpointDone(_))));
    }

    /// Lightning's bar counts batches per epoch, and the last epoch's bar
    /// ends at `max_steps` (50 batches an epoch, max_steps 120: `Epoch 2:
    /// ... 20/20`): step 120, not 2 × 20 + 20. Seen by a trial of a real
    /// Lightning 2.6 fit.
    #[test]
    fn lightnings_last_epoch_bar_is_shorter_and_the_steps_count_on() {
        let p = parser();
        let mut s = LineScanner::default();
        let frame = |e: u64, b: u64, t: u64| {
            format!("\rEpoch {e}:  50%|#####     | {b}/{t} [00:01<00:00, 10.86it/s, v_num=0]")
        };
        let mut steps = Vec::new();
        for (e, t) in [(0, 50), (1, 50), (2, 20)] {
            for b in [1, t / 2, t] {
                for m in s.feed(&p, frame(e, b, t).as_bytes()) {
                    if let Mark::Step(n) = m {
                        steps.push(n);
                    }
                }
            }
        }
        assert_eq!(steps, [1, 25, 50, 51, 75, 100, 101, 110, 120]);
        // A process that first shows epoch 2 (a restart) counts epochs of
        // the length it shows.
        let mut s = LineScanner::default();
        let marks = no_figures(s.feed(&p, format!("{}\n", frame(2, 5, 50)).as_bytes()));
        assert_eq!(marks, vec![Mark::Step(105)]);
    }

    /// After a resume inside an epoch, Lightning 2 draws its bar with no
    /// epoch and no total: life, that names no step.
    #[test]
    fn lightnings_bar_without_a_total_after_a_resume_is_activity() {
        let p = parser();
        let mut s = LineScanner::default();
        let marks = no_figures(s.feed(
            &p,
            "\rTraining: |          | 26/? [00:02<00:00, 10.63it/s, v_num=1]\n".as_bytes(),
        ));
        assert_eq!(marks, vec![Mark::Activity(26)]);
    }

    /// Lightning 2.6's Rich bar as it draws itself where Rich sees a
    /// terminal (`TTY_COMPATIBLE=1`, a pipe): colour codes inside the bar,
    /// each frame after cursor moves. Recorded from the conformance
    /// trainer (tests/fixtures/progress/lightning_rich_tty.txt).
    #[test]
    fn lightnings_rich_bar_drawn_for_a_terminal_names_its_steps() {
        let text = include_bytes!("../../../tests/fixtures/progress/lightning_rich_tty.txt");
        let p = parser();
        for cut in [64, 1000, text.len()] {
            let mut s = LineScanner::default();
            let mut steps = Vec::new();
            for chunk in text.chunks(cut) {
                for m in s.feed(&p, chunk) {
                    if let Mark::Step(n) = m {
                        steps.push(n);
                    }
                }
            }
            assert_eq!(steps.last(), Some(&12), "cut {cut}: {steps:?}");
            assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
            if cut == 64 {
                assert!(steps.len() >= 10, "each frame read: {steps:?}");
            }
        }
        // A later epoch counts on: epoch 2 of 32 batches, batch 5.
        let mut s = LineScanner::default();
        let frame = "\r\x1b[2K\x1b[1A\x1b[2KEpoch 2/9 \x1b[35m\u{2501}\u{2501}\x1b[0m\x1b[90m\u{257a}\u{2501}\x1b[0m 5/32 \x1b[2m0:00:00 \u{2022} 0:00:01\x1b[0m \x1b[2;4m18.73it/s\x1b[0m\n";
        assert_eq!(
            no_figures(s.feed(&p, frame.as_bytes())),
            vec![Mark::Step(69)]
        );
    }

    #[test]
    fn hf_trainers_save_banner_is_a_synchronous_save_of_its_step() {
        // transformers' Trainer at log level info (`logger.info(f"Saving
        // model checkpoint to {output_dir}")`), its bar on the same stream.
        let p = parser();
        let mut s = LineScanner::default();
        let text = "\r 42%|####      | 25/60 [00:05<00:07,  4.9it/s]Saving model checkpoint to out/checkpoint-25\nConfiguration saved in out/checkpoint-25/config.json\n";
        let marks = no_figures(s.feed(&p, text.as_bytes()));
        assert_eq!(marks, vec![Mark::Step(25), Mark::SyncSave(25)], "{marks:?}");
        // The bar, then the banner, in one read: in order.
        let text = "\r 70%|#######   | 42/60 [00:09<00:03,  4.9it/s]\nSaving model checkpoint to /scratch/run 1/checkpoint-42\n";
        let marks = no_figures(s.feed(&p, text.as_bytes()));
        assert_eq!(marks, vec![Mark::Step(42), Mark::SyncSave(42)], "{marks:?}");
        // Other save banners stay phases.
        for other in [
            &b"Saving model checkpoint to /x\n"[..],
            b"Saving model checkpoint to out/checkpoint-25.tmp\n",
        ] {
            let marks = no_figures(s.feed(&p, other));
            assert_eq!(marks, vec![Mark::Phase("checkpoint")]);
        }
    }

    #[test]
    fn another_bar_and_an_epoch_in_one_read_are_one_activity() {
        // The training bar is the first bar's total; a later bar of another
        // total (an evaluation's) is activity, and so is a log dict's epoch
        // when a bar names the steps: one read with both says one activity,
        // the last printed (found by the fuzzer: two in a row).
        let p = parser();
        let mut s = LineScanner::default();
        let marks = no_figures(s.feed(&p, b" 10%|#  | 10/100 [00:01<00:09, 9.9it/s]\n"));
        assert_eq!(marks, vec![Mark::Step(10)]);
        let text = " 30%|###  | 5/16 [00:01<00:02, 3.5it/s]\n{'loss': 0.09, 'epoch': 0.38}\n";
        let marks = no_figures(s.feed(&p, text.as_bytes()));
        assert_eq!(marks, vec![Mark::Activity(380_000)], "{marks:?}");
        // On each side of a save's banner, one each, in the order printed.
        let text = " 40%|####  | 6/16 [00:01<00:02, 3.5it/s]\n{'loss': 0.09, 'epoch': 0.4}\nSaving model checkpoint to /x\n 50%|#####  | 8/16 [00:01<00:02, 3.5it/s]\n{'loss': 0.08, 'epoch': 0.5}\n";
        let marks = no_figures(s.feed(&p, text.as_bytes()));
        assert_eq!(
            marks
                .iter()
                .filter(|m| matches!(m, Mark::Activity(_)))
                .count(),
            marks.len() - 1,
            "{marks:?}"
        );
        assert!(
            marks.len() <= 3 && marks.contains(&Mark::Phase("checkpoint")),
            "{marks:?}"
        );
        assert_eq!(marks.last(), Some(&Mark::Activity(500_000)), "{marks:?}");
    }

    #[test]
    fn a_log_dict_with_an_epoch_is_activity() {
        // HF with disable_tqdm=True: the log dicts are all there is
        // (transformers 5 quotes the values, 4 does not).
        let p = parser();
        let mut s = LineScanner::default();
        let marks = s.feed(
            &p,
            b"{'loss': '4.709', 'grad_norm': '0.6359', 'learning_rate': '0.00085', 'epoch': '0.3125'}\n",
        );
        assert_eq!(
            marks,
            vec![
                Mark::Figures(Seen(vec![("loss", 4.709), ("grad_norm", 0.6359)])),
                Mark::Activity(312_500)
            ]
        );
        assert_eq!(
            no_figures(s.feed(&p, b"{'loss': 2.1, 'learning_rate': 4e-05, 'epoch': 1.5}\n")),
            vec![Mark::Activity(1_500_000)]
        );
        // A step line after the dict names the step; the dict is older.
        assert_eq!(
            no_figures(s.feed(&p, b"{'loss': 2.1, 'epoch': 1.6}\nstep 7\n")),
            vec![Mark::Step(7)]
        );
        // Not a dict: no epoch.
        assert!(no_figures(s.feed(&p, b"epoch': 3 loss\n")).is_empty());
    }

    #[test]
    fn overlong_lines_are_skipped_not_buffered() {
        let p = parser();
        let mut s = LineScanner::default();
        let long = vec![b'x'; MAX_CARRY + 10];
        assert!(s.feed(&p, &long).is_empty());
        assert!(s.feed(&p, b" step 5\nstep 6\n") == vec![Mark::Step(6)]);
    }

    #[test]
    fn carriage_returns_end_lines() {
        let p = parser();
        let mut s = LineScanner::default();
        assert_eq!(s.feed(&p, b"step 1\rstep 2\r"), vec![Mark::Step(2)]);
    }

    #[test]
    fn prefiltered_and_plain_scans_agree() {
        let fast = parser();
        assert!(fast.prefilter.is_some());
        // The same regexes spelled differently: no prefilter.
        let plain = Parser::new(
            Regex::new(&format!("(?:{DEFAULT_PROGRESS_REGEX})")).unwrap(),
            Some(Regex::new(DEFAULT_CHECKPOINT_REGEX).unwrap()),
            Some(Regex::new(DEFAULT_EVAL_REGEX).unwrap()),
        );
        assert!(plain.prefilter.is_none());
        let lines: &[&[u8]] = &[
            b"noise 12 34\n",
            b" iteration      7/    100 | loss 2\n",
            b"Saving checkpoint to /x\n",
            b"global_step=9\n",
            b"Running Evaluation\n",
            b"warmup_steps=100 max_steps: 4\n",
            b"step: 11 loss 2 Saving checkpoint\n",
            b"data 1/2\r",
        ];
        // Every ordered selection of up to 4 lines, as one chunk.
        let n = lines.len();
        for a in 0..n {
            for b in 0..n {
                for c in 0..n {
                    for d in 0..n {
                        let text: Vec<u8> = [a, b, c, d]
                            .iter()
                            .flat_map(|&i| lines[i].to_vec())
                            .collect();
                        assert_eq!(
                            fast.scan(&text),
                            plain.scan(&text),
                            "{}",
                            String::from_utf8_lossy(&text)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let t = Tail::new(32);
        t.push(b"line one\nline two\n");
        t.push(b"line three\nline four\n");
        assert_eq!(t.last_lines(2), vec!["line three", "line four"]);
        t.push(&[b'z'; 100]);
        assert_eq!(t.last_lines(5), vec!["z".repeat(32)]);
    }
}
