// Serving budget (mode infer): a Hugging Face transformers 5.x prefill and one decode step.
//
// The walk below follows what LlamaForCausalLM (and its Qwen2 / Mistral / Gemma relatives) executes
// under torch.inference_mode() for
//     out  = model(input_ids, use_cache=True, logits_to_keep=1)                      # prefill
//     out2 = model(next_ids, past_key_values=out.past_key_values, use_cache=True,
//                  logits_to_keep=1)                                                # one decode step
// (tools/torch_profile_prefill.py measures exactly that). The simulation runs with GradMode::off:
// nothing is saved for backward, so a tensor lives while a Python reference holds it; the allocator
// counts each tensor rounded up to 512 B. The transformers ops (RMSNorm, nn.Linear, rotary, the MLP,
// the residual add) are torch_ops.hpp's, the same definitions the training inventory runs; what is
// here is serving's own: weights in their served dtype without autocast, the DynamicCache update
// (with its copies and the sliding window), MLA's latent cache, logits_to_keep=1, the decode step.
// Phases: floor (weights and the prompt ids), prefill_peak, decode_peak (with the prefill's output,
// i.e. its cache and logits, still held, as generate() does).
#include <algorithm>

#include "predictors.hpp"
#include "autograd_sim.hpp"
#include "korthikanti.hpp"
#include "membudget/serving.hpp"
#include "serve_plan.hpp"
#include "torch_ops.hpp"
#include "weight_storage.hpp"

namespace membudget::detail {
namespace {

bytes_t mul(bytes_t a, bytes_t b, bytes_t c = 1, bytes_t d = 1) { return checked_product("serving tensor size", a, b, c, d); }

// Framework behaviours the walk depends on (transformers 5.x, PyTorch 2.11, sdpa on an H200).
struct Mechanisms {
  // DynamicLayer.update: the first update concatenates onto an empty tensor (a copy) rather than
  // keeping the given key/value states.
  bool cache_copy_on_first_update = true;
  // Flash SDPA returns its output in (b, s, heads, head_dim) memory order, so
  // attn_output.transpose(1, 2).contiguous() is free.
  bool sdpa_output_copy = false;
};

struct Walk {
  const ModelSpec& m;
  const Job& job;
  AutogradSim& sim;
  Mechanisms mech;
  bytes_t b = 0, s = 0, T = 0;        // batch, tokens per sequence in this forward, b·s
  bytes_t h = 0, V = 0, hd = 0;
  bytes_t qd = 0, kvd = 0, vd = 0;    // query, key and value widths (MLA: latent widths)
  bytes_t e = 2;                      // activation element bytes (bf16 / fp16)
  bytes_t kv_e = 2;                   // KV cache element bytes

  TensorId act(const char* name, bytes_t bytes, const char* op, const char* dtype, const char* shape,
               Term term = Term::activations) {
    return sim.make(name, bytes, term, op, dtype, shape, false);
  }

  TensorId cos = kNone, sin = kNone;  // LlamaRotaryEmbedding's output for this forward

  // The shared ops over this forward's tokens; the norm weights are 16-bit like the activations.
  TorchOps ops() { return {sim, m, T, e}; }
  TensorId rmsnorm(TensorId x, const char* tag, bytes_t width, bytes_t groups = 1) {
    return ops().rmsnorm(x, kNone, tag, width, groups);
  }
  TensorId linear(TensorId x, bytes_t out, const char* name) {
    return ops().linear(x, kNone, kNone, out, e, name, "bf16", "T·out");
  }

  // Tokens a layer keeps for a sequence of `ctx` tokens.
  bytes_t held(std::size_t layer, bytes_t ctx) const {
    return m.sliding_layer(layer) ? std::min<bytes_t>(ctx, m.sliding.window) : ctx;
  }

