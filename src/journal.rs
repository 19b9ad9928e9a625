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

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::event::Event;
pub use crate::event::SCHEMA_VERSION;

/// One journal record. Fields beyond the common ones depend on `kind`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The node it concerns, when it concerns one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Kind-specific fields.
    #[serde(flatten)]
    pub data: Map<String, Value>,
}

impl Record {
    /// A field of the kind-specific data.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.data.get(key)
    }

    /// A numeric field.
    pub fn f64(&self, key: &str) -> Option<f64> {
        self.data.get(key).and_then(Value::as_f64)
    }

    /// An integer field.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.data.get(key).and_then(Value::as_u64)
    }

    /// A string field.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.data.get(key).and_then(Value::as_str)
    }

    /// The run key stamped on the record (see [`crate::runs`]).
    pub fn run(&self) -> Option<&str> {
        self.str("run")
    }

    /// The record's kind and fields, typed (see [`crate::event`]); `None`
    /// for a kind this build does not know.
    pub fn event(&self) -> Option<Event> {
        Event::from_fields(&self.kind, &self.data)
    }
}

/// Each record with its typed event; records of a kind this build does not
/// know are left out.
pub fn events(records: &[Record]) -> impl Iterator<Item = (&Record, Event)> + '_ {
    records.iter().filter_map(|r| Some((r, r.event()?)))
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

/// Appends records for one writer (one rank's agent).
pub struct Writer {
    path: PathBuf,
    file: Option<File>,
    attempt: u32,
    rank: Option<u32>,
    node: Option<String>,
    /// The run key stamped on every record (`run`); see [`crate::runs`].
    run: Option<String>,
    warned: bool,
    dropped: u64,
}

impl Writer {
    /// Open (creating as needed) `dir/name`. Never fails: on error the
    /// writer warns once and drops records until writing works again.
    pub fn open(
        dir: &Path,
        name: &str,
        attempt: u32,
        rank: Option<u32>,
        node: Option<String>,
    ) -> Writer {
        let mut w = Writer {
            path: dir.join(name),
            file: None,
            attempt,
            rank,
            node,
            run: None,
            warned: false,
            dropped: 0,
        };
        if let Err(e) = w.try_open() {
            w.fail(&e);
        }
        w
    }

    /// Records from now on belong to `attempt` (a restart in place).
    pub fn set_attempt(&mut self, attempt: u32) {
        self.attempt = attempt;
    }

    /// A writer that writes nothing (used when no journal is wanted).
    pub fn disabled() -> Writer {
        Writer {
            path: PathBuf::new(),
            file: None,
            attempt: 0,
            rank: None,
            node: None,
            run: None,
            warned: true,
            dropped: 0,
        }
    }

    /// Stamp every record from now on with the run key `run` (see
    /// [`crate::runs`]); `None` writes records without one.
    pub fn set_run(&mut self, run: Option<&str>) {
        self.run = run.map(str::to_string);
    }

    /// The same, as a builder.
    pub fn with_run(mut self, run: Option<&str>) -> Writer {
        self.set_run(run);
        self
    }

    /// The run key stamped on records.
    pub fn run(&self) -> Option<&str> {
        self.run.as_deref()
    }

    /// Where records go.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the journal is being written.
    pub fn is_ok(&self) -> bool {
        self.file.is_some()
    }

    /// Records lost to write errors so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn try_open(&mut self) -> std::io::Result<()> {
        if self.path.as_os_str().is_empty() {
            return Err(std::io::Error::other("journal disabled"));
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let existed = self.path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&self.path)?;
        repair_torn_tail(&mut file)?;
        if !existed {
            // Make the new file's directory entry durable too.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        self.file = Some(file);
        Ok(())
    }

    fn fail(&mut self, e: &std::io::Error) {
        self.file = None;
        if !self.warned {
            self.warned = true;
            eprintln!(
                "resilio: cannot write journal {}: {e}; supervision continues without it",
                self.path.display()
            );
        }
    }

    /// Append one record. `durable` records are fsynced before this returns.
    pub fn write(&mut self, event: impl Into<Event>, durable: bool) {
        self.write_at(Utc::now(), event, durable)
    }

