#!/usr/bin/env bash
# Ranks measured after other cases whose reserved memory the replay misses most, each measured
# alone (tools/matrices/dist_fresh_h200.json, pp_fresh_h200.json). Writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/dist_fresh_h200.json \
  "$O/torch_train_dist_fresh_fakepg_h200.json"
bash tools/device/fresh_each.sh tools/torch_profile_pp.py tools/matrices/pp_fresh_h200.json \
  "$O/torch_train_pp_fresh_fakepg_h200.json"
ls -la "$O"
