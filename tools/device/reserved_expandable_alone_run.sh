#!/usr/bin/env bash
# tests/data/reserved_expandable_alone/: the seven steps of tools/device/reserved_run.sh (one process
# there) measured again each alone in a fresh process, with the default caching allocator and with
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (tools/matrices/reserved_expandable_alone_h200.json:
# a whole-run snapshot of Qwen2.5 1.5B amp-bf16 full recompute at 2 × 2048 in each). Run from the
# repository root; writes into $OUT/default and $OUT/expandable.
set -u
O=${OUT:-/tmp/out}
matrix=tools/matrices/reserved_expandable_alone_h200.json
OUT=$O/default bash tools/device/alone_run.sh "$matrix" torch_train_reserved_alone_default_h200.json
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True OUT=$O/expandable \
  bash tools/device/alone_run.sh "$matrix" torch_train_reserved_alone_expandable_h200.json
