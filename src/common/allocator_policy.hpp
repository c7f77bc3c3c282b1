// src/common/allocator_policy.hpp: PyTorch's CUDA caching allocator policy, as one value.
//
// The instrumented allocator (src/measure/allocator.hpp) runs it and the simulator
// (src/model/autograd_sim.hpp: round512, own_segment_block) predicts with it, so the rounding,
// the pools and the split rules are written here only. Source: c10/cuda/CUDACachingAllocator.cpp
// (round_size, get_allocation_size, should_split, get_free_block) and CUDAAllocatorConfig
// (the PYTORCH_CUDA_ALLOC_CONF settings: expandable_segments, max_split_size_mb,
// roundup_power2_divisions). The defaults are PyTorch's; a PYTORCH_CUDA_ALLOC_CONF reader would
// fill the last three fields.
//
//   * a request rounds up to a multiple of min_block_size (512 B, at least 512 B), or, where
//     roundup_power2_divisions gives n > 1 divisions for its power-of-two interval, to the next of
//     n equal steps between two powers of two;
//   * requests <= small_size (1 MiB) come from the small pool, whose segments are small_buffer
//     (2 MiB); larger ones from the large pool: below min_large_alloc (10 MiB) a large_buffer
//     (20 MiB) segment, else the request rounded up to round_large (2 MiB);
//   * a block is split when the remainder is >= min_block_size (small pool, or any pool with
//     expandable segments) or, in the large pool, > small_size and the request is below
//     max_split_size;
//   * a cached block at least max_split_size is not handed to a request below max_split_size, nor
//     one at least a large_buffer longer than the request to a request of max_split_size or more;
//   * with expandable segments, each pool maps pages (small_buffer, large_buffer) into one growing
//     segment instead of allocating segments.
//   Worked numbers: 1000 B → a 1024 B block of a new 2 MiB small segment; 5 MiB → a 5 MiB block of a
//   new 20 MiB segment; 30,000,000 B → 30,000,128 B in a 31,457,280 B (15 × 2 MiB) segment.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <limits>

#include "membudget/bytes.hpp"

namespace membudget {

struct AllocatorPolicy {
  // c10's constants (kMinBlockSize, kSmallSize, kSmallBuffer, kMinLargeAlloc, kLargeBuffer,
  // kRoundLarge).
  bytes_t min_block_size = 512;
  bytes_t small_size = 1 * MiB;
  bytes_t small_buffer = 2 * MiB;
  bytes_t min_large_alloc = 10 * MiB;
  bytes_t large_buffer = 20 * MiB;
  bytes_t round_large = 2 * MiB;
  // PYTORCH_CUDA_ALLOC_CONF settings.
  bool expandable_segments = false;
  bytes_t max_split_size = std::numeric_limits<bytes_t>::max();  // max_split_size_mb; unlimited
  // Divisions per power-of-two interval of the request size, from [1 MiB, 2 MiB) (and below) to
  // [32 GiB, 64 GiB) (and above); 0 or 1: plain 512-byte rounding.
  std::array<std::uint32_t, 16> roundup_power2_divisions{};

  bool operator==(const AllocatorPolicy&) const = default;

  // The block size of a request of `bytes` (> 0): c10 round_size.
  constexpr bytes_t round_size(bytes_t bytes) const {
    if (bytes < min_block_size) return min_block_size;
    const bytes_t divisions = divisions_for(bytes);
    if (divisions > 1 && bytes > min_block_size * divisions) return roundup_power2_next_division(bytes, divisions);
    return checked_mul((bytes - 1) / min_block_size + 1, min_block_size, "allocation rounding");
  }
  // Whether some request rounds to a power-of-two interval's divisions rather than to 512 bytes
  // (what memory_allocated() counts then grows with the setting).
  constexpr bool rounds_to_divisions() const {
    for (std::uint32_t d : roundup_power2_divisions)
      if (d > 1) return true;
    return false;
  }
  constexpr bool is_small(bytes_t rounded) const { return rounded <= small_size; }
  // The segment a block of `rounded` bytes gets when none is cached: c10 get_allocation_size.
  constexpr bytes_t segment_size(bytes_t rounded) const {
    if (is_small(rounded)) return small_buffer;
    if (rounded < min_large_alloc) return large_buffer;
    return checked_mul((rounded - 1) / round_large + 1, round_large, "allocation rounding");
  }
  // The page an expandable segment of the pool grows by.
  constexpr bytes_t page_size(bool small_pool) const { return small_pool ? small_buffer : large_buffer; }
  // c10 should_split: whether a block of `rounded` + `remaining` bytes is split for the request.
  constexpr bool should_split(bool small_pool, bytes_t rounded, bytes_t remaining) const {
    if (small_pool || expandable_segments) return remaining >= min_block_size;
    return rounded < max_split_size && remaining > small_size;
  }
  // c10 get_free_block's oversize rules: may the smallest cached block >= the request serve it?
  constexpr bool may_reuse(bytes_t rounded, bytes_t block) const {
    if (rounded < max_split_size && block >= max_split_size) return false;
    if (rounded >= max_split_size && block >= rounded + large_buffer) return false;
    return true;
  }
  // What memory_allocated() counts for a tensor of `bytes` (> 0) given a segment of its own: the
  // rounded request, or the whole segment when what would remain is too small to split off. A
  // tensor 1 MiB or less short of a 2 MiB multiple (and 10 MiB or more) holds its whole segment:
  // an 81 MiB fp32 Gemma 2 MLP weight is an 82 MiB block.
  constexpr bytes_t own_segment_block(bytes_t bytes) const {
    const bytes_t r = round_size(bytes);
    const bytes_t segment = segment_size(r);
    return should_split(is_small(r), r, segment - r) ? r : segment;
  }

 private:
  constexpr bytes_t divisions_for(bytes_t bytes) const {
    const int log2 = static_cast<int>(std::bit_width(bytes)) - 1;
    const int index = log2 < 20 ? 0 : log2 - 20 > 15 ? 15 : log2 - 20;  // 2^20 = 1 MiB
    return roundup_power2_divisions[static_cast<std::size_t>(index)];
  }
  // c10 roundup_power2_next_division: the next of `divisions` equal steps above the power of two
  // below `bytes` (a power of two is its own).
  static constexpr bytes_t roundup_power2_next_division(bytes_t bytes, bytes_t divisions) {
    if (std::has_single_bit(bytes)) return bytes;
    const bytes_t floor = std::bit_floor(bytes);
    const bytes_t step = floor >> (std::bit_width(divisions) - 1);
    if (step == 0) return floor << 1;
    const bytes_t below = bytes & ~(step - 1);
    return below == bytes ? bytes : below + step;
  }
};

// PyTorch's defaults (no PYTORCH_CUDA_ALLOC_CONF).
inline constexpr AllocatorPolicy kPyTorchAllocator{};

}  // namespace membudget
