//! The batch script's process under Slurm: a small guardian above the
//! job-level supervisor, so that the supervisor's death (`kill -9`, the OOM
//! killer, a crash) does not end the job and the step training in it.
//!
//! Slurm ends a job when its batch script's process exits, and kills the
//! job's running steps with it. The job-level supervisor (`exec resilio run
//! -- srun ...`) used to be that process: its death cost the whole run. Now
//! that process is this guardian:
//!
//! - it becomes a child subreaper and starts the supervisor as its child
//!   (the same `resilio run` with the same arguments, told by
//!   [`ENV_LINK`]), forwards the signals the batch script gets to it, and
//!   exits with its exit code;
//! - each time the supervisor starts a step (`srun`), it hands the guardian
//!   the read ends of srun's output pipes, with the step's pid and where
//!   its journal is ([`hand_over`]). The guardian only holds them: srun
//!   never writes into a pipe nobody holds;
//! - when the supervisor dies while its step runs, srun (no longer bound to
//!   the supervisor's life at batch level) is re-parented to the guardian.
//!   The guardian journals `supervisor_lost`, passes srun's output through,
//!   brings a coordinator back at the dead one's address, and forwards
//!   signals to srun. The ranks train on meanwhile (their links fail open
//!   until the coordinator is back). When the step ends, the guardian
//!   judges and decides with the supervisor's own code
//!   (`batch::after_attempt`): the job ends, is requeued, or the step runs
//!   again inside the allocation, the guardian starting over as itself.
//!
//! If the guardian cannot start the supervisor, the process supervises
//! itself, as before (fail open). `RESILIO_NO_GUARDIAN=1` turns it off.

use crate::event as ev;
use crate::journal::Writer;
use crate::process::Exit;
use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use nix::sys::wait::waitpid;
use nix::unistd::{getpid, Pid};
use serde::{Deserialize, Serialize};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Set in the supervisor's environment by the guardian: the number of its
/// end of the link (a unix socket) to the guardian.
pub const ENV_LINK: &str = "RESILIO_GUARDIAN_FD";
/// Set to `1` to run the job-level supervisor without a guardian.
pub const ENV_OFF: &str = "RESILIO_NO_GUARDIAN";

/// What the supervisor tells the guardian about a step it started.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Handoff {
    pub step_pid: i32,
    /// The job's id (its journal's directory name).
    pub job: String,
    pub attempt: u32,
    pub job_dir: PathBuf,
    pub node: String,
    /// The run key the supervisor's records carry.
    pub run: Option<String>,
    /// The coordinator the supervisor hosts, to bring back if it dies.
    pub coordinator: Option<Rehost>,
}

/// What bringing the job's coordinator back takes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Rehost {
    pub job: String,
    pub world_size: u32,
    pub state_dir: PathBuf,
    /// The user's configuration file (its `[coordinator]` section).
    pub config: Option<PathBuf>,
}

/// The supervisor's end of the link, taken from the environment once.
static LINK: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// In the supervisor, before any thread starts: take the link to the
/// guardian out of the environment (so the step does not inherit it) and
/// keep it. Returns whether this process has a guardian.
pub fn take_link() -> bool {
    LINK.get_or_init(|| {
        let v = std::env::var(ENV_LINK).ok()?;
        std::env::remove_var(ENV_LINK);
        let fd: RawFd = v.trim().parse().ok().filter(|fd| *fd > 2)?;
        // The fd must be an open socket of ours; anything else is ignored.
        let st = nix::sys::stat::fstat(unsafe { BorrowedFd::borrow_raw(fd) }).ok()?;
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return None;
        }
        // SAFETY: the guardian passed this fd to this process for it alone;
        // it was checked open above, and nothing else here owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        set_cloexec(owned.as_raw_fd(), true);
        Some(owned)
    })
    .is_some()
}

/// Whether this supervisor has a guardian.
pub fn guarded() -> bool {
    LINK.get().is_some_and(|l| l.is_some())
}

/// For the supervisor's relaunch of itself (exec): the link is inherited
/// again, under [`ENV_LINK`]. Returns the variable to set, if any.
pub fn keep_across_exec() -> Option<(&'static str, String)> {
    let fd = LINK.get()?.as_ref()?.as_raw_fd();
    set_cloexec(fd, false);
    Some((ENV_LINK, fd.to_string()))
}

fn set_cloexec(fd: RawFd, on: bool) {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    // SAFETY: `fd` is open for the duration of this call (owned by LINK or
    // by the caller).
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let flags = if on {
        FdFlag::FD_CLOEXEC
    } else {
        FdFlag::empty()
    };
    let _ = fcntl(b, FcntlArg::F_SETFD(flags));
}

