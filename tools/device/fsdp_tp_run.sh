#!/usr/bin/env bash
# tests/data/torch_train_fsdp_tp_fakepg_h200.json: ranks of torchtitan's 2-D layout (TP within, FSDP2 across)
# through PyTorch's fake process group (tools/matrices/fsdp_tp_h200.json, tools/torch_profile_dist.py).
# Run from the repository
# root; writes into $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O/snap"
t0=$(date +%s)
timeout 560 python3 tools/torch_profile_dist.py --matrix tools/matrices/fsdp_tp_h200.json \
  --max-seconds 500 --snapshot-dir "$O/snap" --output "$O/torch_train_fsdp_tp_fakepg_h200.json" 2>&1 | tee "$O/log.txt"
echo "== rc=$? t=$(( $(date +%s)-t0 ))s"
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O" "$O/snap"
