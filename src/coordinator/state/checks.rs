//! What the coordinator accepts from a token holder: ranks below the world
//! size, no attempt beyond the current one, finite durations, steps within
//! bounds. A refused report or poll changes nothing (400 with the reason).

use super::*;

/// The highest step a report may carry: 2^53 - 1, exact in a JSON number
/// read as a double (the Python client, Prometheus) and far from wrapping
/// when a checkpoint's lead is added to it.
pub const MAX_STEP: u64 = crate::progress::MAX_STEP;
/// How far a rank's step may jump above its last reported one in one report
/// (2^40: steps counted in tokens or samples jump far, never this far).
pub const MAX_STEP_JUMP: u64 = 1 << 40;
/// The rank bound when the host could not tell the job's world size (a batch
/// script without `SLURM_NTASKS`): far beyond any real job, far below the
/// ids a stranger would make up.
pub const MAX_RANKS: u32 = 1 << 20;
/// The most checkpoint steps a report may list (agents send at most 16).
pub const MAX_CHECKPOINTS: usize = 64;
/// The longest `POST /v1/checkpoint` reason, in bytes.
pub const MAX_REASON: usize = 1024;
/// The longest long poll (`wait_s` above it is cut to it).
pub const MAX_WAIT_S: f64 = 60.0;
/// The most steps a coordinated checkpoint is placed ahead of the fastest rank.
pub(super) const MAX_LEAD: u64 = 1 << 32;

/// A request the coordinator refuses (400): the one-line reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid(pub String);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn seconds(name: &str, x: f64) -> Result<(), Invalid> {
    if x.is_finite() && x >= 0.0 {
        Ok(())
    } else {
        Err(Invalid(format!(
            "{name} must be a finite, non-negative number of seconds (got {x})"
        )))
    }
}

/// A long poll's wait: finite and non-negative, at most [`MAX_WAIT_S`].
pub fn poll_wait(wait_s: Option<f64>) -> Result<Duration, Invalid> {
    let w = wait_s.unwrap_or(20.0);
    seconds("wait_s", w)?;
    Duration::try_from_secs_f64(w.min(MAX_WAIT_S)).map_err(|e| Invalid(format!("wait_s: {e}")))
}