/// In the supervisor: hand the guardian the step just started (its pid and
/// the read ends of its stdout and stderr). Fails open: an error is logged.
pub fn hand_over(h: &Handoff, stdout: BorrowedFd<'_>, stderr: BorrowedFd<'_>) {
    let Some(Some(link)) = LINK.get() else {
        return;
    };
    let body = serde_json::to_vec(h).unwrap_or_default();
    let fds = [stdout.as_raw_fd(), stderr.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    if let Err(e) = sendmsg::<()>(
        link.as_raw_fd(),
        &[IoSlice::new(&body)],
        &cmsg,
        MsgFlags::empty(),
        None,
    ) {
        tracing::warn!("cannot hand the step over to the batch script's guardian: {e}");
    }
}

/// Whether this process, the batch script's, should be the guardian.
pub fn wanted(in_batch_script: bool) -> bool {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty() && v != "0");
    in_batch_script && std::env::var_os(ENV_LINK).is_none() && !set(ENV_OFF)
}

/// What the guardian shares between its threads.
#[derive(Default)]
struct GuardianState {
    /// Where signals go: the supervisor, then (once it died) the step.
    target: i32,
    /// The step the supervisor runs now, with its output's read ends.
    step: Option<(Handoff, OwnedFd, OwnedFd)>,
    /// A stop signal (SIGTERM, SIGINT, ...) reached the guardian: the
    /// step's end was asked for from outside.
    stopped: bool,
    /// Slurm's pre-timeout signal reached the guardian.
    pre_timeout: bool,
}

/// What the guardian decides a step's end with, once the supervisor is
/// gone: the same as the supervisor would (its command line, its
/// configuration, Slurm).
pub struct Decide<'a> {
    pub argv: &'a [std::ffi::OsString],
    pub cfg: &'a crate::config::Config,
    pub slurm: &'a dyn crate::slurm::Slurm,
}

/// The signals a batch script is sent that the guardian passes on.
fn forwarded_signals() -> Vec<i32> {
    let mut s = vec![
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGCONT,
    ];
    s.extend(crate::process::STOP_SIGNALS.iter().map(|s| *s as i32));
    s
}

/// Be the guardian: start the supervisor and stay above it. `None` when it
/// cannot be started (the caller then supervises itself).
pub fn run(d: Decide<'_>) -> Option<crate::job::batch::Next> {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        tracing::debug!("guardian: cannot become a subreaper; supervising in this process");
        return None;
    }
    let (ours, theirs) = match socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    ) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!("guardian: no socket pair ({e}); supervising in this process");
            return None;
        }
    };
    // Signals first, so that none sent while the supervisor starts is lost.
    let mut signals = match signal_hook::iterator::Signals::new(forwarded_signals()) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("guardian: no signal handling ({e}); supervising in this process");
            return None;
        }
    };
    let mut cmd = crate::util::own_binary();
    cmd.args(crate::util::args_os().into_iter().skip(1))
        .env(ENV_LINK, theirs.as_raw_fd().to_string());
    let fd = theirs.as_raw_fd();
    // SAFETY: one fcntl (async-signal-safe) between fork and exec, on an fd
    // this process owns.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(
                "guardian: cannot start the supervisor ({e}); supervising in this process"
            );
            return None;
        }
    };
    drop(theirs);
    let supervisor = child.id() as i32;
    drop(child);
    let shared = Arc::new(Mutex::new(GuardianState {
        target: supervisor,
        ..Default::default()
    }));
    let pre_timeout_signal = d.cfg.pre_timeout_signal as i32;
    {
        let shared = shared.clone();
        std::thread::spawn(move || {
            for sig in signals.forever() {
                let target = {
                    let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
                    if sig == pre_timeout_signal {
                        s.pre_timeout = true;
                    } else if ![libc::SIGHUP, libc::SIGCONT, libc::SIGUSR1, libc::SIGUSR2]
                        .contains(&sig)
                    {
                        s.stopped = true;
                    }
                    s.target
                };
                // Slurm signals every process of the batch step: the
                // supervisor may have had this one already. A second SIGINT
                // would read as a second Ctrl-C (kill at once), so the
                // supervisor gets SIGTERM, the same stop without that.
                let sig = if target == supervisor && sig == libc::SIGINT {
                    libc::SIGTERM
                } else {
                    sig
                };
                if let Ok(s) = Signal::try_from(sig) {
                    let _ = kill(Pid::from_raw(target), s);
                }
            }
        });
    }
    {
        let shared = shared.clone();
        std::thread::spawn(move || receive_handoffs(ours, shared));
    }
    Some(watch(supervisor, shared, &d))
}

