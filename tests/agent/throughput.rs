//! Useful work, read from the trainer's own lines with no code change:
//! tokens/s, TFLOP/s and MFU per attempt, live in `status`, and goodput in
//! the report, checked against what the trainer itself recorded.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn throughput_trainer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/throughput_trainer.py")
}

fn report_json(state: &Path, job: &str) -> serde_json::Value {
    let out = Command::new(bin())
        .args([
            "report",
            "--json",
            "--state-dir",
            state.to_str().unwrap(),
            job,
        ])
        .env("RESILIO_SYSTEM_CONFIG", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn report_text(state: &Path, job: &str) -> String {
    let out = Command::new(bin())
        .args(["report", "--state-dir", state.to_str().unwrap(), job])
        .env("RESILIO_SYSTEM_CONFIG", "")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn torchtitan_lines_give_tokens_mfu_live_and_a_goodput_the_trainer_agrees_with() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), "[journal]\nprogress_interval = \"1s\"\n");
    let record = tmp.path().join("record.json");
    let ready = tmp.path().join("ready");
    let mut c = resilio_run(tmp.path(), "titan");
    c.args(["--ntasks", "2", "--max-restarts", "0", "--config"])
        .arg(&cfg)
        .arg("--")
        .arg("python3")
        .arg(throughput_trainer())
        .args(["--style", "titan", "--steps", "240", "--step-time", "0.05"])
        .args(["--tokens", "4096", "--record"])
        .arg(&record)
        .arg("--ready-file")
        .arg(&ready);
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    assert!(wait_for(Duration::from_secs(30), || ready.exists()));
    // Live: `status` shows the job's tokens/s and MFU from rank 0's lines.
    let mut live = serde_json::Value::Null;
    let seen = wait_for(Duration::from_secs(15), || {
        let o = Command::new(bin())
            .args(["status", "titan", "--json", "--state-dir"])
            .arg(tmp.path())
            .output()
            .unwrap();
        live = serde_json::from_slice(&o.stdout).unwrap_or_default();
        live["tokens_per_s"].as_f64().is_some() && live["mfu"].as_f64().is_some()
    });
    assert!(seen, "status never showed throughput: {live}");
    // 4096 tokens per 0.05 s on each of 2 devices: about 163,840 tokens/s.
    let tps = live["tokens_per_s"].as_f64().unwrap();
    assert!((120_000.0..170_000.0).contains(&tps), "{live}");
    assert!(
        live["ranks"][0]["figures"]["loss"].as_f64().is_some(),
        "{live}"
    );
    // And /metrics, for Prometheus.
    let (url, token) = crate::coordinator::coordinator_of(tmp.path(), "titan").unwrap();
    let (code, metrics) = crate::coordinator::http(&url, "GET", "/metrics", Some(&token), "");
    assert_eq!(code, 200);
    for line in [
        "resilio_tokens_per_second{job=\"titan\"} ",
        "resilio_mfu{job=\"titan\"} ",
        "resilio_figure{job=\"titan\",rank=\"0\",node=",
    ] {
        assert!(metrics.contains(line), "no {line} in:\n{metrics}");
    }
    let (out, _) = wait_output(child, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

    let r = report_json(tmp.path(), "titan");
    let t = &r["attempts"][0]["throughput"];
    assert_eq!(t["devices"], 2, "{t}");
    assert_eq!(t["from"], serde_json::json!(["printed"]), "{t}");
    let mfu = t["mfu"].as_f64().unwrap();
    // The trainer prints tflops = tps * 6e9 / 1e12 and mfu = tflops / 989.
    let tflops = t["tflops_per_device"].as_f64().unwrap();
    assert!((mfu - tflops / 989.0).abs() < 0.01, "{t}");
    // Goodput: the tokens in productive time (the first step's included),
    // against the trainer's own count of the tokens it trained (this run
    // loses nothing): within 2.5%, the printed rate being sampled at the
    // agent's reads (within 0.2% idle, up to 1.8% seen under load; see
    // docs/throughput.md).
    let mine: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    let trained = mine["tokens"].as_f64().unwrap() * mine["world"].as_f64().unwrap();
    let kept = r["goodput"]["tokens_kept"].as_f64().unwrap();
    assert!(
        (kept - trained).abs() / trained < 0.025,
        "report: {kept} tokens kept; trainer: {trained} trained\n\
         lost: {}\nthroughput: {t}\ntrainer: {mine}",
        r["lost_s"]
    );
    let text = report_text(tmp.path(), "titan");
    assert!(text.contains("\nthroughput"), "{text}");
    assert!(text.contains("goodput: "), "{text}");
}

#[test]
fn megatron_lines_with_the_gpus_peak_from_nvidia_smi_give_mfu() {
    // Megatron prints TFLOP/s per GPU but no MFU: the peak comes from the
    // GPU's name (a labelled fake nvidia-smi: this machine has no GPU).
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(
        tmp.path(),
        "[journal]\nprogress_interval = \"1s\"\n[throughput]\npeak_tflops = \"auto\"\n",
    );
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-gpu");
    let path = format!(
        "{}:{}",
        fake.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = resilio_run(tmp.path(), "mega");
    c.env("PATH", path)
        .args(["--max-restarts", "0", "--config"])
        .arg(&cfg)
        .arg("--")
        .arg("python3")
        .arg(throughput_trainer())
        .args([
            "--style",
            "megatron",
            "--steps",
            "60",
            "--step-time",
            "0.05",
        ]);
    let (out, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "mega");
    let start = one(&recs, "rank_start");
    assert_eq!(
        start.get("device").and_then(|d| d.as_str()),
        Some("NVIDIA H100 80GB HBM3")
    );
    assert_eq!(
        start.get("peak_tflops").and_then(|p| p.as_f64()),
        Some(989.0)
    );
    let r = report_json(tmp.path(), "mega");
    let t = &r["attempts"][0]["throughput"];
    let tflops = t["tflops_per_device"].as_f64().unwrap();
    let mfu = t["mfu"].as_f64().unwrap();
    assert!((mfu - tflops / 989.0).abs() < 1e-9, "{t}");
    assert!(t["step_time_s"].as_f64().unwrap() > 0.04, "{t}");
    assert!(r["goodput"]["effective_mfu"].as_f64().is_some(), "{r}");
}

#[test]
fn without_figures_the_configured_tokens_and_flops_give_the_throughput() {
    // A trainer that prints steps only (nanoGPT-style, no mfu): tokens per
    // step and FLOPs per token from [throughput].
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(
        tmp.path(),
        "[journal]\nprogress_interval = \"1s\"\n[throughput]\ntokens_per_step = 8192\nflops_per_token = 1e9\npeak_tflops = 100\n",
    );
    let mut c = run_trainer(
        tmp.path(),
        "plain",
        &["--config", cfg.to_str().unwrap()],
        &["--steps", "60", "--interval", "0.05"],
    );
    let (out, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let r = report_json(tmp.path(), "plain");
    let t = &r["attempts"][0]["throughput"];
    let rate = t["steps_per_s"].as_f64().unwrap();
    let tokens = t["tokens_per_s"].as_f64().unwrap();
    assert!((tokens - 8192.0 * rate).abs() < 1e-6, "{t}");
    let mfu = t["mfu"].as_f64().unwrap();
    assert!((mfu - tokens * 1e9 / 1e12 / 100.0).abs() < 1e-9, "{t}");
    assert_eq!(t["from"], serde_json::json!(["settings"]), "{t}");
}

#[test]
fn a_loss_gone_to_nan_stops_the_job_as_numerical_without_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = resilio_run(tmp.path(), "nan");
    c.args(["--ntasks", "2", "--max-restarts", "3", "--"])
        .arg("python3")
        .arg(throughput_trainer())
        .args([
            "--style",
            "nanogpt",
            "--steps",
            "600",
            "--step-time",
            "0.05",
        ])
        .args(["--nan-at", "30"]);
    let (out, took) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(65), "{}", stderr_of(&out));
    assert!(took < Duration::from_secs(20), "{took:?}: the run went on");
    let recs = records(tmp.path(), "nan");
    let n = one(&recs, "numerical");
    assert_eq!(n.get("finding").and_then(|v| v.as_str()), Some("nan"));
    assert_eq!(n.get("metric").and_then(|v| v.as_str()), Some("loss"));
    assert_eq!(n.get("since_step").and_then(|v| v.as_u64()), Some(30));
    assert_eq!(n.get("action").and_then(|v| v.as_str()), Some("stop"));
    assert_eq!(n.rank, Some(0));
    // Rank 0 is the cause; rank 1 was stopped for it; nothing was restarted.
    let exits = kinds(&recs, "rank_exit");
    let class_of = |rank: u32| {
        exits
            .iter()
            .find(|r| r.rank == Some(rank))
            .and_then(|r| r.get("class"))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    assert_eq!(class_of(0).as_deref(), Some("numerical"));
    assert_ne!(class_of(1).as_deref(), Some("numerical"));
    assert!(recs.iter().all(|r| r.attempt == 0), "restarted");
    let judgment = one(&recs, "judgment");
    assert_eq!(
        judgment.get("class").and_then(|v| v.as_str()),
        Some("numerical")
    );
    let decision = one(&recs, "decision");
    assert_eq!(
        decision.get("decision").unwrap()["action"],
        "stop",
        "{decision:?}"
    );
    let text = report_text(tmp.path(), "nan");
    assert!(text.contains("loss: NOT healthy"), "{text}");
    assert!(text.contains("numerical"), "{text}");
}

#[test]
fn a_loss_spike_is_recorded_and_the_run_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = resilio_run(tmp.path(), "spike");
    c.args(["--max-restarts", "0", "--"])
        .arg("python3")
        .arg(throughput_trainer())
        .args(["--style", "titan", "--steps", "160", "--step-time", "0.02"])
        .args(["--spike-at", "120"]);
    let (out, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "spike");
    let n = one(&recs, "numerical");
    assert_eq!(n.get("finding").and_then(|v| v.as_str()), Some("spike"));
    assert_eq!(n.get("action").and_then(|v| v.as_str()), Some("record"));
    let since = n.get("since_step").and_then(|v| v.as_u64()).unwrap();
    assert!((120..130).contains(&since), "{n:?}");
    let text = report_text(tmp.path(), "spike");
    assert!(text.contains("loss: NOT healthy"), "{text}");
    // A run without either says so too.
    let tmp2 = tempfile::tempdir().unwrap();
    let mut c = resilio_run(tmp2.path(), "fine");
    c.args(["--max-restarts", "0", "--"])
        .arg("python3")
        .arg(throughput_trainer())
        .args(["--style", "titan", "--steps", "40", "--step-time", "0.02"]);
    let (out, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let text = report_text(tmp2.path(), "fine");
    assert!(text.contains("loss: healthy"), "{text}");
}

#[test]
fn a_step_time_that_rises_halfway_is_a_slowdown_blamed_on_the_slow_rank() {
    // Lockstep ranks: from step 120 rank 1 computes three times as long and
    // rank 0 waits for it at every step, so both step intervals rise; only
    // the ranks' compute_s tells which one holds the other back. A window
    // holds two reports (one a second) so that each rank's compute time is
    // measured in every window (3 steps at least): with windows of half a
    // second, the window the slowdown was called in could hold no report
    // of the slow rank's 0.3 s steps, and the blame read "waiting" (seen
    // once under CI's load).
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    let cfg = write_config(
        tmp.path(),
        "[straggler]\nwindow = \"2s\"\ncheckpoint = false\n\
         [slowdown]\nthreshold = 0.3\nsustain = \"2s\"\nbaseline_windows = 6\nwarmup_windows = 1\n",
    );
    let mut c = run_local(
        tmp.path(),
        "slow",
        2,
        &["--max-restarts", "0", "--config", cfg.to_str().unwrap()],
        &[
            "--total",
            "160",
            "--step-time",
            "0.1",
            "--ckpt-dir",
            ckpt.to_str().unwrap(),
            "--ckpt-every",
            "1000",
            "--slow-rank",
            "1",
            "--slow-factor",
            "3",
            "--slow-from",
            "120",
        ],
    );
    let (out, _) = output_within(&mut c, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "slow");
    let started: Vec<_> = kinds(&recs, "slowdown")
        .into_iter()
        .filter(|r| r.get("state").and_then(|s| s.as_str()) == Some("started"))
        .collect();
    assert_eq!(started.len(), 1, "{started:?}");
    let s = started[0];
    assert_eq!(
        s.get("attribution").and_then(|v| v.as_str()),
        Some("rank"),
        "{s:?}"
    );
    assert_eq!(
        s.get("ranks").cloned(),
        Some(serde_json::json!([1])),
        "{s:?}"
    );
    let ratio = s.get("ratio").and_then(|v| v.as_f64()).unwrap();
    assert!(ratio > 1.8, "{s:?}");
    // The report counts the time it cost as its own bucket.
    let r = report_json(tmp.path(), "slow");
    let slow = r["lost_s"]["slowdown"].as_f64().unwrap_or(0.0);
    assert!(slow > 1.0, "{}", r["lost_s"]);
    let text = report_text(tmp.path(), "slow");
    assert!(text.contains("\n  slowdown "), "{text}");
}

/// `python3 -c SCRIPT` under `resilio run` (no restart), its checkpoint
/// directory `STATE/ck` watched (polled every `poll`, inotify besides);
/// the script gets that directory as `{ck}`. Its output.
fn run_watching_checkpoints(
    state: &Path,
    job: &str,
    poll: &str,
    script: impl Fn(&str) -> String,
) -> std::process::Output {
    let ck = state.join("ck");
    std::fs::create_dir_all(&ck).unwrap();
    let cfg = write_config(
        state,
        &format!(
            "[checkpoint]\nwatch_dir = \"{}\"\nwatch_poll = \"{poll}\"\n",
            ck.display()
        ),
    );
    let mut c = resilio_run(state, job);
    c.args([
        "--max-restarts",
        "0",
        "--config",
        cfg.to_str().unwrap(),
        "--",
        "python3",
        "-c",
        &script(&format!("{:?}", ck.to_str().unwrap())),
    ]);
    output_within(&mut c, Duration::from_secs(30)).0
}

#[test]
fn checkpoint_health_names_the_last_restorable_checkpoint_its_size_and_a_broken_one() {
    let tmp = tempfile::tempdir().unwrap();
    // checkpoint-10 saved whole (3000 bytes, COMPLETE written last); then
    // checkpoint-20, whose marker came while a shard still had its
    // temporary name (a save that went wrong); then checkpoint-30, whose
    // marker came while a shard was still being appended to for 3 s.
    let script = |ck: &str| {
        format!(
            "import os, time\nck = {ck}\n\
         os.makedirs(ck + '/checkpoint-10/shards')\n\
         open(ck + '/checkpoint-10/shards/a.pt', 'wb').write(b'x' * 2000)\n\
         open(ck + '/checkpoint-10/model.pt', 'wb').write(b'x' * 1000)\n\
         open(ck + '/checkpoint-10/COMPLETE', 'w').close()\n\
         time.sleep(1.0)\n\
         os.makedirs(ck + '/checkpoint-20')\n\
         open(ck + '/checkpoint-20/model.pt.tmp', 'wb').write(b'x' * 10)\n\
         open(ck + '/checkpoint-20/COMPLETE', 'w').close()\n\
         time.sleep(1.0)\n\
         os.makedirs(ck + '/checkpoint-30')\n\
         shard = open(ck + '/checkpoint-30/shard0.pt', 'wb')\n\
         open(ck + '/checkpoint-30/COMPLETE', 'w').close()\n\
         for _ in range(60):\n\
         \x20   shard.write(b'x' * 100); shard.flush(); time.sleep(0.05)\n\
         shard.close()\n\
         time.sleep(1.0)\n"
        )
    };
    let out = run_watching_checkpoints(tmp.path(), "ckh", "200ms", script);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "ckh");
    let done = kinds(&recs, "checkpoint_done");
    assert_eq!(done.len(), 3, "{done:#?}");
    assert_eq!(
        done[0].get("size_bytes").and_then(|v| v.as_u64()),
        Some(3000)
    );
    assert_eq!(done[0].get("files").and_then(|v| v.as_u64()), Some(3));
    assert_eq!(
        done[0].get("complete").and_then(|v| v.as_bool()),
        Some(true)
    );
    assert_eq!(
        done[1].get("complete").and_then(|v| v.as_bool()),
        Some(false)
    );
    assert_eq!(
        done[2].get("complete").and_then(|v| v.as_bool()),
        Some(false)
    );
    assert_eq!(
        done[2].get("changing"),
        Some(&serde_json::json!(["shard0.pt"])),
        "{:?}",
        done[2]
    );
    let r = report_json(tmp.path(), "ckh");
    let last = &r["checkpoints"]["last_restorable"];
    assert_eq!(last["step"], 10, "{r}");
    assert_eq!(last["path"], "checkpoint-10", "{r}");
    assert_eq!(r["checkpoints"]["incomplete"][0]["step"], 20, "{r}");
    assert_eq!(r["checkpoints"]["incomplete"][1]["step"], 30, "{r}");
    let text = report_text(tmp.path(), "ckh");
    assert!(
        text.contains("last restorable checkpoint: step 10 in checkpoint-10"),
        "{text}"
    );
    assert!(
        text.contains(
            "incomplete: step 20 in checkpoint-20: temporary names left in it (model.pt.tmp)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "incomplete: step 30 in checkpoint-30: still written to after its marker (shard0.pt)"
        ),
        "{text}"
    );
}

/// A save reported as new that wrote the previous checkpoint's weights
/// again (a fresh trainer_state.json and marker) is recorded as stale and
/// is not the last restorable one, whatever the trainer says of it on its
/// output (trial 16b); a checkpoint saved a tenth of a second before the
/// trainer is killed is still recorded (trial 16: lost).
#[test]
fn a_stale_save_is_not_restorable_and_a_save_just_before_a_kill_is_seen() {
    let tmp = tempfile::tempdir().unwrap();
    let script = |ck: &str| {
        format!(
            "import os, shutil, time\nck = {ck}\n\
         def save(step, weights):\n\
         \x20   d = ck + '/checkpoint-%d' % step\n\
         \x20   os.makedirs(d)\n\
         \x20   open(d + '/model.safetensors', 'wb').write(weights)\n\
         \x20   open(d + '/trainer_state.json', 'w').write('{{\"global_step\": %d}}' % step)\n\
         \x20   print('step %d' % step, flush=True)\n\
         \x20   print('Saving model checkpoint to %s' % d, flush=True)\n\
         \x20   print('step %d' % (step + 1), flush=True)\n\
         save(10, os.urandom(400000))\n\
         time.sleep(1.0)\n\
         w20 = os.urandom(400000)\n\
         save(20, w20)\n\
         time.sleep(1.0)\n\
         save(30, w20)\n\
         time.sleep(0.1)\n\
         os.kill(os.getpid(), 9)\n"
        )
    };
    let out = run_watching_checkpoints(tmp.path(), "stale", "1h", script);
    assert_eq!(out.status.code(), Some(137), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "stale");
    // The directory's records (the trainer also says each save on its
    // output, as HF does: that word must not make the stale one whole).
    let done: Vec<(Option<u64>, Option<String>)> = kinds(&recs, "checkpoint_done")
        .iter()
        .filter(|r| r.str("source") == Some("checkpoint_dir"))
        .map(|r| {
            (
                r.get("step").and_then(|v| v.as_u64()),
                r.str("same_as").map(str::to_string),
            )
        })
        .collect();
    assert_eq!(
        done,
        [
            (Some(10), None),
            (Some(20), None),
            (Some(30), Some("checkpoint-20".to_string()))
        ]
    );
    let r = report_json(tmp.path(), "stale");
    assert_eq!(r["checkpoints"]["last_restorable"]["step"], 20, "{r}");
    // Said by the trainer and seen in the directory: the record with its
    // files (its path) is the one shown.
    assert_eq!(
        r["checkpoints"]["last_restorable"]["path"], "checkpoint-20",
        "{r}"
    );
    assert_eq!(r["checkpoints"]["incomplete"][0]["step"], 30, "{r}");
    assert_eq!(
        r["checkpoints"]["incomplete"][0]["same_as"], "checkpoint-20",
        "{r}"
    );
    let text = report_text(tmp.path(), "stale");
    assert!(
        text.contains("checkpoints: 3 confirmed (1 of them not to count on, below)"),
        "{text}"
    );
    assert!(
        text.contains("not new: step 30 in checkpoint-30: stale: its files are byte for byte those of checkpoint-20"),
        "{text}"
    );
}

/// The HTML timeline's charts (tokens/s, loss with its NaN marks, MFU),
/// rendered by headless Chromium: each line must be on the screenshot.
#[test]
fn the_timeline_charts_render_in_headless_chromium() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(
        tmp.path(),
        "[journal]\nprogress_interval = \"300ms\"\n[numerical]\nnan_action = \"record\"\n",
    );
    let mut c = resilio_run(tmp.path(), "charts");
    c.args([
        "--max-restarts",
        "0",
        "--config",
        cfg.to_str().unwrap(),
        "--",
    ])
    .arg("python3")
    .arg(throughput_trainer())
    .args([
        "--style",
        "titan",
        "--steps",
        "150",
        "--step-time",
        "0.03",
        "--nan-at",
        "120",
    ]);
    let (out, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let page = tmp.path().join("charts.html");
    let o = Command::new(bin())
        .args([
            "timeline",
            "charts",
            "--html",
            page.to_str().unwrap(),
            "--state-dir",
        ])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.contains("<script"), "self-contained, no script");
    for (title, colour) in [
        ("tokens/s", resilio::analysis::charts::RATE),
        ("loss", resilio::analysis::charts::LOSS),
        ("MFU", resilio::analysis::charts::MFU),
    ] {
        assert!(
            html.contains(&format!(">{title}</text>")),
            "no {title} chart"
        );
        assert!(
            html.contains(&format!("stroke=\"{colour}\"")),
            "no {title} line"
        );
    }
    assert!(
        html.contains("<title>NaN or Inf</title>"),
        "the NaN losses are marked"
    );
    let shot = tmp.path().join("charts.png");
    crate::reports::screenshot(&page, &shot, "1250,900");
    let rgb = |hex: &str| {
        let v = u32::from_str_radix(&hex[1..], 16).unwrap();
        [(v >> 16) as u8, (v >> 8) as u8, v as u8]
    };
    for (what, colour) in [
        ("tokens/s", resilio::analysis::charts::RATE),
        ("loss", resilio::analysis::charts::LOSS),
        ("MFU", resilio::analysis::charts::MFU),
    ] {
        let n = crate::reports::count_colour(&shot, rgb(colour));
        assert!(n > 150, "{what} line: {n} pixels of {colour}");
    }
}

