#!/usr/bin/env python3
"""Measure one pipeline stage of a torch.distributed.pipelining training step on one GPU.

Rank r of an S-stage pipeline runs its stage through PyTorch's fake process group
(torch.testing._internal.distributed.fake_pg): the stage's parameters, its activations for every
microbatch the schedule keeps in flight, the stage's receive buffers and the loss on the last
stage are real; nothing is sent. Point-to-point transfers do nothing under the fake group anyway;
`dist.batch_isend_irecv` is replaced by a no-op so that no backend call is needed (the receive
buffers are allocated by the stage itself, before any transfer).

The stage module is what torchtitan's pipeline splitter leaves of the model: the embedding on
the first stage, decoder layers [first, last) on each stage, the final norm and lm_head on the
last; the layers run with position embeddings from the model's rotary module and no attention
mask (SDPA's causal path) and no KV cache, as torchtitan's models do. The loss is torchtitan's
pipeline loss, cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1)), given to the
schedule. One step:

    schedule.step(x)                       # first stage (x: M·b sequences)
    schedule.step(target=y, losses=[...])  # last stage
    schedule.step()                        # a middle stage
    optimizer.step(); optimizer.zero_grad(set_to_none=True)

Phases of a stage (a schedule interleaves forward and backward, so a step has no single forward
phase): `floor` at the step's start; `forward_peak` the highest allocated memory during any
microbatch's forward on this stage (with the loss on the last stage, and the transfers that
follow); `backward_peak` the same over the backward actions; `optimizer_peak` as in
tools/torch_profile_step.py. `actions` lists every action of the steady step in order:
[kind, microbatch, peak during it, allocated after it].

Matrix file: {"defaults": {...}, "cases": [{"name", "config", "overrides", "batch", "seq",
"precision", "recompute", "stages", "stage", "microbatches", "schedule" (gpipe | 1f1b |
interleaved), "virtual_stages" (interleaved: V stage modules per rank), "layers" (per-stage layer
counts over all stages; default an even split, the first stages taking the remainder), "fsdp"
(D > 1: FSDP2 within each stage over D ranks, fully_shard on each decoder layer then the stage
module, "reshard" its reshard_after_forward; "amp-bf16" then means fp32 shards with
MixedPrecisionPolicy(bf16, fp32), as tools/torch_profile_dist.py), "tp" (T > 1: the decoder
layers' DTensor plan over T ranks, applied to the meta stage module before FSDP2 as torchtitan
does; the embedding, norms and lm_head replicated; no sequence parallelism), "ddp" (R > 1:
DistributedDataParallel around each stage module over R replicas, "bucket_view" its
gradient_as_bucket_view; the fake allreduce skipped by a communication hook),
"snapshot": {"step": N, "phase": "run" to record every step up to N}}]}. The mesh is ("pp", "dp", "tp"), TP innermost: stage s is played by
rank s·D·R·T.

Interleaved 1F1B (ScheduleInterleaved1F1B): rank r holds the V stage modules r, r + N, …,
r + (V−1)·N of an N·V-stage pipeline (the layers split over all N·V stages), each its own
PipelineStage, with one AdamW per stage module as torchtitan's OptimizersContainer keeps one per
model part. `pipeline_order` records the schedule's own action list for the rank, and each action
in `actions` names its stage: [kind, microbatch, peak, allocated after, stage].
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
import torch_profile_dist as dist_tool  # noqa: E402

DEFAULTS = {"precision": "bf16", "recompute": "none", "attention": "flash", "steps": 4, "warmup": 2,
            "overrides": None, "stages": 2, "stage": 0, "microbatches": 4, "schedule": "1f1b", "layers": None,
            "virtual_stages": 1,
            "batch": 1, "seq": 2048}


def split_layers(total, stages, given):
    if given:
        if len(given) != stages or sum(given) != total:
            raise ValueError("layers %s do not split %d layers over %d stages" % (given, total, stages))
        return list(given)
    base, extra = divmod(total, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def stage_module_class():
    import torch

    class StageModule(torch.nn.Module):
        """What a pipeline stage holds of a Hugging Face causal LM (see the module docstring)."""

        def __init__(self, lm, first, last):
            super().__init__()
            inner = lm.model
            self.embed_tokens = inner.embed_tokens if first else None
            self.layers = inner.layers
            self.rotary_emb = inner.rotary_emb
            self.norm = inner.norm if last else None
            self.lm_head = lm.lm_head if last else None

        def forward(self, x):
            h = self.embed_tokens(x) if self.embed_tokens is not None else x
            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            pe = self.rotary_emb(h, pos)
            for layer in self.layers:
                out = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe)
                h = out[0] if isinstance(out, tuple) else out
            if self.norm is not None:
                h = self.lm_head(self.norm(h))
            return h

    return StageModule


def loss_fn(pred, labels):
    import torch

    return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def build(case, cfgd):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
    from transformers import AutoModelForCausalLM

    S, si, M = int(case["stages"]), int(case["stage"]), int(case["microbatches"])
    V = int(case.get("virtual_stages") or 1) if case["schedule"] == "interleaved" else 1
    layers = split_layers(int(cfgd["num_hidden_layers"]), S * V, case.get("layers"))
    D = int(case.get("fsdp") or 1)
    R = int(case.get("ddp") or 1)
    T = int(case.get("tp") or 1)
    if D > 1 and R > 1:
        raise ValueError("a stage is sharded by FSDP2 or replicated by DDP, not both")
    # the mesh is ("pp", "dp", "tp"), TP innermost (torchtitan's order); this process plays the
    # first rank of its stage's data-parallel and tensor-parallel groups
    dist_tool.init_pg(si * D * R * T, S * D * R * T)
    fsdp_kw, pp_group, tp_mesh, ddp_group = None, None, None, None
    if D > 1 or R > 1 or T > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cuda", (S, D * R, T), mesh_dim_names=("pp", "dp", "tp"))
        pp_group = mesh["pp"].get_group()
        tp_mesh = mesh["tp"] if T > 1 else None
        ddp_group = mesh["dp"].get_group() if R > 1 else None
    if D > 1:  # FSDP2 within each stage (torchtitan's PP × FSDP) over the "dp" ranks
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if case["precision"] == "amp-bf16" else MixedPrecisionPolicy())
        fsdp_kw = {"mesh": mesh["dp"], "reshard_after_forward": bool(case.get("reshard", True)), "mp_policy": mp}
    dist.batch_isend_irecv = lambda ops: []  # the fake group moves nothing; see the docstring
    dtype = common.torch_dtype("bf16" if case["precision"] == "bf16" else "fp32")
    # what passes between stages: FSDP2's mixed-precision policy computes (and returns) in bf16
    act_dtype = torch.bfloat16 if D > 1 and case["precision"] == "amp-bf16" else dtype
    b, s, h, V_ = int(case["batch"]), int(case["seq"]), int(cfgd["hidden_size"]), int(cfgd["vocab_size"])
    meta = torch.device("meta")
    torch.manual_seed(0)
    mods, stages = [], []
    for v in range(V):  # this rank's stage modules: stages si, si + S, …
        idx = si + v * S
        first, last = idx == 0, idx == S * V - 1
        d = dict(cfgd)
        d["num_hidden_layers"] = layers[idx]
        cfg = common.make_config(d)
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(cfg, attn_implementation=common.ATTENTION_IMPL[case["attention"]],
                                                  dtype=dtype)
        if case["recompute"] == "full":
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        mod = stage_module_class()(lm, first, last)
        del lm
        if tp_mesh is not None:  # the decoder layers' plan on the meta stage module (torchtitan's order)
            dist_tool.apply_tp_layers(mod.layers, tp_mesh)
        if fsdp_kw:  # fully_shard on each decoder layer, then the stage module (the root)
            for layer in mod.layers:
                fully_shard(layer, **fsdp_kw)
            fully_shard(mod, **fsdp_kw)
        mod.to_empty(device="cuda")
        with torch.no_grad():
            for p in mod.parameters():
                (p.to_local() if hasattr(p, "to_local") else p).normal_(0.0, 0.02)
            for _, buf in mod.named_buffers():
                if buf.is_floating_point():
                    (buf.to_local() if hasattr(buf, "to_local") else buf).uniform_(1e-4, 1e-2)  # rotary inv_freq
        mod.train()
        if ddp_group is not None:  # DDP around each stage module; the fake allreduce is skipped
            from torch.nn.parallel import DistributedDataParallel as DDP

            mod = DDP(mod, device_ids=[torch.cuda.current_device()], process_group=ddp_group,
                      gradient_as_bucket_view=bool(case.get("bucket_view")))
            mod.register_comm_hook(None, dist_tool.completed_bucket_hook)
        x_meta = torch.empty(b, s, dtype=torch.long, device=meta) if first else torch.empty(b, s, h, dtype=act_dtype, device=meta)
        y_meta = torch.empty(b, s, V_, dtype=act_dtype, device=meta) if last else torch.empty(b, s, h, dtype=act_dtype, device=meta)
        stages.append(PipelineStage(mod, idx, S * V, torch.device("cuda", torch.cuda.current_device()),
                                    input_args=(x_meta,), output_args=(y_meta,), group=pp_group))
        mods.append(mod)
    if case["schedule"] == "interleaved":
        sched = ScheduleInterleaved1F1B(stages, n_microbatches=M, loss_fn=loss_fn)
    else:
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[case["schedule"]]
        sched = cls(stages[0], n_microbatches=M, loss_fn=loss_fn)
    # one AdamW per stage module (torchtitan's OptimizersContainer); under TP alone two per module
    opt = dist_tool.Opts([torch.optim.AdamW(g, lr=1e-5) for m in mods for g in dist_tool.by_tensor_kind(m.parameters())])
    return torch.nn.ModuleList(mods), stages, sched, opt, layers


class ActionTracker:
    """Per-action peaks: each action's peak, and the gap after it counted with it."""

    def __init__(self):
        self.kind = None
        self.peaks = {"forward": 0, "backward": 0}
        self.actions = []

    def _read(self):
        import torch

        torch.cuda.synchronize()
        p = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        return p

    def enter(self, kind):
        p = self._read()
        k = self.kind or kind
        self.peaks[k] = max(self.peaks[k], p)
        self.kind = kind

    def leave(self, kind, mb, stage_index):
        import torch

        p = self._read()
        self.peaks[kind] = max(self.peaks[kind], p)
        self.actions.append([kind, int(mb), p, torch.cuda.memory_allocated(), int(stage_index)])

    def wrap(self, obj, name, kind):
        fn = getattr(obj, name)

        def wrapped(mb, *a, **k):
            self.enter(kind)
            out = fn(mb, *a, **k)
            self.leave(kind, mb, obj.stage_index)
            return out

        setattr(obj, name, wrapped)
        return fn


