#!/usr/bin/env python3
"""Write the JSON that transformers' TrainingArguments.to_json_string() gives for a few typical
fine-tuning setups (tests/data/trainer_args/*.json): the field names and defaults of the installed
transformers, for membudget's --trainer-args to be tested against.

    python3 tools/trainer_args_fixtures.py OUTDIR
"""
import os
import sys

from transformers import TrainingArguments

SETUPS = {
    "defaults": {},
    "bf16_fused_checkpointing": {"per_device_train_batch_size": 4, "bf16": True, "optim": "adamw_torch_fused",
                                 "gradient_checkpointing": True},
    "fp16_adamw_torch": {"per_device_train_batch_size": 2, "fp16": True, "optim": "adamw_torch"},
    "bf16_adamw_8bit_accumulation": {"per_device_train_batch_size": 8, "bf16": True, "optim": "adamw_bnb_8bit",
                                     "gradient_accumulation_steps": 4},
    "bf16_sgd": {"per_device_train_batch_size": 1, "bf16": True, "optim": "sgd"},
    "fsdp_full_shard": {"per_device_train_batch_size": 2, "bf16": True, "fsdp": "full_shard auto_wrap"},
}


def main(out):
    os.makedirs(out, exist_ok=True)
    for name, kw in SETUPS.items():
        try:
            args = TrainingArguments(output_dir="/tmp/membudget_trainer_args", report_to=[], **kw)
            text = args.to_json_string()
        except Exception as e:  # e.g. fp16 without a GPU; bitsandbytes not installed
            text = None
            print(name, "failed:", type(e).__name__, e)
        if text:
            with open(os.path.join(out, name + ".json"), "w") as f:
                f.write(text)
            print(name, "ok")


if __name__ == "__main__":
    main(sys.argv[1])
