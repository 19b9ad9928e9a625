//! Detection policies: pure functions of events and time.
//!
//! Nothing in here reads a clock, a file or a process. The caller passes the
//! current `Instant` with every call, so unit tests drive them with an
//! injected clock and no sleeps.

pub mod checkpoint_interval;
pub mod failure;
pub mod hang;
pub mod numerical;
pub mod outcome;
pub mod patterns;
pub mod restart;
pub mod restore;
pub mod slowdown;
pub mod stall;
pub mod straggler;
mod traceback;
