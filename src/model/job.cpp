// Job options: names, parsing, validation, and the device table.
#include <algorithm>
#include <array>
#include <cctype>
#include <initializer_list>
#include <string>
#include <utility>

#include "membudget/bytes.hpp"
#include "membudget/input.hpp"
#include "membudget/job.hpp"

namespace membudget {
namespace {

template <typename E, std::size_t N>
using NameTable = std::array<std::pair<E, const char*>, N>;

constexpr NameTable<Mode, 2> kModes{{{Mode::train, "train"}, {Mode::infer, "infer"}}};
constexpr NameTable<Precision, 4> kPrecisions{{{Precision::fp32, "fp32"},
                                               {Precision::amp_bf16, "amp-bf16"},
                                               {Precision::bf16, "bf16"},
                                               {Precision::bf16_master, "bf16-master"}}};
constexpr NameTable<Optimizer, 6> kOptimizers{{{Optimizer::adamw, "adamw"},
                                               {Optimizer::sgd, "sgd"},
                                               {Optimizer::sgd_momentum, "sgd-momentum"},
                                               {Optimizer::adamw_8bit, "adamw-8bit"},
                                               {Optimizer::adafactor, "adafactor"},
                                               {Optimizer::lion, "lion"}}};
constexpr NameTable<OptimizerImpl, 3> kOptimizerImpls{{{OptimizerImpl::foreach, "foreach"},
                                                       {OptimizerImpl::fused, "fused"},
                                                       {OptimizerImpl::for_loop, "for-loop"}}};
constexpr NameTable<ExpertsImpl, 3> kExpertsImpls{{{ExpertsImpl::grouped_mm, "grouped_mm"},
                                                   {ExpertsImpl::batched_mm, "batched_mm"},
                                                   {ExpertsImpl::eager, "eager"}}};
constexpr NameTable<Routing, 2> kRoutings{{{Routing::balanced, "balanced"}, {Routing::worst, "worst"}}};
constexpr NameTable<PipelineSchedule, 3> kPipelineSchedules{{{PipelineSchedule::gpipe, "gpipe"},
                                                             {PipelineSchedule::one_f_one_b, "1f1b"},
                                                             {PipelineSchedule::interleaved, "interleaved"}}};
constexpr NameTable<Recompute, 3> kRecomputes{
    {{Recompute::none, "none"}, {Recompute::selective, "selective"}, {Recompute::full, "full"}}};
constexpr NameTable<Attention, 2> kAttentions{{{Attention::flash, "flash"}, {Attention::math, "math"}}};
constexpr NameTable<Loss, 2> kLosses{{{Loss::full, "full"}, {Loss::chunked, "chunked"}}};
constexpr NameTable<ActivationModel, 2> kActivationModels{
    {{ActivationModel::korthikanti, "korthikanti"}, {ActivationModel::inventory, "inventory"}}};
constexpr NameTable<Profile, 2> kProfiles{{{Profile::torch, "torch"}, {Profile::harness, "harness"}}};
constexpr NameTable<DType, 6> kDTypes{{{DType::fp32, "fp32"},
                                       {DType::bf16, "bf16"},
                                       {DType::fp16, "fp16"},
                                       {DType::fp8, "fp8"},
                                       {DType::int8, "int8"},
                                       {DType::int4, "int4"}}};

template <typename E, std::size_t N>
const char* name_of(const NameTable<E, N>& table, E value) noexcept {
  for (const auto& [v, n] : table)
    if (v == value) return n;
  return "?";  // a number cast to the enum (Job::validate refuses it: named)
}
// Whether `value` is one of the enum's named values (a C++ caller can cast any number to it).
template <typename E, std::size_t N>
bool named(const NameTable<E, N>& table, E value) noexcept {
  return std::any_of(table.begin(), table.end(), [value](const auto& entry) { return entry.first == value; });
}

std::string lower(std::string_view s) {
  std::string out = dashed(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

template <typename E, std::size_t N>
E parse_in(const NameTable<E, N>& table, std::string_view text, std::string_view option) {
  const std::string key = lower(text);
  for (const auto& [v, n] : table)
    if (key == lower(n)) return v;  // "grouped_mm" and "grouped-mm" alike, as for every name
  std::string accepted;
  for (const auto& [v, n] : table) accepted += (accepted.empty() ? "" : ", ") + std::string(n);
  throw Error(ErrorKind::invalid_job, std::string(option) + ": '" + std::string(text) +
                                          "' is not one of " + accepted);
}

}  // namespace

const char* to_string(Mode v) noexcept { return name_of(kModes, v); }
const char* to_string(Precision v) noexcept { return name_of(kPrecisions, v); }
const char* to_string(Optimizer v) noexcept { return name_of(kOptimizers, v); }
const char* to_string(OptimizerImpl v) noexcept { return name_of(kOptimizerImpls, v); }
const char* to_string(Recompute v) noexcept { return name_of(kRecomputes, v); }
const char* to_string(Attention v) noexcept { return name_of(kAttentions, v); }
const char* to_string(Loss v) noexcept { return name_of(kLosses, v); }
const char* to_string(ActivationModel v) noexcept { return name_of(kActivationModels, v); }
const char* to_string(Profile v) noexcept { return name_of(kProfiles, v); }
const char* to_string(DType v) noexcept { return name_of(kDTypes, v); }
const char* to_string(ExpertsImpl v) noexcept { return name_of(kExpertsImpls, v); }
const char* to_string(Routing v) noexcept { return name_of(kRoutings, v); }
ExpertsImpl parse_experts_impl(std::string_view s, std::string_view o) { return parse_in(kExpertsImpls, s, o); }
Routing parse_routing(std::string_view s, std::string_view o) { return parse_in(kRoutings, s, o); }
const char* to_string(PipelineSchedule v) noexcept { return name_of(kPipelineSchedules, v); }
PipelineSchedule parse_pipeline_schedule(std::string_view s, std::string_view o) { return parse_in(kPipelineSchedules, s, o); }

Mode parse_mode(std::string_view s, std::string_view o) { return parse_in(kModes, s, o); }
Precision parse_precision(std::string_view s, std::string_view o) { return parse_in(kPrecisions, s, o); }
Optimizer parse_optimizer(std::string_view s, std::string_view o) { return parse_in(kOptimizers, s, o); }
OptimizerImpl parse_optimizer_impl(std::string_view s, std::string_view o) { return parse_in(kOptimizerImpls, s, o); }

std::optional<OptimizerImpl> effective_optimizer_impl(const Job& job) noexcept {
  if (job.optimizer_impl) return job.optimizer_impl;
  if (job.profile == Profile::harness) return OptimizerImpl::fused;
  switch (job.optimizer) {
    case Optimizer::adamw:
    case Optimizer::sgd:
    case Optimizer::sgd_momentum: return OptimizerImpl::foreach;
    case Optimizer::adafactor: return OptimizerImpl::for_loop;
    case Optimizer::adamw_8bit:
    case Optimizer::lion: return std::nullopt;
  }
  return std::nullopt;
}
Recompute parse_recompute(std::string_view s, std::string_view o) { return parse_in(kRecomputes, s, o); }
Attention parse_attention(std::string_view s, std::string_view o) { return parse_in(kAttentions, s, o); }
Loss parse_loss(std::string_view s, std::string_view o) { return parse_in(kLosses, s, o); }
ActivationModel parse_activation_model(std::string_view s, std::string_view o) {
  return parse_in(kActivationModels, s, o);
}
Profile parse_profile(std::string_view s, std::string_view o) {
  if (lower(s) == "hf" || lower(s) == "transformers") return Profile::torch;
  return parse_in(kProfiles, s, o);
}
// The spellings torch and Hugging Face configs use for the dtypes, beside membudget's own names.
std::optional<DType> dtype_alias(const std::string& lowered) {
  if (lowered == "bfloat16") return DType::bf16;
  if (lowered == "float16" || lowered == "half") return DType::fp16;
  if (lowered == "float32") return DType::fp32;
  if (lowered == "fp8-e4m3" || lowered == "fp8-e5m2") return DType::fp8;
  return std::nullopt;
}
// A KV cache is stored in one of these: int4 is a weight format only.
constexpr NameTable<DType, 5> kKvDTypes{
    {{DType::fp32, "fp32"}, {DType::bf16, "bf16"}, {DType::fp16, "fp16"}, {DType::fp8, "fp8"}, {DType::int8, "int8"}}};

DType parse_dtype(std::string_view s, std::string_view o) {
  if (const auto alias = dtype_alias(lower(s))) return *alias;
  return parse_in(kDTypes, s, o);
}
DType parse_kv_dtype(std::string_view s, std::string_view o) {
  const std::string k = lower(s);
  if (const auto alias = dtype_alias(k)) return *alias;
  if (k == "int4") require_kv_dtype(DType::int4, o);  // named, rather than listed as unknown
  return parse_in(kKvDTypes, s, o);
}
void require_kv_dtype(DType d, std::string_view o) {
  if (named(kKvDTypes, d)) return;
  throw Error(ErrorKind::invalid_job, std::string(o) + ": " + name_of(kDTypes, d) +
                                          " is not a KV cache dtype; use fp32, bf16, fp16, fp8 or int8");
}

Recipe recipe_of(Precision p) noexcept {
  using D = DType;
  switch (p) {
    case Precision::fp32: return {D::fp32, D::fp32, D::fp32, false, D::fp32, D::fp32, false};
    case Precision::amp_bf16: return {D::fp32, D::fp32, D::fp32, false, D::bf16, D::fp32, true};
    case Precision::bf16: return {D::bf16, D::bf16, D::bf16, false, D::bf16, D::bf16, false};
    case Precision::bf16_master: return {D::bf16, D::bf16, D::fp32, true, D::bf16, D::bf16, false};
  }
  return {D::fp32, D::fp32, D::fp32, false, D::bf16, D::fp32, true};
}

double dtype_bytes(DType d) noexcept {
  switch (d) {
    case DType::fp32: return 4;
    case DType::bf16:
    case DType::fp16: return 2;
    case DType::fp8:
    case DType::int8: return 1;
    case DType::int4: return 0.5;
  }
  return 2;
}

namespace {
// A product of rank counts, saturating at 2^64 − 1 (0 where a count is 0). Factor by factor: six
// counts a C++ caller set near 2^64 overflow even 128 bits, and a wrapped product could pass
// validate's limit.
std::uint64_t saturating_product(std::initializer_list<std::uint64_t> counts) noexcept {
  std::uint64_t product = 1;
  bool saturated = false;
  for (const std::uint64_t c : counts) {
    if (c == 0) return 0;
    saturated = saturated || __builtin_mul_overflow(product, c, &product);
  }
  return saturated ? ~std::uint64_t{0} : product;
}
}  // namespace

std::uint64_t Parallelism::data_ranks() const noexcept { return saturating_product({data, fsdp}); }

std::uint64_t Parallelism::world() const noexcept { return saturating_product({data, fsdp, tensor, pipeline, context, expert}); }

namespace {
// The layouts predict() models (docs/distributed.md) and the settings that make sense with them;
// everything else is refused by name.
void validate_parallel(const Job& j) {
  const Parallelism& p = j.parallel;
  auto bad = [](const char* flag, const std::string& what) { return Error(ErrorKind::invalid_job, std::string(flag) + ": " + what); };
  auto unsupported = [](const std::string& what) { return Error(ErrorKind::unsupported, what); };
  constexpr std::uint64_t kMaxRanks = 1ull << 20;
  if (p.tensor == 0) throw bad("--tp", "must be at least 1");
  if (p.pipeline == 0) throw bad("--pp", "must be at least 1");
  if (p.data == 0) throw bad("--dp", "must be at least 1");
  if (p.fsdp == 0) throw bad("--fsdp", "must be at least 1");
  if (p.context == 0) throw bad("--cp", "must be at least 1");
  if (p.expert == 0) throw bad("--ep", "must be at least 1");
  if (p.world() > kMaxRanks)
    throw bad("--dp × --fsdp × --tp × --pp × --cp × --ep", std::to_string(p.world()) + " ranks is absurdly large (limit 2^20)");
  if (p.context > 1) {
    // torchtitan's context parallelism: FSDP2 over the dp_shard × cp ranks, each rank's share of
    // the sequence through context_parallel's ring attention (docs/distributed.md). Measured
    // alone and with FSDP2; the other layouts beside it are not modelled yet.
    const std::string cp = "--cp " + std::to_string(p.context);
    if (p.tensor > 1 || p.pipeline > 1 || p.data > 1 || p.zero_stage != 0 || p.fsdp_offload)
      throw unsupported(cp + " with --tp, --pp, --dp, --zero or --fsdp-offload: context parallelism is modelled with "
                        "FSDP2 (--cp N [--fsdp D]) only");
    // the load balancer cuts the sequence into 2·N chunks, each rank taking one from either end
    if (j.seq % (2 * p.context))
      throw bad("--cp", "--seq " + std::to_string(j.seq) + " is not divisible by 2 × " + std::to_string(p.context) +
                            " (context_parallel's load balancing gives each rank two equal chunks)");
    if (j.attention != Attention::flash)
      throw unsupported(cp + " with --attention math: ring attention replaces SDPA's fused kernels only");
    if (j.precision != Precision::bf16 && j.precision != Precision::amp_bf16)
      throw unsupported(cp + " with --precision " + std::string(to_string(j.precision)) +
                        ": measured in bf16 and amp-bf16 (the fused kernels ring attention runs)");
    if (j.recompute == Recompute::selective) throw unsupported(cp + " with --recompute selective: not modelled (none and full are)");
    if (j.loss == Loss::chunked) throw unsupported(cp + " with --loss chunked: not modelled");
  }
  if (p.zero_stage < 0 || p.zero_stage > 3) throw bad("--zero", "the ZeRO stage must be 0, 1, 2 or 3");
  if (p.expert > 1 && (p.tensor > 1 || p.pipeline > 1 || p.data > 1 || p.context > 1 || p.zero_stage != 0 || p.fsdp_offload))
    // transformers 5.17's expert parallelism alone, or with FSDP2 across the expert-parallel
    // groups (the (fsdp, ep) mesh, as --fsdp × --tp). torchtitan borrows its ep ranks from the
    // data-parallel ones and dispatches tokens all-to-all: not modelled yet.
    throw unsupported("--ep " + std::to_string(p.expert) + " with --tp, --pp, --dp, --cp, --zero or --fsdp-offload: expert "
                      "parallelism is modelled alone or with FSDP2 across it (--ep E [--fsdp F]: transformers 5.17's "
                      "DistributedConfig(tp_size=E, enable_expert_parallel=True) on the ep dimension of an (fsdp, ep) "
                      "mesh); torchtitan's all-to-all dispatch is not modelled yet");
  // Not modelled yet: refused by name, never answered as if unsharded.
  // torchtitan's layouts with TP: FSDP2 (or HSDP) across, TP within. PyTorch's DDP does not take
  // DTensor parameters (torchtitan: "DDP has not supported > 1D parallelism"), and ZeRO-2/3 with
  // TP is the --fsdp layout.
  if (p.tensor != 1 && p.fsdp <= 1 && (p.data != 1 || p.zero_stage != 0))
    throw unsupported("--tp " + std::to_string(p.tensor) + " with --dp or --zero: data parallelism beside tensor parallelism "
                      "is FSDP2 (--fsdp N --tp T) or HSDP (--dp R --fsdp S --tp T); DDP and ZeroRedundancyOptimizer do "
                      "not shard DTensor parameters");
  if (p.tensor != 1 && p.fsdp_offload)
    throw unsupported("--tp with --fsdp-offload: not modelled yet");
  // Pipelines beside other layouts, as torchtitan composes them on the ("pp", "dp", "tp") mesh:
  // each stage module tensor-parallel (--tp), then sharded by FSDP2 (--fsdp) or replicated by DDP
  // (--dp), under GPipe and 1F1B. HSDP, ZeRO-1 and sequence parallelism within the stages and
  // interleaved 1F1B beside them are not modelled yet.
  if (p.pipeline > 1) {
    const std::string pp = "--pp " + std::to_string(p.pipeline);
    if (p.zero_stage != 0) throw unsupported(pp + " with --zero: ZeRO within the stages is not modelled (FSDP2 is: --fsdp N)");
    if (p.data > 1 && p.fsdp > 1) throw unsupported(pp + " with --dp and --fsdp: HSDP within the stages is not modelled yet");
    if (p.sequence_parallel || p.loss_parallel)
      throw unsupported(pp + " with --sp or --loss-parallel: the stages' tensor parallelism is modelled without them");
    if ((p.fsdp > 1 || p.data > 1 || p.tensor > 1) && p.pp_schedule == PipelineSchedule::interleaved)
      throw unsupported(pp + " --pp-schedule interleaved with --fsdp, --dp or --tp: those within the stages are modelled for "
                             "GPipe and 1F1B");
    if (p.fsdp_offload) throw unsupported(pp + " with --fsdp-offload: not modelled yet");
  }
  if (p.pipeline == 1 && (p.microbatches != 0 || p.virtual_stages != 1 || !p.pp_layers.empty() ||
                          p.pp_schedule != PipelineSchedule::one_f_one_b))
    throw bad(p.microbatches ? "--microbatches" : p.virtual_stages != 1 ? "--virtual-stages" : !p.pp_layers.empty() ? "--pp-layers" : "--pp-schedule",
              "applies to pipeline parallelism (--pp N, N ≥ 2)");
  if (p.pipeline > 1) {
    if (p.virtual_stages == 0) throw bad("--virtual-stages", "must be at least 1");
    // (each count as set_parallel_option bounds it, for a C++ caller too: their products and sums
    // below stay far from 2^64)
    if (p.virtual_stages > (1ull << 20))
      throw bad("--virtual-stages", std::to_string(p.virtual_stages) + " is absurdly large (limit 2^20)");
    const bool interleaved = p.pp_schedule == PipelineSchedule::interleaved;
    if (interleaved && p.virtual_stages < 2)
      throw bad("--virtual-stages", "interleaved 1F1B runs V ≥ 2 stage modules per rank: give --virtual-stages V");
    if (!interleaved && p.virtual_stages > 1)
      throw bad("--virtual-stages", "applies to --pp-schedule interleaved (GPipe and 1F1B run one stage per rank)");
    const std::uint64_t stages = p.pipeline * p.virtual_stages;  // each ≤ 2^20 (world() above, virtual_stages)
    if (stages > (1ull << 20))
      throw bad("--pp × --virtual-stages", std::to_string(stages) + " stages is absurdly large (limit 2^20)");
    // The schedule is simulated microbatch by microbatch (membudget/input.hpp)
    using limits::kMaxMicrobatches;
    if (p.microbatches > kMaxMicrobatches)
      throw Error(ErrorKind::unsupported, "--microbatches: " + std::to_string(p.microbatches) + " is more than the " +
                                              std::to_string(kMaxMicrobatches) +
                                              " modelled (the schedule is simulated microbatch by microbatch)");
    const std::uint64_t m = p.microbatches ? p.microbatches : p.pipeline;
    if (p.pp_schedule == PipelineSchedule::one_f_one_b && m < p.pipeline)
      throw bad("--microbatches", std::to_string(m) + " is fewer than the " + std::to_string(p.pipeline) +
                                      " stages: 1F1B needs at least one microbatch per stage to fill the pipeline");
    // ScheduleInterleaved1F1B runs max(1, M / N) rounds of equally many microbatches
    const std::uint64_t rounds = std::max<std::uint64_t>(1, m / p.pipeline);
    if (interleaved && m % rounds)
      throw bad("--microbatches", std::to_string(m) + " is not a multiple of the " + std::to_string(rounds) +
                                      " rounds interleaved 1F1B runs (max(1, microbatches / --pp))");
    if (!p.pp_layers.empty() && p.pp_layers.size() != stages)
      throw bad("--pp-layers", "gives " + std::to_string(p.pp_layers.size()) + " stages' layer counts for " +
                                   std::to_string(stages) + " stages (--pp " + std::to_string(p.pipeline) +
                                   (interleaved ? " × --virtual-stages " + std::to_string(p.virtual_stages) : std::string()) + ")");
    for (std::uint64_t n : p.pp_layers) {
      if (n == 0) throw bad("--pp-layers", "a stage with no decoder layers is not modelled (every stage needs one)");
      if (n > (1ull << 20)) throw bad("--pp-layers", std::to_string(n) + " layers in a stage is absurdly large (limit 2^20)");
    }
  }
  if (p.sequence_parallel && p.tensor < 2) throw bad("--sp", "sequence parallelism applies to tensor parallelism (--tp N, N ≥ 2)");
  if (p.loss_parallel && p.tensor < 2) throw bad("--loss-parallel", "the vocabulary-parallel loss applies to tensor parallelism (--tp N)");
  if (p.loss_parallel && j.loss == Loss::chunked)
    throw unsupported("--loss-parallel with --loss chunked: the vocabulary-parallel loss is cross-entropy over whole logits");
  if (p.sequence_parallel && j.loss == Loss::chunked)
    throw unsupported("--sp with --loss chunked: the fused loss over sequence-parallel logits is not modelled");
  if (p.zero_stage > 0 && p.fsdp > 1)
    throw bad("--zero", "with --fsdp: FSDP2 already shards parameters, gradients and optimizer state (--zero 2 and 3 "
                        "are FSDP2 over --dp ranks; give one or the other)");
  if (p.zero_stage > 0 && p.data < 2)
    throw bad("--zero", "stage " + std::to_string(p.zero_stage) + " shards over the data-parallel ranks: give --dp N (N ≥ 2)");
  // ZeroRedundancyOptimizer's partition is worked out rank by rank (predict: 0.5 s over 2^16 ranks,
  // 16 s over 2^20); no job runs it over more
  if (p.zero_stage == 1 && p.data > (1ull << 16))
    throw bad("--zero", "1 over " + std::to_string(p.data) + " ranks is absurdly large (limit 65536 --dp ranks)");
  if (p.zero_stage == 3 && !p.reshard_after_forward)
    throw bad("--reshard-after-forward", "false contradicts --zero 3 (ZeRO-3 reshards after forward; --zero 2 does not)");
  const bool fsdp = p.fsdp > 1 || p.zero_stage >= 2 || p.context > 1;
  const bool ddp = p.data > 1 && !fsdp;
  if (p.fsdp_offload && !fsdp) throw bad("--fsdp-offload", "applies to FSDP2 (--fsdp N, or --dp N --zero 2 / 3)");
  if (p.fsdp_grad_sync_last && !(fsdp && j.grad_accum_steps > 1))
    throw bad("--fsdp-grad-sync", "applies to FSDP2 (--fsdp N, or --dp N --zero 2 / 3) with --grad-accum-steps above 1");
  if (p.ddp_bucket_view && !ddp) throw bad("--ddp-bucket-view", "applies to DistributedDataParallel (--dp N without --fsdp or --zero 2/3)");
  if (!p.reshard_after_forward && !fsdp && p.zero_stage != 2)
    throw bad("--reshard-after-forward", "applies to FSDP2 (--fsdp N)");
  if (p.rank && *p.rank >= p.world())
    throw bad("--rank", std::to_string(*p.rank) + " is not a rank of a job of " + std::to_string(p.world()) + " ranks (0 to " +
                           std::to_string(p.world() - 1) + ")");
  if (p.single()) return;
  const std::string layout = p.expert > 1     ? "--ep"
                             : p.tensor > 1     ? "--tp"
                             : p.pipeline > 1 ? "--pp"
                             : p.context > 1  ? "--cp"
                             : fsdp           ? "--fsdp"
                             : p.zero_stage == 1 ? "--zero 1"
                                                 : "--dp";
  if (j.mode == Mode::infer) throw unsupported(layout + ": serving is predicted on one GPU (tensor-parallel serving is not modelled yet)");
  if (j.profile == Profile::harness) throw unsupported(layout + ": the harness step runs on one device; use --profile torch");
  if (j.lora_rank) throw unsupported(layout + " with --lora: a sharded LoRA fine-tune is not modelled yet");
  if (j.optimizer != Optimizer::adamw && j.optimizer != Optimizer::sgd && j.optimizer != Optimizer::sgd_momentum)
    throw unsupported(layout + " with --optimizer " + std::string(to_string(j.optimizer)) +
                      ": the sharded optimizer is modelled for adamw, sgd and sgd-momentum");
  if ((p.tensor > 1 || p.expert > 1 || p.zero_stage == 1) && j.precision == Precision::bf16_master)
    throw unsupported(layout + " with --precision bf16-master: a master copy beside sharded state is not modelled yet");
  if (p.pipeline > 1) {
    // (under --fsdp, amp-bf16 is FSDP2's mixed-precision policy: no autocast)
    if ((j.precision == Precision::amp_bf16 && p.fsdp <= 1) || j.precision == Precision::bf16_master)
      throw unsupported("--pp with --precision " + std::string(to_string(j.precision)) +
                        ": autocast (or a master copy) across a schedule's microbatches is not modelled; use bf16 or fp32 "
                        "(or amp-bf16 with --fsdp, FSDP2's mixed-precision policy)");
    if (j.loss == Loss::chunked)
      throw unsupported("--pp with --loss chunked: the last stage computes torchtitan's cross-entropy over whole logits");
    if (j.recompute == Recompute::selective)
      throw unsupported("--pp with --recompute selective: not modelled (none and full are)");
  }
  if (fsdp && j.precision == Precision::bf16_master)
    throw unsupported("--fsdp with --precision bf16-master: FSDP2 keeps one copy of the parameters (amp-bf16 is its "
                      "MixedPrecisionPolicy: fp32 shards, bf16 compute)");
}
}  // namespace

std::string dashed(std::string_view key) {
  std::string k(key);
  std::replace(k.begin(), k.end(), '_', '-');
  return k;
}

std::uint64_t parse_count(std::string_view text, std::string_view where, std::uint64_t min, std::uint64_t max) {
  // (the messages are made only on failure: the C ABI's mb_job_set reads every count through here)
  auto fail = [&](const std::string& what) {
    return Error(ErrorKind::invalid_job, std::string(where) + ": '" + std::string(text.substr(0, 64)) + (text.size() > 64 ? "...'" : "'") + what);
  };
  auto not_in_range = [&] {
    const bool bounded = min > 0 || max != ~std::uint64_t{0};
    return fail(" is not a whole number" + (bounded ? " from " + std::to_string(min) + " to " + std::to_string(max) : std::string()));
  };
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) throw not_in_range();
  std::uint64_t v = 0;
  for (const char c : text)
    if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, static_cast<std::uint64_t>(c - '0'), &v))
      throw fail(" is absurdly large (more than 64 bits)");
  if (v < min || v > max) throw not_in_range();
  return v;
}

