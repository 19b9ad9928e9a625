//! What is gathered on a stall before the rank is stopped: the last lines of
//! output, the Python stacks of each Python process of the rank (read
//! in-process, [`super::stacks`]; a `py-spy` on PATH when that fails), and
//! optionally a dump signal for trainers that registered `faulthandler`
//! (its output lands in the trainer's stderr, so in the tail).
//!
//! An external py-spy runs as a child of resilio; its pid is registered in
//! [`Helpers`] while it runs, so that the agent's orphan reaper leaves it
//! alone.

use crate::config::DiagnosticsConfig;
use crate::event::ProbeFinding;
use crate::process;
use crate::util::cmd::{self, Helpers};
use nix::unistd::Pid;
use serde::Serialize;
use std::path::{Path, PathBuf};

use std::time::Duration;

/// One py-spy run.
#[derive(Clone, Debug, Serialize)]
pub struct PySpyDump {
    pub pid: i32,
    pub ok: bool,
    pub output: String,
}

/// Everything gathered.
#[derive(Clone, Debug, Serialize, Default)]
pub struct Diagnostics {
    /// py-spy dumps, one per Python process found.
    pub py_spy: Vec<PySpyDump>,
    /// Why py-spy was not run, if it was not.
    pub py_spy_skipped: Option<String>,
    /// The dump signal sent, if any.
    pub dump_signal: Option<String>,
}

/// Find an executable on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Python processes among the descendants of this process.
pub fn python_processes(skip: &[i32]) -> Vec<i32> {
    process::descendants(std::process::id() as i32)
        .into_iter()
        .filter(|p| p.state != 'Z' && !skip.contains(&p.pid))
        .filter(|p| {
            process::exe_name(p.pid).is_some_and(|n| n.starts_with("python"))
                || p.comm.starts_with("python")
        })
        .map(|p| p.pid)
        .collect()
}

/// `py-spy dump --pid PID`, registered in `helpers` while it runs, its
/// stdout and stderr interleaved as written. (`_scratch` once held them.)
fn run_py_spy(
    py_spy: &Path,
    pid: i32,
    timeout: Duration,
    helpers: &Helpers,
    _scratch: &Path,
) -> PySpyDump {
    let fail = |msg: String| PySpyDump {
        pid,
        ok: false,
        output: msg,
    };
    let opts = cmd::Options {
        merge_stderr: true,
        helpers: Some(helpers),
        ..cmd::Options::new(timeout)
    };
    let pid_arg = pid.to_string();
    let argv = [
        py_spy.as_os_str(),
        "dump".as_ref(),
        "--pid".as_ref(),
        pid_arg.as_ref(),
    ];
    let out = match cmd::run(&argv, &opts) {
        Ok(out) => out,
        Err(e) => return fail(format!("cannot run py-spy: {}", e.source)),
    };
    let output = out.stdout.text();
    match out.status {
        cmd::Termination::Finished(s) => PySpyDump {
            pid,
            ok: s.success(),
            // py-spy's errors end with its own Rust backtrace: not ours to
            // show.
            output: match output.find("\n\nStack backtrace:") {
                Some(cut) if !s.success() => output[..cut].to_string(),
                _ => output,
            },
        },
        cmd::Termination::TimedOut | cmd::Termination::Lost => {
            fail(format!("py-spy timed out after {:?}\n{output}", timeout))
        }
    }
}

/// Gather diagnostics for a stalled rank whose group is `pgid`. Blocking:
/// run it off the agent's event loop. Sends the dump signal last and then
/// waits `dump_wait`, so the trainer's own dump is in the output tail.
pub fn gather(
    cfg: &DiagnosticsConfig,
    pgid: Pid,
    helpers: &Helpers,
    scratch: &Path,
) -> Diagnostics {
    let mut d = Diagnostics::default();
    (d.py_spy, d.py_spy_skipped) = dump_stacks(cfg, helpers, scratch);
    if let Some(sig) = cfg.dump_signal {
        process::signal_group(pgid, sig);
        d.dump_signal = Some(sig.as_str().to_string());
        std::thread::sleep(cfg.dump_wait);
    }
    d
}

