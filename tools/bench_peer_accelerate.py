#!/usr/bin/env python3
"""Wall time per estimate: accelerate's memory estimator against membudget, in one run.

For each Hugging Face config.json, in the same process and run:

  accelerate  with init_empty_weights(): AutoModelForCausalLM.from_config(config)
              then calculate_maximum_sizes(model)  -- what `accelerate estimate-memory` does,
              timed per estimate (median of --repeat), with its numbers: total size (fp32
              parameters) and its "training using Adam" figure (4x the fp32 size).
  membudget   the Python module: membudget.estimate(config.json, batch, seq, precision) uncached
              (memo table cleared before each call) and memoized; and the CLI from start to exit:
              `membudget predict config.json --format json` (subprocess).

It prints a table and writes JSON with both sides' numbers and the ratio of wall times per estimate.
accelerate/transformers/torch must be importable (they are on the GPU machine, not on the build
machine); the membudget module is taken from --module-dir (default build/python).

    python3 tools/bench_peer_accelerate.py configs/hf/llama-3.2-1b.json configs/hf/llama-3.1-8b.json \
        --repeat 20 --output bench_peer_accelerate.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(fn, repeat):
    fn()  # first call (imports, caches) is reported apart
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def accelerate_side(path, repeat):
    import torch
    from accelerate import init_empty_weights
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    out = {}

    def once():
        with init_empty_weights():
            try:
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            except TypeError:
                model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        total, largest = calculate_maximum_sizes(model)
        out["total_size_bytes"] = int(total)
        out["largest_layer_bytes"] = int(largest[0])
        return total

    t0 = time.perf_counter()
    once()
    out["first_call_s"] = time.perf_counter() - t0
    out["median_s"], out["min_s"] = timed(once, repeat)
    # accelerate estimate-memory's "Training using Adam" for float32: model + grads + 2 Adam states.
    out["training_using_adam_fp32_bytes"] = 4 * out["total_size_bytes"]
    try:
        import accelerate
        import transformers
        out["versions"] = {"accelerate": accelerate.__version__, "transformers": transformers.__version__,
                           "torch": torch.__version__}
    except Exception:  # noqa: BLE001
        pass
    return out


def membudget_side(path, args):
    sys.path.insert(0, args.module_dir)
    import membudget

    job = dict(batch=args.batch, seq=args.seq, precision=args.precision)
    e = membudget.estimate(path, **job)
    out = {"job": job, "peak": e["peak"], "required": e["required"], "model_states": e["terms"]["model_states"],
           "states": e["model_states"], "peak_phase": e["peak_phase"]}
    model = membudget.load_model(path)
    out["parameters"] = model.parameters

    def uncached():
        membudget.clear_cache()
        membudget.estimate(model, **job)

    def memoized():
        membudget.estimate(model, **job)

    def from_path_uncached():  # what a Python user types: parse the config.json every time
        membudget.clear_cache()
        membudget.estimate(path, **job)

    out["uncached_median_s"], out["uncached_min_s"] = timed(uncached, max(args.repeat, 200))
    out["uncached_from_path_median_s"], _ = timed(from_path_uncached, max(args.repeat, 200))
    out["memoized_median_s"], out["memoized_min_s"] = timed(memoized, max(args.repeat, 2000))
    if os.path.exists(args.cli):
        cmd = [args.cli, "predict", path, "--batch", str(args.batch), "--seq", str(args.seq), "--precision",
               args.precision, "--format", "json"]
        out["cli_median_s"], out["cli_min_s"] = timed(
            lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL), max(args.repeat, 20))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("configs", nargs="+", help="Hugging Face config.json files")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--precision", default="amp-bf16")
    p.add_argument("--module-dir", default=os.path.join(ROOT, "build", "python"))
    p.add_argument("--cli", default=os.path.join(ROOT, "build", "membudget"))
    p.add_argument("--output")
    args = p.parse_args(argv)
    doc = {"tool": "tools/bench_peer_accelerate.py", "argv": sys.argv, "host": platform.node(),
           "cpu": platform.processor(), "python": platform.python_version(), "results": []}
    print("%-22s %12s %12s %12s %12s %10s" % ("config", "accel s/est", "mb uncached", "mb memo", "cli s",
                                               "ratio"))
    for path in args.configs:
        entry = {"config": os.path.basename(path)}
        try:
            entry["accelerate"] = accelerate_side(path, args.repeat)
        except Exception as e:  # noqa: BLE001
            entry["accelerate"] = {"error": "%s: %s" % (type(e).__name__, e)}
        entry["membudget"] = membudget_side(path, args)
        a, m = entry["accelerate"], entry["membudget"]
        if "median_s" in a:
            entry["ratio_accelerate_over_membudget_uncached"] = a["median_s"] / m["uncached_median_s"]
            entry["ratio_accelerate_over_membudget_memoized"] = a["median_s"] / m["memoized_median_s"]
            if "cli_median_s" in m:
                entry["ratio_accelerate_over_membudget_cli"] = a["median_s"] / m["cli_median_s"]
        doc["results"].append(entry)
        print("%-22s %12.6f %12.6f %12.9f %12.6f %10.0f" % (
            entry["config"], a.get("median_s", float("nan")), m["uncached_median_s"], m["memoized_median_s"],
            m.get("cli_median_s", float("nan")), entry.get("ratio_accelerate_over_membudget_uncached", float("nan"))))
        print("    accelerate: total %s B (fp32 weights), Adam training %s B | membudget %s: model states %d B, "
              "peak %d B (%s), required %d B" % (a.get("total_size_bytes"), a.get("training_using_adam_fp32_bytes"),
                                                 m["job"], m["model_states"], m["peak"], m["peak_phase"],
                                                 m["required"]))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
