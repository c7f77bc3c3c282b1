#!/usr/bin/env bash
# tests/data/reserved_snapshots/: whole-run allocator snapshots of four full-recompute steps whose
# reserved memory the replay misses (tools/matrices/reserved_full_snapshot_h200.json), with their
# phase figures (reserved_full_h200.json), the four in one process, one after another
# (tools/device/fresh_each.sh runs each alone). Run from the repository root; writes $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O/snap"
timeout 300 python3 tools/torch_profile_step.py --matrix tools/matrices/reserved_full_snapshot_h200.json \
  --snapshot-dir "$O/snap" --output "$O/reserved_full_h200.json" 2>&1 | tail -12
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O/snap"
