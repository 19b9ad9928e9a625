//! Heartbeat fan-in: a load generator simulating many agents, each reporting
//! once a second, against one coordinator process on loopback
//! (`cargo bench --bench fanin`; BENCH_AGENTS=16384 BENCH_SECS=20
//! BENCH_CONNS=4096 by default).
//!
//! The coordinator is the real one (`resilio __coordinator`, a process of its
//! own so that its CPU time is its own). The generator sends the agents'
//! real report bodies over HTTP/1.1 keep-alive connections (BENCH_CONNS of
//! them, each carrying its share of the agents in turn: one per agent would
//! need more file descriptors than this machine allows two processes), with
//! a minimal hand-written client so that the generator, which shares the
//! machine's two cores, costs less than the server it measures. Prints offered
//! and achieved reports per second, latency percentiles, and the
//! coordinator's CPU use as a share of one core (goal: sustained on one
//! core, p99 < 50 ms).
//!
//! BENCH_HANG=1 hangs one rank a third of the way into the measured window:
//! every rank's step stands still from then (the others wait on it in the
//! collective), the hung rank's agent reports it stalled BENCH_STALL_S
//! later (default 10, the stall limit), at once in a report of its own as
//! real agents do, every rank (the hung one too, with the look it stalled
//! on) answers the probe the coordinator sends it (the others waiting on a
//! peer) as real agents do: half a second (a probe's least
//! time) after the reply that asked, in a report of their own naming the
//! ask's seq, and in every report after (a sender's next regular report
//! then comes a period after its urgent one, as a relay's next batch
//! does); the bench prints the time from the hang and from the stalled
//! report to the teardown (the first stop in a reply), when the probe's
//! asks reached the senders and their answers were answered, and the rank
//! the coordinator's verdict blamed.
//!
//! BENCH_POLL=1 (the default with BENCH_HANG=1) gives every sender the
//! long poll real agents and relays hold (`GET /v1/commands`, one
//! connection each), so that a probe or a stop reaches it at once rather
//! than in its next report's reply; a probe's answer then goes on the
//! poll's connection. The report connections default to 2,048 then, so
//! that both fit under this machine's 20,000 file descriptors a process
//! at 16,384 senders.
//!
//! BENCH_PER_NODE=8 simulates node relays (`[coordinator] node_relay`):
//! BENCH_AGENTS ranks on BENCH_AGENTS/8 nodes, each node sending one batch
//! of its 8 ranks' reports a second (`POST /v1/reports`) instead of 8
//! reports.
//!
//! BENCH_STORM=1 starts every agent at once (a job's start, or its relaunch
//! after a failure), not spread over the first second, and prints the time
//! from the first report sent to the last agent's first report answered.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_num(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line (11, 12 after the state).
    f.get(11).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)
}

/// One request on a keep-alive HTTP/1.1 connection: whether it was answered
/// 200, and the reply's body.
async fn post(
    stream: &mut tokio::io::BufStream<tokio::net::TcpStream>,
    req: &str,
) -> std::io::Result<(bool, Vec<u8>)> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    stream.write_all(req.as_bytes()).await?;
    stream.flush().await?;
    let mut line = String::new();
    stream.read_line(&mut line).await?;
    let ok = line.split_whitespace().nth(1) == Some("200");
    let mut len = 0usize;
    loop {
        line.clear();
        stream.read_line(&mut line).await?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut b = vec![0u8; len];
    stream.read_exact(&mut b).await?;
    Ok((ok, b))
}

