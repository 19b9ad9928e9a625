//! A site-wide state dir (`resilio admin init-state-dir /shared/resilio`,
//! `state_dir = "/shared/resilio"`) used by two real users: both get journals and node
//! history, neither reads the other's, and root's `resilio nodes` and
//! `resilio report` see every user's jobs. Needs root (useradd, runuser);
//! skipped with a message otherwise.

use crate::common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// Users made for the test, removed again whatever happens.
struct Users(Vec<String>);

impl Users {
    fn create(names: &[String]) -> Users {
        let mut made = Users(Vec::new());
        for n in names {
            let o = Command::new("useradd")
                .args(["--no-create-home", "--shell", "/bin/sh", n])
                .output()
                .expect("useradd");
            assert!(o.status.success(), "useradd {n}: {}", stderr_of(&o));
            made.0.push(n.clone());
        }
        made
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("userdel").arg(n).output();
        }
    }
}

/// `runuser -u USER -- resilio ARGS` in a clean environment.
fn as_user(user: &str, args: &[&str]) -> Output {
    let mut c = Command::new("runuser");
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("RESILIO_SYSTEM_CONFIG", "")
        .args(["-u", user, "--", bin()])
        .args(args);
    output_within(&mut c, Duration::from_secs(60)).0
}

fn uid_of(user: &str) -> u32 {
    nix::unistd::User::from_name(user)
        .unwrap()
        .unwrap()
        .uid
        .as_raw()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_site_wide_state_dir_works_for_every_user_and_keeps_their_journals_private() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED a_site_wide_state_dir_works_for_every_user...: needs root to create two users (useradd) and run as them (runuser)"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let s = shared.to_str().unwrap();
    let id = std::process::id();
    let (a, b) = (format!("rsl{id}a"), format!("rsl{id}b"));
    let _users = Users::create(&[a.clone(), b.clone()]);

    // Not set up by its admin: no user makes users/ (the first would own
    // everyone's journals); the run is refused with the fix named.
    let o = as_user(
        &a,
        &["run", "--state-dir", s, "--job-id", "early", "--", "true"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr_of(&o));
    assert!(
        stderr_of(&o).contains("resilio admin init-state-dir"),
        "{}",
        stderr_of(&o)
    );
    assert!(!shared.join("users").exists());
    let o = Command::new(bin())
        .args(["admin", "init-state-dir", s])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));

    // Each user runs a job whose GPU fails (an infrastructure failure,
    // blamed on this node), one attempt each.
    for (user, job) in [(&a, "job-a"), (&b, "job-b")] {
        let o = as_user(
            user,
            &[
                "run",
                "--state-dir",
                s,
                "--job-id",
                job,
                "--max-restarts",
                "0",
                "--",
                "sh",
                "-c",
                "echo step 1; echo step 2; echo 'RuntimeError: CUDA error: uncorrectable ECC error encountered' >&2; exit 1",
            ],
        );
        let err = stderr_of(&o);
        assert_eq!(o.status.code(), Some(1), "{user}: {err}");
        assert!(!err.contains("cannot write journal"), "{user}: {err}");
    }

    // Layout: one private directory per user; nothing written at the top.
    let users = shared.join("users");
    assert_eq!(mode(&users), 0o1777);
    for user in [&a, &b] {
        let dir = users.join(user);
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        assert_eq!(std::fs::metadata(&dir).unwrap().uid(), uid_of(user));
    }
    assert!(!shared.join("jobs").exists());
    let ja = resilio::journal::job_dir(&users.join(&a), "job-a");
    assert!(!kinds(&records(&users.join(&a), "job-a"), "rank_exit").is_empty());
    assert!(!kinds(&records(&users.join(&b), "job-b"), "rank_exit").is_empty());

    // Privacy: b cannot read a's journal, nor report on a's job.
    let o = Command::new("runuser")
        .args(["-u", &b, "--", "cat"])
        .arg(ja.join("rank-0.jsonl"))
        .output()
        .unwrap();
    assert!(!o.status.success(), "b read a's journal");
    let o = as_user(&b, &["report", "job-a", "--state-dir", s]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr_of(&o));
    // Each user's own reports, and the latest job is their own.
    let o = as_user(&a, &["report", "job-a", "--state-dir", s]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let o = as_user(&b, &["timeline", "--state-dir", s]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("job job-b,"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // A user's node history holds their own jobs.
    let o = as_user(&a, &["nodes", "--no-sacct", "--state-dir", s]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("sources: 1 job journal(s)"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    // Nobody can hide another user's journals (users/ is root's and
    // sticky) or forge them: a directory made in b's name by a, or under a
    // name that is not a's, is not read.
    let o = Command::new("runuser")
        .args(["-u", &a, "--", "mv"])
        .arg(users.join(&b))
        .arg(users.join("hidden"))
        .output()
        .unwrap();
    assert!(!o.status.success(), "a renamed b's journals away");
    let forged = users.join("nobody");
    let o = Command::new("runuser")
        .args(["-u", &a, "--", "cp", "-r"])
        .arg(users.join(&a))
        .arg(&forged)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let o = Command::new("runuser")
        .args(["-u", &a, "--", "mv"])
        .arg(forged.join("jobs/job-a"))
        .arg(forged.join("jobs/forged"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let o = Command::new(bin())
        .args(["report", "forged", "--state-dir", s])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "a forged journal was read");

    // Root (an admin) reads every user's journals, but believes another
    // user's only where Slurm's accounting agrees (these runs were outside
    // Slurm, and sacct is not asked): left out, and said so. Each user's
    // own history holds their own jobs.
    let o = Command::new(bin())
        .args(["nodes", "--json", "--no-sacct", "--state-dir", s])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let history: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let jobs_of = |history: &serde_json::Value| -> Vec<String> {
        history
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|n| n["jobs"].as_array().cloned().unwrap_or_default())
            .filter_map(|j| j.as_str().map(String::from))
            .collect()
    };
    assert!(jobs_of(&history).is_empty(), "{history:#}");
    // With --json, what was left out is said on stderr.
    assert!(
        stderr_of(&o).contains("resilio: left out: "),
        "{}",
        stderr_of(&o)
    );
    let o = Command::new(bin())
        .args(["nodes", "--no-sacct", "--state-dir", s])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("sources: 2 job journal(s)")
            && text.contains("left out: ")
            && text.contains("another user's journal Slurm's accounting could not confirm"),
        "{text}"
    );
    let o = as_user(&b, &["nodes", "--json", "--no-sacct", "--state-dir", s]);
    let history: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(jobs_of(&history), ["job-b"], "{history:#}");
    let o = Command::new(bin())
        .args(["report", "job-b", "--state-dir", s])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    // Whose it is, said (trial 6: another user's job read without a word).
    assert!(
        stderr_of(&o).contains(&format!("job job-b is {b}'s")),
        "{}",
        stderr_of(&o)
    );
}

/// Anyone can plant files in a shared state dir. A FIFO, a symlink to
/// `/dev/zero` and a symlinked job directory among the jobs must neither
/// hang nor exhaust `resilio report` (which reads every job for its
/// failure-rate figure) and `resilio nodes`: they are skipped, and named.
#[test]
fn planted_fifos_devices_and_links_among_the_journals_never_hang_a_reader() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path();
    let o = Command::new(bin())
        .args(["run", "--job-id", "mine", "--state-dir"])
        .arg(state)
        .args(["--", "sh", "-c", "echo step 1; echo step 2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let jobs = resilio::journal::job_dir(state, "mine")
        .parent()
        .unwrap()
        .to_path_buf();
    for j in ["fifo", "zero", "linked"] {
        std::fs::create_dir_all(jobs.join(j)).unwrap();
    }
    nix::unistd::mkfifo(
        &jobs.join("fifo/rank-0.jsonl"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    std::os::unix::fs::symlink("/dev/zero", jobs.join("zero/rank-0.jsonl")).unwrap();
    std::fs::remove_dir(jobs.join("linked")).unwrap();
    std::os::unix::fs::symlink("/etc", jobs.join("linked")).unwrap();
    let s = state.to_str().unwrap();
    for args in [
        vec!["report", "mine", "--state-dir", s],
        vec!["report", "fifo", "--state-dir", s],
        vec!["nodes", "--no-sacct", "--state-dir", s],
        vec!["timeline", "zero", "--state-dir", s],
    ] {
        let (o, took) = output_within(Command::new(bin()).args(&args), Duration::from_secs(30));
        assert!(
            took < Duration::from_secs(20),
            "{args:?} took {took:?}: {}",
            stderr_of(&o)
        );
        assert!(o.status.code().is_some(), "{args:?} was killed");
        if args[1] == "mine" || args[0] == "nodes" {
            assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr_of(&o));
        }
    }
    let (o, _) = output_within(
        Command::new(bin()).args(["report", "fifo", "--state-dir", s]),
        Duration::from_secs(30),
    );
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr_of(&o));
    assert!(all.contains("a FIFO, not read"), "{all}");
    // The node history says so too (the FIFO and the link to /dev/zero).
    let (o, _) = output_within(
        Command::new(bin()).args(["nodes", "--no-sacct", "--state-dir", s]),
        Duration::from_secs(30),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("left out: 2 journal files not read"), "{out}");
}

/// `runuser -u USER -- PROGRAM ARGS` (not resilio): the attacker's hands.
fn sh_as(user: &str, args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", user, "--"])
        .args(args)
        .output()
        .expect("runuser")
}

/// Every path component a run writes under a shared state dir, planted
/// first by another user: a directory of theirs, a symlink to one, a FIFO,
/// a device, as `users/VICTIM` (for a user and for root); the victim's
/// private socket directory under `/tmp`; a legacy top-level `jobs/` with a
/// forged journal. No victim ever writes into the attacker's files or
/// follows their link, each refusal names the fix, the socket directory is
/// replaced by a private one and the run goes on, and the admin's readers
/// ignore what was planted.
#[test]
fn paths_planted_by_another_user_are_refused_or_replaced_never_followed() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED paths_planted_by_another_user_...: needs root to create users (useradd) and run as them (runuser)"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let s = shared.to_str().unwrap();
    let o = Command::new(bin())
        .args(["admin", "init-state-dir", s])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let id = std::process::id();
    let (eve, bob) = (format!("rsl{id}e"), format!("rsl{id}v"));
    let _users = Users::create(&[eve.clone(), bob.clone()]);
    let users = shared.join("users");
    // Eve's own directory, where a victim's journal must never land.
    let trap = tmp.path().join("trap");
    std::fs::create_dir(&trap).unwrap();
    std::os::unix::fs::chown(&trap, Some(uid_of(&eve)), None).unwrap();
    std::fs::set_permissions(&trap, std::fs::Permissions::from_mode(0o777)).unwrap();
    let victim_run = |who: &str| -> Output {
        let args = [
            "run",
            "--state-dir",
            s,
            "--job-id",
            "victim",
            "--",
            "sh",
            "-c",
            "echo step 1",
        ];
        if who == "root" {
            let mut c = Command::new(bin());
            c.args(args).env("RESILIO_SYSTEM_CONFIG", "");
            output_within(&mut c, Duration::from_secs(60)).0
        } else {
            as_user(who, &args)
        }
    };
    let clear = |p: &Path| {
        let _ = std::fs::remove_file(p);
        let _ = std::fs::remove_dir_all(p);
    };
    for victim in [bob.as_str(), "root"] {
        let spot = users.join(victim);
        let plants: [(&str, Vec<&str>); 4] = [
            (
                "a directory of the attacker's",
                vec!["mkdir", spot.to_str().unwrap()],
            ),
            (
                "a symlink to the attacker's directory",
                vec!["ln", "-s", trap.to_str().unwrap(), spot.to_str().unwrap()],
            ),
            ("a FIFO", vec!["mkfifo", spot.to_str().unwrap()]),
            (
                "a symlink to a device",
                vec!["ln", "-s", "/dev/null", spot.to_str().unwrap()],
            ),
        ];
        for (what, cmd) in plants {
            clear(&spot);
            let o = sh_as(&eve, &cmd);
            assert!(o.status.success(), "{what}: {}", stderr_of(&o));
            let o = victim_run(victim);
            let err = stderr_of(&o);
            assert_eq!(o.status.code(), Some(2), "{victim}, {what}: {err}");
            assert!(
                err.contains("not your directory") && err.contains(&spot.display().to_string()),
                "{victim}, {what}: {err}"
            );
            if what.contains("symlink") {
                assert!(err.contains("a symbolic link made by uid"), "{err}");
            }
            assert!(
                std::fs::read_dir(&trap).unwrap().next().is_none(),
                "{victim}, {what}: something was written into the attacker's directory"
            );
        }
        clear(&spot);
        // Unplanted, the same run works.
        let o = victim_run(victim);
        assert_eq!(o.status.code(), Some(0), "{victim}: {}", stderr_of(&o));
    }
    // The admin's way out of squatting (and in before it):
    // `init-state-dir --for-users` makes each account's own directory,
    // moving a squatter's aside.
    let spot = users.join(&bob);
    let _ = std::fs::remove_dir_all(&spot);
    let o = sh_as(&eve, &["mkdir", spot.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    let o = Command::new(bin())
        .args(["admin", "init-state-dir", s, "--for-users"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("moved aside"), "{said}");
    assert_eq!(std::fs::metadata(&spot).unwrap().uid(), uid_of(&bob));
    assert_eq!(mode(&spot), 0o700);
    let o = victim_run(&bob);
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    // Eve's own directory was made too: nobody can take her name either.
    assert_eq!(
        std::fs::metadata(users.join(&eve)).unwrap().uid(),
        uid_of(&eve)
    );
    // Bob's directory is his alone: eve cannot plant inside it.
    let o = sh_as(
        &eve,
        &[
            "ln",
            "-s",
            "/etc",
            users.join(&bob).join("jobs/evil").to_str().unwrap(),
        ],
    );
    assert!(!o.status.success(), "eve planted inside bob's directory");

    // The socket directory bob's agents want, taken by eve first (a link to
    // her directory): bob's run goes on in a private directory of its own.
    let sockets = Path::new("/tmp").join(format!("resilio-{}", uid_of(&bob)));
    clear(&sockets);
    let o = sh_as(
        &eve,
        &[
            "ln",
            "-s",
            trap.to_str().unwrap(),
            sockets.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    let o = as_user(
        &bob,
        &[
            "run",
            "--state-dir",
            s,
            "--job-id",
            "sockets",
            "--",
            "sh",
            "-c",
            "echo step 1; echo step 2",
        ],
    );
    clear(&sockets);
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(
        std::fs::read_dir(&trap).unwrap().next().is_none(),
        "bob's agent used eve's socket directory"
    );
    let recs = records(&users.join(&bob), "sockets");
    assert!(!kinds(&recs, "rank_exit").is_empty());

    // A legacy top-level jobs/ made by eve, with a journal blaming a node:
    // root's node history does not read it.
    let forged = shared.join("jobs/777");
    let o = sh_as(&eve, &["mkdir", "-p", forged.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    let mut w = resilio::journal::Writer::open(
        &forged,
        "rank-0.jsonl",
        0,
        Some(0),
        Some("gpu-node-07".into()),
    );
    w.record(
        "failure",
        serde_json::json!({ "class": "infrastructure", "evidence": "NVRM: Xid 79" }),
        true,
    );
    drop(w);
    let file = forged.join("rank-0.jsonl");
    std::os::unix::fs::chown(&file, Some(uid_of(&eve)), None).unwrap();
    let o = Command::new(bin())
        .args(["nodes", "--json", "--no-sacct", "--state-dir", s])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("gpu-node-07"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // The same journal, the admin's own, is read: the test can see it.
    for p in [shared.join("jobs"), forged.clone(), file.clone()] {
        std::os::unix::fs::chown(&p, Some(0), Some(0)).unwrap();
    }
    let o = Command::new(bin())
        .args(["nodes", "--json", "--no-sacct", "--state-dir", s])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("gpu-node-07"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}
