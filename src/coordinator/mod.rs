//! The coordinator: one per job, it sees every rank. Agents report to it
//! over HTTP with a per-job token; it runs the cross-rank policies (a hang
//! judged job-wide, stragglers, coordinated checkpoints, teardown on the
//! first failure) and tells its host what happened.
//!
//! Where it runs (its *host*): the local launcher (`resilio run --ntasks N`),
//! the batch-level `resilio run -- srun ...` in an sbatch script, or, when
//! neither exists, rank 0's agent. Agents find it from `RESILIO_COORDINATOR`
//! and `RESILIO_COORDINATOR_TOKEN` (exported by the first two hosts), or from
//! `coordinator.json` and the 0600 `coordinator.token` in the job's state
//! directory (rank 0's). See `docs/coordinator.md`.

pub mod client;
pub mod metrics;
pub mod protocol;
pub mod recoveries;
pub mod relay;
pub mod server;
pub mod state;

use crate::journal::Writer;
use state::{Effect, JobView};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

/// Environment variables that lead agents to the coordinator.
pub const ENV_URL: &str = "RESILIO_COORDINATOR";
pub const ENV_TOKEN: &str = "RESILIO_COORDINATOR_TOKEN";
/// Files in the job's state directory.
pub const INFO_FILE: &str = "coordinator.json";
pub const TOKEN_FILE: &str = "coordinator.token";

/// A random token: 32 bytes from the kernel, hex.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Where to listen: `auto` is loopback without Slurm, else the address the
/// node's host name resolves to (reachable from the other nodes), never
/// 0.0.0.0 unless configured.
pub fn bind_address(configured: &str, under_slurm: bool) -> Result<SocketAddr, String> {
    if configured != "auto" {
        return configured
            .parse::<SocketAddr>()
            .or_else(|_| {
                configured
                    .parse::<IpAddr>()
                    .map(|ip| SocketAddr::new(ip, 0))
            })
            .map_err(|_| format!("coordinator.bind: '{configured}' is not an address"));
    }
    if !under_slurm {
        return Ok(SocketAddr::from(([127, 0, 0, 1], 0)));
    }
    let host = nix::unistd::gethostname()
        .map_err(|e| format!("cannot read the host name: {e}"))?
        .to_string_lossy()
        .into_owned();
    use std::net::ToSocketAddrs;
    let addrs: Vec<SocketAddr> = (host.as_str(), 0)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve host name {host}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("host name {host} resolves to no address"))
}

/// Whether the job's world size is unknown to this process: the batch
/// script of an sbatch job without a task count (`sbatch -N 4` alone sets
/// no `SLURM_NTASKS`), whose steps may run any number of tasks. Its
/// coordinator then bounds rank ids by [`state::MAX_RANKS`] (and sizes its
/// connection limit by the open-file limit) rather than refuse real ranks.
fn world_size_is_a_guess(get: &dyn Fn(&str) -> Option<String>) -> bool {
    crate::slurm::SlurmContext::from_lookup(get)
        .is_ok_and(|s| s.in_batch_script() && s.ntasks.is_none())
}

/// A running coordinator.
pub struct Coordinator {
    pub url: String,
    pub token: String,
    shared: Arc<server::Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Effects for the host (failures, settled checkpoints).
    pub effects: mpsc::Receiver<Effect>,
    files: Vec<PathBuf>,
    /// The read-only metrics listener for the site, when open.
    site: Option<SiteMetrics>,
}

/// The read-only `/metrics` listener and its Prometheus target file.
struct SiteMetrics {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    target: Option<PathBuf>,
}

impl Drop for SiteMetrics {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(f) = &self.target {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Where coordinators register their read-only metrics listeners for a
/// site's Prometheus (`file_sd_configs`): one file per job.
pub const TARGETS_DIR: &str = "prometheus";

/// A `file_sd_configs` file: one target, labelled with the job and node.
pub fn target_file_body(addr: &SocketAddr, job: &str, node: &str) -> String {
    serde_json::json!([{
        "targets": [addr.to_string()],
        "labels": {"resilio_job": job, "resilio_node": node},
    }])
    .to_string()
}

impl Coordinator {
    /// Bind, start serving in a thread of its own, and write the discovery
    /// files into `job_dir` (when given).
    pub fn start(
        view: JobView,
        bind: SocketAddr,
        journal: Writer,
        job_dir: Option<&Path>,
    ) -> std::io::Result<Coordinator> {
        Self::start_with(view, bind, journal, job_dir, None)
    }

