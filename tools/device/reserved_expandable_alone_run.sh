#!/usr/bin/env bash
# tests/data/reserved_expandable_alone/: the seven steps of tools/device/reserved_run.sh (one process
# there) measured again each alone in a fresh process (tools/device/fresh_each.sh), with the
# default caching allocator and with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# (tools/matrices/reserved_expandable_alone_h200.json: a whole-run snapshot of Qwen2.5 1.5B amp-bf16 full
# recompute at 2 × 2048 in each). Run from the repository root; writes into $OUT.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O/default" "$O/expandable"
t0=$(date +%s)
bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/reserved_expandable_alone_h200.json \
  "$O/default/torch_train_reserved_alone_default_h200.json"
echo "== default t=$(( $(date +%s)-t0 ))s"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True bash tools/device/fresh_each.sh tools/torch_profile_step.py \
  tools/matrices/reserved_expandable_alone_h200.json "$O/expandable/torch_train_reserved_alone_expandable_h200.json"
echo "== expandable t=$(( $(date +%s)-t0 ))s"
for d in default expandable; do
  mv "$O/$d/snap/"*.gz "$O/$d/" 2>/dev/null; rmdir "$O/$d/snap" 2>/dev/null
done
ls -laR "$O"
