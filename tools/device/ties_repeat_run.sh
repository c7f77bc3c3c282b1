#!/usr/bin/env bash
# The steps whose reserved figure the replay misses by more than 3% although they were measured
# alone (best-fit ties between equal free blocks, decided by where the CUDA driver put their
# segments; docs/accuracy.md): each three more times, each alone in a fresh process with a
# whole-run snapshot, to measure how far the run itself moves. `ties_repeat_run.sh 1`: the two
# single-GPU steps; `2`: the DDP rank and the pipeline stage. Results in $OUT (committed under
# tests/data/ties_repeat/). Run from the repository root.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
case "${1:-1}" in
  1) bash tools/device/fresh_each.sh tools/torch_profile_step.py tools/matrices/ties_repeat_single_h200.json "$O/torch_train_ties_repeat_h200.json" ;;
  2) bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/ties_repeat_dist_h200.json "$O/torch_train_ties_repeat_dist_fakepg_h200.json"
     bash tools/device/fresh_each.sh tools/torch_profile_pp.py tools/matrices/ties_repeat_pp_h200.json "$O/torch_train_ties_repeat_pp_fakepg_h200.json" ;;
  *) echo "usage: $0 1|2" >&2; exit 2 ;;
esac
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
