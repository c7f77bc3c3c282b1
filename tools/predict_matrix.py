#!/usr/bin/env python3
"""membudget's predictions of a device matrix's training cases (tools/matrices/*.json), written
before the cases are measured: the held-out protocol commits this file first, so the measurement
that follows tests the model rather than tunes it. Single-GPU matrices (torch_profile_step.py) and
one-rank distributed ones (torch_profile_dist.py: a case's "strategy" and "world") both map onto
predict's flags; the distributed mapping is the one torch_profile_dist.py's docstring gives.

Usage: tools/predict_matrix.py MATRIX CLI OUTPUT.json
"""
import json
import os
import subprocess
import sys
import tempfile

# matrix field -> predict flag (the fields torch_profile_step.py reads)
FLAGS = {"batch": "-b", "seq": "-s", "precision": "--precision", "recompute": "--recompute",
         "attention": "--attention", "optimizer": "--optimizer", "optimizer_impl": "--optimizer-impl",
         "lora": "--lora", "allocator_conf": "--allocator-conf",
         "experts_implementation": "--experts", "grad_accum": "--grad-accum-steps",
         "fsdp_grad_sync": "--fsdp-grad-sync"}
KNOWN = set(FLAGS) | {"name", "config", "overrides", "steps", "warmup", "snapshot"}
# torch_profile_dist.py's fields, read by parallel_flags
DIST = {"strategy", "world", "rank", "replicate", "reshard", "bucket_view", "sp", "loss_parallel", "tp"}


def parallel_flags(case):
    """predict's flags for a torch_profile_dist.py case: one rank of a distributed layout."""
    strategy, world = case.get("strategy"), case.get("world")
    if strategy is None:
        return []
    replicate, tp = case.get("replicate", 1), case.get("tp", 1)
    reshard = [] if case.get("reshard", True) else ["--reshard-after-forward", "false"]
    if strategy == "fsdp":
        flags = ["--fsdp", world] + reshard
    elif strategy == "hsdp":
        flags = ["--dp", replicate, "--fsdp", world // replicate] + reshard
    elif strategy == "ddp":
        flags = ["--dp", world] + (["--ddp-bucket-view"] if case.get("bucket_view") else [])
    elif strategy == "zero1":
        flags = ["--dp", world, "--zero", 1]
    elif strategy == "fsdp_tp":
        flags = (["--tp", tp] + (["--dp", replicate] if replicate > 1 else []) +
                 ["--fsdp", world // (replicate * tp)] + reshard + (["--sp"] if case.get("sp") else []))
    elif strategy == "tp":
        flags = (["--tp", world] + (["--sp"] if case.get("sp") else []) +
                 (["--loss-parallel"] if case.get("loss_parallel") else []))
    else:
        sys.exit(f"case {case['name']}: strategy {strategy!r} has no mapping here")
    return [str(f) for f in flags + ["--rank", case.get("rank", 0)]]


def main():
    matrix_path, cli, output = sys.argv[1:4]
    matrix = json.load(open(matrix_path))
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in matrix["cases"]:
            case = dict(matrix.get("defaults", {}), **case)
            unknown = set(case) - KNOWN - DIST
            if unknown:
                sys.exit(f"{matrix_path}: case {case['name']}: fields {sorted(unknown)} have no predict flag here")
            config = case["config"]
            shown = [config]
            if case.get("overrides"):
                spec = json.load(open(config))
                spec.update(case["overrides"])
                config = os.path.join(tmp, os.path.basename(case["config"]))
                json.dump(spec, open(config, "w"))
                shown = [case["config"], "with"] + [f"{k} {v}" for k, v in case["overrides"].items()]
            flags = []
            for field, flag in FLAGS.items():
                if case.get(field) not in (None, ""):
                    flags += [flag, str(case[field])]
            flags += parallel_flags(case) + ["--format", "json"]
            run = subprocess.run([cli, "predict", config] + flags, capture_output=True, text=True)
            if run.returncode:
                sys.exit(f"{case['name']}: {run.stderr.strip()}")
            out = json.loads(run.stdout)
            cases.append({"name": case["name"], "allocator_conf": case.get("allocator_conf", ""),
                          "argv": ["membudget", "predict"] + shown + flags,
                          "reserved_peak": out["reserved_peak"], "nvidia_smi": out["nvidia_smi"],
                          "phases": out["phases"]})
    json.dump({"description": f"membudget's predictions of {matrix_path}, made before they were measured, "
                              "by the build of the commit that adds them", "cases": cases},
              open(output, "w"), indent=1)


if __name__ == "__main__":
    main()
