#!/usr/bin/env bash
# tests/data/ddp_rebuild_snapshots/: DDP's second step recorded whole (the bucket rebuild), one rank
# through the fake process group (tools/matrices/ddp_rebuild_snapshot_h200.json), both cases in one
# process (the second after the first; tools/device/fresh_each.sh runs each alone). Writes $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O/snap"
timeout 200 python3 tools/torch_profile_dist.py --matrix tools/matrices/ddp_rebuild_snapshot_h200.json \
  --snapshot-dir "$O/snap" --output "$O/ddp_rebuild_fakepg_h200.json" 2>&1 | tail -5
for f in "$O"/snap/*.pickle; do [ -f "$f" ] && gzip -9 "$f"; done
ls -la "$O/snap"
