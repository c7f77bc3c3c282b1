#!/usr/bin/env bash
# The steps whose reserved memory the replay missed by more than 3% where their files ran many
# cases in one process and that had no measurement alone, each alone in a fresh process with a
# whole-run snapshot, results in tests/data/inprocess_alone/. Run from the repository root; writes $OUT.
#   bash tools/device/inprocess_alone_run.sh 1   seven single-GPU steps (inprocess_misses_alone_h200.json)
#                                                and Llama 3.1 8B's first stage under 1F1B x TP 2 x FSDP2
#                                                (pp_tp_fsdp_8b_snapshot_h200.json, torch_profile_pp.py)
#   bash tools/device/inprocess_alone_run.sh 2   Qwen1.5-MoE's 4-layer full-recompute step
#                                                (inprocess_misses_alone2_h200.json) and Qwen3-30B-A3B's
#                                                ZeRO-1 rank (zero1_moe_alone_h200.json, torch_profile_dist.py)
#   bash tools/device/inprocess_alone_run.sh 3   two dense ZeRO-1 ranks (zero1_dense_alone_h200.json)
#   bash tools/device/inprocess_alone_run.sh 4   four ranks: FSDP2 with CPU offload, DDP, TP and TP with
#                                                sequence parallelism (dist_misses_alone_h200.json)
#   bash tools/device/inprocess_alone_run.sh 5   the 8B DDP and vocabulary-parallel TP ranks with the
#                                                model's construction recorded (construction_snapshots_h200.json)
#   bash tools/device/inprocess_alone_run.sh 6   Llama 3.2 1B's last stage under 1F1B x FSDP2 4 with its
#                                                construction recorded (construction_snapshot_pp_h200.json)
#   bash tools/device/inprocess_alone_run.sh 7   the two single-GPU steps still missed by more than 3% alone,
#                                                construction recorded (construction_snapshots_single_h200.json)
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
case ${1:-1} in
  1) steps=inprocess_misses_alone_h200 steps_out=torch_train_inprocess_alone_h200
     rank_tool=tools/torch_profile_pp.py ranks=pp_tp_fsdp_8b_snapshot_h200 ranks_out=torch_train_pp_tp_fsdp_8b_alone_fakepg_h200 ;;
  2) steps=inprocess_misses_alone2_h200 steps_out=torch_train_inprocess_alone2_h200
     rank_tool=tools/torch_profile_dist.py ranks=zero1_moe_alone_h200 ranks_out=torch_train_zero1_moe_alone_fakepg_h200 ;;
  3) steps="" rank_tool=tools/torch_profile_dist.py ranks=zero1_dense_alone_h200 ranks_out=torch_train_zero1_dense_alone_fakepg_h200 ;;
  4) steps="" rank_tool=tools/torch_profile_dist.py ranks=dist_misses_alone_h200 ranks_out=torch_train_dist_misses_alone_fakepg_h200 ;;
  5) steps="" rank_tool=tools/torch_profile_dist.py ranks=construction_snapshots_h200 ranks_out=torch_train_construction_snapshots_fakepg_h200 ;;
  6) steps="" rank_tool=tools/torch_profile_pp.py ranks=construction_snapshot_pp_h200 ranks_out=torch_train_construction_snapshot_pp_fakepg_h200 ;;
  7) steps=construction_snapshots_single_h200 steps_out=torch_train_construction_snapshots_single_h200 ranks="" ;;
  *) echo "usage: $0 1|2|3|4|5|6|7" >&2; exit 2 ;;
esac
[ -n "$steps" ] && bash tools/device/fresh_each.sh tools/torch_profile_step.py "tools/matrices/$steps.json" "$O/$steps_out.json"
[ -n "$ranks" ] && bash tools/device/fresh_each.sh "$rank_tool" "tools/matrices/$ranks.json" "$O/$ranks_out.json"
if [ -d "$O/snap" ]; then tar -C "$O" -cf "$O/snap.tar" snap && rm -r "$O/snap"; fi
ls -la "$O"
