#!/usr/bin/env bash
# Smoke run of every ground-truth script on tiny configs (plus the cheap deliverables:
# saved-tensor inventory, snapshots, OOM texts, accelerate peer). Run from a folder holding
# tools/ and configs/ (the repo root, or a copy of them). Writes into $OUT (default ./gt_out).
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
O=${OUT:-$PWD/gt_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1
t0=$(date +%s)
timeout 45 python3 tools/torch_profile_step.py --matrix tools/matrices/train_smoke.json --output "$O/train_smoke.json"
echo "== train smoke rc=$? t=$(( $(date +%s)-t0 ))s"
timeout 20 python3 tools/torch_profile_prefill.py --config configs/hf/llama-3.2-1b.json --config configs/hf/qwen2.5-1.5b.json --override num_hidden_layers=2 --shapes 1x128,2x256 --output "$O/prefill_smoke.json"
echo "== prefill smoke rc=$? t=$(( $(date +%s)-t0 ))s"
timeout 35 python3 tools/torch_saved_tensors.py --output "$O/torch_saved_tensors_h200.json"
echo "== saved rc=$? t=$(( $(date +%s)-t0 ))s"
S=/tmp/gt_snapshots
rm -rf "$S"; mkdir -p "$S"
timeout 30 python3 tools/torch_snapshot_step.py --what small,oom,large --large-layers 8 --large-steps 2 --large-contexts all,alloc --outdir "$S"
echo "== snapshot rc=$? t=$(( $(date +%s)-t0 ))s"
ls -la "$S"
tar czf "$O/snap_small.tgz" -C "$S" $(cd "$S" && ls | grep -v '^large_.*pickle$')
tar czf "$O/snap_large.tgz" -C "$S" $(cd "$S" && ls | grep '^large_.*pickle$')
timeout 15 python3 tools/peer_accelerate_estimate.py configs/hf/llama-3.2-1b.json configs/hf/llama-3.1-8b.json --repeat 5 --output "$O/peer_accelerate_h200.json"
echo "== peer rc=$? t=$(( $(date +%s)-t0 ))s"
ls -la "$O"
