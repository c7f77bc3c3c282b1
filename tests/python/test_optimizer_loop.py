"""The for-loop Adafactor's allocations, parameter by parameter, against the measured snapshots.

tests/data/reserved_alone/ holds whole-run allocator snapshots of torch.optim.Adafactor(foreach=False)
stepping Llama 3.2 1B on an H200 (tools/device/reserved_alone_run.sh). The predicted snapshot
(`predict --snapshot`) replays the step's loop (src/model/optimizer_loop.cpp); its last step's
allocations must be the measured last step's, one for one and in order: each parameter's norms and
their reduction staging buffers (ATen's setReduceConfig), its row and column means, its
var_estimate, in model.parameters() order.
"""
import gzip
import os
import pickle
import subprocess

import pytest

CLI = os.environ.get("MEMBUDGET_CLI")
SRC = os.environ.get("MEMBUDGET_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def loop_allocations(trace, in_loop):
    """The requested sizes (rounded to 512 B, as the allocator rounds them) of the last step's loop:
    the last run of allocations `in_loop` with no other allocation between them."""
    runs, current, other_since = [], [], False
    for e in trace:
        if e["action"] != "alloc":
            continue
        if in_loop(e.get("frames") or []):
            if other_since and current:
                runs.append(current)
                current = []
            current.append((e["size"] + 511) // 512 * 512)
            other_since = False
        else:
            other_since = True
    runs.append(current)
    return runs


@pytest.mark.skipif(not CLI, reason="MEMBUDGET_CLI not set (ctest sets it)")
@pytest.mark.parametrize("precision", ["bf16", "amp-bf16"])
def test_adafactor_for_loop_allocates_what_torch_does(tmp_path, precision):
    measured_path = os.path.join(SRC, "tests/data/reserved_alone",
                                 f"llama-3.2-1b_{precision}_none_flash_adafactor_for-loop_b1s512.pickle.gz")
    with gzip.open(measured_path) as f:
        measured = pickle.load(f)["device_traces"][0]
    predicted_path = tmp_path / "predicted.pickle"
    out = subprocess.run([CLI, "predict", os.path.join(SRC, "configs/hf/llama-3.2-1b.json"), "--batch", "1", "--seq", "512",
                          "--precision", precision, "--optimizer", "adafactor", "--optimizer-impl", "for-loop",
                          "--snapshot", str(predicted_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    with open(predicted_path, "rb") as f:
        predicted = pickle.load(f)["device_traces"][0]

    measured_runs = loop_allocations(measured, lambda frames: any(
        fr.get("name") == "_single_tensor_adafactor" for fr in frames))
    predicted_runs = loop_allocations(predicted, lambda frames: any(
        "optimizer temporaries" in fr.get("name", "") for fr in frames))
    # one loop per step: step 0 and the steady steps
    assert len(measured_runs) == 3 and len(predicted_runs) >= 2
    # 16 layers of 9 parameters, the embedding and the final norm: some 1,400 allocations
    assert len(measured_runs[-1]) > 1000
    assert predicted_runs[-1] == measured_runs[-1]
