#!/usr/bin/env bash
# After the CUDA backend became a plugin: the kernel tests, verify through the plugin, the CLI's
# start-up, and the scheduler API's benchmarks beside accelerate's estimator, in one run.
# Expects devbin/run2/ to hold membudget, libmembudget_cuda.so, test_cuda_kernels, membudget_bench,
# libbenchmark.so.1debian and libyaml-cpp.so.0.7 (docs/api.md, docs/cuda.md).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O"
t0=$(date +%s)
B=$PWD/devbin/run2
export LD_LIBRARY_PATH=$B
lscpu | grep -E "^Model name|^CPU\(s\)" | tee "$O/host.txt"
# 1. the plugin: kernel tests and a verify through `--device-backend cuda`
(cd "$B" && MEMBUDGET_SOURCE_DIR=$OLDPWD timeout 200 ./test_cuda_kernels 2>&1 | tail -3) | tee "$O/kernels.txt"
timeout 120 "$B/membudget" verify configs/llama-3.2-1b.yaml --device-backend cuda -b 4 -s 4096 --precision amp-bf16 \
  --warmup 1 --steps 5 --format json > "$O/verify_1b_plugin.json"; echo "verify rc=$?"
echo "== plugin t=$(( $(date +%s)-t0 ))s"
# 2. CLI start to exit, 50 runs each
for cfg in llama-3.2-1b llama-3.1-8b; do
  s=$(date +%s%N); for i in $(seq 50); do "$B/membudget" predict configs/hf/$cfg.json --format json >/dev/null; done; e=$(date +%s%N)
  echo "cli $cfg ms_per_process $(( (e-s)/50000 ))e-3"
done | tee "$O/cli_timing.txt"
# 3. benchmarks, then accelerate, back to back
MEMBUDGET_SOURCE_DIR=$PWD MEMBUDGET_CLI=$B/membudget "$B/membudget_bench" --benchmark_min_time=0.5 \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out="$O/bench_h200_host.json" \
  --benchmark_out_format=json 2>&1 | grep -E "median|Benchmark"
timeout 120 python3 tools/peer_accelerate_estimate.py configs/hf/llama-3.2-1b.json configs/hf/llama-3.1-8b.json \
  configs/hf/llama-3.1-70b.json --repeat 20 --output "$O/peer_accelerate_h200.json" 2>&1 | tail -4
echo "== done t=$(( $(date +%s)-t0 ))s"
