//! The one-prefix form: a batch script whose only resilio is `srun ...
//! resilio run -- CMD`. No job-level supervisor runs above the step, so
//! after a failure the step's own agents judge it and decide (a requeue
//! excluding the blamed node, or a stop), with the job level's own code
//! ([`super::batch::after_attempt`], without an allocation to relaunch in:
//! that stays the job level's privilege).
//!
//! Exactly one agent decides each attempt:
//! - the coordinator's host (rank 0's agent) while it lives: it waits until
//!   every rank has exited or gone silent (the coordinator's view), then
//!   decides;
//! - an agent that could not report its end to the coordinator (the host
//!   died, with its node) or that waited [`HOLD`] for a decision in vain:
//!   it waits for the ranks' `rank_exit` records (at most [`SETTLE`]) and
//!   decides from the journal.
//!
//! Whoever decides first claims the attempt with a file created with
//! `O_EXCL` in the job's state directory ([`Claim`]); the others see the
//! claim and leave it. The decision is marked done with a second file, which
//! the agents of failed ranks wait for before they exit, so that srun (with
//! `--kill-on-bad-exit`) does not kill the decider first.

use crate::event::Event;
use crate::journal::{self, Record};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Exported to the steps by a job-level `resilio run` (the batch script's):
/// the job level decides, the ranks do not. Its value is the job level's
/// state dir, where the ranks journal ([`job_level_state_dir`]).
pub const ENV_JOB_LEVEL: &str = "RESILIO_JOB_LEVEL";

/// The job level's own state dir, as it exports it in [`ENV_JOB_LEVEL`]
/// (an absolute path; older job levels exported `1`).
pub fn job_level_state_dir() -> Option<PathBuf> {
    std::env::var_os(ENV_JOB_LEVEL)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// How long the agent of a failed rank waits for the decision before it
/// decides itself (the host may have died after the rank reported).
pub const HOLD: Duration = Duration::from_secs(90);

/// How long a deciding agent without the coordinator waits for the other
/// ranks' `rank_exit` records; the ranks still without one are judged as
/// agents that died (with their nodes).
pub const SETTLE: Duration = Duration::from_secs(15);

/// Who this agent is in the one-prefix form's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// A job level decides (or there is no Slurm step): nothing to do here.
    None,
    /// The coordinator's host, or the only rank of the step.
    Host,
    /// Any other rank of the step: decides only when the host cannot.
    Rank,
}

/// What decides this agent's part: facts read from the environment.
#[derive(Clone, Copy, Debug)]
pub struct Where {
    /// A task of a Slurm step (not the batch script, not local mode).
    pub in_step: bool,
    /// A job-level `resilio run` is above the step ([`ENV_JOB_LEVEL`]).
    pub job_level: bool,
    /// Started by the local launcher (`resilio run --ntasks N`).
    pub local_launcher: bool,
    /// This agent hosts the job's coordinator.
    pub hosts: bool,
    pub world_size: u32,
}

/// The part: pure. Without a coordinator there is no host: every rank
/// is a candidate and the claim picks one.
pub fn part(w: Where) -> Part {
    if !w.in_step || w.job_level || w.local_launcher {
        Part::None
    } else if w.hosts || w.world_size <= 1 {
        Part::Host
    } else {
        Part::Rank
    }
}

/// The ranks of `attempt` (below `world`) that have no `rank_exit` in the
/// journal yet: pure.
pub fn not_exited(records: &[Record], attempt: u32, world: u32) -> Vec<u32> {
    let mut exited = vec![false; world as usize];
    for (r, e) in journal::events(records).filter(|(r, _)| r.attempt == attempt) {
        if let (Event::RankExit(_), Some(rank)) = (e, r.rank) {
            if let Some(x) = exited.get_mut(rank as usize) {
                *x = true;
            }
        }
    }
    (0..world).filter(|r| !exited[*r as usize]).collect()
}

/// The first non-zero exit code a rank of `attempt` journaled: the step's
/// exit code as srun would give it.
pub fn step_exit_code(records: &[Record], attempt: u32) -> Option<i32> {
    journal::events(records)
        .filter(|(r, _)| r.attempt == attempt && r.rank.is_some())
        .find_map(|(_, e)| match e {
            Event::RankExit(x) => Some(x.exit_code).filter(|c| *c != 0),
            _ => None,
        })
}

/// The claim of one attempt's decision: a file created with `O_EXCL`.
pub struct Claim {
    path: PathBuf,
}

fn stem(run: Option<&str>, attempt: u32) -> String {
    let run: String = run
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(64)
        .collect();
    if run.is_empty() {
        format!("decider-a{attempt}")
    } else {
        format!("decider-{run}-a{attempt}")
    }
}

impl Claim {
    /// Claim `attempt`'s decision: `Ok(None)` when another agent has.
    pub fn take(
        job_dir: &Path,
        run: Option<&str>,
        attempt: u32,
        who: &str,
    ) -> std::io::Result<Option<Claim>> {
        let path = job_dir.join(format!("{}.claim", stem(run, attempt)));
        let mut f = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
            Err(e) => return Err(e),
        };
        let _ = writeln!(f, "{who}");
        let _ = f.sync_all();
        Ok(Some(Claim { path }))
    }

    /// The decision was taken and carried out: the agents waiting for it
    /// may exit.
    pub fn done(self, what: &str) {
        let done = self.path.with_extension("done");
        let tmp = self.path.with_extension("done.tmp");
        let written =
            std::fs::write(&tmp, format!("{what}\n")).and_then(|_| std::fs::rename(&tmp, &done));
        if let Err(e) = written {
            tracing::warn!("cannot mark the decision done ({}): {e}", done.display());
        }
    }
}

