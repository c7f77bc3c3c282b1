#!/usr/bin/env bash
# Reserved memory under PYTORCH_CUDA_ALLOC_CONF settings other than expandable segments, each case
# alone in a fresh process with a whole-run snapshot; results in $OUT (committed under
# tests/data/allocator_conf/). Run from the repository root.
#   max_split_size_mb:128                                  four single-GPU steps (dense, full recompute, MoE, LoRA)
#   roundup_power2_divisions:4                             three single-GPU steps
#   max_split_size_mb:512,roundup_power2_divisions:[...]   two single-GPU steps
#   max_split_size_mb:256                                  an FSDP2 and a ZeRO-1 rank (fake process group)
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
each=tools/device/fresh_each.sh
PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 \
  bash $each tools/torch_profile_step.py tools/matrices/alloc_conf_max_split_h200.json "$O/torch_train_max_split_h200.json"
PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4 \
  bash $each tools/torch_profile_step.py tools/matrices/alloc_conf_roundup_h200.json "$O/torch_train_roundup_h200.json"
PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb:512,roundup_power2_divisions:[256:1,512:2,1024:4,>:8]' \
  bash $each tools/torch_profile_step.py tools/matrices/alloc_conf_both_h200.json "$O/torch_train_max_split_roundup_h200.json"
PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:256 \
  bash $each tools/torch_profile_dist.py tools/matrices/alloc_conf_dist_h200.json "$O/torch_train_dist_max_split_fakepg_h200.json"
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
