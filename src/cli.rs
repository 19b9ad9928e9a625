//! The command line. Parses, resolves configuration, dispatches; every error
//! becomes one line on stderr and a distinct exit code (see [`crate::error`]).

use crate::analysis::report;
use crate::config::{self, Config};
use crate::error::{Error, Result, EXIT_USAGE};
use crate::journal;
use crate::rank::{self, RunOptions};
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "resilio",
    version,
    about = "Resilient supervisor for ML training jobs: progress, hangs, journal, reports",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More of resilio's own diagnostics (-v debug, -vv trace); RESILIO_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Supervise a training command: resilio run [OPTIONS] -- COMMAND [ARGS...]
    Run(RunArgs),
    /// ETTR and where the time went, from the job's journal
    Report(ReportArgs),
    /// One line per event that mattered, by attempt
    Timeline(TimelineArgs),
    /// Failure history of nodes across all jobs, for admins
    Nodes(NodesArgs),
    /// The live job: ranks, steps, stragglers, checkpoints (asks its coordinator)
    Status(StatusArgs),
    /// Ask every rank of a running job to checkpoint at the same step
    Checkpoint(CheckpointArgs),
    /// A local run with an injected hang, end to end (no Slurm needed)
    Demo(DemoArgs),
    /// A ready sbatch script for a common setup, every line commented
    Template(TemplateArgs),
    /// Check a configuration file (and the system one) before deploying it
    Config(ConfigArgs),
    /// A shell completion script, on stdout
    Completions(CompletionsArgs),
    /// Site administration: set up a state dir shared by every user
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Man pages, one per subcommand (resilio.1, resilio-run.1, ...)
    Man(ManArgs),
    /// A standalone coordinator for a job (tests and benchmarks; internal)
    #[command(name = "__coordinator", hide = true)]
    Coordinator(CoordinatorArgs),
    /// The scripted trainer the demo runs (internal)
    #[command(name = "__demo-trainer", hide = true)]
    DemoTrainer(crate::demo::TrainerArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Configuration file (TOML), applied over /etc/resilio/resilio.toml
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where journals live [env: RESILIO_STATE_DIR] [default: $XDG_STATE_HOME/resilio, else ~/.local/state/resilio]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Fixed stall timeout between steps (e.g. 90s, 5m); "adaptive" to learn it
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    stall_timeout: Option<String>,
    /// Allowed time from launch to the first step (default 30m)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    startup_timeout: Option<String>,
    /// Adaptive stall limit: never below this (default 20s)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    stall_floor: Option<String>,
    /// Allowed duration of an evaluation the trainer announces (default 30m)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    eval_timeout: Option<String>,
    /// Allowed duration of a checkpoint save the trainer announces (default 30m)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    checkpoint_timeout: Option<String>,
    /// Observe only: detect, judge and decide as usual, journal and report what would have been done, stop and restart nothing
    #[arg(long)]
    observe: bool,
    /// Regex over output lines; capture group 1 (or `step`) is the step
    #[arg(long, value_name = "RE")]
    progress_regex: Option<String>,
    /// A file the trainer rewrites as it progresses
    #[arg(long, value_name = "FILE")]
    progress_file: Option<PathBuf>,
    /// Time between SIGTERM and SIGKILL when stopping the trainer (default 30s; 0: SIGKILL at once)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    kill_grace: Option<String>,
    /// Signal sent to the trainer on a stall so it dumps its stacks (e.g. SIGUSR2)
    #[arg(long, value_name = "SIG")]
    dump_signal: Option<String>,
    /// Restarts allowed after failures: in place outside Slurm, inside the allocation or by requeue in a batch script (default 3; 0: one attempt)
    #[arg(long, value_name = "N")]
    max_restarts: Option<u32>,
    /// Job id outside Slurm (under Slurm it is SLURM_JOB_ID)
    #[arg(long, value_name = "ID")]
    job_id: Option<String>,
    /// Local mode: launch N ranks on this machine (torchrun variables set),
    /// with a coordinator and in-place restarts (--max-restarts); without
    /// it, outside Slurm, the command is one such rank
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    ntasks: Option<u32>,
    /// Local mode with several ranks: prefix each output line with its rank
    /// ("0: "), as `srun --label` does (off: output passes byte for byte)
    #[arg(long, requires = "ntasks")]
    label: bool,
    /// The command to supervise
    #[arg(last = true, value_name = "COMMAND", num_args = 0..)]
    command: Vec<OsString>,
}

