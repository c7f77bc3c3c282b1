#!/usr/bin/env python3
"""Measure one rank of a distributed PyTorch training step on one GPU, through the fake process group.

PyTorch's "fake" backend (torch.testing._internal.distributed.fake_pg) lets a single process play
rank r of a world of W: every buffer the rank allocates is real, the collectives return at once
without moving data. So the rank's memory, phase by phase, is what a real rank allocates, less
NCCL's own memory and the longer buffer lifetimes of communication overlapping compute (measured
with --torchrun on machines with several GPUs: tools/device/dist_torchrun.sh).

The step and its phases are tools/torch_profile_step.py's (run_step): floor, forward_peak,
backward_peak, optimizer_peak, the reserved memory after each phase, step 0 and the steady state.

Strategies (a case's "strategy"), with the mapping membudget's flags make onto them:
    ddp     DistributedDataParallel(model) with its defaults (bucket_cap_mb 25,
            gradient_as_bucket_view from the case's "bucket_view"); --dp W [--ddp-bucket-view].
            DDP's reducer cannot run the fake allreduce (its future carries no tensor): a
            communication hook returns a completed future holding bucket.buffer(), so every DDP
            buffer stays real and only the in-place allreduce is skipped.
    zero1   DDP plus torch.distributed.optim.ZeroRedundancyOptimizer (optimizer state sharded
            over the W ranks); --dp W --zero 1. Ranks own different parameters: measure each.
    fsdp    FSDP2: fully_shard on every decoder layer, then the root, over W ranks
            (reshard_after_forward from "reshard"); --fsdp W [--reshard-after-forward false].
            --zero 3 is fsdp with reshard, --zero 2 without. "offload": true adds
            CPUOffloadPolicy(pin_memory=True) (--fsdp-offload): the model is materialised on the
            host, the rotary tables moved to the GPU; `host` in each step is the host memory kept. Precision amp-bf16 is fp32 sharded
            parameters with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) and no
            autocast (torchtitan's recipe); bf16 is bf16 parameters, no policy.
    hsdp    FSDP2 over a 2-D mesh (replicate R × shard W/R); --dp R --fsdp W/R.
    fsdp_tp torchtitan's 2-D layout: the "tp" plan over "tp" ranks within, FSDP2 over W / tp
            across (a ("dp", "tp") mesh; the model sharded on the meta device); --fsdp W/tp --tp tp.
            With "replicate" R > 1 the mesh is ("replicate", "shard", "tp") of R × W/(R·tp) × tp
            and FSDP2 runs over the ("replicate", "shard") sub-mesh: HSDP with TP,
            --dp R --fsdp W/(R·tp) --tp tp.
    cp      context parallel over W ranks: each step runs inside
            torch.distributed.tensor.experimental.context_parallel (the batch sharded along the
            sequence, load-balanced; SDPA as ring attention, "cp_rotate": allgather | alltoall);
            "fsdp_over_cp": true adds FSDP2 over the same ranks (torchtitan's dp_shard_cp mesh).
            Measured to model it next; membudget has no --cp yet.
    tp      DTensor tensor parallel over W ranks (q/k/v/gate/up ColwiseParallel, o/down
            RowwiseParallel, the rest replicated); --tp W. "sp": true adds sequence parallel;
            "loss_parallel": true keeps lm_head's output sharded on the vocabulary
            (ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)) and runs the step
            under torch.distributed.tensor.parallel.loss_parallel() (--loss-parallel).
    ep      transformers 5.17's expert parallelism over W ranks (DistributedConfig(tp_size=W,
            enable_expert_parallel=True): the packed experts sharded on dim 0, the router's
            outputs masked to the rank's experts, the experts' output all-reduced; attention and
            the rest replicated, the same tokens on every rank); --ep W. The experts (DTensors)
            and the plain parameters get one AdamW each, as under tp ("one_optimizer": true
            gives all of them to one).
    ep_fsdp the same expert parallelism over "ep" E ranks within, FSDP2 across over W/E (an
            (fsdp, ep) mesh, fully_shard on every decoder layer and the root); --fsdp W/E --ep E.

Matrix file: {"defaults": {...}, "cases": [{"name", "config", "overrides", "batch", "seq",
"precision", "recompute", "strategy", "world", "rank", "replicate", "reshard", "bucket_view",
"sp", "loss_parallel", "offload", "optimizer_impl", "experts_implementation", "one_optimizer", "ep", "snapshot": {"step": N, "phase": "step"|"run"|"build"}}]}. Results are rewritten after every case.
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
import torch_profile_step as step  # noqa: E402

DEFAULTS = {"precision": "amp-bf16", "recompute": "none", "attention": "flash", "steps": 4, "warmup": 2,
            "overrides": None, "strategy": "fsdp", "world": 8, "rank": 0, "replicate": 1, "reshard": True,
            "bucket_view": False, "sp": False, "loss_parallel": False, "offload": False, "optimizer_impl": None, "batch": 1, "seq": 2048}


# Under torchrun (--torchrun) the ranks are real processes on real GPUs and NCCL moves the data;
# the process group is made once, from torchrun's environment, and kept for every case.
TORCHRUN = [False]
# The context-parallel mesh of a "cp" case (run_step shards the batch along the sequence under
# torch.distributed.tensor.experimental.context_parallel, as torchtitan's train step does).
CP_MESH = [None]


def init_pg(rank, world):
    import torch.distributed as dist

    if TORCHRUN[0]:
        if not dist.is_initialized():
            dist.init_process_group("nccl")
        if dist.get_world_size() != world:
            raise RuntimeError("case needs %d ranks, torchrun started %d" % (world, dist.get_world_size()))
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())


def materialise(model, device="cuda", retie=True):
    """Real storage on `device` (the GPU; the host under FSDP2's CPU offload) for a model built on
    the meta device, with random values.

    to_empty gives lm_head and embed_tokens storages of their own: a tied model is tied again."""
    import torch

    model.to_empty(device=device)
    if retie and getattr(model.config, "tie_word_embeddings", False) and hasattr(model, "lm_head"):
        model.lm_head.weight = model.model.embed_tokens.weight
    with torch.no_grad():
        for p in model.parameters():
            (p.to_local() if hasattr(p, "to_local") else p).normal_(0.0, 0.02)
        for name, b in model.named_buffers():
            if b.is_floating_point():
                (b.to_local() if hasattr(b, "to_local") else b).uniform_(1e-4, 1e-2)  # rotary inv_freq


def completed_bucket_hook(state, bucket):
    """DDP's communication hook under the fake group, whose allreduce future carries no tensor: a
    completed future holding the bucket itself (every DDP buffer stays real, the allreduce is skipped)."""
    import torch

    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def apply_tp_layers(layers, mesh, sp=False):
    """The Llama plan on each decoder layer of `layers` over the 1-D `mesh` (q/k/v/gate/up
    ColwiseParallel, o/down RowwiseParallel), with torchtitan's sequence-parallel layouts when `sp`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    for layer in layers:
        plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(), "mlp.gate_proj": ColwiseParallel(),
                "mlp.up_proj": ColwiseParallel()}
        if sp:  # torchtitan's layouts: the residual stream stays a DTensor sharded on the sequence
            plan.update({
                "input_layernorm": SequenceParallel(),
                "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
                "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            })
        else:
            plan.update({"self_attn.o_proj": RowwiseParallel(), "mlp.down_proj": RowwiseParallel()})
        parallelize_module(layer, mesh, plan)


def apply_tp(model, mesh, case):
    """DTensor tensor parallelism over `mesh` (1-D): the Llama plan, with torchtitan's
    sequence-parallel layouts when case["sp"] and the vocabulary-parallel loss's lm_head when
    case["loss_parallel"]."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    sp = bool(case.get("sp"))
    apply_tp_layers(model.model.layers, mesh, sp)
    lp = bool(case.get("loss_parallel"))
    head = (ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1),
                            use_local_output=False) if lp
            else ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()) if sp else None)
    if sp:
        parallelize_module(model, mesh, {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                                  use_local_output=False),
            "model.norm": SequenceParallel(),
            "lm_head": head,
        })
    elif lp:
        parallelize_module(model, mesh, {"lm_head": head})


def build(case, cfgd):
    """The model wrapped for the case's strategy, the optimizers, and whether autocast runs."""
    import torch
    from transformers import AutoModelForCausalLM

    strategy = case["strategy"]
    W, rank = int(case["world"]), int(case["rank"])
    init_pg(rank, W)
    cfg = common.make_config(cfgd)
    attn = common.ATTENTION_IMPL[case["attention"]]
    bf16 = case["precision"] == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    impl = dict(step.IMPL_KWARGS[case.get("optimizer_impl")])
    torch.manual_seed(0)
    # Built on the meta device, then given real (random) storage: the fast way for every strategy,
    # and FSDP2's own recipe (shard on meta, then to_empty).
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=dtype)
    amp = case["precision"] == "amp-bf16"
    if strategy in ("fsdp", "hsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        R = int(case.get("replicate") or 1)
        if strategy == "hsdp":
            mesh = init_device_mesh("cuda", (R, W // R), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cuda", (W,), mesh_dim_names=("shard",))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if amp else MixedPrecisionPolicy())
        kw = {"mesh": mesh, "reshard_after_forward": bool(case["reshard"]), "mp_policy": mp}
        offload = bool(case.get("offload"))
        if offload:  # CPUOffloadPolicy: shards, gradients and optimizer state in pinned host memory
            from torch.distributed.fsdp import CPUOffloadPolicy

            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        for layer in model.model.layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        amp = False  # the policy casts; no autocast
        materialise(model, "cpu" if offload else "cuda")
        if offload:  # torchtitan's buffer_device: the rotary tables stay on the GPU
            model.model.rotary_emb.to("cuda")
    elif strategy == "tp":
        from torch.distributed.device_mesh import init_device_mesh

        materialise(model)
        apply_tp(model, init_device_mesh("cuda", (W,), mesh_dim_names=("tp",)), case)
    elif strategy == "fsdp_tp":  # torchtitan's 2-D layout: TP within, FSDP2 across (on the meta model)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        T = int(case["tp"])
        R = int(case.get("replicate") or 1)
        if R > 1:  # HSDP within the data-parallel ranks: replicate × shard, TP innermost
            mesh = init_device_mesh("cuda", (R, W // (R * T), T), mesh_dim_names=("replicate", "shard", "tp"))
            dp_mesh = mesh["replicate", "shard"]
        else:
            mesh = init_device_mesh("cuda", (W // T, T), mesh_dim_names=("dp", "tp"))
            dp_mesh = mesh["dp"]
        apply_tp(model, mesh["tp"], case)
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if amp else MixedPrecisionPolicy())
        kw = {"mesh": dp_mesh, "reshard_after_forward": bool(case["reshard"]), "mp_policy": mp}
        for layer in model.model.layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        amp = False
        # sequence parallelism untied a tied model's lm_head and embedding (each its own shard): keep them so
        materialise(model, retie=not case.get("sp"))
    elif strategy == "cp":  # context parallel: the sequence sharded per step (run_step)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        CP_MESH[0] = init_device_mesh("cuda", (W,), mesh_dim_names=("cp",))
        if case.get("fsdp_over_cp"):  # torchtitan's layout: FSDP2 over the dp_shard × cp ranks (here cp alone)
            mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if amp else MixedPrecisionPolicy())
            kw = {"mesh": CP_MESH[0], "reshard_after_forward": bool(case["reshard"]), "mp_policy": mp}
            for layer in model.model.layers:
                fully_shard(layer, **kw)
            fully_shard(model, **kw)
            amp = False
        materialise(model)  # (without FSDP2: replicated parameters, the gradients not synchronised)
    elif strategy == "ep":  # transformers' own expert parallelism, as from_pretrained applies it
        # DistributedConfig(tp_size=W, enable_expert_parallel=True): the model's base_model_ep_plan
        # over a 1-D mesh of W ranks (ep_router, grouped_gemm, moe_tp_experts); the attention,
        # the router and everything else stay replicated, every rank runs the same tokens.
        # from_pretrained calls maybe_distribute_model after init and before loading the weights:
        # the same call here on the meta model, then random storage.
        from torch.distributed.device_mesh import init_device_mesh
        from transformers.distributed.configuration_utils import DistributedConfig

        dc = DistributedConfig(tp_size=W, enable_expert_parallel=True)
        model = type(model).maybe_distribute_model(model, dc, init_device_mesh("cuda", (W,)))
        materialise(model)
    elif strategy == "ep_fsdp":  # transformers' expert parallelism within, FSDP2 across (the fsdp_tp analogue)
        # An (fsdp, ep) mesh of W/E × E ranks: DistributedConfig(tp_size=E, enable_expert_parallel=True)
        # on the ep dimension (as "ep" above: each rank holds E-th of the experts, DTensors), then
        # FSDP2 over the fsdp dimension on every decoder layer and the root: the rank's share of the
        # experts and every other parameter sharded W/E ways. The ranks of one ep group run the same
        # tokens (transformers' expert parallelism all-reduces the experts' output); each fsdp index
        # its own. All on the meta model, then random storage.
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers.distributed.configuration_utils import DistributedConfig

        E = int(case["ep"])
        mesh = init_device_mesh("cuda", (W // E, E), mesh_dim_names=("fsdp", "ep"))
        dc = DistributedConfig(tp_size=E, enable_expert_parallel=True)
        model = type(model).maybe_distribute_model(model, dc, mesh["ep"])
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if amp else MixedPrecisionPolicy())
        kw = {"mesh": mesh["fsdp"], "reshard_after_forward": bool(case["reshard"]), "mp_policy": mp}
        for layer in model.model.layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        amp = False
        materialise(model)
    elif strategy in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        materialise(model)
        model = DDP(model, device_ids=[torch.cuda.current_device()],
                    gradient_as_bucket_view=bool(case.get("bucket_view")))

        if not TORCHRUN[0]:  # NCCL's allreduce is real under torchrun
            model.register_comm_hook(None, completed_bucket_hook)
    else:
        raise ValueError("unknown strategy " + strategy)
    model.train()
    if case.get("experts_implementation"):
        step.set_experts_implementation(model, case["experts_implementation"])
    params = [p for p in model.parameters() if p.requires_grad]
    if strategy == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opts = [ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-5, **impl)]
    elif case.get("one_optimizer"):  # one AdamW over DTensor and plain parameters alike
        opts = [torch.optim.AdamW(params, lr=1e-5, **impl)]
    else:
        opts = [torch.optim.AdamW(g, lr=1e-5, **impl) for g in by_tensor_kind(params)]
    return model, opts, amp


def by_tensor_kind(params):
    """The parameters as optimizer groups: fused AdamW refuses DTensor and plain parameters in one
    call, so one group per kind present (one group under FSDP2, where every parameter is a DTensor,
    and without any parallelism; two under tensor parallelism, its norms and embedding plain)."""
    params = list(params)
    dt = [p for p in params if type(p).__name__ == "DTensor"]
    plain = [p for p in params if type(p).__name__ != "DTensor"]
    return [g for g in (dt, plain) if g]


class Opts:
    """Several optimizers stepped as one (run_step calls step() and zero_grad())."""

    def __init__(self, opts):
        self.opts = opts
        self.param_groups = [g for o in opts for g in o.param_groups]

    def step(self):
        for o in self.opts:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)


def state_bytes(opts):
    import torch

    total = 0
    for o in opts:
        inner = getattr(o, "optim", o)  # ZeroRedundancyOptimizer's local optimizer
        for st in inner.state.values():
            for v in st.values():
                if torch.is_tensor(v) and v.is_cuda:
                    loc = v.to_local() if hasattr(v, "to_local") else v
                    total += loc.numel() * loc.element_size()
    return total


def local_param_stats(model):
    out = {"local_parameter_bytes": 0, "local_parameters": 0, "tensors": 0}
    for p in model.parameters():
        loc = p.to_local() if hasattr(p, "to_local") else p
        out["local_parameter_bytes"] += loc.numel() * loc.element_size()
        out["local_parameters"] += loc.numel()
        out["tensors"] += 1
    return out


def host_bytes(model, opts):
    """Host memory the step keeps (FSDP2's CPU offload): the CPU parameter shards, their .grad and
    the optimizer state, by tensor; and the pinned host allocator's reading where torch has it."""
    import torch

    out = {"params": 0, "grads": 0, "state": 0}
    for p in model.parameters():
        loc = p.to_local() if hasattr(p, "to_local") else p
        if not loc.is_cuda:
            out["params"] += loc.numel() * loc.element_size()
        g = p.grad
        if g is not None:
            gl = g.to_local() if hasattr(g, "to_local") else g
            if not gl.is_cuda:
                out["grads"] += gl.numel() * gl.element_size()
    for o in opts:
        for st in getattr(o, "optim", o).state.values():
            for v in st.values():
                if torch.is_tensor(v):
                    loc = v.to_local() if hasattr(v, "to_local") else v
                    if not loc.is_cuda:
                        out["state"] += loc.numel() * loc.element_size()
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats:
        try:
            s = stats()
            out["pinned"] = {k: v for k, v in s.items() if "allocated" in k or "reserved" in k}
        except Exception as e:  # pragma: no cover
            out["pinned_error"] = str(e)
    return out


def run_case(case, snapshot_dir):
    import torch
    import torch.distributed as dist

    res = {"name": case["name"], "status": "running", "job": {k: v for k, v in case.items() if k != "snapshot"}}
    cfgd = common.load_config_dict(case["config"], case.get("overrides"))
    res["model"] = {"num_hidden_layers": cfgd.get("num_hidden_layers"), "vocab_size": cfgd.get("vocab_size")}
    steps, model, opts, x = [], None, None, None
    res["steps"] = steps
    t0 = time.perf_counter()
    try:
        common.clean_cuda()
        res["before_case"] = common.allocator_reading()
        snap = case.get("snapshot") or {}
        if snap.get("phase") == "build" and snapshot_dir:  # the model's construction recorded too
            torch.cuda.memory._record_memory_history(max_entries=1000000, stacks="python")
        model, opt_list, amp = build(case, cfgd)
        inner = getattr(model, "module", model)
        if case["recompute"] == "full":
            inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        res["model"].update(local_param_stats(model))
        res["after_build"] = common.allocator_reading()
        opts = Opts(opt_list)
        g = torch.Generator(device="cuda")
        g.manual_seed(1234)
        x = torch.randint(0, int(cfgd["vocab_size"]), (case["batch"], case["seq"]), device="cuda", generator=g)
        step.SNAPSHOT["step"] = snap.get("step")
        step.SNAPSHOT["path"] = (os.path.join(snapshot_dir, case["name"].replace("/", "_") + ".pickle")
                                 if snap and snapshot_dir else None)
        for i in range(int(case["steps"])):
            rec = {"step": i}
            steps.append(rec)
            step.SNAPSHOT["phase"] = None  # the whole step is recorded here, not one phase
            run_step(model, opts, x, amp, rec, snap, bool(case.get("loss_parallel")),
                     case.get("cp_rotate") if case["strategy"] == "cp" else None, int(case.get("grad_accum") or 1),
                     case.get("fsdp_grad_sync") or "every")
            if i == 0:
                res["optimizer_state_bytes"] = state_bytes(opt_list)
            if case.get("offload"):  # after zero_grad: the gradients' host blocks show in the pinned allocator only
                rec["host"] = host_bytes(model, opt_list)
        res["status"] = "ok"
    except torch.cuda.OutOfMemoryError as e:
        res["status"] = "oom"
        res["error"] = str(e)[:2000]
    except Exception as e:
        res["status"] = "error"
        res["error"] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-4000:])
    finally:
        res["wall_s"] = time.perf_counter() - t0
        del model, opts, x
        gc.collect()
        torch.cuda.synchronize()
        if dist.is_initialized() and not TORCHRUN[0]:
            dist.destroy_process_group()
        common.clean_cuda()
    done = [s for s in steps if s.get("phase") == "done"]
    if done and done[0]["step"] == 0:
        res["step0"] = step.derived(done[0])
    steady = [s for s in done if s["step"] >= max(2, int(case.get("warmup") or 0))]
    if steady:
        res["steady"] = step.derived(steady[-1])
        res["steady_step"] = steady[-1]["step"]
    return res


def run_step(model, opts, x, amp, rec, snap, loss_parallel=False, cp_rotate=None, grad_accum=1, fsdp_grad_sync="every"):
    """tools/torch_profile_step.py's step, with a snapshot of the whole step when asked. Under
    context parallelism (cp_rotate: "allgather" or "alltoall") the step runs inside
    context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]): x (input_ids and labels) is this
    rank's load-balanced share of the sequence, and SDPA is ring attention."""
    import contextlib

    import torch
    if loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel as lp_context
    ctx = lp_context() if loss_parallel else contextlib.nullcontext()
    if cp_rotate:
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        set_rotate_method(cp_rotate)
        ctx = context_parallel(CP_MESH[0], buffers=[x], buffer_seq_dims=[1])

    # "phase": "step" records step N alone; "run" records every step from the first to the end of
    # step N (the reserved replay's step 0 and its steady steps, issue 15); "build" the same from
    # the model's construction on (run_case starts it)
    phase = snap.get("phase") if snap and step.SNAPSHOT["path"] else None
    start = (phase == "step" and rec["step"] == snap.get("step")) or (phase == "run" and rec["step"] == 0)
    stop = phase in ("step", "run", "build") and rec["step"] == snap.get("step")
    if start:
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=1000000, stacks="python")
    with ctx:
        step.run_step(model, opts, x, amp, rec, None, grad_accum, fsdp_grad_sync)
    if stop:
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(step.SNAPSHOT["path"])
        torch.cuda.memory._record_memory_history(enabled=None)
        rec["snapshot"] = step.SNAPSHOT["path"]


def finite(o):
    """NaN and infinities as null: strict JSON readers (the C++ tests) refuse them. The random
    weights can give a NaN loss; memory does not depend on the values."""
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [finite(v) for v in o]
    if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
        return None
    return o


def cases_from_matrix(path, base_defaults=None):
    """The matrix's cases over its defaults over `base_defaults` (this tool's DEFAULTS unless given),
    each config path resolved."""
    with open(path) as f:
        m = json.load(f)
    defaults = dict(DEFAULTS if base_defaults is None else base_defaults)
    defaults.update(m.get("defaults", {}))
    base = os.path.dirname(os.path.abspath(path))
    out = []
    for c in m["cases"]:
        case = dict(defaults)
        case.update(c)
        case["config"] = common.resolve_path(case["config"], os.getcwd(), base, os.path.dirname(base),
                                             os.path.dirname(os.path.dirname(base)))
        out.append(case)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrix", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--snapshot-dir", default=None)
    p.add_argument("--only", default=None, help="run only cases whose name contains this")
    p.add_argument("--torchrun", action="store_true",
                   help="run under torchrun on real GPUs with NCCL: the cases whose world is WORLD_SIZE, "
                        "every rank measured (rank r writes OUTPUT with .rank<r> before .json)")
    args = p.parse_args(argv)
    import torch

    if args.torchrun:
        TORCHRUN[0] = True
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        world, me = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        args.output = args.output.replace(".json", ".rank%d.json" % me)
    else:
        torch.cuda.set_device(0)
    if args.snapshot_dir:
        os.makedirs(args.snapshot_dir, exist_ok=True)
    doc = {"tool": "tools/torch_profile_dist.py", "argv": sys.argv, "env": common.env_info(), "units": "bytes",
           "cases": []}
    t_start = time.perf_counter()
    for case in cases_from_matrix(args.matrix):
        if args.only and args.only not in case["name"]:
            continue
        if args.torchrun:  # each case once per world size; this process is one of its ranks
            if int(case["world"]) != world or int(case.get("rank", 0)) != 0:
                continue
            case = dict(case, rank=me)
        if args.max_seconds is not None and time.perf_counter() - t_start > args.max_seconds:
            doc["cases"].append({"name": case["name"], "status": "skipped", "job": case})
            continue
        res = run_case(case, args.snapshot_dir)
        doc["cases"].append(res)
        doc["elapsed_s"] = time.perf_counter() - t_start
        common.write_json(args.output, finite(doc))
        s = res.get("steady") or {}
        print("%-58s %-5s floor=%s fwd=%s bwd=%s opt=%s res=%s MiB (%.1fs)" % (
            res["name"][:58], res["status"], common.mib(s.get("floor")), common.mib(s.get("forward_peak")),
            common.mib(s.get("backward_peak")), common.mib(s.get("optimizer_peak")), common.mib(s.get("reserved")),
            res["wall_s"]), flush=True)
        if res.get("error"):
            print("    " + res["error"].splitlines()[0][:300], flush=True)
    doc["finished"] = True
    common.write_json(args.output, finite(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