    /// Start in place of a dead coordinator ([`Successor`]): its address
    /// and token, so that the ranks' links to it work again.
    pub fn take_over(
        view: JobView,
        from: Successor,
        journal: Writer,
        job_dir: &Path,
    ) -> std::io::Result<Coordinator> {
        Self::start_with(view, from.addr, journal, Some(job_dir), Some(from))
    }

    fn start_with(
        mut view: JobView,
        bind: SocketAddr,
        journal: Writer,
        job_dir: Option<&Path>,
        from: Option<Successor>,
    ) -> std::io::Result<Coordinator> {
        if world_size_is_a_guess(&|k| std::env::var(k).ok()) {
            view.world_size_unknown();
        }
        let took_over_from = from.as_ref().map(|f| f.pid);
        let token = match from {
            Some(f) => f.token,
            None => new_token()?,
        };
        let listener = std::net::TcpListener::bind(bind)?;
        let addr = listener.local_addr()?;
        let url = format!("http://{addr}");
        let (host_tx, host_rx) = mpsc::channel();
        let (seq_tx, _) = tokio::sync::watch::channel(0u64);
        let shared = Arc::new(server::Shared {
            view: Mutex::new(view),
            journal: Mutex::new(journal),
            token: token.clone(),
            unauthorized: AtomicU64::new(0),
            seq: seq_tx,
            host: Mutex::new(host_tx),
            conns: Default::default(),
            recoveries: Default::default(),
        });
        shared.apply(vec![Effect::Journal {
            event: Box::new(
                crate::event::CoordinatorStart {
                    url: url.clone(),
                    pid: std::process::id(),
                    took_over_from,
                }
                .into(),
            ),
            durable: true,
        }]);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("coordinator".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::warn!("coordinator runtime: {e}; ranks supervise locally");
                        return;
                    }
                };
                if let Err(e) = rt.block_on(server::serve(listener, s, stop_rx)) {
                    tracing::warn!("coordinator stopped: {e}; ranks supervise locally");
                }
            })?;
        // The files only let `resilio status` and `resilio checkpoint` find
        // the coordinator; the agents are given its address. A full disk
        // costs those commands, never the coordinator itself.
        let mut files = Vec::new();
        if let Some(dir) = job_dir {
            match write_discovery(dir, &url, &token) {
                Ok(f) => files = f,
                Err(e) => tracing::warn!(
                    "coordinator: cannot write {INFO_FILE} and {TOKEN_FILE} in {}: {e}; \
                     it serves the ranks all the same (`resilio status` cannot find it)",
                    dir.display()
                ),
            }
        }
        Ok(Coordinator {
            url,
            token,
            shared,
            stop: Some(stop_tx),
            thread: Some(thread),
            effects: host_rx,
            files,
            site: None,
        })
    }

    /// A second, read-only listener for the site's Prometheus: `GET
    /// /metrics` without the token, at the coordinator's address on a port
    /// of its own, registered in `STATE_DIR/prometheus/JOB.json` for
    /// `file_sd_configs` (removed when the coordinator stops). The metrics
    /// are the job's figures only; everything else stays behind the token.
    /// Fails open: a listener that cannot open costs the site's scrape,
    /// never the job.
    pub fn serve_site_metrics(
        &mut self,
        state_dir: &Path,
        job: &str,
        node: &str,
    ) -> std::io::Result<SocketAddr> {
        let ip = self
            .url
            .trim_start_matches("http://")
            .parse::<SocketAddr>()
            .map(|a| a.ip())
            .map_err(std::io::Error::other)?;
        let listener = std::net::TcpListener::bind(SocketAddr::new(ip, 0))?;
        let addr = listener.local_addr()?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let s = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name("site-metrics".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                if let Err(e) = rt.block_on(server::serve_metrics(listener, s, stop_rx)) {
                    tracing::warn!("site metrics listener stopped: {e}");
                }
            })?;
        let mut site = SiteMetrics {
            stop: Some(stop_tx),
            thread: Some(thread),
            target: None,
        };
        let dir = state_dir.join(TARGETS_DIR);
        let file = dir.join(format!("{job}.json"));
        let tmp = dir.join(format!(".{job}.json.{}", std::process::id()));
        let written = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(&tmp, target_file_body(&addr, job, node)))
            .and_then(|_| std::fs::rename(&tmp, &file));
        match written {
            Ok(()) => site.target = Some(file),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                tracing::warn!(
                    "cannot register the metrics target in {}: {e} (served at {addr} all the same)",
                    dir.display()
                );
            }
        }
        self.site = Some(site);
        Ok(addr)
    }

    /// Environment for agents.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (ENV_URL.into(), self.url.clone()),
            (ENV_TOKEN.into(), self.token.clone()),
        ]
    }

    /// Run `f` on the view (effects applied as the server would).
    pub fn with_view<R>(&self, f: impl FnOnce(&mut JobView) -> (R, Vec<Effect>)) -> R {
        self.shared.with_view(f)
    }

    /// A journal record in the coordinator's journal.
    pub fn write(&self, event: impl Into<crate::event::Event>, durable: bool) {
        self.shared.apply(vec![Effect::Journal {
            event: Box::new(event.into()),
            durable,
        }]);
    }

    pub fn request_checkpoint(&self, reason: &str) -> Result<(u64, u64), String> {
        self.with_view(|v| match v.request_checkpoint(reason, Instant::now()) {
            Ok((id, step, e)) => (Ok((id, step)), e),
            Err(m) => (Err(m), Vec::new()),
        })
    }

    /// Where `/metrics` takes the job's recoveries from
    /// ([`recoveries::RecoverySource`]).
    pub fn watch_recoveries(&self, source: Arc<dyn recoveries::RecoverySource>) {
        self.shared.recoveries.set_source(source);
    }

    pub fn new_attempt(&self, attempt: u32) {
        self.with_view(|v| ((), v.new_attempt(attempt, Instant::now())));
    }

    pub fn status(&self) -> protocol::Status {
        let u = self
            .shared
            .unauthorized
            .load(std::sync::atomic::Ordering::Relaxed);
        self.with_view(|v| (v.status(Instant::now(), u), Vec::new()))
    }
}

