//! Process wrapping: the trainer in its own process group, resilio as child
//! subreaper, reaping, and signalling the whole tree.
//!
//! Reaping is done by pid, never with `waitpid(-1)`: the main child by its
//! pid, orphans that were re-parented to resilio by scanning `/proc` for its
//! zombie children. That leaves the helpers resilio runs itself (py-spy) to
//! be waited for by their own code.

use crate::error::Error;
use crate::util::cmd::own_group;
use nix::errno::Errno;
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getpgrp, isatty, tcgetpgrp, tcsetpgrp, Pid};
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::process::{Command, Stdio};

/// Make the calling process a child subreaper: orphaned descendants are
/// re-parented to it instead of init, so none can outlive it unseen.
pub fn set_subreaper() -> std::io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(Into::into)
}

/// Signals whose default would end resilio with no record (and leave the
/// trainer to its death signal), beyond SIGTERM, SIGINT and SIGHUP (handled
/// on their own) and SIGPIPE (ignored by the Rust runtime): each is passed
/// on to the trainer and handled like SIGTERM (stopped on request, SIGKILL
/// after the grace). Not among them: the fault signals (SIGSEGV, SIGBUS,
/// SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP: resilio's own crash), the
/// real-time signals, and SIGXFSZ (see [`stop_signals`]).
pub const STOP_SIGNALS: [Signal; 8] = [
    Signal::SIGQUIT,
    Signal::SIGALRM,
    Signal::SIGVTALRM,
    Signal::SIGPROF,
    Signal::SIGIO,
    Signal::SIGPWR,
    Signal::SIGXCPU,
    Signal::SIGSTKFLT,
];

/// The signals a supervisor of a trainer (the rank agent, the local
/// launcher) handles, installed once, before the trainer starts.
pub struct Signals {
    pub term: tokio::signal::unix::Signal,
    pub int: tokio::signal::unix::Signal,
    pub hup: tokio::signal::unix::Signal,
    pub usr1: tokio::signal::unix::Signal,
    pub usr2: tokio::signal::unix::Signal,
    pub cont: tokio::signal::unix::Signal,
    pub chld: tokio::signal::unix::Signal,
    /// The other signals handled like SIGTERM ([`STOP_SIGNALS`]).
    pub stop: tokio::sync::mpsc::UnboundedReceiver<Signal>,
}

impl Signals {
    /// Install every handler (inside the tokio runtime).
    pub fn install() -> crate::error::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let failed =
            |e: std::io::Error| Error::Other(format!("cannot install signal handler: {e}"));
        let sig = |k: SignalKind| signal(k).map_err(failed);
        Ok(Signals {
            term: sig(SignalKind::terminate())?,
            int: sig(SignalKind::interrupt())?,
            hup: sig(SignalKind::hangup())?,
            usr1: sig(SignalKind::user_defined1())?,
            usr2: sig(SignalKind::user_defined2())?,
            cont: sig(SignalKind::from_raw(libc::SIGCONT))?,
            chld: sig(SignalKind::child())?,
            stop: stop_signals().map_err(failed)?,
        })
    }
}

/// Handle the [`STOP_SIGNALS`]: each arrival comes out of the returned
/// channel. SIGXFSZ (a write of resilio's own past the file size limit) is
/// caught and dropped, so that the write fails instead (the journal fails
/// open); a handler, not SIG_IGN, so that the trainer keeps the default.
/// Call inside the tokio runtime, before the trainer starts.
pub fn stop_signals() -> std::io::Result<tokio::sync::mpsc::UnboundedReceiver<Signal>> {
    use tokio::signal::unix::{signal, SignalKind};
    // tokio keeps a handler installed once registered, stream or not.
    drop(signal(SignalKind::from_raw(libc::SIGXFSZ))?);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for s in STOP_SIGNALS {
        let mut stream = signal(SignalKind::from_raw(s as i32))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(s).is_err() {
                    break;
                }
            }
        });
    }
    Ok(rx)
}

/// A started trainer.
pub struct Spawned {
    /// Its pid, which is also its process group id.
    pub pid: Pid,
    /// Read end of its stdout pipe.
    pub stdout: std::fs::File,
    /// Read end of its stderr pipe.
    pub stderr: std::fs::File,
}

