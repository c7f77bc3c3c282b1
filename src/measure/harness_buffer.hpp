// src/measure/harness_buffer.hpp: pieces shared by the training and inference harnesses
// (internal): the deterministic RNG, an owning allocation of the CachingAllocator, bf16 rounding.
#pragma once

#include <algorithm>
#include <thread>
#include <vector>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "measure/backend.hpp"

namespace membudget::measure {

// splitmix64 and Box–Muller: the same parameters and batch on every platform.
struct Rng {
  static constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  std::uint64_t s;
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static double to_uniform(std::uint64_t x) { return (static_cast<double>(x >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  static float box_muller(double u1, double u2) {
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  std::uint64_t next() { return mix(s += kGolden); }
  double uniform() { return to_uniform(next()); }
  float normal() {
    const double u1 = uniform(), u2 = uniform();
    return box_muller(u1, u2);
  }
  // The k-th normal (0-based) of a stream that starts at `seed`, without drawing the ones before.
  static float normal_at(std::uint64_t seed, std::uint64_t k) {
    return box_muller(to_uniform(mix(seed + (2 * k + 1) * kGolden)), to_uniform(mix(seed + (2 * k + 2) * kGolden)));
  }
};

// f(i) for i in [0, n), split over the machine's threads when n is large.
template <class F>
void parallel_for(std::size_t n, F&& f) {
  const std::size_t threads = std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), 32);
  if (n < (1u << 20) || threads == 1) {
    for (std::size_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::vector<std::thread> pool;
  const std::size_t per = (n + threads - 1) / threads;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const std::size_t end = std::min(n, (t + 1) * per);
      for (std::size_t i = t * per; i < end; ++i) f(i);
    });
  for (auto& th : pool) th.join();
}


// An allocation from the CachingAllocator, returned when the Buffer dies.
class Buffer {
 public:
  Buffer() = default;
  Buffer(CachingAllocator& a, std::size_t bytes, DType dtype, const AllocTag& tag)
      : alloc_(&a), ptr_(a.allocate(bytes, tag)), bytes_(bytes), dtype_(dtype) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = o.alloc_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      dtype_ = o.dtype_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset() {
    if (ptr_) alloc_->deallocate(ptr_);
    ptr_ = nullptr;
  }
  explicit operator bool() const { return ptr_ != nullptr; }
  View view() const { return {ptr_, dtype_}; }
  float* f32() const { return static_cast<float*>(ptr_); }
  std::int32_t* i32() const { return static_cast<std::int32_t*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  CachingAllocator* alloc_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  DType dtype_ = DType::fp32;
};

// fp32 → bf16 with round-to-nearest-even (the values here are finite).
inline std::uint16_t to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

}  // namespace membudget::measure
