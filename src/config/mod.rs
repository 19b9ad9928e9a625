//! Layered configuration: built-in defaults, then `/etc/resilio/resilio.toml`
//! (or `$RESILIO_SYSTEM_CONFIG`), then the user's `--config` file, then flags.
//!
//! Every file is parsed strictly (unknown keys are errors) and every error
//! names `file:line`. `conf/resilio.toml` documents each key with its default.

mod file;
mod show;
#[cfg(test)]
use file::SECTIONS;
pub use show::show;

use crate::error::{Error, Result};
use crate::policy::stall::StallConfig;
use regex::bytes::Regex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// Read the Python stacks of each Python process of the rank: in-process
    /// (the py-spy crate), else with a `py-spy` on PATH.
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
    /// Under Slurm: serve `/metrics` read-only, without the token, on a
    /// port of its own, registered for the site's Prometheus under
    /// `STATE_DIR/prometheus/` (`file_sd_configs`).
    pub site_metrics: bool,
    /// Whether a node's first rank relays its node's reports (`auto`, `on`, `off`).
    pub node_relay: crate::coordinator::relay::NodeRelay,
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
            site_metrics: true,
            node_relay: crate::coordinator::relay::NodeRelay::Auto,
            policy: Default::default(),
        }
    }
}

/// The fully resolved configuration of one `resilio run`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Root of journals: `STATE_DIR/jobs/JOB/`.
    pub state_dir: PathBuf,
    /// Observe mode: detection, diagnostics, verdicts and decisions are
    /// journaled and reported ("would have stopped rank 1"), nothing is
    /// stopped or restarted.
    pub observe: bool,
    /// The user's file it was loaded from (`--config`), if any.
    pub user_file: Option<PathBuf>,
    /// Time between SIGTERM and SIGKILL when stopping the trainer.
    pub kill_grace: Duration,
    /// Restarts allowed after failures, in place, inside the allocation or by
    /// requeue (time-limit requeues do not count).
    pub max_restarts: u32,
    /// Restarts in a row that may bring no progress (no newer whole
    /// checkpoint, no step beyond the best before) before the job is
    /// stopped with exit code 93, whatever the failures (0: never).
    pub no_progress_restarts: u32,
    /// In a batch script, relaunch a failed step inside the allocation
    /// (leaving blamed nodes out when spare nodes exist) before requeueing.
    pub restart_in_allocation: bool,
    /// In a batch script: a step none of whose ranks reported within this
    /// long of srun's start is killed and judged launch trouble (0: never).
    pub step_start_timeout: Duration,
    /// In a batch script: when Slurm requeues the job itself after a node
    /// failure and the job held spare nodes, lower its node count by the
    /// nodes lost (never below the step's), so it starts on what is left.
    pub shrink_after_node_failure: bool,
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
    pub failure_patterns: Option<crate::policy::patterns::Patterns>,
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
    /// `report` warns when a save takes more than this share of the
    /// interval between saves.
    pub checkpoint_warn_share: f64,
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
    /// What the trainer does not print, for throughput and MFU (`[throughput]`).
    pub throughput: ThroughputConfig,
    /// Loss gone to NaN, loss spikes (`[numerical]`).
    pub numerical: crate::policy::numerical::NumericalConfig,
}

/// The peak TFLOP/s of one device, for MFU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Peak {
    /// From `nvidia-smi`'s device name and a built-in table (`crate::device`).
    Auto,
    /// Unknown: MFU only where the trainer prints it.
    Off,
    /// As given.
    Tflops(f64),
}

/// `[throughput]`: the run's numbers for throughput and MFU where the
/// trainer does not print them (0: unknown).
#[derive(Clone, Debug, PartialEq)]
pub struct ThroughputConfig {
    /// Tokens in one global step (global batch size × sequence length).
    pub tokens_per_step: u64,
    /// Model FLOPs per token of training (about 6 × parameters).
    pub flops_per_token: f64,
    /// The model's parameters: 6 × this is the FLOPs per token when
    /// `flops_per_token` is not given.
    pub parameters: f64,
    /// The sequence length: with the global batch size the trainer prints
    /// (Megatron, NeMo), the tokens of a step when `tokens_per_step` is not given.
    pub seq_len: u64,
    /// One device's peak TFLOP/s.
    pub peak_tflops: Peak,
    /// Devices (GPUs) each rank drives.
    pub devices_per_rank: u32,
}

