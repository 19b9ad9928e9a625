//! The command line: parse, dispatch to the subcommand's file; every error
//! becomes one line on stderr and a distinct exit code (see [`crate::error`]).
//! `resilio run` decides its process's role once ([`crate::role`]).

use crate::error::{Error, Result, EXIT_USAGE};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

mod admin;
mod config;
mod coordinator;
mod fleet;
mod man;
mod nodes;
mod report;
mod run;
mod status;
mod template;

#[derive(Parser, Debug)]
#[command(
    name = "resilio",
    version,
    about = "Resilient supervisor for ML training jobs: progress, hangs, journal, reports",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Verb,
    /// More of resilio's own diagnostics (-v debug, -vv trace); RESILIO_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// Supervise a training command: resilio run [OPTIONS] -- COMMAND [ARGS...]
    Run(run::RunArgs),
    /// ETTR and where the time went, from the job's journal
    Report(report::ReportArgs),
    /// One line per event that mattered, by attempt
    Timeline(report::TimelineArgs),
    /// Failure history of nodes across all jobs, for admins
    Nodes(nodes::NodesArgs),
    /// Restart storms: the jobs restarting more than N times within a window, and the nodes they share
    Fleet(fleet::FleetArgs),
    /// The live job: ranks, steps, stragglers, checkpoints (asks its coordinator)
    Status(status::StatusArgs),
    /// Ask every rank of a running job to checkpoint at the same step
    Checkpoint(status::CheckpointArgs),
    /// A local run with an injected hang, end to end (no Slurm needed)
    Demo(DemoArgs),
    /// A ready sbatch script for a common setup, every line commented
    Template(template::TemplateArgs),
    /// Check a configuration file (and the system one) before deploying it
    Config(config::ConfigArgs),
    /// A shell completion script, on stdout
    Completions(man::CompletionsArgs),
    /// Site administration: set up a state dir shared by every user
    #[command(subcommand)]
    Admin(admin::AdminCommand),
    /// Man pages, one per subcommand (resilio.1, resilio-run.1, ...)
    Man(man::ManArgs),
    /// A standalone coordinator for a job (tests and benchmarks; internal)
    #[command(name = "__coordinator", hide = true)]
    Coordinator(coordinator::CoordinatorArgs),
    /// The scripted trainer the demo runs (internal)
    #[command(name = "__demo-trainer", hide = true)]
    DemoTrainer(crate::demo::TrainerArgs),
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

/// The state dir a reader starts from: `--state-dir`, else the one `resilio
/// run` writes to (the environment's, or `[run] state_dir` in the system
/// configuration, as a site sets a shared one).
fn state_dir_of(flag: &Option<PathBuf>) -> Result<PathBuf> {
    match flag {
        Some(d) => Ok(d.clone()),
        None => Ok(crate::config::Config::load(None)?.state_dir),
    }
}

fn dispatch(cli: Cli) -> Result<i32> {
    if !matches!(
        cli.command,
        Verb::Run(_) | Verb::Demo(_) | Verb::Coordinator(_) | Verb::DemoTrainer(_)
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
        Verb::Run(a) => run::run_cmd(a),
        Verb::Report(a) => report::report_cmd(&a, false),
        Verb::Timeline(a) => report::timeline_cmd(&a),
        Verb::Nodes(a) => nodes::nodes_cmd(&a),
        Verb::Fleet(a) => fleet::fleet_cmd(&a),
        Verb::Status(a) => status::status_cmd(&a),
        Verb::Checkpoint(a) => status::checkpoint_cmd(&a),
        Verb::Demo(a) => crate::demo::run(a.state_dir),
        Verb::Template(a) => template::template_cmd(a),
        Verb::Config(a) => config::config_cmd(a),
        Verb::Completions(a) => man::completions_cmd(&a),
        Verb::Man(a) => man::man_cmd(a),
        Verb::Admin(a) => admin::admin_cmd(a),
        Verb::DemoTrainer(a) => Ok(crate::demo::trainer(a)),
        Verb::Coordinator(a) => coordinator::coordinator_cmd(a),
    }
}

/// Entry point: returns the process exit code.
pub fn main() -> i32 {
    // Started by the SPANK plugin in place of the task's command.
    let args = match crate::spank::command_line(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            crate::say_err!("resilio: {e}");
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
            crate::say_err!("resilio: {} (see resilio{sub} --help)", usage_line(&e));
            return EXIT_USAGE;
        }
    };
    crate::log::init(cli.verbose);
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            crate::say_err!("resilio: {e}");
            e.exit_code()
        }
    }
}
