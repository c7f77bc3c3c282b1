#!/usr/bin/env bash
# tests/data/torch_train_dist_tied_fakepg_h200.json: the DDP, ZeRO-1 and tensor-parallel cases of
# tools/matrices/dist_h200.json for the tied models (Llama 3.2 1B, Qwen2.5 1.5B), measured again
# once tools/torch_profile_dist.py re-tied lm_head after to_empty (the first run measured them
# untied). Run from a folder holding tools/ and configs/; writes into $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O"
timeout 300 python3 tools/torch_profile_dist.py --matrix tools/matrices/dist_tied_h200.json \
  --max-seconds 280 --output "$O/torch_train_dist_tied_fakepg_h200.json" 2>&1 | tee "$O/log.txt"
echo "== rc=$?"
