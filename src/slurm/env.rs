//! The SLURM_* environment of a task, typed, and the torchrun-compatible
//! variables resilio exports from it.

use super::hostlist;
use std::collections::BTreeMap;

/// What Slurm tells a task about itself. Every field is optional: resilio
/// also runs with no Slurm at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlurmContext {
    pub job_id: Option<String>,
    pub step_id: Option<String>,
    /// Global rank of the task in the step (`SLURM_PROCID`).
    pub procid: Option<u32>,
    /// Rank of the task on its node (`SLURM_LOCALID`).
    pub localid: Option<u32>,
    /// Index of the node in the step (`SLURM_NODEID`).
    pub nodeid: Option<u32>,
    pub node_name: Option<String>,
    /// Nodes of the step, expanded (`SLURM_STEP_NODELIST`, else `SLURM_JOB_NODELIST`).
    pub step_nodes: Vec<String>,
    /// Nodes of the job, expanded (`SLURM_JOB_NODELIST`).
    pub job_nodes: Vec<String>,
    /// Tasks in the step (`SLURM_STEP_NUM_TASKS`, else `SLURM_NTASKS`).
    pub ntasks: Option<u32>,
    /// Tasks per node of the step, expanded (`SLURM_STEP_TASKS_PER_NODE` such as `2(x3),1`).
    pub tasks_per_node: Vec<u32>,
    /// Requeues so far (`SLURM_RESTART_COUNT`, unset on the first attempt).
    pub restart_count: u32,
    pub cpus_per_task: Option<u32>,
    pub gpus_on_node: Option<u32>,
    /// `ENVIRONMENT=BATCH`: set by sbatch for the batch script (and inherited by its steps).
    pub batch_env: bool,
}

/// Expand `2(x3),1` into `[2, 2, 2, 1]`.
pub fn expand_tasks_per_node(text: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for item in text.split(',').filter(|s| !s.is_empty()) {
        let (count, repeat) = match item.split_once("(x") {
            Some((c, r)) => (
                c,
                r.strip_suffix(')')
                    .ok_or_else(|| format!("bad tasks-per-node '{text}'"))?,
            ),
            None => (item, "1"),
        };
        let c: u32 = count
            .trim()
            .parse()
            .map_err(|_| format!("bad tasks-per-node '{text}'"))?;
        let r: u32 = repeat
            .trim()
            .parse()
            .map_err(|_| format!("bad tasks-per-node '{text}'"))?;
        if r > 1_000_000 {
            return Err(format!("bad tasks-per-node '{text}'"));
        }
        out.extend(std::iter::repeat_n(c, r as usize));
    }
    Ok(out)
}

