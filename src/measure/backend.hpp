// src/measure/backend.hpp: the kernels of the synthetic training step, one virtual per op family.
//
// The harness (harness.cpp) owns every buffer: it allocates them from the CachingAllocator and
// hands the kernels device pointers and shapes. A backend never allocates tensor memory through
// the allocator; memory a backend needs privately (cuBLAS workspace, a CUDA context) lives outside
// it and is reported by outside_bytes(). Each pointer comes with its element type (View), so one
// kernel serves every precision recipe: fp32, amp-bf16 (bf16 activations and weight copies, fp32
// gradients) and bf16. Statistics (rmsnorm's rstd, attention's log-sum-exp and delta, the per-token
// losses) are always fp32; token ids are int32.
//
// Layouts (row-major, T = B·S tokens, token t = b·S + s):
//   activations (T, C); weights (OC, IC) as nn.Linear stores them; q (B, S, heads, head_dim);
//   k, v (B, S, kv_heads, head_dim); lse and delta (B, heads, S).
// Gradient conventions (llm.c's): parameter gradients (dw, dbias, dtable) are always accumulated
// (+=), the harness zeroes them at the start of backward; input gradients are overwritten unless
// the kernel takes an `accumulate_dx` flag. cross_entropy_backward and the rotary kernels may run
// in place (dlogits == logits, x rotated where it lies).
//
// The CPU backend (cpu_backend.cpp) is the numerical reference; a CUDA backend implements the same
// interface (matmul through cuBLAS, flash-style attention) and is checked against it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "measure/allocator.hpp"
#include "membudget/job.hpp"

namespace membudget::measure {

// A device pointer and the type of its elements (fp32 or bf16).
struct View {
  void* data = nullptr;
  DType dtype = DType::fp32;
  explicit operator bool() const { return data != nullptr; }
};

inline std::size_t element_bytes(DType d) { return d == DType::bf16 ? 2 : 4; }

// Rows are offsets of whole rows: `rows(v, r0, C)` points at row r0 of a (·, C) tensor.
inline View rows(View v, std::size_t r0, std::size_t C) {
  return {static_cast<char*>(v.data) + r0 * C * element_bytes(v.dtype), v.dtype};
}

struct AttnShape {
  int B = 0, S = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;  // heads % kv_heads == 0 (GQA)
  int group() const { return heads / kv_heads; }
};

struct AdamWParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};

// One parameter tensor for the fused AdamW: the parameter (master copy under amp-bf16), its
// gradient and both moments, each in its own dtype. Under bf16-master `master` is the fp32 copy the
// update is computed on, and `param` receives it rounded to its own dtype; otherwise empty.
struct AdamWTensor {
  View param, grad, m, v;
  std::size_t n = 0;
  bool decay = false;  // weight decay on matrices only
  View master;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // The memory the allocator sits on (host memory with a capacity; cudaMalloc on a GPU).
  virtual RawMemory& memory() = 0;
  // Bytes in use on the device outside the allocator given what it reserves (CUDA context,
  // cuBLAS workspace: used − reserved from cudaMemGetInfo). 0 on the CPU.
  virtual bytes_t outside_bytes(bytes_t reserved) const = 0;

