//! Reading a file someone else may have planted: a journal in a shared
//! state dir, a job's `coordinator.json`. The last component is opened
//! without following a symlink and without blocking (a FIFO), checked to be
//! a regular file, and read up to a cap (`/dev/zero` behind a name, a file
//! that keeps growing): never a hang, never unbounded memory.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// A journal file is read whole up to this (a long run's largest rank file
/// stays far below).
pub const JOURNAL_CAP: u64 = 1 << 30;

/// No journal record comes near this (a probe's stacks included): a file
/// with a longer line is not a journal.
pub const LINE_CAP: u64 = 8 << 20;

/// A small control or discovery file (`coordinator.json`, a token).
pub const SMALL_CAP: u64 = 1 << 20;

/// The bytes of the regular file at `path`, at most `cap` of them; an error
/// (with a plain reason) for a symlink, a FIFO, a device, a directory, or a
/// file larger than `cap`.
pub fn read_regular(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    read_checked(path, cap, None)
}

/// [`read_regular`], and the file must be owned by `uid` or root (checked
/// on the open file): a file another user put in a directory of `uid`'s
/// (one left writable) is not theirs to speak for.
pub fn read_owned(path: &Path, cap: u64, uid: u32) -> std::io::Result<Vec<u8>> {
    read_checked(path, cap, Some(uid))
}

/// [`read_owned`] of a file in a job's directory: owned by the directory's
/// owner (or root), the only ones who should write there.
pub fn read_in_dir(dir: &Path, name: &str, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::symlink_metadata(dir)?.uid();
    read_owned(&dir.join(name), cap, owner)
}

fn read_checked(path: &Path, cap: u64, owner: Option<u32>) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                refused("a symbolic link, not followed")
            } else {
                e
            }
        })?;
    let meta = f.metadata()?;
    let ft = meta.file_type();
    if !ft.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(refused(&format!("{what}, not read")));
    }
    if let Some(uid) = owner.filter(|&u| meta.uid() != u && meta.uid() != 0) {
        return Err(refused(&format!(
            "owned by uid {}, not by uid {uid} whose directory it is in; not read",
            meta.uid()
        )));
    }
    if meta.len() > cap {
        return Err(refused(&format!(
            "{} bytes, more than the {cap} read",
            meta.len()
        )));
    }
    let mut out = Vec::with_capacity(meta.len().min(1 << 26) as usize);
    if owner.is_some() {
        // A journal: read in chunks, and given up at a line longer than
        // any record (a sparse file of a gigabyte of zeros costs its
        // planter no disk, and cost root's `resilio nodes` 3.4 s each).
        let mut since_newline = 0u64;
        loop {
            let start = out.len();
            let n = (&mut f).take(1 << 20).read_to_end(&mut out)?;
            if n == 0 {
                break;
            }
            since_newline = match out[start..].iter().rposition(|&b| b == b'\n') {
                Some(i) => (n - 1 - i) as u64,
                None => since_newline + n as u64,
            };
            if since_newline > LINE_CAP {
                return Err(refused(&format!(
                    "a line of more than {LINE_CAP} bytes: not a journal, not read further"
                )));
            }
            if out.len() as u64 > cap {
                break;
            }
        }
    } else {
        f.take(cap + 1).read_to_end(&mut out)?;
    }
    if out.len() as u64 > cap {
        return Err(refused(&format!("grew past the {cap} bytes read")));
    }
    Ok(out)
}

fn refused(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_within_its_cap_is_read() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("rank-0.jsonl");
        std::fs::write(&file, b"{}\n").unwrap();
        assert_eq!(read_regular(&file, 10).unwrap(), b"{}\n");
        // Too large.
        let e = read_regular(&file, 2).unwrap_err().to_string();
        assert!(e.contains("more than the 2"), "{e}");
        // A symlink, even to a good file.
        let link = d.path().join("link.jsonl");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = read_regular(&link, 10).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        // A FIFO nobody writes to: refused at once, not waited on.
        let fifo = d.path().join("fifo.jsonl");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_regular(&fifo, 10).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        // A device.
        let e = read_regular(Path::new("/dev/zero"), 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("device"), "{e}");
        // A directory.
        let e = read_regular(d.path(), 10).unwrap_err().to_string();
        assert!(e.contains("directory"), "{e}");
    }

    #[test]
    fn a_file_speaks_for_its_owner_or_root_only() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("rank-0.jsonl");
        std::fs::write(&file, b"{}\n").unwrap();
        let me = nix::unistd::geteuid().as_raw();
        assert!(read_owned(&file, 10, me).is_ok());
        if me != 0 {
            // Someone else's file is refused; root's would be read.
            let e = read_owned(&file, 10, me + 1).unwrap_err().to_string();
            assert!(e.contains(&format!("owned by uid {me}")), "{e}");
            return;
        }
        // A sparse gigabyte of zeros is given up after its first line cap.
        let sparse = d.path().join("sparse.jsonl");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        let e = read_owned(&sparse, JOURNAL_CAP, me)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a journal"), "{e}");
        // Root's file speaks for anyone (the plugin writes as root).
        assert!(read_owned(&file, 10, 4242).is_ok());
        std::os::unix::fs::chown(&file, Some(4343), None).unwrap();
        assert!(read_owned(&file, 10, 4343).is_ok());
        // In a job's directory: the directory's owner's (or root's) only.
        assert!(read_in_dir(d.path(), "rank-0.jsonl", 10).is_err());
        std::os::unix::fs::chown(d.path(), Some(4343), None).unwrap();
        assert!(read_in_dir(d.path(), "rank-0.jsonl", 10).is_ok());
        std::os::unix::fs::chown(d.path(), Some(0), None).unwrap();
        let e = read_owned(&file, 10, 4242).unwrap_err().to_string();
        assert!(e.contains("owned by uid 4343, not by uid 4242"), "{e}");
    }
}
