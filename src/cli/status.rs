//! `resilio status` and `resilio checkpoint`: the live job, through its coordinator.

use super::{flag_duration, state_dir_of};
use crate::error::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(super) struct StatusArgs {
    /// Job id (default: the most recently written job)
    job: Option<String>,
    /// Machine-readable output
    #[arg(long)]
    json: bool,
    /// Where journals live [env: RESILIO_STATE_DIR]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(super) struct CheckpointArgs {
    #[command(flatten)]
    common: StatusArgs,
    /// Why (journaled with the request)
    #[arg(long, default_value = "operator")]
    reason: String,
    /// How long to wait for the ranks to confirm (0: do not wait)
    #[arg(long, value_name = "DUR", default_value = "30s")]
    wait: String,
}

pub(super) fn status_cmd(a: &StatusArgs) -> Result<i32> {
    crate::status::status_cmd(&state_dir_of(&a.state_dir)?, a.job.as_deref(), a.json)
}

pub(super) fn checkpoint_cmd(a: &CheckpointArgs) -> Result<i32> {
    crate::status::checkpoint_cmd(
        &state_dir_of(&a.common.state_dir)?,
        a.common.job.as_deref(),
        &a.reason,
        flag_duration("wait", &a.wait)?,
        a.common.json,
    )
}