/// Start `argv` in a new process group with piped stdout/stderr, inherited
/// stdin, and `env` added to the environment. With `outlive`, it is not
/// killed when resilio dies (the job-level supervisor's step, which the
/// batch script's guardian then sees through).
pub fn spawn(
    argv: &[OsString],
    env: &[(OsString, OsString)],
    outlive: bool,
) -> Result<Spawned, Error> {
    let program = argv
        .first()
        .ok_or_else(|| Error::Usage("no command given after --".into()))?;
    let mut cmd = Command::new(program);
    cmd.args(&argv[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // If resilio dies (even by SIGKILL), the trainer dies with it rather than
    // running on unsupervised with a broken output pipe.
    // Interactive use: when resilio owns the terminal, the trainer's group
    // takes it over (so `breakpoint()` can read the keyboard and Ctrl-C
    // reaches it directly); [`restore_terminal`] hands it back.
    own_group(
        &mut cmd,
        (!outlive).then_some(Signal::SIGKILL),
        owns_terminal(),
    );
    let name = program.to_string_lossy().into_owned();
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            program: name.clone(),
        },
        _ => Error::NotExecutable {
            program: name.clone(),
            source: e,
        },
    })?;
    let pid = Pid::from_raw(child.id() as i32);
    let stdout = std::fs::File::from(std::os::fd::OwnedFd::from(
        child.stdout.take().expect("piped stdout"),
    ));
    let stderr = std::fs::File::from(std::os::fd::OwnedFd::from(
        child.stderr.take().expect("piped stderr"),
    ));
    // The Child handle is dropped without waiting: resilio reaps by pid.
    drop(child);
    Ok(Spawned {
        pid,
        stdout,
        stderr,
    })
}

/// True when stdin is a terminal whose foreground process group is ours.
pub fn owns_terminal() -> bool {
    let stdin = std::io::stdin();
    isatty(&stdin).unwrap_or(false) && tcgetpgrp(&stdin).is_ok_and(|fg| fg == getpgrp())
}

/// Give the terminal back to resilio's own process group if the trainer's
/// group had taken it (no-op otherwise).
pub fn restore_terminal(trainer_pgid: Pid) {
    let stdin = std::io::stdin();
    if isatty(&stdin).unwrap_or(false) && tcgetpgrp(&stdin).is_ok_and(|fg| fg == trainer_pgid) {
        take_foreground(&stdin);
    }
}

/// Take the terminal's foreground back for this process's group when it
/// was handed to `child_pgid` (the local launcher's one rank: its agent's
/// group, then its trainer's) and that group still holds it or is gone.
/// A terminal the user's shell took back meanwhile is left alone.
pub fn reclaim_terminal(child_pgid: Pid) {
    let stdin = std::io::stdin();
    if !isatty(&stdin).unwrap_or(false) {
        return;
    }
    let Ok(fg) = tcgetpgrp(&stdin) else {
        return;
    };
    if fg.as_raw() <= 0 || fg == getpgrp() {
        return;
    }
    let gone = kill(Pid::from_raw(-fg.as_raw()), None) == Err(Errno::ESRCH);
    if fg == child_pgid || gone {
        take_foreground(&stdin);
    }
}

/// Make this process's group the terminal's foreground group. This process
/// may be a background group at that moment, so SIGTTOU is blocked around
/// `tcsetpgrp` (for it the kernel treats blocked like ignored: the call goes
/// through and no SIGTTOU is sent); blocked in this thread only, so no
/// process-wide signal disposition changes even for a moment.
fn take_foreground(tty: impl AsFd) {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let old = ttou.thread_swap_mask(SigmaskHow::SIG_BLOCK);
    let _ = tcsetpgrp(tty, getpgrp());
    if let Ok(old) = old {
        let _ = old.thread_set_mask();
    }
}

/// How the main child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Exited with a status.
    Code(i32),
    /// Killed by a signal.
    Signal(i32, bool),
}

