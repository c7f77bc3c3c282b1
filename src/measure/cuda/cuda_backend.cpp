// The CUDA backend: the hand-written kernels of this folder and cuBLAS behind measure::Backend.
//
// Memory: the allocator sits on cudaMalloc / cudaFree (CudaMemory); a failed cudaMalloc returns
// nullptr (the error is cleared) so the allocator's flush-and-retry and OOM report work as on the
// CPU. Everything the backend keeps privately — the cuBLAS workspace, a scratch buffer for
// column-sum partials (rmsnorm dw, bias gradients), the rotary tables and the AdamW descriptors —
// is cudaMalloc'd outside the allocator and shows up in `outside` (used − reserved from
// cudaMemGetInfo) together with the CUDA context, never in the phase peaks.
// One stream; every call is checked (Error(device) naming the call, file and line).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "measure/backend.hpp"
#include "measure/cuda/kernels.hpp"

namespace membudget::measure {
namespace cuda {

[[noreturn]] void fail(const char* what, const char* detail, const char* file, int line) {
  throw Error(ErrorKind::device, std::string("cuda backend: ") + what + ": " + detail + " (" + file + ":" +
                                     std::to_string(line) + ")");
}

void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail(kernel, cudaGetErrorString(e), file, line);
}

}  // namespace cuda

namespace {

#define CUDA_OK(call)                                                                      \
  do {                                                                                     \
    const cudaError_t err_ = (call);                                                       \
    if (err_ != cudaSuccess) cuda::fail(#call, cudaGetErrorString(err_), __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_OK(call)                                                                    \
  do {                                                                                     \
    const cublasStatus_t st_ = (call);                                                     \
    if (st_ != CUBLAS_STATUS_SUCCESS) cuda::fail(#call, cublasGetStatusString(st_), __FILE__, __LINE__); \
  } while (0)

constexpr std::size_t kWorkspaceBytes = 32ull << 20;  // cuBLAS's recommendation for Hopper
constexpr std::size_t kScratchFloats = 4ull << 20;    // 16 MiB of fp32 partial sums

cuda::Dt dt_of(DType d) {
  if (d == DType::fp32) return cuda::Dt::f32;
  if (d == DType::bf16) return cuda::Dt::bf16;
  throw Error(ErrorKind::unsupported, "cuda backend: only fp32 and bf16 tensors");
}
cuda::Ten ten(View v) { return {v.data, dt_of(v.dtype)}; }
cudaDataType_t blas_type(DType d) { return d == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

class CudaMemory final : public RawMemory {
 public:
  explicit CudaMemory(bytes_t cap) : cap_(cap) {
    cudaDeviceProp prop{};
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    name_ = std::string("cuda:0 (") + prop.name + ")";
  }
  void* raw_alloc(std::size_t bytes) override {
    if (cap_ && used_ + bytes > cap_) return nullptr;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it: the allocator flushes its cache and retries
      return nullptr;
    }
    CUDA_OK(e);
    used_ += bytes;
    return p;
  }
  void raw_free(void* ptr, std::size_t bytes) override {
    CUDA_OK(cudaFree(ptr));
    used_ -= bytes;
  }
  bytes_t capacity() const override {
    if (cap_) return cap_;
    std::size_t free = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free, &total));
    return total;
  }
  bytes_t free_bytes() const override {
    if (cap_) return cap_ - used_;
    std::size_t free = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free, &total));
    return free;
  }
  std::string name() const override { return name_; }

