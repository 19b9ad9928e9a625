//! The command line and environment of each rank's agent, and the
//! rendezvous port.

use super::*;

/// Rank `r`'s line prefix under `--label`: its number, right-aligned to
/// the width of the highest rank, then `": "` (as `srun --label`).
pub(super) fn output_label(r: u32, n: u32) -> String {
    let width = n.saturating_sub(1).to_string().len();
    format!("{r:>width$}: ")
}

impl Local {
    /// The agent of rank `r`, with the torchrun variables and the
    /// rendezvous `port` when there are several ranks. One rank gets none
    /// (`port` is `None`): the command runs as it would without resilio
    /// (Lightning and the Hugging Face Trainer take `LOCAL_RANK` for a
    /// launcher that started their processes).
    pub(super) fn rank_command(
        &self,
        r: u32,
        attempt: u32,
        port: Option<u16>,
        c: Option<&Coordinator>,
    ) -> Command {
        let (n, single) = (self.n, self.single);
        let mut cmd = Command::new(&self.exe);
        cmd.arg("run")
            .args(&self.agent_args)
            .arg("--")
            .args(&self.argv);
        if let Some(port) = port {
            cmd.envs([
                ("RANK", r.to_string()),
                ("LOCAL_RANK", r.to_string()),
                ("WORLD_SIZE", n.to_string()),
                ("LOCAL_WORLD_SIZE", n.to_string()),
                ("GROUP_RANK", "0".into()),
                ("NODE_RANK", "0".into()),
                ("TORCHELASTIC_RESTART_COUNT", attempt.to_string()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.to_string()),
            ]);
        }
        cmd.envs([
            ("RESILIO_JOB_ID", self.job.clone()),
            ("RESILIO_ATTEMPT", attempt.to_string()),
            (
                "RESILIO_STATE_DIR",
                self.cfg.state_dir.to_string_lossy().into_owned(),
            ),
            (
                ENV_LAUNCHER,
                if single { LAUNCHER_SINGLE } else { "1" }.into(),
            ),
        ])
        .envs(self.run_key.iter().map(|k| (crate::runs::ENV_RUN, k)))
        .envs((self.label && !single).then(|| (crate::context::ENV_LABEL, output_label(r, n))))
        // The launcher's clock: the agents' records agree with its own,
        // even for agents started after a step of the wall clock.
        .envs(crate::util::clock::env_value().map(|v| (crate::util::clock::ENV, v)))
        .envs(crate::log::child_env())
        // Ranks run in process groups of their own (so a Ctrl-C
        // reaches them once, through the launcher). Several ranks
        // are not in the terminal's foreground, so none may read
        // it; one rank gets stdin and the terminal.
        .stdin(if single {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
        // The launcher gone (even by SIGKILL): one rank is stopped with it,
        // as a plain wrapper's trainer would be; several ranks train on,
        // their agents notice (docs/coordinator.md).
        own_group(&mut cmd, single.then_some(Signal::SIGTERM), self.take_tty);
        if let Some(c) = c {
            cmd.envs(c.env());
        }
        cmd
    }
}

/// A port free right now, for MASTER_PORT: from 20000..32000, below Linux's
/// ephemeral range, so that no outgoing connection can take it between this
/// check and the trainer's bind (the kernel's own pick, from the ephemeral
/// range, could be). Starts at a place that differs per process and call.
pub(super) fn free_port() -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let start = (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) % 12_000;
    (0..12_000u64)
        .map(|k| 20_000 + ((start + k) % 12_000) as u16)
        .find(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok())
        .unwrap_or(29_500)
}
