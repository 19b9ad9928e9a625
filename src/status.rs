//! `resilio status JOB` and `resilio checkpoint JOB`: ask a running job's
//! coordinator (found from `coordinator.json` and the 0600 token file in the
//! job's state directory).

use crate::coordinator::protocol::{CheckpointAnswer, Status};
use crate::error::{Error, Result};
use crate::journal;
use std::path::Path;
use std::time::Duration;

fn endpoint(state_dir: &Path, job: &str) -> Result<(String, String)> {
    let dir = journal::job_dir(state_dir, job);
    // No journal at all is no such job (exit 3), not a job without a
    // coordinator (exit 5).
    if !dir.is_dir() {
        return Err(Error::NoJob {
            job: job.to_string(),
            dir: state_dir.join("jobs"),
        });
    }
    crate::coordinator::discover_files(&dir).ok_or_else(|| {
        Error::Coordinator(format!(
            "no live coordinator for job {job}: {} is absent or unreadable (the job is not running, or runs without one)",
            dir.join(crate::coordinator::INFO_FILE).display()
        ))
    })
}

/// One request, on a runtime of its own.
fn request(
    method: reqwest::Method,
    url: String,
    token: &str,
    body: Option<String>,
) -> Result<String> {
    crate::util::runtime()?.block_on(async {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::Other(e.to_string()))?;
        let mut req = client.request(method, &url).bearer_auth(token);
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Error::Coordinator(format!("coordinator at {url} unreachable: {e}")))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| Error::Coordinator(format!("{url}: {e}")))?;
        if !status.is_success() {
            return Err(Error::Coordinator(format!(
                "coordinator refused ({status}): {}",
                text.trim()
            )));
        }
        Ok(text)
    })
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".into(), |x| x.to_string())
}

/// A list of ranks as `[0, 1, 2]`; one that was cut says how many it had.
fn ranks_of(listed: &[u32], count: usize) -> String {
    if count > listed.len() {
        format!("{listed:?} and {} more", count - listed.len())
    } else {
        format!("{listed:?}")
    }
}

pub fn render_status(s: &Status) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "job {}  attempt {}  ranks {}/{}  step {}  {} steps/s  up {:.0}s  restarts {}  stalls {}\n",
        s.job,
        s.attempt,
        s.ranks_heard.max(s.ranks.len() as u32),
        s.world_size,
        opt(s.step),
        s.steps_per_s.map_or("-".into(), |r| format!("{r:.2}")),
        s.uptime_s,
        s.restarts,
        s.stalls
    ));
    if s.tokens_per_s.is_some() || s.mfu.is_some() || s.loss.is_some() {
        out.push_str(&format!(
            "throughput {} tokens/s  MFU {}  loss {}\n",
            s.tokens_per_s.map_or("-".into(), |t| format!("{t:.0}")),
            s.mfu.map_or("-".into(), |m| format!("{:.1}%", 100.0 * m)),
            s.loss.map_or("-".into(), |l| format!("{l:.4}")),
        ));
    }
    out.push_str(&format!(
        "{:>5}  {:<14} {:<9} {:>8} {:>8} {:>9} {:>10} {:<10} {:>9}  {}\n",
        "RANK",
        "NODE",
        "STATE",
        "STEP",
        "STEPS/S",
        "STEP_S",
        "COMPUTE_S",
        "PHASE",
        "LAST_STEP",
        "STRAGGLER"
    ));
    for r in &s.ranks {
        out.push_str(&format!(
            "{:>5}  {:<14} {:<9} {:>8} {:>8} {:>9} {:>10} {:<10} {:>9}  {}\n",
            r.rank,
            r.node,
            if r.lost {
                // Its agent went silent: what it last said is stale.
                "lost".to_string()
            } else if r.silent {
                // Reports no steps of its own: alive on the job's progress.
                "silent".to_string()
            } else {
                format!("{:?}", r.state).to_lowercase()
            },
            opt(r.step),
            r.steps_per_s.map_or("-".into(), |x| format!("{x:.2}")),
            r.mean_step_s.map_or("-".into(), |x| format!("{x:.3}")),
            r.mean_compute_s.map_or("-".into(), |x| format!("{x:.3}")),
            r.phase,
            r.progress_age_s
                .map_or("-".into(), |x| format!("{x:.1}s ago")),
            if r.straggler { "yes" } else { "" }
        ));
    }
    if s.ranks_omitted > 0 {
        let states: Vec<String> = s
            .ranks_by_state
            .iter()
            .map(|(state, n)| format!("{state} {n}"))
            .collect();
        out.push_str(&format!(
            "({} more ranks not listed: a job of more than {} ranks lists only the ranks worth a look; all ranks by state: {})\n",
            s.ranks_omitted,
            crate::coordinator::protocol::STATUS_RANKS,
            states.join(", ")
        ));
    }
    out.push_str(&job_lines(s));
    out
}

