"""A PyTorch Lightning callback for resilio (optional; importable without Lightning).

    from resilio_client.lightning import ResilioCallback
    trainer = L.Trainer(callbacks=[ResilioCallback()])

Says when a resumed run has restored its checkpoint, reports every optimizer
step with its loss and the batch's compute time, and
saves a checkpoint at the step a coordinated request names (through the
trainer's own ``save_checkpoint``), announcing the phase so that a long save
is not taken for a hang.
"""

import os
import time

import resilio_client as rc

try:  # Lightning 2.x, then the older package name; neither is required.
    from lightning.pytorch.callbacks import Callback as _Base  # type: ignore
except Exception:  # pragma: no cover - depends on what is installed
    try:
        from pytorch_lightning.callbacks import Callback as _Base  # type: ignore
    except Exception:
        _Base = object


class ResilioCallback(_Base):
    def __init__(self, dirpath=None):
        super().__init__()
        self.dirpath = dirpath
        self._t0 = None

    def on_train_start(self, trainer, pl_module):
        # Resumed (``fit(ckpt_path=...)``): every state is restored by now.
        if int(getattr(trainer, "global_step", 0) or 0) > 0:
            rc.restored(int(trainer.global_step))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = int(getattr(trainer, "global_step", batch_idx))
        loss = None
        try:
            loss = float(outputs["loss"]) if isinstance(outputs, dict) else float(outputs)
        except Exception:
            pass
        compute = time.perf_counter() - self._t0 if self._t0 is not None else None
        rc.step(step, loss=loss, compute_s=compute)
        ask = rc.checkpoint_requested()
        if ask is not None and step >= ask:
            rc.phase("checkpoint", step)
            d = self.dirpath or getattr(trainer, "default_root_dir", ".")
            trainer.save_checkpoint(os.path.join(d, "resilio-step-%d.ckpt" % step))
            rc.checkpoint_done(step)
            rc.phase("train")
