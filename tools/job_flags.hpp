// tools/job_flags.hpp: the job flags shared by predict, verify, max-batch, sweep, advise, serve.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "membudget/budget.hpp"
#include "membudget/report.hpp"

namespace membudget::cli {

struct JobFlags {
  std::string model_path;
  std::string batch, seq, mode, precision, optimizer, optimizer_impl, recompute, attention, loss, loss_chunk, activations, profile;
  std::string overhead, kv_dtype, weights, group_size, lora, grad_accum_steps, fsdp_grad_sync;
  std::string device, device_memory;
  double headroom = 0.05;
  std::string format = "table";
  bool explain = false;
  std::string allocator_conf;  // --allocator-conf (PYTORCH_CUDA_ALLOC_CONF syntax)
  std::string trainer_args;    // --trainer-args: a Hugging Face TrainingArguments JSON (trainer_args.hpp)
  // the parallel layout (docs/distributed.md)
  std::string dp, fsdp, zero, reshard_after_forward, rank, tp, pp, cp, ep, pp_schedule, microbatches, virtual_stages, pp_layers;
  bool ddp_bucket_view = false, sp = false, loss_parallel = false, fsdp_offload = false;
  // mixture of experts (docs/moe.md)
  std::string experts, routing;
  bool router_aux_loss = false;

  // Adds the model argument and every job flag to `cmd`.
  void add(CLI::App* cmd, bool with_batch_seq = true);
  // The job flags without the model argument (for commands where the model is optional).
  void add_job_options(CLI::App* cmd, bool with_batch_seq = true);
  // --allocator-conf (predict: the reserved-memory replay follows it).
  void add_allocator_conf(CLI::App* cmd);
  // --explain (predict only).
  void add_explain(CLI::App* cmd);
  // The model spec and the job: YAML `job:` section first, then the flags that were given. A flag
  // the job's mode does not use is refused (check_options_apply), naming the flag and the mode.
  ModelSpec model() const;
  // Warns on stderr when the sequence exceeds the model's max_positions (warn_beyond_context).
  // `validate` false: the values are parsed (a malformed one is refused) but the job's checks are
  // left to its caller (sweep checks each point with its own layout).
  Job job(const ModelSpec& spec, bool warn = true, bool validate = true) const;
  // The card of --device or --device-memory; an empty value is refused, and so is --headroom
  // without a card (nothing would read it).
  std::optional<Device> device_choice() const;
  // Whether `flag` ("--lora") was given on the command line (for JobFlags filled by hand: whether
  // its value is set).
  bool given(const std::string& flag) const;
  // The job flags that were given, by name ("--batch", …).
  std::vector<std::string> given_job_flags() const;

 private:
  // The spec's bytes, read once for the model and its job: section both (a pipe or a FIFO given as
  // the spec cannot be read twice: the second read found nothing, or blocked).
  const std::string& spec_text() const;
  // The --trainer-args JSON's bytes, read once likewise (standard input for "-").
  const std::string& trainer_args_text() const;
  const CLI::App* cmd_ = nullptr;  // the subcommand holding the flags, once added
  mutable std::optional<std::pair<std::string, std::string>> spec_file_;  // (path, bytes)
  mutable std::optional<std::pair<std::string, std::string>> trainer_args_file_;
};

// A whole number from `min` to `max` written in plain digits, or Error(invalid_argument) naming
// `option` and the range: CLI11 would read "-1" as 2^64 - 1 for an unsigned option.
std::uint64_t parse_whole(const std::string& text, const char* option, std::uint64_t min, std::uint64_t max);
// A fraction as the options that take one write it: decimal digits with at most one point (0.05, .9,
// 1), nothing else (no sign, exponent, hex, spaces); nullopt otherwise. --headroom and
// serve --gpu-memory-utilization read theirs with it.
std::optional<double> decimal_fraction(const std::string& text);

// Error(invalid_argument) when one of `flags` was given to `cmd`: "<flag>: <why>".
void refuse_given(const CLI::App& cmd, std::initializer_list<const char*> flags, const std::string& why);

// A sequence beyond the model's max_positions is predicted (memory does not care whether the
// positions were trained); the CLI says so on stderr.
void warn_beyond_context(const ModelSpec& spec, std::uint64_t seq);
// Notes on stderr that gradient accumulation on a parallel layout's rank is not yet measured.
void warn_unmeasured_accumulation(const Job& j);

}  // namespace membudget::cli
