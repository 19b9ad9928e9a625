//! Slurm's commands, run with argument vectors (never a shell) and a
//! timeout, their output parsed. Node names and job ids are validated before
//! they reach a command line.

use super::{
    hostlist, validate_job_id, AcctRecord, JobInfo, NodeInfo, NodeState, QueueEntry, Slurm,
    SlurmError,
};
use crate::util::cmd::{self, Options, Termination};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::Duration;

/// Output kept of each stream of a command: far more than any listing
/// resilio asks for, so that none is cut short and misparsed.
const MAX_OUTPUT: usize = 64 << 20;

/// The real commands (`scontrol`, `squeue`, `sacct`) from PATH or a directory.
#[derive(Clone, Debug)]
pub struct SlurmCli {
    /// Directory holding the commands; `None`: PATH.
    pub bin_dir: Option<PathBuf>,
    /// Per-command timeout (slurmctld can be slow or down).
    pub timeout: Duration,
}

impl Default for SlurmCli {
    fn default() -> Self {
        SlurmCli {
            bin_dir: None,
            timeout: Duration::from_secs(30),
        }
    }
}

fn check_job(job: &str) -> Result<(), SlurmError> {
    validate_job_id(job).map_err(|_| SlurmError::Invalid {
        what: "job id",
        value: job.into(),
    })
}

fn check_node(node: &str) -> Result<(), SlurmError> {
    if hostlist::valid_node_name(node) {
        Ok(())
    } else {
        Err(SlurmError::Invalid {
            what: "node name",
            value: node.into(),
        })
    }
}

/// Parse `scontrol -o show ...` output: one record per line, `Key=Value`
/// pairs separated by spaces, values possibly containing spaces.
pub fn parse_key_values(line: &str) -> BTreeMap<String, String> {
    let bytes = line.as_bytes();
    // Key starts: a letter after start-of-line or a space, then [A-Za-z0-9_:/]* and '='.
    let mut starts: Vec<(usize, usize)> = Vec::new(); // (key start, '=' index)
    let mut i = 0;
    while i < bytes.len() {
        if (i == 0 || bytes[i - 1] == b' ') && bytes[i].is_ascii_alphabetic() {
            let mut j = i;
            while j < bytes.len()
                && (bytes[j].is_ascii_alphanumeric() || matches!(bytes[j], b'_' | b':' | b'/'))
            {
                j += 1;
            }
            if j < bytes.len() && bytes[j] == b'=' {
                starts.push((i, j));
                i = j + 1;
                continue;
            }
        }
        i += 1;
    }
    let mut out = BTreeMap::new();
    for (n, &(k, eq)) in starts.iter().enumerate() {
        let end = starts.get(n + 1).map_or(line.len(), |&(next, _)| next);
        out.insert(
            line[k..eq].to_string(),
            line[eq + 1..end].trim_end().to_string(),
        );
    }
    out
}

fn hosts(value: Option<&String>) -> Vec<String> {
    match value.map(|s| s.as_str()) {
        None | Some("") | Some("(null)") | Some("None assigned") => Vec::new(),
        Some(v) => hostlist::expand(v).unwrap_or_default(),
    }
}

/// Parse `scontrol -o show job J`.
pub fn parse_show_job(text: &str) -> Result<JobInfo, SlurmError> {
    let line = text
        .lines()
        .find(|l| l.starts_with("JobId="))
        .ok_or_else(|| SlurmError::Parse {
            cmd: "scontrol show job".into(),
            detail: format!(
                "no JobId in {:?}",
                text.chars().take(200).collect::<String>()
            ),
        })?;
    let kv = parse_key_values(line);
    let get = |k: &str| kv.get(k).cloned().unwrap_or_default();
    Ok(JobInfo {
        job_id: get("JobId"),
        state: get("JobState"),
        nodes: hosts(kv.get("NodeList")),
        excluded: hosts(kv.get("ExcNodeList")),
        required: hosts(kv.get("ReqNodeList")),
        restarts: get("Restarts").parse().unwrap_or(0),
        // Only a batch job can be requeued (`scontrol requeue` refuses an
        // interactive `srun`'s: "Only batch jobs are accepted").
        requeue: get("Requeue") == "1" && get("BatchFlag") != "0",
        reason: get("Reason"),
        submit_time: get("SubmitTime"),
        start_time: get("StartTime"),
        end_time: get("EndTime"),
        time_limit: get("TimeLimit"),
        num_nodes: get("NumNodes")
            .split('-')
            .next()
            .unwrap_or("")
            .parse()
            .unwrap_or(0),
    })
}

