//! `resilio fleet`: restart storms across the jobs of a state dir, read
//! from the journals of real runs.

use crate::common::*;
use std::process::Command;
use std::time::Duration;

/// A trainer that reaches a further step each attempt and then loses a
/// GPU (an infrastructure failure: restarted, never a crash loop), until
/// attempt `last`, which completes.
const STORMY: &str = r#"
import os, sys
attempt = int(os.environ.get("RESILIO_ATTEMPT", "0"))
last = int(sys.argv[1])
for step in range(1, 3 + attempt + 1):
    print(f"step {step} loss 0.5", flush=True)
if attempt < last:
    print("RuntimeError: CUDA error: uncorrectable ECC error encountered", file=sys.stderr, flush=True)
    sys.exit(1)
"#;

/// Two real jobs in one state dir: one restarted five times (a storm
/// past the threshold of 3), one once. `resilio fleet` names the first
/// with its failures and node, not the second; its Prometheus output and
/// JSON say the same; `--quiet` prints nothing when no job is past the
/// threshold; a bad window is a usage error.
#[test]
fn fleet_names_the_job_restarting_past_the_threshold_and_its_node() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("stormy.py");
    std::fs::write(&script, STORMY).unwrap();
    for (job, last) in [("storm", "5"), ("calm", "1")] {
        let mut c = resilio_run(tmp.path(), job);
        c.args(["--max-restarts", "6", "--", "python3"])
            .arg(&script)
            .arg(last);
        let (o, _) = output_within(&mut c, Duration::from_secs(120));
        assert_eq!(o.status.code(), Some(0), "{job}: {}", stderr_of(&o));
    }
    let fleet = |args: &[&str]| {
        Command::new(bin())
            .arg("fleet")
            .arg("--state-dir")
            .arg(tmp.path())
            .args(args)
            .env("RESILIO_SYSTEM_CONFIG", "")
            .output()
            .unwrap()
    };
    let o = fleet(&[]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.starts_with("restart storms in the last 1h00m: 1 job(s) restarted more than 3 time(s) (2 job(s) read, 6 restart(s))"),
        "{text}"
    );
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    assert!(text.contains("job storm ("), "{text}");
    assert!(text.contains(": 5 restart(s)"), "{text}");
    assert!(text.contains("failures: infrastructure 5;"), "{text}");
    assert!(text.contains(&format!("nodes: {host}")), "{text}");
    assert!(!text.contains("job calm"), "{text}");
    // Every job's recoveries (5 of one, 1 of the other), by failure class:
    // each phase's p50/p99.
    assert!(
        text.contains("recoveries within the window, by failure class (n; each phase's p50/p99):\n  infrastructure (6): detection "),
        "{text}"
    );
    assert!(text.contains(", total "), "{text}");

    let o = fleet(&["--prometheus"]);
    let prom = String::from_utf8_lossy(&o.stdout);
    assert!(prom.contains("resilio_fleet_storming_jobs 1\n"), "{prom}");
    assert!(prom.contains("resilio_fleet_window_restarts 6\n"), "{prom}");
    assert!(
        prom.contains("resilio_fleet_job_restarts{job=\"storm\","),
        "{prom}"
    );

    // The recoveries as histograms, by class and phase.
    assert!(
        prom.contains("# TYPE resilio_fleet_recovery_seconds histogram\n"),
        "{prom}"
    );
    assert!(
        prom.contains(
            "resilio_fleet_recovery_seconds_count{class=\"infrastructure\",phase=\"total\"} 6\n"
        ),
        "{prom}"
    );
    assert!(
        prom.contains("resilio_fleet_recovery_seconds_bucket{class=\"infrastructure\",phase=\"total\",le=\"+Inf\"} 6\n"),
        "{prom}"
    );

    let o = fleet(&["--json", "--restarts", "4"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let by = &v["recoveries_by_class"][0];
    assert_eq!(
        (by["class"].as_str(), by["n"].as_u64()),
        (Some("infrastructure"), Some(6)),
        "{v:#}"
    );
    let phases: Vec<&str> = by["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert!(
        phases.contains(&"teardown") && phases.last() == Some(&"total"),
        "{phases:?}"
    );
    assert_eq!(v["jobs"][0]["job"], "storm", "{v:#}");
    assert_eq!(v["jobs"][0]["restarts"], 5, "{v:#}");
    assert_eq!(v["threshold"], 4);

    // Past no threshold: quiet for cron; said in one line otherwise.
    let o = fleet(&["--restarts", "5", "--quiet"]);
    assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    let o = fleet(&["--restarts", "5"]);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("no restart storm in the last 1h00m"));
    // A window that ended before the jobs ran: nothing read at all.
    let o = fleet(&["--window", "1ms"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("(0 job(s) read, 0 restart(s))"));
    let o = fleet(&["--window", "soon"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr_of(&o).contains("--window"), "{}", stderr_of(&o));
}
