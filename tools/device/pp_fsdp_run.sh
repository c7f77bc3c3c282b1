#!/usr/bin/env bash
# tests/data/torch_train_pp_fsdp_fakepg_h200.json: one rank of a pipeline whose stages are each
# sharded by FSDP2 (torchtitan's PP × FSDP), through PyTorch's fake process group
# (tools/matrices/pp_fsdp_h200.json, tools/torch_profile_pp.py), with allocator snapshots.
# Run from the repository root; writes $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O/snap"
t0=$(date +%s)
timeout 560 python3 tools/torch_profile_pp.py --matrix tools/matrices/pp_fsdp_h200.json \
  --max-seconds 500 --snapshot-dir "$O/snap" --output "$O/torch_train_pp_fsdp_fakepg_h200.json" 2>&1 | tee "$O/log.txt"
echo "== rc=$? t=$(( $(date +%s)-t0 ))s"
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O" "$O/snap"