#[test]
fn a_loss_spike_is_rolled_back_to_the_checkpoint_before_it_and_its_data_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let record = tmp.path().join("record.json");
    let cfg = write_config(
        tmp.path(),
        &format!(
            "[numerical]\nspike_action = \"rollback\"\n\
             [checkpoint]\nwatch_dir = \"{}\"\nwatch_poll = \"200ms\"\n",
            ck.display()
        ),
    );
    let mut c = resilio_run(tmp.path(), "rollback");
    c.args([
        "--max-restarts",
        "2",
        "--config",
        cfg.to_str().unwrap(),
        "--",
    ])
    .arg("python3")
    .arg(throughput_trainer())
    .args(["--style", "titan", "--steps", "200", "--step-time", "0.02"])
    .args(["--spike-at", "130", "--ckpt-every", "50", "--ckpt-dir"])
    .arg(&ck)
    .arg("--record")
    .arg(&record);
    let (out, _) = output_within(&mut c, Duration::from_secs(90));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "rollback");
    let n = one(&recs, "numerical");
    assert_eq!(n.get("finding").and_then(|v| v.as_str()), Some("spike"));
    assert_eq!(n.get("action").and_then(|v| v.as_str()), Some("rollback"));
    let since = n.get("since_step").and_then(|v| v.as_u64()).unwrap();
    assert!((130..140).contains(&since), "{n:?}");
    // Restarted in place, from checkpoint 100: the last one before the spike
    // (checkpoint 150 may have been saved while it was being confirmed).
    let rb = one(&recs, "rollback");
    assert_eq!(rb.get("for_attempt").and_then(|v| v.as_u64()), Some(1));
    assert_eq!(
        rb.get("checkpoint_step").and_then(|v| v.as_u64()),
        Some(100),
        "{rb:?}"
    );
    let skip = rb
        .get("skip_steps")
        .and_then(|v| v.as_str())
        .unwrap()
        .to_string();
    assert!(skip.starts_with(&format!("{since}-")), "{skip}");
    let decision = kinds(&recs, "decision");
    assert_eq!(
        decision[0].get("decision").unwrap()["action"],
        "restart_in_place"
    );
    // The trainer of attempt 1 was told both, and trained on to the end.
    let mine: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(mine["resumed_from"], 100, "{mine}");
    assert_eq!(mine["skipped"], skip.as_str(), "{mine}");
    assert!(recs.iter().any(|r| r.attempt == 1
        && r.kind == "rank_exit"
        && r.get("exit_code").and_then(|v| v.as_i64()) == Some(0)));
}

