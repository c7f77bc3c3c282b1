#!/usr/bin/env bash
# Held-out reserved-memory checks: model, shape and allocator setting combinations no committed
# measurement has, predicted before the run (tests/data/heldout_conf/predicted_before.json), each case
# alone in a fresh process with a whole-run snapshot; results in $OUT (committed under
# tests/data/heldout_conf/). Run from the repository root.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
each=tools/device/fresh_each.sh
m=tools/matrices
bash $each tools/torch_profile_step.py $m/heldout_conf_default_h200.json "$O/torch_train_heldout_default_h200.json"
bash $each tools/torch_profile_dist.py $m/heldout_conf_dist_h200.json "$O/torch_train_heldout_dist_fakepg_h200.json"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  bash $each tools/torch_profile_step.py $m/heldout_conf_expandable_h200.json "$O/torch_train_heldout_expandable_h200.json"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  bash $each tools/torch_profile_dist.py $m/heldout_conf_expandable_dist_h200.json "$O/torch_train_heldout_expandable_dist_fakepg_h200.json"
PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:2 \
  bash $each tools/torch_profile_step.py $m/heldout_conf_roundup_h200.json "$O/torch_train_heldout_roundup_h200.json"
PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:256 \
  bash $each tools/torch_profile_dist.py $m/heldout_conf_max_split_dist_h200.json "$O/torch_train_heldout_max_split_dist_fakepg_h200.json"
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
