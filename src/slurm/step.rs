//! Relaunching the job step inside its allocation: the `srun` command line
//! with nodes left out, and the hand-over from one attempt's job-level
//! supervisor to the next (`RESILIO_RELAUNCH`).

use std::ffi::OsString;
use std::path::Path;

/// Set by the job-level supervisor for its own next attempt in the same
/// allocation: `attempt=N failed_at_us=T nodes=K exclude=n1,n2`.
pub const ENV_RELAUNCH: &str = "RESILIO_RELAUNCH";

/// What one attempt hands to the next inside the allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NextAttempt {
    pub attempt: u32,
    /// When the failure that ended the previous attempt happened (Unix µs).
    pub failed_at_us: i64,
    /// Nodes the step runs on (`srun --nodes`); 0 leaves srun's own choice.
    pub nodes: u32,
    /// Nodes left out of the step (`srun --exclude`).
    pub exclude: Vec<String>,
}

impl NextAttempt {
    pub fn encode(&self) -> String {
        format!(
            "attempt={} failed_at_us={} nodes={} exclude={}",
            self.attempt,
            self.failed_at_us,
            self.nodes,
            self.exclude.join(",")
        )
    }

    pub fn parse(text: &str) -> Result<NextAttempt, String> {
        let mut r = NextAttempt::default();
        let mut attempt = None;
        for pair in text.split_whitespace() {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("{ENV_RELAUNCH}: '{pair}' is not key=value"))?;
            let bad = || format!("{ENV_RELAUNCH}: bad {k} '{v}'");
            match k {
                "attempt" => attempt = Some(v.parse().map_err(|_| bad())?),
                "failed_at_us" => r.failed_at_us = v.parse().map_err(|_| bad())?,
                "nodes" => r.nodes = v.parse().map_err(|_| bad())?,
                "exclude" => {
                    for n in v.split(',').filter(|n| !n.is_empty()) {
                        if !super::hostlist::valid_node_name(n) {
                            return Err(bad());
                        }
                        r.exclude.push(n.to_string());
                    }
                }
                _ => return Err(format!("{ENV_RELAUNCH}: unknown key '{k}'")),
            }
        }
        r.attempt = attempt.ok_or_else(|| format!("{ENV_RELAUNCH}: no attempt"))?;
        Ok(r)
    }
}

fn is_srun(argv: &[OsString]) -> bool {
    argv.first()
        .and_then(|p| Path::new(p).file_name())
        .is_some_and(|n| n == "srun")
}

/// srun's short options that take a value.
const SRUN_SHORT_WITH_VALUE: &[u8] = b"ABbcCDdeFGiJLmMnNopqrSTtWwx";

/// srun's long options that take a required value (`--name value` as well
/// as `--name=value`).
const SRUN_LONG_WITH_VALUE: &[&str] = &[
    "account",
    "acctg-freq",
    "bb",
    "bbf",
    "begin",
    "chdir",
    "clusters",
    "comment",
    "constraint",
    "container",
    "container-id",
    "core-spec",
    "cores-per-socket",
    "cpu-bind",
    "cpu-freq",
    "cpus-per-gpu",
    "cpus-per-task",
    "deadline",
    "delay-boot",
    "dependency",
    "distribution",
    "epilog",
    "error",
    "exclude",
    "export",
    "extra-node-info",
    "gid",
    "gpu-bind",
    "gpu-freq",
    "gpus",
    "gpus-per-node",
    "gpus-per-socket",
    "gpus-per-task",
    "gres",
    "gres-flags",
    "het-group",
    "hint",
    "input",
    "job-name",
    "jobid",
    "licenses",
    "mail-type",
    "mail-user",
    "mcs-label",
    "mem",
    "mem-bind",
    "mem-per-cpu",
    "mem-per-gpu",
    "mincpus",
    "mpi",
    "network",
    "nodefile",
    "nodelist",
    "nodes",
    "ntasks",
    "ntasks-per-core",
    "ntasks-per-gpu",
    "ntasks-per-node",
    "ntasks-per-socket",
    "open-mode",
    "output",
    "partition",
    "profile",
    "prolog",
    "qos",
    "relative",
    "reservation",
    "segment",
    "signal",
    "slurmd-debug",
    "sockets-per-node",
    "switches",
    "task-epilog",
    "task-prolog",
    "tasks-per-node",
    "threads",
    "threads-per-core",
    "time",
    "time-min",
    "tmp",
    "tres-per-task",
    "uid",
    "wait",
    "wckey",
];

