//! `JOB_DIR/relay-NODE.json`: how a node's agents find its relay.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// `JOB_DIR/relay-NODE.json`: where a node's relay listens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Announcement {
    pub url: String,
    pub attempt: u32,
    pub node: String,
    pub pid: u32,
}

/// The announcement's file name for `node` (anything but letters, digits,
/// `.`, `_` and `-` becomes `_`: a node name is not trusted as a path).
pub fn file_name(node: &str) -> String {
    let safe: String = node
        .chars()
        .take(64)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '_',
        })
        .collect();
    format!("relay-{safe}.json")
}

/// The relay announced for `node` in `attempt`: its address, if the file
/// is there, whole, this job's owner's, and names a loopback address.
pub fn announced(job_dir: &Path, node: &str, attempt: u32) -> Option<String> {
    let bytes =
        crate::util::files::read_in_dir(job_dir, &file_name(node), crate::util::files::SMALL_CAP)
            .ok()?;
    let a: Announcement = serde_json::from_slice(&bytes).ok()?;
    (a.attempt == attempt && a.node == node && a.url.starts_with("http://127.0.0.1:"))
        .then_some(a.url)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_node_name_never_leaves_the_job_directory() {
        assert_eq!(
            super::file_name("gpu-01.cluster"),
            "relay-gpu-01.cluster.json"
        );
        assert_eq!(super::file_name("../../etc/x"), "relay-.._.._etc_x.json");
    }
}