/// Take in the steps the supervisor reports, until its end of the link
/// closes.
fn receive_handoffs(link: OwnedFd, shared: Arc<Mutex<GuardianState>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut cspace = nix::cmsg_space!([RawFd; 2]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(
            link.as_raw_fd(),
            &mut iov,
            Some(&mut cspace),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(r) = c {
                    // SAFETY: descriptors just received: this process owns them.
                    fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
        }
        let len = msg.bytes;
        if len == 0 && fds.is_empty() {
            return;
        }
        let Ok(h) = serde_json::from_slice::<Handoff>(&buf[..len]) else {
            continue;
        };
        if fds.len() != 2 {
            continue;
        }
        let err = fds.pop().expect("two fds");
        let out = fds.pop().expect("two fds");
        let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
        s.step = Some((h, out, err));
    }
}

/// Whether `pid` is alive and a child of this process now.
fn is_our_child(pid: i32) -> bool {
    crate::process::read_stat(pid).is_some_and(|p| p.ppid == getpid().as_raw())
}

/// Reap until the supervisor ends; then, if its step still runs, see the
/// step through.
fn watch(
    supervisor: i32,
    shared: Arc<Mutex<GuardianState>>,
    d: &Decide<'_>,
) -> crate::job::batch::Next {
    use crate::job::batch::Next;
    let Some((status, step_status)) = reap_until(supervisor) else {
        return Next::Exit(1);
    };
    let code = status.code();
    let step = shared.lock().unwrap_or_else(|p| p.into_inner()).step.take();
    let Some((h, out, err)) = step else {
        if matches!(status, Exit::Signal(..)) {
            tracing::error!(
                "the job-level supervisor (pid {supervisor}) died: {}",
                status.describe()
            );
        }
        return Next::Exit(code);
    };
    let reaped_here = step_status
        .filter(|(p, _)| *p == h.step_pid)
        .map(|(_, s)| s);
    let running = reaped_here.is_none() && is_our_child(h.step_pid);
    if !matches!(status, Exit::Signal(..)) && !running {
        return Next::Exit(code);
    }
    let mut journal = note_supervisor_lost(supervisor, &status, &h, running);
    let tail = crate::progress::output::Tail::new(64 * 1024);
    let step_end = if running {
        see_through(&h, out, err, &shared, &tail)
    } else {
        reaped_here
    };
    let Some(st) = step_end else {
        // The step was reaped before (by the supervisor): its status is
        // not known here, so nothing can be judged from it.
        crate::job::act::job_end(
            &mut journal,
            code,
            &format!(
                "the job-level supervisor died ({}) after its step ended",
                status.describe()
            ),
        );
        return Next::Exit(code);
    };
    // The step ended without its supervisor: judged and decided on as the
    // supervisor would have (relaunch, requeue, stop, or the job's end).
    let (stopped, pre_timeout) = {
        let s = shared.lock().unwrap_or_else(|p| p.into_inner());
        (s.stopped, s.pre_timeout)
    };
    decide(
        d,
        &h,
        st,
        &tail.last_lines(200),
        stopped,
        pre_timeout,
        &mut journal,
    )
}

/// Reap children until the supervisor ends: its status, and the last other
/// child's (the step's, if the supervisor's death left it to us). None if
/// waiting fails.
fn reap_until(supervisor: i32) -> Option<(Exit, Option<(i32, Exit)>)> {
    let mut step_status: Option<(i32, Exit)> = None;
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(st) => match (st.pid(), Exit::of(st)) {
                (Some(p), Some(e)) if p.as_raw() == supervisor => return Some((e, step_status)),
                (Some(p), Some(e)) => step_status = Some((p.as_raw(), e)),
                _ => {}
            },
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}

/// Say in the batch journal (and on stderr) that the supervisor died and
/// what the guardian does about its step; the journal, for what follows.
fn note_supervisor_lost(supervisor: i32, status: &Exit, h: &Handoff, running: bool) -> Writer {
    let mut journal = Writer::open(
        &h.job_dir,
        "batch.jsonl",
        h.attempt,
        None,
        Some(h.node.clone()),
    );
    journal.set_run(h.run.as_deref());
    let note = match (running, &h.coordinator) {
        (true, Some(_)) => "the batch script's guardian kept the job and its step running; a coordinator takes over at the same address (coordinator.jsonl); the step's output is passed through, and its end is judged and decided on as the supervisor would",
        (true, None) => "the batch script's guardian kept the job and its step running; the step's output is passed through, and its end is judged and decided on as the supervisor would",
        (false, _) => "the step had ended before; its end was not judged",
    };
    journal.write(
        ev::SupervisorLost {
            supervisor_pid: supervisor,
            status: status.describe(),
            step_pid: h.step_pid,
            step_running: running,
            note: note.into(),
        },
        true,
    );
    tracing::error!(
        "the job-level supervisor (pid {supervisor}) died ({}); {}",
        status.describe(),
        if running {
            "the step trains on without it"
        } else {
            "its step had ended"
        }
    );
    journal
}

/// See the orphaned step through: bring its coordinator back, pass its
/// output on (keeping the tail), and wait for its end.
fn see_through(
    h: &Handoff,
    out: OwnedFd,
    err: OwnedFd,
    shared: &Mutex<GuardianState>,
    tail: &Arc<crate::progress::output::Tail>,
) -> Option<Exit> {
    let coordinator = h.coordinator.as_ref().and_then(bring_back);
    shared.lock().unwrap_or_else(|p| p.into_inner()).target = h.step_pid;
    let (done_tx, done) = std::sync::mpsc::channel();
    relay(out, std::io::stdout(), tail.clone(), done_tx.clone());
    relay(err, std::io::stderr(), tail.clone(), done_tx);
    let st = wait_for(h.step_pid);
    if let Some(c) = coordinator {
        let _ = kill(Pid::from_raw(c), Signal::SIGTERM);
        let _ = waitpid(Pid::from_raw(c), None);
    }
    // Output still buffered is passed on; a process the step left behind
    // holding the pipe does not hold the job up for long.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if done.recv_timeout(left).is_err() {
            break;
        }
    }
    st
}

