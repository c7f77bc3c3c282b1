// A TrainingArguments JSON as a job: trainer_args.hpp.
#include "membudget/trainer_args.hpp"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "json_input.hpp"
#include "membudget/error.hpp"

namespace membudget {
namespace {
using nlohmann::json;

Error field_error(std::string_view where, const char* field, const std::string& what, ErrorKind kind) {
  return Error(kind, std::string(where) + ": TrainingArguments." + field + ": " + what);
}

// Every field TrainingArguments.__init__ takes in transformers 5.17, as to_json_string() writes them
// (tests/data/trainer_args/defaults.json), sorted. TrainingArguments(**d) refuses any other key; so does
// membudget, since a field it does not know may change memory unseen: a misspelling, another version's
// field, or a subclass's (TRL's SFTConfig adds activation_offloading and padding_free).
constexpr std::array<std::string_view, 112> kFields = {
    "accelerator_config", "adam_beta1", "adam_beta2", "adam_epsilon", "auto_find_batch_size",
    "average_tokens_across_devices", "batch_eval_metrics", "bf16", "bf16_full_eval", "data_seed",
    "dataloader_drop_last", "dataloader_in_order", "dataloader_multiprocessing_context", "dataloader_num_workers",
    "dataloader_persistent_workers", "dataloader_pin_memory", "dataloader_prefetch_factor", "ddp_backend",
    "ddp_broadcast_buffers", "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph", "ddp_timeout",
    "debug", "deepspeed", "disable_tqdm", "do_eval", "do_predict", "do_train", "enable_jit_checkpoint",
    "eval_accumulation_steps", "eval_delay", "eval_do_concat_batches", "eval_on_start", "eval_steps", "eval_strategy",
    "eval_use_gather_object", "fp16", "fp16_full_eval", "fsdp", "fsdp_config", "full_determinism",
    "gradient_accumulation_steps", "gradient_checkpointing", "gradient_checkpointing_kwargs", "greater_is_better",
    "hub_always_push", "hub_model_id", "hub_private_repo", "hub_revision", "hub_strategy", "hub_token",
    "ignore_data_skip", "include_for_metrics", "include_num_input_tokens_seen", "label_names",
    "label_smoothing_factor", "learning_rate", "length_column_name", "liger_kernel_config", "load_best_model_at_end",
    "local_rank", "log_level", "log_level_replica", "log_on_each_node", "logging_first_step",
    "logging_nan_inf_filter", "logging_steps", "logging_strategy", "lr_scheduler_kwargs", "lr_scheduler_type",
    "max_grad_norm", "max_steps", "metric_for_best_model", "neftune_noise_alpha", "num_train_epochs", "optim",
    "optim_args", "optim_target_modules", "output_dir", "parallelism_config", "per_device_eval_batch_size",
    "per_device_train_batch_size", "prediction_loss_only", "project", "push_to_hub", "remove_unused_columns",
    "report_to", "restore_callback_states_from_checkpoint", "resume_from_checkpoint", "run_name", "save_on_each_node",
    "save_only_model", "save_steps", "save_strategy", "save_total_limit", "seed", "skip_memory_metrics", "tf32",
    "torch_compile", "torch_compile_backend", "torch_compile_mode", "torch_empty_cache_steps", "trackio_bucket_id",
    "trackio_space_id", "trackio_static_space_id", "train_sampling_strategy", "use_cache", "use_cpu",
    "use_liger_kernel", "warmup_steps", "weight_decay",
};
static_assert(std::is_sorted(kFields.begin(), kFields.end()), "unknown_fields searches kFields by bisection");

// The keys of `j` that are not TrainingArguments fields, quoted and listed with their verb ("'a', 'b'
// are not fields"); empty if none. At most ten are named, each cut at 64 characters: a file of
// garbage keys gets a message of a few lines.
std::string unknown_fields(const json& j) {
  constexpr std::size_t kNamed = 10, kKeyChars = 64;
  std::string list;
  std::size_t count = 0;
  for (const auto& [key, value] : j.items())
    if (!std::binary_search(kFields.begin(), kFields.end(), std::string_view(key)) && count++ < kNamed)
      list += (count > 1 ? ", '" : "'") + (key.size() > kKeyChars ? key.substr(0, kKeyChars) + "..." : key) + "'";
  if (count == 0) return list;
  if (count > kNamed) list += " and " + std::to_string(count - kNamed) + " more";
  return list + (count == 1 ? " is not a field" : " are not fields");
}

// A field that is absent, null, false, 0 or empty: the TrainingArguments default of "not used".
bool unset(const json& j, const char* field) {
  if (!j.contains(field)) return true;
  const json& v = j[field];
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v.get<double>() == 0) ||
         (v.is_string() && v.get<std::string>().empty()) || (v.is_array() && v.empty()) || (v.is_object() && v.empty());
}
}  // namespace

