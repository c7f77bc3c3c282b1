#!/usr/bin/env python3
"""Record CUDA caching-allocator snapshots of real training steps, and real OOM messages.

  --what small   a tiny Llama (hidden 256, 2 layers, vocab 1024), batch 2 x seq 128,
                 amp-bf16 + AdamW, two steps, recorded from before the model is built.
                 Written in several recording variants (context/stacks), each with a JSON
                 sidecar holding the allocator readings at every phase, so a test can check
                 a snapshot replay against memory_allocated()/max_memory_allocated().
  --what large   the same recipe on a bigger config (hidden 1024, vocab 32000, --large-layers
                 layers, --large-steps steps): a benchmark input of ~5-15 MB.
  --what oom     real torch.cuda.OutOfMemoryError texts: a 200 GiB request, a request into
                 a device filled and fragmented by the caching allocator, and a request over a
                 per-process memory fraction.

Snapshots are written with torch.cuda.memory._record_memory_history(...) and
torch.cuda.memory._dump_snapshot(path) (pickle; open it at https://pytorch.org/memory_viz).

Example:
    python3 tools/torch_snapshot_step.py --what small,large,oom --outdir snapshots/
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gt_common as common  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
    "attention_dropout": 0.0, "mlp_bias": False, "hidden_act": "silu", "hidden_size": 256,
    "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "initializer_range": 0.02,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "use_cache": True, "vocab_size": 1024,
    "bos_token_id": 1, "eos_token_id": 2,
}
LARGE_LLAMA = dict(TINY_LLAMA, hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,
                   num_attention_heads=16, num_key_value_heads=4, head_dim=64, vocab_size=32000)


def _record(enabled, context, stacks, max_entries):
    import torch

    kw = {"enabled": enabled}
    if enabled is not None:
        kw.update({"context": context, "stacks": stacks, "max_entries": max_entries})
    torch.cuda.memory._record_memory_history(**kw)


def train_steps(cfgd, batch, seq, steps, readings):
    import torch

    cfg = common.make_config(cfgd)
    torch.manual_seed(0)
    readings.append(("start", common.allocator_reading(), torch.cuda.max_memory_allocated()))
    model = common.build_causal_lm(cfg, torch.float32, "sdpa")
    model.train()
    readings.append(("model_built", common.allocator_reading(), torch.cuda.max_memory_allocated()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator(device="cuda")
    g.manual_seed(3)
    x = torch.randint(0, cfgd["vocab_size"], (batch, seq), device="cuda", generator=g)
    for i in range(steps):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        readings.append(("step%d_after_forward" % i, common.allocator_reading(),
                         torch.cuda.max_memory_allocated()))
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        del loss
        readings.append(("step%d_after_backward" % i, common.allocator_reading(),
                         torch.cuda.max_memory_allocated()))
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        opt.zero_grad(set_to_none=True)
        readings.append(("step%d_after_optimizer" % i, common.allocator_reading(),
                         torch.cuda.max_memory_allocated()))
    n_params = sum(p.numel() for p in model.parameters())
    return model, opt, x, n_params


def snapshot_variant(outdir, stem, cfgd, batch, seq, steps, context, stacks, max_entries):
    import torch

    common.clean_cuda()
    path = os.path.join(outdir, stem + ".pickle")
    readings = []
    info = {"file": os.path.basename(path), "config": cfgd, "batch": batch, "seq": seq,
            "steps": steps, "recipe": "amp-bf16 AdamW(lr=1e-5), sdpa, HF Trainer-style step",
            "record_memory_history": {"enabled": "all", "context": context, "stacks": stacks,
                                      "max_entries": max_entries}}
    t0 = time.perf_counter()
    try:
        _record("all", context, stacks, max_entries)
        model, opt, x, n_params = train_steps(cfgd, batch, seq, steps, readings)
        torch.cuda.synchronize()
        info["end_reading"] = common.allocator_reading()
        torch.cuda.memory._dump_snapshot(path)
        _record(None, None, None, None)
        info["parameters"] = n_params
        del model, opt, x
        info["status"] = "ok"
        info["bytes"] = os.path.getsize(path)
    except Exception as e:
        try:
            _record(None, None, None, None)
        except Exception:
            pass
        info["status"] = "error"
        info["error"] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-3000:])
    info["readings"] = [{"at": a, "max_allocated_since_reset": m, **r} for a, r, m in readings]
    info["wall_s"] = time.perf_counter() - t0
    try:
        import pickle

        with open(path, "rb") as f:
            snap = pickle.load(f)
        info["snapshot_keys"] = sorted(snap.keys())
        info["segments"] = len(snap.get("segments", []))
        info["trace_entries"] = sum(len(t) for t in snap.get("device_traces", []))
        info["segments_total_size"] = sum(s.get("total_size", 0) for s in snap.get("segments", []))
        info["segments_allocated_size"] = sum(s.get("allocated_size", 0) for s in snap.get("segments", []))
        actions = {}
        for t in snap.get("device_traces", []):
            for e in t:
                actions[e.get("action")] = actions.get(e.get("action"), 0) + 1
        info["trace_actions"] = actions
    except Exception as e:
        info["snapshot_read_error"] = repr(e)
    common.write_json(os.path.join(outdir, stem + ".json"), info)
    print("snapshot %-30s %s %s bytes, %s trace entries, %.1fs" % (
        stem, info["status"], info.get("bytes"), info.get("trace_entries"), info["wall_s"]), flush=True)
    common.clean_cuda()
    return info


def do_small(outdir):
    out = []
    for stem, context, stacks in (("small_ctx_all_py", "all", "python"),
                                  ("small_ctx_alloc_py", "alloc", "python"),
                                  ("small_ctx_none", None, "python")):
        out.append(snapshot_variant(outdir, stem, TINY_LLAMA, 2, 128, 2, context, stacks, 100000))
    return out


def do_large(outdir, max_entries, layers, steps, contexts):
    out = []
    cfgd = dict(LARGE_LLAMA, num_hidden_layers=layers)
    for ctx in contexts:
        stem = "large_L%d_s%d_ctx_%s_py" % (layers, steps, ctx)
        out.append(snapshot_variant(outdir, stem, cfgd, 4, 512, steps, ctx, "python", max_entries))
    return out


def do_oom(outdir):
    import torch

    msgs = {}

    def attempt(name, fn):
        try:
            fn()
            msgs[name] = {"status": "no_oom"}
        except torch.cuda.OutOfMemoryError as e:
            msgs[name] = {"status": "oom", "message": str(e)}
        except Exception as e:
            msgs[name] = {"status": "error", "message": "%s: %s" % (type(e).__name__, e)}
        gc.collect()
        with open(os.path.join(outdir, "oom_%s.txt" % name), "w") as f:
            f.write(msgs[name].get("message", msgs[name]["status"]) + "\n")
        print("oom %-20s %s" % (name, msgs[name]["status"]), flush=True)

    common.clean_cuda()
    total = torch.cuda.get_device_properties(0).total_memory

    # 1: one request far over the device
    attempt("huge_200gib", lambda: torch.empty(200 * GiB, dtype=torch.uint8, device="cuda"))
    common.clean_cuda()

    # 2: device filled by the caching allocator, then fragmented: every 4 GiB segment keeps a
    # 3 GiB tensor and a 1 GiB cached hole, so a 2 GiB request finds no block although
    # ~N GiB are reserved but unallocated.
    state = {}

    def fragmented():
        big = []
        try:
            while True:
                big.append(torch.empty(4 * GiB, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            pass
        small = []
        try:
            while True:
                small.append(torch.empty(256 * MiB, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            pass
        state["segments_4gib"] = len(big)
        state["fillers_256mib"] = len(small)
        n = len(big)
        big.clear()  # blocks stay cached (reserved) in the allocator
        keep = [torch.empty(3 * GiB, dtype=torch.uint8, device="cuda") for _ in range(n)]
        state["allocated_before_request"] = torch.cuda.memory_allocated()
        state["reserved_before_request"] = torch.cuda.memory_reserved()
        try:
            torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
        finally:
            state["stats_after"] = {k: v for k, v in torch.cuda.memory_stats().items()
                                    if k in ("num_alloc_retries", "num_ooms")}
            del keep, small

    attempt("fragmented_2gib", fragmented)
    msgs["fragmented_2gib"]["setup"] = state
    common.clean_cuda()

    # 3: per-process memory fraction
    def fraction():
        torch.cuda.set_per_process_memory_fraction(0.05)
        try:
            torch.empty(int(total * 0.10), dtype=torch.uint8, device="cuda")
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)

    attempt("memory_fraction", fraction)
    common.clean_cuda()
    common.write_json(os.path.join(outdir, "oom_messages.json"),
                      {"env": common.env_info(), "messages": msgs})
    return msgs


def main(argv=None):
    p = argparse.ArgumentParser(description="Allocator snapshots of training steps and OOM "
                                            "message texts (see module docstring).",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--what", default="small,large,oom", help="comma list of small, large, oom")
    p.add_argument("--large-max-entries", type=int, default=1000000)
    p.add_argument("--large-layers", type=int, default=32,
                   help="decoder layers of the large config (hidden 1024, vocab 32000)")
    p.add_argument("--large-steps", type=int, default=5)
    p.add_argument("--large-contexts", default="all", help="comma list of context= values")
    p.add_argument("--outdir", required=True)
    args = p.parse_args(argv)
    os.makedirs(args.outdir, exist_ok=True)
    what = [w.strip() for w in args.what.split(",") if w.strip()]
    summary = {"tool": "tools/torch_snapshot_step.py", "argv": sys.argv, "env": common.env_info()}
    for w in what:
        try:
            if w == "small":
                summary["small"] = do_small(args.outdir)
            elif w == "large":
                summary["large"] = do_large(args.outdir, args.large_max_entries, args.large_layers,
                                            args.large_steps, args.large_contexts.split(","))
            elif w == "oom":
                summary["oom"] = do_oom(args.outdir)
            else:
                raise ValueError("unknown --what item %r" % w)
        except Exception as e:
            summary[w + "_error"] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-3000:])
            print("snapshot %s failed: %s" % (w, e), flush=True)
        common.write_json(os.path.join(args.outdir, "summary.json"), summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
