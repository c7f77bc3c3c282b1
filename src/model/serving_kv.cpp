// KV cache bytes and serving weight bytes (include/membudget/serving.hpp, docs/serving.md §1–2).
#include <algorithm>

#include "membudget/error.hpp"
#include "membudget/serving.hpp"
#include "weight_storage.hpp"

namespace membudget {
namespace {

bytes_t mul(bytes_t a, bytes_t b, const char* what) { return checked_mul(a, b, what); }
bytes_t add(bytes_t a, bytes_t b, const char* what) { return checked_add(a, b, what); }

}  // namespace

bytes_t kv_dtype_bytes(DType kv) {
  require_kv_dtype(kv);
  switch (kv) {
    case DType::fp32: return 4;
    case DType::bf16:
    case DType::fp16: return 2;
    case DType::fp8:
    case DType::int8: return 1;
    case DType::int4: break;  // refused above
  }
  return 0;  // not reached: require_kv_dtype refused every other value
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

WeightBytes serving_weights(const ModelSpec& m, DType weights, std::uint64_t group_size) {
  m.validate();
  if (group_size == 0) throw Error(ErrorKind::invalid_job, "--group-size: must be at least 1");
  WeightBytes w;
  // Every decoder layer has layer 0's tensors today (ModelSpec::layer_tensors): one layer times L.
  auto count = [&](const ParamTensor& t, bool in_layer, std::uint64_t copies) {
    const auto stored = detail::stored_tensor(t, in_layer, weights, group_size);
    const std::uint64_t params = checked_mul(t.elements(), copies, "weight parameters");
    bool quantized = false;
    for (const auto& p : stored) {
      const bytes_t b = checked_mul(p.bytes, copies, "weight bytes");
      switch (p.kind) {
        case detail::Stored::value: w.unquantized = add(w.unquantized, b, "unquantized weights"); break;
        case detail::Stored::quantized:
          w.quantized = add(w.quantized, b, "quantized weights");
          quantized = true;
          break;
        case detail::Stored::scale: w.scales = add(w.scales, b, "scales"); break;
      }
    }
    if (quantized) w.quantized_params = add(w.quantized_params, params, "quantized parameters");
    else w.unquantized_params = add(w.unquantized_params, params, "unquantized parameters");
  };
  for (const ParamTensor& t : m.outer_tensors()) count(t, false, 1);
  for (const ParamTensor& t : m.layer_tensors(0)) count(t, true, m.num_layers);
  return w;
}

bytes_t serving_weight_bytes(const ModelSpec& m, DType weights, std::uint64_t group_size) {
  return serving_weights(m, weights, group_size).total();
}

}  // namespace membudget
