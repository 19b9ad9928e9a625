//! Reports on a big job: a generated journal of BENCH_RANKS ranks (1,000 by
//! default) over two attempts, 10 records per rank (10,000 records in
//! 1,000+ files), then `resilio report JOB --json`, `resilio report JOB`,
//! `resilio timeline JOB` and `resilio timeline JOB --html` as a user runs
//! them (whole processes, best of BENCH_RUNS), side by side with what a user
//! would otherwise do: load the same JSON lines with a Python one-liner
//! (parsing only, no analysis). Goal: each report under one second.
//!
//! `cargo bench --bench report` (`BENCH_KEEP=DIR` leaves the journal in DIR)

use resilio::journal::Writer;
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

fn env_num(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn best_of(runs: u64, mut f: impl FnMut()) -> Duration {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap()
}

fn main() {
    let ranks = env_num("BENCH_RANKS", 1000) as u32;
    let runs = env_num("BENCH_RUNS", 5);
    let tmp = tempfile::tempdir().unwrap();
    // BENCH_KEEP=DIR: generate the journal there and leave it, for paired
    // timings of two builds (farm-bench).
    let state = std::env::var_os("BENCH_KEEP")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().join("state"));
    let job = "900001";
    let dir = resilio::journal::job_dir(&state, job);
    let nodes_per = 8;
    let t_gen = Instant::now();
    for rank in 0..ranks {
        let node = format!("gpu{:04}", rank / nodes_per);
        for attempt in 0..2u32 {
            let mut w = Writer::open(
                &dir,
                &format!("rank-{rank}.jsonl"),
                attempt,
                Some(rank),
                Some(node.clone()),
            );
            w.record(
                "rank_start",
                json!({ "pid": 1000 + rank, "argv": ["python", "train.py"] }),
                false,
            );
            w.record(
                "progress",
                json!({ "step": 1 + attempt * 500, "first": true, "source": "stdout" }),
                false,
            );
            w.record(
                "progress",
                json!({ "step": 250 + attempt * 500, "source": "stdout" }),
                false,
            );
            w.record(
                "checkpoint_done",
                json!({ "step": 300 + attempt * 500, "duration_s": 4.0, "blocked_training": true }),
                false,
            );
            let (code, class) = if attempt == 0 && rank == 17 {
                (137, "infrastructure")
            } else if attempt == 0 {
                (1, "secondary")
            } else {
                (0, "clean")
            };
            w.record(
                "rank_exit",
                json!({ "exit_code": code, "class": class, "last_step": 400 + attempt * 600, "cause": "x" }),
                true,
            );
        }
    }
    let mut b = Writer::open(&dir, "batch.jsonl", 0, None, Some("gpu0000".into()));
    b.record(
        "job_start",
        json!({ "allocation": 0, "world_size": ranks }),
        true,
    );
    b.record(
        "judgment",
        json!({ "class": "infrastructure", "primary_rank": 17, "primary_node": "gpu0002", "blamed_nodes": ["gpu0002"] }),
        true,
    );
    b.record(
        "requeue",
        json!({ "reason": "infrastructure", "exclude": ["gpu0002"] }),
        true,
    );
    let records = resilio::journal::read_job(&dir).unwrap().records.len();
    eprintln!(
        "generated {records} records of {ranks} ranks in {:.1}s",
        t_gen.elapsed().as_secs_f64()
    );

    let bin = env!("CARGO_BIN_EXE_resilio");
    let html = tmp.path().join("t.html");
    let resilio = |args: &[&str]| {
        let o = Command::new(bin)
            .args(args)
            .env("RESILIO_STATE_DIR", &state)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "resilio report --json",
            vec!["report".into(), job.into(), "--json".into()],
        ),
        ("resilio report", vec!["report".into(), job.into()]),
        ("resilio timeline", vec!["timeline".into(), job.into()]),
        (
            "resilio timeline --html",
            vec![
                "timeline".into(),
                job.into(),
                "--html".into(),
                html.display().to_string(),
            ],
        ),
    ];
    let python = format!(
        "import glob,json\nn=0\nfor f in glob.glob('{}/*.jsonl'):\n  for l in open(f):\n    json.loads(l); n+=1\nassert n>0",
        dir.display()
    );
    let py = best_of(runs, || {
        let o = Command::new("python3")
            .args(["-c", &python])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    });
    println!("\nreports on {ranks} ranks, {records} records (best of {runs})");
    println!(
        "{:<28} {:>10} {:>22}",
        "command", "time", "vs python json parse"
    );
    for (name, args) in &cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let t = best_of(runs, || resilio(&a));
        println!(
            "{:<28} {:>8.0}ms {:>21.2}x {}",
            name,
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() / py.as_secs_f64(),
            if t < Duration::from_secs(1) {
                "(< 1 s)"
            } else {
                "(OVER 1 s)"
            }
        );
    }
    println!(
        "{:<28} {:>8.0}ms {:>21.2}x",
        "python3: parse the JSON only",
        py.as_secs_f64() * 1e3,
        1.0
    );
    println!(
        "html page: {} KiB",
        std::fs::metadata(&html)
            .map(|m| m.len() / 1024)
            .unwrap_or(0)
    );
}
