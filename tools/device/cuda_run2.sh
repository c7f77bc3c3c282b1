#!/bin/bash
# Second device run for cuda2: tests, then speed and verify on the new (mma.sync) attention.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD:$LD_LIBRARY_PATH PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p "$O"; L=$O/log.txt
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $L 2>&1
el "gpu tests"
timeout 60 ./test_cuda_kernels > $O/gpu_tests.txt 2>&1; T=$?
el "gpu tests rc=$T"; tail -4 $O/gpu_tests.txt | tee -a $L
# fall back only if a whole training step or the attention test of the new kernels fails
if grep -qE "wmma := false|TEST CASE:  whole steps" $O/gpu_tests.txt; then export MEMBUDGET_CUDA_ATTN=wmma; el "FALLBACK to wmma"; fi
el "bench"
timeout 100 python3 bench_step_vs_torch.py --binary ./membudget --config configs/llama-3.2-1b.yaml \
  --hf configs/hf/llama-3.2-1b.json --warmup 2 --steps 5 --out $O/bench.json > /dev/null 2>> $L
el "bench rc=$?"; python3 -c "import json;j=json.load(open('$O/bench.json'));print('ratio',j['ratio_ours_over_torch'],'ours',j['ours']['step_seconds'],'torch',j['torch']['step_seconds'])" >> $L 2>&1
el "8B bf16 lr 3e-4"
MEMBUDGET_CUDA_PROFILE=1 timeout 70 ./membudget verify configs/llama-3.1-8b.yaml --device-backend cuda -b 1 -s 4096 \
  --precision bf16 --warmup 1 --steps 19 --lr 3e-4 --format json > $O/v8b-bf16-lr3e-4.json 2>> $L
el "8B rc=$?"
el "infer 1B B=8 S=4096"
MEMBUDGET_CUDA_PROFILE=1 timeout 50 ./membudget verify configs/llama-3.2-1b.yaml --mode infer --device-backend cuda -b 8 -s 4096 \
  --warmup 1 --steps 2 --format json > $O/i1b-b8-s4096.json 2>> $L
el "infer 1B rc=$?"
el "infer 8B B=4 S=8192"
MEMBUDGET_CUDA_PROFILE=1 timeout 70 ./membudget verify configs/llama-3.1-8b.yaml --mode infer --device-backend cuda -b 4 -s 8192 \
  --warmup 1 --steps 2 --format json > $O/i8b-b4-s8192.json 2>> $L
el "infer 8B rc=$?"
