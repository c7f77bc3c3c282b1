#!/usr/bin/env bash
# tests/data/torch_train_reserved_h200.json and torch_train_reserved_expandable_h200.json: the same
# steps (tools/matrices/reserved_h200.json) with the default caching allocator and with
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, for the reserved-memory prediction
# (memory_reserved() after each phase, read by tools/torch_profile_step.py).
# Run from a folder holding tools/ and configs/; writes into $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O"
t0=$(date +%s)
timeout 200 python3 tools/torch_profile_step.py --matrix tools/matrices/reserved_h200.json \
  --max-seconds 180 --output "$O/torch_train_reserved_h200.json"
echo "== default rc=$? t=$(( $(date +%s)-t0 ))s"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 200 python3 tools/torch_profile_step.py \
  --matrix tools/matrices/reserved_h200.json --max-seconds 180 --output "$O/torch_train_reserved_expandable_h200.json"
echo "== expandable rc=$? t=$(( $(date +%s)-t0 ))s"
ls -la "$O"
