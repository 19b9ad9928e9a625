//! Which class an output line belongs to: the pattern lists a rank's
//! last lines are read against (the defaults, and the site's own from
//! `[failure_patterns]`).

use super::traceback::what_happened;
use regex::Regex;

/// Pattern lists, compiled. Each output line is checked against the lists
/// in this order and takes the class of the first that matches: `ignore`
/// (alarming but harmless lines), `ambiguous` (errors as often the GPU's
/// or its driver's as the code's: an illegal memory access, Xid 13/31/43),
/// `user` (the user's errors: CUDA out of memory, an ImportError),
/// `secondary` (a peer's failure seen from here), `infrastructure`, then
/// `generic` (any Python exception: the user's, unless something above
/// says otherwise). A rank's class is then infrastructure > ambiguous >
/// user > secondary > generic.
#[derive(Clone, Debug)]
pub struct Patterns {
    pub ignore: Vec<Regex>,
    pub ambiguous: Vec<Regex>,
    pub user: Vec<Regex>,
    pub secondary: Vec<Regex>,
    pub infrastructure: Vec<Regex>,
    pub generic: Vec<Regex>,
}

/// Lines that look alarming but are not failures.
pub const DEFAULT_IGNORE: &[&str] = &[
    r"\bNCCL INFO\b",
    r"NCCL WARN Failed to open libibverbs",
    r"\[c10d\] The client socket has failed to connect to .*\(errno: 99 - Cannot assign requested address\)",
    r" - retrying \(try=\d+",
    r"\b(?:UserWarning|FutureWarning|DeprecationWarning):",
    r"process group has NOT been destroyed|destroy_process_group\(\) was not called",
    r"^CUDA kernel errors might be asynchronously reported|^For debugging consider passing CUDA_LAUNCH_BLOCKING=1|^Compile with `TORCH_USE_CUDA_DSA`",
];

/// Errors that are as often the GPU's or its driver's as the code's: an
/// illegal memory access (Xid 13/31 on real clusters come from bad pages
/// and drivers as well as bad kernels). One restart; the same again at the
/// same step is the code's, and the crash-loop guard stops it.
pub const DEFAULT_AMBIGUOUS: &[&str] = &[
    r"an illegal memory access was encountered",
    r"NVRM: Xid \(PCI:[0-9a-fA-F:.]+\): (?:13|31|43),",
];

/// The user's errors, even where they look like the hardware's.
pub const DEFAULT_USER: &[&str] = &[
    r"DataLoader worker \(pid \d+\) is killed by signal: Bus error",
    r"OutOfMemoryError|CUDA out of memory",
    r"failed \(exitcode: -9\)",
    r"exceeded memory limit .* being killed",
    r"\b(?:ModuleNotFoundError|ImportError|KeyError|AssertionError|ValueError|TypeError|IndexError|AttributeError|NameError|SyntaxError|FileNotFoundError|NotImplementedError|ZeroDivisionError)\b",
    r"\[Errno 2\] No such file or directory",
    r"mat1 and mat2 shapes cannot be multiplied",
];

/// A failure caused by a peer's failure, seen from a surviving rank.
pub const DEFAULT_SECONDARY: &[&str] = &[
    r"NET/IB ?: Got completion from peer \S+ with (?:status=|error )5\b",
    r"remote process exited or there was a network error|ncclRemoteError",
    r"(?i)Connection (?:closed|reset) by (?:remote )?peer|failed : Broken pipe|\): Broken pipe|with error: Broken pipe",
    r"Some NCCL operations have failed or timed out|To avoid data inconsistency, we are taking the entire process down|Exception \(either an error or timeout\) detected by watchdog",
    r"DistNetworkError|RendezvousConnectionError|RendezvousClosedError",
    r"multiprocessing/api\.py:\d+\] Sending process \d+ closing signal SIGTERM|multiprocessing\.api:Sending process \d+ closing signal SIGTERM",
];

