#!/usr/bin/env bash
# The scheduler API's benchmarks and accelerate's estimator in one run on the GPU host, then
# allocator snapshots of the phases the inventory underpredicts (tools/matrices/gaps_snapshot_h200.json).
# Expects devbin/bench/ to hold membudget_bench, membudget, libbenchmark.so.1debian and
# libyaml-cpp.so.0.7 (built on the build machine; docs/api.md).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O"
t0=$(date +%s)
lscpu | grep -E "^Model name|^CPU\(s\)" | tee "$O/host.txt"
export LD_LIBRARY_PATH=$PWD/devbin/bench
# 1. membudget's benchmarks and accelerate's, back to back
MEMBUDGET_SOURCE_DIR=$PWD MEMBUDGET_CLI=$PWD/devbin/bench/membudget \
  ./devbin/bench/membudget_bench --benchmark_min_time=0.5 --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out="$O/bench_h200_host.json" --benchmark_out_format=json 2>&1 | tail -40
echo "== bench t=$(( $(date +%s)-t0 ))s"
timeout 120 python3 tools/peer_accelerate_estimate.py configs/hf/llama-3.2-1b.json configs/hf/llama-3.1-8b.json \
  configs/hf/llama-3.1-70b.json --repeat 20 --output "$O/peer_accelerate_h200.json" 2>&1 | tail -12
echo "== peer t=$(( $(date +%s)-t0 ))s"
# 2. snapshots of the underpredicted phases
timeout 330 python3 tools/torch_profile_step.py --matrix tools/matrices/gaps_snapshot_h200.json \
  --snapshot-dir /tmp/snap --max-seconds 300 --output "$O/gaps_h200.json" 2>&1 | tail -12
for f in /tmp/snap/*.pickle; do gzip -c "$f" > "$O/$(basename "$f").gz"; done
echo "== snapshots t=$(( $(date +%s)-t0 ))s"
ls -la "$O"
