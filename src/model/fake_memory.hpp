// src/model/fake_memory.hpp: device addresses without device memory, for replaying a predicted
// step's allocations through the caching allocator (the reserved-memory replay in reserved.cpp,
// the harness step's replay in inventory_harness.cpp). Internal.
#pragma once

#include <string>

#include "measure/allocator.hpp"

namespace membudget::detail {

// Addresses without memory: raw segments and expandable ranges come from a bump pointer that
// moves down, as cudaMalloc's addresses did on the H200 (each new segment below the last: 283 of
// 404 segments of a measured run, tests/data/reserved_snapshots/). The direction matters: c10's
// best fit takes the lowest address among free blocks of one size, so when several equal cached
// segments are free (step 0's logits-sized ones), the newest is reused first. Counting upward the
// replay reused the oldest, split it with the optimizer state, and made one logits-sized segment
// too many in the next step (+3.6% on Qwen2.5 1.5B, −9.4% on a pipeline's last stage).
// The 64-bit forms are the ones implemented: the replay's segments and addresses pass 4 GiB, which a
// 32-bit target's pointers cannot hold (the web page's wasm32); the pointer forms are never called.
class FakeMemory final : public measure::RawMemory {
 public:
  void* raw_alloc(std::size_t) override { return nullptr; }
  void raw_free(void*, std::size_t) override {}
  measure::DeviceAddr raw_alloc_at(bytes_t bytes) override { return bump(bytes); }
  void raw_free_at(measure::DeviceAddr, bytes_t) override {}
  bytes_t capacity() const override { return bytes_t{1} << 50; }
  bytes_t free_bytes() const override { return capacity(); }
  std::string name() const override { return "fake device memory (an allocator replay)"; }
  measure::DeviceAddr reserve_range_at(bytes_t bytes) override { return bump(bytes); }
  void release_range_at(measure::DeviceAddr, bytes_t) override {}
  bool map_range_at(measure::DeviceAddr, bytes_t) override { return true; }
  void unmap_range_at(measure::DeviceAddr, bytes_t) override {}
  void reset() { next_ = kTop; }  // addresses handed out again from the top

 private:
  measure::DeviceAddr bump(bytes_t bytes) {  // whole 2 MiB pages and a 2 MiB gap, below the last
    next_ -= (bytes + (bytes_t{2} << 20) - 1) / (bytes_t{2} << 20) * (bytes_t{2} << 20) + (bytes_t{2} << 20);
    return next_;
  }
  // (2^52: room below for the 2^50 bytes capacity() reports, above any address a test compares)
  static constexpr measure::DeviceAddr kTop = measure::DeviceAddr{1} << 52;
  measure::DeviceAddr next_ = kTop;
};

}  // namespace membudget::detail
