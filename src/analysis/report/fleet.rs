//! The report's failure rate pooled with the node history's, and the
//! checkpoint interval advised from it.

use super::{build, JobReport};

/// Pool this job's failure rate with the fleet's (the node history of the
/// other jobs) for a job of this job's size, and advise on that.
pub fn apply_fleet(r: &mut JobReport, fleet: crate::analysis::node_history::FleetRate) {
    let nodes = r
        .attempts
        .iter()
        .map(|a| a.nodes.len())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let failures = r.failed_attempts as f64 + fleet.failures;
    let exposure = nodes * r.wall_s + fleet.node_seconds;
    if failures > 0.0 && exposure > 0.0 {
        // Failures per node-second, for `nodes` nodes.
        let mttf = exposure / failures / nodes;
        r.mttf_pooled_s = Some(mttf);
        if let Some(d) = r.checkpoints.mean_duration_s {
            r.checkpoint_advice = crate::policy::checkpoint_interval::advise(
                d,
                mttf,
                r.restart_cost(),
                r.checkpoints.mean_interval_s,
            );
        }
    }
    r.fleet = Some(fleet);
}

/// The periodic checkpoint interval to use now (`[coordinator]
/// checkpoint_every = "advised"`): Daly's interval from the job's journal so
/// far and `fleet` (the node history's failure rate, see
/// [`crate::analysis::node_history::fleet_rate`]), with the journal record's data
/// saying why.
pub fn advised_interval(
    state_dir: &std::path::Path,
    job: &str,
    fleet: crate::analysis::node_history::FleetRate,
) -> (
    Option<std::time::Duration>,
    crate::event::CheckpointIntervalAdvised,
) {
    use crate::event::CheckpointIntervalAdvised as Why;
    // The run going on is the latest (a job id used again starts another).
    let records = crate::journal::read_job(&crate::journal::job_dir(state_dir, job))
        .ok()
        .and_then(|j| crate::runs::split(j.records).pop())
        .map(|r| r.records)
        .unwrap_or_default();
    if records.is_empty() {
        return (
            None,
            Why {
                reason: Some("nothing measured yet".into()),
                ..Why::default()
            },
        );
    }
    let mut r = build(job, &records, 0, None);
    apply_fleet(&mut r, fleet);
    match &r.checkpoint_advice {
        Some(a) => (
            Some(std::time::Duration::from_secs_f64(a.optimal_s.max(1.0))),
            Why {
                interval_s: Some(a.optimal_s),
                checkpoint_cost_s: Some(a.checkpoint_cost_s),
                mttf_s: Some(a.mtbf_s),
                expected_ettr: Some(a.ettr_at_optimal),
                pooled_with_node_history: Some(r.mttf_pooled_s.is_some()),
                ..Why::default()
            },
        ),
        None => (
            None,
            Why {
                reason: Some(
                    if r.checkpoints.mean_duration_s.is_none() {
                        "no checkpoint cost measured yet (phase=checkpoint then checkpoint_done)"
                    } else {
                        "no failure rate known yet"
                    }
                    .into(),
                ),
                ..Why::default()
            },
        ),
    }
}
