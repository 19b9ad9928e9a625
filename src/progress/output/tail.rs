//! The tail of the trainer's output, kept for diagnostics: a bounded ring.

use std::sync::{Arc, Mutex};

/// The last bytes of the trainer's output (both streams, interleaved as read):
/// a fixed ring filled with plain copies.
#[derive(Debug)]
pub struct Tail {
    ring: Mutex<Ring>,
}

#[derive(Debug)]
struct Ring {
    buf: Vec<u8>,
    /// Next write position.
    pos: usize,
    /// Bytes held (at most `buf.len()`).
    len: usize,
}

impl Tail {
    /// A tail keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Tail {
            ring: Mutex::new(Ring {
                buf: vec![0; cap.max(1)],
                pos: 0,
                len: 0,
            }),
        })
    }

    /// Append bytes, dropping the oldest beyond the cap.
    pub fn push(&self, bytes: &[u8]) {
        let Ok(mut r) = self.ring.lock() else { return };
        let cap = r.buf.len();
        let bytes = &bytes[bytes.len().saturating_sub(cap)..];
        let first = bytes.len().min(cap - r.pos);
        let pos = r.pos;
        r.buf[pos..pos + first].copy_from_slice(&bytes[..first]);
        let rest = bytes.len() - first;
        r.buf[..rest].copy_from_slice(&bytes[first..]);
        r.pos = (pos + bytes.len()) % cap;
        r.len = (r.len + bytes.len()).min(cap);
    }

    /// The last `n` lines as (lossy) text.
    pub fn last_lines(&self, n: usize) -> Vec<String> {
        let Ok(r) = self.ring.lock() else {
            return Vec::new();
        };
        let cap = r.buf.len();
        let start = (r.pos + cap - r.len) % cap;
        let mut bytes = Vec::with_capacity(r.len);
        if start + r.len <= cap {
            bytes.extend_from_slice(&r.buf[start..start + r.len]);
        } else {
            bytes.extend_from_slice(&r.buf[start..]);
            bytes.extend_from_slice(&r.buf[..r.pos]);
        }
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| l.to_string())
            .collect()
    }
}