impl SlurmContext {
    /// Read from the process environment.
    pub fn from_env() -> Result<SlurmContext, String> {
        Self::from_lookup(&|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// Read from an injected environment.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<SlurmContext, String> {
        let num = |k: &str| -> Result<Option<u32>, String> {
            get(k)
                .map(|v| {
                    v.trim()
                        .parse::<u32>()
                        .map_err(|_| format!("{k}={v:?} is not a number"))
                })
                .transpose()
        };
        let list = |k: &str| -> Result<Vec<String>, String> {
            get(k).map_or(Ok(Vec::new()), |v| {
                hostlist::expand(&v).map_err(|e| format!("{k}: {e}"))
            })
        };
        let job_nodes = list("SLURM_JOB_NODELIST")?;
        let step_nodes = match get("SLURM_STEP_NODELIST") {
            Some(_) => list("SLURM_STEP_NODELIST")?,
            None => job_nodes.clone(),
        };
        let job_id = get("SLURM_JOB_ID");
        if let Some(j) = &job_id {
            super::validate_job_id(j)?;
        }
        let node_name = get("SLURMD_NODENAME");
        if let Some(n) = &node_name {
            if !hostlist::valid_node_name(n) {
                return Err(format!("SLURMD_NODENAME={n:?} is not a valid node name"));
            }
        }
        Ok(SlurmContext {
            job_id,
            step_id: get("SLURM_STEP_ID"),
            procid: num("SLURM_PROCID")?,
            localid: num("SLURM_LOCALID")?,
            nodeid: num("SLURM_NODEID")?,
            node_name,
            step_nodes,
            job_nodes,
            ntasks: match num("SLURM_STEP_NUM_TASKS")? {
                Some(n) => Some(n),
                None => num("SLURM_NTASKS")?,
            },
            tasks_per_node: match get("SLURM_STEP_TASKS_PER_NODE")
                .or_else(|| get("SLURM_TASKS_PER_NODE"))
            {
                Some(t) => expand_tasks_per_node(&t)?,
                None => Vec::new(),
            },
            restart_count: num("SLURM_RESTART_COUNT")?.unwrap_or(0),
            cpus_per_task: num("SLURM_CPUS_PER_TASK")?,
            gpus_on_node: num("SLURM_GPUS_ON_NODE")?,
            batch_env: get("ENVIRONMENT").as_deref() == Some("BATCH"),
        })
    }

    /// Whether this process runs inside a Slurm job.
    pub fn in_job(&self) -> bool {
        self.job_id.is_some()
    }

    /// Whether this process is the batch script of an sbatch job (not a task
    /// of a step, not an interactive `salloc` shell).
    pub fn in_batch_script(&self) -> bool {
        self.in_job() && self.batch_env && !self.in_step()
    }

    /// Whether this process is a task of a step (not the batch script,
    /// whose step id is unset, `batch` or 4294967294).
    pub fn in_step(&self) -> bool {
        self.in_job()
            && self.procid.is_some()
            && self
                .step_id
                .as_deref()
                .is_some_and(|s| !matches!(s, "batch" | "extern" | "4294967294" | "4294967295"))
    }

    /// The rendezvous port for an attempt: derived from the job id so that
    /// every task of a step agrees without talking, and different for each
    /// attempt so a restart never reuses a port a dying attempt may hold.
    ///
    /// The range 20000..32000 stays below Linux's default ephemeral range
    /// (32768-60999, `net.ipv4.ip_local_port_range`): a port in that range
    /// may be held at any moment by some outgoing connection (an RPC to
    /// slurmctld, an agent's heartbeat), and the trainer's `bind` would fail
    /// with EADDRINUSE. Seen on the testbed before this was narrowed.
    pub fn master_port(job_id: &str, attempt: u32) -> u16 {
        // FNV-1a over the job id picks the job's place in 20000..=31999;
        // each attempt steps by a prime coprime with the range's width, so
        // the attempts of one job never reuse a port before 12,000 restarts.
        const WIDTH: u64 = 12_000;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in job_id.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (20000 + (h % WIDTH + u64::from(attempt) * 7919) % WIDTH) as u16
    }

    /// The torchrun-compatible variables for the trainer, computed from the
    /// step. Variables the user set already are not overridden (the caller
    /// checks); `attempt` picks the MASTER_PORT.
    pub fn torchrun_env(&self, attempt: u32) -> BTreeMap<&'static str, String> {
        let mut env = BTreeMap::new();
        if !self.in_step() {
            return env;
        }
        if let Some(r) = self.procid {
            env.insert("RANK", r.to_string());
        }
        if let Some(l) = self.localid {
            env.insert("LOCAL_RANK", l.to_string());
        }
        if let Some(n) = self.ntasks {
            env.insert("WORLD_SIZE", n.to_string());
        }
        if let Some(n) = self.nodeid {
            env.insert("NODE_RANK", n.to_string());
            env.insert("GROUP_RANK", n.to_string());
            if let Some(t) = self.tasks_per_node.get(n as usize) {
                env.insert("LOCAL_WORLD_SIZE", t.to_string());
            }
        }
        if let Some(first) = self.step_nodes.first() {
            env.insert("MASTER_ADDR", first.clone());
        }
        if let Some(j) = &self.job_id {
            env.insert("MASTER_PORT", Self::master_port(j, attempt).to_string());
        }
        env
    }
}

