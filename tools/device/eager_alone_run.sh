#!/usr/bin/env bash
# Training steps, each alone in a fresh process with a whole-run snapshot (first for the eager attention steps). Usage:
# eager_alone_run.sh [NAME] runs tools/matrices/NAME_h200.json (default eager_alone) into
# $OUT/torch_train_NAME_CARD.json, CARD the GPU it ran on (h200, or h100 where no H200 was lent;
# committed under tests/data/). Run from the repository root.
set -u
O=${OUT:-/tmp/out}
name=${1:-eager_alone}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9]\+' | tr 'H' 'h')
mkdir -p "$O"
bash tools/device/fresh_each.sh tools/torch_profile_step.py "tools/matrices/${name}_h200.json" "$O/torch_train_${name}_${card:-h200}.json"
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
