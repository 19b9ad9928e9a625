//! Every job's journal under a state dir that this user may read, with
//! the uid of its directory's owner: what the node history and the
//! restart storms read across jobs.

use crate::journal::{self, JobJournal};
use std::path::Path;
use std::time::SystemTime;

/// One job's journal and who owns it.
pub struct OwnedJournal {
    pub job: String,
    /// The owner of the job's directory (each file in it is its, see
    /// [`journal::read_job`]).
    pub uid: u32,
    pub journal: JobJournal,
}

/// Every job this user may read under `state_dir` (with a site-wide state
/// dir, every user's directory: all of them for root, see
/// [`crate::state_dir`]), written to since `since` when given; a job whose
/// directory cannot be looked at or read is left out.
pub fn every_job(state_dir: &Path, since: Option<SystemTime>) -> Vec<OwnedJournal> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for root in crate::state_dir::readable_roots(state_dir) {
        for (job, newest) in journal::list_jobs(&root) {
            if since.is_some_and(|s| newest < s) {
                continue;
            }
            let dir = journal::job_dir(&root, &job);
            let Ok(uid) = std::fs::symlink_metadata(&dir).map(|m| m.uid()) else {
                continue;
            };
            let Ok(journal) = journal::read_job(&dir) else {
                continue;
            };
            out.push(OwnedJournal { job, uid, journal });
        }
    }
    out
}
