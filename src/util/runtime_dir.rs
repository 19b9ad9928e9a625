//! The private runtime directory holding the agents' progress sockets (and
//! their control files), checked before use, and the sockets that agents
//! killed with -9 left in it.
//!
//! The directory is `$XDG_RUNTIME_DIR/resilio`, else `$TMPDIR/resilio-UID`
//! (`/tmp/resilio-UID`: the usual case in Slurm jobs, where
//! `XDG_RUNTIME_DIR` is not set). Under a world-writable `/tmp` another user
//! can make that directory first. So it is checked with `lstat` (no symlink
//! followed): it must be a directory owned by this user; one of ours that is
//! too open is made 0700 again. One that is not ours (another owner, a
//! symlink, a file) is not used: a fresh directory is made instead with
//! `mkdtemp` (`resilio-UID-XXXXXX`, 0700, a name nobody can take in
//! advance), and resilio says so once. Such directories left empty are
//! removed by later agents of the same user.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Empty fallback directories older than this are removed (younger ones may
/// belong to an agent that has not bound its socket yet).
const FALLBACK_KEPT_FOR: Duration = Duration::from_secs(60);

/// How many entries of the directory are looked at for stale sockets.
const SCAN_AT_MOST: usize = 10_000;

/// Where the runtime directory is wanted, and the base it is made under.
fn wanted() -> (PathBuf, PathBuf, String) {
    let uid = nix::unistd::geteuid();
    let name = format!("resilio-{uid}");
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        return (d.join("resilio"), d, name);
    }
    let base = std::env::var_os("TMPDIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    (base.join(&name), base, name)
}

/// The usual runtime directory (unchecked: see [`private_dir`]).
pub fn usual_dir() -> PathBuf {
    wanted().0
}

