//! The agent's side of the link: report about once a second (at once when
//! something urgent happened), long-poll for commands, and never hold the
//! trainer up. Two tasks on the agent's own runtime; they share the latest
//! report with the agent's loop through an [`Outbox`] and hand commands and
//! link changes back as [`Note`]s.
//!
//! Fail open: an unreachable coordinator is retried with backoff (1 s
//! doubling to 30 s); the agent keeps supervising locally and journals the
//! gap (`coordinator_unreachable`, then `coordinator_reachable`).
//!
//! Jittered: the first report comes at a random point of the first period,
//! and each retry between half its backoff and all of it, so that the ranks
//! of a large job, started (or cut off) at one moment, do not reach the
//! coordinator at one moment, second after second.

use super::protocol::{BatchReply, BatchReport, Command, Reply, Report};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// Where the coordinator is.
#[derive(Clone, Debug)]
pub enum Target {
    /// Known from the environment.
    Known { url: String, token: String },
    /// To be read from the job's discovery files (rank 0's coordinator may
    /// not have written them yet).
    Files(PathBuf),
}

/// The latest report, kept current by the agent's loop.
#[derive(Default)]
pub struct Outbox {
    pub report: Mutex<Report>,
    /// When the last step was seen (the report carries its age when sent).
    pub last_step_at: Mutex<Option<Instant>>,
    pub urgent: tokio::sync::Notify,
    /// The step whose compute time was counted last.
    compute_step: Mutex<Option<u64>>,
}

impl Outbox {
    pub fn update(&self, f: impl FnOnce(&mut Report)) {
        f(&mut self.report.lock().unwrap_or_else(|e| e.into_inner()));
    }
    /// True the first time a compute time comes for `step` (or always for
    /// messages without a step).
    pub fn take_compute_step(&self, step: Option<u64>) -> bool {
        let mut c = self.compute_step.lock().unwrap_or_else(|e| e.into_inner());
        if step.is_some() && *c == step {
            return false;
        }
        *c = step;
        true
    }

    /// The report as it stands now.
    pub fn snapshot(&self) -> Report {
        let at = *self.last_step_at.lock().unwrap_or_else(|e| e.into_inner());
        let mut r = self
            .report
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        r.progress_age_s = at.map(|t| t.elapsed().as_secs_f64());
        r
    }
}

/// The node's relay ([`super::relay`]), used while it answers: looked for
/// every [`Via::LOOK_EVERY`] until announced, and after a failure left alone
/// for [`Via::REST`] (reports go straight to the coordinator meanwhile).
pub struct Via {
    job_dir: PathBuf,
    node: String,
    attempt: u32,
    state: Mutex<ViaState>,
}

#[derive(Default)]
struct ViaState {
    url: Option<String>,
    next_look: Option<Instant>,
    /// Looks in a row that found no announcement.
    misses: u32,
}

impl Via {
    /// The first look after a miss; the wait doubles up to `LOOK_EVERY`
    /// (ranks start with their relay: most find it within a second).
    pub const LOOK_FIRST: Duration = Duration::from_millis(250);
    pub const LOOK_EVERY: Duration = Duration::from_secs(5);
    pub const REST: Duration = Duration::from_secs(30);

    pub fn new(job_dir: PathBuf, node: String, attempt: u32) -> Via {
        Via {
            job_dir,
            node,
            attempt,
            state: Mutex::new(ViaState::default()),
        }
    }

    fn url(&self) -> Option<String> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if s.url.is_none() && s.next_look.is_none_or(|t| now >= t) {
            s.url = super::relay::announce::announced(&self.job_dir, &self.node, self.attempt);
            if s.url.is_none() {
                let wait = Self::LOOK_FIRST.saturating_mul(1 << s.misses.min(8));
                s.next_look = Some(now + wait.min(Self::LOOK_EVERY));
                s.misses += 1;
            } else {
                s.misses = 0;
            }
        }
        s.url.clone()
    }

    fn failed(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.url = None;
        s.next_look = Some(Instant::now() + Self::REST);
        s.misses = 0;
    }
}

/// What the link tells the agent's loop.
#[derive(Debug)]
pub enum Note {
    Command(Command),
    /// The job's freshest progress, as of when the reply arrived.
    JobProgress {
        at: Instant,
    },
    Unreachable {
        error: String,
    },
    Reachable {
        gap_s: f64,
        failed_requests: u64,
    },
    /// The node's relay did not answer: reports go straight to the
    /// coordinator for a while.
    RelayBypassed {
        url: String,
        error: String,
    },
}

/// The HTTP link.
#[derive(Clone)]
pub struct Link {
    http: reqwest::Client,
    target: Target,
    /// The address and token in use (re-read from the files after an error).
    cached: Arc<Mutex<Option<(String, String)>>>,
    period: Duration,
    via: Option<Arc<Via>>,
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(2))
        // Under the coordinator's keep-alive timeout (10 s), so that a
        // connection is never reused just as the coordinator closes it.
        .pool_idle_timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default()
}

