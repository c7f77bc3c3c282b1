#!/usr/bin/env python3
"""What `accelerate estimate-memory` says for a local config.json, and how long it takes.

Mirrors accelerate/commands/estimate.py (gather_data + estimate_training_usage) with the
model built from a local config instead of the Hub:

    with init_empty_weights():
        model = AutoModel.from_config(config, dtype=torch.float32)   # what the CLI builds
    total_size, largest_layer = calculate_maximum_sizes(model)

and for every dtype row of the CLI (float32, float16, int8, int4): largest layer and total
size (divided by 2/4/8 for float16/int8/int4) and "Training using Adam" =
max(estimate_training_usage(total_size, dtype).values()), i.e. 4x the fp32 size for float32
(model + grads + 2 Adam states) and 2x the fp32 size for float16 (mixed precision), N/A for
int8/int4. The CLI builds AutoModel (no LM head) unless the Hub metadata names an
AutoModelFor* class; the AutoModelForCausalLM numbers are reported as well.

Example:
    python3 tools/peer_accelerate_estimate.py configs/hf/llama-3.2-1b.json --repeat 20 --output p.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gt_common as common  # noqa: E402

DTYPES = ("float32", "float16", "int8", "int4")


def build_empty(cfg, auto_cls):
    import torch
    from accelerate import init_empty_weights

    with init_empty_weights():
        try:
            return auto_cls.from_config(cfg, dtype=torch.float32)
        except TypeError:
            return auto_cls.from_config(cfg, torch_dtype=torch.float32)


def estimate_once(cfgd, auto_cls):
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes, convert_bytes

    cfg = common.make_config(cfgd)
    model = build_empty(cfg, auto_cls)
    total_size, largest_layer = calculate_maximum_sizes(model)
    rows = []
    for dtype in DTYPES:
        dtype_total_size = total_size
        dtype_largest_layer = largest_layer[0]
        training = estimate_training_usage(dtype_total_size, dtype)
        if dtype == "float16":
            dtype_total_size /= 2
            dtype_largest_layer /= 2
        elif dtype == "int8":
            dtype_total_size /= 4
            dtype_largest_layer /= 4
        elif dtype == "int4":
            dtype_total_size /= 8
            dtype_largest_layer /= 8
        train_max = max(training.values())
        rows.append({
            "dtype": dtype,
            "largest_layer_bytes": dtype_largest_layer,
            "total_size_bytes": dtype_total_size,
            "training_using_adam_bytes": train_max if train_max != -1 else None,
            "training_breakdown_bytes": training,
            "cli_strings": [dtype, convert_bytes(dtype_largest_layer), convert_bytes(dtype_total_size),
                            convert_bytes(train_max) if train_max != -1 else "N/A"],
        })
    return {"total_size_bytes": total_size, "largest_layer": [largest_layer[0], largest_layer[1]],
            "rows": rows}


def main(argv=None):
    p = argparse.ArgumentParser(description="accelerate estimate-memory numbers for local configs "
                                            "(see module docstring).",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("configs", nargs="+", help="config.json files")
    p.add_argument("--repeat", type=int, default=10, help="timed repetitions per estimate")
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)

    from transformers import AutoModel, AutoModelForCausalLM

    import_t0 = time.perf_counter()
    doc = {"tool": "tools/peer_accelerate_estimate.py", "argv": sys.argv, "env": common.env_info(),
           "units": "bytes", "results": []}
    doc["env_info_s"] = time.perf_counter() - import_t0
    for path in args.configs:
        cfgd = common.load_config_dict(path)
        entry = {"config": os.path.basename(path)}
        for label, cls in (("AutoModel", AutoModel), ("AutoModelForCausalLM", AutoModelForCausalLM)):
            try:
                first_t0 = time.perf_counter()
                est = estimate_once(cfgd, cls)
                first = time.perf_counter() - first_t0
                times = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    estimate_once(cfgd, cls)
                    times.append(time.perf_counter() - t0)
                est["first_call_s"] = first
                est["repeat"] = args.repeat
                est["wall_s_median"] = statistics.median(times) if times else None
                est["wall_s_min"] = min(times) if times else None
                est["wall_s_all"] = times
                entry[label] = est
            except Exception as e:
                entry[label] = {"error": "%s: %s" % (type(e).__name__, e)}
        doc["results"].append(entry)
        am = entry.get("AutoModel", {})
        print("accelerate %-20s total=%s largest=%s adam_fp32=%s median=%.3fs" % (
            entry["config"], am.get("total_size_bytes"), (am.get("largest_layer") or [None])[0],
            (am.get("rows") or [{}])[0].get("training_using_adam_bytes"),
            am.get("wall_s_median") or -1.0), flush=True)
        common.write_json(args.output, doc)
    doc["finished"] = True
    common.write_json(args.output, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
