//! The trainer's own account of its time, independent of resilio: the
//! lockstep trainer (`--timing-file`) appends `step ATTEMPT N START END` and
//! `ckpt ATTEMPT N START END` lines (Unix seconds) that resilio never reads.

use std::collections::BTreeMap;
use std::path::Path;

/// Productive time by the definition: step time whose result survived.
/// A failed attempt's steps survive up to the step its successor resumed
/// after (the successor's first step minus one); the last attempt's steps
/// all survive (the run finished with them).
pub fn productive_s(path: &Path) -> f64 {
    let text = std::fs::read_to_string(path).expect("timing file");
    let mut steps: BTreeMap<u32, Vec<(u64, f64, f64)>> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 5 && f[0] == "step" {
            steps.entry(f[1].parse().unwrap()).or_default().push((
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[4].parse().unwrap(),
            ));
        }
    }
    let attempts: Vec<&Vec<(u64, f64, f64)>> = steps.values().collect();
    let mut total = 0.0;
    for (i, s) in attempts.iter().enumerate() {
        let survived = match attempts.get(i + 1) {
            Some(next) => next.iter().map(|x| x.0).min().unwrap() - 1,
            None => u64::MAX,
        };
        total += s
            .iter()
            .filter(|x| x.0 <= survived)
            .map(|x| x.2 - x.1)
            .sum::<f64>();
    }
    total
}

/// Attempts the trainer ran steps in.
pub fn attempts(path: &Path) -> Vec<u32> {
    let text = std::fs::read_to_string(path).expect("timing file");
    let mut v: Vec<u32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("step "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    v.dedup();
    v
}
