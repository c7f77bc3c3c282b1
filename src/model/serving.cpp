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

  // Tokens of a sequence of `ctx` tokens a layer's cache tensor holds storage for after a later
  // forward: a sliding layer's torch.cat of its window - 1 kept tokens and the new one.
  bytes_t held(std::size_t layer, bytes_t ctx) const {
    return m.sliding_layer(layer) ? std::min<bytes_t>(ctx, m.sliding.window) : ctx;
  }

  // past_key_values.update(keys, values, layer_idx): DynamicLayer.update concatenates the first
  // states onto empty tensors (copies), and each later forward's with torch.cat([old, new]) per
  // tensor, the old one dying when the layer attribute is replaced. The new states go: the
  // attention's locals are rebound to the cache's tensors. `row_k`, `row_v`: values per token.
  // A sliding layer (DynamicSlidingWindowLayer.update) cats the same way and keeps the slice
  // [-(window - 1):] of the result, a view: the prompt's whole cat stays allocated until the next
  // update replaces it (Phi-3 mini's prefills, tests/data/torch_prefill_phi3_h200.json: after a
  // prompt of 4 x 4,096 tokens 6.44 GB stay beyond the weights, every token's keys and values,
  // where the kept window's are 3.22 GB; after one decode step the window's).
  void cache_update(std::size_t i, std::vector<TensorId>& cache, bytes_t past, TensorId kn, TensorId vn, bytes_t row_k,
                    bytes_t row_v, const char* key_name, const char* value_name) {
    if (cache.empty()) {
      if (mech.cache_copy_on_first_update) {
        cache.push_back(act(key_name, mul(b, s, row_k, kv_e), "torch.cat", "bf16", "b·kv·s·hd", Term::kv_cache));
        cache.push_back(act(value_name, mul(b, s, row_v, kv_e), "torch.cat", "bf16", "b·kv·s·hd", Term::kv_cache));
        sim.drop(kn);
        sim.drop(vn);
      } else {
        cache.push_back(kn);
        cache.push_back(vn);
      }
      return;
    }
    for (std::size_t c = 0; c < cache.size(); ++c) {
      TensorId grown = act(c == 0 ? key_name : value_name, mul(b, held(i, past + s), c == 0 ? row_k : row_v, kv_e),
                           "torch.cat", "bf16", "b·kv·(S+1)·hd", Term::kv_cache);
      sim.drop(cache[c]);
      cache[c] = grown;
    }
    sim.drop(kn);
    sim.drop(vn);
  }

  // The attention of a Llama-style layer on `n1` (input_layernorm's output): q/k/v, Qwen3's and
  // OLMoE's q/k norms, rotary, the DynamicCache, flash SDPA and o_proj. Returns o_proj's output.
  TensorId attention(std::size_t i, TensorId n1, std::vector<TensorId>& cache, bytes_t past) {
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
    TensorId ke = ops().rotary(k, cos, sin, kvd, e, e, "key after rotary");
    sim.drop(q);  // query_states, key_states = apply_rotary_pos_emb(...)
    sim.drop(k);
    cache_update(i, cache, past, ke, v, kvd, kvd, "KV cache (keys)", "KV cache (values)");
    // A sliding layer past its window gets the mask (masked()): sdpa_attention_forward then
    // repeats the keys and values over every head rather than passing enable_gqa, and SDPA turns
    // the bool mask into an additive bias in the query's dtype before the memory-efficient kernel
    // runs (as in training: inventory_torch.cpp, memory_efficient_sdpa); both go as the attention
    // returns, the bias first. The keys are the update's whole result: the cache's tensor.
    const bool mask = masked(i, past);
    const bytes_t S = past == 0 ? s : held(i, past + s);  // the keys attended: the update's result
    TensorId rk = kNone, rv = kNone, bias = kNone;
    if (mask && m.num_heads != m.num_kv_heads) {
      rk = act("repeat_kv keys (mask given: no enable_gqa)", mul(b, S, qd, e), "repeat_kv", "bf16", "b·a·S·hd");
      rv = act("repeat_kv values (mask given: no enable_gqa)", mul(b, S, qd, e), "repeat_kv", "bf16", "b·a·S·hd");
    }
    if (mask) bias = act("sdpa attn_bias: additive mask", mul(b, s, S, e), "convert_boolean_attn_mask", "bf16", "b·1·s·S");
    // scaled_dot_product_attention (flash, enable_gqa): output and the fp32 log-sum-exp
    TensorId lse = act("sdpa log-sum-exp", mul(b, m.num_heads, s, 4), "flash attention", "fp32", "b·a·s");
    TensorId ao = act("sdpa output", mul(T, qd, e), "sdpa", "bf16", "b·s·a·hd");
    sim.drop(lse);
    sim.drop(bias);
    sim.drop(rk);
    sim.drop(rv);
    if (mech.sdpa_output_copy) {
      TensorId c = act("sdpa output (contiguous)", mul(T, qd, e), "contiguous", "bf16", "b·s·a·hd");
      sim.drop(ao);
      ao = c;
    }
    TensorId o = linear(ao, h, "o_proj output");
    sim.drop(ao);
    sim.drop(qe);  // attention forward returns
    return o;
  }

  // DeepSeek-V2's apply_rotary_emb on `x` (`width` values per token): x.float().reshape(..., -1, 2)
  // is an fp32 copy (view_as_complex views it) that lives until the function returns; the product
  // with freqs_cis is a complex64 tensor of the same bytes, and view_as_real(...).flatten(3)
  // .type_as(x) its 16-bit copy. Returns the copy and the fp32 input, which the caller drops.
  std::pair<TensorId, TensorId> complex_rotary(bytes_t width, const char* tag) {
    TensorId x32 = act("rotary: x.float() (copy)", mul(T, width, 4), "float + reshape", "fp32", "b·a·s·rope");
    TensorId c = act("rotary: x * freqs_cis (complex64)", mul(T, width, 4), "mul", "complex64", "b·a·s·rope/2");
    TensorId out = act(tag, mul(T, width, e), "type_as", "bf16", "b·a·s·rope");
    sim.drop(c);
    return {out, x32};
  }

  // DeepSeek-V3's rotary on `width` values per token: apply_rotary_pos_emb_interleave (rope_interleave,
  // its default) forms q1·cos − q2·sin and q2·cos + q1·sin from even and odd halves (four
  // half-width products, their difference and sum) and cats them; without it, rotate_half's form.
  TensorId rotary_v3(TensorId x, bytes_t width, const char* tag) {
    if (!m.quirks.interleaved_rotary) return ops().rotary(x, cos, sin, width, e, e, tag);
    auto combine = [&](const char* op) {
      TensorId a1 = act("rotary: half-width product", mul(T, width / 2, e), "mul", "bf16", "b·a·s·rope/2");
      TensorId a2 = act("rotary: half-width product", mul(T, width / 2, e), "mul", "bf16", "b·a·s·rope/2");
      TensorId c = act("rotary: half-width sum", mul(T, width / 2, e), op, "bf16", "b·a·s·rope/2");
      sim.drop(a1);
      sim.drop(a2);
      return c;
    };
    TensorId r1 = combine("sub"), r2 = combine("add");
    TensorId out = act(tag, mul(T, width, e), "cat", "bf16", "b·a·s·rope");
    sim.drop(r1);
    sim.drop(r2);
    return out;
  }

  // DeepseekV2Attention / DeepseekV3Attention.forward (transformers 5.17) on `n1`. The DynamicCache
  // holds the compressed latent, not the heads' keys and values: its "keys" are the normalised
  // latent (b, 1, S, kv_lora_rank), its "values" the rotary key (b, 1, S, qk_rope_head_dim)
  // (tests/data/torch_prefill_moe_h200.json, cache.first_tensors), and every forward re-expands
  // all S cached tokens of the layer:
  //     q = q_proj(x) (or q_b_proj(q_a_layernorm(q_a_proj(x)))); q_pass, q_rot = split(q)  # views: q lives
  //     compressed_kv = kv_a_proj_with_mqa(x); kv_pass, k_rot = split(compressed_kv)        # views: it lives
  //     k_pass = kv_a_layernorm(kv_pass)          # the norm of a strided view: fp32 copies
  //     q_rot, k_rot = apply_rotary_emb(q_rot, k_rot, freqs_cis)    # V3: the interleaved form
  //     k_pass, k_rot = past_key_values.update(k_pass, k_rot, layer_idx)   # now the whole cache
  //     query_states = torch.cat((q_pass, q_rot), dim=-1)
  //     key_states, value_states = self.expand_kv(k_pass, k_rot):
  //         kv = kv_b_proj(k_pass).view(b, S, a, nope + v).transpose(1, 2)      # over all S tokens
  //         k_nope, value_states = torch.split(kv, [nope, v], dim=-1)            # views of kv
  //         key_states = kv.new_empty(b, a, S, nope + rope)
  //         key_states[..., :nope].copy_(k_nope); key_states[..., nope:].copy_(k_rot.expand(...))
  //     attn = sdpa(query_states, key_states, value_states); o_proj(attn.reshape(b, s, -1))
  // kv and key_states live until the attention returns: in a decode step, where every other
  // tensor is one token wide, these b·S·a·(2·nope + v + rope) values of one layer are the step's
  // peak, beside the latent cache of all layers (b·S·(r + rope) each).
  TensorId mla_attention(std::size_t i, TensorId n1, std::vector<TensorId>& cache, bytes_t past) {
    const LatentAttention& la = m.mla;
    const bytes_t a = m.num_heads, nope = la.qk_nope_head_dim, rope = la.qk_rope_head_dim, vh = la.v_head_dim,
                  r = la.kv_lora_rank, qk = nope + rope;
    // q_proj's output, or with q_lora_rank (V3) q_b_proj's: q_a_proj and q_a_layernorm before it
    // (T·q_lora_rank wide, gone before the cache is read) are not walked.
    TensorId q = linear(n1, mul(a, qk), la.q_lora_rank ? "q_b_proj output" : "q_proj output");
    TensorId ckv = linear(n1, r + rope, "kv_a_proj_with_mqa output");
    TensorId k_pass = ops().rmsnorm(ckv, kNone, "kv_a_layernorm output", r, 1, e);
    TensorId q_rot = kNone, k_rot = kNone;
    if (m.quirks.complex_rotary) {
      auto [qr, xq] = complex_rotary(mul(a, rope), "q_rot after rotary");
      auto [kr, xk] = complex_rotary(rope, "k_rot after rotary");
      sim.drop(xq);  // apply_rotary_emb returns
      sim.drop(xk);
      q_rot = qr;
      k_rot = kr;
    } else {
      q_rot = rotary_v3(q, mul(a, rope), "q_rot after rotary");
      k_rot = rotary_v3(ckv, rope, "k_rot after rotary");
    }
    cache_update(i, cache, past, k_pass, k_rot, r, rope, "KV cache (latent)", "KV cache (rotary key)");
    TensorId qs = act("query_states: cat(q_pass, q_rot)", mul(T, a, qk, e), "cat", "bf16", "b·a·s·qk");
    // expand_kv over the S tokens the layer now caches
    const bytes_t S = mul(b, held(i, past + s));
    TensorId kv = act("kv_b_proj output over the cache (k_nope, value_states views)", mul(S, a, nope + vh, e),
                      "kv_b_proj", "bf16", "b·S·a·(nope+v)");
    TensorId key = act("key_states (new_empty, two copy_)", mul(S, a, qk, e), "new_empty + copy_", "bf16", "b·a·S·qk");
    // sdpa: flash needs one head width for q, k and v (192, 192, 128 on DeepSeek), so it does not run.
    // What the kernel allocates is read off the training snapshot
    // (deepseek-v2-lite_L2_bf16_none_flash_adamw_b1s1024_snapshot-forward, events 75-82): its
    // bf16 output in q's (b, a, s, v) layout and no fp32 accumulator; the fp32 log-sum-exp it keeps
    // there is for backward, not computed without grad (should_compute_logsumexp). For one new
    // token per sequence, sdpa_attention_forward's attn_output.transpose(1, 2).contiguous() is
    // already contiguous. (Over a prompt of s > 1 tokens it copies the output, as the snapshot's
    // event 82 shows; the walk leaves that copy out: the compiled plan's probes start at s = 1,
    // where there is none, and on the measured prefills the peak is in the MLP.)
    TensorId ao = act("sdpa output", mul(T, a, vh, e), "sdpa", "bf16", "b·a·s·v");
    TensorId o = linear(ao, h, "o_proj output");
    sim.drop(ao);
    for (TensorId t : {q, ckv, q_rot, qs, kv, key}) sim.drop(t);  // attention forward returns
    return o;
  }

  // Whether layer i's attention gets the sliding window's mask in a forward over `s` new tokens
  // after `past` cached ones: create_sliding_window_causal_mask skips it for SDPA while the keys
  // it would cover, DynamicSlidingWindowLayer.get_mask_sizes' kv_length (the cached tokens, at
  // most window - 1, plus the new ones), are fewer than the window.
  bool masked(std::size_t i, bytes_t past) const {
    return m.sliding_layer(i) && std::min<bytes_t>(past, m.sliding.window - 1) + s >= m.sliding.window;
  }

  // One decoder layer. `cache` holds this layer's [k, v] (MLA: [latent, rotary key]) (in/out);
  // `past` is the cached length.
  TensorId layer(std::size_t i, TensorId x, std::vector<TensorId>& cache, bytes_t past) {
    TensorId n1 = rmsnorm(x, "input_layernorm output", h);
    TensorId o = m.mla.enabled() ? mla_attention(i, n1, cache, past) : attention(i, n1, cache, past);
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
    if (m.quirks.embedding_scale) {  // Gemma's embedding module scales its lookup and returns the product
      TensorId scaled = act("embedding × sqrt(h)", mul(T, h, e), "mul", "bf16", "b·s·h");
      sim.drop(emb);
      emb = scaled;
    }
    // LlamaRotaryEmbedding: fp32 freqs for position_ids (batch 1), cos and sin cast to bf16
    const bytes_t rot = m.mla.enabled() ? m.mla.qk_rope_head_dim : hd;
    // The sliding window's bool mask, made before the rotary embeddings and held by the model's
    // forward until it returns, for a prompt that reaches the window, and for every prompt where
    // the model makes it for no layer (ArchQuirks::unused_sliding_mask; training's walk makes the
    // same ones: TorchOps::bool_causal_mask); a decode step's mask is one row
    // (b·1·1·window bools), not walked.
    TensorId mask = kNone;
    if (past == 0 && ((m.sliding.enabled() && s >= m.sliding.window) || m.quirks.unused_sliding_mask))
      mask = ops().bool_causal_mask(s, true);
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
    sim.drop(mask);
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
