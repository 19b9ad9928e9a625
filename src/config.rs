//! Layered configuration: built-in defaults, then `/etc/resilio/resilio.toml`
//! (or `$RESILIO_SYSTEM_CONFIG`), then the user's `--config` file, then flags.
//!
//! Every file is parsed strictly (unknown keys are errors) and every error
//! names `file:line`. `conf/resilio.toml` documents each key with its default.

use crate::duration::serde_text;
use crate::error::{Error, Result};
use crate::policy::stall::StallConfig;
use regex::bytes::Regex;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// The default system-wide configuration file.
pub const SYSTEM_CONFIG: &str = "/etc/resilio/resilio.toml";

// The default patterns belong to the progress sources that use them; the
// configuration re-exports them under their old names.
pub use crate::progress::patterns::{
    PollMode, DEFAULT_CHECKPOINT_REGEX, DEFAULT_CHECKPOINT_WATCH_REGEX, DEFAULT_EVAL_REGEX,
    DEFAULT_PROGRESS_REGEX,
};

/// Where progress comes from, besides the datagram socket (always on).
#[derive(Clone, Debug)]
pub struct ProgressConfig {
    /// Regex over output lines; capture group 1 (or the group named `step`) is the step.
    pub regex: Regex,
    /// Regex over output lines that marks the start of a checkpoint save (empty: off).
    pub checkpoint_regex: Option<Regex>,
    /// Regex over output lines that marks the start of an evaluation (empty: off).
    pub eval_regex: Option<Regex>,
    /// A file the trainer rewrites with its step (or any content) as it progresses.
    pub file: Option<PathBuf>,
    /// Watch mode for `file`.
    pub file_poll: PollMode,
    /// Polling period when polling.
    pub file_poll_interval: Duration,
    /// Set PYTHONUNBUFFERED=1 in the trainer's environment unless already set,
    /// so that a Python trainer's prints reach resilio as they happen.
    pub python_unbuffered: bool,
}

/// What to gather on a stall, before the rank is stopped.
#[derive(Clone, Debug)]
pub struct DiagnosticsConfig {
    /// Signal sent to the trainer's process group to make it dump its stacks
    /// (e.g. SIGUSR2 with `faulthandler.register(signal.SIGUSR2)`); off by default,
    /// because the default action of most signals kills a trainer that did not register one.
    pub dump_signal: Option<nix::sys::signal::Signal>,
    /// How long to let the trainer write its dump before it is terminated.
    pub dump_wait: Duration,
    /// Run `py-spy dump --pid` on each Python process of the rank when py-spy is on PATH.
    pub py_spy: bool,
    /// Timeout for each py-spy invocation.
    pub py_spy_timeout: Duration,
    /// How many lines of recent output to keep in the stall record.
    pub tail_lines: usize,
}

/// The optional site health check.
#[derive(Clone, Debug)]
pub struct HealthConfig {
    /// Command and arguments (no shell); `None`: no check.
    pub command: Option<Vec<String>>,
    /// Longest a check may run.
    pub timeout: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            command: None,
            timeout: Duration::from_secs(60),
        }
    }
}

/// Where and how the coordinator runs (`[coordinator]`, `[straggler]`).
#[derive(Clone, Debug)]
pub struct CoordinatorSettings {
    /// Off: every rank supervises alone (no reports, no cross-rank policies).
    pub enabled: bool,
    /// `auto` (loopback without Slurm, else the node's address), or an address.
    pub bind: String,
    /// How often an agent reports when nothing urgent happens.
    pub report_interval: Duration,
    /// Also send `[checkpoint] signal` to the trainer on a coordinated
    /// checkpoint request (besides the control file).
    pub signal_trainer: bool,
    /// The cross-rank policies' parameters.
    pub policy: crate::coordinator::state::CoordinatorConfig,
}

impl Default for CoordinatorSettings {
    fn default() -> Self {
        CoordinatorSettings {
            enabled: true,
            bind: "auto".into(),
            report_interval: Duration::from_secs(1),
            signal_trainer: false,
            policy: Default::default(),
        }
    }
}

