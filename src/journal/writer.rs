//! Appending records: one `write(2)` per line, `fdatasync` for the ones
//! that matter, a torn last line cut off before appending, fail open.
//!
//! Files are made 0600 and directories 0700: a journal holds argv, the
//! working directory and output lines. After a write error (a full disk)
//! records are counted as lost and writing is tried again, at once for a
//! durable record and at most once a second for the others; the first record
//! that gets through is preceded by a `journal_gap` naming how many were lost
//! and from when.

use super::{Record, SCHEMA_VERSION};
use crate::event::Event;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often writing is tried again after an error, for records that are
/// not durable (a durable one always tries).
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// Make `dir` and its missing parents private (0700): journal and job
/// directories. Existing directories are left as they are (a site's shared
/// state dir, see [`crate::state_dir`]).
pub fn create_private_dir_all(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Write a whole file readable by its owner only (0600): diagnostics
/// beside the journal.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
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
    /// When the first record not yet written was to be written.
    lost_from: Option<DateTime<Utc>>,
    /// The last time writing was tried again after an error.
    retried: Option<Instant>,
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
            lost_from: None,
            retried: None,
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
            lost_from: None,
            retried: None,
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

    /// Records lost to write errors and not yet told by a `journal_gap`.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn try_open(&mut self) -> std::io::Result<()> {
        if self.path.as_os_str().is_empty() {
            return Err(std::io::Error::other("journal disabled"));
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        create_private_dir_all(dir)?;
        let existed = self.path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
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
        self.retried = Some(Instant::now());
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                "cannot write journal {}: {e}; supervision continues without it",
                self.path.display()
            );
        }
    }

    /// Append one record. `durable` records are fsynced before this returns.
    pub fn write(&mut self, event: impl Into<Event>, durable: bool) {
        self.write_at(crate::util::clock::now(), event, durable)
    }

    /// The same with an explicit timestamp.
    pub fn write_at(&mut self, ts: DateTime<Utc>, event: impl Into<Event>, durable: bool) {
        let event = event.into();
        let kind = event.kind();
        self.record_at(ts, kind, Value::Object(event.into_fields()), durable)
    }

    /// Append a record written by hand: `kind` with `data` (an object).
    /// For tests and tools that shape records themselves (an older build's,
    /// a malformed one); resilio writes typed events ([`Writer::write`]),
    /// which a test checks.
    pub fn record(&mut self, kind: &str, data: Value, durable: bool) {
        self.record_at(crate::util::clock::now(), kind, data, durable)
    }

    /// The same with an explicit timestamp.
    pub fn record_at(&mut self, ts: DateTime<Utc>, kind: &str, data: Value, durable: bool) {
        if self.path.as_os_str().is_empty() {
            self.lose(ts);
            return;
        }
        if self.file.is_none() {
            // Try again (the disk may have space again): at once for records
            // that matter, else at most once per RETRY_EVERY.
            let due = durable || self.retried.is_none_or(|t| t.elapsed() >= RETRY_EVERY);
            if !due {
                self.lose(ts);
                return;
            }
            self.retried = Some(Instant::now());
            if self.try_open().is_err() {
                self.lose(ts);
                return;
            }
        }
        if self.dropped > 0 {
            let lost = self.dropped;
            let gap = crate::event::JournalGap {
                lost_records: lost,
                from: self.lost_from,
                to: Some(ts),
            };
            let gap = Value::Object(Event::from(gap).into_fields());
            if !self.write_line(ts, "journal_gap", gap, false) {
                self.lose(ts);
                return;
            }
            tracing::warn!(
                "journal {} written again ({lost} records lost)",
                self.path.display()
            );
            self.dropped = 0;
            self.lost_from = None;
        }
        if !self.write_line(ts, kind, data, durable) {
            self.lose(ts);
        }
    }

    /// Count a record that was not written.
    fn lose(&mut self, ts: DateTime<Utc>) {
        self.dropped += 1;
        self.lost_from = Some(self.lost_from.map_or(ts, |f| f.min(ts)));
    }

    /// Write one line; false when it was not written (the file is then
    /// closed, to be opened again, its torn tail cut, on the next try).
    fn write_line(&mut self, ts: DateTime<Utc>, kind: &str, data: Value, durable: bool) -> bool {
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
            parsed: Default::default(),
            text: Default::default(),
        };
        let mut line = match serde_json::to_vec(&rec) {
            Ok(l) => l,
            Err(_) => return true,
        };
        line.push(b'\n');
        let Some(file) = self.file.as_mut() else {
            return false;
        };
        let before = file.metadata().map(|m| m.len()).ok();
        // One write(2) per record; O_APPEND puts it at the end.
        let result =
            file.write_all(&line)
                .and_then(|_| if durable { file.sync_data() } else { Ok(()) });
        if let Err(e) = result {
            // A short write (a disk filling up) left part of the line: cut
            // it (reopening cuts it too, should this fail).
            if let Some(len) = before {
                let _ = file.set_len(len);
            }
            self.fail(&e);
            return false;
        }
        true
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
