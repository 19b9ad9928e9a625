//! Running an external command with a timeout, for resilio's own helpers:
//! the site health check, `py-spy dump`, Slurm's commands.
//!
//! The command is an argument vector, never a shell string. It starts with
//! stdin from /dev/null in a process group of its own that dies with
//! resilio ([`own_group`]). Its stdout and stderr are read concurrently, one
//! thread each, so a command that fills one pipe while the other is read
//! cannot block; what goes past the cap is counted and dropped, but still
//! read. Its exit is awaited on a third thread with `waitid(WNOWAIT)`, which
//! leaves it unreaped: until it is reaped its pid, which is also its group's
//! id, cannot be taken by another process, so killing the group at the
//! deadline reaches the command's own processes and nothing else.

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::{killpg, raise, signal, SigHandler, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::{getpid, getppid, tcsetpgrp, Pid};
use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::BorrowedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How much of each stream [`run`] keeps unless told otherwise: 1 MiB.
pub const MAX_OUTPUT: usize = 1 << 20;

/// How long the pipes are still waited for once the command is gone and
/// its group killed: a process that left the group (`setsid`) can hold
/// them open for as long as it likes.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// How to run a command.
#[derive(Clone, Copy)]
pub struct Options<'a> {
    /// From the start to the moment its process group is killed.
    pub timeout: Duration,
    /// Bytes kept of each stream; the rest is counted and dropped.
    pub max_output: usize,
    /// Send stderr into the stdout pipe, interleaved as written, as one
    /// file would hold them. [`Output::stderr`] then comes back empty.
    pub merge_stderr: bool,
    /// Where to register the command's pid while it runs, so that the
    /// agent's orphan reaper leaves it alone. The lock is held across the
    /// spawn; the pid is removed once the command is reaped.
    pub helpers: Option<&'a Helpers>,
}

impl Options<'_> {
    /// `timeout`, [`MAX_OUTPUT`] of each stream kept, streams apart, no
    /// registration.
    pub fn new(timeout: Duration) -> Self {
        Options {
            timeout,
            max_output: MAX_OUTPUT,
            merge_stderr: false,
            helpers: None,
        }
    }
}

/// What was read from one stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first [`Options::max_output`] bytes.
    pub bytes: Vec<u8>,
    /// Bytes read in all.
    pub total: u64,
}

impl Captured {
    /// Bytes read past the cap and dropped.
    pub fn dropped(&self) -> u64 {
        self.total - self.bytes.len() as u64
    }

    /// The kept bytes as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Termination {
    /// It ended by itself: an exit code, or a signal sent by someone else
    /// (see [`Output::code`] and [`Output::signal`]).
    Finished(ExitStatus),
    /// It was still running at the deadline: its process group was killed
    /// and it was reaped.
    TimedOut,
    /// It was reaped by someone else (a reaper not told about it through
    /// [`Options::helpers`]), so how it ended is unknown.
    Lost,
}

/// A command that ran.
#[derive(Clone, Debug)]
pub struct Output {
    pub status: Termination,
    /// Its stdout (with stderr in it under [`Options::merge_stderr`]).
    pub stdout: Captured,
    pub stderr: Captured,
    /// From before the spawn to the return.
    pub elapsed: Duration,
}

impl Output {
    /// It exited with code 0.
    pub fn success(&self) -> bool {
        matches!(self.status, Termination::Finished(s) if s.success())
    }

    /// Its exit code, when it exited by itself.
    pub fn code(&self) -> Option<i32> {
        match self.status {
            Termination::Finished(s) => s.code(),
            _ => None,
        }
    }

    /// The signal that ended it, when someone else sent it.
    pub fn signal(&self) -> Option<i32> {
        match self.status {
            Termination::Finished(s) => s.signal(),
            _ => None,
        }
    }
}

/// The command could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot run {program}: {source}")]
pub struct SpawnError {
    /// `argv[0]`, as given.
    pub program: String,
    /// Why (`NotFound` for a missing program).
    pub source: std::io::Error,
}