#[derive(Args, Debug)]
struct CoordinatorArgs {
    /// Job id
    #[arg(long)]
    job_id: String,
    /// Ranks expected
    #[arg(long, default_value_t = 1)]
    world_size: u32,
    /// Address to bind (default 127.0.0.1:0)
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: String,
    /// Configuration file (its [coordinator] and [straggler] sections apply)
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where journals live [env: RESILIO_STATE_DIR]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Come back in place of the job's dead coordinator: its address and
    /// token, from the files it left (the ranks report here again)
    #[arg(long, conflicts_with = "bind")]
    take_over: bool,
}

#[derive(Args, Debug)]
struct ConfigArgs {
    #[command(subcommand)]
    action: ConfigAction,
}

#[derive(Subcommand, Debug)]
enum ConfigAction {
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

#[derive(Subcommand, Debug)]
enum AdminCommand {
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

#[derive(Args, Debug)]
struct CompletionsArgs {
    /// The shell
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
struct ManArgs {
    /// Directory to write the pages into
    #[arg(long, value_name = "DIR", default_value = ".")]
    dir: PathBuf,
}

#[derive(Args, Debug)]
struct TemplateArgs {
    /// The framework the job trains with
    #[arg(value_enum)]
    kind: crate::template::Kind,
    /// Nodes of the training step
    #[arg(long, default_value_t = 2)]
    nodes: u32,
    /// Spare nodes on top, that replace a failed node inside the allocation
    #[arg(long, default_value_t = 1)]
    spares: u32,
    /// GPUs per node, one rank each (0: one rank per node, no GPU request)
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Time limit, as sbatch takes it
    #[arg(long, default_value = "24:00:00")]
    time: String,
    /// Seconds before the time limit to checkpoint every rank (0: none)
    #[arg(long, default_value_t = 300)]
    signal_lead: u32,
    /// Restarts allowed after failures
    #[arg(long, default_value_t = 3)]
    max_restarts: u32,
    /// The job's name
    #[arg(long, default_value = "train")]
    job_name: String,
    /// RESILIO_STATE_DIR in the script [default: the site's [run] state_dir, else ~/.local/state/resilio]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<String>,
    /// Write the script here (mode 0755) instead of stdout
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The training command [default: the framework's usual one]
    #[arg(last = true, value_name = "COMMAND", num_args = 0..)]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct StatusArgs {
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
struct CheckpointArgs {
    #[command(flatten)]
    common: StatusArgs,
    /// Why (journaled with the request)
    #[arg(long, default_value = "operator")]
    reason: String,
    /// How long to wait for the ranks to confirm (0: do not wait)
    #[arg(long, value_name = "DUR", default_value = "30s")]
    wait: String,
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// Job id (default: the most recently written job)
    job: Option<String>,
    /// Machine-readable output
    #[arg(long)]
    json: bool,
    /// Where journals live [env: RESILIO_STATE_DIR]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Which run of a job id used more than once: 1 for the first, or a run
    /// key (default: the latest)
    #[arg(long, value_name = "N|KEY")]
    run: Option<String>,
}

#[derive(Args, Debug)]
struct TimelineArgs {
    #[command(flatten)]
    common: ReportArgs,
    /// Also write a self-contained HTML timeline (inline SVG) to FILE ("-": standard output)
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct NodesArgs {
    /// Machine-readable output
    #[arg(long, conflicts_with_all = ["exclude_list", "drain", "prometheus"])]
    json: bool,
    /// Prometheus text format, for node_exporter's textfile collector
    /// (node scores, listed nodes, failures by class, fleet totals)
    #[arg(long, conflicts_with_all = ["exclude_list", "drain"])]
    prometheus: bool,
    /// Print a Slurm hostlist of nodes at or above the threshold (for sbatch --exclude=)
    #[arg(long, conflicts_with = "drain")]
    exclude_list: bool,
    /// Drain the nodes at or above the threshold with scontrol
    #[arg(long)]
    drain: bool,
    /// With --drain: print the commands instead of running them
    #[arg(long, requires = "drain")]
    dry_run: bool,
    /// Score at which a node is listed or drained: a new failure scores 1.0,
    /// halving every half-life, so 0.9 keeps one failure listed for about a
    /// day and two for about a week (with the default half-life)
    #[arg(long, default_value_t = 0.9)]
    threshold: f64,
    /// Time for a failure's weight to halve (e.g. 7d, 72h)
    #[arg(long, default_value = "7d")]
    half_life: String,
    /// Journals only: do not ask sacct for NODE_FAIL records
    #[arg(long)]
    no_sacct: bool,
    /// Where journals live [env: RESILIO_STATE_DIR]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// Where the demo's journal goes (default: a new directory under /tmp)
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// A command-line error in one line that says what to do: the missing
/// arguments by name, the flag meant (`--stal-timeout`: did you mean
/// `--stall-timeout`?), and `--` before a trainer's command.
fn usage_line(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let strs = |k: ContextKind| -> Vec<String> {
        match e.get(k) {
            Some(ContextValue::String(s)) => vec![s.clone()],
            Some(ContextValue::Strings(v)) => v.clone(),
            Some(ContextValue::StyledStr(s)) => vec![s.to_string()],
            Some(ContextValue::StyledStrs(v)) => v.iter().map(|s| s.to_string()).collect(),
            _ => Vec::new(),
        }
    };
    let invalid = strs(ContextKind::InvalidArg);
    let meant = |k: ContextKind| {
        let s = strs(k);
        (!s.is_empty()).then(|| format!("; did you mean '{}'?", s.join("' or '")))
    };
    match e.kind() {
        ErrorKind::MissingRequiredArgument if !invalid.is_empty() => {
            format!("missing {}", invalid.join(", "))
        }
        ErrorKind::UnknownArgument if !invalid.is_empty() => {
            let arg = &invalid[0];
            let hint = meant(ContextKind::SuggestedArg).unwrap_or_else(|| {
                if arg.starts_with('-') {
                    String::new()
                } else {
                    "; a trainer's command goes after `--`: resilio run [FLAGS] -- COMMAND [ARGS]"
                        .to_string()
                }
            });
            format!("unexpected argument '{arg}'{hint}")
        }
        ErrorKind::InvalidSubcommand if !strs(ContextKind::InvalidSubcommand).is_empty() => {
            format!(
                "unknown command '{}'{}",
                strs(ContextKind::InvalidSubcommand)[0],
                meant(ContextKind::SuggestedSubcommand).unwrap_or_default()
            )
        }
        _ => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid usage");
            first.strip_prefix("error: ").unwrap_or(first).to_string()
        }
    }
}

fn usage(msg: impl Into<String>) -> Error {
    Error::Usage(msg.into())
}

fn flag_duration(flag: &str, value: &str) -> Result<std::time::Duration> {
    crate::duration::parse(value).map_err(|e| usage(format!("--{flag}: {e}")))
}

/// A timeout flag: zero would fire at once, so it is a usage error.
fn flag_timeout(flag: &str, value: &str, hint: &str) -> Result<std::time::Duration> {
    crate::duration::parse_positive(value).map_err(|e| usage(format!("--{flag}: {e}{hint}")))
}

fn resolve_run_config(a: &RunArgs) -> Result<Config> {
    let mut cfg = Config::load(a.config.as_deref())?;
    if let Some(d) = &a.state_dir {
        cfg.state_dir = d.clone();
    }
    // A site-wide state dir (mode 1777): this user's own directory in it.
    cfg.state_dir = crate::state_dir::for_writer(&cfg.state_dir).map_err(usage)?;
    // Under a job level (a batch script's `resilio run`, or `#SBATCH
    // --resilio`), a rank journals where the job level reads: a state dir
    // exported inside the script after it started would split the journal,
    // and the job level would judge blind (trial 6).
    if let Some(above) = crate::job::step_level::job_level_state_dir() {
        if std::path::absolute(&cfg.state_dir).ok().as_ref() != Some(&above) {
            if std::env::var("SLURM_PROCID").as_deref().unwrap_or("0") == "0" {
                tracing::warn!(
                    "the state dir {} differs from the job level's {} (RESILIO_STATE_DIR changed inside the batch script?): journaling to the job level's, which judges this job",
                    cfg.state_dir.display(),
                    above.display()
                );
            }
            cfg.state_dir = crate::state_dir::for_writer(&above).map_err(usage)?;
        }
    }
    if let Some(t) = &a.stall_timeout {
        cfg.stall.fixed_timeout = if t.trim() == "adaptive" {
            None
        } else {
            Some(flag_timeout(
                "stall-timeout",
                t,
                "; 'adaptive' learns it from the steps",
            )?)
        };
    }
    if let Some(t) = &a.startup_timeout {
        cfg.stall.startup_timeout = flag_timeout("startup-timeout", t, "")?;
    }
    if a.observe {
        cfg.observe = true;
    }
    if let Some(t) = &a.stall_floor {
        cfg.stall.adaptive_floor = flag_timeout("stall-floor", t, "")?;
    }
    if let Some(t) = &a.eval_timeout {
        cfg.stall.eval_timeout = flag_timeout("eval-timeout", t, "")?;
    }
    if let Some(t) = &a.checkpoint_timeout {
        cfg.stall.checkpoint_timeout = flag_timeout("checkpoint-timeout", t, "")?;
    }
    if let Some(re) = &a.progress_regex {
        cfg.progress.regex =
            config::compile_regex(re).map_err(|e| usage(format!("--progress-regex: {e}")))?;
    }
    if let Some(f) = &a.progress_file {
        cfg.progress.file = Some(f.clone());
    }
    if let Some(n) = a.max_restarts {
        cfg.max_restarts = n;
    }
    if let Some(t) = &a.kill_grace {
        cfg.kill_grace = flag_duration("kill-grace", t)?;
    }
    if let Some(s) = &a.dump_signal {
        cfg.diagnostics.dump_signal =
            Some(config::parse_signal(s).map_err(|e| usage(format!("--dump-signal: {e}")))?);
    }
    Ok(cfg)
}

/// The flags every rank's agent gets from the local launcher.
fn agent_args(a: &RunArgs, cfg: &Config) -> Vec<OsString> {
    let mut v: Vec<OsString> = Vec::new();
    let mut put = |flag: &str, value: Option<OsString>| {
        if let Some(x) = value {
            v.push(format!("--{flag}").into());
            v.push(x);
        }
    };
    put("config", a.config.clone().map(Into::into));
    put("state-dir", Some(cfg.state_dir.clone().into()));
    put("stall-timeout", a.stall_timeout.clone().map(Into::into));
    put("startup-timeout", a.startup_timeout.clone().map(Into::into));
    put("stall-floor", a.stall_floor.clone().map(Into::into));
    put("eval-timeout", a.eval_timeout.clone().map(Into::into));
    put(
        "checkpoint-timeout",
        a.checkpoint_timeout.clone().map(Into::into),
    );
    put("progress-regex", a.progress_regex.clone().map(Into::into));
    put("progress-file", a.progress_file.clone().map(Into::into));
    put("kill-grace", a.kill_grace.clone().map(Into::into));
    put("dump-signal", a.dump_signal.clone().map(Into::into));
    if a.observe || cfg.observe {
        v.push("--observe".into());
    }
    v
}

/// The state dir a reader starts from: `--state-dir`, else the one `resilio
/// run` writes to (the environment's, or `[run] state_dir` in the system
/// configuration, as a site sets a shared one).
fn state_dir_of(flag: &Option<PathBuf>) -> Result<PathBuf> {
    match flag {
        Some(d) => Ok(d.clone()),
        None => Ok(Config::load(None)?.state_dir),
    }
}

/// Load a job's journal for the report commands.
pub fn load_job(
    state_dir: &std::path::Path,
    job: Option<&str>,
) -> Result<(String, journal::JobJournal)> {
    let (state_dir, job) = crate::state_dir::locate(state_dir, job)?;
    let dir = journal::job_dir(&state_dir, &job);
    // Another user's journal (readable, or read as root): say whose.
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::symlink_metadata(&dir) {
            if m.uid() != nix::unistd::geteuid().as_raw() {
                eprintln!(
                    "resilio: job {job} is {}'s ({}), not yours",
                    crate::util::terminal_safe(&crate::state_dir::name_of(m.uid())),
                    dir.display()
                );
            }
        }
    }
    let j = journal::read_job(&dir).map_err(|_| Error::NoJob {
        job: job.clone(),
        dir: state_dir.join("jobs"),
    })?;
    if j.records.is_empty() {
        if j.skipped.is_empty() {
            return Err(Error::NoJob {
                job,
                dir: state_dir.join("jobs"),
            });
        }
        // Files exist, and nothing in them could be read: name them.
        let files: Vec<String> = j.skipped.iter().map(|f| f.describe()).collect();
        return Err(Error::NoReadableRecord(files.join("; ")));
    }
    Ok((job, j))
}

/// A job's journal cut down to one run (the latest, or `--run`), with
/// what the reports say about it.
struct Shown {
    job: String,
    records: Vec<journal::Record>,
    bad_lines: usize,
    skipped: Vec<journal::SkippedLines>,
    /// Attempts left out of the figures, with why.
    left_out: Vec<String>,
    run: crate::runs::RunInfo,
    runs: Vec<crate::runs::RunInfo>,
}

impl Shown {
    fn load(a: &ReportArgs) -> Result<Shown> {
        let (job, j) = load_job(&state_dir_of(&a.state_dir)?, a.job.as_deref())?;
        let mut runs = crate::runs::split(j.records);
        let infos: Vec<crate::runs::RunInfo> = runs.iter().map(|r| r.info.clone()).collect();
        let pick = match &a.run {
            Some(w) => crate::runs::select(&infos, w).map_err(Error::Usage)?,
            None => infos.len() - 1,
        };
        let mut run = runs.swap_remove(pick);
        // Attempts dated out of their order are a journal's lie (or a
        // clock's): left out of the figures, and said so.
        let reversed = crate::runs::reversed_attempts(&run.records);
        run.records
            .retain(|r| !reversed.iter().any(|(a, _)| *a == r.attempt));
        Ok(Shown {
            job,
            records: run.records,
            bad_lines: j.bad_lines,
            skipped: j.skipped,
            left_out: reversed.into_iter().map(|(_, why)| why).collect(),
            run: run.info,
            runs: infos,
        })
    }

    /// The lines printed under a timeline's heading.
    fn notes(&self) -> Vec<String> {
        let mut v: Vec<String> =
            crate::runs::note(&self.job, &self.runs, self.run.index.saturating_sub(1))
                .into_iter()
                .collect();
        v.extend(
            report::skipped_notes(&self.skipped, self.bad_lines, &self.left_out)
                .into_iter()
                .filter(|l| !l.is_empty()),
        );
        v
    }

    fn report(&self, slurm: Option<&crate::analysis::accounting::SlurmTimes>) -> report::Report {
        let mut r = report::build(&self.job, &self.records, self.bad_lines, slurm);
        r.skipped_lines = self.skipped.clone();
        r.left_out = self.left_out.clone();
        // The site's (or the default) share of the interval a save may take;
        // a configuration that does not load costs only this warning's tuning.
        r.checkpoints.warn_share =
            Some(Config::load(None).map_or(0.1, |c| c.checkpoint_warn_share));
        r.run = Some(self.run.clone());
        r.runs = self.runs.clone();
        r
    }
}

fn report_cmd(a: &ReportArgs, timeline: bool) -> Result<i32> {
    let shown = Shown::load(a)?;
    let job = &shown.job;
    if timeline {
        if a.json {
            let out = serde_json::to_string_pretty(&shown.records)
                .map_err(|e| Error::Other(e.to_string()))?;
            println!("{out}");
            for n in shown.notes() {
                eprintln!("resilio: {}", crate::util::terminal_safe(n.trim_start()));
            }
        } else {
            // Only the allocations that agree with the journal (as the report).
            let slurm =
                crate::analysis::accounting::slurm_times(job, &crate::slurm::SlurmCli::default())
                    .map(|s| {
                        crate::analysis::accounting::consistent_slurm_times(&shown.records, &s).0
                    });
            print!(
                "{}",
                crate::util::terminal_safe(&crate::analysis::timeline::render_with_notes(
                    job,
                    &shown.records,
                    slurm.as_ref(),
                    &shown.notes()
                ))
            );
        }
    } else {
        let slurm =
            crate::analysis::accounting::slurm_times(job, &crate::slurm::SlurmCli::default());
        let mut r = shown.report(slurm.as_ref());
        let state_dir = state_dir_of(&a.state_dir)?;
        report::apply_fleet(
            &mut r,
            crate::analysis::node_history::fleet_rate(
                &state_dir,
                job,
                chrono::Utc::now(),
                std::time::Duration::from_secs(56 * 86400),
            ),
        );
        if a.json {
            let out = serde_json::to_string_pretty(&r).map_err(|e| Error::Other(e.to_string()))?;
            println!("{out}");
        } else {
            print!("{}", crate::util::terminal_safe(&report::render_text(&r)));
        }
    }
    Ok(0)
}

/// `resilio timeline JOB --html FILE`.
fn html_cmd(a: &ReportArgs, file: &std::path::Path) -> Result<i32> {
    let shown = Shown::load(a)?;
    let job = &shown.job;
    let slurm = crate::analysis::accounting::slurm_times(job, &crate::slurm::SlurmCli::default());
    let r = shown.report(slurm.as_ref());
    let page = crate::analysis::html::render(job, &shown.records, &r);
    if file == std::path::Path::new("-") {
        print!("{page}");
        return Ok(0);
    }
    // Whole or absent: written aside, then renamed over.
    let tmp = file.with_extension("html.tmp");
    std::fs::write(&tmp, page)
        .and_then(|_| std::fs::rename(&tmp, file))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            // A path or permission mistake is the user's: a usage error.
            Error::Usage(format!("cannot write {}: {e}", file.display()))
        })?;
    eprintln!(
        "resilio: timeline of job {job} written to {}",
        file.display()
    );
    Ok(0)
}

fn nodes_cmd(a: &NodesArgs) -> Result<i32> {
    use crate::analysis::node_history;
    use crate::slurm::{NodeState, Slurm, SlurmCli};
    let half_life = flag_timeout("half-life", &a.half_life, "")?;
    if !(a.threshold.is_finite() && a.threshold > 0.0) {
        return Err(usage("--threshold must be a positive number"));
    }
    let cli = SlurmCli::default();
    let (history, sources) = node_history::build(
        &state_dir_of(&a.state_dir)?,
        chrono::Utc::now(),
        half_life,
        (!a.no_sacct).then_some(&cli as &dyn crate::slurm::Slurm),
    );
    // What was left out, for every output form (on stderr where stdout is
    // for a machine).
    let left_out: Vec<String> = sources
        .dropped
        .iter()
        .map(|(why, n)| format!("left out: {n} event(s): {why}"))
        .chain(
            sources
                .unread
                .iter()
                .map(|(what, n)| format!("left out: {n} {what}")),
        )
        .collect();
    if a.json || a.exclude_list {
        for l in &left_out {
            eprintln!("resilio: {l}");
        }
    }
    if a.json {
        let out =
            serde_json::to_string_pretty(&history).map_err(|e| Error::Other(e.to_string()))?;
        println!("{out}");
        return Ok(0);
    }
    if a.exclude_list {
        println!("{}", node_history::exclude_list(&history, a.threshold));
        return Ok(0);
    }
    if a.prometheus {
        print!(
            "{}",
            node_history::render_prometheus(&history, a.threshold, sources.journals)
        );
        return Ok(0);
    }
    if !a.drain {
        print!(
            "{}",
            crate::util::terminal_safe(&node_history::render(&history, a.threshold))
        );
        println!(
            "sources: {} job journal(s); {}",
            sources.journals,
            match (&sources.sacct_node_failures, &sources.sacct_error) {
                (Some(n), _) => format!("sacct: {n} NODE_FAIL allocation(s)"),
                (None, Some(e)) => format!("sacct not used ({e})"),
                (None, None) => "sacct not asked".into(),
            }
        );
        for l in &left_out {
            println!("{l}");
        }
        return Ok(0);
    }
    let mut failed = 0;
    for h in history.iter().filter(|h| h.listed(a.threshold)) {
        let reason: String = format!("resilio: score {:.2}: {}", h.score, h.last_evidence())
            .chars()
            .take(200)
            .collect();
        if a.dry_run {
            println!(
                "scontrol update NodeName={} State=DRAIN Reason={reason:?}",
                h.node
            );
            continue;
        }
        match cli.set_node_state(&h.node, &NodeState::Drain(reason)) {
            Ok(()) => println!("drained {}", h.node),
            Err(e) => {
                let msg = e.to_string();
                let hint = if msg.contains("ermission")
                    || msg.contains("ccess")
                    || msg.contains("authoriz")
                {
                    " (draining needs root or the SlurmUser)"
                } else {
                    ""
                };
                eprintln!("resilio: cannot drain {}: {msg}{hint}", h.node);
                failed += 1;
            }
        }
    }
    Ok(if failed > 0 {
        crate::error::EXIT_NOT_PERMITTED
    } else {
        0
    })
}

fn dispatch(cli: Cli) -> Result<i32> {
    if !matches!(
        cli.command,
        Command::Run(_) | Command::Demo(_) | Command::Coordinator(_) | Command::DemoTrainer(_)
    ) {
        // Commands that only print: a reader that goes away (`| head`) ends
        // them quietly, as it would any Unix tool, instead of a panic in
        // println!. (Supervising commands keep SIGPIPE ignored: their
        // output may go away while the trainer must not.)
        // SAFETY: setting a signal's disposition, before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cli.command {
        Command::Run(a) => {
            if a.command.is_empty() {
                return Err(usage(
                    "run: no command given (usage: resilio run [OPTIONS] -- COMMAND [ARGS...])",
                ));
            }
            let config = resolve_run_config(&a)?;
            if let Some(n) = a.ntasks {
                if std::env::var_os("SLURM_JOB_ID").is_some_and(|v| !v.is_empty())
                    && std::env::var_os("SLURM_STEP_ID").is_some()
                {
                    return Err(usage(
                        "run: --ntasks is local mode; inside a Slurm step, srun starts the ranks",
                    ));
                }
                let agent_args = agent_args(&a, &config);
                return crate::job::local::run(crate::job::local::LocalOptions {
                    argv: a.command,
                    config,
                    job_id: a.job_id,
                    ntasks: n,
                    agent_args,
                    label: a.label,
                });
            }
            if runs_locally() {
                // Outside Slurm a plain run is local mode with one rank:
                // restarts in place within --max-restarts, and a
                // coordinator for `resilio status` / `resilio checkpoint`.
                let agent_args = agent_args(&a, &config);
                let job_id = a.job_id.or_else(|| {
                    std::env::var("RESILIO_JOB_ID")
                        .ok()
                        .filter(|j| !j.is_empty())
                });
                return crate::job::local::run(crate::job::local::LocalOptions {
                    argv: a.command,
                    config,
                    job_id,
                    ntasks: 1,
                    agent_args,
                    label: false,
                });
            }
            rank::run(
                RunOptions {
                    argv: a.command,
                    config,
                    job_id: a.job_id,
                },
                &crate::slurm::SlurmCli::default(),
            )
        }
        Command::Report(a) => report_cmd(&a, false),
        Command::Timeline(a) => match &a.html {
            Some(file) => html_cmd(&a.common, file),
            None => report_cmd(&a.common, true),
        },
        Command::Nodes(a) => nodes_cmd(&a),
        Command::Status(a) => {
            crate::status::status_cmd(&state_dir_of(&a.state_dir)?, a.job.as_deref(), a.json)
        }
        Command::Checkpoint(a) => crate::status::checkpoint_cmd(
            &state_dir_of(&a.common.state_dir)?,
            a.common.job.as_deref(),
            &a.reason,
            flag_duration("wait", &a.wait)?,
            a.common.json,
        ),
        Command::Demo(a) => crate::demo::run(a.state_dir),
        Command::Template(a) => template_cmd(a),
        Command::Config(a) => config_cmd(a),
        Command::Completions(a) => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(a.shell, &mut cmd, "resilio", &mut std::io::stdout());
            Ok(0)
        }
        Command::Man(a) => man_cmd(a),
        Command::Admin(AdminCommand::InitStateDir { dir, for_users }) => {
            let done = crate::state_dir::init_shared(&dir).map_err(usage)?;
            println!("{done}");
            if for_users {
                if !nix::unistd::geteuid().is_root() {
                    return Err(usage(
                        "--for-users: only root can make other users' directories",
                    ));
                }
                for line in
                    crate::state_dir::make_user_dirs(&dir, &crate::state_dir::local_accounts())
                {
                    println!("{}", crate::util::terminal_safe(&line));
                }
            }
            Ok(0)
        }
        Command::DemoTrainer(a) => Ok(crate::demo::trainer(a)),
        Command::Coordinator(a) => coordinator_cmd(a),
    }
}

/// `resilio config check [FILE]`.
fn config_cmd(a: ConfigArgs) -> Result<i32> {
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

/// `resilio man`: one page per visible subcommand, and the top page.
fn man_cmd(a: ManArgs) -> Result<i32> {
    use clap::CommandFactory;
    let top = Cli::command();
    let io = |p: &std::path::Path, e: std::io::Error| Error::Usage(format!("{}: {e}", p.display()));
    std::fs::create_dir_all(&a.dir).map_err(|e| io(&a.dir, e))?;
    let mut pages: Vec<(String, clap::Command)> = vec![("resilio".into(), top.clone())];
    for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("resilio-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
    }
    for (name, cmd) in pages {
        let path = a.dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(cmd)
            .render(&mut buf)
            .map_err(|e| io(&path, e))?;
        buf.extend(exit_status_section(name.strip_prefix("resilio-")).into_bytes());
        std::fs::write(&path, buf).map_err(|e| io(&path, e))?;
        println!("{}", path.display());
    }
    Ok(0)
}

/// The man page's EXIT STATUS section: the codes of `command` (all of them
/// for the top page), from [`crate::error::EXIT_CODES`].
fn exit_status_section(command: Option<&str>) -> String {
    // Roff: `code` in bold, backslashes escaped, no line starting with a dot.
    let roff = |s: &str| {
        let s = s.replace('\\', "\\e");
        let mut out = String::new();
        for (i, part) in s.split('`').enumerate() {
            if i % 2 == 1 {
                out += &format!("\\fB{part}\\fR");
            } else {
                out += part;
            }
        }
        if out.starts_with('.') || out.starts_with('\'') {
            out.insert_str(0, "\\&");
        }
        out
    };
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning, commands) in crate::error::EXIT_CODES {
        let applies = match command {
            None => true,
            Some(c) => {
                commands.contains("every command")
                    || commands.contains(&format!("`{c}`"))
                    || commands.contains(&format!("`{c} "))
                    || (commands.contains("only print") && !["run", "demo"].contains(&c))
            }
        };
        if applies {
            out += &format!(".TP\n{}\n{}\n", roff(code), roff(meaning));
        }
    }
    out
}

/// `resilio template`: the script on stdout, or in a file.
fn template_cmd(a: TemplateArgs) -> Result<i32> {
    let s = crate::template::Settings {
        kind: a.kind,
        job_name: a.job_name,
        nodes: a.nodes,
        spares: a.spares,
        gpus_per_node: a.gpus_per_node,
        time: a.time,
        signal_lead_s: a.signal_lead,
        max_restarts: a.max_restarts,
        state_dir: a.state_dir,
        command: a.command,
    };
    crate::template::check(&s).map_err(Error::Usage)?;
    let text = crate::template::render(&s);
    match a.output {
        None => print!("{text}"),
        Some(path) => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o755)
                .open(&path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
        }
    }
    Ok(0)
}

/// Serve a coordinator until SIGTERM/SIGINT; prints its URL and token file.
fn coordinator_cmd(a: CoordinatorArgs) -> Result<i32> {
    use crate::coordinator::{state::JobView, Coordinator};
    journal::validate_job_id(&a.job_id).map_err(Error::Usage)?;
    let cfg = Config::load(a.config.as_deref())?;
    let state_dir =
        crate::state_dir::for_writer(&a.state_dir.clone().unwrap_or(cfg.state_dir.clone()))
            .map_err(usage)?;
    let dir = journal::job_dir(&state_dir, &a.job_id);
    // Taking over: the attempt the ranks run now is the journal's latest,
    // and the run is the dead coordinator's.
    let earlier = if a.take_over {
        journal::read_job(&dir)
            .map(|j| j.records)
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let attempt = earlier.iter().map(|r| r.attempt).max().unwrap_or(0);
    let run = earlier
        .iter()
        .rev()
        .find(|r| r.kind == "coordinator_start")
        .and_then(|r| r.run())
        .map(str::to_string);
    let view = JobView::new(
        &a.job_id,
        a.world_size,
        attempt,
        cfg.coordinator.policy.clone(),
        std::time::Instant::now(),
    );
    let mut w = journal::Writer::open(&dir, "coordinator.jsonl", attempt, None, None);
    w.set_run(run.as_deref());
    let mut c = if a.take_over {
        let from = crate::coordinator::successor_of(&dir)
            .map_err(|e| Error::Usage(format!("cannot take over the coordinator: {e}")))?;
        Coordinator::take_over(view, from, w, &dir)
    } else {
        let bind = crate::coordinator::bind_address(&a.bind, false).map_err(usage)?;
        Coordinator::start(view, bind, w, Some(&dir))
    }
    .map_err(|e| Error::Other(format!("coordinator: {e}")))?;
    // In place of a job's dead coordinator: the site's scrape comes back too.
    if a.take_over && cfg.coordinator.site_metrics {
        let node = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Err(e) = c.serve_site_metrics(&state_dir, &a.job_id, &node) {
            tracing::warn!("no read-only metrics listener for the site: {e}");
        }
    }
    println!("{}", c.url);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut signals = signal_hook_iter()?;
    let _ = signals.forever().next();
    drop(c);
    Ok(0)
}

fn signal_hook_iter() -> Result<signal_hook::iterator::Signals> {
    signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT])
        .map_err(|e| Error::Other(format!("cannot install signal handler: {e}")))
}

