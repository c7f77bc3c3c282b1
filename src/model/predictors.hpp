// src/model/predictors.hpp: the predictors predict() (predict.cpp) dispatches to, by mode and profile.
//
//   mode train, profile torch    simulate_torch_train / _fast (inventory.hpp), filled in predict.cpp
//   mode infer, profile torch    predict_infer          (serving.cpp)
//   mode train, profile harness  predict_harness        (inventory_harness.cpp)
//   mode infer, profile harness  predict_harness_infer  (inventory_harness.cpp)
// Each fills the budget predict() hands it (model, job, parameters and overhead already set): model
// states, activations, logits and loss, KV cache, and the phase peaks. The compiled plans of the
// API (step_plan.hpp, serve_plan.hpp) give the same numbers for the torch profile.
#pragma once

#include "membudget/budget.hpp"

namespace membudget::detail {

// Error(unsupported) for a (model, job) no predictor simulates yet: a mixture of experts served
// with quantised weights. MoE training is the torch inventory's (check_torch_coverage says which
// MoE jobs), the harness refuses MoE, and vLLM's sizing refuses it (fused MoE kernels).
void check_simulated(const ModelSpec& m, const Job& job);
// --experts eager: the expert iterations one walk of the step runs (experts × MoE layers × the
// micro-batches walked: a pipeline rank's share of the microbatches, or simulated_accum_steps), in
// 128 bits (the counts are not validated yet where it is asked).
unsigned __int128 eager_expert_iterations(const ModelSpec& m, const Job& job);

// Serving (mode infer) with the torch profile: docs/serving.md.
void predict_infer(Budget& b, const PredictOptions& options);
// membudget's own training step (profile harness): docs/harness.md.
void predict_harness(Budget& b, const PredictOptions& options);
// membudget's own inference step (profile harness, mode infer): docs/harness.md.
void predict_harness_infer(Budget& b, const PredictOptions& options);

// The logits/loss term of a torch training step: the logits, their fp32 upcast in the loss, the
// loss's saved log-softmax and the logits' gradient (per chunk with --loss chunked), for the rank
// the job is: a vocabulary shard's under --loss-parallel, nothing on a pipeline stage that is not
// the last (one microbatch's on the last). predict() and the compiled plans' estimate() both read it.
LogitsLossBreakdown logits_breakdown(const ModelSpec& m, const Job& job);

}  // namespace membudget::detail