  virtual void copy_to_device(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void zero(View x, std::size_t n) = 0;
  virtual void synchronize() = 0;

  // dst[i] = src[i] converted (fp32 ↔ bf16, or a plain copy).
  virtual void cast(View dst, View src, std::size_t n) = 0;

  // out(T, C) = table[tokens[t]]; backward: dtable[tokens[t]] += dout[t].
  virtual void embedding_forward(View out, const std::int32_t* tokens, View table, int T, int C) = 0;
  virtual void embedding_backward(View dtable, const std::int32_t* tokens, View dout, int T, int C) = 0;

  // out = x · rstd · w with rstd = 1/sqrt(mean(x²) + eps) per row (saved, fp32).
  virtual void rmsnorm_forward(View out, float* rstd, View x, View w, int N, int C, float eps) = 0;
  virtual void rmsnorm_backward(View dx, bool accumulate_dx, View dw, View dout, View x, View w,
                                const float* rstd, int N, int C) = 0;

  // out(N, OC) = x(N, IC) · w(OC, IC)ᵀ + bias(OC) (bias may be empty).
  virtual void matmul_forward(View out, View x, View w, View bias, int N, int IC, int OC) = 0;
  // dx (=, or += with accumulate_dx) dout · w; dw += doutᵀ · x; dbias += Σ_rows dout.
  virtual void matmul_backward(View dx, bool accumulate_dx, View dw, View dbias, View dout, View x,
                               View w, int N, int IC, int OC) = 0;

  // Rotary embedding in place on (B·S, heads, head_dim), rotate-half pairing (i, i + head_dim/2),
  // position s of each token, frequencies theta^(−2i/head_dim). Backward rotates by −angle.
  virtual void rotary_forward(View x, int B, int S, int heads, int head_dim, float theta) = 0;
  virtual void rotary_backward(View dx, int B, int S, int heads, int head_dim, float theta) = 0;

  // Causal attention with GQA, softmax scale 1/sqrt(head_dim); saves the fp32 log-sum-exp and never
  // materialises the S×S scores (flash-style tiles / online softmax).
  virtual void attention_forward(View out, float* lse, View q, View k, View v, const AttnShape& a) = 0;
  // delta (B, heads, S) fp32 is workspace owned by the harness: rowsum(dout ∘ out).
  virtual void attention_backward(View dq, View dk, View dv, float* delta, View dout, View q, View k,
                                  View v, View out, const float* lse, const AttnShape& a) = 0;

  // out = silu(gate) · up, elementwise over n.
  virtual void swiglu_forward(View out, View gate, View up, std::size_t n) = 0;
  virtual void swiglu_backward(View dgate, View dup, View dout, View gate, View up, std::size_t n) = 0;

  // losses[i] = logsumexp(logits_i) − logits_i[targets[i]], computed in fp32 row by row.
  virtual void cross_entropy_forward(float* losses, View logits, const std::int32_t* targets, int N, int V) = 0;
  // dlogits = (softmax(logits) − onehot(target)) · dloss; dlogits may be logits (in place).
  virtual void cross_entropy_backward(View dlogits, View logits, const std::int32_t* targets, float dloss,
                                      int N, int V) = 0;

  // One fused AdamW step over every parameter (decoupled weight decay, bias-corrected, step ≥ 1).
  virtual void adamw(std::span<const AdamWTensor> tensors, const AdamWParams& p, int step) = 0;

  // out = a + b; its backward sends the same gradient to both inputs, which the harness does by
  // sharing one residual-gradient buffer (rmsnorm_backward accumulates into it).
  virtual void residual_forward(View out, View a, View b, std::size_t n) = 0;

  // ---- inference (`membudget verify --mode infer`, harness_infer.cpp) ----
  // Both have a default so that a backend without them still builds; the harness's inference step
  // needs them (K/V are written into the pool with cast(), one call per sequence).

  // rotary_forward with positions pos0 + s (a decode step continues the prompt's positions).
  // Default: pos0 == 0 is rotary_forward, any other offset Error(unsupported).
  virtual void rotary_forward_at(View x, int B, int S, int heads, int head_dim, float theta, int pos0) {
    if (pos0 != 0)
      throw Error(ErrorKind::unsupported, name() + ": rotary_forward_at (rotary with a position offset) is not implemented");
    rotary_forward(x, B, S, heads, head_dim, theta);
  }

  // Causal GQA attention of a.S new queries per sequence over a KV cache, softmax scale
  // 1/sqrt(head_dim), nothing saved (no log-sum-exp). q and out (B, S, heads, head_dim): query i of a
  // sequence sits at position past + i. k_cache, v_cache (B, max_tokens, kv_heads, head_dim), one
  // sequence every max_tokens rows, already hold positions 0 … past + S − 1 (the new keys included);
  // query i attends keys 0 … past + i. Default: Error(unsupported).
  virtual void attention_forward_cached(View out, View q, View k_cache, View v_cache, const AttnShape& a, int past,
                                        int max_tokens) {
    (void)out, (void)q, (void)k_cache, (void)v_cache, (void)a, (void)past, (void)max_tokens;
    throw Error(ErrorKind::unsupported, name() + ": attention_forward_cached (attention over a KV cache) is not implemented");
  }
};

// The Eigen reference backend on host memory of `capacity` bytes (0: unlimited).
std::unique_ptr<Backend> make_cpu_backend(bytes_t capacity);

// "cpu" or "cuda". "cuda" loads the CUDA backend plugin (src/measure/backend_loader.cpp):
// Error(unsupported) when it is not installed, Error(device) when it cannot start (no GPU).
std::unique_ptr<Backend> make_backend(const std::string& name, bytes_t capacity);

// Defined by the CUDA backend (src/measure/cuda/, linked into the plugin and into
// test_cuda_kernels); capacity caps what the allocator may take.
std::unique_ptr<Backend> make_cuda_backend(bytes_t capacity);

}  // namespace membudget::measure
