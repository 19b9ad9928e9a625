//! What the journals say, after the fact: the report and its accounting of
//! where time went (ETTR), the timeline (text and HTML), the node history
//! across jobs, and the checkpoint interval advised from them. Everything
//! here reads journals only (plus Slurm's records where asked), never a
//! live process.

pub mod accounting;
pub mod advice;
pub mod charts;
pub mod html;
pub mod jobs;
pub mod loss;
pub mod node_history;
pub mod notable;
pub mod prometheus;
pub mod recovery;
pub mod report;
pub mod storms;
pub mod throughput;
pub mod timeline;
