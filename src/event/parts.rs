//! The parts of records that are structures of their own: a decision's
//! outcome (its action is the restart policy's own `Action`), the hang verdict and the ranks it judged, a settled
//! checkpoint, the checkpoint advice; and their conversions from the
//! policies' own types.

use super::{Class, Event};
use crate::policy::restart::AttemptOutcome;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The advised checkpoint interval (Daly's, from the job's checkpoint
/// cost and failure rate), or why there is none yet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointIntervalAdvised {
    /// `null` when nothing is advised yet (then `reason` says why).
    #[serde(default)]
    pub interval_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_cost_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mttf_s: Option<f64>,
    /// The ETTR the interval gives, by Daly's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_ettr: Option<f64>,
    /// The failure rate pooled the job's with the node history's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooled_with_node_history: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Fields of a later build.
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

impl From<CheckpointIntervalAdvised> for Event {
    fn from(e: CheckpointIntervalAdvised) -> Event {
        Event::CheckpointIntervalAdvised(e)
    }
}

/// What a step relaunched inside its allocation left out
/// (`job_start.relaunch_in_allocation`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RelaunchInAllocation {
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// What the site's health check found (`health_check.result`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthOutcome {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    /// `exit N`, `signal N`, `timed out`, or why it could not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The first lines of its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// What an attempt came to (`decision.outcome`): the restart policy's
/// [`AttemptOutcome`], every field optional as journals of every build
/// have it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<Class>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// The deciding line or reason as written, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default)]
    pub last_step: Option<u64>,
    #[serde(default)]
    pub blamed_nodes: Vec<String>,
    /// The step started no rank (absent: it did).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub launch_trouble: bool,
    /// A numerical failure rolled back to the checkpoint before it
    /// (absent: not).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rollback: bool,
    /// A whole checkpoint newer than every earlier one was confirmed in
    /// the attempt (absent, in journals of earlier builds: taken as yes,
    /// so that what was never recorded stops nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_checkpoint: Option<bool>,
    /// The step of the newest whole checkpoint by the end of the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<u64>,
    /// The step of the checkpoint the attempt started from, as far as the
    /// job level could tell (absent: none, or not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<u64>,
    /// The attempt that saved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_saved_in: Option<u32>,
    /// The first bad step of a numerical failure (absent: its last step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_from: Option<u64>,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// The coordinator's hang verdict (`hang.verdict`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HangVerdictRecord {
    #[serde(default, deserialize_with = "super::fields::null_as_default")]
    pub rule: crate::policy::hang::HangRule,
    #[serde(default)]
    pub blamed_ranks: Vec<u32>,
    #[serde(default)]
    pub blamed_nodes: Vec<String>,
    #[serde(default)]
    pub stalled_ranks: Vec<u32>,
    #[serde(default, deserialize_with = "super::fields::null_as_default")]
    pub reason: String,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// A coordinated checkpoint settled (`checkpoint_complete`, `checkpoint_incomplete`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointSettled {
    #[serde(default, deserialize_with = "super::fields::null_as_default")]
    pub id: u64,
    #[serde(default, deserialize_with = "super::fields::null_as_default")]
    pub step: u64,
    #[serde(default, deserialize_with = "super::fields::null_as_default")]
    pub reason: String,
    #[serde(default, deserialize_with = "super::fields::null_as_default")]
    pub confirmed_ranks: Vec<u32>,
    #[serde(default, deserialize_with = "super::fields::null_as_default")]
    pub missing_ranks: Vec<u32>,
    #[serde(default, deserialize_with = "super::fields::null_as_default")]
    pub request_to_last_confirmation_s: f64,
}

