"""The Python module: predict, estimate, fits, max_micro_batch, sweep, errors."""
import json
import os
import subprocess

import pytest

import membudget

SRC = os.environ.get("MEMBUDGET_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
LLAMA_1B = os.path.join(SRC, "configs", "llama-3.2-1b.yaml")


def test_predict_is_the_cli_json():
    d = membudget.predict(LLAMA_1B, batch=2, seq=2048, precision="bf16")
    assert isinstance(d, dict)
    assert d["job"]["batch"] == 2 and d["job"]["precision"] == "bf16"
    cli = os.environ.get("MEMBUDGET_CLI")
    if cli:
        out = subprocess.run([cli, "predict", LLAMA_1B, "--batch", "2", "--seq", "2048", "--precision", "bf16",
                              "--format", "json"], capture_output=True, text=True, check=True).stdout
        assert json.loads(out)["peak"] == d["peak"]


def test_estimate_matches_predict():
    m = membudget.load_model(LLAMA_1B)
    assert m.num_layers == 16 and m.parameters == 1235814400
    e = membudget.estimate(m, batch=4, seq=4096)
    assert e["peak"] == membudget.predict(m, batch=4, seq=4096)["peak"]
    assert e["required"] == e["peak"] + e["overhead"]
    assert set(e["phases"]) == {"floor", "forward_peak", "backward_peak", "optimizer_peak"}


def test_optimizer_impl():
    d = {impl: membudget.predict(LLAMA_1B, batch=1, seq=512, optimizer_impl=impl)
         for impl in ("foreach", "fused", "for-loop")}
    assert {k: v["job"]["optimizer_impl"] for k, v in d.items()} == {k: k for k in d}
    opt = {k: v["phases"]["optimizer_peak"] for k, v in d.items()}
    assert opt["foreach"] > opt["for-loop"] > opt["fused"]
    assert membudget.predict(LLAMA_1B, optimizer="adafactor")["job"]["optimizer_impl"] == "for-loop"
    with pytest.raises(Exception):
        membudget.predict(LLAMA_1B, optimizer="adafactor", optimizer_impl="fused")


def test_mixture_of_experts_keys():
    qwen3 = os.path.join(SRC, "tests", "data", "hf", "moe", "qwen3-30b-a3b.json")
    d = {impl: membudget.predict(qwen3, batch=1, seq=256, precision="bf16", experts=impl)
         for impl in ("grouped_mm", "batched_mm", "eager")}
    assert {k: v["job"]["experts"] for k, v in d.items()} == {k: k for k in d}
    assert d["batched_mm"]["peak"] > d["grouped_mm"]["peak"]
    aux = membudget.predict(qwen3, batch=1, seq=256, precision="bf16", router_aux_loss="true", routing="worst")
    assert aux["job"]["router_aux_loss"] is True and aux["job"]["routing"] == "worst"
    assert d["grouped_mm"]["model"]["active_parameters"] < d["grouped_mm"]["model"]["parameters"]
    with pytest.raises(Exception, match="has no mixture of experts"):
        membudget.predict(LLAMA_1B, experts="eager")
    # expert parallelism: a rank holds 1/8 of the packed experts, the rest replicated
    ep = membudget.predict(qwen3, batch=1, seq=256, precision="bf16", expert_parallel=8, rank=3)
    assert ep["job"]["parallel"]["ep"] == 8 and ep["job"]["parallel"]["rank"] == 3
    assert ep["breakdown"]["model_states"]["weights"] < d["grouped_mm"]["breakdown"]["model_states"]["weights"]
    with pytest.raises(membudget.Error, match="not divisible by 3"):
        membudget.predict(qwen3, batch=1, seq=256, ep=3)


def test_fits_and_max_micro_batch():
    assert membudget.fits(LLAMA_1B, device="H100", batch=4)["fits"]
    assert not membudget.fits(LLAMA_1B, capacity=1 << 30)["fits"]  # a result, not an error
    r = membudget.max_micro_batch(LLAMA_1B, device="H100", seq=2048, global_batch=64)
    b = r["max_micro_batch"]
    assert b > 0
    assert membudget.fits(LLAMA_1B, device="H100", seq=2048, batch=b)["fits"]
    assert not membudget.fits(LLAMA_1B, device="H100", seq=2048, batch=b + 1)["fits"]
    assert r["accum_micro_batch"] * r["grad_accum_steps"] == 64
    assert membudget.max_micro_batch(LLAMA_1B, capacity=1 << 30)["max_micro_batch"] == 0


def test_max_sequence_length_and_sweep():
    r = membudget.max_sequence_length(LLAMA_1B, device="A100-40GB", multiple_of=256, batch=1)
    assert r["max_seq"] % 256 == 0 and r["max_seq"] > 0
    # 10^6 tokens is beyond the model's max_positions (predicted, flagged); 5*10^9 tokens is
    # beyond 2^32 (an invalid point).
    pts = membudget.sweep(LLAMA_1B, batches=[1, 2], seqs=[1024, 10 ** 6, 5 * 10 ** 9], precisions=["bf16"],
                          device="H100")
    assert len(pts) == 6
    assert [p["ok"] for p in pts] == [True, True, True, True, False, False]
    assert [p.get("beyond_max_positions") for p in pts[:4]] == [False, False, True, True]
    assert not pts[2]["fits"] and pts[3]["required"] > pts[2]["required"]
    assert "absurdly large" in pts[4]["error"]
    assert all(p["basis"] == "allocated" for p in pts[:4])


def test_fits_and_max_micro_batch_on_reserved_memory():
    at2 = membudget.predict(LLAMA_1B, batch=2, seq=2048, precision="bf16")
    between = (at2["peak"] + at2["reserved_peak"]) // 2 + at2["terms"]["overhead"]
    capacity = int(between / 0.95) + 1
    on_allocated = membudget.fits(LLAMA_1B, capacity=capacity, batch=2, seq=2048, precision="bf16")
    on_reserved = membudget.fits(LLAMA_1B, capacity=capacity, batch=2, seq=2048, precision="bf16", reserved=True)
    assert on_allocated["fits"] and on_allocated["basis"] == "allocated"
    assert not on_reserved["fits"] and on_reserved["basis"] == "reserved"
    assert on_reserved["required"] == at2["nvidia_smi"]
    a = membudget.max_micro_batch(LLAMA_1B, capacity=capacity, seq=2048, precision="bf16")
    r = membudget.max_micro_batch(LLAMA_1B, capacity=capacity, seq=2048, precision="bf16", reserved=True)
    assert a["max_micro_batch"] >= 2 > r["max_micro_batch"] and r["basis"] == "reserved"


def test_sweep_on_reserved_memory():
    # a card between batch 2's allocated and reserved figures: the reserved decision is stricter
    at2 = membudget.predict(LLAMA_1B, batch=2, seq=2048, precision="bf16")
    between = (at2["peak"] + at2["reserved_peak"]) // 2 + at2["terms"]["overhead"]
    capacity = int(between / 0.95) + 1
    kw = dict(batches=[1, 2, 3], seqs=[2048], precisions=["bf16"], capacity=capacity)
    allocated = membudget.sweep(LLAMA_1B, **kw)
    reserved = membudget.sweep(LLAMA_1B, reserved=True, **kw)
    assert [p["basis"] for p in reserved] == ["reserved"] * 3
    assert allocated[1]["fits"] and not reserved[1]["fits"]
    assert reserved[1]["reserved_required"] == at2["nvidia_smi"]


def test_errors_are_typed():
    with pytest.raises(membudget.Error, match="--precision"):
        membudget.predict(LLAMA_1B, precision="fp64")
    with pytest.raises(ValueError):
        membudget.predict(LLAMA_1B, batch=0)
    with pytest.raises(membudget.Error, match="unknown job option"):
        membudget.estimate(LLAMA_1B, bacth=2)
    with pytest.raises(membudget.Error):
        membudget.load_model("/nonexistent.yaml")
    with pytest.raises(membudget.Error, match="unknown card"):
        membudget.fits(LLAMA_1B, device="no-such-card")


def test_parallel_settings_not_modelled_are_unsupported_not_unsharded():
    for kw, named in [({"tensor_parallel": 2, "data_parallel": 2}, "--tp 2 with --dp"),
                      ({"pp": 4, "tensor_parallel": 2, "sequence_parallel": True}, "--pp 4 with --sp"),
                      ({"pp": 4}, "--pp with --precision amp-bf16"),
                      ({"tensor_parallel": 4, "sequence_parallel": True, "seq": 1022}, "not divisible"),
                      ({"tensor_parallel": 4, "loss_parallel": True, "loss": "chunked"}, "--loss-parallel with --loss chunked"),
                      ({"context_parallel": 2, "tensor_parallel": 2, "precision": "bf16"}, "--cp 2 with --tp")]:
        with pytest.raises(membudget.Error, match=named):
            membudget.predict(LLAMA_1B, **kw)
        with pytest.raises(membudget.Error, match=named):
            membudget.estimate(LLAMA_1B, **kw)
    # data parallelism is predicted per rank: ZeRO-3 over 8 ranks holds less than one GPU
    one = membudget.predict(LLAMA_1B, batch=1, seq=1024)
    z3 = membudget.predict(LLAMA_1B, batch=1, seq=1024, data_parallel=8, zero_stage=3)
    assert z3["peak"] < one["peak"]
    assert membudget.predict(LLAMA_1B, batch=1, seq=1024, fsdp=8, reshard_after_forward=False)["peak"] > z3["peak"]
    # sequence parallelism and the vocabulary-parallel loss: less than tensor parallelism alone
    tp = membudget.predict(LLAMA_1B, batch=1, seq=2048, precision="bf16", tensor_parallel=4)
    sp = membudget.predict(LLAMA_1B, batch=1, seq=2048, precision="bf16", tensor_parallel=4, sequence_parallel=True)
    lp = membudget.predict(LLAMA_1B, batch=1, seq=2048, precision="bf16", tensor_parallel=4, sequence_parallel=True,
                           loss_parallel=True)
    assert lp["peak"] < sp["peak"] < tp["peak"]
    assert sp["job"]["parallel"]["sp"] and lp["job"]["parallel"]["loss_parallel"]
    # the vocabulary-parallel loss without SP: the logits a vocabulary shard, the embedding whole
    lp_alone = membudget.predict(LLAMA_1B, batch=1, seq=2048, precision="bf16", tensor_parallel=4, loss_parallel=True)
    assert lp_alone["peak"] < tp["peak"]
    assert lp_alone["terms"]["logits_loss"] * 4 == tp["terms"]["logits_loss"]
    # context parallelism: FSDP2 over the cp ranks, a quarter of the sequence each
    cp = membudget.predict(LLAMA_1B, batch=1, seq=8192, precision="bf16", context_parallel=4)
    fsdp = membudget.predict(LLAMA_1B, batch=1, seq=2048, precision="bf16", fsdp=4)
    assert cp["job"]["parallel"]["cp"] == 4 and cp["job"]["parallel"]["world"] == 4
    assert cp["terms"]["logits_loss"] == fsdp["terms"]["logits_loss"]
    assert cp["peak"] > fsdp["peak"]  # ring attention's output copies
    # a pipeline stage: the keys of --pp-schedule, --microbatches, --pp-layers; the last stage holds lm_head
    kw = dict(batch=1, seq=1024, precision="bf16", pp=2, pp_schedule="gpipe", microbatches=4)
    first = membudget.predict(LLAMA_1B, rank=0, **kw)
    last = membudget.predict(LLAMA_1B, rank=1, **kw)
    assert first["stage"]["embedding"] and not first["stage"]["lm_head"]
    assert last["stage"] == {"first_layer": 8, "layers": 8, "embedding": False, "lm_head": True}
    assert membudget.predict(LLAMA_1B, **kw)["peak"] == max(first["peak"], last["peak"])  # the most loaded stage
    uneven = membudget.predict(LLAMA_1B, rank=0, pp_layers="10,6", **kw)
    assert uneven["stage"]["layers"] == 10 and uneven["peak"] > first["peak"]
    # max_micro_batch's data_parallel divides the global batch; it is not a job setting
    r = membudget.max_micro_batch(LLAMA_1B, device="H100", seq=2048, global_batch=64, data_parallel=8)
    assert r["accum_micro_batch"] * r["grad_accum_steps"] * 8 == 64


def test_from_training_arguments_maps_what_transformers_writes():
    import json
    import os
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "trainer_args")
    with open(os.path.join(here, "bf16_fused_checkpointing.json")) as f:
        text = f.read()
    kw = membudget.from_training_arguments(LLAMA_1B, text)
    assert kw == {"batch": 4, "precision": "amp-bf16", "optimizer": "adamw", "optimizer_impl": "fused",
                  "recompute": "full"}
    assert membudget.from_training_arguments(LLAMA_1B, json.loads(text)) == kw  # its dict works too

    class Args:  # anything with to_json_string(), as TrainingArguments has
        def to_json_string(self):
            return text
    assert membudget.from_training_arguments(LLAMA_1B, Args()) == kw
    b = membudget.predict(LLAMA_1B, seq=1024, **kw)
    assert b["job"]["recompute"] == "full" and b["job"]["batch"] == 4
    with open(os.path.join(here, "bf16_adamw_8bit_accumulation.json")) as f:
        accumulated = membudget.from_training_arguments(LLAMA_1B, f.read())
    assert accumulated["grad_accum_steps"] == 4 and accumulated["optimizer"] == "adamw-8bit"
    one = membudget.predict(LLAMA_1B, seq=1024, **dict(accumulated, grad_accum_steps=1))
    assert membudget.predict(LLAMA_1B, seq=1024, **accumulated)["peak"] > one["peak"]
    with open(os.path.join(here, "fp16_adamw_torch.json")) as f:
        with pytest.raises(membudget.Error, match="fp16"):
            membudget.from_training_arguments(LLAMA_1B, f.read())
    with pytest.raises(membudget.Error):
        membudget.from_training_arguments(LLAMA_1B, 42)