#[cfg(target_arch = "x86_64")]
const POLLS: &[libc::c_long] = &[
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
];
#[cfg(not(target_arch = "x86_64"))]
const POLLS: &[libc::c_long] = &[libc::SYS_ppoll, libc::SYS_pselect6, libc::SYS_epoll_pwait];
const READS: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_recvmmsg,
];
const SLEEPS: &[libc::c_long] = &[libc::SYS_nanosleep, libc::SYS_clock_nanosleep];
const WAITS: &[libc::c_long] = &[libc::SYS_wait4, libc::SYS_waitid];

fn fd_is_socket(pid: i32, fd: i64) -> bool {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
}

fn has_socket(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|d| {
        d.filter_map(|e| e.ok()).any(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
        })
    })
}

/// What one process was found doing: waiting on a peer (`Some(true)`),
/// not (`Some(false)`), or unknown (`None`); in words; and whether "not"
/// is shown (somewhere a collective never is) or only likely (running).
struct Found(Option<bool>, String, bool);

/// The system call a thread is blocked in and its first argument.
fn syscall_of(pid: i32, tid: i32) -> Option<(libc::c_long, i64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    let mut f = text.split_ascii_whitespace();
    let nr = f.next()?.parse::<libc::c_long>().ok()?;
    let arg0 = f
        .next()
        .and_then(|a| i64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .unwrap_or(-1);
    Some((nr, arg0))
}

/// Whether a gloo collective is under way in the process: torch's
/// ProcessGroupGloo runs collectives on its `pt_gloo_runloop` threads, which
/// wait for work together on one condition (one futex address) when idle;
/// a thread blocked on another address is inside a collective, waiting for
/// its peers' data (gloo's own `gloo_tcp_loop` thread does the I/O). The
/// caller's main thread then waits for that collective on a futex. Seen
/// with torch 2.15's gloo: idle `futex 0x5593..84f0` twice; in an
/// all_reduce whose peer sleeps, `0x5591..9cb0` and `0x7f20..9c08`.
fn gloo_collective(pid: i32) -> Option<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut addrs: Vec<(i32, i64)> = Vec::new();
    for t in tasks.filter_map(|e| e.ok()) {
        let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let comm =
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
        if !comm.trim_end().starts_with("pt_gloo_runloop") {
            continue;
        }
        if let Some((nr, addr)) = syscall_of(pid, tid) {
            if nr == libc::SYS_futex {
                addrs.push((tid, addr));
            }
        }
    }
    if addrs.len() < 2 {
        return None;
    }
    // The idle condition is an address two threads or more share; with
    // every thread apart, all of them are busy.
    let shared = addrs
        .iter()
        .map(|(_, a)| *a)
        .find(|a| addrs.iter().filter(|(_, b)| b == a).count() >= 2);
    let busy: Vec<String> = addrs
        .iter()
        .filter(|(_, a)| Some(*a) != shared)
        .map(|(t, _)| t.to_string())
        .collect();
    if busy.is_empty() {
        return None;
    }
    Some(format!(
        "in a gloo collective (pt_gloo_runloop thread(s) {} blocked apart from the idle ones)",
        busy.join(",")
    ))
}

/// Classify one process: `Some(true)` waiting on a peer, `Some(false)` not,
/// `None` for a parent waiting for its children or an unreadable one.
fn probe_process(pid: i32) -> Found {
    let text = match std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/syscall")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Found(
                None,
                "syscall unreadable: ptrace refused (kernel.yama.ptrace_scope, another user's process, or one that is not dumpable while resilio lacks CAP_SYS_PTRACE)".into(),
                false,
            )
        }
        Err(_) => return Found(None, "syscall unreadable".into(), false),
    };
    let mut f = text.split_ascii_whitespace();
    let first = f.next().unwrap_or("");
    if first == "running" {
        return Found(Some(false), "running on a CPU".into(), false);
    }
    let Ok(nr) = first.parse::<libc::c_long>() else {
        return Found(
            Some(false),
            format!("not in a system call ({first})"),
            false,
        );
    };
    let arg0 = f
        .next()
        .and_then(|a| i64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .unwrap_or(-1);
    if READS.contains(&nr) {
        return if fd_is_socket(pid, arg0) {
            Found(
                Some(true),
                format!("blocked reading socket fd {arg0}"),
                false,
            )
        } else {
            Found(
                Some(false),
                format!("blocked reading fd {arg0} (not a socket)"),
                true,
            )
        };
    }
    if POLLS.contains(&nr) {
        return if has_socket(pid) {
            Found(
                Some(true),
                "blocked polling, with sockets open".into(),
                false,
            )
        } else {
            Found(Some(false), "blocked polling, no socket open".into(), true)
        };
    }
    if SLEEPS.contains(&nr) {
        return Found(Some(false), "sleeping".into(), true);
    }
    if WAITS.contains(&nr) {
        return Found(None, "waiting for a child".into(), false);
    }
    if nr == libc::SYS_futex {
        if let Some(what) = gloo_collective(pid) {
            return Found(Some(true), what, false);
        }
        return Found(None, "blocked on a lock or condition (futex)".into(), false);
    }
    Found(Some(false), format!("blocked in system call {nr}"), false)
}

