#!/usr/bin/env python3
"""How well a rule for cudaMalloc's addresses orders a run's segments as the driver did.

c10's best fit breaks a tie between equal free blocks by the lower address, so what the reserved
replay needs of its fake addresses (src/model/fake_memory.hpp) is the driver's ORDER. For every
committed whole-run snapshot without expandable segments, this replays the segment_alloc and
segment_free sizes through two rules and counts, over every pair of equal-size segments alive
together, the pairs each rule puts in the snapshot's order:
  down     the replay's: each segment below the last (its size in 2 MiB pages and a 2 MiB gap);
  regions  tools/device/cuda_va_probe.py's: the lowest-addressed gap left in the regions made so
           far that holds it, else a new region of its size rounded up to 32 MiB, aligned, below
           the lowest (docs/accuracy.md, "The ties").
Usage: python3 tools/snapshot_address_order.py [-v]   (-v: one line per snapshot)
"""
import bisect
import glob
import gzip
import os
import pickle
import sys
from collections import defaultdict

MIB = 1 << 20
TOP = 1 << 52


def up(x, unit):
    return (x + unit - 1) // unit * unit


class Down:
    def __init__(self):
        self.next = TOP

    def alloc(self, n):
        self.next -= up(n, 2 * MIB) + 2 * MIB
        return self.next


class Regions:
    def __init__(self):
        self.low = TOP
        self.gaps = []  # [start, end), ascending

    def alloc(self, n):
        n = up(n, 2 * MIB)
        for i, (start, end) in enumerate(self.gaps):
            if end - start >= n:
                self.gaps[i:i + 1] = [(start + n, end)] if end > start + n else []
                return start
        size = up(n, 32 * MIB)
        at = (self.low - size) // (32 * MIB) * (32 * MIB)
        for gap in ((at + size, self.low), (at + n, at + size)):
            if gap[1] > gap[0]:
                bisect.insort(self.gaps, gap)
        self.low = at
        return at


def segment_events(path):
    with gzip.open(path, "rb") as f:
        snap = pickle.load(f)
    trace = (snap.get("device_traces") or [[]])[0]
    if any(e["action"] in ("segment_map", "segment_unmap") for e in trace):
        return None  # expandable segments: no cudaMalloc placement
    return [(e["action"], e["addr"], e["size"]) for e in trace if e["action"] in ("segment_alloc", "segment_free")]


def order_agreement(events, rule):
    """(pairs in the snapshot's order, pairs) over equal-size segments alive together."""
    alive = defaultdict(dict)  # size -> {actual address: the rule's}
    agree = pairs = 0
    for action, addr, size in events:
        if action == "segment_free":
            alive[size].pop(addr, None)
            continue
        mine = rule.alloc(size)
        for other, others in alive[size].items():
            pairs += 1
            agree += (addr < other) == (mine < others)
        alive[size][addr] = mine
    return agree, pairs


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
    totals = {"down": [0, 0], "regions": [0, 0]}
    snapshots = 0
    for path in sorted(glob.glob(os.path.join(root, "**", "*.pickle.gz"), recursive=True)):
        events = segment_events(path)
        if not events:
            continue
        snapshots += 1
        line = []
        for name, rule in (("down", Down), ("regions", Regions)):
            agree, pairs = order_agreement(events, rule())
            totals[name][0] += agree
            totals[name][1] += pairs
            line.append("%s %.3f" % (name, agree / pairs if pairs else 1.0))
        if "-v" in sys.argv:
            print("%-100s %s" % (os.path.relpath(path, root)[:100], "  ".join(line)))
    for name, (agree, pairs) in totals.items():
        print("%-8s %d snapshots: %d of %d equal-size segment pairs in the driver's order (%.4f)" % (
            name, snapshots, agree, pairs, agree / pairs))


if __name__ == "__main__":
    main()