/// What the coordinator knew of one rank when it judged a hang (`hang.ranks`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HangRank {
    pub rank: u32,
    pub node: String,
    pub last_step: Option<u64>,
    /// Seconds on the coordinator's clock when its last step was seen.
    pub last_progress_s: Option<f64>,
    pub stalled: bool,
    pub exited: bool,
    pub waiting_on_peer: Option<bool>,
    pub silent: bool,
    /// What its agent's probe found, in words.
    pub probe: Option<String>,
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// What the trainer's processes are doing right now, from
/// `/proc/PID/task/PID/syscall` of each process's main thread: blocked on a
/// peer (reading or polling a socket), or not (running, sleeping, reading a
/// file or pipe). A rank that waits in a collective over TCP (gloo, the
/// test trainers) blocks on a socket; a rank hung in its own code does not.
/// Ranks spinning in NCCL look "running" on every rank: the probe cannot tell
/// them apart there, and says so by answering "not waiting" for all.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProbeFinding {
    /// `Some(true)`: some process of the rank waits on a socket.
    /// `Some(false)`: none does, and at least one is busy or blocked elsewhere.
    /// `None`: nothing could be read.
    pub waiting_on_peer: Option<bool>,
    /// One line per process: `pid comm: what`.
    pub evidence: Vec<String>,
    /// The verdict comes from py-spy stacks.
    #[serde(default)]
    pub stacks: bool,
    /// Not waiting, shown: a stack outside any collective, or every process
    /// that is not waiting is somewhere a collective never is (asleep,
    /// reading a file, stopped, in the kernel). Running on a CPU alone is
    /// not shown: NCCL spins there too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_waiting_shown: bool,
    /// The trainer's CPU time over the probe (a second or more): seconds
    /// worked and seconds watched. Taken for the coordinator's probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<(f64, f64)>,
    /// Seconds its threads were ready to run but waited for a CPU over the
    /// same time (more runnable threads than cores): work held back,
    /// counted as work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_wait_s: Option<f64>,
    /// Not waiting at the probe's start, waiting on a peer at its end: it
    /// worked its way into a collective meanwhile (working, not hung).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reached_peer: bool,
    /// Bytes the trainer read and wrote over the probe, and the seconds
    /// watched (`/proc/PID/io`): a save to a slow file system works with
    /// little CPU time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<(u64, f64)>,
}

/// Bytes a second read or written that show a trainer at work (a save at
/// 64 KiB a second does it; a rank asleep moves none). Socket traffic
/// counts too (`rchar`, `wchar`), so it is evidence only for a rank not
/// waiting on a peer (a collective moves bytes while it waits).
pub const BUSY_IO_RATE: f64 = 65_536.0;

impl ProbeFinding {
    /// Working: at least `share` of a core over the probe (on a CPU, or
    /// ready to run and waiting for one), into a collective by its end, or,
    /// waiting on no peer, reading or writing at [`BUSY_IO_RATE`] (a save
    /// to a slow file system).
    pub fn busy(&self, share: f64) -> bool {
        let wait = self.cpu_wait_s.unwrap_or(0.0);
        self.reached_peer
            || self
                .cpu
                .is_some_and(|(cpu, over)| Self::worked(cpu, wait, over, share))
            || self.waiting_on_peer == Some(false)
                && self
                    .io
                    .is_some_and(|(bytes, over)| Self::moved(bytes, over))
    }

    /// `bytes` read or written over `over_s`: at [`BUSY_IO_RATE`] or more.
    pub fn moved(bytes: u64, over_s: f64) -> bool {
        over_s > 0.0 && bytes as f64 >= BUSY_IO_RATE * over_s
    }

    /// Working by CPU time alone (the time its threads waited for a CPU
    /// left out: a stack read causes such waits), or into a collective by
    /// the probe's end.
    pub fn busy_on_cpu(&self, share: f64) -> bool {
        self.reached_peer
            || self
                .cpu
                .is_some_and(|(cpu, over)| Self::worked(cpu, 0.0, over, share))
    }

    /// `cpu_s` on a CPU and `wait_s` ready to run but waiting for one, over
    /// `over_s`: at least `share` of a core.
    pub fn worked(cpu_s: f64, wait_s: f64, over_s: f64, share: f64) -> bool {
        over_s > 0.0 && cpu_s + wait_s >= share * over_s
    }
}