/// Parse `sacct -D -X -n -P -o JobID,State,ExitCode,NodeList,Submit,Start,End[,UID]`.
pub fn parse_sacct(text: &str) -> Vec<AcctRecord> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (f.len() >= 7).then(|| AcctRecord {
                job_id: f[0].into(),
                state: f[1].into(),
                exit_code: f[2].into(),
                nodes: hosts(Some(&f[3].to_string())),
                submit: f[4].into(),
                start: f[5].into(),
                end: f[6].into(),
                uid: f.get(7).and_then(|u| u.trim().parse().ok()),
            })
        })
        .collect()
}

/// The fields asked of sacct, in [`parse_sacct`]'s order.
const ACCT_FIELDS: &str = "JobID,State,ExitCode,NodeList,Submit,Start,End,UID";

/// Parse `sinfo -h -N -o %N|%T|%E`.
pub fn parse_sinfo_nodes(text: &str) -> Vec<NodeInfo> {
    let mut out: Vec<NodeInfo> = Vec::new();
    for l in text.lines() {
        let f: Vec<&str> = l.splitn(3, '|').collect();
        if f.len() == 3 && !out.iter().any(|n| n.name == f[0]) {
            out.push(NodeInfo {
                name: f[0].trim().into(),
                state: f[1].trim().into(),
                reason: f[2].trim().into(),
            });
        }
    }
    out
}

/// Parse `squeue -h -o %i|%T|%N|%r`.
pub fn parse_squeue(text: &str) -> Vec<QueueEntry> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.splitn(4, '|').collect();
            (f.len() == 4).then(|| QueueEntry {
                job_id: f[0].trim().into(),
                state: f[1].into(),
                nodes: hosts(Some(&f[2].to_string())),
                reason: f[3].into(),
            })
        })
        .collect()
}

impl SlurmCli {
    /// `sacct -D -X -n -P ARGS -o FIELDS`: every attempt, one line each.
    fn sacct(&self, args: &[&str], fields: &str) -> Result<Vec<AcctRecord>, SlurmError> {
        self.sacct_rows(args, fields, false)
    }

    /// `sacct`'s rows: the jobs' allocations (`-X`), and with `steps` their
    /// steps too (`J.0`, `J.batch`, ...).
    fn sacct_rows(
        &self,
        args: &[&str],
        fields: &str,
        steps: bool,
    ) -> Result<Vec<AcctRecord>, SlurmError> {
        let mut all = vec!["-D", "-n", "-P"];
        if !steps {
            all.push("-X");
        }
        all.extend_from_slice(args);
        all.extend(["-o", fields]);
        Ok(parse_sacct(&self.run("sacct", &all)?))
    }

    /// Run `program args...`; stdout on success, a one-line error otherwise.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String, SlurmError> {
        let path = match &self.bin_dir {
            Some(d) => d.join(program),
            None => PathBuf::from(program),
        };
        let cmdline = format!("{program} {}", args.join(" "));
        let argv: Vec<&OsStr> = std::iter::once(path.as_os_str())
            .chain(args.iter().map(OsStr::new))
            .collect();
        let opts = Options {
            max_output: MAX_OUTPUT,
            ..Options::new(self.timeout)
        };
        let out = cmd::run(&argv, &opts).map_err(|e| match e.source.kind() {
            std::io::ErrorKind::NotFound => SlurmError::NotFound(program.into()),
            _ => SlurmError::Failed {
                cmd: cmdline.clone(),
                message: e.source.to_string(),
            },
        })?;
        let status = match out.status {
            Termination::Finished(s) => s,
            // Lost (reaped elsewhere) reads as before: no status by the deadline.
            Termination::TimedOut | Termination::Lost => {
                return Err(SlurmError::Timeout(cmdline, self.timeout))
            }
        };
        let (out, err) = (out.stdout.text(), out.stderr.text());
        if status.success() {
            Ok(out)
        } else {
            let message = err
                .lines()
                .chain(out.lines())
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output")
                .trim()
                .to_string();
            Err(SlurmError::Failed {
                cmd: cmdline,
                message: format!("{message} ({status})"),
            })
        }
    }
}

impl Slurm for SlurmCli {
    fn show_job(&self, job: &str) -> Result<JobInfo, SlurmError> {
        check_job(job)?;
        parse_show_job(&self.run("scontrol", &["-o", "show", "job", job])?)
    }

    fn batch_script(&self, job: &str) -> Result<String, SlurmError> {
        check_job(job)?;
        self.run("scontrol", &["write", "batch_script", job, "-"])
    }

