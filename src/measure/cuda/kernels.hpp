// src/measure/cuda/kernels.hpp: the launchers of the hand-written kernels, one family per .cu.
//
// This header is plain C++ (no CUDA types beyond an opaque stream), so cuda_backend.cpp includes
// it with the host compiler. Every launcher takes the stream explicitly, checks its shape
// preconditions and the launch (Error(device) naming the kernel, file and line).
// Layouts and gradient conventions are those of measure/backend.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace membudget::measure::cuda {

using Stream = CUstream_st*;

// Element type of a device buffer (the backend's View without the project headers).
enum class Dt : std::uint8_t { f32, bf16 };
struct Ten {
  void* p = nullptr;
  Dt dt = Dt::f32;
};

// [[noreturn]] error reporting, defined in cuda_backend.cpp (throws membudget::Error(device)).
[[noreturn]] void fail(const char* what, const char* detail, const char* file, int line);
// Throws Error(device) if the last launch failed.
void check_launch(const char* kernel, const char* file, int line);

// casts.cu
void cast(Stream s, Ten dst, Ten src, std::size_t n);
void residual_forward(Stream s, Ten out, Ten a, Ten b, std::size_t n);
void add_bias(Stream s, Ten out, Ten bias, int N, int OC);                         // out[n, :] += bias
void bias_backward(Stream s, Ten dbias, Ten dout, int N, int OC, float* scratch, std::size_t scratch_floats);
// dst[c] += Σ_p partial[p, c] for c < C (per-block partial sums of a weight or bias gradient),
// rounded once into dst's dtype.
void add_partials(Stream s, Ten dst, const float* partial, int parts, int C);

// embedding.cu
void embedding_forward(Stream s, Ten out, const std::int32_t* tokens, Ten table, int T, int C);
void embedding_backward(Stream s, Ten dtable, const std::int32_t* tokens, Ten dout, int T, int C);

// rmsnorm.cu (scratch: fp32 partial sums of dw, at least C floats)
void rmsnorm_forward(Stream s, Ten out, float* rstd, Ten x, Ten w, int N, int C, float eps);
void rmsnorm_backward(Stream s, Ten dx, bool accumulate_dx, Ten dw, Ten dout, Ten x, Ten w, const float* rstd, int N,
                      int C, float* scratch, std::size_t scratch_floats);

// rotary.cu: table (S, head_dim/2) of (cos, sin) float2, made once per (S, head_dim, theta)
void rotary_table(Stream s, float* table, int S, int head_dim, float theta);
// positions pos0 + s (the table holds at least pos0 + S rows)
void rotary(Stream s, Ten x, const float* table, int B, int S, int heads, int head_dim, bool inverse, int pos0 = 0);

// attention.cu (mma.sync flash attention; MEMBUDGET_CUDA_ATTN=wmma switches training to attention_wmma.cu)
struct Attn {
  int B, S, heads, kv_heads, head_dim;
};
void attention_forward(Stream s, Ten out, float* lse, Ten q, Ten k, Ten v, const Attn& a);
void attention_backward(Stream s, Ten dq, Ten dk, Ten dv, float* delta, Ten dout, Ten q, Ten k, Ten v, Ten out,
                        const float* lse, const Attn& a);
// a.S new queries per sequence at positions past … past + a.S − 1 over (B, max_tokens, kv_heads,
// head_dim) caches holding positions 0 … past + a.S − 1; no log-sum-exp. The caches may be fp32 or
// bf16 whatever q's dtype.
void attention_forward_cached(Stream s, Ten out, Ten q, Ten k_cache, Ten v_cache, const Attn& a, int past,
                              int max_tokens);
// The first kernels (attention_wmma.cu), selected with MEMBUDGET_CUDA_ATTN=wmma.
void attention_forward_wmma(Stream s, Ten out, float* lse, Ten q, Ten k, Ten v, const Attn& a);
void attention_backward_wmma(Stream s, Ten dq, Ten dk, Ten dv, float* delta, Ten dout, Ten q, Ten k, Ten v, Ten out,
                             const float* lse, const Attn& a);

// swiglu.cu
void swiglu_forward(Stream s, Ten out, Ten gate, Ten up, std::size_t n);
void swiglu_backward(Stream s, Ten dgate, Ten dup, Ten dout, Ten gate, Ten up, std::size_t n);

// cross_entropy.cu
void cross_entropy_forward(Stream s, float* losses, Ten logits, const std::int32_t* targets, int N, int V);
void cross_entropy_backward(Stream s, Ten dlogits, Ten logits, const std::int32_t* targets, float dloss, int N, int V);

// adamw.cu: one launch over every tensor; `desc` is device memory for `count` descriptors.
struct AdamTensor {
  void* param;
  void* grad;
  void* m;
  void* v;
  float* master;  // bf16-master: the fp32 copy updated, then rounded into param; else null
  std::uint64_t n;
  std::uint64_t first_chunk;  // filled by the launcher
  Dt param_dt, grad_dt, m_dt, v_dt;
  std::uint8_t decay;
};
void adamw(Stream s, AdamTensor* host_desc, AdamTensor* device_desc, int count, float lr, float beta1, float beta2,
           float eps, float weight_decay, int step);

}  // namespace membudget::measure::cuda
