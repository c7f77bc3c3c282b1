#!/usr/bin/env bash
# tests/data/torch_train_moe_h200.json, torch_prefill_moe_h200.json and tests/data/moe_snapshots/:
# Mixture-of-Experts models from tests/data/hf/moe/ (fewer layers, as the case names say), random
# weights, trained (tools/matrices/moe_h200.json) and prefilled. Run from a folder holding tools/,
# configs/ and tests/data/hf/moe/; writes into $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O/snap"
t0=$(date +%s)
timeout 400 python3 tools/torch_profile_step.py --matrix tools/matrices/moe_h200.json --max-seconds 380 \
  --snapshot-dir "$O/snap" --output "$O/torch_train_moe_h200.json" 2>&1 | tail -40
echo "== train rc=$? t=$(( $(date +%s)-t0 ))s"
args=""
for f in qwen3-30b-a3b qwen1.5-moe-a2.7b olmoe-1b-7b mixtral-8x7b deepseek-v2-lite; do args="$args --config tests/data/hf/moe/$f.json"; done
timeout 150 python3 tools/torch_profile_prefill.py $args --override num_hidden_layers=4 --shapes 1x2048,4x4096 \
  --output "$O/torch_prefill_moe_h200.json" 2>&1 | tail -15
echo "== prefill rc=$? t=$(( $(date +%s)-t0 ))s"
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O" "$O/snap"
