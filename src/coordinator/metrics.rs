//! `GET /metrics`: the job in Prometheus text format, built from the view
//! at scrape time (bounded at any job size: per-rank series only for the
//! ranks the status lists).

use super::protocol::Status;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(String, String)>;

/// What a scrape reads from the coordinator.
pub struct Scrape {
    pub status: Status,
    pub ettr: f64,
    pub checkpoints: u64,
    pub reports: u64,
    pub batches: u64,
    /// Live ranks whose latest report came through a node relay.
    pub relayed_ranks: usize,
    pub rejected: u64,
    pub unauthorized: u64,
    /// Connections open now, and shed at the limit so far.
    pub connections: (usize, u64),
    /// The job's recoveries so far ([`super::recoveries`]).
    pub recoveries: Vec<super::recoveries::RecoveryFigures>,
}

/// Upper bounds of the recovery histograms' buckets, in seconds (the
/// fleet's too, `resilio fleet --prometheus`).
pub const BUCKETS_S: [f64; 10] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Prometheus text format.
pub fn render_metrics(x: &Scrape) -> String {
    let st = &x.status;
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
    gauge_f(
        &mut reg,
        "ranks",
        "Ranks reporting",
        f64::from(st.ranks_heard),
    );
    by_state(&mut reg, st);
    for (name, help, value) in [
        (
            "job_step",
            "Lowest step of the ranks: where the job is",
            st.step.map(|s| s as f64),
        ),
        ("attempt", "Current attempt", Some(st.attempt as f64)),
        ("ettr_estimate", "Share of the coordinator's uptime with ranks progressing (the report computes the exact ETTR)", Some(x.ettr)),
        (
            "stragglers",
            "Ranks currently flagged as stragglers",
            Some(st.straggler_ranks.len() as f64),
        ),
        (
            "straggler_nodes",
            "Nodes currently flagged as stragglers",
            Some(st.straggler_nodes.len() as f64),
        ),
    ] {
        if let Some(v) = value {
            gauge_f(&mut reg, name, help, v);
        }
    }
    // The counters, one line each.
    for (name, help, value) in counters(x) {
        counter(&mut reg, name, help, value);
    }
    for (name, help, value) in [
        (
            "connections",
            "Connections open now",
            Some(x.connections.0 as f64),
        ),
        (
            "relayed_ranks",
            "Live ranks whose latest report came through their node's relay",
            Some(x.relayed_ranks as f64),
        ),
        (
            "tokens_per_second",
            "Tokens per second of the job, from the trainer's printed per-device throughput",
            st.tokens_per_s,
        ),
        (
            "mfu",
            "Model FLOPs utilisation (fraction), median over the ranks that print it",
            st.mfu,
        ),
    ] {
        if let Some(v) = value {
            gauge_f(&mut reg, name, help, v);
        }
    }
    per_rank(&mut reg, st);
    recoveries(&mut reg, &st.job, &x.recoveries);
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        out.clear();
    }
    out
}

/// The counters of `/metrics`: name, help, value.
fn counters(x: &Scrape) -> [(&'static str, &'static str, u64); 8] {
    let st = &x.status;
    [
        ("stalls", "Stalls reported by agents", st.stalls),
        ("restarts", "Relaunches of the step", u64::from(st.restarts)),
        (
            "checkpoints",
            "Coordinated checkpoints confirmed by every rank",
            x.checkpoints,
        ),
        ("reports", "Agent reports received", x.reports),
        (
            "relay_batches",
            "Batches of reports received from node relays",
            x.batches,
        ),
        (
            "unauthorized_requests",
            "Requests refused for a missing or wrong token",
            x.unauthorized,
        ),
        (
            "rejected_requests",
            "Requests refused (400) for a value out of range",
            x.rejected,
        ),
        (
            "connections_shed",
            "Connections closed or refused at the connection limit",
            x.connections.1,
        ),
    ]
}

/// `resilio_recovery_seconds`: a histogram per failure class and phase
/// (and `total`) of the job's recoveries; a phase the journal does not show
/// is not observed.
fn recoveries(reg: &mut Registry, job: &str, list: &[super::recoveries::RecoveryFigures]) {
    use prometheus_client::metrics::histogram::Histogram;
    if list.is_empty() {
        return;
    }
    let f: Family<Labels, Histogram, fn() -> Histogram> =
        Family::new_with_constructor(|| Histogram::new(BUCKETS_S.iter().copied()));
    for r in list {
        for (phase, v) in &r.phases {
            let labels: Labels = vec![
                ("job".into(), job.to_string()),
                ("class".into(), r.class.clone()),
                ("phase".into(), phase.to_string()),
            ];
            f.get_or_create(&labels).observe(*v);
        }
    }
    reg.register(
        "recovery_seconds",
        "Seconds of each phase of the job's recoveries (fault to detected, diagnosed, torn down, relaunched, first step, back at the step reached before; total), by failure class",
        f,
    );
}

/// Ranks by state, one series each.
fn by_state(reg: &mut Registry, st: &Status) {
    let by_state = Family::<Labels, Gauge>::default();
    for (state, n) in &st.ranks_by_state {
        let l: Labels = vec![
            ("job".into(), st.job.clone()),
            ("state".into(), state.clone()),
        ];
        by_state.get_or_create(&l).set(i64::from(*n));
    }
    reg.register(
        "ranks_in_state",
        "Ranks by state (starting, running, stalled, exited, lost)",
        by_state,
    );
}

/// The series of each rank the status lists (every rank of a small job;
/// past [`STATUS_RANKS`] ranks, only those worth a look): bounded at any
/// size.
fn per_rank(reg: &mut Registry, st: &Status) {
    let figure = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    for r in &st.ranks {
        for (name, v) in &r.figures {
            let l: Labels = vec![
                ("job".into(), st.job.clone()),
                ("rank".into(), r.rank.to_string()),
                ("node".into(), r.node.clone()),
                ("name".into(), name.clone()),
            ];
            figure.get_or_create(&l).set(*v);
        }
    }
    reg.register(
        "figure",
        "The trainer's latest figures per rank (loss, tflops, mfu, tokens_per_s_device, ...)",
        figure,
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
    reg.register(
        "step",
        "Last step reported by the rank (past 256 ranks, only the ranks worth a look: not running, in a long phase, stragglers, silent, lost)",
        step,
    );
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
}
