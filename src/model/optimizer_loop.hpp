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

// The global-memory staging buffer ATen's CUDA reduction kernel allocates (Reduce.cuh,
// setReduceConfig and ReduceConfig::global_memory_size, torch 2.11) to reduce `outputs` values of
// `inputs_per_output` each, accumulated in 4-byte floats, from a contiguous tensor. `along_fastest`:
// the reduced dimension is the contiguous one (a row norm), else a strided one (a column norm).
// `inner_outputs` (strided only): the extent of the outputs' contiguous dimension, which the
// kernel's vector width divides (0: `outputs`). Zero when the kernel reduces within its blocks. The
// grid is sized for kReduceSms multiprocessors.
struct ReduceStaging {
  bytes_t buffer = 0;     // the partial results of the blocks that share an output
  bytes_t semaphores = 0; // one int per output block column (0 with no buffer)
};
// H100 and H200 (the measured GPUs): 132 multiprocessors of 2,048 threads. The buffer of a large
// column norm scales with the count (an A100's 108 would make the embedding's 108 MiB, not 132).
inline constexpr std::uint64_t kReduceSms = 132;
inline constexpr std::uint64_t kReduceThreadsPerSm = 2048;
ReduceStaging cuda_reduce_staging(std::uint64_t outputs, std::uint64_t inputs_per_output, bool along_fastest,
                                  std::uint64_t inner_outputs = 0);

// torch.optim.Adafactor's for-loop step (_single_tensor_adafactor, torch/optim/_adafactor.py,
// torch's default for Adafactor) over `tensors` in model.parameters() order, its gradients and
// factored state `elem` bytes per value (the optimizer's state dtype: the parameters' own).
std::vector<LoopOp> adafactor_for_loop(const std::vector<ParamTensor>& tensors, bytes_t elem);

// The most bytes memory_allocated() counts above the loop's start at any point of `ops` (each
// block as the allocator counts it, given a segment of its own: own_segment_block).
bytes_t loop_peak(const std::vector<LoopOp>& ops);

}  // namespace membudget::detail