/// Start `cmd` in a process group of its own (its pid is the group's id)
/// that gets `death_signal` (if one is given) when the thread that spawned
/// it ends, resilio killed by SIGKILL included (`PR_SET_PDEATHSIG`), or at
/// once if that parent is already gone when the child sets up. With `take_terminal` the
/// new group also becomes the foreground group of the terminal on stdin (so
/// it can read the keyboard and gets Ctrl-C itself).
pub fn own_group(
    cmd: &mut Command,
    death_signal: Option<Signal>,
    take_terminal: bool,
) -> &mut Command {
    cmd.process_group(0);
    let parent = getpid();
    // SAFETY: only async-signal-safe calls between fork and exec: nix's
    // wrappers here are single system calls that neither allocate nor lock.
    // `pre_exec` itself is why this block exists (no safe form); inside it,
    // `signal` only swaps SIGTTOU between ignored and its old handler in a
    // single-threaded child, and fd 0 is borrowed for one call, only with
    // `take_terminal`, which callers pass when stdin is their terminal.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(death_signal) = death_signal {
                let _ = nix::sys::prctl::set_pdeathsig(death_signal);
                if getppid() != parent {
                    let _ = raise(death_signal);
                }
            }
            if take_terminal {
                let old = signal(Signal::SIGTTOU, SigHandler::SigIgn);
                let _ = tcsetpgrp(BorrowedFd::borrow_raw(0), getpid());
                if let Ok(old) = old {
                    let _ = signal(Signal::SIGTTOU, old);
                }
            }
            Ok(())
        })
    }
}

/// What the threads watching a command report.
enum Notice {
    /// The command exited; `true` when it is still there to be reaped here
    /// (`false`: someone else reaped it).
    Exited(bool),
    /// A pipe reached its end.
    Drained,
}

struct Watched {
    exited: Option<bool>,
    open_pipes: usize,
}

impl Watched {
    fn apply(&mut self, e: Notice) {
        match e {
            Notice::Exited(ours) => self.exited = Some(ours),
            Notice::Drained => self.open_pipes -= 1,
        }
    }

    fn done(&self) -> bool {
        self.exited.is_some() && self.open_pipes == 0
    }

    /// Take events until `enough` or `until`, whichever comes first.
    fn until(&mut self, rx: &Receiver<Notice>, until: Instant, enough: fn(&Watched) -> bool) {
        while !enough(self) {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return;
            };
            match rx.recv_timeout(left) {
                Ok(e) => self.apply(e),
                Err(_) => return,
            }
        }
    }
}

fn lock(c: &Mutex<Captured>) -> MutexGuard<'_, Captured> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read `pipe` to its end on a thread of its own, keeping `cap` bytes.
fn drain(
    mut pipe: impl Read + Send + 'static,
    into: Arc<Mutex<Captured>>,
    cap: usize,
    done: Sender<Notice>,
) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let mut c = lock(&into);
                    let keep = n.min(cap.saturating_sub(c.bytes.len()));
                    c.bytes.extend_from_slice(&buf[..keep]);
                    c.total += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = done.send(Notice::Drained);
    });
}

/// Spawn the command as [`run`] describes; with the read end of the merged
/// pipe under [`Options::merge_stderr`].
fn start<S: AsRef<OsStr>>(
    program: &OsStr,
    args: &[S],
    opts: &Options,
) -> Result<(Child, Option<std::fs::File>), SpawnError> {
    let spawn_error = |source| SpawnError {
        program: program.to_string_lossy().into_owned(),
        source,
    };
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null());
    own_group(&mut cmd, Some(Signal::SIGKILL), false);
    let merged = if opts.merge_stderr {
        let (read, write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| spawn_error(e.into()))?;
        let write2 = write.try_clone().map_err(spawn_error)?;
        cmd.stdout(write).stderr(write2);
        Some(std::fs::File::from(read))
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        None
    };
    let spawned = match opts.helpers {
        Some(h) => h.with(|pids| {
            let child = cmd.spawn();
            if let Ok(c) = &child {
                pids.push(c.id() as i32);
            }
            child
        }),
        None => cmd.spawn(),
    };
    // The Command holds our copies of a merged pipe's write end: without
    // closing them its reader would never see the end.
    drop(cmd);
    Ok((spawned.map_err(spawn_error)?, merged))
}

