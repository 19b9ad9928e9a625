//! The job's recoveries for `/metrics` (`resilio_recovery_seconds`, by
//! failure class and phase): worked out from the job's journal
//! ([`crate::analysis::recovery`]) when a scrape finds a new attempt or
//! restart, and again while the latest recovery has not reached its step
//! again: once the job's step is past it, or at most every [`REREAD`]. Nothing is read while the job runs its
//! first attempt, and never on the path of a report; the read runs on a
//! blocking thread, and a journal that cannot be read leaves the last
//! figures (fail open).

use crate::analysis::recovery::Recovery;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a recovery not yet back at its step is read again.
pub const REREAD: Duration = Duration::from_secs(30);

/// How often the journal is read again while it shows fewer recoveries
/// than attempts after the first (the next attempt's start not yet
/// journaled when it was read).
pub const REREAD_SOON: Duration = Duration::from_secs(2);

/// The recoveries last read, and when.
#[derive(Default)]
pub struct Cache {
    dir: Option<PathBuf>,
    state: Mutex<Read>,
}

#[derive(Default)]
struct Read {
    /// (attempt, restarts) when last read.
    key: Option<(u32, u32)>,
    at: Option<Instant>,
    list: Vec<Recovery>,
}

impl Cache {
    pub fn new(dir: Option<&Path>) -> Cache {
        Cache {
            dir: dir.map(Path::to_path_buf),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Read> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a scrape at `now` of a job at `attempt` after `restarts`
    /// restarts, at `step`, should read the journal again.
    fn stale(&self, attempt: u32, restarts: u32, step: Option<u64>, now: Instant) -> bool {
        if self.dir.is_none() || (attempt, restarts) == (0, 0) {
            return false;
        }
        let r = self.lock();
        let since = |d: Duration| r.at.is_none_or(|t| now.duration_since(t) >= d);
        let behind = r.list.last().filter(|x| !x.caught_up);
        r.key != Some((attempt, restarts))
            || ((r.list.len() as u32) < attempt && since(REREAD_SOON))
            || behind.is_some_and(|x| step > x.step_before || since(REREAD))
    }

    /// The job's recoveries, read again first when stale.
    pub async fn get(&self, attempt: u32, restarts: u32, step: Option<u64>) -> Vec<Recovery> {
        let now = Instant::now();
        if self.stale(attempt, restarts, step, now) {
            let dir = self.dir.clone();
            let read = tokio::task::spawn_blocking(move || dir.as_deref().and_then(read))
                .await
                .ok()
                .flatten();
            let mut r = self.lock();
            if let Some(list) = read {
                r.list = list;
            }
            r.key = Some((attempt, restarts));
            r.at = Some(now);
        }
        self.lock().list.clone()
    }
}

/// The recoveries of the job's latest run.
fn read(dir: &Path) -> Option<Vec<Recovery>> {
    let j = crate::journal::read_job(dir).ok()?;
    let run = crate::runs::split(j.records).pop()?;
    Some(crate::analysis::recovery::recoveries(&run.records))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recovery(caught_up: bool) -> Recovery {
        Recovery {
            failed_attempt: 0,
            class: Some("hang".into()),
            action: Some("restart_in_place".into()),
            fault: chrono::Utc::now(),
            phases_s: [Some(1.0); 6],
            total_s: 6.0,
            step_before: Some(100),
            first_step: Some(91),
            caught_up,
        }
    }

    #[test]
    fn the_journal_is_read_after_a_restart_and_until_the_job_is_back() {
        let t0 = Instant::now();
        let c = Cache::new(Some(Path::new("/nonexistent")));
        // The first attempt: nothing to read.
        assert!(!c.stale(0, 0, Some(5), t0));
        // A restart: read; read too soon (no recovery yet), read again soon.
        assert!(c.stale(1, 1, Some(5), t0));
        *c.lock() = Read {
            key: Some((1, 1)),
            at: Some(t0),
            list: Vec::new(),
        };
        assert!(!c.stale(1, 1, Some(5), t0 + Duration::from_secs(1)));
        assert!(c.stale(1, 1, Some(5), t0 + REREAD_SOON));
        // A recovery on its way back: read again once past its step.
        c.lock().list = vec![recovery(false)];
        assert!(!c.stale(1, 1, Some(100), t0 + REREAD_SOON));
        assert!(c.stale(1, 1, Some(101), t0 + REREAD_SOON));
        assert!(c.stale(1, 1, Some(95), t0 + REREAD));
        // Back: nothing more until the next restart.
        c.lock().list = vec![recovery(true)];
        assert!(!c.stale(1, 1, Some(500), t0 + REREAD * 10));
        assert!(c.stale(2, 2, Some(500), t0 + REREAD * 10));
        // No job directory: never.
        assert!(!Cache::new(None).stale(3, 3, None, t0));
    }
}
