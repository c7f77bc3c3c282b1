#!/usr/bin/env python3
"""Inference ground truth: GPU memory of a Hugging Face prefill and one decode step.

The model is built in bf16 from a config.json with random weights, attention 'sdpa', and run
under torch.inference_mode():

    out = model(input_ids=x, use_cache=True, logits_to_keep=1)          # prefill, B prompts of S tokens
    out2 = model(input_ids=next_tok, past_key_values=out.past_key_values,
                 use_cache=True, logits_to_keep=1)                       # one decode step

Recorded per (B, S), in bytes:
    floor          memory_allocated() with the weights (and the prompt ids) only
    prefill_peak   max_memory_allocated() during the prefill (peak stats reset before)
    after_prefill  memory_allocated() after it, keeping the returned cache and logits
    kv_cache_bytes sum of numel*element_size over the returned cache's keys and values
    decode_peak    max_memory_allocated() during one decode step with that cache (reset before)
    after_decode   memory_allocated() after it (new cache and logits kept, old output dropped)
plus reserved/outside readings, the cache's class and per-layer key/value shapes.

Example:
    python3 tools/torch_profile_prefill.py --config configs/hf/llama-3.2-1b.json \\
        --shapes 1x2048,4x4096 --output prefill.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gt_common as common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_SHAPES = "1x2048,4x4096,8x8192,16x1024,1x32768"


def cache_tensors(cache):
    """[(layer, 'k'|'v', tensor)] from a transformers Cache object or a legacy tuple."""
    import torch

    out = []
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for i, lay in enumerate(layers):
            for name, attrs in (("k", ("keys", "key_cache")), ("v", ("values", "value_cache"))):
                for a in attrs:
                    t = getattr(lay, a, None)
                    if torch.is_tensor(t):
                        out.append((i, name, t))
                        break
        if out:
            return out
    kc = getattr(cache, "key_cache", None)
    vc = getattr(cache, "value_cache", None)
    if isinstance(kc, (list, tuple)) and isinstance(vc, (list, tuple)):
        for i, (k, v) in enumerate(zip(kc, vc)):
            if torch.is_tensor(k):
                out.append((i, "k", k))
            if torch.is_tensor(v):
                out.append((i, "v", v))
        if out:
            return out
    legacy = cache
    if hasattr(cache, "to_legacy_cache"):
        try:
            legacy = cache.to_legacy_cache()
        except Exception:
            legacy = cache
    try:
        for i, kv in enumerate(legacy):
            k, v = kv[0], kv[1]
            out.append((i, "k", k))
            out.append((i, "v", v))
    except Exception:
        pass
    return out


def cache_info(cache):
    ts = cache_tensors(cache)
    seen = set()
    total = 0
    unique = 0
    for _, _, t in ts:
        b = t.numel() * t.element_size()
        total += b
        p = t.untyped_storage().data_ptr()
        if p not in seen:
            seen.add(p)
            unique += t.untyped_storage().nbytes()
    first = [(i, n, list(t.shape), str(t.dtype)) for i, n, t in ts[:4]]
    return {"class": type(cache).__name__, "tensors": len(ts), "kv_cache_bytes": total,
            "kv_cache_storage_bytes": unique, "first_tensors": first,
            "layer_classes": sorted({type(l).__name__ for l in getattr(cache, "layers", [])})}


def run_shape(model, vocab, B, S):
    import torch

    cuda = torch.cuda
    res = {"batch": B, "seq": S, "status": "running"}
    out = out2 = x = nxt = None
    try:
        g = torch.Generator(device="cuda")
        g.manual_seed(11)
        x = torch.randint(0, vocab, (B, S), device="cuda", generator=g)
        common.clean_cuda()
        cuda.synchronize()
        res["floor"] = cuda.memory_allocated()
        res["floor_reading"] = common.allocator_reading()
        cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model(input_ids=x, use_cache=True, logits_to_keep=1)
        cuda.synchronize()
        res["prefill_s"] = time.perf_counter() - t0
        res["prefill_peak"] = cuda.max_memory_allocated()
        res["after_prefill"] = cuda.memory_allocated()
        res["after_prefill_reading"] = common.allocator_reading()
        res["logits_shape"] = list(out.logits.shape)
        res["logits_dtype"] = str(out.logits.dtype)
        res["logits_bytes"] = out.logits.numel() * out.logits.element_size()
        res["cache"] = cache_info(out.past_key_values)
        res["kv_cache_bytes"] = res["cache"]["kv_cache_bytes"]
        res["prefill_peak_minus_floor"] = res["prefill_peak"] - res["floor"]
        res["after_prefill_minus_floor"] = res["after_prefill"] - res["floor"]
        with torch.inference_mode():
            nxt = out.logits[:, -1:].argmax(-1)
        cuda.synchronize()
        cuda.reset_peak_memory_stats()
        res["before_decode"] = cuda.memory_allocated()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out2 = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True,
                         logits_to_keep=1)
        cuda.synchronize()
        res["decode_s"] = time.perf_counter() - t0
        res["decode_peak"] = cuda.max_memory_allocated()
        res["decode_peak_minus_floor"] = res["decode_peak"] - res["floor"]
        out = None
        cuda.synchronize()
        res["after_decode"] = cuda.memory_allocated()
        res["cache_after_decode"] = cache_info(out2.past_key_values)
        res["after_decode_reading"] = common.allocator_reading()
        res["status"] = "ok"
    except torch.cuda.OutOfMemoryError as e:
        res["status"] = "oom"
        res["error"] = str(e)
    except Exception as e:
        res["status"] = "error"
        res["error"] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-3000:])
    finally:
        out = out2 = x = nxt = None
        common.clean_cuda()
    return res


def parse_shapes(s):
    out = []
    for it in s.split(","):
        b, _, t = it.strip().lower().partition("x")
        out.append((int(b), int(t)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="Prefill/decode memory of a HF causal LM in bf16 "
                                            "(see module docstring).",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--config", action="append", required=True,
                   help="config.json (repeatable: models run in the order given)")
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="BxS list (default %s)" % DEFAULT_SHAPES)
    p.add_argument("--override", action="append", default=[], metavar="KEY=JSON",
                   help="config override applied to every model, e.g. num_hidden_layers=2")
    p.add_argument("--attention", choices=("flash", "math"), default="flash")
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)

    import json

    import torch

    overrides = {}
    for it in args.override:
        k, _, v = it.partition("=")
        overrides[k] = json.loads(v)
    shapes = parse_shapes(args.shapes)
    doc = {"tool": "tools/torch_profile_prefill.py", "argv": sys.argv, "env": common.env_info(),
           "units": "bytes", "models": []}
    for cpath in args.config:
        cpath = common.resolve_path(cpath, os.getcwd(), REPO)
        entry = {"config": os.path.basename(cpath), "overrides": overrides or None,
                 "attn_implementation": common.ATTENTION_IMPL[args.attention], "shapes": []}
        doc["models"].append(entry)
        model = None
        try:
            common.clean_cuda()
            base = torch.cuda.memory_allocated()
            cfgd = common.load_config_dict(cpath, overrides)
            cfg = common.make_config(cfgd)
            t0 = time.perf_counter()
            torch.manual_seed(0)
            model = common.build_causal_lm(cfg, torch.bfloat16, entry["attn_implementation"])
            model.eval()
            entry["build_s"] = time.perf_counter() - t0
            entry["model"] = common.param_stats(model)
            common.clean_cuda()
            entry["weights_allocated"] = torch.cuda.memory_allocated() - base
        except Exception as e:
            entry["status"] = "error"
            entry["error"] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-3000:])
            common.write_json(args.output, doc)
            print("prefill %s: build error %s" % (entry["config"], e), flush=True)
            model = None
            common.clean_cuda()
            continue
        for B, S in shapes:
            r = run_shape(model, int(cfgd["vocab_size"]), B, S)
            entry["shapes"].append(r)
            common.write_json(args.output, doc)
            print("prefill %-20s B=%-3d S=%-6d %-5s floor=%s peak=%s after=%s kv=%s decode_peak=%s MiB (%.2fs)" % (
                entry["config"], B, S, r["status"], common.mib(r.get("floor")),
                common.mib(r.get("prefill_peak")), common.mib(r.get("after_prefill")),
                common.mib(r.get("kv_cache_bytes")), common.mib(r.get("decode_peak")),
                r.get("prefill_s", 0.0)), flush=True)
            if r["status"] != "ok":
                print("    " + r.get("error", "")[:500], flush=True)
        entry["status"] = "ok"
        del model
        common.clean_cuda()
        common.write_json(args.output, doc)
    doc["finished"] = True
    common.write_json(args.output, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
