//! The coordinator's HTTP server (axum on a current-thread tokio runtime in
//! a thread of its own): authenticates, feeds the [`JobView`], writes the
//! coordinator's journal, and passes host effects on.

use super::protocol::*;
use super::state::{Effect, JobView};
use crate::journal::Writer;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::future::IntoFuture;
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
                Effect::Journal { event, durable } => j.write(event, durable),
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
    // Compare every byte: the time taken does not tell how much matched.
    let a = given.as_bytes();
    let b = s.token.as_bytes();
    let mut diff = (a.len() ^ b.len()) as u8;
    for (i, x) in b.iter().enumerate() {
        diff |= x ^ a.get(i).copied().unwrap_or(0);
    }
    let ok = diff == 0 && !b.is_empty();
    if !ok {
        s.unauthorized.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

fn refuse() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
        "missing or wrong token\n",
    )
        .into_response()
}

async fn report(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(r): Json<Report>,
) -> Response {
    if !authorized(&s, &headers) {
        return refuse();
    }
    let (rank, attempt, seen) = (r.rank, r.attempt, r.commands_seen);
    let now = Instant::now();
    let (commands, job_progress_age_s) = s.with_view(|v| {
        let e = v.on_report(r, now);
        (
            (v.commands_for(rank, attempt, seen), v.job_progress_age(now)),
            e,
        )
    });
    Json(Reply {
        commands,
        job_progress_age_s,
    })
    .into_response()
}

#[derive(serde::Deserialize)]
struct PollQuery {
    rank: u32,
    attempt: u32,
    after: u64,
    #[serde(default)]
    wait_s: Option<f64>,
}

async fn commands(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<PollQuery>,
) -> Response {
    if !authorized(&s, &headers) {
        return refuse();
    }
    let wait = Duration::from_secs_f64(q.wait_s.unwrap_or(20.0).clamp(0.0, 60.0));
    let deadline = tokio::time::Instant::now() + wait;
    let mut rx = s.seq.subscribe();
    loop {
        let cmds = s.with_view(|v| (v.commands_for(q.rank, q.attempt, q.after), Vec::new()));
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

async fn status(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if !authorized(&s, &headers) {
        return refuse();
    }
    let u = s.unauthorized.load(Ordering::Relaxed);
    let st = s.with_view(|v| (v.status(Instant::now(), u), Vec::new()));
    Json(st).into_response()
}

async fn checkpoint(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Option<Json<CheckpointAsk>>,
) -> Response {
    if !authorized(&s, &headers) {
        return refuse();
    }
    let reason = body
        .and_then(|Json(b)| b.reason)
        .unwrap_or_else(|| "operator".into());
    let r = s.with_view(|v| match v.request_checkpoint(&reason, Instant::now()) {
        Ok((id, step, e)) => (Ok((id, step)), e),
        Err(m) => (Err(m), Vec::new()),
    });
    match r {
        Ok((id, step)) => Json(CheckpointAnswer { id, step }).into_response(),
        Err(m) => (StatusCode::CONFLICT, format!("{m}\n")).into_response(),
    }
}

type Labels = Vec<(String, String)>;

/// Prometheus text format, built from the view at scrape time.
pub fn render_metrics(s: &Shared) -> String {
    let u = s.unauthorized.load(Ordering::Relaxed);
    let (st, ettr, checkpoints, reports) = s.with_view(|v| {
        (
            (
                v.status(Instant::now(), u),
                v.live_ettr(Instant::now()),
                v.checkpoints,
                v.reports,
            ),
            Vec::new(),
        )
    });
    let mut reg = Registry::with_prefix("resilio");
    let job: Labels = vec![("job".into(), st.job.clone())];
    let gauge_f = |reg: &mut Registry, name: &str, help: &str, value: f64| {
        let f = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        f.get_or_create(&job).set(value);
        reg.register(name, help, f);
    };
    let counter = |reg: &mut Registry, name: &str, help: &str, value: u64| {
        let f = Family::<Labels, Counter>::default();
        f.get_or_create(&job).inc_by(value);
        reg.register(name, help, f);
    };
    gauge_f(&mut reg, "ranks", "Ranks reporting", st.ranks.len() as f64);
    gauge_f(&mut reg, "attempt", "Current attempt", st.attempt as f64);
    gauge_f(&mut reg, "ettr_estimate", "Share of the coordinator's uptime with ranks progressing (the report computes the exact ETTR)", ettr);
    gauge_f(
        &mut reg,
        "stragglers",
        "Ranks currently flagged as stragglers",
        st.straggler_ranks.len() as f64,
    );
    gauge_f(
        &mut reg,
        "straggler_nodes",
        "Nodes currently flagged as stragglers",
        st.straggler_nodes.len() as f64,
    );
    counter(&mut reg, "stalls", "Stalls reported by agents", st.stalls);
    counter(
        &mut reg,
        "restarts",
        "Relaunches of the step",
        st.restarts as u64,
    );
    counter(
        &mut reg,
        "checkpoints",
        "Coordinated checkpoints confirmed by every rank",
        checkpoints,
    );
    counter(&mut reg, "reports", "Agent reports received", reports);
    counter(
        &mut reg,
        "unauthorized_requests",
        "Requests refused for a missing or wrong token",
        u,
    );
    let step = Family::<Labels, Gauge>::default();
    let step_time = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    let compute = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    for r in &st.ranks {
        let l: Labels = vec![
            ("job".into(), st.job.clone()),
            ("rank".into(), r.rank.to_string()),
            ("node".into(), r.node.clone()),
        ];
        if let Some(x) = r.step {
            step.get_or_create(&l).set(x as i64);
        }
        if let Some(x) = r.mean_step_s {
            step_time.get_or_create(&l).set(x);
        }
        if let Some(x) = r.mean_compute_s {
            compute.get_or_create(&l).set(x);
        }
    }
    reg.register("step", "Last step reported by the rank", step);
    reg.register(
        "step_time_seconds",
        "Mean step interval of the rank in this attempt",
        step_time,
    );
    reg.register(
        "compute_time_seconds",
        "Mean compute time per step the rank reported (compute_s)",
        compute,
    );
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        out.clear();
    }
    out
}

async fn metrics(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if !authorized(&s, &headers) {
        return refuse();
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        render_metrics(&s),
    )
        .into_response()
}

pub fn router(s: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/report", post(report))
        .route("/v1/commands", get(commands))
        .route("/v1/status", get(status))
        .route("/v1/checkpoint", post(checkpoint))
        .route("/metrics", get(metrics))
        .with_state(s)
}

/// Serve until `stop` fires; ticks the view once a second.
pub async fn serve(
    listener: std::net::TcpListener,
    s: Arc<Shared>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
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
    let r = tokio::select! {
        r = axum::serve(listener, router(s)).into_future() => r,
        _ = stop => Ok(()),
    };
    ticker.abort();
    r
}
