// src/model/step_plan.hpp: the torch training step compiled in the micro-batch and sequence length.
//
// A scheduler asks about one model and recipe at many (micro-batch, sequence) points. Every
// tensor of the simulated step has a size c · b^i · s^j (c from the model and the recipe), and the
// allocator counts it rounded up to 512 B. So the live bytes at any moment of the step are a sum
// over a small basis: a constant, the exact polynomial terms b^i·s^j (tensors whose c is a
// multiple of 512 are never rounded), and one term round512(c · b^i · s^j) per other size class.
// A phase peak is the largest live value over the moments of that phase: the maximum of a set of
// vectors dotted with the basis evaluated at (b, s). StepPlan holds those vectors, pruned to the
// ones no other vector dominates, and answers a new (b, s) with a few hundred multiply-adds.
//
// compile() finds the vectors by simulation (src/model/step_plan.cpp says how and what it checks)
// and returns nullptr when the step does not have this form; the caller then simulates.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd_sim.hpp"
#include "inventory.hpp"
#include "membudget/budget.hpp"
#include "plan_common.hpp"

namespace membudget::detail {

class StepPlan {
 public:
  static constexpr std::size_t kPhases = 4;  // floor, forward_peak, backward_peak, optimizer_peak

  // The regime of a job: the chunked loss computes min(loss_chunk, b·s) logits rows, a different
  // size class on either side of b·s = loss_chunk (bit 0); a sliding window on every layer makes
  // transformers build an SDPA mask from s = window on (bit 1; sliding_window_mask in
  // inventory.hpp); eager attention and SDPA's math kernel at micro-batch 1 fold b·a as views, where
  // a larger batch copies, and so does SP's all-gather concat (bit 2, kBatchOne:
  // stream_differs_at_batch_one; its probes keep b = 1, so its plan is the batch-1 step's). Plans
  // are compiled per regime.
  static constexpr int kBatchOne = 4;
  static int regime(const ModelSpec& m, const Job& job);

  // Compiles the torch-profile training step of `m` under `job` (its batch and seq are ignored;
  // regime(m, job) is). nullptr when the step is not expressible or a check fails.
  static std::shared_ptr<const StepPlan> compile(const ModelSpec& m, const Job& job);

  // This thread's plan for (m, job), compiled on first use (validating m); nullptr when the step
  // does not compile. The job must be valid. At most 256 plans per thread, cleared when full.
  static const StepPlan* cached(const ModelSpec& m, const Job& job);
  // The plans of every stage of a pipeline job whose rank is not given (stage r's at index r),
  // found with one lookup: what a most-loaded-stage search over new shapes asks each time. nullptr
  // when a stage does not compile. Valid until this thread's next call.
  static const std::vector<std::shared_ptr<const StepPlan>>* stage_plans(const ModelSpec& m, const Job& job);
  // Whether plans cover the job at all: a pipeline's plan is one stage's (the job's rank; predict()
  // and estimate() choose the most loaded stage from the stages' plans).
  static bool covers(const Job& job) noexcept { return job.parallel.pipeline <= 1 || job.parallel.rank.has_value(); }
  // The unit the plan's sequence variable counts in: the tensor-parallel degree under sequence
  // parallelism (the plan is in the local sequence s / t), times the context-parallel degree (a
  // rank's share of the sequence), else 1.
  static std::uint64_t seq_unit(const Job& job) noexcept {
    return (job.parallel.sequence_parallel ? job.parallel.tensor : 1) * job.parallel.context;
  }
  static void clear_cache() noexcept;

  struct Result {
    std::array<bytes_t, kPhases> steady{}, step0{};
    bytes_t activations = 0;  // activation tensors live at the end of the forward (steady state)
  };
  // The step at micro-batch b and sequence s (b, s ≥ 1, in the plan's regime; s a multiple of
  // seq_unit). Throws Error(overflow) when a size does not fit 64 bits.
  Result evaluate(std::uint64_t b, std::uint64_t s) const;
  // At least every phase of evaluate(b, s), of both steps, for a few multiply-adds: what lets a
  // search over several plans (a pipeline's stages) skip the ones that cannot hold the peak.
  bytes_t peak_bound(std::uint64_t b, std::uint64_t s) const { return rows_.upper_bound(b, local_seq(s)); }

  // Everything simulate_torch_train(m, job at (b, s), false) returns except the section peaks:
  // phases, model states, and the tensors live after the forward by name.
  TorchStepResult result(std::uint64_t b, std::uint64_t s) const;

  // Independent of b and s.
  bytes_t weights = 0, gradients = 0, optimizer_state = 0, master = 0;
  bytes_t host_parameters = 0, host_gradients = 0, host_optimizer_state = 0;  // FSDP2's CPU offload

  // Introspection for tests and benchmarks.
  std::size_t basis_size() const { return rows_.basis().size(); }
  std::size_t rows() const { return rows_.rows(); }

 private:
  std::uint64_t local_seq(std::uint64_t s) const;
  plan::PhaseRows rows_;  // steady phases, then step-0 phases, in (b, s / seq_unit_)
  std::uint64_t seq_unit_ = 1;
  std::vector<std::uint64_t> activations_;        // one row
  std::vector<std::uint64_t> logits_, states_;    // logits/loss and model-state tensors after the forward
  struct Group {                                  // tensors of one name after the forward
    TensorInfo info;                              // name, op, dtype, shape, term (static strings)
    std::uint64_t count = 0;
    std::vector<std::uint64_t> row;
  };
  std::array<std::vector<Group>, 2> groups_;      // [0] activations, [1] logits/loss
  friend struct PlanBuilder;
};

// The three shapes (b, s / seq_unit) at which compile() simulates the job's regime (step_plan.cpp
// says why these); throws plan::Fail where the regime has none. The reserved-memory replay's
// compiled stream (reserved.cpp) probes at the same shapes.
std::array<plan::Probe, 3> training_probes(const ModelSpec& m, const Job& job);

// How many compile() calls returned nullptr (tests assert none did for the shipped configs).
std::uint64_t step_plan_failures();

}  // namespace membudget::detail
