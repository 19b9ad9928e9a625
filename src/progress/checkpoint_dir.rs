//! Checkpoints the trainer makes on its own, seen in its checkpoint
//! directory: a path (relative to the directory, at most 3 levels deep)
//! matching `[checkpoint] watch_regex` marks a *complete* checkpoint, and
//! its first capture group is the step. The regex names the file written
//! last (a `COMPLETE` marker, `trainer_state.json`, torch DCP's `.metadata`)
//! or the final name after a rename, never the half-written directory.
//!
//! inotify (notify) wakes a rescan at once on a local filesystem; a rescan
//! every poll interval catches what inotify cannot see (network
//! filesystems, a directory created later). Paths present at start are
//! known, not news.

use super::{Kind, ProgressEvent, Sender, Source};
use regex::Regex;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keeps the watch alive; stops it when dropped.
pub struct DirWatch {
    stop: Arc<AtomicBool>,
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One checkpoint's files, looked at when it was found complete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Files {
    /// The checkpoint, relative to the watched directory (`checkpoint-500`).
    pub path: String,
    pub step: Option<u64>,
    pub bytes: u64,
    pub files: u64,
    /// Names a save in progress leaves (`*.tmp`, `*.partial`, ...), at most 5.
    pub temp_names: Vec<String>,
    /// Files whose size or modification time changed while it settled
    /// (written to after its marker said complete), at most 5.
    pub changing: Vec<String>,
    /// More than [`MAX_FILES`] entries: the counts stop there.
    pub truncated: bool,
}

/// Entries looked at per checkpoint, at most.
pub const MAX_FILES: u64 = 100_000;

/// How long a checkpoint found complete must keep its files unchanged to
/// be judged whole (its sizes and modification times looked at twice).
pub const SETTLE: Duration = Duration::from_millis(500);

impl Files {
    /// Whole: no temporary names left in it, and nothing written to it
    /// while it settled.
    pub fn complete(&self) -> bool {
        self.temp_names.is_empty() && self.changing.is_empty()
    }
}

/// Every file of a checkpoint: its size and modification time.
type Look = std::collections::BTreeMap<PathBuf, (u64, Option<std::time::SystemTime>)>;

/// A name a save leaves while it writes (or leaves behind when it dies).
fn is_temporary(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [".tmp", ".temp", ".partial", ".incomplete", ".lock", "~"]
        .iter()
        .any(|s| lower.ends_with(s))
        || lower.starts_with(".tmp")
        || lower.contains(".tmp.")
}

/// The files of the checkpoint `matched` names: the directory of its first
/// path component (`checkpoint-500/trainer_state.json` is in
/// `checkpoint-500/`), or the matched file alone at the top. Looked at
/// twice, `settle` apart (once when `settle` is zero): a file whose size
/// or modification time moved in between was still being written.
pub fn inspect(dir: &Path, matched: &str, step: Option<u64>, settle: Duration) -> Files {
    let top = matched.split('/').next().unwrap_or(matched);
    let root = dir.join(top);
    let (mut f, first) = look(&root);
    if !settle.is_zero() {
        std::thread::sleep(settle);
        let (again, second) = look(&root);
        f = again;
        let names = first
            .keys()
            .chain(second.keys())
            .collect::<std::collections::BTreeSet<_>>();
        f.changing = names
            .into_iter()
            .filter(|p| first.get(*p) != second.get(*p))
            .take(5)
            .map(|p| {
                p.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            })
            .collect();
    }
    f.path = top.to_string();
    f.step = step;
    f
}

fn look(root: &Path) -> (Files, Look) {
    let mut f = Files::default();
    let mut files = Look::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if f.files >= MAX_FILES {
            f.truncated = true;
            break;
        }
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if is_temporary(&name) && f.temp_names.len() < 5 {
            f.temp_names.push(name);
        }
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        } else {
            f.files += 1;
            f.bytes += meta.len();
            files.insert(p, (meta.len(), meta.modified().ok()));
        }
    }
    (f, files)
}

