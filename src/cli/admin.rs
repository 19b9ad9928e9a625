//! `resilio admin`: site administration.

use super::usage;
use crate::error::Result;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub(super) enum AdminCommand {
    /// Make DIR a state dir shared by every user (1777, like /tmp) with its
    /// users/ directory owned by you (root, or DIR's owner); or check one
    InitStateDir {
        /// The directory (made if missing)
        dir: PathBuf,
        /// Also make each local account's own directory (root and uids
        /// 1000-59999 in the passwd database), so that no user can take
        /// another's name first; one already taken is moved aside. Run
        /// again when accounts are added (root only).
        #[arg(long)]
        for_users: bool,
    },
}

pub(super) fn admin_cmd(a: AdminCommand) -> Result<i32> {
    let AdminCommand::InitStateDir { dir, for_users } = a;
    let done = crate::state_dir::init_shared(&dir).map_err(usage)?;
    println!("{done}");
    if for_users {
        if !nix::unistd::geteuid().is_root() {
            return Err(usage(
                "--for-users: only root can make other users' directories",
            ));
        }
        for line in crate::state_dir::make_user_dirs(&dir, &crate::state_dir::local_accounts()) {
            println!("{}", crate::util::terminal_safe(&line));
        }
    }
    Ok(0)
}
