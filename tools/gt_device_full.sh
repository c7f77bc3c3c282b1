#!/usr/bin/env bash
# Full ground-truth run on the H200: the training matrix, prefill/decode, the large snapshot
# and the accelerate peer. Run from a folder holding tools/ and configs/. Writes into $OUT.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
O=${OUT:-$PWD/gt_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1
t0=$(date +%s)
timeout 170 python3 tools/torch_profile_step.py --matrix tools/matrices/train_h200.json --max-seconds 140 --output "$O/torch_train_h200.json"
echo "== train rc=$? t=$(( $(date +%s)-t0 ))s"
timeout 75 python3 tools/torch_profile_prefill.py --config configs/hf/llama-3.2-1b.json --config configs/hf/qwen2.5-1.5b.json --config configs/hf/llama-3.1-8b.json --shapes 1x2048,4x4096,8x8192,16x1024,1x32768 --output "$O/torch_prefill_h200.json"
echo "== prefill rc=$? t=$(( $(date +%s)-t0 ))s"
S=/tmp/gt_large
rm -rf "$S"; mkdir -p "$S"
timeout 25 python3 tools/torch_snapshot_step.py --what large --large-layers 32 --large-steps 5 --large-contexts all --outdir "$S"
echo "== snapshot rc=$? t=$(( $(date +%s)-t0 ))s"
ls -la "$S"
tar czf "$O/snap_large.tgz" -C "$S" .
timeout 25 python3 tools/peer_accelerate_estimate.py configs/hf/llama-3.2-1b.json configs/hf/llama-3.1-8b.json --repeat 20 --output "$O/peer_accelerate_h200.json"
echo "== peer rc=$? t=$(( $(date +%s)-t0 ))s"
ls -la "$O"