/// Matching paths under `dir` (relative, `/`-separated), with their steps.
pub fn scan(dir: &Path, re: &Regex) -> Vec<(String, Option<u64>)> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new(), 0usize)];
    while let Some((d, rel, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if let Some(c) = re.captures(&r) {
                let step = c
                    .iter()
                    .skip(1)
                    .flatten()
                    .next()
                    .and_then(|m| m.as_str().parse().ok());
                out.push((r.clone(), step));
            }
            if depth < 2 && e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), r, depth + 1));
            }
        }
    }
    out
}

pub fn watch(dir: &Path, re: Regex, poll: Duration, tx: Sender) -> std::io::Result<DirWatch> {
    let dir: PathBuf = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()?.join(dir)
    };
    let (wake_tx, wake_rx) = std::sync::mpsc::channel::<()>();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let mut seen: HashSet<String> = scan(&dir, &re).into_iter().map(|(p, _)| p).collect();
    // The directory, or while it does not exist yet its nearest existing
    // ancestor: its creation wakes a scan at once, and the watch moves to
    // it (trial 14: a directory the trainer made after the start was only
    // polled, and checkpoints saved between two polls of an attempt that
    // ended were never seen).
    let mut armed = arm(&dir, &wake_tx);
    std::thread::Builder::new()
        .name("checkpoint-dir".into())
        .spawn(move || {
            while !flag.load(Ordering::Relaxed) && !tx.is_closed() {
                match wake_rx.recv_timeout(poll) {
                    // Let a burst of events (a save writing many files) settle.
                    Ok(()) => {
                        std::thread::sleep(Duration::from_millis(50));
                        while wake_rx.try_recv().is_ok() {}
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(_) => std::thread::sleep(poll),
                }
                // Move the watch down when the directory (or a nearer
                // ancestor) appeared; a new watcher is a thread, so only then.
                if armed.as_ref().map(|(_, on)| on.as_path()) != watch_target(&dir) {
                    armed = arm(&dir, &wake_tx).or(armed);
                }
                let mut found = scan(&dir, &re);
                found.sort_by_key(|(_, s)| *s);
                for (path, step) in found {
                    if seen.insert(path.clone()) {
                        // Found now; judged whole after it settled.
                        let at = Instant::now();
                        tx.send(ProgressEvent {
                            at,
                            source: Source::CheckpointDir,
                            kind: Kind::CheckpointFiles(inspect(&dir, &path, step, SETTLE)),
                        });
                        tx.send(ProgressEvent {
                            at,
                            source: Source::CheckpointDir,
                            kind: Kind::CheckpointDone { step },
                        });
                    }
                }
            }
        })?;
    Ok(DirWatch { stop })
}

/// What to watch for `dir`: itself, or while it does not exist its
/// nearest existing ancestor.
fn watch_target(dir: &Path) -> Option<&Path> {
    dir.ancestors().find(|a| a.is_dir())
}

