// The model a committed measurement ran: its config.json with the run's overrides (a reduced
// depth, fewer experts, the MoE auxiliary loss), as tools/torch_profile_step.py applied them.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "helpers.hpp"
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

}  // namespace test
