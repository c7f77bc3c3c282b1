"""Measure the GPU memory of real PyTorch training steps of a Hugging Face causal LM.

The model is built from a config.json with random weights (nothing is downloaded). Each
step is written the way the Hugging Face Trainer runs it:

    loss = model(input_ids=x, labels=x).loss   # the output object is dropped at once
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

and the CUDA caching allocator is read around each phase (torch.cuda.synchronize() before
every reading):

    floor           memory_allocated() at the start of the step
    forward_peak    max_memory_allocated() during the forward (+loss); after_forward after it
    backward_peak   max_memory_allocated() during backward;            after_backward after it
    optimizer_peak  max_memory_allocated() during step()+zero_grad();  after_optimizer after it

plus memory_reserved(), `outside` = (total - free from mem_get_info) - memory_reserved(),
and the allocator's num_alloc_retries / num_ooms counters. Step 0 (optimizer state not yet
created) is reported as `step0`; the steady state is the last measured step (index >= 2).

Recipes (--precision):
    fp32      fp32 parameters, gradients and optimizer state
    amp-bf16  fp32 model; forward and loss under torch.autocast("cuda", dtype=torch.bfloat16),
              backward outside autocast; fp32 optimizer state
    bf16      model cast to bf16; torch.optim state follows the parameter dtype (bf16)

Examples:
    python3 tools/torch_profile_step.py --config configs/hf/llama-3.2-1b.json \\
        --batch 4 --seq 4096 --precision amp-bf16 --optimizer adamw --recompute none \\
        --attention flash --steps 4 --output out.json
    python3 tools/torch_profile_step.py --matrix tools/matrices/train_h200.json --output out.json

Matrix file: {"defaults": {...}, "cases": [{"name": ..., "config": ..., "batch": ...,
"seq": ..., "precision": ..., "optimizer": ..., "optimizer_impl": foreach|fused|for-loop,
"recompute": ..., "attention": ..., "grad_accum": micro-batches per step,
"overrides": {config.json keys}}, ...]}. All cases run in one process; consecutive cases
with the same config, overrides, parameter dtype and attention reuse one model, and each case
gets a fresh optimizer. Results are rewritten to --output after every case.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback

try:  # inside the package (python -m membudget measure) or as a plain module (tools/torch_profile_step.py)
    from . import torch_common as common
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_common as common  # noqa: E402

CASE_KEYS = ("config", "batch", "seq", "precision", "optimizer", "optimizer_impl", "recompute",
             "attention", "steps", "warmup", "overrides", "use_cache", "name", "lora",
             "experts_implementation", "grad_accum")
DEFAULTS = {"precision": "amp-bf16", "optimizer": "adamw", "optimizer_impl": None, "recompute": "none",
            "attention": "flash", "steps": 4, "warmup": 2, "overrides": None,
            "use_cache": None, "experts_implementation": None, "grad_accum": 1}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (head of this file) for the phase definitions.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="Hugging Face config.json of the model")
    p.add_argument("--batch", type=int, default=1, help="micro-batch size (default 1)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument("--precision", choices=common.PRECISIONS, default="amp-bf16")
    p.add_argument("--optimizer", choices=("adamw", "adamw-fused", "sgd", "sgd-momentum", "adafactor"),
                   default="adamw")
    p.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default=None,
                   help="torch.optim implementation: foreach (foreach=True), fused (fused=True), "
                        "for-loop (foreach=False); default: the constructor's own default")
    p.add_argument("--recompute", choices=("none", "full"), default="none",
                   help="full = HF gradient checkpointing of every decoder layer (non-reentrant)")
    p.add_argument("--attention", choices=("flash", "math"), default="flash",
                   help="flash = attn_implementation 'sdpa', math = 'eager'")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches per optimizer step (the Trainer's gradient_accumulation_steps; default 1)")
    p.add_argument("--steps", type=int, default=4, help="total steps measured (default 4)")
    p.add_argument("--warmup", type=int, default=2,
                   help="steps before the steady state (default 2); the steady state is the last step")
    p.add_argument("--use-cache", choices=("config", "false", "true"), default="config",
                   help="KV cache during the training forward: as the config says (the Trainer's "
                        "behaviour, default) or forced")
    p.add_argument("--override", action="append", default=[], metavar="KEY=JSON",
                   help="override a config.json key, e.g. num_hidden_layers=2 (repeatable)")
    p.add_argument("--matrix", help="JSON file with many cases, run in one process")
    p.add_argument("--only", default=None,
                   help="run only the matrix cases whose name contains this (one case per process: a process keeps "
                        "its cuBLAS workspaces and cached segments from earlier cases)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="matrix mode: skip the remaining cases after this many seconds")
    p.add_argument("--output", required=True, help="JSON file to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--snapshot-dir", default=None,
                   help="where cases with a \"snapshot\" entry write their allocator snapshot")
    args = p.parse_args(argv)
    if not args.matrix and not args.config:
        p.error("either --config or --matrix is required")
    return args


def _overrides_from_args(items):
    out = {}
    for it in items:
        k, _, v = it.partition("=")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def cases_from_args(args):
    uc = {"config": None, "false": False, "true": True}[args.use_cache]
    return [{
        "name": os.path.basename(args.config),
        "config": args.config, "batch": args.batch, "seq": args.seq,
        "precision": args.precision, "optimizer": args.optimizer,
        "optimizer_impl": args.optimizer_impl, "recompute": args.recompute,
        "attention": args.attention, "steps": args.steps, "warmup": args.warmup,
        "grad_accum": args.grad_accum, "overrides": _overrides_from_args(args.override) or None, "use_cache": uc,
    }]


def cases_from_matrix(path):
    with open(path) as f:
        m = json.load(f)
    defaults = dict(DEFAULTS)
    defaults.update(m.get("defaults", {}))
    cases = []
    base = os.path.dirname(os.path.abspath(path))
    for c in m["cases"]:
        case = dict(defaults)
        case.update(c)
        case["config"] = common.resolve_path(case["config"], os.getcwd(), base,
                                             os.path.dirname(base), os.path.dirname(os.path.dirname(base)))
        case.setdefault("name", "%s/%s/%s/b%ds%d" % (os.path.basename(case["config"]),
                                                      case["precision"], case["recompute"],
                                                      case["batch"], case["seq"]))
        cases.append(case)
    return cases


def model_key(case):
    dtype = "bf16" if case["precision"] == "bf16" else "fp32"
    return (os.path.abspath(case["config"]), json.dumps(case.get("overrides"), sort_keys=True),
            dtype, common.ATTENTION_IMPL[case["attention"]], case.get("lora") or 0,
            case.get("experts_implementation") or "")


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_model(case):
    import torch

    cfgd = common.load_config_dict(case["config"], case.get("overrides"))
    cfg = common.make_config(cfgd)
    dtype = torch.bfloat16 if case["precision"] == "bf16" else torch.float32
    torch.manual_seed(0)
    model = common.build_causal_lm(cfg, dtype, common.ATTENTION_IMPL[case["attention"]])
    if case.get("experts_implementation"):
        set_experts_implementation(model, case["experts_implementation"])
    if case.get("lora"):
        # peft LoRA on every decoder linear (what `membudget advise` assumes): rank r, alpha 2r,
        # no dropout; the base is frozen and peft keeps the adapters in fp32.
        from peft import LoraConfig, get_peft_model

        r = int(case["lora"])
        model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, bias="none",
                                                 target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
    model.train()
    return model, cfgd


def set_experts_implementation(model, impl):
    """transformers 5's MoE experts read config._experts_implementation at every forward
    (integrations/moe.py, use_experts_implementation): set it on every config a module holds."""
    setter = getattr(model, "set_experts_implementation", None)
    if setter is not None:
        try:
            setter(impl)
        except Exception:
            pass
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "_experts_implementation"):
            cfg._experts_implementation = impl


def experts_implementations(model):
    """The implementation each experts module will run (the config it reads)."""
    return sorted({str(getattr(m.config, "_experts_implementation", None)) for m in model.modules()
                   if type(m).__name__.endswith("Experts") and hasattr(m, "config")})


def set_recompute(model, recompute):
    if recompute == "full":
        try:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        except TypeError:
            model.gradient_checkpointing_enable()
    else:
        model.gradient_checkpointing_disable()
    return bool(getattr(model, "is_gradient_checkpointing", recompute == "full"))


# --optimizer-impl as torch.optim's constructor flags (membudget's --optimizer-impl).
OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")
IMPL_KWARGS = {None: {}, "foreach": {"foreach": True}, "fused": {"fused": True},
               "for-loop": {"foreach": False}}


def make_optimizer(model, name, impl=None):
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    kw = dict(IMPL_KWARGS[impl])
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-5, **kw)
    if name == "adamw-fused":  # what `membudget advise` calls the fused optimizer
        return torch.optim.AdamW(params, lr=1e-5, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-5, **kw)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-5, momentum=0.9, **kw)
    if name == "adafactor":  # no fused implementation; foreach=None runs the for-loop
        return torch.optim.Adafactor(params, **kw)
    raise ValueError(name)


def optimizer_state_bytes(opt):
    import torch

    total = 0
    dtypes = set()
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.is_cuda:
                total += v.numel() * v.element_size()
                dtypes.add(str(v.dtype))
    return total, sorted(dtypes)


PHASE_FIELDS = ("floor", "forward_peak", "after_forward", "backward_peak", "after_backward",
                "optimizer_peak", "after_optimizer")


# Allocator snapshot of one phase of one step (a case's "snapshot": {"phase": "forward" or
# "backward", "step": N}; written to --snapshot-dir as <case name>.pickle with "/" replaced by "_").
# "phase": "run" records every step from the first to the end of step N ("build": from the model's
# construction on; the case must build its own model) (the reserved memory's
# whole history: which request made each segment).
SNAPSHOT = {"phase": None, "step": None, "path": None}
SNAPSHOT_DIR = [None]


def _snapshot(rec, phase, begin):
    import torch

    if SNAPSHOT["phase"] != phase or rec["step"] != SNAPSHOT["step"] or not SNAPSHOT["path"]:
        return
    torch.cuda.synchronize()
    if begin:
        torch.cuda.memory._record_memory_history(max_entries=500000, stacks="python")
    else:
        torch.cuda.memory._dump_snapshot(SNAPSHOT["path"])
        torch.cuda.memory._record_memory_history(enabled=None)
        rec["snapshot"] = SNAPSHOT["path"]


def run_step(model, opt, x, amp, rec, use_cache, grad_accum=1, fsdp_grad_sync="every"):
    """One training step; fills `rec` phase by phase (so a failure leaves partial data).

    With grad_accum = k the step runs k micro-batches (forward, backward each, as the Trainer's
    gradient_accumulation_steps does; the loss is not divided, as the Trainer leaves it for models
    that take num_items_in_batch) before optimizer.step(): the gradients of the first stay
    allocated through the later forwards. forward_peak and backward_peak are the highest over the
    micro-batches (each one's in forward_peaks / backward_peaks); after_forward and after_backward
    are the last micro-batch's. A DistributedDataParallel model runs every micro-batch but the
    last inside model.no_sync(), forward and backward, as accelerate's accumulate() does. An FSDP2
    model reduce-scatters every micro-batch's gradients (fsdp_grad_sync "every", FSDP2's default and
    torchtitan's loop), or with "last" runs the ones before the last under
    set_requires_gradient_sync(False), keeping unsharded gradients, as accelerate 1.11+ (the
    Trainer's) does."""
    import contextlib

    import torch

    cuda = torch.cuda
    kwargs = {"input_ids": x, "labels": x}
    if use_cache is not None:
        kwargs["use_cache"] = use_cache

    cuda.synchronize()
    rec["floor"] = cuda.memory_allocated()
    rec["reserved_at_start"] = cuda.memory_reserved()
    cuda.reset_peak_memory_stats()
    rec["forward_peaks"], rec["backward_peaks"] = [], []
    t_forward = t_backward = 0.0
    for micro in range(grad_accum):
        no_sync = micro + 1 < grad_accum and hasattr(model, "no_sync")
        if grad_accum > 1 and fsdp_grad_sync == "last" and hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(micro + 1 == grad_accum)
        with model.no_sync() if no_sync else contextlib.nullcontext():
            rec["phase"] = "forward"
            _snapshot(rec, "forward", True)
            t0 = time.perf_counter()
            if amp:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(**kwargs).loss
            else:
                loss = model(**kwargs).loss
            cuda.synchronize()
            t1 = time.perf_counter()
            _snapshot(rec, "forward", False)
            rec["forward_peaks"].append(cuda.max_memory_allocated())
            rec["after_forward"] = cuda.memory_allocated()
            rec["reserved_after_forward"] = cuda.memory_reserved()
            cuda.reset_peak_memory_stats()

            rec["phase"] = "backward"
            _snapshot(rec, "backward", True)
            loss.backward()
            cuda.synchronize()
            t2 = time.perf_counter()
            _snapshot(rec, "backward", False)
            rec["backward_peaks"].append(cuda.max_memory_allocated())
            rec["after_backward"] = cuda.memory_allocated()
            rec["reserved_after_backward"] = cuda.memory_reserved()
            rec["loss"] = float(loss.detach().float().item())
            del loss
            cuda.synchronize()
            cuda.reset_peak_memory_stats()
        t_forward += t1 - t0
        t_backward += t2 - t1
    rec["forward_peak"] = max(rec["forward_peaks"])
    rec["backward_peak"] = max(rec["backward_peaks"])
    t2 = time.perf_counter()

    rec["phase"] = "optimizer"
    opt.step()
    opt.zero_grad(set_to_none=True)
    cuda.synchronize()
    t3 = time.perf_counter()
    rec["optimizer_peak"] = cuda.max_memory_allocated()
    rec["after_optimizer"] = cuda.memory_allocated()
    rd = common.allocator_reading()
    rec["reserved"] = rd["reserved"]
    rec["max_reserved_optimizer_phase"] = rd["max_reserved"]
    rec["outside"] = rd["outside"]
    rec["device_used"] = rd["device_used"]
    rec["num_alloc_retries"] = rd["num_alloc_retries"]
    rec["num_ooms"] = rd["num_ooms"]
    rec["time_forward_s"] = t_forward
    rec["time_backward_s"] = t_backward
    rec["time_optimizer_s"] = t3 - t2
    rec["phase"] = "done"


def derived(rec):
    out = {k: rec.get(k) for k in PHASE_FIELDS}
    for k in ("reserved", "outside", "num_alloc_retries", "num_ooms", "reserved_after_forward",
              "reserved_after_backward"):
        out[k] = rec.get(k)
    if rec.get("after_forward") is not None:
        out["after_forward_minus_floor"] = rec["after_forward"] - rec["floor"]
        out["forward_transient"] = rec["forward_peak"] - rec["after_forward"]
    if rec.get("backward_peak") is not None:
        out["backward_peak_minus_floor"] = rec["backward_peak"] - rec["floor"]
        out["after_backward_minus_floor"] = rec["after_backward"] - rec["floor"]
    if rec.get("optimizer_peak") is not None:
        out["optimizer_transient"] = rec["optimizer_peak"] - rec["after_optimizer"]
    out["step"] = rec.get("step")
    return out


def run_case(model, mstats, case, cfgd):
    import torch

    res = {"name": case["name"], "status": "running",
           "job": {k: case.get(k) for k in CASE_KEYS},
           "model": dict(mstats)}
    res["job"]["attn_implementation"] = common.ATTENTION_IMPL[case["attention"]]
    res["job"]["config_name"] = os.path.basename(case["config"])
    res["model"]["num_hidden_layers"] = cfgd.get("num_hidden_layers")
    res["model"]["vocab_size"] = cfgd.get("vocab_size")
    res["model"]["config_use_cache"] = getattr(model.config, "use_cache", None)
    try:
        res["model"]["attn_implementation_effective"] = model.config._attn_implementation
    except Exception:
        pass
    steps = []
    res["steps"] = steps
    opt = None
    x = None
    t_case = time.perf_counter()
    err_text = None
    try:
        snap = case.get("snapshot") or {}
        SNAPSHOT["phase"], SNAPSHOT["step"] = snap.get("phase"), snap.get("step")
        SNAPSHOT["path"] = (os.path.join(SNAPSHOT_DIR[0], case["name"].replace("/", "_") + ".pickle")
                            if snap and SNAPSHOT_DIR[0] else None)
        res["job"]["gradient_checkpointing"] = set_recompute(model, case["recompute"])
        model.zero_grad(set_to_none=True)
        common.clean_cuda()
        res["before_case"] = common.allocator_reading()
        opt = make_optimizer(model, case["optimizer"], case.get("optimizer_impl"))
        g = torch.Generator(device="cuda")
        g.manual_seed(1234)
        vocab = int(cfgd["vocab_size"])
        x = torch.randint(0, vocab, (case["batch"], case["seq"]), device="cuda", generator=g)
        amp = case["precision"] == "amp-bf16"
        whole_run = SNAPSHOT["phase"] in ("run", "build") and SNAPSHOT["path"]
        if whole_run and SNAPSHOT["phase"] == "run":
            torch.cuda.synchronize()
            torch.cuda.memory._record_memory_history(max_entries=2000000, stacks="python")
        for i in range(int(case["steps"])):
            rec = {"step": i}
            steps.append(rec)
            run_step(model, opt, x, amp, rec, case.get("use_cache"), int(case.get("grad_accum") or 1))
            if whole_run and i == SNAPSHOT["step"]:
                torch.cuda.synchronize()
                torch.cuda.memory._dump_snapshot(SNAPSHOT["path"])
                torch.cuda.memory._record_memory_history(enabled=None)
                rec["snapshot"] = SNAPSHOT["path"]
            if i == 0:
                res["optimizer_state_bytes"], res["optimizer_state_dtypes"] = optimizer_state_bytes(opt)
                # the implementation torch.optim ran (None: the function's own default)
                grp = opt.param_groups[0]
                res["optimizer_flags"] = {k: grp.get(k) for k in ("foreach", "fused")}
        res["status"] = "ok"
    except torch.cuda.OutOfMemoryError as e:
        res["status"] = "oom"
        err_text = str(e)
        res["oom_at"] = {"step": steps[-1]["step"] if steps else None,
                         "phase": steps[-1].get("phase") if steps else None,
                         "max_memory_allocated": torch.cuda.max_memory_allocated()}
    except Exception as e:  # record and continue with the next case
        res["status"] = "error"
        err_text = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-3000:])
    finally:
        res["wall_s"] = time.perf_counter() - t_case
        if err_text is not None:
            res["error"] = err_text
        del opt, x
        model.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.synchronize()
        res["after_case_before_empty_cache"] = common.allocator_reading()
        common.clean_cuda()
    done = [s for s in steps if s.get("phase") == "done"]
    if done and done[0]["step"] == 0:
        res["step0"] = derived(done[0])
    steady = [s for s in done if s["step"] >= max(2, int(case.get("warmup") or 0))]
    if steady:
        res["steady"] = derived(steady[-1])
        res["steady_step"] = steady[-1]["step"]
        res["steady_max"] = {k: max(s[k] for s in steady) for k in PHASE_FIELDS}
        tot = sum(steady[-1][k] for k in ("time_forward_s", "time_backward_s", "time_optimizer_s"))
        res["steady_step_time_s"] = tot
        res["tokens_per_s"] = case["batch"] * case["seq"] * int(case.get("grad_accum") or 1) / tot if tot > 0 else None
    return res