/// One of srun's own options on the command line.
#[derive(Debug)]
struct SrunOpt {
    /// The short letter as a string (`"N"`) or the long name (`"nodes"`).
    name: String,
    value: Option<String>,
    /// The arguments it occupies.
    at: Vec<usize>,
    /// It shares its argument with other short options (`-lx n7`).
    clustered: bool,
}

/// srun's own options, as its option parser reads them: they end at `--`
/// or at the first argument that is neither an option nor the value of one
/// (the command srun runs; its arguments are not srun's). Also returns
/// where the command starts.
fn srun_opts(argv: &[OsString]) -> (Vec<SrunOpt>, usize) {
    let mut opts = Vec::new();
    let mut i = 1;
    while i < argv.len() {
        let a = argv[i].to_string_lossy().to_string();
        if a == "--" || !a.starts_with('-') || a == "-" {
            break;
        }
        let next = argv.get(i + 1).map(|v| v.to_string_lossy().to_string());
        if let Some(long) = a.strip_prefix("--") {
            let separate = !long.contains('=') && SRUN_LONG_WITH_VALUE.contains(&long);
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None if separate => (long.to_string(), next),
                None => (long.to_string(), None),
            };
            let at = if separate { vec![i, i + 1] } else { vec![i] };
            i += at.len();
            opts.push(SrunOpt {
                name,
                value,
                at,
                clustered: false,
            });
            continue;
        }
        // A cluster of short options: flags, then at most one that takes a
        // value (the rest of the cluster, or the next argument).
        let letters = &a.as_bytes()[1..];
        let clustered = letters.len() > 1;
        let mut step = 1;
        for (k, c) in letters.iter().enumerate() {
            if SRUN_SHORT_WITH_VALUE.contains(c) {
                let rest = &a[2 + k..];
                let (value, at) = if rest.is_empty() {
                    step = 2;
                    (next.clone(), vec![i, i + 1])
                } else {
                    (Some(rest.to_string()), vec![i])
                };
                opts.push(SrunOpt {
                    name: (*c as char).to_string(),
                    value,
                    at,
                    clustered: clustered && k > 0,
                });
                break;
            }
            opts.push(SrunOpt {
                name: (*c as char).to_string(),
                value: None,
                at: vec![i],
                clustered,
            });
        }
        i += step;
    }
    (opts, i.min(argv.len()))
}

/// Options that pin the step to named nodes: leaving one out would
/// contradict them.
fn pins_nodes(o: &SrunOpt) -> bool {
    matches!(o.name.as_str(), "w" | "F" | "nodelist" | "nodefile")
}

/// The user's own `-x/--exclude` on the srun line: the argument indices it
/// takes and the nodes it names (`Err` when it names a file, or shares its
/// argument with other options: it cannot be merged with ours then).
fn user_exclude(argv: &[OsString]) -> Result<(Vec<usize>, Vec<String>), String> {
    let mut at = Vec::new();
    let mut nodes = Vec::new();
    let (opts, _) = srun_opts(argv);
    for o in opts.iter().filter(|o| o.name == "x" || o.name == "exclude") {
        let v = o.value.as_deref().unwrap_or_default();
        if v.contains('/') {
            return Err(format!("srun --exclude names a file ({v})"));
        }
        if o.clustered {
            return Err(format!(
                "srun -x shares an argument with other options ({v})"
            ));
        }
        for n in super::hostlist::expand(v)? {
            if !super::hostlist::valid_node_name(&n) {
                return Err(format!("srun --exclude names an invalid node ({n})"));
            }
            nodes.push(n);
        }
        at.extend(o.at.iter().copied());
    }
    Ok((at, nodes))
}

/// The nodes the user's own `srun -x/--exclude` leaves out (none when it
/// cannot be read): they are no spare nodes for a relaunch.
pub fn user_excluded_nodes(argv: &[OsString]) -> Vec<String> {
    if !is_srun(argv) {
        return Vec::new();
    }
    user_exclude(argv).map(|(_, n)| n).unwrap_or_default()
}

/// The node count an `srun` line asks for (`-N K`, `-NK`, `--nodes=K`,
/// `--nodes K`); `None` when it gives none or a range.
pub fn requested_nodes(argv: &[OsString]) -> Option<u32> {
    if !is_srun(argv) {
        return None;
    }
    srun_opts(argv)
        .0
        .iter()
        .rfind(|o| o.name == "N" || o.name == "nodes")
        .and_then(|o| o.value.as_deref()?.parse().ok())
}

