//! The output line parser with the default patterns: any bytes a trainer
//! prints, cut into reads at points the input chooses. Never panics; never
//! yields a step above `MAX_STEP`; at most one phase per read, with at
//! most one step on each side of it, and activity last;
//! on a single line the prefiltered parser (default regexes) and the plain
//! one (the same regexes spelled differently) agree, but for keywords in a
//! case the prefilter does not list (see `DEFAULT_LITERALS`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use regex::bytes::Regex;
use resilio::progress::output::{LineScanner, Mark, Parser, DEFAULT_LITERALS};
use resilio::progress::patterns::{
    DEFAULT_CHECKPOINT_REGEX, DEFAULT_EVAL_REGEX, DEFAULT_PROGRESS_REGEX,
};
use resilio::progress::MAX_STEP;
use std::sync::OnceLock;

fn parsers() -> &'static (Parser, Parser) {
    static P: OnceLock<(Parser, Parser)> = OnceLock::new();
    P.get_or_init(|| {
        let phases = || {
            (
                Some(Regex::new(DEFAULT_CHECKPOINT_REGEX).unwrap()),
                Some(Regex::new(DEFAULT_EVAL_REGEX).unwrap()),
            )
        };
        let (c, e) = phases();
        let fast = Parser::new(Regex::new(DEFAULT_PROGRESS_REGEX).unwrap(), c, e);
        let (c, e) = phases();
        let plain = Parser::new(
            Regex::new(&format!("(?:{DEFAULT_PROGRESS_REGEX})")).unwrap(),
            c,
            e,
        );
        (fast, plain)
    })
}

fn check(marks: &[Mark]) {
    // A line saying a checkpoint was loaded comes before all else, once.
    let loads = marks
        .iter()
        .filter(|m| matches!(m, Mark::Loaded(_)))
        .count();
    assert!(loads <= 1, "{marks:?}");
    if loads == 1 {
        assert!(matches!(marks[0], Mark::Loaded(_)), "{marks:?}");
    }
    let marks = &marks[loads..];
    // Figures come first, at most once, and hold names of the table only.
    let figures = marks
        .iter()
        .filter(|m| matches!(m, Mark::Figures(_)))
        .count();
    assert!(figures <= 1, "{marks:?}");
    if figures == 1 {
        assert!(matches!(marks[0], Mark::Figures(_)), "{marks:?}");
    }
    let marks: Vec<Mark> = marks
        .iter()
        .filter(|m| !matches!(m, Mark::Figures(_)))
        .cloned()
        .collect();
    let marks = &marks[..];
    // Activity (another bar, a log dict's epoch) comes at most once on each
    // side of the phase marker: each one last, or right before the marker
    // (a bar that is not the training bar, drawn before a save's banner:
    // activity, then the save, in the order printed; then, after the
    // banner, activity again).
    let is_activity = |m: &Mark| matches!(m, Mark::Activity(_) | Mark::Epoch(_));
    let acts: Vec<usize> = (0..marks.len()).filter(|&i| is_activity(&marks[i])).collect();
    assert!(acts.len() <= 2, "{marks:?}");
    for &at in &acts {
        let before_marker = marks
            .get(at + 1)
            .is_some_and(|m| matches!(m, Mark::Phase(_) | Mark::SyncSave(_)));
        assert!(at + 1 == marks.len() || before_marker, "{marks:?}");
    }
    if let [first, second] = acts[..] {
        let marker = marks
            .iter()
            .position(|m| matches!(m, Mark::Phase(_) | Mark::SyncSave(_)));
        assert!(
            marker.is_some_and(|p| first < p && p < second),
            "two activities, not one on each side of the marker: {marks:?}"
        );
    }
    // At most one phase marker, with at most one step on each side of it
    // (the stall policy says whether the later one ends the phase).
    let is_step = |m: &Mark| matches!(m, Mark::Step(_) | Mark::Bar { .. } | Mark::EpochBar { .. });
    let phase = marks
        .iter()
        .position(|m| matches!(m, Mark::Phase(_) | Mark::SyncSave(_)));
    assert!(
        marks
            .iter()
            .filter(|m| matches!(m, Mark::Phase(_) | Mark::SyncSave(_)))
            .count()
            <= 1,
        "{marks:?}"
    );
    let (before, after) = match phase {
        Some(p) => (&marks[..p], &marks[p + 1..]),
        None => (marks, &marks[..0]),
    };
    assert!(
        before.iter().filter(|m| is_step(m)).count() <= 1,
        "{marks:?}"
    );
    assert!(
        after.iter().filter(|m| is_step(m)).count() <= 1,
        "{marks:?}"
    );
    for m in marks {
        if let Mark::Step(s) | Mark::Bar { count: s, .. } = m {
            assert!(*s <= MAX_STEP, "{marks:?}");
        }
        if let Mark::EpochBar {
            epoch,
            count,
            total,
        } = m
        {
            assert!(epoch * total + count <= MAX_STEP, "{marks:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (fast, plain) = parsers();
    // The first byte sets the read size (1..=256 bytes); the rest is output.
    let Some((&size, text)) = data.split_first() else {
        return;
    };
    let size = usize::from(size) + 1;
    let mut scanner = LineScanner::default();
    for chunk in text.chunks(size) {
        check(&scanner.feed(fast, chunk));
    }
    check(&scanner.finish(fast));
    check(&fast.scan(text));
    for line in text.split(|&b| b == b'\n' || b == b'\r') {
        let s = fast.step_in(line);
        assert!(s.is_none_or(|s| s <= MAX_STEP));
        // A keyword in a case the prefilter does not list (`sTep 5`) is
        // a documented miss of the fast path (`DEFAULT_LITERALS`).
        let has = |hay: &[u8], lit: &[u8]| hay.windows(lit.len()).any(|w| w == lit);
        let lower = line.to_ascii_lowercase();
        let exact = DEFAULT_LITERALS.iter().any(|l| has(line, l.as_bytes()));
        let folded = DEFAULT_LITERALS
            .iter()
            .any(|l| has(&lower, l.to_ascii_lowercase().as_bytes()));
        if exact || !folded {
            assert_eq!(
                s,
                plain.step_in(line),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }
});
