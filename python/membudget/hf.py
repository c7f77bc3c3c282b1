"""membudget.hf: a Hugging Face Trainer callback that holds a training run to its prediction.

    from membudget.hf import MemoryCheckCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[MemoryCheckCallback(tolerance=0.02)])

Before the first step's forward runs, the callback predicts the step (membudget.predict of the
model's config, the TrainingArguments through membudget.from_training_arguments, and the batch
and sequence of the first batch the model sees), or takes `prediction`, a `membudget predict
--format json` made elsewhere. During training it reads the caching allocator around each phase
of each step as membudget measures them (floor at the forward's start; forward_peak, backward_peak
and optimizer_peak as the peak of each phase) and compares the steady steps (from the third on)
with the prediction: a phase more than `tolerance` above it is logged as a warning, and with
action="stop" the training stops there. `readings` keeps every step's figures. Under
gradient_accumulation_steps the step is all its micro-batches (predicted with them): the floor is
read at the first one's forward, and forward_peak and backward_peak are the highest over them.

This module imports without torch and transformers; the callback class is made when first asked
for, and says so clearly when transformers is missing.
"""
from __future__ import annotations

import json
import logging

PHASES = ("floor", "forward_peak", "backward_peak", "optimizer_peak")
logger = logging.getLogger("membudget")


def predict_trainer_step(config_json, training_args_json, batch, seq, attn_implementation="sdpa",
                         parameter_dtype="float32"):
    """membudget.predict of the step a Trainer runs: the model's config (its to_json_string()), the
    TrainingArguments (to_json_string(), a dict or the JSON) through from_training_arguments, the
    first batch's shape, the attention the model runs (eager is the math path) and the dtype its
    parameters were loaded in (bfloat16: pure bf16, whatever bf16= says, as no fp32 master exists)."""
    import membudget

    model = membudget.Model.from_config_json(config_json)
    job = membudget.from_training_arguments(model, training_args_json)
    if parameter_dtype in ("bfloat16", "torch.bfloat16"):
        job["precision"] = "bf16"
    job.update(batch=batch, seq=seq, attention="math" if attn_implementation == "eager" else "flash")
    return membudget.predict(model, **job)


def _make_callback_class():
    try:
        from transformers import TrainerCallback
    except ImportError as e:
        raise ImportError("membudget.hf.MemoryCheckCallback needs transformers (pip install transformers): %s" % e) from e

    class MemoryCheckCallback(TrainerCallback):
        """Predicts the step before it runs, then checks every steady step's phases against it."""

        def __init__(self, tolerance=0.02, action="warn", prediction=None, steady_from=2):
            if action not in ("warn", "stop"):
                raise ValueError("MemoryCheckCallback: action is 'warn' or 'stop', not %r" % (action,))
            if not 0 < tolerance < 1:
                raise ValueError("MemoryCheckCallback: tolerance must be in (0, 1), e.g. 0.02")
            self.tolerance = tolerance
            self.action = action
            self.prediction = prediction
            self.steady_from = steady_from
            self.readings = []      # one dict per step: floor, forward_peak, backward_peak, optimizer_peak
            self.violations = []    # (step, phase, measured, predicted)
            self._args = None
            self._current = None
            self._hooks = []
            self._stop = False

        # ---- the Trainer's events ----
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self._args = args
            if model is not None:
                self._hooks.append(model.register_forward_pre_hook(self._forward_begins, with_kwargs=True))
                self._hooks.append(model.register_forward_hook(self._forward_ends))

        def on_step_begin(self, args, state, control, **kwargs):
            import torch

            torch.cuda.synchronize()
            self._current = {"step": len(self.readings)}

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self._read("backward_peak")

        def on_optimizer_step(self, args, state, control, **kwargs):
            self._read("optimizer_peak")

        def on_step_end(self, args, state, control, **kwargs):
            if self._current is not None:
                self.readings.append(self._current)
                self._check(self._current)
                self._current = None
            if self._stop:
                control.should_training_stop = True
            return control

        def on_train_end(self, args, state, control, **kwargs):
            for h in self._hooks:
                h.remove()
            self._hooks = []

        # ---- the model's forward, where the phases begin ----
        def _forward_begins(self, module, args, kwargs):
            import torch

            if self._current is None or not module.training or not torch.is_grad_enabled():
                return None  # evaluation, or a forward outside a training step
            if self.prediction is None:
                self.prediction = self._predict(module, args, kwargs)
            if "floor" in self._current:  # a later micro-batch: what ran since was the last one's backward
                self._read("backward_peak")
                return None
            torch.cuda.synchronize()
            self._current["floor"] = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            return None

        def _forward_ends(self, module, args, output):
            if self._current is not None and "floor" in self._current:
                self._read("forward_peak")

        def _read(self, phase):
            """The peak since the last reading, as `phase` (the highest of the step's readings of it)."""
            import torch

            if self._current is None:
                return
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            self._current[phase] = max(peak, self._current.get(phase, 0))
            torch.cuda.reset_peak_memory_stats()

        def _predict(self, module, args, kwargs):
            ids = kwargs.get("input_ids") if kwargs else None
            if ids is None and args:
                ids = args[0]
            if ids is None:
                raise ValueError("MemoryCheckCallback: the model was called without input_ids; pass prediction=")
            prediction = predict_trainer_step(
                module.config.to_json_string(), self._args.to_json_string(), int(ids.shape[0]), int(ids.shape[1]),
                getattr(module.config, "_attn_implementation", "sdpa"), str(next(module.parameters()).dtype))
            logger.info("membudget: predicted %s", json.dumps(prediction["phases"]))
            return prediction

        def _check(self, reading):
            if reading["step"] < self.steady_from or self.prediction is None:
                return
            for phase in PHASES:
                got, want = reading.get(phase), self.prediction["phases"][phase]
                if got is None or got <= want * (1 + self.tolerance):
                    continue
                self.violations.append((reading["step"], phase, got, want))
                logger.warning("membudget: step %d %s measured %.1f MiB, %.2f%% above the predicted %.1f MiB",
                               reading["step"], phase, got / 2**20, 100 * (got - want) / want, want / 2**20)
                if self.action == "stop":
                    self._stop = True

    return MemoryCheckCallback


def __getattr__(name):
    if name == "MemoryCheckCallback":
        cls = _make_callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
