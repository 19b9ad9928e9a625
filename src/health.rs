//! The optional site health check: a command from config (an argument
//! vector, never a shell string) run on the node before the trainer starts
//! and after it failed. A failing check blames the node.

use crate::config::HealthConfig;
use serde::Serialize;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Exit code of `resilio run` when the health check failed before start.
pub const EXIT_UNHEALTHY: i32 = 125;

/// What one run of the check found.
#[derive(Clone, Debug, Serialize)]
pub struct HealthResult {
    pub ok: bool,
    /// `exit N`, `signal N`, `timed out`, or why it could not run.
    pub status: String,
    /// The first lines of its output.
    pub output: String,
    pub duration_s: f64,
}

/// Run the configured check (None when none is configured).
pub fn run(cfg: &HealthConfig) -> Option<HealthResult> {
    let argv = cfg.command.as_ref()?;
    let t = Instant::now();
    let fail = |status: String| HealthResult {
        ok: false,
        status,
        output: String::new(),
        duration_s: t.elapsed().as_secs_f64(),
    };
    let mut child = match Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Some(fail(format!("cannot run {}: {e}", argv[0]))),
    };
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        let mut e = String::new();
        let _ = err.read_to_string(&mut e);
        s + &e
    });
    let deadline = Instant::now() + cfg.timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let output: String = reader
        .join()
        .unwrap_or_default()
        .lines()
        .take(20)
        .collect::<Vec<_>>()
        .join("\n");
    let (ok, status) = match status {
        Some(st) if st.success() => (true, "exit 0".to_string()),
        Some(st) => (
            false,
            match st.code() {
                Some(c) => format!("exit {c}"),
                None => "killed by a signal".into(),
            },
        ),
        None => (false, format!("timed out after {:?}", cfg.timeout)),
    };
    Some(HealthResult {
        ok,
        status,
        output,
        duration_s: t.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(argv: &[&str], timeout_ms: u64) -> HealthConfig {
        HealthConfig {
            command: Some(argv.iter().map(|s| s.to_string()).collect()),
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    #[test]
    fn passes_fails_and_times_out() {
        assert!(run(&HealthConfig::default()).is_none());
        let ok = run(&cfg(&["true"], 5000)).unwrap();
        assert!(ok.ok);
        let bad = run(&cfg(
            &["sh", "-c", "echo 'GPU 3: ECC errors 12'; exit 2"],
            5000,
        ))
        .unwrap();
        assert!(
            !bad.ok && bad.status == "exit 2" && bad.output.contains("ECC"),
            "{bad:?}"
        );
        let slow = run(&cfg(&["sleep", "10"], 100)).unwrap();
        assert!(!slow.ok && slow.status.starts_with("timed out"));
        let missing = run(&cfg(&["/nonexistent/check"], 100)).unwrap();
        assert!(!missing.ok && missing.status.starts_with("cannot run"));
    }
}
