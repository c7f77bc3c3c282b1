// Embedding lookup and its backward (a scatter-add into the table's rows).
#include "measure/cuda/common.cuh"

namespace membudget::measure::cuda {
namespace {

template <class O, class W>
__global__ void embedding_forward_kernel(O* out, const std::int32_t* tokens, const W* table, int T, int C) {
  const std::size_t n = std::size_t(T) * C;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t t = i / C, c = i % C;
    out[i] = from_f<O>(to_f(table[std::size_t(tokens[t]) * C + c]));
  }
}

__device__ __forceinline__ void atomic_add(float* p, float x) { atomicAdd(p, x); }
__device__ __forceinline__ void atomic_add(bf16* p, float x) { atomicAdd(p, __float2bfloat16_rn(x)); }

// Repeated tokens add into the same row: atomics, so the order (and under bf16 the rounding
// sequence) varies from run to run; every addend is rounded once into the table's dtype, as the
// CPU reference does token by token.
template <class W, class D>
__global__ void embedding_backward_kernel(W* dtable, const std::int32_t* tokens, const D* dout, int T, int C) {
  const std::size_t n = std::size_t(T) * C;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t t = i / C, c = i % C;
    atomic_add(&dtable[std::size_t(tokens[t]) * C + c], to_f(dout[i]));
  }
}

}  // namespace

void embedding_forward(Stream s, Ten out, const std::int32_t* tokens, Ten table, int T, int C) {
  const std::size_t n = std::size_t(T) * C;
  if (n == 0) return;
  dispatch(out.dt, [&](auto o) {
    dispatch(table.dt, [&](auto w) {
      using O = decltype(o);
      using W = decltype(w);
      embedding_forward_kernel<O, W><<<blocks_for(n, 256), 256, 0, s>>>(static_cast<O*>(out.p), tokens,
                                                                         static_cast<const W*>(table.p), T, C);
    });
  });
  CHECK_LAUNCH("embedding_forward_kernel");
}

void embedding_backward(Stream s, Ten dtable, const std::int32_t* tokens, Ten dout, int T, int C) {
  const std::size_t n = std::size_t(T) * C;
  if (n == 0) return;
  dispatch(dtable.dt, [&](auto w) {
    dispatch(dout.dt, [&](auto d) {
      using W = decltype(w);
      using D = decltype(d);
      embedding_backward_kernel<W, D><<<blocks_for(n, 256), 256, 0, s>>>(static_cast<W*>(dtable.p), tokens,
                                                                          static_cast<const D*>(dout.p), T, C);
    });
  });
  CHECK_LAUNCH("embedding_backward_kernel");
}

}  // namespace membudget::measure::cuda
