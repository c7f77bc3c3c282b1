// src/measure/cuda/common.cuh: what every kernel file shares — checked calls, element loads and
// stores in fp32, dtype dispatch, and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "measure/cuda/kernels.hpp"

// A failed runtime call is Error(device) naming the call, the file and the line.
#define CUDA_CHECK(call)                                                                          \
  do {                                                                                            \
    const cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess)                                                                      \
      ::membudget::measure::cuda::fail(#call, cudaGetErrorString(err_), __FILE__, __LINE__);      \
  } while (0)

#define CHECK_LAUNCH(kernel) ::membudget::measure::cuda::check_launch(kernel, __FILE__, __LINE__)

// A shape precondition of a launcher.
#define REQUIRE(cond, msg)                                                                        \
  do {                                                                                            \
    if (!(cond)) ::membudget::measure::cuda::fail(msg, #cond, __FILE__, __LINE__);              \
  } while (0)

namespace membudget::measure::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

// Runtime-typed access, for kernels whose operands each have their own dtype (AdamW, casts).
__device__ __forceinline__ float ld(const void* p, Dt dt, std::size_t i) {
  return dt == Dt::f32 ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const bf16*>(p)[i]);
}
__device__ __forceinline__ void st(void* p, Dt dt, std::size_t i, float x) {
  if (dt == Dt::f32) static_cast<float*>(p)[i] = x;
  else static_cast<bf16*>(p)[i] = __float2bfloat16_rn(x);
}

// Calls f(T{}) with T the element type of dt.
template <class F>
void dispatch(Dt dt, F&& f) {
  if (dt == Dt::f32) f(float{});
  else f(bf16{});
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 floats; the trailing barrier lets the caller reuse it at once.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  v = warp_max(v);
  __syncthreads();
  return v;
}

inline unsigned blocks_for(std::size_t n, unsigned threads, std::size_t cap = 1u << 20) {
  std::size_t b = (n + threads - 1) / threads;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b ? b : 1);
}

}  // namespace membudget::measure::cuda
