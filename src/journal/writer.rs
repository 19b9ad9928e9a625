//! Appending records: one `write(2)` per line, `fdatasync` for the ones
//! that matter, a torn last line cut off before appending, fail open.

use super::{Record, SCHEMA_VERSION};
use crate::event::Event;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

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
            tracing::warn!(
                "cannot write journal {}: {e}; supervision continues without it",
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

    /// Append a record written by hand: `kind` with `data` (an object).
    /// For tests and tools that shape records themselves (an older build's,
    /// a malformed one); resilio writes typed events ([`Writer::write`]),
    /// which a test checks.
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
