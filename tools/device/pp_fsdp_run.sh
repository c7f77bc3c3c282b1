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
# tests/data/torch_train_pp_fsdp_more_fakepg_h200.json (Llama 3.1 8B at 8 layers, Qwen2.5 1.5B) and
# tests/data/torch_train_pp_qwen_small_fakepg_h200.json (Qwen2.5 0.5B with and without FSDP2):
timeout 200 python3 tools/torch_profile_pp.py --matrix tools/matrices/pp_fsdp_more_h200.json \
  --output "$O/torch_train_pp_fsdp_more_fakepg_h200.json" 2>&1 | tee -a "$O/log.txt"
timeout 200 python3 tools/torch_profile_pp.py --matrix tools/matrices/qwen_pp_probe.json --snapshot-dir "$O/snap" \
  --output "$O/torch_train_pp_qwen_small_fakepg_h200.json" 2>&1 | tee -a "$O/log.txt"
