//! The pump: one thread per stream passes the trainer's output on at once
//! (tee and splice where resilio's own output is a pipe), copies it into
//! the tail, and hands complete lines to the scanner.

use super::figures::Figures;
use super::*;
use super::{Kind, ProgressEvent, Sender, Source};
use nix::errno::Errno;
use nix::fcntl::{fcntl, splice, tee, FcntlArg, SpliceFFlags};
use nix::poll::{poll, PollFd, PollFlags};
use nix::sys::stat::{fstat, SFlag};
use nix::unistd::{read, write};
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Write all of `bytes` to `fd`, waiting out EINTR and EAGAIN (a
/// non-blocking stdout inherited from a parent).
pub fn write_all_fd(fd: impl AsFd, mut bytes: &[u8]) -> std::io::Result<()> {
    let fd = fd.as_fd();
    while !bytes.is_empty() {
        match write(fd, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                wait_for(fd, PollFlags::POLLOUT, 1000);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Wait up to `ms` milliseconds for `events` on `fd`. True when it timed
/// out; false when the fd is ready, or the wait failed (EINTR, ...), which
/// callers treat as ready and find out by trying.
fn wait_for(fd: BorrowedFd<'_>, events: PollFlags, ms: u16) -> bool {
    matches!(poll(&mut [PollFd::new(fd, events)], ms), Ok(0))
}

fn is_fifo(fd: BorrowedFd<'_>) -> bool {
    fstat(fd).is_ok_and(|st| st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFIFO.bits())
}

/// Retry a call on EINTR.
fn retry<T>(mut f: impl FnMut() -> nix::Result<T>) -> nix::Result<T> {
    loop {
        match f() {
            Err(Errno::EINTR) => {}
            r => return r,
        }
    }
}

/// Grow a pipe's buffer to at least `size` bytes (never shrink it: on
/// 64 KiB-page kernels the default is already larger). Returns the size.
fn grow_pipe(fd: BorrowedFd<'_>, size: usize) -> usize {
    let now = fcntl(fd, FcntlArg::F_GETPIPE_SZ);
    if let Ok(now) = now {
        if now as usize >= size {
            return now as usize;
        }
    }
    match fcntl(fd, FcntlArg::F_SETPIPE_SZ(size as i32)) {
        Ok(got) => got as usize,
        Err(_) => now.unwrap_or(0).max(0) as usize,
    }
}

/// The fd the pump passes output on to, as the borrowed fd the calls above
/// take.
fn output_fd(fd: RawFd) -> BorrowedFd<'static> {
    // SAFETY: `spawn_pump` is given resilio's own stdout or stderr (fd 1 or
    // 2), which resilio never closes; std borrows them the same way for
    // `Stdout`/`Stderr`. No wrapper can check this for a raw fd number.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// Rounds smaller than this are written from the scan copy instead of
/// spliced: a spliced buffer takes a whole slot of the output pipe however
/// few bytes it holds, so a trainer printing a line at a time would fill a
/// lagging reader's pipe after 16 lines (and stop progress scanning), where
/// written lines share pages as before.
const SPLICE_MIN: usize = 16 * 1024;

/// The zero-copy pass-through used when both ends are pipes: `tee(2)`
/// duplicates what the trainer wrote into a private scan pipe (page
/// references, no copy), the scan pipe's copy is read for the parser and the
/// tail, and `splice(2)` moves the original on to our output. One copy
/// through user space instead of two (read, then write), which is what keeps
/// a heavy stream within reach of `cat`. Small rounds are written from the
/// scan copy (see [`SPLICE_MIN`]).
struct ZeroCopy {
    scan_r: std::os::fd::OwnedFd,
    scan_w: std::os::fd::OwnedFd,
}

impl ZeroCopy {
    /// Only between two pipes, with a scan pipe that holds a whole chunk.
    fn new(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> Option<ZeroCopy> {
        if !is_fifo(src) || !is_fifo(dst) {
            return None;
        }
        let (scan_r, scan_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok()?;
        (grow_pipe(scan_w.as_fd(), CHUNK) >= CHUNK).then_some(ZeroCopy { scan_r, scan_w })
    }

    /// One round: wait for output, hand its bytes to `scan`, pass them on.
    /// `Ok(true)` to go on; `Ok(false)` or an error hands the rest of the
    /// stream to the plain read/write loop, which also tells a real end of
    /// stream from an empty buffer (`tee` returns 0 for both) and drains
    /// once our output is gone. Nothing is lost or passed on twice either way:
    /// the trainer's pipe is only read after its bytes went out.
    fn round(
        &self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        buf: &mut [u8],
        out_ok: &mut bool,
        scan: &mut dyn FnMut(&[u8]),
    ) -> std::io::Result<bool> {
        let none = SpliceFFlags::empty();
        let n = retry(|| tee(src, &self.scan_w, buf.len(), none))?;
        if n == 0 {
            return Ok(false);
        }
        // Progress first: a slow reader of our output must not delay it.
        let mut got = 0;
        while got < n {
            let m = retry(|| read(&self.scan_r, &mut buf[got..n]))?;
            if m == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            got += m;
        }
        scan(&buf[..n]);
        if !*out_ok {
            return Ok(false);
        }
        let mut left = n;
        if n >= SPLICE_MIN {
            while left > 0 {
                match retry(|| splice(src, None, dst, None, left, none)) {
                    Ok(m) => left -= m,
                    // A non-blocking output inherited from a parent.
                    Err(Errno::EAGAIN) => {
                        wait_for(dst, PollFlags::POLLOUT, 1000);
                    }
                    // Refused (EINVAL, ENOSYS): the rest is written below.
                    Err(Errno::EINVAL | Errno::ENOSYS) => break,
                    Err(_) => {
                        *out_ok = false;
                        break;
                    }
                }
            }
        }
        if left > 0 {
            // Small rounds, or what splice would not take: written from the
            // scan copy, then taken out of the trainer's pipe.
            if *out_ok && write_all_fd(dst, &buf[n - left..n]).is_err() {
                *out_ok = false;
            }
            let mut dropped = 0;
            while dropped < left {
                let m = retry(|| read(src, &mut buf[..left - dropped]))?;
                if m == 0 {
                    return Ok(false);
                }
                dropped += m;
            }
        }
        Ok(*out_ok)
    }
}

/// How a pump writes what it reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Lines {
    /// As it comes, byte for byte (zero-copy where the kernel allows).
    #[default]
    Raw,
    /// Whole lines only (several ranks share one terminal), each after
    /// `label` when one is given (`--label`).
    Whole { label: Option<Vec<u8>> },
}

/// `bytes` with `label` before the start of each line; `at_start` says
/// whether the next byte starts a line, carried from one write to the next.
pub fn labelled(label: &[u8], bytes: &[u8], at_start: &mut bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 4 * label.len());
    for &b in bytes {
        if *at_start {
            out.extend_from_slice(label);
            *at_start = false;
        }
        out.push(b);
        if b == b'\n' {
            *at_start = true;
        }
    }
    out
}

/// Figures with owned names, as events carry metrics.
fn named(f: Figures) -> Vec<(String, f64)> {
    f.into_iter().map(|(n, v)| (n.to_string(), v)).collect()
}

/// The trainer's stderr, as passed through, ended inside a line (a tqdm
/// frame has no line end): resilio's own next line on stderr starts a new
/// one, so that it is not glued to the frame.
static STDERR_MID_LINE: AtomicBool = AtomicBool::new(false);

fn note_line_end(dst_fd: RawFd, bytes: &[u8]) {
    if dst_fd == 2 {
        if let Some(&last) = bytes.last() {
            STDERR_MID_LINE.store(last != b'\n', Ordering::Relaxed);
        }
    }
}

/// Whether resilio's stderr was left inside a line by the trainer's output;
/// taking it says a line end is being written.
pub fn take_stderr_mid_line() -> bool {
    STDERR_MID_LINE.swap(false, Ordering::Relaxed)
}

/// Start the pump thread for one stream: pass `pipe` through to `dst_fd`,
/// keep the tail, report marks on `tx`. The thread ends at end of stream.
/// `dst_fd` is resilio's own stdout or stderr (1 or 2), borrowed for as long
/// as the thread runs.
pub fn spawn_pump(
    pipe: std::fs::File,
    dst_fd: RawFd,
    source: Source,
    parser: Parser,
    tail: Arc<Tail>,
    tx: Sender,
    lines: Lines,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("pump-{}", source.name()))
        .spawn(move || pump(pipe, dst_fd, source, &parser, &tail, &tx, lines))
}

/// The pump thread's body: zero-copy while it can, then the plain loop.
fn pump(
    mut pipe: std::fs::File,
    dst_fd: RawFd,
    source: Source,
    parser: &Parser,
    tail: &Tail,
    tx: &Sender,
    lines: Lines,
) {
    // Failure just keeps the default size.
    let dst = output_fd(dst_fd);
    grow_pipe(pipe.as_fd(), PIPE_SIZE);
    let mut buf = vec![0u8; CHUNK];
    let mut scanner = LineScanner::default();
    let mut out_ok = true;
    let send = |marks: Vec<Mark>| send_marks(tx, source, marks);
    let mut first = first_output(tx, source);
    // Line-atomic mode (several ranks share one terminal, as in local
    // mode): write whole lines only, so that ranks' lines do not cut into
    // each other; a partial line waits at most 100 ms.
    let mut whole = match lines {
        Lines::Raw => None,
        Lines::Whole { label } => Some(WholeLines::new(dst_fd, label)),
    };
    if let Some(zc) = whole
        .is_none()
        .then(|| ZeroCopy::new(pipe.as_fd(), dst))
        .flatten()
    {
        let mut scan = |bytes: &[u8]| {
            let marks = scanner.feed(parser, bytes);
            first(bytes, &marks);
            if !marks.is_empty() {
                send(marks);
            }
            tail.push(bytes);
            note_line_end(dst_fd, bytes);
        };
        // Until the end of the stream, an error, or our output gone: then
        // the plain loop below takes over.
        while let Ok(true) = zc.round(pipe.as_fd(), dst, &mut buf, &mut out_ok, &mut scan) {}
    }
    loop {
        if let Some(w) = whole.as_mut() {
            if w.waiting() && wait_for(pipe.as_fd(), PollFlags::POLLIN, 100) {
                if !out_ok {
                    w.carry.clear();
                } else if w.flush().is_err() {
                    out_ok = false;
                }
                continue;
            }
        }
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let chunk = &buf[..n];
        // Progress first: a slow reader of resilio's own output (a stalled
        // filesystem, a paused terminal) must not delay it.
        let marks = scanner.feed(parser, chunk);
        first(chunk, &marks);
        if !marks.is_empty() {
            send(marks);
        }
        match whole.as_mut() {
            Some(w) if out_ok => {
                if w.push(chunk).is_err() {
                    out_ok = false;
                }
            }
            Some(_) => {}
            None => {
                if out_ok && write_all_fd(dst, chunk).is_err() {
                    // Our own output is gone; keep draining so the trainer
                    // never blocks.
                    out_ok = false;
                }
                // (Line-atomic mode notes what it writes.)
                note_line_end(dst_fd, chunk);
            }
        }
        tail.push(chunk);
    }
    if let Some(w) = whole.as_mut() {
        if out_ok {
            let _ = w.flush();
        }
    }
    let marks = scanner.finish(parser);
    if !marks.is_empty() {
        send(marks);
    }
}

/// The progress marks of one chunk as events; figures go with the step
/// they come with, else on their own.
/// Says [`Kind::FirstOutput`] at the stream's first bytes (the trainer's
/// start-up done, as its output shows; whether a step was in them), then
/// nothing.
fn first_output(tx: &Sender, source: Source) -> impl FnMut(&[u8], &[Mark]) + '_ {
    let mut fed = false;
    move |bytes: &[u8], marks: &[Mark]| {
        if !fed && !bytes.is_empty() {
            fed = true;
            let with_step = marks
                .iter()
                .any(|m| matches!(m, Mark::Step(_) | Mark::Bar { .. } | Mark::EpochBar { .. }));
            tx.send(ProgressEvent {
                at: Instant::now(),
                source,
                kind: Kind::FirstOutput { with_step },
            });
        }
    }
}

fn send_marks(tx: &Sender, source: Source, marks: Vec<Mark>) {
    let at = Instant::now();
    let mut figures: Option<Figures> = None;
    for mark in marks {
        let kind = match mark {
            Mark::Figures(Seen(f)) => {
                figures = Some(f);
                continue;
            }
            Mark::EpochBar {
                epoch,
                count,
                total,
            } => Kind::Step {
                step: Some(epoch.saturating_mul(total).saturating_add(count)),
                metrics: named(figures.take().unwrap_or_default()),
                with_phase: None,
            },
            Mark::Step(s) | Mark::Bar { count: s, .. } => Kind::Step {
                step: Some(s),
                metrics: named(figures.take().unwrap_or_default()),
                with_phase: None,
            },
            Mark::Activity(count) | Mark::Epoch(count) => Kind::Activity { count },
            Mark::Loaded(line) => Kind::CheckpointLoaded { line, step: None },
            Mark::CheckpointDone(step) => Kind::CheckpointDone { step: Some(step) },
            Mark::Phase(p) => Kind::Phase {
                name: p.to_string(),
                step: None,
            },
            Mark::SyncSave(step) => {
                tx.send(ProgressEvent {
                    at,
                    source,
                    kind: Kind::Phase {
                        name: "checkpoint".into(),
                        step: None,
                    },
                });
                Kind::SyncSave { step }
            }
        };
        tx.send(ProgressEvent { at, source, kind });
    }
    if let Some(f) = figures {
        tx.send(ProgressEvent {
            at,
            source,
            kind: Kind::Figures(named(f)),
        });
    }
}

/// Whole-line output: complete lines are written at once (labelled when
/// asked), a partial line is carried until its end, a full chunk, or 100 ms
/// without input.
struct WholeLines {
    dst_fd: RawFd,
    label: Option<Vec<u8>>,
    carry: Vec<u8>,
    at_start: bool,
}

impl WholeLines {
    fn new(dst_fd: RawFd, label: Option<Vec<u8>>) -> Self {
        WholeLines {
            dst_fd,
            label,
            carry: Vec::new(),
            at_start: true,
        }
    }

    /// A partial line is waiting to be written.
    fn waiting(&self) -> bool {
        !self.carry.is_empty()
    }

    /// Write what is carried, whole lines or not.
    fn flush(&mut self) -> std::io::Result<()> {
        if self.carry.is_empty() {
            return Ok(());
        }
        note_line_end(self.dst_fd, &self.carry);
        let dst = output_fd(self.dst_fd);
        let w = match &self.label {
            Some(l) => write_all_fd(dst, &labelled(l, &self.carry, &mut self.at_start)),
            None => write_all_fd(dst, &self.carry),
        };
        self.carry.clear();
        w
    }

    /// A chunk read: write up to its last line end, carry the rest.
    fn push(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        match chunk.iter().rposition(|&b| b == b'\n') {
            Some(i) => {
                self.carry.extend_from_slice(&chunk[..=i]);
                let w = self.flush();
                self.carry.extend_from_slice(&chunk[i + 1..]);
                w
            }
            None => {
                self.carry.extend_from_slice(chunk);
                if self.carry.len() >= CHUNK {
                    self.flush()
                } else {
                    Ok(())
                }
            }
        }
    }
}