def run_step(mod, stages, sched, opt, x, rec, case, snap_path, record=None):
    """`snap_path`: dump the allocator's history there at the step's end; `record`: start recording
    it at the step's start (default: when dumping, the step alone)."""
    import torch

    cuda = torch.cuda
    S, si = int(case["stages"]), int(case["stage"])
    whole = snap_path is not None
    cuda.synchronize()
    if whole if record is None else record:
        cuda.memory._record_memory_history(max_entries=1000000, stacks="python")
    rec["floor"] = cuda.memory_allocated()
    rec["reserved_at_start"] = cuda.memory_reserved()
    cuda.reset_peak_memory_stats()
    tr = ActionTracker()
    originals = [(st, tr.wrap(st, "forward_one_chunk", "forward"), tr.wrap(st, "backward_one_chunk", "backward"))
                 for st in stages]
    t0 = time.perf_counter()
    rec["phase"] = "schedule"
    if si == 0:
        sched.step(x)
    elif si == S - 1:
        losses = []
        sched.step(target=x, losses=losses)
        rec["loss"] = float(torch.stack([l.detach().float() for l in losses]).mean().item()) if losses else None
        del losses
    else:
        sched.step()
    tr.enter("backward")  # the tail after the last action
    for st, fwd, bwd in originals:
        st.forward_one_chunk, st.backward_one_chunk = fwd, bwd
    cuda.synchronize()
    t1 = time.perf_counter()
    rec["forward_peak"] = tr.peaks["forward"]
    rec["backward_peak"] = tr.peaks["backward"]
    rec["after_backward"] = cuda.memory_allocated()
    rec["reserved_after_backward"] = cuda.memory_reserved()
    rec["actions"] = tr.actions
    cuda.reset_peak_memory_stats()
    rec["phase"] = "optimizer"
    opt.step()
    opt.zero_grad(set_to_none=True)
    cuda.synchronize()
    rec["optimizer_peak"] = cuda.max_memory_allocated()
    rec["after_optimizer"] = cuda.memory_allocated()
    rd = common.allocator_reading()
    for k in ("reserved", "outside", "num_alloc_retries", "num_ooms"):
        rec[k] = rd[k]
    rec["time_schedule_s"] = t1 - t0
    rec["time_optimizer_s"] = time.perf_counter() - t1
    if whole:
        cuda.memory._dump_snapshot(snap_path)
        cuda.memory._record_memory_history(enabled=None)
        rec["snapshot"] = snap_path
    rec["phase"] = "done"


