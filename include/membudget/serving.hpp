// membudget/serving.hpp: serving memory: the KV cache, quantized weights, and vLLM's KV pool.
//
// KV cache (docs/serving.md §1). Per token and layer a standard attention layer stores a key and a
// value of num_kv_heads × head_dim elements: 2 × kv_heads × head_dim × bytes. MHA, GQA and MQA
// differ only in kv_heads. A DeepSeek-style MLA layer stores one latent of kv_lora_rank plus one
// shared rotary key of qk_rope_head_dim: (kv_lora_rank + qk_rope_head_dim) × bytes, no factor 2.
// A sliding-window layer keeps at most `window` tokens of a sequence, so the bytes of one sequence
// depend on its context: Σ_layers min(context, window_l) × per-token bytes of the layer.
//
// Weights (docs/serving.md §2). bf16/fp16: 2 B per parameter. Quantized formats quantize the
// linear layers of the decoder (q, k, v, o or the MLA projections; gate, up, down or fc1, fc2);
// the embedding, lm_head, norms and biases stay bf16, as GPTQ/AWQ/llm-compressor checkpoints do.
//   fp8:  1 B per weight + one fp32 scale per tensor (vLLM's fp8 per-tensor scheme).
//   int8: 1 B per weight + one fp16 scale per group of group_size inputs per output (symmetric).
//   int4: GPTQ/AWQ layout: qweight int32[ceil(K/8)][N] (8 weights per int32), scales
//         fp16[ceil(K/g)][N], qzeros int32[ceil(K/g)][ceil(N/8)] (asymmetric, packed int4 zeros),
//         for a K-input, N-output linear layer and group size g.
//
// vLLM's pool (docs/serving.md §3) follows vllm/v1/worker/gpu_worker.py and kv_cache_utils.py:
// requested = total × gpu_memory_utilization; non_kv = weights + profiling activation peak +
// non-torch growth; available = requested − non_kv; num_blocks = available // page // layers per
// group; KV tokens = num_blocks // groups × block_size; concurrency = num_blocks / blocks per
// request at max_model_len.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "membudget/bytes.hpp"
#include "membudget/job.hpp"
#include "membudget/spec.hpp"

namespace membudget {

// Bytes of one KV element; throws Error(invalid_job) for dtypes a KV cache does not use (int4).
bytes_t kv_dtype_bytes(DType kv);

// KV bytes of one token in one layer: 2 × kv_heads × head_dim × bytes, or the MLA latent.
bytes_t kv_bytes_per_token_layer(const ModelSpec& m, DType kv);

// KV bytes of one token over all layers, ignoring sliding windows (the figure while the context
// is within every window). Llama 3.1 8B in bf16: 131,072.
bytes_t kv_bytes_per_token(const ModelSpec& m, DType kv);

// KV bytes of one sequence of `context` tokens: windowed layers hold min(context, window) tokens.
bytes_t kv_bytes_per_sequence(const ModelSpec& m, DType kv, std::uint64_t context);

// KV bytes of `batch` sequences of `context` tokens.
bytes_t kv_cache_bytes(const ModelSpec& m, DType kv, std::uint64_t batch, std::uint64_t context);

struct WeightBytes {
  bytes_t quantized = 0;      // packed weights of the linear layers
  bytes_t scales = 0;         // scales and zero points
  bytes_t unquantized = 0;    // embedding, lm_head, norms, biases (bf16)
  std::uint64_t quantized_params = 0;
  std::uint64_t unquantized_params = 0;
  bytes_t total() const { return quantized + scales + unquantized; }
};
// Exact bytes of the weights stored as `weights` (bf16, fp16, fp8, int8, int4; fp32 allowed too).
WeightBytes serving_weights(const ModelSpec& m, DType weights, std::uint64_t group_size = 128);
bytes_t serving_weight_bytes(const ModelSpec& m, DType weights, std::uint64_t group_size = 128);

// ---- vLLM ----

struct ServeOptions {
  bytes_t total_memory = 0;             // what torch.cuda.mem_get_info reports as total
  std::string device_name;              // for the default max_num_batched_tokens
  double gpu_memory_utilization = 0.9;  // (0, 1]
  std::optional<std::uint64_t> max_model_len;           // default: the model's max_positions
  std::optional<std::uint64_t> max_num_batched_tokens;  // default: vLLM's (8192 or 2048)
  std::optional<std::uint64_t> max_num_seqs;            // default: vLLM's (1024 or 256)
  std::uint64_t block_size = 16;
  DType kv_dtype = DType::bf16;
  DType weights = DType::bf16;
  std::uint64_t group_size = 128;
  // Memory the profiling run sees growing outside PyTorch (cuBLAS/NCCL workspaces); default in
  // docs/serving.md.
  std::optional<bytes_t> non_torch;
  bytes_t cudagraph = 0;  // CUDA graph memory when vLLM subtracts its estimate
};

// One KV cache group of vLLM's hybrid allocator.
struct KvGroup {
  std::string kind;                   // "full" or "sliding"
  std::uint64_t layers = 0;           // layers in the group (padding included)
  std::uint64_t window = 0;           // sliding window (0 for full)
  bytes_t max_usage_per_layer = 0;    // spec.max_memory_usage_bytes at max_model_len
};

struct ServePlan {
  // inputs after defaults
  bytes_t total_memory = 0;
  double gpu_memory_utilization = 0;
  std::uint64_t max_model_len = 0, max_num_batched_tokens = 0, max_num_seqs = 0, block_size = 0;
  DType kv_dtype = DType::bf16, weights_dtype = DType::bf16;
  // memory
  bytes_t requested = 0;         // total × utilization
  bytes_t weights = 0;           // model weights as loaded
  bytes_t activation_peak = 0;   // profiling run's torch peak increase
  bytes_t non_torch = 0;
  bytes_t cudagraph = 0;
  bytes_t non_kv = 0;            // weights + activation_peak + non_torch + cudagraph
  std::int64_t available = 0;    // requested − non_kv (may be negative)
  // pool
  bytes_t page_size = 0;             // bytes of one block in one layer
  std::uint64_t group_size = 0;      // layers per KV cache group (the pool's layer count)
  std::vector<KvGroup> groups;
  std::uint64_t num_blocks = 0;
  std::uint64_t kv_tokens = 0;       // "GPU KV cache size: N tokens"
  bytes_t pool_bytes = 0;            // num_blocks × page × group_size
  std::uint64_t blocks_per_request = 0;  // at max_model_len
  double max_concurrency = 0;        // "Maximum concurrency for X tokens per request: Y.YYx"
  bytes_t needed_one_request = 0;    // KV bytes vLLM needs for one request of max_model_len
  std::uint64_t estimated_max_model_len = 0;  // when one request does not fit
  bool fits_one_request = false;
  std::string error;                 // vLLM's ValueError text when it would refuse to start

