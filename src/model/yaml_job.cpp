// yaml_job.cpp: the `job:` mapping of a YAML spec applied over a job (keys in job_yaml.hpp).
// One of the two translation units that use yaml-cpp (with yaml_spec.cpp).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <optional>
#include <set>

#include "job_yaml_internal.hpp"
#include "yaml_number.hpp"
#include "membudget/input.hpp"

namespace membudget::detail {

Job apply_yaml_job_section(std::string_view text, const std::string& path, Job job, JobSources* sources) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw Error(ErrorKind::parse, path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!root.IsMap()) return job;
  // root["job"] would take the first of two job: sections and drop the other silently.
  std::optional<YAML::Node> section;
  for (const auto& kv : root) {
    if (!kv.first.IsScalar() || kv.first.Scalar() != "job") continue;
    if (section)
      throw Error(ErrorKind::invalid_job, path + ":" + std::to_string(kv.first.Mark().line + 1) +
                                              ": job: a second job section; give one");
    section = kv.second;
  }
  if (!section) return job;
  const YAML::Node j = *section;
  if (!j.IsMap()) throw Error(ErrorKind::invalid_job, path + ":" + std::to_string(j.Mark().line + 1) + ": job: must be a mapping");
  std::set<std::string> seen;
  for (const auto& kv : j) {
    if (!kv.first.IsScalar())
      throw Error(ErrorKind::invalid_job, path + ":" + std::to_string(kv.first.Mark().line + 1) + ": job: keys must be plain names");
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    const std::string line = path + ":" + std::to_string(v.Mark().line + 1);
    const std::string where = line + ": job." + key;
    if (!seen.insert(key).second) throw Error(ErrorKind::invalid_job, where + ": duplicate key; give each key once");
    auto text_of = [&]() {
      if (!v.IsScalar()) throw Error(ErrorKind::invalid_job, where + ": must be a scalar");
      return v.as<std::string>();
    };
    auto count_of = [&]() -> std::uint64_t {
      // written as the spec's own counts are (yaml_number.hpp)
      if (v.IsScalar() && !yaml_number_scalar(v, false))
        throw Error(ErrorKind::invalid_job, where + ": expected a whole number, got '" + v.Scalar() + "' " +
                                                (v.Tag() == "!" ? "quoted" : "tagged " + v.Tag()));
      const std::string s = text_of();
      if (const std::string zero = yaml_leading_zero_problem(s); !zero.empty()) throw Error(ErrorKind::invalid_job, where + ": " + zero);
      return parse_count(s, where);
    };
    try {
      if (key == "parallel") {  // job.parallel: {dp: 8, fsdp: 1, zero: 1, ...}
        if (!v.IsMap()) throw Error(ErrorKind::invalid_job, where + ": must be a mapping (dp, fsdp, zero, ...)");
        std::set<std::string> pseen;
        for (const auto& pk : v) {
          const std::string pkey = pk.first.IsScalar() ? pk.first.Scalar() : "";
          const std::string pline = path + ":" + std::to_string(pk.second.Mark().line + 1);
          const std::string pwhere = pline + ": job.parallel." + pkey;
          if (!pseen.insert(pkey).second) throw Error(ErrorKind::invalid_job, pwhere + ": duplicate key; give each key once");
          if (!pk.second.IsScalar()) throw Error(ErrorKind::invalid_job, pwhere + ": must be a scalar");
          if (!set_parallel_option(job, pkey, pk.second.Scalar(), pwhere))
            throw Error(ErrorKind::invalid_job, pwhere + ": unknown key (known: dp, fsdp, zero, reshard_after_forward, "
                                                         "ddp_bucket_view, rank, tp, pp, cp, ep, sp, ...)");
          if (sources) sources->note(parallel_flag(pkey), pline, "job.parallel." + pkey);
        }
        continue;
      }
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
      else if (key == "grad_accum_steps") job.grad_accum_steps = count_of();
      else if (set_moe_option(job, key, text_of(), where)) {
      } else
        throw Error(ErrorKind::invalid_job, where + ": unknown job key (known: batch, seq, mode, precision, optimizer, "
                                                    "optimizer_impl, recompute, attention, loss, loss_chunk, activations, profile, overhead, "
                                                    "lora, grad_accum_steps, experts, routing, router_aux_loss, parallel)");
    } catch (const YAML::Exception& e) {
      throw Error(ErrorKind::invalid_job, where + ": " + e.msg);
    }
    if (sources) {  // the key's command-line flag: the key with dashes
      sources->note("--" + dashed(key), line, "job." + key);
    }
  }
  return job;
}

}  // namespace membudget::detail
