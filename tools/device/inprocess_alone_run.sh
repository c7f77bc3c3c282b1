#!/usr/bin/env bash
# The steps whose reserved memory the replay misses by more than 3% where their files ran many
# cases in one process and that had no measurement alone, each now alone in a fresh process with a
# whole-run snapshot (tools/matrices/inprocess_misses_alone_h200.json), and Llama 3.1 8B's first
# stage under 1F1B x TP 2 x FSDP2 with its snapshot (tools/matrices/pp_tp_fsdp_8b_snapshot_h200.json).
# Results: tests/data/inprocess_alone/. Run from the repository root; writes $OUT.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/inprocess_misses_alone_h200.json \
  "$O/torch_train_inprocess_alone_h200.json"
bash tools/device/fresh_each.sh tools/torch_profile_pp.py tools/matrices/pp_tp_fsdp_8b_snapshot_h200.json \
  "$O/torch_train_pp_tp_fsdp_8b_alone_fakepg_h200.json"
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
