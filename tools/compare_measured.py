#!/usr/bin/env python3
"""Compares membudget's predictions with measured PyTorch steps (tests/data/torch_train_*.json).

usage: tools/compare_measured.py [--membudget build/membudget] [--data tests/data/torch_train_h200.json]
                                 [--activations inventory|korthikanti] [--markdown]
Prints, per case and phase, measured and predicted bytes and the error in percent.
"""
import argparse, json, subprocess, sys, os

PHASES = ["floor", "forward_peak", "backward_peak", "optimizer_peak"]


def steady(case):
    steps = [s for s in case["steps"] if s.get("step", 0) >= 2 and s.get("phase") == "done"]
    return steps[-1] if steps else None


def predict(exe, case, activations):
    j = case["job"]
    args = [exe, "predict", j["config"], "--batch", str(j["batch"]), "--seq", str(j["seq"]),
            "--precision", j["precision"], "--optimizer", j["optimizer"], "--recompute", j["recompute"],
            "--attention", j["attention"], "--activations", activations, "--format", "json"]
    if j.get("lora"):
        args += ["--lora", str(j["lora"])]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise RuntimeError(" ".join(args) + "\n" + out.stdout + out.stderr)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--membudget", default="build/membudget")
    ap.add_argument("--data", default="tests/data/torch_train_h200.json")
    ap.add_argument("--activations", default="inventory")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--filter", default="")
    a = ap.parse_args()
    data = json.load(open(a.data))
    worst = (0, "")
    if a.markdown:
        print("| case | phase | measured (MiB) | inventory (MiB) | error | korthikanti activations (MiB) |")
        print("|---|---|---:|---:|---:|---:|")
    for case in data["cases"]:
        if case.get("status") != "ok" or a.filter not in case["name"]:
            continue
        m = steady(case)
        p = predict(a.membudget, case, a.activations)
        s0 = case["steps"][0]
        row = []
        for ph in PHASES:
            meas, pred = m[ph], p["phases"][ph]
            err = (pred - meas) / meas * 100
            if abs(err) > abs(worst[0]):
                worst = (err, case["name"] + " " + ph)
            row.append((ph, meas, pred, err))
        for ph in ["forward_peak", "backward_peak"]:
            meas, pred = s0[ph], p["step0"][ph]
            err = (pred - meas) / meas * 100
            row.append(("step0." + ph, meas, pred, err))
        af = m["after_forward"] - m["floor"]
        pa = p["terms"]["activations"]
        if a.markdown:
            for ph, meas, pred, err in row:
                print(f"| {case['name']} | {ph} | {meas/2**20:.0f} | {pred/2**20:.0f} | {err:+.2f}% | |")
        else:
            print(f"{case['name']:55s} " + " ".join(f"{ph[:4]}:{err:+6.2f}%" for ph, _, _, err in row) +
                  f"  (after_fwd-floor meas {af/2**20:.0f} MiB)")
    print(f"worst steady-state error: {worst[0]:+.2f}% ({worst[1]})", file=sys.stderr)


if __name__ == "__main__":
    main()
