// src/model/optimizer_loop.hpp: a for-loop optimizer step as the allocations it makes (internal).
//
// torch.optim's for-loop implementations (foreach=False) step one parameter after the other, and
// each parameter's temporaries live until the next parameter's statement rebinds their Python name:
// the step's peak is two neighbouring parameters' temporaries together, which only the parameters'
// order and shapes decide. The simulated step counts the loop's peak (OptimizerCost::transient);
// the reserved-memory replay runs the loop itself (SimTrace::optimizer_loop).
#pragma once

#include <cstdint>
#include <vector>

#include "membudget/spec.hpp"

namespace membudget::detail {

// One allocation or free of the loop, in the order torch makes them: `bytes` > 0 allocates block
// `id` (the request's bytes, as the allocator is asked), `bytes` == 0 frees block `id`.
struct LoopOp {
  std::uint32_t id = 0;
  bytes_t bytes = 0;
  bool operator==(const LoopOp&) const = default;
};

// torch.optim.Adafactor's for-loop step (_single_tensor_adafactor, torch/optim/_adafactor.py,
// torch's default for Adafactor) over `tensors` in model.parameters() order, its gradients and
// factored state `elem` bytes per value (the optimizer's state dtype: the parameters' own).
std::vector<LoopOp> adafactor_for_loop(const std::vector<ParamTensor>& tensors, bytes_t elem);

// torch.optim.AdamW's for-loop step (_single_tensor_adam, adam.py:545: denom =
// (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)) over `tensors` in model.parameters()
// order, its state `elem` bytes per value: per parameter the sqrt, then the quotient `denom` keeps
// until the next parameter's; the sqrt dies with the statement.
std::vector<LoopOp> adamw_for_loop(const std::vector<ParamTensor>& tensors, bytes_t elem);

// The most bytes memory_allocated() counts above the loop's start at any point of `ops` (each
// block as the allocator counts it, given a segment of its own: own_segment_block).
bytes_t loop_peak(const std::vector<LoopOp>& ops);

}  // namespace membudget::detail
