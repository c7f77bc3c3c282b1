#!/usr/bin/env bash
# tests/data/reserved_alone/: the single-GPU MoE, experts-implementation and optimizer-implementation
# steps whose reserved memory the replay missed by more than 3% when their files ran many cases in one
# process, each alone in a fresh process with a whole-run snapshot
# (tools/matrices/reserved_alone_h200.json). Run from the repository root; writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/reserved_alone_h200.json \
  "$O/torch_train_reserved_alone_h200.json"
tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"
ls -la "$O"
