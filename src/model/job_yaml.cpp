#include "membudget/job_yaml.hpp"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

namespace membudget {

Job load_job_section(const std::string& path, Job job) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::io, path + ": cannot read the model spec");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] == '{') return job;  // JSON: no job section
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(ErrorKind::parse, path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!root.IsMap() || !root["job"]) return job;
  const YAML::Node j = root["job"];
  if (!j.IsMap()) throw Error(ErrorKind::invalid_job, path + ":" + std::to_string(j.Mark().line + 1) + ": job: must be a mapping");
  for (const auto& kv : j) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    const std::string where = path + ":" + std::to_string(v.Mark().line + 1) + ": job." + key;
    auto text_of = [&]() {
      if (!v.IsScalar()) throw Error(ErrorKind::invalid_job, where + ": must be a scalar");
      return v.as<std::string>();
    };
    auto count_of = [&]() -> std::uint64_t {
      const std::string s = text_of();
      if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos)
        throw Error(ErrorKind::invalid_job, where + ": '" + s + "' is not a positive integer");
      return std::stoull(s);
    };
    try {
      if (key == "batch") job.batch = count_of();
      else if (key == "seq") job.seq = count_of();
      else if (key == "mode") job.mode = parse_mode(text_of(), where);
      else if (key == "precision") job.precision = parse_precision(text_of(), where);
      else if (key == "optimizer") job.optimizer = parse_optimizer(text_of(), where);
      else if (key == "optimizer_impl") job.optimizer_impl = parse_optimizer_impl(text_of(), where);
      else if (key == "recompute") job.recompute = parse_recompute(text_of(), where);
      else if (key == "attention") job.attention = parse_attention(text_of(), where);
      else if (key == "loss") job.loss = parse_loss(text_of(), where);
      else if (key == "loss_chunk") job.loss_chunk = count_of();
      else if (key == "activations") job.activations = parse_activation_model(text_of(), where);
      else if (key == "profile") job.profile = parse_profile(text_of(), where);
      else if (key == "overhead") job.overhead = parse_bytes(text_of(), where);
      else if (key == "lora") job.lora_rank = count_of();
      else
        throw Error(ErrorKind::invalid_job, where + ": unknown job key (known: batch, seq, mode, precision, optimizer, "
                                                    "optimizer_impl, recompute, attention, loss, loss_chunk, activations, profile, overhead, "
                                                    "lora)");
    } catch (const YAML::Exception& e) {
      throw Error(ErrorKind::invalid_job, where + ": " + e.msg);
    }
  }
  return job;
}

}  // namespace membudget
