// Casts, the residual add and the matmul bias: elementwise kernels in fp32 registers.
#include "measure/cuda/common.cuh"

namespace membudget::measure::cuda {
namespace {

// Grid-stride loops: one launch covers any n with a capped grid.
template <class D, class S>
__global__ void cast_kernel(D* dst, const S* src, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    dst[i] = from_f<D>(to_f(src[i]));
}

template <class T>
__global__ void residual_kernel(T* out, const T* a, const T* b, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

template <class T, class B>
__global__ void add_bias_kernel(T* out, const B* bias, std::size_t n, int OC) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(to_f(out[i]) + to_f(bias[i % OC]));
}

// Column sums of dout (N, OC): block b sums rows b, b + gridDim.x, … into partial[b, :].
template <class T>
__global__ void column_partials(float* partial, const T* dout, int N, int OC) {
  for (int c = threadIdx.x; c < OC; c += blockDim.x) {
    float acc = 0.0f;
    for (int r = blockIdx.x; r < N; r += gridDim.x) acc += to_f(dout[std::size_t(r) * OC + c]);
    partial[std::size_t(blockIdx.x) * OC + c] = acc;
  }
}

// dst[c] += Σ_p partial[p, c], one rounding into dst's dtype.
__global__ void add_partials_kernel(void* dst, Dt dt, const float* partial, int parts, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int p = 0; p < parts; ++p) acc += partial[std::size_t(p) * C + c];
  st(dst, dt, c, ld(dst, dt, c) + acc);
}

}  // namespace

void add_partials(Stream s, Ten dst, const float* partial, int parts, int C) {
  add_partials_kernel<<<(C + 255) / 256, 256, 0, s>>>(dst.p, dst.dt, partial, parts, C);
  CHECK_LAUNCH("add_partials_kernel");
}

void cast(Stream s, Ten dst, Ten src, std::size_t n) {
  if (n == 0) return;
  dispatch(dst.dt, [&](auto d) {
    dispatch(src.dt, [&](auto sv) {
      using D = decltype(d);
      using S = decltype(sv);
      cast_kernel<D, S><<<blocks_for(n, 256), 256, 0, s>>>(static_cast<D*>(dst.p), static_cast<const S*>(src.p), n);
    });
  });
  CHECK_LAUNCH("cast_kernel");
}

void residual_forward(Stream s, Ten out, Ten a, Ten b, std::size_t n) {
  REQUIRE(out.dt == a.dt && a.dt == b.dt, "residual_forward: operands must share one dtype");
  if (n == 0) return;
  dispatch(out.dt, [&](auto t) {
    using T = decltype(t);
    residual_kernel<T><<<blocks_for(n, 256), 256, 0, s>>>(static_cast<T*>(out.p), static_cast<const T*>(a.p),
                                                           static_cast<const T*>(b.p), n);
  });
  CHECK_LAUNCH("residual_kernel");
}

void add_bias(Stream s, Ten out, Ten bias, int N, int OC) {
  const std::size_t n = std::size_t(N) * OC;
  if (n == 0) return;
  dispatch(out.dt, [&](auto t) {
    dispatch(bias.dt, [&](auto bv) {
      using T = decltype(t);
      using B = decltype(bv);
      add_bias_kernel<T, B><<<blocks_for(n, 256), 256, 0, s>>>(static_cast<T*>(out.p), static_cast<const B*>(bias.p), n, OC);
    });
  });
  CHECK_LAUNCH("add_bias_kernel");
}

void bias_backward(Stream s, Ten dbias, Ten dout, int N, int OC, float* scratch, std::size_t scratch_floats) {
  REQUIRE(std::size_t(OC) <= scratch_floats, "bias_backward: scratch smaller than one row");
  int parts = static_cast<int>(scratch_floats / OC);
  parts = parts > 256 ? 256 : parts;
  parts = parts > N ? N : parts;
  if (parts < 1) return;
  dispatch(dout.dt, [&](auto t) {
    using T = decltype(t);
    column_partials<T><<<parts, 256, 0, s>>>(scratch, static_cast<const T*>(dout.p), N, OC);
  });
  CHECK_LAUNCH("column_partials");
  add_partials(s, dbias, scratch, parts, OC);
}

}  // namespace membudget::measure::cuda