/// Whether a plain `resilio run` (no `--ntasks`) is a job of its own on
/// this machine, run as local mode with one rank. Not under Slurm (a task
/// of a step, or the batch-level supervisor: both unchanged), not a rank
/// agent started by a launcher (the local one, or a coordinator's), and not
/// one rank of a bigger job started by another launcher (torchrun's
/// `WORLD_SIZE` > 1).
fn runs_locally() -> bool {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    let world = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|w| w.trim().parse::<u32>().ok())
        .unwrap_or(1);
    !set("SLURM_JOB_ID")
        && !set("SLURM_STEP_ID")
        && !set(crate::job::local::ENV_LAUNCHER)
        && !set(crate::coordinator::ENV_URL)
        && world <= 1
}

/// Entry point: returns the process exit code.
pub fn main() -> i32 {
    // Started by the SPANK plugin in place of the task's command.
    let args = match crate::spank::command_line(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("resilio: {e}");
            return EXIT_USAGE;
        }
    };
    crate::util::set_args(args.clone());
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    EXIT_USAGE
                } else {
                    0
                };
            }
            // The subcommand's own help, where one was named.
            let sub = args
                .iter()
                .skip(1)
                .filter_map(|a| a.to_str())
                .find(|a| !a.starts_with('-'))
                .filter(|a| {
                    <Cli as clap::CommandFactory>::command()
                        .find_subcommand(a)
                        .is_some()
                })
                .map_or(String::new(), |a| format!(" {a}"));
            eprintln!("resilio: {} (see resilio{sub} --help)", usage_line(&e));
            return EXIT_USAGE;
        }
    };
    crate::log::init(cli.verbose);
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("resilio: {e}");
            e.exit_code()
        }
    }
}
