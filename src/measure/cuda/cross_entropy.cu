// Cross-entropy over the vocabulary, one block per row, fp32 log-sum-exp. The backward may run in
// place (dlogits == logits): each thread reads and writes only its own elements. The chunked loss
// of the harness calls these on one (c, V) chunk at a time, so full fp32 logits never exist.
#include "measure/cuda/common.cuh"

namespace membudget::measure::cuda {
namespace {

constexpr int kThreads = 1024;

// Online max / sum per thread, then merged over the block: one read of the row.
template <class T>
__device__ float row_lse(const T* row, int V, float* red) {
  float m = -INFINITY, s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float x = to_f(row[i]);
    if (x > m) {
      s = s * expf(m - x) + 1.0f;
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  const float M = block_max(m, red);
  s = m == -INFINITY ? 0.0f : s * expf(m - M);
  return M + logf(block_sum(s, red));
}

template <class T>
__global__ void ce_forward_kernel(float* losses, const T* logits, const std::int32_t* targets, int N, int V) {
  __shared__ float red[32];
  for (int r = blockIdx.x; r < N; r += gridDim.x) {
    const T* row = logits + std::size_t(r) * V;
    const float lse = row_lse(row, V, red);
    if (threadIdx.x == 0) losses[r] = lse - to_f(row[targets[r]]);
  }
}

template <class T>
__global__ void ce_backward_kernel(T* dlogits, const T* logits, const std::int32_t* targets, float dloss, int N, int V) {
  __shared__ float red[32];
  for (int r = blockIdx.x; r < N; r += gridDim.x) {
    const T* row = logits + std::size_t(r) * V;
    T* drow = dlogits + std::size_t(r) * V;
    const float lse = row_lse(row, V, red);
    const int tgt = targets[r];
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float p = expf(to_f(row[i]) - lse) - (i == tgt ? 1.0f : 0.0f);
      drow[i] = from_f<T>(p * dloss);
    }
    __syncthreads();  // the next row's reduction reuses red
  }
}

}  // namespace

void cross_entropy_forward(Stream s, float* losses, Ten logits, const std::int32_t* targets, int N, int V) {
  if (N == 0) return;
  const int blocks = N < 65535 ? N : 65535;
  dispatch(logits.dt, [&](auto t) {
    using T = decltype(t);
    ce_forward_kernel<T><<<blocks, kThreads, 0, s>>>(losses, static_cast<const T*>(logits.p), targets, N, V);
  });
  CHECK_LAUNCH("ce_forward_kernel");
}

void cross_entropy_backward(Stream s, Ten dlogits, Ten logits, const std::int32_t* targets, float dloss, int N, int V) {
  REQUIRE(dlogits.dt == logits.dt, "cross_entropy_backward: dlogits and logits must share one dtype");
  if (N == 0) return;
  const int blocks = N < 65535 ? N : 65535;
  dispatch(logits.dt, [&](auto t) {
    using T = decltype(t);
    ce_backward_kernel<T><<<blocks, kThreads, 0, s>>>(static_cast<T*>(dlogits.p), static_cast<const T*>(logits.p),
                                                      targets, dloss, N, V);
  });
  CHECK_LAUNCH("ce_backward_kernel");
}

}  // namespace membudget::measure::cuda
