// src/model/cuda_reduce.hpp: the staging buffer of ATen's CUDA reductions (internal).
//
// A reduction whose outputs each sum many values splits them over several thread blocks when the
// grid would otherwise leave multiprocessors idle, and the blocks' partial results meet in a
// global-memory buffer the kernel allocates through the caching allocator and frees when it
// returns. The buffer shows in the snapshots as a transient the size of no tensor: 32 MiB for a
// 2048 × 2048 column norm (Adafactor's), 132 MiB for Llama 3.1 8B's norm-weight gradients at
// 4 × 4096 tokens.
#pragma once

#include <cstdint>

#include "membudget/bytes.hpp"

namespace membudget::detail {

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

}  // namespace membudget::detail
