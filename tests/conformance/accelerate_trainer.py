"""A plain training loop with accelerate's Accelerator, printing the way the
accelerate example scripts do (examples/by_feature/*, run_clm_no_trainer.py):
an INFO banner through accelerate's get_logger with logging.basicConfig's
format, a tqdm bar on the local main process only, `accelerator.print` lines
for the loss every --logging-steps, eval results through logger.info,
accelerator.save_state for checkpoints.

A 2-layer MLP regressing random data; CPU only, no downloads.

Usage (python: $(bash tests/torch-venv.sh)/bin/python, with
PYTHONPATH=$(bash tests/conformance/frameworks-venv.sh); the script leaves
PYTHONUNBUFFERED alone, so stdout is block-buffered on a pipe as in real runs):
  python accelerate_trainer.py [knobs]                          # one process
  torchrun --nproc-per-node 2 accelerate_trainer.py [knobs]     # DDP over gloo
  resilio run --ntasks 2 -- python accelerate_trainer.py [knobs]

With WORLD_SIZE > 1 in the environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), the script initialises the process group from
env:// (gloo, --pg-timeout) before creating the Accelerator, which then runs
as MULTI_CPU on it.

Knobs: see _knobs.py (max-steps, logging-steps, step-sleep, progress,
eval-steps, eval-batches, eval-sleep, save-steps, output-dir, seed,
destroy-pg, pg-timeout, fault, fault-step, fault-rank, fault-once,
fault-exit-code), each also settable as TRAINER_<NAME>. accelerate-only:
  --batches-per-epoch N   training batches per epoch per rank (25)

Lines it prints itself (besides the tqdm bar, on stderr):
  <date> <time> - INFO - __main__ - ***** Running training *****   (banner, rank 0)
  step <N>: loss <x.xxxx>                        (stdout, main process, every --logging-steps)
  <date> <time> - INFO - __main__ - step <N>: eval_loss: <x.xxxx>  (stderr, rank 0)
  <date> <time> - INFO - accelerate.accelerator - Saving current state to <dir>  (accelerate's own)

Faults fire right after optimizer step K (hang: asleep in the loop);
nan multiplies the loss by NaN before backward.
"""

import logging
import math
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _knobs  # noqa: E402

EXTRA = [("batches-per-epoch", int, 25)]

a = _knobs.parse("accelerate_trainer.py", __doc__, EXTRA)
rank, world, local_rank = _knobs.dist_env()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.logging import get_logger  # noqa: E402
from accelerate.utils import set_seed  # noqa: E402

logger = get_logger(__name__)
BATCH = 8


def loader(n_batches, seed, shuffle):
    g = torch.Generator().manual_seed(seed)
    n = n_batches * BATCH * world  # prepare() shards it over the ranks
    x = torch.randn(n, 32, generator=g)
    y = torch.randn(n, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=shuffle)


def main():
    if world > 1:
        torch.distributed.init_process_group("gloo", init_method="env://",
                                             timeout=timedelta(seconds=a.pg_timeout))
    torch.set_num_threads(1)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", level=logging.INFO)
    accelerator = Accelerator(cpu=True)
    logger.info(accelerator.state, main_process_only=False)
    set_seed(a.seed)

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train_dl = loader(a.batches_per_epoch, a.seed, True)
    eval_dl = loader(a.eval_batches, a.seed + 1, False)
    model, opt, train_dl, eval_dl = accelerator.prepare(model, opt, train_dl, eval_dl)

    epochs = math.ceil(a.max_steps / len(train_dl))
    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {len(train_dl.dataset)}")
    logger.info(f"  Num Epochs = {epochs}")
    logger.info(f"  Instantaneous batch size per device = {BATCH}")
    logger.info(f"  Total train batch size (w. parallel, distributed & accumulation) = {BATCH * world}")
    logger.info("  Gradient Accumulation steps = 1")
    logger.info(f"  Total optimization steps = {a.max_steps}")
    bar = tqdm(range(a.max_steps), disable=(a.progress == "off" or not accelerator.is_local_main_process))

    step = 0
    for epoch in range(epochs):
        model.train()
        for x, y in train_dl:
            if a.step_sleep > 0:
                time.sleep(a.step_sleep)
            loss = nn.functional.mse_loss(model(x), y)
            if _knobs.nan_now(a, step + 1, accelerator.process_index):
                loss = loss * float("nan")
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            step += 1
            bar.update(1)
            _knobs.after_step(a, step, accelerator.process_index)
            if a.logging_steps and step % a.logging_steps == 0:
                accelerator.print(f"step {step}: loss {loss.item():.4f}")
            if a.eval_steps and step % a.eval_steps == 0:
                model.eval()
                losses = []
                for ex, ey in eval_dl:
                    if a.eval_sleep > 0:
                        time.sleep(a.eval_sleep / max(1, a.eval_batches))
                    with torch.no_grad():
                        el = nn.functional.mse_loss(model(ex), ey)
                    losses.append(accelerator.gather_for_metrics(el.reshape(1)))
                logger.info(f"step {step}: eval_loss: {torch.cat(losses).mean().item():.4f}")
                model.train()
            if a.save_steps and step % a.save_steps == 0:
                accelerator.save_state(os.path.join(a.output_dir, f"step_{step}"))
            if step >= a.max_steps:
                break
        if step >= a.max_steps:
            break
    accelerator.wait_for_everyone()
    if a.destroy_pg:
        # Accelerator.end_training() destroys the process group; the examples
        # call it only with trackers on (--with_tracking), so not by default.
        accelerator.end_training()


if __name__ == "__main__":
    main()