/// A refusal, with the coordinator's one-line reason (a 400 says which
/// value was out of range).
async fn refused(url: &str, resp: reqwest::Response) -> String {
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    match body.lines().next().map(str::trim).filter(|l| !l.is_empty()) {
        Some(why) => format!(
            "{url}: HTTP {status}: {}",
            why.chars().take(200).collect::<String>()
        ),
        None => format!("{url}: HTTP {status}"),
    }
}

impl Link {
    pub fn new(target: Target, period: Duration) -> Link {
        Link {
            http: client(),
            target,
            cached: Arc::new(Mutex::new(None)),
            period,
            via: None,
        }
    }

    /// Reports and polls go through the node's relay while it answers.
    pub fn through(mut self, via: Via) -> Link {
        self.via = Some(Arc::new(via));
        self
    }

    /// The relay's address and the job's token, when a relay is in use.
    fn relay(&self) -> Option<(&Via, String, String)> {
        let via = self.via.as_deref()?;
        let url = via.url()?;
        let (_, token) = self.resolve()?;
        Some((via, url, token))
    }

    /// Send one report through the node's relay if there is one (straight
    /// to the coordinator if it fails, said in `notes`); the reply.
    async fn send_routed(
        &self,
        r: &Report,
        timeout: Duration,
        notes: &UnboundedSender<Note>,
    ) -> Result<Reply, String> {
        if let Some((via, url, token)) = self.relay() {
            match self.post(&url, &token, "/v1/report", r, timeout).await {
                Ok(reply) => return Ok(reply),
                Err(error) => {
                    via.failed();
                    let _ = notes.send(Note::RelayBypassed { url, error });
                }
            }
        }
        self.send(r, timeout).await
    }

    fn resolve(&self) -> Option<(String, String)> {
        let mut c = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if c.is_none() {
            *c = match &self.target {
                Target::Known { url, token } => Some((url.clone(), token.clone())),
                Target::Files(dir) => super::discover_files(dir),
            };
        }
        c.clone()
    }

