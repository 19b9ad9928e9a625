//! `resilio __coordinator`: a standalone coordinator (tests, benchmarks).

use super::usage;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::journal;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(super) struct CoordinatorArgs {
    /// Job id
    #[arg(long)]
    job_id: String,
    /// Ranks expected
    #[arg(long, default_value_t = 1)]
    world_size: u32,
    /// Address to bind (default 127.0.0.1:0)
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: String,
    /// Configuration file (its [coordinator] and [straggler] sections apply)
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where journals live [env: RESILIO_STATE_DIR]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Come back in place of the job's dead coordinator: its address and
    /// token, from the files it left (the ranks report here again)
    #[arg(long, conflicts_with = "bind")]
    take_over: bool,
}

/// Serve a coordinator until SIGTERM/SIGINT; prints its URL and token file.
pub(super) fn coordinator_cmd(a: CoordinatorArgs) -> Result<i32> {
    use crate::coordinator::{state::JobView, Coordinator};
    journal::validate_job_id(&a.job_id).map_err(Error::Usage)?;
    let cfg = Config::load(a.config.as_deref())?;
    let state_dir =
        crate::state_dir::for_writer(&a.state_dir.clone().unwrap_or(cfg.state_dir.clone()))
            .map_err(usage)?;
    let dir = journal::job_dir(&state_dir, &a.job_id);
    // Taking over: the attempt the ranks run now is the journal's latest,
    // and the run is the dead coordinator's.
    let earlier = if a.take_over {
        journal::read_job(&dir)
            .map(|j| j.records)
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let attempt = earlier.iter().map(|r| r.attempt).max().unwrap_or(0);
    let run = earlier
        .iter()
        .rev()
        .find(|r| r.kind == "coordinator_start")
        .and_then(|r| r.run())
        .map(str::to_string);
    let view = JobView::new(
        &a.job_id,
        a.world_size,
        attempt,
        cfg.coordinator.policy.clone(),
        std::time::Instant::now(),
    );
    let mut w = journal::Writer::open(&dir, "coordinator.jsonl", attempt, None, None);
    w.set_run(run.as_deref());
    let mut c = if a.take_over {
        let from = crate::coordinator::successor_of(&dir)
            .map_err(|e| Error::Usage(format!("cannot take over the coordinator: {e}")))?;
        Coordinator::take_over(view, from, w, &dir)
    } else {
        let bind = crate::coordinator::bind_address(&a.bind, false).map_err(usage)?;
        Coordinator::start(view, bind, w, Some(&dir))
    }
    .map_err(|e| Error::Other(format!("coordinator: {e}")))?;
    c.watch_recoveries(std::sync::Arc::new(
        crate::analysis::recovery::JournalRecoveries::new(&dir),
    ));
    // In place of a job's dead coordinator: the site's scrape comes back too.
    if a.take_over && cfg.coordinator.site_metrics {
        let node = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Err(e) = c.serve_site_metrics(&state_dir, &a.job_id, &node) {
            tracing::warn!("no read-only metrics listener for the site: {e}");
        }
    }
    println!("{}", c.url);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut signals = signal_hook_iter()?;
    let _ = signals.forever().next();
    drop(c);
    Ok(0)
}

pub(super) fn signal_hook_iter() -> Result<signal_hook::iterator::Signals> {
    signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT])
        .map_err(|e| Error::Other(format!("cannot install signal handler: {e}")))
}