/// A process whose state alone says it is not waiting on a peer, whatever
/// system call it was in: one in uninterruptible sleep, and one stopped
/// (SIGSTOP, a debugger). A stopped process keeps the system call it was
/// stopped in (a socket read of a collective, say), but it reads nothing
/// until it is continued: it holds its peers up, they do not hold it.
fn by_state(state: char) -> Option<&'static str> {
    match state {
        'D' => Some("uninterruptible sleep (disk or driver)"),
        'T' => Some("stopped (SIGSTOP or the like)"),
        't' => Some("stopped by a tracer (a debugger)"),
        _ => None,
    }
}

/// The process (thread group) tracing `pid`, from its `TracerPid` (a
/// thread's id) and that thread's `Tgid`; `None` when nothing traces it.
fn tracer_of(pid: i32) -> Option<i32> {
    let field = |pid: i32, name: &str| -> Option<i32> {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
    };
    let tid = field(pid, "TracerPid:").filter(|&t| t > 0)?;
    Some(field(tid, "Tgid:").unwrap_or(tid))
}

/// Classify one process by its state, else by its system call. A process
/// held in a tracing stop by resilio itself (its stack reader) or one of its
/// helpers (an external py-spy), for a stall's diagnostics while another
/// probe runs, is paused by us for a moment, not by a debugger: its system
/// call says what it waits on.
fn probe_one(p: &process::ProcInfo, helpers: &[i32]) -> Found {
    match by_state(p.state) {
        Some(_)
            if p.state == 't'
                && tracer_of(p.pid)
                    .is_some_and(|t| helpers.contains(&t) || t == std::process::id() as i32) =>
        {
            let Found(w, what, shown) = probe_process(p.pid);
            Found(w, format!("{what} (paused by resilio's own py-spy)"), shown)
        }
        Some(what) => Found(Some(false), what.to_string(), true),
        None => probe_process(p.pid),
    }
}

/// Probe every process under this agent (the trainer's tree), helpers excluded.
pub fn probe(skip: &[i32]) -> ProbeFinding {
    let mut p = ProbeFinding::default();
    let mut all_shown = true;
    for proc_ in process::descendants(std::process::id() as i32) {
        if proc_.state == 'Z' || skip.contains(&proc_.pid) {
            continue;
        }
        let Found(w, what, shown) = probe_one(&proc_, skip);
        p.evidence
            .push(format!("{} {}: {what}", proc_.pid, proc_.comm));
        p.waiting_on_peer = match (p.waiting_on_peer, w) {
            (Some(true), _) | (_, Some(true)) => Some(true),
            (Some(false), _) | (_, Some(false)) => Some(false),
            _ => None,
        };
        if w == Some(false) {
            all_shown &= shown;
        }
    }
    p.not_waiting_shown = p.waiting_on_peer == Some(false) && all_shown;
    p
}

