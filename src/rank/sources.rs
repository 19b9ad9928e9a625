//! The progress sources around the trainer: the socket it reports on, the
//! pumps on its output, the progress file and the checkpoint directory.
//! Each fails open: without it, supervision goes on with the others.

use super::supervised::Rank;
use crate::context::Identity;
use crate::progress::{self, output};
use std::path::PathBuf;

/// The progress socket (fail open: without it, output and file still work).
pub(super) fn progress_socket(
    id: &Identity,
    tx: &progress::Sender,
    monitor_errors: &mut Vec<String>,
) -> (PathBuf, bool) {
    // Short paths: sun_path is 108 bytes. The directory is checked (owner,
    // mode, no symlink) and replaced when someone else made it.
    let sock_dir = match crate::util::runtime_dir::private_dir() {
        Ok(d) => d,
        Err(e) => {
            let d = crate::util::runtime_dir::usual_dir();
            monitor_errors.push(format!(
                "progress socket: no private directory for it ({}): {e}",
                d.display()
            ));
            return (d.join(format!("{}.sock", std::process::id())), false);
        }
    };
    crate::util::runtime_dir::remove_stale(&sock_dir);
    let mut sock_path = sock_dir.join(format!(
        "{}.{}.{}.sock",
        id.job,
        id.rank,
        std::process::id()
    ));
    if sock_path.as_os_str().len() > 100 {
        sock_path = sock_dir.join(format!("{}.sock", std::process::id()));
    }
    let socket = progress::socket::bind(&sock_path);
    let socket_ok = match socket.and_then(|sock| progress::socket::spawn_listener(sock, tx.clone()))
    {
        Ok(_) => true,
        Err(e) => {
            monitor_errors.push(format!("progress socket {}: {e}", sock_path.display()));
            false
        }
    };
    (sock_path, socket_ok)
}

impl Rank {
    /// The output pumps, the progress file and the checkpoint directory;
    /// the progress file's watch mode.
    pub(super) fn watch(
        &mut self,
        stdout: std::fs::File,
        stderr: std::fs::File,
        monitor_errors: &mut Vec<String>,
    ) -> Option<String> {
        let cfg = &self.cfg;
        let parser = output::Parser::new(
            cfg.progress.regex.clone(),
            cfg.progress.checkpoint_regex.clone(),
            cfg.progress.eval_regex.clone(),
        );
        for (pipe, fd, source) in [
            (stdout, 1, progress::Source::Stdout),
            (stderr, 2, progress::Source::Stderr),
        ] {
            match output::spawn_pump(
                pipe,
                fd,
                source,
                parser.clone(),
                self.tail.clone(),
                self.tx.clone(),
                if crate::context::shares_output() {
                    output::Lines::Whole {
                        label: crate::context::output_label(),
                    }
                } else {
                    output::Lines::Raw
                },
            ) {
                Ok(h) => self.pumps.push(h),
                Err(e) => monitor_errors.push(format!("output pump: {e}")),
            }
        }
        let mut file_mode = None;
        if let Some(path) = &cfg.progress.file {
            file_mode = Some(progress::file::effective_mode(path, cfg.progress.file_poll).1);
            match progress::file::watch(
                path,
                cfg.progress.file_poll,
                cfg.progress.file_poll_interval,
                output::Parser::new(cfg.progress.regex.clone(), None, None),
                self.tx.clone(),
            ) {
                Ok(w) => self.file_watch = Some(w),
                Err(e) => monitor_errors.push(format!("progress file {}: {e}", path.display())),
            }
        }
        file_mode
    }
}

/// Checkpoints the trainer saves on its own (rank 0 only: the directory is
/// usually shared, and one record per checkpoint is enough). Started
/// before the trainer: a checkpoint it saves in its first moments is news,
/// not one that was there at the start.
pub(super) fn checkpoint_watch(
    cfg: &crate::config::Config,
    rank: u32,
    tx: &progress::Sender,
    monitor_errors: &mut Vec<String>,
) -> Option<progress::checkpoint_dir::DirWatch> {
    let dir = cfg.checkpoint_watch_dir.as_ref().filter(|_| rank == 0)?;
    match progress::checkpoint_dir::watch(
        dir,
        cfg.checkpoint_watch_regex.clone(),
        cfg.checkpoint_watch_poll,
        tx.clone(),
    ) {
        Ok(w) => Some(w),
        Err(e) => {
            monitor_errors.push(format!("checkpoint directory {}: {e}", dir.display()));
            None
        }
    }
}
