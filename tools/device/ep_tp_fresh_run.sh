#!/usr/bin/env bash
# Each case alone in a fresh process, through the fake process group (tools/device/fresh_each.sh):
#   tests/data/torch_train_ep_holdout_fakepg_h200.json: expert-parallel ranks the model was not
#     developed on (tools/matrices/ep_holdout_h200.json: other degrees, depths, shapes, fused AdamW);
#   tests/data/torch_train_tp_fresh_fakepg_h200.json: four tensor-parallel ranks first measured in
#     one process with other cases (tools/matrices/tp_fresh_h200.json; two whole-run snapshots);
#   tools/device/dist_fresh_run.sh's ranks (FSDP2 and pipeline ranks the reserved replay missed).
# Run from the repository root; writes into $OUT.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
t0=$(date +%s)
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/ep_holdout_h200.json "$O/torch_train_ep_holdout_fakepg_h200.json"
echo "== ep t=$(( $(date +%s)-t0 ))s"
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/tp_fresh_h200.json "$O/torch_train_tp_fresh_fakepg_h200.json"
echo "== tp t=$(( $(date +%s)-t0 ))s"
bash tools/device/dist_fresh_run.sh
echo "== dist t=$(( $(date +%s)-t0 ))s"
ls -la "$O" "$O/snap"