/// An inotify watch waking `wake` on any change under `dir` (recursive),
/// or, while `dir` does not exist, in its nearest existing ancestor (not
/// recursive: the creation of the next level is what matters); with the
/// path watched. `None` where nothing can be watched (polling still runs).
fn arm(
    dir: &Path,
    wake: &std::sync::mpsc::Sender<()>,
) -> Option<(notify::RecommendedWatcher, PathBuf)> {
    use notify::{RecursiveMode, Watcher};
    let target = watch_target(dir)?;
    let mode = if target == dir {
        RecursiveMode::Recursive
    } else {
        RecursiveMode::NonRecursive
    };
    let w = wake.clone();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok_and(|e| !e.kind.is_access()) {
            let _ = w.send(());
        }
    })
    .ok()?;
    watcher.watch(target, mode).ok()?;
    Some((watcher, target.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoints_size_and_leftover_temporary_names_are_found() {
        let d = tempfile::tempdir().unwrap();
        for (p, n) in [
            ("checkpoint-100/model.safetensors", 1000),
            ("checkpoint-100/optimizer/shard0.pt", 500),
            ("checkpoint-100/optimizer/shard1.pt.tmp", 7),
            ("checkpoint-100/trainer_state.json", 3),
            ("checkpoint-200/model.safetensors", 99),
        ] {
            let f = d.path().join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, vec![0u8; n]).unwrap();
        }
        let f = inspect(
            d.path(),
            "checkpoint-100/trainer_state.json",
            Some(100),
            Duration::ZERO,
        );
        assert_eq!(
            (f.path.as_str(), f.files, f.bytes),
            ("checkpoint-100", 4, 1510)
        );
        assert_eq!(f.temp_names, vec!["shard1.pt.tmp".to_string()]);
        assert!(!f.truncated && !f.complete());
    }

    #[test]
    fn a_file_still_written_after_the_marker_makes_the_checkpoint_incomplete() {
        let d = tempfile::tempdir().unwrap();
        let ck = d.path().join("checkpoint-7");
        std::fs::create_dir_all(&ck).unwrap();
        std::fs::write(ck.join("model.pt"), b"whole").unwrap();
        std::fs::write(ck.join("shard.pt"), b"x").unwrap();
        std::fs::write(ck.join("COMPLETE"), b"").unwrap();
        let quiet = inspect(d.path(), "checkpoint-7/COMPLETE", Some(7), SETTLE);
        assert!(quiet.complete() && quiet.changing.is_empty(), "{quiet:?}");
        // A writer still appending to a shard (an asynchronous save that
        // wrote its marker too soon).
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (stop, shard) = (stop.clone(), ck.join("shard.pt"));
            std::thread::spawn(move || {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(shard)
                    .unwrap();
                while !stop.load(Ordering::Relaxed) {
                    f.write_all(&[0u8; 64]).unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let busy = inspect(d.path(), "checkpoint-7/COMPLETE", Some(7), SETTLE);
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert_eq!(busy.changing, vec!["shard.pt".to_string()], "{busy:?}");
        assert!(busy.temp_names.is_empty() && !busy.complete());
        assert_eq!((busy.path.as_str(), busy.files), ("checkpoint-7", 3));
    }

    /// A checkpoint directory the trainer makes after the start, two
    /// levels down: its checkpoints are seen at once (inotify on the
    /// nearest existing ancestor, then on the directory), not at the next
    /// poll, here an hour away (trial 14: missed when the attempt ended
    /// between two polls).
    #[test]
    fn a_directory_made_after_the_start_is_watched_as_soon_as_it_exists() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out/checkpoints");
        let tx = Sender::new();
        let re = Regex::new(r"^checkpoint-(\d+)/COMPLETE$").unwrap();
        let _w = watch(&dir, re, Duration::from_secs(3600), tx.clone()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        std::fs::create_dir(tmp.path().join("out")).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        std::fs::create_dir(&dir).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        std::fs::create_dir(dir.join("checkpoint-10")).unwrap();
        std::fs::write(dir.join("checkpoint-10/COMPLETE"), "").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            seen.extend(tx.drain().into_iter().filter_map(|e| match e.kind {
                Kind::CheckpointDone { step } => Some(step),
                _ => None,
            }));
            if !seen.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(seen, [Some(10)]);
    }

    #[test]
    fn only_complete_checkpoints_match_and_give_their_step() {
        let d = tempfile::tempdir().unwrap();
        let re = Regex::new(crate::progress::patterns::DEFAULT_CHECKPOINT_WATCH_REGEX).unwrap();
        for p in [
            "checkpoint-100/model.safetensors",
            "checkpoint-100/trainer_state.json",
            "step_200.tmp/.metadata",
            "global_step300/COMPLETE",
            "checkpoint-400/optimizer.pt",
            "version_0/checkpoints/epoch=2-step=150.ckpt",
            "ckpt/epoch=2-step=150-v1.ckpt",
            "ckpt/last.ckpt",
            "ckpt/.epoch=3-step=200.ckpt.tmp",
        ] {
            let f = d.path().join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, b"x").unwrap();
        }
        let mut got = scan(d.path(), &re);
        got.sort();
        assert_eq!(
            got,
            vec![
                ("checkpoint-100/trainer_state.json".to_string(), Some(100)),
                ("ckpt/epoch=2-step=150-v1.ckpt".to_string(), Some(150)),
                ("global_step300/COMPLETE".to_string(), Some(300)),
                (
                    "version_0/checkpoints/epoch=2-step=150.ckpt".to_string(),
                    Some(150)
                ),
            ]
        );
    }
}
