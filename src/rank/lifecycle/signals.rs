//! The machine on a signal: a stop (TERM, INT, the others that would end
//! resilio), Slurm's pre-timeout signal, the checkpoint signal, and the
//! rest, forwarded or left to Slurm's delivery.

use super::*;

impl Lifecycle {
    fn forward_unless(&self, sig: Signal) -> Order {
        if self.s.slurm_delivers {
            Order::LeftToSlurm(sig)
        } else {
            Order::Forward(sig)
        }
    }

    /// A signal to resilio, at `now` (`wall`: the wall clock then).
    pub fn on_signal(&mut self, sig: Sig, now: Instant, wall: DateTime<Utc>) -> Vec<Order> {
        match sig {
            Sig::Term | Sig::Int | Sig::Stop(_) => self.on_stop_signal(sig, now),
            Sig::Hup => vec![self.forward_unless(Signal::SIGHUP)],
            Sig::Usr1 => self.on_user_signal(Signal::SIGUSR1, now, wall),
            Sig::Usr2 => self.on_user_signal(Signal::SIGUSR2, now, wall),
            Sig::Cont => {
                // Resumed after a suspension (scontrol suspend, gang
                // scheduling, Ctrl-Z): the time stopped is not a stall.
                self.policy.on_resume(now);
                vec![self.forward_unless(Signal::SIGCONT)]
            }
        }
    }

    fn on_stop_signal(&mut self, sig: Sig, now: Instant) -> Vec<Order> {
        let (signal, name) = match sig {
            Sig::Int => (Signal::SIGINT, "SIGINT"),
            Sig::Stop(s) => (s, s.as_str()),
            _ => (Signal::SIGTERM, "SIGTERM"),
        };
        let mut out = Vec::new();
        if sig == Sig::Int {
            self.ints += 1;
        }
        if sig == Sig::Int && self.ints >= 2 {
            self.killed = true;
            out.push(Order::KillOnSecondInt);
        } else if let Some(StallStep::Diagnosing { stop_asked }) = self.stall_step() {
            // The stall's evidence is being taken (srun stopping the step
            // because a peer failed, say): the stop follows as soon as it
            // is done, within the grace.
            *stop_asked = true;
            out.push(Order::Deferred(signal));
        } else {
            out.push(self.forward_unless(signal));
            self.kill_at.get_or_insert(now + self.s.grace);
        }
        if self.monitoring() {
            self.state = State::Stopping(StopReason::Signal(name));
        }
        out
    }

    /// SIGUSR1/SIGUSR2. In a batch script, Slurm's pre-timeout signal
    /// becomes a checkpoint request: the checkpoint signal goes to srun,
    /// which delivers it to every process of the step (trainers included),
    /// or straight to a trainer the script runs itself. In a step, the
    /// checkpoint signal is journaled as a request (Slurm delivered it to
    /// the trainer already). Anything else is forwarded (or, in a step,
    /// left to Slurm's delivery).
    fn on_user_signal(&mut self, sig: Signal, now: Instant, wall: DateTime<Utc>) -> Vec<Order> {
        if self.s.supervises_step && sig == self.s.pre_timeout_signal {
            if self.pre_timeout.is_none() {
                self.pre_timeout = Some(PreTimeout {
                    asked_wall: wall,
                    deadline: now + self.s.checkpoint_wait,
                    done: false,
                    coordinated: false,
                });
            }
            return vec![Order::PreTimeoutCheckpoint { received: sig }];
        }
        if self.s.in_step && Some(sig) == self.s.checkpoint_signal {
            return vec![Order::CheckpointSignal {
                received: sig,
                forward: !self.s.slurm_delivers,
            }];
        }
        vec![self.forward_unless(sig)]
    }
}
