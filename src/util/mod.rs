//! Small pieces used across resilio that belong to no one concern.
//!
//! - [`cmd`]: running an external command with a timeout, and spawning in a
//!   process group of its own that dies with resilio.

pub mod cmd;