/// A checkpoint's reason: short, one line, printable (it is journaled and
/// written into every trainer's control file).
pub fn check_reason(reason: &str) -> Result<(), Invalid> {
    if reason.len() > MAX_REASON {
        return Err(Invalid(format!(
            "reason is {} bytes long; at most {MAX_REASON}",
            reason.len()
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err(Invalid("reason must not hold control characters".into()));
    }
    Ok(())
}

impl JobView {
    /// The bound on rank ids: the world size, or [`MAX_RANKS`] when it is not known.
    pub fn rank_limit(&self) -> u32 {
        self.rank_limit
    }

    /// The world size given is a guess (the host could not tell it): ranks
    /// are accepted below [`MAX_RANKS`] instead.
    pub fn world_size_unknown(&mut self) {
        self.rank_limit = self.rank_limit.max(MAX_RANKS);
    }

    pub(super) fn check_rank(&self, rank: u32) -> Result<(), Invalid> {
        if rank < self.rank_limit {
            Ok(())
        } else if self.rank_limit == self.world_size {
            Err(Invalid(format!(
                "rank {rank} is out of range: the job has {} rank(s)",
                self.world_size
            )))
        } else {
            Err(Invalid(format!(
                "rank {rank} is out of range: at most {} ranks",
                self.rank_limit
            )))
        }
    }

    /// Attempts are started by the coordinator's host only (the launcher's
    /// restart in place, the job-level supervisor's relaunch, a new
    /// allocation's host): an agent reporting a later attempt is not believed.
    /// An earlier attempt is accepted (and its report ignored): a rank of the
    /// attempt being torn down still reports, and polls for its stop.
    pub(super) fn check_attempt(&self, attempt: u32) -> Result<(), Invalid> {
        if attempt <= self.attempt {
            Ok(())
        } else {
            Err(Invalid(format!(
                "attempt {attempt} is not started: the current attempt is {}",
                self.attempt
            )))
        }
    }

    /// Every field of a report in range, before anything in the view changes.
    pub fn check_report(&self, r: &Report) -> Result<(), Invalid> {
        self.check_rank(r.rank)?;
        self.check_attempt(r.attempt)?;
        if let Some(a) = r.progress_age_s {
            seconds("progress_age_s", a)?;
        }
        seconds("intervals (sum)", r.intervals.1)?;
        seconds("compute (sum)", r.compute.1)?;
        if r.figures.len() > crate::coordinator::protocol::MAX_FIGURES {
            return Err(Invalid(format!(
                "{} figures: at most {}",
                r.figures.len(),
                crate::coordinator::protocol::MAX_FIGURES
            )));
        }
        for (name, v) in &r.figures {
            if !crate::progress::figures::is_name(name) || !v.is_finite() {
                return Err(Invalid(format!("figure {name:?} = {v} is out of range")));
            }
        }
        if let Some(step) = r.step {
            if step > MAX_STEP {
                return Err(Invalid(format!("step {step} is above {MAX_STEP}")));
            }
            let last = self
                .ranks
                .get(&r.rank)
                .filter(|e| e.report.attempt == r.attempt)
                .and_then(|e| e.report.step);
            if let Some(last) = last.filter(|l| step > l.saturating_add(MAX_STEP_JUMP)) {
                return Err(Invalid(format!(
                    "step {step} jumps more than {MAX_STEP_JUMP} above the rank's last step {last}"
                )));
            }
        }
        if r.checkpoints.len() > MAX_CHECKPOINTS {
            return Err(Invalid(format!(
                "{} checkpoint steps listed; at most {MAX_CHECKPOINTS}",
                r.checkpoints.len()
            )));
        }
        if let Some(c) = r.checkpoints.iter().find(|c| **c > MAX_STEP) {
            return Err(Invalid(format!("checkpoint step {c} is above {MAX_STEP}")));
        }
        Ok(())
    }

    /// A batch's size (its reports are checked one by one in
    /// [`JobView::on_batch`]).
    pub fn check_batch(&self, b: &BatchReport) -> Result<(), Invalid> {
        use crate::coordinator::protocol::MAX_BATCH;
        if b.reports.is_empty() || b.reports.len() > MAX_BATCH {
            return Err(Invalid(format!(
                "a batch of {} reports: from 1 to {MAX_BATCH}",
                b.reports.len()
            )));
        }
        Ok(())
    }

    /// A relay's long poll: its ranks (`1,2,3`: at most [`MAX_BATCH`], each
    /// in range), ascending and without repeats.
    pub fn check_poll_ranks(&self, ranks: &str) -> Result<Vec<u32>, Invalid> {
        use crate::coordinator::protocol::MAX_BATCH;
        let mut out = Vec::new();
        for part in ranks.split(',') {
            let r: u32 = part
                .trim()
                .parse()
                .map_err(|_| Invalid(format!("ranks {ranks:?}: {part:?} is not a rank")))?;
            self.check_rank(r)?;
            out.push(r);
            if out.len() > MAX_BATCH {
                return Err(Invalid(format!("ranks: at most {MAX_BATCH}")));
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// A long poll's rank and attempt, and its wait.
    pub fn check_poll(
        &self,
        rank: u32,
        attempt: u32,
        wait_s: Option<f64>,
    ) -> Result<Duration, Invalid> {
        self.check_rank(rank)?;
        self.check_attempt(attempt)?;
        poll_wait(wait_s)
    }
}

#[cfg(test)]
mod range_tests {
    use super::*;

    fn report(rank: u32, step: u64) -> Report {
        Report {
            v: VERSION,
            rank,
            node: "n0".into(),
            state: RankState::Running,
            step: Some(step),
            progress_age_s: Some(0.0),
            intervals: (step, step as f64 * 0.5),
            phase: "train".into(),
            ..Default::default()
        }
    }

    /// Two real ranks at steps 10 and 12; what a token holder then sends
    /// must be refused with a reason and leave the view as it was.
    fn refused(bad: Report, why: &str) {
        let t = Instant::now();
        let mut v = JobView::new("j", 2, 0, CoordinatorConfig::default(), t);
        v.on_report(report(0, 10), t);
        v.on_report(report(1, 12), t);
        let before = v.status(t, 0);
        let e = v.check_report(&bad).unwrap_err();
        assert!(e.0.contains(why), "{e}");
        assert!(!e.0.contains('\n'), "one line: {e}");
        assert!(v.on_report(bad, t).is_empty());
        assert_eq!(v.status(t, 0), before);
        assert_eq!((v.rejected, v.reports), (1, 2));
        // The real ranks are still heard.
        let e = v.on_report(report(0, 11), t);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(v.status(t, 0).ranks[0].step, Some(11));
    }

    #[test]
    fn ranks_beyond_the_world_size_are_refused() {
        for rank in [2, 50, 99, u32::MAX] {
            refused(report(rank, 1), "out of range");
        }
    }

    #[test]
    fn an_unknown_world_size_still_bounds_ranks() {
        let t = Instant::now();
        let mut v = JobView::new("j", 1, 0, CoordinatorConfig::default(), t);
        v.world_size_unknown();
        assert_eq!(v.check_report(&report(3, 1)), Ok(()));
        assert_eq!(v.check_report(&report(MAX_RANKS - 1, 1)), Ok(()));
        assert!(v.check_report(&report(MAX_RANKS, 1)).is_err());
        assert!(v.check_report(&report(u32::MAX, 1)).is_err());
    }

    #[test]
    fn a_later_attempt_cannot_take_the_view_over() {
        let mut r = report(0, 10);
        r.attempt = u32::MAX;
        refused(r.clone(), "not started");
        r.attempt = 1;
        refused(r, "not started");
    }

    #[test]
    fn durations_must_be_finite_and_not_negative() {
        for x in [f64::NAN, f64::INFINITY, -1.0, f64::NEG_INFINITY] {
            let mut r = report(0, 10);
            r.progress_age_s = Some(x);
            refused(r, "progress_age_s");
            let mut r = report(0, 10);
            r.intervals.1 = x;
            refused(r, "intervals");
            let mut r = report(0, 10);
            r.compute = (3, x);
            refused(r, "compute");
        }
    }

    #[test]
    fn steps_stay_within_bounds() {
        refused(report(0, u64::MAX), "above");
        refused(report(0, MAX_STEP + 1), "above");
        // Rank 0 was at 10: a jump of more than MAX_STEP_JUMP is refused...
        refused(report(0, 11 + MAX_STEP_JUMP), "jumps");
        let mut r = report(0, 10);
        r.checkpoints = vec![u64::MAX];
        refused(r, "checkpoint step");
        let mut r = report(0, 10);
        r.checkpoints = vec![1; MAX_CHECKPOINTS + 1];
        refused(r, "checkpoint steps listed");
        // ...one of exactly MAX_STEP_JUMP is not, nor a step going back
        // (a counter reset by the trainer), nor a first report far ahead (a
        // resume from a late checkpoint).
        let t = Instant::now();
        let mut v = JobView::new("j", 2, 0, CoordinatorConfig::default(), t);
        v.on_report(report(0, 10), t);
        assert_eq!(v.check_report(&report(0, 10 + MAX_STEP_JUMP)), Ok(()));
        assert_eq!(v.check_report(&report(0, 3)), Ok(()));
        assert_eq!(v.check_report(&report(1, MAX_STEP)), Ok(()));
    }

    #[test]
    fn the_highest_steps_do_not_wrap_a_checkpoint() {
        let t = Instant::now();
        let mut v = JobView::new("j", 1, 0, CoordinatorConfig::default(), t);
        // A step time too small to be true: the lead is capped.
        let mut r = report(0, MAX_STEP);
        r.intervals = (1_000_000, 1e-300);
        assert!(v.on_report(r, t).is_empty());
        let (_, step, _) = v.request_checkpoint("operator", t).unwrap();
        assert!(step > MAX_STEP && step <= MAX_STEP + MAX_LEAD, "{step}");
    }

    #[test]
    fn an_earlier_attempt_is_heard_but_changes_nothing() {
        let t = Instant::now();
        let mut v = JobView::new("j", 2, 3, CoordinatorConfig::default(), t);
        let mut r = report(0, 10);
        r.attempt = 2;
        assert_eq!(v.check_report(&r), Ok(()));
        assert!(v.on_report(r, t).is_empty());
        assert!(v.status(t, 0).ranks.is_empty());
        assert_eq!(v.attempt(), 3);
    }

    #[test]
    fn a_long_polls_values_are_checked() {
        let t = Instant::now();
        let v = JobView::new("j", 2, 1, CoordinatorConfig::default(), t);
        assert_eq!(v.check_poll(1, 1, None), Ok(Duration::from_secs(20)));
        assert_eq!(
            v.check_poll(1, 0, Some(0.5)),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(v.check_poll(0, 1, Some(1e300)), Ok(Duration::from_secs(60)));
        for w in [f64::NAN, -1.0, f64::INFINITY] {
            assert!(v
                .check_poll(0, 1, Some(w))
                .unwrap_err()
                .0
                .contains("wait_s"));
        }
        assert!(v.check_poll(2, 1, None).is_err());
        assert!(v.check_poll(0, 2, None).is_err());
    }

    #[test]
    fn a_checkpoint_reason_is_one_short_line() {
        assert_eq!(check_reason("operator"), Ok(()));
        assert_eq!(check_reason("disk maintenance at 3pm"), Ok(()));
        assert!(check_reason("x\ncheckpoint id=9 step=1").is_err());
        assert!(check_reason("\u{1b}[2J").is_err());
        assert!(check_reason(&"x".repeat(MAX_REASON + 1)).is_err());
    }
    /// `resilio_relayed_ranks`: ranks last heard in a relay's batch, not
    /// those that then reported straight (their relay frozen) or exited.
    #[test]
    fn relayed_ranks_count_the_ranks_last_heard_through_a_relay() {
        let t = Instant::now();
        let mut v = JobView::new("j", 3, 0, CoordinatorConfig::default(), t);
        let batch = |ranks: &[u32], step| BatchReport {
            v: VERSION,
            node: "n0".into(),
            reports: ranks.iter().map(|r| report(*r, step)).collect(),
        };
        v.on_batch(batch(&[0, 1, 2], 1), t);
        assert_eq!(v.relayed_ranks(), 3);
        v.on_batch(batch(&[0, 1, 2], 2), t);
        assert_eq!(v.relayed_ranks(), 3);
        v.on_report(report(1, 3), t);
        assert_eq!(v.relayed_ranks(), 2);
        let mut gone = report(2, 3);
        gone.state = RankState::Exited;
        v.on_batch(
            BatchReport {
                reports: vec![gone],
                ..batch(&[], 0)
            },
            t,
        );
        assert_eq!(v.relayed_ranks(), 1);
        v.on_batch(batch(&[1], 4), t);
        assert_eq!(v.relayed_ranks(), 2);
        assert_eq!(v.batches, 4);
    }
}
