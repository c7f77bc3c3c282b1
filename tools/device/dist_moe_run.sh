#!/usr/bin/env bash
# tests/data/torch_train_dist_moe_fakepg_h200.json: one rank of DDP, ZeRO-1, FSDP2 and HSDP steps of
# mixture-of-experts models through PyTorch's fake process group
# (tools/matrices/dist_moe_h200.json, tools/torch_profile_dist.py). Run from a folder holding tools/
# and tests/data/hf/moe/; writes into $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O/snap"
t0=$(date +%s)
timeout 560 python3 tools/torch_profile_dist.py --matrix tools/matrices/dist_moe_h200.json \
  --max-seconds 520 --snapshot-dir "$O/snap" --output "$O/torch_train_dist_moe_fakepg_h200.json" 2>&1 | tee "$O/log.txt"
echo "== rc=$? t=$(( $(date +%s)-t0 ))s"
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O" "$O/snap"