  std::string kv_cache_size_line() const;    // "GPU KV cache size: 1,234 tokens"
  std::string concurrency_line() const;      // "Maximum concurrency for 8,192 tokens per request: 3.25x"
};

// The pool vLLM would allocate. Throws Error(invalid_argument) for a utilization outside (0, 1],
// a max_model_len beyond the model's, zero sizes; a pool that cannot hold one request is not an
// exception here: fits_one_request is false and `error` holds vLLM's message.
ServePlan plan_serving(const ModelSpec& m, const ServeOptions& o);
// Throws Error(out_of_memory) with plan.error when the plan cannot serve one request.
void require_one_request(const ServePlan& plan);

// vLLM's profiling peak: one forward of max_num_batched_tokens tokens and a sampler run over
// min(max_num_seqs, max_num_batched_tokens) rows (docs/serving.md §3.2); a mixture of experts
// through vLLM's 16-bit fused MoE kernel (§3.2; quantized experts, `weights` other than bf16 or
// fp16, are Error(unsupported)).
bytes_t vllm_profile_activation_peak(const ModelSpec& m, std::uint64_t tokens, std::uint64_t seqs,
                                     DType weights = DType::bf16);

// vLLM's "GiB" figures: round(bytes / 2^30, 2) printed as a Python float ("10.0", "5.62").
std::string vllm_gib(bytes_t b);

// ---- traffic ----

struct Traffic {
  std::uint64_t concurrency = 0;   // requests in flight
  std::uint64_t mean_context = 0;  // tokens per request (prompt + generated), mean
  std::uint64_t max_context = 0;   // the longest request
};
// "64x2048" (max = mean) or "64:2048:8192". Throws Error(invalid_argument).
Traffic parse_traffic(const std::string& text);

struct TrafficFit {
  Traffic traffic;
  std::uint64_t blocks_needed = 0;  // concurrency × blocks of a mean request
  std::uint64_t blocks_max_request = 0;
  bytes_t bytes_needed = 0;
  bool fits = false;
  double oversize = 0;              // pool blocks / blocks needed (≥ 1 when it fits)
  bytes_t excess_bytes = 0;         // pool bytes beyond the need (0 when it does not fit)
  double suggested_utilization = 0; // the smallest utilization (2 decimals) that holds the traffic; 0
                                    // when no utilization would (a request past max_model_len, more
                                    // requests than max_num_seqs)
  std::string reason;               // why it does not fit
};
TrafficFit fit_traffic(const ModelSpec& m, const ServePlan& plan, const Traffic& t);

}  // namespace membudget