/// Why a directory cannot be used as ours.
fn not_ours(dir: &Path) -> std::io::Result<Option<String>> {
    let meta = std::fs::symlink_metadata(dir)?;
    let uid = nix::unistd::geteuid().as_raw();
    let owner = meta.uid();
    if meta.file_type().is_symlink() {
        return Ok(Some(format!("it is a symlink, owner uid {owner}")));
    }
    if !meta.is_dir() {
        return Ok(Some(format!("it is not a directory, owner uid {owner}")));
    }
    if owner != uid {
        return Ok(Some(format!("it is another user's, owner uid {owner}")));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        // Ours but open: close it (only we, and root, may chmod it).
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(None)
}

/// Make (0700) or check `dir`: `Ok(None)` when it is ours and private
/// (one of ours that is too open is closed), else why it cannot be ours.
pub fn claim(dir: &Path) -> std::io::Result<Option<String>> {
    if let Some(parent) = dir.parent() {
        if !parent.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    not_ours(dir)
}

/// The runtime directory, private to this user: the usual one, or when it
/// was taken by someone else a fresh one beside it. An error only when no
/// directory could be made at all.
pub fn private_dir() -> std::io::Result<PathBuf> {
    let (dir, base, name) = wanted();
    let why = match claim(&dir) {
        Ok(None) => return Ok(dir),
        Ok(Some(why)) => why,
        Err(e) => e.to_string(),
    };
    let fresh = fallback(&base, &name)?;
    tracing::warn!(
        "the runtime directory {} is not used ({why}: someone may have made it to catch resilio's sockets); using {} instead",
        dir.display(),
        fresh.display()
    );
    Ok(fresh)
}

/// A new directory `base/NAME-XXXXXX`, made 0700 by `mkdtemp`.
fn fallback(base: &Path, name: &str) -> std::io::Result<PathBuf> {
    let template = base.join(format!("{name}-XXXXXX"));
    let made = nix::unistd::mkdtemp(&template).map_err(std::io::Error::from)?;
    // mkdtemp makes it 0700 and ours; checked all the same.
    match not_ours(&made)? {
        None => Ok(made),
        Some(why) => Err(std::io::Error::other(format!("{}: {why}", made.display()))),
    }
}

/// The agent's pid written in a socket's or control file's name
/// (`JOB.RANK.PID.sock`, `PID.sock`, `JOB.RANK.PID.ctl`), with the name
/// without its extension.
fn pid_of(name: &str) -> Option<(i32, &str)> {
    let stem = name
        .strip_suffix(".sock")
        .or_else(|| name.strip_suffix(".ctl"))
        .or_else(|| name.strip_suffix(".ctl.tmp"))?;
    let pid = stem.rsplit('.').next()?;
    let pid: i32 = pid.parse().ok().filter(|p| *p > 0)?;
    Some((pid, stem))
}

fn alive(pid: i32) -> bool {
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Whether some process still receives on the socket at `path`.
fn bound(path: &Path) -> bool {
    let Ok(s) = std::os::unix::net::UnixDatagram::unbound() else {
        return true;
    };
    match s.connect(path) {
        Ok(()) => true,
        Err(e) => e.kind() != std::io::ErrorKind::ConnectionRefused,
    }
}

/// Remove what agents of this user killed with -9 left in `dir`: sockets
/// whose agent (the pid in the name) is gone and that nobody receives on,
/// and their control files. Live agents' files are never touched. Also
/// removes this user's empty fallback directories beside the usual one.
/// Returns how many files were removed.
pub fn remove_stale(dir: &Path) -> usize {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut gone = std::collections::BTreeSet::new();
    let mut files: Vec<(String, i32, String)> = Vec::new();
    for e in entries.flatten().take(SCAN_AT_MOST) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((pid, stem)) = pid_of(&name) else {
            continue;
        };
        files.push((name.clone(), pid, stem.to_string()));
    }
    for (name, pid, stem) in &files {
        if name.ends_with(".sock") && *pid != me && !alive(*pid) && !bound(&dir.join(name)) {
            gone.insert(stem.clone());
        }
    }
    let mut removed = 0;
    for (name, pid, stem) in &files {
        let stale = gone.contains(stem)
            // A control file without its socket, of an agent that is gone.
            || (!name.ends_with(".sock")
                && *pid != me
                && !alive(*pid)
                && !files.iter().any(|(n, _, s)| s == stem && n.ends_with(".sock")));
        if stale && std::fs::remove_file(dir.join(name)).is_ok() {
            removed += 1;
        }
    }
    remove_empty_fallbacks();
    removed
}

/// This user's fallback directories (`NAME-XXXXXX` beside the usual one)
/// that are empty and not new.
fn remove_empty_fallbacks() {
    let (_, base, name) = wanted();
    let Ok(entries) = std::fs::read_dir(&base) else {
        return;
    };
    let uid = nix::unistd::geteuid().as_raw();
    let prefix = format!("{name}-");
    for e in entries.flatten().take(SCAN_AT_MOST) {
        let n = e.file_name();
        let Some(rest) = n.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        if rest.len() != 6 {
            continue;
        }
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= FALLBACK_KEPT_FOR);
        if meta.is_dir() && meta.uid() == uid && old {
            remove_stale_in(&path);
            // Fails unless empty: a live agent's socket keeps it.
            let _ = std::fs::remove_dir(&path);
        }
    }
}

/// [`remove_stale`] for one fallback directory (not recursing further).
fn remove_stale_in(dir: &Path) {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten().take(SCAN_AT_MOST) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((pid, _)) = pid_of(&name) else {
            continue;
        };
        let path = e.path();
        let stale = pid != me && !alive(pid) && (!name.ends_with(".sock") || !bound(&path));
        if stale {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_are_read_from_socket_names() {
        assert_eq!(pid_of("j.0.123.sock"), Some((123, "j.0.123")));
        assert_eq!(pid_of("123.sock"), Some((123, "123")));
        assert_eq!(pid_of("local-1.2.77.ctl"), Some((77, "local-1.2.77")));
        assert_eq!(pid_of("local-1.2.77.ctl.tmp"), Some((77, "local-1.2.77")));
        assert_eq!(pid_of("j.0.x.sock"), None);
        assert_eq!(pid_of("j.0.0.sock"), None);
        assert_eq!(pid_of("notes.txt"), None);
    }

    #[test]
    fn stale_sockets_go_and_live_ones_stay() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        // A pid that is gone: a child that was reaped.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let dead = c.id();
        c.wait().unwrap();
        let stale = dir.join(format!("j.0.{dead}.sock"));
        drop(std::os::unix::net::UnixDatagram::bind(&stale).unwrap());
        std::fs::write(dir.join(format!("j.0.{dead}.ctl")), "x").unwrap();
        // A live socket of a process that is gone (another pid namespace):
        // someone receives on it, kept.
        let held = dir.join(format!("k.0.{dead}.sock"));
        let _keep = std::os::unix::net::UnixDatagram::bind(&held).unwrap();
        // A live agent's (this process), and an unrelated file.
        let mine = dir.join(format!("j.1.{}.sock", std::process::id()));
        drop(std::os::unix::net::UnixDatagram::bind(&mine).unwrap());
        std::fs::write(dir.join("other.txt"), "x").unwrap();
        assert_eq!(remove_stale(dir), 2);
        let mut left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                format!("j.1.{}.sock", std::process::id()),
                format!("k.0.{dead}.sock"),
                "other.txt".to_string()
            ]
        );
    }
}
