#!/usr/bin/env bash
# tests/data/torch_train_dist_fakepg_h200.json and tests/data/dist_snapshots/: one rank of DDP,
# ZeRO-1, FSDP2, HSDP and tensor-parallel steps through PyTorch's fake process group
# (tools/matrices/dist_h200.json, tools/torch_profile_dist.py). Run from a folder holding tools/
# and configs/; writes into $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O/snap"
t0=$(date +%s)
timeout 560 python3 tools/torch_profile_dist.py --matrix tools/matrices/dist_h200.json \
  --max-seconds 520 --snapshot-dir "$O/snap" --output "$O/torch_train_dist_fakepg_h200.json" 2>&1 | tee "$O/log.txt"
echo "== rc=$? t=$(( $(date +%s)-t0 ))s"
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O" "$O/snap"
