//! resilio's own diagnostics: `tracing` events, one plain line each on
//! stderr, `resilio: MESSAGE` (the level is named only below `info`).
//!
//! What is shown: `warn` and `info` events of resilio by default (the lines a
//! user reads while a job runs: a restart, a requeue, a degraded monitor);
//! `-v` adds `debug`, `-vv` `trace`; `RESILIO_LOG` takes an `EnvFilter`
//! directive (`debug`, `resilio::coordinator=debug`, `off`) and wins over
//! `-v`. Other crates' events show from `warn` up. The filter chosen here is
//! handed to the processes resilio starts (ranks' agents, `srun`) in
//! `RESILIO_LOG`, so `-v` reaches every rank.
//!
//! A command's own result (a usage error, the report's notes, "written to
//! FILE") is its output, not a diagnostic, and is printed directly.

use std::fmt;
use std::sync::OnceLock;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The environment variable holding the filter.
pub const ENV_LOG: &str = "RESILIO_LOG";

static FILTER: OnceLock<String> = OnceLock::new();

/// The filter for `verbose` (`-v` count) and the environment's `RESILIO_LOG`.
pub fn filter_for(verbose: u8, env: Option<&str>) -> String {
    match env.map(str::trim).filter(|s| !s.is_empty()) {
        Some(directive) => directive.to_string(),
        None => match verbose {
            0 => "warn,resilio=info".to_string(),
            1 => "warn,resilio=debug".to_string(),
            _ => "warn,resilio=trace".to_string(),
        },
    }
}

/// Install the subscriber (once; later calls do nothing).
pub fn init(verbose: u8) {
    let env = std::env::var(ENV_LOG).ok();
    let wanted = filter_for(verbose, env.as_deref());
    let filter = EnvFilter::try_new(&wanted).unwrap_or_else(|e| {
        crate::say_err!("resilio: ignoring {ENV_LOG}={wanted}: {e}");
        EnvFilter::new(filter_for(verbose, None))
    });
    let _ = FILTER.set(wanted);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // A stderr that went away (its reader gone) loses resilio's lines
        // and nothing else: never tracing's own complaint, which panics.
        .log_internal_errors(false)
        .with_writer(|| {
            // A line of resilio's never continues a trainer's unended one
            // (a tqdm frame): `grep '^resilio:'` finds them all.
            let mut e = std::io::stderr();
            if crate::progress::output::take_stderr_mid_line() {
                let _ = std::io::Write::write_all(&mut e, b"\n");
            }
            e
        })
        .event_format(Plain)
        .try_init();
}

/// `RESILIO_LOG` for the processes resilio starts, when it is not the default.
pub fn child_env() -> Vec<(&'static str, String)> {
    match FILTER.get() {
        Some(f) if *f != filter_for(0, None) => vec![(ENV_LOG, f.clone())],
        _ => Vec::new(),
    }
}

/// `resilio: MESSAGE`, or `resilio: debug: MESSAGE` below `info`.
struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: format::Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = *event.metadata().level();
        write!(w, "resilio: ")?;
        if level > Level::INFO {
            write!(w, "{}: ", level.as_str().to_ascii_lowercase())?;
        }
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_wins_over_v_and_v_counts() {
        assert_eq!(filter_for(0, None), "warn,resilio=info");
        assert_eq!(filter_for(1, None), "warn,resilio=debug");
        assert_eq!(filter_for(3, None), "warn,resilio=trace");
        assert_eq!(filter_for(2, Some("off")), "off");
        assert_eq!(filter_for(1, Some("  ")), "warn,resilio=debug");
    }
}
