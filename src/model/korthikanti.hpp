// src/model/korthikanti.hpp: the textbook activation model (--activations korthikanti).
#pragma once

#include "membudget/budget.hpp"

namespace membudget::detail {

// Korthikanti et al. 2022 (arXiv 2205.05198) Table 2 with fused-attention, gated-MLP and GQA
// variants; see korthikanti.cpp for the line-by-line terms.
ActivationsBreakdown korthikanti(const ModelSpec& m, const Job& job);
// Its total (per layer × layers) without building the lists.
bytes_t korthikanti_total(const ModelSpec& m, const Job& job);

}  // namespace membudget::detail