  // One decoder layer. `cache` holds this layer's [k, v] (in/out); `past` is the cached length.
  TensorId layer(std::size_t i, TensorId x, std::vector<TensorId>& cache, bytes_t past) {
    const bytes_t rows = T;
    TensorId n1 = rmsnorm(x, "input_layernorm output", h);
    TensorId q = linear(n1, qd, "q_proj output");
    TensorId k = linear(n1, kvd, "k_proj output");
    TensorId v = linear(n1, vd, "v_proj output");
    if (m.qk_norm) {
      TensorId qn = rmsnorm(q, "q_norm output", qd, m.num_heads);
      sim.drop(q);
      q = qn;
      TensorId kn = rmsnorm(k, "k_norm output", kvd, m.num_kv_heads);
      sim.drop(k);
      k = kn;
    }
    TensorId qe = ops().rotary(q, cos, sin, qd, e, e, "query after rotary");
    TensorId ke = ops().rotary(k, cos, sin, m.mla.enabled() ? m.mla.qk_rope_head_dim : kvd, e, e, "key after rotary");
    sim.drop(q);  // query_states, key_states = apply_rotary_pos_emb(...)
    sim.drop(k);
    // past_key_values.update(key_states, value_states, layer_idx)
    const bytes_t kv_row_k = m.mla.enabled() ? m.mla.kv_lora_rank + m.mla.qk_rope_head_dim : kvd;
    const bytes_t kv_row_v = m.mla.enabled() ? 0 : kvd;
    if (cache.empty()) {
      const bytes_t keep = held(i, s);
      if (mech.cache_copy_on_first_update || keep < s) {
        cache.push_back(act("KV cache (keys)", mul(b, keep, kv_row_k, kv_e), "torch.cat", "bf16", "b·kv·s·hd", Term::kv_cache));
        if (kv_row_v)
          cache.push_back(act("KV cache (values)", mul(b, keep, kv_row_v, kv_e), "torch.cat", "bf16", "b·kv·s·hd", Term::kv_cache));
        sim.drop(ke);
        sim.drop(v);
      } else {
        cache.push_back(ke);
        cache.push_back(v);
      }
    } else {
      // decode: torch.cat([old, new]) per tensor; the old one dies when the layer attribute is replaced
      for (std::size_t c = 0; c < cache.size(); ++c) {
        const bytes_t row = c == 0 ? kv_row_k : kv_row_v;
        TensorId grown = act(c == 0 ? "KV cache (keys)" : "KV cache (values)", mul(b, held(i, past + s), row, kv_e),
                             "torch.cat", "bf16", "b·kv·(S+1)·hd", Term::kv_cache);
        sim.drop(cache[c]);
        cache[c] = grown;
      }
      sim.drop(ke);
      sim.drop(v);
    }
    // scaled_dot_product_attention (flash, enable_gqa): output and the fp32 log-sum-exp
    const bytes_t attn_w = m.mla.enabled() ? m.num_heads * m.mla.v_head_dim : qd;
    TensorId lse = act("sdpa log-sum-exp", mul(b, m.num_heads, s, 4), "flash attention", "fp32", "b·a·s");
    TensorId ao = act("sdpa output", mul(rows, attn_w, e), "sdpa", "bf16", "b·s·a·hd");
    sim.drop(lse);
    if (mech.sdpa_output_copy) {
      TensorId c = act("sdpa output (contiguous)", mul(rows, attn_w, e), "contiguous", "bf16", "b·s·a·hd");
      sim.drop(ao);
      ao = c;
    }
    TensorId o = linear(ao, h, "o_proj output");
    sim.drop(ao);
    sim.drop(qe);  // attention forward returns
    sim.drop(n1);  // hidden_states, _ = self.self_attn(...)
    TensorId h1 = ops().close_block(x, o, kNone, "post_attention_layernorm output", e, "bf16",
                                    "residual stream (after attention)");
    TensorId n2 = rmsnorm(h1, "post_attention_layernorm output", h);
    auto served_linear = [&](TensorId in_x, bytes_t in, bytes_t out, Module mod, const char* name, const char*) {
      if (mod == Module::router && m.moe.router != MixtureOfExperts::Router::softmax_top_k)
        return ops().fp32_gate(in_x, kNone, e, in, out, name);  // DeepSeek's gate
      return linear(in_x, out, name);
    };
    // a mixture-of-experts layer: the same block as training (TorchOps::moe), nothing saved; the
    // experts' grouped_mm runs in the served 16-bit dtype
    auto served_expert_linear = [&](TensorId in_x, TensorId, bytes_t rows, bytes_t, bytes_t out, const char* name) {
      TorchOps op = ops();
      op.T = rows;
      return op.linear(in_x, kNone, kNone, out, e, name, "bf16", "n·out");
    };
    TensorId d = m.moe_layer(i) ? ops().moe(n2, kNone, kNone, e, e, "bf16", MoeRun{job.experts, job.routing, nullptr},
                                            served_linear, served_expert_linear)
                                : ops().mlp(n2, e, "bf16", served_linear);
    sim.drop(n2);  // hidden_states = self.mlp(hidden_states)
    TensorId h2 = ops().close_block(h1, d, kNone, "post_feedforward_layernorm output", e, "bf16",
                                    "residual stream (layer output)");
    sim.drop(h1);
    return h2;
  }

