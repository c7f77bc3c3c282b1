// src/model/inventory.hpp: the inventory activation models (internal).
#pragma once

#include <algorithm>
#include <array>
#include <vector>

#include "membudget/budget.hpp"

namespace membudget::detail {

struct TorchStepResult {
  std::vector<PhasePeak> steady;  // floor, forward_peak, backward_peak, optimizer_peak
  std::vector<PhasePeak> step0;
  bytes_t weights = 0, gradients = 0, optimizer_state = 0, master = 0;
  // FSDP2's CPU offload: what the rank keeps in host memory instead (pinned shards and gradients,
  // the optimizer's state)
  bytes_t host_parameters = 0, host_gradients = 0, host_optimizer_state = 0;
  // live at the end of the forward (steady state), by term
  bytes_t after_forward_activations = 0, after_forward_logits = 0, after_forward_autocast = 0;
  std::vector<TensorBytes> saved;         // activations live after forward, grouped by name
  std::vector<TensorBytes> saved_logits;  // logits/loss tensors live after forward
};

// Hugging Face transformers 5.x on PyTorch 2.11 (profile "torch").
// `sizing` (default: m) is the model whose parameter count sizes the optimizer state; the fast
// path simulates a few-layer copy of the model with the full model's optimizer.
// `traces` (optional) receives the allocation streams of the two passes (0: step 0, 1: steady).
struct SimTrace;
TorchStepResult simulate_torch_train(const ModelSpec& m, const Job& job, bool explain,
                                     const ModelSpec* sizing = nullptr, std::array<SimTrace, 2>* traces = nullptr);

// The micro-batches a training step's walk runs of job.grad_accum_steps: at most three. The first
// makes the gradients; every later one finds them allocated (and its inputs, activations and
// gradient temporaries the same) and adds into them in place, so from the second on each makes the
// same allocations on the same live set, and the third runs on the allocator's layout the second
// left (the reserved replay's). The allocated phases are exact for any count; the reserved ones
// take the third micro-batch's as every later one's, as the steady step stands for every later step.
inline std::uint64_t simulated_accum_steps(const Job& job) noexcept {
  return job.mode == Mode::train ? std::min<std::uint64_t>(job.grad_accum_steps, 3) : 1;
}

// Whether the step runs SDPA with a materialised sliding-window mask (a different allocation
// stream: the step plan compiles it as its own regime).
bool sliding_window_mask(const ModelSpec& m, const Job& job);

// Whether attention's matmuls fold the batch into the heads (b·a) as views: a tensor laid out
// b·s·a·hd (the query, the output's gradient, the keys and values where they are not repeated)
// folds without a copy only where the batch is 1.
bool matmul_folds_batch_as_view(const Job& job);
// Whether some layer's attention runs such matmuls (so that the batch-1 step allocates a different
// stream: the step plan compiles it as its own regime): eager attention, and SDPA's math kernel,
// which runs in fp32 under GQA without a mask (attention_runs_as_matmuls; a masked layer runs the
// memory-efficient kernel, so this may hold where every layer is masked).
bool attention_folds_batch(const ModelSpec& m, const Job& job);
// Whether the batch-1 step allocates a different stream than a larger batch's (the step plan's
// batch-1 regime, StepPlan::kBatchOne): attention that folds the batch (above), or sequence
// parallelism's all-gathers, whose sequence concat is a view only at batch 1 (Step::sp_all_gather).
bool stream_differs_at_batch_one(const ModelSpec& m, const Job& job);

// The highest decoder layer whose checkpoint frame is the last to hold one of the model's
// attention masks (each frame holds the mask its layer was called with: Step::layer_mask), so its
// backward frees that mask where the layers above it free nothing: Gemma 2's layer 1 under eager
// attention and full recompute (the full layers' mask; layer 0 holds the sliding one). 0 where
// layer 0 is the last holder of every mask, or there is no mask or no checkpoint.
std::uint64_t last_mask_holder(const ModelSpec& m, const Job& job);

// The same result without the explain lists and the section peaks, from this thread's compiled plan
// for (m, job) (src/model/step_plan.hpp); the full simulation when the step does not compile.
TorchStepResult simulate_torch_train_fast(const ModelSpec& m, const Job& job);

}  // namespace membudget::detail
