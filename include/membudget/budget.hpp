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
#include <vector>

#include "membudget/bytes.hpp"
#include "membudget/job.hpp"
#include "membudget/spec.hpp"

namespace membudget {

enum class Term { model_states, activations, logits_loss, kv_cache, overhead, other };
const char* to_string(Term t) noexcept;

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
  std::string name;  // "forward_peak"
  bytes_t bytes = 0;
  std::vector<TensorBytes> live;  // tensors live at this phase's peak (filled with explain)
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

  bytes_t phase(std::string_view name) const {  // 0 when absent
    const PhasePeak* p = find_phase(name);
    return p ? p->bytes : 0;
  }
  const PhasePeak* find_phase(std::string_view name) const {
    for (const auto& p : phases)
      if (p.name == name) return &p;
    return nullptr;
  }
  // The phase named by peak_phase ("backward_peak" or "step0.backward_peak"), or nullptr.
  const PhasePeak* peak_entry() const {
    std::string_view name = peak_phase;
    if (name.rfind("step0.", 0) != 0) return find_phase(name);
    name.remove_prefix(6);
    for (const auto& p : step0)
      if (p.name == name) return &p;
    return nullptr;
  }
};

struct PredictOptions {
  bool explain = false;  // keep the live-tensor lists of each phase peak (implies full_simulation)
  // Simulate every layer at this shape. The default evaluates the step's plan, compiled once per
  // (model, recipe) from simulations of 4-6 layer copies at three probe shapes (same numbers; see
  // docs/api.md); this switch exists for tests and for checking that claim.
  bool full_simulation = false;
};

// Throws Error(invalid_spec / invalid_job / unsupported / overflow).
Budget predict(const ModelSpec& model, const Job& job, const PredictOptions& options = {});

// Memory outside the allocator assumed when the job does not set one (docs/model.md).
bytes_t default_overhead(Profile profile);

struct Fit {
  Device device;
  bytes_t capacity = 0;
  bytes_t required = 0;  // peak + overhead
  double headroom = 0.05;
  bool fits = false;
};
// fits ⇔ required ≤ capacity · (1 − headroom).
Fit check_fit(const Budget& budget, const Device& device, double headroom = 0.05);

}  // namespace membudget