/// The torchrun variables to give the trainer.
///
/// - In a Slurm step: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
///   NODE_RANK, GROUP_RANK from Slurm (authoritative: an outer resilio or
///   shell may have leaked other values), MASTER_ADDR (first node of the step)
///   and MASTER_PORT (from the job id and attempt) unless already set.
/// - Outside Slurm: nothing. Several local ranks have them from the local
///   launcher (`--ntasks N`), as torchrun's ranks do; one rank runs as it
///   would without resilio (a framework that starts its own processes,
///   Lightning's, takes `LOCAL_RANK` for a launcher that started them).
/// - In a batch script that is not a step: nothing (its environment would
///   leak into every `srun` task).
pub fn trainer_env(
    ctx: &SlurmContext,
    attempt: u32,
    is_set: &dyn Fn(&str) -> bool,
) -> Vec<(&'static str, String)> {
    if ctx.in_step() {
        ctx.torchrun_env(attempt)
            .into_iter()
            .filter(|(k, _)| !(matches!(*k, "MASTER_ADDR" | "MASTER_PORT") && is_set(k)))
            .collect()
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn ctx(vars: &[(&str, &str)]) -> Result<SlurmContext, String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        SlurmContext::from_lookup(&move |k| m.get(k).cloned())
    }

    #[test]
    fn a_task_of_a_multi_node_step() {
        let c = ctx(&[
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "5"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
            ("SLURMD_NODENAME", "gpu003"),
            ("SLURM_JOB_NODELIST", "gpu[001-004]"),
            ("SLURM_STEP_NODELIST", "gpu[001-003]"),
            ("SLURM_STEP_NUM_TASKS", "6"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x3)"),
            ("SLURM_RESTART_COUNT", "1"),
        ])
        .unwrap();
        assert_eq!(c.step_nodes, ["gpu001", "gpu002", "gpu003"]);
        assert_eq!(c.job_nodes.len(), 4);
        assert_eq!(c.restart_count, 1);
        let env = c.torchrun_env(1);
        assert_eq!(env["RANK"], "5");
        assert_eq!(env["LOCAL_RANK"], "1");
        assert_eq!(env["WORLD_SIZE"], "6");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(env["NODE_RANK"], "2");
        assert_eq!(env["MASTER_ADDR"], "gpu001");
        let port: u16 = env["MASTER_PORT"].parse().unwrap();
        assert!((20000..32000).contains(&port));
        assert_ne!(
            c.torchrun_env(2)["MASTER_PORT"],
            env["MASTER_PORT"],
            "fresh port per attempt"
        );
        assert_eq!(
            c.torchrun_env(1)["MASTER_PORT"],
            env["MASTER_PORT"],
            "all tasks agree"
        );
    }

    #[test]
    fn the_rendezvous_port_stays_out_of_the_ephemeral_range() {
        for job in 1..2000u32 {
            for attempt in 0..4 {
                let p = SlurmContext::master_port(&job.to_string(), attempt);
                assert!(
                    (20000..32768).contains(&p),
                    "job {job} attempt {attempt}: {p}"
                );
            }
            let ports: std::collections::BTreeSet<u16> = (0..50)
                .map(|a| SlurmContext::master_port(&job.to_string(), a))
                .collect();
            assert_eq!(ports.len(), 50, "job {job}: an attempt reused a port");
        }
    }

    #[test]
    fn no_slurm_no_variables_and_bad_values_are_errors() {
        let c = ctx(&[]).unwrap();
        assert!(!c.in_job() && c.torchrun_env(0).is_empty());
        assert!(ctx(&[("SLURM_JOB_ID", "1"), ("SLURM_PROCID", "x")])
            .unwrap_err()
            .contains("SLURM_PROCID"));
        assert!(ctx(&[("SLURM_JOB_NODELIST", "n[1-")])
            .unwrap_err()
            .contains("SLURM_JOB_NODELIST"));
        assert!(ctx(&[("SLURM_JOB_ID", "1;rm")]).is_err());
        // The batch script is in the job but not a task of a step.
        let b = ctx(&[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "batch"),
        ])
        .unwrap();
        assert!(b.in_job() && !b.in_step());
    }

    #[test]
    fn user_settings_are_kept_where_they_may_be() {
        let step = ctx(&[
            ("SLURM_JOB_ID", "5"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
        ])
        .unwrap();
        let set = |k: &str| matches!(k, "MASTER_PORT" | "RANK");
        let env: BTreeMap<_, _> = trainer_env(&step, 0, &set).into_iter().collect();
        assert_eq!(env["RANK"], "1", "Slurm's rank wins over a leaked RANK");
        assert!(!env.contains_key("MASTER_PORT"), "the user's port is kept");
        assert_eq!(env["MASTER_ADDR"], "n1");
        let local = ctx(&[]).unwrap();
        assert!(
            trainer_env(&local, 0, &set).is_empty(),
            "outside Slurm the local launcher gives them, to several ranks only"
        );
        let batch = ctx(&[("SLURM_JOB_ID", "5"), ("SLURM_JOB_NODELIST", "n1")]).unwrap();
        assert!(trainer_env(&batch, 0, &set).is_empty());
    }

    #[test]
    fn tasks_per_node_forms() {
        assert_eq!(expand_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(expand_tasks_per_node("4").unwrap(), [4]);
        assert!(expand_tasks_per_node("2(x").is_err());
    }
}
