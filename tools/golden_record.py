#!/usr/bin/env python3
"""Records (or checks) the CLI's JSON answers over every config and a fixed grid of jobs.

Refactors promise that no committed prediction moves: `record` writes what the CLI says today for
predict, serve, advise and max-batch over every spec in configs/ and tests/data/hf/ and a
deterministic grid of jobs (tests/data/golden/record.json.gz); `check` runs the same invocations
with the CLI under test and fails on the first field that differs. A field the record lacks (a new
output added since) is allowed; a recorded field that is missing or changed is not.

    python3 tools/golden_record.py record --cli build/membudget
    python3 tools/golden_record.py check  --cli build/membudget
"""
import argparse
import concurrent.futures
import gzip
import itertools
import json
import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(ROOT, "tests", "data", "golden", "record.json.gz")


def specs():
    out = []
    for folder in ("configs", "configs/hf", "tests/data/hf"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith((".yaml", ".json")):
                out.append(f"{folder}/{name}")
    return out


def invocations():
    """Every (command, spec, flags) the record holds, in a fixed order (seeded sampling)."""
    rng = random.Random(20261201)
    train_axes = {
        "--batch": ["1", "2", "4"],
        "--seq": ["256", "1024", "4096", "8192"],
        "--precision": ["fp32", "amp-bf16", "bf16", "bf16-master"],
        "--optimizer": ["adamw", "sgd", "sgd-momentum", "adamw-8bit", "adafactor", "lion"],
        "--recompute": ["none", "selective", "full"],
        "--attention": ["flash", "math"],
        "--loss": ["full", "chunked"],
        "--lora": ["0", "0", "0", "16"],
        "--activations": ["inventory", "inventory", "inventory", "korthikanti"],
        "--profile": ["torch", "torch", "torch", "harness"],
    }
    infer_axes = {
        "--batch": ["1", "8", "32"],
        "--seq": ["512", "4096", "32768"],
        "--kv-dtype": ["bf16", "fp16", "fp8", "int8"],
        "--weights": ["bf16", "fp16", "fp8", "int8", "int4"],
    }
    runs = []
    for spec in specs():
        runs.append(("predict", spec, []))  # the spec's own job
        runs.append(("predict", spec, ["--mode", "infer"]))
        for _ in range(20):
            flags = []
            for k, vs in train_axes.items():
                flags += [k, rng.choice(vs)]
            runs.append(("predict", spec, flags))
        for _ in range(4):
            flags = ["--mode", "infer"]
            for k, vs in infer_axes.items():
                flags += [k, rng.choice(vs)]
            runs.append(("predict", spec, flags))
        runs.append(("predict", spec, ["--batch", "1", "--seq", "2048", "--explain"]))
        for dev in ("H100", "A100-40GB", "RTX-4090"):
            runs.append(("serve", spec, ["--device", dev]))
        runs.append(("serve", spec, ["--device", "H200", "--kv-dtype", "fp8", "--weights", "int4",
                                     "--max-model-len", "8192", "--traffic", "64x2048"]))
        for dev, prec in itertools.product(("H100", "A100-40GB"), ("amp-bf16", "bf16")):
            runs.append(("advise", spec, ["--device", dev, "--precision", prec, "--batch", "2",
                                          "--seq", "4096"]))
            runs.append(("max-batch", spec, ["--device", dev, "--precision", prec, "--seq", "2048",
                                             "--global-batch", "64", "--data-parallel", "2"]))
    runs += parallel_invocations()
    return runs


def parallel_invocations():
    """One rank of every modelled layout (added 2026-12-03, after the record's single-GPU grid):
    dense models under DDP, ZeRO-1, FSDP2, HSDP, TP (with SP and the vocabulary-parallel loss),
    FSDP2 × TP, pipelines and context parallelism; MoE models under FSDP2 and expert parallelism."""
    dense = {
        "configs/llama-3.2-1b.yaml": [],  # tied
        "configs/hf/llama-3.1-8b.json": [],
        "configs/hf/qwen2.5-0.5b.json": [],
    }
    layouts = [
        ["--dp", "4"], ["--dp", "4", "--zero", "1", "--rank", "3"], ["--dp", "4", "--ddp-bucket-view"],
        ["--fsdp", "8"], ["--fsdp", "8", "--reshard-after-forward", "false"], ["--dp", "2", "--fsdp", "4"],
        ["--tp", "2"], ["--tp", "2", "--sp"], ["--tp", "2", "--loss-parallel"], ["--tp", "2", "--sp", "--loss-parallel"],
        ["--fsdp", "2", "--tp", "2"], ["--pp", "2", "--precision", "bf16"],
        ["--pp", "2", "--fsdp", "2", "--pp-schedule", "gpipe"], ["--pp", "2", "--tp", "2", "--precision", "bf16", "--rank", "3"],
        ["--cp", "2", "--precision", "bf16"],
    ]
    runs = []
    for spec in dense:
        if not os.path.exists(os.path.join(ROOT, spec)):
            continue
        for lay in layouts:
            runs.append(("predict", spec, ["--batch", "1", "--seq", "1024", *lay]))
    moe = ["tests/data/hf/moe/qwen3-30b-a3b.json", "tests/data/hf/moe/mixtral-8x7b.json",
           "tests/data/hf/moe/olmoe-1b-7b.json", "tests/data/hf/moe/qwen1.5-moe-a2.7b.json"]
    for spec in moe:
        for lay in (["--seq", "512", "--fsdp", "8"], ["--seq", "512", "--ep", "2"],
                    ["--seq", "512", "--ep", "4", "--rank", "1", "--precision", "bf16"],
                    ["--seq", "64", "--ep", "2", "--experts", "batched_mm"]):
            runs.append(("predict", spec, ["--batch", "1", *lay]))
    return runs


def run_one(cli, run):
    cmd, spec, flags = run
    p = subprocess.run([cli, cmd, spec, *flags, "--format", "json"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    try:
        out = json.loads(p.stdout)
    except ValueError:
        out = p.stdout
    return {"cmd": cmd, "spec": spec, "flags": flags, "rc": p.returncode, "out": out,
            "err": p.stderr.strip() if p.returncode != 0 else ""}


def run_all(cli):
    runs = invocations()
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(lambda r: run_one(cli, r), runs))


def differs(old, new, path):
    """The first path where `new` does not carry `old`'s value (extra keys in `new` are fine)."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return path
        for k, v in old.items():
            if k not in new:
                return f"{path}.{k} (missing)"
            d = differs(v, new[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(old, list):
        if not isinstance(new, list) or len(old) != len(new):
            return f"{path} (length)"
        for i, (a, b) in enumerate(zip(old, new)):
            d = differs(a, b, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if old == new else f"{path}: {old!r} -> {new!r}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=["record", "check"])
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "membudget"))
    ap.add_argument("--max-report", type=int, default=20)
    a = ap.parse_args()
    results = run_all(os.path.abspath(a.cli))
    if a.action == "record":
        os.makedirs(os.path.dirname(RECORD), exist_ok=True)
        with gzip.open(RECORD, "wt") as f:
            json.dump(results, f, sort_keys=True)
        ok = sum(r["rc"] in (0, 1) for r in results)
        print(f"recorded {len(results)} invocations ({ok} answered, {len(results) - ok} errors)")
        return 0
    with gzip.open(RECORD, "rt") as f:
        recorded = json.load(f)
    if len(recorded) != len(results):
        print(f"the grid changed: {len(recorded)} recorded, {len(results)} run", file=sys.stderr)
        return 1
    bad = 0
    for old, new in zip(recorded, results):
        where = f"{old['cmd']} {old['spec']} {' '.join(old['flags'])}"
        d = differs({"rc": old["rc"], "out": old["out"]}, {"rc": new["rc"], "out": new["out"]}, "")
        if d:
            bad += 1
            if bad <= a.max_report:
                print(f"{where}: {d}", file=sys.stderr)
    print(f"{len(results) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
