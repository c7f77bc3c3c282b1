// vLLM's KV pool (include/membudget/serving.hpp, docs/serving.md §3).
//
// The arithmetic follows vLLM v1: gpu_worker.determine_available_memory (requested memory minus
// weights, the profiling run's torch peak increase and the non-torch growth),
// kv_cache_utils.get_kv_cache_groups / get_num_blocks / _report_kv_cache_config /
// get_max_concurrency_for_kv_cache_config / _check_enough_kv_cache_memory, and the
// max_memory_usage_bytes of FullAttentionSpec, SlidingWindowSpec and MLAAttentionSpec.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "predictors.hpp"
#include "membudget/error.hpp"
#include "membudget/input.hpp"
#include "membudget/serving.hpp"

namespace membudget {
namespace {

std::uint64_t cdiv(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

std::string commas(std::uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<std::size_t>(i), ",");
  return s;
}

bytes_t round512(bytes_t b) { return b == 0 ? 0 : (b + 511) / 512 * 512; }

// What one layer of a group needs for one request of `len` tokens (spec.max_memory_usage_bytes).
bytes_t usage_per_layer(const KvGroup& g, bytes_t page, std::uint64_t block, std::uint64_t len,
                        std::uint64_t batched) {
  if (g.kind == "sliding") {
    const std::uint64_t tokens = std::min(g.window - 1 + batched, len);
    return checked_mul(cdiv(tokens, block) + 1, page, "sliding-window KV usage");
  }
  return checked_mul(cdiv(len, block), page, "KV usage");
}

std::uint64_t blocks_per_request(const ServePlan& p, std::uint64_t len) {
  std::uint64_t blocks = 0;
  for (const auto& g : p.groups)
    blocks += cdiv(usage_per_layer(g, p.page_size, p.block_size, len, p.max_num_batched_tokens), p.page_size);
  return blocks;
}

bytes_t needed_bytes(const ServePlan& p, std::uint64_t len) {
  return checked_product("KV bytes of one request", p.group_size, p.page_size, blocks_per_request(p, len));
}

const char* kConserving = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.";

}  // namespace

std::string vllm_gib(bytes_t b) {
  const double g = std::round(static_cast<double>(b) / static_cast<double>(GiB) * 100.0) / 100.0;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", g);
  std::string s = buf;
  if (s.size() >= 2 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();  // "10.00" → "10.0"
  return s;
}

std::string ServePlan::kv_cache_size_line() const { return "GPU KV cache size: " + commas(kv_tokens) + " tokens"; }

std::string ServePlan::concurrency_line() const {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2fx", max_concurrency);
  return "Maximum concurrency for " + commas(max_model_len) + " tokens per request: " + buf;
}

// vLLM's fused mixture of experts over T tokens (bf16, one GPU, no expert parallel), as the modular
// Triton kernel runs it on Hopper (vllm/model_executor/layers/fused_moe: TritonExperts, the
// UnquantizedFusedMoEMethod's default there; early 2026). Modelled from the source, not measured.
struct VllmMoe {
  bytes_t workspace = 0;  // the persistent workspace: one buffer for every layer, kept after the run
  bytes_t peak = 0;       // the block's own tensors at its highest moment, beyond the stream
};
VllmMoe vllm_moe_block(const ModelSpec& m, std::uint64_t T) {
  const auto& moe = m.moe;
  const bytes_t e = 2, h = m.hidden_size, k = moe.top_k, N = 2 * moe.expert_ff;
  auto r256 = [](bytes_t v) { return (v + 255) / 256 * 256; };
  VllmMoe out;
  // workspace13 (T, k, max(N/2, h)) and workspace2 (T, k, max(N, h)) from the workspace manager,
  // each rounded to 256 B; it only grows and serves every layer
  out.workspace = r256(checked_product("vLLM MoE workspace13", T, k, std::max(N / 2, h), e)) +
                  r256(checked_product("vLLM MoE workspace2", T, k, std::max(N, h), e));
  // the router's logits (T, E) in the model's dtype, fused_topk's fp32 weights and int32 ids (T, k),
  // and moe_align_block_size's sorted ids and expert ids (int32, BLOCK_SIZE_M 64 as the default config)
  const bytes_t BM = 64;
  const bytes_t padded = checked_add(checked_mul(T, k, "vLLM MoE tokens"), moe.experts * (BM - 1), "vLLM MoE padded ids");
  const bytes_t routing = round512(checked_product("vLLM router logits", T, moe.experts, e)) +
                          2 * round512(checked_product("vLLM top-k", T, k, 4)) + round512(checked_mul(padded, 4, "sorted ids")) +
                          round512((padded + BM - 1) / BM * 4) + 512;
  const bytes_t th = round512(checked_product("vLLM MoE output", T, h, e));
  // the shared expert (Qwen2-MoE, DeepSeek) runs first, a plain MLP (gate_up and its activation),
  // and its (T, h) output (Qwen2: gated by a sigmoid, a new tensor) stays through the routed pass;
  // the routed output (T, h), then their sum, a new (T, h) while both are live
  bytes_t shared_mlp = 0, kept = 0;
  if (moe.shared_ff) {
    shared_mlp = round512(checked_product("vLLM shared gate_up", T, 2 * moe.shared_ff, e)) +
                 round512(checked_product("vLLM shared activation", T, moe.shared_ff, e));
    kept = th;
  }
  const bytes_t routed = routing + th + (moe.shared_ff ? kept + th : 0);
  out.peak = std::max(routing + shared_mlp, routed);
  return out;
}

bytes_t vllm_profile_activation_peak(const ModelSpec& m, std::uint64_t T, std::uint64_t seqs, DType weights) {
  if (m.moe.enabled() && m.moe_layers() > 0 && weights != DType::bf16 && weights != DType::fp16)
    throw Error(ErrorKind::unsupported, m.display_name() + ": vLLM's " +
                                            to_string(weights) +
                                            " mixture-of-experts kernels (Marlin, fp8 Triton) are not modelled; the "
                                            "16-bit fused MoE is (--weights bf16)");
  // A vLLM decoder layer in bf16 with fused kernels: the hidden states and the residual live across
  // layers (fused add-RMSNorm and rotary work in place); attention holds the fused qkv output and
  // the attention output; the MLP holds the fused gate_up output and the activation; a mixture of
  // experts its router, routing buffers and outputs, and (once, for every layer) the kernel's
  // workspace.
  const bytes_t e = 2, h = m.hidden_size, I = m.intermediate_size;
  bytes_t qkv_width, attn_width;
  if (m.mla.enabled()) {
    const auto& a = m.mla;
    qkv_width = m.num_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim) + a.kv_lora_rank + a.qk_rope_head_dim;
    attn_width = m.num_heads * a.v_head_dim;
  } else {
    qkv_width = m.q_dim() + 2 * m.kv_dim();
    attn_width = m.q_dim();
  }
  const bytes_t stream = 2 * round512(checked_product("profile hidden states", T, h, e));
  const bytes_t attn = round512(checked_product("profile qkv", T, qkv_width, e)) +
                       round512(checked_product("profile attention output", T, attn_width, e));
  const bool gated = m.mlp != MlpKind::plain_gelu;
  const bytes_t dense_mlp = round512(checked_product("profile gate_up", T, gated ? 2 * I : I, e)) +
                            round512(checked_product("profile activation", T, I, e));
  const bool any_dense = m.moe_layers() < m.num_layers;
  bytes_t block = std::max(attn, any_dense ? dense_mlp : 0);
  bytes_t workspace = 0;
  if (m.moe.enabled() && m.moe_layers() > 0) {
    const VllmMoe moe = vllm_moe_block(m, T);
    block = std::max(block, moe.peak);
    workspace = moe.workspace;  // allocated at the first MoE layer, live from there on
  }
  const bytes_t forward = checked_add(stream + block, workspace, "profile forward");
  // The dummy sampler run: bf16 logits, their fp32 copy, the top-k/top-p sort (fp32 values and
  // int64 indices), the softmax, the mask and the scattered result: 27 bytes per logit. The MoE
  // workspace is still held.
  const std::uint64_t rows = std::min(seqs, T);
  const bytes_t sampler = round512(checked_product("profile hidden states", T, h, e)) +
                          checked_product("profile sampler", rows, m.vocab_size, 27) + workspace;
  return std::max(forward, sampler);
}

ServePlan plan_serving(const ModelSpec& m, const ServeOptions& o) {
  m.validate();
  auto bad = [](const std::string& what) { return Error(ErrorKind::invalid_argument, what); };
  if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0))
    throw bad("--gpu-memory-utilization: must be in (0, 1], e.g. 0.9 (got " +
              std::to_string(o.gpu_memory_utilization) + ")");
  if (o.total_memory == 0) throw bad("--device: the card's capacity must be positive");
  // available = requested − non_kv is signed (it may be negative): a capacity of 2^63 bytes or more
  // would wrap it.
  if (o.total_memory > static_cast<bytes_t>(INT64_MAX))
    throw Error(ErrorKind::overflow, "--device-memory: " + std::to_string(o.total_memory) +
                                         " bytes is more than vLLM's budget can hold here (at most 2^63 - 1)");
  // CacheConfig's BlockSize (vllm/config/cache.py): `vllm serve --block-size` takes only these
  constexpr std::uint64_t kBlockSizes[] = {1, 8, 16, 32, 64, 128, 256};
  if (std::find(std::begin(kBlockSizes), std::end(kBlockSizes), o.block_size) == std::end(kBlockSizes))
    throw bad("--block-size: " + std::to_string(o.block_size) + " is not one vLLM takes (1, 8, 16, 32, 64, 128, 256; 16 by default)");
  ServePlan p;
  p.total_memory = o.total_memory;
  p.gpu_memory_utilization = o.gpu_memory_utilization;
  p.block_size = o.block_size;
  p.kv_dtype = o.kv_dtype;
  p.weights_dtype = o.weights;
  p.max_model_len = o.max_model_len.value_or(m.default_max_model_len ? m.default_max_model_len : m.max_positions);
  if (p.max_model_len == 0) throw bad("--max-model-len: must be at least 1");
  if (p.max_model_len > m.max_positions)
    throw bad("--max-model-len: " + std::to_string(p.max_model_len) +
              " is greater than the model's maximum context (max_positions " + std::to_string(m.max_positions) +
              "); vLLM refuses it as 'User-specified max_model_len (" + std::to_string(p.max_model_len) +
              ") is greater than the derived max_model_len'");
  // vLLM's defaults for `vllm serve` (EngineArgs.get_batch_defaults): large cards that are not an
  // A100 get 8192 batched tokens and 1024 sequences, the rest 2048 and 256.
  std::string lname;
  for (char c : o.device_name) lname += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool big = o.total_memory >= 70 * GiB && lname.find("a100") == std::string::npos;
  p.max_num_batched_tokens = o.max_num_batched_tokens.value_or(big ? 8192 : 2048);
  p.max_num_seqs = o.max_num_seqs.value_or(big ? 1024 : 256);
  if (p.max_num_batched_tokens == 0) throw bad("--max-num-batched-tokens: must be at least 1");
  if (p.max_num_seqs == 0) throw bad("--max-num-seqs: must be at least 1");
  // SchedulerConfig._verify_args: every sequence of a step gets at least one token of it
  if (p.max_num_batched_tokens < p.max_num_seqs)
    throw bad("--max-num-batched-tokens " + std::to_string(p.max_num_batched_tokens) + " is below --max-num-seqs " +
              std::to_string(p.max_num_seqs) + "; vLLM refuses it as 'max_num_batched_tokens (" +
              std::to_string(p.max_num_batched_tokens) + ") must be greater than or equal to max_num_seqs (" +
              std::to_string(p.max_num_seqs) + ")'");

  // total · utilization ≤ total; in doubles it can round up to 2^64 (a total within 1 KiB of 2^64),
  // which no integer holds: the range is checked, never cast blindly.
  const double requested = static_cast<double>(o.total_memory) * o.gpu_memory_utilization;
  p.requested = requested >= 18446744073709551616.0 ? o.total_memory : bytes_from_double(requested, "requested memory");
  p.weights = serving_weight_bytes(m, o.weights, o.group_size);
  p.activation_peak = vllm_profile_activation_peak(m, p.max_num_batched_tokens, p.max_num_seqs, o.weights);
  p.non_torch = o.non_torch.value_or(128 * MiB);
  p.cudagraph = o.cudagraph;
  p.non_kv = checked_add(checked_add(p.weights, p.activation_peak, "non-KV memory"),
                         checked_add(p.non_torch, p.cudagraph, "non-KV memory"), "non-KV memory");
  // available = requested − non_kv, signed, computed without wrapping (requested may round up to
  // 2^63 on a card of 2^63 − 1 bytes).
  if (p.requested >= p.non_kv) {
    const bytes_t d = p.requested - p.non_kv;
    if (d > static_cast<bytes_t>(INT64_MAX))
      throw Error(ErrorKind::overflow, "available KV cache memory: " + std::to_string(d) + " bytes exceeds 2^63 - 1");
    p.available = static_cast<std::int64_t>(d);
  } else {
    const bytes_t d = p.non_kv - p.requested;
    p.available = d > static_cast<bytes_t>(INT64_MAX) ? INT64_MIN : -static_cast<std::int64_t>(d);
  }

  // Page of one block in one layer: 2 × block × kv_heads × head_size × bytes (MLA: one latent).
  p.page_size = checked_mul(o.block_size, kv_bytes_per_token_layer(m, o.kv_dtype), "KV page size");
  const std::uint64_t L = m.num_layers;
  const std::uint64_t W = m.sliding.windowed_layers(L), F = L - W;
  if (W == 0 || F == 0) {
    KvGroup g{W ? "sliding" : "full", L, W ? m.sliding.window : 0, 0};
    p.groups.push_back(g);
    p.group_size = L;
  } else {
    // Hybrid: groups of equal layer counts (kv_cache_utils._get_kv_cache_groups_uniform_page_size).
    std::uint64_t gs = std::min(F, W);
    const std::uint64_t mx = std::max(F, W);
    if (static_cast<double>(mx) < static_cast<double>(gs) * 1.5) gs = mx;
    for (std::uint64_t i = 0; i < cdiv(F, gs); ++i) p.groups.push_back({"full", gs, 0, 0});
    for (std::uint64_t i = 0; i < cdiv(W, gs); ++i) p.groups.push_back({"sliding", gs, m.sliding.window, 0});
    p.group_size = gs;
  }
  for (auto& g : p.groups)
    g.max_usage_per_layer = usage_per_layer(g, p.page_size, p.block_size, p.max_model_len, p.max_num_batched_tokens);

  p.blocks_per_request = blocks_per_request(p, p.max_model_len);
  p.needed_one_request = needed_bytes(p, p.max_model_len);
  if (p.available > 0) {
    p.num_blocks = static_cast<std::uint64_t>(p.available) / p.page_size / p.group_size;
    p.pool_bytes = checked_product("KV pool bytes", p.num_blocks, p.page_size, p.group_size);
    p.kv_tokens = p.num_blocks / p.groups.size() * p.block_size;
    p.max_concurrency = static_cast<double>(p.num_blocks) / static_cast<double>(p.blocks_per_request);
  }
  if (p.available <= 0) {
    p.error = std::string("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                          "when initializing the engine. ") + kConserving;
  } else if (p.needed_one_request > static_cast<bytes_t>(p.available)) {
    // estimate_max_model_len: binary search over [1, max_model_len]
    const auto avail = static_cast<bytes_t>(p.available);
    std::uint64_t lo = 1, hi = p.max_model_len, best = 0;
    if (needed_bytes(p, 1) <= avail) {
      best = 1;
      while (lo <= hi) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        if (needed_bytes(p, mid) <= avail) {
          best = mid;
          lo = mid + 1;
        } else {
          hi = mid - 1;
        }
      }
    }
    p.estimated_max_model_len = best;
    std::string est;
    if (best > 0)
      est = "Based on the available memory, the estimated maximum model length is " + std::to_string(best) + ". ";
    p.error = "To serve at least one request with the models's max seq len (" + std::to_string(p.max_model_len) +
              "), (" + vllm_gib(p.needed_one_request) +
              " GiB KV cache is needed, which is larger than the available KV cache memory (" +
              vllm_gib(avail) + " GiB). " + est +
              "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. " +
              kConserving;
  } else {
    p.fits_one_request = true;
  }
  return p;
}

