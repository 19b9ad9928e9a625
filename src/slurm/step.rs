//! Relaunching the job step inside its allocation: the `srun` command line
//! with nodes left out, and the hand-over from one attempt's job-level
//! supervisor to the next (`RESILIO_RELAUNCH`).

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// Set by the job-level supervisor for its own next attempt in the same
/// allocation: `attempt=N failed_at_us=T nodes=K exclude=n1,n2`.
pub const ENV_RELAUNCH: &str = "RESILIO_RELAUNCH";

/// What one attempt hands to the next inside the allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Relaunch {
    pub attempt: u32,
    /// When the failure that ended the previous attempt happened (Unix µs).
    pub failed_at_us: i64,
    /// Nodes the step runs on (`srun --nodes`); 0 leaves srun's own choice.
    pub nodes: u32,
    /// Nodes left out of the step (`srun --exclude`).
    pub exclude: Vec<String>,
}

impl Relaunch {
    pub fn encode(&self) -> String {
        format!(
            "attempt={} failed_at_us={} nodes={} exclude={}",
            self.attempt,
            self.failed_at_us,
            self.nodes,
            self.exclude.join(",")
        )
    }

    pub fn parse(text: &str) -> Result<Relaunch, String> {
        let mut r = Relaunch::default();
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

/// Options that pin the step to named nodes: leaving one out would
/// contradict them. Everything on the line is checked, the trainer's own
/// arguments included: a false alarm only means a requeue instead.
fn pins_nodes(arg: &OsStr) -> bool {
    let a = arg.to_string_lossy();
    a == "-F"
        || a == "--nodefile"
        || a.starts_with("--nodefile=")
        || a == "--nodelist"
        || a.starts_with("--nodelist=")
        || (a.starts_with("-w") && !a.starts_with("--"))
}

/// Where srun's own options end: at `--`, or at the first argument naming
/// `resilio` or a Python interpreter (the command srun runs).
fn srun_options(argv: &[OsString]) -> std::ops::Range<usize> {
    let end = argv
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, a)| {
            let a = a.to_string_lossy();
            let base = a.rsplit('/').next().unwrap_or(&a).to_string();
            a == "--" || base == "resilio" || base.starts_with("python")
        })
        .map_or(argv.len(), |(i, _)| i);
    1..end.max(1)
}

/// The user's own `-x/--exclude` on the srun line: the argument indices it
/// takes and the nodes it names (`Err` when it names a file, which cannot
/// be merged with ours).
fn user_exclude(argv: &[OsString]) -> Result<(Vec<usize>, Vec<String>), String> {
    let mut at = Vec::new();
    let mut nodes = Vec::new();
    let range = srun_options(argv);
    let mut i = range.start;
    while i < range.end {
        let a = argv[i].to_string_lossy();
        let value = if a == "-x" || a == "--exclude" {
            at.extend([i, i + 1]);
            i += 1;
            argv.get(i).map(|v| v.to_string_lossy().to_string())
        } else if let Some(v) = a.strip_prefix("--exclude=") {
            at.push(i);
            Some(v.to_string())
        } else if let Some(v) = a.strip_prefix("-x").filter(|_| !a.starts_with("--")) {
            at.push(i);
            Some(v.to_string())
        } else {
            None
        };
        if let Some(v) = value {
            if v.contains('/') {
                return Err(format!("srun --exclude names a file ({v})"));
            }
            nodes.extend(super::hostlist::expand(&v)?);
        }
        i += 1;
    }
    Ok((at, nodes))
}

/// The node count an `srun` line asks for (`-N K`, `-NK`, `--nodes=K`,
/// `--nodes K`); `None` when it gives none or a range. srun's own options
/// come before the command it runs: the scan stops at `--` or at the first
/// argument naming `resilio` or a Python interpreter.
pub fn requested_nodes(argv: &[OsString]) -> Option<u32> {
    if !is_srun(argv) {
        return None;
    }
    let mut it = argv[srun_options(argv)].iter().map(|a| a.to_string_lossy());
    let mut found = None;
    while let Some(a) = it.next() {
        let value = if a == "-N" || a == "--nodes" {
            it.next().map(|v| v.to_string())
        } else if let Some(v) = a.strip_prefix("--nodes=") {
            Some(v.to_string())
        } else if let Some(v) = a.strip_prefix("-N").filter(|_| !a.starts_with("--")) {
            Some(v.to_string())
        } else {
            continue;
        };
        found = value.and_then(|v| v.parse().ok());
    }
    found
}

/// Whether the step command can be told to leave nodes out.
pub fn can_leave_out(argv: &[OsString]) -> bool {
    is_srun(argv)
        && !argv[srun_options(argv)].iter().any(|a| pins_nodes(a))
        && user_exclude(argv).is_ok()
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let r = Relaunch {
            attempt: 2,
            failed_at_us: 1_790_000_000_000_000,
            nodes: 3,
            exclude: vec!["n2".into(), "gpu-a01".into()],
        };
        assert_eq!(Relaunch::parse(&r.encode()).unwrap(), r);
        let none = Relaunch {
            attempt: 1,
            ..Default::default()
        };
        assert_eq!(Relaunch::parse(&none.encode()).unwrap(), none);
        assert!(Relaunch::parse("attempt=x").is_err());
        assert!(Relaunch::parse("nodes=3").is_err());
        assert!(Relaunch::parse("attempt=1 exclude=n1;rm").is_err());
        assert!(Relaunch::parse("attempt=1 colour=red").is_err());
    }
}
