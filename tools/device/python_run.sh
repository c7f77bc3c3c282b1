#!/usr/bin/env bash
# tests/data/python_measure_h200.json: `python -m membudget measure` and membudget.hf's
# MemoryCheckCallback in a real Hugging Face Trainer, on two models (tools/hf_callback_run.py).
# The GPU machine's Python cannot load the compiled core built here, so the predictions are
# made here first (devbin/pred/*.json, `membudget predict --format json`) and given with
# --prediction / prediction=. Run from the repository root; writes $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=python
O=${OUT:-/tmp/out}
mkdir -p "$O"
python3 --version; python3 -c "import transformers, accelerate; print(transformers.__version__, accelerate.__version__)" 2>&1 | tail -1
python3 -c "import membudget; membudget.predict" 2>&1 | tail -1
python3 -m membudget measure configs/hf/llama-3.2-1b.json --precision bf16 --batch 1 --seq 2048 \
  --prediction devbin/pred/measure_llama-3.2-1b.json --output "$O/measure_llama-3.2-1b.json"; echo "== measure llama rc=$?"
python3 -m membudget measure configs/hf/qwen2.5-0.5b.json --precision amp-bf16 --batch 2 --seq 1024 --recompute full \
  --prediction devbin/pred/measure_qwen2.5-0.5b.json --output "$O/measure_qwen2.5-0.5b.json"; echo "== measure qwen rc=$?"
python3 -m membudget measure configs/hf/llama-3.2-1b.json --tolerance 2; echo "== bad tolerance rc=$? (2 expected)"
python3 tools/hf_callback_run.py --output "$O/trainer_callback.json" 2>&1 | grep -v "^\s*$" | tail -40; echo "== callback rc=$?"
