//! The wall clock resilio stamps its records with: the wall time read once,
//! carried forward on the monotonic clock. A step of the wall clock under a
//! running job (an NTP step, `date -s`, a VM resumed with a stale clock)
//! then moves no record: durations read from the journal stay the time
//! that passed, and records stay in the order they were written. NTP's
//! slewing (at most 0.05%) reaches the monotonic clock too, so the
//! journal's time does not drift from the wall clock; only steps are left
//! out, until the next process reads the wall clock afresh.
//!
//! The reading is shared by every resilio process of a job on one host:
//! the launcher hands its own to the agents it starts ([`ENV`], honoured
//! only on the same boot of the same host: another node's monotonic clock
//! is another clock), so that records of an agent started after a step
//! agree with the launcher's.

use chrono::{DateTime, Utc};
use std::sync::OnceLock;
use std::time::Instant;

/// `BOOT_ID/OFFSET_NS`: the wall clock minus CLOCK_MONOTONIC, in
/// nanoseconds, as the job's first resilio process read it.
pub const ENV: &str = "RESILIO_CLOCK";

/// Wall minus monotonic (ns), and the `Instant` read with it.
static OFFSET: OnceLock<(i128, Instant, i128)> = OnceLock::new();

fn monotonic_ns() -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; CLOCK_MONOTONIC
    // always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The offset handed down in `value` (of [`ENV`]), if it was read on this boot.
fn inherited(value: &str, boot: Option<&str>) -> Option<i128> {
    let (id, offset) = value.split_once('/')?;
    (Some(id) == boot).then(|| offset.parse().ok()).flatten()
}

fn offset() -> &'static (i128, Instant, i128) {
    OFFSET.get_or_init(|| {
        let mono = monotonic_ns();
        let at = Instant::now();
        let wall = Utc::now().timestamp_nanos_opt().unwrap_or(0) as i128;
        let offset = std::env::var(ENV)
            .ok()
            .and_then(|v| inherited(&v, boot_id().as_deref()))
            .unwrap_or(wall - mono);
        (offset, at, mono)
    })
}

/// Now, on the job's clock.
pub fn now() -> DateTime<Utc> {
    from_ns(monotonic_ns() + offset().0)
}

/// An earlier (or later) `Instant` of this process, on the job's clock.
pub fn at(i: Instant) -> DateTime<Utc> {
    let (offset, t0, mono0) = *offset();
    let d = if i >= t0 {
        i.duration_since(t0).as_nanos() as i128
    } else {
        -(t0.duration_since(i).as_nanos() as i128)
    };
    from_ns(mono0 + d + offset)
}

fn from_ns(ns: i128) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(ns.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
}

/// The value of [`ENV`] for the processes this one starts (none when the
/// boot cannot be told: they read the wall clock themselves).
pub fn env_value() -> Option<String> {
    Some(format!("{}/{}", boot_id()?, offset().0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_is_taken_only_from_the_same_boot() {
        assert_eq!(inherited("abc/42", Some("abc")), Some(42));
        assert_eq!(inherited("abc/-42", Some("abc")), Some(-42));
        assert_eq!(inherited("abc/42", Some("other")), None);
        assert_eq!(inherited("abc/42", None), None);
        assert_eq!(inherited("abc/x", Some("abc")), None);
        assert_eq!(inherited("42", Some("abc")), None);
    }

    #[test]
    fn now_and_instants_agree_and_follow_the_wall_clock() {
        let i = Instant::now();
        let (a, n) = (at(i), now());
        assert!(n >= a && (n - a).num_milliseconds() < 1000, "{a} {n}");
        // Without a step since this process read it, it is the wall clock.
        let diff = (Utc::now() - now()).num_milliseconds().abs();
        assert!(diff < 1000, "{diff} ms");
        assert_eq!(
            at(i + std::time::Duration::from_secs(5)) - a,
            chrono::Duration::seconds(5)
        );
    }
}