/// `[coordinator] checkpoint_every = "advised"`: Daly's interval from what
/// this job (and the node history) measured so far. Evaluated when the host
/// starts an attempt and again every [`IntervalAdvisor::EVERY`] while it runs, so that
/// a first attempt picks up advice once its first checkpoint has been timed
/// rather than only after a restart. The re-evaluations run on a thread of
/// their own (they read the whole journal: the host's loop must not wait on
/// that), and the node history's failure rate, which reads every job's
/// journal, is taken once per attempt. A revision is applied (and journaled
/// as `checkpoint_interval_advised`) only when it differs by more than 5%;
/// an interval in force is never withdrawn in the middle of an attempt.
pub struct IntervalAdvisor {
    source: Arc<dyn AdviceSource>,
    due: Option<Instant>,
    /// What is in force: `None` before the first evaluation.
    current: Option<Option<std::time::Duration>>,
    running: Option<mpsc::Receiver<Evaluation>>,
}

/// One evaluation of the advised checkpoint interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// The interval advised (`None`: nothing to go on yet).
    pub every: Option<std::time::Duration>,
    /// Why, as journaled.
    pub why: crate::event::CheckpointIntervalAdvised,
}

/// Where the advice comes from. The host hands it in: the coordinator reads
/// no journal and no node history itself (`crate::analysis::advice` reads both).
pub trait AdviceSource: Send + Sync + 'static {
    /// At the start of an attempt: also refresh what stays the same for the
    /// whole attempt (the node history's failure rate, which reads every
    /// job's journal).
    fn at_attempt_start(&self) -> Evaluation;
    /// During the attempt, on a thread of its own.
    fn again(&self) -> Evaluation;
}

impl IntervalAdvisor {
    /// How often the journal is read again while an attempt runs.
    pub const EVERY: std::time::Duration = std::time::Duration::from_secs(300);

    pub fn new(source: Arc<dyn AdviceSource>) -> IntervalAdvisor {
        IntervalAdvisor {
            source,
            due: None,
            current: None,
            running: None,
        }
    }

