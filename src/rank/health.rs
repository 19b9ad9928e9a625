//! The optional site health check: a command from config (an argument
//! vector, never a shell string) run on the node before the trainer starts
//! and after it failed. A failing check blames the node.

use crate::config::HealthConfig;
use crate::util::cmd::{self, Options, Termination};
use serde::Serialize;
use std::time::Instant;

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

impl From<&HealthResult> for crate::event::HealthOutcome {
    fn from(h: &HealthResult) -> Self {
        crate::event::HealthOutcome {
            ok: Some(h.ok),
            status: Some(h.status.clone()),
            output: Some(h.output.clone()),
            duration_s: Some(h.duration_s),
            ..Default::default()
        }
    }
}

/// Run the configured check (None when none is configured).
pub fn run(cfg: &HealthConfig) -> Option<HealthResult> {
    let argv = cfg.command.as_ref()?;
    let t = Instant::now();
    let out = match cmd::run(argv, &Options::new(cfg.timeout)) {
        Ok(out) => out,
        Err(e) => {
            return Some(HealthResult {
                ok: false,
                status: e.to_string(),
                output: String::new(),
                duration_s: t.elapsed().as_secs_f64(),
            })
        }
    };
    let output: String = (out.stdout.text() + &out.stderr.text())
        .lines()
        .take(20)
        .collect::<Vec<_>>()
        .join("\n");
    let (ok, status) = match out.status {
        Termination::Finished(st) if st.success() => (true, "exit 0".to_string()),
        Termination::Finished(st) => (
            false,
            match st.code() {
                Some(c) => format!("exit {c}"),
                None => "killed by a signal".into(),
            },
        ),
        // Lost (reaped elsewhere) reads as before: no status by the deadline.
        Termination::TimedOut | Termination::Lost => {
            (false, format!("timed out after {:?}", cfg.timeout))
        }
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
    use std::time::Duration;

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

    #[test]
    fn a_chatty_stderr_is_not_a_timeout() {
        let chatty = run(&cfg(
            &["sh", "-c", "echo fine; head -c 10485760 /dev/zero >&2"],
            60_000,
        ))
        .unwrap();
        assert!(chatty.ok && chatty.status == "exit 0", "{}", chatty.status);
        assert!(chatty.output.starts_with("fine"));
    }
}
