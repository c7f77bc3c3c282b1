#!/usr/bin/env bash
# tests/data/torch_train_fsdp_reserved_fakepg_h200.json and tests/data/fsdp_reserved_snapshots/:
# FSDP2 ranks through the fake process group, each case alone in a fresh process, six steps each,
# whole-run snapshots where the matrix asks (tools/matrices/fsdp_reserved_h200.json). Writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/fsdp_reserved_h200.json \
  "$O/torch_train_fsdp_reserved_fakepg_h200.json"
ls -la "$O" "$O/snap"
