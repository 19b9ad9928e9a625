//! The Slurm adapter: the task's environment ([`env`]), hostlist
//! expressions ([`hostlist`]), and Slurm's commands behind the [`Slurm`]
//! trait ([`commands`] runs the real ones with argument vectors and
//! timeouts; [`fake`] serves unit tests).

pub mod commands;
pub mod env;
pub mod fake;
pub mod hostlist;
pub mod step;

pub use commands::SlurmCli;
pub use env::SlurmContext;

/// A job as `scontrol show job` describes it (fields resilio uses).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobInfo {
    pub job_id: String,
    pub state: String,
    /// Nodes allocated now (expanded).
    pub nodes: Vec<String>,
    /// Nodes the job must not run on (expanded `ExcNodeList`).
    pub excluded: Vec<String>,
    /// Nodes the job must run on (expanded `ReqNodeList`, `sbatch -w`).
    pub required: Vec<String>,
    /// `Restarts=`: how often it was requeued.
    pub restarts: u32,
    /// `Requeue=1` of a batch job (`BatchFlag=1`): the job may be requeued.
    pub requeue: bool,
    pub reason: String,
    pub submit_time: String,
    pub start_time: String,
    pub end_time: String,
    pub time_limit: String,
    /// `NumNodes=`: nodes the job needs.
    pub num_nodes: u32,
}

/// One attempt of a job as `sacct -D` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcctRecord {
    pub job_id: String,
    pub state: String,
    pub exit_code: String,
    pub nodes: Vec<String>,
    pub submit: String,
    pub start: String,
    pub end: String,
    /// The job's owner (`UID`), when sacct said.
    pub uid: Option<u32>,
}

/// A node as `sinfo -N` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// `idle`, `alloc`, `down*`, `drain`, ... (`*`: not responding).
    pub state: String,
    pub reason: String,
}

impl NodeInfo {
    /// Down, not responding, or failing: a node that failed under a job.
    pub fn is_failed(&self) -> bool {
        let s = self.state.to_ascii_lowercase();
        s.ends_with('*')
            || s.starts_with("down")
            || s.starts_with("fail")
            || s.contains("not_responding")
    }
}

/// A line of `squeue`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueEntry {
    pub job_id: String,
    pub state: String,
    pub nodes: Vec<String>,
    pub reason: String,
}

/// Node states resilio sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// Keep the node out of scheduling, with a reason.
    Drain(String),
    /// Back into service.
    Resume,
}

/// Errors from Slurm's commands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlurmError {
    #[error("{0}: command not found (is Slurm installed?)")]
    NotFound(String),
    #[error("{0} timed out after {1:?}")]
    Timeout(String, std::time::Duration),
    #[error("{cmd} failed: {message}")]
    Failed { cmd: String, message: String },
    #[error("invalid {what}: {value:?}")]
    Invalid { what: &'static str, value: String },
    #[error("cannot parse {cmd} output: {detail}")]
    Parse { cmd: String, detail: String },
}

/// What resilio asks of Slurm. Implemented by [`SlurmCli`] (real commands)
/// and [`fake::FakeSlurm`] (unit tests).
pub trait Slurm {
    /// `scontrol show job`.
    fn show_job(&self, job: &str) -> Result<JobInfo, SlurmError>;
    /// Set the job's excluded nodes to exactly `nodes` (callers merge).
    fn set_excluded(&self, job: &str, nodes: &[String]) -> Result<(), SlurmError>;
    /// `scontrol requeue`.
    fn requeue(&self, job: &str) -> Result<(), SlurmError>;
    /// `scontrol update JobId=J NumNodes=N [NumTasks=T]` (a pending job only).
    fn set_size(&self, job: &str, nodes: u32, tasks: Option<u32>) -> Result<(), SlurmError>;
    /// `scancel --signal=SIG JOB`: signal every step of the job (not the batch script).
    fn signal_steps(&self, job: &str, signal: nix::sys::signal::Signal) -> Result<(), SlurmError>;
    /// `scontrol update NodeName=... State=...`.
    fn set_node_state(&self, node: &str, state: &NodeState) -> Result<(), SlurmError>;
    /// `squeue` for one job.
    fn queue(&self, job: &str) -> Result<Vec<QueueEntry>, SlurmError>;
    /// `sacct -D` for one job: every attempt.
    fn accounting(&self, job: &str) -> Result<Vec<AcctRecord>, SlurmError>;
    /// State and reason of each node (`sinfo -N`).
    fn node_states(&self, nodes: &[String]) -> Result<Vec<NodeInfo>, SlurmError>;
    /// Every node of the cluster (`sinfo -N`).
    fn all_nodes(&self) -> Result<Vec<NodeInfo>, SlurmError>;
    /// Every job allocation of any user that ended in NODE_FAIL since `since`
    /// (`sacct -a -D -X -s NODE_FAIL`).
    fn node_failures(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<AcctRecord>, SlurmError>;
    /// Every attempt of each of `jobs` and their steps, of any user (`sacct
    /// -a -D -j J1,J2,...`): where and when they ran, and whose they are.
    /// A step's row has the job's id and a suffix (`J.0`, `J.batch`).
    fn jobs_accounting(&self, jobs: &[String]) -> Result<Vec<AcctRecord>, SlurmError>;

    /// The job's batch script (`scontrol write batch_script JOB -`).
    fn batch_script(&self, job: &str) -> Result<String, SlurmError> {
        Err(SlurmError::Failed {
            cmd: "scontrol write batch_script".into(),
            message: format!("not available for job {job} here"),
        })
    }

    /// Add `nodes` to what the job already excludes; returns the new list.
    fn exclude_more(&self, job: &str, nodes: &[String]) -> Result<Vec<String>, SlurmError> {
        let mut all = self.show_job(job)?.excluded;
        for n in nodes {
            if !all.contains(n) {
                all.push(n.clone());
            }
        }
        self.set_excluded(job, &all)?;
        Ok(all)
    }
}

/// A Slurm job id: digits, optionally `_N` (array task) or `+N` (het component).
pub fn validate_job_id(job: &str) -> Result<(), String> {
    let mut parts = job.splitn(2, ['_', '+']);
    let head = parts.next().unwrap_or("");
    let ok_digits =
        |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    let ok = ok_digits(head) && parts.next().is_none_or(ok_digits);
    if ok {
        Ok(())
    } else {
        Err(format!("invalid Slurm job id {job:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids() {
        for ok in ["1", "123456", "77_3", "9+1"] {
            assert!(validate_job_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "x", "1 2", "1;rm -rf", "-1", "1_", "1__2"] {
            assert!(validate_job_id(bad).is_err(), "{bad}");
        }
    }
}
