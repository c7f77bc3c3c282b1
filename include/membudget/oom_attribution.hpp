// membudget/oom_attribution.hpp: which budget term a failed allocation most likely belongs to.
//
// Given an out-of-memory report and the model and job that raised it, the prediction's live tensors
// at each phase peak are searched for one whose size matches the failed request (PyTorch prints the
// request rounded to the allocator's block or segment size, so sizes within 2 MiB or 2% match).
#pragma once

#include <optional>
#include <string>

#include "membudget/budget.hpp"
#include "membudget/oom.hpp"

namespace membudget {

struct OomAttribution {
  bool matched = false;      // a tensor of that size exists in the prediction
  std::string term;          // "logits_loss", "activations", "model_states", …
  std::string tensor;        // the inventory's name, e.g. "log-softmax output (saved by the loss)"
  std::string phase;         // the phase whose peak holds it, e.g. "forward_peak"
  bytes_t tensor_bytes = 0;  // predicted size of one such tensor
  bytes_t predicted_peak = 0;
  bytes_t predicted_required = 0;  // peak + overhead
  std::string note;          // one sentence for people
};

// Throws what predict() throws for a bad model or job.
OomAttribution attribute_oom(const OomReport& report, const ModelSpec& model, const Job& job);

// to_json(report, context) with one more key, "attribution": {"matched", "term", "tensor",
// "phase", "tensor_bytes", "predicted_peak", "predicted_required", "note"}.
std::string to_json(const OomReport& report, const OomContext& context, const OomAttribution& attribution,
                    int indent = -1);

}  // namespace membudget
