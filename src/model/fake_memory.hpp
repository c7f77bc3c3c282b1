// src/model/fake_memory.hpp: device addresses without device memory, for replaying a predicted
// step's allocations through the caching allocator (the reserved-memory replay in reserved.cpp,
// the harness step's replay in inventory_harness.cpp). Internal.
#pragma once

#include <string>

#include "measure/allocator.hpp"

namespace membudget::detail {

// Addresses without memory: raw segments and expandable ranges come from a bump pointer. The
// 64-bit forms are the ones implemented: the replay's segments and addresses pass 4 GiB, which a
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

 private:
  measure::DeviceAddr bump(bytes_t bytes) {
    const measure::DeviceAddr at = next_;
    next_ += (bytes + (bytes_t{2} << 20) - 1) / (bytes_t{2} << 20) * (bytes_t{2} << 20) + (bytes_t{2} << 20);
    return at;
  }
  measure::DeviceAddr next_ = measure::DeviceAddr{1} << 40;
};

}  // namespace membudget::detail
