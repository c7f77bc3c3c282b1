#!/usr/bin/env bash
# tests/data/torch_train_pp_tp_ddp_fakepg_h200.json: one rank of a pipeline whose stages are
# tensor-parallel (alone, or with FSDP2 across: torchtitan's 3-D layout) or replicated by DDP,
# through PyTorch's fake process group (tools/matrices/pp_tp_ddp_h200.json,
# tools/torch_profile_pp.py), with three allocator snapshots. Run from the repository root; writes $OUT.
#
# A tensor-parallel case runs in a process of its own: after destroy_process_group, a second
# device mesh of the same shape in one process hands DTensor's collectives a stale group name
# ("Could not resolve the process group registered under the name 9"; torch 2.11).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
M=tools/matrices/pp_tp_ddp_h200.json
mkdir -p "$O/snap" "$O/parts"
t0=$(date +%s)
# what torch.distributed.pipelining does with a DDP-wrapped stage (kept beside the data)
python3 - > "$O/pipelining_ddp_source.txt" 2>&1 <<'PY'
import inspect
from torch.distributed.pipelining import stage
for name in ("backward_maybe_with_nosync", "perform_reduce_grad", "scale_grads"):
    fn = getattr(stage._PipelineStageBase, name, None)
    if fn is not None:
        print(inspect.getsource(fn))
PY
# the cases without tensor parallelism in one process; each tensor-parallel case in its own (above).
# Names given as arguments run only those cases.
python3 - "$M" "$@" > "$O/names.txt" <<'PY'
import json, sys
want = set(sys.argv[2:])
for c in json.load(open(sys.argv[1]))["cases"]:
    if not want or c["name"] in want:
        print(("tp " if int(c.get("tp") or 1) > 1 else "one ") + c["name"])
PY
python3 - "$M" "$O/names.txt" > "$O/rest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
keep = {l.split(" ", 1)[1].strip() for l in open(sys.argv[2]) if l.startswith("one ")}
m["cases"] = [c for c in m["cases"] if c["name"] in keep]
print(json.dumps(m))
PY
i=0
if grep -q "^one " "$O/names.txt"; then
  timeout 200 python3 tools/torch_profile_pp.py --matrix "$O/rest.json" --snapshot-dir "$O/snap" \
    --output "$O/parts/00.json" 2>&1 | tee -a "$O/log.txt"
fi
grep "^tp " "$O/names.txt" | cut -d' ' -f2- | while read -r name; do
  i=$((i + 1))
  timeout 60 python3 tools/torch_profile_pp.py --matrix "$M" --only "$name" --snapshot-dir "$O/snap" \
    --output "$O/parts/$(printf %02d $i).json" 2>&1 | tee -a "$O/log.txt"
done
rm -f "$O/names.txt" "$O/rest.json"
python3 - "$O" <<'PY'
import glob, json, sys
o = sys.argv[1]
parts = [json.load(open(p)) for p in sorted(glob.glob(o + "/parts/*.json"))]
doc = dict(parts[0])
doc["argv"] = ["tools/device/pp_tp_ddp_run.sh (one process per case)"]
doc["cases"] = [c for p in parts for c in p["cases"]]
doc["elapsed_s"] = sum(p.get("elapsed_s", 0) for p in parts)
json.dump(doc, open(o + "/torch_train_pp_tp_ddp_fakepg_h200.json", "w"), indent=1)
print(len(doc["cases"]), "cases:", sum(c["status"] == "ok" for c in doc["cases"]), "ok")
PY
rm -rf "$O/parts"
echo "== t=$(( $(date +%s)-t0 ))s"
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O" "$O/snap"
