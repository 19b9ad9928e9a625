//! Who this rank is: job id, attempt, rank, node, world size, from flags and
//! the environment (Slurm's, torchrun's, or resilio's own when nested).

use crate::journal::validate_job_id;
use std::ffi::OsStr;

/// The identity of one supervised rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Job id: `--job-id`, else `SLURM_JOB_ID`, else `RESILIO_JOB_ID`, else generated.
    pub job: String,
    /// Attempt: `RESILIO_ATTEMPT`, else `SLURM_RESTART_COUNT`, else 0.
    pub attempt: u32,
    /// Rank: `SLURM_PROCID`, else `RANK`, else 0.
    pub rank: u32,
    /// Number of ranks: `SLURM_NTASKS`, else `WORLD_SIZE`, else 1.
    pub world_size: u32,
    /// Node name: `SLURMD_NODENAME`, else the host name.
    pub node: String,
    /// The run key stamped on the journal's records, and whether this
    /// process starts the run (see [`crate::runs::resolve`]).
    pub run: crate::runs::RunKey,
}

fn env_u32(lookup: &dyn Fn(&str) -> Option<String>, keys: &[&str]) -> Option<u32> {
    keys.iter()
        .find_map(|k| lookup(k).and_then(|v| v.trim().parse().ok()))
}

impl Identity {
    /// Resolve from the process environment.
    pub fn from_env(job_flag: Option<&str>) -> Result<Identity, String> {
        Self::resolve(job_flag, &|k| {
            std::env::var(k).ok().filter(|v| !v.is_empty())
        })
    }

    /// Resolve with an injected environment (for tests).
    pub fn resolve(
        job_flag: Option<&str>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Identity, String> {
        let job = match job_flag {
            Some(j) => j.to_string(),
            None => match lookup("SLURM_JOB_ID").or_else(|| lookup("RESILIO_JOB_ID")) {
                Some(j) => j,
                None => format!(
                    "local-{}-{}",
                    chrono::Utc::now().format("%Y%m%d-%H%M%S"),
                    std::process::id()
                ),
            },
        };
        validate_job_id(&job)?;
        let run = crate::runs::resolve(&job, lookup);
        let node = lookup("SLURMD_NODENAME").unwrap_or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| {
                    h.to_str()
                        .map(|s| s.split('.').next().unwrap_or(s).to_string())
                })
                .unwrap_or_else(|| "localhost".into())
        });
        Ok(Identity {
            job,
            attempt: env_u32(lookup, &["RESILIO_ATTEMPT", "SLURM_RESTART_COUNT"]).unwrap_or(0),
            rank: env_u32(lookup, &["SLURM_PROCID", "RANK"]).unwrap_or(0),
            world_size: env_u32(lookup, &["SLURM_NTASKS", "WORLD_SIZE"])
                .unwrap_or(1)
                .max(1),
            node,
            run,
        })
    }

    /// Variables exported to the trainer so nested tools see the same identity.
    pub fn exported(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("RESILIO_JOB_ID", self.job.clone()),
            ("RESILIO_ATTEMPT", self.attempt.to_string()),
            ("RESILIO_RANK", self.rank.to_string()),
        ];
        if let Some(k) = &self.run.key {
            v.push((crate::runs::ENV_RUN, k.clone()));
        }
        v
    }
}

/// True when `name` is set in the environment (even to an empty string).
pub fn env_is_set(name: impl AsRef<OsStr>) -> bool {
    std::env::var_os(name).is_some()
}

/// Marks an agent started by the local launcher. Its value is
/// [`LAUNCHER_SINGLE`] for the only rank of a one-rank job (which has the
/// terminal to itself), else `1` (ranks share it: whole lines only).
pub const ENV_LAUNCHER: &str = "RESILIO_LOCAL_LAUNCHER";
/// [`ENV_LAUNCHER`]'s value for the agent of a one-rank job.
pub const LAUNCHER_SINGLE: &str = "single";

/// Whether this agent shares its terminal with other ranks' agents (local
/// mode with several ranks): then its output is written in whole lines.
pub fn shares_output() -> bool {
    std::env::var_os(ENV_LAUNCHER).is_some_and(|v| v != LAUNCHER_SINGLE)
}

/// Set by the local launcher under `--label`: the prefix of each of this
/// rank's output lines (`"0: "`, as `srun --label` writes it).
pub const ENV_LABEL: &str = "RESILIO_LABEL";

/// This agent's line prefix, when its output is shared and labelled.
pub fn output_label() -> Option<Vec<u8>> {
    if !shares_output() {
        return None;
    }
    let v = std::env::var_os(ENV_LABEL)?;
    use std::os::unix::ffi::OsStrExt;
    let b = v.as_bytes();
    // A short prefix of printable text only (it goes before every line).
    (!b.is_empty() && b.len() <= 32 && b.iter().all(|c| (0x20..0x7f).contains(c)))
        .then(|| b.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn slurm_environment_wins() {
        let id = Identity::resolve(
            None,
            &with(&[
                ("SLURM_JOB_ID", "4242"),
                ("SLURM_PROCID", "3"),
                ("SLURM_NTASKS", "8"),
                ("SLURM_RESTART_COUNT", "2"),
                ("SLURMD_NODENAME", "n3"),
                ("RANK", "9"),
            ]),
        )
        .unwrap();
        assert_eq!(
            id,
            Identity {
                job: "4242".into(),
                attempt: 2,
                rank: 3,
                world_size: 8,
                node: "n3".into(),
                // A requeue continues the job's run.
                run: crate::runs::RunKey {
                    key: Some("slurm-4242+2".into()),
                    fresh: false
                },
            }
        );
    }

    #[test]
    fn flag_and_torchrun_variables() {
        let id =
            Identity::resolve(Some("mine"), &with(&[("RANK", "1"), ("WORLD_SIZE", "2")])).unwrap();
        assert_eq!(
            (id.job.as_str(), id.rank, id.world_size, id.attempt),
            ("mine", 1, 2, 0)
        );
        let id = Identity::resolve(None, &with(&[])).unwrap();
        assert!(id.job.starts_with("local-"));
        assert!(Identity::resolve(Some("../etc"), &with(&[])).is_err());
    }
}