/// The job-wide lines under the ranks: stragglers, coordinated
/// checkpoints, refused requests.
fn job_lines(s: &Status) -> String {
    let mut out = String::new();
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(",")
        }
    };
    out.push_str(&format!(
        "stragglers: ranks {}; nodes {}\n",
        list(&s.straggler_ranks),
        list(&s.straggler_nodes)
    ));
    match &s.last_checkpoint {
        Some(c) => out.push_str(&format!(
            "last coordinated checkpoint: #{} at step {} ({}), confirmed by ranks {}{}\n",
            c.id,
            c.step,
            c.reason,
            ranks_of(&c.confirmed, c.confirmed_count),
            if c.missing.is_empty() {
                String::new()
            } else {
                format!(", missing {}", ranks_of(&c.missing, c.missing_count))
            }
        )),
        None => out.push_str("last coordinated checkpoint: none\n"),
    }
    if let Some(c) = &s.pending_checkpoint {
        out.push_str(&format!(
            "pending checkpoint: #{} at step {} ({}), asked {:.1}s ago, waiting for ranks {}\n",
            c.id,
            c.step,
            c.reason,
            c.age_s,
            ranks_of(&c.missing, c.missing_count)
        ));
    }
    if s.unauthorized > 0 {
        out.push_str(&format!(
            "requests refused for a missing or wrong token: {}\n",
            s.unauthorized
        ));
    }
    out
}

pub fn status_cmd(state_dir: &Path, job: Option<&str>, json: bool) -> Result<i32> {
    let (state_dir, job) = crate::state_dir::locate(state_dir, job)?;
    let (url, token) = endpoint(&state_dir, &job)?;
    let text = request(
        reqwest::Method::GET,
        format!("{url}/v1/status"),
        &token,
        None,
    )?;
    let s: Status = serde_json::from_str(&text)
        .map_err(|e| Error::Coordinator(format!("unreadable status from {url}: {e}")))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s).unwrap_or(text));
    } else {
        print!("{}", crate::util::terminal_safe(&render_status(&s)));
    }
    Ok(0)
}

/// What the ranks said of a checkpoint request, once settled or waited for.
fn acknowledged(
    url: &str,
    token: &str,
    id: u64,
    wait: std::time::Duration,
) -> Option<crate::coordinator::protocol::CheckpointStatus> {
    let deadline = std::time::Instant::now() + wait;
    let mut last = None;
    loop {
        let s: Option<Status> = request(
            reqwest::Method::GET,
            format!("{url}/v1/status"),
            token,
            None,
        )
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
        if let Some(s) = s {
            if let Some(c) = s.last_checkpoint.filter(|c| c.id == id) {
                return Some(c);
            }
            if let Some(c) = s.pending_checkpoint.filter(|c| c.id == id) {
                if c.missing.is_empty() {
                    return Some(c);
                }
                last = Some(c);
            }
        }
        if std::time::Instant::now() >= deadline {
            return last;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// What to tell about a checkpoint's acknowledgements, in words.
fn acknowledgement_words(
    c: &crate::coordinator::protocol::CheckpointStatus,
    waited: std::time::Duration,
) -> String {
    if c.missing.is_empty() {
        return format!("every rank confirmed it ({:?})", c.confirmed);
    }
    if c.confirmed.is_empty() {
        return format!(
            "no rank confirmed it within {}: the trainer does not seem to read checkpoint requests. \
             resilio asks through $RESILIO_CONTROL (and with the checkpoint signal only where [coordinator] signal_trainer = true); \
             a trainer reads it with resilio_client.checkpoint_requested() (clients/python) or by reading $RESILIO_CONTROL, \
             and confirms with `checkpoint_done step=N` on $RESILIO_SOCKET (resilio_client.checkpoint_done(step))",
            crate::duration::format(waited)
        );
    }
    format!(
        "confirmed by ranks {:?}; not within {} by ranks {:?}",
        c.confirmed,
        crate::duration::format(waited),
        c.missing
    )
}

pub fn checkpoint_cmd(
    state_dir: &Path,
    job: Option<&str>,
    reason: &str,
    wait: std::time::Duration,
    json: bool,
) -> Result<i32> {
    let (state_dir, job) = crate::state_dir::locate(state_dir, job)?;
    let (url, token) = endpoint(&state_dir, &job)?;
    let body = serde_json::json!({ "reason": reason }).to_string();
    let text = request(
        reqwest::Method::POST,
        format!("{url}/v1/checkpoint"),
        &token,
        Some(body),
    )?;
    let a: CheckpointAnswer = serde_json::from_str(&text)
        .map_err(|e| Error::Coordinator(format!("unreadable answer from {url}: {e}")))?;
    if !json {
        println!(
            "checkpoint #{} requested for job {job}: every rank is asked to save at step {}",
            a.id, a.step
        );
    }
    let ack = (!wait.is_zero())
        .then(|| acknowledged(&url, &token, a.id, wait))
        .flatten();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "job": job,
                "id": a.id,
                "step": a.step,
                "confirmed": ack.as_ref().map(|c| c.confirmed.clone()),
                "missing": ack.as_ref().map(|c| c.missing.clone()),
            })
        );
    } else if let Some(c) = &ack {
        println!("checkpoint #{}: {}", a.id, acknowledgement_words(c, wait));
    }
    // Waited for, and not every rank confirmed it (or nothing was heard).
    let unconfirmed = !wait.is_zero() && ack.as_ref().is_none_or(|c| !c.missing.is_empty());
    Ok(if unconfirmed {
        crate::error::EXIT_NOT_CONFIRMED
    } else {
        0
    })
}
