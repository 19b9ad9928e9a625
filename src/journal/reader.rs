//! Reading a job's journal: every `*.jsonl` of its directory merged by
//! time; unreadable lines skipped and counted per file.

use super::Record;
use serde::Serialize;
use std::path::{Path, PathBuf};

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
    /// Records left out because another file (read first, by name) has the
    /// very same line: a copied journal file counts once.
    #[serde(skip_serializing_if = "is_zero")]
    pub duplicates: usize,
    /// Records left out because they are dated more than
    /// [`FUTURE_SLACK_S`] after the journal was read: a clock or a journal
    /// that lies (one record in year 9999 made a wall time of 8,000 years).
    #[serde(skip_serializing_if = "is_zero")]
    pub future: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// How far past the time of reading a record may be dated (clocks of other
/// nodes running ahead) before it is left out as a lie.
pub const FUTURE_SLACK_S: i64 = 86_400;

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
        let mut left_out = Vec::new();
        if self.duplicates > 0 {
            left_out.push(format!(
                "{} record(s) repeating another file's, left out",
                self.duplicates
            ));
        }
        if self.future > 0 {
            left_out.push(format!(
                "{} record(s) dated more than a day ahead, left out",
                self.future
            ));
        }
        if !left_out.is_empty() {
            let skipped = if self.lines > 0 {
                format!("; {} unreadable line(s) skipped", self.lines)
            } else {
                String::new()
            };
            return format!("{name}: {}{skipped}", left_out.join("; "));
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
    read_job_at(dir, chrono::Utc::now())
}

/// [`read_job`] as of `now`: records dated more than [`FUTURE_SLACK_S`]
/// after it, and files with the very bytes of a file read before (a copied
/// journal), are left out and counted.
pub fn read_job_at(dir: &Path, now: chrono::DateTime<chrono::Utc>) -> std::io::Result<JobJournal> {
    use std::os::unix::fs::MetadataExt;
    let latest = now + chrono::Duration::seconds(FUTURE_SLACK_S);
    let mut out = JobJournal::default();
    // Each file speaks for the directory's owner (or root's plugin): one
    // another user slipped in is not read.
    let owner = std::fs::symlink_metadata(dir)?.uid();
    let files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    // The names resilio writes (`rank-3.jsonl`, `batch.jsonl`) first: of a
    // file and its copy (`rank-3-copy.jsonl`), the copy is the one left out.
    // (Sorted by name alone: they share the directory. 131,072 paths were
    // cloned to be sorted.)
    let mut keyed: Vec<(bool, PathBuf)> =
        files.into_iter().map(|p| (!is_own_name(&p), p)).collect();
    keyed.sort_unstable_by(|(a, p), (b, q)| (a, p.file_name()).cmp(&(b, q.file_name())));
    let files: Vec<PathBuf> = keyed.into_iter().map(|(_, p)| p).collect();
    // Each file read and parsed (its records' events too) on every core,
    // then merged in name order.
    let read = read_all(&files, owner);
    out.records
        .reserve_exact(read.iter().map(|f| f.records.len()).sum());
    // Files read so far by length and ends: a copy is then compared whole.
    let mut by_shape: std::collections::HashMap<FileShape, usize> = Default::default();
    for (index, (path, got)) in files.iter().zip(read).enumerate() {
        let mut skip = got.skip;
        skip.file = path.clone();
        if let Some(shape) = got.shape {
            let mut records = got.records;
            let copy = by_shape.get(&shape).is_some_and(|&e| {
                let read = |p: &Path| {
                    crate::util::files::read_owned(p, crate::util::files::JOURNAL_CAP, owner)
                };
                matches!((read(&files[e]), read(path)), (Ok(a), Ok(b)) if a == b)
            });
            if copy && !records.is_empty() {
                skip.duplicates = records.len();
                records.clear();
            } else {
                by_shape.entry(shape).or_insert(index);
            }
            if records.iter().any(|r| r.ts > latest) {
                let before = records.len();
                records.retain(|r| r.ts <= latest);
                skip.future = before - records.len();
            }
            out.records.append(&mut records);
        }
        out.bad_lines += skip.lines;
        if skip.lines > 0
            || skip.error.is_some()
            || skip.records == 0
            || skip.duplicates > 0
            || skip.future > 0
        {
            out.skipped.push(skip);
        }
    }
    out.records = by_time(out.records);
    out.files = files;
    Ok(out)
}

/// `records` ordered by time, stable for equal times: their times sorted
/// with their places, then the records moved into place in the list they
/// are in, each cycle of places followed once (a sort of a million records
/// moved each of them twenty times).
fn by_time(mut records: Vec<Record>) -> Vec<Record> {
    if records.is_sorted_by_key(|r| r.ts) {
        return records;
    }
    let mut order: Vec<(chrono::DateTime<chrono::Utc>, usize)> =
        records.iter().enumerate().map(|(i, r)| (r.ts, i)).collect();
    order.sort_unstable();
    // Place i takes the record now at from[i].
    let mut from: Vec<usize> = order.into_iter().map(|(_, i)| i).collect();
    for start in 0..from.len() {
        let mut at = start;
        while from[at] != start && from[at] != at {
            let next = from[at];
            records.swap(at, next);
            from[at] = at;
            at = next;
        }
        from[at] = at;
    }
    records
}

