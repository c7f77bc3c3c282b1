#!/usr/bin/env bash
# Eager (math) attention steps, each alone in a fresh process with a whole-run snapshot. Usage:
# eager_alone_run.sh [NAME] runs tools/matrices/NAME_h200.json (default eager_alone) into
# $OUT/torch_train_NAME_h200.json (committed under tests/data/eager_alone/). Run from the
# repository root.
set -u
O=${OUT:-/tmp/out}
name=${1:-eager_alone}
mkdir -p "$O"
bash tools/device/fresh_each.sh tools/torch_profile_step.py "tools/matrices/${name}_h200.json" "$O/torch_train_${name}_h200.json"
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
