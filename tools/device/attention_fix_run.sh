#!/usr/bin/env bash
# The attention paths combos_heldout corrected, held out (tools/matrices/attention_fix_heldout_h200.json),
# and the fp32 interleaved pipeline rank alone (tools/matrices/pp_fp32_alone_h200.json), each step
# in a fresh process with its whole-run snapshot. Run from the repository root; writes $OUT.
set -u
O=${OUT:-/tmp/out}
OUT=$O/heldout bash tools/device/eager_alone_run.sh attention_fix_heldout
mkdir -p "$O/pp"
bash tools/device/fresh_each.sh tools/torch_profile_pp.py tools/matrices/pp_fp32_alone_h200.json "$O/pp/pp_fp32_alone_fakepg_h200.json"
ls -la "$O/pp" "$O/pp/snap"
