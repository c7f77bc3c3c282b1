// src/model/cuda_reduce.cpp: see cuda_reduce.hpp.
#include "cuda_reduce.hpp"

#include <algorithm>
#include <bit>

namespace membudget::detail {

namespace {

std::uint64_t div_up(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }
// ATen's last_pow2: the largest power of two not above n, at least 1
std::uint64_t last_pow2(std::uint64_t n) { return std::max<std::uint64_t>(1, std::bit_floor(n)); }

}  // namespace

ReduceStaging cuda_reduce_staging(std::uint64_t outputs, std::uint64_t inputs_per_output, bool along_fastest,
                                  std::uint64_t inner_outputs) {
  constexpr std::uint64_t kMaxThreads = 512, kWarp = 32, kInputVec = 4;
  constexpr std::uint64_t kMinValuesPerThread = 16, kMaxValuesPerThread = 256;
  if (outputs == 0 || inputs_per_output == 0) return {};
  // block.x along the fastest-moving dimension: the reduced one, or the outputs
  std::uint64_t dim0 = along_fastest ? inputs_per_output : outputs;
  const std::uint64_t dim1 = along_fastest ? outputs : inputs_per_output;
  std::uint64_t output_vec = 1;
  if (along_fastest) {
    if (dim0 > 128) dim0 /= kInputVec;  // "vectorize along input"
  } else {
    // "vectorize along output" (get_output_vec_size): 4, 2 or 1, dividing the contiguous extent
    const std::uint64_t inner = inner_outputs ? inner_outputs : outputs;
    output_vec = inner % 4 == 0 ? 4 : inner % 2 == 0 ? 2 : 1;
    dim0 /= output_vec;
  }
  // ReduceConfig::set_block_dimension
  const std::uint64_t max_threads = kMaxThreads / output_vec;
  const std::uint64_t dim0_pow2 = dim0 < max_threads ? last_pow2(dim0) : max_threads;
  const std::uint64_t dim1_pow2 = dim1 < max_threads ? last_pow2(dim1) : max_threads;
  std::uint64_t block_width = std::min(dim0_pow2, kWarp);
  const std::uint64_t block_height = std::min(dim1_pow2, max_threads / block_width);
  block_width = std::min(dim0_pow2, max_threads / block_height);
  const std::uint64_t threads = block_width * block_height;
  // the lanes split the input (block_x_reduce) or the outputs; the warps split the input when
  // each thread is left at least warp_split_threshold values
  std::uint64_t step_input = 1, step_output = 1;
  (along_fastest ? step_input : step_output) *= block_width;
  const bool warps_split_input = div_up(inputs_per_output, step_input) >= std::min(block_height * 16, kMaxValuesPerThread);
  (warps_split_input ? step_input : step_output) *= block_height;
  // the blocks split the input too (a reduction through global memory) when each thread still has
  // max_values_per_thread values and the grid leaves SMs idle
  const std::uint64_t target_grid = kReduceSms * (kReduceThreadsPerSm / threads);
  const std::uint64_t grid_x = div_up(outputs / output_vec, step_output);
  const std::uint64_t values_per_thread = div_up(inputs_per_output, step_input);
  if (!warps_split_input || values_per_thread < kMaxValuesPerThread || grid_x > target_grid) return {};
  const std::uint64_t ctas_per_output =
      std::max(std::min(div_up(target_grid, grid_x), div_up(values_per_thread, kMinValuesPerThread)),
               div_up(values_per_thread, kMaxValuesPerThread));
  if (ctas_per_output <= 1) return {};
  // global_memory_size: an accumulator per output and block; per lane and vector too when the
  // lanes do not reduce among themselves
  bytes_t buffer = checked_product("reduction staging", 4, outputs, ctas_per_output);
  if (!along_fastest) buffer = checked_mul(buffer, block_width * output_vec, "reduction staging");
  return {buffer, checked_mul(4, grid_x, "reduction semaphores")};
}

bytes_t mem_efficient_grad_q_bytes(std::uint64_t batch_heads, std::uint64_t queries, std::uint64_t head_dim) {
  constexpr std::uint64_t kHeaderFloats = 4;
  const std::uint64_t kBlockQueries = head_dim <= 128 ? 64 : 128, kBlockColumns = head_dim <= 128 ? 128 : 64;
  const auto ceil_div = [](std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0); };  // a + b - 1 may wrap
  const std::uint64_t blocks = checked_mul(ceil_div(queries, kBlockQueries), ceil_div(head_dim, kBlockColumns), "attention workspace");
  return checked_product("attention workspace", batch_heads, blocks, (kBlockQueries * kBlockColumns + kHeaderFloats) * 4);
}

bytes_t launch_bytes(const LaunchSize& l) {
  const auto [a0, a1, a2] = l.args;
  switch (l.kind) {
    case LaunchSize::Kind::none: return 0;
    case LaunchSize::Kind::reduce_buffer: return cuda_reduce_staging(a0, a1, l.along_fastest, a2).buffer;
    case LaunchSize::Kind::reduce_semaphores: return cuda_reduce_staging(a0, a1, l.along_fastest, a2).semaphores;
    case LaunchSize::Kind::sum: return checked_add(checked_add(a0, a1, "kernel workspace"), a2, "kernel workspace");
    case LaunchSize::Kind::mem_efficient_grad_q: return mem_efficient_grad_q_bytes(a0, a1, a2);
    case LaunchSize::Kind::embedding_partial_sums:
    case LaunchSize::Kind::embedding_partial_offsets: {
      // up to 3,072 indices (without scale_grad_by_freq) one kernel adds the rows straight into
      // the zeroed gradient: no sort, no segments
      if (a0 <= 3072) return 0;
      constexpr std::uint64_t kRowsPerThread = 10;  // NROWS_PER_THREAD
      const std::uint64_t segments = a0 / kRowsPerThread + std::min(a0, a1);
      if (l.kind == LaunchSize::Kind::embedding_partial_offsets) return checked_mul(segments, 8, "embedding partial segments");
      return checked_product("embedding partial sums", segments, a2, 4);
    }
  }
  return 0;
}

std::array<LaunchSize, 2> reduce_launch(std::uint64_t outputs, std::uint64_t inputs_per_output, bool along_fastest,
                                        std::uint64_t inner_outputs) {
  const std::array<std::uint64_t, 3> args{outputs, inputs_per_output, inner_outputs};
  return {LaunchSize{LaunchSize::Kind::reduce_buffer, along_fastest, args},
          LaunchSize{LaunchSize::Kind::reduce_semaphores, along_fastest, args}};
}

}  // namespace membudget::detail
