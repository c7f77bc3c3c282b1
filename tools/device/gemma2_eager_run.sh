#!/usr/bin/env bash
# tests/data/torch_train_gemma2_eager_h200.json: Gemma 2 trained with transformers' eager attention
# (tools/matrices/gemma2_eager_h200.json, tools/torch_profile_step.py), one forward snapshot.
# Run from the repository root; writes $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O/snap"
t0=$(date +%s)
timeout 560 python3 tools/torch_profile_step.py --matrix tools/matrices/gemma2_eager_h200.json --max-seconds 500 \
  --snapshot-dir "$O/snap" --output "$O/torch_train_gemma2_eager_h200.json" 2>&1 | tail -30
echo "== rc=$? t=$(( $(date +%s)-t0 ))s"
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O" "$O/snap"
