#!/usr/bin/env bash
# Single-GPU training steps of a matrix, each alone in a fresh process (tools/device/fresh_each.sh,
# tools/torch_profile_step.py), with the snapshots the matrix asks for packed into $OUT/snap.tar.
# Run from the repository root; writes into $OUT.
#   bash tools/device/alone_run.sh MATRIX RESULT
# MATRIX / RESULT (the file in $OUT), and where they are committed:
#   tools/matrices/reserved_alone_h200.json   torch_train_reserved_alone_h200.json   tests/data/reserved_alone/
#     (the MoE, experts- and optimizer-implementation steps the replay missed by over 3% in one process)
#   tools/matrices/adafactor_loop_h200.json   torch_train_adafactor_loop_h200.json   tests/data/adafactor_loop/
#     (torch.optim.Adafactor's for-loop step on five architectures)
#   tools/matrices/adamw_loop_h200.json       torch_train_adamw_loop_h200.json       tests/data/adamw_loop/
#     (the for-loop AdamW where neighbouring MLP projections make the optimizer step's peak)
#   tools/matrices/engine_holdout_h200.json   torch_train_engine_holdout_h200.json   tests/data/engine_holdout/
#     (models and shapes held out from the engine-order work: predicted first, then measured)
# tools/device/reserved_expandable_alone_run.sh runs it twice, with and without expandable segments.
set -u
matrix=$1 result=$2
O=${OUT:-/tmp/out}
mkdir -p "$O"
bash tools/device/fresh_each.sh tools/torch_profile_step.py "$matrix" "$O/$result"
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
