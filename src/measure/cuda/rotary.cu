// Rotary embedding in place (rotate-half pairing). The angles come from a (S, head_dim/2) table
// of (cos, sin) computed once in double precision, as the CPU reference computes each angle.
#include "measure/cuda/common.cuh"

namespace membudget::measure::cuda {
namespace {

__global__ void rotary_table_kernel(float2* table, int S, int hd, double theta) {
  const int half = hd / 2;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= S * half) return;
  const int s = i / half, f = i % half;
  const double ang = s * pow(theta, -2.0 * f / hd);
  table[i] = make_float2(static_cast<float>(cos(ang)), static_cast<float>(sin(ang)));
}

// One thread per (token, head, pair) at position pos0 + s; `sign` −1 rotates back (the backward).
template <class T>
__global__ void rotary_kernel(T* x, const float2* table, int B, int S, int heads, int hd, float sign, int pos0) {
  const int half = hd / 2;
  const std::size_t n = std::size_t(B) * S * heads * half;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const int f = static_cast<int>(i % half);
    const std::size_t th = i / half;  // (b·S + s)·heads + h
    const int s = pos0 + static_cast<int>((th / heads) % S);
    const float2 cs = table[std::size_t(s) * half + f];
    const float c = cs.x, sn = sign * cs.y;
    T* p = x + th * hd;
    const float a = to_f(p[f]), b = to_f(p[f + half]);
    p[f] = from_f<T>(a * c - b * sn);
    p[f + half] = from_f<T>(b * c + a * sn);
  }
}

}  // namespace

void rotary_table(Stream s, float* table, int S, int head_dim, float theta) {
  const int n = S * (head_dim / 2);
  if (n == 0) return;
  rotary_table_kernel<<<(n + 255) / 256, 256, 0, s>>>(reinterpret_cast<float2*>(table), S, head_dim, theta);
  CHECK_LAUNCH("rotary_table_kernel");
}

void rotary(Stream s, Ten x, const float* table, int B, int S, int heads, int head_dim, bool inverse, int pos0) {
  REQUIRE(head_dim % 2 == 0, "rotary: head_dim must be even");
  const std::size_t n = std::size_t(B) * S * heads * (head_dim / 2);
  if (n == 0) return;
  dispatch(x.dt, [&](auto t) {
    using T = decltype(t);
    rotary_kernel<T><<<blocks_for(n, 256), 256, 0, s>>>(static_cast<T*>(x.p), reinterpret_cast<const float2*>(table), B,
                                                        S, heads, head_dim, inverse ? -1.0f : 1.0f, pos0);
  });
  CHECK_LAUNCH("rotary_kernel");
}

}  // namespace membudget::measure::cuda
