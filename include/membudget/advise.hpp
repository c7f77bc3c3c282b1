// membudget/advise.hpp: what to change when a training step does not fit (docs/diagnose.md).
//
// advise(model, job, device, headroom) tries each candidate fix on the job and returns them ranked
// cheapest first: by cost class (below), then by the extra compute or transfer time inside a class.
//
//   class        fixes                                          cost
//   free         chunked (fused) cross-entropy, flash           ≈ 0: same maths, often faster
//                attention (when --attention math), fused
//                optimizer step (no multi-tensor temporaries)
//   recompute    selective, then full activation recompute      +5% / +33% compute (one extra forward)
//   numerics     8-bit AdamW, pure bf16 weights and states      ≈ 0 compute; small accuracy risk
//   sharding     ZeRO-1 / 2 / 3 over the smallest N ∈ {2,4,8}   N GPUs and their communication
//                that fits (optimizer state / + gradients /
//                + parameters divided by N)
//   model        LoRA (rank 16 on q,k,v,o,gate,up,down), QLoRA  trains adapters, not the full model
//   offload      optimizer state on the CPU (ZeRO-Offload)      PCIe traffic per step at ~25 GB/s
//   micro-batch  smaller micro-batch b' with ceil(b/b')         same tokens per step, lower GPU
//                gradient-accumulation steps                    efficiency
//
// A fix the inventory models (loss, attention, recompute, optimizer, precision, LoRA, batch) is a
// changed Job run through predict(). The others are computed from the prediction's per-phase live tensors: each
// phase peak is re-added with the parameters, gradients, master weights, optimizer state and
// optimizer temporaries scaled by the fix, plus what the fix adds (adapters, gather buffers).
// fits ⇔ required ≤ capacity · (1 − headroom), exactly as check_fit(): required is the reserved
// memory + outside (what nvidia-smi shows) for a job change whose job has a reserved model (the
// replay through the caching allocator, docs/accuracy.md), else the allocated peak + outside (a
// fix that scales roles, a job without a reserved model such as FSDP2); on_reserved says which.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "membudget/budget.hpp"

namespace membudget {

enum class CostClass { free, recompute, numerics, sharding, model, offload, micro_batch };
const char* to_string(CostClass c) noexcept;

struct Fix {
  std::string name;     // "chunked loss"
  std::string change;   // what to set: "--loss chunked", "ZeRO-2 over 4 GPUs"
  CostClass cost_class = CostClass::free;
  double compute = 0;   // extra compute relative to the step: 0.33 = a third more
  double transfer_s = 0;  // host-device transfer per step in seconds (offload)
  std::uint64_t gpus = 1; // GPUs the fix needs
  std::string cost;     // the cost in words, with its rationale
  std::string note;     // what the fix changes in the prediction, and its caveats
  bool predicted = false;  // peak, required, on_reserved and fits are a prediction's (false: skipped
                           // before one, as not applying or not modelled)
  bytes_t peak = 0;     // predicted new peak (allocated bytes)
  bytes_t required = 0; // what the card must hold: reserved + overhead where on_reserved, else peak + overhead
  bool on_reserved = false;
  bool fits = false;
  bool skipped = false;  // does not apply (already set, no saving, not modelled): note says why
  std::optional<Job> job;  // the job predict() ran on, when the fix is a job change
};

// Candidate fixes for a training job on `device`, ranked: applicable fixes by (class, compute,
// transfer), then the skipped ones. When no single-GPU fix of the free, recompute and numerics
// classes fits alone, a "combined" fix stacks them in rank order until the job fits.
// Throws Error(unsupported) for serving jobs, and what predict() throws for a bad job.
std::vector<Fix> advise(const ModelSpec& model, const Job& job, const Device& device, double headroom = 0.05,
                        const std::string& allocator_conf = "");

}  // namespace membudget
