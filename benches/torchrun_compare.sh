#!/usr/bin/env bash
# Failure-to-relaunch time and agent memory: resilio's local mode next to
# torchrun, in the same run, on the same crashing DDP script (gloo on CPU).
#
#   bash benches/torchrun_compare.sh [ROUNDS]
#
# Installs torch into its own virtualenv (the registry's wheel is the CUDA
# build, about 2.8 GB to download and 5 GB installed), so it is not part of
# the test suite. What it prints:
#   - failure -> first step of the next attempt, median of ROUNDS (default 5),
#     for `resilio run --ntasks 4` and `torchrun --nproc-per-node 4 --max-restarts 1`;
#   - peak RSS of resilio's launcher and one rank agent, next to torchrun's agent.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
LIMIT=${LIMIT:-120}   # a run longer than this is cut and its restart counted as hung
VENV=${TORCH_VENV:-/var/tmp/resilio-torch-venv}
if [ ! -x "$VENV/bin/torchrun" ]; then
  echo "installing torch into $VENV (large download)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch
fi
cargo build --release -q
BIN=$PWD/target/release/resilio
SCRIPT=$PWD/examples/ddp_train.py
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PATH="$VENV/bin:$PATH"

# The script prints "step N" after every all-reduce and crashes (rank 2, step 5)
# in the first attempt only; both tools restart it once.
first_step_after_crash() { # stamped output file -> seconds from the crash line to the next "step" line
  python3 - "$1" <<'PY'
import sys
t_crash = None
for line in open(sys.argv[1]):
    t, _, text = line.partition(" ")
    if "injected crash" in text and t_crash is None:
        t_crash = float(t)
    elif t_crash is not None and text.startswith("step") and "attempt 1" in text:
        print(f"{float(t) - t_crash:.3f}")
        break
else:
    print("hung")
PY
}
stamp() { python3 -u -c '
import sys, time
for line in sys.stdin:
    sys.stdout.write(f"{time.time():.4f} {line}"); sys.stdout.flush()'; }

peak_rss_of() { # command pattern -> max VmHWM in MiB over matching processes, sampled
  local pat=$1 max=0
  for p in $(pgrep -f "$pat" || true); do
    v=$(awk '/VmHWM/ {print $2}' /proc/$p/status 2>/dev/null || echo 0)
    [ "${v:-0}" -gt "$max" ] && max=$v
  done
  echo $((max / 1024))
}

r_times=(); t_times=(); r_rss=0; a_rss=0; t_rss=0
for i in $(seq 1 "$ROUNDS"); do
  rm -rf "$WORK/ck"; mkdir -p "$WORK/ck"
  ( RESILIO_STATE_DIR=$WORK/state timeout --kill-after=5 "$LIMIT" "$BIN" run --ntasks 4 --kill-grace 5s --max-restarts 1 --job-id "bench-$i" -- \
      python3 "$SCRIPT" --steps 12 --crash-rank 2 --crash-step 5 --ckpt "$WORK/ck/r" 2>&1 | stamp > "$WORK/r.$i" ) &
  bg=$!
  sleep 3
  r_rss=$(( $(peak_rss_of "resilio run --ntasks") > r_rss ? $(peak_rss_of "resilio run --ntasks") : r_rss ))
  a_rss=$(( $(peak_rss_of "resilio run --state-dir") > a_rss ? $(peak_rss_of "resilio run --state-dir") : a_rss ))
  wait $bg || true
  r_times+=("$(first_step_after_crash "$WORK/r.$i")")

  rm -rf "$WORK/ck"; mkdir -p "$WORK/ck"
  ( timeout --kill-after=5 "$LIMIT" torchrun --nproc-per-node 4 --max-restarts 1 --master-port $((29600 + i)) \
      "$SCRIPT" --steps 12 --crash-rank 2 --crash-step 5 --ckpt "$WORK/ck/t" 2>&1 | stamp > "$WORK/t.$i" ) &
  bg=$!
  sleep 3
  v=$(peak_rss_of "bin/torchrun"); [ "$v" -gt "$t_rss" ] && t_rss=$v
  wait $bg || true
  t_times+=("$(first_step_after_crash "$WORK/t.$i")")
done
median() { printf '%s\n' "$@" | grep -v '^$' | grep -v hung | sort -n | awk '{a[NR]=$1} END {if (NR==0) print "n/a"; else print a[int((NR+1)/2)]}'; }
echo
echo "failure -> first step of the restarted attempt (median of $ROUNDS, seconds):"
echo "  resilio run --ntasks 4:                      $(median "${r_times[@]}")   (rounds: ${r_times[*]})"
echo "  torchrun --nproc-per-node 4 --max-restarts 1: $(median "${t_times[@]}")   (rounds: ${t_times[*]})"
hung() { printf '%s\n' "$@" | grep -c hung || true; }
echo "restarted attempts that never made a step (failed in rendezvous, or hung until the ${LIMIT}s cut): resilio $(hung "${r_times[@]}")/$ROUNDS, torchrun $(hung "${t_times[@]}")/$ROUNDS"
echo "peak RSS (MiB): resilio launcher $r_rss, resilio rank agent $a_rss, torchrun agent $t_rss"
