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
    /// Set by [`DirWatch::finish`]: one more look, files taken as they are.
    last_look: Arc<AtomicBool>,
    /// Set by the watcher when it stopped.
    finished: Arc<AtomicBool>,
    wake: std::sync::mpsc::Sender<()>,
}

impl DirWatch {
    /// The trainer is gone: look once more now, the files as they are
    /// (nothing writes to them any more, so nothing to let settle), and
    /// wait until `deadline` for what is found to be sent. A trainer killed
    /// half a second after its marker (an OOM at the next step) still has
    /// its checkpoint seen (trial 16: lost, and its restarts taken for
    /// ones that brought nothing new).
    pub fn finish(&self, deadline: Instant) {
        self.last_look.store(true, Ordering::Relaxed);
        let _ = self.wake.send(());
        while !self.finished.load(Ordering::Relaxed) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
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
    /// The bulk of its bytes (its largest files, nine tenths of it),
    /// fingerprinted from their names, sizes and sampled contents
    /// ([`bulk_fingerprint`]); `None` when it holds no bytes.
    pub bulk: Option<u64>,
    /// The earlier checkpoint whose bulk is byte for byte this one's: a
    /// save reported as new that wrote nothing new (stale weights under a
    /// fresh marker). Not a checkpoint to count on as the last good one.
    pub same_as: Option<String>,
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

/// Files fingerprinted per checkpoint, at most (the largest).
pub const BULK_FILES: usize = 16;
/// Bytes read from each, at most: three samples (start, middle, end).
const SAMPLE: u64 = 64 * 1024;

/// A fingerprint of the bulk of a checkpoint: its largest files until nine
/// tenths of its bytes (at most [`BULK_FILES`]), each by its name within the
/// checkpoint, its size and three 64 KiB samples of its contents. A
/// training step changes nearly every byte of the weights and the
/// optimizer state, so two checkpoints of different steps differ here,
/// while a save that rewrote old state under a new name does not; the small
/// files (`trainer_state.json`, the step it names) are left out on purpose.
/// At most 3 MiB read, whatever the checkpoint's size.
pub fn bulk_fingerprint(root: &Path, look: &Look) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    use std::io::{Read, Seek, SeekFrom};
    let total: u64 = look.values().map(|(n, _)| n).sum();
    if total == 0 {
        return None;
    }
    let mut by_size: Vec<(&PathBuf, u64)> = look.iter().map(|(p, (n, _))| (p, *n)).collect();
    by_size.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut covered = 0u64;
    for (path, size) in by_size.into_iter().take(BULK_FILES) {
        if covered * 10 >= total * 9 {
            break;
        }
        covered += size;
        path.strip_prefix(root).unwrap_or(path).hash(&mut h);
        size.hash(&mut h);
        let Ok(mut f) = std::fs::File::open(path) else {
            continue;
        };
        let mut buf = vec![0u8; SAMPLE.min(size) as usize];
        for at in [
            0,
            size.saturating_sub(SAMPLE) / 2,
            size.saturating_sub(SAMPLE),
        ] {
            if f.seek(SeekFrom::Start(at)).is_ok() && f.read_exact(&mut buf).is_ok() {
                buf.hash(&mut h);
            }
        }
    }
    Some(h.finish())
}

/// Every file of a checkpoint: its size and modification time.
pub type Look = std::collections::BTreeMap<PathBuf, (u64, Option<std::time::SystemTime>)>;

/// A name a save leaves while it writes (or leaves behind when it dies).
fn is_temporary(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [".tmp", ".temp", ".partial", ".incomplete", ".lock", "~"]
        .iter()
        .any(|s| lower.ends_with(s))
        || lower.starts_with(".tmp")
        || lower.contains(".tmp.")
}

/// The checkpoint a matched path names, relative to the watched
/// directory: the deepest component that names its step
/// (`run1/checkpoint-500/trainer_state.json` is `run1/checkpoint-500`,
/// Lightning's `version_0/checkpoints/epoch=2-step=150.ckpt` is that file),
/// or without a step the first component.
fn checkpoint_of(matched: &str, step: Option<u64>) -> &str {
    let parts: Vec<&str> = matched.split('/').collect();
    let names_step = |c: &str| {
        step.is_some_and(|s| {
            c.split(|ch: char| !ch.is_ascii_digit())
                .any(|digits| !digits.is_empty() && digits.parse::<u64>().ok() == Some(s))
        })
    };
    let upto = parts.iter().rposition(|c| names_step(c)).unwrap_or(0);
    let len = parts[..=upto].iter().map(|c| c.len()).sum::<usize>() + upto;
    &matched[..len]
}

/// The files of the checkpoint `matched` names ([`checkpoint_of`]: the
/// directory `checkpoint-500/` for `checkpoint-500/trainer_state.json`, a
/// checkpoint file alone). Looked at twice, `settle` apart (once when
/// `settle` is zero): a file whose size or modification time moved in
/// between was still being written.
pub fn inspect(dir: &Path, matched: &str, step: Option<u64>, settle: Duration) -> Files {
    let top = checkpoint_of(matched, step);
    let root = dir.join(top);
    let (mut f, mut files) = look(&root);
    if !settle.is_zero() {
        let first = files;
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
        files = second;
    }
    f.path = top.to_string();
    f.step = step;
    f.bulk = bulk_fingerprint(&root, &files);
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
    let last_look = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let (last_look_seen, finished_set) = (last_look.clone(), finished.clone());
    let wake = wake_tx.clone();
    let at_start = scan(&dir, &re);
    // The newest checkpoint there already (what a restarted trainer loads):
    // a new one with the same bulk is stale.
    let mut last: Option<(String, u64)> = at_start
        .iter()
        .filter(|(_, s)| s.is_some())
        .max_by_key(|(_, s)| *s)
        .and_then(|(p, s)| {
            let f = inspect(&dir, p, *s, Duration::ZERO);
            Some((f.path, f.bulk?))
        });
    let mut seen: HashSet<String> = at_start.into_iter().map(|(p, _)| p).collect();
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
                let final_look = last_look_seen.load(Ordering::Relaxed);
                let settle = if final_look { Duration::ZERO } else { SETTLE };
                let mut found = scan(&dir, &re);
                found.sort_by_key(|(_, s)| *s);
                for (path, step) in found {
                    if seen.insert(path.clone()) {
                        // Found now; judged whole after it settled.
                        let at = Instant::now();
                        let mut files = inspect(&dir, &path, step, settle);
                        if let Some(bulk) = files.bulk {
                            if let Some((earlier, _)) = last
                                .as_ref()
                                .filter(|(p, b)| *b == bulk && *p != files.path)
                            {
                                files.same_as = Some(earlier.clone());
                            } else {
                                last = Some((files.path.clone(), bulk));
                            }
                        }
                        tx.send(ProgressEvent {
                            at,
                            source: Source::CheckpointDir,
                            kind: Kind::CheckpointFiles(files),
                        });
                        tx.send(ProgressEvent {
                            at,
                            source: Source::CheckpointDir,
                            kind: Kind::CheckpointDone { step },
                        });
                    }
                }
                if final_look {
                    break;
                }
            }
            finished_set.store(true, Ordering::Relaxed);
        })?;
    Ok(DirWatch {
        stop,
        last_look,
        finished,
        wake,
    })
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
    fn a_checkpoint_is_the_deepest_part_of_its_path_that_names_its_step() {
        for (matched, step, want) in [
            (
                "checkpoint-500/trainer_state.json",
                Some(500),
                "checkpoint-500",
            ),
            (
                "run1/checkpoint-500/COMPLETE",
                Some(500),
                "run1/checkpoint-500",
            ),
            ("iter_0000100/.metadata", Some(100), "iter_0000100"),
            (
                "version_0/checkpoints/epoch=2-step=150.ckpt",
                Some(150),
                "version_0/checkpoints/epoch=2-step=150.ckpt",
            ),
            (
                "ckpt/epoch=2-step=150-v1.ckpt",
                Some(150),
                "ckpt/epoch=2-step=150-v1.ckpt",
            ),
            // 1000 is not 100; no step: the first component.
            (
                "checkpoint-1000/done/COMPLETE",
                Some(100),
                "checkpoint-1000",
            ),
            ("latest/COMPLETE", None, "latest"),
            ("model.pt", None, "model.pt"),
        ] {
            assert_eq!(checkpoint_of(matched, step), want, "{matched}");
        }
    }

    /// A save reported as new whose weights are an earlier checkpoint's
    /// (stale state under a fresh marker and a fresh trainer_state.json)
    /// is found not new; a real next save is new.
    #[test]
    fn a_save_with_an_earlier_checkpoints_bytes_is_not_new() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let weights = |seed: u8| -> Vec<u8> {
            (0..300_000u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
                .collect()
        };
        let save = |step: u32, seed: u8| {
            let ck = dir.join(format!("checkpoint-{step}"));
            std::fs::create_dir_all(&ck).unwrap();
            std::fs::write(ck.join("model.safetensors"), weights(seed)).unwrap();
            std::fs::write(ck.join("optimizer.pt"), weights(seed ^ 0x55)).unwrap();
            std::fs::write(
                ck.join("trainer_state.json"),
                format!("{{\"global_step\": {step}}}"),
            )
            .unwrap();
        };
        save(100, 1);
        let tx = Sender::new();
        let re = Regex::new(r"^checkpoint-(\d+)/trainer_state\.json$").unwrap();
        let _w = watch(dir, re, Duration::from_millis(100), tx.clone()).unwrap();
        let files = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut got = Vec::new();
            while got.len() < n && Instant::now() < deadline {
                got.extend(tx.drain().into_iter().filter_map(|e| match e.kind {
                    Kind::CheckpointFiles(f) => Some(f),
                    _ => None,
                }));
                std::thread::sleep(Duration::from_millis(50));
            }
            got
        };
        // Stale: checkpoint-100's state again, under step 200.
        save(200, 1);
        let got = files(1);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].same_as.as_deref(), Some("checkpoint-100"), "{got:?}");
        assert!(got[0].complete());
        // New state: new; and the one after is compared with it.
        save(300, 2);
        let got = files(1);
        assert_eq!(got[0].same_as, None, "{got:?}");
        save(400, 2);
        let got = files(1);
        assert_eq!(got[0].same_as.as_deref(), Some("checkpoint-300"), "{got:?}");
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
