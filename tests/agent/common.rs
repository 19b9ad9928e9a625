//! Helpers for the agent's integration tests: the real binary, the Python
//! fake trainer, journal reading, and waiting on conditions with deadlines.

#![allow(dead_code)]

use resilio::journal::{self, Record};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_resilio")
}

pub fn trainer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/trainer.py")
}

/// `resilio run --job-id JOB` with a private state dir and a clean environment.
pub fn resilio_run(state: &Path, job: &str) -> Command {
    let mut c = Command::new(bin());
    for k in [
        "SLURM_JOB_ID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_RESTART_COUNT",
        "SLURMD_NODENAME",
        "RANK",
        "WORLD_SIZE",
        "RESILIO_JOB_ID",
        "RESILIO_ATTEMPT",
        "RESILIO_COORDINATOR",
        "RESILIO_COORDINATOR_TOKEN",
        "RESILIO_CLOCK",
        "RESILIO_CONTROL",
        "RESILIO_LOCAL_LAUNCHER",
        "RESILIO_SOCKET",
        "RESILIO_LOG",
        "SLURM_STEP_ID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "SLURM_JOB_NODELIST",
        "SLURM_STEP_NODELIST",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_TASKS_PER_NODE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        c.env_remove(k);
    }
    c.env("RESILIO_STATE_DIR", state)
        .env("RESILIO_SYSTEM_CONFIG", "")
        .args(["run", "--job-id", job]);
    c
}

/// The same, followed by `-- python3 trainer.py ARGS`. One attempt
/// (`--max-restarts 0`) unless `opts` says otherwise: these tests look at
/// what one attempt does; restarts in place have tests of their own.
pub fn run_trainer(state: &Path, job: &str, opts: &[&str], args: &[&str]) -> Command {
    let mut c = resilio_run(state, job);
    if !opts.contains(&"--max-restarts") {
        c.args(["--max-restarts", "0"]);
    }
    c.args(opts)
        .arg("--")
        .arg("python3")
        .arg(trainer())
        .args(args);
    c
}

/// Run to completion, failing the test after `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> (Output, Duration) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn resilio");
    wait_output(child, limit)
}

pub fn wait_output(child: Child, limit: Duration) -> (Output, Duration) {
    let start = Instant::now();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => (out.expect("wait"), start.elapsed()),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("resilio did not finish within {limit:?}");
        }
    }
}

/// Poll `cond` every 20 ms until it holds or `limit` passes.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn records(state: &Path, job: &str) -> Vec<Record> {
    journal::read_job(&journal::job_dir(state, job))
        .map(|j| j.records)
        .unwrap_or_default()
}

pub fn kinds<'a>(recs: &'a [Record], kind: &str) -> Vec<&'a Record> {
    recs.iter().filter(|r| r.kind == kind).collect()
}

pub fn one<'a>(recs: &'a [Record], kind: &str) -> &'a Record {
    let found = kinds(recs, kind);
    assert_eq!(
        found.len(),
        1,
        "expected one {kind} record, got {}: {recs:#?}",
        found.len()
    );
    found[0]
}

pub fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("resilio.toml");
    std::fs::write(&p, text).unwrap();
    p
}

pub fn lockstep() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lockstep_trainer.py")
}

/// `resilio run --ntasks N OPTS -- python3 lockstep_trainer.py ARGS`.
pub fn run_local(state: &Path, job: &str, n: u32, opts: &[&str], args: &[&str]) -> Command {
    let mut c = resilio_run(state, job);
    c.args(["--ntasks", &n.to_string()])
        .args(opts)
        .arg("--")
        .arg("python3")
        .arg(lockstep())
        .args(args);
    c
}

/// A tmpfs mounted for a test, unmounted (lazily) when dropped.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    pub fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755")])
            .arg("tmpfs")
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Write zeros into `path` until the filesystem is full; the bytes written.
pub fn fill(path: &Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 4096];
    let mut n = 0u64;
    while let Ok(k) = f.write(&block) {
        if k == 0 {
            break;
        }
        n += k as u64;
    }
    let _ = f.sync_all();
    n
}
