#!/usr/bin/env bash
# tests/data/handthrough_snapshots/: whole-run snapshots, each case alone in a fresh process, of the
# steps whose reserved memory moved most when the replay's adds began to hand their gradient
# through (tools/matrices/{reserved,pp,ep}_handthrough_h200.json). Writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/reserved_handthrough_h200.json \
  "$O/torch_train_handthrough_h200.json"
bash tools/device/fresh_each.sh tools/torch_profile_pp.py tools/matrices/pp_handthrough_h200.json \
  "$O/torch_train_pp_handthrough_fakepg_h200.json"
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/ep_handthrough_h200.json \
  "$O/torch_train_ep_handthrough_fakepg_h200.json"
ls -la "$O" "$O/snap"