/// One py-spy run of a probe or of a stall's diagnostics (`probe.py_spy`,
/// `diagnostics.py_spy`), its output cut to 1,500 bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StackDump {
    pub pid: i32,
    pub ok: bool,
    pub output: String,
}

impl From<&AttemptOutcome> for Outcome {
    fn from(o: &AttemptOutcome) -> Outcome {
        Outcome {
            attempt: Some(o.attempt),
            class: Some(o.class),
            signature: Some(o.signature.clone()),
            detail: Some(o.detail.clone()),
            last_step: o.last_step,
            blamed_nodes: o.blamed_nodes.clone(),
            launch_trouble: o.launch_trouble,
            rollback: o.rollback,
            new_checkpoint: Some(o.new_checkpoint),
            last_checkpoint: o.last_checkpoint,
            restored: o.restored,
            restored_saved_in: o.restored_saved_in,
            failed_from: o.failed_from,
            more: Map::new(),
        }
    }
}

impl Outcome {
    /// The restart policy's outcome of attempt `about`, as the journal
    /// kept it; `None` without a class or signature. Journals written
    /// before `detail` existed: the signature stands for it.
    pub fn of_attempt(self, about: u32) -> Option<AttemptOutcome> {
        let signature = self.signature?;
        Some(AttemptOutcome {
            attempt: about,
            class: self.class?,
            detail: self.detail.unwrap_or_else(|| signature.clone()),
            signature,
            last_step: self.last_step,
            blamed_nodes: self.blamed_nodes,
            launch_trouble: self.launch_trouble,
            rollback: self.rollback,
            new_checkpoint: self.new_checkpoint.unwrap_or(true),
            last_checkpoint: self.last_checkpoint,
            restored: self.restored,
            restored_saved_in: self.restored_saved_in,
            failed_from: self.failed_from,
        })
    }
}

impl From<&crate::policy::hang::HangVerdict> for HangVerdictRecord {
    fn from(v: &crate::policy::hang::HangVerdict) -> HangVerdictRecord {
        HangVerdictRecord {
            rule: v.rule,
            blamed_ranks: v.blamed_ranks.clone(),
            blamed_nodes: v.blamed_nodes.clone(),
            stalled_ranks: v.stalled_ranks.clone(),
            reason: v.reason.clone(),
            more: Map::new(),
        }
    }
}

names! {
    /// How a job runs (`job_start.mode`).
    JobMode {
        /// `resilio run --ntasks N`, or a plain run outside Slurm.
        Local = "local",
        /// One rank that is the whole job.
        Single = "single",
        /// The job-level supervisor in a batch script.
        Batch = "batch",
    }

    /// What a `failure` record is about (`failure.failure_kind`).
    FailureKind {
        Stall = "stall",
        Crash = "crash",
        Signal = "signal",
        Numerical = "numerical",
        SpawnFailed = "spawn_failed",
        HealthCheck = "health_check",
        /// A rank whose agent died and left no record of its own.
        AgentDied = "agent_died",
        /// Slurm's accounting says the node failed (NODE_FAIL).
        NodeFailure = "node_failure",
        /// Slurm ended the allocation otherwise (from its accounting).
        Slurm = "slurm",
    }

    /// When the site health check ran (`health_check.when`).
    HealthWhen {
        BeforeStart = "before_start",
        AfterFailure = "after_failure",
    }

    /// Where progress was seen (`progress.source`, `phase.source`,
    /// `checkpoint_done.source`).
    ProgressVia {
        Stdout = "stdout",
        Stderr = "stderr",
        /// A datagram on `RESILIO_SOCKET`.
        Socket = "socket",
        /// The watched progress file.
        File = "file",
        /// A complete checkpoint in the watched checkpoint directory.
        CheckpointDir = "checkpoint_dir",
    }

    /// Which source names the step (`progress_source.steps_from`, `before`).
    StepNamer {
        /// Step lines in the trainer's stdout or stderr.
        Output = "output",
        Socket = "socket",
        File = "file",
    }

    /// Who told of an attempt resilio did not see end itself
    /// (`failure.source`, `decision.source`, `previous_attempt.source`).
    ToldBy {
        /// Slurm's accounting.
        Sacct = "sacct",
    }

    /// Where a node was left out (`node_excluded.scope`; absent: the
    /// requeued job).
    ExcludedFrom {
        /// The next step inside the allocation.
        Step = "step",
    }

    /// Who requeued the job (`requeue.by`; absent: resilio after a failure).
    RequeueBy {
        /// At an allocation's start, for the node history.
        NodeHistory = "node_history",
        /// Slurm itself (a node failure without `--no-kill`, a preemption).
        Slurm = "slurm",
    }
}

