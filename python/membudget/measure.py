"""python -m membudget measure CONFIG.json [job flags]: the real Hugging Face training step, measured
with PyTorch on this machine's GPU, beside membudget's prediction, phase by phase.

The step is membudget.torch_step's (what tools/torch_profile_step.py measures for the committed
ground truth): a model built from the config.json with random weights, the Trainer's loop
(forward with labels, backward, optimizer.step, zero_grad), the caching allocator read around each
phase, the last of --steps steps taken as the steady state. The prediction is membudget.predict for
the same job (or --prediction FILE, a `membudget predict --format json` made elsewhere). Exit status:
0 when every phase is within --tolerance, 1 when one is not (or the step ran out of memory), 2 for
bad input, a missing torch or transformers included.
"""
from __future__ import annotations

import argparse
import json
import sys

from . import torch_step  # imports torch only when a step runs

PHASES = ("floor", "forward_peak", "backward_peak", "optimizer_peak")
MIB = 1024.0 * 1024.0


class MissingDependency(Exception):
    pass


def require_torch():
    """torch with a CUDA device, and transformers; MissingDependency says which is missing."""
    try:
        import torch
    except ImportError as e:
        raise MissingDependency("membudget measure needs PyTorch (pip install torch): %s" % e) from e
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise MissingDependency("membudget measure needs transformers (pip install transformers): %s" % e) from e
    if not torch.cuda.is_available():
        raise MissingDependency("membudget measure needs a CUDA GPU: torch.cuda.is_available() is False")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m membudget measure", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="the model's Hugging Face config.json")
    p.add_argument("--batch", "-b", type=int, default=1)
    p.add_argument("--seq", "-s", type=int, default=2048)
    p.add_argument("--precision", choices=("fp32", "amp-bf16", "bf16"), default="amp-bf16")
    p.add_argument("--optimizer", choices=("adamw", "sgd", "sgd-momentum", "adafactor"), default="adamw")
    p.add_argument("--optimizer-impl", choices=("foreach", "fused", "for-loop"), default=None)
    p.add_argument("--recompute", choices=("none", "full"), default="none")
    p.add_argument("--attention", choices=("flash", "math"), default="flash")
    p.add_argument("--override", action="append", default=[], metavar="KEY=JSON",
                   help="a config.json key for both the model and the prediction, e.g. num_hidden_layers=4")
    p.add_argument("--steps", type=int, default=4, help="steps run; the last is the steady state (default 4)")
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="largest |measured − predicted| / measured per phase (default 0.02)")
    p.add_argument("--prediction", help="a `membudget predict --format json` of this job, instead of predicting here")
    p.add_argument("--output", help="write measured, predicted and errors as JSON here")
    a = p.parse_args(argv)
    if a.batch < 1 or a.seq < 1 or a.steps < 3:
        p.error("--batch and --seq must be at least 1 and --steps at least 3 (two warm-up steps)")
    if not 0 < a.tolerance < 1:
        p.error("--tolerance must be in (0, 1), e.g. 0.02")
    return a


def overrides_of(items):
    """--override KEY=JSON items as torch_step reads them (a value that is not JSON is a string)."""
    for it in items:
        k, eq, _ = it.partition("=")
        if not eq or not k:
            raise ValueError("--override %r: expected KEY=JSON, e.g. num_hidden_layers=4" % it)
    return torch_step._overrides_from_args(items)


def job_options(a):
    """The job as membudget.predict's keyword arguments."""
    kw = {"batch": a.batch, "seq": a.seq, "precision": a.precision, "optimizer": a.optimizer,
          "recompute": a.recompute, "attention": a.attention}
    if a.optimizer_impl:
        kw["optimizer_impl"] = a.optimizer_impl
    return kw


def predicted(a, cfgd):
    if a.prediction:
        with open(a.prediction) as f:
            return json.load(f)
    import membudget

    model = membudget.Model.from_config_json(json.dumps(cfgd))
    return membudget.predict(model, **job_options(a))


def compare(measured, prediction, tolerance):
    """Rows (phase, measured, predicted, error): the steady step's phases, which --tolerance
    decides, then step 0's phases and the reserved memory after the steady step, shown beside them
    (step 0 and the allocator's cache are held to looser bounds: docs/accuracy.md)."""
    rows = []
    deciding = [("steady " + ph, measured["steady"][ph], prediction["phases"][ph]) for ph in PHASES]
    shown = [("step 0 " + ph, measured["step0"][ph], prediction["step0"][ph]) for ph in PHASES if "step0" in measured]
    if prediction.get("reserved_peak") and measured["steady"].get("reserved"):
        shown.append(("reserved", measured["steady"]["reserved"], prediction["reserved_peak"]))
    for decides, group in ((True, deciding), (False, shown)):
        for label, got, want in group:
            err = (want - got) / got if got else 0.0
            rows.append({"phase": label, "measured": got, "predicted": want, "error": err, "decides": decides,
                         "within": abs(err) <= tolerance})
    return rows


def main(argv=None):
    try:
        a = parse_args(sys.argv[1:] if argv is None else argv)
        cfg_over = overrides_of(a.override)
    except ValueError as e:
        print("membudget measure: error: %s" % e, file=sys.stderr)
        return 2
    try:
        require_torch()
    except MissingDependency as e:
        print("membudget measure: error: %s" % e, file=sys.stderr)
        return 2
    cfgd = torch_step.common.load_config_dict(a.config, cfg_over or None)
    try:
        prediction = predicted(a, cfgd)
    except Exception as e:  # membudget.Error (a ValueError) or an unreadable --prediction
        print("membudget measure: error: the prediction: %s" % e, file=sys.stderr)
        return 2
    case = {"name": a.config, "config": a.config, "batch": a.batch, "seq": a.seq, "precision": a.precision,
            "optimizer": a.optimizer, "optimizer_impl": a.optimizer_impl, "recompute": a.recompute,
            "attention": a.attention, "steps": a.steps, "warmup": 2, "overrides": cfg_over or None,
            "use_cache": None}
    model, cfgd = torch_step.build_model(case)
    res = torch_step.run_case(model, torch_step.common.param_stats(model), case, cfgd)
    if res["status"] != "ok":
        print("membudget measure: the step did not complete (%s): %s" % (res["status"], res.get("error", "")[:400]))
        return 1
    rows = compare(res, prediction, a.tolerance)
    print("%-24s %12s %12s %9s" % ("phase", "measured", "predicted", "error"))
    for r in rows:
        print("%-24s %9.1f MiB %9.1f MiB %+8.2f%%%s" % (r["phase"], r["measured"] / MIB, r["predicted"] / MIB,
                                                       100 * r["error"], "" if r["within"] or not r["decides"]
                                                       else "  beyond --tolerance"))
    steady = [r for r in rows if r["decides"]]
    bad = [r for r in steady if not r["within"]]
    print("%d of %d steady phases within %.1f%% (step 0 and reserved shown, not held to it)"
          % (len(steady) - len(bad), len(steady), 100 * a.tolerance))
    if a.output:
        with open(a.output, "w") as f:
            json.dump({"job": vars(a), "rows": rows, "measured": res, "prediction": prediction}, f, indent=1)
    return 1 if bad else 0
