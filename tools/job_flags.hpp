// tools/job_flags.hpp: the job flags shared by predict, verify, max-batch, sweep, advise, serve.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "membudget/budget.hpp"
#include "membudget/report.hpp"

namespace membudget::cli {

struct JobFlags {
  std::string model_path;
  std::string batch, seq, mode, precision, optimizer, recompute, attention, loss, loss_chunk, activations, profile;
  std::string overhead, kv_dtype, weights, group_size, lora;
  std::string device, device_memory;
  double headroom = 0.05;
  std::string format = "table";
  bool explain = false;
  std::string allocator_conf;  // --allocator-conf (PYTORCH_CUDA_ALLOC_CONF syntax)

  // Adds the model argument and every job flag to `cmd`.
  void add(CLI::App* cmd, bool with_batch_seq = true);
  // The job flags without the model argument (for commands where the model is optional).
  void add_job_options(CLI::App* cmd, bool with_batch_seq = true);
  // --allocator-conf (predict: the reserved-memory replay follows it).
  void add_allocator_conf(CLI::App* cmd);
  // The model spec and the job: YAML `job:` section first, then the flags that were given.
  ModelSpec model() const;
  // Warns on stderr when the sequence exceeds the model's max_positions (warn_beyond_context).
  Job job(const ModelSpec& spec, bool warn = true) const;
  std::optional<Device> device_choice() const;
};

// A sequence beyond the model's max_positions is predicted (memory does not care whether the
// positions were trained); the CLI says so on stderr.
void warn_beyond_context(const ModelSpec& spec, std::uint64_t seq);

}  // namespace membudget::cli
