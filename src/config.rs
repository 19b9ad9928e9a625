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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    run: RunSection,
    #[serde(default)]
    progress: ProgressSection,
    #[serde(default)]
    stall: StallSection,
    #[serde(default)]
    diagnostics: DiagnosticsSection,
    #[serde(default)]
    journal: JournalSection,
    #[serde(default)]
    failure: FailureSection,
    #[serde(default)]
    checkpoint: CheckpointSection,
    #[serde(default)]
    slurm: SlurmSection,
    #[serde(default)]
    health: HealthSection,
    #[serde(default)]
    coordinator: CoordinatorSection,
    #[serde(default)]
    straggler: StragglerSection,
    #[serde(default)]
    nodes: NodesSection,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NodesSection {
    exclude_at_start: Option<bool>,
    threshold: Option<Spanned<f64>>,
    #[serde(default, with = "serde_text::option")]
    half_life: Option<Duration>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CoordinatorSection {
    enabled: Option<bool>,
    bind: Option<Spanned<String>>,
    #[serde(default, with = "serde_text::option")]
    report_interval: Option<Duration>,
    signal_trainer: Option<bool>,
    #[serde(default, with = "serde_text::option")]
    hang_wait: Option<Duration>,
    #[serde(default, with = "serde_text::option")]
    checkpoint_lead: Option<Duration>,
    /// "none" or a duration.
    checkpoint_every: Option<Spanned<String>>,
    lost_after: Option<Spanned<Dur>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StragglerSection {
    #[serde(default, with = "serde_text::option")]
    window: Option<Duration>,
    margin: Option<Spanned<f64>>,
    windows: Option<Spanned<u32>>,
    min_samples: Option<u64>,
    checkpoint: Option<bool>,
    exclude: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct HealthSection {
    command: Option<Spanned<Vec<String>>>,
    timeout: Option<Spanned<Dur>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CheckpointSection {
    signal: Option<Spanned<String>>,
    #[serde(default, with = "serde_text::option")]
    wait: Option<Duration>,
    watch_dir: Option<PathBuf>,
    watch_regex: Option<Spanned<String>>,
    #[serde(default, with = "serde_text::option")]
    watch_poll: Option<Duration>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SlurmSection {
    pre_timeout_signal: Option<Spanned<String>>,
    forward_signals: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FailureSection {
    ignore_patterns: Option<Spanned<Vec<String>>>,
    user_patterns: Option<Spanned<Vec<String>>>,
    secondary_patterns: Option<Spanned<Vec<String>>>,
    infrastructure_patterns: Option<Spanned<Vec<String>>>,
    generic_patterns: Option<Spanned<Vec<String>>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RunSection {
    state_dir: Option<PathBuf>,
    #[serde(default, with = "serde_text::option")]
    kill_grace: Option<Duration>,
    max_restarts: Option<u32>,
    restart_in_allocation: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ProgressSection {
    regex: Option<Spanned<String>>,
    checkpoint_regex: Option<Spanned<String>>,
    eval_regex: Option<Spanned<String>>,
    file: Option<PathBuf>,
    file_poll: Option<PollMode>,
    #[serde(default, with = "serde_text::option")]
    file_poll_interval: Option<Duration>,
    python_unbuffered: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StallSection {
    startup_timeout: Option<Spanned<Dur>>,
    /// A fixed timeout; `"adaptive"` or absent means adaptive.
    timeout: Option<Spanned<String>>,
    adaptive_factor: Option<Spanned<f64>>,
    adaptive_percentile: Option<Spanned<f64>>,
    adaptive_floor: Option<Spanned<Dur>>,
    adaptive_window: Option<Spanned<usize>>,
    checkpoint_timeout: Option<Spanned<Dur>>,
    eval_timeout: Option<Spanned<Dur>>,
    #[serde(default, with = "serde_text::option")]
    kill_grace: Option<Duration>,
    in_step_phases: Option<Spanned<Vec<String>>>,
    phase_timeouts: Option<BTreeMap<String, Spanned<String>>>,
}

/// A duration written as text or seconds, kept with its place in the file
/// (`Spanned<Dur>`) so that a value out of range is reported as `file:line`.
#[derive(Deserialize)]
#[serde(transparent)]
struct Dur(#[serde(with = "serde_text")] Duration);

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DiagnosticsSection {
    dump_signal: Option<Spanned<String>>,
    #[serde(default, with = "serde_text::option")]
    dump_wait: Option<Duration>,
    py_spy: Option<bool>,
    py_spy_timeout: Option<Spanned<Dur>>,
    tail_lines: Option<usize>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct JournalSection {
    #[serde(default, with = "serde_text::option")]
    progress_interval: Option<Duration>,
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
        let err_at = |offset: usize, message: String| Error::Config {
            path: path.to_path_buf(),
            line: line_of(text, offset),
            message,
        };
        let file: FileConfig = toml::from_str(text).map_err(|e| {
            let offset = e.span().map(|s| s.start).unwrap_or(0);
            err_at(offset, e.message().trim().replace('\n', " "))
        })?;
        // Timeouts: zero would fire at once (a trainer killed after its
        // first step), so it is an error, never "no timeout".
        let timeout = |d: Spanned<Dur>, key: &str| -> Result<Duration> {
            let start = d.span().start;
            let v = d.into_inner().0;
            if v.is_zero() {
                Err(err_at(start, format!("{key} must be greater than zero")))
            } else {
                Ok(v)
            }
        };

        if let Some(dir) = file.run.state_dir {
            self.state_dir = dir;
        }
        if let Some(d) = file.run.kill_grace {
            self.kill_grace = d;
        }
        if let Some(n) = file.run.max_restarts {
            self.max_restarts = n;
        }
        if let Some(b) = file.run.restart_in_allocation {
            self.restart_in_allocation = b;
        }

        let p = file.progress;
        if let Some(re) = p.regex {
            self.progress.regex =
                compile_regex(re.get_ref()).map_err(|m| err_at(re.span().start, m))?;
        }
        for (field, target) in [
            (p.checkpoint_regex, &mut self.progress.checkpoint_regex),
            (p.eval_regex, &mut self.progress.eval_regex),
        ] {
            if let Some(re) = field {
                *target = if re.get_ref().is_empty() {
                    None
                } else {
                    Some(compile_regex(re.get_ref()).map_err(|m| err_at(re.span().start, m))?)
                };
            }
        }
        if let Some(f) = p.file {
            self.progress.file = Some(f);
        }
        if let Some(m) = p.file_poll {
            self.progress.file_poll = m;
        }
        if let Some(d) = p.file_poll_interval {
            self.progress.file_poll_interval = d.max(Duration::from_millis(10));
        }
        if let Some(b) = p.python_unbuffered {
            self.progress.python_unbuffered = b;
        }

        let s = file.stall;
        if let Some(d) = s.startup_timeout {
            self.stall.startup_timeout = timeout(d, "stall.startup_timeout")?;
        }
        if let Some(t) = s.timeout {
            let value = t.get_ref().trim();
            self.stall.fixed_timeout = if value == "adaptive" {
                None
            } else {
                Some(crate::duration::parse_positive(value).map_err(|m| {
                    err_at(
                        t.span().start,
                        format!("stall.timeout: {m}; \"adaptive\" learns it from the steps"),
                    )
                })?)
            };
        }
        if let Some(f) = s.adaptive_factor {
            if !(*f.get_ref() >= 1.0 && f.get_ref().is_finite()) {
                return Err(err_at(
                    f.span().start,
                    "stall.adaptive_factor must be >= 1".into(),
                ));
            }
            self.stall.adaptive_factor = *f.get_ref();
        }
        if let Some(p) = s.adaptive_percentile {
            let v = *p.get_ref();
            if !(v > 0.0 && v <= 1.0) {
                return Err(err_at(
                    p.span().start,
                    "stall.adaptive_percentile must be in (0, 1]".into(),
                ));
            }
            self.stall.adaptive_percentile = v;
        }
        if let Some(d) = s.adaptive_floor {
            self.stall.adaptive_floor = timeout(d, "stall.adaptive_floor")?;
        }
        if let Some(w) = s.adaptive_window {
            if *w.get_ref() == 0 {
                return Err(err_at(
                    w.span().start,
                    "stall.adaptive_window must be >= 1".into(),
                ));
            }
            self.stall.adaptive_window = *w.get_ref();
        }
        if let Some(d) = s.checkpoint_timeout {
            self.stall.checkpoint_timeout = timeout(d, "stall.checkpoint_timeout")?;
        }
        if let Some(d) = s.eval_timeout {
            self.stall.eval_timeout = timeout(d, "stall.eval_timeout")?;
        }
        if let Some(d) = s.kill_grace {
            self.stall_kill_grace = d;
        }
        let phase_name = |n: &str| {
            let n = n.trim().to_ascii_lowercase();
            (!n.is_empty()
                && n.len() <= 64
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
            .then_some(n)
        };
        if let Some(list) = s.in_step_phases {
            let mut names = Vec::new();
            for n in list.get_ref() {
                names.push(phase_name(n).ok_or_else(|| {
                    err_at(
                        list.span().start,
                        format!("stall.in_step_phases: '{n}' is not a phase name (letters, digits, _ and -)"),
                    )
                })?);
            }
            self.stall.in_step_phases = names;
        }
        if let Some(map) = s.phase_timeouts {
            for (name, t) in map {
                let n = phase_name(&name).ok_or_else(|| {
                    err_at(
                        t.span().start,
                        format!("stall.phase_timeouts: '{name}' is not a phase name (letters, digits, _ and -)"),
                    )
                })?;
                let d = crate::duration::parse(t.get_ref().trim())
                    .and_then(|d| {
                        if d.is_zero() {
                            Err("must be longer than zero".to_string())
                        } else {
                            Ok(d)
                        }
                    })
                    .map_err(|m| {
                        err_at(t.span().start, format!("stall.phase_timeouts.{name}: {m}"))
                    })?;
                self.stall.phase_timeouts.insert(n, d);
            }
        }

        let d = file.diagnostics;
        if let Some(sig) = d.dump_signal {
            let value = sig.get_ref().trim();
            self.diagnostics.dump_signal = if value.is_empty() || value == "none" {
                None
            } else {
                Some(parse_signal(value).map_err(|m| err_at(sig.span().start, m))?)
            };
        }
        if let Some(w) = d.dump_wait {
            self.diagnostics.dump_wait = w;
        }
        if let Some(b) = d.py_spy {
            self.diagnostics.py_spy = b;
        }
        if let Some(t) = d.py_spy_timeout {
            self.diagnostics.py_spy_timeout = timeout(t, "diagnostics.py_spy_timeout")?;
        }
        if let Some(n) = d.tail_lines {
            self.diagnostics.tail_lines = n;
        }
        if let Some(i) = file.journal.progress_interval {
            self.journal_progress_interval = i;
        }
        if let Some(sig) = file.checkpoint.signal {
            let value = sig.get_ref().trim();
            self.checkpoint_signal = if value.is_empty() || value == "none" {
                None
            } else {
                Some(parse_signal(value).map_err(|m| err_at(sig.span().start, m))?)
            };
        }
        if let Some(w) = file.checkpoint.wait {
            self.checkpoint_wait = w;
        }
        if let Some(d) = file.checkpoint.watch_dir {
            self.checkpoint_watch_dir = (!d.as_os_str().is_empty()).then_some(d);
        }
        if let Some(re) = file.checkpoint.watch_regex {
            self.checkpoint_watch_regex = regex::Regex::new(re.get_ref()).map_err(|e| {
                err_at(
                    re.span().start,
                    format!(
                        "checkpoint.watch_regex: {}",
                        e.to_string().lines().last().unwrap_or("")
                    ),
                )
            })?;
        }
        if let Some(p) = file.checkpoint.watch_poll {
            self.checkpoint_watch_poll = p.max(Duration::from_millis(100));
        }
        if let Some(sig) = file.slurm.pre_timeout_signal {
            self.pre_timeout_signal =
                parse_signal(sig.get_ref()).map_err(|m| err_at(sig.span().start, m))?;
        }
        if let Some(cmd) = file.health.command {
            if cmd.get_ref().is_empty() {
                self.health.command = None;
            } else {
                self.health.command = Some(cmd.get_ref().clone());
            }
        }
        if let Some(t) = file.health.timeout {
            self.health.timeout = timeout(t, "health.timeout")?;
        }
        if let Some(b) = file.slurm.forward_signals {
            self.slurm_forward_signals = b;
        }
        let c = file.coordinator;
        let cs = &mut self.coordinator;
        if let Some(b) = c.enabled {
            cs.enabled = b;
        }
        if let Some(b) = c.bind {
            let v = b.get_ref().trim().to_string();
            crate::coordinator::bind_address(&v, false).map_err(|m| err_at(b.span().start, m))?;
            cs.bind = v;
        }
        if let Some(d) = c.report_interval {
            cs.report_interval = d.max(Duration::from_millis(50));
        }
        if let Some(b) = c.signal_trainer {
            cs.signal_trainer = b;
        }
        if let Some(d) = c.hang_wait {
            cs.policy.hang_wait = d;
        }
        if let Some(d) = c.checkpoint_lead {
            cs.policy.checkpoint_lead = d;
        }
        if let Some(e) = c.checkpoint_every {
            let v = e.get_ref().trim();
            cs.policy.checkpoint_advised = v == "advised";
            cs.policy.checkpoint_every = if v == "none" || v.is_empty() || v == "advised" {
                None
            } else {
                Some(crate::duration::parse(v).map_err(|m| {
                    err_at(e.span().start, format!("coordinator.checkpoint_every: {m}"))
                })?)
            };
        }
        if let Some(d) = c.lost_after {
            cs.policy.lost_after = timeout(d, "coordinator.lost_after")?;
        }
        // The coordinator's checkpoint wait is the one the pre-timeout uses.
        cs.policy.checkpoint_wait = self.checkpoint_wait;
        let st = file.straggler;
        let sp = &mut cs.policy.straggler;
        if let Some(d) = st.window {
            sp.window = d.max(Duration::from_millis(100));
        }
        if let Some(m) = st.margin {
            if !(*m.get_ref() >= 0.0 && m.get_ref().is_finite()) {
                return Err(err_at(
                    m.span().start,
                    "straggler.margin must be >= 0".into(),
                ));
            }
            sp.margin = *m.get_ref();
        }
        if let Some(w) = st.windows {
            if *w.get_ref() == 0 {
                return Err(err_at(
                    w.span().start,
                    "straggler.windows must be >= 1".into(),
                ));
            }
            sp.windows = *w.get_ref();
        }
        if let Some(n) = st.min_samples {
            sp.min_samples = n.max(1);
        }
        if let Some(b) = st.checkpoint {
            cs.policy.checkpoint_on_straggler = b;
        }
        if let Some(b) = st.exclude {
            cs.policy.exclude_confirmed_stragglers = b;
        }
        let n = file.nodes;
        if let Some(b) = n.exclude_at_start {
            self.nodes.exclude_at_start = b;
        }
        if let Some(t) = n.threshold {
            if !(*t.get_ref() > 0.0 && t.get_ref().is_finite()) {
                return Err(err_at(
                    t.span().start,
                    "nodes.threshold must be a positive number".into(),
                ));
            }
            self.nodes.threshold = *t.get_ref();
        }
        if let Some(d) = n.half_life {
            self.nodes.half_life = d.max(Duration::from_secs(1));
        }
        let f = file.failure;
        let lists = [
            (f.infrastructure_patterns, "infrastructure"),
            (f.secondary_patterns, "secondary"),
            (f.user_patterns, "user"),
            (f.ignore_patterns, "ignore"),
            (f.generic_patterns, "generic"),
        ];
        if lists.iter().any(|(l, _)| l.is_some()) {
            let mut p = self
                .failure_patterns
                .take()
                .unwrap_or_else(crate::policy::failure::Patterns::defaults);
            for (field, what) in lists {
                let Some(list) = field else { continue };
                let compiled =
                    crate::policy::failure::compile_list(list.get_ref(), what).map_err(|m| {
                        err_at(list.span().start, format!("failure.{what}_patterns: {m}"))
                    })?;
                match what {
                    "infrastructure" => p.infrastructure = compiled,
                    "secondary" => p.secondary = compiled,
                    "user" => p.user = compiled,
                    "ignore" => p.ignore = compiled,
                    _ => p.generic = compiled,
                }
            }
            self.failure_patterns = Some(p);
        }
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