  // One forward over `s` new tokens per sequence after `past` cached ones. Returns the logits.
  TensorId forward(std::vector<std::vector<TensorId>>& cache, bytes_t past) {
    // cache_position = arange(past, past + s); position_ids = cache_position.unsqueeze(0)
    TensorId pos = act("cache_position", mul(s, 8), "arange", "int64", "s", Term::other);
    // inputs_embeds = embed_tokens(input_ids): held by LlamaModel.forward until it returns
    TensorId emb = act("embedding output (inputs_embeds)", mul(T, h, e), "embedding", "bf16", "b·s·h");
    // LlamaRotaryEmbedding: fp32 freqs for position_ids (batch 1), cos and sin cast to bf16
    const bytes_t rot = m.mla.enabled() ? m.mla.qk_rope_head_dim : hd;
    TensorId pf = act("rotary positions fp32", mul(s, 4), "float", "fp32", "1·s", Term::other);
    TensorId fr = act("rotary freqs", mul(s, rot / 2, 4), "matmul", "fp32", "1·s·hd/2", Term::other);
    TensorId em = act("rotary emb", mul(s, rot, 4), "cat", "fp32", "1·s·hd", Term::other);
    sim.drop(fr);
    TensorId c1 = act("rotary cos fp32", mul(s, rot, 4), "cos", "fp32", "1·s·hd", Term::other);
    TensorId c2 = act("rotary cos × scaling", mul(s, rot, 4), "mul", "fp32", "1·s·hd", Term::other);
    sim.drop(c1);
    TensorId s1 = act("rotary sin fp32", mul(s, rot, 4), "sin", "fp32", "1·s·hd", Term::other);
    TensorId s2 = act("rotary sin × scaling", mul(s, rot, 4), "mul", "fp32", "1·s·hd", Term::other);
    sim.drop(s1);
    cos = act("rotary cos/sin", mul(s, rot, e), "to(dtype)", "bf16", "1·s·hd", Term::other);
    sin = act("rotary cos/sin", mul(s, rot, e), "to(dtype)", "bf16", "1·s·hd", Term::other);
    sim.drop(c2);
    sim.drop(s2);
    sim.drop(em);
    sim.drop(pf);
    TensorId x = emb;
    sim.hold(emb);
    if (m.quirks.embedding_scale) {  // hidden_states = inputs_embeds * normalizer
      sim.drop(emb);
      x = act("embedding × sqrt(h)", mul(T, h, e), "mul", "bf16", "b·s·h");
    }
    for (std::size_t i = 0; i < m.num_layers; ++i) {
      TensorId out = layer(i, x, cache[i], past);
      sim.drop(x);  // hidden_states = decoder_layer(hidden_states, ...)
      x = out;
    }
    TensorId hn = rmsnorm(x, "final norm output", h);
    sim.drop(x);
    // logits_to_keep=1: lm_head(hidden_states[:, -1:, :])
    TensorId last = act("last position (contiguous)", mul(b, h, e), "slice", "bf16", "b·1·h");
    TensorId logits = act("logits (last position)", mul(b, V, e), "lm_head", "bf16", "b·1·V", Term::logits_loss);
    sim.drop(last);
    if (m.final_logit_softcap > 0) {  // logits / cap; tanh; * cap
      sim.transient("logit softcap temporaries", mul(b, V, e, 2), Term::logits_loss);
    }
    sim.drop(hn);
    sim.drop(emb);
    sim.drop(cos);
    sim.drop(sin);
    sim.drop(pos);
    return logits;
  }
};

// Parameter tensors in their storage dtype (weight_storage.hpp), one allocation each, then the
// rotary buffers.
void load_weights(AutogradSim& sim, const ModelSpec& m, const Job& job) {
  auto load = [&](const ParamTensor& t, bool in_layer) {
    for (const auto& piece : stored_tensor(t, in_layer, job.weights, job.group_size))
      if (piece.bytes) sim.param("weights", piece.bytes, Term::model_states, piece.dtype, false);
  };
  for (const ParamTensor& t : m.outer_tensors()) load(t, false);
  for (std::uint64_t il = 0; il < m.num_layers; ++il)
    for (const ParamTensor& t : m.layer_tensors(il)) load(t, true);
  // LlamaRotaryEmbedding buffers: inv_freq and original_inv_freq (fp32)
  const bytes_t rot_half = m.mla.enabled() ? m.mla.qk_rope_head_dim / 2 : m.head_dim / 2;
  sim.param("weights", mul(rot_half, 4), Term::model_states, "fp32", false);
  sim.param("weights", mul(rot_half, 4), Term::model_states, "fp32", false);
}

// cuBLAS workspace: PyTorch allocates it through the caching allocator on the first matmul of a
// handle and keeps it (CUBLAS_WORKSPACE_CONFIG default ":4096:8" on Hopper and later: 32 MiB;
// tests/data/torch_prefill_h200.json shows it appear during the first prefill of the process).
constexpr bytes_t kCublasWorkspace = 32 * MiB;

}  // namespace

ServeStepResult simulate_serving(const ModelSpec& m, const Job& job, bool explain, SimTrace* trace) {
  check_simulated(m, job);
  ServeStepResult res;
  AutogradSim sim(explain, GradMode::off);  // torch.inference_mode()
  if (trace) sim.record_to(trace);
  load_weights(sim, m, job);
  res.weights = sim.live();
  Walk w{m, job, sim, {}};
  w.b = job.batch;
  w.s = job.seq;
  w.T = mul(job.batch, job.seq);
  w.h = m.hidden_size;
  w.V = m.vocab_size;
  w.hd = m.head_dim;
  if (m.mla.enabled()) {
    w.qd = m.num_heads * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim);
    w.kvd = m.mla.kv_lora_rank + m.mla.qk_rope_head_dim;  // kv_a_proj_with_mqa output
    w.vd = 0;
  } else {
    w.qd = m.q_dim();
    w.kvd = m.kv_dim();
    w.vd = m.kv_dim();
  }
  w.kv_e = kv_dtype_bytes(job.kv_dtype);

