//! Where journals live, and a state directory shared by a whole site.
//!
//! A state dir that is world-writable with the sticky bit (mode 1777, as
//! `/tmp` is: an admin runs `mkdir -m 1777 /shared/resilio` once) is taken
//! for a site-wide one. Every user then writes under a directory of their
//! own, `STATE_DIR/users/NAME/` (mode 0700, made on first use; `users/` is
//! made 1777 too), so that:
//!
//! - every user's runs get a journal and a node history (the first user's
//!   `jobs/`, created 0755, used to lock every other user out);
//! - nobody reads anyone else's journals (commands, output lines, coordinator
//!   tokens), and nobody can remove them (the sticky bit);
//! - job ids of different users never collide.
//!
//! Readers look in the user's own directory first, then in every other one
//! they may read (all of them for root: `resilio nodes` across all users'
//! jobs, `resilio report JOB` of anyone's job), and in `STATE_DIR/jobs/`
//! (journals written there before).
//!
//! Any other state dir (a home directory, `$XDG_STATE_HOME`) is used as it is.

use crate::error::{Error, Result};
use crate::journal;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The directory of every user's own state dir under a shared one.
pub const USERS: &str = "users";

/// Whether `root` is a site-wide state dir: a directory, world-writable and
/// sticky (mode 1777).
pub fn is_shared(root: &Path) -> bool {
    std::fs::metadata(root).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o1002 == 0o1002)
}

/// This user's name (the effective uid's), or `uid-N` without a passwd entry.
pub fn user_name() -> String {
    name_of(nix::unistd::geteuid().as_raw())
}

/// A user's name, or `uid-N` without a passwd entry (or with a name unfit
/// for a directory).
pub fn name_of(uid: u32) -> String {
    nix::unistd::User::from_uid(uid.into())
        .ok()
        .flatten()
        .map(|u| u.name)
        .filter(|n| !n.is_empty() && !n.contains('/') && !n.starts_with('.'))
        .unwrap_or_else(|| format!("uid-{uid}"))
}

/// This user's directory under a shared state dir.
pub fn user_dir(root: &Path) -> PathBuf {
    root.join(USERS).join(user_name())
}

/// The state dir of last resort (no state dir configured, no home
/// directory): `/tmp/resilio-state-UID`. Anyone can make that path first,
/// so [`for_writer`] checks it is this user's private directory.
pub fn tmp_fallback() -> PathBuf {
    PathBuf::from(format!("/tmp/resilio-state-{}", nix::unistd::getuid()))
}

