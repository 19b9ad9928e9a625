//! The coordinator on a shared network (issue 13): a standalone coordinator
//! process (`resilio __coordinator`), strangers and token holders speaking
//! raw HTTP/1.1 over real sockets. Idle connections cannot keep others out,
//! a slow header is cut off, the token is checked before a body is read,
//! and values out of range get 400 with the view left as it was.

use crate::common::*;
use serde_json::{json, Value};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A coordinator for a job of `world` ranks, killed when dropped.
struct Coord {
    child: Child,
    addr: String,
    token: String,
    _state: tempfile::TempDir,
}

impl Coord {
    fn start(world: u32) -> Coord {
        let state = tempfile::tempdir().unwrap();
        let mut child = Command::new(bin())
            .args(["__coordinator", "--job-id", "hard", "--world-size"])
            .arg(world.to_string())
            .arg("--state-dir")
            .arg(state.path())
            .env("RESILIO_SYSTEM_CONFIG", "")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = Vec::new();
        let mut so = child.stdout.take().unwrap();
        let mut b = [0u8; 1];
        while so.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
            line.push(b[0]);
        }
        let url = String::from_utf8(line).unwrap();
        let (_, token) =
            resilio::coordinator::discover_files(&resilio::journal::job_dir(state.path(), "hard"))
                .expect("coordinator files");
        Coord {
            child,
            addr: url.trim().trim_start_matches("http://").to_string(),
            token,
            _state: state,
        }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).unwrap();
        // A bound, not a measurement: a test that would hang fails instead.
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        s
    }

    /// One request on a connection of its own; (status, body).
    fn http(&self, method: &str, path: &str, token: bool, body: &str) -> (u16, String) {
        let mut s = self.connect();
        let auth = if token {
            format!("Authorization: Bearer {}\r\n", self.token)
        } else {
            String::new()
        };
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
        (code, body)
    }

    fn status(&self) -> Value {
        let (code, body) = self.http("GET", "/v1/status", true, "");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    fn metric(&self, name: &str) -> f64 {
        let (code, body) = self.http("GET", "/metrics", true, "");
        assert_eq!(code, 200);
        body.lines()
            .find(|l| l.starts_with(&format!("resilio_{name}{{")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {body}"))
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Coord {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn report(rank: u32, step: u64) -> Value {
    serde_json::to_value(resilio::coordinator::protocol::Report {
        v: 1,
        rank,
        node: format!("n{rank}"),
        state: resilio::coordinator::protocol::RankState::Running,
        step: Some(step),
        progress_age_s: Some(0.0),
        intervals: (step, step as f64 * 0.5),
        phase: "train".into(),
        ..Default::default()
    })
    .unwrap()
}

/// Whether the server has closed `s` (without waiting).
fn closed(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let r = match s.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    s.set_nonblocking(false).unwrap();
    r
}

/// The ranks as (rank, step, state), the job's step and attempt.
fn view(st: &Value) -> Value {
    let ranks: Vec<Value> = st["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| json!([r["rank"], r["step"], r["state"], r["node"]]))
        .collect();
    json!({"ranks": ranks, "step": st["step"], "attempt": st["attempt"],
           "pending": st["pending_checkpoint"]})
}

#[test]
fn idle_connections_cannot_keep_status_out_and_the_excess_is_closed() {
    let c = Coord::start(2);
    for r in 0..2 {
        let (code, body) = c.http("POST", "/v1/report", true, &report(r, 10).to_string());
        assert_eq!(code, 200, "{body}");
    }
    // Far more idle connections than the limit (256 for a small job): none
    // sends a byte.
    let n = 700;
    let limit = resilio::coordinator::server::MIN_CONNECTIONS;
    let idle: Vec<TcpStream> = (0..n).map(|_| c.connect()).collect();
    // The excess is closed at once, not queued...
    assert!(
        wait_for(Duration::from_secs(10), || idle
            .iter()
            .filter(|s| closed(s))
            .count()
            >= n - limit),
        "{} of {n} closed",
        idle.iter().filter(|s| closed(s)).count()
    );
    // ...and status still answers, each time taking an idle one's place.
    for _ in 0..3 {
        let st = c.status();
        assert_eq!(st["ranks"].as_array().unwrap().len(), 2, "{st}");
    }
    let open = idle.iter().filter(|s| !closed(s)).count();
    assert!(open < limit, "{open} idle connections still open");
    assert!(c.metric("connections") <= limit as f64);
    assert!(c.metric("connections_shed_total") >= (n - limit) as f64);
    // A report goes through too.
    let (code, _) = c.http("POST", "/v1/report", true, &report(0, 11).to_string());
    assert_eq!(code, 200);
}

#[test]
fn a_slow_header_a_slow_body_and_an_idle_keep_alive_connection_are_cut_off() {
    let c = Coord::start(2);
    // A header sent a byte every 200 ms never ends; the server hangs up
    // (the header timeout is 10 s; the test gives it 20).
    let slow = {
        let addr = c.addr.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            let gone = wait_for(Duration::from_secs(20), || {
                std::thread::sleep(Duration::from_millis(200));
                s.write_all(b"a").is_err() || closed(&s)
            });
            assert!(gone, "a slow header kept its connection for 20 s");
        })
    };
    // A token holder whose body never comes: 408 once the body timeout passes.
    let slow_body = {
        let mut s = c.connect();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "POST /v1/report HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: 1000\r\n\r\n{{\"v\":",
            c.token
        )
        .unwrap();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = s.read_to_string(&mut text);
            assert!(text.starts_with("HTTP/1.1 408"), "{text:?}");
        })
    };
    // A keep-alive connection that made one request, then says nothing.
    let mut s = c.connect();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        c.token
    )
    .unwrap();
    let mut text = Vec::new();
    // Read the answer, then until the server closes (or the 20 s bound).
    let r = s.read_to_end(&mut text);
    assert!(r.is_ok(), "idle keep-alive connection not closed: {r:?}");
    assert!(String::from_utf8_lossy(&text).starts_with("HTTP/1.1 200"));
    slow.join().unwrap();
    slow_body.join().unwrap();
}

