//! `resilio demo`: a short scripted run on this machine, no Slurm and
//! nothing installed beyond the build, in local mode (`resilio run --ntasks 2`).
//! A scripted trainer (this same binary, `resilio __demo-trainer`) prints
//! Megatron-style iteration lines, its ranks wait for each other at every
//! step over TCP (as a collective does: rank 0 gathers every rank's step and
//! answers), and it saves a "checkpoint" that takes longer than the step
//! timeout (announced over `RESILIO_SOCKET`, so it is not taken for a hang);
//! then rank 1 hangs in its own code while rank 0 waits for it. resilio
//! detects the stall, asks the trainer for a stack dump (SIGUSR2), probes
//! what each rank is blocked on, the coordinator judges the hang job-wide
//! from that evidence (rank 0 waiting on a peer, rank 1 not) and stops the
//! attempt, both ranks are restarted in place from the checkpoint and
//! finish, and the report and timeline are printed from the journal.

use crate::analysis::report;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::journal;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Arguments of the scripted trainer.
#[derive(clap::Args, Debug, Clone)]
pub struct TrainerArgs {
    /// Steps to run before hanging (or finishing, with --hang-at 0)
    #[arg(long, default_value_t = 24)]
    pub steps: u64,
    /// Time per step in milliseconds
    #[arg(long, default_value_t = 200)]
    pub step_ms: u64,
    /// Save a checkpoint after this step (0: never)
    #[arg(long, default_value_t = 10)]
    pub checkpoint_at: u64,
    /// How long the checkpoint takes, in milliseconds
    #[arg(long, default_value_t = 3000)]
    pub checkpoint_ms: u64,
    /// Hang after this step instead of finishing (0: never hang)
    #[arg(long, default_value_t = 24)]
    pub hang_at: u64,
    /// Only this rank hangs (RANK); every rank when not given
    #[arg(long)]
    pub hang_rank: Option<u32>,
    /// Hang only in the first attempt (RESILIO_ATTEMPT 0)
    #[arg(long)]
    pub hang_first_attempt_only: bool,
    /// Where the checkpoint's step is kept: resumed from on start
    #[arg(long)]
    pub checkpoint_file: Option<PathBuf>,
}

fn notify(msg: &str) {
    // Fire and forget: never block, never fail the trainer.
    if let Some(path) = std::env::var_os("RESILIO_SOCKET") {
        if let Ok(s) = std::os::unix::net::UnixDatagram::unbound() {
            let _ = s.set_nonblocking(true);
            let _ = s.send_to(msg.as_bytes(), path);
        }
    }
}

