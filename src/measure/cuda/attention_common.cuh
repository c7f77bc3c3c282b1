// src/measure/cuda/attention_common.cuh: what both attention implementations (attention.cu, the
// mma.sync default, and attention_wmma.cu, the fallback) share.
#pragma once

#include <type_traits>

#include "measure/cuda/common.cuh"
#include "measure/cuda/kernels.hpp"

namespace membudget::measure::cuda {
namespace {  // each including file gets its own instances (no relocatable device code)

// delta[b, h, s] = Σ_d dout · out, one warp per row.
template <class T, int HD>
__global__ void attn_delta_kernel(float* delta, const T* dout, const T* out, int B, int S, int H) {
  const std::size_t row = (blockIdx.x * std::size_t(blockDim.x) + threadIdx.x) / 32;  // (b·S + s)·H + h
  const int lane = threadIdx.x % 32;
  if (row >= std::size_t(B) * S * H) return;
  float acc = 0.0f;
  for (int d = lane; d < HD; d += 32) acc += to_f(dout[row * HD + d]) * to_f(out[row * HD + d]);
  acc = warp_sum(acc);
  if (lane == 0) {
    const int h = static_cast<int>(row % H);
    const std::size_t bs = row / H;
    const int s = static_cast<int>(bs % S), b = static_cast<int>(bs / S);
    delta[(std::size_t(b) * H + h) * S + s] = acc;
  }
}

// Calls f(std::integral_constant<int, HD>) for the supported head dims.
template <class F>
void with_head_dim(int hd, F&& f) {
  switch (hd) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: fail("attention", "head_dim must be 16, 32, 64 or 128 on the CUDA backend", __FILE__, __LINE__);
  }
}

inline void check_shape(const Attn& a) {
  REQUIRE(a.kv_heads > 0 && a.heads % a.kv_heads == 0, "attention: heads must be a multiple of kv_heads");
  REQUIRE(a.heads <= 65535 && a.B <= 65535, "attention: too many heads or sequences for one grid");
}

// What both implementations' entry points require of their arguments.
inline void check_forward(const Attn& a, Ten out, Ten q, Ten k, Ten v) {
  check_shape(a);
  REQUIRE(out.dt == q.dt && k.dt == q.dt && v.dt == q.dt, "attention_forward: q, k, v, out must share one dtype");
}
inline void check_backward(const Attn& a, Ten dq, Ten dk, Ten dv, Ten dout, Ten q, Ten k, Ten v, Ten out) {
  check_shape(a);
  REQUIRE(dq.dt == q.dt && dk.dt == q.dt && dv.dt == q.dt && dout.dt == q.dt && k.dt == q.dt && v.dt == q.dt &&
              out.dt == q.dt,
          "attention_backward: every tensor must share one dtype");
}

}  // namespace
}  // namespace membudget::measure::cuda
