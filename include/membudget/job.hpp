// membudget/job.hpp: what is run on the model: a training or serving step and its options.
//
// Every option is an enum with one to_string/parse pair; an unknown value is an Error naming the
// option and listing the accepted values. Defaults reproduce the worked example of this project:
// a full fine-tune of Llama 3.2 1B at micro-batch 4 × 4096, amp-bf16, AdamW, no recompute, flash
// attention, full loss.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "membudget/bytes.hpp"

namespace membudget {

enum class Mode { train, infer };
// fp32: everything fp32. amp-bf16: fp32 params/grads/optimizer, forward under torch.autocast(bf16).
// bf16: params, grads and optimizer state bf16. bf16-master: bf16 params/grads + fp32 master
// weights and optimizer state (Megatron / DeepSpeed).
enum class Precision { fp32, amp_bf16, bf16, bf16_master };
enum class Optimizer { adamw, sgd, sgd_momentum, adamw_8bit, adafactor, lion };
// torch.optim's implementation of optimizer.step(): foreach=True (multi-tensor kernels over the
// whole parameter list), fused=True (one fused kernel), foreach=False (a Python for-loop over the
// parameters). What each allocates: docs/model.md, "The optimizer step".
enum class OptimizerImpl { foreach, fused, for_loop };
enum class Recompute { none, selective, full };
enum class Attention { flash, math };
enum class Loss { full, chunked };
enum class ActivationModel { korthikanti, inventory };
// Which implementation the inventory describes. torch: Hugging Face transformers 5.x on
// PyTorch 2.11 (measured, docs/accuracy.md). harness: membudget's own synthetic step.
enum class Profile { torch, harness };
enum class DType { fp32, bf16, fp16, fp8, int8, int4 };
// How transformers 5 runs a mixture of experts' routed experts (config._experts_implementation,
// integrations/moe.py): grouped_mm (torch.nn.functional.grouped_mm; what it picks on CUDA sm80+),
// batched_mm (a bmm over per-pair gathered weights), eager (a Python loop over the experts hit).
enum class ExpertsImpl { grouped_mm, batched_mm, eager };
// The routing a prediction assumes where a buffer's size depends on it: balanced (each expert gets
// T·k/E of the token-expert pairs, as a random router nearly does) or worst (as many pairs as can
// reach one expert: every token of the micro-batch). docs/moe.md lists which buffers depend on it.
enum class Routing { balanced, worst };
// torch.distributed.pipelining's schedule of one step's microbatches on a stage: ScheduleGPipe (every
// forward, then every backward), Schedule1F1B (a warm-up of stages − stage forwards, then one
// backward and one forward alternately), ScheduleInterleaved1F1B (virtual stages; refused).
enum class PipelineSchedule { gpipe, one_f_one_b, interleaved };

const char* to_string(Mode v) noexcept;
const char* to_string(Precision v) noexcept;
const char* to_string(Optimizer v) noexcept;
const char* to_string(OptimizerImpl v) noexcept;
const char* to_string(Recompute v) noexcept;
const char* to_string(Attention v) noexcept;
const char* to_string(Loss v) noexcept;
const char* to_string(ActivationModel v) noexcept;
const char* to_string(Profile v) noexcept;
const char* to_string(DType v) noexcept;
const char* to_string(ExpertsImpl v) noexcept;
const char* to_string(Routing v) noexcept;
const char* to_string(PipelineSchedule v) noexcept;

// parse_<enum>(text, option) → value, or Error(invalid_job) "--precision: 'fp64' is not one of
// fp32, amp-bf16, bf16, bf16-master".
Mode parse_mode(std::string_view s, std::string_view option = "--mode");
Precision parse_precision(std::string_view s, std::string_view option = "--precision");
Optimizer parse_optimizer(std::string_view s, std::string_view option = "--optimizer");
OptimizerImpl parse_optimizer_impl(std::string_view s, std::string_view option = "--optimizer-impl");
Recompute parse_recompute(std::string_view s, std::string_view option = "--recompute");
Attention parse_attention(std::string_view s, std::string_view option = "--attention");
Loss parse_loss(std::string_view s, std::string_view option = "--loss");
ActivationModel parse_activation_model(std::string_view s, std::string_view option = "--activations");
Profile parse_profile(std::string_view s, std::string_view option = "--profile");
DType parse_dtype(std::string_view s, std::string_view option = "--weights");
// A KV cache's dtype: parse_dtype's names less int4, a weight format only (refused by name).
DType parse_kv_dtype(std::string_view s, std::string_view option = "--kv-dtype");
// Error(invalid_job) opening with `option` unless a KV cache can be stored as `d` (int4 cannot).
void require_kv_dtype(DType d, std::string_view option = "--kv-dtype");
ExpertsImpl parse_experts_impl(std::string_view s, std::string_view option = "--experts");
Routing parse_routing(std::string_view s, std::string_view option = "--routing");
PipelineSchedule parse_pipeline_schedule(std::string_view s, std::string_view option = "--pp-schedule");
// A count given as text (a flag's value, a job: key's, a C ABI option's): decimal digits only, from
// `min` to `max`, or Error(invalid_job) opening with `where`: "'x' is not a whole number", "... from
// min to max" for one out of the range, "is absurdly large" for one past 64 bits. (Job::validate
// bounds each count as the job uses it: a batch above 2^32 is refused there.)
std::uint64_t parse_count(std::string_view text, std::string_view where, std::uint64_t min = 0,
                          std::uint64_t max = ~std::uint64_t{0});

// Bytes of one element; int4 is counted as half a byte by the callers that use it.
double dtype_bytes(DType d) noexcept;

// What a precision recipe stores and computes in: the one definition the torch inventory, the
// harness's inventory and its measured step, and advise read.
struct Recipe {
  DType param;        // parameters as stored
  DType grad;         // their .grad
  DType state;        // optimizer state: torch.optim follows the parameter dtype, fp32 beside a master copy
  bool master;        // an fp32 master copy of the parameters (bf16-master)
  DType compute;      // matmul inputs and outputs: the autocast target, else the parameter dtype
  DType residual;     // the residual stream (the embedding's output, in the parameter dtype)
  bool autocast;      // torch.autocast: 16-bit copies of weights and matmul inputs per op
};
Recipe recipe_of(Precision p) noexcept;
// Whole bytes of one element of a 16- or 32-bit dtype (the recipe's dtypes).
inline std::uint64_t element_size(DType d) noexcept { return static_cast<std::uint64_t>(dtype_bytes(d)); }

// How the job is spread over GPUs (docs/distributed.md). predict() answers for one rank.
//   --dp N                  DistributedDataParallel over N replicas (bucket_cap_mb 25,
//                           gradient_as_bucket_view from ddp_bucket_view)
//   --dp N --zero 1         plus torch.distributed.optim.ZeroRedundancyOptimizer: the optimizer
//                           state sharded over the N ranks, whole parameters each owned by one rank
//   --fsdp N                FSDP2: fully_shard on every decoder layer, then the root, over N ranks,
//                           each group with reshard_after_forward (default true)
//   --dp R --fsdp S         HSDP: shard over S, replicate over R (world R·S)
//   --dp N --zero 2 | 3     FSDP2 over N without | with reshard after forward (PyTorch's ZeRO-2 /
//                           ZeRO-3: gradients and optimizer state sharded, plus parameters between
//                           forward and backward for 3)
//   --tp N                  DTensor tensor parallelism (Llama plan: q, k, v, gate, up column-, o, down
//                           row-parallel; embedding, norms, lm_head replicated)
//   --cp N [--fsdp D]       context parallelism: each rank runs its 1/N of the sequence
//                           (context_parallel, ring attention); FSDP2 over the D·N ranks
//                           (torchtitan's dp_shard_cp mesh)
// docs/distributed.md lists the combinations modelled; validate() refuses the others by name.
struct Parallelism {
  std::uint64_t tensor = 1;     // --tp
  std::uint64_t pipeline = 1;   // --pp: pipeline stages
  PipelineSchedule pp_schedule = PipelineSchedule::one_f_one_b;  // --pp-schedule (torchtitan's default)
  std::uint64_t microbatches = 0;   // --microbatches: per step and stage; 0: as many as stages
  std::uint64_t virtual_stages = 1; // --virtual-stages: stage modules per rank (interleaved 1F1B: ≥ 2)
  std::vector<std::uint64_t> pp_layers;  // --pp-layers: decoder layers per stage; empty: even split
  std::uint64_t data = 1;       // --dp: DDP replicas, or HSDP's replicate dimension with --fsdp
  std::uint64_t fsdp = 1;       // --fsdp: FSDP2 shard ranks
  std::uint64_t context = 1;    // --cp: context-parallel ranks (the sequence split N ways)
  // --ep: expert-parallel ranks, transformers 5.17's DistributedConfig(tp_size=N,
  // enable_expert_parallel=True): each rank holds experts / N of every MoE layer's packed experts
  // and runs the same tokens; the rest of the model is replicated (docs/moe.md).
  std::uint64_t expert = 1;
  int zero_stage = 0;           // --zero: 0 none; 1, 2, 3 over --dp as above
  bool sequence_parallel = false;      // --sp (with --tp)
  bool loss_parallel = false;          // --loss-parallel: lm_head's output kept sharded, loss_parallel() (with --sp)
  bool reshard_after_forward = true;   // --reshard-after-forward (FSDP2)
  bool fsdp_offload = false;           // --fsdp-offload: FSDP2's CPUOffloadPolicy(pin_memory=True)
  // --fsdp-grad-sync every|last: FSDP2 under gradient accumulation (Job::grad_accum_steps).
  // every (false, FSDP2's default and torchtitan's loop): each micro-batch's backward
  // reduce-scatters, the sharded gradients add in place; last (true, accelerate 1.11+'s
  // accumulate(), the Trainer's): the micro-batches before the last run under
  // set_requires_gradient_sync(False), the unsharded gradients kept between them.
  bool fsdp_grad_sync_last = false;
  bool ddp_bucket_view = false;        // --ddp-bucket-view: DDP's gradient_as_bucket_view=True
  // --rank: the rank predicted; unset: the most loaded one (ranks differ under ZeRO-1's partition
  // and FSDP2's uneven shards).
  std::optional<std::uint64_t> rank;
  // Ranks in the job (data × fsdp × tensor × pipeline × context × expert); saturates at 2^64 − 1 (validate refuses it).
  std::uint64_t world() const noexcept;
  bool single() const noexcept { return world() == 1; }
  // The ranks that each take a micro-batch of their own (DDP's or HSDP's replicas × FSDP2's
  // shards); tensor, expert, pipeline and context ranks share theirs. Saturates as world() does.
  std::uint64_t data_ranks() const noexcept;
};

struct Job;
// Sets one parallel-layout key from text, as the YAML `job.parallel:` section and the C ABI / Python
// job options give them: dp, fsdp, zero, tp, pp, cp, ep (counts), reshard_after_forward, ddp_bucket_view,
// sp (true/false), rank (a rank). Dashes and underscores are alike. Returns false for another key;
// throws Error(invalid_job) "<where>: ..." for a bad value.
bool set_parallel_option(Job& job, std::string_view key, std::string_view value, std::string_view where);
// A job key as its command-line flag spells it, without the "--": underscores as dashes
// ("loss_chunk" → "loss-chunk"). The YAML and C ABI keys take either spelling.
std::string dashed(std::string_view key);
// The command-line flag of a parallel-layout key as set_parallel_option takes it ("data_parallel"
// → "--dp"); empty for another key.
std::string parallel_flag(std::string_view key);
// The same for the mixture-of-experts keys: experts (grouped_mm, batched_mm, eager), routing
// (balanced, worst), router_aux_loss (true/false).
bool set_moe_option(Job& job, std::string_view key, std::string_view value, std::string_view where);

struct Job {
  Mode mode = Mode::train;
  std::uint64_t batch = 4;      // micro-batch b
  std::uint64_t seq = 4096;     // sequence length s
  Precision precision = Precision::amp_bf16;
  Optimizer optimizer = Optimizer::adamw;
  // Unset: torch.optim's own default for the optimizer (effective_optimizer_impl).
  std::optional<OptimizerImpl> optimizer_impl;
  Recompute recompute = Recompute::none;
  Attention attention = Attention::flash;
  Loss loss = Loss::full;
  std::uint64_t loss_chunk = 1024;  // tokens per chunk for --loss chunked
  ActivationModel activations = ActivationModel::inventory;
  // LoRA (training): rank r adapters (peft: fp32, alpha 2r, no dropout) on every decoder linear
  // (q, k, v, o, gate, up, down); the base model is frozen. 0: full fine-tuning.
  std::uint64_t lora_rank = 0;
  // Gradient accumulation (training; --grad-accum-steps, Hugging Face's gradient_accumulation_steps):
  // micro-batches of `batch` sequences run forward and backward before each optimizer step. From
  // the second on, the first one's gradients stay allocated through the forward (docs/model.md,
  // "Gradient accumulation"). 1: none.
  std::uint64_t grad_accum_steps = 1;
  Profile profile = Profile::torch;
  Parallelism parallel;
  // Mixture-of-experts models (ignored by none: a dense model refuses a setting other than these
  // defaults). router_aux_loss: output_router_logits, transformers' load-balancing loss added to
  // the training loss (--router-aux-loss).
  ExpertsImpl experts = ExpertsImpl::grouped_mm;
  Routing routing = Routing::balanced;
  bool router_aux_loss = false;
  // Memory outside the allocator (CUDA context, cuBLAS/cuDNN handles): see docs/model.md.
  std::optional<bytes_t> overhead;
  // Serving
  DType kv_dtype = DType::bf16;
  DType weights = DType::bf16;       // weight precision when serving
  std::uint64_t group_size = 128;    // int4/int8 group-wise scales: one fp16 scale per group