impl Exit {
    /// The shell's convention: the status, or 128+N for signal N.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s, _) => 128 + s,
        }
    }

    /// Human description (`exit 3`, `signal 9 (SIGKILL)`).
    pub fn describe(self) -> String {
        match self {
            Exit::Code(c) => format!("exit {c}"),
            Exit::Signal(s, core) => {
                let name = Signal::try_from(s).map(|s| s.as_str()).unwrap_or("?");
                format!(
                    "signal {s} ({name}){}",
                    if core { ", core dumped" } else { "" }
                )
            }
        }
    }
}

impl Exit {
    /// The end a wait status reports, if it reports one (not a stop).
    pub fn of(st: WaitStatus) -> Option<Exit> {
        match st {
            WaitStatus::Exited(_, code) => Some(Exit::Code(code)),
            WaitStatus::Signaled(_, sig, core) => Some(Exit::Signal(sig as i32, core)),
            _ => None,
        }
    }
}

/// Reap the main child if it has exited.
pub fn try_reap_main(pid: Pid) -> Option<Exit> {
    waitpid(pid, Some(WaitPidFlag::WNOHANG))
        .ok()
        .and_then(Exit::of)
}

/// One entry of `/proc/PID/stat`.
#[derive(Clone, Debug)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub state: char,
    pub comm: String,
}

/// Parse `/proc/PID/stat` (the command name may contain spaces and parens).
pub fn read_stat(pid: i32) -> Option<ProcInfo> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let mut rest = text[close + 1..].split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgid = rest.next()?.parse().ok()?;
    Some(ProcInfo {
        pid,
        ppid,
        pgid,
        state,
        comm,
    })
}

/// What the trainer's tree has worked so far: its CPU time (user and
/// system, every thread) and the time its threads were ready to run but
/// waited for a CPU (the run delay of `/proc/PID/task/TID/schedstat`). On a
/// node with more runnable threads than cores a working trainer gets only
/// a share of one: its wait is work held back, not idleness.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    /// Clock ticks on a CPU.
    pub cpu_ticks: u64,
    /// Nanoseconds ready to run, waiting for a CPU (0 where the kernel
    /// keeps no such account).
    pub wait_ns: u64,
}

impl Work {
    /// Seconds on a CPU and seconds waiting for one, from `earlier` to this.
    pub fn since(self, earlier: Work) -> (f64, f64) {
        (
            self.cpu_ticks.saturating_sub(earlier.cpu_ticks) as f64 / clock_ticks(),
            self.wait_ns.saturating_sub(earlier.wait_ns) as f64 / 1e9,
        )
    }
}

/// [`Work`] of `root` and its descendants, in one walk of the tree.
pub fn tree_work(root: i32) -> Work {
    read_stat(root)
        .into_iter()
        .chain(descendants(root))
        .map(|p| Work {
            cpu_ticks: cpu_ticks(p.pid).unwrap_or(0),
            wait_ns: cpu_wait_ns(p.pid),
        })
        .fold(Work::default(), |a, b| Work {
            cpu_ticks: a.cpu_ticks + b.cpu_ticks,
            wait_ns: a.wait_ns + b.wait_ns,
        })
}

/// A process's CPU time in clock ticks, all its threads.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: state (3), ... utime (14), stime (15).
    let mut f = rest.split_ascii_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// A process's threads' run delay in nanoseconds.
fn cpu_wait_ns(pid: i32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
    tasks
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| {
            let text = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            text.split_ascii_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum()
}

/// Bytes moved by `root` and its descendants so far (`/proc/PID/io`: read
/// and written through system calls, and to and from storage as pages are
/// dirtied, so a long `write()` to a slow file system shows as it goes).
/// A rank asleep, or waiting on a peer that sends nothing, moves none.
pub fn tree_io_bytes(root: i32) -> u64 {
    read_stat(root)
        .into_iter()
        .chain(descendants(root))
        .filter_map(|p| {
            let text = std::fs::read_to_string(format!("/proc/{}/io", p.pid)).ok()?;
            Some(
                text.lines()
                    .filter_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        matches!(k, "rchar" | "wchar" | "read_bytes" | "write_bytes")
                            .then(|| v.trim().parse::<u64>().ok())?
                    })
                    .sum::<u64>(),
            )
        })
        .sum()
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Every process on the system (that can be read).
pub fn all_processes() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_stat)
        .collect()
}