    fn set_excluded(&self, job: &str, nodes: &[String]) -> Result<(), SlurmError> {
        check_job(job)?;
        nodes.iter().try_for_each(|n| check_node(n))?;
        let list = format!("ExcNodeList={}", hostlist::compress(nodes));
        self.run("scontrol", &["update", &format!("JobId={job}"), &list])
            .map(|_| ())
    }

    fn requeue(&self, job: &str) -> Result<(), SlurmError> {
        check_job(job)?;
        self.run("scontrol", &["requeue", job]).map(|_| ())
    }

    fn set_size(&self, job: &str, nodes: u32, tasks: Option<u32>) -> Result<(), SlurmError> {
        check_job(job)?;
        let mut args = vec![
            "update".to_string(),
            format!("JobId={job}"),
            format!("NumNodes={nodes}"),
        ];
        if let Some(t) = tasks {
            args.push(format!("NumTasks={t}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run("scontrol", &args).map(|_| ())
    }

    fn signal_steps(&self, job: &str, signal: nix::sys::signal::Signal) -> Result<(), SlurmError> {
        check_job(job)?;
        let name = signal.as_str().trim_start_matches("SIG");
        self.run("scancel", &[&format!("--signal={name}"), job])
            .map(|_| ())
    }

    fn set_node_state(&self, node: &str, state: &NodeState) -> Result<(), SlurmError> {
        check_node(node)?;
        let name = format!("NodeName={node}");
        match state {
            NodeState::Drain(reason) => {
                let reason = format!("Reason={}", reason.replace(['\n', '\r'], " "));
                self.run("scontrol", &["update", &name, "State=DRAIN", &reason])
            }
            NodeState::Resume => self.run("scontrol", &["update", &name, "State=RESUME"]),
        }
        .map(|_| ())
    }

    fn queue(&self, job: &str) -> Result<Vec<QueueEntry>, SlurmError> {
        check_job(job)?;
        Ok(parse_squeue(
            &self.run("squeue", &["-h", "-j", job, "-o", "%i|%T|%N|%r"])?,
        ))
    }

    fn node_states(&self, nodes: &[String]) -> Result<Vec<NodeInfo>, SlurmError> {
        nodes.iter().try_for_each(|n| check_node(n))?;
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let list = hostlist::compress(nodes);
        Ok(parse_sinfo_nodes(&self.run(
            "sinfo",
            &["-h", "-N", "-n", &list, "-o", "%N|%T|%E"],
        )?))
    }

    fn all_nodes(&self) -> Result<Vec<NodeInfo>, SlurmError> {
        Ok(parse_sinfo_nodes(
            &self.run("sinfo", &["-h", "-N", "-o", "%N|%T|%E"])?,
        ))
    }

    fn node_failures(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<AcctRecord>, SlurmError> {
        // sacct reads and prints local time.
        let since = since
            .with_timezone(&chrono::Local)
            .format("%Y-%m-%dT%H:%M:%S")
            .to_string();
        self.sacct(
            &["-a", "-S", &since, "-E", "now", "-s", "NODE_FAIL"],
            ACCT_FIELDS,
        )
    }

    fn jobs_accounting(&self, jobs: &[String]) -> Result<Vec<AcctRecord>, SlurmError> {
        let mut out = Vec::new();
        // A few hundred ids per call keeps the argument list short.
        for chunk in jobs.chunks(256) {
            for j in chunk {
                check_job(j)?;
            }
            let list = chunk.join(",");
            // The raw id: an array task's directory is named by it.
            // With the steps: a job resilio requeued keeps only its last
            // allocation in the job's own row, while the steps of the
            // earlier ones keep their nodes and times.
            out.extend(self.sacct_rows(
                &["-a", "-j", &list],
                &ACCT_FIELDS.replacen("JobID", "JobIDRaw", 1),
                true,
            )?);
        }
        Ok(out)
    }

    fn accounting(&self, job: &str) -> Result<Vec<AcctRecord>, SlurmError> {
        check_job(job)?;
        self.sacct(&["-j", job], ACCT_FIELDS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOW_JOB: &str = "JobId=17 JobName=train.sbatch UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901745 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:05 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-22T01:10:00 EligibleTime=2026-11-22T01:10:12 AccrueTime=Unknown StartTime=2026-11-22T01:10:13 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-22T01:10:13 Scheduler=Main Partition=debug AllocNode:Sid=vm:1234 ReqNodeList=(null) ExcNodeList=n[2,4] NodeList=n[1,3] BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/root/train.sbatch WorkDir=/root StdErr=/root/slurm-17.out StdIn=/dev/null StdOut=/root/slurm-17.out Power=\n";

    #[test]
    fn parses_show_job() {
        let j = parse_show_job(SHOW_JOB).unwrap();
        assert_eq!(j.job_id, "17");
        assert_eq!(j.state, "RUNNING");
        assert_eq!(j.nodes, ["n1", "n3"]);
        assert_eq!(j.excluded, ["n2", "n4"]);
        assert_eq!(j.restarts, 2);
        assert!(j.requeue);
        // An interactive srun's job (no batch script) cannot be requeued.
        let interactive = parse_show_job(&SHOW_JOB.replace("BatchFlag=1", "BatchFlag=0")).unwrap();
        assert!(!interactive.requeue);
        assert_eq!(j.start_time, "2026-11-22T01:10:13");
        assert_eq!(j.num_nodes, 2);
        assert!(parse_show_job("slurm_load_jobs error: Invalid job id specified").is_err());
    }

    #[test]
    fn key_values_with_spaces_in_values() {
        let kv = parse_key_values("NodeName=n2 State=DRAIN Reason=resilio: NCCL timeout [root@2026-11-22T01:00:00] Comment=x y");
        assert_eq!(
            kv["Reason"],
            "resilio: NCCL timeout [root@2026-11-22T01:00:00]"
        );
        assert_eq!(kv["Comment"], "x y");
    }

    #[test]
    fn parses_sacct_and_squeue() {
        let a = parse_sacct("17|REQUEUED|0:0|n[1-3]|2026-11-22T01:00:00|2026-11-22T01:00:01|2026-11-22T01:00:30\n17|COMPLETED|0:0|n[1,3-4]|2026-11-22T01:00:30|2026-11-22T01:00:45|2026-11-22T01:01:30\n");
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].state, "REQUEUED");
        assert_eq!(a[1].nodes, ["n1", "n3", "n4"]);
        let n = parse_sinfo_nodes(
            "n2|down*|Not responding\nn2|down*|Not responding\nn3|allocated|none\n",
        );
        assert_eq!(n.len(), 2);
        assert!(n[0].is_failed() && !n[1].is_failed());
        let q = parse_squeue("17|PENDING||BeginTime\n");
        assert_eq!(q[0].state, "PENDING");
        assert!(q[0].nodes.is_empty());
        assert_eq!(q[0].reason, "BeginTime");
    }

    #[test]
    fn bad_names_never_reach_a_command() {
        let cli = SlurmCli {
            bin_dir: Some(PathBuf::from("/nonexistent")),
            ..SlurmCli::default()
        };
        assert!(matches!(
            cli.requeue("1; rm -rf /"),
            Err(SlurmError::Invalid { .. })
        ));
        assert!(matches!(
            cli.set_node_state("n1 State=DOWN", &NodeState::Resume),
            Err(SlurmError::Invalid { .. })
        ));
        assert!(matches!(
            cli.set_excluded("5", &["n1,n2".into()]),
            Err(SlurmError::Invalid { .. })
        ));
        assert!(matches!(cli.requeue("5"), Err(SlurmError::NotFound(_))));
    }

    #[test]
    fn commands_time_out() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("squeue");
        std::fs::write(&fake, "#!/bin/sh\nexec sleep 30\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cli = SlurmCli {
            bin_dir: Some(dir.path().to_path_buf()),
            timeout: Duration::from_millis(200),
        };
        assert!(matches!(cli.queue("5"), Err(SlurmError::Timeout(..))));
    }

    #[test]
    fn failures_name_the_first_line_and_the_status() {
        let dir = tempfile::tempdir().unwrap();
        let fake = |name: &str, body: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        // A megabyte of noise on stderr, then the answer.
        fake(
            "squeue",
            "head -c 1048576 /dev/zero | tr '\\0' x >&2; echo '5|RUNNING|n1|None'",
        );
        fake(
            "scontrol",
            "echo; echo ' slurm_load_jobs error: Invalid job id specified' >&2; exit 1",
        );
        let cli = SlurmCli {
            bin_dir: Some(dir.path().to_path_buf()),
            timeout: Duration::from_secs(60),
        };
        let q = cli.queue("5").unwrap();
        assert_eq!((q.len(), q[0].state.as_str()), (1, "RUNNING"));
        match cli.requeue("5") {
            Err(SlurmError::Failed { cmd, message }) => {
                assert_eq!(cmd, "scontrol requeue 5");
                assert_eq!(
                    message,
                    "slurm_load_jobs error: Invalid job id specified (exit status: 1)"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
