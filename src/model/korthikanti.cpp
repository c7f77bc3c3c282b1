// The textbook activation model: Korthikanti et al. 2022, "Reducing Activation Recomputation in
// Large Transformer Models" (arXiv 2205.05198), §4 and Table 2, per layer, 16-bit activations,
// 1-byte dropout masks. Tensor parallelism (Table 2, sbh(10 + 24/t + 5as/(ht))) is the same
// formula over one rank's local spec (tp_local_spec: heads, KV heads and I divided by t; the norm
// inputs, the LayerNorm outputs and the dropout masks stay whole). Sequence parallelism (Table 2,
// sbh(34/t + 5as/(ht))) shards those along the sequence too: they are divided by t. (Megatron
// all-gathers the LayerNorm output again in backward; PyTorch's SP keeps the gathered copy, which
// the inventory counts and the textbook does not.)
#include "korthikanti.hpp"
#include "parallel.hpp"

namespace membudget::detail {
namespace {
bytes_t mul(bytes_t a, bytes_t b, bytes_t c = 1, bytes_t d = 1) {
  return checked_product("korthikanti activation size", a, b, c, d);
}

// Calls add(name, shape, bytes, dtype) for each tensor one layer keeps. `moe`: the layer's MLP is a
// mixture of experts, counted as the textbook would extend it: the gated expert MLP's four
// I_e-wide tensors and its input once per routed token (k·sb of them), the router's logits, and a
// shared expert as a dense MLP of its width.
template <class Add>
void korthikanti_layer(const ModelSpec& m, const Job& job, bool moe, Add&& add) {
  // (a context-parallel rank keeps its share of the sequence)
  const bytes_t s = rank_seq(job), b = job.batch, h = m.hidden_size, I = m.intermediate_size, a = m.num_heads;
  const bytes_t sb = mul(s, b);
  const bytes_t qd = m.q_dim(), kvd = m.kv_dim();
  const bytes_t sp = job.parallel.sequence_parallel ? job.parallel.tensor : 1;  // the sequence-sharded terms' divisor
  if (job.recompute == Recompute::full) {
    // Full recompute keeps only each layer's input ("2sbh" in 16-bit; 4sbh when the residual
    // stream is fp32, as under amp-bf16 and fp32 recipes).
    const bytes_t resid = job.precision == Precision::bf16 || job.precision == Precision::bf16_master ? 2 : 4;
    add("layer input (full recompute)", "s·b·h", mul(sb, h, resid) / sp, resid == 2 ? "16-bit" : "fp32");
    return;
  }
  // Attention block: 11sbh + 5as²b, with K and V at kv width under GQA.
  add("QKV input (LayerNorm output)", "2sbh", mul(sb, h, 2) / sp);
  add("Q for QKᵀ", "2sb·q", mul(sb, qd, 2));
  add("K for QKᵀ", "2sb·kv", mul(sb, kvd, 2));
  add("V", "2sb·kv", mul(sb, kvd, 2));
  add("output-projection input", "2sb·q", mul(sb, qd, 2));
  add("attention dropout mask", "sbh", mul(sb, h) / sp, "uint8");
  const bool fused = job.attention == Attention::flash;
  if (!fused && job.recompute != Recompute::selective) {
    add("softmax output", "2as²b", mul(a, s, s, b) * 2);
    add("softmax dropout mask", "as²b", mul(a, s, s, b), "uint8");
    add("dropout output", "2as²b", mul(a, s, s, b) * 2);
  } else if (fused) {
    add("softmax log-sum-exp (fused attention)", "4asb", mul(a, sb, 4), "fp32");
  }
  // MLP: 19sbh for the 4h GeLU MLP; a gated MLP keeps gate, up, activation and product at width I.
  add("MLP input (LayerNorm output)", "2sbh", mul(sb, h, 2) / sp);
  if (moe) {
    const bytes_t routed = mul(sb, m.moe.top_k), Ie = m.moe.expert_ff;
    add("router logits", "2sbE", mul(sb, m.moe.experts, 2));
    add("expert inputs (per routed token)", "2ksbh", mul(routed, h, 2));
    add("expert gate, up, activation and product (per routed token)", "4 × 2ksb·I_e", mul(routed, Ie, 2, 4));
    add("expert outputs (per routed token, for the weighting)", "2ksbh", mul(routed, h, 2));
    if (m.moe.shared_ff) add("shared expert gate, up, activation and product", "4 × 2sb·I_s", mul(sb, m.moe.shared_ff, 2, 4));
  } else if (m.mlp == MlpKind::plain_gelu) {
    add("GeLU input (fc1 output)", "2sbI", mul(sb, I, 2));
    add("fc2 input (GeLU output)", "2sbI", mul(sb, I, 2));
  } else {
    add("gate projection output", "2sbI", mul(sb, I, 2));
    add("up projection output", "2sbI", mul(sb, I, 2));
    add("activation output", "2sbI", mul(sb, I, 2));
    add("down projection input (product)", "2sbI", mul(sb, I, 2));
  }
  add("MLP dropout mask", "sbh", mul(sb, h) / sp, "uint8");
  // Norm inputs: 2sbh each.
  add("norm inputs", "2sbh × norms", mul(sb, h, 2, m.norms_per_layer) / sp);
}

}  // namespace

namespace {
// Layers with a dense MLP and with a mixture of experts.
std::pair<bytes_t, bytes_t> layer_kinds(const ModelSpec& m) {
  const bytes_t moe = m.moe_layers();
  return {m.num_layers - moe, moe};
}
bytes_t layer_bytes(const ModelSpec& m, const Job& job, bool moe) {
  bytes_t per_layer = 0;
  korthikanti_layer(m, job, moe, [&](const char*, const char*, bytes_t bytes, const char* = nullptr) {
    per_layer = checked_add(per_layer, bytes, "korthikanti per-layer total");
  });
  return per_layer;
}
}  // namespace

// The breakdown lists one layer's tensors: an MoE layer's where the model has any (per_layer is
// then the mean over the layers, dense ones included).
ActivationsBreakdown korthikanti(const ModelSpec& m, const Job& job) {
  ActivationsBreakdown out;
  out.layers = m.num_layers;
  const auto [dense, moe] = layer_kinds(m);
  korthikanti_layer(m, job, moe > 0, [&](const char* name, const char* shape, bytes_t bytes, const char* dtype = "16-bit") {
    out.layer_tensors.push_back({name, "Korthikanti §4.1", dtype, shape, 1, bytes, Term::activations});
  });
  const bytes_t total = korthikanti_total(m, job);
  out.per_layer = m.num_layers ? total / m.num_layers : 0;
  out.other = total - out.per_layer * m.num_layers;  // what the mean leaves over
  return out;
}

bytes_t korthikanti_total(const ModelSpec& m, const Job& job) {
  const auto [dense, moe] = layer_kinds(m);
  return checked_add(checked_mul(layer_bytes(m, job, false), dense, "korthikanti activations"),
                     checked_mul(layer_bytes(m, job, true), moe, "korthikanti activations"), "korthikanti activations");
}

}  // namespace membudget::detail