std::string parallel_flag(std::string_view key) {
  std::string k = dashed(key);
  static constexpr std::pair<std::string_view, std::string_view> kAliases[] = {
      {"data-parallel", "dp"},   {"context-parallel", "cp"}, {"tensor-parallel", "tp"},     {"expert-parallel", "ep"},
      {"pipeline-parallel", "pp"}, {"zero-stage", "zero"},   {"sequence-parallel", "sp"}};
  for (const auto& [alias, name] : kAliases)
    if (k == alias) k = name;
  static constexpr std::string_view kFlags[] = {"dp", "fsdp", "cp", "tp", "ep", "pp", "zero", "reshard-after-forward",
                                                "ddp-bucket-view", "sp", "loss-parallel", "fsdp-offload", "fsdp-grad-sync", "pp-schedule",
                                                "microbatches", "virtual-stages", "pp-layers", "rank"};
  for (const std::string_view f : kFlags)
    if (k == f) return "--" + k;
  return {};
}

bool set_parallel_option(Job& job, std::string_view key, std::string_view value, std::string_view where) {
  const std::string flag = parallel_flag(key);
  if (flag.empty()) return false;
  const std::string_view k = std::string_view(flag).substr(2);
  const std::string v(value);
  auto fail = [&](const std::string& what) { return Error(ErrorKind::invalid_job, std::string(where) + ": '" + v + "' " + what); };
  auto count = [&](std::uint64_t max, std::uint64_t min = 0) { return parse_count(v, where, min, max); };
  auto boolean = [&] {
    if (v == "true" || v == "True" || v == "1") return true;
    if (v == "false" || v == "False" || v == "0") return false;
    throw fail("is not true or false");
  };
  constexpr std::uint64_t kRanks = 1ull << 20;
  Parallelism& p = job.parallel;
  if (k == "dp") p.data = count(kRanks);
  else if (k == "fsdp") p.fsdp = count(kRanks);
  else if (k == "cp") p.context = count(kRanks);
  else if (k == "tp") p.tensor = count(kRanks);
  else if (k == "ep") p.expert = count(kRanks);
  else if (k == "pp") p.pipeline = count(kRanks);
  else if (k == "zero") p.zero_stage = static_cast<int>(count(3));
  else if (k == "reshard-after-forward") p.reshard_after_forward = boolean();
  else if (k == "ddp-bucket-view") p.ddp_bucket_view = boolean();
  else if (k == "sp") p.sequence_parallel = boolean();
  else if (k == "loss-parallel") p.loss_parallel = boolean();
  else if (k == "fsdp-offload") p.fsdp_offload = boolean();
  else if (k == "fsdp-grad-sync") {
    if (v != "every" && v != "last") throw fail("is not every or last");
    p.fsdp_grad_sync_last = v == "last";
  }
  else if (k == "pp-schedule") p.pp_schedule = parse_pipeline_schedule(v, where);
  else if (k == "microbatches") p.microbatches = count(kRanks, 1);  // (0, the field's "as many as stages", is no count to give)
  else if (k == "virtual-stages") p.virtual_stages = count(kRanks);
  else if (k == "pp-layers") {  // "4,4,4,4": decoder layers per stage
    p.pp_layers.clear();
    std::size_t from = 0;
    do {
      const std::size_t comma = v.find(',', from);
      const std::string item = v.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
      if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos)
        throw fail("is not a comma-separated list of layer counts (e.g. 4,4,4,4)");
      p.pp_layers.push_back(parse_count(item, std::string(where) + ": a stage's layers", 0, kRanks));
      from = comma == std::string::npos ? std::string::npos : comma + 1;
    } while (from != std::string::npos);
  }
  else if (k == "rank") p.rank = count(kRanks - 1);
  else return false;
  return true;
}

