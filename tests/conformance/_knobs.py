"""Knobs and fault injection shared by the conformance trainers.

Every knob is a command-line option `--name value` whose default comes from
the environment variable TRAINER_<NAME> (upper case, '-' -> '_'), then from
the built-in default below. So `--max-steps 40` and `TRAINER_MAX_STEPS=40`
mean the same; the command line wins.

Common knobs (all trainers):
  --max-steps N         optimizer steps to run (60)
  --logging-steps N     log the loss every N steps (10)
  --step-sleep S        seconds each training step sleeps on every rank, to
                        pace the run like a real one (0.05)
  --progress on|off     progress bar on or off (on). HF: disable_tqdm;
                        Lightning: enable_progress_bar; accelerate: tqdm disable
  --eval-steps N        evaluate every N steps; 0 = never (0)
  --eval-batches N      batches per evaluation (4)
  --eval-sleep S        extra seconds one evaluation takes, spread over its
                        batches, on every rank (0)
  --save-steps N        checkpoint every N steps; 0 = never (0)
  --output-dir DIR      checkpoints and logs (./out-<trainer>)
  --seed N              (0)
  --destroy-pg 0|1      call torch.distributed.destroy_process_group() at the
                        end (0: like most real scripts, which don't)
  --pg-timeout S        process-group (gloo) collective timeout in seconds (1800,
                        torch's default); lower it to have the surviving ranks
                        of a hang fail sooner

Fault knobs:
  --fault KIND          none | hang | collective | crash | sigkill | nan | exit
                        (none)
                          hang:    the rank sleeps forever in its own code
                                   (time.sleep in a loop, in a callback /
                                   right after the optimizer step)
                          collective: the rank waits forever in a
                                   torch.distributed receive from the next
                                   rank, which never sends (stuck in
                                   communication, as a rank in a collective
                                   that never completes; its peers then
                                   wait for it in the next step's all_reduce)
                          crash:   raise RuntimeError
                          sigkill: os.kill(os.getpid(), SIGKILL)
                          exit:    os._exit(--fault-exit-code)
                          nan:     the loss of that rank is NaN from that
                                   step on (so the gradients and, after the
                                   optimizer step, the weights of all ranks)
  --fault-step K        the step at which the fault fires: right after
                        optimizer step K completed (global step == K);
                        for nan, the loss of step K is the first NaN (20)
  --fault-rank R        global rank that faults; -1 = every rank (0)
  --fault-once PATH     if set: fire only when PATH does not exist, creating
                        it just before firing (for restart tests) ('')
  --fault-exit-code N   exit code for --fault exit (3)

Distributed: when WORLD_SIZE > 1 the process group is initialised from
env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LOCAL_RANK for the
device), gloo backend, CPU only. torchrun or `resilio run --ntasks N` set them.

Each fault prints one line to stderr before firing:
  conformance: fault <kind> after update <K> on rank <R>
(worded so that no step pattern reads it: the faulty rank stays as silent
as a real one)
"""

import argparse
import os
import signal
import sys
import time

COMMON = [
    # name, type, default
    ("max-steps", int, 60),
    ("logging-steps", int, 10),
    ("step-sleep", float, 0.05),
    ("progress", str, "on"),
    ("eval-steps", int, 0),
    ("eval-batches", int, 4),
    ("eval-sleep", float, 0.0),
    ("save-steps", int, 0),
    ("output-dir", str, None),
    ("seed", int, 0),
    ("destroy-pg", int, 0),
    ("pg-timeout", float, 1800.0),
    ("fault", str, "none"),
    ("fault-step", int, 20),
    ("fault-rank", int, 0),
    ("fault-once", str, ""),
    ("fault-exit-code", int, 3),
]

FAULTS = ("none", "hang", "collective", "crash", "sigkill", "nan", "exit")


def env_name(name):
    return "TRAINER_" + name.upper().replace("-", "_")


def parse(prog, doc, extra=(), argv=None):
    """Parse the common knobs plus `extra` ones ((name, type, default, help))."""
    p = argparse.ArgumentParser(prog=prog, description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, typ, default, *_ in list(COMMON) + list(extra):
        env = os.environ.get(env_name(name))
        if env is not None:
            default = typ(env)
        p.add_argument("--" + name, type=typ, default=default,
                       help="env %s (default %r)" % (env_name(name), default))
    a = p.parse_args(argv)
    if a.fault not in FAULTS:
        p.error("--fault must be one of " + ", ".join(FAULTS))
    if a.progress not in ("on", "off"):
        p.error("--progress must be on or off")
    if a.output_dir is None:
        a.output_dir = "./out-" + prog.replace("_trainer.py", "").replace(".py", "")
    return a


def dist_env():
    """(rank, world_size, local_rank) from the torchrun-style environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local


def fault_applies(a, rank):
    if a.fault == "none":
        return False
    if a.fault_rank not in (-1, rank):
        return False
    if a.fault_once:
        if os.path.exists(a.fault_once):
            return False
    return True


def _announce(a, step, rank):
    if a.fault_once:
        try:
            with open(a.fault_once, "x") as f:
                f.write("%s step %d rank %d\n" % (a.fault, step, rank))
        except FileExistsError:
            pass  # the other rank of a --fault-rank -1 run got there first
    sys.stderr.write("conformance: fault %s after update %d on rank %d\n" % (a.fault, step, rank))
    sys.stderr.flush()


def after_step(a, step, rank):
    """Call right after optimizer step `step` (1-based) completed. Fires the
    hang / collective / crash / sigkill / exit faults."""
    if step != a.fault_step or a.fault in ("none", "nan") or not fault_applies(a, rank):
        return
    _announce(a, step, rank)
    sys.stdout.flush()
    if a.fault == "hang":
        while True:  # asleep in our own code, forever
            time.sleep(3600)
    if a.fault == "collective":
        import torch
        import torch.distributed as dist
        peer = (rank + 1) % dist.get_world_size()
        dist.recv(torch.zeros(1), src=peer)  # nobody sends: waits forever
    if a.fault == "crash":
        raise RuntimeError("conformance: injected crash at step %d on rank %d" % (step, rank))
    if a.fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if a.fault == "exit":
        os._exit(a.fault_exit_code)


_nan_announced = False


def nan_now(a, step, rank):
    """True when the loss of (1-based) step `step` on this rank must be NaN."""
    global _nan_announced
    if a.fault != "nan" or step < a.fault_step:
        return False
    if not _nan_announced:
        if not fault_applies(a, rank):
            return False
        _announce(a, step, rank)
        _nan_announced = True
    return True


def compute(seconds):
    """Matrix products for `seconds`: work, not sleep, and no output."""
    import torch
    m = torch.randn(256, 256)
    t = time.time()
    while time.time() - t < seconds:
        m = torch.tanh(m @ m)