  sim.make("cuBLAS workspace", kCublasWorkspace, Term::other, Role::workspace, "first matmul", "", "32 MiB", false);
  sim.make("input_ids", mul(w.T, 8), Term::other, Role::input, "prompt", "int64", "b·s", false);
  res.floor = sim.live();
  sim.begin_phase(Phase::prefill_peak);
  std::vector<std::vector<TensorId>> cache(m.num_layers);
  w.forward(cache, 0);
  // decode: next token ids from the last logits; the prefill output (cache, logits) stays held
  sim.make("next token ids", mul(w.b, 8), Term::other, Role::input, "argmax", "int64", "b·1", false);
  sim.begin_phase(Phase::decode_peak);
  const bytes_t prompt = w.s;
  w.s = 1;
  w.T = w.b;
  w.forward(cache, prompt);
  res.phases = sim.take_phases();
  sim.finish_trace();
  return res;
}

void predict_infer(Budget& bud, const PredictOptions& options) {
  const ModelSpec& m = bud.model;
  const Job& job = bud.job;
  ServeStepResult r;
  const ServePlan* plan = options.explain || options.full_simulation ? nullptr : ServePlan::cached(m, job);
  if (plan) {
    const auto p = plan->evaluate(job.batch, job.seq);
    r.weights = plan->weights;
    r.floor = p[0];
    r.phases.push_back({Phase::prefill_peak, p[1], {}});
    r.phases.push_back({Phase::decode_peak, p[2], {}});
  } else {
    r = simulate_serving(m, job, options.explain);
  }
  bud.states.weights = r.weights;
  bud.terms.kv_cache = kv_cache_bytes(m, job.kv_dtype, job.batch, job.seq);
  bud.logits.logits = mul(job.batch, m.vocab_size, 2);
  bud.activations.layers = 0;
  PhasePeak fl;
  fl.phase = Phase::floor;
  fl.bytes = r.floor;
  bud.phases.clear();
  bud.phases.push_back(fl);
  for (auto& p : r.phases) bud.phases.push_back(std::move(p));
  // activations: the prefill peak beyond weights, ids and the full KV cache
  bud.activations.other = serving_activations(bud.phase(Phase::prefill_peak), r.floor, bud.terms.kv_cache);
}

}  // namespace membudget::detail
