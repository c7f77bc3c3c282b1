#!/usr/bin/env bash
# tests/data/adamw_loop/: the for-loop AdamW where neighbouring MLP projections, not the embedding,
# make the optimizer step's peak, each case alone in a fresh process with a whole-run snapshot
# (tools/matrices/adamw_loop_h200.json). Run from the repository root; writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/adamw_loop_h200.json \
  "$O/torch_train_adamw_loop_h200.json"
tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"
ls -la "$O"
