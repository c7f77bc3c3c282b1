#!/usr/bin/env python3
"""Step time of membudget's CUDA harness against PyTorch's eager step of the same model.

Both sides run one training step of a Hugging Face Llama built from configs/hf/<model>.json (random
weights, no download) on the same batch × seq, in one process run on one GPU:
  * PyTorch: LlamaForCausalLM in bf16 (parameters, gradients and AdamW moments bf16, the harness's
    `bf16` recipe), attn_implementation="sdpa", torch.optim.AdamW (betas 0.9/0.95, eps 1e-8, no
    weight decay); step = forward with labels, backward, optimizer.step(), zero_grad(), loss.item().
    Timed with torch.cuda.Event over --steps steps after --warmup steps; a torch.profiler pass of
    one more step groups the GPU time by kernel family.
  * membudget: `membudget verify MODEL --device-backend cuda --precision bf16 --format json` with
    MEMBUDGET_CUDA_PROFILE=1; each step's wall time (synchronised at phase ends, the loss copied
    to the host, as loss.item() does) comes from the JSON, the GPU time per op family from stderr.
Prints one JSON object (and writes it with --out): both step times, the ratio ours / PyTorch's
(lower is better, target ≤ 1.5) and both breakdowns.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def torch_side(hf_json: str, batch: int, seq: int, warmup: int, steps: int) -> dict:
    import torch
    import torch_gt_common as common

    cfg = common.make_config(common.load_config_dict(hf_json))
    model = common.build_causal_lm(cfg, torch.bfloat16, "sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda", generator=g)

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.item()

    losses = [step() for _ in range(warmup)]
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        losses.append(step())
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000.0)
    breakdown = {}
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
        total = 0.0
        for ev in prof.key_averages():
            # kernels only (self time), so operator events never count their kernels twice
            if "cuda" not in str(getattr(ev, "device_type", "cuda")).lower():
                continue
            t = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
            if t <= 0 or ev.key.startswith("ProfilerStep"):
                continue
            fam = kernel_family(ev.key)
            breakdown[fam] = breakdown.get(fam, 0.0) + t / 1000.0
            total += t / 1000.0
        breakdown = {k: round(v, 3) for k, v in sorted(breakdown.items(), key=lambda kv: -kv[1])}
        breakdown["total_ms"] = round(total, 3)
    except Exception as e:  # the profiler is optional
        breakdown = {"error": repr(e)}
    peak = torch.cuda.max_memory_allocated()
    del model, opt, ids
    common.clean_cuda()
    return {"step_seconds": statistics.median(times), "step_seconds_all": times, "losses": losses,
            "max_memory_allocated": peak, "gpu_ms_by_family_one_step": breakdown, "env": common.env_info()}


def kernel_family(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa", "cudnn")):
        return "attention"
    if any(k in n for k in ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "matmul", "mm_")):
        return "matmul"
    if "adam" in n or "foreach" in n or "multi_tensor" in n:
        return "optimizer"
    if "softmax" in n or "nll" in n or "cross_entropy" in n or "log_softmax" in n:
        return "cross_entropy"
    if "reduce" in n:
        return "reductions"
    if "memcpy" in n or "memset" in n:
        return "copies"
    return "elementwise/other"


def our_side(binary: str, config: str, batch: int, seq: int, warmup: int, steps: int) -> dict:
    env = dict(os.environ, MEMBUDGET_CUDA_PROFILE="1")
    cmd = [binary, "verify", config, "--device-backend", "cuda", "-b", str(batch), "-s", str(seq),
           "--precision", "bf16", "--warmup", str(warmup), "--steps", str(steps), "--format", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode not in (0, 1):
        raise RuntimeError("membudget verify failed (%d): %s" % (p.returncode, p.stderr[-4000:]))
    j = json.loads(p.stdout)
    per = j["measured"]["per_step"]
    times = [s["seconds"] for s in per]
    prof = {}
    for line in p.stderr.splitlines():
        m = re.match(r"cuda profile: (\S+)\s+([0-9.]+) ms", line)
        if m:
            prof[m.group(1)] = float(m.group(2))
    total_steps = warmup + steps
    per_step = {k: round(v / total_steps, 3) for k, v in sorted(prof.items(), key=lambda kv: -kv[1])}
    return {"step_seconds": statistics.median(times), "step_seconds_all": times,
            "losses": [s["loss"] for s in per], "within_tolerance": j["within_tolerance"],
            "gpu_ms_by_op_per_step": per_step, "command": " ".join(cmd)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="./devbin/membudget")
    ap.add_argument("--config", default="configs/llama-3.2-1b.yaml")
    ap.add_argument("--hf", default="configs/hf/llama-3.2-1b.json")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch_r = torch_side(a.hf, a.batch, a.seq, a.warmup, a.steps)
    ours = our_side(a.binary, a.config, a.batch, a.seq, a.warmup, a.steps)
    res = {"model": a.config, "hf_config": a.hf, "batch": a.batch, "seq": a.seq, "precision": "bf16",
           "ours": ours, "torch": torch_r,
           "ratio_ours_over_torch": ours["step_seconds"] / torch_r["step_seconds"], "target_ratio": 1.5}
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
