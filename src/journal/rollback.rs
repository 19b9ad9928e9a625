//! The rollback the job level leaves for the next attempt
//! (`JOB_DIR/rollback.json`, replaced whole), read by that attempt's agents
//! (`RESILIO_ROLLBACK_STEP`, `RESILIO_SKIP_STEPS`).

/// The file the next attempt's agents read a rollback from.
pub const ROLLBACK_FILE: &str = "rollback.json";

/// A rollback for the next attempt: the checkpoint to restart from and the
/// steps whose data to skip (`policy::numerical`, action `rollback`).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rollback {
    pub for_attempt: u32,
    /// The last checkpoint confirmed before the bad values began (none:
    /// the trainer starts from scratch, or from what it has).
    pub checkpoint_step: Option<u64>,
    /// The steps whose data led to the bad values: from the first bad
    /// report's step to the one the finding was made at.
    pub skip_from: Option<u64>,
    pub skip_to: Option<u64>,
    pub detail: String,
    /// Checkpoints blamed for failures after their restore: not to load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid: Vec<u64>,
}

impl Rollback {
    /// `RESILIO_SKIP_STEPS`: `FROM-TO`.
    pub fn skip_steps(&self) -> Option<String> {
        match (self.skip_from, self.skip_to) {
            (Some(a), Some(b)) => Some(format!("{a}-{}", b.max(a))),
            (Some(a), None) | (None, Some(a)) => Some(format!("{a}-{a}")),
            (None, None) => None,
        }
    }
}

/// A new run of the job id starts: a rollback an earlier run left is not
/// its own (its attempts count from 0 again), and goes.
pub fn forget_rollback(job_dir: &std::path::Path) {
    match std::fs::remove_file(job_dir.join(ROLLBACK_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => tracing::warn!(
            "cannot remove an earlier run's {} in {}: {e}",
            ROLLBACK_FILE,
            job_dir.display()
        ),
        _ => {}
    }
}

/// The rollback left for `attempt`, if any.
pub fn rollback_for(job_dir: &std::path::Path, attempt: u32) -> Option<Rollback> {
    let text =
        crate::util::files::read_in_dir(job_dir, ROLLBACK_FILE, crate::util::files::SMALL_CAP)
            .ok()?;
    serde_json::from_slice::<Rollback>(&text)
        .ok()
        .filter(|r| r.for_attempt == attempt)
}
