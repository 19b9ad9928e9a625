#!/usr/bin/env bash
# Run the agent benchmarks (release build), then the Python client's per-call
# cost. Quick look: BENCH_MB=50 BENCH_WRAP_SECS=10 bash benches/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench agent
python3 benches/client.py
