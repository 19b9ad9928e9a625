//! A job's live view as its coordinator serves it (`GET /v1/status`),
//! asked with one raw HTTP/1.1 request: what any client would send.

use std::io::{Read, Write};

/// The steps of the ranks the coordinator at `url` sees running; empty when
/// it cannot be reached or refuses.
pub fn running_steps(url: &str, token: &str) -> Vec<u64> {
    let addr = url.trim_start_matches("http://");
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return Vec::new();
    };
    let _ = write!(
        s,
        "GET /v1/status HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    if text.split_whitespace().nth(1) != Some("200") {
        return Vec::new();
    }
    let json: serde_json::Value = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or_default();
    json.get("ranks")
        .and_then(|r| r.as_array())
        .map(|ranks| {
            ranks
                .iter()
                .filter(|r| r.get("state").and_then(|s| s.as_str()) == Some("running"))
                .filter_map(|r| r.get("step").and_then(|s| s.as_u64()))
                .collect()
        })
        .unwrap_or_default()
}