    /// Evaluate at the next [`IntervalAdvisor::poll`] whatever the time (a new attempt).
    pub fn now(&mut self) {
        self.due = None;
    }

    /// Evaluate if due and apply the interval to the coordinator: at a new
    /// attempt at once and always (its schedule starts with the attempt),
    /// otherwise in the background and only when the advice changed.
    pub fn poll(&mut self, c: &Coordinator, now: Instant) {
        if let Some(rx) = &self.running {
            match rx.try_recv() {
                Ok(e) => {
                    self.running = None;
                    self.apply(c, now, e, false);
                }
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => self.running = None,
            }
        }
        let fresh = self.due.is_none();
        if self.due.is_some_and(|t| now < t) {
            return;
        }
        self.due = Some(now + Self::EVERY);
        if fresh {
            let e = self.source.at_attempt_start();
            self.apply(c, now, e, true);
        } else if self.running.is_none() {
            let (tx, rx) = mpsc::channel();
            let source = self.source.clone();
            let spawned = std::thread::Builder::new()
                .name("advice".into())
                .spawn(move || {
                    let _ = tx.send(source.again());
                });
            if spawned.is_ok() {
                self.running = Some(rx);
            }
        }
    }

    /// Wait for a background evaluation and apply it (tests).
    #[cfg(test)]
    fn settle(&mut self, c: &Coordinator, now: Instant) {
        if let Some(e) = self.running.take().and_then(|rx| rx.recv().ok()) {
            self.apply(c, now, e, false);
        }
    }

    fn apply(&mut self, c: &Coordinator, now: Instant, e: Evaluation, fresh: bool) {
        let Evaluation {
            every: advised,
            why,
        } = e;
        // Nothing known any more (a journal that could not be read): keep
        // what is in force rather than stop checkpointing.
        if !fresh && advised.is_none() && self.current.is_some_and(|cur| cur.is_some()) {
            return;
        }
        let changed = self.current.is_none_or(|cur| revised(cur, advised));
        let every = match self.current {
            Some(cur) if !changed => cur,
            _ => advised,
        };
        if !fresh && !changed {
            return;
        }
        self.current = Some(every);
        c.with_view(|v| {
            if fresh {
                v.set_checkpoint_every(None, now);
            }
            v.set_checkpoint_every(every, now);
            ((), Vec::new())
        });
        if changed {
            c.write(why, false);
        }
    }
}

/// Whether advice `new` differs enough from `old` to be applied.
fn revised(old: Option<std::time::Duration>, new: Option<std::time::Duration>) -> bool {
    match (old, new) {
        (Some(a), Some(b)) => {
            let (a, b) = (a.as_secs_f64(), b.as_secs_f64());
            (a - b).abs() > 0.05 * a.max(b)
        }
        (None, None) => false,
        _ => true,
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.site = None;
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// `coordinator.json`: where a job's coordinator listens, and which process
/// on which host it is (a dead one's files are stale).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Info {
    /// `http://ADDR:PORT`.
    pub url: String,
    /// Its process (0: not known).
    #[serde(default)]
    pub pid: u32,
    /// The host it runs on, when known.
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub started: Option<chrono::DateTime<chrono::Utc>>,
}

impl Info {
    /// The address of `http://ADDR:PORT`.
    fn addr(&self) -> Option<SocketAddr> {
        self.url.strip_prefix("http://")?.parse().ok()
    }

    /// Left by a coordinator on this host whose process is gone.
    fn stale(&self) -> bool {
        let here = nix::unistd::gethostname()
            .ok()
            .map(|h| h.to_string_lossy().into_owned());
        let pid = i32::try_from(self.pid).ok().filter(|p| *p > 0);
        match pid {
            Some(p) if self.node.is_some() && self.node == here => {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None)
                    == Err(nix::errno::Errno::ESRCH)
            }
            _ => false,
        }
    }

    /// A job's `coordinator.json`, read as a file anyone may have planted
    /// (see [`read_small`]).
    fn read(job_dir: &Path) -> Result<Info, String> {
        let path = job_dir.join(INFO_FILE);
        read_small(job_dir, INFO_FILE)
            .map_err(|e| format!("{}: {e}", path.display()))
            .and_then(|b| {
                serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", path.display()))
            })
    }
}

