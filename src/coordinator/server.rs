//! The coordinator's HTTP server (axum on a current-thread tokio runtime in
//! a thread of its own): authenticates, feeds the [`JobView`], writes the
//! coordinator's journal, and passes host effects on.

use super::protocol::*;
use super::state::{Effect, Invalid, JobView};
use crate::journal::Writer;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// State shared by the handlers.
pub struct Shared {
    pub view: Mutex<JobView>,
    pub journal: Mutex<Writer>,
    pub token: String,
    pub unauthorized: AtomicU64,
    /// The latest command sequence number, for long polls.
    pub seq: tokio::sync::watch::Sender<u64>,
    pub host: Mutex<mpsc::Sender<Effect>>,
    /// The open connections (bounded).
    pub conns: Conns,
    /// The job's recoveries, for `/metrics`.
    pub recoveries: super::recoveries::Cache,
}

impl Shared {
    /// Journal records go to the coordinator's journal, the rest to the host.
    pub fn apply(&self, effects: Vec<Effect>) {
        if effects.is_empty() {
            return;
        }
        let mut j = self.journal.lock().unwrap_or_else(|e| e.into_inner());
        for e in effects {
            match e {
                Effect::Journal { event, durable } => j.write(*event, durable),
                other => {
                    let _ = self
                        .host
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .send(other);
                }
            }
        }
    }

    /// Run `f` on the view, apply its effects, wake long polls if commands were added.
    pub fn with_view<R>(&self, f: impl FnOnce(&mut JobView) -> (R, Vec<Effect>)) -> R {
        let (r, effects, seq, attempt) = {
            let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
            let (r, effects) = f(&mut v);
            (r, effects, v.seq(), v.attempt())
        };
        if !effects.is_empty() {
            self.journal
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_attempt(attempt);
        }
        self.apply(effects);
        self.seq.send_if_modified(|s| {
            if *s != seq {
                *s = seq;
                true
            } else {
                false
            }
        });
        r
    }
}

fn authorized(s: &Shared, headers: &HeaderMap) -> bool {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let ok = same_token(given, &s.token);
    if !ok {
        s.unauthorized.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

/// `given` is the token: every byte compared, so that the time taken does
/// not tell how much matched.
pub(crate) fn same_token(given: &str, token: &str) -> bool {
    let a = given.as_bytes();
    let b = token.as_bytes();
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in b.iter().enumerate() {
        diff |= x ^ a.get(i).copied().unwrap_or(0);
    }
    diff == 0 && !b.is_empty()
}

fn refuse() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
        "missing or wrong token\n",
    )
        .into_response()
}

