#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O"
t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
# 1. our CLI against accelerate's estimator, same machine, same run
export LD_LIBRARY_PATH=$PWD/devbin
for cfg in llama-3.2-1b llama-3.1-8b; do
  ./devbin/membudget predict configs/hf/$cfg.json --format json > "$O/ours_$cfg.json"
  s=$(date +%s%N); for i in $(seq 50); do ./devbin/membudget predict configs/hf/$cfg.json --format json >/dev/null; done; e=$(date +%s%N)
  echo "ours $cfg cli_wall_s_per_estimate $(( (e-s)/50000 ))e-6"
done | tee "$O/ours_timing.txt"
timeout 60 python3 tools/peer_accelerate_estimate.py configs/hf/llama-3.2-1b.json configs/hf/llama-3.1-8b.json --repeat 20 --output "$O/peer_accelerate_h200.json"
echo "== peer t=$(( $(date +%s)-t0 ))s"
# 2. saved-tensor inventories of architectures not measured before
mkdir -p /tmp/st
for cfg in gemma-2-2b phi-3-mini-4k qwen3-0.6b; do for p in bf16 amp-bf16; do
  timeout 40 python3 tools/torch_saved_tensors.py --config configs/hf/$cfg.json --layers 2 --batch 1 --seq 256 --precision $p --output /tmp/st/$cfg-$p.json >/dev/null 2>/tmp/st/$cfg-$p.err || tail -3 /tmp/st/$cfg-$p.err
done; done
tar czf "$O/saved_holdout.tgz" -C /tmp/st .
echo "== saved t=$(( $(date +%s)-t0 ))s"
# 3. held-out training cases
timeout 330 python3 tools/torch_profile_step.py --matrix tools/matrices/train_holdout_h200.json --max-seconds 300 --output "$O/torch_train_holdout_h200.json"
echo "== holdout rc=$? t=$(( $(date +%s)-t0 ))s"
ls -la "$O"
