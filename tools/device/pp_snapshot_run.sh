#!/usr/bin/env bash
# tests/data/pp_fresh_snapshots/: whole-run allocator snapshots of the two pipeline stages whose
# reserved memory the replay misses when each runs alone (tools/matrices/pp_snapshot_h200.json).
# Run from the repository root; writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_pp.py tools/matrices/pp_snapshot_h200.json "$O/pp_snapshot_fakepg_h200.json"
ls -la "$O" "$O/snap"