void require_one_request(const ServePlan& plan) {
  if (!plan.fits_one_request) throw Error(ErrorKind::out_of_memory, "vLLM would refuse to start: ValueError: " + plan.error);
}

Traffic parse_traffic(const std::string& text) {
  auto bad = [&] {
    return Error(ErrorKind::invalid_argument, "--traffic: '" + text +
                                                  "' is not CONCURRENCYxCONTEXT (e.g. 64x2048) or "
                                                  "CONCURRENCY:MEAN:MAX (e.g. 64:2048:8192)");
  };
  if (text.find('\n') != std::string::npos) throw bad();  // the loop below ends at the first one
  std::vector<std::uint64_t> nums;
  std::string cur;
  char sep = 0;
  for (char c : text + "\n") {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      cur += c;
      continue;
    }
    if (cur.empty()) throw bad();
    // (more requests or tokens than any card holds: a typo, not a format; leading zeros are no size)
    if (cur.size() - std::min(cur.find_first_not_of('0'), cur.size() - 1) > 12)
      throw Error(ErrorKind::invalid_argument, "--traffic: " + cur + " is absurdly large (more than 12 digits)");
    nums.push_back(std::stoull(cur));
    cur.clear();
    if (c == '\n') break;
    if (c != 'x' && c != ':') throw bad();
    if (sep && sep != c) throw bad();
    sep = c;
  }
  Traffic t;
  if (sep == 'x' && nums.size() == 2) {
    t = {nums[0], nums[1], nums[1]};
  } else if (sep == ':' && (nums.size() == 2 || nums.size() == 3)) {
    t = {nums[0], nums[1], nums.size() == 3 ? nums[2] : nums[1]};
  } else {
    throw bad();
  }
  if (t.concurrency == 0 || t.mean_context == 0) throw Error(ErrorKind::invalid_argument, "--traffic: concurrency and context must be at least 1");
  if (t.max_context < t.mean_context)
    throw Error(ErrorKind::invalid_argument, "--traffic: the max context is below the mean context");
  return t;
}

