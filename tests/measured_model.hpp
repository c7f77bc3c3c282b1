// What a committed measurement ran: the model (its config.json with the run's overrides: a reduced
// depth, fewer experts, the MoE auxiliary loss), a single-GPU step's job, and the allocator
// settings of the measuring process, as tools/torch_profile_*.py recorded them.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "helpers.hpp"
#include "membudget/job.hpp"
#include "membudget/spec.hpp"

namespace test {

inline membudget::ModelSpec model_as_measured(const nlohmann::json& job) {
  const std::string config = job["config"].get<std::string>();
  if (!job.contains("overrides") || !job["overrides"].is_object()) return membudget::load_model(source_path(config));
  std::ifstream in(source_path(config));
  auto parsed = nlohmann::json::parse(in);
  for (const auto& [key, value] : job["overrides"].items()) parsed[key] = value;
  return membudget::parse_hf_config(parsed.dump(), config);
}

// A single-GPU step's job as torch_profile_step.py ran it ("adamw-fused": AdamW(fused=True)).
inline membudget::Job job_as_measured(const nlohmann::json& j) {
  using namespace membudget;
  Job job;
  job.batch = j["batch"].get<std::uint64_t>();
  job.seq = j["seq"].get<std::uint64_t>();
  job.precision = parse_precision(j["precision"].get<std::string>());
  const std::string opt = j["optimizer"].get<std::string>();
  job.optimizer = parse_optimizer(opt == "adamw-fused" ? "adamw" : opt);
  if (opt == "adamw-fused") job.optimizer_impl = OptimizerImpl::fused;
  if (j.contains("optimizer_impl") && !j["optimizer_impl"].is_null())
    job.optimizer_impl = parse_optimizer_impl(j["optimizer_impl"].get<std::string>());
  job.recompute = parse_recompute(j["recompute"].get<std::string>());
  job.attention = parse_attention(j["attention"].get<std::string>());
  if (j.contains("experts_implementation") && !j["experts_implementation"].is_null())
    job.experts = parse_experts_impl(j["experts_implementation"].get<std::string>());
  if (j.contains("lora") && !j["lora"].is_null()) job.lora_rank = j["lora"].get<std::uint64_t>();
  if (j.contains("grad_accum") && !j["grad_accum"].is_null()) job.grad_accum_steps = j["grad_accum"].get<std::uint64_t>();
  return job;
}

// The measuring process's PYTORCH_CUDA_ALLOC_CONF ("" for c10's defaults), from a data file's env.
inline std::string allocator_conf_as_measured(const nlohmann::json& data) {
  if (data.contains("env") && data["env"].value("PYTORCH_CUDA_ALLOC_CONF", nlohmann::json()).is_string())
    return data["env"]["PYTORCH_CUDA_ALLOC_CONF"].get<std::string>();
  return "";
}

}  // namespace test