bool set_moe_option(Job& job, std::string_view key, std::string_view value, std::string_view where) {
  const std::string k = dashed(key);
  const std::string v(value);
  if (k == "experts") job.experts = parse_experts_impl(v, where);
  else if (k == "routing") job.routing = parse_routing(v, where);
  else if (k == "router-aux-loss") {
    if (v == "true" || v == "True" || v == "1") job.router_aux_loss = true;
    else if (v == "false" || v == "False" || v == "0") job.router_aux_loss = false;
    else throw Error(ErrorKind::invalid_job, std::string(where) + ": '" + v + "' is not true or false");
  } else return false;
  return true;
}

namespace {
// Gradient accumulation is walked on one GPU's step, on a DDP or ZeRO-1 rank (every micro-batch but
// the last under no_sync()), on a tensor-parallel rank and on an FSDP2 rank either way its loop runs
// it (--fsdp-grad-sync) (inventory_torch.cpp, TrainPass::micro_batches); the layouts not measured
// with it (context and expert parallelism, FSDP2 with CPU offload, HSDP, FSDP2 with TP) are
// refused by name.
void validate_grad_accum(const Job& j) {
  const std::string flag = "--grad-accum-steps";
  if (j.grad_accum_steps == 0) throw Error(ErrorKind::invalid_job, flag + ": must be at least 1");
  if (j.grad_accum_steps > limits::kMaxGradAccumSteps)
    throw Error(ErrorKind::invalid_job, flag + ": " + std::to_string(j.grad_accum_steps) + " is absurdly large (limit " +
                                            std::to_string(limits::kMaxGradAccumSteps) + ")");
  if (j.grad_accum_steps == 1) return;
  const std::string given = flag + " " + std::to_string(j.grad_accum_steps);
  if (j.mode != Mode::train)
    throw Error(ErrorKind::invalid_job, given + ": applies to training; --mode infer (serving) does not use it");
  if (j.profile == Profile::harness)
    throw Error(ErrorKind::unsupported, given + ": the harness runs one micro-batch per step; use --profile torch");
  if (j.parallel.pipeline > 1)
    throw Error(ErrorKind::unsupported, given + " with --pp: a pipeline accumulates over its microbatches; give --microbatches");
  const Parallelism& p = j.parallel;
  const bool fsdp = p.fsdp > 1 || p.zero_stage >= 2;
  const char* layout = p.context > 1                   ? "--cp"
                       : p.expert > 1                  ? "--ep"
                       : fsdp && p.fsdp_offload        ? "--fsdp-offload"
                       : fsdp && p.data > 1 && p.fsdp > 1 ? "HSDP (--dp with --fsdp)"
                       : fsdp && p.tensor > 1          ? "FSDP2 with --tp"
                                                       : nullptr;
  if (layout)
    throw Error(ErrorKind::unsupported,
                given + " with " + layout + ": accumulation is modelled on one GPU, on DDP or ZeRO-1 ranks (--dp, "
                        "no_sync() before the last micro-batch), on tensor-parallel ranks (--tp) and on FSDP2 ranks "
                        "(--fsdp, --zero 2 or 3; --fsdp-grad-sync every or last); what stays allocated between this "
                        "layout's micro-batches is not modelled yet");
}
}  // namespace

