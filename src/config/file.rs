//! Reading one configuration file: strictly (unknown keys are errors), each
//! section declared once as a table of keys and the check that stores each
//! value, every error naming `file:line`.

use super::*;
use crate::duration::serde_text;
use serde::Deserialize;
use toml::Spanned;

impl Config {
    /// Apply TOML text (named `path` in errors) on top of `self`.
    pub fn apply_str(&mut self, text: &str, path: &Path) -> Result<()> {
        let src = ConfigText { path, text };
        let file: FileConfig = toml::from_str(text).map_err(|e| {
            let offset = e.span().map(|s| s.start).unwrap_or(0);
            let message = e.message().trim().replace('\n', " ");
            // A value of the wrong type: which key (toml says only
            // "expected u32"; trial 16).
            let message = match key_at(text, offset) {
                Some(key) if !message.contains(key.rsplit('.').next().unwrap_or(&key)) => {
                    format!("{key}: {message}")
                }
                _ => message,
            };
            src.error(offset, message)
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
        file.throughput.apply(self, &src)?;
        file.numerical.apply(self, &src)?;
        file.slowdown.apply(self, &src)?;
        // The coordinator's checkpoint wait is the one the pre-timeout uses.
        self.coordinator.policy.checkpoint_wait = self.checkpoint_wait;
        Ok(())
    }
}

/// `section.key` of the `key = value` line holding `offset`, if it is one.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?;
    let key = line.split('=').next()?.trim();
    let bare = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
    };
    if !line.contains('=') || !bare(key) {
        return None;
    }
    let section = text[..start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && l.ends_with(']'))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim());
    Some(match section {
        Some(s) if bare(s) => format!("{s}.{key}"),
        _ => key.to_string(),
    })
}

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
struct ConfigText<'a> {
    path: &'a Path,
    text: &'a str,
}

impl ConfigText<'_> {
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
            fn apply(self, cfg: &mut Config, src: &ConfigText) -> Result<()> {
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
    no_progress_restarts: u32 => no_progress_restarts by set,
    observe: bool => observe by set,
    restart_in_allocation: bool => restart_in_allocation by set,
    step_start_timeout: Dur => step_start_timeout by duration,
    shrink_after_node_failure: bool => shrink_after_node_failure by set,
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
    warn_share: f64 => checkpoint_warn_share by fraction,
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
    site_metrics: bool => coordinator.site_metrics by set,
    node_relay: String => coordinator.node_relay by node_relay,
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

section!(ThroughputSection "throughput" {
    tokens_per_step: u64 => throughput.tokens_per_step by set,
    flops_per_token: f64 => throughput.flops_per_token by non_negative,
    parameters: f64 => throughput.parameters by non_negative,
    seq_len: u64 => throughput.seq_len by set,
    peak_tflops: NumOrText => throughput.peak_tflops by peak,
    devices_per_rank: u32 => throughput.devices_per_rank by count,
});

section!(SlowdownSection "slowdown" {
    threshold: f64 => coordinator.policy.slowdown.threshold by non_negative,
    sustain: Dur => coordinator.policy.slowdown.sustain by duration,
    baseline_windows: usize => coordinator.policy.slowdown.baseline_windows by count,
    warmup_windows: u32 => coordinator.policy.slowdown.warmup_windows by set,
    action: String => coordinator.policy.slowdown.action by slow_action,
});

section!(NumericalSection "numerical" {
    nan_steps: u32 => numerical.nan_steps by count,
    nan_action: String => numerical.nan_action by numerical_act,
    spike_factor: f64 => numerical.spike_factor by non_negative,
    spike_steps: u32 => numerical.spike_steps by count,
    spike_window: usize => numerical.spike_window by count,
    spike_action: String => numerical.spike_action by numerical_act,
});

section!(@keys FailureSection "failure" {
    ignore_patterns: Vec<String>,
    ambiguous_patterns: Vec<String>,
    user_patterns: Vec<String>,
    secondary_patterns: Vec<String>,
    infrastructure_patterns: Vec<String>,
    generic_patterns: Vec<String>,
});

impl FailureSection {
    /// A list set replaces the built-in one (the others stay built in);
    /// they are checked in the classifier's order, infrastructure first.
    fn apply(self, cfg: &mut Config, src: &ConfigText) -> Result<()> {
        let FailureSection {
            ignore_patterns,
            ambiguous_patterns,
            user_patterns,
            secondary_patterns,
            infrastructure_patterns,
            generic_patterns,
        } = self;
        let lists = [
            &infrastructure_patterns,
            &secondary_patterns,
            &ambiguous_patterns,
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
            .unwrap_or_else(crate::policy::patterns::Patterns::defaults);
        for (list, what, out) in [
            (
                infrastructure_patterns,
                "infrastructure",
                &mut p.infrastructure,
            ),
            (secondary_patterns, "secondary", &mut p.secondary),
            (ambiguous_patterns, "ambiguous", &mut p.ambiguous),
            (user_patterns, "user", &mut p.user),
            (ignore_patterns, "ignore", &mut p.ignore),
            (generic_patterns, "generic", &mut p.generic),
        ] {
            let Some(list) = list else { continue };
            *out = crate::policy::patterns::compile_list(list.get_ref(), what).map_err(|m| {
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
        /// keys (`config show` lists them in this order; tests check them).
        pub(super) const SECTIONS: &[(&str, &str, &[&str])] =
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
    throughput: ThroughputSection,
    numerical: NumericalSection,
    slowdown: SlowdownSection,
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

/// `"record"`, `"checkpoint"` or `"exclude"`.
fn slow_action(value: String, key: &str, out: &mut crate::policy::slowdown::SlowAction) -> Stored {
    *out = crate::policy::slowdown::SlowAction::parse(&value).ok_or_else(|| {
        format!("{key} must be \"record\", \"checkpoint\" or \"exclude\", not {value:?}")
    })?;
    Ok(())
}

/// `"record"`, `"stop"` or `"rollback"`.
fn numerical_act(value: String, key: &str, out: &mut crate::policy::numerical::Act) -> Stored {
    *out = crate::policy::numerical::Act::parse(&value).ok_or_else(|| {
        format!("{key} must be \"record\", \"stop\" or \"rollback\", not {value:?}")
    })?;
    Ok(())
}

/// A number, or a word (`"auto"`).
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrText {
    Num(f64),
    Text(String),
}

/// `"auto"`, `"none"`, or a positive number of TFLOP/s.
fn peak(value: NumOrText, key: &str, out: &mut Peak) -> Stored {
    *out = match value {
        NumOrText::Text(t) if t == "auto" => Peak::Auto,
        NumOrText::Text(t) if t == "none" => Peak::Off,
        NumOrText::Num(v) if v > 0.0 && v.is_finite() => Peak::Tflops(v),
        NumOrText::Num(_) => return Err(format!("{key} must be a positive number").into()),
        NumOrText::Text(t) => {
            return Err(format!("{key} must be \"auto\", \"none\" or a number, not {t:?}").into())
        }
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

/// `"auto"`, `"on"` or `"off"`.
fn node_relay(value: String, key: &str, out: &mut crate::coordinator::relay::NodeRelay) -> Stored {
    *out = match value.trim() {
        "auto" => crate::coordinator::relay::NodeRelay::Auto,
        "on" => crate::coordinator::relay::NodeRelay::On,
        "off" => crate::coordinator::relay::NodeRelay::Off,
        other => return Err(format!("{key}: {other:?} is not auto, on or off").into()),
    };
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

pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}
