//! Reading a job's journal as it grows: each file from where the last read
//! stopped, so that a long-lived reader (the local launcher, deciding after
//! every failed attempt) parses each line once, and keeps of older attempts
//! only what its decisions use. Its cost per attempt stays flat over
//! thousands of restarts, where reading the whole journal again grew with
//! every attempt.

use super::Record;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A job directory's journal, followed.
pub struct Follow {
    dir: PathBuf,
    /// Per file: the offset after the last whole line read.
    offsets: HashMap<PathBuf, u64>,
    records: Vec<Record>,
}

impl Follow {
    pub fn new(dir: &Path) -> Follow {
        Follow {
            dir: dir.to_path_buf(),
            offsets: HashMap::new(),
            records: Vec::new(),
        }
    }

    /// Read the whole lines appended to each `*.jsonl` since the last call;
    /// every record kept, ordered by time. A file that shrank (replaced) is
    /// read again from its start; a line that does not parse is skipped, as
    /// [`super::read_job`] does.
    pub fn refresh(&mut self) -> &[Record] {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return &self.records;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        files.sort();
        let before = self.records.len();
        for path in files {
            let from = self.offsets.get(&path).copied().unwrap_or(0);
            if let Some(read) = read_whole_lines(&path, from, &mut self.records) {
                self.offsets.insert(path, read);
            }
        }
        if self.records.len() > before {
            self.records.sort_by_key(|r| r.ts);
        }
        &self.records
    }

    /// Drop the records of attempts before `attempt` that `keep` does not
    /// want (a decision, a confirmed checkpoint): what is left of them stays
    /// bounded by what the decisions read.
    pub fn prune(&mut self, attempt: u32, keep: impl Fn(&Record) -> bool) {
        self.records.retain(|r| r.attempt >= attempt || keep(r));
    }
}

/// Parse the whole lines of `path` from byte `from` into `out`; the offset
/// after the last whole line. `None` when the file cannot be read (it stays
/// where it was). A file shorter than `from` is read from its start.
fn read_whole_lines(path: &Path, from: u64, out: &mut Vec<Record>) -> Option<u64> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.file_type().is_file() {
        return None;
    }
    let from = if meta.len() < from { 0 } else { from };
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut text = Vec::new();
    f.take(crate::util::files::JOURNAL_CAP)
        .read_to_end(&mut text)
        .ok()?;
    // Up to the last newline: a line still being written waits for the next read.
    let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    out.extend(super::parse_file(&text[..whole]).0);
    Some(from + whole as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{read_job, Writer};
    use serde_json::json;

    #[test]
    fn following_reads_each_line_once_and_agrees_with_a_whole_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = Follow::new(dir.path());
        assert!(f.refresh().is_empty());
        let mut a = Writer::open(dir.path(), "rank-0.jsonl", 0, Some(0), None);
        let mut b = Writer::open(dir.path(), "rank-1.jsonl", 0, Some(1), None);
        a.record("rank_start", json!({}), true);
        b.record("rank_start", json!({}), true);
        assert_eq!(f.refresh().len(), 2);
        // A line still being written is not read, nor lost.
        use std::io::Write;
        let path = dir.path().join("rank-0.jsonl");
        let line = {
            let mut w = Writer::open(dir.path(), "scratch.jsonl", 1, Some(0), None);
            w.record("progress", json!({ "step": 7 }), true);
            drop(w);
            let t = std::fs::read_to_string(dir.path().join("scratch.jsonl")).unwrap();
            std::fs::remove_file(dir.path().join("scratch.jsonl")).unwrap();
            t
        };
        let mut raw = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        raw.write_all(&line.as_bytes()[..10]).unwrap();
        assert_eq!(f.refresh().len(), 2);
        raw.write_all(&line.as_bytes()[10..]).unwrap();
        drop(raw);
        assert_eq!(f.refresh().len(), 3);
        for step in 0..5 {
            b.record("progress", json!({ "step": step }), false);
        }
        let followed: Vec<String> = f.refresh().iter().map(|r| format!("{r:?}")).collect();
        let whole: Vec<String> = read_job(dir.path())
            .unwrap()
            .records
            .iter()
            .map(|r| format!("{r:?}"))
            .collect();
        assert_eq!(followed, whole);
        // Older attempts keep only what is asked for.
        f.prune(1, |r| r.kind == "rank_start");
        let kinds: Vec<(u32, &str)> = f
            .refresh()
            .iter()
            .map(|r| (r.attempt, r.kind.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [(0, "rank_start"), (0, "rank_start"), (1, "progress")]
        );
    }
}
