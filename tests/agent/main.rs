//! Integration tests of `resilio run` and the journal commands, with real
//! processes, signals, files and sockets. One file per contract area.

mod chaos;
mod client;
mod common;
mod coordinator;
mod coordinator_hardening;
mod ddp;
mod exit_codes;
mod fleet;
mod health;
mod journal;
mod judgment;
mod local_single;
mod matrix;
mod own_faults;
mod passthrough;
mod progress_sources;
mod relay;
mod reports;
mod runtime_dirs;
mod shared_state;
mod signals;
mod site;
mod stall;
#[path = "../support/status.rs"]
mod status;
mod throughput;
#[path = "../support/timing.rs"]
mod timing;
