//! The datagram progress protocol (version 1) and its listener.
//!
//! One message per datagram, UTF-8 text, tokens separated by whitespace. A
//! token is `key=value` or a bare flag. Full description with examples:
//! `docs/progress-protocol.md`.

use super::{Kind, ProgressEvent, Sender, Source};
use std::path::Path;
use std::time::Instant;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest datagram read; longer ones are truncated and reported malformed.
pub const MAX_DATAGRAM: usize = 8 * 1024;

fn valid_phase(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Parse one datagram into what it says. Faults come back as `Malformed`
/// with a short fault name; valid parts of a message with a fault are dropped
/// whole, so a trainer never gets half of what it meant.
pub fn parse(datagram: &[u8]) -> Vec<Kind> {
    let malformed = |fault: &'static str| {
        let sample = String::from_utf8_lossy(&datagram[..datagram.len().min(120)]).into_owned();
        vec![Kind::Malformed { fault, sample }]
    };
    if datagram.len() > MAX_DATAGRAM {
        return malformed("too_long");
    }
    let Ok(text) = std::str::from_utf8(datagram) else {
        return malformed("not_utf8");
    };
    let mut step = None;
    let mut phase = None;
    let mut checkpoint_done = None::<Option<u64>>;
    let mut restored = None::<Option<u64>>;
    let mut metrics = Vec::new();
    let mut any = false;
    for token in text.split_ascii_whitespace() {
        any = true;
        let (key, value) = match token.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (token, None),
        };
        match (key, value) {
            ("v", Some(v)) => match v.parse::<u32>() {
                Ok(n) if n >= 1 => {}
                _ => return malformed("bad_version"),
            },
            ("step", Some(v)) => match v.parse::<u64>() {
                Ok(n) if n <= super::MAX_STEP => step = Some(n),
                _ => return malformed("bad_step"),
            },
            ("phase", Some(v)) => {
                if !valid_phase(v) {
                    return malformed("bad_phase");
                }
                phase = Some(v.to_ascii_lowercase());
            }
            ("checkpoint_done", None) => checkpoint_done = Some(None),
            ("checkpoint_done", Some(v)) => match v.parse::<u64>() {
                Ok(n) if n <= super::MAX_STEP => checkpoint_done = Some(Some(n)),
                _ => return malformed("bad_step"),
            },
            ("restored", None) => restored = Some(None),
            ("restored", Some(v)) => match v.parse::<u64>() {
                Ok(n) if n <= super::MAX_STEP => restored = Some(Some(n)),
                _ => return malformed("bad_step"),
            },
            (_, None) => return malformed("bad_token"),
            (k, Some(v)) => {
                if k.is_empty() {
                    return malformed("bad_token");
                }
                // Unknown keys with numbers are metrics; others are ignored
                // (forward compatible with later protocol versions).
                if let Ok(x) = v.parse::<f64>() {
                    if x.is_finite() {
                        metrics.push((k.to_string(), x));
                    }
                }
            }
        }
    }
    if !any {
        return malformed("empty");
    }
    // Order: the step first, then the phase it enters (`phase=checkpoint
    // step=120` is "at step 120, checkpointing"), then a checkpoint's end.
    let mut out = Vec::new();
    if let Some(loaded) = restored {
        // `restored=20` (or `restored step=20`): the trainer loaded the
        // checkpoint of step 20 (before its first step; what it says later
        // is not kept).
        let line = text.trim().chars().take(200).collect();
        out.push(Kind::CheckpointLoaded {
            line,
            step: loaded.or(step),
        });
    }
    if checkpoint_done.is_none() && restored.is_none() && step.is_some() {
        out.push(Kind::Step {
            step,
            metrics,
            with_phase: phase.clone(),
        });
    }
    if let Some(p) = phase {
        out.push(Kind::Phase { name: p, step });
    }
    if let Some(ck) = checkpoint_done {
        // `checkpoint_done step=120`: the step names the checkpoint.
        out.push(Kind::CheckpointDone { step: ck.or(step) });
    }
    out
}

/// Bind the socket at `path` (mode 0600).
pub fn bind(path: &Path) -> std::io::Result<std::os::unix::net::UnixDatagram> {
    let _ = std::fs::remove_file(path);
    let sock = std::os::unix::net::UnixDatagram::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(sock)
}