/// Judge the end of the step the guardian saw through, and decide what
/// follows, with the supervisor's own code (`batch::after_attempt`).
fn decide(
    d: &Decide<'_>,
    h: &Handoff,
    st: Exit,
    tail: &[String],
    stopped: bool,
    pre_timeout: bool,
    journal: &mut Writer,
) -> crate::job::batch::Next {
    let exit_code = st.code();
    let signal = match st {
        Exit::Signal(s, _) => Some(s),
        Exit::Code(_) => None,
    };
    let verdict = crate::policy::failure::classify(
        &crate::policy::failure::RankEnd {
            exit_code,
            signal,
            stalled: false,
            stop_requested: stopped,
            health_check_failed: false,
            numerical: None,
            tail: tail.to_vec(),
        },
        &d.cfg.patterns(),
    );
    let step = crate::job::batch::StepEnd {
        ended: chrono::Utc::now(),
        exit_code,
        verdict: &verdict,
        tail,
        node: &h.node,
        pre_timeout,
        agents: &[],
    };
    let slurm = crate::slurm::SlurmContext::from_env().unwrap_or_default();
    let step_out = std::env::var(crate::slurm::step::ENV_RELAUNCH)
        .ok()
        .and_then(|t| crate::slurm::step::NextAttempt::parse(&t).ok())
        .map(|r| (r.exclude, r.nodes));
    let alloc = super::batch::allocation(d.cfg, &slurm.job_nodes, d.argv, step_out.as_ref());
    crate::job::batch::after_attempt(
        &d.cfg.state_dir,
        &h.job,
        h.attempt,
        &step,
        d.cfg.budget(),
        d.cfg.observe,
        alloc,
        d.slurm,
        journal,
    )
}

/// Start a coordinator in place of the one that died with the supervisor
/// (its address and token: the ranks' links work again). Its pid.
fn bring_back(c: &Rehost) -> Option<i32> {
    let mut cmd = crate::util::own_binary();
    cmd.args(["__coordinator", "--take-over", "--job-id", &c.job])
        .arg("--world-size")
        .arg(c.world_size.to_string())
        .arg("--state-dir")
        .arg(&c.state_dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    if let Some(f) = &c.config {
        cmd.arg("--config").arg(f);
    }
    match cmd.spawn() {
        Ok(child) => {
            tracing::warn!("a coordinator took over (pid {})", child.id());
            Some(child.id() as i32)
        }
        Err(e) => {
            tracing::warn!("cannot bring the coordinator back: {e}");
            None
        }
    }
}

/// Reap until `pid` ends (orphans the step leaves are reaped on the way).
fn wait_for(pid: i32) -> Option<Exit> {
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(st) if st.pid().map(|p| p.as_raw()) == Some(pid) && Exit::of(st).is_some() => {
                return Exit::of(st)
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}

/// Copy a pipe to an output stream until its end, in a thread.
fn relay<W: Write + Send + 'static>(
    from: OwnedFd,
    mut to: W,
    tail: Arc<crate::progress::output::Tail>,
    done: std::sync::mpsc::Sender<()>,
) {
    std::thread::spawn(move || {
        // Said when the pipe ends, whichever way this thread returns.
        struct Notify(std::sync::mpsc::Sender<()>);
        impl Drop for Notify {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let _done = Notify(done);
        let mut f = std::fs::File::from(from);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match f.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    // The output is passed through as it came; a reader
                    // that went away only loses it.
                    let _ = to.write_all(&buf[..n]);
                    let _ = to.flush();
                    tail.push(&buf[..n]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    });
}
