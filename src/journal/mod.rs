//! The per-job journal: append-only JSON Lines, one file per writer.
//!
//! Layout: `STATE_DIR/jobs/JOB/rank-R.jsonl` for each rank's agent (and
//! later `coordinator.jsonl`); readers merge every `*.jsonl` in the job's
//! directory, ordered by timestamp. One file per writer keeps records whole
//! on shared filesystems (NFS gives no atomic `O_APPEND` across nodes).
//!
//! Crash safety: each record is one `write(2)` of a complete line to a file
//! opened with `O_APPEND`; records that matter are `fdatasync`ed before
//! resilio acts on them. A writer that finds its file ending in a partial
//! line (a kill in the middle of a write) cuts it off before appending, and
//! readers skip a final line that does not parse. So after a `kill -9` at any
//! moment every record is either whole or absent.
//!
//! Fail open: if the journal cannot be written, resilio says so once on
//! stderr and keeps supervising; when writing works again it records a
//! `journal_gap` with the number of records lost.
//!
//! `writer.rs` appends, `reader.rs` reads and merges; a record's fields are
//! typed by [`crate::event`].

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

use crate::event::Event;
pub use crate::event::SCHEMA_VERSION;

mod follow;
mod parse;
mod reader;
mod rollback;
mod writer;

pub use follow::Follow;
pub use reader::{list_jobs, parse_file, read_job, JobJournal, SkippedLines};
pub use rollback::{forget_rollback, rollback_for, Rollback, ROLLBACK_FILE};
pub use writer::{create_private_dir_all, write_private, Writer};

/// One journal record. Fields beyond the common ones depend on `kind`.
/// Read by hand (`parse.rs`): the envelope typed, the rest kept as it is.
///
/// A record read from a journal line whose kind this build knows keeps its
/// typed event and the line's text, not a map of its fields (`data` is then
/// empty): at a million records the maps were most of a report's memory and
/// time. [`Record::fields`] gives the fields either way.
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// Schema version.
    pub v: u32,
    /// When it happened (UTC).
    pub ts: DateTime<Utc>,
    /// What happened: `rank_start`, `progress`, `stall`, `rank_exit`, ...
    pub kind: String,
    /// Attempt number (0 for the first run, +1 per requeue or restart).
    pub attempt: u32,
    /// The rank it concerns, when it concerns one.
    pub rank: Option<u32>,
    /// The node it concerns, when it concerns one.
    pub node: Option<String>,
    /// Kind-specific fields of a record made in code or read whole; empty
    /// for one read as its event and its line (see [`Record::fields`]).
    pub data: Map<String, Value>,
    /// The typed event: for a record read as its event and its line, set
    /// when the line was read; otherwise parsed from `data` the first time
    /// it is asked for (so `data` is not to be changed after that).
    pub parsed: Parsed,
    /// The line a record was read from, when its fields are kept as text.
    pub text: LineText,
}

/// A record's typed event, parsed once. Not part of what a record is: two
/// records are equal, and shown alike, whether or not either was parsed
/// yet.
#[derive(Clone, Default)]
pub struct Parsed(std::sync::OnceLock<Option<Box<Event>>>);

impl std::fmt::Debug for Parsed {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("Parsed")
    }
}

/// The text of the line a record was read from, with its run key, and its
/// fields as a map once asked for (`None`: the record's fields are its
/// `data`).
#[derive(Clone, Default)]
pub struct LineText(Option<Box<Line>>);

#[derive(Clone)]
struct Line {
    /// The whole file the line was read from, shared by its records (a
    /// copy of each line cost a million allocations on a big job).
    file: std::sync::Arc<Vec<u8>>,
    span: std::ops::Range<usize>,
    run: Option<Box<str>>,
    fields: std::sync::OnceLock<Map<String, Value>>,
}