 private:
  bytes_t cap_ = 0, used_ = 0;
  std::string name_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(bytes_t capacity) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
      throw Error(ErrorKind::device, std::string("--device-backend cuda: no CUDA device (") +
                                         (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaFree(nullptr));  // create the context now, so `outside` sees it
    memory_ = std::make_unique<CudaMemory>(capacity);
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_OK(cublasCreate(&blas_));
    CUBLAS_OK(cublasSetStream(blas_, stream_));
    CUDA_OK(cudaMalloc(&workspace_, kWorkspaceBytes));
    CUBLAS_OK(cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes));
    CUDA_OK(cudaMalloc(&scratch_, kScratchFloats * sizeof(float)));
    cudaDeviceProp prop{};
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    name_ = std::string("cuda (") + prop.name + ", cuBLAS + membudget kernels)";
  }
  ~CudaBackend() override {
    // errors here cannot be reported; the process is usually ending
    cudaStreamSynchronize(stream_);
    if (profile_) {
      drain_profile();
      print_profile();
    }
    for (auto& [_, p] : rope_) cudaFree(p);
    cudaFree(adam_desc_);
    cudaFree(scratch_);
    cudaFree(workspace_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  RawMemory& memory() override { return *memory_; }
  bytes_t outside_bytes(bytes_t reserved) const override {
    std::size_t free = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free, &total));
    const bytes_t used = total - free;
    return used > reserved ? used - reserved : 0;
  }

  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
  }
  void zero(View x, std::size_t n) override {
    Prof prof_(*this, "zero");
    if (n) CUDA_OK(cudaMemsetAsync(x.data, 0, n * element_bytes(x.dtype), stream_));
  }
  void synchronize() override {
    CUDA_OK(cudaStreamSynchronize(stream_));
    if (profile_) drain_profile();
  }

  void cast(View dst, View src, std::size_t n) override {
    Prof prof_(*this, "cast"); cuda::cast(stream_, ten(dst), ten(src), n); }

  void embedding_forward(View out, const std::int32_t* tokens, View table, int T, int C) override {
    Prof prof_(*this, "embedding_forward");
    cuda::embedding_forward(stream_, ten(out), tokens, ten(table), T, C);
  }
  void embedding_backward(View dtable, const std::int32_t* tokens, View dout, int T, int C) override {
    Prof prof_(*this, "embedding_backward");
    cuda::embedding_backward(stream_, ten(dtable), tokens, ten(dout), T, C);
  }

  void rmsnorm_forward(View out, float* rstd, View x, View w, int N, int C, float eps) override {
    Prof prof_(*this, "rmsnorm_forward");
    cuda::rmsnorm_forward(stream_, ten(out), rstd, ten(x), ten(w), N, C, eps);
  }
  void rmsnorm_backward(View dx, bool accumulate_dx, View dw, View dout, View x, View w, const float* rstd, int N,
                        int C) override {
    Prof prof_(*this, "rmsnorm_backward");
    cuda::rmsnorm_backward(stream_, ten(dx), accumulate_dx, ten(dw), ten(dout), ten(x), ten(w), rstd, N, C, scratch_,
                           kScratchFloats);
  }

  // Row-major out(N, OC) = x(N, IC) · w(OC, IC)ᵀ is, column-major, out(OC, N) = wᵀ · x.
  void matmul_forward(View out, View x, View w, View bias, int N, int IC, int OC) override {
    Prof prof_(*this, "matmul_forward");
    require_same(x, w, "matmul_forward");
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, IC, x, IC, 0.0f, out, OC);
    if (bias) cuda::add_bias(stream_, ten(out), ten(bias), N, OC);
  }
  // Column-major: dx(IC, N) = w(IC, OC) · dout(OC, N); dw(IC, OC) += x(IC, N) · dout(OC, N)ᵀ.
  void matmul_backward(View dx, bool accumulate_dx, View dw, View dbias, View dout, View x, View w, int N, int IC,
                       int OC) override {
    Prof prof_(*this, "matmul_backward");
    require_same(x, w, "matmul_backward");
    require_same(dout, w, "matmul_backward");
    if (dx) gemm(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, IC, dout, OC, accumulate_dx ? 1.0f : 0.0f, dx, IC);
    if (dw) gemm(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, x, IC, dout, OC, 1.0f, dw, IC);
    if (dbias) cuda::bias_backward(stream_, ten(dbias), ten(dout), N, OC, scratch_, kScratchFloats);
  }

  void rotary_forward(View x, int B, int S, int heads, int hd, float theta) override {
    Prof prof_(*this, "rotary_forward");
    cuda::rotary(stream_, ten(x), rope_table(S, hd, theta), B, S, heads, hd, false);
  }
  void rotary_backward(View dx, int B, int S, int heads, int hd, float theta) override {
    Prof prof_(*this, "rotary_backward");
    cuda::rotary(stream_, ten(dx), rope_table(S, hd, theta), B, S, heads, hd, true);
  }
  void rotary_forward_at(View x, int B, int S, int heads, int hd, float theta, int pos0) override {
    Prof prof_(*this, "rotary_forward");
    if (pos0 < 0) throw Error(ErrorKind::invalid_argument, "rotary_forward_at: negative position offset");
    cuda::rotary(stream_, ten(x), rope_table(pos0 + S, hd, theta), B, S, heads, hd, false, pos0);
  }

  void attention_forward(View out, float* lse, View q, View k, View v, const AttnShape& a) override {
    Prof prof_(*this, "attention_forward");
    cuda::attention_forward(stream_, ten(out), lse, ten(q), ten(k), ten(v), attn(a));
  }
  void attention_backward(View dq, View dk, View dv, float* delta, View dout, View q, View k, View v, View out,
                          const float* lse, const AttnShape& a) override {
    Prof prof_(*this, "attention_backward");
    cuda::attention_backward(stream_, ten(dq), ten(dk), ten(dv), delta, ten(dout), ten(q), ten(k), ten(v), ten(out),
                             lse, attn(a));
  }

  void attention_forward_cached(View out, View q, View k_cache, View v_cache, const AttnShape& a, int past,
                                int max_tokens) override {
    Prof prof_(*this, "attention_forward_cached");
    if (past < 0 || past + a.S > max_tokens)
      throw Error(ErrorKind::invalid_argument, "attention_forward_cached: past + new tokens exceed the cache");
    cuda::attention_forward_cached(stream_, ten(out), ten(q), ten(k_cache), ten(v_cache), attn(a), past, max_tokens);
  }

  void swiglu_forward(View out, View gate, View up, std::size_t n) override {
    Prof prof_(*this, "swiglu_forward");
    cuda::swiglu_forward(stream_, ten(out), ten(gate), ten(up), n);
  }
  void swiglu_backward(View dgate, View dup, View dout, View gate, View up, std::size_t n) override {
    Prof prof_(*this, "swiglu_backward");
    cuda::swiglu_backward(stream_, ten(dgate), ten(dup), ten(dout), ten(gate), ten(up), n);
  }

  void cross_entropy_forward(float* losses, View logits, const std::int32_t* targets, int N, int V) override {
    Prof prof_(*this, "cross_entropy_forward");
    cuda::cross_entropy_forward(stream_, losses, ten(logits), targets, N, V);
  }
  void cross_entropy_backward(View dlogits, View logits, const std::int32_t* targets, float dloss, int N,
                              int V) override {
    Prof prof_(*this, "cross_entropy_backward");
    cuda::cross_entropy_backward(stream_, ten(dlogits), ten(logits), targets, dloss, N, V);
  }

  void adamw(std::span<const AdamWTensor> tensors, const AdamWParams& p, int step) override {
    Prof prof_(*this, "adamw");
    const int count = static_cast<int>(tensors.size());
    if (count > adam_capacity_) {
      CUDA_OK(cudaStreamSynchronize(stream_));
      CUDA_OK(cudaFree(adam_desc_));
      adam_desc_ = nullptr;
      CUDA_OK(cudaMalloc(&adam_desc_, sizeof(cuda::AdamTensor) * count));
      adam_capacity_ = count;
    }
    std::vector<cuda::AdamTensor> host(count);
    for (int i = 0; i < count; ++i) {
      const auto& t = tensors[i];
      host[i] = {t.param.data, t.grad.data, t.m.data, t.v.data, static_cast<float*>(t.master.data), t.n, 0,
                 dt_of(t.param.dtype), dt_of(t.grad.dtype), dt_of(t.m.dtype), dt_of(t.v.dtype),
                 static_cast<std::uint8_t>(t.decay)};
    }
    cuda::adamw(stream_, host.data(), adam_desc_, count, p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, step);
    // the host descriptors die here: make sure the copy has left them
    CUDA_OK(cudaStreamSynchronize(stream_));
  }

  void residual_forward(View out, View a, View b, std::size_t n) override {
    Prof prof_(*this, "residual_forward");
    cuda::residual_forward(stream_, ten(out), ten(a), ten(b), n);
  }

 private:
  // MEMBUDGET_CUDA_PROFILE=1: GPU time per op family from events around each call, summed at every
  // synchronize and printed to stderr when the backend dies (the benchmark's "where the time goes").
  struct Span {
    const char* name;
    cudaEvent_t begin, end;
  };
  struct Prof {
    CudaBackend& be;
    Span span{};
    Prof(CudaBackend& b, const char* name) : be(b) {
      if (!be.profile_) return;
      span.name = name;
      CUDA_OK(cudaEventCreate(&span.begin));
      CUDA_OK(cudaEventCreate(&span.end));
      CUDA_OK(cudaEventRecord(span.begin, be.stream_));
    }
    ~Prof() {
      if (!be.profile_) return;
      cudaEventRecord(span.end, be.stream_);
      be.spans_.push_back(span);
    }
  };
  void drain_profile() {
    cudaStreamSynchronize(stream_);
    for (const Span& s : spans_) {
      float ms = 0;
      cudaEventElapsedTime(&ms, s.begin, s.end);
      auto& [total, calls] = profile_ms_[s.name];
      total += ms;
      calls += 1;
      cudaEventDestroy(s.begin);
      cudaEventDestroy(s.end);
    }
    spans_.clear();
  }
  void print_profile() const {
    std::vector<std::pair<double, std::string>> rows;
    double all = 0;
    for (const auto& [name, tc] : profile_ms_) {
      rows.push_back({tc.first, name});
      all += tc.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "cuda profile (GPU ms summed over the run, all steps):\n");
    for (const auto& [ms, name] : rows)
      std::fprintf(stderr, "cuda profile: %-24s %12.3f ms %6.2f%% %8d calls\n", name.c_str(), ms,
                   all > 0 ? 100.0 * ms / all : 0.0, profile_ms_.at(name).second);
    std::fprintf(stderr, "cuda profile: %-24s %12.3f ms\n", "total", all);
  }

  static void require_same(View a, View b, const char* op) {
    if (a.dtype != b.dtype)
      throw Error(ErrorKind::unsupported, std::string("cuda backend: ") + op + ": operands must share one dtype");
  }
  static cuda::Attn attn(const AttnShape& a) { return {a.B, a.S, a.heads, a.kv_heads, a.head_dim}; }

  // C = alpha · op(A) · op(B) + beta · C, column-major, fp32 accumulation (bf16 or fp32 operands).
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, View A, int lda, View B, int ldb,
            float beta, View C, int ldc) {
    if (m == 0 || n == 0) return;
    const float alpha = 1.0f;
    CUBLAS_OK(cublasGemmEx(blas_, ta, tb, m, n, k, &alpha, A.data, blas_type(A.dtype), lda, B.data, blas_type(B.dtype),
                           ldb, &beta, C.data, blas_type(C.dtype), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // A table of at least S positions: row s does not depend on the length, so any longer table of
  // the same (head_dim, theta) serves (a decode step at position S reuses the prompt's S + 1 table).
  const float* rope_table(int S, int hd, float theta) {
    const auto key = std::make_tuple(S, hd, theta);
    for (const auto& [k, t] : rope_)
      if (std::get<0>(k) >= S && std::get<1>(k) == hd && std::get<2>(k) == theta) return t;
    float* t = nullptr;
    CUDA_OK(cudaMalloc(&t, std::size_t(S) * (hd / 2) * 2 * sizeof(float)));
    rope_[key] = t;
    cuda::rotary_table(stream_, t, S, hd, theta);
    return t;
  }

  std::unique_ptr<CudaMemory> memory_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  float* scratch_ = nullptr;
  cuda::AdamTensor* adam_desc_ = nullptr;
  int adam_capacity_ = 0;
  std::map<std::tuple<int, int, float>, float*> rope_;
  std::string name_;
  bool profile_ = std::getenv("MEMBUDGET_CUDA_PROFILE") != nullptr;
  std::vector<Span> spans_;
  std::map<std::string, std::pair<double, int>> profile_ms_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(bytes_t capacity) { return std::make_unique<CudaBackend>(capacity); }

}  // namespace membudget::measure