def summary_line(res):
    s = res.get("steady") or res.get("step0") or {}
    return "%-44s %-5s floor=%s fwd=%s aft_fwd=%s bwd=%s opt=%s MiB  (%.1fs)" % (
        res["name"][:44], res["status"], common.mib(s.get("floor")), common.mib(s.get("forward_peak")),
        common.mib(s.get("after_forward")), common.mib(s.get("backward_peak")),
        common.mib(s.get("optimizer_peak")), res.get("wall_s", 0.0))


def run_all(cases, output, max_seconds=None, seed=0):
    import torch

    torch.manual_seed(seed)
    t_start = time.perf_counter()
    doc = {"tool": "tools/torch_profile_step.py", "argv": sys.argv, "env": common.env_info(),
           "units": "bytes", "cases": []}
    common.write_json(output, doc)
    model = None
    key = None
    mstats = None
    cfgd = None
    for case in cases:
        if max_seconds is not None and time.perf_counter() - t_start > max_seconds:
            doc["cases"].append({"name": case["name"], "status": "skipped",
                                 "job": {k: case.get(k) for k in CASE_KEYS},
                                 "error": "time budget (--max-seconds) exhausted"})
            common.write_json(output, doc)
            print("%-44s skipped (time budget)" % case["name"][:44], flush=True)
            continue
        k = model_key(case)
        if k != key:
            if model is not None:
                del model
                model = None
                common.clean_cuda()
            key = None
            t0 = time.perf_counter()
            try:
                if (case.get("snapshot") or {}).get("phase") == "build" and SNAPSHOT_DIR[0]:
                    import torch  # the model's construction recorded too (run_case stops it)

                    torch.cuda.memory._record_memory_history(max_entries=2000000, stacks="python")
                model, cfgd = build_model(case)
                mstats = common.param_stats(model)
                mstats["experts_implementations"] = experts_implementations(model)
                mstats["build_s"] = time.perf_counter() - t0
                key = k
            except Exception as e:
                model = None
                doc["cases"].append({"name": case["name"], "status": "error",
                                     "job": {kk: case.get(kk) for kk in CASE_KEYS},
                                     "error": "model build failed: %s: %s\n%s" % (
                                         type(e).__name__, e, traceback.format_exc()[-3000:])})
                common.write_json(output, doc)
                print("%-44s error (build): %s" % (case["name"][:44], e), flush=True)
                common.clean_cuda()
                continue
        res = run_case(model, mstats, case, cfgd)
        doc["cases"].append(res)
        doc["elapsed_s"] = time.perf_counter() - t_start
        common.write_json(output, doc)
        print(summary_line(res), flush=True)
        if res["status"] != "ok" and res.get("error"):
            print("    " + res["error"].splitlines()[0][:400], flush=True)
    del model
    common.clean_cuda()
    doc["elapsed_s"] = time.perf_counter() - t_start
    doc["finished"] = True
    common.write_json(output, doc)
    return doc


def main(argv=None):
    args = parse_args(argv)
    SNAPSHOT_DIR[0] = args.snapshot_dir
    if args.snapshot_dir:
        os.makedirs(args.snapshot_dir, exist_ok=True)
    cases = cases_from_matrix(args.matrix) if args.matrix else cases_from_args(args)
    if args.only:
        cases = [c for c in cases if args.only in c["name"]]
    doc = run_all(cases, args.output, args.max_seconds, args.seed)
    bad = [c for c in doc["cases"] if c["status"] not in ("ok", "oom", "skipped")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
