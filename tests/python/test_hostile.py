"""Hostile and absurd input through the Python module (issue 13, docs/robustness.md)."""
import os
import threading
import time

import pytest

import membudget

SRC = os.environ.get("MEMBUDGET_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
LLAMA_1B = os.path.join(SRC, "configs", "llama-3.2-1b.yaml")
TINY = os.path.join(SRC, "configs", "tiny-llama.yaml")
MAX64 = 2**64 - 1


def test_capacity_near_2_64_answers_at_once():
    t0 = time.monotonic()
    f = membudget.fits(LLAMA_1B, capacity=MAX64, headroom=0.0)
    assert f["fits"] and f["limit"] == MAX64 and f["capacity"] == MAX64
    assert membudget.max_micro_batch(TINY, capacity=MAX64, headroom=0.0, seq=64)["max_micro_batch"] == 65536
    assert membudget.max_sequence_length(TINY, capacity=MAX64, headroom=0.0, batch=1)["max_seq"] == 512
    assert time.monotonic() - t0 < 5


def test_sizes_are_exact_and_an_overhead_past_any_card_is_refused():
    e = membudget.estimate(TINY, batch=1, seq=64, overhead="1125899906842624")  # 1 PiB, the limit
    assert e["overhead"] == 1125899906842624
    e = membudget.estimate(TINY, batch=1, seq=64, overhead=1125899906842623)  # an int, read through str()
    assert e["overhead"] == 1125899906842623
    # near 2^64, reserved + overhead wrapped: refused, naming the option
    with pytest.raises(membudget.Error, match="--overhead: 8.00 EiB is more than any GPU holds"):
        membudget.estimate(TINY, batch=1, seq=64, overhead="9223372036854775809")
    with pytest.raises(membudget.Error, match="overflows 64 bits"):
        membudget.estimate(TINY, overhead=str(2**64))


@pytest.mark.parametrize("call", [
    lambda: membudget.fits(LLAMA_1B, device=5),
    lambda: membudget.fits(LLAMA_1B, device=b"H100"),
    lambda: membudget.fits(LLAMA_1B, capacity=2**64),
    lambda: membudget.fits(LLAMA_1B, capacity=-1),
    lambda: membudget.fits(LLAMA_1B, capacity=True),
    lambda: membudget.fits(LLAMA_1B, capacity=8e10),
    lambda: membudget.fits(LLAMA_1B, capacity="80GiB"),
    lambda: membudget.fits(LLAMA_1B, device="H100", headroom="0.1"),
    lambda: membudget.fits(LLAMA_1B, device="H100", capacity=1 << 30),  # both: which one?
    lambda: membudget.max_micro_batch(LLAMA_1B, device="H100", global_batch=-1),
    lambda: membudget.max_sequence_length(LLAMA_1B, device="H100", multiple_of=1.5),
    lambda: membudget.sweep(LLAMA_1B, batches="12"),
    lambda: membudget.sweep(LLAMA_1B, batches=[1, "2"]),
    lambda: membudget.sweep(LLAMA_1B, precisions="bf16"),
    lambda: membudget.estimate(5),
    lambda: membudget.estimate(None),
    lambda: membudget.load_model(5),
    lambda: membudget.Model.from_yaml(5),
    lambda: membudget.Model.from_config_json(b"{}"),
    lambda: membudget.estimate(LLAMA_1B, batch=2.0),
    lambda: membudget.estimate(LLAMA_1B, batch=True),
    lambda: membudget.estimate(LLAMA_1B, batch=None),
])
def test_wrongly_typed_arguments_raise_membudget_error(call):
    with pytest.raises(membudget.Error):
        call()


def test_options_the_mode_does_not_use_are_refused():
    for kw in ({"lora": 16}, {"recompute": "full"}, {"precision": "bf16"}, {"loss_chunk": 512}):
        with pytest.raises(membudget.Error, match="--mode infer"):
            membudget.estimate(TINY, mode="infer", **kw)
    for kw in ({"kv_dtype": "fp8"}, {"weights": "int4"}, {"group_size": 64}):
        with pytest.raises(membudget.Error, match="training"):
            membudget.estimate(TINY, **kw)
    with pytest.raises(membudget.Error, match="--precision"):
        membudget.sweep(TINY, precisions=["bf16"], mode="infer")
    assert membudget.estimate(TINY, mode="infer", weights="int4", group_size=32, kv_dtype="fp8")["peak"] > 0


def test_sweep_grid_is_bounded_before_the_work():
    t0 = time.monotonic()
    with pytest.raises(membudget.Error, match="100000"):
        membudget.sweep(TINY, batches=list(range(1, 1001)), seqs=list(range(1, 102)))
    assert time.monotonic() - t0 < 2


def test_error_messages_are_escaped_text():
    with pytest.raises(membudget.Error) as e:
        membudget.Model.from_yaml('name: x\n"\\e[31m\\u0000": 1\n')
    msg = str(e.value)
    assert "\x1b" not in msg and "\x00" not in msg and "\\x1B" in msg


def _answers(model, shapes):
    out = []
    for b, s in shapes:
        out.append(membudget.estimate(model, batch=b, seq=s)["peak"])
        out.append(membudget.fits(model, device="H100", batch=b, seq=s)["required"])
        out.append(membudget.estimate(model, mode="infer", batch=b, seq=s, kv_dtype="fp8")["peak"])
    out.append(membudget.max_micro_batch(model, device="A100-40GB", seq=2048)["max_micro_batch"])
    out.append(membudget.max_sequence_length(model, device="A100-40GB", batch=1, multiple_of=128)["max_seq"])
    return out


def test_eight_threads_give_the_serial_answers():
    model = membudget.load_model(LLAMA_1B)
    shapes = [(b, s) for b in (1, 2, 3, 5, 8) for s in (512, 1000, 2048, 4096)]
    expected = _answers(model, shapes)
    results = [None] * 8
    errors = []

    def work(i):
        try:
            # each thread walks the shapes in its own order, with its own plans
            order = shapes[i % len(shapes):] + shapes[:i % len(shapes)]
            got = _answers(model, order)
            k = i % len(shapes)
            rot = expected[3 * k:3 * len(shapes)] + expected[:3 * k] + expected[3 * len(shapes):]
            results[i] = got == rot
        except Exception as exc:  # noqa: BLE001: reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [True] * 8


def test_long_calls_release_the_gil():
    # While one thread runs a sweep of 100,000 points (tenths of a second inside the library), the
    # main thread keeps running: with the GIL held for the whole call it could not tick at all.
    state = {"started": False, "done": False}

    def work():
        state["started"] = True
        membudget.sweep(TINY, batches=list(range(1, 1001)), seqs=list(range(1, 101)))
        state["done"] = True

    t = threading.Thread(target=work)
    t.start()
    while not state["started"]:
        time.sleep(0.0005)
    ticks = 0
    while not state["done"]:
        time.sleep(0.001)
        ticks += 1
    t.join()
    assert ticks >= 10