impl Line {
    /// The line's text (checked to be UTF-8 when it was read).
    fn text(&self) -> &str {
        std::str::from_utf8(&self.file[self.span.clone()]).unwrap_or_default()
    }
}

impl std::fmt::Debug for LineText {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match &self.0 {
            Some(l) => write!(f, "LineText({:?})", l.text()),
            None => f.write_str("LineText(None)"),
        }
    }
}

impl PartialEq for Record {
    fn eq(&self, o: &Record) -> bool {
        self.v == o.v
            && self.ts == o.ts
            && self.kind == o.kind
            && self.attempt == o.attempt
            && self.rank == o.rank
            && self.node == o.node
            && self.fields() == o.fields()
    }
}

impl Serialize for Record {
    /// The envelope, then the fields: the same line whichever way the
    /// record is held.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let fields = self.fields();
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("v", &self.v)?;
        m.serialize_entry("ts", &self.ts)?;
        m.serialize_entry("kind", &self.kind)?;
        m.serialize_entry("attempt", &self.attempt)?;
        if let Some(rank) = &self.rank {
            m.serialize_entry("rank", rank)?;
        }
        if let Some(node) = &self.node {
            m.serialize_entry("node", node)?;
        }
        for (k, v) in fields {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl Record {
    /// The kind-specific fields (those but the envelope's), whichever way
    /// the record is held.
    pub fn fields(&self) -> &Map<String, Value> {
        match &self.text.0 {
            None => &self.data,
            Some(l) => l.fields.get_or_init(|| parse::fields_of(l.text())),
        }
    }

    /// A field of the kind-specific data.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields().get(key)
    }

    /// A numeric field.
    pub fn f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }

    /// An integer field.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    /// A string field.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// The run key stamped on the record (see [`crate::runs`]).
    pub fn run(&self) -> Option<&str> {
        match &self.text.0 {
            Some(l) => l.run.as_deref(),
            None => self.str("run"),
        }
    }

    /// The record's kind and fields, typed (see [`crate::event`]), parsed
    /// once; `None` for a kind this build does not know.
    pub fn event(&self) -> Option<&Event> {
        self.parsed
            .0
            .get_or_init(|| Event::from_fields(&self.kind, &self.data).map(Box::new))
            .as_deref()
    }
}

/// Each record with its typed event; records of a kind this build does not
/// know are left out.
pub fn events(records: &[Record]) -> impl Iterator<Item = (&Record, &Event)> + '_ {
    records.iter().filter_map(|r| Some((r, r.event()?)))
}

/// The checkpoints to count on: a `checkpoint_done` that is
/// [`whole`](crate::event::CheckpointDone::whole), and whose step no look
/// at its files found incomplete or stale (the trainer's own word, on its
/// output or socket, for a checkpoint its directory shows stale does not
/// make it whole; trial 16b). With the record each is in.
pub fn whole_checkpoints(
    records: &[Record],
) -> impl Iterator<Item = (&Record, &crate::event::CheckpointDone)> + '_ {
    let unsound = unsound_checkpoint_steps(records);
    events(records).filter_map(move |(r, e)| match e {
        Event::CheckpointDone(c) if c.whole() && c.step.is_none_or(|s| !unsound.contains(&s)) => {
            Some((r, c))
        }
        _ => None,
    })
}

/// The steps of the checkpoints the last look at their files found
/// incomplete or stale: not restorable, whatever else says of them. A
/// later save under the same step that its files show whole is sound again.
pub fn unsound_checkpoint_steps(records: &[Record]) -> std::collections::BTreeSet<u64> {
    let mut last: std::collections::BTreeMap<u64, bool> = Default::default();
    for (_, e) in events(records) {
        if let Event::CheckpointDone(c) = e {
            if let Some(step) = c.step.filter(|_| c.path.is_some() || !c.whole()) {
                last.insert(step, c.whole());
            }
        }
    }
    last.into_iter()
        .filter_map(|(step, whole)| (!whole).then_some(step))
        .collect()
}

