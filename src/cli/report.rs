//! `resilio report` and `resilio timeline`: one job's journal, read and shown.

use super::state_dir_of;
use crate::analysis::report;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::journal;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(super) struct ReportArgs {
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
pub(super) struct TimelineArgs {
    #[command(flatten)]
    common: ReportArgs,
    /// Also write a self-contained HTML timeline (inline SVG) to FILE ("-": standard output)
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

/// Load a job's journal for the report commands.
pub(super) fn load_job(
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
                crate::say_err!(
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
pub(super) struct Shown {
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

    /// Done with: the process is about to exit, and its memory goes back
    /// at once; freeing a million records one by one first would take a
    /// second.
    fn leave(self) {
        std::mem::forget(self);
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

    fn report(&self, slurm: Option<&crate::analysis::accounting::SlurmTimes>) -> report::JobReport {
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

pub(super) fn report_cmd(a: &ReportArgs, timeline: bool) -> Result<i32> {
    let shown = Shown::load(a)?;
    let job = &shown.job;
    if timeline {
        if a.json {
            let out = serde_json::to_string_pretty(&shown.records)
                .map_err(|e| Error::Other(e.to_string()))?;
            println!("{out}");
            for n in shown.notes() {
                crate::say_err!("resilio: {}", crate::util::terminal_safe(n.trim_start()));
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
    shown.leave();
    Ok(0)
}

/// `resilio timeline JOB --html FILE`.
pub(super) fn html_cmd(a: &ReportArgs, file: &std::path::Path) -> Result<i32> {
    let shown = Shown::load(a)?;
    let job = &shown.job;
    let slurm = crate::analysis::accounting::slurm_times(job, &crate::slurm::SlurmCli::default());
    let r = shown.report(slurm.as_ref());
    let page = crate::analysis::html::render(job, &shown.records, &r);
    let job = job.clone();
    shown.leave();
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
    crate::say_err!(
        "resilio: timeline of job {job} written to {}",
        file.display()
    );
    Ok(0)
}

/// `resilio timeline [--html FILE]`.
pub(super) fn timeline_cmd(a: &TimelineArgs) -> Result<i32> {
    match &a.html {
        Some(file) => html_cmd(&a.common, file),
        None => report_cmd(&a.common, true),
    }
}
