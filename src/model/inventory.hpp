// src/model/inventory.hpp: the inventory activation models (internal).
#pragma once

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
};

// Hugging Face transformers 5.x on PyTorch 2.11 (profile "torch").
TorchStepResult simulate_torch_train(const ModelSpec& m, const Job& job, bool explain);

}  // namespace membudget::detail
