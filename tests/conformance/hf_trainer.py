"""A tiny transformers Trainer run, for conformance tests of what HF prints.

A randomly initialised GPT-2 (2 layers, n_embd 32, vocab 128, context 32) on
random tokens; CPU only, no downloads (HF_HUB_OFFLINE=1 is set here).

Usage (python: $(bash tests/torch-venv.sh)/bin/python, with
PYTHONPATH=$(bash tests/conformance/frameworks-venv.sh); the script leaves
PYTHONUNBUFFERED alone, so stdout is block-buffered on a pipe as in real runs):
  python hf_trainer.py [knobs]                          # one process
  torchrun --nproc-per-node 2 hf_trainer.py [knobs]     # DDP over gloo
  resilio run --ntasks 2 -- python hf_trainer.py [knobs]

With WORLD_SIZE > 1 in the environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), the script initialises the process group from
env://, backend gloo, with --pg-timeout (the Trainer would do it itself, but
ignores TrainingArguments.ddp_timeout with use_cpu=True); the Trainer then
uses that group (DDP).

Knobs: see _knobs.py (max-steps, logging-steps, step-sleep, progress,
eval-steps, eval-batches, eval-sleep, save-steps, output-dir, seed,
destroy-pg, pg-timeout, fault, fault-step, fault-rank, fault-once,
fault-exit-code), each also settable as TRAINER_<NAME>. HF-only knobs:
  --log-level passive|info|...   TrainingArguments.log_level (passive: the
                                 transformers default, WARNING, which hides
                                 the "***** Running training *****" banner;
                                 info: as the HF example scripts do)
  --nan-filter 1|0               TrainingArguments.logging_nan_inf_filter (1,
                                 HF's default: a NaN/inf step loss is replaced
                                 by the running mean in the logged `loss`)
  --batch-size N                 per-device batch size (4)
  --train-examples N             training set size (256)
  --eval-compute S               each evaluation computes S seconds at its
                                 first batch without a word (matrix
                                 products): a silent evaluation that works
  --eval-compute-rank R          only rank R computes so (-1: every rank): an
                                 uneven evaluation, the others wait for it
  --first-step-compute S         the first training step computes S seconds
                                 more without a word, on every rank (as a
                                 torch.compile or a cold cache does)
  --save-compute S               each checkpoint save computes S seconds more
                                 without a word, on every rank (a slow
                                 filesystem), after HF's "Saving model
                                 checkpoint to" line (at --log-level info)

Faults fire in a TrainerCallback.on_step_end (hang: asleep in that callback)
after optimizer step K; nan multiplies the loss by NaN in compute_loss.
"""

import os
import sys
import time
from datetime import timedelta

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _knobs  # noqa: E402

EXTRA = [
    ("eval-compute", float, 0.0),
    ("eval-compute-rank", int, -1),
    ("first-step-compute", float, 0.0),
    ("save-compute", float, 0.0),
    ("log-level", str, "passive"),
    ("nan-filter", int, 1),
    ("batch-size", int, 4),
    ("train-examples", int, 256),
]

a = _knobs.parse("hf_trainer.py", __doc__, EXTRA)
rank, world, local_rank = _knobs.dist_env()

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

SEQ = 32
VOCAB = 128


class RandomTokens(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Knobs(TrainerCallback):
    """Slow evaluation and the step faults."""

    def on_evaluate(self, args, state, control, **kw):
        self.computed = False

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kw):
        if a.eval_sleep > 0:
            time.sleep(a.eval_sleep / max(1, a.eval_batches))
        uneven = a.eval_compute_rank not in (-1, rank)
        if a.eval_compute > 0 and not uneven and not getattr(self, "computed", False):
            # A silent evaluation that really works: matrix products for
            # --eval-compute seconds at its first batch, no output meanwhile.
            self.computed = True
            compute(a.eval_compute)

    def on_step_end(self, args, state, control, **kw):
        _knobs.after_step(a, state.global_step, rank)


compute = _knobs.compute


class KnobTrainer(Trainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        if a.step_sleep > 0 and model.training:
            time.sleep(a.step_sleep)
        if a.first_step_compute > 0 and model.training and self.state.global_step == 0 \
                and not getattr(self, "first_done", False):
            self.first_done = True
            compute(a.first_step_compute)
        out = super().compute_loss(model, inputs, *args, **kwargs)
        if model.training and _knobs.nan_now(a, self.state.global_step + 1, rank):
            if isinstance(out, tuple):
                out = (out[0] * float("nan"),) + tuple(out[1:])
            else:
                out = out * float("nan")
        return out

    def _save_checkpoint(self, model, trial, *args, **kwargs):
        out = super()._save_checkpoint(model, trial, *args, **kwargs)
        if a.save_compute > 0:
            compute(a.save_compute)
        return out


def main():
    if world > 1:
        # The Trainer (accelerate's PartialState) would do this itself, but on
        # the CPU (use_cpu=True) it drops TrainingArguments.ddp_timeout, so
        # --pg-timeout could not take effect: do it here, from env://.
        torch.distributed.init_process_group("gloo", init_method="env://",
                                             timeout=timedelta(seconds=a.pg_timeout))
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=SEQ)
    model = GPT2LMHeadModel(cfg)
    train = RandomTokens(a.train_examples, a.seed)
    evald = RandomTokens(a.eval_batches * a.batch_size * world, a.seed + 1) if a.eval_steps else None

    args = TrainingArguments(
        output_dir=a.output_dir,
        max_steps=a.max_steps,
        per_device_train_batch_size=a.batch_size,
        per_device_eval_batch_size=a.batch_size,
        learning_rate=1e-3,
        logging_steps=a.logging_steps,
        logging_strategy="steps",
        eval_strategy="steps" if a.eval_steps else "no",
        eval_steps=a.eval_steps or None,
        save_strategy="steps" if a.save_steps else "no",
        save_steps=a.save_steps or 500,
        disable_tqdm=(a.progress == "off"),
        log_level=a.log_level,
        logging_nan_inf_filter=bool(a.nan_filter),
        use_cpu=True,
        ddp_backend="gloo" if world > 1 else None,
        ddp_timeout=int(a.pg_timeout),
        dataloader_num_workers=0,
        report_to="none",
        seed=a.seed,
    )
    trainer = KnobTrainer(model=model, args=args, train_dataset=train, eval_dataset=evald,
                          callbacks=[Knobs()])
    trainer.train()
    if a.destroy_pg and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