  // Throws Error(invalid_job) for zero or absurd sizes, Error(unsupported) for combinations that
  // are not modelled (a parallel setting other than one rank, LoRA with Adafactor, ...).
  void validate() const;
};

// The optimizer implementation the step runs: the job's, else torch.optim's default — foreach for
// AdamW and SGD (torch/optim/adam.py, sgd.py: _default_to_fused_or_foreach(use_fused=False)),
// the for-loop for Adafactor (torch/optim/_adafactor.py: foreach=None runs
// _single_tensor_adafactor); fused for the harness's AdamW (one kernel per parameter). None for
// optimizers outside torch.optim (adamw-8bit: bitsandbytes, lion: lion-pytorch), which offer no
// choice.
std::optional<OptimizerImpl> effective_optimizer_impl(const Job& job) noexcept;

// Every option given is used or refused: throws Error(invalid_job) naming the first option in
// `given` (command-line names, with or without dashes: "--kv-dtype", "kv_dtype") that `job` does
// not read, and the mode. Training reads no kv-dtype, weights or group-size; serving reads no
// precision, optimizer, recompute, attention, loss, loss-chunk, activations or lora; loss-chunk
// needs --loss chunked, group-size --weights int4 or int8. The CLI, the C ABI and the Python
// module pass the options their caller set.
void check_options_apply(const Job& job, const std::vector<std::string>& given);

// Cards with the capacity the driver reports (docs/devices.md).
struct Device {
  std::string name;
  bytes_t capacity = 0;
};
const std::vector<Device>& known_devices();
// Case-insensitive; accepts "H100", "h100-80gb", "A100-40GB"… Error(invalid_argument) lists names.
Device find_device(std::string_view name);

}  // namespace membudget
