#!/usr/bin/env bash
# tests/data/reserved_fresh/: single-GPU steps each alone in a fresh process
# (tools/matrices/reserved_fresh_h200.json, tools/torch_profile_step.py), one whole-run snapshot.
# Writes $OUT/torch_train_reserved_fresh_h200.json and $OUT/snap/.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/reserved_fresh_h200.json \
  "$O/torch_train_reserved_fresh_h200.json"
ls -la "$O" "$O/snap"
