//! The figures trainers print next to their steps: loss, grad norm, step
//! time, throughput, TFLOP/s and MFU, read from output lines with no code
//! change (Megatron-LM/NeMo, torchtitan, nanoGPT, DeepSpeed, Hugging Face
//! Trainer, Lightning/tqdm bars). `tests/fixtures/progress/figure_lines.tsv`
//! holds real lines of each with what must be read from them.
//!
//! Every figure has one name and one unit whatever the trainer called it:
//!
//! | name | unit | from |
//! |---|---|---|
//! | `loss` | as printed | `lm loss:`, `loss:`, `loss=`, `'loss':`, `train_loss`, `reduced_train_loss` |
//! | `grad_norm` | as printed | `grad norm:`, `grad_norm`, `gnorm=` |
//! | `step_time_s` | seconds per step | `elapsed time per iteration (ms):`, `time 913ms`, `iter time (s):`, `train_step_timing in s:`, tqdm's `s/it` and `it/s` |
//! | `tokens_per_s_device` | tokens/s of one device | torchtitan's `tps:` |
//! | `samples_per_s` | samples/s of the job | `samples/sec:`, `samples per second:`, `train_samples_per_second`, DeepSpeed's `CurrSamplesPerSec=` |
//! | `tflops` | TFLOP/s of one device | `throughput per GPU (TFLOP/s/GPU):`, `tflops:`, `approx flops per GPU: 97.0TFLOPS` |
//! | `mfu` | fraction (0.35, not 35%) | `mfu: 34.29%`, `mfu 16.57%` |
//! | `global_batch_size` | samples per step | `global batch size:`, `global_batch_size:` |
//!
//! A value that is not a number is no figure; `nan` and `inf` are read (a
//! loss gone to NaN is what [`crate::policy`] must see), a negative MFU
//! (nanoGPT's -100% before it has measured) is not.

use regex::Regex;
use std::sync::OnceLock;

/// Every name a figure read from output can have.
pub const NAMES: &[&str] = &[
    "loss",
    "grad_norm",
    "step_time_s",
    "tokens_per_s_device",
    "samples_per_s",
    "tflops",
    "mfu",
    "global_batch_size",
];