void Job::validate() const {
  auto bad = [](const char* field, const std::string& what) {
    return Error(ErrorKind::invalid_job, std::string(field) + ": " + what);
  };
  constexpr std::uint64_t kMaxTokens = 1ull << 32;  // 4 G tokens in one micro-batch is absurd
  if (batch == 0) throw bad("--batch", "must be at least 1");
  if (seq == 0) throw bad("--seq", "must be at least 1");
  if (batch > kMaxTokens || seq > kMaxTokens)
    throw bad(batch > kMaxTokens ? "--batch" : "--seq",
              std::to_string(batch > kMaxTokens ? batch : seq) + " is absurdly large (limit 2^32)");
  if (batch * seq > kMaxTokens)
    throw bad("--batch × --seq", std::to_string(batch) + " × " + std::to_string(seq) +
                                     " tokens per micro-batch is absurdly large (limit 2^32)");
  // A C++ caller can cast any number to an enum: one outside its names is refused, never read as
  // whichever value a comparison falls through to.
  const std::pair<const char*, bool> settings[] = {
      {"--mode", named(kModes, mode)},
      {"--precision", named(kPrecisions, precision)},
      {"--optimizer", named(kOptimizers, optimizer)},
      {"--optimizer-impl", !optimizer_impl || named(kOptimizerImpls, *optimizer_impl)},
      {"--recompute", named(kRecomputes, recompute)},
      {"--attention", named(kAttentions, attention)},
      {"--loss", named(kLosses, loss)},
      {"--activations", named(kActivationModels, activations)},
      {"--profile", named(kProfiles, profile)},
      {"--kv-dtype", named(kDTypes, kv_dtype)},
      {"--weights", named(kDTypes, weights)},
      {"--experts", named(kExpertsImpls, experts)},
      {"--routing", named(kRoutings, routing)},
      {"--pp-schedule", named(kPipelineSchedules, parallel.pp_schedule)}};
  for (const auto& [flag, ok] : settings)
    if (!ok) throw bad(flag, "is not one of its values (a number cast to the enum)");
  if (loss == Loss::chunked && loss_chunk == 0) throw bad("--loss-chunk", "must be at least 1");
  // Memory outside the allocator is added to every figure (required, nvidia_smi): a value past any
  // card's memory is a typo, and near 2^64 the sums would wrap.
  constexpr bytes_t kMaxOverhead = bytes_t{1} << 50;  // 1 PiB
  if (overhead && *overhead > kMaxOverhead)
    throw bad("--overhead", format_bytes(*overhead) + " is more than any GPU holds (limit 1 PiB); check the value for a typo");
  validate_parallel(*this);
  validate_grad_accum(*this);
  if (group_size == 0) throw bad("--group-size", "must be at least 1");
  if (lora_rank > 65536) throw bad("--lora", "rank " + std::to_string(lora_rank) + " is absurdly large (limit 65536)");
  if (lora_rank && mode == Mode::train && profile == Profile::harness)
    throw Error(ErrorKind::unsupported, "--lora: the harness trains the full model; use --profile torch");
  if (lora_rank && mode == Mode::train && optimizer == Optimizer::adafactor)
    throw Error(ErrorKind::unsupported, "--lora: Adafactor's factored state over adapters is not modelled");
  if (optimizer_impl) {
    // Only what torch.optim offers: torch itself refuses the others (Adafactor takes no `fused`).
    const std::string both = std::string("--optimizer-impl ") + to_string(*optimizer_impl) + " with --optimizer " +
                             to_string(optimizer) + ": ";
    if (optimizer == Optimizer::adamw_8bit || optimizer == Optimizer::lion)
      throw Error(ErrorKind::invalid_job,
                  both + (optimizer == Optimizer::lion ? "Lion (lion-pytorch)" : "AdamW8bit (bitsandbytes)") +
                      " is not in torch.optim and has no foreach/fused/for-loop choice");
    if (optimizer == Optimizer::adafactor && *optimizer_impl == OptimizerImpl::fused)
      throw Error(ErrorKind::invalid_job, both + "torch.optim.Adafactor has no fused implementation (foreach or for-loop)");
    if (profile == Profile::harness && mode == Mode::train && *optimizer_impl != OptimizerImpl::fused)
      throw Error(ErrorKind::unsupported, both + "the harness's AdamW is one fused kernel (--optimizer-impl fused)");
  }
  if (mode == Mode::infer && precision == Precision::fp32 && weights != DType::fp32) {
    // serving precision is chosen by --weights; nothing to reject
  }
  if (profile == Profile::harness && mode == Mode::infer) {
    // the inference step has no optimizer, recompute or loss; weights and KV dtypes are checked by
    // the harness and its prediction (bf16 or fp32)
  } else if (profile == Profile::harness) {
    if (optimizer != Optimizer::adamw)
      throw Error(ErrorKind::unsupported, "--profile harness: the harness implements AdamW only");
    if (recompute == Recompute::selective)
      throw Error(ErrorKind::unsupported,
                  "--profile harness: the harness implements --recompute none and full");
    if (attention != Attention::flash)
      throw Error(ErrorKind::unsupported, "--profile harness: the harness implements flash attention only");
    // The harness step is predicted tensor by tensor; the textbook figure would be ignored.
    if (activations == ActivationModel::korthikanti)
      throw Error(ErrorKind::unsupported,
                  "--activations korthikanti: --profile harness predicts its own step; use --profile torch");
  }
}

