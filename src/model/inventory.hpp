// src/model/inventory.hpp: the inventory activation models (internal).
#pragma once

#include <array>
#include <vector>

#include "membudget/budget.hpp"

namespace membudget::detail {

struct TorchStepResult {
  std::vector<PhasePeak> steady;  // floor, forward_peak, backward_peak, optimizer_peak
  std::vector<PhasePeak> step0;
  bytes_t weights = 0, gradients = 0, optimizer_state = 0, master = 0;
  // live at the end of the forward (steady state), by term
  bytes_t after_forward_activations = 0, after_forward_logits = 0, after_forward_autocast = 0;
  std::vector<TensorBytes> saved;         // activations live after forward, grouped by name
  std::vector<TensorBytes> saved_logits;  // logits/loss tensors live after forward
  // For the fast path: [phase][section] peaks of each pass (phases as AutogradSim numbers them:
  // 0 floor, 1 forward_peak, 2 backward_peak, 3 optimizer_peak; sections 0 before the layers,
  // 1 + i layer i, L + 1 after them).
  std::vector<std::vector<bytes_t>> steady_sections, step0_sections;
};

// Hugging Face transformers 5.x on PyTorch 2.11 (profile "torch").
// `sizing` (default: m) is the model whose parameter count sizes the optimizer state; the fast
// path simulates a few-layer copy of the model with the full model's optimizer.
// `traces` (optional) receives the allocation streams of the two passes (0: step 0, 1: steady).
struct SimTrace;
TorchStepResult simulate_torch_train(const ModelSpec& m, const Job& job, bool explain,
                                     const ModelSpec* sizing = nullptr, std::array<SimTrace, 2>* traces = nullptr);

// The same result without the explain lists, computed from simulations of 4, 5 and 6 layers and
// extrapolated exactly in the layer count (src/model/fast_step.cpp). Falls back to
// simulate_torch_train when the layer pattern is not affine (checked on every call).
TorchStepResult simulate_torch_train_fast(const ModelSpec& m, const Job& job);
// How many fast-path calls fell back to the full simulation (tests assert none did).
std::uint64_t fast_path_fallbacks();

}  // namespace membudget::detail
