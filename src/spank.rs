//! Started by the SPANK plugin (`slurm-plugin/`): slurmstepd execs resilio
//! in place of the task's command, whose path the plugin put in
//! [`ENV_EXEC`] (and the user's `--resilio=key=value,...` in [`ENV_OPTS`]).
//! [`command_line`] turns that back into `resilio run [flags] -- COMMAND
//! ARGS...`, so the task runs under a rank agent (or, for the batch
//! script, under the job level) as if the user had written the prefix.

use std::ffi::OsString;

pub const ENV_EXEC: &str = "RESILIO_SPANK_EXEC";
pub const ENV_OPTS: &str = "RESILIO_SPANK_OPTS";

/// The keys `--resilio=` takes, as `resilio run` flags.
const KEYS: &[&str] = &[
    "max-restarts",
    "stall-timeout",
    "startup-timeout",
    "stall-floor",
    "eval-timeout",
    "checkpoint-timeout",
    "kill-grace",
    "config",
];

/// `resilio run` with the flags of `opts` (`key=value,...`), then `--`,
/// `exec` and the task's own arguments (`args`, after its argv[0]). Pure.
pub fn argv_of(exec: OsString, opts: &str, args: &[OsString]) -> Result<Vec<OsString>, String> {
    let mut out: Vec<OsString> = vec!["resilio".into(), "run".into()];
    for item in opts.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        // `--resilio=observe`: observe mode (journal what would be done).
        if item == "observe" {
            out.push("--observe".into());
            continue;
        }
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("--resilio: '{item}' is not key=value"))?;
        let key = key.replace('_', "-");
        if !KEYS.contains(&key.as_str()) {
            return Err(format!(
                "--resilio: unknown key '{key}' (known: {})",
                KEYS.join(", ")
            ));
        }
        if value.is_empty() {
            return Err(format!("--resilio: {key} has no value"));
        }
        out.push(format!("--{key}").into());
        out.push(value.into());
    }
    out.push("--".into());
    out.push(exec);
    out.extend(args.iter().cloned());
    Ok(out)
}

/// This process's command line: as given, or, when the plugin started it,
/// the `resilio run ...` it stands for (the plugin's variables are removed
/// so that nothing below sees them).
pub fn command_line(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let Some(exec) = std::env::var_os(ENV_EXEC).filter(|e| !e.is_empty()) else {
        return Ok(args);
    };
    let opts = std::env::var(ENV_OPTS).unwrap_or_default();
    std::env::remove_var(ENV_EXEC);
    std::env::remove_var(ENV_OPTS);
    argv_of(exec, &opts, args.get(1..).unwrap_or(&[]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn observe_is_a_word_of_its_own() {
        let v = argv_of("/bin/sh".into(), "observe,stall-floor=5s", &[]).unwrap();
        assert_eq!(
            v,
            [
                "resilio",
                "run",
                "--observe",
                "--stall-floor",
                "5s",
                "--",
                "/bin/sh"
            ]
            .map(std::ffi::OsString::from)
        );
    }

    #[test]
    fn the_plugins_task_becomes_resilio_run_around_the_command() {
        assert_eq!(
            argv_of(
                "/usr/bin/python3".into(),
                "",
                &os(&["train.py", "--lr", "3e-4"])
            )
            .unwrap(),
            os(&[
                "resilio",
                "run",
                "--",
                "/usr/bin/python3",
                "train.py",
                "--lr",
                "3e-4"
            ])
        );
        assert_eq!(
            argv_of("/bin/sh".into(), "max_restarts=2,stall-timeout=5m", &[]).unwrap(),
            os(&[
                "resilio",
                "run",
                "--max-restarts",
                "2",
                "--stall-timeout",
                "5m",
                "--",
                "/bin/sh"
            ])
        );
        // An argument that looks like a flag stays the command's.
        assert_eq!(
            argv_of("/bin/x".into(), "", &os(&["--resilio", "--"])).unwrap(),
            os(&["resilio", "run", "--", "/bin/x", "--resilio", "--"])
        );
    }

    #[test]
    fn unknown_or_empty_keys_are_refused_with_what_is_known() {
        let e = argv_of("/bin/x".into(), "retries=3", &[]).unwrap_err();
        assert!(
            e.contains("unknown key 'retries'") && e.contains("max-restarts"),
            "{e}"
        );
        assert!(argv_of("/bin/x".into(), "config", &[])
            .unwrap_err()
            .contains("key=value"));
        assert!(argv_of("/bin/x".into(), "config=", &[])
            .unwrap_err()
            .contains("no value"));
    }
}
