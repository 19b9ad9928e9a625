//! After a rank's end, what its agent does for the job: in the one-prefix
//! form (`srun ... resilio run -- CMD` with no job-level `resilio run`
//! above the step) one of the step's agents judges the step and decides
//! (see [`super::step_level`] for who, and why one); a rank that is the
//! whole job records the job's end.

use super::batch::Next;
use super::step_level::{self, Claim, Part, Where};
use super::supervisor::SILENT_STEP;
use crate::context::env_is_set;
use crate::event as ev;
use crate::journal::{self, Writer};
use crate::policy::failure::Verdict;
use crate::rank::{Agent, Finished};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(200);

/// After the rank's end: the step's decision, or the job's end where this
/// agent owns the job; resilio's exit code (the rank's own).
pub(crate) async fn after_rank(fin: Finished<'_>) -> i32 {
    let code = fin.ending.code();
    let mut a = fin.agent;
    let part = step_part(&a);
    if part != Part::None {
        let next = decide_for_step(
            &mut a,
            part,
            code,
            &fin.verdict,
            fin.ending.pre_timeout,
            fin.reported,
        )
        .await;
        return match next {
            Next::Exit(code) => code,
            // The one-prefix form has no allocation to relaunch in.
            Next::Relaunch(_) => code,
        };
    }
    if a.rank.owns_job {
        a.rank.journal.write(
            ev::JobEnd {
                exit_code: code,
                reason: None,
            },
            true,
        );
    } else if a.launcher_lost && a.rank.id.rank == 0 {
        // The launcher that would have ended the job is gone: the
        // journal gets its end from rank 0, the rank whose end a
        // torchrun job's status follows.
        a.rank.journal.write(
            ev::JobEnd {
                exit_code: code,
                reason: Some(format!(
                    "rank 0 ended (exit code {code}) after the launcher died"
                )),
            },
            true,
        );
    }
    code
}

/// This agent's part in the step's decision.
fn step_part(a: &Agent<'_>) -> Part {
    let r = &a.rank;
    step_level::part(Where {
        in_step: r.slurm.in_step(),
        job_level: env_is_set(step_level::ENV_JOB_LEVEL),
        local_launcher: env_is_set(crate::context::ENV_LAUNCHER),
        hosts: r.hosted.is_some(),
        world_size: r.id.world_size,
    })
}

/// Decide on the step (or leave it to the agent that does), then exit
/// with the rank's own code. `reported`: the rank's end reached a live
/// coordinator, whose host will decide.
async fn decide_for_step(
    a: &mut Agent<'_>,
    part: Part,
    code: i32,
    verdict: &Verdict,
    pre_timeout: bool,
    reported: bool,
) -> Next {
    match part {
        Part::None => return Next::Exit(code),
        Part::Host => wait_for_the_step(a).await,
        Part::Rank if code == 0 => return Next::Exit(code),
        Part::Rank => {
            // A failed rank stays until the step is decided (srun
            // with --kill-on-bad-exit would kill the host if it went),
            // and decides itself when nobody else could.
            if reported && wait_for_decision(a, step_level::HOLD).await {
                return Next::Exit(code);
            }
        }
    }
    let (job_dir, attempt) = (a.rank.job_dir.clone(), a.rank.id.attempt);
    let run = a.rank.journal.run().map(str::to_string);
    let who = format!("rank {} on {}", a.rank.id.rank, a.rank.id.node);
    let claim = match Claim::take(&job_dir, run.as_deref(), attempt, &who) {
        Ok(Some(c)) => c,
        Ok(None) => {
            if code != 0 {
                wait_for_decision(a, step_level::HOLD).await;
            }
            return Next::Exit(code);
        }
        Err(e) => {
            tracing::warn!(
                "cannot claim the step's decision in {}: {e}; nobody requeues this job",
                job_dir.display()
            );
            return Next::Exit(code);
        }
    };
    if part == Part::Rank {
        wait_for_exits(a, step_level::SETTLE).await;
    }
    // Without an allocation to relaunch in, the decision is an exit
    // (the job finishes, stops, or was requeued): the rank's own code.
    let next = decide_step(a, code, verdict, pre_timeout);
    claim.done(&format!("{next:?}"));
    Next::Exit(code)
}

/// The host: until every rank has exited or gone silent
/// ([`SILENT_STEP`]), the coordinator serving meanwhile.
async fn wait_for_the_step(a: &mut Agent<'_>) {
    let Some(c) = &a.rank.hosted else {
        return;
    };
    loop {
        while c.effects.try_recv().is_ok() {}
        let over = c.with_view(|v| (v.step_over(Instant::now(), SILENT_STEP), Vec::new()));
        if let Some(silent) = over {
            if !silent.is_empty() {
                tracing::warn!(
                    "deciding without ranks {:?}: not heard from for {}s",
                    silent.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
                    SILENT_STEP.as_secs()
                );
            }
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Until the decision on this attempt is done, at most `limit`: whether it is.
async fn wait_for_decision(a: &Agent<'_>, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let run = a.rank.journal.run().map(str::to_string);
    loop {
        if step_level::decided(&a.rank.job_dir, run.as_deref(), a.rank.id.attempt) {
            return true;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                "no decision on attempt {} after {}s: this agent decides",
                a.rank.id.attempt,
                limit.as_secs()
            );
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Without the coordinator: until every rank of the attempt journaled
/// its end, at most `limit` (the others' agents died with their nodes).
async fn wait_for_exits(a: &Agent<'_>, limit: Duration) {
    let deadline = Instant::now() + limit;
    let world = a.rank.id.world_size;
    loop {
        let records = records(a);
        if step_level::not_exited(&records, a.rank.id.attempt, world).is_empty()
            || Instant::now() >= deadline
        {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

fn records(a: &Agent<'_>) -> Vec<journal::Record> {
    journal::read_job(&a.rank.job_dir)
        .map(|j| crate::runs::of_key(j.records, a.rank.journal.run()))
        .unwrap_or_default()
}

/// Judge the step from every rank's journal and decide, as the job
/// level would without an allocation to relaunch in: requeue (the
/// blamed node excluded), stop, or finish. Journaled in `decider.jsonl`.
fn decide_step(a: &mut Agent<'_>, code: i32, verdict: &Verdict, pre_timeout: bool) -> Next {
    let records = records(a);
    let r = &mut *a.rank;
    let attempt = r.id.attempt;
    let exit_code = step_level::step_exit_code(&records, attempt).unwrap_or(code);
    let step = super::judge::StepEnd {
        ended: crate::util::clock::now(),
        exit_code,
        verdict,
        tail: &[],
        node: &r.id.node,
        pre_timeout,
        agents: &[],
    };
    let mut w = Writer::open(
        &r.job_dir,
        "decider.jsonl",
        attempt,
        None,
        Some(r.id.node.clone()),
    )
    .with_run(r.journal.run());
    super::batch::after_attempt(
        &r.cfg.state_dir,
        &r.id.job,
        attempt,
        &step,
        r.cfg.budget(),
        r.cfg.observe,
        None,
        a.slurm_cli,
        &mut w,
    )
}
