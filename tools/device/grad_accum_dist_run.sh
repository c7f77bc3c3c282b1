#!/usr/bin/env bash
# One rank of DDP, ZeRO-1, TP and FSDP2 jobs with gradient accumulation through the fake process
# group (tools/matrices/grad_accum_ddp_h200.json, grad_accum_fsdp_h200.json), each case alone in a
# fresh process, most telling first, one result file per case under $OUT (a run cut short keeps
# what it finished). Run from the repository root.
set -u
export PYTHONUNBUFFERED=1
run() { m=$1; n=$2; f=$(echo "$n" | tr '/' '_'); timeout 120 python3 tools/torch_profile_dist.py --matrix "$m" --only "$n" --output "$OUT/$f.json" 2>&1 | grep -v use_cache | tail -1; }
F=tools/matrices/grad_accum_fsdp_h200.json D=tools/matrices/grad_accum_ddp_h200.json
run $F llama-3.2-1b/fsdp/w4/bf16/none/b1s2048/accum2/sync-every
run $F llama-3.2-1b/fsdp/w4/bf16/none/b1s2048/accum2/sync-last
run $D llama-3.2-1b/ddp/w4/bf16/none/b1s2048/accum2
run $F llama-3.2-1b/fsdp/w4/amp-bf16/none/b1s2048/accum3/sync-last
run $D llama-3.2-1b/tp/w2/bf16/none/b1s2048/accum2
run $D llama-3.2-1b/ddp-view/w4/bf16/none/b1s2048/accum2
run $F llama-3.2-1b/fsdp/w4/amp-bf16/none/b1s2048/accum2/sync-every
run $D llama-3.2-1b/zero1/w4/bf16/none/b1s2048/accum2
run $F qwen2.5-0.5b/fsdp-noreshard/w2/bf16/full/b2s1024/accum2/sync-last
run $D qwen2.5-0.5b/ddp/w2/amp-bf16/none/b2s1024/accum3
run $F qwen3-0.6b/fsdp/w8/amp-bf16/full/b1s2048/accum2/sync-every
run $D qwen2.5-1.5b/tp-sp/w2/bf16/full/b2s2048/accum3
run $D qwen2.5-1.5b/ddp-view/w8/amp-bf16/full/b1s2048/accum2
run $D qwen3-0.6b/ddp/w2/bf16/full/b2s2048/accum4
ls $OUT | wc -l