/// What one `py-spy dump` says about waiting on peers: the innermost Python
/// frame of each process's main thread. A frame inside `torch.distributed`
/// (a collective, a barrier, a rendezvous), DDP's own synchronisation
/// (`torch/nn/parallel/distributed.py`), DeepSpeed's comm layer, or the
/// autograd engine (where DDP's gradient all-reduce is waited for, below
/// Python) is waiting on a peer; any other frame (the trainer's own code,
/// `time.sleep`, a data loader queue) is not. `None` when the text holds no
/// stack (py-spy failed).
pub fn classify_stack(dump: &str) -> Option<(bool, String)> {
    let mut in_main = false;
    let mut first_thread = true;
    for line in dump.lines() {
        let t = line.trim_start();
        if t.starts_with("Thread ") {
            // The main thread (py-spy names it), else the first one listed.
            in_main =
                t.contains("\"MainThread\"") || (first_thread && !dump.contains("\"MainThread\""));
            first_thread = false;
            continue;
        }
        if !in_main || line.len() == t.len() || t.is_empty() {
            continue;
        }
        // `    function (path/file.py:line)`: the first frame is the innermost.
        let frame = t.to_string();
        let path = t
            .rsplit_once(" (")
            .map(|(_, p)| p.trim_end_matches(')'))
            .unwrap_or("");
        let path = path.replace('\\', "/");
        let waiting = [
            "torch/distributed/",
            "torch/nn/parallel/distributed.py",
            "deepspeed/comm/",
            "torch/autograd/",
        ]
        .iter()
        .any(|p| path.contains(p));
        return Some((waiting, frame));
    }
    None
}

/// The verdict of several dumps (one per Python process of the rank): any
/// process waiting on a peer makes the rank wait; otherwise any readable
/// stack makes it not wait.
pub fn classify_dumps(dumps: &[PySpyDump]) -> Option<(bool, Vec<String>)> {
    let mut verdict: Option<bool> = None;
    let mut evidence = Vec::new();
    for d in dumps.iter().filter(|d| d.ok) {
        if let Some((w, frame)) = classify_stack(&d.output) {
            evidence.push(format!(
                "{} stack: {} in {frame}",
                d.pid,
                if w {
                    "waiting on a peer"
                } else {
                    "not waiting"
                }
            ));
            verdict = Some(verdict.unwrap_or(false) || w);
        }
    }
    verdict.map(|v| (v, evidence))
}

/// The stacks of every Python process of the rank, or why there are none:
/// read in-process ([`super::stacks`]), else by a `py-spy` on PATH.
pub fn dump_stacks(
    cfg: &DiagnosticsConfig,
    helpers: &Helpers,
    scratch: &Path,
) -> (Vec<PySpyDump>, Option<String>) {
    if !cfg.py_spy {
        return (Vec::new(), Some("disabled in config".into()));
    }
    let skip = helpers.with(|h| h.clone());
    let pids = python_processes(&skip);
    if pids.is_empty() {
        return (Vec::new(), Some("no Python process in the rank".into()));
    }
    let _ = crate::journal::create_private_dir_all(scratch);
    let external = which("py-spy");
    let dumps: Vec<PySpyDump> = pids
        .into_iter()
        .map(|pid| match super::stacks::dump(pid, cfg.py_spy_timeout) {
            Ok(output) => PySpyDump {
                pid,
                ok: true,
                output,
            },
            Err(why) => match &external {
                Some(py_spy) => {
                    let mut d = run_py_spy(py_spy, pid, cfg.py_spy_timeout, helpers, scratch);
                    if !d.ok {
                        d.output = format!("built-in reader: {why}\npy-spy: {}", d.output);
                    }
                    d
                }
                None => PySpyDump {
                    pid,
                    ok: false,
                    output: format!("built-in reader: {why}; no py-spy on PATH to try"),
                },
            },
        })
        .collect();
    let skipped = dumps.iter().all(|d| !d.ok).then(|| {
        dumps
            .iter()
            .map(|d| d.output.lines().next().unwrap_or("").to_string())
            .collect::<Vec<_>>()
            .join("; ")
    });
    (dumps, skipped)
}

/// Lines a rank prints while it waits on a peer in a collective: NCCL's
/// watchdog and heartbeat, gloo's transport timeouts and lost peers, the
/// c10d store's timeouts. (Recorded samples: tests/fixtures/failures.)
const COLLECTIVE_WAIT_LINES: &str = concat!(
    r"Watchdog caught collective operation timeout",
    r"|Exception \(either an error or timeout\) detected by watchdog",
    r"|Heartbeat monitor timed out",
    r"|Timed out waiting \d+ ?ms for (?:recv|send) operation",
    r"|gloo/transport/.*(?:Connection reset by peer|Connection closed by peer|Timed out)",
    r"|\[c10d\].*(?:Socket Timeout|timed out|Timeout)",
    r"|DistBackendError: .*(?:timed out|Timeout)",
    r"|NCCL WARN .*(?:remote process exited|Connection closed by remote peer)",
);

