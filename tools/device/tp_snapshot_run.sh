#!/usr/bin/env bash
# tests/data/tp_fresh_snapshots/*alone-snapshot*: whole-run allocator snapshots of the two
# tensor-parallel ranks of tools/matrices/tp_fresh_h200.json that had none
# (tools/matrices/tp_snapshot_h200.json), each alone. Run from the repository root; writes $OUT.
set -u
O=${OUT:-/tmp/out}
bash tools/device/fresh_each.sh tools/torch_profile_dist.py tools/matrices/tp_snapshot_h200.json "$O/tp_snapshot_fakepg_h200.json"
ls -la "$O" "$O/snap"
