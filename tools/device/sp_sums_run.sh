#!/usr/bin/env bash
# Tensor-parallel ranks with SP (tools/matrices/sp_sums_heldout_h200.json), each alone in a fresh
# process with a whole-run snapshot; predicted before by tests/data/sp_sums_heldout/predicted_before.json.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/sp_sums_heldout_h200.json \
  "$O/torch_train_sp_sums_fakepg.json"
(cd "$O" && tar cf snap.tar snap && rm -r snap)
ls -la "$O"
