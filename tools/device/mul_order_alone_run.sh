#!/usr/bin/env bash
# The steps and ranks whose reserved figure moved by more than 1.5% when the walk's MulBackward0
# began computing `other`'s gradient before `self`'s, none measured alone before: each alone in a
# fresh process with a whole-run snapshot. Results in $OUT (committed under
# tests/data/mul_order_alone/). Run from the repository root.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/mul_order_alone_single_h200.json "$O/torch_train_mul_order_alone_h200.json"
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/mul_order_alone_dist_h200.json "$O/torch_train_mul_order_alone_dist_fakepg_h200.json"
bash tools/device/fresh_each.sh tools/torch_profile_pp.py tools/matrices/mul_order_alone_pp_h200.json "$O/torch_train_mul_order_alone_pp_fakepg_h200.json"
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
