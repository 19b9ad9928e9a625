//! A node relay: the node's first local rank's agent gathers its node's
//! ranks' reports on loopback and sends the coordinator one batch for all
//! of them about once a period (at once when a rank's state changed), and
//! fans the coordinator's commands back out, so that the coordinator of a
//! job of 8 ranks a node hears from nodes, not ranks.
//!
//! It speaks the coordinator's own protocol to the node's agents
//! (`POST /v1/report`, `GET /v1/commands`, the job's token), and announces
//! itself in `JOB_DIR/relay-NODE.json` (address and attempt). Upstream it
//! sends `POST /v1/reports` and holds one long poll for all its ranks.
//!
//! Fail open: an agent whose relay does not answer (gone with its rank,
//! or cut off from the coordinator) reports straight to the coordinator,
//! says so in its journal (`relay_bypassed`), and tries the relay again
//! later. A relay never repeats a report: a rank whose agent went silent
//! is silent to the coordinator too.

pub mod announce;
pub mod book;

pub use announce::{announced, file_name, Announcement};

use super::client::Link;
use super::protocol::{Reply, Report};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use book::Book;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `[coordinator] node_relay`: does the coordinator hear from nodes or
/// from ranks?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeRelay {
    /// A multi-node Slurm step of at least [`RELAY_AUTO_RANKS`] ranks with
    /// several ranks on a node.
    Auto,
    /// Every node with a local rank 0 (also one node, or a small job).
    On,
    /// Every rank reports on its own.
    Off,
}

/// The smallest job `node_relay = "auto"` relays for: below it, a rank's
/// own report costs the coordinator little.
pub const RELAY_AUTO_RANKS: u32 = 256;

/// `[coordinator] node_relay`: this rank's place on its node (its local
/// rank) when its reports go through the node's relay; `None` when they do
/// not. `auto`: a multi-node Slurm step of at least
/// [`RELAY_AUTO_RANKS`] ranks with several on this node;
/// `on`: any rank of a job of several with a local rank (Slurm's, else
/// `local_rank`, the launcher's `LOCAL_RANK`); `off`: never.
pub fn position(
    mode: NodeRelay,
    slurm: &crate::slurm::env::SlurmContext,
    world_size: u32,
    local_rank: Option<u32>,
) -> Option<u32> {
    let local = slurm.localid.filter(|_| slurm.in_step()).or(local_rank);
    match mode {
        NodeRelay::Off => None,
        NodeRelay::On => local.filter(|_| world_size > 1),
        NodeRelay::Auto => {
            let here = slurm
                .nodeid
                .and_then(|n| slurm.tasks_per_node.get(n as usize))
                .copied()
                .unwrap_or(1);
            let big = world_size >= RELAY_AUTO_RANKS;
            (slurm.in_step() && slurm.step_nodes.len() > 1 && here > 1 && big)
                .then_some(local)
                .flatten()
        }
    }
}

/// A running relay; dropping it takes the announcement away.
pub struct Relay {
    pub url: String,
    file: PathBuf,
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Only if it still names this relay (a new attempt's may replace it).
        let ours = std::fs::read(&self.file)
            .ok()
            .and_then(|b| serde_json::from_slice::<Announcement>(&b).ok())
            .is_some_and(|a| a.url == self.url);
        if ours {
            let _ = std::fs::remove_file(&self.file);
        }
    }
}

struct RelayState {
    book: Mutex<Book>,
    upstream: Link,
    node: String,
    period: Duration,
    urgent: tokio::sync::Notify,
    /// The newest command held, for the local long polls.
    seq: tokio::sync::watch::Sender<u64>,
}

impl RelayState {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn commands_added(&self) {
        let last = self.book().last_seq();
        self.seq.send_if_modified(|s| {
            let new = *s != last;
            *s = last;
            new
        });
    }
}

/// Start the node's relay on the current tokio runtime: listen on
/// loopback, announce it in `job_dir`, forward to `upstream`.
pub fn start(
    upstream: Link,
    job_dir: &Path,
    node: &str,
    attempt: u32,
    period: Duration,
) -> std::io::Result<Relay> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    listener.set_nonblocking(true)?;
    let url = format!("http://{}", listener.local_addr()?);
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let shared = Arc::new(RelayState {
        book: Mutex::new(Book::default()),
        upstream,
        node: node.to_string(),
        period,
        urgent: tokio::sync::Notify::new(),
        seq: tokio::sync::watch::channel(0).0,
    });
    let app = Router::new()
        .route("/v1/report", post(report))
        .route("/v1/commands", get(commands))
        .layer(DefaultBodyLimit::max(64 * 1024))
        .with_state(shared.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    tokio::spawn(forward(shared.clone()));
    tokio::spawn(poll_upstream(shared));
    let body = serde_json::to_vec(&Announcement {
        url: url.clone(),
        attempt,
        node: node.to_string(),
        pid: std::process::id(),
    })
    .map_err(std::io::Error::other)?;
    let file = super::write_whole(job_dir, &file_name(node), &body, 0o600)?;
    Ok(Relay { url, file })
}

