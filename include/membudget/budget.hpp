// membudget/budget.hpp: the prediction: five terms, their breakdown, and the per-phase peaks.
//
// predict(model, job) returns a Budget:
//   terms      model_states, activations, logits_loss, kv_cache, overhead (bytes)
//   breakdown  weights / gradients / master / optimizer; per-layer saved tensors; logits pieces
//   phases     what torch.cuda.max_memory_allocated() reports in a steady-state step (training:
//              floor, forward_peak, backward_peak, optimizer_peak; serving: floor, prefill_peak,
//              decode_peak), and the same for step 0 (no optimizer state yet)
//   peak       the largest phase, which phase it is, and which tensors are live there
// Overhead (memory outside the allocator) is a term of its own and is added only for device fit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "membudget/bytes.hpp"
#include "membudget/job.hpp"
#include "membudget/spec.hpp"

namespace membudget {

enum class Term { model_states, activations, logits_loss, kv_cache, overhead, other };
const char* to_string(Term t) noexcept;

// What a tensor is for, independent of the name the simulator gives it: advise, attribute and the
// term breakdown switch on roles (a label can be reworded without breaking them).
enum class Role {
  parameter,            // weights in their storage dtype
  adapter,              // LoRA adapter weights (trainable, fp32) beside a frozen base
  gradient,             // .grad of a parameter
  master_weight,        // fp32 master copy (bf16-master)
  optimizer_state,      // moments and other optimizer state
  optimizer_temporary,  // temporaries of optimizer.step()
  weight_copy,          // autocast's 16-bit copies of weights (cached, or saved by a matmul)
  saved_activation,     // activations created in the forward (saved or in flight)
  temporary,            // transient buffers of one op (kernel workspaces, masks)
  logits_loss,          // logits, their fp32 copies, the loss and what it saves
  workspace,            // library workspaces (cuBLAS) and allocator slack
  kv_cache,             // serving: the KV cache
  input,                // input ids and labels
  communication,        // collective buffers: FSDP2's all-gather and reduce-scatter inputs and outputs
};
const char* to_string(Role r) noexcept;

// The phases a step is measured at; to_string gives the one name used in JSON, CSV, the C ABI and
// the measurement scripts. Training: floor, forward_peak, backward_peak, optimizer_peak. Serving:
// floor, prefill_peak, decode_peak.
enum class Phase { floor, forward_peak, backward_peak, optimizer_peak, prefill_peak, decode_peak };
inline constexpr Phase kAllPhases[] = {Phase::floor,          Phase::forward_peak, Phase::backward_peak,
                                       Phase::optimizer_peak, Phase::prefill_peak, Phase::decode_peak};
inline constexpr Phase kTrainPhases[] = {Phase::floor, Phase::forward_peak, Phase::backward_peak,
                                         Phase::optimizer_peak};
inline constexpr Phase kServePhases[] = {Phase::floor, Phase::prefill_peak, Phase::decode_peak};
const char* to_string(Phase p) noexcept;
// "backward_peak" → Phase::backward_peak; false for an unknown name.
bool parse_phase(std::string_view name, Phase* out) noexcept;
// The prefix of step-0 phases in names ("step0.backward_peak").
inline constexpr std::string_view kStep0Prefix = "step0.";
// The phase's name, or its step-0 name ("step0.backward_peak"), with static storage.
const char* phase_label(Phase p, bool step0) noexcept;

struct ModelStates {
  bytes_t weights = 0;    // parameters in their storage dtype
  bytes_t gradients = 0;  // .grad (0 while serving)
  bytes_t master = 0;     // fp32 master copy (bf16-master only)
  bytes_t optimizer = 0;  // moments and other optimizer state
  bytes_t total() const { return weights + gradients + master + optimizer; }
};

// One tensor (or a group of identical tensors) of the inventory.
struct TensorBytes {
  std::string name;   // "layers.*.mlp.gate_out"
  std::string op;     // what saves or creates it: "silu (saves input)"
  std::string dtype;  // "bf16"
  std::string shape;  // "b·s·I"
  std::uint64_t count = 1;  // how many such tensors (e.g. layers)
  bytes_t bytes = 0;        // total over count
  Term term = Term::activations;
  Role role = Role::saved_activation;
};

struct ActivationsBreakdown {
  bytes_t per_layer = 0;                 // saved by one decoder layer
  std::uint64_t layers = 0;              // layers holding saved activations
  bytes_t other = 0;                     // embedding output, final norm, rotary tables
  std::vector<TensorBytes> layer_tensors;// per-tensor inventory of one layer
  std::vector<TensorBytes> other_tensors;
  bytes_t total() const { return per_layer * layers + other; }
};

struct LogitsLossBreakdown {
  bytes_t logits = 0;        // output projection's logits (compute dtype)
  bytes_t upcast = 0;        // their fp32 copy inside the loss
  bytes_t loss_saved = 0;    // what the loss keeps for backward (log-softmax output)
  bytes_t logits_grad = 0;   // gradient of the logits at the start of backward
  bytes_t total() const { return logits + upcast + loss_saved + logits_grad; }
};

struct Terms {
  bytes_t model_states = 0;
  bytes_t activations = 0;
  bytes_t logits_loss = 0;
  bytes_t kv_cache = 0;
  bytes_t overhead = 0;
};

struct PhasePeak {
  Phase phase = Phase::floor;
  bytes_t bytes = 0;
  std::vector<TensorBytes> live;  // tensors live at this phase's peak (filled with explain)
  const char* name() const noexcept { return to_string(phase); }
};

struct Budget {
  ModelSpec model;
  Job job;
  ParameterCounts parameters;
  ModelStates states;
  ActivationsBreakdown activations;
  LogitsLossBreakdown logits;
  bytes_t autocast_cache = 0;  // bf16 weight copies held by autocast during the forward
  Terms terms;
  std::vector<PhasePeak> phases;  // steady state (training) or serving phases
  std::vector<PhasePeak> step0;   // training only: the first step, before optimizer state exists
  bytes_t peak = 0;               // max over phases (and step 0)
  std::string peak_phase;         // e.g. "backward_peak" or "step0.backward_peak"
  // Reserved memory (PredictOptions::reserved; training with the torch profile, else empty / 0):
  // torch.cuda.memory_reserved() at the end of each phase (reserved only grows within a step), the
  // step's allocations replayed through PyTorch's caching allocator; reserved_peak is the figure
  // after a steady-state step (step 0 included before it, as a real run has it).
  std::vector<PhasePeak> reserved;        // steady state, same phases as `phases`
  std::vector<PhasePeak> reserved_step0;  // the first step
  bytes_t reserved_peak = 0;
  // A distributed job (Job::parallel): the figures above are those of rank `rank` of `world`; `ranks`
  // lists the groups of ranks whose phases differ (ZeRO-1's partition, FSDP2's uneven shards), when
  // PredictOptions::ranks asks for them. One GPU: rank 0 of 1, no groups.
  struct RankGroup {
    std::vector<std::uint64_t> ranks;  // the ranks with these phases
    std::vector<PhasePeak> phases, step0;
    bytes_t peak = 0;
  };
  std::uint64_t rank = 0, world = 1;
  std::vector<RankGroup> ranks;
  // FSDP2's CPU offload (--fsdp-offload): the host memory the rank needs instead of GPU memory.
  struct HostMemory {
    bytes_t parameters = 0, gradients = 0, optimizer_state = 0;
    bytes_t total() const { return parameters + gradients + optimizer_state; }
  } host;
  // What nvidia-smi shows for the process: reserved_peak plus the memory outside the allocator.
  bytes_t nvidia_smi() const { return reserved_peak ? reserved_peak + terms.overhead : 0; }