/// Headers only: what the server answers before any body byte is sent.
fn headers_only(c: &Coord, token: bool, length: usize) -> String {
    let mut s = c.connect();
    let auth = if token {
        format!("Authorization: Bearer {}\r\n", c.token)
    } else {
        String::new()
    };
    write!(
        s,
        "POST /v1/report HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            other => panic!("no answer before the body: {other:?}"),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[test]
fn a_stranger_is_refused_before_any_body_is_read() {
    let c = Coord::start(2);
    // 100 MB announced, none sent: refused at once for the token (not for
    // the size, which would be checked second)...
    assert!(headers_only(&c, false, 100 << 20).starts_with("HTTP/1.1 401"));
    // ...and under the size limit too: the server does not wait for it.
    assert!(headers_only(&c, false, 100_000).starts_with("HTTP/1.1 401"));
    // A token holder announcing too much is refused for the size, unread.
    assert!(headers_only(&c, true, 100 << 20).starts_with("HTTP/1.1 413"));
    assert_eq!(c.metric("unauthorized_requests_total"), 2.0);
    // Every route wants the token, unknown ones too.
    assert_eq!(c.http("GET", "/nothing", false, "").0, 401);
    assert_eq!(c.http("GET", "/v1/status", false, "").0, 401);
}

#[test]
fn values_out_of_range_get_400_and_the_view_is_unchanged() {
    let mut c = Coord::start(2);
    for (r, step) in [(0, 10), (1, 12)] {
        let (code, body) = c.http("POST", "/v1/report", true, &report(r, step).to_string());
        assert_eq!(code, 200, "{body}");
    }
    let before = view(&c.status());
    let with = |rank: u32, f: &dyn Fn(&mut Value)| {
        let mut v = report(rank, 11);
        f(&mut v);
        v.to_string()
    };
    let bad_reports = [
        with(2, &|_| {}),
        with(99, &|_| {}),
        with(u32::MAX, &|_| {}),
        with(0, &|v| v["attempt"] = json!(u32::MAX)),
        with(0, &|v| v["attempt"] = json!(1)),
        with(0, &|v| v["step"] = json!(u64::MAX)),
        with(0, &|v| v["step"] = json!(1u64 << 53)),
        with(0, &|v| v["checkpoints"] = json!([u64::MAX])),
        with(0, &|v| v["progress_age_s"] = json!(-1.0)),
        with(0, &|v| v["intervals"] = json!([3, -0.5])),
        with(0, &|v| v["compute"] = json!([3, -1e300])),
    ];
    let polls = [
        "/v1/commands?rank=0&attempt=0&after=0&wait_s=NaN",
        "/v1/commands?rank=0&attempt=0&after=0&wait_s=inf",
        "/v1/commands?rank=0&attempt=0&after=0&wait_s=-1",
        "/v1/commands?rank=2&attempt=0&after=0&wait_s=0",
        "/v1/commands?rank=0&attempt=4294967295&after=0&wait_s=0",
    ];
    let mut refused = 0;
    for body in &bad_reports {
        let (code, why) = c.http("POST", "/v1/report", true, body);
        assert_eq!(code, 400, "{body}: {why}");
        assert_eq!(why.lines().count(), 1, "one line: {why:?}");
        refused += 1;
    }
    for path in polls {
        let (code, why) = c.http("GET", path, true, "");
        assert_eq!(code, 400, "{path}: {why}");
        assert_eq!(why.lines().count(), 1, "one line: {why:?}");
        refused += 1;
    }
    let (code, why) = c.http(
        "POST",
        "/v1/checkpoint",
        true,
        &json!({"reason": "x\ncheckpoint id=9 step=1"}).to_string(),
    );
    assert_eq!(code, 400, "{why}");
    refused += 1;
    // Nothing moved, nothing broke.
    assert!(c.alive(), "the coordinator died");
    assert_eq!(view(&c.status()), before);
    assert_eq!(c.metric("rejected_requests_total"), refused as f64);
    assert_eq!(c.metric("reports_total"), 2.0);
    // The real ranks are heard as before; a long poll still answers.
    let (code, _) = c.http("POST", "/v1/report", true, &report(0, 11).to_string());
    assert_eq!(code, 200);
    assert_eq!(c.status()["ranks"][0]["step"], 11);
    let (code, body) = c.http(
        "GET",
        "/v1/commands?rank=1&attempt=0&after=0&wait_s=0",
        true,
        "",
    );
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"commands":[],"job_progress_age_s":null}"#)
    );
}

/// An agent whose report is refused is told why, keeps supervising its rank
/// alone (fail open), and its trainer finishes: here an agent of an attempt
/// the coordinator's host never started.
#[test]
fn an_agent_refused_for_a_value_says_why_and_its_rank_trains_on() {
    let c = Coord::start(2);
    let state = tempfile::tempdir().unwrap();
    let (out, _) = output_within(
        run_trainer(
            state.path(),
            "hard",
            &[],
            &["--steps", "10", "--interval", "0.05"],
        )
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("RESILIO_ATTEMPT", "5")
        .env("RESILIO_COORDINATOR", format!("http://{}", c.addr))
        .env("RESILIO_COORDINATOR_TOKEN", &c.token),
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let recs = records(state.path(), "hard");
    let down = kinds(&recs, "coordinator_unreachable");
    assert!(
        down.iter().any(|r| r
            .str("error")
            .is_some_and(|e| e.contains("HTTP 400") && e.contains("attempt 5 is not started"))),
        "{down:?}"
    );
    assert!(c.status()["ranks"].as_array().unwrap().is_empty());
}
