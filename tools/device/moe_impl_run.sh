#!/usr/bin/env bash
# tests/data/torch_train_moe_impl_h200.json and tests/data/moe_snapshots/*eager*, *batched_mm*,
# *aux*: the MoE experts run eagerly and through batched_mm, and with output_router_logits (the
# auxiliary load-balancing loss), tools/matrices/moe_impl_h200.json. Run from a folder holding
# tools/ and tests/data/hf/moe/; writes into $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O/snap"
t0=$(date +%s)
timeout 540 python3 tools/torch_profile_step.py --matrix tools/matrices/moe_impl_h200.json --max-seconds 500 \
  --snapshot-dir "$O/snap" --output "$O/torch_train_moe_impl_h200.json" 2>&1 | tail -40
echo "== train rc=$? t=$(( $(date +%s)-t0 ))s"
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O" "$O/snap"
