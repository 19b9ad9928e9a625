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
//! later (default 10, the stall limit), the others answer the probe the
//! coordinator sends them (waiting on a peer) as real agents do: half a
//! second (a probe's least time) after the reply that asked, in a report
//! of their own naming the ask's seq, and in every report after; the bench
//! prints the time from the stalled report to the teardown (the first stop
//! in a reply) and the rank the coordinator's verdict blamed.
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
                age = due.duration_since(h.at).as_secs_f64();
                if rank == h.rank && due >= h.at + h.stall {
                    state = "stalled";
                    probe =
                        r#""waiting_on_peer":false,"not_waiting_shown":true,"probed":true"#.into();
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

    /// A sender's urgent report with its probe's answer, at `at`, on a
    /// connection of its own.
    async fn answer(self: Arc<Sim>, addr: String, sender: u32, round: u64, seq: u64, at: Instant) {
        tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
        let req = self.request(sender, at, round, Some(seq), "close");
        if let Ok(s) = tokio::net::TcpStream::connect(&addr).await {
            if let Ok((_, reply)) = post(&mut tokio::io::BufStream::new(s), &req).await {
                self.heard(&reply);
            }
        }
    }
}

fn main() {
    let agents = env_num("BENCH_AGENTS", 16384) as u32;
    let secs = env_num("BENCH_SECS", 20);
    let per_node = env_num("BENCH_PER_NODE", 1).clamp(1, 64) as u32;
    // Who reports: each rank, or each node's relay for its ranks.
    let senders = agents.div_ceil(per_node);
    let conns = env_num("BENCH_CONNS", 4096).clamp(1, senders as u64) as usize;
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
    let hang = (env_num("BENCH_HANG", 0) == 1).then(|| Hang {
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
        });
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
                // The probe each sender was asked for, and when its answer
                // is out (its ranks say so in every report from then on).
                let mut asked: Vec<Option<(u64, Instant)>> = vec![None; ranks.len()];
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
                        let answered = asked[k].filter(|(_, at)| *at <= due).map(|(seq, _)| seq);
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
                            let seq = sim.hang.and_then(|_| probe_asked(reply));
                            if let Some(seq) = seq.filter(|s| asked[k].is_none_or(|(a, _)| a < *s)) {
                                // The probe takes half a second, then the
                                // agent reports at once (an urgent report).
                                let at = Instant::now() + Duration::from_millis(500);
                                asked[k] = Some((seq, at));
                                tokio::spawn(sim.clone().answer(addr.clone(), *sender, round, seq, at));
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
                    "  hang on rank {}: stalled report to teardown {:.2} s (hang to verdict {:.2} s with a stall limit of {} s)",
                    h.rank,
                    t.saturating_duration_since(*s).as_secs_f64(),
                    t.saturating_duration_since(h.at).as_secs_f64(),
                    h.stall.as_secs()
                ),
                (Some(_), None) => println!("  hang on rank {}: no teardown before the end", h.rank),
                _ => println!("  hang on rank {}: the stall was never reported (window too short)", h.rank),
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