/// The direct children of `pid`, from `/proc/PID/task/*/children` (a few
/// small reads instead of a walk of every process on the machine); `None`
/// where the kernel does not provide those files.
/// Children this process had before it started any: the reader of a
/// `> >(tee out.log)` that bash forked before it exec'd resilio, or
/// whatever a wrapper left. Never resilio's to stop, wait for or probe:
/// left out of [`live_children`] and of this process's [`descendants`]
/// (and so of every stop of a tree). A pid leaves the list when it is
/// reaped (it may be given to another process then).
static INHERITED: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Note the children this process already has. Called first thing, before
/// resilio starts any process.
pub fn note_inherited_children() {
    let me = std::process::id() as i32;
    let kids = children_of(me).unwrap_or_else(|| {
        all_processes()
            .into_iter()
            .filter(|p| p.ppid == me)
            .map(|p| p.pid)
            .collect()
    });
    if !kids.is_empty() {
        tracing::debug!("children from before resilio started, left alone: {kids:?}");
    }
    *INHERITED.lock().unwrap_or_else(|e| e.into_inner()) = kids;
}

/// Whether `pid` is a child this process had before it started any.
fn inherited(pid: i32) -> bool {
    INHERITED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&pid)
}

fn forget_inherited(pid: i32) {
    INHERITED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p| *p != pid);
}

pub fn children_of(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    let mut any = false;
    for t in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(t.path().join("children")) else {
            continue;
        };
        any = true;
        out.extend(
            text.split_whitespace()
                .filter_map(|x| x.parse::<i32>().ok()),
        );
    }
    any.then_some(out)
}

/// Whether our child `pid` is stopped by job control (SIGTSTP: Ctrl-Z at
/// a terminal; SIGTTIN, SIGTTOU), as its parent sees it (`waitid` with
/// `WNOWAIT`: the stop stays to be seen again, nothing is reaped).
pub fn stopped_by_job_control(pid: Pid) -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let flags = WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    matches!(
        waitid(Id::Pid(pid), flags),
        Ok(WaitStatus::Stopped(
            _,
            Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU
        ))
    )
}

/// All descendants of `root` (not `root` itself), parents before children.
pub fn descendants(root: i32) -> Vec<ProcInfo> {
    let me = std::process::id() as i32;
    let ours = |parent: i32, pid: i32| parent != me || !inherited(pid);
    if let Some(first) = children_of(root) {
        let mut out = Vec::new();
        let mut frontier = vec![root];
        let mut known = Some(first);
        while let Some(parent) = frontier.pop() {
            let kids = known.take().or_else(|| children_of(parent));
            for c in kids.unwrap_or_default() {
                if !ours(parent, c) {
                    continue;
                }
                if let Some(p) = read_stat(c) {
                    frontier.push(p.pid);
                    out.push(p);
                }
            }
        }
        return out;
    }
    let procs = all_processes();
    let mut out: Vec<ProcInfo> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for p in procs
            .iter()
            .filter(|p| p.ppid == parent && ours(parent, p.pid))
        {
            frontier.push(p.pid);
            out.push(p.clone());
        }
    }
    out
}

/// Reap every zombie child of this process except the main child and the
/// pids in `skip` (helpers waited for elsewhere). Returns how many.
pub fn reap_orphans(main: Pid, skip: &[i32]) -> usize {
    let me = std::process::id() as i32;
    let mut n = 0;
    if let Some(kids) = children_of(me) {
        for pid in kids {
            if pid != main.as_raw() && !skip.contains(&pid) {
                if let Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) =
                    waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG))
                {
                    forget_inherited(pid);
                    n += 1;
                }
            }
        }
        return n;
    }
    for p in all_processes() {
        if p.ppid == me && p.state == 'Z' && p.pid != main.as_raw() && !skip.contains(&p.pid) {
            if let Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) =
                waitpid(Pid::from_raw(p.pid), Some(WaitPidFlag::WNOHANG))
            {
                forget_inherited(p.pid);
                n += 1;
            }
        }
    }
    n
}

