// RMSNorm forward and backward: one block per row, fp32 statistics.
#include "measure/cuda/common.cuh"

namespace membudget::measure::cuda {
namespace {

constexpr int kThreads = 256;

template <class T, class W>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const W* w, int N, int C, float eps) {
  __shared__ float red[32];
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + std::size_t(row) * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float v = to_f(xr[c]);
      ss += v * v;
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / C + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    T* o = out + std::size_t(row) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = from_f<T>(to_f(xr[c]) * r * to_f(w[c]));
  }
}

// Block b handles rows b, b + gridDim.x, …; its share of dw stays in shared memory (each thread
// owns the same columns in every row, so no barrier is needed) and lands in partial[b, :].
template <class T, class W>
__global__ void rmsnorm_backward_kernel(T* dx, bool accumulate, float* partial, const T* dout, const T* x, const W* w,
                                        const float* rstd, int N, int C) {
  extern __shared__ float dw_acc[];
  __shared__ float red[32];
  for (int c = threadIdx.x; c < C; c += blockDim.x) dw_acc[c] = 0.0f;
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const std::size_t off = std::size_t(row) * C;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = to_f(dout[off + c]), xh = to_f(x[off + c]) * r;
      dot += d * to_f(w[c]) * xh;
      dw_acc[c] += d * xh;
    }
    const float m = block_sum(dot, red) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float xh = to_f(x[off + c]) * r;
      float v = r * (to_f(dout[off + c]) * to_f(w[c]) - xh * m);
      if (accumulate) v += to_f(dx[off + c]);
      dx[off + c] = from_f<T>(v);
    }
  }
  for (int c = threadIdx.x; c < C; c += blockDim.x) partial[std::size_t(blockIdx.x) * C + c] = dw_acc[c];
}

}  // namespace

void rmsnorm_forward(Stream s, Ten out, float* rstd, Ten x, Ten w, int N, int C, float eps) {
  REQUIRE(out.dt == x.dt, "rmsnorm_forward: out and x must share one dtype");
  if (N == 0) return;
  const int blocks = N < 65535 ? N : 65535;
  dispatch(x.dt, [&](auto xt) {
    dispatch(w.dt, [&](auto wt) {
      using T = decltype(xt);
      using W = decltype(wt);
      rmsnorm_forward_kernel<T, W><<<blocks, kThreads, 0, s>>>(static_cast<T*>(out.p), rstd, static_cast<const T*>(x.p),
                                                               static_cast<const W*>(w.p), N, C, eps);
    });
  });
  CHECK_LAUNCH("rmsnorm_forward_kernel");
}

void rmsnorm_backward(Stream s, Ten dx, bool accumulate_dx, Ten dw, Ten dout, Ten x, Ten w, const float* rstd, int N,
                      int C, float* scratch, std::size_t scratch_floats) {
  REQUIRE(dx.dt == x.dt && dout.dt == x.dt, "rmsnorm_backward: dx, dout and x must share one dtype");
  REQUIRE(std::size_t(C) <= scratch_floats, "rmsnorm_backward: scratch smaller than one row");
  REQUIRE(std::size_t(C) * 4 <= 96 * 1024, "rmsnorm_backward: rows longer than 24576 elements");
  if (N == 0) return;
  int parts = static_cast<int>(scratch_floats / C);
  parts = parts > 528 ? 528 : parts;  // 4 blocks per SM on an H100/H200
  parts = parts > N ? N : parts;
  const std::size_t smem = std::size_t(C) * 4;
  dispatch(x.dt, [&](auto xt) {
    dispatch(w.dt, [&](auto wt) {
      using T = decltype(xt);
      using W = decltype(wt);
      auto kernel = rmsnorm_backward_kernel<T, W>;
      if (smem > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      kernel<<<parts, kThreads, smem, s>>>(static_cast<T*>(dx.p), accumulate_dx, scratch,
                                           static_cast<const T*>(dout.p), static_cast<const T*>(x.p),
                                           static_cast<const W*>(w.p), rstd, N, C);
    });
  });
  CHECK_LAUNCH("rmsnorm_backward_kernel");
  add_partials(s, dw, scratch, parts, C);
}

}  // namespace membudget::measure::cuda
