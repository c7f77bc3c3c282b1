// membudget/trainer_args.hpp: a Hugging Face TrainingArguments (its to_json_string() JSON) as a job.
#pragma once

#include <string>
#include <string_view>

#include "membudget/job.hpp"
#include "membudget/job_sources.hpp"

namespace membudget {

// Sets the memory-relevant settings of `base` from a TrainingArguments JSON (transformers 5.17's
// field names), a field the JSON leaves out taking TrainingArguments' default as
// TrainingArguments(**json) does: per_device_train_batch_size (8) → batch; bf16 → amp-bf16 (fp32
// parameters under autocast, as the Trainer runs a model loaded in fp32), neither bf16 nor fp16 (the
// default) → fp32; optim (adamw_torch_fused) adamw_torch / adamw_torch_fused / sgd / adamw_bnb_8bit
// (adamw_8bit) → --optimizer and --optimizer-impl; gradient_checkpointing (false) → --recompute full
// (non-reentrant, transformers' default) or none; gradient_accumulation_steps (1) → --grad-accum-steps. A key that is not a 5.17 field is an error, as in
// TrainingArguments(**json). Fields that change memory in a way not modelled are errors naming the
// field: fp16, fsdp, deepspeed and parallelism_config (the world size
// is not in the JSON: give --fsdp N), torch_compile, use_cpu, optim_args, optim_target_modules,
// torch_empty_cache_steps, label_smoothing_factor, neftune_noise_alpha, use_cache, use_reentrant true,
// any other optim. The sequence length is not a TrainingArguments field. `where` names the source in
// messages (a file name); `sources`, when given, records the fields read as the settings they set
// (the CLI's messages name them: job_sources.hpp).
Job apply_training_arguments(Job base, std::string_view json_text, std::string_view where, JobSources* sources = nullptr);

}  // namespace membudget
