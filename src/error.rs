//! Errors that reach the user, and the exit codes they map to.
//!
//! Library code returns [`Error`]; only the CLI turns it into a one-line
//! message on stderr and a process exit code.

use std::path::PathBuf;

/// Exit code for usage and configuration errors (as most Unix tools do).
pub const EXIT_USAGE: i32 = 2;
/// Exit code when the command could not be found.
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit code when the command was found but could not be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;
/// Exit code when resilio stopped the rank because it stalled (as timeout(1)).
pub const EXIT_STALLED: i32 = 124;
/// Exit code of a rank resilio stopped for a numerical failure (a loss gone
/// to NaN or Inf, `[numerical]`), as `EX_DATAERR`.
pub const EXIT_NUMERICAL: i32 = 65;
/// Exit code for an internal failure of resilio itself (never used while a
/// child is running: the child's status always wins).
pub const EXIT_INTERNAL: i32 = 70;
/// Exit code when a report was asked for a job that has no journal.
pub const EXIT_NO_JOB: i32 = 3;
/// Exit code when Slurm refused an action (e.g. draining without permission).
pub const EXIT_NOT_PERMITTED: i32 = 4;
/// Exit code when a job's coordinator cannot be reached (not running, or
/// running without one) or refused the request.
pub const EXIT_NO_COORDINATOR: i32 = 5;
/// Exit code when a checkpoint asked for with `resilio checkpoint --wait`
/// was not confirmed by every rank in time.
pub const EXIT_NOT_CONFIRMED: i32 = 6;
/// Exit code of a job resilio stopped because its restarts brought no
/// progress (`[run] no_progress_restarts` in a row without a newer
/// checkpoint or a step beyond the best), whatever the failures were. The
/// code NVIDIA's resiliency extension (NVRx) gives the same stop.
pub const EXIT_NO_PROGRESS: i32 = 93;

/// Every exit code, as the README's table and the man pages' EXIT STATUS
/// give it: (code, meaning, commands), in Markdown (`tests/docs.rs` checks
/// the README's table against it).
pub const EXIT_CODES: &[(&str, &str, &str)] = &[
    ("the trainer's", "its own status; 128+N if it died of signal N; after restarts in place, the last attempt's; under Slurm, a job stopped after a failure ends with its primary rank's code (srun's when no rank gave one)", "`run`"),
    ("`0`", "done", "every command"),
    ("`2`", "usage or configuration error, or a path that cannot be written: one line, `file:line` for config files", "every command"),
    ("`3`", "no journal for that job (or none readable)", "`report`, `timeline`, `status`, `checkpoint`"),
    ("`4`", "Slurm refused an action (draining a node without permission)", "`nodes --drain`"),
    ("`5`", "the job's coordinator cannot be reached, or refused the request", "`status`, `checkpoint`"),
    ("`6`", "not every rank confirmed the checkpoint within `--wait`", "`checkpoint`"),
    ("`65`", "resilio stopped a rank whose loss went to NaN or Inf (`[numerical]`); not restarted", "`run`"),
    ("`70`", "an internal failure of resilio itself (never while a trainer runs: its status wins)", "every command"),
    ("`93`", "restarts brought no progress: `no_progress_restarts` (default 3) in a row without a newer whole checkpoint or a step beyond the best before; stopped whatever the failures were", "`run`"),
    ("`124`", "resilio stopped a stalled rank (as `timeout` does)", "`run`"),
    ("`126` / `127`", "the command was found but cannot be executed / was not found", "`run`"),
    ("`141`", "the reader of the output went away (SIGPIPE)", "commands that only print"),
];

/// Everything that can go wrong before or around supervision.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command-line value was wrong.
    #[error("{0}")]
    Usage(String),
    /// A configuration file was wrong; `line` is 1-based.
    #[error("{}:{line}: {message}", path.display())]
    Config {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// A configuration file could not be read.
    #[error("{}: {source}", path.display())]
    ConfigRead {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The command to run does not exist.
    #[error("{program}: command not found")]
    NotFound { program: String },
    /// The command exists but cannot be executed.
    #[error("{program}: cannot execute: {source}")]
    NotExecutable {
        program: String,
        source: std::io::Error,
    },
    /// No journal exists for the job asked about.
    #[error("no journal for job '{job}' under {}", dir.display())]
    NoJob { job: String, dir: PathBuf },
    /// A job's journal files exist but hold no readable record (each named).
    #[error("{0}")]
    NoReadableRecord(String),
    /// The job's coordinator could not be reached or refused.
    #[error("{0}")]
    Coordinator(String),
    /// Anything else (I/O on resilio's own files, runtime set-up).
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// The process exit code this error maps to.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) | Error::Config { .. } | Error::ConfigRead { .. } => EXIT_USAGE,
            Error::NotFound { .. } => EXIT_NOT_FOUND,
            Error::NotExecutable { .. } => EXIT_NOT_EXECUTABLE,
            Error::NoJob { .. } | Error::NoReadableRecord(_) => EXIT_NO_JOB,
            Error::Coordinator(_) => EXIT_NO_COORDINATOR,
            Error::Other(_) => EXIT_INTERNAL,
        }
    }
}

/// Result alias used across the crate.
pub type Result<T> = std::result::Result<T, Error>;
