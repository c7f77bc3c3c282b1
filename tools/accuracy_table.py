#!/usr/bin/env python3
"""Writes the accuracy table of docs/accuracy.md from the committed measurements.

usage: tools/accuracy_table.py [--membudget build/membudget] [--data tests/data/torch_train_h200.json] [--reserved]

A rank of a distributed job (tools/torch_profile_dist.py's files: the job has a "strategy") is
predicted with its layout's flags (tools/dist_table.py's flags_of). --reserved adds the reserved
memory after the steady step, measured / predicted.

For each measured case: the four steady-state phases, measured and predicted by the inventory model
(error in %), and two textbook figures beside the measurement:
  * saved after forward: measured memory_allocated() after forward minus the floor, against the
    inventory's and against Korthikanti's layer activations plus the loss's saved log-softmax;
  * peak: the measured max over phases, against the inventory's and against the textbook sum that
    formula-based estimators use: weights + gradients + optimizer state + Korthikanti activations
    + logits/loss term.
"""
import argparse, json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_table import flags_of  # noqa: E402

PHASES = ["floor", "forward_peak", "backward_peak", "optimizer_peak"]


def config_of(job):
    """The config as measured: the file, or a temporary copy with the run's overrides (a reduced
    depth, fewer experts, output_router_logits)."""
    if not job.get("overrides"):
        return job["config"]
    cfg = json.load(open(job["config"]))
    cfg.update(job["overrides"])
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(cfg, f)
    f.close()
    return f.name


def run(exe, job, activations):
    args = [exe, "predict", config_of(job), "--batch", str(job["batch"]), "--seq", str(job["seq"]),
            "--precision", job["precision"], "--optimizer", job.get("optimizer", "adamw"), "--recompute", job["recompute"],
            "--attention", job.get("attention", "flash"), "--activations", activations, "--format", "json"]
    if job.get("strategy"):  # a rank of a distributed job
        args += flags_of(job)[8:]  # (after its --batch, --seq, --precision and --recompute)
    if job.get("lora"):
        args += ["--lora", str(job["lora"])]
    if job.get("experts_implementation") and "--experts" not in args:
        args += ["--experts", job["experts_implementation"]]
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    if out.returncode not in (0, 1):  # refused (a job not modelled): the row says so
        why = out.stderr.strip().removeprefix("membudget: error: ")
        return {"refused": why.split(": ", 1)[1] if why.startswith("tmp") else why}  # not the temporary's name
    return json.loads(out.stdout)


def pct(p, m):
    return f"{(p - m) / m * 100:+.1f}%"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--membudget", default="build/membudget")
    ap.add_argument("--data", default="tests/data/torch_train_h200.json")
    ap.add_argument("--reserved", action="store_true", help="add the reserved memory after the steady step")
    a = ap.parse_args()
    data = json.load(open(a.data))
    mib = lambda b: f"{b / 2**20:,.0f}"
    print("| case | floor | forward | backward | optimizer | saved after forward: measured / inventory / Korthikanti | peak: measured / inventory / textbook sum |"
          + (" reserved |" if a.reserved else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if a.reserved else ""))
    worst_inv, worst_k = 0.0, 0.0
    for c in data["cases"]:
        if c.get("status") != "ok":
            continue
        m = [s for s in c["steps"] if s["step"] >= 2][-1]
        inv = run(a.membudget, c["job"], "inventory")
        if "refused" in inv:
            print(f"| {c['name']} | refused: {inv['refused'][:120]} | | | | | |")
            continue
        kor = run(a.membudget, c["job"], "korthikanti")
        cells = []
        for ph in PHASES:
            meas, pred = m[ph], inv["phases"][ph]
            worst_inv = max(worst_inv, abs(pred - meas) / meas)
            cells.append(f"{mib(meas)} / {mib(pred)} ({pct(pred, meas)})")
        saved_meas = m["after_forward"] - m["floor"]
        br = inv["breakdown"]
        saved_inv = inv["terms"]["activations"] + br["autocast_cache"] + br["logits_loss"]["loss_saved"]
        saved_k = kor["terms"]["activations"] + kor["breakdown"]["logits_loss"]["loss_saved"]
        peak_meas = max(m[ph] for ph in PHASES)
        t = kor["terms"]
        peak_k = t["model_states"] + t["activations"] + t["logits_loss"]
        worst_k = max(worst_k, abs(peak_k - peak_meas) / peak_meas)
        cells.append(f"{mib(saved_meas)} / {mib(saved_inv)} ({pct(saved_inv, saved_meas)}) / {mib(saved_k)} ({pct(saved_k, saved_meas)})")
        cells.append(f"{mib(peak_meas)} / {mib(inv['peak'])} ({pct(inv['peak'], peak_meas)}) / {mib(peak_k)} ({pct(peak_k, peak_meas)})")
        if a.reserved:
            cells.append(f"{mib(m['reserved'])} / {mib(inv['reserved_peak'])} ({pct(inv['reserved_peak'], m['reserved'])})")
        print(f"| {c['name']} | " + " | ".join(cells) + " |")
    print()
    print(f"Worst inventory phase error: {worst_inv * 100:.2f}%. Worst textbook-sum peak error: {worst_k * 100:.1f}%.")


if __name__ == "__main__":
    main()
