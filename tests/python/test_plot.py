"""predict --plot FILE.svg: the SVG parses as XML, its phase labels are the JSON's numbers."""
import json
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest

CLI = os.environ.get("MEMBUDGET_CLI")
SRC = os.environ.get("MEMBUDGET_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
NS = "{http://www.w3.org/2000/svg}"


def plot(tmp_path, *flags, spec="configs/llama-3.2-1b.yaml"):
    svg = tmp_path / "step.svg"
    out = subprocess.run([CLI, "predict", os.path.join(SRC, spec), "--format", "json",
                          "--plot", str(svg), *flags], capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr
    return ET.parse(svg).getroot(), json.loads(out.stdout)


@pytest.mark.skipif(not CLI, reason="MEMBUDGET_CLI not set (ctest sets it)")
@pytest.mark.parametrize("flags", [("--batch", "2", "--seq", "2048", "--device", "H100"),
                                   ("--batch", "1", "--seq", "2048", "--precision", "bf16", "--pp", "2", "--microbatches", "4"),
                                   ("--batch", "1", "--seq", "1024", "--fsdp", "8"),
                                   # small tensors: the caching allocator's slack reaches 3.4% of the allocated bytes
                                   ("--spec", "tests/data/new_models_heldout2/configs/smollm2-135m.json",
                                    "--batch", "2", "--seq", "1500", "--precision", "fp32", "--optimizer", "adafactor")])
def test_plot_is_svg_with_the_json_numbers(tmp_path, flags):
    spec = flags[1] if flags[0] == "--spec" else "configs/llama-3.2-1b.yaml"
    flags = flags[2:] if flags[0] == "--spec" else flags
    root, budget = plot(tmp_path, *flags, spec=spec)
    assert root.tag == NS + "svg"
    labels = {e.get("data-phase"): int(e.get("data-bytes")) for e in root.iter(NS + "text") if e.get("class") == "phase-peak"}
    assert set(labels) == {"floor", "forward_peak", "backward_peak", "optimizer_peak"}
    for phase, b in labels.items():
        assert b == budget["phases"][phase]
    bands = [e.get("data-band") for e in root.iter(NS + "polygon")]
    assert bands == ["parameters", "gradients", "optimizer state", "saved activations", "temporaries",
                     "logits and loss", "workspace", "allocator slack"]
    peak = [e for e in root.iter(NS + "circle") if e.get("class") == "peak"]
    assert len(peak) == 1 and int(peak[0].get("data-bytes")) == budget["peak"]
    if "reserved_peak" in budget:
        # the stack's top is the replay's memory_allocated(), the figure the phases report (the
        # tensors alone sit below it by the allocator's slack)
        assert int(peak[0].get("data-drawn-bytes")) == budget["peak"]
    if "--device" in flags:
        caps = [int(e.get("data-bytes")) for e in root.iter(NS + "line") if e.get("class") == "capacity"]
        assert budget["device"]["capacity"] in caps
    reserved = [e for e in root.iter(NS + "polyline") if e.get("class") == "reserved"]
    if "reserved_peak" in budget:
        assert int(reserved[0].get("data-bytes")) == budget["reserved_peak"]
        # event by event, not a line per phase; it never drops (nothing is released without
        # empty_cache: y only rises on the page), and it ends at or above the allocated peak
        pts = [tuple(map(float, p.split(","))) for p in reserved[0].get("points").split()]
        assert len(pts) > 50
        assert all(b[1] <= a[1] + 1e-9 for a, b in zip(pts, pts[1:]))
        assert pts[-1][1] <= float(peak[0].get("cy")) + 0.1


@pytest.mark.skipif(not CLI, reason="MEMBUDGET_CLI not set (ctest sets it)")
def test_plot_of_a_serving_job_labels_its_phases(tmp_path):
    root, budget = plot(tmp_path, "--mode", "infer", "--batch", "4", "--seq", "4096")
    labels = {e.get("data-phase"): int(e.get("data-bytes")) for e in root.iter(NS + "text") if e.get("class") == "phase-peak"}
    assert set(labels) == set(budget["phases"])
    for phase, b in labels.items():
        assert b == budget["phases"][phase]


@pytest.mark.skipif(not CLI, reason="MEMBUDGET_CLI not set (ctest sets it)")
def test_plot_of_the_harness_profile_is_refused_by_name(tmp_path):
    out = subprocess.run([CLI, "predict", os.path.join(SRC, "configs/llama-3.2-1b.yaml"), "--profile", "harness",
                          "--plot", str(tmp_path / "x.svg")], capture_output=True, text=True)
    assert out.returncode == 2
    assert "--plot" in out.stderr


# The opcodes pytorch.org/memory_viz's unpickler reads (and src/diagnose/pickle_writer.hpp emits).
VIEWER_OPCODES = {"PROTO", "EMPTY_DICT", "EMPTY_LIST", "MARK", "SETITEMS", "APPENDS", "TUPLE", "BININT", "BININT1",
                  "BININT2", "LONG1", "BINFLOAT", "BINUNICODE", "NEWTRUE", "NEWFALSE", "NONE", "BINPUT", "BINGET", "STOP"}


@pytest.mark.skipif(not CLI, reason="MEMBUDGET_CLI not set (ctest sets it)")
def test_snapshot_is_an_allocator_trace_the_viewer_reads(tmp_path):
    import pickle
    import pickletools
    path = tmp_path / "predicted.pickle"
    out = subprocess.run([CLI, "predict", os.path.join(SRC, "configs/llama-3.2-1b.yaml"), "--batch", "1", "--seq", "1024",
                          "--format", "json", "--snapshot", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    budget = json.loads(out.stdout)
    data = path.read_bytes()
    assert {op.name for op, _, _ in pickletools.genops(data)} <= VIEWER_OPCODES
    snap = pickle.loads(data)
    # the replay's segments are the reserved memory the budget reports
    assert sum(s["total_size"] for s in snap["segments"]) == budget["reserved_peak"]
    trace = snap["device_traces"][0]
    assert {e["action"] for e in trace} >= {"alloc", "free_requested", "free_completed", "segment_alloc"}
    names = [e["frames"][0]["name"] for e in trace if e["action"] == "alloc" and e["frames"]]
    assert any(n.startswith("forward_peak:") for n in names) and any(n.startswith("backward_peak:") for n in names)
    # the peak of the replayed trace is the steady step's allocated peak
    live = peak = 0
    for e in trace:
        if e["action"] == "alloc":
            live += e["size"]
        elif e["action"] == "free_completed":
            live -= e["size"]
        peak = max(peak, live)
    assert peak >= budget["peak"]


@pytest.mark.skipif(not CLI, reason="MEMBUDGET_CLI not set (ctest sets it)")
def test_attribute_plot_draws_the_snapshot_beside_the_prediction(tmp_path):
    snap = os.path.join(SRC, "tests/data/snapshots/train_tiny_llama_amp_bf16_ctx_all.pickle")
    model = os.path.join(SRC, "tests/data/snapshots/train_tiny_llama.config.json")
    svg = tmp_path / "a.svg"
    args = [CLI, "attribute", snap, "--model", model, "--batch", "2", "--seq", "128"]
    out = subprocess.run(args + ["--plot", str(svg), "--format", "json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    root = ET.parse(svg).getroot()
    lines = {e.get("class"): e for e in root.iter(NS + "polyline")}
    assert int(lines["measured"].get("data-bytes")) == report["peak_bytes"]
    # the predicted stream's highest moment is the step's predicted peak (the steady step here)
    assert int(lines["predicted"].get("data-bytes")) == report["predicted_peak"]
    assert len(lines["measured"].get("points").split()) > 100
    bars = {}
    for e in root.iter(NS + "rect"):
        if e.get("class") == "term":
            bars[(e.get("data-side"), e.get("data-term"))] = int(e.get("data-bytes"))
    for term, row in report["terms"].items():
        assert bars[("measured", term)] == row["measured"]
        assert bars[("predicted", term)] == row["predicted"]
    assert sum(v for (side, _), v in bars.items() if side == "measured") == report["peak_bytes"]
    # without a model there is no prediction to draw
    bad = subprocess.run([CLI, "attribute", snap, "--plot", str(tmp_path / "b.svg")], capture_output=True, text=True)
    assert bad.returncode == 2 and "--model" in bad.stderr
