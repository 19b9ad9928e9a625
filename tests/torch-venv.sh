#!/usr/bin/env bash
# The virtualenv with real torch and py-spy (both from PyPI) that the tests
# of real torch.distributed training use (tests/agent/ddp.rs). Installed once
# per torch / py-spy / Python version into a cache outside the clone, reused
# afterwards; prints the virtualenv's path on stdout.
#
#   export RESILIO_TEST_PYTHON=$(bash tests/torch-venv.sh)/bin/python
#
# tests/run.sh calls it. PyPI's torch for Linux x86_64 is the CUDA build:
# `pip install --no-deps torch` (a 540 MB wheel) cannot even be imported, as
# libtorch links libcudart and friends, so the nvidia packages come along
# (about 3 GB to download, 5.3 GB installed; about 2 minutes here). torch
# runs on the CPU all the same (gloo), without a GPU or a driver.
#
# Environment: RESILIO_CI_CACHE (default /var/cache/resilio-ci, or
# ~/.cache/resilio-ci when that is not writable), RESILIO_TEST_BASE_PYTHON
# (default python3).
set -euo pipefail

TORCH_VERSION=2.15.0
PYSPY_VERSION=0.4.3
NUMPY_VERSION=2.4.6 # torch warns on every import without numpy

PY=${RESILIO_TEST_BASE_PYTHON:-python3}
pyver=$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
CACHE=${RESILIO_CI_CACHE:-/var/cache/resilio-ci}
if ! mkdir -p "$CACHE" 2>/dev/null || [ ! -w "$CACHE" ]; then
  CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/resilio-ci
  mkdir -p "$CACHE"
fi
VENV=$CACHE/torch-$TORCH_VERSION-pyspy-$PYSPY_VERSION-py$pyver

usable() { # complete, and its interpreter still runs (a venv points at its base Python)
  [ -f "$VENV/.complete" ] && "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1 &&
    [ -x "$VENV/bin/py-spy" ] && [ -x "$VENV/py-spy-only/py-spy" ]
}

if ! usable; then
  exec 9>"$CACHE/.lock"
  flock 9 # another run installing the same thing: wait for it
  if ! usable; then
    echo "tests/torch-venv.sh: installing torch $TORCH_VERSION and py-spy $PYSPY_VERSION into $VENV" >&2
    t0=$(date +%s)
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check \
      "torch==$TORCH_VERSION" "py-spy==$PYSPY_VERSION" "numpy==$NUMPY_VERSION" >&2
    "$VENV/bin/python" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available(), "no gloo"' >&2
    "$VENV/bin/py-spy" --version >&2
    # py-spy alone, for PATH (the venv's bin/ would also shadow python3).
    mkdir -p "$VENV/py-spy-only"
    ln -sf ../bin/py-spy "$VENV/py-spy-only/py-spy"
    touch "$VENV/.complete"
    echo "tests/torch-venv.sh: installed in $(($(date +%s) - t0)) s" >&2
  fi
  exec 9>&-
fi
echo "$VENV"
