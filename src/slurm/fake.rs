//! An in-memory Slurm for unit tests of the decision logic: jobs, node
//! states, and a log of every call, with injectable failures.

use super::{AcctRecord, JobInfo, NodeInfo, NodeState, QueueEntry, Slurm, SlurmError};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A fake Slurm. Calls are recorded as strings such as `requeue 17`.
#[derive(Default)]
pub struct FakeSlurm {
    pub jobs: Mutex<BTreeMap<String, JobInfo>>,
    pub nodes: Mutex<BTreeMap<String, NodeState>>,
    pub acct: Mutex<BTreeMap<String, Vec<AcctRecord>>>,
    /// `sacct -s NODE_FAIL` answers, any job.
    pub node_fail_rows: Mutex<Vec<AcctRecord>>,
    /// `sinfo -N` answers (nodes not listed are idle).
    pub node_info: Mutex<BTreeMap<String, NodeInfo>>,
    pub calls: Mutex<Vec<String>>,
    /// Calls (by first word) that fail with this message.
    pub failing: Mutex<BTreeMap<String, String>>,
}

impl FakeSlurm {
    /// A fake with one job.
    pub fn with_job(job: JobInfo) -> Self {
        let f = FakeSlurm::default();
        f.jobs.lock().unwrap().insert(job.job_id.clone(), job);
        f
    }

    /// Make calls starting with `verb` fail.
    pub fn fail(&self, verb: &str, message: &str) {
        self.failing
            .lock()
            .unwrap()
            .insert(verb.into(), message.into());
    }

    /// The calls made so far.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn call(&self, verb: &str, rest: String) -> Result<(), SlurmError> {
        self.calls.lock().unwrap().push(format!("{verb} {rest}"));
        match self.failing.lock().unwrap().get(verb) {
            Some(m) => Err(SlurmError::Failed {
                cmd: verb.into(),
                message: m.clone(),
            }),
            None => Ok(()),
        }
    }

    fn job(&self, job: &str) -> Result<JobInfo, SlurmError> {
        self.jobs
            .lock()
            .unwrap()
            .get(job)
            .cloned()
            .ok_or_else(|| SlurmError::Failed {
                cmd: "scontrol show job".into(),
                message: "Invalid job id specified".into(),
            })
    }
}

impl Slurm for FakeSlurm {
    fn show_job(&self, job: &str) -> Result<JobInfo, SlurmError> {
        self.call("show_job", job.into())?;
        self.job(job)
    }

    fn set_excluded(&self, job: &str, nodes: &[String]) -> Result<(), SlurmError> {
        self.call("set_excluded", format!("{job} {}", nodes.join(",")))?;
        let mut jobs = self.jobs.lock().unwrap();
        let j = jobs.get_mut(job).ok_or_else(|| SlurmError::Failed {
            cmd: "scontrol update".into(),
            message: "Invalid job id specified".into(),
        })?;
        j.excluded = nodes.to_vec();
        Ok(())
    }

    fn requeue(&self, job: &str) -> Result<(), SlurmError> {
        self.call("requeue", job.into())?;
        let mut jobs = self.jobs.lock().unwrap();
        let j = jobs.get_mut(job).ok_or_else(|| SlurmError::Failed {
            cmd: "scontrol requeue".into(),
            message: "Invalid job id specified".into(),
        })?;
        if !j.requeue {
            return Err(SlurmError::Failed {
                cmd: "scontrol requeue".into(),
                message: "Requested operation is presently disabled".into(),
            });
        }
        j.restarts += 1;
        j.state = "PENDING".into();
        Ok(())
    }

    fn set_size(&self, job: &str, nodes: u32, tasks: Option<u32>) -> Result<(), SlurmError> {
        self.call("set_size", format!("{job} {nodes} {tasks:?}"))?;
        let mut jobs = self.jobs.lock().unwrap();
        let j = jobs.get_mut(job).ok_or_else(|| SlurmError::Failed {
            cmd: "scontrol update".into(),
            message: "Invalid job id specified".into(),
        })?;
        if !j.state.starts_with("PENDING") {
            return Err(SlurmError::Failed {
                cmd: "scontrol update".into(),
                message: format!("Job is no longer pending execution for job {job}"),
            });
        }
        j.num_nodes = nodes;
        Ok(())
    }

    fn signal_steps(&self, job: &str, signal: nix::sys::signal::Signal) -> Result<(), SlurmError> {
        self.call("signal_steps", format!("{job} {signal}"))
    }

    fn set_node_state(&self, node: &str, state: &NodeState) -> Result<(), SlurmError> {
        self.call("set_node_state", format!("{node} {state:?}"))?;
        self.nodes
            .lock()
            .unwrap()
            .insert(node.into(), state.clone());
        Ok(())
    }

    fn queue(&self, job: &str) -> Result<Vec<QueueEntry>, SlurmError> {
        self.call("queue", job.into())?;
        let j = self.job(job)?;
        Ok(vec![QueueEntry {
            job_id: j.job_id,
            state: j.state,
            nodes: j.nodes,
            reason: j.reason,
        }])
    }

    fn node_states(&self, nodes: &[String]) -> Result<Vec<NodeInfo>, SlurmError> {
        self.call("node_states", nodes.join(","))?;
        let known = self.node_info.lock().unwrap();
        Ok(nodes
            .iter()
            .map(|n| {
                known.get(n).cloned().unwrap_or(NodeInfo {
                    name: n.clone(),
                    state: "idle".into(),
                    reason: String::new(),
                })
            })
            .collect())
    }

    fn all_nodes(&self) -> Result<Vec<NodeInfo>, SlurmError> {
        self.call("all_nodes", String::new())?;
        Ok(self.node_info.lock().unwrap().values().cloned().collect())
    }

    fn node_failures(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<AcctRecord>, SlurmError> {
        self.call("node_failures", since.to_rfc3339())?;
        Ok(self.node_fail_rows.lock().unwrap().clone())
    }

    fn jobs_accounting(&self, jobs: &[String]) -> Result<Vec<AcctRecord>, SlurmError> {
        self.call("jobs_accounting", jobs.join(","))?;
        let acct = self.acct.lock().unwrap();
        Ok(jobs
            .iter()
            .filter_map(|j| acct.get(j))
            .flatten()
            .cloned()
            .collect())
    }

    fn accounting(&self, job: &str) -> Result<Vec<AcctRecord>, SlurmError> {
        self.call("accounting", job.into())?;
        Ok(self
            .acct
            .lock()
            .unwrap()
            .get(job)
            .cloned()
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclude_more_merges_with_what_the_job_excludes() {
        let f = FakeSlurm::with_job(JobInfo {
            job_id: "9".into(),
            excluded: vec!["n4".into()],
            requeue: true,
            ..JobInfo::default()
        });
        let all = f.exclude_more("9", &["n2".into(), "n4".into()]).unwrap();
        assert_eq!(all, ["n4", "n2"]);
        f.requeue("9").unwrap();
        assert_eq!(f.show_job("9").unwrap().restarts, 1);
        assert_eq!(
            f.calls()[..3],
            ["show_job 9", "set_excluded 9 n4,n2", "requeue 9"]
        );
    }
}
