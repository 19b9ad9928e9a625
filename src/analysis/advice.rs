//! The host's side of checkpoint-interval advice: what the coordinator's
//! [`Advice`](crate::coordinator::IntervalAdvisor) is handed. It reads the job's own
//! journal (checkpoint cost, failures so far: `report::advised_interval`)
//! and, once per attempt, the node history's failure rate for jobs of this
//! size (`node_history::fleet_rate`), so that the live coordinator never
//! reads journals or reports itself.

use crate::analysis::node_history::FleetRate;
use crate::coordinator::{AdviceSource, Evaluation};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// How far back the node history counts for the failure rate.
const FLEET_WINDOW: Duration = Duration::from_secs(56 * 86400);

/// Advice from the journals under a state dir.
pub struct JournalAdvice {
    state_dir: PathBuf,
    job: String,
    fleet: Mutex<FleetRate>,
}

impl JournalAdvice {
    pub fn new(state_dir: &Path, job: &str) -> JournalAdvice {
        JournalAdvice {
            state_dir: state_dir.to_path_buf(),
            job: job.to_string(),
            fleet: Mutex::new(FleetRate::default()),
        }
    }

    fn evaluate(&self, fleet: FleetRate) -> Evaluation {
        let (every, why) =
            crate::analysis::report::advised_interval(&self.state_dir, &self.job, fleet);
        Evaluation { every, why }
    }
}

impl AdviceSource for JournalAdvice {
    fn at_attempt_start(&self) -> Evaluation {
        let fleet = crate::analysis::node_history::fleet_rate(
            &self.state_dir,
            &self.job,
            chrono::Utc::now(),
            FLEET_WINDOW,
        );
        *self.fleet.lock().unwrap_or_else(|e| e.into_inner()) = fleet.clone();
        self.evaluate(fleet)
    }

    fn again(&self) -> Evaluation {
        let fleet = self.fleet.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.evaluate(fleet)
    }
}
