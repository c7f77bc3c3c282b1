#!/usr/bin/env bash
# tests/data/reserved_8b_snapshot/: Llama 3.1 8B bf16, full recompute, 4 x 4096, alone in a fresh
# process with a whole-run snapshot (tools/matrices/reserved_8b_snapshot_h200.json). Writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/reserved_8b_snapshot_h200.json \
  "$O/torch_train_reserved_8b_snapshot_h200.json"
ls -la "$O" "$O/snap"
