// src/measure/harness.hpp: the synthetic Llama training step, measured phase by phase.
//
// A Harness owns the parameters, their gradients and AdamW moments (one allocation per tensor,
// through the CachingAllocator) and one fixed batch. step() runs forward, backward and the
// optimizer on the backend; each phase is an RAII scope that resets the allocator's peak and
// reads it back at the end, so a StepMeasure holds what torch.cuda.max_memory_allocated() would
// report per phase. Every activation and gradient buffer comes from harness_table.hpp.
//
// Lifetimes (docs/harness.md): parameters at construction; gradients at the start of the first
// backward (kept, zeroed each backward); moments at the first optimizer step (kept). Under
// amp-bf16 every parameter gets a bf16 copy at the start of forward, freed at the end of backward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "measure/backend.hpp"
#include "measure/harness_table.hpp"
#include "membudget/spec.hpp"

namespace membudget::measure {

struct HarnessOptions {
  AdamWParams adamw{3e-3f, 0.9f, 0.95f, 1e-8f, 0.0f};
  std::uint64_t seed = 1234;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  // Debug: keep a 4 KiB buffer alive from every step, to show that verify's leak check fires.
  bool leak_per_step = false;
};

struct StepMeasure {
  int index = 0;                // 0 = the first step (no gradients or moments yet)
  bytes_t floor = 0;            // allocated when the forward starts
  bytes_t forward_peak = 0;     // allocated.peak over each phase (the peak is reset at its start)
  bytes_t backward_peak = 0;
  bytes_t optimizer_peak = 0;
  bytes_t allocated_end = 0;    // allocated after the step
  bytes_t reserved_peak = 0;    // reserved.peak over the step
  float loss = 0;               // mean cross-entropy of the forward
  // inference mode (harness_infer.hpp): floor is weights + KV pool; these replace the three above
  bytes_t prefill_peak = 0;
  bytes_t decode_peak = 0;
  double seconds = 0;           // wall time of the step (the backend is synchronised at each phase end)
};

// Where a phase starts in the allocator's history (for the timeline plot).
struct PhaseMark {
  int step = 0;
  std::string phase;  // "forward", "backward", "optimizer", "end" (inference: "prefill", "decode")
  std::size_t event = 0;
};

// Throws Error(unsupported) for what the harness does not implement (it is a Llama-family step:
// RMSNorm, SwiGLU, GQA flash attention, AdamW, recipes fp32 / amp-bf16 / bf16, recompute none or full).
// The job is validated first (Job::validate refuses parallel settings other than one rank).
void check_harness_supported(const ModelSpec& model, const Job& job);

HarnessDims harness_dims(const ModelSpec& model, const Job& job);

class Harness {
 public:
  // The allocator must outlive the harness (its destructor returns every buffer).
  Harness(const ModelSpec& model, const Job& job, Backend& backend, CachingAllocator& allocator,
          HarnessOptions options = {});
  ~Harness();
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  // One training step on the fixed batch. Error(out_of_memory) names the step, phase and tensor.
  StepMeasure step();

  const HarnessDims& dims() const;
  const std::vector<PhaseMark>& marks() const;
  std::uint64_t parameter_tensors() const;
  // For tests: a parameter's name and its gradient from the last backward, as fp32 on the host.
  std::string parameter_name(std::size_t i) const;
  std::vector<float> gradient(std::size_t i) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace membudget::measure
