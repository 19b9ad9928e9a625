"""A tiny Lightning 2.x Trainer run, for conformance tests of what Lightning prints.

A 2-layer MLP regressing random data; CPU only, no downloads.

Usage (python: $(bash tests/torch-venv.sh)/bin/python, with
PYTHONPATH=$(bash tests/conformance/frameworks-venv.sh); the script leaves
PYTHONUNBUFFERED alone, so stdout is block-buffered on a pipe as in real runs):
  python lightning_trainer.py [knobs]                          # one process
  torchrun --nproc-per-node 2 lightning_trainer.py [knobs]     # DDP over gloo
  resilio run --ntasks 2 -- python lightning_trainer.py [knobs]

With WORLD_SIZE > 1 in the environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), the processes are taken as started externally
(Lightning's LightningEnvironment, or TorchElasticEnvironment under torchrun):
devices = LOCAL_WORLD_SIZE (or WORLD_SIZE), num_nodes = WORLD_SIZE / devices,
strategy DDP with process_group_backend="gloo", which initialises the process
group from env://. Several nodes need LOCAL_WORLD_SIZE and NODE_RANK too
(Lightning computes the global rank from them). Under Slurm (SLURM_NTASKS
etc. set) Lightning would pick its SLURMEnvironment instead; this script
does not fight that.

Which progress bar: Lightning's default, i.e. RichProgressBar when rich is
importable, TQDMProgressBar otherwise (PYTHONPATH with or without the rich
directory of frameworks-venv.sh), unless --bar tqdm|rich forces one.

Knobs: see _knobs.py (max-steps, logging-steps, step-sleep, progress,
eval-steps, eval-batches, eval-sleep, save-steps, output-dir, seed,
destroy-pg, pg-timeout, fault, fault-step, fault-rank, fault-once,
fault-exit-code), each also settable as TRAINER_<NAME>. Lightning-only:
  --bar default|tqdm|rich    progress bar class (default: Lightning's choice)
  --batches-per-epoch N      training batches per epoch (25), so that epochs
                             roll over during a 60-step run
  --ckpt-verbose 0|1         ModelCheckpoint(verbose=...) for --save-steps (1)
  --ckpt-monitor NAME        ModelCheckpoint(monitor=NAME) for --save-steps, e.g.
                             train_loss ('' = none). Without a monitor Lightning
                             saves silently even with verbose=True; with one
                             (and verbose) rank 0 logs to stderr
                             "Epoch E, global step S: 'train_loss' reached ..."

Mapping: --logging-steps -> log_every_n_steps (and the loss is logged with
prog_bar=True, so it shows in the bar); --eval-steps N -> val_check_interval=N
with limit_val_batches=--eval-batches (0: no validation); --save-steps N ->
ModelCheckpoint(every_n_train_steps=N, save_top_k=-1); the default
end-of-epoch checkpoint of Lightning stays on (enable_checkpointing=True).

Faults fire in on_train_batch_end (hang: asleep in that hook) once
trainer.global_step == K; nan multiplies the loss by NaN in training_step.
"""

import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _knobs  # noqa: E402

EXTRA = [
    ("bar", str, "default"),
    ("batches-per-epoch", int, 25),
    ("ckpt-verbose", int, 1),
    ("ckpt-monitor", str, ""),
]

a = _knobs.parse("lightning_trainer.py", __doc__, EXTRA)
rank, world, local_rank = _knobs.dist_env()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402

BATCH = 8


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        if a.step_sleep > 0:
            time.sleep(a.step_sleep)
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if _knobs.nan_now(a, self.global_step + 1, self.global_rank):
            loss = loss * float("nan")
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        if a.eval_sleep > 0:
            time.sleep(a.eval_sleep / max(1, a.eval_batches))
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("val_loss", loss, prog_bar=True, sync_dist=True)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        _knobs.after_step(a, self.trainer.global_step, self.global_rank)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(n_batches, seed):
    g = torch.Generator().manual_seed(seed)
    n = n_batches * BATCH * world  # the DistributedSampler splits it over the ranks
    x = torch.randn(n, 32, generator=g)
    y = torch.randn(n, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, num_workers=0)


def main():
    torch.set_num_threads(1)
    L.seed_everything(a.seed)
    callbacks = []
    if a.save_steps:
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(a.output_dir, "checkpoints"),
                                         every_n_train_steps=a.save_steps, save_top_k=-1,
                                         monitor=a.ckpt_monitor or None,
                                         verbose=bool(a.ckpt_verbose)))
    if a.bar == "tqdm":
        from lightning.pytorch.callbacks import TQDMProgressBar
        callbacks.append(TQDMProgressBar())
    elif a.bar == "rich":
        from lightning.pytorch.callbacks import RichProgressBar
        callbacks.append(RichProgressBar())

    if world > 1:
        devices = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        num_nodes = world // devices
        strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=a.pg_timeout))
    else:
        devices, num_nodes, strategy = 1, 1, "auto"

    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        max_steps=a.max_steps,
        log_every_n_steps=a.logging_steps,
        val_check_interval=a.eval_steps if a.eval_steps else None,
        check_val_every_n_epoch=None if a.eval_steps else 1,
        limit_val_batches=a.eval_batches if a.eval_steps else 0,
        num_sanity_val_steps=0,
        enable_progress_bar=(a.progress == "on"),
        default_root_dir=a.output_dir,
        callbacks=callbacks,
    )
    model = Tiny()
    trainer.fit(model, loader(a.batches_per_epoch, a.seed),
                loader(a.eval_batches, a.seed + 1) if a.eval_steps else None)
    if a.destroy_pg and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
