// A TrainingArguments JSON as a job: trainer_args.hpp.
#include "membudget/trainer_args.hpp"

#include <nlohmann/json.hpp>
#include <string>

#include "json_input.hpp"
#include "membudget/error.hpp"

namespace membudget {
namespace {
using nlohmann::json;

Error field_error(std::string_view where, const char* field, const std::string& what, ErrorKind kind) {
  return Error(kind, std::string(where) + ": TrainingArguments." + field + ": " + what);
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
  if (j.contains("per_device_train_batch_size")) {
    const json& b = j["per_device_train_batch_size"];
    if (!b.is_number_unsigned() || b.get<std::uint64_t>() == 0)
      throw field_error(where, "per_device_train_batch_size", "is not a whole number ≥ 1", ErrorKind::invalid_job);
    job.batch = b.get<std::uint64_t>();
    read_as("--batch", "per_device_train_batch_size");
  }
  if (j.contains("gradient_accumulation_steps") && !j["gradient_accumulation_steps"].is_null()) {
    const json& g = j["gradient_accumulation_steps"];
    if (!g.is_number_unsigned() || g.get<std::uint64_t>() == 0)
      throw field_error(where, "gradient_accumulation_steps", "is not a whole number ≥ 1", ErrorKind::invalid_job);
    if (g.get<std::uint64_t>() > 1)
      refuse("gradient_accumulation_steps", std::to_string(g.get<std::uint64_t>()) +
                                                ": the gradients stay allocated between the micro-batches of an "
                                                "accumulation; not modelled yet (1 is)");
  }
  if (boolean("fp16")) refuse("fp16", "fp16 mixed precision with a GradScaler is not modelled (bf16 is)");
  if (j.contains("bf16") || j.contains("fp16")) {
    job.precision = boolean("bf16") ? Precision::amp_bf16 : Precision::fp32;
    read_as("--precision", j.contains("bf16") ? "bf16" : "fp16");
  }
  if (j.contains("optim") && !j["optim"].is_null()) {
    if (!j["optim"].is_string()) throw field_error(where, "optim", "is not a string", ErrorKind::invalid_job);
    const std::string o = j["optim"].get<std::string>();
    // transformers' trainer_optimizer.py: adamw_torch is torch.optim.AdamW as constructed (foreach on
    // CUDA), adamw_torch_fused passes fused=True; sgd is torch.optim.SGD (no momentum); the 8-bit
    // names are bitsandbytes' AdamW8bit
    if (o == "adamw_torch") job.optimizer = Optimizer::adamw, job.optimizer_impl = OptimizerImpl::foreach;
    else if (o == "adamw_torch_fused") job.optimizer = Optimizer::adamw, job.optimizer_impl = OptimizerImpl::fused;
    else if (o == "sgd") job.optimizer = Optimizer::sgd, job.optimizer_impl = std::nullopt;
    else if (o == "adamw_bnb_8bit" || o == "adamw_8bit") job.optimizer = Optimizer::adamw_8bit, job.optimizer_impl = std::nullopt;
    else
      refuse("optim", "'" + o + "' is not modelled (adamw_torch, adamw_torch_fused, sgd, adamw_bnb_8bit are; transformers' "
                                "own adafactor differs from torch.optim's)");
    read_as("--optimizer", "optim");
    read_as("--optimizer-impl", "optim");
  }
  if (boolean("gradient_checkpointing")) {
    job.recompute = Recompute::full;
    read_as("--recompute", "gradient_checkpointing");
    if (!unset(j, "gradient_checkpointing_kwargs")) {
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
  }
  for (const char* field : {"fsdp", "deepspeed"})
    if (!unset(j, field))
      refuse(field, "a sharded Trainer job: the JSON does not hold the world size; give the layout with --fsdp N / --dp N "
                    "--zero S (docs/distributed.md)");
  // torch_compile_backend and torch_compile_mode turn torch_compile on (TrainingArguments.__post_init__);
  // Liger's kernels replace the loss and the MLP's activations; auto_find_batch_size retries smaller
  // batches on an out-of-memory error, so the batch that runs is not the one given
  for (const char* field : {"torch_compile", "torch_compile_backend", "torch_compile_mode", "use_liger_kernel",
                            "auto_find_batch_size", "use_cpu", "optim_args", "optim_target_modules", "torch_empty_cache_steps"})
    if (!unset(j, field)) refuse(field, "changes memory in a way not modelled");
  return job;
}

}  // namespace membudget
