#!/usr/bin/env bash
# The local launcher over many restarts: its memory (RSS) and the time of a
# restart cycle (a crash, the decision, every rank started again, the next
# crash) at the start and at the end, so that growth per attempt shows.
#
#   bash benches/launcher_restarts.sh [RESTARTS]     (default 1000; release build, or BIN=...)
#
# Two ranks of `sh` that print a step and fail with a different message each
# time (no same-failure guard), each attempt one step further (no crash-loop
# guard). Prints one line per 10 s: attempts so far, RSS, attempts per second.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}
# BIN=/path/to/resilio: another build (the one before a change).
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet
  BIN=$PWD/target/release/resilio
fi
tmp=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
cat > "$tmp/t.sh" <<'T'
echo "step $((RESILIO_ATTEMPT+1))"
sleep 0.05
echo "RuntimeError: failure $(head -c 6 /dev/urandom | base64 | tr -dc 'a-zA-Z')" >&2
exit 1
T
"$BIN" run --job-id bench --state-dir "$tmp/sd" --ntasks 2 --max-restarts "$N" -- sh "$tmp/t.sh" >/dev/null 2>&1 &
pid=$!
launches() { grep -c '"kind":"launch"' "$tmp/sd/jobs/bench/launcher.jsonl" 2>/dev/null || echo 0; }
prev=0
printf '%8s %10s %12s\n' attempts rss_kb attempts/s
while kill -0 "$pid" 2>/dev/null; do
  sleep 10
  rss=$(awk '/VmRSS/{print $2}' "/proc/$pid/status" 2>/dev/null || echo -)
  n=$(launches)
  printf '%8s %10s %12.1f\n' "$n" "$rss" "$(echo "($n - $prev) / 10" | bc -l)"
  prev=$n
done
wait "$pid" || true