Job apply_training_arguments(Job job, std::string_view json_text, std::string_view where, JobSources* sources) {
  json j;
  try {
    j = detail::parse_json_once_per_key(json_text, std::string(where), ErrorKind::invalid_job);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::invalid_job, std::string(where) + ": not TrainingArguments JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error(ErrorKind::invalid_job, std::string(where) + ": not a TrainingArguments JSON object");
  auto refuse = [&](const char* field, const std::string& what) {
    throw field_error(where, field, what, ErrorKind::unsupported);
  };
  auto read_as = [&](const char* flag, const char* field) {
    if (sources) sources->note(flag, std::string(where), std::string("TrainingArguments.") + field);
  };
  auto boolean = [&](const char* field) {
    if (unset(j, field)) return false;
    if (!j[field].is_boolean()) throw field_error(where, field, "is not true or false", ErrorKind::invalid_job);
    return j[field].get<bool>();
  };
  if (const std::string unknown = unknown_fields(j); !unknown.empty())
    throw Error(ErrorKind::invalid_job,
                std::string(where) + ": " + unknown +
                    " of transformers 5.17's TrainingArguments (a misspelling, another version's field, or a "
                    "subclass's such as TRL's SFTConfig; membudget reads 5.17's fields and refuses others, since any "
                    "could change memory)");
  // A field the JSON leaves out takes TrainingArguments' default, as TrainingArguments(**json) does:
  // each setting below is the file's, given or not.
  if (j.contains("per_device_train_batch_size")) {
    const json& b = j["per_device_train_batch_size"];
    if (!b.is_number_unsigned() || b.get<std::uint64_t>() == 0)
      throw field_error(where, "per_device_train_batch_size", "is not a whole number ≥ 1", ErrorKind::invalid_job);
    job.batch = b.get<std::uint64_t>();
  } else {
    job.batch = 8;
  }
  read_as("--batch", "per_device_train_batch_size");
  job.grad_accum_steps = 1;
  if (j.contains("gradient_accumulation_steps") && !j["gradient_accumulation_steps"].is_null()) {
    const json& g = j["gradient_accumulation_steps"];
    if (!g.is_number_unsigned() || g.get<std::uint64_t>() == 0)
      throw field_error(where, "gradient_accumulation_steps", "is not a whole number ≥ 1", ErrorKind::invalid_job);
    job.grad_accum_steps = g.get<std::uint64_t>();
  }
  read_as("--grad-accum-steps", "gradient_accumulation_steps");
  if (boolean("fp16")) refuse("fp16", "fp16 mixed precision with a GradScaler is not modelled (bf16 is)");
  job.precision = boolean("bf16") ? Precision::amp_bf16 : Precision::fp32;
  read_as("--precision", "bf16");
  if (j.contains("optim") && !j["optim"].is_string())
    throw field_error(where, "optim", "is not a string", ErrorKind::invalid_job);
  const std::string optim = j.contains("optim") ? j["optim"].get<std::string>() : "adamw_torch_fused";
  // transformers' trainer_optimizer.py: adamw_torch is torch.optim.AdamW as constructed (foreach on
  // CUDA), adamw_torch_fused passes fused=True; sgd is torch.optim.SGD (no momentum); the 8-bit
  // names are bitsandbytes' AdamW8bit
  if (optim == "adamw_torch") job.optimizer = Optimizer::adamw, job.optimizer_impl = OptimizerImpl::foreach;
  else if (optim == "adamw_torch_fused") job.optimizer = Optimizer::adamw, job.optimizer_impl = OptimizerImpl::fused;
  else if (optim == "sgd") job.optimizer = Optimizer::sgd, job.optimizer_impl = std::nullopt;
  else if (optim == "adamw_bnb_8bit" || optim == "adamw_8bit") job.optimizer = Optimizer::adamw_8bit, job.optimizer_impl = std::nullopt;
  else
    refuse("optim", "'" + optim + "' is not modelled (adamw_torch, adamw_torch_fused, sgd, adamw_bnb_8bit are)");
  read_as("--optimizer", "optim");
  read_as("--optimizer-impl", "optim");
  job.recompute = boolean("gradient_checkpointing") ? Recompute::full : Recompute::none;
  read_as("--recompute", "gradient_checkpointing");
  if (job.recompute == Recompute::full && !unset(j, "gradient_checkpointing_kwargs")) {
    // passed to torch.utils.checkpoint as is: only use_reentrant is read, and only false is modelled
    const json& kw = j["gradient_checkpointing_kwargs"];
    if (!kw.is_object())
      throw field_error(where, "gradient_checkpointing_kwargs", "is not an object of checkpoint() arguments", ErrorKind::invalid_job);
    for (const auto& [key, value] : kw.items()) {
      if (key != "use_reentrant")
        refuse("gradient_checkpointing_kwargs", "'" + key + "' is not modelled (use_reentrant is)");
      if (!value.is_boolean())
        throw field_error(where, "gradient_checkpointing_kwargs", "use_reentrant is not true or false", ErrorKind::invalid_job);
      if (value.get<bool>())
        refuse("gradient_checkpointing_kwargs", "use_reentrant=true is not modelled (transformers' default, false, is)");
    }
  }
  for (const char* field : {"fsdp", "deepspeed", "parallelism_config"})
    if (!unset(j, field))
      refuse(field, "a sharded Trainer job: the JSON does not hold the world size; give the layout with --fsdp N / --dp N "
                    "--zero S (docs/distributed.md)");
  // torch_compile_backend and torch_compile_mode turn torch_compile on (TrainingArguments.__post_init__);
  // Liger's kernels replace the loss and the MLP's activations; auto_find_batch_size retries smaller
  // batches on an out-of-memory error, so the batch that runs is not the one given; the Trainer's
  // label smoother takes its own log_softmax of the whole logits; NEFTune's hook adds a noise tensor
  // the size of the embeddings' output; use_cache makes the model keep every layer's keys and values
  // in a cache through the forward
  for (const char* field : {"torch_compile", "torch_compile_backend", "torch_compile_mode", "use_liger_kernel",
                            "auto_find_batch_size", "use_cpu", "optim_args", "optim_target_modules", "torch_empty_cache_steps",
                            "label_smoothing_factor", "neftune_noise_alpha", "use_cache"})
    if (!unset(j, field)) refuse(field, "changes memory in a way not modelled");
  return job;
}

}  // namespace membudget
