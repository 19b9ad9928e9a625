#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what the tests need, then runs
# unit and integration tests. Usage: bash tests/run.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
# The torch virtualenv below (Debian's python3 has no ensurepip without it).
python3 -c 'import ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
# The SPANK plugin (slurm-plugin/) is built with make by the Slurm suite.
command -v make >/dev/null 2>&1 || need_apt+=(make)
# The HTML timeline is rendered in headless Chromium by a test.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# The wall clock is stepped under resilio with libfaketime (tests/agent/chaos.rs).
command -v faketime >/dev/null 2>&1 || need_apt+=(faketime)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "tests/run.sh: installing ${need_apt[*]}" >&2
  if [ "$(id -u)" -ne 0 ]; then
    echo "tests/run.sh: need root to install ${need_apt[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Real torch (CPU, gloo) and py-spy from PyPI, for the tests of real
# torch.distributed hangs (tests/agent/ddp.rs): installed once into a cache
# outside the clone (about 1-2 min and 5.3 GB the first time), reused after.
# Those tests fail here without it (RESILIO_REQUIRE_TORCH=1); a plain `cargo
# test` without RESILIO_TEST_PYTHON skips them and says why. Real py-spy is on
# PATH for the whole suite, so every stall's diagnostics run the real thing.
venv=$(bash tests/torch-venv.sh)
export RESILIO_TEST_PYTHON=$venv/bin/python
export RESILIO_REQUIRE_TORCH=1
export PATH=$venv/py-spy-only:$PATH
# The real frameworks of the conformance suite (tests/conformance.rs): HF
# transformers, Lightning, accelerate and rich from PyPI, pinned, layered on
# that virtualenv (a PYTHONPATH; about 200 MB and 30 s the first time).
RESILIO_TEST_FRAMEWORKS=$(bash tests/conformance/frameworks-venv.sh)
export RESILIO_TEST_FRAMEWORKS

# The real Slurm cluster the end-to-end tests run on (installs Slurm, munge and
# MariaDB from Debian's packages when missing; takes it down again afterwards
# unless it was already up).
was_up=0
bash tests/slurm/testbed.sh status >/dev/null 2>&1 && was_up=1
bash tests/slurm/testbed.sh up
if [ "$was_up" = 0 ]; then
  trap 'bash tests/slurm/testbed.sh down >/dev/null 2>&1 || true' EXIT
fi

# Every suite runs (--no-fail-fast); the last line sums them all, because
# cargo's own last line is the empty doc-test run's "0 passed". The fuzz
# targets come after (tests/fuzz.sh: built, each run 10 s over its seed
# corpus), their line counted in the sum, one test per target; then the
# packages (tests/packaging.sh: the .deb and the RPM built, the .deb
# installed, used and purged), one test per check.
#
# The fuzz build and the packages' release build take about 8 minutes of both
# cores from cold, and the Slurm suite mostly waits on Slurm: so once the
# tests are built, those two builds run in the background at idle priority
# (SCHED_IDLE: they get a core only when no test wants it), and fuzz.sh and
# packaging.sh find them done. Whatever the background build did, they build
# again what is not up to date and report its failure themselves.
log=$(mktemp)
ahead=$(mktemp)
set +e
cargo test --locked --no-run 2>&1 | tee "$log"
(
  idle=()
  command -v chrt >/dev/null 2>&1 && idle+=(chrt --idle 0)
  command -v ionice >/dev/null 2>&1 && idle+=(ionice -c 3)
  RESILIO_FUZZ_BUILD_ONLY=1 "${idle[@]}" nice -n 19 bash tests/fuzz.sh
  RESILIO_PACKAGING_BUILD_ONLY=1 "${idle[@]}" nice -n 19 bash packaging/build.sh deb rpm
) >"$ahead" 2>&1 &
ahead_pid=$!
cargo test --locked --no-fail-fast "$@" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
wait "$ahead_pid"
echo "tests/run.sh: built ahead: $(grep -c . "$ahead") line(s) of output, last: $(tail -n 1 "$ahead")"
rm -f "$ahead"
bash tests/fuzz.sh 2>&1 | tee -a "$log"
fuzz_status=${PIPESTATUS[0]}
[ "$status" -ne 0 ] || status=$fuzz_status
bash tests/packaging.sh 2>&1 | tee -a "$log"
packaging_status=${PIPESTATUS[0]}
[ "$status" -ne 0 ] || status=$packaging_status
set -e
awk '/^test result:/ { for (i = 2; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
rm -f "$log"
exit "$status"