/// Receive datagrams on a thread of their own until the queue is closed
/// (the agent then sends an empty datagram to wake it). A failing socket is
/// reported once as `SourceFailed`, never to the trainer.
pub fn spawn_listener(
    sock: std::os::unix::net::UnixDatagram,
    tx: Sender,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("progress-socket".into())
        .spawn(move || {
            let mut buf = vec![0u8; MAX_DATAGRAM + 1];
            loop {
                match sock.recv(&mut buf) {
                    Ok(n) => {
                        if tx.is_closed() {
                            return;
                        }
                        let at = Instant::now();
                        for kind in parse(&buf[..n]) {
                            tx.send(ProgressEvent {
                                at,
                                source: Source::Socket,
                                kind,
                            });
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tx.send(ProgressEvent {
                            at: Instant::now(),
                            source: Source::Socket,
                            kind: Kind::SourceFailed(format!("progress socket: {e}")),
                        });
                        return;
                    }
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(n: u64, metrics: &[(&str, f64)]) -> Kind {
        Kind::Step {
            step: Some(n),
            metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            with_phase: None,
        }
    }

    #[test]
    fn documented_messages() {
        assert_eq!(
            parse(b"step=120 loss=2.31 compute_s=0.41"),
            vec![step(120, &[("loss", 2.31), ("compute_s", 0.41)])]
        );
        assert_eq!(
            parse(b"phase=checkpoint"),
            vec![Kind::Phase {
                name: "checkpoint".into(),
                step: None
            }]
        );
        assert_eq!(
            parse(b"checkpoint_done step=120"),
            vec![Kind::CheckpointDone { step: Some(120) }]
        );
        assert_eq!(
            parse(b"v=1 phase=train step=121\n"),
            vec![
                Kind::Step {
                    step: Some(121),
                    metrics: vec![],
                    with_phase: Some("train".into())
                },
                Kind::Phase {
                    name: "train".into(),
                    step: Some(121)
                }
            ]
        );
        assert_eq!(
            parse(b"checkpoint_done"),
            vec![Kind::CheckpointDone { step: None }]
        );
        // Unknown keys are ignored, numeric ones kept as metrics.
        assert_eq!(
            parse(b"step=5 note=hello lr=1e-4"),
            vec![step(5, &[("lr", 1e-4)])]
        );
        // Metrics alone say nothing to the stall detector.
        assert!(parse(b"loss=2.0").is_empty());
        // A checkpoint loaded: its step, never a step trained.
        for m in [&b"restored=40"[..], b"restored step=40"] {
            assert_eq!(
                parse(m),
                vec![Kind::CheckpointLoaded {
                    line: String::from_utf8(m.to_vec()).unwrap(),
                    step: Some(40)
                }]
            );
        }
        assert_eq!(
            parse(b"restored"),
            vec![Kind::CheckpointLoaded {
                line: "restored".into(),
                step: None
            }]
        );
        assert_eq!(fault_of(b"restored=x"), "bad_step");
    }

    fn fault_of(m: &[u8]) -> &'static str {
        match parse(m).as_slice() {
            [Kind::Malformed { fault, .. }] => fault,
            other => panic!("expected malformed, got {other:?}"),
        }
    }

    #[test]
    fn malformed_messages_name_their_fault() {
        let fault = |m: &[u8]| match parse(m).as_slice() {
            [Kind::Malformed { fault, .. }] => *fault,
            other => panic!("expected malformed, got {other:?}"),
        };
        assert_eq!(fault(b""), "empty");
        assert_eq!(fault(b"   \n"), "empty");
        assert_eq!(fault(b"step=abc"), "bad_step");
        assert_eq!(fault(b"step=-1"), "bad_step");
        assert_eq!(fault(b"step=9007199254740992"), "bad_step");
        assert_eq!(
            fault(b"checkpoint_done step=18446744073709551615"),
            "bad_step"
        );
        assert_eq!(fault(b"hello"), "bad_token");
        assert_eq!(fault(b"=3"), "bad_token");
        assert_eq!(fault(b"phase=a/b"), "bad_phase");
        assert_eq!(fault(b"v=zero step=1"), "bad_version");
        assert_eq!(fault(&[0xff, 0xfe]), "not_utf8");
        assert_eq!(fault(&vec![b'a'; MAX_DATAGRAM + 1]), "too_long");
    }
}
