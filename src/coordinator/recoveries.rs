//! The job's recoveries for `/metrics` (`resilio_recovery_seconds`, by
//! failure class and phase), from a [`RecoverySource`] the host hands in
//! (the journal's, `analysis::recovery::JournalRecoveries`: the
//! coordinator itself reads no journal). Asked when a scrape finds a new
//! attempt or restart, and again while the latest recovery has not reached
//! its step again: once the job's step is past it, or at most every
//! [`REREAD`]. Never during the first attempt, never on the path of a
//! report; on a blocking thread; a source that fails leaves the last
//! figures (fail open).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One recovery, as `/metrics` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct RecoveryFigures {
    /// The failure's class.
    pub class: String,
    /// Seconds of each phase the journal shows, and `total`.
    pub phases: Vec<(&'static str, f64)>,
    /// The step the failed attempt had reached, and whether the job is
    /// back at it.
    pub step_before: Option<u64>,
    pub caught_up: bool,
}

/// Where the recoveries come from.
pub trait RecoverySource: Send + Sync + 'static {
    /// The job's recoveries so far (`None`: cannot tell now).
    fn recoveries(&self) -> Option<Vec<RecoveryFigures>>;
}

/// How often a recovery not yet back at its step is read again.
pub const REREAD: Duration = Duration::from_secs(30);

/// How often the journal is read again while it shows fewer recoveries
/// than attempts after the first (the next attempt's start not yet
/// journaled when it was read).
pub const REREAD_SOON: Duration = Duration::from_secs(2);

/// The recoveries last read, and when.
#[derive(Default)]
pub struct Cache {
    source: Mutex<Option<Arc<dyn RecoverySource>>>,
    state: Mutex<Read>,
}

#[derive(Default)]
struct Read {
    /// (attempt, restarts) when last read.
    key: Option<(u32, u32)>,
    at: Option<Instant>,
    list: Vec<RecoveryFigures>,
}

impl Cache {
    /// Where the recoveries come from from now on.
    pub fn set_source(&self, source: Arc<dyn RecoverySource>) {
        *self.source.lock().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    fn source(&self) -> Option<Arc<dyn RecoverySource>> {
        self.source
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Read> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a scrape at `now` of a job at `attempt` after `restarts`
    /// restarts, at `step`, should read the journal again.
    fn stale(&self, attempt: u32, restarts: u32, step: Option<u64>, now: Instant) -> bool {
        if self.source().is_none() || (attempt, restarts) == (0, 0) {
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
    pub async fn get(
        &self,
        attempt: u32,
        restarts: u32,
        step: Option<u64>,
    ) -> Vec<RecoveryFigures> {
        let now = Instant::now();
        if self.stale(attempt, restarts, step, now) {
            let source = self.source();
            let read = tokio::task::spawn_blocking(move || source.and_then(|s| s.recoveries()))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn recovery(caught_up: bool) -> RecoveryFigures {
        RecoveryFigures {
            class: "hang".into(),
            phases: vec![("detection", 1.0), ("total", 6.0)],
            step_before: Some(100),
            caught_up,
        }
    }

    struct Nothing;
    impl RecoverySource for Nothing {
        fn recoveries(&self) -> Option<Vec<RecoveryFigures>> {
            None
        }
    }

    #[test]
    fn the_journal_is_read_after_a_restart_and_until_the_job_is_back() {
        let t0 = Instant::now();
        let c = Cache::default();
        // No source: never.
        assert!(!c.stale(3, 3, None, t0));
        c.set_source(Arc::new(Nothing));
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
    }
}
