#!/usr/bin/env python3
"""Inventory of the tensors a real Hugging Face forward saves for backward.

One forward (+ the HF causal-LM loss) of a SMALL model is run under
torch.autograd.graph.saved_tensors_hooks. Every packed tensor is recorded with its shape,
dtype, numel*element_size, storage (data_ptr, nbytes; a storage seen before is marked as a
duplicate), whether it is a parameter, the module that was running (forward hooks), the torch
function being called (a TorchFunctionMode) and, after the forward, the autograd node(s) that
hold it: the graph is walked from loss.grad_fn and every `_saved_*` attribute is read, which
calls the unpack hook with the record's index, so each record gets "<GradFn>._saved_<name>".

memory_allocated() after the forward (loss kept, the model output dropped, as the HF Trainer
does) minus before is recorded too, so the saved-tensor totals can be set against the
allocator's view. Under full recompute (non-reentrant checkpointing) the tensors saved inside
a checkpointed layer go to the checkpoint's own hooks, not ours: what we see is what the
forward really keeps (layer inputs via _NoopSaveInputs, embedding, final norm, head, loss).

Example:
    python3 tools/torch_saved_tensors.py --output saved.json            # the built-in cases
    python3 tools/torch_saved_tensors.py --config configs/hf/llama-3.2-1b.json --layers 2 \\
        --batch 1 --seq 256 --precision bf16 --attention flash --recompute none --output s.json
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gt_common as common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def default_cases():
    cases = []
    for cfg in ("configs/hf/llama-3.2-1b.json", "configs/hf/qwen2.5-1.5b.json"):
        for precision in ("amp-bf16", "bf16"):
            for attention in ("flash", "math"):
                for recompute in ("none", "full"):
                    cases.append({"config": cfg, "layers": 2, "batch": 1, "seq": 256,
                                  "precision": precision, "attention": attention,
                                  "recompute": recompute})
    # one larger shape to show what scales with batch*seq
    for precision in ("amp-bf16", "bf16"):
        cases.append({"config": "configs/hf/llama-3.2-1b.json", "layers": 2, "batch": 2,
                      "seq": 512, "precision": precision, "attention": "flash",
                      "recompute": "none"})
    return cases


class _State:
    def __init__(self):
        self.records = []
        self.tensors = {}
        self.module_stack = []
        self.op = None
        self.lookup = None
        self.seen_storages = {}
        self.param_ptrs = set()


def _fn_name(func):
    n = getattr(func, "__name__", None) or str(func)
    q = getattr(func, "__qualname__", None)
    if q and "." in q:
        n = q
    return n


def make_op_mode(state):
    import torch
    from torch.overrides import TorchFunctionMode

    class OpMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            prev = state.op
            state.op = _fn_name(func)
            try:
                return func(*args, **(kwargs or {}))
            finally:
                state.op = prev

    return OpMode()


def install_module_hooks(model, state):
    handles = []
    for name, mod in model.named_modules():
        def pre(m, inp, _n=name):
            state.module_stack.append(_n)

        def post(m, inp, out, _n=name):
            if state.module_stack and state.module_stack[-1] == _n:
                state.module_stack.pop()
            elif _n in state.module_stack:
                while state.module_stack and state.module_stack.pop() != _n:
                    pass
        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    return handles


def make_hooks(state):
    import torch

    def pack(t):
        idx = len(state.records)
        try:
            st = t.untyped_storage()
            sptr = st.data_ptr()
            snbytes = st.nbytes()
        except Exception:
            sptr, snbytes = None, None
        first = sptr is not None and sptr not in state.seen_storages
        if first:
            state.seen_storages[sptr] = idx
        rec = {
            "i": idx,
            "shape": list(t.shape),
            "dtype": str(t.dtype).replace("torch.", ""),
            "bytes": t.numel() * t.element_size(),
            "storage_bytes": snbytes,
            "storage_id": state.seen_storages.get(sptr),
            "first_seen": first,
            "is_param": sptr in state.param_ptrs,
            "device": t.device.type,
            "requires_grad": bool(t.requires_grad),
            "is_view": t._base is not None if hasattr(t, "_base") else None,
            "contiguous": bool(t.is_contiguous()),
            "module": state.module_stack[-1] if state.module_stack else "",
            "op": state.op,
            "grad_fns": [],
        }
        try:
            node = torch._C._current_autograd_node()
            if node is not None:
                rec["current_node"] = node.name()
        except Exception:
            pass
        state.records.append(rec)
        state.tensors[idx] = t
        return idx

    def unpack(idx):
        if state.lookup is not None and isinstance(idx, int) and idx < len(state.records):
            state.records[idx]["grad_fns"].append(state.lookup)
        return state.tensors[idx]

    return pack, unpack


def walk_graph(root, state, read_saved=True):
    """Reads every _saved_* attribute of every node reachable from root.

    Not under checkpointing: reading a saved tensor of a checkpointed node would trigger
    its recomputation, so then only the nodes are counted."""
    import torch

    seen = set()
    stack = [root]
    nodes = []
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        nodes.append(n)
        for nxt, _ in getattr(n, "next_functions", ()):
            if nxt is not None:
                stack.append(nxt)
    counts = {}
    for n in nodes:
        name = n.name()
        counts[name] = counts.get(name, 0) + 1
        if not read_saved:
            continue
        for attr in dir(n):
            if not attr.startswith("_saved_"):
                continue
            state.lookup = "%s.%s" % (name, attr)
            try:
                getattr(n, attr)
            except Exception:
                pass
            finally:
                state.lookup = None
    return {"nodes": len(nodes), "node_counts": dict(sorted(counts.items()))}


def run_case(case):
    import torch

    cfgd = common.load_config_dict(common.resolve_path(case["config"], os.getcwd(), REPO),
                                   {"num_hidden_layers": case["layers"], **(case.get("overrides") or {})})
    cfg = common.make_config(cfgd)
    dtype = torch.bfloat16 if case["precision"] == "bf16" else torch.float32
    attn = common.ATTENTION_IMPL[case["attention"]]
    torch.manual_seed(0)
    model = common.build_causal_lm(cfg, dtype, attn)
    model.train()
    if case["recompute"] == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    res = {"case": dict(case), "model": common.param_stats(model),
           "config_name": os.path.basename(case["config"])}
    state = _State()
    for p in model.parameters():
        state.param_ptrs.add(p.untyped_storage().data_ptr())
    g = torch.Generator(device="cuda")
    g.manual_seed(7)
    x = torch.randint(0, int(cfgd["vocab_size"]), (case["batch"], case["seq"]), device="cuda",
                      generator=g)
    handles = install_module_hooks(model, state)
    pack, unpack = make_hooks(state)
    use_mode = case.get("op_mode", True)
    common.clean_cuda()
    before = torch.cuda.memory_allocated()
    amp = case["precision"] == "amp-bf16"
    try:
        import contextlib

        mode_ctx = make_op_mode(state) if use_mode else contextlib.nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            with mode_ctx:
                if amp:
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = model(input_ids=x, labels=x).loss
                else:
                    loss = model(input_ids=x, labels=x).loss
        torch.cuda.synchronize()
        res["forward_peak_minus_before"] = torch.cuda.max_memory_allocated() - before
        res["after_forward_minus_before"] = torch.cuda.memory_allocated() - before
        res["op_mode"] = use_mode
        res["graph"] = walk_graph(loss.grad_fn, state, read_saved=case["recompute"] != "full")
        # the tensors dict keeps every packed tensor alive; that is the graph's own set
        res["after_walk_minus_before"] = torch.cuda.memory_allocated() - before
        res["loss"] = float(loss.item())
        # no backward: the hooks' dict would keep every saved tensor to the end of it
        del loss
        res["status"] = "ok"
    except Exception as e:
        res["status"] = "error"
        res["error"] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-3000:])
    finally:
        for h in handles:
            h.remove()
    recs = state.records
    res["records"] = recs
    res["totals"] = {
        "count": len(recs),
        "raw_bytes": sum(r["bytes"] for r in recs),
        "unique_storage_bytes": sum(r["storage_bytes"] or 0 for r in recs if r["first_seen"]),
        "unique_storage_bytes_non_param": sum(r["storage_bytes"] or 0 for r in recs
                                              if r["first_seen"] and not r["is_param"]),
        "raw_bytes_non_param": sum(r["bytes"] for r in recs if not r["is_param"]),
    }
    by = {}
    for r in recs:
        if r["is_param"] or not r["first_seen"]:
            continue
        k = r["dtype"]
        by[k] = by.get(k, 0) + (r["storage_bytes"] or 0)
    res["totals"]["unique_non_param_by_dtype"] = by
    del state.tensors
    state.tensors = {}
    del model, x
    common.clean_cuda()
    return res


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Inventory of the tensors saved for backward by a "
                                            "Hugging Face causal LM forward (see module docstring).",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--config", help="config.json; without it the built-in case list runs")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--precision", choices=("fp32", "amp-bf16", "bf16"), default="amp-bf16")
    p.add_argument("--attention", choices=("flash", "math"), default="flash")
    p.add_argument("--recompute", choices=("none", "full"), default="none")
    p.add_argument("--quick", action="store_true", help="only the first two built-in cases")
    p.add_argument("--output", required=True)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.config:
        cases = [{"config": args.config, "layers": args.layers, "batch": args.batch,
                  "seq": args.seq, "precision": args.precision, "attention": args.attention,
                  "recompute": args.recompute}]
    else:
        cases = default_cases()
        if args.quick:
            cases = cases[:2]
    doc = {"tool": "tools/torch_saved_tensors.py", "argv": sys.argv, "env": common.env_info(),
           "units": "bytes", "cases": []}
    t0 = time.perf_counter()
    for c in cases:
        t = time.perf_counter()
        try:
            r = run_case(c)
        except Exception as e:
            r = {"case": c, "status": "error",
                 "error": "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-3000:])}
            common.clean_cuda()
        if r["status"] == "error" and c.get("op_mode", True):
            # retry without the TorchFunctionMode (op names are then missing)
            c2 = dict(c, op_mode=False)
            try:
                r2 = run_case(c2)
                r2["first_attempt_error"] = r.get("error")
                r = r2
            except Exception:
                common.clean_cuda()
        r["wall_s"] = time.perf_counter() - t
        doc["cases"].append(r)
        doc["elapsed_s"] = time.perf_counter() - t0
        common.write_json(args.output, doc)
        tt = r.get("totals", {})
        print("saved %-22s %-8s %-5s %-4s b%ds%d %s: n=%s raw=%s uniq_nonparam=%s alloc_delta=%s MiB" % (
            os.path.basename(c["config"]), c["precision"], c["attention"], c["recompute"],
            c["batch"], c["seq"], r["status"], tt.get("count"), common.mib(tt.get("raw_bytes")),
            common.mib(tt.get("unique_storage_bytes_non_param")),
            common.mib(r.get("after_forward_minus_before"))), flush=True)
        if r["status"] != "ok":
            print("    " + r.get("error", "")[:600], flush=True)
    doc["finished"] = True
    common.write_json(args.output, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
