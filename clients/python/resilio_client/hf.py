"""A Hugging Face Trainer callback for resilio (optional; importable without transformers).

    from resilio_client.hf import ResilioCallback
    trainer = Trainer(..., callbacks=[ResilioCallback()])

Says when a resumed run has loaded its checkpoint, reports every step (with
its loss when logged, and compute time), and when a
coordinated checkpoint is requested sets ``control.should_save`` at that step,
so the Trainer saves through its own checkpointing; ``on_save`` confirms it.
"""

import time

import resilio_client as rc

try:
    from transformers import TrainerCallback as _Base  # type: ignore
except Exception:  # pragma: no cover - depends on what is installed
    _Base = object


class ResilioCallback(_Base):
    def __init__(self):
        super().__init__()
        self._t0 = None
        self._loss = None
        self._saving = None

    def on_train_begin(self, args, state, control, **kwargs):
        # Resumed: the Trainer has loaded the checkpoint's weights, optimizer
        # and state by now.
        if int(getattr(state, "global_step", 0) or 0) > 0:
            rc.restored(int(state.global_step))

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self._loss = logs["loss"]

    def on_step_end(self, args, state, control, **kwargs):
        step = int(state.global_step)
        compute = time.perf_counter() - self._t0 if self._t0 is not None else None
        rc.step(step, loss=self._loss, compute_s=compute)
        ask = rc.checkpoint_requested()
        if ask is not None and step >= ask:
            rc.phase("checkpoint", step)
            self._saving = step
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        step = int(state.global_step)
        if self._saving is not None:
            rc.checkpoint_done(step)
            rc.phase("train")
            self._saving = None
        return control