/// Infrastructure signatures (recorded samples: tests/fixtures/failures).
pub const DEFAULT_INFRA: &[&str] = &[
    r"Watchdog caught collective operation timeout",
    r"NVRM: Xid \(PCI:[0-9a-fA-F:.]+\): \d+,",
    r"fallen off the bus|GPU likely needs to be reset",
    r"SXid \(PCI:[0-9a-fA-F:.]+\): \d+, (?:Fatal|Non-fatal)",
    r"uncorrectable ECC error",
    r"(?:CUDA error|cuda runtime error \(\d+\)) ?: (?:unknown error|unspecified launch failure)",
    r"unhandled system error|ncclSystemError|internal error - please report this issue to the NCCL developers|ncclInternalError",
    r"NET/IB ?: Got completion from peer",
    r"NCCL WARN Call to ibv_\w+ failed",
    r"NET/OFI Request \S+ completed with error",
    r"Bus error",
    r"srun: error: Node failure on |DUE TO NODE FAILURE",
];

/// Any Python exception: the user's unless a list above said otherwise.
pub const DEFAULT_GENERIC: &[&str] = &[
    r"Traceback \(most recent call last\)",
    r"^(?:\[rank\d+\]:\s*)?\w*(?:Error|Exception)\b",
];

/// The class one output line gives, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineClass {
    Ambiguous,
    User,
    Secondary,
    Infrastructure,
    Generic,
}

impl Patterns {
    /// Compile pattern sources; the error names the bad one.
    pub fn compile(
        ignore: &[String],
        ambiguous: &[String],
        user: &[String],
        secondary: &[String],
        infra: &[String],
        generic: &[String],
    ) -> Result<Patterns, String> {
        Ok(Patterns {
            ignore: compile_list(ignore, "ignore")?,
            ambiguous: compile_list(ambiguous, "ambiguous")?,
            user: compile_list(user, "user")?,
            secondary: compile_list(secondary, "secondary")?,
            infrastructure: compile_list(infra, "infrastructure")?,
            generic: compile_list(generic, "generic")?,
        })
    }

    /// The built-in defaults.
    pub fn defaults() -> Patterns {
        let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Patterns::compile(
            &own(DEFAULT_IGNORE),
            &own(DEFAULT_AMBIGUOUS),
            &own(DEFAULT_USER),
            &own(DEFAULT_SECONDARY),
            &own(DEFAULT_INFRA),
            &own(DEFAULT_GENERIC),
        )
        .expect("default patterns compile")
    }

    /// Classify one line.
    pub fn line_class(&self, line: &str) -> Option<LineClass> {
        let any = |list: &[Regex]| list.iter().any(|r| r.is_match(line));
        if any(&self.ignore) {
            None
        } else if any(&self.ambiguous) {
            Some(LineClass::Ambiguous)
        } else if any(&self.user) {
            Some(LineClass::User)
        } else if any(&self.secondary) {
            Some(LineClass::Secondary)
        } else if any(&self.infrastructure) {
            Some(LineClass::Infrastructure)
        } else if any(&self.generic) {
            Some(LineClass::Generic)
        } else {
            None
        }
    }

    /// The strongest line of a tail: infrastructure > ambiguous > user >
    /// secondary > generic; of two as strong, the first. A traceback's
    /// quoted source lines are the code, not what happened, and never
    /// count (`    x = fetch(i)  # a bad shard raises ValueError` made a
    /// ConnectionResetError a user error, trial 13; `    raise
    /// RuntimeError("CUDA error: ...")` is followed by the exception's own
    /// line).
    pub fn strongest<'a>(&self, tail: &'a [String]) -> Option<(LineClass, &'a str)> {
        let rank = |c: LineClass| match c {
            LineClass::Infrastructure => 4,
            LineClass::Ambiguous => 3,
            LineClass::User => 2,
            LineClass::Secondary => 1,
            LineClass::Generic => 0,
        };
        let mut best: Option<(LineClass, &str)> = None;
        for line in what_happened(tail) {
            if let Some(c) = self.line_class(line) {
                if best.is_none_or(|(b, _)| rank(c) > rank(b)) {
                    best = Some((c, line));
                }
            }
        }
        best
    }
}

/// Compile one list of patterns; the error names the bad one.
pub fn compile_list(list: &[String], what: &str) -> Result<Vec<Regex>, String> {
    list.iter()
        .map(|p| {
            Regex::new(p).map_err(|e| {
                format!(
                    "invalid {what} pattern '{p}': {}",
                    e.to_string().lines().last().unwrap_or("").trim()
                )
            })
        })
        .collect()
}