/// Whether the step command can be told to leave nodes out.
pub fn can_leave_out(argv: &[OsString]) -> bool {
    is_srun(argv) && !srun_opts(argv).0.iter().any(pins_nodes) && user_exclude(argv).is_ok()
}

/// `srun --exclude=... --nodes=K <the user's options and command>`. The
/// user's own `--exclude` is merged into ours (srun keeps only the last);
/// other options of theirs still win where they repeat ours. With nothing
/// to leave out, the command is run as it is (a node count means nothing
/// to a command that is not srun). `None` when nodes must be left out and
/// the command is not such an srun.
pub fn leave_out(argv: &[OsString], exclude: &[String], nodes: u32) -> Option<Vec<OsString>> {
    if exclude.is_empty() && (nodes == 0 || !can_leave_out(argv)) {
        return Some(argv.to_vec());
    }
    if !can_leave_out(argv) {
        return None;
    }
    let (theirs_at, theirs) = user_exclude(argv).ok()?;
    let mut all: Vec<String> = theirs;
    for n in exclude {
        if !all.contains(n) {
            all.push(n.clone());
        }
    }
    let mut out = vec![argv[0].clone()];
    if !all.is_empty() {
        out.push(format!("--exclude={}", super::hostlist::compress(&all)).into());
    }
    if nodes > 0 {
        out.push(format!("--nodes={nodes}").into());
    }
    out.extend(
        argv.iter()
            .enumerate()
            .skip(1)
            .filter(|(i, _)| !theirs_at.contains(i))
            .map(|(_, a)| a.clone()),
    );
    Some(out)
}

/// Whether a batch script asks Slurm to keep the allocation when a node
/// fails (`#SBATCH --no-kill` or `-k`, in the `#SBATCH` lines before the
/// first command, as sbatch reads them).
pub fn script_keeps_allocation(script: &str) -> bool {
    for line in script.lines().skip(1) {
        let t = line.trim();
        if t.is_empty() || (t.starts_with('#') && !t.starts_with("#SBATCH")) {
            continue;
        }
        let Some(opts) = t.strip_prefix("#SBATCH") else {
            break;
        };
        let keeps = opts
            .split_whitespace()
            .take_while(|w| !w.starts_with('#'))
            .any(|w| w == "-k" || w == "--no-kill" || w.starts_with("--no-kill="));
        if keeps {
            return true;
        }
    }
    false
}

/// What to warn about at an allocation's start when its spare nodes cannot
/// replace a node that dies: the allocation holds more nodes than the step
/// asks for (`step_nodes`), relaunching inside it is on, and neither the
/// batch script nor sbatch's environment (`SBATCH_NO_KILL`) asks for
/// `--no-kill`, so Slurm ends the whole allocation when it declares a node
/// failed. `script`: the batch script, when it could be read (not read: no
/// warning, rather than a false one).
pub fn spares_without_no_kill(
    job_nodes: usize,
    step_nodes: Option<u32>,
    relaunch_here: bool,
    script: Option<&str>,
    env_no_kill: bool,
) -> Option<String> {
    let step = step_nodes? as usize;
    if !relaunch_here || job_nodes <= step || env_no_kill {
        return None;
    }
    let script = script?;
    if script_keeps_allocation(script) {
        return None;
    }
    Some(format!(
        "the allocation has {} spare node(s) for a {step}-node step, but the batch script does not ask for --no-kill: when a node dies, Slurm ends the whole allocation about SlurmdTimeout later, spares included; add `#SBATCH --no-kill`",
        job_nodes - step
    ))
}