/// The state dir under `/tmp` ([`tmp_fallback`]): made 0700 if missing; an
/// error when it is not this user's own directory (a symlink, another
/// owner's: a squatter could remove or replace journals).
fn private_tmp(dir: &Path) -> std::result::Result<(), String> {
    match crate::util::runtime_dir::claim(dir) {
        Ok(None) => Ok(()),
        Ok(Some(why)) => Err(format!(
            "the state dir {} is not your directory ({why}): someone else made it; set RESILIO_STATE_DIR or HOME",
            dir.display()
        )),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

/// The state dir a run writes to: `root` itself, or under a shared `root`
/// this user's own directory, made (0700) if needed. An error when that
/// directory exists but is someone else's (it would expose the journals),
/// and when the state dir of last resort under `/tmp` is not this user's.
/// A state dir that is a symbolic link someone else made is not followed
/// (root given `/tmp/sd -> /etc` by a user would write `/etc/jobs`).
pub fn for_writer(root: &Path) -> std::result::Result<PathBuf, String> {
    if let Ok(m) = std::fs::symlink_metadata(root) {
        let me = nix::unistd::geteuid().as_raw();
        if m.file_type().is_symlink() && m.uid() != me {
            return Err(format!(
                "the state dir {} is a symbolic link made by uid {}, not by you: not followed; give the directory itself",
                root.display(),
                m.uid()
            ));
        }
    }
    if root == tmp_fallback() {
        private_tmp(root)?;
        return Ok(root.to_path_buf());
    }
    if !is_shared(root) {
        return Ok(root.to_path_buf());
    }
    let users = root.join(USERS);
    match trusted_users_dir(root) {
        Ok(()) => {}
        // Missing: only the state dir's admin (root, or its owner) makes
        // it; anyone else would own everyone's journals (rename them away,
        // put forged ones in their place).
        Err(Untrusted::Missing) if is_admin_of(root) => init_users_dir(&users)?,
        Err(why) => return Err(why.explain(root)),
    }
    let mine = user_dir(root);
    match std::fs::DirBuilder::new().mode(0o700).create(&mine) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        // Not made (a read-only filesystem, ...): the journal says so and
        // supervision goes on without it, as for any unwritable state dir.
        Err(_) => return Ok(mine),
    }
    let meta = std::fs::symlink_metadata(&mine).map_err(|e| format!("{}: {e}", mine.display()))?;
    let uid = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid {
        let what = if meta.file_type().is_symlink() {
            format!("a symbolic link made by uid {}", meta.uid())
        } else if !meta.is_dir() {
            format!("not a directory (owner uid {})", meta.uid())
        } else {
            format!("owner uid {}", meta.uid())
        };
        return Err(format!(
            "the shared state dir's {} is not your directory ({what}): journals written there could be read by others; ask an admin to remove it",
            mine.display(),
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        let _ = std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700));
    }
    Ok(mine)
}

/// Why a shared state dir's `users/` is not to be trusted.
#[derive(Debug, PartialEq)]
pub enum Untrusted {
    /// No `users/` yet: the admin has not set the state dir up.
    Missing,
    /// Something else: what, in words.
    Bad(String),
}

impl Untrusted {
    /// One line naming the fix.
    pub fn explain(&self, root: &Path) -> String {
        let fix = format!(
            "the state dir's admin runs `resilio admin init-state-dir {}` (as root, or as its owner)",
            root.display()
        );
        match self {
            Untrusted::Missing => format!(
                "the shared state dir {} is not set up ({}/ is missing): {fix}",
                root.display(),
                root.join(USERS).display()
            ),
            Untrusted::Bad(why) => format!(
                "the shared state dir's {}/ cannot be trusted ({why}): whoever owns it controls every user's journals; {fix}",
                root.join(USERS).display()
            ),
        }
    }
}

/// The owner of a shared state dir, and root, are its admins.
fn admin_uids(root: &Path) -> [u32; 2] {
    [0, std::fs::metadata(root).map_or(0, |m| m.uid())]
}

/// This process may set `root` up.
fn is_admin_of(root: &Path) -> bool {
    admin_uids(root).contains(&nix::unistd::geteuid().as_raw())
}

/// `root/users/` is a directory (not a symlink) owned by an admin of
/// `root`, sticky (nobody renames another's directory) and writable by
/// all (every user makes their own).
pub fn trusted_users_dir(root: &Path) -> std::result::Result<(), Untrusted> {
    let users = root.join(USERS);
    let meta = match std::fs::symlink_metadata(&users) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Untrusted::Missing),
        Err(e) => return Err(Untrusted::Bad(e.to_string())),
    };
    if !meta.file_type().is_dir() {
        return Err(Untrusted::Bad("not a directory, or a symbolic link".into()));
    }
    if !admin_uids(root).contains(&meta.uid()) {
        return Err(Untrusted::Bad(format!(
            "owned by uid {}, not by root or the state dir's owner",
            meta.uid()
        )));
    }
    if meta.permissions().mode() & 0o1777 != 0o1777 {
        return Err(Untrusted::Bad(format!(
            "mode {:o}, not 1777",
            meta.permissions().mode() & 0o7777
        )));
    }
    Ok(())
}

/// Make `users/` (1777, sticky like `/tmp`): every user makes their own
/// directory in it, and nobody can rename another's.
fn init_users_dir(users: &Path) -> std::result::Result<(), String> {
    // The mode is set at creation (umask cleared for the call) so that
    // another user's first run finds it writable at once; chmod too, for
    // filesystems that drop the sticky bit on mkdir.
    // SAFETY: umask is process-wide; this runs before any thread is
    // started (the command line, before the runtime).
    let old = unsafe { libc::umask(0) };
    let made = std::fs::DirBuilder::new().mode(0o1777).create(users);
    unsafe { libc::umask(old) };
    match made {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{}: {e}", users.display())),
    }
    std::fs::set_permissions(users, std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| format!("{}: {e}", users.display()))
}

/// `resilio admin init-state-dir DIR`: make `DIR` (1777) if missing and its
/// `users/` (1777, owned by the caller), or check them. Run as root or as
/// `DIR`'s owner. What it did, in a line.
pub fn init_shared(root: &Path) -> std::result::Result<String, String> {
    match std::fs::symlink_metadata(root) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(format!(
                "{}: a symbolic link: give the directory itself",
                root.display()
            ))
        }
        Ok(m) if !m.is_dir() => return Err(format!("{}: not a directory", root.display())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .create(root)
                .map_err(|e| format!("{}: {e}", root.display()))?;
        }
        Err(e) => return Err(format!("{}: {e}", root.display())),
    }
    if !is_admin_of(root) {
        return Err(format!(
            "{}: only root or its owner may set it up",
            root.display()
        ));
    }
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let users = root.join(USERS);
    match trusted_users_dir(root) {
        Ok(()) => return Ok(format!("{}: set up already (users/ 1777)", root.display())),
        Err(Untrusted::Missing) => init_users_dir(&users)?,
        Err(Untrusted::Bad(why)) => {
            return Err(format!(
                "{}: {why}; move it aside (its users' journals are in it) and run this again",
                users.display()
            ))
        }
    }
    Ok(format!(
        "{}: a shared state dir (1777), every user's journals under {}/USER/",
        root.display(),
        users.display()
    ))
}

