//! `resilio nodes`: the node history across jobs, for admins.

use super::{flag_timeout, state_dir_of, usage};
use crate::error::{Error, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(super) struct NodesArgs {
    /// Machine-readable output
    #[arg(long, conflicts_with_all = ["exclude_list", "drain", "prometheus"])]
    json: bool,
    /// Prometheus text format, for node_exporter's textfile collector
    /// (node scores, listed nodes, failures by class, fleet totals)
    #[arg(long, conflicts_with_all = ["exclude_list", "drain"])]
    prometheus: bool,
    /// Print a Slurm hostlist of nodes at or above the threshold (for sbatch --exclude=)
    #[arg(long, conflicts_with = "drain")]
    exclude_list: bool,
    /// Drain the nodes at or above the threshold with scontrol
    #[arg(long)]
    drain: bool,
    /// With --drain: print the commands instead of running them
    #[arg(long, requires = "drain")]
    dry_run: bool,
    /// Score at which a node is listed or drained: a new failure scores 1.0,
    /// halving every half-life, so 0.9 keeps one failure listed for about a
    /// day and two for about a week (with the default half-life)
    #[arg(long, default_value_t = 0.9)]
    threshold: f64,
    /// Time for a failure's weight to halve (e.g. 7d, 72h)
    #[arg(long, default_value = "7d")]
    half_life: String,
    /// Journals only: do not ask sacct for NODE_FAIL records
    #[arg(long)]
    no_sacct: bool,
    /// Where journals live [env: RESILIO_STATE_DIR]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

pub(super) fn nodes_cmd(a: &NodesArgs) -> Result<i32> {
    use crate::analysis::node_history;
    use crate::slurm::SlurmCli;
    let half_life = flag_timeout("half-life", &a.half_life, "")?;
    if !(a.threshold.is_finite() && a.threshold > 0.0) {
        return Err(usage("--threshold must be a positive number"));
    }
    let cli = SlurmCli::default();
    let (history, sources) = node_history::build(
        &state_dir_of(&a.state_dir)?,
        chrono::Utc::now(),
        half_life,
        (!a.no_sacct).then_some(&cli as &dyn crate::slurm::Slurm),
    );
    // What was left out, for every output form (on stderr where stdout is
    // for a machine).
    let left_out: Vec<String> = sources
        .dropped
        .iter()
        .map(|(why, n)| format!("left out: {n} event(s): {why}"))
        .chain(
            sources
                .unread
                .iter()
                .map(|(what, n)| format!("left out: {n} {what}")),
        )
        .collect();
    if a.json || a.exclude_list {
        for l in &left_out {
            crate::say_err!("resilio: {l}");
        }
    }
    if a.json {
        let out =
            serde_json::to_string_pretty(&history).map_err(|e| Error::Other(e.to_string()))?;
        println!("{out}");
        return Ok(0);
    }
    if a.exclude_list {
        println!("{}", node_history::exclude_list(&history, a.threshold));
        return Ok(0);
    }
    if a.prometheus {
        print!(
            "{}",
            node_history::render_prometheus(&history, a.threshold, sources.journals)
        );
        return Ok(0);
    }
    if !a.drain {
        print!(
            "{}",
            crate::util::terminal_safe(&node_history::render(&history, a.threshold))
        );
        println!(
            "sources: {} job journal(s); {}",
            sources.journals,
            match (&sources.sacct_node_failures, &sources.sacct_error) {
                (Some(n), _) => format!("sacct: {n} NODE_FAIL allocation(s)"),
                (None, Some(e)) => format!("sacct not used ({e})"),
                (None, None) => "sacct not asked".into(),
            }
        );
        for l in &left_out {
            println!("{l}");
        }
        return Ok(0);
    }
    drain(&cli, &history, a.threshold, a.dry_run)
}

/// `--drain`: drain each listed node (`--dry-run`: print the commands).
fn drain(
    cli: &crate::slurm::SlurmCli,
    history: &[crate::analysis::node_history::NodeHistory],
    threshold: f64,
    dry_run: bool,
) -> Result<i32> {
    use crate::slurm::{NodeState, Slurm};
    let mut failed = 0;
    for h in history.iter().filter(|h| h.listed(threshold)) {
        let reason: String = format!("resilio: score {:.2}: {}", h.score, h.last_evidence())
            .chars()
            .take(200)
            .collect();
        if dry_run {
            println!(
                "scontrol update NodeName={} State=DRAIN Reason={reason:?}",
                h.node
            );
            continue;
        }
        match cli.set_node_state(&h.node, &NodeState::Drain(reason)) {
            Ok(()) => println!("drained {}", h.node),
            Err(e) => {
                let msg = e.to_string();
                let hint = if msg.contains("ermission")
                    || msg.contains("ccess")
                    || msg.contains("authoriz")
                {
                    " (draining needs root or the SlurmUser)"
                } else {
                    ""
                };
                crate::say_err!("resilio: cannot drain {}: {msg}{hint}", h.node);
                failed += 1;
            }
        }
    }
    Ok(if failed > 0 {
        crate::error::EXIT_NOT_PERMITTED
    } else {
        0
    })
}