/// Whether this rank is in its own code (hung) rather than waiting for
/// its peer: what its stack dump says.
static IN_OWN_CODE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_usr2(_: libc::c_int) {
    let own: &[u8] = b"demo-trainer: SIGUSR2: stack of the main thread (simulated):\n  File \"train.py\", line 61, in next_batch\n    time.sleep(poll)   # stuck in its own code, outside any collective\n";
    let waiting: &[u8] = b"demo-trainer: SIGUSR2: stack of the main thread (simulated):\n  File \"train.py\", line 88, in train_step\n    dist.all_reduce(grad)   # waiting for the other rank\n";
    let msg = if IN_OWN_CODE.load(Ordering::Relaxed) {
        own
    } else {
        waiting
    };
    // SAFETY: write(2) is async-signal-safe.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// The ranks' "collective": rank 0 gathers each rank's step over TCP and
/// answers every rank, so no rank runs ahead of another (rank 0 waits in a
/// socket read for a rank that stopped, as a gloo or NCCL collective does).
enum Peers {
    Alone,
    Root(Vec<TcpStream>),
    Leaf(TcpStream),
}

impl Peers {
    fn connect(rank: u32, world: u32) -> std::io::Result<Peers> {
        if world <= 1 {
            return Ok(Peers::Alone);
        }
        let addr = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
        let port: u16 = std::env::var("MASTER_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| std::io::Error::other("MASTER_PORT is not set"))?;
        if rank == 0 {
            let l = TcpListener::bind((addr.as_str(), port))?;
            let peers = (1..world)
                .map(|_| l.accept().map(|(s, _)| s))
                .collect::<std::io::Result<Vec<_>>>()?;
            return Ok(Peers::Root(peers));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match TcpStream::connect((addr.as_str(), port)) {
                Ok(s) => return Ok(Peers::Leaf(s)),
                Err(e) if std::time::Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Every rank at `step`, or an error when a peer is gone.
    fn all_reduce(&mut self, step: u64) -> std::io::Result<()> {
        let mut buf = [0u8; 8];
        match self {
            Peers::Alone => Ok(()),
            Peers::Root(peers) => {
                for p in peers.iter_mut() {
                    p.read_exact(&mut buf)?;
                }
                for p in peers.iter_mut() {
                    p.write_all(&step.to_le_bytes())?;
                }
                Ok(())
            }
            Peers::Leaf(s) => {
                s.write_all(&step.to_le_bytes())?;
                s.read_exact(&mut buf)
            }
        }
    }
}

/// Run the scripted trainer; returns its exit code.
pub fn trainer(a: TrainerArgs) -> i32 {
    // SAFETY: installing a handler that only calls write(2).
    unsafe { libc::signal(libc::SIGUSR2, on_usr2 as *const () as libc::sighandler_t) };
    let total = a.steps.max(1);
    let env_num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
    let rank = env_num("RANK").unwrap_or(0);
    let world = env_num("WORLD_SIZE").unwrap_or(1);
    let attempt = env_num("RESILIO_ATTEMPT").unwrap_or(0);
    let hangs = a.hang_at > 0
        && a.hang_rank.is_none_or(|r| r == rank)
        && (!a.hang_first_attempt_only || attempt == 0);
    let resumed = a
        .checkpoint_file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "demo-trainer rank {rank}: building model, loading data{}",
        if resumed > 0 {
            format!(", resuming after checkpoint {resumed}")
        } else {
            String::new()
        }
    );
    let _ = out.flush();
    let mut peers = match Peers::connect(rank, world) {
        Ok(p) => p,
        Err(e) => {
            crate::say_err!("demo-trainer rank {rank}: cannot reach the other ranks: {e}");
            return 1;
        }
    };
    std::thread::sleep(Duration::from_millis(600));
    if resumed > 0 {
        let _ = writeln!(
            out,
            "demo-trainer rank {rank}: checkpoint {resumed} restored"
        );
        let _ = out.flush();
    }
    for step in resumed + 1..=a.steps {
        std::thread::sleep(Duration::from_millis(a.step_ms));
        if let Err(e) = peers.all_reduce(step) {
            crate::say_err!("demo-trainer rank {rank}: all_reduce of update {step}: connection to a peer lost: {e}");
            return 1;
        }
        let loss = 4.0 / (1.0 + step as f64 * 0.1);
        let _ = writeln!(
            out,
            " iteration {step:>8}/{total:>8} | consumed samples: {:>8} | elapsed time per iteration (ms): {:.1} | lm loss: {loss:.6E} |",
            step * 32,
            a.step_ms as f64
        );
        let _ = out.flush();
        if a.checkpoint_at > 0 && step == a.checkpoint_at {
            notify(&format!("phase=checkpoint step={step}"));
            let _ = writeln!(
                out,
                "demo-trainer: writing checkpoint for step {step} ({} ms)",
                a.checkpoint_ms
            );
            let _ = out.flush();
            std::thread::sleep(Duration::from_millis(a.checkpoint_ms));
            if let Some(f) = a.checkpoint_file.as_ref().filter(|_| rank == 0) {
                let tmp = f.with_extension("tmp");
                if std::fs::write(&tmp, step.to_string()).is_ok() {
                    let _ = std::fs::rename(&tmp, f);
                }
            }
            notify(&format!("checkpoint_done step={step}"));
            let _ = writeln!(out, "demo-trainer: checkpoint for step {step} is durable");
            let _ = out.flush();
        }
        if hangs && step == a.hang_at {
            let _ = writeln!(
                out,
                "demo-trainer rank {rank}: waiting for the next batch ... (stuck in its own code)"
            );
            let _ = out.flush();
            IN_OWN_CODE.store(true, Ordering::Relaxed);
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
    0
}

/// `resilio demo`.
pub fn run(state_dir: Option<PathBuf>) -> Result<i32> {
    // --state-dir, else RESILIO_STATE_DIR (so that the `resilio report`
    // it suggests finds it), else a directory of its own.
    let state_dir = match state_dir.or_else(|| {
        std::env::var_os("RESILIO_STATE_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    }) {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("resilio-demo-{}", std::process::id())),
    };
    // The demo is a local run: inside a Slurm job it must not act on the job.
    for (key, _) in std::env::vars_os() {
        if key
            .to_str()
            .is_some_and(|k| k.starts_with("SLURM") || k == "ENVIRONMENT")
        {
            std::env::remove_var(key);
        }
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::Other(format!("cannot find own binary: {e}")))?;
    let job = format!("demo-{}", chrono::Utc::now().format("%Y%m%d-%H%M%S"));

    std::fs::create_dir_all(&state_dir)
        .map_err(|e| Error::Other(format!("{}: {e}", state_dir.display())))?;
    // The ranks' agents read their settings from a file, as a user's would.
    let conf = state_dir.join("demo-resilio.toml");
    std::fs::write(
        &conf,
        "# resilio demo: short timeouts so that it all happens within a minute\n\
         [run]\nkill_grace = \"5s\"\nmax_restarts = 2\n\
         [stall]\nadaptive_floor = \"2s\"\nstartup_timeout = \"30s\"\ncheckpoint_timeout = \"60s\"\n\
         [diagnostics]\ndump_signal = \"SIGUSR2\"\ndump_wait = \"500ms\"\n\
         [journal]\nprogress_interval = \"1s\"\n\
         [coordinator]\nhang_wait = \"3s\"\n",
    )
    .map_err(|e| Error::Other(format!("{}: {e}", conf.display())))?;
    let cfg = Config::load(Some(&conf))?;
    let cfg = Config {
        state_dir: state_dir.clone(),
        ..cfg
    };
    let ckpt = state_dir.join("demo-checkpoint");
    let _ = std::fs::remove_file(&ckpt);

    println!(
        "== resilio demo: job {job}, journal under {}",
        state_dir.display()
    );
    println!("== `resilio run --ntasks 2` starts two ranks of a scripted trainer (0.2 s steps) with a coordinator;");
    println!("== the ranks wait for each other at every step, as in a collective. Both save a 3 s checkpoint at step 10");
    println!("== (announced on RESILIO_SOCKET, so not a hang); then, after step 18, rank 1 hangs in its own code and rank 0");
    println!("== waits for it. The adaptive stall timeout (2 s floor here) catches both; the coordinator judges the hang");
    println!("== job-wide from what each rank is blocked on (rank 0 reading from its peer, rank 1 asleep in its own code),");
    println!("== blames rank 1, and both ranks restart in place from the checkpoint.\n");
    let argv: Vec<std::ffi::OsString> = vec![
        exe.into(),
        "__demo-trainer".into(),
        "--hang-at".into(),
        "18".into(),
        "--hang-rank".into(),
        "1".into(),
        "--hang-first-attempt-only".into(),
        "--checkpoint-file".into(),
        ckpt.into(),
    ];
    let code = crate::job::local::run(crate::job::local::LocalOptions {
        argv,
        config: cfg,
        job_id: Some(job.clone()),
        ntasks: 2,
        agent_args: vec![
            "--config".into(),
            conf.into(),
            "--state-dir".into(),
            state_dir.clone().into(),
        ],
        label: false,
    })?;
    println!(
        "\n== resilio run --ntasks 2 exited with {code} (0: the job completed after the restart)\n"
    );
    show_journal(&state_dir, &job)?;
    Ok(code)
}

/// The demo's report and timeline, from its journal alone, and how to get
/// them again.
fn show_journal(state_dir: &std::path::Path, job: &str) -> Result<()> {
    let dir = journal::job_dir(state_dir, job);
    let j = journal::read_job(&dir)
        .map_err(|e| Error::Other(format!("cannot read the demo's journal: {e}")))?;
    let r = report::build(job, &j.records, j.bad_lines, None);
    println!("== resilio report {job}\n");
    print!("{}", report::render_text(&r));
    println!("\n== resilio timeline {job}\n");
    print!(
        "{}",
        crate::analysis::timeline::render(job, &j.records, None)
    );
    println!(
        "\n== again, from the journal alone:\n   resilio report --state-dir {} {job} [--json]\n   resilio timeline --state-dir {} {job}",
        state_dir.display(),
        state_dir.display()
    );
    Ok(())
}