/// Whether `attempt`'s decision was taken and carried out.
pub fn decided(job_dir: &Path, run: Option<&str>, attempt: u32) -> bool {
    job_dir
        .join(format!("{}.done", stem(run, attempt)))
        .exists()
}

/// Whether someone claimed `attempt`'s decision.
pub fn claimed(job_dir: &Path, run: Option<&str>, attempt: u32) -> bool {
    job_dir
        .join(format!("{}.claim", stem(run, attempt)))
        .exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Writer;
    use serde_json::json;

    fn w(in_step: bool, job_level: bool, hosts: bool, world_size: u32) -> Where {
        Where {
            in_step,
            job_level,
            local_launcher: false,
            hosts,
            world_size,
        }
    }

    #[test]
    fn only_a_step_without_a_job_level_decides_and_the_host_first() {
        assert_eq!(part(w(false, false, true, 4)), Part::None);
        assert_eq!(part(w(true, true, false, 4)), Part::None);
        assert_eq!(part(w(true, true, true, 1)), Part::None);
        assert_eq!(part(w(true, false, true, 4)), Part::Host);
        assert_eq!(part(w(true, false, false, 4)), Part::Rank);
        assert_eq!(part(w(true, false, false, 1)), Part::Host);
        let local = Where {
            local_launcher: true,
            ..w(true, false, true, 4)
        };
        assert_eq!(part(local), Part::None);
    }

    #[test]
    fn ranks_without_a_rank_exit_of_the_attempt_are_not_exited() {
        let dir = tempfile::tempdir().unwrap();
        for (rank, attempt) in [(0, 0), (2, 0), (1, 1)] {
            let mut w = Writer::open(
                dir.path(),
                &format!("rank-{rank}.jsonl"),
                attempt,
                Some(rank),
                Some("n1".into()),
            );
            w.record("rank_exit", json!({"exit_code": 1 + rank as i32}), true);
        }
        let records = journal::read_job(dir.path()).unwrap().records;
        assert_eq!(not_exited(&records, 0, 3), vec![1]);
        assert_eq!(not_exited(&records, 1, 3), vec![0, 2]);
        assert_eq!(not_exited(&records, 0, 1), Vec::<u32>::new());
        assert_eq!(step_exit_code(&records, 1), Some(2));
        assert!(step_exit_code(&records, 2).is_none());
    }

    #[test]
    fn one_claim_per_attempt_and_run_and_done_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let first = Claim::take(d, Some("r1"), 0, "rank 1 on n2").unwrap();
        assert!(first.is_some());
        assert!(Claim::take(d, Some("r1"), 0, "rank 0 on n1")
            .unwrap()
            .is_none());
        assert!(claimed(d, Some("r1"), 0) && !decided(d, Some("r1"), 0));
        // Another attempt, another run: claims of their own.
        assert!(Claim::take(d, Some("r1"), 1, "x").unwrap().is_some());
        assert!(Claim::take(d, None, 0, "x").unwrap().is_some());
        first.unwrap().done("requeue");
        assert!(decided(d, Some("r1"), 0));
        assert!(!decided(d, Some("r1"), 1));
        // A run key cannot leave the directory.
        assert_eq!(stem(Some("../../x y"), 3), "decider-xy-a3");
    }

    #[test]
    fn claims_race_to_exactly_one_winner() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let winners: usize = (0..16)
            .map(|i| {
                let d = d.clone();
                std::thread::spawn(move || {
                    Claim::take(&d, None, 0, &format!("rank {i}"))
                        .unwrap()
                        .is_some() as usize
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(winners, 1);
    }
}
