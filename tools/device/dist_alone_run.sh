#!/usr/bin/env bash
# Ranks of a distributed matrix through the fake process group, each alone in a fresh process with
# a whole-run snapshot (tools/device/fresh_each.sh). Usage: dist_alone_run.sh NAME RESULT runs
# tools/matrices/NAME_h200.json into $OUT/RESULT and the snapshots into $OUT/snap.tar (committed
# under tests/data/). Run from the repository root:
#   dist_alone_run.sh dist_new_models torch_train_dist_new_models_fakepg.json
#   dist_alone_run.sh sp_sums_heldout torch_train_sp_sums_fakepg.json
set -u
O=${OUT:-/tmp/out}
name=$1 result=$2
mkdir -p "$O"
bash tools/device/fresh_each.sh tools/torch_profile_dist.py "tools/matrices/${name}_h200.json" "$O/$result"
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
