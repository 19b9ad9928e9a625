//! The coordinator's request decoding and what follows it: a sequence of
//! requests, one a line, decoded as the server decodes them (axum's `Json`
//! and `Query`), range-checked, and applied to a `JobView` (world size 4,
//! attempt 1) under an injected clock. Never panics; the view stays within
//! its bounds.
//!
//! Lines: `R{json}` a report body, `P{query}` a long poll's query,
//! `C{json}` a checkpoint request body (`C` alone: no body), `T{n}` the
//! clock moves n ms on and the view ticks, `A` the host starts the next
//! attempt, `U` the world size becomes unknown.
#![no_main]

use axum::extract::Query;
use axum::http::Uri;
use axum::Json;
use libfuzzer_sys::fuzz_target;
use resilio::coordinator::protocol::{CheckpointAsk, Report};
use resilio::coordinator::server::PollQuery;
use resilio::coordinator::state::{check_reason, CoordinatorConfig, JobView, MAX_RANKS, MAX_STEP};
use std::time::{Duration, Instant};

/// The furthest ahead of a step a coordinated checkpoint is placed.
const MAX_LEAD: u64 = 1 << 32;

fuzz_target!(|data: &[u8]| {
    let start = Instant::now();
    let mut now = start;
    let cfg = CoordinatorConfig {
        checkpoint_every: Some(Duration::from_secs(30)),
        ..CoordinatorConfig::default()
    };
    let mut v = JobView::new("fuzz", 4, 1, cfg, now);
    for line in data.split(|&b| b == b'\n').take(64) {
        let Some((&op, body)) = line.split_first() else {
            continue;
        };
        match op {
            b'R' => {
                let Ok(Json(r)) = Json::<Report>::from_bytes(body) else {
                    continue;
                };
                if v.check_report(&r).is_err() {
                    continue;
                }
                assert!(r.rank < v.rank_limit() && v.rank_limit() <= MAX_RANKS);
                let (rank, attempt, seen) = (r.rank, r.attempt, r.commands_seen);
                let _ = v.on_report(r, now);
                let _ = v.commands_for(rank, attempt, seen);
                if let Some(age) = v.job_progress_age(now) {
                    assert!(age.is_finite() && age >= 0.0, "{age}");
                }
            }
            b'P' => {
                let Ok(q) = std::str::from_utf8(body) else {
                    continue;
                };
                let Ok(uri) = format!("/v1/commands?{q}").parse::<Uri>() else {
                    continue;
                };
                let Ok(Query(q)) = Query::<PollQuery>::try_from_uri(&uri) else {
                    continue;
                };
                if let Ok(wait) = v.check_poll(q.rank, q.attempt, q.wait_s) {
                    assert!(wait <= Duration::from_secs(60));
                    let _ = v.commands_for(q.rank, q.attempt, q.after);
                }
            }
            b'C' => {
                let reason = if body.is_empty() {
                    None
                } else {
                    let Ok(Json(ask)) = Json::<CheckpointAsk>::from_bytes(body) else {
                        continue;
                    };
                    ask.reason
                };
                let reason = reason.unwrap_or_else(|| "operator".into());
                if check_reason(&reason).is_err() {
                    continue;
                }
                if let Ok((_, step, _)) = v.request_checkpoint(&reason, now) {
                    assert!(step <= MAX_STEP + MAX_LEAD, "{step}");
                }
            }
            b'T' => {
                let ms: u64 = std::str::from_utf8(body)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(1000);
                now += Duration::from_millis(ms.min(3_600_000));
                let _ = v.tick(now);
            }
            b'A' => {
                let next = v.attempt().saturating_add(1);
                let _ = v.new_attempt(next, now);
            }
            b'U' => v.world_size_unknown(),
            _ => {}
        }
    }
    let st = v.status(now, 0);
    assert!(st.ranks.len() <= v.rank_limit() as usize);
    assert!(st.step.is_none_or(|s| s <= MAX_STEP));
    let e = v.live_ettr(now);
    assert!((0.0..=1.0).contains(&e), "{e}");
});