/// Live children of this process other than `skip` (zombies count as gone
/// once reaped; call [`reap_orphans`] first).
pub fn live_children(skip: &[i32]) -> Vec<ProcInfo> {
    let me = std::process::id() as i32;
    if let Some(kids) = children_of(me) {
        return kids
            .into_iter()
            .filter(|pid| !skip.contains(pid) && !inherited(*pid))
            .filter_map(read_stat)
            .collect();
    }
    all_processes()
        .into_iter()
        .filter(|p| p.ppid == me && !skip.contains(&p.pid) && !inherited(p.pid))
        .collect()
}

/// Send `sig` to a process group; a group that is gone is not an error.
pub fn signal_group(pgid: Pid, sig: Signal) {
    match kill(Pid::from_raw(-pgid.as_raw()), sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::debug!("kill(-{pgid}, {sig}): {e}"),
    }
}

/// Send `sig` to the trainer's group and to every other descendant of this
/// process (those that left the group with setsid/setpgid), except `skip`.
pub fn signal_tree(pgid: Pid, sig: Signal, skip: &[i32]) {
    signal_group(pgid, sig);
    let me = std::process::id() as i32;
    for p in descendants(me) {
        if p.pgid != pgid.as_raw() && !skip.contains(&p.pid) && p.state != 'Z' {
            let _ = kill(Pid::from_raw(p.pid), sig);
        }
    }
}

/// resilio's own stop of a rank (a stall, a teardown): SIGTERM, then
/// SIGCONT, to the trainer's group and, with `tree`, to every other
/// descendant but `skip`. A stopped process (SIGSTOP, a debugger's stop)
/// keeps a caught or blocked SIGTERM pending until it is continued: without
/// the SIGCONT its first word would be the SIGKILL after the grace, and its
/// handler (a last save, a clean exit) would never run. Slurm sends SIGCONT
/// with SIGTERM for the same reason. To a process that runs, SIGCONT does
/// nothing (its default action is to continue).
pub fn terminate(pgid: Pid, tree: Option<&[i32]>) {
    for sig in [Signal::SIGTERM, Signal::SIGCONT] {
        match tree {
            Some(skip) => signal_tree(pgid, sig, skip),
            None => signal_group(pgid, sig),
        }
    }
}

/// The executable name of a process (`/proc/PID/exe` basename, else comm).
pub fn exe_name(pid: i32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| read_stat(pid).map(|s| s.comm))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three busy loops on one CPU: each runs a third of the time and waits
    /// for the CPU the rest, and that wait is counted; a sleeping process
    /// waits for none.
    #[test]
    fn time_ready_to_run_but_kept_off_the_cpu_is_counted() {
        let spin = || {
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap()
        };
        let mut kids: Vec<std::process::Child> = (0..3).map(|_| spin()).collect();
        for k in &kids {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
            // sched_setaffinity are given a set of the right size.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(k.id() as i32, std::mem::size_of_val(&set), &set);
            }
        }
        let mut sleeper = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (w0, s0) = (
            tree_work(kids[0].id() as i32),
            tree_work(sleeper.id() as i32),
        );
        std::thread::sleep(std::time::Duration::from_millis(900));
        let (_, waited) = tree_work(kids[0].id() as i32).since(w0);
        let (_, slept) = tree_work(sleeper.id() as i32).since(s0);
        for k in kids.iter_mut().chain([&mut sleeper]) {
            let _ = k.kill();
            let _ = k.wait();
        }
        assert!(
            waited > 0.3,
            "a loop sharing one CPU with two others waited {waited:.2}s of 0.9s"
        );
        assert!(
            slept < 0.05,
            "a sleeping process waited {slept:.2}s for a CPU"
        );
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(Exit::Code(3).code(), 3);
        assert_eq!(Exit::Signal(9, false).code(), 137);
        assert_eq!(Exit::Signal(15, false).describe(), "signal 15 (SIGTERM)");
    }

    #[test]
    fn stat_parsing_handles_odd_names() {
        let me = read_stat(std::process::id() as i32).unwrap();
        assert_eq!(me.pid, std::process::id() as i32);
        assert!(me.ppid > 0);
    }
}
