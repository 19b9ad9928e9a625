//! Property tests of the parsers that read what others wrote: the progress
//! datagram, trainer output, the journal, the configuration file. Short
//! runs (proptest's default 256 cases, fewer where a case writes files);
//! the fuzz targets in fuzz/ go further (`bash tests/fuzz.sh`).

use proptest::prelude::*;
use regex::bytes::Regex;
use resilio::config::Config;
use resilio::journal::{read_job, Writer};
use resilio::progress::output::{LineScanner, Mark, Parser};
use resilio::progress::patterns::{
    DEFAULT_CHECKPOINT_REGEX, DEFAULT_EVAL_REGEX, DEFAULT_PROGRESS_REGEX,
};
use resilio::progress::socket::parse;
use resilio::progress::{Kind, MAX_STEP};
use std::path::Path;

fn step_of(k: &Kind) -> Option<u64> {
    match k {
        Kind::Step { step, .. } | Kind::Phase { step, .. } | Kind::CheckpointDone { step } => *step,
        _ => None,
    }
}

/// Datagrams as trainers write them, and near misses: known keys with
/// numbers of any size, signs, exponents, junk.
fn datagram() -> impl Strategy<Value = Vec<u8>> {
    let key = prop::sample::select(vec![
        "step",
        "checkpoint_done",
        "phase",
        "v",
        "loss",
        "compute_s",
        "",
    ]);
    let value = prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..=MAX_STEP + 2).prop_map(|n| n.to_string()),
        "[-+0-9.eE]{0,24}",
        "[a-zA-Z_/-]{0,70}",
        any::<f64>().prop_map(|x| x.to_string()),
    ];
    let token = prop_oneof![
        3 => (key.clone(), value).prop_map(|(k, v)| format!("{k}={v}")),
        1 => key.prop_map(str::to_string),
    ];
    let text = prop::collection::vec(token, 0..6).prop_map(|t| t.join(" ").into_bytes());
    prop_oneof![4 => text, 1 => prop::collection::vec(any::<u8>(), 0..64)]
}

fn default_parser() -> Parser {
    Parser::new(
        Regex::new(DEFAULT_PROGRESS_REGEX).unwrap(),
        Some(Regex::new(DEFAULT_CHECKPOINT_REGEX).unwrap()),
        Some(Regex::new(DEFAULT_EVAL_REGEX).unwrap()),
    )
}

/// Output lines in the forms trainers print (each with at most one step).
fn output_line() -> impl Strategy<Value = String> {
    let n = 0u64..100_000;
    prop_oneof![
        n.clone().prop_map(|s| format!("step {s} loss 2.31")),
        n.clone()
            .prop_map(|s| format!(" iteration      {s}/  100000 | lm loss 2.0")),
        n.clone()
            .prop_map(|s| format!("[batch={s}/100000] loss 1.5")),
        n.prop_map(|s| format!("{{\"step\": {s}, \"loss\": 2.1}}")),
        Just("noise 12 34 warmup_steps=100".to_string()),
        Just("Saving checkpoint to /ckpt".to_string()),
        Just("Running Evaluation".to_string()),
        "[a-z ]{0,30}",
    ]
}

