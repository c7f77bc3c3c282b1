"""python -m membudget measure and membudget.hf: against the real runs committed from the H200
(tests/data/python_h200/, tools/device/python_run.sh), and their behaviour without torch."""
import json
import os
import subprocess
import sys

import pytest

import membudget
from membudget import hf, measure

ROOT = os.environ.get("MEMBUDGET_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "tests", "data", "python_h200", "measure_and_callback_h200.json")
PHASES = ("floor", "forward_peak", "backward_peak", "optimizer_peak")


def data():
    with open(DATA) as f:
        return json.load(f)


def config_of(name):
    with open(os.path.join(ROOT, "configs", "hf", name + ".json")) as f:
        return f.read()


@pytest.mark.parametrize("run", data()["trainer"]["runs"], ids=lambda r: r["name"])
def test_trainer_step_prediction_against_the_callbacks_readings(run):
    # the job the callback predicts from a Trainer (config, TrainingArguments, first batch, dtype),
    # predicted now, against what the callback read in the real Trainer's steady steps
    model = run["name"].split()[0]
    dtype = "float32" if "amp-bf16" in run["name"] else "bfloat16"
    batch = run["args"]["per_device_train_batch_size"]
    seq = {"llama-3.2-1b": 2048, "qwen2.5-0.5b": 1024}[model]
    predicted = hf.predict_trainer_step(config_of(model), run["args"], batch, seq, "sdpa", dtype)
    assert predicted["job"]["optimizer_impl"] == "fused"  # the Trainer's adamw_torch_fused
    assert run["optimizer_flags"]["fused"] is True
    steady = [r for r in run["readings"] if r["step"] >= 2]
    assert len(steady) >= 3
    for phase in PHASES:
        measured = steady[-1][phase]
        err = (predicted["phases"][phase] - measured) / measured
        assert abs(err) <= 0.01, (phase, err)
    assert run["violations"] == []


@pytest.mark.parametrize("case", data()["measure"], ids=lambda c: c["job"]["config"])
def test_measure_rows_against_a_prediction_made_now(case):
    j = case["job"]
    predicted = membudget.predict(os.path.join(ROOT, j["config"]), batch=j["batch"], seq=j["seq"],
                                  precision=j["precision"], recompute=j["recompute"])
    rows = measure.compare({"steady": case["steady"], "step0": case["step0"]}, predicted, 0.01)
    steady = [r for r in rows if r["decides"]]
    assert [r["phase"] for r in steady] == ["steady " + p for p in PHASES]
    assert all(r["within"] for r in steady), steady
    assert any(r["phase"] == "reserved" for r in rows)


def test_compare_decides_on_the_steady_phases_only():
    measured = {"steady": {"floor": 100, "forward_peak": 200, "backward_peak": 300, "optimizer_peak": 400,
                           "reserved": 500},
                "step0": {"floor": 10, "forward_peak": 20, "backward_peak": 30, "optimizer_peak": 40}}
    prediction = {"phases": {"floor": 100, "forward_peak": 210, "backward_peak": 300, "optimizer_peak": 400},
                  "step0": {"floor": 20, "forward_peak": 20, "backward_peak": 30, "optimizer_peak": 40},
                  "reserved_peak": 500}
    rows = measure.compare(measured, prediction, 0.02)
    by = {r["phase"]: r for r in rows}
    assert not by["steady forward_peak"]["within"] and by["steady forward_peak"]["decides"]
    assert by["steady forward_peak"]["error"] == pytest.approx(0.05)
    assert not by["step 0 floor"]["within"] and not by["step 0 floor"]["decides"]
    assert by["reserved"]["within"]


def run_module(*args):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "membudget", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_python_m_membudget_mirrors_the_cli():
    cli = os.environ.get("MEMBUDGET_CLI")
    spec = os.path.join(ROOT, "configs", "llama-3.2-1b.yaml")
    r = run_module("predict", spec, "--batch", "2", "--format", "json")
    assert r.returncode == 0, r.stderr
    if cli:
        c = subprocess.run([cli, "predict", spec, "--batch", "2", "--format", "json"], capture_output=True, text=True)
        assert json.loads(r.stdout) == json.loads(c.stdout)
    bad = run_module("predict", "/nonexistent.yaml")
    assert bad.returncode == 5 and "cannot read the model spec" in bad.stderr
    assert run_module("advise", spec, "--device", "H200").returncode in (0, 1)
    assert run_module("no-such-command").returncode == 2


def test_measure_without_torch_or_with_bad_flags_says_so():
    try:
        import torch  # noqa: F401
        has_torch = True
    except ImportError:
        has_torch = False
    if not has_torch:
        r = run_module("measure", os.path.join(ROOT, "configs", "hf", "llama-3.2-1b.json"))
        assert r.returncode == 2 and "needs PyTorch" in r.stderr
    r = run_module("measure", "x.json", "--tolerance", "3")
    assert r.returncode == 2 and "--tolerance" in r.stderr
    r = run_module("measure", "x.json", "--override", "novalue")
    assert r.returncode == 2 and "KEY=JSON" in r.stderr


def test_the_callback_needs_transformers_only_when_asked_for():
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs transformers"):
            hf.MemoryCheckCallback  # noqa: B018
    assert hasattr(hf, "predict_trainer_step")


def test_the_callback_reads_a_step_of_several_micro_batches_as_one(monkeypatch):
    """Under gradient_accumulation_steps the Trainer calls on_step_begin once, then each micro-batch's
    forward and backward, then the optimizer: the floor is the first forward's, the forward and
    backward peaks the highest over the micro-batches (a fake torch and transformers stand in)."""
    import types

    class Cuda:
        allocated = peak = 0

        @classmethod
        def to(cls, n, peak=None):  # memory_allocated() becomes n, after rising to `peak`
            cls.peak = max(cls.peak, peak or n, n)
            cls.allocated = n

        synchronize = staticmethod(lambda: None)
        memory_allocated = classmethod(lambda cls: cls.allocated)
        max_memory_allocated = classmethod(lambda cls: cls.peak)

        @classmethod
        def reset_peak_memory_stats(cls):
            cls.peak = cls.allocated

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=Cuda, is_grad_enabled=lambda: True))
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(TrainerCallback=object))
    prediction = {"phases": {"floor": 100, "forward_peak": 170, "backward_peak": 180, "optimizer_peak": 140}}
    cb = hf._make_callback_class()(prediction=prediction, steady_from=0)
    module = types.SimpleNamespace(training=True)
    Cuda.to(100)
    cb.on_step_begin(None, None, None)
    for first in (True, False):
        grads = 0 if first else 20  # the first micro-batch's gradients stay through the second
        cb._forward_begins(module, (), {})
        Cuda.to(130 + grads, peak=150 + grads)  # forward: activations kept for backward
        cb._forward_ends(module, (), None)
        Cuda.to(120, peak=160 + grads)  # backward: activations freed, gradients made (20)
    cb.on_pre_optimizer_step(None, None, None)
    Cuda.to(100, peak=140)  # optimizer step, then zero_grad
    cb.on_optimizer_step(None, None, None)
    cb.on_step_end(None, None, types.SimpleNamespace(should_training_stop=False))
    assert cb.readings == [{"step": 0, "floor": 100, "forward_peak": 170, "backward_peak": 180, "optimizer_peak": 140}]
    assert cb.violations == []
