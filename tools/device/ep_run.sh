#!/usr/bin/env bash
# One rank per case of transformers 5.17's expert parallelism (DistributedConfig(enable_expert_parallel=True))
# through the fake process group, each case alone in a fresh process (tools/device/fresh_each.sh,
# tools/torch_profile_dist.py strategies "ep" and "ep_fsdp"). Run from the repository root; writes
# into $OUT the results and the step snapshots the matrix asks for.
#   bash tools/device/ep_run.sh [MATRIX [RESULT]]
# MATRIX / RESULT (the file in $OUT, then committed under tests/data/):
#   tools/matrices/ep_h200.json           torch_train_ep_fakepg_h200.json (the default; snapshots: ep_snapshots/)
#   tools/matrices/ep_fsdp_h200.json      torch_train_ep_fsdp_fakepg_h200.json (--ep E --fsdp F; ep_fsdp_snapshots/)
#   tools/matrices/ep_deepseek_h200.json  torch_train_ep_deepseek_fakepg_h200.json (DeepSeek-V2 and V3; ep_snapshots/)
set -u
matrix=${1:-tools/matrices/ep_h200.json}
result=${2:-torch_train_ep_fakepg_h200.json}
O=${OUT:-/tmp/out}
mkdir -p "$O"
t0=$(date +%s)
bash tools/device/fresh_each.sh tools/torch_profile_dist.py "$matrix" "$O/$result"
echo "== t=$(( $(date +%s)-t0 ))s"
python3 - "$O/$result" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    s = c.get("steady", {})
    print(c["name"], c["status"], {k: s.get(k) for k in ("floor", "forward_peak", "backward_peak", "optimizer_peak", "reserved")}, (c.get("error") or "")[:300])
PY
mv "$O"/snap/*.gz "$O"/ 2>/dev/null
rmdir "$O/snap" 2>/dev/null
ls -la "$O"
