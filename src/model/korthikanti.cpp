// The textbook activation model: Korthikanti et al. 2022, "Reducing Activation Recomputation in
// Large Transformer Models" (arXiv 2205.05198), §4 and Table 2, per layer, 16-bit activations,
// 1-byte dropout masks. Tensor parallelism (Table 2, sbh(10 + 24/t + 5as/(ht))) is the same
// formula over one rank's local spec (tp_local_spec: heads, KV heads and I divided by t; the norm
// inputs, the LayerNorm outputs and the dropout masks stay whole); sequence parallelism is not
// modelled.
#include "korthikanti.hpp"

namespace membudget::detail {
namespace {
bytes_t mul(bytes_t a, bytes_t b, bytes_t c = 1, bytes_t d = 1) {
  return checked_product("korthikanti activation size", a, b, c, d);
}

// Calls add(name, shape, bytes, dtype) for each tensor one layer keeps.
template <class Add>
void korthikanti_layer(const ModelSpec& m, const Job& job, Add&& add) {
  const bytes_t s = job.seq, b = job.batch, h = m.hidden_size, I = m.intermediate_size, a = m.num_heads;
  const bytes_t sb = mul(s, b);
  const bytes_t qd = m.q_dim(), kvd = m.kv_dim();
  if (job.recompute == Recompute::full) {
    // Full recompute keeps only each layer's input ("2sbh" in 16-bit; 4sbh when the residual
    // stream is fp32, as under amp-bf16 and fp32 recipes).
    const bytes_t resid = job.precision == Precision::bf16 || job.precision == Precision::bf16_master ? 2 : 4;
    add("layer input (full recompute)", "s·b·h", mul(sb, h, resid), resid == 2 ? "16-bit" : "fp32");
    return;
  }
  // Attention block: 11sbh + 5as²b, with K and V at kv width under GQA.
  add("QKV input (LayerNorm output)", "2sbh", mul(sb, h, 2));
  add("Q for QKᵀ", "2sb·q", mul(sb, qd, 2));
  add("K for QKᵀ", "2sb·kv", mul(sb, kvd, 2));
  add("V", "2sb·kv", mul(sb, kvd, 2));
  add("output-projection input", "2sb·q", mul(sb, qd, 2));
  add("attention dropout mask", "sbh", mul(sb, h), "uint8");
  const bool fused = job.attention == Attention::flash;
  if (!fused && job.recompute != Recompute::selective) {
    add("softmax output", "2as²b", mul(a, s, s, b) * 2);
    add("softmax dropout mask", "as²b", mul(a, s, s, b), "uint8");
    add("dropout output", "2as²b", mul(a, s, s, b) * 2);
  } else if (fused) {
    add("softmax log-sum-exp (fused attention)", "4asb", mul(a, sb, 4), "fp32");
  }
  // MLP: 19sbh for the 4h GeLU MLP; a gated MLP keeps gate, up, activation and product at width I.
  add("MLP input (LayerNorm output)", "2sbh", mul(sb, h, 2));
  if (m.mlp == MlpKind::plain_gelu) {
    add("GeLU input (fc1 output)", "2sbI", mul(sb, I, 2));
    add("fc2 input (GeLU output)", "2sbI", mul(sb, I, 2));
  } else {
    add("gate projection output", "2sbI", mul(sb, I, 2));
    add("up projection output", "2sbI", mul(sb, I, 2));
    add("activation output", "2sbI", mul(sb, I, 2));
    add("down projection input (product)", "2sbI", mul(sb, I, 2));
  }
  add("MLP dropout mask", "sbh", mul(sb, h), "uint8");
  // Norm inputs: 2sbh each.
  add("norm inputs", "2sbh × norms", mul(sb, h, 2, m.norms_per_layer));
}

}  // namespace

ActivationsBreakdown korthikanti(const ModelSpec& m, const Job& job) {
  ActivationsBreakdown out;
  out.layers = m.num_layers;
  korthikanti_layer(m, job, [&](const char* name, const char* shape, bytes_t bytes, const char* dtype = "16-bit") {
    out.layer_tensors.push_back({name, "Korthikanti §4.1", dtype, shape, 1, bytes, Term::activations});
    out.per_layer = checked_add(out.per_layer, bytes, "korthikanti per-layer total");
  });
  return out;
}

bytes_t korthikanti_total(const ModelSpec& m, const Job& job) {
  bytes_t per_layer = 0;
  korthikanti_layer(m, job, [&](const char*, const char*, bytes_t bytes, const char* = nullptr) {
    per_layer = checked_add(per_layer, bytes, "korthikanti per-layer total");
  });
  return checked_mul(per_layer, m.num_layers, "korthikanti activations");
}

}  // namespace membudget::detail