/// Run `argv` (program, then arguments; never through a shell) until it
/// ends or `opts.timeout` passes, whichever comes first, and reap it. At
/// the deadline its whole process group is killed with SIGKILL; the group
/// is also killed when the command exited in time but something it left in
/// the group still holds its pipes open at the deadline.
///
/// Blocking: run it off an async event loop. Returns once the command is
/// reaped and its pipes are drained, or, for pipes held open by a process
/// that left the group, a short grace after the deadline.
pub fn run<S: AsRef<OsStr>>(argv: &[S], opts: &Options) -> Result<Output, SpawnError> {
    let started = Instant::now();
    let Some((program, args)) = argv.split_first() else {
        return Err(SpawnError {
            program: String::new(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
        });
    };
    let (mut child, merged) = start(program.as_ref(), args, opts)?;
    let pid = Pid::from_raw(child.id() as i32);
    let now = Instant::now();
    // A timeout too long to add is no timeout (a century).
    let deadline = now
        .checked_add(opts.timeout)
        .unwrap_or(now + Duration::from_secs(100 * 365 * 86400));

    let (tx, rx) = mpsc::channel();
    let stdout = Arc::new(Mutex::new(Captured::default()));
    let stderr = Arc::new(Mutex::new(Captured::default()));
    let mut watch = Watched {
        exited: None,
        open_pipes: 0,
    };
    if let Some(pipe) = merged {
        drain(pipe, stdout.clone(), opts.max_output, tx.clone());
        watch.open_pipes += 1;
    }
    if let Some(pipe) = child.stdout.take() {
        drain(pipe, stdout.clone(), opts.max_output, tx.clone());
        watch.open_pipes += 1;
    }
    if let Some(pipe) = child.stderr.take() {
        drain(pipe, stderr.clone(), opts.max_output, tx.clone());
        watch.open_pipes += 1;
    }
    let waiter = std::thread::spawn(move || {
        let ours = loop {
            match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                Err(Errno::EINTR) => continue,
                r => break r.is_ok(),
            }
        };
        let _ = tx.send(Notice::Exited(ours));
    });

    watch.until(&rx, deadline, Watched::done);
    let timed_out = watch.exited.is_none();
    if !watch.done() && watch.exited != Some(false) {
        // Not reaped yet, so the group id is still the command's own.
        let _ = killpg(pid, Signal::SIGKILL);
    }
    // SIGKILL cannot be caught or ignored: the command goes now (unless it
    // is stuck in the kernel, which no signal helps).
    while watch.exited.is_none() {
        match rx.recv() {
            Ok(e) => watch.apply(e),
            Err(_) => break,
        }
    }
    watch.until(&rx, Instant::now() + DRAIN_GRACE, |w| w.open_pipes == 0);
    let reaped = match watch.exited {
        Some(true) => child.wait().ok(),
        _ => None,
    };
    let status = match reaped {
        _ if timed_out => Termination::TimedOut,
        Some(s) => Termination::Finished(s),
        None => Termination::Lost,
    };
    if let Some(h) = opts.helpers {
        h.with(|pids| pids.retain(|p| *p != pid.as_raw()));
    }
    let _ = waiter.join();
    let stdout = std::mem::take(&mut *lock(&stdout));
    let stderr = std::mem::take(&mut *lock(&stderr));
    Ok(Output {
        status,
        stdout,
        stderr,
        elapsed: started.elapsed(),
    })
}

/// Pids of resilio's own helper processes (not to be reaped by the agent).
/// The lock is held across spawn and registration, and by the reaper.
#[derive(Clone, Default)]
pub struct Helpers(std::sync::Arc<std::sync::Mutex<Vec<i32>>>);

impl Helpers {
    /// Run `f` with the registry locked.
    pub fn with<R>(&self, f: impl FnOnce(&mut Vec<i32>) -> R) -> R {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, timeout: Duration) -> Output {
        run(&["sh", "-c", script], &Options::new(timeout)).unwrap()
    }

