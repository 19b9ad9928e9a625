#!/usr/bin/env python3
"""A small DDP training script (torch, gloo on CPU) that works unchanged under
`resilio run --ntasks 4`, under srun with `resilio run`, and under torchrun.

    resilio run --ntasks 4 -- python3 examples/ddp_train.py --steps 200
    sbatch: srun resilio run -- python3 examples/ddp_train.py

It reads the torchrun variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
that resilio exports, resumes from its checkpoint, reports each step with
resilio_client (compute time included, so stragglers can be told apart) and
saves at the step of a coordinated checkpoint request. --crash-rank and
--crash-step inject a crash in the first attempt (benchmarks use it).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
import resilio_client as rc  # noqa: E402  (a no-op without resilio)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--ckpt", default="ddp-checkpoint.pt")
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--crash-rank", type=int, default=-1)
    p.add_argument("--crash-step", type=int, default=-1)
    a = p.parse_args()

    attempt = int(os.environ.get("RESILIO_ATTEMPT") or os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if os.path.exists(a.ckpt):
        state = torch.load(a.ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        if rank == 0:
            print(f"resumed at step {start}", flush=True)

    def save(step):
        if rank == 0:
            tmp = a.ckpt + ".tmp"
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, a.ckpt)
        dist.barrier()

    for step in range(start + 1, a.steps + 1):
        t0 = time.perf_counter()
        x = torch.randn(256, 64)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # the all-reduce happens here
        opt.step()
        compute = time.perf_counter() - t0
        if attempt == 0 and rank == a.crash_rank and step == a.crash_step:
            print(f"rank {rank}: injected crash", flush=True)
            os._exit(1)
        if rank == 0:
            print(f"step {step} attempt {attempt} loss {loss.item():.4f}", flush=True)
        rc.step(step, loss=loss.item(), compute_s=compute)
        ask = rc.checkpoint_requested()
        if step % a.ckpt_every == 0 or (ask is not None and step >= ask):
            rc.phase("checkpoint", step)
            save(step)
            rc.checkpoint_done(step)
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
