#!/usr/bin/env bash
# tests/data/adafactor_loop/: torch.optim.Adafactor's for-loop step on five architectures, each alone
# in a fresh process with a whole-run snapshot (tools/matrices/adafactor_loop_h200.json), for
# tests/python/test_measured_allocations.py. Run from the repository root; writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/adafactor_loop_h200.json \
  "$O/torch_train_adafactor_loop_h200.json"
tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"
ls -la "$O"
