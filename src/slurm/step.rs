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
        || a == "-w"
        || (a.starts_with("-w") && !a.starts_with("--"))
}

/// The node count an `srun` line asks for (`-N K`, `-NK`, `--nodes=K`,
/// `--nodes K`); `None` when it gives none or a range. srun's own options
/// come before the command it runs: the scan stops at `--` or at the first
/// argument naming `resilio` or a Python interpreter.
pub fn requested_nodes(argv: &[OsString]) -> Option<u32> {
    if !is_srun(argv) {
        return None;
    }
    let mut it = argv[1..].iter().map(|a| a.to_string_lossy());
    let mut found = None;
    while let Some(a) = it.next() {
        let base = a.rsplit('/').next().unwrap_or(&a).to_string();
        if a == "--" || base == "resilio" || base.starts_with("python") {
            break;
        }
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
    is_srun(argv) && !argv[1..].iter().any(|a| pins_nodes(a))
}

/// `srun --exclude=... --nodes=K <the user's options and command>`; the
/// user's own later options still win where they repeat ours. `None` when
/// the command is not such an srun.
pub fn leave_out(argv: &[OsString], exclude: &[String], nodes: u32) -> Option<Vec<OsString>> {
    if exclude.is_empty() && nodes == 0 {
        return Some(argv.to_vec());
    }
    if !can_leave_out(argv) {
        return None;
    }
    let mut out = vec![argv[0].clone()];
    if !exclude.is_empty() {
        out.push(format!("--exclude={}", super::hostlist::compress(exclude)).into());
    }
    if nodes > 0 {
        out.push(format!("--nodes={nodes}").into());
    }
    out.extend(argv[1..].iter().cloned());
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
