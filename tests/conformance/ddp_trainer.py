"""A plain torch DistributedDataParallel loop, printing the way nanoGPT's
train.py does (the most copied plain-DDP script): only the master process
prints, `iter N: loss X, time Tms` every --logging-steps, `step N: train
loss X, val loss Y` after an evaluation, `saving checkpoint to DIR` before a
save. No framework, no progress bar (--progress is ignored).

A 2-layer MLP regressing random data; CPU only, no downloads.

Usage (python: $(bash tests/torch-venv.sh)/bin/python):
  python ddp_trainer.py [knobs]                          # one process
  torchrun --nproc-per-node 2 ddp_trainer.py [knobs]     # DDP over gloo
  resilio run --ntasks 2 -- python ddp_trainer.py [knobs]

Knobs: see _knobs.py. ddp-only:
  --eval-compute S       each evaluation computes S seconds (matrix products)
                         before its first batch, without a word (0)
  --eval-compute-rank R  only rank R computes so (-1: every rank) (-1)
Evaluation (--eval-steps) runs --eval-batches forward
passes on every rank and averages the loss with an all_reduce; --eval-sleep
is spread over its batches. Checkpoints (--save-steps) are written by the
master process with torch.save to DIR/ckpt.pt (renamed into place), as
nanoGPT does, after a barrier.

Faults fire right after optimizer step K (hang: asleep in the loop;
collective: waiting in a receive from a peer that never sends); nan
multiplies the loss by NaN before backward.
"""

import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _knobs  # noqa: E402

EXTRA = [("eval-compute", float, 0.0), ("eval-compute-rank", int, -1)]
a = _knobs.parse("ddp_trainer.py", __doc__, EXTRA)
rank, world, local_rank = _knobs.dist_env()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

BATCH = 8


def main():
    ddp = world > 1
    if ddp:
        dist.init_process_group("gloo", init_method="env://",
                                timeout=timedelta(seconds=a.pg_timeout))
    master = rank == 0
    torch.set_num_threads(1)
    torch.manual_seed(a.seed + rank)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    if ddp:
        model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(a.seed + 1)
    ex, ey = torch.randn(a.eval_batches * BATCH, 32, generator=g), torch.randn(a.eval_batches * BATCH, 1, generator=g)
    if master:
        print(f"tokens per iteration will be: {BATCH * world * 32:,}")
        os.makedirs(a.output_dir, exist_ok=True)
    t0 = time.time()
    for it in range(1, a.max_steps + 1):
        if a.step_sleep > 0:
            time.sleep(a.step_sleep)
        x, y = torch.randn(BATCH, 32), torch.randn(BATCH, 1)
        loss = nn.functional.mse_loss(model(x), y)
        if _knobs.nan_now(a, it, rank):
            loss = loss * float("nan")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _knobs.after_step(a, it, rank)
        if a.logging_steps and it % a.logging_steps == 0 and master:
            t1 = time.time()
            print(f"iter {it}: loss {loss.item():.4f}, time {(t1 - t0) * 1000 / a.logging_steps:.2f}ms")
            t0 = t1
        if a.eval_steps and it % a.eval_steps == 0:
            model.eval()
            total = torch.zeros(1)
            if a.eval_compute > 0 and a.eval_compute_rank in (-1, rank):
                _knobs.compute(a.eval_compute)
            with torch.no_grad():
                for b in range(a.eval_batches):
                    if a.eval_sleep > 0:
                        time.sleep(a.eval_sleep / max(1, a.eval_batches))
                    total += nn.functional.mse_loss(model(ex[b * BATCH:(b + 1) * BATCH]),
                                                    ey[b * BATCH:(b + 1) * BATCH])
            if ddp:
                dist.all_reduce(total)
            model.train()
            if master:
                print(f"step {it}: train loss {loss.item():.4f}, val loss {total.item() / world / a.eval_batches:.4f}")
        if a.save_steps and it % a.save_steps == 0:
            if ddp:
                dist.barrier()
            if master:
                print(f"saving checkpoint to {a.output_dir}")
                tmp = os.path.join(a.output_dir, "ckpt.pt.tmp")
                raw = model.module if ddp else model
                torch.save({"model": raw.state_dict(), "optimizer": opt.state_dict(), "iter_num": it}, tmp)
                os.replace(tmp, os.path.join(a.output_dir, "ckpt.pt"))
    if ddp:
        dist.barrier()
        if a.destroy_pg:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
