#!/usr/bin/env bash
# One rank of distributed layouts on models no distributed run measured
# (tools/matrices/dist_new_models_h200.json), each case alone in a fresh process with a whole-run
# snapshot; predicted before by tests/data/dist_new_models/predicted_before.json. Writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/dist_new_models_h200.json \
  "$O/torch_train_dist_new_models_fakepg.json"
(cd "$O" && tar cf snap.tar snap && rm -r snap)
ls -la "$O"
