// KV cache bytes and serving weight bytes (include/membudget/serving.hpp, docs/serving.md §1–2).
#include <algorithm>

#include "membudget/error.hpp"
#include "membudget/serving.hpp"

namespace membudget {
namespace {

bytes_t mul(bytes_t a, bytes_t b, const char* what) { return checked_mul(a, b, what); }
bytes_t add(bytes_t a, bytes_t b, const char* what) { return checked_add(a, b, what); }
std::uint64_t cdiv(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

}  // namespace

bytes_t kv_dtype_bytes(DType kv) {
  switch (kv) {
    case DType::fp32: return 4;
    case DType::bf16:
    case DType::fp16: return 2;
    case DType::fp8:
    case DType::int8: return 1;
    case DType::int4: break;
  }
  throw Error(ErrorKind::invalid_job, "--kv-dtype: int4 is not a KV cache dtype; use bf16, fp16, fp8 or int8");
}

bytes_t kv_bytes_per_token_layer(const ModelSpec& m, DType kv) {
  const bytes_t e = kv_dtype_bytes(kv);
  if (m.mla.enabled())
    return mul(add(m.mla.kv_lora_rank, m.mla.qk_rope_head_dim, "MLA latent width"), e, "MLA KV bytes per token");
  return checked_product("KV bytes per token and layer", 2, m.num_kv_heads, m.head_dim, e);
}

bytes_t kv_bytes_per_token(const ModelSpec& m, DType kv) {
  return mul(m.num_layers, kv_bytes_per_token_layer(m, kv), "KV bytes per token");
}

bytes_t kv_bytes_per_sequence(const ModelSpec& m, DType kv, std::uint64_t context) {
  const bytes_t per = kv_bytes_per_token_layer(m, kv);
  const std::uint64_t windowed = m.sliding.windowed_layers(m.num_layers);
  const std::uint64_t full = m.num_layers - windowed;
  bytes_t total = mul(mul(full, context, "KV tokens"), per, "KV bytes of one sequence");
  if (windowed) {
    const std::uint64_t held = std::min(context, m.sliding.window);
    total = add(total, mul(mul(windowed, held, "KV tokens"), per, "KV bytes of one sequence"),
                "KV bytes of one sequence");
  }
  return total;
}

bytes_t kv_cache_bytes(const ModelSpec& m, DType kv, std::uint64_t batch, std::uint64_t context) {
  return mul(batch, kv_bytes_per_sequence(m, kv, context), "KV cache bytes");
}

std::vector<LinearShape> linear_layers(const ModelSpec& m) {
  const std::uint64_t L = m.num_layers, h = m.hidden_size, I = m.intermediate_size;
  std::vector<LinearShape> v;
  if (m.mla.enabled()) {
    const auto& a = m.mla;
    const std::uint64_t qk_head = a.qk_nope_head_dim + a.qk_rope_head_dim;
    if (a.q_lora_rank > 0) {
      v.push_back({"q_a_proj", h, a.q_lora_rank, L});
      v.push_back({"q_b_proj", a.q_lora_rank, m.num_heads * qk_head, L});
    } else {
      v.push_back({"q_proj", h, m.num_heads * qk_head, L});
    }
    v.push_back({"kv_a_proj_with_mqa", h, a.kv_lora_rank + a.qk_rope_head_dim, L});
    v.push_back({"kv_b_proj", a.kv_lora_rank, m.num_heads * (a.qk_nope_head_dim + a.v_head_dim), L});
    v.push_back({"o_proj", m.num_heads * a.v_head_dim, h, L});
  } else {
    v.push_back({"q_proj", h, m.q_dim(), L});
    v.push_back({"k_proj", h, m.kv_dim(), L});
    v.push_back({"v_proj", h, m.kv_dim(), L});
    v.push_back({"o_proj", m.q_dim(), h, L});
  }
  if (m.mlp == MlpKind::plain_gelu) {
    v.push_back({"fc1", h, I, L});
    v.push_back({"fc2", I, h, L});
  } else {
    v.push_back({"gate_proj", h, I, L});
    v.push_back({"up_proj", h, I, L});
    v.push_back({"down_proj", I, h, L});
  }
  return v;
}

WeightBytes serving_weights(const ModelSpec& m, DType weights, std::uint64_t group_size) {
  m.validate();
  if (group_size == 0) throw Error(ErrorKind::invalid_job, "--group-size: must be at least 1");
  const std::uint64_t total = m.parameters().total;
  WeightBytes w;
  if (weights == DType::bf16 || weights == DType::fp16 || weights == DType::fp32) {
    w.unquantized_params = total;
    w.unquantized = mul(total, weights == DType::fp32 ? 4 : 2, "weight bytes");
    return w;
  }
  std::uint64_t qparams = 0;
  for (const auto& l : linear_layers(m)) {
    const std::uint64_t K = l.in, N = l.out, n = l.count;
    const std::uint64_t params = checked_product("linear weights", K, N, n);
    qparams = add(qparams, params, "quantized parameters");
    switch (weights) {
      case DType::fp8:
        w.quantized = add(w.quantized, params, "fp8 weights");
        w.scales = add(w.scales, mul(n, 4, "fp8 scales"), "fp8 scales");  // one fp32 per tensor
        break;
      case DType::int8:
        w.quantized = add(w.quantized, params, "int8 weights");
        w.scales = add(w.scales, checked_product("int8 scales", cdiv(K, group_size), N, 2, n), "int8 scales");
        break;
      case DType::int4: {
        // GPTQ/AWQ: qweight int32[ceil(K/8)][N]; scales fp16[ceil(K/g)][N]; qzeros int32[ceil(K/g)][ceil(N/8)]
        w.quantized = add(w.quantized, checked_product("int4 qweight", cdiv(K, 8), N, 4, n), "int4 weights");
        const std::uint64_t groups = cdiv(K, group_size);
        w.scales = add(w.scales, checked_product("int4 scales", groups, N, 2, n), "int4 scales");
        w.scales = add(w.scales, checked_product("int4 zeros", groups, cdiv(N, 8), 4, n), "int4 zeros");
        break;
      }
      default: break;
    }
  }
  w.quantized_params = qparams;
  w.unquantized_params = total - qparams;
  w.unquantized = mul(w.unquantized_params, 2, "unquantized weights (bf16)");
  return w;
}

bytes_t serving_weight_bytes(const ModelSpec& m, DType weights, std::uint64_t group_size) {
  return serving_weights(m, weights, group_size).total();
}

}  // namespace membudget