    /// The same with an explicit timestamp.
    pub fn write_at(&mut self, ts: DateTime<Utc>, event: impl Into<Event>, durable: bool) {
        let event = event.into();
        let kind = event.kind();
        self.record_at(ts, kind, Value::Object(event.into_fields()), durable)
    }

    /// Append one record of `kind` with `data` (an object). `durable` records
    /// are fsynced before this returns.
    pub fn record(&mut self, kind: &str, data: Value, durable: bool) {
        self.record_at(Utc::now(), kind, data, durable)
    }

    /// The same with an explicit timestamp.
    pub fn record_at(&mut self, ts: DateTime<Utc>, kind: &str, data: Value, durable: bool) {
        if self.file.is_none() {
            if self.path.as_os_str().is_empty() || !durable {
                self.dropped += 1;
                return;
            }
            // Retry on records that matter: the disk may have recovered.
            if self.try_open().is_err() {
                self.dropped += 1;
                return;
            }
        }
        if self.dropped > 0 {
            let lost = self.dropped;
            self.dropped = 0;
            let gap = crate::event::JournalGap {
                lost_records: Some(lost),
            };
            self.write_line(
                ts,
                "journal_gap",
                Value::Object(Event::from(gap).into_fields()),
                false,
            );
        }
        self.write_line(ts, kind, data, durable);
    }

    fn write_line(&mut self, ts: DateTime<Utc>, kind: &str, data: Value, durable: bool) {
        let data = match data {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => {
                let mut m = Map::new();
                m.insert("value".into(), other);
                m
            }
        };
        let mut data = data;
        for reserved in ["v", "ts", "kind", "attempt", "rank", "node"] {
            debug_assert!(
                !data.contains_key(reserved),
                "journal data must not set '{reserved}'"
            );
            data.remove(reserved);
        }
        if let Some(run) = &self.run {
            data.insert("run".into(), Value::String(run.clone()));
        }
        let rec = Record {
            v: SCHEMA_VERSION,
            ts,
            kind: kind.to_string(),
            attempt: self.attempt,
            rank: self.rank,
            node: self.node.clone(),
            data,
        };
        let mut line = match serde_json::to_vec(&rec) {
            Ok(l) => l,
            Err(_) => return,
        };
        line.push(b'\n');
        let Some(file) = self.file.as_mut() else {
            self.dropped += 1;
            return;
        };
        // One write(2) per record; O_APPEND puts it at the end.
        let result =
            file.write_all(&line)
                .and_then(|_| if durable { file.sync_data() } else { Ok(()) });
        if let Err(e) = result {
            self.dropped += 1;
            self.fail(&e);
        }
    }
}

/// If the file ends in a partial line, cut it off.
fn repair_torn_tail(file: &mut File) -> std::io::Result<()> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))?;
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    // Walk back to the last newline.
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    let mut cut = 0;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..n])?;
        if let Some(p) = buf[..n].iter().rposition(|&b| b == b'\n') {
            cut = start + p as u64 + 1;
            break;
        }
        end = start;
    }
    file.set_len(cut)?;
    file.sync_data()?;
    Ok(())
}

/// What reading a job's journal found.
#[derive(Debug, Default)]
pub struct JobJournal {
    /// Every whole record, ordered by time (stable for equal times).
    pub records: Vec<Record>,
    /// Lines that did not parse as a record (a torn final line, garbled
    /// or foreign content), over all files.
    pub bad_lines: usize,
    /// The files read.
    pub files: Vec<PathBuf>,
    /// Per file: the lines skipped, or why the file could not be read.
    /// Only files with something skipped are listed.
    pub skipped: Vec<SkippedLines>,
}

/// Lines of one journal file that were skipped.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct SkippedLines {
    pub file: PathBuf,
    /// Lines that did not parse as a record (the torn last line included).
    pub lines: usize,
    /// Their line numbers (1-based), the first [`MAX_LINE_NUMBERS`].
    pub line_numbers: Vec<usize>,
    /// The last line was cut short (no newline): a write interrupted by a
    /// crash. Writers cut it off before appending again.
    pub torn_last_line: bool,
    /// Records read from the file.
    pub records: usize,
    /// The file could not be read at all (permission denied, a directory, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How many line numbers [`SkippedLines`] keeps per file.