PHASES = ("floor", "forward_peak", "backward_peak", "optimizer_peak", "after_backward", "after_optimizer", "reserved")


def run_case(case, snapshot_dir):
    import torch
    import torch.distributed as dist

    res = {"name": case["name"], "status": "running", "job": {k: v for k, v in case.items() if k != "snapshot"}}
    cfgd = common.load_config_dict(case["config"], case.get("overrides"))
    steps, mod, stages, sched, opt, x = [], None, None, None, None, None
    res["steps"] = steps
    t0 = time.perf_counter()
    try:
        common.clean_cuda()
        snap = case.get("snapshot") or {}
        if snap.get("phase") == "build" and snapshot_dir:  # the stage's construction recorded too
            torch.cuda.memory._record_memory_history(max_entries=1000000, stacks="python")
        mod, stages, sched, opt, layers = build(case, cfgd)
        order = getattr(sched, "pipeline_order", None)
        if order is not None:  # the schedule's own plan for this rank (None: an idle slot)
            res["pipeline_order"] = [str(a) if a is not None else None for a in order[int(case["stage"])]]
        res["model"] = {"num_hidden_layers": cfgd["num_hidden_layers"], "stage_layers": layers,
                        "vocab_size": cfgd["vocab_size"]}
        res["model"].update(dist_tool.local_param_stats(mod))
        g = torch.Generator(device="cuda")
        g.manual_seed(1234)
        M, b = int(case["microbatches"]), int(case["batch"])
        x = torch.randint(0, int(cfgd["vocab_size"]), (M * b, int(case["seq"])), device="cuda", generator=g)
        for i in range(int(case["steps"])):
            rec = {"step": i}
            steps.append(rec)
            path = None
            if snap and snapshot_dir and snap.get("step") == i:
                path = os.path.join(snapshot_dir, case["name"].replace("/", "_") + ".pickle")
            # "phase": "run" records every step from the first to the end of step N; "build" the
            # same from the construction on (started above)
            phase = snap.get("phase") if snap and snapshot_dir else None
            record = (i == 0) if phase == "run" else False if phase == "build" else None
            run_step(mod, stages, sched, opt, x, rec, case, path, record)
            if i == 0:
                res["optimizer_state_bytes"] = dist_tool.state_bytes(opt.opts)
        res["status"] = "ok"
    except torch.cuda.OutOfMemoryError as e:
        res["status"] = "oom"
        res["error"] = str(e)[:2000]
    except Exception as e:
        res["status"] = "error"
        res["error"] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-4000:])
    finally:
        res["wall_s"] = time.perf_counter() - t0
        del mod, stages, sched, opt, x
        gc.collect()
        torch.cuda.synchronize()
        if dist.is_initialized():
            dist.destroy_process_group()
        common.clean_cuda()
    done = [s for s in steps if s.get("phase") == "done"]
    if done and done[0]["step"] == 0:
        res["step0"] = {k: done[0].get(k) for k in PHASES}
    steady = [s for s in done if s["step"] >= max(2, int(case.get("warmup") or 0))]
    if steady:
        res["steady"] = {k: steady[-1].get(k) for k in PHASES}
        res["steady_step"] = steady[-1]["step"]
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrix", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--snapshot-dir", default=None)
    p.add_argument("--only", default=None)
    args = p.parse_args(argv)
    import torch

    torch.cuda.set_device(0)
    if args.snapshot_dir:
        os.makedirs(args.snapshot_dir, exist_ok=True)
    doc = {"tool": "tools/torch_profile_pp.py", "argv": sys.argv, "env": common.env_info(), "units": "bytes",
           "cases": []}
    t_start = time.perf_counter()
    for case in dist_tool.cases_from_matrix(args.matrix, DEFAULTS):
        if args.only and args.only not in case["name"]:
            continue
        if args.max_seconds is not None and time.perf_counter() - t_start > args.max_seconds:
            doc["cases"].append({"name": case["name"], "status": "skipped", "job": case})
            continue
        res = run_case(case, args.snapshot_dir)
        doc["cases"].append(res)
        doc["elapsed_s"] = time.perf_counter() - t_start
        common.write_json(args.output, dist_tool.finite(doc))
        s = res.get("steady") or {}
        print("%-52s %-5s floor=%s fwd=%s bwd=%s opt=%s res=%s MiB (%.1fs)" % (
            res["name"][:52], res["status"], common.mib(s.get("floor")), common.mib(s.get("forward_peak")),
            common.mib(s.get("backward_peak")), common.mib(s.get("optimizer_peak")), common.mib(s.get("reserved")),
            res["wall_s"]), flush=True)
        if res.get("error"):
            print("    " + res["error"][-1500:], flush=True)
    doc["finished"] = True
    common.write_json(args.output, dist_tool.finite(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
