//! The default progress regex against real output lines of common trainers
//! (tests/fixtures/progress/trainer_lines.tsv: EXPECTED<TAB>LINE, `-` = no step).

use regex::bytes::Regex;
use resilio::config::DEFAULT_PROGRESS_REGEX;
use resilio::progress::output::Parser;

#[test]
fn default_regex_reads_the_step_of_every_fixture_line() {
    let text = include_str!("fixtures/progress/trainer_lines.tsv");
    let parser = Parser::new(Regex::new(DEFAULT_PROGRESS_REGEX).unwrap(), None, None);
    let mut failures = Vec::new();
    let (mut positives, mut negatives) = (0, 0);
    for (n, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (expected, sample) = line.split_once('\t').expect("EXPECTED<TAB>LINE");
        let expected = match expected {
            "-" => {
                negatives += 1;
                None
            }
            n => {
                positives += 1;
                Some(n.parse::<u64>().unwrap())
            }
        };
        // Lines may carry '\r'-joined progress bars: the parser sees them as lines.
        let got = parser.step_in(sample.as_bytes());
        if got != expected {
            failures.push(format!(
                "line {}: expected {expected:?}, got {got:?}: {sample}",
                n + 1
            ));
        }
    }
    assert!(positives >= 30 && negatives >= 30, "fixture too small");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_custom_regex_with_a_named_group_is_honoured() {
    let parser = Parser::new(Regex::new(r"it=(?P<step>\d+)").unwrap(), None, None);
    assert_eq!(parser.step_in(b"epoch 3 it=77 loss 1"), Some(77));
    // Without groups, the first number of the match is the step.
    let parser = Parser::new(Regex::new(r"upd \d+").unwrap(), None, None);
    assert_eq!(parser.step_in(b"x upd 12 y"), Some(12));
}

#[test]
fn figures_of_every_fixture_line_are_read_by_name_and_unit() {
    use resilio::progress::output::{Mark, Seen};
    let text = include_str!("fixtures/progress/figure_lines.tsv");
    let parser = Parser::new(Regex::new(DEFAULT_PROGRESS_REGEX).unwrap(), None, None);
    let mut failures = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    let (mut with, mut without) = (0, 0);
    for (n, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (expected, sample) = line.split_once('\t').expect("EXPECTED<TAB>LINE");
        let mut want: Vec<(String, f64)> = Vec::new();
        if expected != "-" {
            with += 1;
            for kv in expected.split(',') {
                let (k, v) = kv.split_once('=').expect("name=value");
                want.push((k.to_string(), v.parse().unwrap()));
                names.insert(k.to_string());
            }
        } else {
            without += 1;
        }
        let got: Vec<(String, f64)> = parser
            .scan(sample.as_bytes())
            .into_iter()
            .find_map(|m| match m {
                Mark::Figures(Seen(f)) => Some(f),
                _ => None,
            })
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let same = |a: f64, b: f64| {
            (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
        };
        let ok = got.len() == want.len()
            && want
                .iter()
                .all(|(k, v)| got.iter().any(|(gk, gv)| gk == k && same(*gv, *v)));
        if !ok {
            failures.push(format!(
                "line {}: want {want:?}\n   got {got:?}: {sample}",
                n + 1
            ));
        }
    }
    assert!(
        with >= 30 && without >= 30,
        "fixture too small: {with} with, {without} without"
    );
    // Every figure name is exercised by some real line.
    for name in resilio::progress::figures::NAMES {
        assert!(names.contains(*name), "no fixture line for {name}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
