#!/usr/bin/env bash
# The fuzz targets (fuzz/: cargo-fuzz and libFuzzer), built and each run
# briefly over its committed seed corpus: a crash, a timeout or an
# out-of-memory in any of them fails. tests/run.sh calls it; its last line
# is in cargo's format (one "test" per target) for run.sh's sum.
#
#   bash tests/fuzz.sh                       # every target, 10 s each
#   RESILIO_FUZZ_SECS=600 bash tests/fuzz.sh hostlist   # one, 10 minutes
#
# Stable Rust only: `cargo fuzz build --sanitizer none` passes rustc only
# stable flags (-Cpasses=sancov-module, -Cllvm-args=..., --cfg fuzzing,
# -Cdebug-assertions); a sanitizer would need -Zsanitizer, so nightly, and
# the paths fuzzed are safe Rust. cargo-fuzz itself is installed once per
# version from crates.io into a cache outside the clone (about 45 s), like
# tests/torch-venv.sh; the fuzz build's target dir is kept there too, so a
# fresh clone rebuilds only resilio and the targets. Measured from a fresh
# clone (2 cores, other builds running): 4 min 50 s with nothing cached,
# 1 min 43 s with the cache (build 68 s, the runs 35 s). A debug build
# (`--dev`) builds in 65 s instead of about 3 minutes but runs 20 to 100
# times slower: too slow for the hostlist seeds.
#
# Environment: RESILIO_CI_CACHE (default /var/cache/resilio-ci, or
# ~/.cache/resilio-ci when that is not writable), RESILIO_FUZZ_SECS
# (default 10), RESILIO_FUZZ_BUILD_ONLY (set: build, run nothing).
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
SECS=${RESILIO_FUZZ_SECS:-10}
t0=$(date +%s)

CACHE=${RESILIO_CI_CACHE:-/var/cache/resilio-ci}
if ! mkdir -p "$CACHE" 2>/dev/null || [ ! -w "$CACHE" ]; then
  CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/resilio-ci
  mkdir -p "$CACHE"
fi
ROOT=$CACHE/cargo-fuzz-$CARGO_FUZZ_VERSION
if [ ! -x "$ROOT/bin/cargo-fuzz" ]; then
  exec 9>"$CACHE/.lock"
  flock 9 # another run installing the same thing: wait for it
  if [ ! -x "$ROOT/bin/cargo-fuzz" ]; then
    echo "tests/fuzz.sh: installing cargo-fuzz $CARGO_FUZZ_VERSION into $ROOT" >&2
    rm -rf "$ROOT.partial"
    cargo install --quiet --locked --root "$ROOT.partial" cargo-fuzz --version "$CARGO_FUZZ_VERSION" >&2
    rm -rf "$ROOT"
    mv "$ROOT.partial" "$ROOT"
  fi
  exec 9>&-
fi
export PATH=$ROOT/bin:$PATH

# libFuzzer is C++, built by libfuzzer-sys's build script.
if ! command -v c++ >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "tests/fuzz.sh: need root to install g++" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
fi

# One target dir for every clone (cargo locks it while building).
TARGET_DIR=$CACHE/fuzz-target
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cd fuzz && cargo fuzz list)
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "tests/fuzz.sh: building ${targets[*]} (cargo fuzz build --sanitizer none)" >&2
build=(cargo fuzz build --sanitizer none --target-dir "$TARGET_DIR")
if [ $# -eq 0 ]; then
  (cd fuzz && "${build[@]}") >"$scratch/build.log" 2>&1 || build_failed=1
else
  for t in "${targets[@]}"; do
    (cd fuzz && "${build[@]}" "$t") >>"$scratch/build.log" 2>&1 || build_failed=1
  done
fi
if [ -n "${build_failed:-}" ]; then
  tail -n 40 "$scratch/build.log"
  echo "test result: FAILED. 0 passed; ${#targets[@]} failed; 0 ignored; 0 measured; 0 filtered out (the fuzz build failed)"
  exit 1
fi
built=$(date +%s)
# tests/run.sh builds ahead, at idle priority, while the other suites run.
if [ -n "${RESILIO_FUZZ_BUILD_ONLY:-}" ]; then
  echo "tests/fuzz.sh: built in $((built - t0)) s" >&2
  exit 0
fi
bin=$TARGET_DIR/x86_64-unknown-linux-gnu/release

# Each target over a scratch corpus plus its seeds (the seeds stay as
# committed: libFuzzer writes new inputs to the first directory only),
# two at a time (2 cores).
run() {
  local t=$1 dir=$scratch/$1 rc=0
  mkdir -p "$dir/corpus" "$dir/artifacts"
  "$bin/$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" "$dir/corpus" "fuzz/corpus/$t" >"$dir/log" 2>&1 || rc=$?
  echo "$rc" >"$dir/rc"
}
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  run "${targets[i]}" &
  if [ $((i + 1)) -lt ${#targets[@]} ]; then run "${targets[i + 1]}" & fi
  wait
done

passed=0
failed=0
for t in "${targets[@]}"; do
  dir=$scratch/$t
  execs=$(awk '/stat::number_of_executed_units/ { print $2 }' "$dir/log")
  rc=$(cat "$dir/rc" 2>/dev/null || echo "?")
  if [ "$rc" = 0 ] && [ -z "$(ls -A "$dir/artifacts")" ]; then
    echo "test fuzz::$t ... ok (${SECS} s, ${execs:-?} executions)"
    passed=$((passed + 1))
  else
    echo "test fuzz::$t ... FAILED (exit $rc)"
    grep -E -A12 "panicked at|ERROR: libFuzzer|SUMMARY" "$dir/log" | head -n 40 || tail -n 30 "$dir/log"
    for a in "$dir"/artifacts/*; do
      [ -e "$a" ] || continue
      echo "--- input $(basename "$a") (base64; 'base64 -d' it into fuzz/corpus/$t/ to keep it):"
      base64 -w 76 "$a" | head -n 40
    done
    failed=$((failed + 1))
  fi
done
end=$(date +%s)
result=ok
[ "$failed" -eq 0 ] || result=FAILED
echo "test result: $result. $passed passed; $failed failed; 0 ignored; 0 measured; 0 filtered out; finished in $((end - t0))s (build $((built - t0))s)"
[ "$failed" -eq 0 ]
