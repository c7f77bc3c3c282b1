#!/usr/bin/env bash
# Runs every case of a matrix alone in a fresh process (a process keeps its earlier cases' cuBLAS
# workspaces and cached segments, which change what a later case reserves), then merges the
# results into one file. Usage: fresh_each.sh TOOL MATRIX OUTPUT.json; snapshots go to
# $(dirname OUTPUT)/snap/. TOOL is tools/torch_profile_step.py, _dist.py or _pp.py.
set -u
export PYTHONUNBUFFERED=1
tool=$1 matrix=$2 output=$3
dir=$(dirname "$output")
work=$(mktemp -d)
mkdir -p "$dir/snap"
python3 -c "import json, sys; [print(c['name']) for c in json.load(open(sys.argv[1]))['cases']]" "$matrix" |
  while read -r name; do
    timeout 240 python3 "$tool" --matrix "$matrix" --only "$name" --snapshot-dir "$dir/snap" \
      --output "$work/$(echo "$name" | tr '/' '_').json" 2>&1 | grep -v use_cache | tail -1
  done
for f in "$dir"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
python3 - "$work" "$output" "$tool $matrix" <<'PY'
import glob, json, os, sys
work, output, how = sys.argv[1:4]
merged = None
for f in sorted(glob.glob(os.path.join(work, "*.json"))):
    d = json.load(open(f))
    if merged is None:
        merged = dict(d, cases=[], argv=["tools/device/fresh_each.sh"] + how.split())
    merged["cases"] += d["cases"]
if merged:
    json.dump(merged, open(output, "w"), indent=1)
PY
rm -r "$work"
