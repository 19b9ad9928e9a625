//! The rollback a decision to run again leaves for the next attempt
//! (`JOB_DIR/rollback.json`, read by its agents as `RESILIO_ROLLBACK_STEP`
//! and `RESILIO_SKIP_STEPS`): worked out from the journal and the decision
//! ([`plan_rollback`], pure), journaled and written ([`leave_rollback`]).

use super::decide::Decision;
use crate::event as ev;
use crate::journal::{self, Writer};
use crate::policy::restart::Action;

/// After a decision to run again on a rollback: work the rollback out from
/// the journal, journal it and leave it for the next attempt's agents
/// (`JOB_DIR/rollback.json`, replaced whole). Nothing for other decisions.
pub fn leave_rollback(
    job_dir: &std::path::Path,
    records: &[crate::journal::Record],
    d: &Decision,
    journal: &mut Writer,
) {
    let Some(rb) = plan_rollback(records, d) else {
        return;
    };
    journal.write(
        ev::RollbackPlanned {
            for_attempt: rb.for_attempt,
            checkpoint_step: rb.checkpoint_step,
            skip_steps: rb.skip_steps(),
            detail: rb.detail.clone(),
            avoid: (!rb.avoid.is_empty()).then(|| rb.avoid.clone()),
        },
        true,
    );
    let path = job_dir.join(journal::ROLLBACK_FILE);
    let tmp = job_dir.join(format!(
        ".{}.{}",
        journal::ROLLBACK_FILE,
        std::process::id()
    ));
    let written = serde_json::to_vec(&rb)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&tmp, b))
        .and_then(|_| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        tracing::warn!(
            "cannot leave the rollback for the next attempt in {}: {e}",
            path.display()
        );
    }
}

/// The rollback a decision to run again leaves for the next attempt
/// (`None` when it needs none): after a numerical failure whose action is
/// a rollback, the last whole checkpoint confirmed before the bad values
/// began and the steps whose data led to them; after a failure blamed on
/// the checkpoint it restored, the whole checkpoint before that one; and
/// whenever the newest whole checkpoint is one blamed, the newest not
/// blamed. A blamed checkpoint is never the one to load.
pub(super) fn plan_rollback(
    records: &[crate::journal::Record],
    d: &Decision,
) -> Option<journal::Rollback> {
    if matches!(d.action, Action::Stop { .. } | Action::Finish) {
        return None;
    }
    let attempt = d.outcome.attempt;
    let blamed = |step: u64, confirmed_in: u32| {
        crate::policy::restore::is_blamed(&d.blamed, step, confirmed_in)
    };
    let mut whole: Vec<u64> = Vec::new();
    let mut avoid: Vec<u64> = Vec::new();
    for (r, c) in journal::whole_checkpoints(records) {
        let Some(step) = c.step else { continue };
        if blamed(step, r.attempt) {
            avoid.push(step);
        } else {
            whole.push(step);
        }
    }
    avoid.sort_unstable();
    avoid.dedup();
    let newest_blamed = avoid.last().is_some_and(|a| whole.iter().all(|w| w < a));
    // The newest checkpoint its files showed incomplete or stale: what a
    // trainer resuming from its latest would load (trial 18: a torn save
    // was, and the failure after it blamed the whole one before it).
    let unsound = journal::unsound_checkpoint_steps(records);
    let newest_unsound = unsound
        .last()
        .copied()
        .filter(|u| whole.iter().all(|w| w < u) && avoid.iter().all(|a| a < u));
    let numerical = d.outcome.is_rollback() && d.suspect.is_none();
    if !numerical && d.suspect.is_none() && !newest_blamed && newest_unsound.is_none() {
        return None;
    }
    let blamed_list = avoid.clone();
    avoid.extend(
        unsound
            .iter()
            .copied()
            .filter(|u| whole.iter().all(|w| w < u)),
    );
    avoid.sort_unstable();
    avoid.dedup();
    let (since, at) = if numerical {
        bad_steps(records, attempt)
    } else {
        (None, None)
    };
    let limit = since.or(d.suspect);
    let before = whole
        .iter()
        .copied()
        .filter(|s| limit.is_none_or(|b| *s < b))
        .max();
    // Checkpoints there are, but none that may be loaded: 0 says so (start
    // from scratch). Left unset, the trainer would load the latest (trial 14).
    let any = !whole.is_empty() || !avoid.is_empty();
    let checkpoint_step = before.or(any.then_some(0));
    let detail = if numerical {
        d.outcome.detail.clone()
    } else {
        not_to_load(&avoid, &blamed_list)
    };
    Some(journal::Rollback {
        for_attempt: attempt + 1,
        checkpoint_step,
        skip_from: since,
        skip_to: at,
        detail,
        avoid,
    })
}

/// The first bad step and the finding's step of the numerical failure
/// `attempt` was stopped for with a rollback.
fn bad_steps(records: &[crate::journal::Record], attempt: u32) -> (Option<u64>, Option<u64>) {
    let finding = records.iter().rev().find_map(|r| match r.event() {
        Some(ev::Event::Numerical(n))
            if r.attempt == attempt
                && n.action == Some(crate::policy::numerical::Act::Rollback) =>
        {
            Some(n)
        }
        _ => None,
    });
    finding
        .as_ref()
        .map_or((None, None), |n| (n.since_step.or(n.step), n.step))
}

/// Why the checkpoints `avoid` are not to be loaded: `blamed` ones for a
/// failure after their restore, the others for their files.
fn not_to_load(avoid: &[u64], blamed: &[u64]) -> String {
    let steps = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    let torn: Vec<u64> = avoid
        .iter()
        .copied()
        .filter(|a| !blamed.contains(a))
        .collect();
    let mut parts = Vec::new();
    if !blamed.is_empty() {
        parts.push(format!(
            "the checkpoint(s) of step {} (blamed for a failure soon after their restore, or saved from one)",
            steps(blamed)
        ));
    }
    if !torn.is_empty() {
        parts.push(format!(
            "the checkpoint(s) of step {} (their files found incomplete or stale)",
            steps(&torn)
        ));
    }
    format!("not to load: {}", parts.join("; "))
}