/// Whether `name` can name a figure in a report to the coordinator
/// (lowercase, digits and `_`, at most 32 bytes; the socket's keys too).
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Figures read from one line, or merged over a few: `(name, value)`.
pub type Figures = Vec<(&'static str, f64)>;

/// A number as trainers print it: `1.8e+00`, `6,437`, `nan`, `'0.2854'`.
/// ASCII digits only: a number in other digits would not read as one.
const NUM: &str = r#"['"]?([-+]?(?:(?i:nan|inf(?:inity)?)|[0-9][0-9,]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?))"#;

/// Before a key: start of line or a character that cannot be part of a
/// longer name (`val_loss` and `nll_loss` are not the loss): an ASCII
/// character other than a letter, digit, `_` or `.`, or one of the spaces
/// and marks beyond ASCII that logs put between fields (no-break space,
/// general punctuation such as `•` and `—`, box drawing and block
/// elements such as `│` and `█`, CJK and full-width punctuation such as
/// `，`). Any other character beyond ASCII counts as part of a name.
///
/// The classes are kept small on purpose: each rank agent holds these
/// patterns compiled for the whole run, and with Unicode's `\w` (and
/// ASCII digits) they took 6 MB of its memory, 1.3 MB with Unicode's `\d`
/// too; these take about 0.5 MB.
const B: &str = r"(?:^|[^0-9A-Za-z_.\x{80}-\x{10FFFF}]|[\x{A0}\x{2000}-\x{206F}\x{2500}-\x{25FF}\x{3000}-\x{303F}\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF20}])";

/// How a pattern's number becomes the figure.
#[derive(Clone, Copy)]
enum Unit {
    Same,
    /// Milliseconds to seconds.
    Ms,
    /// A rate (it/s) to its inverse (s/it).
    Inverse,
    /// A percentage to a fraction.
    Percent,
}

struct Pattern {
    name: &'static str,
    re: Regex,
    unit: Unit,
    /// Read only from a line that is a step (a tqdm rate is the step's
    /// only on the training bar, not on a loading bar).
    step_line_only: bool,
}

fn patterns() -> &'static [Pattern] {
    static P: OnceLock<Vec<Pattern>> = OnceLock::new();
    P.get_or_init(|| {
        // `KEY NUMBER`, the key after a boundary.
        let key = |k: &str| format!("{B}{k}{NUM}");
        let table: Vec<(&'static str, String, Unit)> = vec![
            (
                "loss",
                key(r#"(?i:lm[ _]loss|reduced_train_loss|train_loss|loss)['"]?\s*[:=]?\s*"#),
                Unit::Same,
            ),
            (
                "grad_norm",
                key(r#"(?i:grad[ _]norm|gnorm)['"]?\s*[:=]?\s*"#),
                Unit::Same,
            ),
            (
                "step_time_s",
                key(r"elapsed time per iteration \(ms\):\s*"),
                Unit::Ms,
            ),
            ("step_time_s", key(r"iter time \(s\):\s*"), Unit::Same),
            ("step_time_s", key(r"train_step_timing in s:\s*"), Unit::Same),
            ("step_time_s", format!(r"{B}time\s+{NUM}\s*ms\b"), Unit::Ms),
            // tqdm's rate: `5.82s/it` when slow, `3.52it/s` when fast.
            ("step_time_s", r"(?:^|[\s,\[])([0-9]+(?:\.[0-9]*)?)\s*s/it\b".into(), Unit::Same),
            ("step_time_s", r"(?:^|[\s,\[])([0-9]+(?:\.[0-9]*)?)\s*it/s\b".into(), Unit::Inverse),
            ("tokens_per_s_device", key(r"tps:\s*"), Unit::Same),
            (
                "samples_per_s",
                key(r#"(?:samples/sec:|samples per second:|(?:train_)?samples_per_second['"]?:|(?:Curr)?SamplesPerSec=)\s*"#),
                Unit::Same,
            ),
            (
                "tflops",
                key(r"(?:throughput per GPU \(TFLOP/s/GPU\):|(?i:tflops):?|approx flops per GPU:)\s*"),
                Unit::Same,
            ),
            ("mfu", format!(r"{B}(?i:mfu):?\s*{NUM}\s*%"), Unit::Percent),
            (
                "global_batch_size",
                key(r"global[ _]batch[ _]size:\s*"),
                Unit::Same,
            ),
        ];
        table
            .into_iter()
            .map(|(name, source, unit)| Pattern {
                name,
                step_line_only: source.contains("it/s") || source.contains("s/it"),
                re: Regex::new(&source).expect("figure pattern"),
                unit,
            })
            .collect()
    })
}

/// Compile the figure patterns now (a parser is built before the trainer
/// starts): compiled lazily on the first step line instead, they held that
/// line up, and its step was stamped late (about 80 ms in a debug build,
/// 250 ms on a loaded machine), which read as startup time in the report.
pub fn prepare() {
    patterns();
}

/// Remove ANSI escape sequences (torchtitan colours its step lines).
fn strip_ansi(line: &str) -> std::borrow::Cow<'_, str> {
    if !line.contains('\x1b') {
        return line.into();
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, then one final byte @..~.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out.into()
}

/// The figures in one line of output, each name at most once (its first
/// occurrence in the line); `step_line`: the line is a step's.
pub fn of_line(line: &[u8], step_line: bool) -> Figures {
    let text = String::from_utf8_lossy(line);
    let text = strip_ansi(&text);
    let mut out: Figures = Vec::new();
    for p in patterns() {
        if out.iter().any(|(n, _)| *n == p.name) || (p.step_line_only && !step_line) {
            continue;
        }
        let Some(caps) = p.re.captures(&text) else {
            continue;
        };
        let raw = caps[1].trim_matches(['\'', '"']).replace(',', "");
        let Ok(v) = raw.parse::<f64>() else { continue };
        let v = match p.unit {
            Unit::Same => v,
            Unit::Ms => v / 1000.0,
            Unit::Inverse if v > 0.0 => 1.0 / v,
            Unit::Inverse => continue,
            Unit::Percent if v >= 0.0 => v / 100.0,
            Unit::Percent => continue,
        };
        // Rates, times and sizes are never negative; a loss can be.
        if p.name != "loss" && v.is_finite() && v < 0.0 {
            continue;
        }
        out.push((p.name, v));
    }
    out
}

/// Whether a line can hold figures at all: a cheap test before [`of_line`].
pub fn may_hold(line: &[u8]) -> bool {
    const HINTS: &[&[u8]] = &[
        b"loss",
        b"LOSS",
        b"Loss",
        b"tps:",
        b"tflops",
        b"TFLOP",
        b"it/s",
        b"s/it",
        b"mfu",
        b"per_second",
        b"samples/sec",
        b"PerSec",
        b"time",
        b"norm",
    ];
    HINTS.iter().any(|h| line.windows(h.len()).any(|w| w == *h))
}

/// Add the figures of `newer` lines over `older` ones: a name already
/// present keeps the newer value.
pub fn merge(newer: &mut Figures, older: Figures) {
    for (name, v) in older {
        if !newer.iter().any(|(n, _)| *n == name) {
            newer.push((name, v));
        }
    }
}

/// [`merge`] for figures with owned names (as events carry them).
pub fn merge_named(newer: &mut Vec<(String, f64)>, older: Vec<(String, f64)>) {
    for (name, v) in older {
        if !newer.iter().any(|(n, _)| *n == name) {
            newer.push((name, v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(f: &Figures, name: &str) -> Option<f64> {
        f.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    #[test]
    fn ansi_colours_do_not_hide_figures() {
        let line = "\x1b[31mstep:  2  \x1b[32mloss:  9.8472  \x1b[33mmemory: 31.63GiB(33.30%)  \x1b[34mtps: 6,437  \x1b[36mtflops: 370.76  \x1b[35mmfu: 37.49%\x1b[39m";
        let f = of_line(line.as_bytes(), true);
        assert_eq!(get(&f, "loss"), Some(9.8472));
        assert_eq!(get(&f, "tokens_per_s_device"), Some(6437.0));
        assert_eq!(get(&f, "tflops"), Some(370.76));
        assert!((get(&f, "mfu").unwrap() - 0.3749).abs() < 1e-9);
    }

    #[test]
    fn nan_is_read_and_a_negative_mfu_is_not() {
        let f = of_line(b"iter 0: loss nan, time 9371.81ms, mfu -100.00%", true);
        assert!(get(&f, "loss").unwrap().is_nan());
        assert_eq!(get(&f, "mfu"), None);
        assert!((get(&f, "step_time_s").unwrap() - 9.37181).abs() < 1e-9);
    }

    #[test]
    fn a_key_is_read_after_a_boundary_and_not_inside_a_longer_name() {
        let loss = |line: &str| get(&of_line(line.as_bytes(), true), "loss");
        // Inside a longer name, ASCII or not: not the loss.
        assert_eq!(loss("val_loss: 2.5"), None);
        assert_eq!(loss("eval.loss: 2.5"), None);
        assert_eq!(loss("nll_loss=2.5"), None);
        assert_eq!(loss("élan_loss=2.5"), None);
        assert_eq!(loss("ξloss=2.5"), None);
        assert_eq!(loss("١loss=2.5"), None);
        // After a boundary, ASCII or not.
        assert_eq!(loss("loss=2.5"), Some(2.5));
        assert_eq!(loss("step 3 | loss: 2.5"), Some(2.5));
        assert_eq!(loss("{'loss': '2.5'}"), Some(2.5));
        assert_eq!(loss("│loss 2.5"), Some(2.5));
        assert_eq!(loss("•loss=2.5"), Some(2.5));
        assert_eq!(loss("\u{a0}loss=2.5"), Some(2.5));
        assert_eq!(loss("損失，loss=2.5"), Some(2.5));
        // The later key of a line whose first is inside a name.
        assert_eq!(loss("val_loss=9.0 train_loss=2.5"), Some(2.5));
        // Numbers in ASCII digits, as trainers print them.
        assert_eq!(loss("loss 6,437"), Some(6437.0));
        assert_eq!(loss("loss 1.8e+00"), Some(1.8));
        assert_eq!(loss("loss .5"), Some(0.5));
        assert_eq!(loss("loss ١٢"), None);
        let f = of_line(b" 40%|####      | 4/10 [00:02<00:03,  1.91it/s]", true);
        assert!((get(&f, "step_time_s").unwrap() - 1.0 / 1.91).abs() < 1e-9);
        let f = of_line(b" 40%|####      | 4/10 [00:08<00:12,  2.05s/it]", true);
        assert_eq!(get(&f, "step_time_s"), Some(2.05));
    }

    #[test]
    fn merge_keeps_the_newer_value() {
        let mut a = vec![("loss", 1.0)];
        merge(&mut a, vec![("loss", 2.0), ("mfu", 0.3)]);
        assert_eq!(a, vec![("loss", 1.0), ("mfu", 0.3)]);
    }
}