/// Every route: the token first, before any byte of a body is read; then
/// the body, at most [`MAX_BODY`] (a longer `Content-Length` is refused
/// unread) and within [`BODY_TIMEOUT`]. A request without the token never
/// reaches a handler.
async fn require_token(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    if !authorized(&s, req.headers()) {
        return refuse();
    }
    let too_long = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is longer than {MAX_BODY} bytes\n"),
        )
            .into_response()
    };
    let announced = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY as u64) {
        return too_long();
    }
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await
    {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return too_long(),
        Err(_) => {
            return (
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive in time\n",
            )
                .into_response()
        }
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// 400 with the one-line reason; counted, and the first few logged.
fn bad_request(s: &Shared, e: Invalid) -> Response {
    let n = s.with_view(|v| {
        v.rejected += 1;
        (v.rejected, Vec::new())
    });
    if n <= 5 {
        tracing::warn!("coordinator: request refused: {e}");
    } else {
        tracing::debug!("coordinator: request refused: {e}");
    }
    (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
}

/// A JSON body, decoded straight from its bytes (axum's `Json` tracks the
/// path to each field as it goes, which costs more than the rest of a
/// report's handling).
fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Invalid> {
    serde_json::from_slice(body)
        .map_err(|e| Invalid(format!("the body is not a valid request: {e}")))
}

async fn report(State(s): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    let r: Report = match decode(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&s, e),
    };
    let (rank, attempt, seen) = (r.rank, r.attempt, r.commands_seen);
    let now = Instant::now();
    let answer = s.with_view(|v| {
        if let Err(e) = v.check_report(&r) {
            return (Err(e), Vec::new());
        }
        let e = v.on_checked_report(r, false, now);
        (
            Ok((
                v.commands_for(rank, attempt, seen),
                v.job_progress_age_for(Some(rank), now),
            )),
            e,
        )
    });
    match answer {
        Ok((commands, job_progress_age_s)) => Json(Reply {
            commands,
            job_progress_age_s,
        })
        .into_response(),
        Err(e) => bad_request(&s, e),
    }
}

async fn reports(State(s): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    let b: BatchReport = match decode(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(&s, e),
    };
    let now = Instant::now();
    let answer = s.with_view(|v| match v.check_batch(&b) {
        Err(e) => (Err(e), Vec::new()),
        Ok(()) => {
            let (reply, effects) = v.on_batch(b, now);
            (Ok(reply), effects)
        }
    });
    match answer {
        Ok(reply) => {
            if let Some(why) = &reply.refused {
                tracing::debug!("coordinator: a relay's report refused: {why}");
            }
            Json(reply).into_response()
        }
        Err(e) => bad_request(&s, e),
    }
}

/// The query of `GET /v1/commands` (public for the fuzz target that
/// decodes it as the server does).
#[derive(Debug, serde::Deserialize)]
pub struct PollQuery {
    pub rank: u32,
    pub attempt: u32,
    pub after: u64,
    #[serde(default)]
    pub wait_s: Option<f64>,
    /// A node relay's poll: the commands for any of these ranks (`0,1,2`),
    /// each naming only those of them it is for; `rank` is one of them.
    #[serde(default)]
    pub ranks: Option<String>,
}

async fn commands(State(s): State<Arc<Shared>>, Query(q): Query<PollQuery>) -> Response {
    let wait = match s.with_view(|v| (v.check_poll(q.rank, q.attempt, q.wait_s), Vec::new())) {
        Ok(w) => w,
        Err(e) => return bad_request(&s, e),
    };
    let ranks = match q
        .ranks
        .as_deref()
        .map(|r| s.with_view(|v| (v.check_poll_ranks(r), Vec::new())))
    {
        Some(Err(e)) => return bad_request(&s, e),
        Some(Ok(r)) => Some(r),
        None => None,
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut rx = s.seq.subscribe();
    loop {
        let cmds = s.with_view(|v| {
            let c = match &ranks {
                Some(r) => v.commands_for_ranks(r, q.attempt, q.after),
                None => v.commands_for(q.rank, q.attempt, q.after),
            };
            (c, Vec::new())
        });
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

async fn status(State(s): State<Arc<Shared>>) -> Response {
    let u = s.unauthorized.load(Ordering::Relaxed);
    let st = s.with_view(|v| (v.status(Instant::now(), u), Vec::new()));
    Json(st).into_response()
}

async fn checkpoint(State(s): State<Arc<Shared>>, body: Option<Json<CheckpointAsk>>) -> Response {
    let reason = body
        .and_then(|Json(b)| b.reason)
        .unwrap_or_else(|| "operator".into());
    if let Err(e) = super::state::check_reason(&reason) {
        return bad_request(&s, e);
    }
    let r = s.with_view(|v| match v.request_checkpoint(&reason, Instant::now()) {
        Ok((id, step, e)) => (Ok((id, step)), e),
        Err(m) => (Err(m), Vec::new()),
    });
    match r {
        Ok((id, step)) => Json(CheckpointAnswer { id, step }).into_response(),
        Err(m) => (StatusCode::CONFLICT, format!("{m}\n")).into_response(),
    }
}

/// What `/metrics` shows, read from the view.
fn scrape(s: &Shared) -> super::metrics::Scrape {
    let unauthorized = s.unauthorized.load(Ordering::Relaxed);
    let connections = s.conns.counts();
    s.with_view(|v| {
        let now = Instant::now();
        (
            super::metrics::Scrape {
                status: v.status(now, unauthorized),
                ettr: v.live_ettr(now),
                checkpoints: v.checkpoints,
                reports: v.reports,
                batches: v.batches,
                relayed_ranks: v.relayed_ranks(),
                rejected: v.rejected,
                unauthorized,
                connections,
                recoveries: Vec::new(),
            },
            Vec::new(),
        )
    })
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let mut x = scrape(&s);
    x.recoveries = s
        .recoveries
        .get(x.status.attempt, x.status.restarts, x.status.step)
        .await;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        super::metrics::render_metrics(&x),
    )
        .into_response()
}

/// The read-only listener for a site's Prometheus: `GET /metrics` and
/// nothing else, without the token (see [`super::Coordinator::serve_site_metrics`]).
pub fn metrics_router(s: Arc<Shared>) -> Router {
    Router::new().route("/metrics", get(metrics)).with_state(s)
}

/// Serve [`metrics_router`] until `stop` fires.
pub async fn serve_metrics(
    listener: std::net::TcpListener,
    s: Arc<Shared>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    axum::serve(listener, metrics_router(s))
        .with_graceful_shutdown(async {
            let _ = stop.await;
        })
        .await
}

/// The largest request body (a report, a checkpoint's reason): 256 KiB. A
/// longer `Content-Length` gets 413 before anything is read.
pub const MAX_BODY: usize = 256 * 1024;
/// How long a request's body may take to arrive once its header has.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

pub fn router(s: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/report", post(report))
        .route("/v1/reports", post(reports))
        .route("/v1/commands", get(commands))
        .route("/v1/status", get(status))
        .route("/v1/checkpoint", post(checkpoint))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(
            s.clone(),
            require_token,
        ))
        .with_state(s)
}

/// How long a connection may take to send a request's header, and how long
/// it may stay idle between requests (keep-alive), before it is closed.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections open at once, whatever the job's size: at least this many.
pub const MIN_CONNECTIONS: usize = 256;
/// File descriptors kept free for the host (journals, the ranks' pipes).
const FD_RESERVE: usize = 128;

/// How many connections the coordinator keeps open at once: four per rank
/// (a report, a long poll, and a spare each) plus 64 for `resilio status`
/// and scrapers, at least [`MIN_CONNECTIONS`], and never so many that the
/// host's file descriptors (`nofile`, its soft limit) run out.
pub fn connection_limit(world_size: u32, nofile: Option<u64>) -> usize {
    let want = (world_size as usize)
        .saturating_mul(4)
        .saturating_add(64)
        .max(MIN_CONNECTIONS);
    match nofile {
        Some(n) => want.min((n as usize).saturating_sub(FD_RESERVE).max(32)),
        None => want,
    }
}

fn nofile() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// One open connection, as the accept loop sees it.
struct Conn {
    opened: Instant,
    /// Requests being answered now (a long poll stays here up to its wait).
    in_flight: AtomicU64,
    /// Requests received on it so far.
    served: AtomicU64,
    close: tokio::sync::Notify,
}

/// The open connections. When they are at the limit, a new connection
/// takes the place of an idle one (no request in flight): first one that
/// never sent a request (oldest first), else the one open longest. Idle
/// connections therefore cannot keep an agent or `resilio status` out; a
/// new connection is refused (closed at once) only when every open one is
/// answering a request.
#[derive(Default)]
pub struct Conns {
    open: Mutex<std::collections::HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    shed: AtomicU64,
}

impl Conns {
    fn admit(&self, limit: usize) -> Option<(u64, Arc<Conn>)> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= limit {
            let victim = open
                .iter()
                .filter(|(_, c)| c.in_flight.load(Ordering::Relaxed) == 0)
                .min_by_key(|(_, c)| (c.served.load(Ordering::Relaxed) > 0, c.opened))
                .map(|(id, _)| *id);
            self.shed.fetch_add(1, Ordering::Relaxed);
            let victim = victim?;
            if let Some(c) = open.remove(&victim) {
                c.close.notify_one();
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let c = Arc::new(Conn {
            opened: Instant::now(),
            in_flight: AtomicU64::new(0),
            served: AtomicU64::new(0),
            close: tokio::sync::Notify::new(),
        });
        open.insert(id, c.clone());
        Some((id, c))
    }

    /// Open now; closed or refused to make room so far.
    pub fn counts(&self) -> (usize, u64) {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner()).len();
        (open, self.shed.load(Ordering::Relaxed))
    }

    fn gone(&self, id: u64) {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

/// Counts a request in flight on its connection while it lives.
struct InFlight(Arc<Conn>);

impl InFlight {
    fn new(c: Arc<Conn>) -> InFlight {
        c.served.fetch_add(1, Ordering::Relaxed);
        c.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(c)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Accept connections for `app`, bounded: at most `limit` open at once (see
/// [`Conns`]), each given [`HEADER_TIMEOUT`] to send a request's header and
/// to stay idle between requests (hyper's HTTP/1 header timer, which starts
/// whenever the connection waits for a request).
async fn accept_loop(listener: tokio::net::TcpListener, s: Arc<Shared>, limit: usize) {
    use hyper::service::Service as _;
    let app = router(s.clone());
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true);
    let builder = Arc::new(builder);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors (or another passing error): wait
                // a little rather than spin; connections wait in the backlog.
                tracing::debug!("coordinator: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some((id, conn)) = s.conns.admit(limit) else {
            drop(stream); // every connection is answering a request
            continue;
        };
        let _ = stream.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let per_request = {
            let conn = conn.clone();
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let guard = InFlight::new(conn.clone());
                let fut = svc.call(req);
                async move {
                    let r = fut.await;
                    drop(guard);
                    r
                }
            })
        };
        let builder = builder.clone();
        let s = s.clone();
        tokio::spawn(async move {
            let served =
                builder.serve_connection(hyper_util::rt::TokioIo::new(stream), per_request);
            tokio::select! {
                _ = served => {}
                _ = conn.close.notified() => {}
            }
            s.conns.gone(id);
        });
    }
}

/// Serve until `stop` fires; ticks the view once a second.
pub async fn serve(
    listener: std::net::TcpListener,
    s: Arc<Shared>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let limit = {
        let ranks = s
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rank_limit();
        connection_limit(ranks, nofile())
    };
    let ticker = {
        let s = s.clone();
        tokio::spawn(async move {
            let mut iv = tokio::time::interval(Duration::from_secs(1));
            iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                iv.tick().await;
                let now = Instant::now();
                s.with_view(|v| ((), v.tick(now)));
            }
        })
    };
    // Long polls stay open up to 20 s: a stop does not wait for them.
    tokio::select! {
        _ = accept_loop(listener, s, limit) => {}
        _ = stop => {}
    };
    ticker.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_limit_grows_with_the_job_and_stays_under_nofile() {
        assert_eq!(connection_limit(1, None), MIN_CONNECTIONS);
        assert_eq!(connection_limit(4, Some(1024)), MIN_CONNECTIONS);
        assert_eq!(connection_limit(1000, None), 4064);
        assert_eq!(connection_limit(1000, Some(1024)), 1024 - FD_RESERVE);
        assert_eq!(connection_limit(1000, Some(100)), 32);
        assert_eq!(connection_limit(u32::MAX, None), 4 * u32::MAX as usize + 64);
    }

    #[test]
    fn at_the_limit_an_idle_connection_gives_way() {
        let c = Conns::default();
        let (a, ca) = c.admit(2).unwrap();
        let (_b, cb) = c.admit(2).unwrap();
        // `a` has served a request; `b` never sent one: `b` goes first.
        drop(InFlight::new(ca.clone()));
        let (_c, cc) = c.admit(2).unwrap();
        assert!(!c.open.lock().unwrap().contains_key(&_b));
        assert_eq!(c.open.lock().unwrap().len(), 2);
        let _ = cb;
        // Then the oldest of those that served requests.
        drop(InFlight::new(cc.clone()));
        let (_d, _) = c.admit(2).unwrap();
        assert!(!c.open.lock().unwrap().contains_key(&a));
        // Connections answering a request are never closed for a new one.
        let busy: Vec<InFlight> = c
            .open
            .lock()
            .unwrap()
            .values()
            .map(|x| InFlight::new(x.clone()))
            .collect();
        assert!(c.admit(2).is_none());
        drop(busy);
        assert!(c.admit(2).is_some());
        assert_eq!(c.shed.load(Ordering::Relaxed), 4);
    }
}