/// A file of `dir` written whole: a temporary file, synced, then renamed
/// over `name` (a reader sees the old file or the new one, never a part).
pub(crate) fn write_whole(
    dir: &Path,
    name: &str,
    body: &[u8],
    mode: u32,
) -> std::io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if written.is_err() {
        // (A full disk: nothing half-written is left behind.)
        let _ = std::fs::remove_file(&tmp);
    }
    written.map(|()| path)
}

/// `coordinator.json` (where) and `coordinator.token` (0600), both written
/// whole (temporary file, then rename).
fn write_discovery(dir: &Path, url: &str, token: &str) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let put = |name: &str, body: &[u8], mode: u32| write_whole(dir, name, body, mode);
    let token_path = put(TOKEN_FILE, format!("{token}\n").as_bytes(), 0o600)?;
    let info = Info {
        url: url.to_string(),
        pid: std::process::id(),
        node: nix::unistd::gethostname()
            .ok()
            .map(|h| h.to_string_lossy().into_owned()),
        started: Some(chrono::Utc::now()),
    };
    let body = serde_json::to_string(&info).map_err(std::io::Error::other)?;
    let info_path = put(INFO_FILE, format!("{body}\n").as_bytes(), 0o600).inspect_err(|_| {
        let _ = std::fs::remove_file(&token_path);
    })?;
    Ok(vec![info_path, token_path])
}

/// Find a job's coordinator: the environment first, then the job's files.
pub fn discover(job_dir: &Path) -> Option<(String, String)> {
    if let (Ok(url), Ok(token)) = (std::env::var(ENV_URL), std::env::var(ENV_TOKEN)) {
        if !url.is_empty() && !token.is_empty() {
            return Some((url, token));
        }
    }
    discover_files(job_dir)
}

/// Find a job's coordinator from its files only. Files a coordinator on
/// this host left when it was killed (its pid is gone) are stale: ignored
/// (the next run of the job writes its own over them).
pub fn discover_files(job_dir: &Path) -> Option<(String, String)> {
    let info = Info::read(job_dir).ok()?;
    if info.stale() {
        return None;
    }
    let url = info.url;
    let token = String::from_utf8(read_small(job_dir, TOKEN_FILE).ok()?).ok()?;
    let token = token.trim().to_string();
    (!token.is_empty()).then_some((url, token))
}

/// A job's discovery file, anyone's to plant in a shared state dir: no
/// symlink followed, no FIFO waited on, at most [`crate::util::files::SMALL_CAP`],
/// and owned by the job directory's owner (or root).
fn read_small(job_dir: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    crate::util::files::read_in_dir(job_dir, name, crate::util::files::SMALL_CAP)
}

/// What a coordinator coming back in place of a dead one takes over.
#[derive(Debug)]
pub struct Successor {
    pub addr: SocketAddr,
    pub token: String,
    /// The dead coordinator's pid.
    pub pid: i32,
}

/// The dead coordinator of a job, from the files it left in `job_dir`: its
/// address and token, when its process is gone from this host, and the
/// token file is this user's own and private. `Err` says why not.
pub fn successor_of(job_dir: &Path) -> Result<Successor, String> {
    use std::os::unix::fs::MetadataExt;
    let info_path = job_dir.join(INFO_FILE);
    let info = Info::read(job_dir)?;
    if !info.stale() {
        return Err(format!(
            "{}: its coordinator is still running on this host, or ran on another",
            info_path.display()
        ));
    }
    let pid = i32::try_from(info.pid).unwrap_or(0);
    let addr = info
        .addr()
        .ok_or_else(|| format!("{}: no address in it", info_path.display()))?;
    let token_path = job_dir.join(TOKEN_FILE);
    let meta = std::fs::symlink_metadata(&token_path)
        .map_err(|e| format!("{}: {e}", token_path.display()))?;
    if !meta.file_type().is_file()
        || meta.uid() != nix::unistd::getuid().as_raw()
        || meta.mode() & 0o077 != 0
    {
        return Err(format!(
            "{}: not a private file of this user",
            token_path.display()
        ));
    }
    let token =
        read_small(job_dir, TOKEN_FILE).map_err(|e| format!("{}: {e}", token_path.display()))?;
    let token = String::from_utf8_lossy(&token).trim().to_string();
    if token.len() < 32 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{}: not a token", token_path.display()));
    }
    Ok(Successor { addr, token, pid })
}

