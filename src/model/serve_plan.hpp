// src/model/serve_plan.hpp: the serving walk (serving.cpp) compiled in the batch and prompt length.
//
// The same idea as StepPlan (step_plan.hpp, plan_common.hpp) for `--mode infer`: a prefill of b
// prompts of s tokens and one decode step. The decode step's KV cache has b · (s + 1) tokens, so the
// basis here has terms in s + 1 as well. Sliding-window layers keep min(s, window) tokens: plans are
// compiled per side of s = window. Models are simulated at their full depth (the walk has no
// layer sections), four times per plan.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd_sim.hpp"
#include "membudget/budget.hpp"
#include "plan_common.hpp"

namespace membudget::detail {

struct ServeStepResult {
  bytes_t weights = 0;              // the weights as loaded
  bytes_t floor = 0;                // weights, cuBLAS workspace and the prompt ids
  std::vector<PhasePeak> phases;    // prefill_peak, decode_peak
};
// The walk itself (serving.cpp): a transformers prefill and one decode step.
ServeStepResult simulate_serving(const ModelSpec& m, const Job& job, bool explain, SimTrace* trace = nullptr);

// The budget's activations term for serving: the prefill peak beyond the floor and the KV cache.
inline bytes_t serving_activations(bytes_t prefill, bytes_t floor, bytes_t kv) {
  const bytes_t above = prefill > floor ? prefill - floor : 0;
  return above > kv ? above - kv : 0;
}

class ServePlan {
 public:
  static constexpr std::size_t kPhases = 3;  // floor, prefill_peak, decode_peak
  // 1 when a prompt reaches a sliding window (s ≥ window: its mask, the window kept after the
  // decode step), 2 at s = window - 1 (only the decode step's keys reach it: not compiled), else 0.
  static int regime(const ModelSpec& m, const Job& job);
  // nullptr when the walk does not compile (a check fails).
  static std::shared_ptr<const ServePlan> compile(const ModelSpec& m, const Job& job);
  // This thread's plan for (m, job), compiled on first use (plan_cache.hpp). The job must be valid.
  static const ServePlan* cached(const ModelSpec& m, const Job& job);
  static void clear_cache() noexcept;

  // floor, prefill peak, decode peak at batch b and prompt length s. Throws Error(overflow).
  std::array<bytes_t, kPhases> evaluate(std::uint64_t b, std::uint64_t s) const;

  bytes_t weights = 0;
  std::size_t basis_size() const { return rows_.basis().size(); }
  std::size_t rows() const { return rows_.rows(); }

 private:
  plan::PhaseRows rows_;
  friend struct ServePlanBuilder;
};

// How many ServePlan::compile() calls returned nullptr.
std::uint64_t serve_plan_failures();

}  // namespace membudget::detail