/// The seq of the probe (`diagnose`) a reply asks for, if it asks for one.
fn probe_asked(reply: &[u8]) -> Option<u64> {
    let has = |w: &[u8]| reply.windows(w.len()).any(|x| x == w);
    if !has(br#""kind":"diagnose""#) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(reply).ok()?;
    v["commands"]
        .as_array()?
        .iter()
        .filter(|c| c["kind"] == "diagnose")
        .filter_map(|c| c["seq"].as_u64())
        .max()
}

fn has_stop(reply: &[u8]) -> bool {
    let w = br#""kind":"stop""#;
    reply.windows(w.len()).any(|x| x == w)
}

/// The injected hang (BENCH_HANG=1).
#[derive(Clone, Copy)]
struct Hang {
    rank: u32,
    at: Instant,
    stall: Duration,
}

/// What every simulated agent shares: the job, the injected hang, and
/// where to note the stalled report and the teardown.
struct Sim {
    agents: u32,
    per_node: u32,
    start: Instant,
    hang: Option<Hang>,
    /// The request's headers but the connection's and the length.
    header: String,
    stalled_sent: Arc<std::sync::OnceLock<Instant>>,
    stop_seen: Arc<std::sync::OnceLock<Instant>>,
    /// Per sender: the newest probe it was asked for, and the newest whose
    /// answer is out (its reports name it from then on); 0 for none.
    asked: Vec<AtomicU64>,
    answered: Vec<AtomicU64>,
    /// Per sender: when it last sent an urgent report, in microseconds
    /// from the start (0 for never). A relay's next batch is a period
    /// after its last one, urgent or not: the report due within a second
    /// after an urgent one is not sent.
    urgent_at: Vec<AtomicU64>,
    /// When the probe's asks reached the senders, and when their answers
    /// were answered: (first, last) of each.
    asks: std::sync::Mutex<Option<(Instant, Instant)>>,
    answers: std::sync::Mutex<Option<(Instant, Instant)>>,
}

/// Note `t` in a (first, last) span.
fn span(s: &std::sync::Mutex<Option<(Instant, Instant)>>, t: Instant) {
    let mut s = s.lock().unwrap();
    *s = Some(s.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
}

impl Sim {
    /// The request of `sender` (a rank, or a node's relay) due at `due`:
    /// its ranks' reports, their probe answering the ask `answered`.
    fn request(
        &self,
        sender: u32,
        due: Instant,
        round: u64,
        answered: Option<u64>,
        conn: &str,
    ) -> String {
        let per_node = self.per_node;
        let mut bodies = Vec::with_capacity(per_node as usize);
        let first = sender * per_node;
        for rank in first..(first + per_node).min(self.agents) {
            let mut step = 10 * (round + 1);
            let mut age = 0.05;
            let mut state = "running";
            let mut probe = r#""waiting_on_peer":null,"probed":false"#.to_string();
            if let Some(h) = self.hang.filter(|h| due >= h.at) {
                // Every rank's step stands where the hang began.
                step = 10 * (h.at.duration_since(self.start).as_secs() + 1);
                // As an agent says it: its progress's age when it sends
                // (a connection behind its schedule sends late).
                age = Instant::now().saturating_duration_since(h.at).as_secs_f64();
                if rank == h.rank && due >= h.at + h.stall {
                    state = "stalled";
                    // Asked too, it answers with the same look.
                    let seq = answered.unwrap_or(0);
                    probe = format!(
                        r#""waiting_on_peer":false,"not_waiting_shown":true,"probed":true,"probe_seq":{seq}"#
                    );
                    let _ = self.stalled_sent.set(Instant::now());
                } else if let Some(seq) = answered {
                    probe = format!(r#""waiting_on_peer":true,"probed":true,"probe_seq":{seq}"#);
                }
            }
            bodies.push(format!(
                r#"{{"v":1,"rank":{rank},"node":"node{:04}","attempt":0,"pid":{},"state":"{state}","step":{step},"progress_age_s":{age},"intervals":[{step},{}],"compute":[{step},{}],"phase":"train","checkpoints":[],"exit":null,{probe},"probe":null,"commands_seen":0}}"#,
                rank / 8,
                1000 + rank,
                step as f64 * 0.1,
                step as f64 * 0.08
            ));
        }
        let (path, body) = if per_node == 1 {
            ("/v1/report", bodies.pop().unwrap_or_default())
        } else {
            (
                "/v1/reports",
                format!(
                    r#"{{"v":1,"node":"node{sender:04}","reports":[{}]}}"#,
                    bodies.join(",")
                ),
            )
        };
        format!(
            "POST {path} HTTP/1.1\r\n{}\r\nConnection: {conn}\r\nContent-Length: {}\r\n\r\n{body}",
            self.header,
            body.len()
        )
    }

    /// Note a teardown in a reply.
    fn heard(&self, reply: &[u8]) {
        if self.hang.is_some() && has_stop(reply) {
            let _ = self.stop_seen.set(Instant::now());
        }
    }

    /// Whether `reply` asks `sender` for a probe it was not asked for
    /// before: the ask's seq, now noted as asked.
    fn new_ask(&self, sender: u32, reply: &[u8]) -> Option<u64> {
        let seq = self.hang.and_then(|_| probe_asked(reply))?;
        let new = self.asked[sender as usize].fetch_max(seq, Relaxed) < seq;
        if new {
            span(&self.asks, Instant::now());
        }
        new.then_some(seq)
    }

    /// A sender's urgent report with its probe's answer (`seq`; none for
    /// the hung rank's stalled report), at `at`: on `stream` (the long
    /// poll's connection), or on a connection of its own.
    async fn urgent(
        &self,
        addr: &str,
        stream: Option<&mut tokio::io::BufStream<tokio::net::TcpStream>>,
        sender: u32,
        seq: Option<u64>,
        at: Instant,
    ) {
        tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
        if let Some(seq) = seq {
            self.answered[sender as usize].fetch_max(seq, Relaxed);
        }
        let answered = Some(self.answered[sender as usize].load(Relaxed)).filter(|s| *s > 0);
        let from_start = at.saturating_duration_since(self.start).as_micros() as u64;
        self.urgent_at[sender as usize].store(from_start.max(1), Relaxed);
        let conn = if stream.is_some() {
            "keep-alive"
        } else {
            "close"
        };
        let req = self.request(sender, at, 0, answered, conn);
        let reply = match stream {
            Some(s) => post(s, &req).await,
            None => match tokio::net::TcpStream::connect(addr).await {
                Ok(s) => post(&mut tokio::io::BufStream::new(s), &req).await,
                Err(e) => Err(e),
            },
        };
        if let Ok((_, reply)) = reply {
            if seq.is_some() {
                span(&self.answers, Instant::now());
            }
            self.heard(&reply);
        }
    }

    /// The long poll of `sender` (its ranks' commands), held until `end`;
    /// a probe it brings is answered half a second later on its connection.
    async fn hold_poll(self: Arc<Sim>, addr: String, sender: u32, from: Instant, end: Instant) {
        tokio::time::sleep_until(tokio::time::Instant::from_std(from)).await;
        let first = sender * self.per_node;
        let ranks: Vec<String> = (first..(first + self.per_node).min(self.agents))
            .map(|r| r.to_string())
            .collect();
        let mut after = 0u64;
        let mut stream: Option<tokio::io::BufStream<tokio::net::TcpStream>> = None;
        while Instant::now() < end {
            let req = format!(
                "GET /v1/commands?rank={first}&attempt=0&after={after}&wait_s=30&ranks={} HTTP/1.1\r\n{}\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
                ranks.join(","),
                self.header
            );
            let res = async {
                if stream.is_none() {
                    stream = Some(tokio::io::BufStream::new(
                        tokio::net::TcpStream::connect(&addr).await?,
                    ));
                }
                post(stream.as_mut().unwrap(), &req).await
            }
            .await;
            let reply = match res {
                Ok((true, reply)) => reply,
                _ => {
                    stream = None;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            self.heard(&reply);
            after = after.max(newest_seq(&reply));
            if let Some(seq) = self.new_ask(sender, &reply) {
                // The probe takes half a second, then the agents report at
                // once, and the relay sends their batch.
                let at = Instant::now() + Duration::from_millis(500);
                self.urgent(&addr, stream.as_mut(), sender, Some(seq), at)
                    .await;
            }
        }
    }
}

/// The newest seq of the commands a reply carries (0 for none).
fn newest_seq(reply: &[u8]) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(reply).unwrap_or_default();
    v["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["seq"].as_u64())
        .max()
        .unwrap_or(0)
}

fn main() {
    let agents = env_num("BENCH_AGENTS", 16384) as u32;
    let secs = env_num("BENCH_SECS", 20);
    let per_node = env_num("BENCH_PER_NODE", 1).clamp(1, 64) as u32;
    // Who reports: each rank, or each node's relay for its ranks.
    let senders = agents.div_ceil(per_node);
    let hanging = env_num("BENCH_HANG", 0) == 1;
    let polls = env_num("BENCH_POLL", u64::from(hanging)) == 1;
    let conns =
        env_num("BENCH_CONNS", if polls { 2048 } else { 4096 }).clamp(1, senders as u64) as usize;
    let state = tempfile::tempdir().unwrap();
    let mut coord = Command::new(env!("CARGO_BIN_EXE_resilio"))
        .args(["__coordinator", "--job-id", "fanin", "--world-size"])
        .arg(agents.to_string())
        .arg("--state-dir")
        .arg(state.path())
        .env("RESILIO_SYSTEM_CONFIG", "")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the coordinator");
    let mut line = String::new();
    BufReader::new(coord.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().to_string();
    let dir = state.path().join("jobs/fanin");
    let token = std::fs::read_to_string(dir.join("coordinator.token"))
        .unwrap()
        .trim()
        .to_string();
    let pid = coord.id();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let lat = Arc::new(std::sync::Mutex::new(Vec::<f32>::new()));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let warmup = Duration::from_secs(5);
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + Duration::from_secs(secs);
    // The hang: which rank, when its progress stops, when its agent says so.
    let hang = hanging.then(|| Hang {
        rank: agents / 2,
        at: measure_from + Duration::from_secs(secs) / 3,
        stall: Duration::from_secs(env_num("BENCH_STALL_S", 10)),
    });
    let storm = env_num("BENCH_STORM", 0) == 1;
    let registered = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let last_registered = Arc::new(std::sync::Mutex::new(start));
    let stalled_sent = Arc::new(std::sync::OnceLock::<Instant>::new());
    let stop_seen = Arc::new(std::sync::OnceLock::<Instant>::new());
    let addr = url.trim_start_matches("http://").to_string();
    rt.block_on(async {
        let mut tasks = Vec::new();
        let sim = Arc::new(Sim {
            agents,
            per_node,
            start,
            hang,
            header: format!(
                "Host: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json"
            ),
            stalled_sent: stalled_sent.clone(),
            stop_seen: stop_seen.clone(),
            asked: (0..senders).map(|_| AtomicU64::new(0)).collect(),
            answered: (0..senders).map(|_| AtomicU64::new(0)).collect(),
            urgent_at: (0..senders).map(|_| AtomicU64::new(0)).collect(),
            asks: Default::default(),
            answers: Default::default(),
        });
        // Each sender's long poll, opened over the first two seconds.
        let mut poll_tasks = Vec::new();
        if polls {
            for sender in 0..senders {
                let from = start + Duration::from_micros(sender as u64 * 2_000_000 / senders as u64);
                poll_tasks.push(tokio::spawn(sim.clone().hold_poll(addr.clone(), sender, from, end)));
            }
        }
        // The hung rank's agent reports its stall at once.
        if let Some(h) = hang {
            let (sim, addr) = (sim.clone(), addr.clone());
            tokio::spawn(async move {
                sim.urgent(&addr, None, h.rank / per_node, None, h.at + h.stall).await;
            });
        }
        // One task per connection; its agents report in turn, each once a
        // second, spread over the second. A minimal HTTP/1.1 client (the
        // agents' reqwest would cost the generator more than the server).
        for c in 0..conns {
            let lat = lat.clone();
            let errors = errors.clone();
            let addr = addr.clone();
            let sim = sim.clone();
            let (registered, last_registered) = (registered.clone(), last_registered.clone());
            tasks.push(tokio::spawn(async move {
                let ranks: Vec<u32> = (c as u32..senders).step_by(conns).collect();
                let mut stream: Option<tokio::io::BufStream<tokio::net::TcpStream>> = None;
                let mut round = 0u64;
                'outer: loop {
                    for (k, sender) in ranks.iter().enumerate() {
                        let spread = Duration::from_micros(
                            (*sender as u64 * 1_000_000 / senders as u64 + k as u64) % 1_000_000,
                        );
                        let due = if storm && round == 0 {
                            start
                        } else {
                            start + Duration::from_secs(round) + spread
                        };
                        if due >= end {
                            break 'outer;
                        }
                        tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
                        let urgent = sim.urgent_at[*sender as usize].load(Relaxed);
                        if urgent > 0 && due < sim.start + Duration::from_micros(urgent) + Duration::from_secs(1) {
                            continue;
                        }
                        let answered = Some(sim.answered[*sender as usize].load(Relaxed)).filter(|s| *s > 0);
                        let req = sim.request(*sender, due, round, answered, "keep-alive");
                        let t = Instant::now();
                        let res: std::io::Result<(bool, Vec<u8>)> = async {
                            if stream.is_none() {
                                stream = Some(tokio::io::BufStream::new(
                                    tokio::net::TcpStream::connect(&addr).await?,
                                ));
                            }
                            post(stream.as_mut().unwrap(), &req).await
                        }
                        .await;
                        let ok = matches!(res, Ok((true, _)));
                        if let Ok((_, reply)) = &res {
                            sim.heard(reply);
                            if let Some(seq) = sim.new_ask(*sender, reply) {
                                // The probe takes half a second, then the
                                // agent reports at once (an urgent report).
                                let at = Instant::now() + Duration::from_millis(500);
                                let (sim, addr, sender) = (sim.clone(), addr.clone(), *sender);
                                tokio::spawn(async move {
                                    sim.urgent(&addr, None, sender, Some(seq), at).await
                                });
                            }
                        }
                        if !ok {
                            stream = None;
                        }
                        if ok && round == 0 {
                            registered.fetch_add(u64::from(per_node), std::sync::atomic::Ordering::Relaxed);
                            let mut l = last_registered.lock().unwrap();
                            *l = (*l).max(Instant::now());
                        }
                        if t >= measure_from {
                            if ok {
                                lat.lock().unwrap().push(t.elapsed().as_secs_f32());
                            } else {
                                errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    }
                    round += 1;
                }
            }));
        }
        // CPU of the coordinator over the measured window only.
        tokio::time::sleep_until(tokio::time::Instant::from_std(measure_from)).await;
        let c0 = cpu_ticks(pid);
        let t0 = Instant::now();
        tokio::time::sleep_until(tokio::time::Instant::from_std(end)).await;
        let c1 = cpu_ticks(pid);
        let wall = t0.elapsed().as_secs_f64();
        for t in tasks {
            let _ = t.await;
        }
        for t in poll_tasks {
            t.abort();
        }
        let hz = 100.0; // USER_HZ on Linux
        let cpu = (c1 - c0) as f64 / hz / wall;
        let mut l = lat.lock().unwrap().clone();
        l.sort_by(f32::total_cmp);
        let pct = |p: f64| {
            if l.is_empty() {
                f32::NAN
            } else {
                l[((l.len() - 1) as f64 * p) as usize] * 1000.0
            }
        };
        let errs = errors.load(std::sync::atomic::Ordering::Relaxed);
        if per_node == 1 {
            println!("heartbeat fan-in: {agents} simulated agents at 1 Hz over {conns} keep-alive connections, {secs} s measured after {} s warm-up", warmup.as_secs());
        } else {
            println!("heartbeat fan-in: {agents} simulated ranks on {senders} nodes of {per_node}, each node's relay sending one batch a second, over {conns} keep-alive connections, {secs} s measured after {} s warm-up", warmup.as_secs());
        }
        if polls {
            println!("  and {senders} long polls for commands, one connection each");
        }
        println!("  offered   {:>9.0} reports/s in {senders} requests/s", agents as f64);
        println!("  achieved  {:>9.0} reports/s  ({} errors or timeouts)", l.len() as f64 * per_node as f64 / wall, errs);
        println!("  latency   p50 {:.1} ms   p99 {:.1} ms   max {:.1} ms", pct(0.5), pct(0.99), pct(1.0));
        println!("  coordinator CPU {:.1}% of one core (the load generator shares this 2-core machine)", cpu * 100.0);
        let joined = registered.load(std::sync::atomic::Ordering::Relaxed);
        let took = last_registered.lock().unwrap().saturating_duration_since(start);
        println!(
            "  start{}: {joined} of {agents} agents registered in their first second's report, the last {:.2} s after the start",
            if storm { " (storm: every agent at once)" } else { " (spread over a second)" },
            took.as_secs_f64()
        );
        if let Some(h) = hang {
            match (stalled_sent.get(), stop_seen.get()) {
                (Some(s), Some(t)) => println!(
                    "  hang on rank {}: stalled report to teardown {:.2} s (hang to teardown {:.2} s with a stall limit of {} s)",
                    h.rank,
                    t.saturating_duration_since(*s).as_secs_f64(),
                    t.saturating_duration_since(h.at).as_secs_f64(),
                    h.stall.as_secs()
                ),
                (Some(_), None) => println!("  hang on rank {}: no teardown before the end", h.rank),
                _ => println!("  hang on rank {}: the stall was never reported (window too short)", h.rank),
            }
            let since = |t: Instant| t.saturating_duration_since(*stalled_sent.get().unwrap_or(&t)).as_secs_f64();
            if let (Some((a0, a1)), Some((b0, b1))) = (*sim.asks.lock().unwrap(), *sim.answers.lock().unwrap()) {
                println!(
                    "  after the stalled report: the probe's asks reached the senders {:.2}-{:.2} s, their answers were answered {:.2}-{:.2} s",
                    since(a0), since(a1), since(b0), since(b1)
                );
            }
            let journal = std::fs::read_to_string(dir.join("coordinator.jsonl")).unwrap_or_default();
            for line in journal.lines().filter(|l| l.contains(r#""kind":"hang""#)) {
                let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
                println!(
                    "  verdict: blamed {} ({})",
                    v.pointer("/verdict/blamed_ranks").or(v.get("blamed_ranks")).map_or("?".into(), |b| b.to_string()),
                    v.get("reason").or(v.pointer("/verdict/reason")).and_then(|r| r.as_str()).unwrap_or("?")
                );
            }
        }
    });
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = coord.wait();
}
