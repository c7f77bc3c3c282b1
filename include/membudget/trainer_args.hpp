// membudget/trainer_args.hpp: a Hugging Face TrainingArguments (its to_json_string() JSON) as a job.
#pragma once

#include <string>
#include <string_view>

#include "membudget/job.hpp"
#include "membudget/job_sources.hpp"

namespace membudget {

// Applies the memory-relevant fields of a TrainingArguments JSON (transformers 5.17's field names)
// over `base`: per_device_train_batch_size → batch; bf16 → amp-bf16 (fp32 parameters under
// autocast, as the Trainer runs a model loaded in fp32), neither bf16 nor fp16 → fp32; optim
// adamw_torch / adamw_torch_fused / sgd / adamw_bnb_8bit (adamw_8bit) → --optimizer and
// --optimizer-impl; gradient_checkpointing → --recompute full (non-reentrant, transformers'
// default). Fields that change memory in a way not modelled are errors naming the field:
// gradient_accumulation_steps > 1, fp16, fsdp and deepspeed (the world size is not in the JSON:
// give --fsdp N), torch_compile, use_cpu, optim_args, optim_target_modules, torch_empty_cache_steps,
// use_reentrant true, any other optim. The sequence length is not a TrainingArguments field.
// `where` names the source in messages (a file name); `sources`, when given, records the fields
// read as the settings they set (the CLI's messages name them: job_sources.hpp).
Job apply_training_arguments(Job base, std::string_view json_text, std::string_view where, JobSources* sources = nullptr);

}  // namespace membudget
