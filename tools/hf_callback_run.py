#!/usr/bin/env python3
"""membudget.hf.MemoryCheckCallback inside real Hugging Face Trainer runs (the GPU machine's check).

Two runs, each a Trainer with random weights built from a config.json and a dataset of fixed-length
random sequences (input_ids = labels, as torch_step measures): Llama 3.2 1B as an fp32 model with
bf16=True (autocast, amp-bf16) at 1 x 2048, and Qwen2.5 0.5B loaded in bf16 with gradient
checkpointing at 2 x 1024; both with the Trainer's default optimizer (adamw_torch_fused). The
prediction comes from `prediction` (a `membudget predict --format json` file, devbin/pred/) where
the compiled core cannot be imported, else the callback predicts it itself. Writes the callback's
readings, its violations and the prediction's phases to --output.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

RUNS = [
    {"name": "llama-3.2-1b amp-bf16 b1s2048", "config": "configs/hf/llama-3.2-1b.json", "dtype": "float32",
     "batch": 1, "seq": 2048, "checkpointing": False, "prediction": "devbin/pred/trainer_llama-3.2-1b.json"},
    {"name": "qwen2.5-0.5b bf16 full b2s1024", "config": "configs/hf/qwen2.5-0.5b.json", "dtype": "bfloat16",
     "batch": 2, "seq": 1024, "checkpointing": True, "prediction": "devbin/pred/trainer_qwen2.5-0.5b.json"},
]


def core_importable():
    try:
        import membudget._core  # noqa: F401
        return True
    except ImportError:
        return False


def run(spec, out_dir, steps):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    from membudget.hf import MemoryCheckCallback

    with open(spec["config"]) as f:
        cfgd = json.load(f)
    cfg = AutoConfig.for_model(**cfgd)
    torch.manual_seed(0)
    dtype = getattr(torch, spec["dtype"])
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, cfgd["vocab_size"], (spec["seq"],), generator=g) for _ in range(spec["batch"] * steps)]
    data = [{"input_ids": r, "labels": r.clone()} for r in rows]
    args = TrainingArguments(output_dir=os.path.join(out_dir, "trainer"), per_device_train_batch_size=spec["batch"],
                             max_steps=steps, bf16=True, gradient_checkpointing=spec["checkpointing"],
                             report_to=[], save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
                             disable_tqdm=True)
    prediction = None
    if not core_importable():
        with open(spec["prediction"]) as f:
            prediction = json.load(f)
    cb = MemoryCheckCallback(tolerance=0.02, action="warn", prediction=prediction)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[cb])
    trainer.train()
    res = {"name": spec["name"], "args": json.loads(args.to_json_string()), "predicted": cb.prediction["phases"],
           "predicted_here": prediction is None, "readings": cb.readings, "violations": cb.violations,
           "optimizer": type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer")
                             else trainer.optimizer).__name__,
           "optimizer_flags": {k: trainer.optimizer.param_groups[0].get(k) for k in ("foreach", "fused")}}
    del trainer, model
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    out = {"runs": []}
    for spec in RUNS:
        try:
            res = run(spec, os.path.dirname(os.path.abspath(a.output)), a.steps)
        except Exception as e:  # recorded: the next run still goes
            import traceback

            res = {"name": spec["name"], "error": "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-3000:])}
        out["runs"].append(res)
        with open(a.output, "w") as f:
            json.dump(out, f, indent=1)
        print(json.dumps({k: res.get(k) for k in ("name", "predicted", "violations", "error")})[:3000])
        for r in res.get("readings", []):
            print("   ", r)
    return 0 if all("error" not in r for r in out["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