/// Local accounts that get a directory under a shared state dir: root, and
/// uids 1000-59999 (users, not system accounts), from the passwd database.
pub fn local_accounts() -> Vec<(String, u32)> {
    let mut out = Vec::new();
    // SAFETY: getpwent/endpwent walk the passwd database; this admin
    // command is single-threaded, and each entry is copied before the next.
    unsafe {
        libc::setpwent();
        loop {
            let p = libc::getpwent();
            if p.is_null() {
                break;
            }
            let uid = (*p).pw_uid;
            if uid == 0 || (1000..60000).contains(&uid) {
                if let Ok(name) = std::ffi::CStr::from_ptr((*p).pw_name).to_str() {
                    out.push((name.to_string(), uid));
                }
            }
        }
        libc::endpwent();
    }
    out.sort();
    out.dedup();
    out
}

/// Make `users/NAME` (0700, NAME's) under the shared state dir `root` for
/// each of `accounts`, so that nobody can take NAME first. An entry already
/// there that is not NAME's own directory (another user's, a symlink, a
/// FIFO) is renamed aside to `users/.taken-NAME-PID`, never followed or
/// removed. What was done, a line per account that changed.
pub fn make_user_dirs(root: &Path, accounts: &[(String, u32)]) -> Vec<String> {
    let users = root.join(USERS);
    let mut out = Vec::new();
    for (name, uid) in accounts {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            continue;
        }
        let dir = users.join(name);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() && m.uid() == *uid => continue,
            Ok(m) => {
                let aside = users.join(format!(".taken-{name}-{}", std::process::id()));
                match std::fs::rename(&dir, &aside) {
                    Ok(()) => out.push(format!(
                        "{}: not {name}'s own directory (owner uid {}): moved aside to {}",
                        dir.display(),
                        m.uid(),
                        aside.display()
                    )),
                    Err(e) => {
                        out.push(format!("{}: cannot move aside: {e}", dir.display()));
                        continue;
                    }
                }
            }
            Err(_) => {}
        }
        let made = std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .and_then(|()| std::os::unix::fs::lchown(&dir, Some(*uid), None));
        match made {
            Ok(()) => out.push(format!("{}: made for {name}", dir.display())),
            Err(e) => out.push(format!("{}: {e}", dir.display())),
        }
    }
    out
}

/// Every state dir a reader looks in under `root`, own first: `root`
/// itself when it is not shared; else this user's directory, the journals
/// written directly under `root` before, and every other user's directory
/// (only those this user may read are of any use: all of them for root).
pub fn readable_roots(root: &Path) -> Vec<PathBuf> {
    if !is_shared(root) {
        return vec![root.to_path_buf()];
    }
    let mine = user_dir(root);
    let mut out = vec![mine.clone()];
    // Journals written directly under `root` before: only where the admin
    // owns `jobs/` (anyone can make it in a 1777 directory and plant jobs).
    let legacy = root.join("jobs");
    if std::fs::symlink_metadata(&legacy)
        .is_ok_and(|m| m.file_type().is_dir() && admin_uids(root).contains(&m.uid()))
    {
        out.push(root.to_path_buf());
    }
    if let Ok(entries) = std::fs::read_dir(root.join(USERS)) {
        // Each user's directory only where it is that user's: another
        // user could make `users/bob` and fill it with forged journals.
        let mut others: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path() != mine && e.file_type().is_ok_and(|t| t.is_dir()))
            .filter(|e| {
                let owner = e.metadata().map(|m| m.uid()).ok();
                let named = uid_named(&e.file_name().to_string_lossy());
                owner.is_some() && owner == named
            })
            .map(|e| e.path())
            .collect();
        others.sort();
        out.extend(others);
    }
    out
}

/// The uid Slurm's accounting gives `job` (`sacct`), if it knows it.
fn slurm_owner(job: &str) -> Option<u32> {
    use crate::slurm::Slurm;
    crate::slurm::SlurmCli::default()
        .jobs_accounting(&[job.to_string()])
        .ok()?
        .into_iter()
        .find(|r| r.job_id == job)?
        .uid
}

