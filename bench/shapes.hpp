// bench/shapes.hpp: the new shapes the benchmarks ask about (bench_api.cpp, estimate_loop.cpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

// Shapes a scheduler might ask about: micro-batch 1-64, sequence 1-32768, none repeated within
// 4096 calls, so every call evaluates (there is no per-shape memo on the training path).
inline const std::vector<std::pair<std::uint64_t, std::uint64_t>>& shapes() {
  static const auto v = [] {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    std::uint64_t x = 88172645463325252ull;  // xorshift64
    for (int i = 0; i < 4096; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      out.push_back({1 + x % 64, 1 + (x >> 20) % 32768});
    }
    return out;
  }();
  return v;
}
