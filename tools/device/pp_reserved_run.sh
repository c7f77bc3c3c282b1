#!/usr/bin/env bash
# Pipeline stages (tools/matrices/pp_reserved_h200.json, tools/torch_profile_pp.py) and two more
# FSDP2 ranks (tools/matrices/fsdp_reserved_more_h200.json, tools/torch_profile_dist.py), each
# case alone in a fresh process, six steps: tests/data/torch_train_pp_reserved_fakepg_h200.json,
# torch_train_fsdp_reserved_more_fakepg_h200.json and a snapshot. Writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_pp.py tools/matrices/pp_reserved_h200.json \
  "$O/torch_train_pp_reserved_fakepg_h200.json"
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/fsdp_reserved_more_h200.json \
  "$O/torch_train_fsdp_reserved_more_fakepg_h200.json"
ls -la "$O" "$O/snap"