/// A relaunch's `srun` with `--overlap`: it may share the allocation's
/// resources with the step before it. A step whose node died stays listed,
/// holding its other nodes, until slurmctld hears from that node again, and
/// a new step that does not overlap waits for it with no end (seen on the
/// testbed: `kill-node` with `--no-kill`, over 150 s; with `--overlap` the
/// relaunch started at once). The step before has ended everywhere else,
/// so nothing is shared in practice. Left as it is when it is not srun, or
/// asks for `--overlap` or `--exclusive` itself.
pub fn overlapping(argv: &[OsString]) -> Vec<OsString> {
    if !is_srun(argv) {
        return argv.to_vec();
    }
    let (opts, _) = srun_opts(argv);
    if opts
        .iter()
        .any(|o| matches!(o.name.as_str(), "overlap" | "exclusive"))
    {
        return argv.to_vec();
    }
    let mut out = vec![argv[0].clone(), "--overlap".into()];
    out.extend(argv[1..].iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spares_need_no_kill() {
        let with = "#!/bin/bash\n#SBATCH -N 5\n#SBATCH --requeue --no-kill # keep it\nexec resilio run -- srun -N 4 x\n";
        let short = "#!/bin/bash\n#SBATCH -N 5 -k\nsrun x\n";
        let without = "#!/bin/bash\n#SBATCH -N 5\n#SBATCH --requeue\n\n# a comment\nexec resilio run -- srun -N 4 x\n#SBATCH --no-kill\n";
        assert!(script_keeps_allocation(with));
        assert!(script_keeps_allocation(short));
        assert!(
            !script_keeps_allocation(without),
            "after the first command sbatch reads no more"
        );
        assert!(!script_keeps_allocation(
            "#!/bin/bash\n#SBATCH --job-name=no-kill-k\n"
        ));
        let warn = spares_without_no_kill(5, Some(4), true, Some(without), false).unwrap();
        assert!(warn.contains("1 spare node(s) for a 4-node step"), "{warn}");
        for quiet in [
            spares_without_no_kill(5, Some(4), true, Some(with), false),
            spares_without_no_kill(5, Some(4), true, Some(without), true),
            spares_without_no_kill(5, Some(4), false, Some(without), false),
            spares_without_no_kill(4, Some(4), true, Some(without), false),
            spares_without_no_kill(5, None, true, Some(without), false),
            spares_without_no_kill(5, Some(4), true, None, false),
        ] {
            assert_eq!(quiet, None);
        }
    }

    #[test]
    fn a_relaunch_overlaps_the_step_before_it() {
        let argv = v(&[
            "srun",
            "-N",
            "3",
            "resilio",
            "run",
            "--",
            "python3",
            "t.py",
            "--exclusive",
        ]);
        assert_eq!(
            overlapping(&argv),
            v(&[
                "srun",
                "--overlap",
                "-N",
                "3",
                "resilio",
                "run",
                "--",
                "python3",
                "t.py",
                "--exclusive"
            ])
        );
        for kept in [
            &["srun", "--overlap", "x"][..],
            &["srun", "--exclusive", "x"],
            &["bash", "train.sh"],
        ] {
            assert_eq!(overlapping(&v(kept)), v(kept), "{kept:?}");
        }
    }

    fn v(xs: &[&str]) -> Vec<OsString> {
        xs.iter().map(OsString::from).collect()
    }

    #[test]
    fn srun_leaves_nodes_out() {
        let argv = v(&["srun", "-n", "3", "resilio", "run", "--", "python3", "t.py"]);
        let out = leave_out(&argv, &["n2".into(), "n3".into()], 3).unwrap();
        assert_eq!(
            out,
            v(&[
                "srun",
                "--exclude=n[2-3]",
                "--nodes=3",
                "-n",
                "3",
                "resilio",
                "run",
                "--",
                "python3",
                "t.py"
            ])
        );
        let full = v(&["/usr/bin/srun", "python3"]);
        assert!(can_leave_out(&full));
        assert_eq!(leave_out(&full, &[], 0).unwrap(), full);
        for pinned in [
            &["srun", "-w", "n1", "x"][..],
            &["srun", "-wn[1-3]", "x"],
            &["srun", "--nodelist=n1", "x"],
            &["srun", "--nodefile", "f", "x"],
        ] {
            assert!(!can_leave_out(&v(pinned)), "{pinned:?}");
            assert!(leave_out(&v(pinned), &["n2".into()], 2).is_none());
        }
        assert!(!can_leave_out(&v(&["bash", "train.sh"])));
        // Nothing to leave out: a command that is not srun runs as it is.
        let plain = v(&["bash", "train.sh"]);
        assert_eq!(leave_out(&plain, &[], 3).unwrap(), plain);
    }

    #[test]
    fn the_users_own_exclusion_is_kept() {
        for theirs in [
            &[
                "srun", "-x", "n[7-8]", "-N", "2", "resilio", "run", "--", "x",
            ][..],
            &[
                "srun",
                "--exclude=n[7-8]",
                "-N",
                "2",
                "resilio",
                "run",
                "--",
                "x",
            ],
            &[
                "srun",
                "--exclude",
                "n7,n8",
                "-N",
                "2",
                "resilio",
                "run",
                "--",
                "x",
            ],
            &["srun", "-xn[7-8]", "-N", "2", "resilio", "run", "--", "x"],
        ] {
            let out = leave_out(&v(theirs), &["n2".into(), "n7".into()], 2).unwrap();
            assert_eq!(
                out,
                v(&[
                    "srun",
                    "--exclude=n[2,7-8]",
                    "--nodes=2",
                    "-N",
                    "2",
                    "resilio",
                    "run",
                    "--",
                    "x"
                ]),
                "{theirs:?}"
            );
        }
        // A wrapper's own options are not srun's: its `-x 3` stays its own.
        let argv = v(&["srun", "-N", "2", "./launch.sh", "-x", "3"]);
        assert_eq!(srun_opts(&argv).1, 3);
        let out = leave_out(&argv, &["n2".into()], 2).unwrap();
        assert_eq!(
            out,
            v(&[
                "srun",
                "--exclude=n2",
                "--nodes=2",
                "-N",
                "2",
                "./launch.sh",
                "-x",
                "3"
            ])
        );
        // Values of srun's options are not the command: a job name like
        // `python_job`, `--time 10`, a cluster `-lN 2`.
        let argv = v(&[
            "srun",
            "-J",
            "python_job",
            "--time",
            "10",
            "-lN",
            "2",
            "-x",
            "n7",
            "resilio",
            "run",
        ]);
        assert_eq!(srun_opts(&argv).1, 9);
        assert_eq!(requested_nodes(&argv), Some(2));
        let out = leave_out(&argv, &["n2".into()], 0).unwrap();
        assert_eq!(out[1], "--exclude=n[2,7]");
        assert!(!out.iter().any(|a| a == "-x" || a == "n7"));
        // The trainer's own `-w`/`--nodelist` do not pin srun's nodes.
        let argv = v(&[
            "srun", "resilio", "run", "--", "python3", "t.py", "-warmup", "5",
        ]);
        assert!(can_leave_out(&argv));
        // The trainer's own `-x` is not srun's.
        let argv = v(&["srun", "resilio", "run", "--", "python3", "t.py", "-x", "3"]);
        let out = leave_out(&argv, &["n2".into()], 0).unwrap();
        assert_eq!(out[1], "--exclude=n2");
        assert_eq!(&out[2..], &argv[1..]);
        // A file of excluded nodes cannot be merged: no leaving out.
        let file = v(&[
            "srun",
            "--exclude=/etc/bad-nodes",
            "resilio",
            "run",
            "--",
            "x",
        ]);
        assert!(!can_leave_out(&file));
        assert!(leave_out(&file, &["n2".into()], 0).is_none());
    }

    #[test]
    fn the_step_size_srun_asks_for() {
        assert_eq!(
            requested_nodes(&v(&[
                "srun", "-N", "3", "resilio", "run", "--", "python3", "-N", "9"
            ])),
            Some(3)
        );
        assert_eq!(requested_nodes(&v(&["srun", "-N4", "python3"])), Some(4));
        assert_eq!(
            requested_nodes(&v(&["/usr/bin/srun", "--nodes=2", "--ntasks=8", "x"])),
            Some(2)
        );
        assert_eq!(requested_nodes(&v(&["srun", "--nodes", "5", "x"])), Some(5));
        assert_eq!(requested_nodes(&v(&["srun", "-N", "2-4", "x"])), None);
        assert_eq!(requested_nodes(&v(&["srun", "-n", "8", "x"])), None);
        assert_eq!(requested_nodes(&v(&["bash", "-N", "3"])), None);
    }

    #[test]
    fn relaunch_round_trips_and_rejects_garbage() {
        let r = NextAttempt {
            attempt: 2,
            failed_at_us: 1_790_000_000_000_000,
            nodes: 3,
            exclude: vec!["n2".into(), "gpu-a01".into()],
        };
        assert_eq!(NextAttempt::parse(&r.encode()).unwrap(), r);
        let none = NextAttempt {
            attempt: 1,
            ..Default::default()
        };
        assert_eq!(NextAttempt::parse(&none.encode()).unwrap(), none);
        assert!(NextAttempt::parse("attempt=x").is_err());
        assert!(NextAttempt::parse("nodes=3").is_err());
        assert!(NextAttempt::parse("attempt=1 exclude=n1;rm").is_err());
        assert!(NextAttempt::parse("attempt=1 colour=red").is_err());
    }
}