/// A coordinator on this host whose process is gone.
#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `GET path` over plain HTTP/1.1: the status code and the body.
    fn get(addr: &str, path: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        write!(
            c,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        let code = out
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (
            code,
            out.split_once("\r\n\r\n")
                .map(|x| x.1.to_string())
                .unwrap_or_default(),
        )
    }

    #[test]
    fn the_site_scrapes_metrics_without_the_token_and_nothing_else() {
        let state = tempfile::tempdir().unwrap();
        let dir = crate::journal::job_dir(state.path(), "77");
        std::fs::create_dir_all(&dir).unwrap();
        let view = JobView::new("77", 2, 0, Default::default(), Instant::now());
        let w = Writer::open(&dir, "coordinator.jsonl", 0, None, Some("n1".into()));
        let mut c =
            Coordinator::start(view, "127.0.0.1:0".parse().unwrap(), w, Some(&dir)).unwrap();
        let addr = c.serve_site_metrics(state.path(), "77", "n1").unwrap();
        // Registered for file_sd_configs, with the job and node as labels.
        let target = state.path().join(TARGETS_DIR).join("77.json");
        let t: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&target).unwrap()).unwrap();
        assert_eq!(t[0]["targets"][0], addr.to_string());
        assert_eq!(t[0]["labels"]["resilio_job"], "77");
        assert_eq!(t[0]["labels"]["resilio_node"], "n1");
        // Read-only, no token: /metrics only.
        let (code, body) = get(&addr.to_string(), "/metrics");
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("resilio_ranks{job=\"77\"}"), "{body}");
        assert_eq!(get(&addr.to_string(), "/v1/status").0, 404);
        // The job's own listener still wants the token.
        let own = c.url.trim_start_matches("http://").to_string();
        assert_eq!(get(&own, "/metrics").0, 401);
        // Every metric the example dashboard plots is served.
        let dash: serde_json::Value =
            serde_json::from_str(include_str!("../../conf/grafana-dashboard.json")).unwrap();
        let names = regex::Regex::new(r"resilio_[a-z_]+").unwrap();
        let mut plotted = 0;
        for p in dash["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                for m in names.find_iter(t["expr"].as_str().unwrap()) {
                    if m.as_str() == "resilio_job" {
                        continue;
                    }
                    plotted += 1;
                    assert!(
                        body.lines()
                            .any(|l| l.starts_with(&format!("{}{{", m.as_str()))),
                        "the dashboard plots {} which /metrics does not serve:\n{body}",
                        m.as_str()
                    );
                }
            }
        }
        assert!(plotted >= 6);
        // The example Prometheus config reads the registered targets.
        let prom = include_str!("../../conf/prometheus.yml");
        assert!(prom.contains(&format!("/{TARGETS_DIR}/*.json")), "{prom}");
        drop(c);
        assert!(!target.exists(), "the target goes with the coordinator");
        assert!(std::net::TcpStream::connect(addr).is_err());
    }

    #[test]
    fn files_of_a_coordinator_killed_on_this_host_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        write_discovery(dir.path(), "http://127.0.0.1:1", "tok").unwrap();
        assert_eq!(
            discover_files(dir.path()),
            Some(("http://127.0.0.1:1".to_string(), "tok".to_string()))
        );
        // The same files, written by a process that is gone.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let dead = gone.id();
        gone.wait().unwrap();
        let info = dir.path().join(INFO_FILE);
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&info).unwrap()).unwrap();
        v["pid"] = dead.into();
        std::fs::write(&info, v.to_string()).unwrap();
        assert_eq!(discover_files(dir.path()), None);
        // On another host, the pid says nothing here.
        v["node"] = "elsewhere".into();
        std::fs::write(&info, v.to_string()).unwrap();
        assert!(discover_files(dir.path()).is_some());
    }

    /// A first attempt with nothing measured gets no periodic checkpoints;
    /// once a checkpoint was timed and a failure seen, the next background
    /// re-evaluation sets the interval, without the host's loop waiting.
    #[test]
    fn advice_comes_during_the_attempt_once_there_is_something_to_go_on() {
        let state = tempfile::tempdir().unwrap();
        let dir = crate::journal::job_dir(state.path(), "j");
        std::fs::create_dir_all(&dir).unwrap();
        let t0 = Instant::now();
        let view = JobView::new("j", 1, 0, Default::default(), t0);
        let w = Writer::open(&dir, "coordinator.jsonl", 0, None, Some("n1".into()));
        let c = Coordinator::start(view, "127.0.0.1:0".parse().unwrap(), w, None).unwrap();
        let mut advice = IntervalAdvisor::new(std::sync::Arc::new(
            crate::analysis::advice::JournalAdvice::new(state.path(), "j"),
        ));
        advice.poll(&c, t0);
        assert_eq!(c.with_view(|v| (v.checkpoint_every(), Vec::new())), None);

        // What the rank journaled meanwhile: a 10 s checkpoint, a crash.
        let mut rank = Writer::open(&dir, "rank-0.jsonl", 0, Some(0), Some("n1".into()));
        let at = |s: i64| chrono::Utc::now() - chrono::Duration::seconds(1000 - s);
        rank.record_at(at(0), "rank_start", serde_json::json!({}), true);
        rank.record_at(
            at(5),
            "progress",
            serde_json::json!({"step": 1, "first": true}),
            true,
        );
        rank.record_at(
            at(100),
            "phase",
            serde_json::json!({"phase": "checkpoint", "step": 100}),
            true,
        );
        rank.record_at(
            at(110),
            "checkpoint_done",
            serde_json::json!({"step": 100, "duration_s": 10.0}),
            true,
        );
        rank.record_at(
            at(900),
            "rank_exit",
            serde_json::json!({"exit_code": 137}),
            true,
        );
        rank.record_at(
            at(900),
            "failure",
            serde_json::json!({"failure_kind": "crash", "cause": "x"}),
            true,
        );

        // Not due yet: nothing read.
        advice.poll(&c, t0 + Duration::from_secs(10));
        assert!(advice.running.is_none());
        let due = t0 + IntervalAdvisor::EVERY + Duration::from_secs(1);
        advice.poll(&c, due);
        assert!(advice.running.is_some(), "evaluated on a thread");
        advice.settle(&c, due);
        let every = c.with_view(|v| (v.checkpoint_every(), Vec::new()));
        assert!(every.is_some_and(|d| d > Duration::ZERO), "{every:?}");
        drop(c);
        let recs = crate::journal::read_job(&dir).unwrap().records;
        let advised: Vec<_> = recs
            .iter()
            .filter(|r| r.kind == "checkpoint_interval_advised")
            .collect();
        assert_eq!(advised.len(), 2, "{advised:?}");
        assert!(advised[0].get("interval_s").is_none_or(|v| v.is_null()));
        assert!(advised[1].f64("interval_s").is_some());
    }

    #[test]
    fn the_world_size_is_a_guess_only_in_a_batch_script_without_a_task_count() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let batch: &'static [(&str, &str)] = &[("SLURM_JOB_ID", "7"), ("ENVIRONMENT", "BATCH")];
        assert!(world_size_is_a_guess(&env(batch)));
        let counted: &[(&str, &str)] = &[
            ("SLURM_JOB_ID", "7"),
            ("ENVIRONMENT", "BATCH"),
            ("SLURM_NTASKS", "4"),
        ];
        assert!(!world_size_is_a_guess(&env(counted)));
        let step: &[(&str, &str)] = &[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
        ];
        assert!(!world_size_is_a_guess(&env(step)));
        assert!(!world_size_is_a_guess(&env(&[])));
    }

    #[test]
    fn advice_is_revised_only_when_it_moves_by_more_than_five_percent() {
        let s = |x: u64| Some(Duration::from_secs(x));
        assert!(!revised(s(1000), s(1040)));
        assert!(!revised(s(1040), s(1000)));
        assert!(revised(s(1000), s(1100)));
        assert!(revised(s(1100), s(1000)));
        assert!(revised(None, s(600)));
        assert!(revised(s(600), None));
        assert!(!revised(None, None));
    }
}
