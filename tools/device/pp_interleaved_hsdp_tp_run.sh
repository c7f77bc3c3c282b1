#!/usr/bin/env bash
# tests/data/torch_train_pp_interleaved_fakepg_h200.json: the ranks of ScheduleInterleaved1F1B
# pipelines (tools/matrices/pp_interleaved_h200.json, tools/torch_profile_pp.py), then
# tests/data/torch_train_hsdp_tp_fakepg_h200.json: HSDP with tensor parallelism
# (tools/matrices/hsdp_tp_h200.json, tools/torch_profile_dist.py), both through PyTorch's fake
# process group, one after the other (the `outside` figures read the whole device). Run from the
# repository root; writes $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O/snap"
t0=$(date +%s)
timeout 330 python3 tools/torch_profile_pp.py --matrix tools/matrices/pp_interleaved_h200.json \
  --max-seconds 290 --snapshot-dir "$O/snap" --output "$O/torch_train_pp_interleaved_fakepg_h200.json" 2>&1 | tee "$O/log_pp.txt"
echo "== pp rc=$? t=$(( $(date +%s)-t0 ))s"
timeout $(( 575 - ($(date +%s)-t0) )) python3 tools/torch_profile_dist.py --matrix tools/matrices/hsdp_tp_h200.json \
  --max-seconds $(( 545 - ($(date +%s)-t0) )) --snapshot-dir "$O/snap" --output "$O/torch_train_hsdp_tp_fakepg_h200.json" 2>&1 | tee "$O/log_hsdp_tp.txt"
echo "== hsdp-tp rc=$? t=$(( $(date +%s)-t0 ))s"
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O" "$O/snap"