TrafficFit fit_traffic(const ModelSpec& m, const ServePlan& p, const Traffic& t) {
  TrafficFit f;
  f.traffic = t;
  const std::uint64_t per_mean = blocks_per_request(p, t.mean_context);
  f.blocks_max_request = blocks_per_request(p, t.max_context);
  f.blocks_needed = checked_mul(t.concurrency, per_mean, "traffic blocks");
  const bytes_t block_bytes = checked_mul(p.page_size, p.group_size, "block bytes");
  f.bytes_needed = checked_mul(f.blocks_needed, block_bytes, "traffic bytes");
  // A reason no utilization mends leaves suggested_utilization 0.
  bool memory_mends_it = false;
  if (t.max_context > p.max_model_len) {
    f.reason = "the longest request (" + commas(t.max_context) + " tokens) exceeds max_model_len (" +
               commas(p.max_model_len) + ")" +
               (t.max_context <= m.max_positions ? "; give --max-model-len " + std::to_string(t.max_context) + " or more"
                                                 : "; the model's context is " + commas(m.max_positions) + " tokens");
  } else if (!p.fits_one_request) {
    f.reason = "vLLM would not start: " + p.error;
    memory_mends_it = true;
  } else if (t.concurrency > p.max_num_seqs) {
    // the scheduler runs at most max_num_seqs requests at once; the others wait in its queue (and
    // vLLM refuses max_num_seqs above max_num_batched_tokens, so the advice raises both if need be)
    const std::string count = std::to_string(t.concurrency);
    f.reason = commas(t.concurrency) + " requests in flight, but vLLM runs at most max_num_seqs (" +
               commas(p.max_num_seqs) + ") at once; the others queue (give --max-num-seqs " + count +
               (t.concurrency > p.max_num_batched_tokens ? " and --max-num-batched-tokens " + count + " or more" : "") +
               ")";
  } else if (f.blocks_needed > p.num_blocks) {
    memory_mends_it = true;
    f.reason = commas(t.concurrency) + " requests of " + commas(t.mean_context) + " tokens need " +
               commas(f.blocks_needed) + " blocks; the pool has " + commas(p.num_blocks);
  } else {
    f.fits = true;
  }
  f.oversize = f.blocks_needed ? static_cast<double>(p.num_blocks) / static_cast<double>(f.blocks_needed) : 0.0;
  if (f.fits) f.excess_bytes = (p.num_blocks - f.blocks_needed) * block_bytes;
  // The smallest utilization whose pool holds the traffic and one request of max_model_len.
  if (f.fits || memory_mends_it) {
    const std::uint64_t blocks = std::max(f.blocks_needed, p.blocks_per_request);
    const double need = static_cast<double>(p.non_kv) + static_cast<double>(blocks) * static_cast<double>(block_bytes);
    f.suggested_utilization = std::ceil(need / static_cast<double>(p.total_memory) * 100.0) / 100.0;
  }
  return f;
}

}  // namespace membudget
