#!/usr/bin/env python3
"""The table of docs/distributed.md: each rank measured through the fake process group
(tests/data/torch_train_dist_*fakepg_h200.json) beside membudget's prediction, the textbook
figure (model states + Korthikanti activations + logits: `--activations korthikanti`) and
DeepSpeed's model-states estimators for the same layout.

DeepSpeed (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py, cpu_offload=False):
    ZeRO-1/2: 2·P + 18·P/W          ZeRO-3: 4·largest_layer + 18·P/W
applied to ZeRO-1 (--zero 1), FSDP2 without reshard (ZeRO-2) and with it (ZeRO-3); DDP and tensor
parallelism have none.

    python3 tools/dist_table.py [--membudget build/membudget] > table.md
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FILES = ["tests/data/torch_train_dist_fakepg_h200.json", "tests/data/torch_train_dist_tied_fakepg_h200.json",
         "tests/data/torch_train_sp_fakepg_h200.json", "tests/data/torch_train_fsdp_tp_fakepg_h200.json",
         "tests/data/torch_train_fsdp_tp_rerun_fakepg_h200.json",
         "tests/data/torch_train_hsdp_tp_fakepg_h200.json",
         "tests/data/torch_train_offload_fakepg_h200.json", "tests/data/torch_train_pp_fakepg_h200.json",
         "tests/data/torch_train_pp_interleaved_fakepg_h200.json", "tests/data/torch_train_cp_fakepg_h200.json",
         "tests/data/torch_train_pp_fsdp_fakepg_h200.json", "tests/data/torch_train_pp_fsdp_more_fakepg_h200.json",
         "tests/data/torch_train_pp_qwen_small_fakepg_h200.json", "tests/data/torch_train_pp_tp_ddp_fakepg_h200.json"]
PHASES = ("floor", "forward_peak", "backward_peak", "optimizer_peak")


def flags_of(j):
    f = ["--batch", str(j["batch"]), "--seq", str(j["seq"]), "--precision", j["precision"], "--recompute", j["recompute"]]
    if "stages" in j:  # tools/torch_profile_pp.py: one pipeline stage
        # the ("pp", "dp", "tp") mesh: the stage's first rank, stage · D·R·T
        D, R, T = j.get("fsdp", 1), j.get("ddp", 1), j.get("tp", 1)
        f += ["--pp", str(j["stages"]), "--rank", str(j["stage"] * D * R * T), "--microbatches", str(j["microbatches"]),
              "--pp-schedule", j["schedule"]]
        f += ["--fsdp", str(D), "--reshard-after-forward", "true" if j.get("reshard", True) else "false"] if D > 1 else []
        f += ["--dp", str(R)] + (["--ddp-bucket-view"] if j.get("bucket_view") else []) if R > 1 else []
        f += ["--tp", str(T)] if T > 1 else []
        f += ["--virtual-stages", str(j["virtual_stages"])] if j["schedule"] == "interleaved" else []
        return f + (["--pp-layers", ",".join(map(str, j["layers"]))] if j.get("layers") else [])
    W, st = j["world"], j["strategy"]
    f += ["--rank", str(j.get("rank", 0))]
    if st == "fsdp":
        f += ["--fsdp", str(W), "--reshard-after-forward", "true" if j.get("reshard", True) else "false"]
        f += ["--fsdp-offload"] if j.get("offload") else []
    elif st == "fsdp_tp":  # with replicate R > 1: HSDP across the TP groups
        R = j.get("replicate", 1)
        f += ["--dp", str(R)] if R > 1 else []
        f += ["--fsdp", str(W // (R * j["tp"])), "--tp", str(j["tp"]), "--reshard-after-forward",
              "true" if j.get("reshard", True) else "false"] + (["--sp"] if j.get("sp") else [])
    elif st == "cp" and j.get("fsdp_over_cp"):  # FSDP2 over the cp ranks (the cases without it are no layout)
        f += ["--cp", str(W), "--reshard-after-forward", "true" if j.get("reshard", True) else "false"]
    elif st == "hsdp":
        f += ["--dp", str(j["replicate"]), "--fsdp", str(W // j["replicate"])]
    elif st == "ddp":
        f += ["--dp", str(W)] + (["--ddp-bucket-view"] if j.get("bucket_view") else [])
    elif st == "zero1":
        f += ["--dp", str(W), "--zero", "1"]
    elif st == "ep":  # transformers' expert parallelism
        f += ["--ep", str(W)] + (["--experts", j["experts_implementation"]] if j.get("experts_implementation") else [])
    elif st == "ep_fsdp":  # expert parallelism within, FSDP2 across
        f += ["--fsdp", str(W // j["ep"]), "--ep", str(j["ep"]), "--reshard-after-forward", "true" if j.get("reshard", True) else "false"]
        f += ["--experts", j["experts_implementation"]] if j.get("experts_implementation") else []
    elif st == "tp":
        f += ["--tp", str(W)] + (["--sp"] if j.get("sp") else []) + (["--loss-parallel"] if j.get("loss_parallel") else [])
    else:
        return None
    return f


def config_of(j, tmp):
    with open(os.path.join(ROOT, j["config"])) as fh:
        cfg = json.load(fh)
    if j.get("overrides"):
        cfg.update(j["overrides"])
    path = os.path.join(tmp, os.path.basename(j["config"]).replace(".json", "") + "_%s.json" % abs(hash(json.dumps(cfg, sort_keys=True))))
    with open(path, "w") as fh:
        json.dump(cfg, fh)
    return path, cfg


def deepspeed(j, params, largest_layer):
    W, st = j.get("world"), j.get("strategy")
    if j.get("offload"):
        return None  # (its cpu_offload=True estimator is another formula; not compared here)
    if st == "zero1" or (st in ("fsdp", "hsdp") and not j.get("reshard", True)):
        return 2 * params + int(18 * params / W)
    if st in ("fsdp", "hsdp"):
        shard = W // j.get("replicate", 1) if st == "hsdp" else W
        return 4 * largest_layer + int(18 * params / shard)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--membudget", default=os.path.join(ROOT, "build", "membudget"))
    a = ap.parse_args()
    tmp = "/tmp/membudget_dist_table"
    os.makedirs(tmp, exist_ok=True)
    print("| rank | measured peak (steady step) | membudget | its worst phase | textbook (Korthikanti) | DeepSpeed (states only) |")
    print("|---|---:|---:|---:|---:|---:|")
    for rel in FILES:
        first = "tied" not in rel
        for c in json.load(open(os.path.join(ROOT, rel)))["cases"]:
            j = c["job"]
            tied = "llama-3.2-1b" in j["config"] or "qwen2.5-1.5b" in j["config"]
            if c["status"] != "ok" or (first and tied and j.get("strategy") in ("ddp", "zero1", "tp") and not j.get("sp")):
                continue  # superseded by the tied run (the first lost the tying)
            f = flags_of(j)
            if f is None:
                continue
            path, cfg = config_of(j, tmp)
            run = lambda extra: json.loads(subprocess.run([a.membudget, "predict", path, "--format", "json"] + f + extra,
                                                          capture_output=True, text=True, check=True).stdout)
            p, k = run([]), run(["--activations", "korthikanti"])
            measured = max(c["steady"][ph] for ph in PHASES)
            worst = max((abs(p["phases"][ph] - c["steady"][ph]) / c["steady"][ph], ph) for ph in PHASES)
            tb = k["terms"]
            textbook = tb["model_states"] + tb["activations"] + tb["logits_loss"]
            params = p["model"]["parameters"]
            h, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
            largest_layer = max(cfg["vocab_size"] * h, I * h)  # DeepSpeed: the largest module's own parameters
            ds = deepspeed(j, params, largest_layer)
            gib = lambda x: "%.2f GiB" % (x / 2**30)
            err = lambda x: "%s (%+.1f%%)" % (gib(x), 100 * (x - measured) / measured)
            print("| %s | %s | %s | %.2f%% %s | %s | %s |" % (
                c["name"], gib(measured), err(max(p["phases"][ph] for ph in PHASES)), 100 * worst[0], worst[1], err(textbook),
                err(ds) if ds else "—"))


if __name__ == "__main__":
    sys.exit(main())