/// The last line of `lines` that shows the rank waiting on a peer in a
/// collective, if any.
pub fn collective_wait_line(lines: &[String]) -> Option<String> {
    static RE: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    let re = RE
        .get_or_init(|| regex::Regex::new(COLLECTIVE_WAIT_LINES).ok())
        .as_ref()?;
    lines
        .iter()
        .rev()
        .find(|l| re.is_match(l))
        .map(|l| l.chars().take(300).collect())
}

/// Add what the output says: a collective's timeout or a lost peer in the
/// rank's recent lines means it was waiting on a peer.
pub fn with_output(mut p: ProbeFinding, tail: &[String]) -> ProbeFinding {
    if let Some(line) = collective_wait_line(tail) {
        p.waiting_on_peer = Some(true);
        p.not_waiting_shown = false;
        p.evidence.push(format!("output: {line}"));
    }
    p
}

/// Combine the system-call probe with the stacks. Either one seeing a wait
/// on a peer decides: a stack inside a collective (NCCL spins on a GPU, so
/// the system call says nothing there), or a process blocked reading a
/// socket (a collective the stacks do not know, such as a hand-written one
/// over TCP). Not waiting needs the stacks to say so and the system call
/// not to contradict them.
pub fn with_stacks(
    mut p: ProbeFinding,
    dumps: &[PySpyDump],
    skipped: Option<&str>,
) -> ProbeFinding {
    match classify_dumps(dumps) {
        Some((w, ev)) => {
            p.waiting_on_peer = Some(w || p.waiting_on_peer == Some(true));
            p.not_waiting_shown = p.waiting_on_peer == Some(false);
            p.evidence.extend(ev);
            p.stacks = true;
        }
        None => p.evidence.push(format!(
            "no stacks: {}",
            skipped.unwrap_or("py-spy could not read the processes")
        )),
    }
    p
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    /// A real Python asleep in a function of its own: its frames, innermost
    /// first, the thread named, as `py-spy dump` shows them.
    #[test]
    #[cfg(feature = "stacks")]
    fn a_python_asleep_in_its_own_function_is_read_in_process() {
        let Some(python) = ["python3", "python"].iter().find_map(|n| which(n)) else {
            eprintln!("skipped: no python on PATH");
            return;
        };
        let mut child = std::process::Command::new(python)
            .args([
                "-c",
                "import time\ndef napping():\n    while True: time.sleep(1)\nprint('ready', flush=True)\nnapping()\n",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let got = super::super::stacks::dump(child.id() as i32, Duration::from_secs(30));
        let _ = child.kill();
        let _ = child.wait();
        let text = got.unwrap();
        assert!(text.contains("\"MainThread\""), "{text}");
        let (waiting, frame) = classify_stack(&text).unwrap();
        assert!(!waiting, "{text}");
        assert!(frame.starts_with("napping (<string>:3)"), "{frame}\n{text}");
        assert!(!super::super::stacks::tracing_now());
    }

    /// A child of the test, killed and reaped when dropped (a failed
    /// assertion must not leave it holding the test's output open).
    struct Kid(std::process::Child);

    impl Kid {
        fn spawn(argv: &[&str]) -> Kid {
            Kid(std::process::Command::new(argv[0])
                .args(&argv[1..])
                .spawn()
                .unwrap())
        }
        fn id(&self) -> u32 {
            self.0.id()
        }
    }

    impl Drop for Kid {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A child reading a socket that never speaks.
    fn socket_reader() -> Kid {
        Kid::spawn(&[
            "python3",
            "-c",
            "import socket; a, b = socket.socketpair(); a.recv(1)",
        ])
    }

    /// Wait up to 10 s for `what`; its last answer.
    fn until(what: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !what() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        what()
    }

    #[test]
    fn a_process_blocked_on_a_socket_waits_on_a_peer_and_a_sleeper_does_not() {
        // This test's own children: one reads a socket that never speaks, one sleeps.
        let sleeper = Kid::spawn(&["sleep", "30"]);
        let waiter = socket_reader();
        // Started: the sleeper in its nanosleep, the reader in its read.
        let in_sleep = || {
            std::fs::read_to_string(format!("/proc/{}/syscall", sleeper.id()))
                .ok()
                .and_then(|t| t.split_ascii_whitespace().next()?.parse().ok())
                .is_some_and(|nr: libc::c_long| SLEEPS.contains(&nr))
        };
        assert!(until(in_sleep));
        let Found(s, what, _) = probe_process(sleeper.id() as i32);
        assert_eq!(s, Some(false), "{what}");
        assert!(
            until(|| probe_process(waiter.id() as i32).0 == Some(true)),
            "{}",
            probe_process(waiter.id() as i32).1
        );
        let all = probe(&[]);
        assert_eq!(all.waiting_on_peer, Some(true), "{:?}", all.evidence);
    }

    #[test]
    fn a_stopped_process_is_not_waiting_even_inside_a_socket_read() {
        use nix::sys::signal::{kill, Signal};
        let waiter = socket_reader();
        let pid = waiter.id() as i32;
        let state = || process::read_stat(pid).map(|p| p.state);
        assert!(until(|| probe_process(pid).0 == Some(true)));
        kill(nix::unistd::Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
        assert!(until(|| state() == Some('T')));
        // Its system call is still the socket read...
        assert_eq!(probe_process(pid).0, Some(true));
        // ...but a stopped process waits on nobody. (Not `probe()`: it
        // sees every child of this test binary, other tests' too.)
        let Found(w, what, _) = probe_one(&process::read_stat(pid).unwrap(), &[]);
        drop(waiter);
        assert_eq!(w, Some(false), "{what}");
        assert!(what.starts_with("stopped (SIGSTOP"), "{what}");
    }

    /// The race a loaded machine showed: a rank's stall diagnostics ran
    /// py-spy on it (a tracing stop) while the coordinator's probe read its
    /// state, and a rank blocked in a collective was taken for one held by
    /// a debugger, so nobody was blamed for the hang.
    #[test]
    fn a_process_paused_by_our_own_helper_is_judged_by_its_system_call() {
        let waiter = socket_reader();
        let pid = waiter.id() as i32;
        assert!(until(|| probe_process(pid).0 == Some(true)));
        // A tracer in this process (as py-spy traces the trainer) holds it.
        // SAFETY: plain ptrace requests on our own child; no memory passed.
        unsafe {
            assert_eq!(libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0), 0);
            assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0), 0);
            let mut status = 0;
            libc::waitpid(pid, &mut status, libc::__WALL);
        }
        let info = process::read_stat(pid).unwrap();
        let me = std::process::id() as i32;
        let tracer = tracer_of(pid);
        // This process itself is the tracer (the built-in stack reader),
        // helpers or not.
        let ours = probe_one(&info, &[]);
        unsafe {
            libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
        }
        drop(waiter);
        assert_eq!(info.state, 't');
        assert_eq!(tracer, Some(me), "the tracing thread's process is this one");
        assert_eq!(ours.0, Some(true), "{}", ours.1);
        assert!(
            ours.1.contains("paused by resilio's own py-spy"),
            "{}",
            ours.1
        );
    }

    /// A process held by a tracer that is neither this process nor one of
    /// its helpers (a debugger) waits on nobody, whatever its system call.
    #[test]
    fn a_process_held_by_someone_elses_tracer_is_stopped() {
        let Some(python) = which("python3") else {
            eprintln!("skipped: no python3");
            return;
        };
        let waiter = socket_reader();
        let pid = waiter.id() as i32;
        assert!(until(|| probe_process(pid).0 == Some(true)));
        let script = "import ctypes, os, sys, time\n\
            libc = ctypes.CDLL(None, use_errno=True)\n\
            pid = int(sys.argv[1])\n\
            ok = libc.ptrace(0x4206, pid, 0, 0) == 0 and libc.ptrace(0x4207, pid, 0, 0) == 0\n\
            ok and os.waitpid(pid, 0x40000000)\n\
            print('held' if ok else 'refused', flush=True)\n\
            time.sleep(60)\n";
        let mut debugger = Kid(std::process::Command::new(python)
            .args(["-c", script, &pid.to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap());
        let mut said = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(debugger.0.stdout.take().unwrap()),
            &mut said,
        )
        .unwrap();
        if said.trim() != "held" {
            eprintln!("skipped: ptrace of a non-child refused here");
            return;
        }
        let info = process::read_stat(pid).unwrap();
        let tracer = tracer_of(pid);
        let theirs = probe_one(&info, &[]);
        let debugger_pid = debugger.id() as i32;
        drop(debugger);
        drop(waiter);
        assert_eq!(info.state, 't');
        assert_eq!(tracer, Some(debugger_pid));
        assert_eq!(theirs.0, Some(false), "{}", theirs.1);
        assert!(theirs.1.starts_with("stopped by a tracer"), "{}", theirs.1);
    }

    #[test]
    fn stacks_inside_a_collective_wait_and_others_do_not() {
        let waiting = "Process 4242: python3 train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\nThread 4242 (idle): \"MainThread\"\n    all_reduce (torch/distributed/distributed_c10d.py:2501)\n    wrapper (torch/distributed/c10d_logger.py:83)\n    <module> (train.py:20)\nThread 4250 (idle): \"Thread-1\"\n    wait (threading.py:320)\n";
        let (w, frame) = classify_stack(waiting).unwrap();
        assert!(w, "{frame}");
        assert!(frame.starts_with("all_reduce"), "{frame}");
        let hung = "Process 4243: python3 train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\nThread 4243 (idle): \"MainThread\"\n    step (train.py:31)\n    <module> (train.py:40)\n";
        assert!(!classify_stack(hung).unwrap().0);
        let backward = "Thread 7 (active): \"MainThread\"\n    _engine_run_backward (torch/autograd/graph.py:825)\n    backward (torch/autograd/__init__.py:347)\n    <module> (t.py:9)\n";
        assert!(classify_stack(backward).unwrap().0);
        assert_eq!(classify_stack("Error: Permission denied"), None);
        let dumps = [
            PySpyDump {
                pid: 1,
                ok: true,
                output: hung.into(),
            },
            PySpyDump {
                pid: 2,
                ok: false,
                output: "failed".into(),
            },
        ];
        let (v, ev) = classify_dumps(&dumps).unwrap();
        assert!(!v);
        assert!(
            ev[0].contains("not waiting in step (train.py:31)"),
            "{ev:?}"
        );
        let p = with_stacks(
            ProbeFinding {
                waiting_on_peer: None,
                ..Default::default()
            },
            &dumps,
            None,
        );
        assert_eq!(p.waiting_on_peer, Some(false));
        assert!(p.stacks);
        let p = with_stacks(ProbeFinding::default(), &[], Some("py-spy not on PATH"));
        assert_eq!(p.waiting_on_peer, None);
        assert!(p.evidence[0].contains("py-spy not on PATH"));
    }

    #[test]
    fn collective_timeouts_and_lost_peers_in_the_output_are_waits() {
        let lines = |ls: &[&str]| ls.iter().map(|l| l.to_string()).collect::<Vec<_>>();
        for l in [
            "[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.",
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete",
            "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:54321: Connection reset by peer",
            "[rank0]:[E1120 10:00:00.000 ProcessGroupNCCL.cpp:1400] [PG ID 0 PG GUID 0(default_pg) Rank 0] Heartbeat monitor timed out! Process will be terminated after dumping debug info.",
        ] {
            let p = with_output(ProbeFinding::default(), &lines(&["step 11 loss 0.3", l]));
            assert_eq!(p.waiting_on_peer, Some(true), "{l}");
            assert!(p.evidence[0].starts_with("output: "));
        }
        let p = with_output(
            ProbeFinding {
                waiting_on_peer: Some(false),
                ..Default::default()
            },
            &lines(&[
                "step 11 loss 0.3",
                "NCCL INFO [Service thread] Connection closed by localRank 0",
            ]),
        );
        assert_eq!(
            p.waiting_on_peer,
            Some(false),
            "NCCL's normal teardown is no wait"
        );
    }
}
