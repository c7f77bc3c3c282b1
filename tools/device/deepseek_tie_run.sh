#!/usr/bin/env bash
# DeepSeek-V2-Lite's held-out step (+3.44% on reserved, its stream exact): again alone with c10's
# default allocator, and alone with expandable segments, each with a whole-run snapshot; results in
# $OUT (committed under tests/data/heldout_conf/). Run from the repository root.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/deepseek_tie_default_h200.json "$O/torch_train_deepseek_tie_default_h200.json"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/deepseek_tie_expandable_h200.json "$O/torch_train_deepseek_tie_expandable_h200.json"
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
