#!/usr/bin/env bash
# The ML frameworks (transformers, lightning, accelerate, tqdm, rich) that the
# conformance trainers of tests/conformance/ run with, layered on the torch
# virtualenv of tests/torch-venv.sh without copying torch: plain directories
# installed with `pip install --no-deps --target`, put on PYTHONPATH. Installed
# once per set of pinned versions into a cache outside the clone, reused
# afterwards; prints a PYTHONPATH value on stdout:
#
#   export PYTHONPATH=$(bash tests/conformance/frameworks-venv.sh)
#   export RESILIO_TEST_PYTHON=$(bash tests/torch-venv.sh)/bin/python
#   $RESILIO_TEST_PYTHON tests/conformance/hf_trainer.py
#
# The value is "<dir>/site:<dir>/rich". rich (and its own dependencies) sits
# in a directory of its own because Lightning changes its default progress bar
# when rich is importable (RichProgressBar instead of TQDMProgressBar):
# `--no-rich` prints "<dir>/site" alone, a world without rich.
#
# The pins are the minimal set that imports and runs the three trainers
# (found by installing with --no-deps and adding what was missing):
# huggingface_hub 2.x wants httpx2/httpcore2/h11/idna/truststore at import;
# its other declared dependencies (typer, pydantic, hf-xet, ...) and
# fsspec[http]'s aiohttp are not needed offline. filelock, fsspec,
# typing_extensions and numpy come from the torch virtualenv. About 200 MB
# (lightning and pytorch_lightning are two copies of the same code), 30 s to
# install here. The trainers' findings are in FINDINGS.md.
#
# Environment: as tests/torch-venv.sh (RESILIO_CI_CACHE,
# RESILIO_TEST_BASE_PYTHON).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
want_rich=1
[ "${1:-}" = --no-rich ] && want_rich=0

PINS=(
  transformers==5.24.0
  lightning==2.6.6
  pytorch-lightning==2.6.6
  accelerate==1.15.0
  tqdm==4.70.1
  huggingface_hub==2.4.0
  tokenizers==0.23.3
  safetensors==0.8.0
  regex==2026.11.19
  PyYAML==6.0.4
  packaging==26.4
  lightning-utilities==0.15.3
  torchmetrics==1.9.0
  psutil==7.2.2
  httpx2==2.16.2
  httpcore2==2.16.2
  h11==0.16.0
  idna==3.20
  truststore==0.10.5
)
RICH_PINS=(
  rich==15.0.0
  markdown-it-py==4.3.0
  mdurl==0.1.2
  Pygments==2.21.0
)

TORCH_VENV=$(bash "$here/../torch-venv.sh")
PY=$TORCH_VENV/bin/python
# torch-venv.sh's directory name carries the torch and Python versions.
key=$(printf '%s\n' "${PINS[@]}" "${RICH_PINS[@]}" "$(basename "$TORCH_VENV")" | sha1sum | cut -c1-10)
CACHE=$(dirname "$TORCH_VENV")
DIR=$CACHE/frameworks-tf5.24.0-pl2.6.6-acc1.15.0-$key

usable() { # complete, and the torch virtualenv's interpreter runs
  [ -f "$DIR/.complete" ] && "$PY" -c 'import sys' >/dev/null 2>&1
}

if ! usable; then
  exec 9>"$CACHE/.frameworks.lock" # not torch-venv.sh's .lock: it takes that one itself
  flock 9
  if ! usable; then
    echo "tests/conformance/frameworks-venv.sh: installing ${PINS[*]} ${RICH_PINS[*]} into $DIR" >&2
    t0=$(date +%s)
    rm -rf "$DIR"
    mkdir -p "$DIR"
    pip=("$PY" -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps)
    "${pip[@]}" --target "$DIR/site" "${PINS[@]}" >&2
    "${pip[@]}" --target "$DIR/rich" "${RICH_PINS[@]}" >&2
    HF_HUB_OFFLINE=1 PYTHONPATH=$DIR/site "$PY" -c '
import transformers, lightning, accelerate, tqdm
from transformers import Trainer, TrainingArguments, GPT2LMHeadModel
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE
assert not _RICH_AVAILABLE, "rich visible without rich/"
print("transformers", transformers.__version__, "lightning", lightning.__version__,
      "accelerate", accelerate.__version__, "tqdm", tqdm.__version__)' >&2
    HF_HUB_OFFLINE=1 PYTHONPATH=$DIR/site:$DIR/rich "$PY" -c '
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE
assert _RICH_AVAILABLE, "rich not visible"' >&2
    touch "$DIR/.complete"
    echo "tests/conformance/frameworks-venv.sh: installed in $(($(date +%s) - t0)) s, $(du -sh "$DIR" | cut -f1)" >&2
  fi
  exec 9>&-
fi
if [ "$want_rich" = 1 ]; then
  echo "$DIR/site:$DIR/rich"
else
  echo "$DIR/site"
fi