pub const MAX_LINE_NUMBERS: usize = 20;

impl SkippedLines {
    /// One line for people, such as `.../rank-0.jsonl: 1 line skipped (line 7)`
    /// or `.../rank-1.jsonl: no readable record (empty)`.
    pub fn describe(&self) -> String {
        let name = self.file.display();
        if let Some(e) = &self.error {
            return format!("{name}: unreadable ({e})");
        }
        if self.lines == 0 {
            return format!("{name}: no readable record (empty)");
        }
        let head = if self.records == 0 {
            format!("{name}: no readable record, ")
        } else {
            format!("{name}: ")
        };
        let count = match self.lines {
            1 => "1 line skipped".to_string(),
            n => format!("{n} lines skipped"),
        };
        let torn_only = self.torn_last_line && self.lines == 1;
        let detail = if torn_only {
            " (the last line, cut short by a crash)".to_string()
        } else {
            let mut n: Vec<String> = self.line_numbers.iter().map(|l| l.to_string()).collect();
            if self.lines > self.line_numbers.len() {
                n.push("...".into());
            }
            format!(
                " (line{} {}{})",
                if self.lines == 1 { "" } else { "s" },
                n.join(", "),
                if self.torn_last_line {
                    "; the last one cut short by a crash"
                } else {
                    ""
                }
            )
        };
        format!("{head}{count}{detail}")
    }
}

/// Read and merge every `*.jsonl` of a job's directory. Lines that do not
/// parse as a record are skipped and counted per file; a file that cannot
/// be read is skipped and named. Fails only when the directory cannot be
/// listed.
pub fn read_job(dir: &Path) -> std::io::Result<JobJournal> {
    let mut out = JobJournal::default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    for path in &files {
        let mut skip = SkippedLines {
            file: path.clone(),
            ..SkippedLines::default()
        };
        match std::fs::read(path) {
            Ok(text) => read_lines(&text, &mut out.records, &mut skip),
            Err(e) => skip.error = Some(e.to_string()),
        }
        out.bad_lines += skip.lines;
        if skip.lines > 0 || skip.error.is_some() || skip.records == 0 {
            out.skipped.push(skip);
        }
    }
    out.records.sort_by_key(|r| r.ts);
    out.files = files;
    Ok(out)
}

/// Parse one file's lines into `records`, noting what was skipped.
fn read_lines(text: &[u8], records: &mut Vec<Record>, skip: &mut SkippedLines) {
    let ends_whole = text.last().is_none_or(|&b| b == b'\n');
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    let last = lines.len().saturating_sub(1);
    for (i, line) in lines.iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Record>(line) {
            Ok(r) => {
                records.push(r);
                skip.records += 1;
            }
            Err(_) => {
                skip.lines += 1;
                if skip.line_numbers.len() < MAX_LINE_NUMBERS {
                    skip.line_numbers.push(i + 1);
                }
                if i == last && !ends_whole {
                    skip.torn_last_line = true;
                }
            }
        }
    }
}

/// Jobs under a state dir, most recently written last.
pub fn list_jobs(state_dir: &Path) -> Vec<(String, std::time::SystemTime)> {
    let Ok(entries) = std::fs::read_dir(state_dir.join("jobs")) else {
        return Vec::new();
    };
    let mut jobs: Vec<(String, std::time::SystemTime)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let newest = std::fs::read_dir(e.path())
                .ok()?
                .filter_map(|f| f.ok()?.metadata().ok()?.modified().ok())
                .max()?;
            Some((name, newest))
        })
        .collect();
    jobs.sort_by_key(|(_, t)| *t);
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn job_ids_are_validated() {
        for ok in ["12345", "local-20261122-005100-42", "12345_7", "a.b+c"] {
            assert!(validate_job_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "../x", "a/b", ".hidden", "a b", "x\n"] {
            assert!(validate_job_id(bad).is_err(), "{bad:?}");
        }
    }
}