    /// After an error: a coordinator found from files may have moved (a new
    /// attempt's rank 0 wrote new ones).
    fn forget(&self) {
        *self.cached.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Send one report now; the reply.
    pub async fn send(&self, r: &Report, timeout: Duration) -> Result<Reply, String> {
        let res = self.send_once(r, timeout).await;
        if res.is_err() {
            self.forget();
        }
        res
    }

    async fn send_once(&self, r: &Report, timeout: Duration) -> Result<Reply, String> {
        let (url, token) = self
            .resolve()
            .ok_or_else(|| "coordinator not found yet (no coordinator.json)".to_string())?;
        self.post(&url, &token, "/v1/report", r, timeout).await
    }

    /// A node relay's batch, straight to the coordinator.
    pub async fn send_batch(
        &self,
        b: &BatchReport,
        timeout: Duration,
    ) -> Result<BatchReply, String> {
        let res = match self.resolve() {
            Some((url, token)) => self.post(&url, &token, "/v1/reports", b, timeout).await,
            None => Err("coordinator not found yet (no coordinator.json)".to_string()),
        };
        if res.is_err() {
            self.forget();
        }
        res
    }

    /// The job's token, once the coordinator is known (a relay asks its
    /// node's agents for it).
    pub fn token(&self) -> Option<String> {
        self.resolve().map(|(_, t)| t)
    }

    async fn post<B: serde::Serialize, R: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        token: &str,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<R, String> {
        let body = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        let resp = self
            .http
            .post(format!("{url}{path}"))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if !resp.status().is_success() {
            return Err(refused(url, resp).await);
        }
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    }

    async fn poll(&self, rank: u32, attempt: u32, after: u64) -> Result<Vec<Command>, String> {
        let query = format!("rank={rank}&attempt={attempt}&after={after}");
        if let Some((via, url, token)) = self.relay() {
            match self.get_commands(&url, &token, &query).await {
                Ok(c) => return Ok(c),
                Err(_) => via.failed(),
            }
        }
        self.poll_query(&query).await
    }

    /// A node relay's long poll for the commands of its ranks (ascending).
    pub async fn poll_ranks(
        &self,
        ranks: &[u32],
        attempt: u32,
        after: u64,
    ) -> Result<Vec<Command>, String> {
        let first = ranks.first().copied().unwrap_or(0);
        let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
        let res = self
            .poll_query(&format!(
                "rank={first}&attempt={attempt}&after={after}&ranks={}",
                list.join(",")
            ))
            .await;
        if res.is_err() {
            self.forget();
        }
        res
    }

    async fn poll_query(&self, query: &str) -> Result<Vec<Command>, String> {
        let (url, token) = self
            .resolve()
            .ok_or_else(|| "coordinator not found yet".to_string())?;
        self.get_commands(&url, &token, query).await
    }

    async fn get_commands(
        &self,
        url: &str,
        token: &str,
        query: &str,
    ) -> Result<Vec<Command>, String> {
        let resp = self
            .http
            .get(format!("{url}/v1/commands?{query}&wait_s=20"))
            .bearer_auth(token)
            .timeout(Duration::from_secs(25))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status()));
        }
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        let reply: Reply = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        Ok(reply.commands)
    }

    /// Start the reporter and the long poll on the current runtime.
    pub fn spawn(&self, outbox: Arc<Outbox>, notes: UnboundedSender<Note>) {
        let me = self.clone();
        let ob = outbox.clone();
        let tx = notes.clone();
        tokio::spawn(async move {
            let mut dice = Dice::new(me.period);
            let mut backoff = me.period.mul_f64(dice.roll().max(0.01));
            let mut down_since: Option<Instant> = None;
            // The gap is the time the coordinator heard nothing from this
            // rank: from the last report that got through (not from the
            // first failure, which a request's timeout delays by 2 s).
            let mut last_ok: Option<Instant> = None;
            let mut failed = 0u64;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = ob.urgent.notified(), if down_since.is_none() => {}
                }
                let r = ob.snapshot();
                let sent = Instant::now();
                match me.send_routed(&r, Duration::from_secs(2), &tx).await {
                    Ok(reply) => {
                        last_ok = Some(Instant::now());
                        if let Some(t) = down_since.take() {
                            let _ = tx.send(Note::Reachable {
                                gap_s: t.elapsed().as_secs_f64(),
                                failed_requests: failed,
                            });
                        }
                        failed = 0;
                        backoff = me.period;
                        if let Some(age) = reply
                            .job_progress_age_s
                            .filter(|a| a.is_finite() && *a >= 0.0)
                        {
                            let at = Instant::now()
                                .checked_sub(Duration::from_secs_f64(age.min(1e6)))
                                .unwrap_or_else(Instant::now);
                            let _ = tx.send(Note::JobProgress { at });
                        }
                        for c in reply.commands {
                            let _ = tx.send(Note::Command(c));
                        }
                    }
                    Err(e) => {
                        failed += 1;
                        if down_since.is_none() {
                            down_since = Some(last_ok.unwrap_or(sent));
                            let _ = tx.send(Note::Unreachable { error: e });
                        }
                        backoff = down_backoff(failed).mul_f64(0.5 + 0.5 * dice.roll());
                    }
                }
            }
        });
        let me = self.clone();
        tokio::spawn(async move {
            let mut dice = Dice::new(Duration::from_secs(1));
            let mut failed = 0u64;
            loop {
                let (rank, attempt, after) = {
                    let r = outbox.report.lock().unwrap_or_else(|e| e.into_inner());
                    (r.rank, r.attempt, r.commands_seen)
                };
                match me.poll(rank, attempt, after).await {
                    Ok(cmds) => {
                        failed = 0;
                        let mut last = after;
                        for c in cmds {
                            last = last.max(c.seq);
                            let _ = notes.send(Note::Command(c));
                        }
                        // Do not ask again for what was just delivered, even
                        // before the loop has marked it seen.
                        if last > after {
                            outbox.update(|r| r.commands_seen = r.commands_seen.max(last));
                        }
                    }
                    Err(_) => {
                        failed += 1;
                        let wait = down_backoff(failed).mul_f64(0.5 + 0.5 * dice.roll());
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        });
    }
}

/// The wait after `failed` failures in a row: 2 s, 4 s, ... up to 30 s
/// (before jitter).
fn down_backoff(failed: u64) -> Duration {
    Duration::from_secs(1 << failed.clamp(1, 5)).min(Duration::from_secs(30))
}

/// Uniform numbers in [0, 1) for the jitter: a xorshift seeded from the
/// process, the thread and the clock (nothing here needs to be secret).
struct Dice(u64);

impl Dice {
    fn new(salt: Duration) -> Dice {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(salt.as_nanos());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        Dice(h.finish() | 1)
    }

    fn roll(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_30_s_and_the_jitter_spreads_ranks() {
        let waits: Vec<u64> = (1..=7).map(|n| down_backoff(n).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 30, 30, 30]);
        // Two agents started at one moment draw different first waits, all
        // within the period, spread over it.
        let mut a = Dice::new(Duration::from_secs(1));
        let mut b = Dice::new(Duration::from_secs(1));
        let xs: Vec<f64> = (0..1000).map(|_| a.roll()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let low = xs.iter().filter(|x| **x < 0.5).count();
        assert!((400..600).contains(&low), "{low} of 1000 below one half");
        assert_ne!(a.roll(), b.roll());
    }
}
