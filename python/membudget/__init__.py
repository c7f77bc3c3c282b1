"""membudget: predict the GPU memory of a transformer training or serving step (docs/api.md).

The library's functions (predict, estimate, fits, max_micro_batch, max_sequence_length, sweep,
from_training_arguments, load_model, Model, Error) come from the compiled core, membudget._core.
`python -m membudget ...` runs the command line (the same code as the `membudget` executable);
`membudget.measure` runs the real PyTorch step beside the prediction and `membudget.hf` holds the
Hugging Face Trainer callback; both import torch only when they run.

Where the compiled core cannot be imported (a Python the package was not built for), the
pure-Python parts still work from a prediction made elsewhere (`measure --prediction`,
`MemoryCheckCallback(prediction=...)`); every API name then raises ImportError saying why.
"""
try:
    from ._core import *  # noqa: F401,F403  (the API: every public name of the compiled core)
    from ._core import __version__  # noqa: F401
except ImportError as _error:  # noqa: F841
    _CORE_ERROR = _error
    __version__ = "0.1.0"

    def __getattr__(name):
        if name in ("measure", "hf", "torch_step", "torch_common"):  # `from membudget import hf`
            import importlib

            return importlib.import_module("." + name, __name__)
        if name.startswith("__"):
            raise AttributeError(name)
        raise ImportError(
            "membudget's compiled core (membudget._core) is not importable here (%s); build it for this "
            "Python with `pip install .` in a checkout" % _CORE_ERROR) from _CORE_ERROR