/// The node's agents carry the job's token; nobody else on the node may
/// feed the relay.
fn authorized(s: &RelayState, headers: &HeaderMap) -> bool {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    s.upstream
        .token()
        .is_some_and(|t| super::server::same_token(given, &t))
}

async fn report(
    State(s): State<Arc<RelayState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !authorized(&s, &headers) {
        return (StatusCode::UNAUTHORIZED, "missing or wrong token\n").into_response();
    }
    let r: Report = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let now = Instant::now();
    let answer = {
        let mut b = s.book();
        if let Some(why) = &b.upstream_down {
            Err(format!("node relay: the coordinator did not answer: {why}"))
        } else {
            let (rank, attempt, seen) = (r.rank, r.attempt, r.commands_seen);
            let urgent = b.take(r, now);
            Ok((urgent, b.answer(rank, attempt, seen, now)))
        }
    };
    match answer {
        Ok((urgent, reply)) => {
            if urgent {
                s.urgent.notify_one();
            }
            Json(reply).into_response()
        }
        Err(why) => (StatusCode::BAD_GATEWAY, format!("{why}\n")).into_response(),
    }
}

async fn commands(
    State(s): State<Arc<RelayState>>,
    headers: HeaderMap,
    Query(q): Query<super::server::PollQuery>,
) -> Response {
    if !authorized(&s, &headers) {
        return (StatusCode::UNAUTHORIZED, "missing or wrong token\n").into_response();
    }
    let wait = match super::state::poll_wait(q.wait_s) {
        Ok(w) => w,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut rx = s.seq.subscribe();
    loop {
        let cmds = s.book().commands_for(q.rank, q.attempt, q.after);
        if !cmds.is_empty() {
            return Json(Reply {
                commands: cmds,
                job_progress_age_s: None,
            })
            .into_response();
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => continue,
            _ => return Json(Reply::default()).into_response(),
        }
    }
}

/// Once a period, or at once on an urgent report: the reports not passed
/// on yet, as batches.
async fn forward(s: Arc<RelayState>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(s.period) => {}
            _ = s.urgent.notified() => {}
        }
        let batches = s.book().batches(&s.node, Instant::now());
        for batch in batches {
            match s.upstream.send_batch(&batch, Duration::from_secs(2)).await {
                Ok(reply) => {
                    if let Some(why) = &reply.refused {
                        tracing::debug!("node relay: a report refused: {why}");
                    }
                    s.book().on_reply(&batch, reply, Instant::now());
                    s.commands_added();
                }
                Err(e) => s.book().unsent(&batch, e),
            }
        }
    }
}

/// One long poll for all the node's ranks; what it brings is held for
/// theirs.
async fn poll_upstream(s: Arc<RelayState>) {
    let mut failed = 0u32;
    loop {
        let (ranks, attempt, after) = {
            let b = s.book();
            (b.ranks(), b.attempt(), b.last_seq())
        };
        if ranks.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        match s.upstream.poll_ranks(&ranks, attempt, after).await {
            Ok(cmds) => {
                failed = 0;
                {
                    let mut b = s.book();
                    b.upstream_down = None;
                    b.add_commands(cmds);
                }
                s.commands_added();
            }
            Err(_) => {
                failed += 1;
                tokio::time::sleep(Duration::from_secs(1 << failed.min(4))).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::position;
    use super::NodeRelay;
    use crate::slurm::env::SlurmContext;

    fn step(nodes: usize, per_node: u32, localid: u32) -> SlurmContext {
        SlurmContext {
            job_id: Some("7".into()),
            step_id: Some("0".into()),
            procid: Some(localid),
            localid: Some(localid),
            nodeid: Some(0),
            step_nodes: (0..nodes).map(|n| format!("n{n}")).collect(),
            tasks_per_node: vec![per_node; nodes],
            ..Default::default()
        }
    }

    #[test]
    fn auto_relays_only_large_multi_node_steps_with_several_ranks_a_node() {
        let big = step(64, 8, 3);
        assert_eq!(position(NodeRelay::Auto, &big, 512, None), Some(3));
        // Small jobs, one node, or one rank a node: each rank reports.
        assert_eq!(position(NodeRelay::Auto, &big, 128, None), None);
        assert_eq!(position(NodeRelay::Auto, &step(1, 8, 0), 512, None), None);
        assert_eq!(position(NodeRelay::Auto, &step(512, 1, 0), 512, None), None);
        assert_eq!(
            position(NodeRelay::Auto, &SlurmContext::default(), 512, Some(0)),
            None
        );
        assert_eq!(position(NodeRelay::Off, &big, 512, None), None);
        // `on`: any job of several ranks with a local rank, the launcher's too.
        assert_eq!(
            position(NodeRelay::On, &SlurmContext::default(), 4, Some(2)),
            Some(2)
        );
        assert_eq!(
            position(NodeRelay::On, &SlurmContext::default(), 1, Some(0)),
            None
        );
        assert_eq!(
            position(NodeRelay::On, &SlurmContext::default(), 4, None),
            None
        );
    }
}
