//! Python stacks read in-process with the py-spy crate (as a library: no
//! `py-spy` binary and no Python needed next to resilio). The agent is the
//! trainer's parent, so the kernel lets it look where a `py-spy` it spawned
//! would be refused (`kernel.yama.ptrace_scope=1`, Ubuntu's default).
//!
//! The text is `py-spy dump`'s, so one reader classifies both:
//!
//! ```text
//! Thread 0x7F17D3C91B80 (idle): "MainThread"
//!     inner (train.py:4)
//! ```
//!
//! While a process is held for reading, the agent must not `waitpid` it
//! from another thread: the tracing stop would be reported there, and the
//! reading thread would wait for it forever. [`tracing_now`] says when
//! (the main child's reaper skips a round then).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// When the current read began (ms since the epoch), 0 when none runs.
static TRACING_SINCE: AtomicU64 = AtomicU64::new(0);
/// One read at a time: two threads cannot trace one process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
/// A read older than this is taken to be stuck: the reaper reaps again
/// (the agent's exit status must come through whatever the reader does).
const STUCK: Duration = Duration::from_secs(60);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Whether a process is being read now (and not for longer than [`STUCK`]).
pub fn tracing_now() -> bool {
    let since = TRACING_SINCE.load(Ordering::Acquire);
    since != 0 && now_ms().saturating_sub(since) < STUCK.as_millis() as u64
}

/// The stacks of Python process `pid`, as `py-spy dump` prints them, read
/// within `timeout` (on a thread of its own: a read that never returns is
/// left behind, never waited for), or why not.
pub fn dump(pid: i32, timeout: Duration) -> Result<String, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("stacks".into())
        .spawn(move || {
            let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
            TRACING_SINCE.store(now_ms().max(1), Ordering::Release);
            let r = read(pid);
            TRACING_SINCE.store(0, Ordering::Release);
            let _ = tx.send(r);
        })
        .map_err(|e| format!("no thread to read stacks: {e}"))?;
    rx.recv_timeout(timeout)
        .map_err(|_| format!("reading the stacks took over {timeout:?}"))?
}

#[cfg(feature = "stacks")]
fn read(pid: i32) -> Result<String, String> {
    use std::fmt::Write;
    let cfg = py_spy::Config {
        include_idle: true,
        collect_thread_names: true,
        ..py_spy::Config::default()
    };
    // `{:#}`: the message and its causes on one line ("... : Permission
    // denied (os error 13)"), never a backtrace.
    let mut spy = py_spy::PythonSpy::new(pid, &cfg).map_err(|e| format!("{e:#}"))?;
    let traces = spy.get_stack_traces().map_err(|e| format!("{e:#}"))?;
    let mut out = format!(
        "Process {pid}: {}\nPython v{} (resilio's built-in py-spy)\n",
        spy.process
            .cmdline()
            .map(|c| c.join(" "))
            .unwrap_or_default(),
        spy.version
    );
    for t in &traces {
        let status = match (t.active, t.owns_gil) {
            (_, true) => "active+gil",
            (true, false) => "active",
            (false, false) => "idle",
        };
        let _ = write!(out, "\nThread {:#X} ({status})", t.thread_id);
        if let Some(name) = &t.thread_name {
            let _ = write!(out, ": \"{name}\"");
        }
        out.push('\n');
        for f in &t.frames {
            let file = f.short_filename.as_deref().unwrap_or(&f.filename);
            let _ = writeln!(out, "    {} ({file}:{})", f.name, f.line);
        }
    }
    Ok(out)
}

#[cfg(not(feature = "stacks"))]
fn read(_pid: i32) -> Result<String, String> {
    Err("resilio was built without its own stack reader (feature `stacks`)".into())
}

#[cfg(all(test, feature = "stacks"))]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_is_not_python_says_why() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let got = dump(child.id() as i32, Duration::from_secs(30));
        let _ = child.kill();
        let _ = child.wait();
        assert!(got.is_err(), "{got:?}");
    }
}