/// The uid a `users/` directory's name stands for: a user's, or `uid-N`'s
/// (a user without a passwd entry, as [`user_name`] names them).
fn uid_named(name: &str) -> Option<u32> {
    if let Some(n) = name.strip_prefix("uid-") {
        return n.parse().ok();
    }
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
}

/// The state dir holding `job` under `root` (own directory first), or for
/// no job the one holding the most recently written job. The job id is
/// validated; a job found in several users' directories (the same
/// `--job-id`) is an error that names them.
pub fn locate(root: &Path, job: Option<&str>) -> Result<(PathBuf, String)> {
    let roots = readable_roots(root);
    let Some(job) = job else {
        // The latest of the caller's own jobs only: another user's job
        // written later (or planted with a later time) is never picked.
        let mut best: Option<(std::time::SystemTime, PathBuf, String)> = None;
        for r in roots.iter().take(1) {
            if let Some((j, t)) = journal::list_jobs(r).pop() {
                if best.as_ref().is_none_or(|(bt, _, _)| t > *bt) {
                    best = Some((t, r.clone(), j));
                }
            }
        }
        return best.map(|(_, r, j)| (r, j)).ok_or_else(|| Error::NoJob {
            job: "(latest)".into(),
            dir: root.join("jobs"),
        });
    };
    journal::validate_job_id(job).map_err(Error::Usage)?;
    let holding: Vec<&PathBuf> = roots
        .iter()
        .filter(|r| journal::job_dir(r, job).is_dir())
        .collect();
    match holding.as_slice() {
        [] => Ok((roots[0].clone(), job.to_string())),
        [one] => Ok(((*one).clone(), job.to_string())),
        [first, ..] if **first == roots[0] => Ok(((*first).clone(), job.to_string())),
        several => {
            // Slurm knows whose job it is: that user's directory (another
            // user may have made one of the same id).
            let uid = crate::slurm::validate_job_id(job)
                .ok()
                .and_then(|_| slurm_owner(job));
            if let Some(r) = uid.and_then(|u| {
                several
                    .iter()
                    .find(|r| std::fs::symlink_metadata(r).is_ok_and(|m| m.uid() == u))
            }) {
                return Ok(((*r).clone(), job.to_string()));
            }
            Err(Error::Usage(format!(
                "job {job} is in several users' state dirs ({}): pass --state-dir with one of them",
                several
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sticky_world_writable_dir_is_shared() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("s");
        std::fs::create_dir(&d).unwrap();
        for (mode, shared) in [
            (0o755, false),
            (0o777, false),
            (0o1755, false),
            (0o1777, true),
        ] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(is_shared(&d), shared, "{mode:o}");
        }
        assert!(!is_shared(&t.path().join("absent")));
        // A private dir is used as it is.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(for_writer(&d).unwrap(), d);
        assert_eq!(readable_roots(&d), vec![d.clone()]);
    }

    #[test]
    fn the_state_dir_under_tmp_must_be_this_users_own() {
        let t = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        // Missing: made private.
        let d = t.path().join("fresh");
        private_tmp(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        // Own but open: tightened.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        private_tmp(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        // A symlink to a directory of ours is still refused.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let e = private_tmp(&link).unwrap_err();
        assert!(
            e.contains("a symlink") && e.contains("RESILIO_STATE_DIR"),
            "{e}"
        );
        // Another user's (root can make one here): refused, not used.
        if nix::unistd::geteuid().is_root() {
            let other = t.path().join("other");
            std::fs::create_dir(&other).unwrap();
            std::os::unix::fs::chown(&other, Some(4242), Some(4242)).unwrap();
            let e = private_tmp(&other).unwrap_err();
            assert!(e.contains("owner uid 4242"), "{e}");
        }
        assert!(tmp_fallback().starts_with("/tmp"));
    }

    #[test]
    fn a_shared_dir_gets_a_private_directory_per_user() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("shared");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let mine = for_writer(&root).unwrap();
        assert_eq!(mine, root.join("users").join(user_name()));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&root.join("users")), 0o1777);
        assert_eq!(mode(&mine), 0o700);
        // Idempotent, and a loosened mode is tightened again.
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(for_writer(&root).unwrap(), mine);
        assert_eq!(mode(&mine), 0o700);
        // The per-user dir is not shared itself: writing there again stays there.
        assert_eq!(for_writer(&mine).unwrap(), mine);

        // Readers: own first, then the old layout (the admin's `jobs/`),
        // then the others: each only where its owner is the user it names.
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        std::fs::create_dir_all(root.join("jobs")).unwrap();
        let other = root.join("users").join("uid-4242");
        std::fs::create_dir_all(journal::job_dir(&other, "j2")).unwrap();
        std::fs::write(journal::job_dir(&other, "j2").join("rank-0.jsonl"), "").unwrap();
        // Made by someone else (root here) in uid 4242's name: forged, left out.
        assert_eq!(readable_roots(&root), [mine.clone(), root.clone()]);
        std::os::unix::fs::chown(&other, Some(4242), None).unwrap();
        assert_eq!(
            readable_roots(&root),
            [mine.clone(), root.clone(), other.clone()]
        );
        assert_eq!(locate(&root, Some("j2")).unwrap().0, other);
        // Without a job id: the caller's own latest job, never another's.
        assert!(locate(&root, None).is_err());
        std::fs::create_dir_all(journal::job_dir(&mine, "j1")).unwrap();
        std::fs::write(journal::job_dir(&mine, "j1").join("rank-0.jsonl"), "").unwrap();
        assert_eq!(locate(&root, None).unwrap(), (mine.clone(), "j1".into()));
        // Unknown job: the own directory (the error then names it).
        assert_eq!(locate(&root, Some("nope")).unwrap().0, mine);
        // The same id in two users' directories: own first; else ambiguous.
        std::fs::create_dir_all(journal::job_dir(&root, "j2")).unwrap();
        let err = locate(&root, Some("j2")).unwrap_err().to_string();
        assert!(err.contains("several"), "{err}");
        std::fs::create_dir_all(journal::job_dir(&mine, "j2")).unwrap();
        assert_eq!(locate(&root, Some("j2")).unwrap().0, mine);
        assert!(locate(&root, Some("../x")).is_err());

        // Someone else made this user's directory first (as root, the test
        // can play them): refused, the journals would not be private.
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("shared");
        init_shared(&root).unwrap();
        std::fs::create_dir_all(root.join("users").join(user_name())).unwrap();
        std::os::unix::fs::chown(root.join("users").join(user_name()), Some(65534), None).unwrap();
        let err = for_writer(&root).unwrap_err();
        assert!(err.contains("not your directory"), "{err}");
    }

    #[test]
    fn a_state_dir_linked_by_someone_else_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("target");
        std::fs::create_dir(&target).unwrap();
        let link = t.path().join("sd");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        // One's own link: followed (a home directory's link to scratch).
        assert_eq!(for_writer(&link).unwrap(), link);
        if nix::unistd::geteuid().is_root() {
            // A link another user made (root plays them): refused.
            std::os::unix::fs::lchown(&link, Some(4242), None).unwrap();
            let e = for_writer(&link).unwrap_err();
            assert!(
                e.contains("made by uid 4242") && e.contains("not followed"),
                "{e}"
            );
        }
    }

    #[test]
    fn only_an_admin_sets_a_shared_dir_up_and_users_must_be_theirs() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root to play another user (chown)");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("shared");
        // Set up by the admin (root here), idempotent.
        let done = init_shared(&root).unwrap();
        assert!(done.contains("a shared state dir"), "{done}");
        assert!(init_shared(&root).unwrap().contains("set up already"));
        assert!(is_shared(&root));
        assert_eq!(trusted_users_dir(&root), Ok(()));
        // A users/ some user made first (the old first-comer layout): not
        // trusted, and the message names the fix.
        std::os::unix::fs::chown(root.join("users"), Some(4242), None).unwrap();
        let e = for_writer(&root).unwrap_err();
        assert!(
            e.contains("owned by uid 4242") && e.contains("resilio admin init-state-dir"),
            "{e}"
        );
        assert!(init_shared(&root).unwrap_err().contains("move it aside"));
        // Not sticky: anyone could rename another user's directory away.
        std::os::unix::fs::chown(root.join("users"), Some(0), None).unwrap();
        std::fs::set_permissions(root.join("users"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        let e = for_writer(&root).unwrap_err();
        assert!(e.contains("mode 777, not 1777"), "{e}");
        // A symlink in its place.
        std::fs::remove_dir(root.join("users")).unwrap();
        std::os::unix::fs::symlink(t.path(), root.join("users")).unwrap();
        assert!(matches!(trusted_users_dir(&root), Err(Untrusted::Bad(_))));
        // Missing: what to do, said.
        std::fs::remove_file(root.join("users")).unwrap();
        assert_eq!(trusted_users_dir(&root), Err(Untrusted::Missing));
        assert!(Untrusted::Missing.explain(&root).contains("is not set up"));
    }
}
