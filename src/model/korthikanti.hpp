// src/model/korthikanti.hpp: the textbook activation model and the logits/loss breakdown.
#pragma once

#include "membudget/budget.hpp"

namespace membudget::detail {

// Korthikanti et al. 2022 (arXiv 2205.05198) Table 2 with fused-attention, gated-MLP and GQA
// variants; see korthikanti.cpp for the line-by-line terms.
ActivationsBreakdown korthikanti(const ModelSpec& m, const Job& job);
// Its total (per layer × layers) without building the lists.
bytes_t korthikanti_total(const ModelSpec& m, const Job& job);

// Logits, their fp32 upcast in the loss, the loss's saved log-softmax and the logits' gradient.
LogitsLossBreakdown logits_breakdown(const ModelSpec& m, const Job& job);

// Serving (mode infer) and the harness profile fill the budget themselves.
void predict_infer(Budget& b, const PredictOptions& options);
void predict_harness(Budget& b, const PredictOptions& options);
// membudget's own inference step (profile harness, mode infer): docs/harness.md.
void predict_harness_infer(Budget& b, const PredictOptions& options);

}  // namespace membudget::detail
