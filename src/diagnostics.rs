//! What is gathered on a stall before the rank is stopped: the last lines of
//! output, `py-spy dump` of each Python process of the rank (when py-spy is
//! on PATH), and optionally a dump signal for trainers that registered
//! `faulthandler` (its output lands in the trainer's stderr, so in the tail).
//!
//! py-spy runs as a child of resilio; its pid is registered in [`Helpers`]
//! while it runs, so that the agent's orphan reaper leaves it alone.

use crate::config::DiagnosticsConfig;
use crate::process;
use nix::unistd::Pid;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Pids of resilio's own helper processes (not to be reaped by the agent).
/// The lock is held across spawn and registration, and by the reaper.
#[derive(Clone, Default)]
pub struct Helpers(Arc<Mutex<Vec<i32>>>);

impl Helpers {
    /// Run `f` with the registry locked.
    pub fn with<R>(&self, f: impl FnOnce(&mut Vec<i32>) -> R) -> R {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }
}

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

fn run_py_spy(
    py_spy: &Path,
    pid: i32,
    timeout: Duration,
    helpers: &Helpers,
    scratch: &Path,
) -> PySpyDump {
    let out_path = scratch.join(format!("py-spy-{pid}-{}.txt", std::process::id()));
    let fail = |msg: String| PySpyDump {
        pid,
        ok: false,
        output: msg,
    };
    let Ok(out) = std::fs::File::create(&out_path) else {
        return fail("cannot create scratch file".into());
    };
    let Ok(err) = out.try_clone() else {
        return fail("cannot create scratch file".into());
    };
    let spawned = helpers.with(|h| {
        let child = std::process::Command::new(py_spy)
            .args(["dump", "--pid", &pid.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn();
        if let Ok(c) = &child {
            h.push(c.id() as i32);
        }
        child
    });
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot run py-spy: {e}")),
    };
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    helpers.with(|h| h.retain(|p| *p != child.id() as i32));
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    match status {
        Some(s) => PySpyDump {
            pid,
            ok: s.success(),
            output,
        },
        None => fail(format!("py-spy timed out after {:?}\n{output}", timeout)),
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
    if cfg.py_spy {
        match which("py-spy") {
            Some(py_spy) => {
                let skip = helpers.with(|h| h.clone());
                let pids = python_processes(&skip);
                if pids.is_empty() {
                    d.py_spy_skipped = Some("no Python process in the rank".into());
                }
                for pid in pids {
                    d.py_spy.push(run_py_spy(
                        &py_spy,
                        pid,
                        cfg.py_spy_timeout,
                        helpers,
                        scratch,
                    ));
                }
            }
            None => d.py_spy_skipped = Some("py-spy not on PATH".into()),
        }
    } else {
        d.py_spy_skipped = Some("disabled in config".into());
    }
    if let Some(sig) = cfg.dump_signal {
        process::signal_group(pgid, sig);
        d.dump_signal = Some(sig.as_str().to_string());
        std::thread::sleep(cfg.dump_wait);
    }
    d
}
