// SwiGLU: out = silu(gate) · up, and its backward, elementwise in fp32.
#include "measure/cuda/common.cuh"

namespace membudget::measure::cuda {
namespace {

template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[i]);
    out[i] = from_f<T>(g / (1.0f + expf(-g)) * to_f(up[i]));
  }
}

template <class T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[i]), u = to_f(up[i]), d = to_f(dout[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    dgate[i] = from_f<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
    dup[i] = from_f<T>(d * g * sig);
  }
}

}  // namespace

void swiglu_forward(Stream s, Ten out, Ten gate, Ten up, std::size_t n) {
  REQUIRE(out.dt == gate.dt && gate.dt == up.dt, "swiglu_forward: operands must share one dtype");
  if (n == 0) return;
  dispatch(out.dt, [&](auto t) {
    using T = decltype(t);
    swiglu_forward_kernel<T><<<blocks_for(n, 256), 256, 0, s>>>(static_cast<T*>(out.p), static_cast<const T*>(gate.p),
                                                                static_cast<const T*>(up.p), n);
  });
  CHECK_LAUNCH("swiglu_forward_kernel");
}

void swiglu_backward(Stream s, Ten dgate, Ten dup, Ten dout, Ten gate, Ten up, std::size_t n) {
  REQUIRE(dgate.dt == gate.dt && dup.dt == gate.dt && dout.dt == gate.dt && up.dt == gate.dt,
          "swiglu_backward: operands must share one dtype");
  if (n == 0) return;
  dispatch(gate.dt, [&](auto t) {
    using T = decltype(t);
    swiglu_backward_kernel<T><<<blocks_for(n, 256), 256, 0, s>>>(static_cast<T*>(dgate.p), static_cast<T*>(dup.p),
                                                                 static_cast<const T*>(dout.p),
                                                                 static_cast<const T*>(gate.p),
                                                                 static_cast<const T*>(up.p), n);
  });
  CHECK_LAUNCH("swiglu_backward_kernel");
}

}  // namespace membudget::measure::cuda
