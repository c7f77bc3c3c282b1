#!/bin/bash
# The harness's bf16-master recipe on the GPU (issue 15): the CUDA kernel tests (the fused AdamW
# with an fp32 master copy, whole bf16-master steps against the CPU backend), then `verify` of
# Llama 3.2 1B (recompute none and full) and 3B in bf16-master, and Qwen2.5 0.5B in bf16, amp-bf16 and
# bf16-master (its block slack, now replayed: docs/harness.md). Run from a folder holding membudget,
# libmembudget_cuda.so, test_cuda_kernels, libyaml-cpp.so.0.7 and configs/ (docs/cuda.md); writes $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p "$O"; L=$O/log.txt
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
el "gpu tests"
timeout 90 ./test_cuda_kernels > $O/gpu_tests.txt 2>&1
el "gpu tests rc=$?"; tail -4 $O/gpu_tests.txt | tee -a $L
v() {  # name, config, flags...
  local name=$1 cfg=$2; shift 2
  timeout 90 ./membudget verify configs/$cfg --device-backend cuda --warmup 1 --steps 9 "$@" --format json > $O/$name.json 2>> $L
  el "$name rc=$?"
  python3 -c "import json;j=json.load(open('$O/$name.json'));print({k:v['percent'] for k,v in j['error'].items()}, j['within_tolerance'])" >> $L 2>&1
}
v v1b-bf16-master-none llama-3.2-1b.yaml -b 4 -s 4096 --precision bf16-master
v v1b-bf16-master-full llama-3.2-1b.yaml -b 4 -s 4096 --precision bf16-master --recompute full
v v3b-bf16-master-none llama-3.2-3b.yaml -b 2 -s 4096 --precision bf16-master
v vq05-bf16-none qwen2.5-0.5b.yaml -b 4 -s 4096 --precision bf16
v vq05-amp-full qwen2.5-0.5b.yaml -b 2 -s 2048 --precision amp-bf16 --recompute full
v vq05-bf16-master-none qwen2.5-0.5b.yaml -b 4 -s 4096 --precision bf16-master
cat $L