/// The fully resolved configuration of one `resilio run`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Root of journals: `STATE_DIR/jobs/JOB/`.
    pub state_dir: PathBuf,
    /// Time between SIGTERM and SIGKILL when stopping the trainer.
    pub kill_grace: Duration,
    /// Restarts allowed after failures, in place, inside the allocation or by
    /// requeue (time-limit requeues do not count).
    pub max_restarts: u32,
    /// In a batch script, relaunch a failed step inside the allocation
    /// (leaving blamed nodes out when spare nodes exist) before requeueing.
    pub restart_in_allocation: bool,
    /// Progress sources.
    pub progress: ProgressConfig,
    /// Stall policy parameters.
    pub stall: StallConfig,
    /// Time between SIGTERM and SIGKILL when resilio stops a rank itself (a
    /// stall, or the coordinator's teardown of a failed attempt): a hung
    /// process rarely honours SIGTERM. Never longer than `kill_grace`, which
    /// stays for stops asked from outside (scancel, Ctrl-C).
    pub stall_kill_grace: Duration,
    /// Stall diagnostics.
    pub diagnostics: DiagnosticsConfig,
    /// At most one `progress` journal record per this interval (plus first and last).
    pub journal_progress_interval: Duration,
    /// Output patterns that classify a rank's failure.
    /// `None`: the built-in lists, compiled only when a failure is classified
    /// (they are many regexes; start-up stays cheap).
    pub failure_patterns: Option<crate::policy::failure::Patterns>,
    /// Signal that asks the trainer for a checkpoint now (`None`: do not signal).
    pub checkpoint_signal: Option<nix::sys::signal::Signal>,
    /// How long the job-level supervisor waits for `checkpoint_done` after a
    /// pre-timeout signal before it stops the step for the requeue.
    pub checkpoint_wait: Duration,
    /// A directory where the trainer saves checkpoints on its own (rank 0 watches it).
    pub checkpoint_watch_dir: Option<PathBuf>,
    /// Paths in it (relative) that mark a complete checkpoint; group 1 is the step.
    pub checkpoint_watch_regex: regex::Regex,
    /// Rescan period (what inotify cannot see: network filesystems).
    pub checkpoint_watch_poll: Duration,
    /// The signal Slurm sends before the time limit (`sbatch --signal=B:USR1@N`).
    pub pre_timeout_signal: nix::sys::signal::Signal,
    /// In a Slurm step, forward signals to the trainer too. Off by default:
    /// Slurm's process tracking (cgroup, linuxproc) already delivers them to
    /// every process of the step; sites with `ProctrackType=proctrack/pgid` turn it on.
    pub slurm_forward_signals: bool,
    /// Site health check, run before the trainer starts and after it failed.
    pub health: HealthConfig,
    /// The coordinator and its cross-rank policies.
    pub coordinator: CoordinatorSettings,
    /// Node history at job start (`[nodes]`).
    pub nodes: NodesConfig,
}

/// `[nodes]`: a job may leave out nodes the node history lists.
#[derive(Clone, Debug, PartialEq)]
pub struct NodesConfig {
    /// At the start of a batch job, leave out (or requeue away from) nodes
    /// whose score is at or above `threshold`.
    pub exclude_at_start: bool,
    pub threshold: f64,
    pub half_life: Duration,
}

impl Default for NodesConfig {
    fn default() -> Self {
        NodesConfig {
            exclude_at_start: false,
            threshold: 0.9,
            half_life: Duration::from_secs(7 * 86400),
        }
    }
}

/// The default state directory: `$RESILIO_STATE_DIR`, else
/// `$XDG_STATE_HOME/resilio`, else `$HOME/.local/state/resilio`, else
/// `/tmp/resilio-$UID`.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RESILIO_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("resilio");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".local/state/resilio");
    }
    PathBuf::from(format!("/tmp/resilio-{}", nix::unistd::getuid()))
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: default_state_dir(),
            kill_grace: Duration::from_secs(30),
            stall_kill_grace: Duration::from_secs(5),
            max_restarts: 3,
            restart_in_allocation: true,
            progress: ProgressConfig {
                regex: Regex::new(DEFAULT_PROGRESS_REGEX).expect("default regex"),
                checkpoint_regex: Some(
                    Regex::new(DEFAULT_CHECKPOINT_REGEX).expect("default regex"),
                ),
                eval_regex: Some(Regex::new(DEFAULT_EVAL_REGEX).expect("default regex")),
                file: None,
                file_poll: PollMode::Auto,
                file_poll_interval: Duration::from_secs(2),
                python_unbuffered: true,
            },
            stall: StallConfig::default(),
            diagnostics: DiagnosticsConfig {
                dump_signal: None,
                dump_wait: Duration::from_secs(3),
                py_spy: true,
                py_spy_timeout: Duration::from_secs(20),
                tail_lines: 40,
            },
            journal_progress_interval: Duration::from_secs(10),
            failure_patterns: None,
            checkpoint_signal: Some(nix::sys::signal::Signal::SIGUSR2),
            checkpoint_wait: Duration::from_secs(120),
            checkpoint_watch_dir: None,
            checkpoint_watch_regex: regex::Regex::new(DEFAULT_CHECKPOINT_WATCH_REGEX)
                .expect("default regex"),
            checkpoint_watch_poll: Duration::from_secs(5),
            pre_timeout_signal: nix::sys::signal::Signal::SIGUSR1,
            slurm_forward_signals: false,
            health: HealthConfig::default(),
            coordinator: CoordinatorSettings::default(),
            nodes: NodesConfig::default(),
        }
    }
}