/// A checkpoint that loads into NaN losses is blamed, not the run: after a
/// crash at step 45, attempt 1 restores the newest checkpoint (step 40,
/// saved corrupt) and its loss is NaN from its first step. That is not
/// stopped as a numerical failure: the checkpoint is suspect, the next
/// attempt is told to load the one before it (30), and trains to the end.
/// A trainer that loads the blamed checkpoint anyway, although told, is
/// stopped before it loads it a third time.
#[test]
fn a_checkpoint_that_fails_soon_after_its_restore_is_not_loaded_again() {
    let run = |tmp: &std::path::Path, id: &str, extra: &[&str]| {
        let ck = tmp.join(format!("ck-{id}"));
        let cfg = write_config(
            tmp,
            &format!(
                "[checkpoint]\nwatch_dir = \"{}\"\nwatch_poll = \"200ms\"\n",
                ck.display()
            ),
        );
        let record = tmp.join(format!("{id}.json"));
        let mut c = resilio_run(tmp, id);
        c.args([
            "--max-restarts",
            "4",
            "--config",
            cfg.to_str().unwrap(),
            "--",
        ])
        .arg("python3")
        .arg(throughput_trainer())
        .args(["--style", "titan", "--steps", "80", "--step-time", "0.05"])
        .args([
            "--ckpt-every",
            "10",
            "--corrupt-at",
            "40",
            "--crash-at",
            "45",
        ])
        .arg("--fault-once")
        .arg(tmp.join(format!("{id}.once")))
        .arg("--record")
        .arg(&record)
        .args(extra)
        .arg("--ckpt-dir")
        .arg(&ck);
        let (out, _) = output_within(&mut c, Duration::from_secs(120));
        (out, records(tmp, id), record)
    };
    let tmp = tempfile::tempdir().unwrap();
    let (out, recs, record) = run(tmp.path(), "restore", &[]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let decisions = kinds(&recs, "decision");
    assert_eq!(decisions.len(), 2, "{decisions:#?}");
    let d = &decisions[1];
    assert_eq!(d.fields()["outcome"]["class"], "numerical", "{d:?}");
    assert_eq!(d.fields()["outcome"]["restored"], 40, "{d:?}");
    assert_eq!(d.fields()["suspect_checkpoint"], 40, "{d:?}");
    assert_eq!(
        d.fields()["decision"]["action"],
        "restart_in_place",
        "{d:?}"
    );
    let reason = d.fields()["decision"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("restoring the checkpoint of step 40")
            && reason.contains(
                "the next attempt is told to load an earlier one (RESILIO_ROLLBACK_STEP)"
            ),
        "{reason}"
    );
    let rb = one(&recs, "rollback");
    assert_eq!(rb.fields()["for_attempt"], 2, "{rb:?}");
    assert_eq!(rb.fields()["checkpoint_step"], 30, "{rb:?}");
    // Nor the checkpoints attempt 1 saved from it, NaN weights and all.
    assert_eq!(
        rb.fields()["avoid"],
        serde_json::json!([40, 50, 60]),
        "{rb:?}"
    );
    let mine: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(mine["resumed_from"], 30, "{mine}");
    let o = std::process::Command::new(bin())
        .args(["report", "restore", "--state-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("suspect: step 40: attempt 1 failed soon after restoring it"),
        "{text}"
    );
    // Attempt 2 saved checkpoint-40 again, whole: seen, and said.
    assert!(
        text.contains("saved again by attempt 2, whole: that save is another checkpoint"),
        "{text}"
    );
    // The checkpoint of step 40 saved again by attempt 2 is whole and new.
    assert!(
        text.contains("last restorable checkpoint: step 80"),
        "{text}"
    );

    // Told to load step 30, this trainer loads 40 again: stopped then.
    let (out, recs, _) = run(tmp.path(), "stubborn", &["--ignore-rollback"]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(
        err.contains("restoring the checkpoint of step 60: that checkpoint is suspect")
            && err.contains(
                "told to load a checkpoint before step 40 (RESILIO_ROLLBACK_STEP) and did not"
            ),
        "{err}"
    );
    assert_eq!(kinds(&recs, "rank_start").len(), 3);
}

/// One NaN step the trainer skipped, shown by its log line and then by its
/// progress bar redrawn three times with the stale `loss=nan` (tqdm's
/// postfix, set every few steps): one observation, not three in a row, so
/// the run goes on; and the report says a NaN was printed (trial 4: the
/// run was stopped, exit 65, and the report said "0 record(s)").
#[test]
fn a_nan_step_redrawn_on_a_bar_is_not_a_nan_run_and_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let script = r#"
import sys, time
def frame(n, loss):
    sys.stderr.write("\rtrain: %d/40 [00:01<00:01, 20.0it/s, loss=%s]" % (n, loss))
    sys.stderr.flush()
loss = "2.0"
for n in range(1, 41):
    time.sleep(0.02)
    if n % 4 == 0:
        loss = "nan" if n == 20 else "%.3f" % (2.0 - n / 40)
        print("step %d/40 | loss %s" % (n, loss), flush=True)
    for _ in range(3 if n == 20 else 1):
        frame(n, loss)
"#;
    let mut c = resilio_run(tmp.path(), "skip");
    c.args(["--", "python3", "-c", script]);
    let (out, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(tmp.path(), "skip");
    assert!(kinds(&recs, "numerical").is_empty(), "{recs:#?}");
    let o = std::process::Command::new(bin())
        .args(["report", "skip", "--state-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("NaN or Inf loss printed, not for long enough to be a finding"),
        "{text}"
    );
}

/// A rollback an earlier run of the same job id left (`rollback.json`,
/// for its attempt 1) is not a new run's: the new run's attempt 1, after
/// an ordinary failure, is told of no rollback (trial 14: it was, and a
/// trainer following the docs would have loaded an old checkpoint and
/// skipped data).
#[test]
fn an_earlier_runs_rollback_is_not_handed_to_a_new_run_of_the_same_job_id() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("t.py");
    std::fs::write(
        &script,
        r#"
import os, sys
attempt = int(os.environ["RESILIO_ATTEMPT"])
print("step 1 loss 0.5", flush=True)
print(f"attempt {attempt} rollback={os.environ.get('RESILIO_ROLLBACK_STEP')} skip={os.environ.get('RESILIO_SKIP_STEPS')}", flush=True)
if attempt == 0:
    print("RuntimeError: CUDA error: uncorrectable ECC error encountered", file=sys.stderr, flush=True)
    sys.exit(1)
"#,
    )
    .unwrap();
    let dir = resilio::journal::job_dir(tmp.path(), "reused");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rollback.json"),
        r#"{"for_attempt":1,"checkpoint_step":20,"skip_from":40,"skip_to":42,"detail":"rollback: an earlier run's"}"#,
    )
    .unwrap();
    let mut c = resilio_run(tmp.path(), "reused");
    c.args(["--max-restarts", "1", "--", "python3"])
        .arg(&script);
    let (o, _) = output_within(&mut c, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("attempt 1 rollback=None skip=None"), "{out}");
    assert!(!dir.join("rollback.json").exists());
}
