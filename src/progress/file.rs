//! A progress file the trainer rewrites (Megatron's
//! `latest_checkpointed_iteration.txt`, or any file holding the step).
//!
//! Content that is a bare integer is the step; otherwise the progress regex
//! is applied and its last match is the step; content that changed but names
//! no step still counts as progress. The content found at start-up is the
//! baseline, not progress (it may be a previous run's).
//!
//! inotify (through notify) watches the file's directory, so files replaced
//! by rename are seen. Network filesystems do not deliver inotify events for
//! writes made on other nodes, so on NFS, Lustre, GPFS, BeeGFS, CIFS, Ceph,
//! FUSE and the like (`file_poll = "auto"`), or when asked (`"always"`), the
//! file is polled with `stat` instead.

use super::output::Parser;
use super::patterns::PollMode;
use super::{Kind, ProgressEvent, Sender, Source};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Keeps the watch alive; dropping it stops watching.
pub enum WatchHandle {
    /// inotify through notify.
    Inotify(Box<notify::RecommendedWatcher>),
    /// A polling thread, stopped by the flag.
    Poll(Arc<AtomicBool>),
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        if let WatchHandle::Poll(stop) = self {
            stop.store(true, Ordering::Relaxed);
        }
    }
}

/// How the file will be watched, and why (for the journal).
pub fn effective_mode(path: &Path, mode: PollMode) -> (bool, String) {
    match mode {
        PollMode::Always => (true, "polling (configured)".into()),
        PollMode::Never => (false, "inotify (configured)".into()),
        PollMode::Auto => match network_fs(dir_of(path)) {
            Some(name) => (true, format!("polling ({name} filesystem)")),
            None => (false, "inotify".into()),
        },
    }
}

fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The name of the network filesystem `dir` is on, if it is on one.
pub fn network_fs(dir: &Path) -> Option<&'static str> {
    let st = nix::sys::statfs::statfs(dir).ok()?;
    let magic = st.filesystem_type().0 as i64 & 0xffff_ffff;
    Some(match magic {
        0x6969 => "nfs",
        0x517B => "smb",
        0xFF53_4D42 => "cifs",
        0xFE53_4D42 => "smb2",
        0x0BD0_0BD0 => "lustre",
        0x4750_4653 => "gpfs",
        0x00C3_6400 => "ceph",
        0x6573_5546 => "fuse",
        0x0102_1997 => "9p",
        0x5346_414F => "afs",
        0x1983_0326 => "beegfs",
        0xAAD7_AAEA => "panfs",
        0x0116_1970 => "gfs2",
        0x7461_636F => "ocfs2",
        _ => return None,
    })
}

/// Turns file content into progress, remembering the last content.
struct Reader {
    path: PathBuf,
    parser: Parser,
    last: Option<Vec<u8>>,
}

impl Reader {
    fn new(path: PathBuf, parser: Parser) -> Self {
        let last = std::fs::read(&path).ok();
        Reader { path, parser, last }
    }

    /// Read the file; an event if its content changed.
    fn poll(&mut self) -> Option<Kind> {
        let content = std::fs::read(&self.path).ok()?;
        if content.is_empty() || self.last.as_deref() == Some(&content[..]) {
            // An empty file is a writer mid-truncate: wait for the content.
            return None;
        }
        self.last = Some(content.clone());
        let text = String::from_utf8_lossy(&content);
        let step = text
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|s| *s <= super::MAX_STEP)
            .or_else(|| self.parser.step_in(&content));
        Some(Kind::Step {
            step,
            metrics: Vec::new(),
            with_phase: None,
        })
    }
}

fn send(tx: &Sender, kind: Kind) -> bool {
    tx.send(ProgressEvent {
        at: Instant::now(),
        source: Source::File,
        kind,
    })
}

/// Start watching `path`; progress goes to `tx`.
pub fn watch(
    path: &Path,
    mode: PollMode,
    interval: Duration,
    parser: Parser,
    tx: Sender,
) -> std::io::Result<WatchHandle> {
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let (poll, _) = effective_mode(&path, mode);
    if !poll {
        let reader = Reader::new(path.clone(), parser.clone());
        match watch_inotify(&path, reader, tx.clone()) {
            Ok(w) => return Ok(WatchHandle::Inotify(Box::new(w))),
            Err(e) if mode == PollMode::Never => return Err(e),
            // e.g. the directory does not exist yet: poll until it does.
            Err(_) => {}
        }
    }
    watch_poll(Reader::new(path, parser), interval, tx)
}

fn watch_inotify(
    path: &Path,
    reader: Reader,
    tx: Sender,
) -> std::io::Result<notify::RecommendedWatcher> {
    use notify::{RecursiveMode, Watcher};
    let name = path.file_name().map(|n| n.to_os_string());
    let reader = Mutex::new(reader);
    let handler = move |res: notify::Result<notify::Event>| {
        let Ok(event) = res else { return };
        if event.kind.is_access() {
            return;
        }
        let ours = event
            .paths
            .iter()
            .any(|p| p.file_name().map(|n| n.to_os_string()) == name);
        if !ours {
            return;
        }
        if let Ok(mut r) = reader.lock() {
            if let Some(kind) = r.poll() {
                send(&tx, kind);
            }
        }
    };
    let mut watcher = notify::recommended_watcher(handler).map_err(std::io::Error::other)?;
    watcher
        .watch(dir_of(path), RecursiveMode::NonRecursive)
        .map_err(std::io::Error::other)?;
    Ok(watcher)
}

fn watch_poll(mut reader: Reader, interval: Duration, tx: Sender) -> std::io::Result<WatchHandle> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::Builder::new()
        .name("progress-file-poll".into())
        .spawn(move || {
            use std::os::unix::fs::MetadataExt;
            let stamp = |p: &Path| {
                std::fs::metadata(p)
                    .ok()
                    .map(|m| (m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
            };
            let mut last = stamp(&reader.path);
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(interval);
                let now = stamp(&reader.path);
                if now != last {
                    last = now;
                    if let Some(kind) = reader.poll() {
                        if !send(&tx, kind) {
                            return;
                        }
                    }
                }
            }
        })?;
    Ok(WatchHandle::Poll(stop))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_tmp_is_not_a_network_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(network_fs(dir.path()), None);
        assert!(!effective_mode(&dir.path().join("f"), PollMode::Auto).0);
        assert!(effective_mode(&dir.path().join("f"), PollMode::Always).0);
    }

    #[test]
    fn reader_reports_changes_only() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("latest_checkpointed_iteration.txt");
        std::fs::write(&f, "100\n").unwrap();
        let cfg = crate::config::Config::default();
        let mut r = Reader::new(f.clone(), Parser::new(cfg.progress.regex, None, None));
        assert_eq!(r.poll(), None, "start-up content is the baseline");
        std::fs::write(&f, "200\n").unwrap();
        assert_eq!(
            r.poll(),
            Some(Kind::Step {
                step: Some(200),
                metrics: vec![],
                with_phase: None,
            })
        );
        assert_eq!(r.poll(), None);
        std::fs::write(&f, "{\"global_step\": 300}").unwrap();
        assert_eq!(
            r.poll(),
            Some(Kind::Step {
                step: Some(300),
                metrics: vec![],
                with_phase: None,
            })
        );
        std::fs::write(&f, "alive at 12:00").unwrap();
        assert_eq!(
            r.poll(),
            Some(Kind::Step {
                step: None,
                metrics: vec![],
                with_phase: None,
            })
        );
    }
}