// ---- the file format: every key optional, unknown keys rejected ----
//
// Each `[section]` is declared once, as a table: for every key, the type it
// is written as, the field of `Config` it sets, and the function that checks
// the value and stores it there. `section!` makes of it the section's struct
// (every key optional, unknown keys refused, each value kept with its place
// in the file) and its `apply`, which stores the keys a file sets, in the
// order of the table. A new key is one line in a table, its field in
// `Config` with the built-in default, and that default written in
// conf/resilio.toml (the tests check the last two agree and that every key is
// there).

/// Why a value is refused, and where when that is not where the value starts.
struct Bad {
    message: String,
    at: Option<usize>,
}

impl From<String> for Bad {
    fn from(message: String) -> Self {
        Bad { message, at: None }
    }
}

/// What checking and storing one value gives.
type Stored = std::result::Result<(), Bad>;

/// The file being applied, for errors that name `file:line`.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    fn error(&self, offset: usize, message: String) -> Error {
        Error::Config {
            path: self.path.to_path_buf(),
            line: line_of(self.text, offset),
            message,
        }
    }
}

macro_rules! section {
    // The struct alone, for a section that stores its keys itself.
    (@keys $Section:ident $name:literal { $($key:ident: $raw:ty),* $(,)? }) => {
        #[derive(Deserialize, Default)]
        #[serde(deny_unknown_fields)]
        struct $Section {
            $($key: Option<Spanned<$raw>>,)*
        }

        #[cfg(test)]
        impl $Section {
            const NAME: &'static str = $name;
            const KEYS: &'static [&'static str] = &[$(stringify!($key)),*];
        }
    };
    // `key: type written => field in Config by how it is checked and stored`.
    ($Section:ident $name:literal {
        $($key:ident: $raw:ty => $($field:ident).+ by $store:expr),* $(,)?
    }) => {
        section!(@keys $Section $name { $($key: $raw),* });

        impl $Section {
            /// Store the keys this file sets; the first refused value is the error.
            fn apply(self, cfg: &mut Config, src: &Source) -> Result<()> {
                $(if let Some(value) = self.$key {
                    let start = value.span().start;
                    let key = concat!($name, ".", stringify!($key));
                    $store(value.into_inner(), key, &mut cfg.$($field).+)
                        .map_err(|bad| src.error(bad.at.unwrap_or(start), bad.message))?;
                })*
                Ok(())
            }
        }
    };
}

section!(RunSection "run" {
    state_dir: PathBuf => state_dir by set,
    kill_grace: Dur => kill_grace by duration,
    max_restarts: u32 => max_restarts by set,
    restart_in_allocation: bool => restart_in_allocation by set,
});

section!(ProgressSection "progress" {
    regex: String => progress.regex by regex,
    checkpoint_regex: String => progress.checkpoint_regex by regex_or_off,
    eval_regex: String => progress.eval_regex by regex_or_off,
    file: PathBuf => progress.file by some,
    file_poll: PollMode => progress.file_poll by set,
    file_poll_interval: Dur => progress.file_poll_interval by at_least::<10>,
    python_unbuffered: bool => progress.python_unbuffered by set,
});

