#!/usr/bin/env bash
# Reserved memory where the data had no measurement of its kind, each case alone in a fresh process
# with a whole-run snapshot; results in $OUT (committed under tests/data/inprocess_alone/ and
# tests/data/reserved_expandable_alone/). Run from the repository root.
#   bash tools/device/expandable_more_run.sh 1   the last in-process misses never measured alone: two
#                                                single-GPU steps and a TP rank, c10's default allocator
#   bash tools/device/expandable_more_run.sh 2   expandable segments: five single-GPU steps (LoRA, two
#                                                MoE, fused AdamW, for-loop Adafactor), five ranks (FSDP2,
#                                                DDP, ZeRO-1, TP, EP) and a pipeline stage
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
each=tools/device/fresh_each.sh
case ${1:-1} in
  1)
    bash $each tools/torch_profile_step.py tools/matrices/inprocess_misses_alone3_h200.json "$O/torch_train_inprocess_alone3_h200.json"
    bash $each tools/torch_profile_dist.py tools/matrices/dist_misses_alone2_h200.json "$O/torch_train_dist_misses_alone2_fakepg_h200.json" ;;
  2)
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    bash $each tools/torch_profile_step.py tools/matrices/expandable_more_h200.json "$O/torch_train_expandable_more_h200.json"
    bash $each tools/torch_profile_dist.py tools/matrices/dist_expandable_h200.json "$O/torch_train_dist_expandable_fakepg_h200.json"
    bash $each tools/torch_profile_pp.py tools/matrices/pp_expandable_h200.json "$O/torch_train_pp_expandable_fakepg_h200.json" ;;
  *) echo "usage: $0 1|2" >&2; exit 2 ;;
esac
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
