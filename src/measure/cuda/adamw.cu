// AdamW fused over every parameter tensor: one launch, each block one chunk of one tensor. The
// descriptors (pointers, dtypes, sizes) live in a small device array the backend owns; a block
// finds its tensor by binary search over the tensors' first chunks.
#include <cmath>

#include "measure/cuda/common.cuh"

namespace membudget::measure::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::uint64_t kChunk = 8192;  // elements per block

__global__ void adamw_kernel(const AdamTensor* ts, int count, float lr, float b1, float b2, float eps, float wd,
                             float bc1, float bc2) {
  const std::uint64_t chunk = blockIdx.x;
  int lo = 0, hi = count - 1;
  while (lo < hi) {  // the last tensor whose first chunk is <= chunk
    const int mid = (lo + hi + 1) / 2;
    if (ts[mid].first_chunk <= chunk) lo = mid;
    else hi = mid - 1;
  }
  const AdamTensor t = ts[lo];
  const std::uint64_t begin = (chunk - t.first_chunk) * kChunk;
  const std::uint64_t end = begin + kChunk < t.n ? begin + kChunk : t.n;
  const float decay = t.decay ? 1.0f - lr * wd : 1.0f;
  for (std::uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = ld(t.grad, t.grad_dt, i);
    const float m = b1 * ld(t.m, t.m_dt, i) + (1.0f - b1) * g;
    const float v = b2 * ld(t.v, t.v_dt, i) + (1.0f - b2) * g * g;
    float p = (t.master ? t.master[i] : ld(t.param, t.param_dt, i)) * decay;
    p -= lr * (m / bc1) / (sqrtf(v / bc2) + eps);
    if (t.master) t.master[i] = p;
    st(t.param, t.param_dt, i, p);
    st(t.m, t.m_dt, i, m);
    st(t.v, t.v_dt, i, v);
  }
}

}  // namespace

void adamw(Stream s, AdamTensor* host_desc, AdamTensor* device_desc, int count, float lr, float beta1, float beta2,
           float eps, float weight_decay, int step) {
  REQUIRE(step >= 1, "adamw: step counts from 1");
  if (count == 0) return;
  std::uint64_t chunks = 0;
  for (int i = 0; i < count; ++i) {
    host_desc[i].first_chunk = chunks;
    chunks += (host_desc[i].n + kChunk - 1) / kChunk;
  }
  REQUIRE(chunks < (1ull << 31), "adamw: too many chunks for one grid");
  if (chunks == 0) return;
  // the descriptors change only when a buffer moves; the copy is tiny and ordered on the stream
  CUDA_CHECK(cudaMemcpyAsync(device_desc, host_desc, sizeof(AdamTensor) * count, cudaMemcpyHostToDevice, s));
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  adamw_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, s>>>(device_desc, count, lr, beta1, beta2, eps,
                                                                  weight_decay, bc1, bc2);
  CHECK_LAUNCH("adamw_kernel");
}

}  // namespace membudget::measure::cuda
