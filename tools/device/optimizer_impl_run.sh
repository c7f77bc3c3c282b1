#!/usr/bin/env bash
# tests/data/torch_train_optimizer_impl_h200.json: every torch.optim implementation (foreach,
# fused, for-loop) of AdamW, SGD (with and without momentum) and Adafactor on Llama 3.2 1B and
# Qwen2.5 1.5B (tools/matrices/optimizer_impl_h200.json), plus the optimizer sources of the torch
# and the TrainingArguments of the transformers that ran them (torch_optim_src.tgz), to cite.
# Run from a folder holding tools/ and configs/; writes into $OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O"
t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 - "$O" <<'PY'
import os, sys, tarfile, torch, transformers, torch.optim as o
import transformers.training_args as ta
print("torch", torch.__version__, "transformers", transformers.__version__)
d = os.path.dirname(o.__file__)
with tarfile.open(os.path.join(sys.argv[1], "torch_optim_src.tgz"), "w:gz") as t:
    for f in ("adam.py", "adamw.py", "sgd.py", "_adafactor.py", "optimizer.py"):
        t.add(os.path.join(d, f), arcname="torch-%s/optim/%s" % (torch.__version__, f))
    t.add(ta.__file__, arcname="transformers-%s/training_args.py" % transformers.__version__)
PY
timeout 280 python3 tools/torch_profile_step.py --matrix tools/matrices/optimizer_impl_h200.json \
  --max-seconds 250 --output "$O/torch_train_optimizer_impl_h200.json"
echo "== optimizer impl rc=$? t=$(( $(date +%s)-t0 ))s"
ls -la "$O"