void check_options_apply(const Job& job, const std::vector<std::string>& given) {
  const bool train = job.mode == Mode::train;
  for (const std::string& g : given) {
    const std::string name = dashed(g.starts_with("--") ? std::string_view(g).substr(2) : std::string_view(g));
    const std::string flag = "--" + name;
    auto refuse = [&](const std::string& why) { throw Error(ErrorKind::invalid_job, flag + ": " + why); };
    static const char* const kTrainOnly[] = {"precision", "optimizer", "optimizer-impl", "recompute", "attention", "trainer-args",
                                             "loss",      "loss-chunk", "activations",    "lora",  "grad-accum-steps", "dp", "fsdp", "zero",
                                             "reshard-after-forward", "ddp-bucket-view", "rank", "tp", "pp", "cp", "sp", "pp-schedule",
                                             "microbatches", "virtual-stages", "pp-layers", "loss-parallel", "fsdp-offload",
                                             "fsdp-grad-sync", "router-aux-loss"};
    static const char* const kServeOnly[] = {"kv-dtype", "weights", "group-size"};
    for (const char* t : kTrainOnly)
      if (!train && name == t) refuse("applies to training; --mode infer (serving) does not use it");
    for (const char* t : kServeOnly)
      if (train && name == t) refuse("applies to serving (--mode infer); training does not use it");
    if (name == "loss-chunk" && job.loss != Loss::chunked) refuse("applies only with --loss chunked");
    if (name == "allocator-conf" && (!train || job.profile != Profile::torch))
      refuse("the reserved-memory replay covers training with --profile torch");
    if (name == "group-size" && job.weights != DType::int4 && job.weights != DType::int8)
      refuse(std::string("applies only with --weights int4 or int8, not ") + to_string(job.weights));
  }
}