/// One journal file as read: its records (their events parsed), what was
/// skipped (`file` left empty), and its shape (`None`: not read).
#[derive(Default)]
struct FileRead {
    records: Vec<Record>,
    skip: SkippedLines,
    shape: Option<FileShape>,
}

/// Read and parse `files`, in their order, on up to as many threads as the
/// machine has cores (a job of 131,072 ranks has as many files).
fn read_all(files: &[PathBuf], owner: u32) -> Vec<FileRead> {
    let one = |path: &PathBuf| {
        let mut got = FileRead::default();
        // Not followed, not waited on, not read past its cap: a shared
        // state dir's journals are anyone's to plant (a FIFO would hang the
        // reader, `/dev/zero` behind a name would fill its memory).
        match crate::util::files::read_owned(path, crate::util::files::JOURNAL_CAP, owner) {
            Ok(text) => {
                let text = std::sync::Arc::new(text);
                read_lines(&text, &mut got.records, &mut got.skip);
                for r in &got.records {
                    r.event();
                }
                got.shape = Some(FileShape::of(&text));
            }
            Err(e) => got.skip.error = Some(e.to_string()),
        }
        got
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
        .min(files.len().div_ceil(64));
    if threads <= 1 {
        return files.iter().map(one).collect();
    }
    let mut out: Vec<FileRead> = Vec::with_capacity(files.len());
    std::thread::scope(|s| {
        let chunk = files.len().div_ceil(threads);
        let parts: Vec<_> = files
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().map(one).collect::<Vec<_>>()))
            .collect();
        for p in parts {
            // A thread that panicked read nothing: its files read here.
            match p.join() {
                Ok(mut got) => out.append(&mut got),
                Err(_) => out.extend(files[out.len()..].iter().take(chunk).map(one)),
            }
        }
    });
    out
}

/// A journal file name as resilio writes them: `rank-N`, `stepS-rank-N`,
/// `batch`, `coordinator`, `decider`, `launcher` (`.jsonl`).
pub(super) fn is_own_name(path: &Path) -> bool {
    let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let rank = |s: &str| s.strip_prefix("rank-").is_some_and(digits);
    matches!(stem, "batch" | "coordinator" | "decider" | "launcher")
        || rank(stem)
        || stem
            .strip_prefix("step")
            .and_then(|s| s.split_once('-'))
            .is_some_and(|(n, r)| digits(n) && rank(r))
}

/// A journal file's length and a digest of its first and last bytes
/// (FNV-1a): files of one shape are compared whole to find a copy.
#[derive(PartialEq, Eq, Hash)]
struct FileShape(usize, u64);

impl FileShape {
    fn of(text: &[u8]) -> FileShape {
        let n = text.len().min(64);
        let digest = text[..n]
            .iter()
            .chain(&text[text.len() - n..])
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        FileShape(text.len(), digest)
    }
}

/// Parse the text of one journal file as [`read_job`] does each file: its
/// whole records, in file order, and what was skipped (`file` left empty).
/// For tests and fuzzing; never fails, whatever the bytes.
pub fn parse_file(text: &[u8]) -> (Vec<Record>, SkippedLines) {
    let mut records = Vec::new();
    let mut skip = SkippedLines::default();
    read_lines(&std::sync::Arc::new(text.to_vec()), &mut records, &mut skip);
    (records, skip)
}

/// Parse one file's lines into `records`, noting what was skipped.
fn read_lines(text: &std::sync::Arc<Vec<u8>>, records: &mut Vec<Record>, skip: &mut SkippedLines) {
    let ends_whole = text.last().is_none_or(|&b| b == b'\n');
    // Each line's span in the file: its records share the file's text.
    let mut spans = Vec::with_capacity(text.iter().filter(|&&b| b == b'\n').count() + 1);
    let mut from = 0;
    for (i, &b) in text.iter().enumerate() {
        if b == b'\n' {
            spans.push(from..i);
            from = i + 1;
        }
    }
    spans.push(from..text.len());
    // Room for every line at once (grown record by record, the lists of
    // 131,072 files were copied three times each).
    records.reserve(spans.len());
    let last = spans.len().saturating_sub(1);
    for (i, span) in spans.into_iter().enumerate() {
        let line = &text[span.clone()];
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match Record::from_line_of(text, span) {
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
        // A directory, not a symlink to one.
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
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

    /// The same order as a stable sort by time, ties in list order, for
    /// lists in every order (cycles long and short, fixed places, sorted).
    #[test]
    fn records_by_time_are_as_a_stable_sort_leaves_them() {
        let base: chrono::DateTime<chrono::Utc> = "2026-11-29T06:00:00Z".parse().unwrap();
        let mut seed = 7u64;
        for n in [0usize, 1, 2, 3, 10, 257, 1000] {
            for spread in [1i64, 3, 1000] {
                let records: Vec<Record> = (0..n)
                    .map(|i| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        Record {
                            ts: base + chrono::Duration::seconds((seed >> 33) as i64 % spread),
                            attempt: i as u32,
                            ..Default::default()
                        }
                    })
                    .collect();
                let mut want = records.clone();
                want.sort_by_key(|r| r.ts);
                let got = by_time(records);
                let key = |v: &[Record]| v.iter().map(|r| (r.ts, r.attempt)).collect::<Vec<_>>();
                assert_eq!(key(&got), key(&want), "{n} records over {spread} s");
            }
        }
    }
}
