#!/usr/bin/env bash
# Issue 16: the fake-group cases of tools/matrices/dist_h200.json as real torchrun jobs on 2, 4 and 8
# GPUs (NCCL), every rank recording its phases, memory_reserved() and the memory outside PyTorch
# (NCCL's communicators and channels included): $OUT/torch_train_dist_nccl_w<W>.rank<r>.json.
# Needs a machine with several GPUs (nvidia-h200-x2/-x4/-x8); run from a folder holding tools/ and
# configs/. Not yet run: no such machine was lent when it was written.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O"
n=$(nvidia-smi -L | wc -l)
for W in 2 4 8; do
  [ "$W" -le "$n" ] || continue
  timeout 500 torchrun --standalone --nproc-per-node "$W" tools/torch_profile_dist.py --torchrun \
    --matrix tools/matrices/dist_h200.json --max-seconds 450 --output "$O/torch_train_dist_nccl_w$W.json" \
    2>&1 | tail -30
  echo "== world $W rc=$?"
done
ls -la "$O"