    /// Wait for `f` to hold, up to `limit`.
    fn within(limit: Duration, f: impl Fn() -> bool) -> bool {
        let end = Instant::now() + limit;
        while !f() {
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// `pid` is no process running `comm` (gone, a zombie, or reused).
    fn gone(pid: i32, comm: &str) -> bool {
        crate::process::read_stat(pid).is_none_or(|p| p.state == 'Z' || p.comm != comm)
    }

    #[test]
    fn a_chatty_stderr_is_not_a_timeout() {
        let out = sh(
            "head -c 10485760 /dev/zero >&2; echo done",
            Duration::from_secs(60),
        );
        assert!(out.success(), "{:?}", out.status);
        assert_eq!(out.code(), Some(0));
        assert_eq!(out.stdout.text(), "done\n");
        assert_eq!(out.stderr.total, 10 << 20);
        assert_eq!(out.stderr.bytes.len(), MAX_OUTPUT);
    }

    #[test]
    fn output_past_the_cap_is_counted_and_dropped() {
        let opts = Options {
            max_output: 1000,
            ..Options::new(Duration::from_secs(60))
        };
        let out = run(&["sh", "-c", "head -c 5000 /dev/zero; echo x >&2"], &opts).unwrap();
        assert!(out.success());
        assert_eq!(out.stdout.bytes.len(), 1000);
        assert_eq!(out.stdout.total, 5000);
        assert_eq!(out.stdout.dropped(), 4000);
        assert_eq!(
            (out.stderr.text().as_str(), out.stderr.dropped()),
            ("x\n", 0)
        );
    }

    #[test]
    fn exit_codes_and_signals_come_back() {
        let out = sh("echo oops >&2; exit 3", Duration::from_secs(60));
        assert_eq!(out.code(), Some(3));
        assert!(!out.success());
        assert_eq!(out.stderr.text(), "oops\n");
        let out = sh("kill -KILL $$", Duration::from_secs(60));
        assert!(
            matches!(out.status, Termination::Finished(_)),
            "{:?}",
            out.status
        );
        assert_eq!((out.code(), out.signal()), (None, Some(9)));
    }

    #[test]
    fn a_command_past_its_timeout_is_killed_with_its_group() {
        let timeout = Duration::from_secs(1);
        // The shell's pid and its background sleep's, then it waits.
        let out = sh("sleep 30 & echo $$ $!; wait", timeout);
        assert_eq!(out.status, Termination::TimedOut);
        assert!(
            out.elapsed < timeout + Duration::from_secs(2),
            "{:?}",
            out.elapsed
        );
        let text = out.stdout.text();
        let pids: Vec<i32> = text
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        let [shell, sleep] = pids[..] else {
            panic!("{text:?}")
        };
        // The shell was reaped before the return; its grandchild dies of
        // the group's SIGKILL.
        assert!(gone(shell, "sh"), "the shell {shell} is still there");
        assert!(
            within(Duration::from_secs(5), || gone(sleep, "sleep")),
            "the grandchild {sleep} outlived the timeout"
        );
    }

    #[test]
    fn pipes_held_by_a_process_that_left_the_group_do_not_hold_the_return() {
        // The shell exits at once; the sleep it leaves behind in a session
        // of its own (out of reach of the group kill) keeps stdout open.
        let timeout = Duration::from_secs(1);
        let out = sh("setsid sleep 30 & echo $!", timeout);
        let text = out.stdout.text();
        let sleep: i32 = text.trim().parse().expect("the sleep's pid");
        let _ = nix::sys::signal::kill(Pid::from_raw(sleep), Signal::SIGKILL);
        assert_eq!(out.code(), Some(0), "{:?}", out.status);
        assert!(
            out.elapsed < timeout + DRAIN_GRACE + Duration::from_secs(2),
            "{:?}",
            out.elapsed
        );
    }

    #[test]
    fn a_missing_command_cannot_be_spawned() {
        let e = run(
            &["/nonexistent/resilio-no-such-check", "--flag"],
            &Options::new(Duration::from_secs(5)),
        )
        .unwrap_err();
        assert_eq!(e.program, "/nonexistent/resilio-no-such-check");
        assert_eq!(e.source.kind(), std::io::ErrorKind::NotFound);
        assert!(e
            .to_string()
            .starts_with("cannot run /nonexistent/resilio-no-such-check: "));
        let empty: [&str; 0] = [];
        assert!(run(&empty, &Options::new(Duration::from_secs(5))).is_err());
    }

    #[test]
    fn a_registered_helper_is_known_while_it_runs() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let helpers = Helpers::default();
        let script = format!(
            "echo out; echo err >&2; echo out2; echo $$ > {0}.part && mv {0}.part {0}; exec sleep 30",
            pid_file.display()
        );
        let h = helpers.clone();
        let runner = std::thread::spawn(move || {
            let opts = Options {
                merge_stderr: true,
                helpers: Some(&h),
                ..Options::new(Duration::from_secs(60))
            };
            run(&["sh", "-c", &script], &opts).unwrap()
        });
        assert!(within(Duration::from_secs(20), || pid_file.exists()));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(helpers.with(|h| h.clone()), [pid]);
        nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
        let out = runner.join().unwrap();
        assert_eq!(out.signal(), Some(15));
        assert_eq!(out.stdout.text(), "out\nerr\nout2\n");
        assert_eq!(out.stderr, Captured::default());
        assert!(helpers.with(|h| h.is_empty()));
    }
}
