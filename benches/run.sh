#!/usr/bin/env bash
# Run the agent benchmarks (release build). Quick look: BENCH_MB=50 BENCH_WRAP_SECS=10 bash benches/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo bench --bench agent
