#include "job_flags.hpp"

#include <cctype>
#include <cstdlib>
#include <iostream>

#include "membudget/api.hpp"
#include "membudget/input.hpp"
#include "membudget/job_yaml.hpp"
#include "membudget/trainer_args.hpp"

namespace membudget::cli {
namespace {
// --headroom's check, before CLI11 converts it: a decimal fraction, digits[.digits] (0.05, .1), in
// [0, 1); the problem, or "" (CLI11's validator protocol; it names the option in its error).
std::string headroom_problem(const std::string& text) {
  const std::optional<double> v = decimal_fraction(text);
  if (!v) return "'" + text + "' is not a decimal fraction such as 0.05";
  if (*v >= 1.0) return "must be in [0, 1), e.g. 0.05 for 5%";
  return "";
}
bool parse_bool(const std::string& text, const char* option) {
  if (text == "true" || text == "True" || text == "1") return true;
  if (text == "false" || text == "False" || text == "0") return false;
  throw Error(ErrorKind::invalid_job, std::string(option) + ": '" + text + "' is not true or false");
}
}  // namespace

void JobFlags::add(CLI::App* cmd, bool with_batch_seq) {
  cmd->add_option("model", model_path, "model spec: our YAML (configs/*.yaml) or a Hugging Face config.json")
      ->required();
  add_job_options(cmd, with_batch_seq);
}

void JobFlags::add_job_options(CLI::App* cmd, bool with_batch_seq) {
  if (with_batch_seq) {
    cmd->add_option("--batch,-b", batch, "micro-batch size (default 4)");
    cmd->add_option("--seq,-s", seq, "sequence length in tokens (default 4096)");
  }
  cmd->add_option("--mode", mode, "train | infer");
  cmd->add_option("--precision", precision, "fp32 | amp-bf16 (default) | bf16 | bf16-master");
  cmd->add_option("--optimizer", optimizer, "adamw (default) | sgd | sgd-momentum | adamw-8bit | adafactor | lion");
  cmd->add_option("--optimizer-impl", optimizer_impl,
                  "torch.optim implementation: foreach (default for adamw, sgd) | fused | for-loop (default for adafactor)");
  cmd->add_option("--recompute", recompute, "none (default) | selective | full");
  cmd->add_option("--attention", attention, "flash (default) | math");
  cmd->add_option("--loss", loss, "full (default) | chunked");
  cmd->add_option("--loss-chunk", loss_chunk, "tokens per chunk for --loss chunked (default 1024)");
  cmd->add_option("--activations", activations, "inventory (default) | korthikanti");
  cmd->add_option("--trainer-args", trainer_args,
                  "a Hugging Face TrainingArguments JSON file (to_json_string(); - reads standard input): batch, "
                  "precision, optim, gradient checkpointing (flags given override it)");
  cmd->add_option("--lora", lora, "LoRA rank on every decoder linear, base frozen (peft; default 0: full fine-tune)");
  cmd->add_option("--grad-accum-steps", grad_accum_steps,
                  "micro-batches per optimizer step (gradient accumulation; default 1): the first's gradients stay "
                  "through the later forwards");
  cmd->add_option("--profile", profile, "torch (default: transformers 5 on PyTorch 2.11) | harness");
  cmd->add_option("--overhead", overhead, "memory outside the allocator, e.g. 800MiB (default: docs/model.md)");
  cmd->add_option("--kv-dtype", kv_dtype, "KV cache dtype when serving: bf16 | fp16 | fp8 | int8 | fp32");
  cmd->add_option("--weights", weights, "weight precision when serving: bf16 | fp16 | fp8 | int8 | int4 | fp32");
  cmd->add_option("--group-size", group_size, "group size of int4/int8 weight scales (default 128)");
  cmd->add_option("--dp", dp, "data-parallel ranks: DistributedDataParallel, or HSDP's replicas with --fsdp (docs/distributed.md)");
  cmd->add_option("--fsdp", fsdp, "FSDP2 shard ranks: fully_shard on every decoder layer, then the root");
  cmd->add_option("--zero", zero, "ZeRO stage over --dp ranks: 1 ZeroRedundancyOptimizer, 2 FSDP2 without, 3 with reshard after forward");
  cmd->add_option("--reshard-after-forward", reshard_after_forward, "FSDP2 reshard_after_forward: true (default) | false");
  cmd->add_flag("--ddp-bucket-view", ddp_bucket_view, "DDP with gradient_as_bucket_view=True");
  cmd->add_option("--fsdp-grad-sync", fsdp_grad_sync,
                  "FSDP2 with --grad-accum-steps: every (default: each micro-batch reduce-scattered, as torchtitan) | last "
                  "(set_requires_gradient_sync(False) before the last, as accelerate 1.11+ and the Trainer)");
  cmd->add_flag("--fsdp-offload", fsdp_offload, "FSDP2's CPUOffloadPolicy: shards, gradients and optimizer state on the host (JSON: host)");
  cmd->add_option("--rank", rank, "the rank predicted (default: the most loaded one)");
  cmd->add_option("--tp", tp, "tensor-parallel ranks: DTensor's Llama plan (docs/distributed.md)");
  cmd->add_option("--ep", ep, "expert-parallel ranks: transformers' expert parallelism, experts / N per rank (docs/moe.md)");
  cmd->add_option("--pp", pp, "pipeline stages: torch.distributed.pipelining (docs/distributed.md)");
  cmd->add_option("--cp", cp, "context-parallel ranks: each runs 1/N of the sequence (ring attention), FSDP2 over --fsdp × N ranks");
  cmd->add_option("--pp-schedule", pp_schedule, "the pipeline schedule: 1f1b (default) | gpipe | interleaved (ScheduleInterleaved1F1B; give --virtual-stages)");
  cmd->add_option("--microbatches", microbatches, "micro-batches of --batch sequences per step and stage (default: as many as stages)");
  cmd->add_option("--virtual-stages", virtual_stages, "stage modules per rank of --pp-schedule interleaved (V ≥ 2; the layers split over --pp × V stages)");
  cmd->add_option("--pp-layers", pp_layers, "decoder layers per stage, e.g. 4,4,4,4 (default: an even split, the first stages taking the remainder)");
  cmd->add_flag("--sp", sp, "sequence parallelism with --tp (torchtitan's layouts: docs/distributed.md)");
  cmd->add_flag("--loss-parallel", loss_parallel, "the vocabulary-parallel loss (loss_parallel()) with --tp --sp");
  cmd->add_option("--experts", experts, "a mixture of experts' implementation: grouped_mm (default, as transformers picks on CUDA) | batched_mm | eager");
  cmd->add_option("--routing", routing, "routing assumed where a buffer depends on it: balanced (default) | worst (docs/moe.md)");
  cmd->add_flag("--router-aux-loss", router_aux_loss, "output_router_logits: the router's load-balancing loss joins the training loss");
  cmd->add_option("--device", device, "card: H100, H200, A100-40GB, A100-80GB, L40S, RTX-4090, B200, MI300X, …");
  cmd->add_option("--device-memory", device_memory, "card capacity instead of --device, e.g. 80GiB");
  // (checked here first: CLI11's number parser alone takes hex, leading spaces and denormals)
  cmd->add_option("--headroom", headroom, "fraction of the card kept free (default 0.05)")
      ->check(CLI::Validator(headroom_problem, "FRACTION", "decimal fraction"));
  cmd->add_option("--format", format, "table (default) | json | csv | markdown");
  cmd_ = cmd;
}

void JobFlags::add_explain(CLI::App* cmd) {
  cmd->add_flag("--explain", explain, "list the tensors live at each phase peak");
}

namespace {
// Every string-valued flag JobFlags holds, once: `job` marks the options of the job itself (what
// check_options_apply judges for the mode), as opposed to the card.
struct StringFlag {
  const char* name;
  std::string JobFlags::*value;
  bool job;
};
constexpr StringFlag kStringFlags[] = {
    {"--batch", &JobFlags::batch, true},           {"--seq", &JobFlags::seq, true},
    {"--mode", &JobFlags::mode, true},             {"--precision", &JobFlags::precision, true},
    {"--optimizer", &JobFlags::optimizer, true},   {"--recompute", &JobFlags::recompute, true},
    {"--attention", &JobFlags::attention, true},   {"--loss", &JobFlags::loss, true},
    {"--loss-chunk", &JobFlags::loss_chunk, true}, {"--activations", &JobFlags::activations, true},
    {"--lora", &JobFlags::lora, true},             {"--profile", &JobFlags::profile, true},
    {"--grad-accum-steps", &JobFlags::grad_accum_steps, true},
    {"--overhead", &JobFlags::overhead, true},     {"--kv-dtype", &JobFlags::kv_dtype, true},
    {"--weights", &JobFlags::weights, true},       {"--group-size", &JobFlags::group_size, true},
    {"--optimizer-impl", &JobFlags::optimizer_impl, true}, {"--allocator-conf", &JobFlags::allocator_conf, true},
    {"--trainer-args", &JobFlags::trainer_args, true},
    {"--dp", &JobFlags::dp, true},                 {"--fsdp", &JobFlags::fsdp, true},
    {"--zero", &JobFlags::zero, true},             {"--reshard-after-forward", &JobFlags::reshard_after_forward, true},
    {"--rank", &JobFlags::rank, true},             {"--tp", &JobFlags::tp, true},
    {"--pp", &JobFlags::pp, true},                 {"--experts", &JobFlags::experts, true},
    {"--cp", &JobFlags::cp, true},                 {"--ep", &JobFlags::ep, true},
    {"--pp-schedule", &JobFlags::pp_schedule, true}, {"--microbatches", &JobFlags::microbatches, true},
    {"--fsdp-grad-sync", &JobFlags::fsdp_grad_sync, true},
    {"--virtual-stages", &JobFlags::virtual_stages, true}, {"--pp-layers", &JobFlags::pp_layers, true},
    {"--routing", &JobFlags::routing, true},
    {"--device", &JobFlags::device, false},        {"--device-memory", &JobFlags::device_memory, false},
};
}  // namespace

bool JobFlags::given(const std::string& flag) const {
  if (cmd_) {
    const CLI::Option* o = cmd_->get_option_no_throw(flag);
    return o && o->count() > 0;
  }
  for (const StringFlag& f : kStringFlags)
    if (flag == f.name) return !(this->*f.value).empty();
  return false;
}

std::vector<std::string> JobFlags::given_job_flags() const {
  std::vector<std::string> out;
  for (const StringFlag& f : kStringFlags)
    if (f.job && given(f.name)) out.push_back(f.name);
  if (ddp_bucket_view) out.push_back("--ddp-bucket-view");
  if (sp) out.push_back("--sp");
  if (loss_parallel) out.push_back("--loss-parallel");
  if (fsdp_offload) out.push_back("--fsdp-offload");
  if (router_aux_loss) out.push_back("--router-aux-loss");
  return out;
}

std::optional<double> decimal_fraction(const std::string& text) {
  const std::size_t dot = text.find('.');
  const std::string whole = text.substr(0, dot), fraction = dot == std::string::npos ? "" : text.substr(dot + 1);
  const bool digits_only = whole.find_first_not_of("0123456789") == std::string::npos &&
                           fraction.find_first_not_of("0123456789") == std::string::npos;
  if (!digits_only || whole.size() + fraction.size() == 0 || text.size() > 32) return std::nullopt;
  return std::strtod(text.c_str(), nullptr);
}

std::uint64_t parse_whole(const std::string& text, const char* option, std::uint64_t min, std::uint64_t max) {
  try {
    return parse_count(text, option, min, max);
  } catch (const Error& e) {  // a flag of a command, not of the job
    throw Error(ErrorKind::invalid_argument, e.what());
  }
}

void refuse_given(const CLI::App& cmd, std::initializer_list<const char*> flags, const std::string& why) {
  for (const char* f : flags) {
    const CLI::Option* o = cmd.get_option_no_throw(f);
    if (o && o->count() > 0) throw Error(ErrorKind::invalid_argument, std::string(f) + ": " + why);
  }
}

void JobFlags::add_allocator_conf(CLI::App* cmd) {
  cmd->add_option("--allocator-conf", allocator_conf,
                  "PYTORCH_CUDA_ALLOC_CONF of the job, e.g. expandable_segments:True,max_split_size_mb:512 "
                  "(reserved memory follows it)");
}

const std::string& JobFlags::spec_text() const {
  if (!spec_file_ || spec_file_->first != model_path)
    spec_file_.emplace(model_path, read_spec_file(model_path));
  return spec_file_->second;
}

const std::string& JobFlags::trainer_args_text() const {
  // "-" is standard input (a script's `print(args.to_json_string())` piped in), as for oom
  constexpr std::string_view kWhat = "TrainingArguments JSON";
  if (!trainer_args_file_ || trainer_args_file_->first != trainer_args)
    trainer_args_file_.emplace(trainer_args, trainer_args == "-"
                                                 ? read_input_stream(std::cin, limits::kMaxTrainerArgsBytes, kWhat, "standard input")
                                                 : read_input_file(trainer_args, limits::kMaxTrainerArgsBytes, kWhat));
  return trainer_args_file_->second;
}

ModelSpec JobFlags::model() const { return parse_model(spec_text(), model_path); }

Job JobFlags::job(const ModelSpec& spec, bool warn, bool validate) const {
  // Where each setting not given as a flag was read, for the checks' messages (job_sources.hpp).
  JobSources sources;
  // A check's error, located where the setting it names was read.
  auto located = [&sources](auto&& check) {
    try {
      check();
    } catch (const Error& e) {
      throw sources.locate(e);
    }
  };
  Job j = parse_job_section(spec_text(), model_path, Job{}, &sources);
  // The section's own settings apply to the job it describes (its loss_chunk needs its loss
  // chunked; its mode infer reads no precision); flags given below may then override any of them.
  located([&] { check_options_apply(j, sources.flags()); });
  if (!trainer_args.empty())  // after the spec's job: section, before the flags
    j = apply_training_arguments(j, trainer_args_text(), trainer_args == "-" ? "standard input" : trainer_args, &sources);
  if (!batch.empty()) j.batch = parse_count(batch, "--batch");
  if (!seq.empty()) j.seq = parse_count(seq, "--seq");
  if (!mode.empty()) j.mode = parse_mode(mode);
  if (!precision.empty()) j.precision = parse_precision(precision);
  if (!optimizer.empty()) {
    const Optimizer given = parse_optimizer(optimizer);
    // an implementation read with another optimizer (the job: section, TrainingArguments' optim)
    // was that one's: the flag's optimizer takes its own default unless --optimizer-impl is given
    if (given != j.optimizer) j.optimizer_impl.reset();
    j.optimizer = given;
  }
  if (!optimizer_impl.empty()) j.optimizer_impl = parse_optimizer_impl(optimizer_impl);
  if (!recompute.empty()) j.recompute = parse_recompute(recompute);
  if (!attention.empty()) j.attention = parse_attention(attention);
  if (!loss.empty()) j.loss = parse_loss(loss);
  if (!loss_chunk.empty()) j.loss_chunk = parse_count(loss_chunk, "--loss-chunk");
  if (!activations.empty()) j.activations = parse_activation_model(activations);
  if (!profile.empty()) j.profile = parse_profile(profile);
  if (!overhead.empty()) j.overhead = parse_bytes(overhead, "--overhead");
  if (!kv_dtype.empty()) j.kv_dtype = parse_kv_dtype(kv_dtype);
  if (!weights.empty()) j.weights = parse_dtype(weights, "--weights");
  if (!group_size.empty()) j.group_size = parse_count(group_size, "--group-size");
  if (!lora.empty()) j.lora_rank = lora == "0" ? 0 : parse_count(lora, "--lora");
  if (!grad_accum_steps.empty()) j.grad_accum_steps = parse_count(grad_accum_steps, "--grad-accum-steps");
  Parallelism& p = j.parallel;
  if (!dp.empty()) p.data = parse_count(dp, "--dp");
  if (!fsdp.empty()) p.fsdp = parse_count(fsdp, "--fsdp");
  if (!tp.empty()) p.tensor = parse_count(tp, "--tp");
  if (!pp.empty()) p.pipeline = parse_count(pp, "--pp");
  if (!cp.empty()) p.context = parse_count(cp, "--cp");
  if (!ep.empty()) p.expert = parse_count(ep, "--ep");
  const std::pair<const char*, const std::string*> pipeline_keys[] = {
      {"pp-schedule", &pp_schedule}, {"microbatches", &microbatches}, {"virtual-stages", &virtual_stages}, {"pp-layers", &pp_layers},
      {"fsdp-grad-sync", &fsdp_grad_sync}};
  for (const auto& [key, value] : pipeline_keys)
    if (!value->empty()) set_parallel_option(j, key, *value, std::string("--") + key);
  if (!zero.empty()) {
    if (zero.size() != 1 || zero[0] < '0' || zero[0] > '3')
      throw Error(ErrorKind::invalid_job, "--zero: '" + zero + "' is not one of 0, 1, 2, 3");
    p.zero_stage = zero[0] - '0';
  }
  if (!reshard_after_forward.empty()) p.reshard_after_forward = parse_bool(reshard_after_forward, "--reshard-after-forward");
  if (ddp_bucket_view) p.ddp_bucket_view = true;
  if (sp) p.sequence_parallel = true;
  if (loss_parallel) p.loss_parallel = true;
  if (fsdp_offload) p.fsdp_offload = true;
  if (!rank.empty()) p.rank = parse_whole(rank, "--rank", 0, (1ull << 20) - 1);
  if (!experts.empty()) j.experts = parse_experts_impl(experts);
  if (!routing.empty()) j.routing = parse_routing(routing);
  if (router_aux_loss) j.router_aux_loss = true;
  const std::vector<std::string> flags = given_job_flags();
  for (const std::string& flag : flags) sources.given_as_flag(flag);
  if (validate)
    located([&] {
      j.validate();
      check_options_apply(j, flags);
      check_options_apply_to(spec, j);
    });
  if (warn) {
    warn_beyond_context(spec, j.seq);
    warn_unmeasured_accumulation(j);
  }
  return j;
}

// Gradient accumulation on a DDP, ZeRO-1, TP or FSDP2 rank is walked with mechanisms measured
// elsewhere (a pipeline's no_sync() and FSDP2 microbatches, single-GPU accumulation), and its
// predictions are committed (tests/data/grad_accum/predicted_ddp.json, predicted_fsdp.json), but no
// such rank has been measured yet: the answer says so.
void warn_unmeasured_accumulation(const Job& j) {
  if (j.mode != Mode::train || j.grad_accum_steps <= 1 || j.parallel.single()) return;
  std::cerr << "membudget: note: --grad-accum-steps on a parallel layout's rank is predicted, not yet measured (one "
               "GPU's is, within 0.02%: docs/accuracy.md, \"Gradient accumulation\")\n";
}

void warn_beyond_context(const ModelSpec& spec, std::uint64_t seq) {
  if (seq <= spec.max_positions) return;
  std::cerr << "membudget: warning: --seq " << seq << " exceeds " << (spec.name.empty() ? "the model" : printable(spec.name))
            << "'s max_positions (" << spec.max_positions
            << "); the memory is predicted as if the model ran at that length (RoPE scaling, a longer context)\n";
}

std::optional<Device> JobFlags::device_choice() const {
  // (an empty --device or --device-memory never gets here: tools/cli_main.cpp refuses every empty value)
  if (!device.empty() && !device_memory.empty())
    throw Error(ErrorKind::invalid_argument, "--device and --device-memory: give one, not both");
  if (device.empty() && device_memory.empty() && cmd_ && cmd_->count("--headroom"))
    throw Error(ErrorKind::invalid_argument, "--headroom: applies only with --device or --device-memory");
  if (!device_memory.empty()) return Device{"custom (" + device_memory + ")", parse_bytes(device_memory, "--device-memory")};
  if (!device.empty()) return find_device(device);
  return std::nullopt;
}

}  // namespace membudget::cli