impl Default for ThroughputConfig {
    fn default() -> Self {
        ThroughputConfig {
            tokens_per_step: 0,
            flops_per_token: 0.0,
            parameters: 0.0,
            seq_len: 0,
            peak_tflops: Peak::Auto,
            devices_per_rank: 1,
        }
    }
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

/// `$RESILIO_STATE_DIR` when set and not empty: it wins over `[run]
/// state_dir` in any file (and `--state-dir` over it).
pub fn state_dir_from_env() -> Option<PathBuf> {
    std::env::var_os("RESILIO_STATE_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// The default state directory: `$RESILIO_STATE_DIR`, else
/// `$XDG_STATE_HOME/resilio`, else `$HOME/.local/state/resilio` (HOME, or
/// the passwd entry's home directory), else `/tmp/resilio-state-$UID`
/// (checked to be this user's own by [`crate::state_dir::for_writer`]).
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = state_dir_from_env() {
        return dir;
    }
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("resilio");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".local/state/resilio");
    }
    // No HOME (a daemon's or a stripped environment): the passwd entry's.
    let uid = nix::unistd::getuid();
    if let Some(home) = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.dir)
        .filter(|d| d.is_dir() && d != Path::new("/"))
    {
        return home.join(".local/state/resilio");
    }
    crate::state_dir::tmp_fallback()
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: default_state_dir(),
            user_file: None,
            kill_grace: Duration::from_secs(30),
            stall_kill_grace: Duration::from_secs(5),
            max_restarts: 3,
            no_progress_restarts: crate::policy::restart::Budget::NO_PROGRESS,
            observe: false,
            restart_in_allocation: true,
            step_start_timeout: Duration::from_secs(300),
            shrink_after_node_failure: false,
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
            checkpoint_warn_share: 0.1,
            pre_timeout_signal: nix::sys::signal::Signal::SIGUSR1,
            slurm_forward_signals: false,
            health: HealthConfig::default(),
            coordinator: CoordinatorSettings::default(),
            nodes: NodesConfig::default(),
            throughput: ThroughputConfig::default(),
            numerical: Default::default(),
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

/// The system configuration file: the file `$RESILIO_SYSTEM_CONFIG` names
/// (which must exist; set empty: none), else [`SYSTEM_CONFIG`] when it
/// exists.
pub fn system_file() -> Result<Option<PathBuf>> {
    match std::env::var_os("RESILIO_SYSTEM_CONFIG") {
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => {
            let path = PathBuf::from(v);
            if path.exists() {
                Ok(Some(path))
            } else {
                Err(Error::Usage(format!(
                    "RESILIO_SYSTEM_CONFIG={}: no such file (unset it to read {SYSTEM_CONFIG}, or set it empty for no system configuration)",
                    path.display()
                )))
            }
        }
        None => {
            let path = PathBuf::from(SYSTEM_CONFIG);
            Ok(path.exists().then_some(path))
        }
    }
}

impl Config {
    /// The failure patterns in force: the configured lists, or the defaults.
    /// What bounds restarts: `max_restarts` and `no_progress_restarts`.
    pub fn budget(&self) -> crate::policy::restart::Budget {
        crate::policy::restart::Budget {
            max_restarts: self.max_restarts,
            no_progress: self.no_progress_restarts,
        }
    }

    pub fn patterns(&self) -> crate::policy::patterns::Patterns {
        self.failure_patterns
            .clone()
            .unwrap_or_else(crate::policy::patterns::Patterns::defaults)
    }

    /// Apply one TOML file on top of `self`. Errors name `path:line`.
    pub fn apply_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
            path: path.to_path_buf(),
            source,
        })?;
        self.apply_str(&text, path)
    }

    /// Defaults, then the system file (if present), then the user's file.
    pub fn load(user_file: Option<&Path>) -> Result<Config> {
        let mut cfg = Config::default();
        if let Some(system) = system_file()? {
            cfg.apply_file(&system)?;
        }
        if let Some(path) = user_file {
            cfg.apply_file(path)?;
            cfg.user_file = Some(path.to_path_buf());
        }
        // The environment is above the files, as flags are: a job level
        // passes its state dir to its steps this way.
        if let Some(dir) = state_dir_from_env() {
            cfg.state_dir = dir;
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
        let text = include_str!("../../conf/resilio.toml");
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
    fn a_value_of_the_wrong_type_names_its_key_and_line() {
        for (text, want) in [
            (
                "[run]\nno_progress_restarts = \"abc\"\n",
                "test.toml:2: run.no_progress_restarts: invalid type: string \"abc\", expected u32",
            ),
            (
                "# x\n[run]\n\nmax_restarts = -1\n",
                "test.toml:4: run.max_restarts: invalid value: integer `-1`, expected u32",
            ),
        ] {
            assert_eq!(apply(text).unwrap_err().to_string(), want);
        }
        // An unknown key names itself already.
        let e = apply("[run]\nfoo = 1\n").unwrap_err().to_string();
        assert!(e.starts_with("test.toml:2: unknown field `foo`"), "{e}");
    }

    #[test]
    fn documented_default_file_sets_every_field_to_its_default() {
        // Every field, not only the ones compared above: the Debug form
        // shows each value (regexes by their source).
        let c = apply(include_str!("../../conf/resilio.toml")).unwrap();
        assert_eq!(format!("{c:#?}"), format!("{:#?}", Config::default()));
    }

    #[test]
    fn every_key_is_documented_in_conf_resilio_toml() {
        // Each key of every section is written in conf/resilio.toml with its
        // default, or commented out where the default is not a value (a
        // built-in list, a path from the environment, a long regex).
        let mut documented = std::collections::BTreeSet::new();
        let mut section = String::new();
        for line in include_str!("../../conf/resilio.toml").lines() {
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