section!(StallSection "stall" {
    startup_timeout: Dur => stall.startup_timeout by timeout,
    timeout: String => stall.fixed_timeout by adaptive_or_timeout,
    adaptive_factor: f64 => stall.adaptive_factor by factor,
    adaptive_percentile: f64 => stall.adaptive_percentile by fraction,
    adaptive_floor: Dur => stall.adaptive_floor by timeout,
    adaptive_window: usize => stall.adaptive_window by count,
    checkpoint_timeout: Dur => stall.checkpoint_timeout by timeout,
    eval_timeout: Dur => stall.eval_timeout by timeout,
    kill_grace: Dur => stall_kill_grace by duration,
    in_step_phases: Vec<String> => stall.in_step_phases by phase_names,
    phase_timeouts: BTreeMap<String, Spanned<String>> => stall.phase_timeouts by phase_timeouts,
});

section!(DiagnosticsSection "diagnostics" {
    dump_signal: String => diagnostics.dump_signal by signal_or_none,
    dump_wait: Dur => diagnostics.dump_wait by duration,
    py_spy: bool => diagnostics.py_spy by set,
    py_spy_timeout: Dur => diagnostics.py_spy_timeout by timeout,
    tail_lines: usize => diagnostics.tail_lines by set,
});

section!(JournalSection "journal" {
    progress_interval: Dur => journal_progress_interval by duration,
});

section!(CheckpointSection "checkpoint" {
    signal: String => checkpoint_signal by signal_or_none,
    wait: Dur => checkpoint_wait by duration,
    watch_dir: PathBuf => checkpoint_watch_dir by path_or_off,
    watch_regex: String => checkpoint_watch_regex by path_regex,
    watch_poll: Dur => checkpoint_watch_poll by at_least::<100>,
});

section!(SlurmSection "slurm" {
    pre_timeout_signal: String => pre_timeout_signal by signal,
    forward_signals: bool => slurm_forward_signals by set,
});

section!(HealthSection "health" {
    command: Vec<String> => health.command by command_or_off,
    timeout: Dur => health.timeout by timeout,
});

section!(CoordinatorSection "coordinator" {
    enabled: bool => coordinator.enabled by set,
    bind: String => coordinator.bind by bind_address,
    report_interval: Dur => coordinator.report_interval by at_least::<50>,
    signal_trainer: bool => coordinator.signal_trainer by set,
    hang_wait: Dur => coordinator.policy.hang_wait by duration,
    checkpoint_lead: Dur => coordinator.policy.checkpoint_lead by duration,
    checkpoint_every: String => coordinator.policy by checkpoint_every,
    lost_after: Dur => coordinator.policy.lost_after by timeout,
});

section!(StragglerSection "straggler" {
    window: Dur => coordinator.policy.straggler.window by at_least::<100>,
    margin: f64 => coordinator.policy.straggler.margin by non_negative,
    windows: u32 => coordinator.policy.straggler.windows by count,
    min_samples: u64 => coordinator.policy.straggler.min_samples by at_least_one,
    checkpoint: bool => coordinator.policy.checkpoint_on_straggler by set,
    exclude: bool => coordinator.policy.exclude_confirmed_stragglers by set,
});

section!(NodesSection "nodes" {
    exclude_at_start: bool => nodes.exclude_at_start by set,
    threshold: f64 => nodes.threshold by positive,
    half_life: Dur => nodes.half_life by at_least::<1000>,
});

section!(@keys FailureSection "failure" {
    ignore_patterns: Vec<String>,
    user_patterns: Vec<String>,
    secondary_patterns: Vec<String>,
    infrastructure_patterns: Vec<String>,
    generic_patterns: Vec<String>,
});

impl FailureSection {
    /// A list set replaces the built-in one (the others stay built in);
    /// they are checked in the classifier's order, infrastructure first.
    fn apply(self, cfg: &mut Config, src: &Source) -> Result<()> {
        let FailureSection {
            ignore_patterns,
            user_patterns,
            secondary_patterns,
            infrastructure_patterns,
            generic_patterns,
        } = self;
        let lists = [
            &infrastructure_patterns,
            &secondary_patterns,
            &user_patterns,
            &ignore_patterns,
            &generic_patterns,
        ];
        if lists.iter().all(|l| l.is_none()) {
            return Ok(());
        }
        let mut p = cfg
            .failure_patterns
            .take()
            .unwrap_or_else(crate::policy::failure::Patterns::defaults);
        for (list, what, out) in [
            (
                infrastructure_patterns,
                "infrastructure",
                &mut p.infrastructure,
            ),
            (secondary_patterns, "secondary", &mut p.secondary),
            (user_patterns, "user", &mut p.user),
            (ignore_patterns, "ignore", &mut p.ignore),
            (generic_patterns, "generic", &mut p.generic),
        ] {
            let Some(list) = list else { continue };
            *out = crate::policy::failure::compile_list(list.get_ref(), what).map_err(|m| {
                src.error(list.span().start, format!("failure.{what}_patterns: {m}"))
            })?;
        }
        cfg.failure_patterns = Some(p);
        Ok(())
    }
}

