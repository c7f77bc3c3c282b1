"""Shared helpers for the PyTorch ground-truth scripts (tools/torch_*.py).

Builds Hugging Face causal LMs from a config.json with random weights (no download),
reads the CUDA caching allocator, records versions, and writes JSON atomically.
"""
from __future__ import annotations

import gc
import json
import os
import platform
import socket
import time

MIB = 1024.0 * 1024.0

PRECISIONS = ("fp32", "amp-bf16", "bf16")
ATTENTION_IMPL = {"flash": "sdpa", "sdpa": "sdpa", "math": "eager", "eager": "eager"}


def resolve_path(path: str, *bases: str) -> str:
    """Returns `path` if it exists, else the first `base/path` that exists, else `path`."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    for base in bases:
        if not base:
            continue
        cand = os.path.join(base, path)
        if os.path.exists(cand):
            return cand
    return path


def load_config_dict(path: str, overrides: dict | None = None) -> dict:
    with open(path) as f:
        d = json.load(f)
    if overrides:
        d.update(overrides)
    return d


def make_config(d: dict):
    """A transformers config object from a config.json dict."""
    import transformers

    d = dict(d)
    model_type = d.pop("model_type")
    d.pop("transformers_version", None)
    try:
        return transformers.AutoConfig.for_model(model_type, **d)
    except Exception:  # pragma: no cover - fallback for other transformers versions
        from transformers import CONFIG_MAPPING

        return CONFIG_MAPPING[model_type](**d)


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
            "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}[name]


def build_causal_lm(cfg, dtype, attn_implementation: str, device: str = "cuda"):
    """AutoModelForCausalLM.from_config with random weights, built directly on `device`.

    The dtype is always passed explicitly: transformers otherwise uses the config's
    torch_dtype (bfloat16 in every configs/hf file).
    """
    import torch
    from transformers import AutoModelForCausalLM

    errors = []
    model = None
    for dev_ctx in (device, None):
        for kw in ({"dtype": dtype}, {"torch_dtype": dtype}):
            try:
                if dev_ctx is not None:
                    with torch.device(dev_ctx):
                        model = AutoModelForCausalLM.from_config(
                            cfg, attn_implementation=attn_implementation, **kw)
                else:
                    model = AutoModelForCausalLM.from_config(
                        cfg, attn_implementation=attn_implementation, **kw)
                break
            except TypeError as e:  # unknown keyword: try the other spelling
                errors.append(repr(e))
                model = None
            except Exception as e:  # building on the device failed: retry on CPU
                errors.append(repr(e))
                model = None
                break
        if model is not None:
            break
    if model is None:
        raise RuntimeError("could not build model: " + " | ".join(errors))
    model.to(device=device)
    if any(p.dtype != dtype for p in model.parameters() if p.is_floating_point()):
        model.to(dtype=dtype)
    return model


def param_stats(model) -> dict:
    params = list(model.parameters())  # de-duplicated (tied weights counted once)
    n = sum(p.numel() for p in params)
    nbytes = sum(p.numel() * p.element_size() for p in params)
    bufs = list(model.buffers())
    return {
        "parameters": n,
        "parameter_bytes": nbytes,
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "parameter_tensors": len(params),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in bufs),
        "param_dtypes": sorted({str(p.dtype) for p in params}),
        "tied_word_embeddings": _tied(model),
        # transformers 5 chooses how MoE experts run (grouped_mm, batched_mm, eager)
        "experts_implementation": getattr(getattr(model, "config", None), "_experts_implementation", None),
    }


def _tied(model):
    try:
        out = model.get_output_embeddings()
        inp = model.get_input_embeddings()
        if out is None or inp is None:
            return None
        return out.weight.data_ptr() == inp.weight.data_ptr()
    except Exception:
        return None


def env_info() -> dict:
    import torch

    info = {
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": None,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    try:
        info["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception as e:
        info["transformers"] = "unavailable: %r" % (e,)
    try:
        import accelerate

        info["accelerate"] = accelerate.__version__
    except Exception:
        info["accelerate"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        info.update({
            "gpu_name": p.name,
            "gpu_total_memory": p.total_memory,
            "gpu_total_memory_mem_get_info": total,
            "gpu_free_memory_at_start": free,
            "gpu_capability": "%d.%d" % (p.major, p.minor),
            "gpu_multiprocessors": p.multi_processor_count,
        })
        try:
            info["driver"] = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
        except Exception:
            pass
    return info


def sync():
    import torch

    torch.cuda.synchronize()


def allocator_reading() -> dict:
    """memory_allocated / reserved / outside-the-allocator and retry counters, now."""
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    stats = torch.cuda.memory_stats()
    return {
        "allocated": torch.cuda.memory_allocated(),
        "reserved": reserved,
        "max_reserved": torch.cuda.max_memory_reserved(),
        "device_used": total - free,
        "outside": (total - free) - reserved,
        "num_alloc_retries": stats.get("num_alloc_retries", 0),
        "num_ooms": stats.get("num_ooms", 0),
    }


def clean_cuda():
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def write_json(path: str, obj) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def mib(x) -> str:
    return "%.1f" % (x / MIB) if isinstance(x, (int, float)) else str(x)