// Capacities as the driver reports them (nvidia-smi "MiB" total; rocm-smi for MI300X).
// docs/devices.md lists the sources.
const std::vector<Device>& known_devices() {
  static const std::vector<Device> devices = {
      {"H200", 143771ull * MiB},      {"H100-80GB", 81559ull * MiB},  {"H100-NVL", 95830ull * MiB},
      {"A100-80GB", 81920ull * MiB},  {"A100-40GB", 40960ull * MiB},  {"L40S", 46068ull * MiB},
      {"L4", 23034ull * MiB},         {"A10G", 23028ull * MiB},       {"RTX-4090", 24564ull * MiB},
      {"RTX-3090", 24576ull * MiB},   {"B200", 183359ull * MiB},      {"MI300X", 196288ull * MiB},
      {"V100-32GB", 32768ull * MiB},  {"V100-16GB", 16384ull * MiB},  {"T4", 15360ull * MiB},
  };
  return devices;
}

Device find_device(std::string_view name) {
  auto norm = [](std::string_view s) {
    std::string out;
    for (char c : s)
      if (std::isalnum(static_cast<unsigned char>(c)))
        out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  };
  const std::string key = norm(name);
  for (const auto& d : known_devices())
    if (norm(d.name) == key) return d;
  // Short forms: "H100" → H100-80GB, "A100" → A100-80GB, "4090" → RTX-4090.
  const std::pair<const char*, const char*> aliases[] = {
      {"h100", "H100-80GB"}, {"h10080g", "H100-80GB"}, {"a10080g", "A100-80GB"},
      {"a10040g", "A100-40GB"}, {"4090", "RTX-4090"}, {"rtx4090", "RTX-4090"}, {"3090", "RTX-3090"},
      {"h200141gb", "H200"}, {"b200192gb", "B200"}, {"mi300", "MI300X"}};
  for (const auto& [alias, target] : aliases)
    if (key == alias) return find_device(target);
  // both parts of these are common (clouds rent each): a guess would be off by a factor of two
  if (key == "v100")
    throw Error(ErrorKind::invalid_argument, "--device: 'V100' is two cards; give V100-16GB or V100-32GB");
  if (key == "a100")
    throw Error(ErrorKind::invalid_argument, "--device: 'A100' is two cards; give A100-40GB or A100-80GB");
  std::string names;
  for (const auto& d : known_devices()) names += (names.empty() ? "" : ", ") + d.name;
  throw Error(ErrorKind::invalid_argument, "--device: unknown card '" + std::string(name) +
                                               "' (known: " + names +
                                               "; or give --device-memory 80GiB)");
}

}  // namespace membudget