  bytes_t phase(Phase ph) const {  // 0 when absent
    const PhasePeak* p = find_phase(ph);
    return p ? p->bytes : 0;
  }
  const PhasePeak* find_phase(Phase ph) const {
    for (const auto& p : phases)
      if (p.phase == ph) return &p;
    return nullptr;
  }
  // The phase named by peak_phase ("backward_peak" or "step0.backward_peak"), or nullptr.
  const PhasePeak* peak_entry() const {
    std::string_view name = peak_phase;
    const bool in_step0 = name.rfind(kStep0Prefix, 0) == 0;
    if (in_step0) name.remove_prefix(kStep0Prefix.size());
    Phase ph{};
    if (!parse_phase(name, &ph)) return nullptr;
    for (const auto& p : in_step0 ? step0 : phases)
      if (p.phase == ph) return &p;
    return nullptr;
  }
};

struct PredictOptions {
  bool explain = false;  // keep the live-tensor lists of each phase peak (implies full_simulation)
  // Simulate every layer at this shape. The default evaluates the step's plan, compiled once per
  // (model, recipe) from simulations of 4-6 layer copies at three probe shapes (same numbers; see
  // docs/api.md); this switch exists for tests and for checking that claim.
  bool full_simulation = false;
  // Also compute the reserved memory (Budget::reserved, reserved_peak): a full simulation replayed
  // through the caching allocator, about a millisecond for a new shape, so it is asked for.
  bool reserved = false;
  // Distributed jobs: also predict every group of ranks whose memory differs (Budget::ranks).
  bool ranks = false;
  // PYTORCH_CUDA_ALLOC_CONF the job runs with (expandable_segments:True, max_split_size_mb:N,
  // roundup_power2_divisions:N, garbage_collection_threshold:F); empty: PyTorch's defaults. Any
  // other key is Error(invalid_job) naming it.
  std::string allocator_conf;
};

// Throws Error(invalid_spec / invalid_job / unsupported / overflow).
Budget predict(const ModelSpec& model, const Job& job, const PredictOptions& options = {});

// Memory outside the allocator assumed when the job does not set one (docs/model.md).
bytes_t default_overhead(Profile profile);

struct Fit {
  Device device;
  bytes_t capacity = 0;
  // What the card must hold: reserved_peak + overhead (what nvidia-smi shows) when the budget has
  // the reserved memory (PredictOptions::reserved), else peak + overhead. A step runs out of memory
  // when the caching allocator cannot grow its segments, which the allocated peak understates.
  bytes_t required = 0;
  bytes_t allocated_required = 0;  // peak + overhead, always
  bool on_reserved = false;        // required is reserved_peak + overhead
  double headroom = 0.05;
  bool fits = false;
};
// fits ⇔ required ≤ capacity · (1 − headroom).
Fit check_fit(const Budget& budget, const Device& device, double headroom = 0.05);

}  // namespace membudget