/// Check a job id before it becomes part of a path.
pub fn validate_job_id(job: &str) -> Result<(), String> {
    let ok = !job.is_empty()
        && job.len() <= 128
        && !job.starts_with('.')
        && job
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid job id '{job}': use letters, digits, '.', '_', '-', '+' (at most 128)"
        ))
    }
}

/// The directory holding a job's journal.
pub fn job_dir(state_dir: &Path, job: &str) -> PathBuf {
    state_dir.join("jobs").join(job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::fs::OpenOptions;
    use std::io::Write;

    #[test]
    fn records_round_trip_and_merge_by_time() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Writer::open(dir.path(), "rank-0.jsonl", 0, Some(0), Some("n1".into()));
        let mut b = Writer::open(dir.path(), "rank-1.jsonl", 0, Some(1), Some("n2".into()));
        a.record("rank_start", json!({"pid": 1}), true);
        b.record("rank_start", json!({"pid": 2}), true);
        a.record("progress", json!({"step": 5}), false);
        let j = read_job(dir.path()).unwrap();
        assert_eq!(j.records.len(), 3);
        assert_eq!(j.bad_lines, 0);
        assert_eq!(
            j.records
                .iter()
                .map(|r| r.kind.as_str())
                .collect::<Vec<_>>(),
            ["rank_start", "rank_start", "progress"]
        );
        assert_eq!(j.records[2].u64("step"), Some(5));
        assert_eq!(j.records[2].rank, Some(0));
        assert_eq!(j.records[0].v, SCHEMA_VERSION);
    }

    #[test]
    fn torn_tail_is_cut_on_reopen_and_skipped_by_readers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rank-0.jsonl");
        let mut w = Writer::open(dir.path(), "rank-0.jsonl", 0, Some(0), None);
        w.record("rank_start", json!({}), true);
        drop(w);
        // Simulate a kill in the middle of a write.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"v\":1,\"ts\":\"2026-").unwrap();
        drop(f);
        let j = read_job(dir.path()).unwrap();
        assert_eq!((j.records.len(), j.bad_lines), (1, 1));
        let mut w = Writer::open(dir.path(), "rank-0.jsonl", 1, Some(0), None);
        w.record("rank_start", json!({}), true);
        let j = read_job(dir.path()).unwrap();
        assert_eq!((j.records.len(), j.bad_lines), (2, 0));
    }

    #[test]
    fn unreadable_lines_and_files_are_skipped_counted_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), "rank-0.jsonl", 0, Some(0), None);
        for step in 1..=3 {
            w.record("progress", json!({ "step": step }), false);
        }
        drop(w);
        // A garbled middle line, a line that is JSON but not a record, and
        // a torn last line.
        let path = dir.path().join("rank-0.jsonl");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines[1] = lines[1].replace("\"kind\"", "\u{1}garbled");
        lines.push("{\"v\":1}".into());
        let mut text = lines.join("\n");
        text.push_str("\n{\"v\":1,\"ts\":\"2026-");
        std::fs::write(&path, text).unwrap();
        // A file of garbage, an empty one, and one that cannot be read.
        std::fs::write(dir.path().join("rank-1.jsonl"), "not json\n\0\0\0\n").unwrap();
        std::fs::write(dir.path().join("rank-2.jsonl"), "").unwrap();
        std::fs::create_dir(dir.path().join("rank-3.jsonl")).unwrap();

        let j = read_job(dir.path()).unwrap();
        assert_eq!(j.records.len(), 2);
        assert_eq!(j.bad_lines, 5);
        let by_name = |n: &str| {
            j.skipped
                .iter()
                .find(|f| f.file.ends_with(n))
                .unwrap_or_else(|| panic!("{n} not listed: {:#?}", j.skipped))
        };
        let r0 = by_name("rank-0.jsonl");
        assert_eq!(
            (r0.lines, r0.records, r0.torn_last_line),
            (3, 2, true),
            "{r0:#?}"
        );
        assert_eq!(r0.line_numbers, [2, 4, 5]);
        assert!(
            r0.describe().ends_with(
                "rank-0.jsonl: 3 lines skipped (lines 2, 4, 5; the last one cut short by a crash)"
            ),
            "{}",
            r0.describe()
        );
        let r1 = by_name("rank-1.jsonl");
        assert!(r1
            .describe()
            .ends_with("rank-1.jsonl: no readable record, 2 lines skipped (lines 1, 2)"));
        assert!(by_name("rank-2.jsonl")
            .describe()
            .ends_with("rank-2.jsonl: no readable record (empty)"));
        let r3 = by_name("rank-3.jsonl");
        assert!(r3.error.is_some() && r3.describe().contains("rank-3.jsonl: unreadable ("));
        assert_eq!(j.skipped.len(), 4);
    }

    #[test]
    fn a_job_of_many_files_is_read_on_every_core_as_it_is_file_by_file() {
        // Enough files to be split between threads: each file's records
        // and skipped lines as read alone, in name order, merged by time.
        let dir = tempfile::tempdir().unwrap();
        for rank in 0..300u32 {
            let mut w = Writer::open(
                dir.path(),
                &format!("rank-{rank}.jsonl"),
                0,
                Some(rank),
                None,
            );
            w.record("rank_start", json!({ "pid": rank }), false);
            w.record("progress", json!({ "step": rank }), false);
        }
        let path = |n: &str| dir.path().join(n);
        let text = |n: &str| std::fs::read_to_string(path(n)).unwrap();
        let garbled = text("rank-7.jsonl").replace("\"kind\"", "garbled");
        std::fs::write(path("rank-7.jsonl"), garbled).unwrap();
        let torn = format!("{}{{\"v\":1,\"ts\"", text("rank-290.jsonl"));
        std::fs::write(path("rank-290.jsonl"), torn).unwrap();
        std::fs::write(path("rank-3-copy.jsonl"), text("rank-3.jsonl")).unwrap();
        let future = text("rank-5.jsonl").replacen("2026-", "9999-", 1);
        std::fs::write(path("rank-5.jsonl"), future).unwrap();
        std::fs::create_dir(path("rank-300.jsonl")).unwrap();

        let j = read_job(dir.path()).unwrap();
        let mut alone = Vec::new();
        for f in &j.files {
            if let Ok(t) = std::fs::read(f) {
                let (r, _) = parse_file(&t);
                if !f.ends_with("rank-3-copy.jsonl") {
                    alone.extend(
                        r.into_iter()
                            .filter(|r| r.ts.format("%Y").to_string() != "9999"),
                    );
                }
            }
        }
        alone.sort_by_key(|r| r.ts);
        assert_eq!(j.records, alone);
        assert_eq!(j.records.len(), 600 - 2 - 1);
        // Every record's event was parsed as it was read.
        assert!(j.records.iter().all(|r| r.parsed.0.get().is_some()));
        assert_eq!(j.files.len(), 302);
        assert!(j.files[..301].iter().all(|f| reader::is_own_name(f)));
        assert!(j.files[301].ends_with("rank-3-copy.jsonl"));
        let listed: Vec<String> = j
            .skipped
            .iter()
            .map(|f| {
                let name = f.file.file_name().unwrap().to_string_lossy();
                format!(
                    "{name} {} {} {} {} {}",
                    f.lines,
                    f.torn_last_line,
                    f.duplicates,
                    f.future,
                    f.error.is_some()
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                "rank-290.jsonl 1 true 0 0 false",
                "rank-300.jsonl 0 false 0 0 true",
                "rank-5.jsonl 0 false 0 1 false",
                "rank-7.jsonl 2 false 0 0 false",
                "rank-3-copy.jsonl 0 false 2 0 false",
            ]
        );
        assert_eq!(j.bad_lines, 3);
    }

    #[test]
    fn a_torn_last_line_alone_is_described_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), "rank-0.jsonl", 0, Some(0), None);
        w.record("rank_start", json!({}), true);
        drop(w);
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("rank-0.jsonl"))
            .unwrap();
        f.write_all(b"{\"v\":1,\"ts\"").unwrap();
        let j = read_job(dir.path()).unwrap();
        assert_eq!(j.skipped.len(), 1);
        assert!(j.skipped[0]
            .describe()
            .ends_with("rank-0.jsonl: 1 line skipped (the last line, cut short by a crash)"));
    }

    #[test]
    fn records_carry_the_writers_run_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), "rank-0.jsonl", 0, Some(0), None).with_run(Some("k1"));
        w.record("rank_start", json!({}), true);
        w.set_run(None);
        w.record("rank_exit", json!({}), true);
        let j = read_job(dir.path()).unwrap();
        assert_eq!(j.records[0].str("run"), Some("k1"));
        assert_eq!(j.records[1].get("run"), None);
    }

    #[test]
    fn unwritable_dir_fails_open() {
        let w = Writer::open(
            Path::new("/proc/resilio-no-such"),
            "rank-0.jsonl",
            0,
            None,
            None,
        );
        assert!(!w.is_ok());
        let mut w = w;
        w.record("stall", json!({}), true);
        assert_eq!(w.dropped(), 1);
    }

    #[test]
    fn files_and_directories_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = job_dir(t.path(), "j");
        let mut w = Writer::open(&dir, "rank-0.jsonl", 0, Some(0), None);
        w.record("rank_start", json!({}), true);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir.join("rank-0.jsonl")), 0o600);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&t.path().join("jobs")), 0o700);
        write_private(&dir.join("x.txt"), b"x").unwrap();
        assert_eq!(mode(&dir.join("x.txt")), 0o600);
    }

    #[test]
    fn writing_resumes_after_an_error_and_the_gap_is_journaled() {
        let t = tempfile::tempdir().unwrap();
        // A file where the directory should be: nothing can be written.
        let dir = t.path().join("d");
        std::fs::write(&dir, "").unwrap();
        let mut w = Writer::open(&dir, "rank-0.jsonl", 0, Some(0), None);
        assert!(!w.is_ok());
        let t0 = Utc::now();
        for step in 1..=5 {
            let at = t0 + chrono::Duration::seconds(step);
            w.record_at(at, "progress", json!({ "step": step }), false);
        }
        assert_eq!(w.dropped(), 5);
        // The disk is back: a durable record tries at once, and the gap
        // goes first.
        std::fs::remove_file(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        let back = t0 + chrono::Duration::seconds(10);
        w.record_at(back, "stall", json!({}), true);
        assert!(w.is_ok());
        assert_eq!(w.dropped(), 0);
        // Ordinary records go on being written.
        w.record_at(
            back + chrono::Duration::seconds(1),
            "progress",
            json!({ "step": 11 }),
            false,
        );
        let j = read_job(&dir).unwrap();
        let kinds: Vec<&str> = j.records.iter().map(|r| r.kind.as_str()).collect();
        assert_eq!(kinds, ["journal_gap", "stall", "progress"]);
        let Some(Event::JournalGap(g)) = j.records[0].event() else {
            panic!("{:?}", j.records[0]);
        };
        assert_eq!(g.lost_records, 5);
        assert_eq!(g.from, Some(t0 + chrono::Duration::seconds(1)));
        assert_eq!(g.to, Some(back));
    }

    #[test]
    fn job_ids_are_validated() {
        for ok in ["12345", "local-20261122-005100-42", "12345_7", "a.b+c"] {
            assert!(validate_job_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "../x", "a/b", ".hidden", "a b", "x\n"] {
            assert!(validate_job_id(bad).is_err(), "{bad:?}");
        }
    }
}