macro_rules! file_config {
    ($($section:ident: $Section:ident),* $(,)?) => {
        /// A whole file: its sections, in the order unknown-key messages list them.
        #[derive(Deserialize, Default)]
        #[serde(deny_unknown_fields)]
        struct FileConfig {
            $(#[serde(default)] $section: $Section,)*
        }

        /// Every section (its name in the file, and in its messages) and its
        /// keys, for the tests.
        #[cfg(test)]
        const SECTIONS: &[(&str, &str, &[&str])] =
            &[$((stringify!($section), $Section::NAME, $Section::KEYS)),*];
    };
}

file_config! {
    run: RunSection,
    progress: ProgressSection,
    stall: StallSection,
    diagnostics: DiagnosticsSection,
    journal: JournalSection,
    failure: FailureSection,
    checkpoint: CheckpointSection,
    slurm: SlurmSection,
    health: HealthSection,
    coordinator: CoordinatorSection,
    straggler: StragglerSection,
    nodes: NodesSection,
}

/// A duration written as text or seconds.
#[derive(Deserialize)]
#[serde(transparent)]
struct Dur(#[serde(with = "serde_text")] Duration);

// ---- how values are checked and stored: (value, `section.key`, field) ----

/// Any value of the field's type.
fn set<T>(value: T, _: &str, out: &mut T) -> Stored {
    *out = value;
    Ok(())
}

/// A value for a field that is off unless set.
fn some<T>(value: T, _: &str, out: &mut Option<T>) -> Stored {
    *out = Some(value);
    Ok(())
}

/// A path; empty turns it off.
fn path_or_off(value: PathBuf, _: &str, out: &mut Option<PathBuf>) -> Stored {
    *out = (!value.as_os_str().is_empty()).then_some(value);
    Ok(())
}

/// An argument vector; empty turns it off.
fn command_or_off(value: Vec<String>, _: &str, out: &mut Option<Vec<String>>) -> Stored {
    *out = (!value.is_empty()).then_some(value);
    Ok(())
}

fn duration(value: Dur, _: &str, out: &mut Duration) -> Stored {
    *out = value.0;
    Ok(())
}

/// A period, raised to at least `MS` milliseconds.
fn at_least<const MS: u64>(value: Dur, _: &str, out: &mut Duration) -> Stored {
    *out = value.0.max(Duration::from_millis(MS));
    Ok(())
}

/// A timeout: zero would fire at once (a trainer killed after its first
/// step), so it is an error, never "no timeout".
fn timeout(value: Dur, key: &str, out: &mut Duration) -> Stored {
    refuse_unless(!value.0.is_zero(), key, "must be greater than zero")?;
    *out = value.0;
    Ok(())
}

/// `"adaptive"` (learnt from the steps), or a fixed timeout.
fn adaptive_or_timeout(value: String, key: &str, out: &mut Option<Duration>) -> Stored {
    let value = value.trim();
    *out = if value == "adaptive" {
        None
    } else {
        Some(
            crate::duration::parse_positive(value)
                .map_err(|m| format!("{key}: {m}; \"adaptive\" learns it from the steps"))?,
        )
    };
    Ok(())
}

fn refuse_unless(ok: bool, key: &str, rule: &str) -> Stored {
    if ok {
        Ok(())
    } else {
        Err(format!("{key} {rule}").into())
    }
}

fn factor(value: f64, key: &str, out: &mut f64) -> Stored {
    refuse_unless(value >= 1.0 && value.is_finite(), key, "must be >= 1")?;
    *out = value;
    Ok(())
}

fn fraction(value: f64, key: &str, out: &mut f64) -> Stored {
    refuse_unless(value > 0.0 && value <= 1.0, key, "must be in (0, 1]")?;
    *out = value;
    Ok(())
}

fn non_negative(value: f64, key: &str, out: &mut f64) -> Stored {
    refuse_unless(value >= 0.0 && value.is_finite(), key, "must be >= 0")?;
    *out = value;
    Ok(())
}

fn positive(value: f64, key: &str, out: &mut f64) -> Stored {
    let ok = value > 0.0 && value.is_finite();
    refuse_unless(ok, key, "must be a positive number")?;
    *out = value;
    Ok(())
}

/// A count that must be at least one.
fn count<T: Copy + Default + PartialEq>(value: T, key: &str, out: &mut T) -> Stored {
    refuse_unless(value != T::default(), key, "must be >= 1")?;
    *out = value;
    Ok(())
}

/// A count, raised to at least one.
fn at_least_one(value: u64, _: &str, out: &mut u64) -> Stored {
    *out = value.max(1);
    Ok(())
}

fn regex(value: String, _: &str, out: &mut Regex) -> Stored {
    *out = compile_regex(&value)?;
    Ok(())
}

/// A regex over output lines; empty turns it off.
fn regex_or_off(value: String, _: &str, out: &mut Option<Regex>) -> Stored {
    *out = if value.is_empty() {
        None
    } else {
        Some(compile_regex(&value)?)
    };
    Ok(())
}

/// A regex over relative paths.
fn path_regex(value: String, key: &str, out: &mut regex::Regex) -> Stored {
    *out = regex::Regex::new(&value)
        .map_err(|e| format!("{key}: {}", e.to_string().lines().last().unwrap_or("")))?;
    Ok(())
}

fn signal(value: String, _: &str, out: &mut nix::sys::signal::Signal) -> Stored {
    *out = parse_signal(&value)?;
    Ok(())
}

/// A signal; `"none"` or empty: do not send one.
fn signal_or_none(value: String, _: &str, out: &mut Option<nix::sys::signal::Signal>) -> Stored {
    let value = value.trim();
    *out = if value.is_empty() || value == "none" {
        None
    } else {
        Some(parse_signal(value)?)
    };
    Ok(())
}

/// `auto` or an address the coordinator can bind.
fn bind_address(value: String, _: &str, out: &mut String) -> Stored {
    let value = value.trim().to_string();
    crate::coordinator::bind_address(&value, false)?;
    *out = value;
    Ok(())
}

/// `"none"` (or empty), `"advised"`, or an interval.
fn checkpoint_every(
    value: String,
    key: &str,
    out: &mut crate::coordinator::state::CoordinatorConfig,
) -> Stored {
    let value = value.trim();
    out.checkpoint_advised = value == "advised";
    out.checkpoint_every = if value == "none" || value.is_empty() || value == "advised" {
        None
    } else {
        Some(crate::duration::parse(value).map_err(|m| format!("{key}: {m}"))?)
    };
    Ok(())
}

/// A phase name in lower case: letters, digits, `_` and `-`.
fn phase_name(name: &str) -> Option<String> {
    let n = name.trim().to_ascii_lowercase();
    (!n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    .then_some(n)
}

fn not_a_phase(key: &str, name: &str) -> String {
    format!("{key}: '{name}' is not a phase name (letters, digits, _ and -)")
}

fn phase_names(value: Vec<String>, key: &str, out: &mut Vec<String>) -> Stored {
    *out = value
        .iter()
        .map(|n| phase_name(n).ok_or_else(|| not_a_phase(key, n)))
        .collect::<std::result::Result<_, _>>()?;
    Ok(())
}

/// Long phases with limits of their own, added to those set before; each
/// error names the line of its phase.
fn phase_timeouts(
    value: BTreeMap<String, Spanned<String>>,
    key: &str,
    out: &mut BTreeMap<String, Duration>,
) -> Stored {
    for (name, limit) in value {
        let at = Some(limit.span().start);
        let n = phase_name(&name).ok_or_else(|| Bad {
            message: not_a_phase(key, &name),
            at,
        })?;
        let d = crate::duration::parse(limit.get_ref().trim())
            .and_then(|d| {
                if d.is_zero() {
                    Err("must be longer than zero".to_string())
                } else {
                    Ok(d)
                }
            })
            .map_err(|m| Bad {
                message: format!("{key}.{name}: {m}"),
                at,
            })?;
        out.insert(n, d);
    }
    Ok(())
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Compile a user regex, mapping errors to a one-line message.
pub fn compile_regex(source: &str) -> std::result::Result<Regex, String> {
    Regex::new(source).map_err(|e| {
        let detail = e.to_string();
        let last = detail
            .lines()
            .last()
            .unwrap_or("invalid regex")
            .trim()
            .to_string();
        format!("invalid regex '{source}': {last}")
    })
}

/// Parse a signal name (`SIGUSR2`, `USR2`, `12`).
pub fn parse_signal(text: &str) -> std::result::Result<nix::sys::signal::Signal, String> {
    use nix::sys::signal::Signal;
    let t = text.trim();
    if let Ok(n) = t.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| format!("unknown signal '{text}'"));
    }
    let upper = t.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>()
        .map_err(|_| format!("unknown signal '{text}'"))
}

impl Config {
    /// Apply one TOML file on top of `self`. Errors name `path:line`.
    pub fn apply_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
            path: path.to_path_buf(),
            source,
        })?;
        self.apply_str(&text, path)
    }

    /// Apply TOML text (named `path` in errors) on top of `self`.
    pub fn apply_str(&mut self, text: &str, path: &Path) -> Result<()> {
        let src = Source { path, text };
        let file: FileConfig = toml::from_str(text).map_err(|e| {
            let offset = e.span().map(|s| s.start).unwrap_or(0);
            src.error(offset, e.message().trim().replace('\n', " "))
        })?;
        // Parse errors first, then each section's values in this order.
        file.run.apply(self, &src)?;
        file.progress.apply(self, &src)?;
        file.stall.apply(self, &src)?;
        file.diagnostics.apply(self, &src)?;
        file.journal.apply(self, &src)?;
        file.checkpoint.apply(self, &src)?;
        file.slurm.apply(self, &src)?;
        file.health.apply(self, &src)?;
        file.coordinator.apply(self, &src)?;
        file.straggler.apply(self, &src)?;
        file.nodes.apply(self, &src)?;
        file.failure.apply(self, &src)?;
        // The coordinator's checkpoint wait is the one the pre-timeout uses.
        self.coordinator.policy.checkpoint_wait = self.checkpoint_wait;
        Ok(())
    }

    /// Defaults, then the system file (if present), then the user's file.
    pub fn load(user_file: Option<&Path>) -> Result<Config> {
        let mut cfg = Config::default();
        let system = std::env::var_os("RESILIO_SYSTEM_CONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(SYSTEM_CONFIG));
        if system.exists() {
            cfg.apply_file(&system)?;
        }
        if let Some(path) = user_file {
            cfg.apply_file(path)?;
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(text: &str) -> Result<Config> {
        let mut c = Config::default();
        c.apply_str(text, Path::new("test.toml"))?;
        Ok(c)
    }

    #[test]
    fn documented_default_file_parses_and_equals_builtin_defaults() {
        let text = include_str!("../conf/resilio.toml");
        let c = apply(text).expect("conf/resilio.toml must parse");
        let d = Config::default();
        assert_eq!(c.kill_grace, d.kill_grace);
        assert_eq!(c.stall, d.stall);
        assert_eq!(c.progress.regex.as_str(), d.progress.regex.as_str());
        assert_eq!(c.journal_progress_interval, d.journal_progress_interval);
        assert_eq!(c.diagnostics.tail_lines, d.diagnostics.tail_lines);
        assert_eq!(c.coordinator.policy, d.coordinator.policy);
        assert_eq!(c.coordinator.bind, d.coordinator.bind);
        assert_eq!(c.coordinator.report_interval, d.coordinator.report_interval);
        assert_eq!(c.coordinator.enabled, d.coordinator.enabled);
        assert_eq!(c.coordinator.signal_trainer, d.coordinator.signal_trainer);
    }

    #[test]
    fn documented_default_file_sets_every_field_to_its_default() {
        // Every field, not only the ones compared above: the Debug form
        // shows each value (regexes by their source).
        let c = apply(include_str!("../conf/resilio.toml")).unwrap();
        assert_eq!(format!("{c:#?}"), format!("{:#?}", Config::default()));
    }

    #[test]
    fn every_key_is_documented_in_conf_resilio_toml() {
        // Each key of every section is written in conf/resilio.toml with its
        // default, or commented out where the default is not a value (a
        // built-in list, a path from the environment, a long regex).
        let mut documented = std::collections::BTreeSet::new();
        let mut section = String::new();
        for line in include_str!("../conf/resilio.toml").lines() {
            if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                match header.split_once('.') {
                    Some((s, key)) => documented.insert(format!("{s}.{key}")),
                    None => documented.insert(format!("{header}.")),
                };
                section = header.to_string();
                continue;
            }
            let setting = line.strip_prefix('#').unwrap_or(line).trim_start();
            let Some((key, _)) = setting.split_once(" = ") else {
                continue;
            };
            if !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                documented.insert(format!("{section}.{key}"));
            }
        }
        let mut known = std::collections::BTreeSet::new();
        for (section, name, keys) in SECTIONS {
            assert_eq!(section, name, "[{section}] names its keys {name}.*");
            known.insert(format!("{section}."));
            for key in *keys {
                let key = format!("{section}.{key}");
                assert!(
                    documented.contains(&key),
                    "{key} is not in conf/resilio.toml"
                );
                known.insert(key);
            }
        }
        // And nothing there (a commented-out key with a typo) is unknown.
        for key in &documented {
            assert!(
                known.contains(key),
                "conf/resilio.toml documents unknown {key}"
            );
        }
    }

    #[test]
    fn values_override_defaults() {
        let c = apply(
            "[stall]\ntimeout = \"90s\"\nstartup_timeout = \"5m\"\n[diagnostics]\ndump_signal = \"USR2\"\n",
        )
        .unwrap();
        assert_eq!(c.stall.fixed_timeout, Some(Duration::from_secs(90)));
        assert_eq!(c.stall.startup_timeout, Duration::from_secs(300));
        assert_eq!(
            c.diagnostics.dump_signal,
            Some(nix::sys::signal::Signal::SIGUSR2)
        );
    }

    #[test]
    fn a_zero_kill_grace_is_kept_it_means_sigkill_at_once() {
        let c = apply("[run]\nkill_grace = \"0s\"\n").unwrap();
        assert_eq!(c.kill_grace, Duration::ZERO);
    }

    #[test]
    fn durations_may_be_bare_seconds() {
        let c = apply("[run]\nkill_grace = 5\n[stall]\nadaptive_floor = 0.5\n").unwrap();
        assert_eq!(c.kill_grace, Duration::from_secs(5));
        assert_eq!(c.stall.adaptive_floor, Duration::from_millis(500));
    }

    #[test]
    fn errors_name_file_and_line() {
        let cases = [
            ("[stall]\n\ntimeot = \"5s\"\n", 3, "unknown field"),
            ("[stall]\nstartup_timeout = \"5x\"\n", 2, "unknown unit"),
            ("\n[progress]\nregex = \"(unclosed\"\n", 3, "invalid regex"),
            (
                "[diagnostics]\ndump_signal = \"SIGFOO\"\n",
                2,
                "unknown signal",
            ),
            ("[stall]\nadaptive_factor = 0.5\n", 2, "adaptive_factor"),
            ("[run]\nkill_grace = true\n", 2, "expected a duration"),
            (
                "[failure]\nuser_patterns = [\n  \"ok\",\n  \"(bad\"]\n",
                2,
                "failure.user_patterns",
            ),
            ("[stall\n", 1, ""),
            (
                "[stall]\ntimeout = \"0s\"\n",
                2,
                "stall.timeout: must be greater than zero",
            ),
            (
                "[stall]\n\nstartup_timeout = 0\n",
                3,
                "stall.startup_timeout must be greater than zero",
            ),
            (
                "[stall]\ncheckpoint_timeout = \"0m\"\n",
                2,
                "stall.checkpoint_timeout",
            ),
            ("[stall]\neval_timeout = 0.0\n", 2, "stall.eval_timeout"),
            (
                "[stall]\nadaptive_floor = \"0ms\"\n",
                2,
                "stall.adaptive_floor",
            ),
            ("[stall]\ntimeout = \"-5s\"\n", 2, "must not be negative"),
            ("[stall]\nstartup_timeout = -5\n", 2, "must not be negative"),
            ("[health]\ntimeout = \"0s\"\n", 2, "health.timeout"),
            (
                "[diagnostics]\npy_spy_timeout = 0\n",
                2,
                "diagnostics.py_spy_timeout",
            ),
            (
                "[coordinator]\nlost_after = \"0s\"\n",
                2,
                "coordinator.lost_after",
            ),
        ];
        for (text, line, needle) in cases {
            let err = apply(text).unwrap_err();
            let msg = err.to_string();
            assert!(msg.starts_with(&format!("test.toml:{line}: ")), "{msg}");
            assert!(msg.contains(needle), "{msg}");
            assert!(!msg.contains('\n'), "one line: {msg}");
            assert_eq!(err.exit_code(), crate::error::EXIT_USAGE);
        }
    }
}