proptest! {
    #[test]
    fn the_datagram_parser_never_panics_nor_passes_a_step_above_the_bound(d in datagram()) {
        let kinds = parse(&d);
        for k in &kinds {
            prop_assert!(step_of(k).is_none_or(|s| s <= MAX_STEP), "{:?} from {:?}", k, d);
        }
        let faults = kinds.iter().filter(|k| matches!(k, Kind::Malformed { .. })).count();
        prop_assert!(faults == 0 || kinds.len() == 1, "{:?}", kinds);
    }

    /// However the output is cut into reads, the last step reported is the
    /// step of the last line that has one, and no read reports two steps
    /// but around a phase marker (one before it, one after).
    #[test]
    fn reads_cut_anywhere_report_the_last_lines_step(
        lines in prop::collection::vec(output_line(), 0..20),
        cuts in prop::collection::vec(1usize..64, 1..8),
    ) {
        let p = default_parser();
        let text = lines.iter().map(|l| format!("{l}\n")).collect::<String>().into_bytes();
        let expected = lines.iter().rev().find_map(|l| p.step_in(l.as_bytes()));
        let mut scanner = LineScanner::default();
        let mut last = None;
        let mut rest = &text[..];
        let mut i = 0;
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(cuts[i % cuts.len()].min(rest.len()));
            let marks = scanner.feed(&p, chunk);
            let steps: Vec<u64> = marks.iter().filter_map(|m| match m {
                Mark::Step(s) | Mark::Bar { count: s, .. } => Some(*s),
                Mark::EpochBar { epoch, count, total } => Some(epoch * total + count),
                Mark::Phase(_) | Mark::SyncSave(_) | Mark::Figures(_) | Mark::Activity(_) | Mark::Epoch(_) | Mark::CheckpointDone(_) | Mark::Loaded(_) => None,
            }).collect();
            let phases = marks.iter().filter(|m| matches!(m, Mark::Phase(_) | Mark::SyncSave(_))).count();
            prop_assert!(phases <= 1 && steps.len() <= 1 + phases, "{:?}", marks);
            last = steps.last().copied().or(last);
            rest = tail;
            i += 1;
        }
        prop_assert!(scanner.finish(&p).is_empty());
        prop_assert_eq!(last, expected);
    }

    /// Any text as a configuration file: an error or a configuration,
    /// never a panic.
    #[test]
    fn any_configuration_text_loads_or_is_refused(
        entries in prop::collection::vec((
            prop::sample::select(vec!["run", "progress", "stall", "diagnostics", "journal",
                "checkpoint", "slurm", "health", "coordinator", "straggler", "nodes",
                "failure", "x"]),
            "[a-z_]{1,24}",
            prop_oneof![
                any::<i64>().prop_map(|n| n.to_string()),
                any::<f64>().prop_map(|x| format!("{x:?}")),
                "\"[ -~]{0,20}\"",
                Just("true".to_string()),
                Just("[\"a\", \"b\"]".to_string()),
                Just("{ a = \"1s\" }".to_string()),
            ],
        ), 0..8),
    ) {
        let text: String = entries
            .iter()
            .map(|(s, k, v)| format!("[{s}]\n{k} = {v}\n"))
            .collect();
        let _ = Config::default().apply_str(&text, Path::new("props.toml"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A journal cut at any byte (a crash in the middle of a write) reads
    /// back as whole records only: the records before the cut, each as
    /// written, and at most one line skipped (the torn one).
    #[test]
    fn a_journal_cut_anywhere_reads_back_whole_records_only(
        steps in prop::collection::vec(0u64..1_000_000, 1..12),
        cut in any::<prop::sample::Index>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full");
        let mut w = Writer::open(&full, "rank-0.jsonl", 0, Some(0), Some("n1".into()));
        let t0 = chrono::DateTime::parse_from_rfc3339("2026-11-23T00:00:00Z").unwrap().to_utc();
        for (i, s) in steps.iter().enumerate() {
            let ts = t0 + chrono::Duration::milliseconds(i as i64 * 1500 + 1);
            w.record_at(ts, "progress", serde_json::json!({ "step": s, "source": "stdout" }), false);
        }
        drop(w);
        let bytes = std::fs::read(full.join("rank-0.jsonl")).unwrap();
        let whole = read_job(&full).unwrap().records;
        prop_assert_eq!(whole.len(), steps.len());

        let k = cut.index(bytes.len() + 1);
        let cutdir = dir.path().join("cut");
        std::fs::create_dir(&cutdir).unwrap();
        std::fs::write(cutdir.join("rank-0.jsonl"), &bytes[..k]).unwrap();
        let j = read_job(&cutdir).unwrap();
        // Lines complete before the cut (a line whose newline was cut off
        // is still whole: its JSON ended).
        let mut complete = 0;
        let mut at = 0;
        for line in bytes.split_inclusive(|&b| b == b'\n') {
            if at + line.len() - 1 <= k {
                complete += 1;
            }
            at += line.len();
        }
        prop_assert_eq!(&j.records[..], &whole[..complete], "cut at {} of {}", k, bytes.len());
        prop_assert!(j.bad_lines <= 1);
        let torn = j.skipped.iter().any(|s| s.torn_last_line);
        prop_assert_eq!(torn, j.bad_lines == 1);
    }
}