impl From<crate::progress::Source> for ProgressVia {
    fn from(s: crate::progress::Source) -> ProgressVia {
        use crate::progress::Source;
        match s {
            Source::Stdout => ProgressVia::Stdout,
            Source::Stderr => ProgressVia::Stderr,
            Source::Socket => ProgressVia::Socket,
            Source::File => ProgressVia::File,
            Source::CheckpointDir => ProgressVia::CheckpointDir,
        }
    }
}

impl From<crate::progress::tracker::Namer> for StepNamer {
    fn from(n: crate::progress::tracker::Namer) -> StepNamer {
        use crate::progress::tracker::Namer;
        match n {
            Namer::Output => StepNamer::Output,
            Namer::Socket => StepNamer::Socket,
            Namer::File => StepNamer::File,
        }
    }
}

impl super::CheckpointDone {
    /// A checkpoint to count on as the last good one: not found incomplete
    /// (temporary names, files still written to) and not stale (the same
    /// files as an earlier one). Confirmations without files (the trainer's
    /// word) are taken as whole.
    pub fn whole(&self) -> bool {
        self.complete != Some(false) && self.same_as.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::{ProbeFinding, ProgressVia, StepNamer};

    /// The progress module names its sources and step namers for the
    /// journal; the schema reads them back by the same names.
    #[test]
    fn the_schemas_sources_are_named_as_the_progress_module_names_them() {
        use crate::progress::{tracker::Namer, Source};
        for s in [
            Source::Stdout,
            Source::Stderr,
            Source::Socket,
            Source::File,
            Source::CheckpointDir,
        ] {
            assert_eq!(ProgressVia::from(s).name(), s.name());
            assert_eq!(ProgressVia::parse(s.name()), Some(ProgressVia::from(s)));
        }
        for n in [Namer::Output, Namer::Socket, Namer::File] {
            assert_eq!(StepNamer::from(n).name(), n.name());
        }
    }

    #[test]
    fn a_probe_is_busy_by_its_cpu_share_or_by_reaching_a_peer() {
        let mut p = ProbeFinding {
            waiting_on_peer: Some(false),
            cpu: Some((0.05, 0.5)),
            ..Default::default()
        };
        assert!(!p.busy(0.2));
        p.cpu = Some((0.1, 0.5));
        assert!(p.busy(0.2));
        // Ready to run but kept waiting for a CPU (an oversubscribed node):
        // working all the same.
        p.cpu = Some((0.05, 0.5));
        p.cpu_wait_s = Some(0.4);
        assert!(p.busy(0.2));
        p.cpu_wait_s = Some(0.02);
        assert!(!p.busy(0.2));
        p.cpu = Some((0.0, 0.5));
        p.reached_peer = true;
        assert!(p.busy(0.2));
        // A save to a slow file system: little CPU time, bytes moving (trial
        // 29: a throttled save on rank 0 was blamed for the stall of the
        // rank waiting for it, twice, and the healthy run ended as a crash
        // loop). Not in a collective, whose wait moves bytes too.
        p.reached_peer = false;
        p.io = Some((40_000, 1.0));
        assert!(!p.busy(0.2));
        p.io = Some((8_400_000, 1.0));
        assert!(p.busy(0.2) && !p.busy_on_cpu(0.2));
        p.waiting_on_peer = Some(true);
        assert!(!p.busy(0.2));
        p.waiting_on_peer = None;
        assert!(!p.busy(0.2));
    }
}
