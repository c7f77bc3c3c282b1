// src/measure/allocator.hpp: an instrumented caching allocator with PyTorch's policy and statistics.
//
// Policy (c10/cuda/CUDACachingAllocator.cpp, restated in ../shared/REFERENCE.md §5):
//   * every request is rounded up to a multiple of 512 B (minimum 512 B);
//   * requests <= 1 MiB come from the small pool, whose segments are 2 MiB;
//     larger requests come from the large pool: a request < 10 MiB gets a 20 MiB segment, a larger
//     one a segment rounded up to a multiple of 2 MiB;
//   * best fit among cached free blocks of the pool (one stream only here);
//   * a block is split when the remainder is >= 512 B (small pool) or > 1 MiB (large pool);
//     freed blocks coalesce with free neighbours of the same segment;
//   * on a miss: ask the raw memory for a segment; if that fails, release every cached segment
//     that is entirely free and retry once (num_alloc_retries += 1); if that fails too,
//     num_ooms += 1 and Error(out_of_memory) is thrown with PyTorch's figures.
//   Worked numbers: a 1000 B request becomes a 1024 B block carved from a new 2 MiB small segment
//   (allocated 1024, reserved 2 MiB); a 5 MiB request becomes a 5 MiB block from a new 20 MiB
//   segment (reserved 20 MiB, the 15 MiB remainder stays cached); a 30,000,000 B request is rounded
//   to 30,000,128 B and gets a segment of 31,457,280 B (15 × 2 MiB).
//
// Optional expandable-segments mode maps pages into one growing segment per pool (2 MiB pages for
// the small pool, 20 MiB for the large), so freed space is reused without fragmentation.
//
// Statistics mirror torch.cuda.memory_stats(): allocated, reserved, active, inactive_split and
// requested bytes, each with current and peak; reset_peak_stats() sets every peak to current.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "membudget/bytes.hpp"

namespace membudget::measure {

// Where the bytes under the allocator come from: cudaMalloc on a GPU, host memory on the CPU.
class RawMemory {
 public:
  virtual ~RawMemory() = default;
  // Returns nullptr when the memory is exhausted (never throws for that).
  virtual void* raw_alloc(std::size_t bytes) = 0;
  virtual void raw_free(void* ptr, std::size_t bytes) = 0;
  // Capacity and free bytes as the device reports them (cudaMemGetInfo on a GPU).
  virtual bytes_t capacity() const = 0;
  virtual bytes_t free_bytes() const = 0;
  virtual std::string name() const = 0;
};

// Host memory with an optional simulated capacity, so tests can drive retries and OOM.
std::unique_ptr<RawMemory> make_host_memory(bytes_t capacity);

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
};

struct AllocatorStats {
  Stat allocated;       // bytes of live blocks (rounded sizes): max_memory_allocated()
  Stat reserved;        // bytes of segments held from the raw memory: memory_reserved()
  Stat active;          // live blocks plus blocks freed but not yet reusable (same as allocated here)
  Stat inactive_split;  // free bytes inside segments that also hold live blocks
  Stat requested;       // bytes as requested, before rounding
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_segments = 0;
};

// What a tensor is, for the OOM report and the snapshot's frames.
struct AllocTag {
  std::string op;      // "rmsnorm_forward"
  std::string tensor;  // "layers.3.attn.q"
  std::string phase;   // "forward", "backward", "optimizer"
};

struct AllocatorOptions {
  bool expandable_segments = false;
  bool record_history = false;  // keep trace events for the snapshot
};

// One event of the allocation history (the snapshot's device_traces entries).
struct TraceEvent {
  enum class Action { alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom };
  Action action;
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t time_us;
  AllocTag tag;
};

class CachingAllocator {
 public:
  explicit CachingAllocator(RawMemory& raw, AllocatorOptions options = {});
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Throws Error(out_of_memory) with PyTorch's figures after the flush-and-retry fails.
  void* allocate(std::size_t bytes, const AllocTag& tag = {});
  void deallocate(void* ptr);

  AllocatorStats stats() const;
  void reset_peak_stats();
  void empty_cache();  // release every entirely free segment

  // Rounding rules, exposed so tests compute expectations with the allocator's own functions.
  static std::size_t round_size(std::size_t bytes);
  static std::size_t segment_size(std::size_t rounded);

  const std::vector<TraceEvent>& history() const;
  RawMemory& raw() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace membudget::measure
