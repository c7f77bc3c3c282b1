#!/usr/bin/env bash
# tests/data/torch_train_ep_deepseek_fakepg_h200.json (+ a step snapshot of the first case): one rank of transformers 5.17's
# expert parallelism (DistributedConfig(enable_expert_parallel=True)) on DeepSeek-V2-Lite and DeepSeek-V3 through the
# fake process group, each case alone in a fresh process (tools/matrices/ep_deepseek_h200.json,
# tools/torch_profile_dist.py strategy "ep"). Run from the repository root; writes into $OUT.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
t0=$(date +%s)
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/ep_deepseek_h200.json "$O/torch_train_ep_deepseek_fakepg_h200.json"
echo "== t=$(( $(date +%s)-t0 ))s"
python3 - "$O/torch_train_ep_deepseek_fakepg_h200.json" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    s = c.get("steady", {})
    print(c["name"], c["status"], {k: s.get(k) for k in ("floor", "forward_peak", "backward_peak", "optimizer_peak", "reserved")}, (c.get("error") or "")[:300])
PY
mv "$O"/snap/*.gz "$O"/ 2>/dev/null; rmdir "$O/snap"; ls -la "$O"
