// src/model/cuda_reduce.hpp: the staging buffer of ATen's CUDA reductions (internal).
//
// A reduction whose outputs each sum many values splits them over several thread blocks when the
// grid would otherwise leave multiprocessors idle, and the blocks' partial results meet in a
// global-memory buffer the kernel allocates through the caching allocator and frees when it
// returns. The buffer shows in the snapshots as a transient the size of no tensor: 32 MiB for a
// 2048 × 2048 column norm (Adafactor's), 132 MiB for Llama 3.1 8B's norm-weight gradients at
// 4 × 4096 tokens.
#pragma once

#include <array>
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

// A temporary whose size a CUDA kernel derives from its launch configuration rather than from a
// tensor's shape: its arguments are monomials in the micro-batch and the sequence, its bytes are
// not (they start at some size, saturate, or round). The simulation keeps the arguments with the
// tensor so that the compiled plans and streams evaluate the kernel's rule at any shape
// (plan_common.hpp, Kind::launch; reserved.cpp).
struct LaunchSize {
  enum class Kind : std::uint8_t {
    none,
    reduce_buffer,      // cuda_reduce_staging's buffer: outputs, inputs per output, inner outputs
    reduce_semaphores,  // its semaphores: the same arguments
    // embedding_dense_backward_cuda (EmbeddingBackwardKernel.cu) sizes its partial segments for the
    // most there can be, numel / NROWS_PER_THREAD + min(numel, num_weights), to avoid a device
    // sync: their fp32 sums (× the row width) and their offsets (int64); none up to 3,072 indices,
    // which one kernel adds straight into the gradient. Arguments: indices, embedding rows, row width.
    embedding_partial_sums,
    embedding_partial_offsets,
    sum,  // a request of several parts of different shapes (flash attention's backward workspace)
    // the fp32 memory-efficient attention backward's dq accumulators (mem_efficient_grad_q_bytes):
    // arguments batch × heads, queries, head_dim
    mem_efficient_grad_q,
  };
  Kind kind = Kind::none;
  bool along_fastest = false;  // reduce_*
  std::array<std::uint64_t, 3> args{};
  bool operator==(const LaunchSize&) const = default;
};
// The workspace ATen's fp32 memory-efficient attention backward allocates (attention_backward.cu,
// Params::workspace_size, torch 2.11): per batch and head, one GradQTempStorage per block of
// kBlockSizeI queries and kBlockSizeJ head-dim columns, a 16-byte lock-and-counter header and the
// block's fp32 dq tile. On sm80 and later the fp32 kernels of head_dim up to 128 tile 64 x 128
// (fmha_cutlassB_f32_aligned_64x128_k128_sm80: Mistral 7B's 32 heads of 128 at 6,144 tokens ask
// 100,712,448 bytes, tests/data/common_heldout/), wider heads 128 x 64 (the k65536 kernel:
// DeepSeek-V2-Lite's 16 heads of 192 at 1,024 tokens ask 12,589,056 bytes, 24 tiles a head where
// 64 x 128 would make 32, tests/data/attention_fix_heldout/).
bytes_t mem_efficient_grad_q_bytes(std::uint64_t batch_heads, std::uint64_t queries, std::uint64_t head_dim);
// The bytes at these arguments (Error(overflow) past 2^64).
bytes_t launch_bytes(const LaunchSize& l);
// The reduction of `outputs` values of `inputs_per_output` each (cuda_reduce_staging's arguments):
// its buffer, then its semaphores.
std::array<LaunchSize, 2> reduce_launch(std::uint64_t outputs, std::uint64_t inputs_per_output, bool along_fastest,
                                        std::uint64_t inner_outputs = 0);

}  // namespace membudget::detail
