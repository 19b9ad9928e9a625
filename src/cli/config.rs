//! `resilio config check`.

use crate::config::Config;
use crate::error::Result;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(super) struct ConfigArgs {
    #[command(subcommand)]
    action: ConfigAction,
}

#[derive(Subcommand, Debug)]
pub(super) enum ConfigAction {
    /// Load the system configuration and FILE over it as `resilio run
    /// --config FILE` would: `ok` and the files read, or the first error
    /// (file:line) and exit 2
    Check {
        /// A user configuration file to check too
        file: Option<PathBuf>,
    },
    /// Print the configuration `resilio run --config FILE` would use, every
    /// key with where its value came from (built-in default, file:line,
    /// environment)
    Show {
        /// A user configuration file, applied over the system one
        file: Option<PathBuf>,
    },
}

/// `resilio config check [FILE]`.
pub(super) fn config_cmd(a: ConfigArgs) -> Result<i32> {
    match a.action {
        ConfigAction::Check { file } => {
            Config::load(file.as_deref())?;
            let system = crate::config::system_file()?;
            let read: Vec<String> = system
                .iter()
                .chain(file.iter())
                .map(|p| p.display().to_string())
                .collect();
            if read.is_empty() {
                println!("ok: no configuration file (the built-in defaults)");
            } else {
                println!("ok: {}", read.join(", "));
            }
            Ok(0)
        }
        ConfigAction::Show { file } => {
            print!("{}", crate::config::show(file.as_deref())?);
            Ok(0)
        }
    }
}
