// The inventory model of a Hugging Face transformers 5.x training step on PyTorch 2.11.
//
// This drives AutogradSim op by op through what LlamaForCausalLM (and its Mistral / Qwen2 / Qwen3 /
// Gemma / Phi-3 relatives) executes in eager mode, with the dtype of every tensor that the recipe
// implies, and the tensors each autograd node saves (tools/torch_saved_tensors.py lists them from a
// real run; tests/data/torch_saved_tensors_h200.json). Each op below says which framework behaviour
// it models. Phase names follow tools/torch_profile_step.py.
#include <algorithm>
#include <optional>
#include <string>

#include "autograd_sim.hpp"
#include "inventory.hpp"

namespace membudget::detail {
namespace {

constexpr bytes_t kCublasWorkspace = 32 * MiB;

struct Dims {
  bytes_t b, s, T, h, I, V, qd, kvd, a, kva, hd, L;
};

// The recipe (membudget::Recipe, job.hpp) as the walk uses it: element bytes and dtype names.
struct RecipeBytes {
  bytes_t param, compute, resid;
  bool autocast;
  const char *param_name, *compute_name, *resid_name;
  explicit RecipeBytes(const Recipe& r)
      : param(element_size(r.param)), compute(element_size(r.compute)), resid(element_size(r.residual)),
        autocast(r.autocast), param_name(to_string(r.param)), compute_name(to_string(r.compute)),
        resid_name(to_string(r.residual)) {}
};

bytes_t mul(bytes_t a, bytes_t b, bytes_t c = 1, bytes_t d = 1) {
  return checked_product("activation size", a, b, c, d);
}

// A LoRA adapter: A (r × in) and B (out × r), fp32 as peft keeps them.
struct Adapter {
  TensorId a = kNone, b = kNone;
};

// A decoder layer's parameters (kNone where the model has no such tensor). Fused projections
// (Phi-3) sit in q (qkv_proj) and gate (gate_up_proj).
struct LayerParams {
  TensorId norm1 = kNone, norm2 = kNone, norm3 = kNone, norm4 = kNone;  // attn, mlp, attn_out, mlp_out norms
  TensorId q = kNone, k = kNone, v = kNone, o = kNone, qb = kNone, kb = kNone, vb = kNone;
  TensorId gate = kNone, up = kNone, down = kNone, q_norm = kNone, k_norm = kNone;
  Adapter aq, ak, av, ao, agate, aup, adown;  // LoRA (job.lora_rank > 0)
};

struct Step {
  const ModelSpec& m;
  const Job& job;
  Dims d;
  RecipeBytes r;
  AutogradSim& sim;
  std::vector<LayerParams> layers;
  std::vector<TensorId> layer0_params{};  // decoder layer 0's parameters and adapters
  TensorId emb = kNone, final_norm = kNone, lm_head = kNone, input_ids = kNone, labels = kNone;
  TensorId cos = kNone, sin = kNone;
  // autocast's cache of bf16 weight copies: parameter → copy (valid while autocast is active)
  std::vector<std::pair<TensorId, TensorId>> cast_cache{};
  std::vector<TensorId> layer_inputs{};  // checkpoint keeps each layer's input
  std::vector<TensorId> kv_cache{};     // DynamicCache entries (use_cache=True while training)
  // transformers materialises a sliding-window mask for SDPA (see forward()); `mask` is its bool
  // b·1·s·s tensor while the model holds it. `layer_masked`: the layer being run is one of the
  // sliding layers (all of them, or Gemma 2's every other one) and gets the mask.
  bool masked = false;
  bool layer_masked = false;
  TensorId mask = kNone;

  void drop_kv_cache() {
    for (TensorId t : kv_cache) sim.drop(t);
    kv_cache.clear();
  }

  // Weight as used by a matmul: under autocast a bf16 copy, cached per forward (per recompute).
  // autocast caches only leaves that require grad (cached_cast in autocast_mode.cpp): a frozen
  // weight (LoRA's base) is cast again at every use, and its copy lives only as long as the matmul
  // keeps it (release_weight).
  TensorId weight(TensorId w) {
    if (!r.autocast) return w;
    for (auto& [p, c] : cast_cache)
      if (p == w) return c;
    const auto& wi = sim.info(w);
    const bool frozen = !wi.requires_grad;
    TensorId c = sim.make(frozen ? "autocast: bf16 copies of frozen weights (saved by their matmul)"
                                 : "autocast cache: bf16 weight copies",
                          wi.bytes / r.param * r.compute, Term::model_states, "autocast cast", "bf16", "weight", true);
    sim.node("ToCopyBackward (weight cast)", {w}, {c}, {});
    if (!frozen) cast_cache.push_back({w, c});  // the cache holds it (one holder)
    return c;
  }
  void release_weight(TensorId w, TensorId c) {
    if (r.autocast && w != kNone && !sim.info(w).requires_grad) sim.drop(c);
  }
  void clear_cast_cache() {
    for (auto& [p, c] : cast_cache) sim.drop(c);
    cast_cache.clear();
  }

  // Activation as used by a matmul: under autocast a fresh bf16 copy (non-leaf casts are not cached).
  TensorId cast_input(TensorId x, bytes_t elems, const char* name) {
    if (!r.autocast || sim.info(x).bytes == mul(elems, r.compute)) {
      sim.hold(x);
      return x;
    }
    TensorId c = sim.make(name, mul(elems, r.compute), Term::activations, "autocast cast (saved by linear)",
                          r.compute_name, "b·s·in", true);
    sim.node("ToCopyBackward", {x}, {c}, {});
    return c;
  }

  // y = x W^T (+ bias). Linear saves its input and weight (aten::linear → mm; addmm with a bias).
  // Both gradients come back as views (see AutogradSim::node): the weight's is
  // mm_mat2_backward's transpose (W^T is column-major) transposed again by TBackward0, the input's
  // is ViewBackward0's reshape of the 2-D mm over the flattened tokens (matmul's fold, or
  // _flatten_nd_linear with a bias). A second contribution to such a gradient is summed out of
  // place. Where it shows: with tied embeddings in bf16 or fp32, lm_head's weight gradient waits in
  // the embedding's input buffer through the whole backward, and EmbeddingBackward's V×h gradient
  // (embedding_dense_backward_cuda: at::zeros(V, h)) is added as old + new, so three V×h buffers
  // coexist at the end of backward. Under autocast the weight cast's ToCopyBackward hands the
  // buffer a fresh fp32 tensor, and the embedding's gradient is added to it in place.
  static constexpr std::uint8_t kLinearViewGrads = 0b011;
  // `out_b`: the output's element bytes when autocast is off (default: the compute dtype).
  // `ad`: the linear's LoRA adapter, if any. Linear saves the input for the weight's gradient and
  // the weight for the input's: with a frozen weight (LoRA's base) it keeps no input.
  TensorId linear(TensorId x, bytes_t in, bytes_t out, TensorId w, TensorId bias, const char* name,
                  const char* shape, const Adapter* ad = nullptr, bytes_t out_b = 0) {
    TensorId xin = cast_input(x, mul(d.T, in), "linear inputs (autocast bf16 copies)");
    TensorId wc = weight(w);
    TensorId bc = bias == kNone ? kNone : weight(bias);
    const bytes_t ob = r.autocast || out_b == 0 ? r.compute : out_b;
    TensorId y = sim.make(name, mul(d.T, out, ob), Term::activations, "linear output",
                          ob == 4 ? "fp32" : r.compute_name, shape, true);
    const bool wg = sim.info(wc).requires_grad, xg = sim.info(xin).requires_grad;
    sim.node("LinearBackward", {xin, wc, bc}, {y}, {wg ? xin : kNone, xg ? wc : kNone}, 0, kLinearViewGrads);
    sim.drop(xin);
    release_weight(w, wc);
    release_weight(bias, bc);
    if (ad && ad->a != kNone) y = lora(x, in, out, *ad, y);
    return y;
  }

  // peft's LoRA Linear.forward (peft 0.21, lora/layer.py): result = base_layer(x);
  // x = _cast_input_dtype(x, lora_A.weight.dtype) — a fp32 copy when x is 16-bit, which lora_A
  // saves; result = result + lora_B(lora_A(dropout(x))) * scaling (dropout 0: nn.Identity;
  // lora_B saves the rank-r intermediate; the scalar multiply saves nothing; the sum promotes to
  // fp32 when the base output is 16-bit and autocast is off); result.to(the base output's dtype).
  TensorId lora(TensorId x, bytes_t in, bytes_t out, const Adapter& ad, TensorId y) {
    const bytes_t rank = job.lora_rank;
    TensorId xl = x;
    if (sim.info(x).bytes != mul(d.T, in, 4)) {
      xl = sim.make("LoRA: adapter inputs cast to fp32 (saved by lora_A)", mul(d.T, in, 4), Term::activations,
                    "x.to(float32)", "fp32", "b·s·in", true);
      sim.node("ToCopyBackward", {x}, {xl}, {});
    } else {
      sim.hold(xl);
    }
    TensorId a = linear(xl, in, rank, ad.a, kNone, "LoRA: lora_A output (saved by lora_B)", "b·s·r", nullptr, 4);
    sim.drop(xl);
    TensorId bo = linear(a, rank, out, ad.b, kNone, "LoRA: lora_B output", "b·s·out", nullptr, 4);
    sim.drop(a);
    const bytes_t lb = sim.info(bo).bytes / mul(d.T, out);
    TensorId sc = sim.make("LoRA: lora_B output × scaling", mul(d.T, out, lb), Term::activations, "mul", "", "b·s·out", true);
    sim.node("MulBackward1", {bo}, {sc}, {});
    sim.drop(bo);
    const bytes_t yb = sim.info(y).bytes / mul(d.T, out);
    const bytes_t sb = std::max(yb, lb);
    TensorId sum = sim.make("LoRA: base + adapter", mul(d.T, out, sb), Term::activations, "add", "", "b·s·out", true);
    sim.node("AddBackward0", {y, sc}, {sum}, {});
    sim.drop(y);
    sim.drop(sc);
    if (sb == yb) return sum;
    TensorId back = sim.make("LoRA: result cast back to the base dtype", mul(d.T, out, yb), Term::activations,
                             "to(dtype)", r.compute_name, "b·s·out", true);
    sim.node("ToCopyBackward", {sum}, {back}, {});
    sim.drop(sum);
    return back;
  }

  // RMSNorm over `width` values per token (`rows` normalised groups per token: 1, or the heads of
  // Qwen3's q_norm / k_norm). The input dtype is read off the input tensor.
  //   LlamaRMSNorm: hs = x.to(fp32); var = hs.pow(2).mean(-1); hs = hs * rsqrt(var + eps);
  //     return w * hs.to(input_dtype)   — pow saves hs; mul saves hs and rsqrt; w* saves the cast;
  //     the output takes the promoted dtype of weight and input.
  //   GemmaRMSNorm: out = _norm(x.float()) * (1.0 + w.float()); return out.type_as(x)
  //     — the fp32 normalised tensor and (1 + w) are saved; the output has the input's dtype.
  TensorId rmsnorm(TensorId x, TensorId w, const char* tag, bytes_t width = 0, bytes_t rows = 1) {
    if (width == 0) width = d.h;
    const bytes_t Tw = mul(d.T, width);
    const bytes_t in_b = sim.info(x).bytes / Tw;  // element bytes of the input
    const bool gemma = m.quirks.norm_weight_offset;
    TensorId hs32 = x;
    if (in_b != 4) {
      hs32 = sim.make("rmsnorm fp32 input copy (saved by pow, mul)", mul(Tw, 4), Term::activations,
                      "x.to(float32)", "fp32", "b·s·h", true);
      sim.node("ToCopyBackward", {x}, {hs32}, {});
    } else {
      sim.hold(hs32);
    }
    TensorId sq = sim.make("rmsnorm pow output", mul(Tw, 4), Term::activations, "pow", "fp32", "b·s·h", true);
    sim.node("PowBackward0", {hs32}, {sq}, {hs32}, mul(Tw, 4));
    TensorId var = sim.make("rmsnorm variance", mul(d.T, rows, 4), Term::activations, "mean", "fp32", "b·s", true);
    sim.node("MeanBackward1", {sq}, {var}, {});
    sim.drop(sq);
    TensorId rs = sim.make("rmsnorm rsqrt (saved)", mul(d.T, rows, 4), Term::activations, "rsqrt", "fp32", "b·s", true);
    sim.node("RsqrtBackward0", {var}, {rs}, {rs});
    sim.drop(var);
    const bool n32_saved = gemma || in_b == 4;
    TensorId n32 = sim.make(n32_saved ? "rmsnorm normalized (saved by weight mul)" : "rmsnorm normalized fp32",
                            mul(Tw, 4), Term::activations, "hs * rsqrt", "fp32", "b·s·h", true);
    sim.node("MulBackward0", {hs32, rs}, {n32}, {hs32, rs}, mul(Tw, 4));
    sim.drop(hs32);
    sim.drop(rs);
    if (gemma) {
      TensorId w1 = sim.make("gemma norm (1 + w) (saved)", mul(width, 4), Term::activations, "1.0 + w.float()", "fp32", "h", true);
      sim.node("AddBackward1", {w}, {w1}, {});
      TensorId y32 = sim.make(in_b == 4 ? tag : "gemma norm fp32 output", mul(Tw, 4), Term::activations, "hs * (1 + w)",
                              "fp32", "b·s·h", true);
      const bool w1g = sim.info(w1).requires_grad, n32g = sim.info(n32).requires_grad;
      sim.node("MulBackward0", {n32, w1}, {y32}, {w1g ? n32 : kNone, n32g ? w1 : kNone}, w1g ? mul(Tw, 4) : 0);
      sim.drop(n32);
      sim.drop(w1);
      if (in_b == 4) return y32;
      TensorId y = sim.make(tag, mul(Tw, in_b), Term::activations, "type_as(x)", "", "b·s·h", true);
      sim.node("ToCopyBackward", {y32}, {y}, {});
      sim.drop(y32);
      return y;
    }
    TensorId nc = n32;
    if (in_b != 4) {
      nc = sim.make("rmsnorm normalized (saved by weight mul)", mul(Tw, in_b), Term::activations,
                    "to(input_dtype)", "", "b·s·h", true);
      sim.node("ToCopyBackward", {n32}, {nc}, {});
      sim.drop(n32);
    }
    const bytes_t out_b = std::max<bytes_t>(in_b, r.param);  // weight * x promotes
    TensorId y = sim.make(tag, mul(Tw, out_b), Term::activations, "weight * hs", "", "b·s·h", true);
    // MulBackward0 keeps each factor only for the other's gradient; a frozen weight (LoRA) needs no
    // normalised input and no per-token product to sum into its gradient.
    const bool wg = sim.info(w).requires_grad, ng = sim.info(nc).requires_grad;
    sim.node("MulBackward0", {w, nc}, {y}, {ng ? w : kNone, wg ? nc : kNone}, wg ? mul(Tw, out_b) : 0);
    sim.drop(nc);
    return y;
  }

  void layer(std::size_t i, TensorId x, TensorId* out) {
    const auto& p = layers[i];
    // Gemma 2 alternates: config.layer_types is "sliding_attention" for layers 0, 2, 4, … and
    // "full_attention" for the others, and each decoder layer gets
    // causal_mask_mapping[layer.attention_type]. The full layers' create_causal_mask is skipped for
    // SDPA (no padding, no local window: _ignore_causal_mask_sdpa), so only the sliding layers see
    // the mask, repeat their keys and values and save the additive mask.
    layer_masked = masked && m.sliding_layer(i);
    const bytes_t Th = mul(d.T, d.h);
    // residual = hidden_states; hidden_states = input_layernorm(hidden_states)
    TensorId n1 = rmsnorm(x, p.norm1, "input_layernorm output");
    // Phi-3 fuses the projections: qkv_proj's output is sliced into q, k, v views (their gradients
    // come back as full-size slice_backward buffers), and SDPA makes v contiguous.
    const bool fused = m.quirks.fused_qkv;
    TensorId q, k, v, qkv = kNone;
    if (fused) {
      qkv = linear(n1, d.h, d.qd + 2 * d.kvd, p.q, p.qb, "qkv_proj output (sliced into q, k, v)", "b·s·(q+2kv)");
      q = k = qkv;
      sim.hold(qkv);
      if (job.recompute == Recompute::none) {
        v = qkv;  // the cache's torch.cat copies the value slice
        sim.hold(qkv);
      } else {
        v = sim.make("v contiguous copy (saved by sdpa)", mul(d.T, d.kvd, r.compute), Term::activations,
                     "contiguous", r.compute_name, "b·kv·s·hd", true);
        sim.node("CloneBackward", {qkv}, {v}, {});
      }
    } else {
      q = linear(n1, d.h, d.qd, p.q, p.qb, "q_proj output", "b·s·a·hd", &p.aq);
      k = linear(n1, d.h, d.kvd, p.k, p.kb, "k_proj output", "b·s·kv·hd", &p.ak);
      v = linear(n1, d.h, d.kvd, p.v, p.vb, "v_proj output", "b·s·kv·hd", &p.av);
    }
    sim.drop(n1);
    if (m.qk_norm) {  // Qwen3: RMSNorm over head_dim on q and k, before rotary
      TensorId qn = rmsnorm(q, p.q_norm, "q_norm output", d.qd, d.a);
      sim.drop(q);
      q = qn;
      TensorId kn = rmsnorm(k, p.k_norm, "k_norm output", d.kvd, d.kva);
      sim.drop(k);
      k = kn;
    }
    // apply_rotary_pos_emb: q*cos + rotate_half(q)*sin; cos/sin carry the residual dtype, so under
    // autocast the products promote to fp32. mul saves only cos/sin (q's grad needs cos, not q).
    auto rotary = [&](TensorId t, bytes_t width, const char* name) {
      const bytes_t eb = t == qkv ? r.compute : sim.info(t).bytes / mul(d.T, width);
      const bytes_t rb = std::max<bytes_t>(r.resid, eb);
      TensorId a1 = sim.make("rotary q*cos", mul(d.T, width, rb), Term::activations, "mul", "", "", true);
      sim.node("MulBackward0", {t, cos}, {a1}, {cos});
      TensorId neg = sim.make("rotate_half neg", mul(d.T, width / 2, eb),
                              Term::activations, "neg", "", "", true);
      sim.node("NegBackward0", {t}, {neg}, {});
      TensorId rh = sim.make("rotate_half cat", mul(d.T, width, eb), Term::activations, "cat", "", "", true);
      sim.node("CatBackward0", {neg, t}, {rh}, {});
      sim.drop(neg);
      TensorId a2 = sim.make("rotary rot*sin", mul(d.T, width, rb), Term::activations, "mul", "", "", true);
      sim.node("MulBackward0", {rh, sin}, {a2}, {sin});
      sim.drop(rh);
      const bool phi3 = m.quirks.partial_rotary;
      TensorId e = sim.make(phi3 ? "rotary q*cos + rot*sin" : name, mul(d.T, width, rb), Term::activations, "add", "",
                            "b·s·n·hd", true);
      sim.node("AddBackward0", {a1, a2}, {e}, {});
      sim.drop(a1);
      sim.drop(a2);
      if (phi3) {
        // Phi-3's apply_rotary_pos_emb supports partial rotary: q_embed = torch.cat([q_rot*cos +
        // rotate_half(q_rot)*sin, q_pass], -1) with an empty q_pass. The cat is a copy, and a
        // contiguous one (b·n·s·hd): the rotated tensor keeps qkv_proj's b·s·n·hd layout, cat does
        // not (its output takes the inputs' suggested memory format, which for this permutation is
        // the default contiguous one).
        TensorId ec = sim.make(name, mul(d.T, width, rb), Term::activations, "cat (partial rotary)", "",
                               "b·n·s·hd", true);
        sim.node("CatBackward0", {e}, {ec}, {});
        sim.drop(e);
        e = ec;
      }
      return e;
    };
    TensorId qe = rotary(q, d.qd, "q after rotary");
    sim.drop(q);
    TensorId ke = rotary(k, d.kvd, "k after rotary");
    sim.drop(k);
    // LlamaModel creates a DynamicCache when config.use_cache is true, also in training (HF turns
    // it off only under gradient checkpointing). DynamicLayer.update concatenates the new keys and
    // values onto empty tensors created in the *keys'* dtype and hands the concatenations to
    // attention: under autocast the keys are fp32 after rotary, so both copies are fp32 (the values
    // are promoted). The cache holds them until the model's output dies.
    if (job.recompute == Recompute::none) {
      const bytes_t kb = sim.info(ke).bytes / mul(d.T, d.kvd);
      TensorId kc = sim.make("DynamicCache keys (torch.cat copy)", mul(d.T, d.kvd, kb), Term::activations, "cat", "",
                             "b·kv·s·hd", true);
      sim.node("CatBackward0", {ke}, {kc}, {});
      TensorId vc = sim.make("DynamicCache values (torch.cat copy, keys' dtype)", mul(d.T, d.kvd, kb),
                             Term::activations, "cat", "", "b·kv·s·hd", true);
      sim.node("CatBackward0", {fused ? qkv : v}, {vc}, {});
      sim.drop(ke);
      sim.drop(v);
      ke = kc;
      v = vc;
      sim.hold(kc);
      sim.hold(vc);
      kv_cache.push_back(kc);
      kv_cache.push_back(vc);
    }
    TensorId att = attention(qe, ke, v);
    sim.drop(qe);
    sim.drop(ke);
    sim.drop(v);
    // attn_output.transpose(1, 2).contiguous(): cuDNN writes its output in q's layout (flash in
    // b·s·a·hd). q keeps q_proj's b·s·a·hd layout through rotary, so this is a view that o_proj
    // saves; Phi-3's partial-rotary cat makes q contiguous b·a·s·hd, and then it is a copy, saved by
    // o_proj beside the output SDPA saves. The math paths copy (below).
    TensorId attc = att;
    if (m.quirks.partial_rotary && fused_sdpa()) {
      attc = sim.make("attention output (contiguous copy, saved by o_proj)", mul(d.T, d.qd, r.compute), Term::activations,
                      "contiguous", r.compute_name, "b·s·a·hd", true);
      sim.node("CloneBackward0", {att}, {attc}, {});
      sim.drop(att);
    }
    TensorId o = linear(attc, d.qd, d.h, p.o, kNone, "o_proj output", "b·s·h", &p.ao);
    sim.drop(attc);
    if (m.norms_per_layer >= 4) {  // Gemma 2: post_attention_layernorm on the branch
      TensorId on = rmsnorm(o, p.norm3, "post-attention norm output");
      sim.drop(o);
      o = on;
    }
    TensorId h1 = sim.make("residual stream (saved by the next norm)", mul(Th, r.resid), Term::activations,
                           "residual add", r.resid_name, "b·s·h", true);
    sim.node("AddBackward0", {x, o}, {h1}, {});
    sim.drop(o);
    TensorId n2 = rmsnorm(h1, p.norm2, "post_attention_layernorm output");
    // MLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))
    const bytes_t TI = mul(d.T, d.I);
    TensorId g, u;
    if (m.quirks.fused_gate_up) {  // Phi-3: gate_up_proj, chunked; both chunks are views of one buffer
      g = u = linear(n2, d.h, 2 * d.I, p.gate, kNone, "gate_up_proj output (saved by act and mul)", "b·s·2I");
      sim.hold(g);
    } else {
      g = linear(n2, d.h, d.I, p.gate, kNone, "gate_proj output (saved by act)", "b·s·I", &p.agate);
    }
    TensorId act = sim.make("activation output (saved by mul)", mul(TI, r.compute), Term::activations,
                            m.mlp == MlpKind::gated_gelu ? "gelu_tanh" : "silu", r.compute_name, "b·s·I", true);
    sim.node(m.mlp == MlpKind::gated_gelu ? "GeluBackward0" : "SiluBackward0", {g}, {act}, {g});
    sim.drop(g);
    if (!m.quirks.fused_gate_up) u = linear(n2, d.h, d.I, p.up, kNone, "up_proj output (saved by mul)", "b·s·I", &p.aup);
    sim.drop(n2);
    TensorId prod = sim.make("act*up (saved by down_proj)", mul(TI, r.compute), Term::activations, "mul",
                             r.compute_name, "b·s·I", true);
    sim.node("MulBackward0", {act, u}, {prod}, {act, u});
    sim.drop(act);
    sim.drop(u);
    TensorId dn = linear(prod, d.I, d.h, p.down, kNone, "down_proj output", "b·s·h", &p.adown);
    sim.drop(prod);
    if (m.norms_per_layer >= 4) {
      TensorId dnn = rmsnorm(dn, p.norm4, "post-feedforward norm output");
      sim.drop(dn);
      dn = dnn;
    }
    TensorId h2 = sim.make("residual stream (layer output)", mul(Th, r.resid), Term::activations,
                           "residual add", r.resid_name, "b·s·h", true);
    sim.node("AddBackward0", {h1, dn}, {h2}, {});
    sim.drop(dn);
    sim.drop(h1);
    *out = h2;
  }

  // scaled_dot_product_attention. Flash/cuDNN need 16-bit inputs: with GQA (enable_gqa) in fp32 no
  // fused kernel applies and PyTorch falls back to its math implementation. Under autocast q and k
  // (fp32 after rotary) are cast to bf16.
  bool fused_sdpa() const { return job.attention == Attention::flash && r.compute != 4; }

  TensorId attention(TensorId qe, TensorId ke, TensorId v) {
    // transformers' sdpa_attention_forward passes enable_gqa only without a mask
    // (use_gqa_in_sdpa); with one it repeat_kv's keys and values first (expand + reshape: copies
    // in their dtype, which backward sums back to the kv heads).
    const bool repeat = layer_masked && fused_sdpa() && d.a != d.kva;
    if (repeat) {
      const bytes_t kb = sim.info(ke).bytes / mul(d.T, d.kvd), vb = sim.info(v).bytes / mul(d.T, d.kvd);
      TensorId kr = sim.make("repeat_kv keys (mask given: no enable_gqa)", mul(d.T, d.qd, kb), Term::activations,
                             "repeat_kv", "", "b·a·s·hd", true);
      sim.node("ExpandBackward0", {ke}, {kr}, {});
      TensorId vr = sim.make("repeat_kv values (mask given: no enable_gqa)", mul(d.T, d.qd, vb), Term::activations,
                             "repeat_kv", "", "b·a·s·hd", true);
      sim.node("ExpandBackward0", {v}, {vr}, {});
      ke = kr;
      v = vr;
    }
    const bytes_t kw = repeat ? d.qd : d.kvd;
    TensorId q = cast_input(qe, d.qd * d.T, "sdpa inputs (bf16 casts of q, k)");
    TensorId k = cast_input(ke, kw * d.T, "sdpa inputs (bf16 casts of q, k)");
    TensorId vin = cast_input(v, kw * d.T, "sdpa inputs (bf16 cast of the cached fp32 values)");
    if (repeat) {
      sim.drop(ke);
      sim.drop(v);
    }
    v = vin;
    TensorId out = kNone;
    if (fused_sdpa()) {
      // cuDNN / flash: saves q, k, v (not repeated), the output and the fp32 log-sum-exp
      out = sim.make("sdpa output (saved)", mul(d.T, d.qd, r.compute), Term::activations, "sdpa",
                     r.compute_name, "b·s·a·hd", true);
      TensorId lse = sim.make("sdpa log-sum-exp (saved)", mul(d.b, d.a, d.s, 4), Term::activations,
                              "flash attention", "fp32", "b·a·s", false);
      // With a mask, SDPA (convert_boolean_attn_mask) turns the bool mask into an additive one in
      // q's dtype, at::where(mask.logical_not(), -inf, 0): a b·1·s·s tensor per layer, which cuDNN
      // attention takes as attn_bias and saves for backward.
      TensorId bias = kNone;
      if (layer_masked) {
        sim.transient("sdpa mask: logical_not (bool)", mul(d.b, d.s, d.s));
        bias = sim.make("sdpa attn_bias: additive mask (saved)", mul(d.b, d.s, d.s, r.compute), Term::activations,
                        "convert_boolean_attn_mask", r.compute_name, "b·1·s·s", false);
      }
      // backward: dq accumulator in fp32, and k/v gradients expanded to all query heads under GQA
      bytes_t ws = mul(d.T, d.qd, 4) + mul(d.b, d.a, d.s, 4);
      if (d.a != d.kva && !repeat) ws += mul(d.T, d.qd, r.compute, 2);
      if (bias != kNone) {
        sim.node("CudnnAttentionBackward (attn_bias)", {q, k, v}, {out}, {q, k, v, out, lse, bias}, ws);
      } else {
        sim.node("FlashAttentionBackward", {q, k, v}, {out}, {q, k, v, out, lse}, ws);
      }
      sim.drop(lse);
      sim.drop(bias);
    } else if (job.attention == Attention::flash) {
      out = sdpa_math(q, k, v);
    } else {
      out = eager(q, k, v);
    }
    sim.drop(q);
    sim.drop(k);
    sim.drop(v);
    return out;
  }

  // at::_scaled_dot_product_attention_math: q·√scale, k repeated (enable_gqa) then ·√scale, a
  // causal mask materialised as s² floats, softmax (saves its result), then @ v (repeated).
  TensorId sdpa_math(TensorId q, TensorId k, TensorId v) {
    const bytes_t e = r.compute;
    const bytes_t bas2 = mul(d.b, d.a, d.s, d.s);
    TensorId qs = sim.make("sdpa math: scaled q (saved)", mul(d.T, d.qd, e), Term::activations, "mul", "", "b·a·s·hd", true);
    sim.node("MulBackward1", {q}, {qs}, {});
    TensorId kr = k, vr = v;
    if (d.a != d.kva) {
      kr = sim.make("sdpa math: repeated k", mul(d.T, d.qd, e), Term::activations, "repeat_interleave", "", "b·a·s·hd", true);
      sim.node("RepeatInterleaveBackward", {k}, {kr}, {});
      vr = sim.make("sdpa math: repeated v (saved)", mul(d.T, d.qd, e), Term::activations, "repeat_interleave", "", "b·a·s·hd", true);
      sim.node("RepeatInterleaveBackward", {v}, {vr}, {});
    } else {
      sim.hold(kr);
      sim.hold(vr);
    }
    TensorId ks = sim.make("sdpa math: scaled k (saved)", mul(d.T, d.qd, e), Term::activations, "mul", "", "b·a·s·hd", true);
    sim.node("MulBackward1", {kr}, {ks}, {});
    sim.drop(kr);
    TensorId mask = sim.make("sdpa math: causal mask", mul(d.s, d.s, 1 + e), Term::activations, "tril + where", "", "s·s", false);
    TensorId sc = sim.make("sdpa math: scores", mul(bas2, e), Term::activations, "matmul", "", "b·a·s·s", true);
    sim.node("BmmBackward", {qs, ks}, {sc}, {qs, ks});
    sim.drop(qs);
    sim.drop(ks);
    TensorId sm = sim.make("sdpa math: softmax output (saved)", mul(bas2, e), Term::activations, "softmax", "", "b·a·s·s", true);
    // _safe_softmax's backward is _softmax_backward_data; on CUDA (SoftMax.cu,
    // softmax_backward_cuda_out) it computes `Tensor tmp = grad * output` before the reduction:
    // a temporary the size of the scores beside grad_input.
    sim.node("SoftmaxBackward", {sc}, {sm}, {sm}, mul(bas2, e));
    sim.drop(sc);
    sim.drop(mask);
    TensorId o = sim.make("sdpa output", mul(d.T, d.qd, e), Term::activations, "matmul", "", "b·a·s·hd", true);
    sim.node("BmmBackward", {sm, vr}, {o}, {sm, vr});
    sim.drop(sm);
    sim.drop(vr);
    // the math output is b·a·s·hd: HF's transpose(1, 2).contiguous() copies it for o_proj
    TensorId oc = sim.make("attention output (contiguous, saved by o_proj)", mul(d.T, d.qd, e), Term::activations,
                           "contiguous", "", "b·s·a·hd", true);
    sim.node("CloneBackward", {o}, {oc}, {});
    sim.drop(o);
    return oc;
  }

  // transformers' eager_attention_forward: repeat_kv, q @ kᵀ, · scaling (a copy), + causal mask (in
  // the residual dtype, so fp32 under autocast), softmax in fp32 (saves its result), .to(dtype)
  // (saved by the second matmul), @ v, then transpose(1, 2).contiguous() (a copy).
  TensorId eager(TensorId q, TensorId k, TensorId v) {
    const bytes_t e = r.compute;
    const bytes_t bas2 = mul(d.b, d.a, d.s, d.s);
    TensorId kr = k, vr = v;
    if (d.a != d.kva) {
      kr = sim.make("repeat_kv keys", mul(d.T, d.qd, e), Term::activations, "repeat_kv", r.compute_name, "b·a·s·hd", true);
      sim.node("ExpandBackward", {k}, {kr}, {});
      vr = sim.make("repeat_kv values", mul(d.T, d.qd, e), Term::activations, "repeat_kv", r.compute_name, "b·a·s·hd", true);
      sim.node("ExpandBackward", {v}, {vr}, {});
    } else {
      sim.hold(kr);
      sim.hold(vr);
    }
    TensorId mask = sim.make("causal mask (4-D, residual dtype)", mul(d.b, d.s, d.s, r.resid), Term::activations,
                             "create_causal_mask", r.resid_name, "b·1·s·s", false);
    TensorId sc = sim.make("attention scores", mul(bas2, e), Term::activations, "matmul", r.compute_name, "b·a·s·s", true);
    sim.node("BmmBackward", {q, kr}, {sc}, {q, kr});
    TensorId scl = sim.make("attention scores × scaling", mul(bas2, e), Term::activations, "mul", r.compute_name, "b·a·s·s", true);
    sim.node("MulBackward1", {sc}, {scl}, {});
    sim.drop(sc);
    const bytes_t mb = std::max(e, r.resid);
    TensorId msk = sim.make("attention scores + mask", mul(bas2, mb), Term::activations, "add", "", "b·a·s·s", true);
    sim.node("AddBackward0", {scl}, {msk}, {});
    sim.drop(scl);
    sim.drop(mask);
    TensorId sm32 = sim.make("softmax output fp32 (saved)", mul(bas2, 4), Term::activations, "softmax(float32)", "fp32",
                             "b·a·s·s", true);
    // _softmax_backward_data on CUDA allocates `tmp = grad * output` (fp32 here) beside grad_input
    // (SoftMax.cu, softmax_backward_cuda_out).
    sim.node("SoftmaxBackward", {msk}, {sm32}, {sm32}, mul(bas2, 4));
    sim.drop(msk);
    TensorId sm = sm32;
    if (e != 4) {
      sm = sim.make("attention weights (saved by @ v)", mul(bas2, e), Term::activations, "to(dtype)", r.compute_name,
                    "b·a·s·s", true);
      sim.node("ToCopyBackward", {sm32}, {sm}, {});
      sim.drop(sm32);
    }
    TensorId o = sim.make("attention probs @ v", mul(d.T, d.qd, e), Term::activations, "matmul", r.compute_name,
                          "b·a·s·hd", true);
    sim.node("BmmBackward", {sm, vr}, {o}, {sm, vr});
    sim.drop(sm);
    sim.drop(kr);
    sim.drop(vr);
    TensorId oc = sim.make("attention output (contiguous, saved by o_proj)", mul(d.T, d.qd, e), Term::activations,
                           "contiguous", r.compute_name, "b·s·a·hd", true);
    sim.node("CloneBackward", {o}, {oc}, {});
    sim.drop(o);
    return oc;
  }
};

}  // namespace


namespace {

// Forward of layers, final norm, lm_head and loss. Returns the loss tensor.
TensorId forward(Step& st, bool checkpoint) {
  auto& sim = st.sim;
  const auto& d = st.d;
  const auto& r = st.r;
  // inputs_embeds = embed_tokens(input_ids): the embedding saves only the indices.
  TensorId x = sim.make("embedding output", mul(d.T, d.h, r.param), Term::activations, "embedding",
                        r.param_name, "b·s·h", true);
  sim.node("EmbeddingBackward0", {st.emb}, {x}, {st.input_ids});
  // Gemma scales the embeddings by sqrt(h): a new tensor; inputs_embeds stays referenced by the
  // model's forward until the layers are done.
  TensorId inputs_embeds = kNone;
  if (st.m.quirks.embedding_scale) {
    inputs_embeds = x;
    x = sim.make("embedding × sqrt(h)", mul(d.T, d.h, r.param), Term::activations, "mul", r.param_name, "b·s·h", true);
    sim.node("MulBackward0", {inputs_embeds}, {x}, {});
  }
  // LlamaRotaryEmbedding: cos and sin in the hidden states' dtype, shared by every layer.
  st.cos = sim.make("rotary cos/sin", mul(d.s, d.hd, r.resid), Term::activations, "rotary", r.resid_name, "s·hd", false);
  st.sin = sim.make("rotary cos/sin", mul(d.s, d.hd, r.resid), Term::activations, "rotary", r.resid_name, "s·hd", false);
  // Sliding-window attention (Mistral, Phi-3: the window on every layer; Gemma 2: on every other
  // layer) through SDPA: create_sliding_window_causal_mask skips the mask and lets SDPA use
  // is_causal only while kv_length < sliding_window (masking_utils._ignore_causal_mask_sdpa); from
  // s = window on it materialises a bool b·1·s·s mask, once per forward, shared by the sliding
  // layers. The model's forward holds it through the layers; under checkpointing each sliding
  // layer's recompute closure holds it too, until that layer's backward (layer 0 is a sliding
  // layer in Gemma 2 as well, so the mask lives through the whole backward either way).
  if (st.masked)
    st.mask = sim.make("sliding-window attention mask (bool)", mul(d.b, d.s, d.s), Term::activations,
                       "create_sliding_window_causal_mask", "bool", "b·1·s·s", false);
  for (std::size_t i = 0; i < d.L; ++i) {
    TensorId out = kNone;
    sim.set_section(static_cast<int>(i) + 1);  // plans: layer i's section
    if (checkpoint) {
      // torch.utils.checkpoint(use_reentrant=False): saved tensors are dropped; the layer input
      // (held by the checkpoint frame) is kept; backward re-runs the layer first.
      const std::size_t first = sim.node_count();
      sim.set_discard_saves(true);
      st.layer(i, x, &out);
      sim.set_discard_saves(false);
      sim.add_recompute_region(first, sim.node_count(), static_cast<int>(i));
      st.layer_inputs.push_back(x);  // keep holding x
    } else {
      st.layer(i, x, &out);
      sim.drop(x);
    }
    x = out;
  }
  sim.set_section(static_cast<int>(d.L) + 1);  // after the layers
  sim.drop(inputs_embeds);
  // LlamaModel returns the final norm output as last_hidden_state: the CausalLM forward holds it
  // (and the DynamicCache) until it returns, i.e. through the loss.
  TensorId hn = st.rmsnorm(x, st.final_norm, "final norm output");
  sim.drop(x);
  if (!checkpoint) sim.drop(st.mask);  // the model's forward returns
  sim.hold(hn);
  TensorId loss = kNone;
  const bytes_t TV = mul(d.T, d.V);
  if (st.job.loss == Loss::full) {
    TensorId logits = st.linear(hn, d.h, d.V, st.lm_head, kNone, "logits", "b·s·V");
    sim.drop(hn);
    if (st.m.final_logit_softcap > 0) {
      // Gemma 2: logits = tanh(logits / cap) * cap; tanh saves its output
      TensorId dv = sim.make("logits / softcap", mul(TV, r.compute), Term::logits_loss, "div", r.compute_name, "b·s·V", true);
      sim.node("DivBackward1", {logits}, {dv}, {});
      sim.drop(logits);
      TensorId th = sim.make("tanh(logits / softcap) (saved)", mul(TV, r.compute), Term::logits_loss, "tanh",
                             r.compute_name, "b·s·V", true);
      sim.node("TanhBackward0", {dv}, {th}, {th});
      sim.drop(dv);
      logits = sim.make("logits", mul(TV, r.compute), Term::logits_loss, "mul", r.compute_name, "b·s·V", true);
      sim.node("MulBackward1", {th}, {logits}, {});
      sim.drop(th);
    }
    // ForCausalLMLoss: logits.float(), then cross_entropy = log_softmax (saves its output) + nll_loss.
    TensorId l32 = logits;
    if (r.compute != 4) {
      l32 = sim.make("logits fp32 upcast (in the loss)", mul(TV, 4), Term::logits_loss, "logits.float()", "fp32", "b·s·V", true);
      sim.node("ToCopyBackward", {logits}, {l32}, {});
    } else {
      sim.hold(l32);
    }
    TensorId shift = sim.make("shifted labels", mul(d.T, 8), Term::other, Role::input, "pad + contiguous", "int64", "b·s", false);
    TensorId lsm = sim.make("log-softmax output (saved by the loss)", mul(TV, 4), Term::logits_loss, "log_softmax", "fp32", "b·s·V", true);
    sim.node("LogSoftmaxBackward0", {l32}, {lsm}, {lsm});
    sim.drop(l32);
    loss = sim.make("loss", 4, Term::logits_loss, "nll_loss", "fp32", "1", true);
    sim.node("NllLossBackward0", {lsm}, {loss}, {shift});
    sim.drop(lsm);
    sim.drop(shift);
    sim.drop(logits);  // the output object is dropped once .loss is taken
  } else {
    // Chunked (fused linear + cross-entropy, Liger-style): per chunk of c tokens the logits, their
    // fp32 copy and their gradient exist only inside the forward; the gradients of the hidden states
    // and of the output weight are computed there and saved for backward.
    const bytes_t c = std::min<bytes_t>(st.job.loss_chunk, d.T);
    TensorId gh = sim.make("chunked loss: saved grad of hidden states", mul(d.T, d.h, r.compute), Term::logits_loss,
                           "fused linear cross-entropy", r.compute_name, "b·s·h", true);
    // (a frozen output weight, under LoRA, gets no gradient)
    const bool head_grad = sim.info(st.lm_head).requires_grad;
    TensorId gw = head_grad ? sim.make("chunked loss: saved grad of output weight", mul(d.V, d.h, 4), Term::logits_loss,
                                       "fused linear cross-entropy", "fp32", "V·h", true)
                            : kNone;
    TensorId chunk = sim.make("chunked loss: logits of one chunk", mul(c, d.V, r.compute), Term::logits_loss, "chunk", r.compute_name, "c·V", false);
    TensorId c32 = sim.make("chunked loss: fp32 logits / grad of one chunk", mul(c, d.V, 8), Term::logits_loss, "chunk", "fp32", "c·V", false);
    sim.drop(c32);
    sim.drop(chunk);
    loss = sim.make("loss", 4, Term::logits_loss, "fused linear cross-entropy", "fp32", "1", true);
    TensorId wc = st.weight(st.lm_head);
    sim.node("FusedLinearCrossEntropyBackward", {hn, wc}, {loss}, {gh, gw});
    st.release_weight(st.lm_head, wc);
    sim.drop(gh);
    sim.drop(gw);
    sim.drop(hn);
  }
  // leaving torch.autocast clears its weight cache; saved copies live on in the graph
  st.clear_cast_cache();
  if (!checkpoint) {  // checkpointed layers keep cos/sin as inputs until their recompute
    sim.drop(st.cos);
    sim.drop(st.sin);
  }
  st.drop_kv_cache();
  sim.drop(hn);
  return loss;
}

void recompute_layer(AutogradSim& sim, void* ctx, int region) {
  Step& st = *static_cast<Step*>(ctx);
  TensorId out = kNone;
  // checkpoint restores the autocast state: weights are cast again into a fresh cache
  st.layer(static_cast<std::size_t>(region), st.layer_inputs[region], &out);
  st.clear_cast_cache();
  sim.drop(out);
  sim.drop(st.layer_inputs[region]);  // the checkpoint frame releases its input
}

// Optimizer state bytes and the step's transient bytes, for `params` parameters of `pb` bytes.
struct OptimizerCost {
  bytes_t state = 0;      // persistent
  bytes_t master = 0;     // fp32 master copy
  bytes_t transient = 0;  // temporaries at the peak of optimizer.step()
};

// Elements of the largest trainable parameter tensor: the model's, or (LoRA) its adapters'.
std::uint64_t largest_trainable(const ModelSpec& m, std::uint64_t lora_rank) {
  std::uint64_t largest = 0;
  for (std::uint64_t il = 0; il < m.num_layers; ++il)
    for (const ParamTensor& t : m.layer_tensors(static_cast<std::size_t>(il)))
      largest = std::max(largest, !lora_rank ? t.elements()
                                  : t.projection() ? std::max(mul(lora_rank, t.in), mul(t.out, lora_rank))
                                                   : 0);
  if (!lora_rank)
    for (const ParamTensor& t : m.outer_tensors()) largest = std::max(largest, t.elements());
  return largest;
}

// `params`: the trainable parameters (all, or LoRA's fp32 adapters: fp32 state, no master copy).
// The implementation (effective_optimizer_impl) decides the step's temporaries; the line numbers
// are torch 2.11.0's torch/optim/ sources (tools/device/optimizer_impl_run.sh keeps a copy), and
// tests/data/torch_train_optimizer_impl_h200.json measures each.
OptimizerCost optimizer_cost(const Job& job, const ModelSpec& m, std::uint64_t params) {
  OptimizerCost c;
  const bytes_t n = params;
  const Recipe recipe = recipe_of(job.precision);
  const bool master = recipe.master && job.lora_rank == 0;
  const bytes_t sb = job.lora_rank ? 4 : element_size(recipe.state);
  const std::optional<OptimizerImpl> impl = effective_optimizer_impl(job);
  if (master) c.master = mul(n, 4);
  switch (job.optimizer) {
    case Optimizer::adamw:
      // exp_avg, exp_avg_sq (adam.py:177-184, zeros_like(p) per parameter)
      c.state = mul(n, sb, 2);
      if (impl == OptimizerImpl::foreach)
        // _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)
        // (adam.py:791) for every parameter at once; the rest is in place
        c.transient = mul(n, sb);
      else if (impl == OptimizerImpl::for_loop)
        // _single_tensor_adam: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        // (adam.py:545): sqrt() and the division's result are both live, for one parameter at a
        // time; the peak holds the largest parameter's two, each a block of its own
        // (own_segment_block: a 501 MiB bf16 embedding takes a 502 MiB block, as measured)
        c.transient = mul(own_segment_block(mul(largest_trainable(m, job.lora_rank), sb)), 2);
      // fused: torch._fused_adamw_ (adam.py:878) updates in place, no parameter-sized temporary
      // (its state["step"] lives on the device, adam.py:168: a 512-byte block per parameter
      // tensor, 75 KB for Llama 3.2 1B, not counted)
      break;
    // SGD, every implementation: no temporary. The momentum buffer is the gradient's clone at the
    // first step (sgd.py:366, foreach likewise; fused: empty_like(g), sgd.py:512), then updated in
    // place; the parameter update is in place (sgd.py:378, 473; torch._fused_sgd_, sgd.py:530).
    case Optimizer::sgd: c.state = 0; c.transient = 0; break;
    case Optimizer::sgd_momentum: c.state = mul(n, sb); c.transient = 0; break;
    case Optimizer::lion:
      // exp_avg; the update sign(lerp(m, g)) is a temporary of parameter size
      c.state = mul(n, sb);
      c.transient = mul(n, sb);
      break;
    case Optimizer::adamw_8bit:
      // bitsandbytes: two uint8 moments + one fp32 absmax per 256-value block each; fused kernel
      c.state = mul(n, 2) + mul((n + 255) / 256, 8);
      c.transient = 0;
      break;
    case Optimizer::adafactor: {
      // torch.optim.Adafactor: factored second moment (row and column fp32 vectors) for matrices,
      // full for vectors; no first moment.
      // (The vectors' state is not counted: norms are a few KiB.)
      bytes_t layer_rows_cols = 0, outer_rows_cols = 0, largest = 0;
      for (const ParamTensor& t : m.layer_tensors(0))
        if (t.projection()) {
          layer_rows_cols += t.in + t.out;
          largest = std::max(largest, t.elements());
        }
      for (const ParamTensor& t : m.outer_tensors())
        if (t.projection()) {
          outer_rows_cols += t.in + t.out;
          largest = std::max(largest, t.elements());
        }
      c.state = mul(checked_add(mul(m.num_layers, layer_rows_cols), outer_rows_cols, "Adafactor state"), sb);
      if (impl == OptimizerImpl::foreach)
        // _multi_tensor_adafactor: var_estimates = [row_var @ col_var ...] (_adafactor.py:567) for
        // every matrix at once and [v.clone() ...] (_adafactor.py:589) for every vector: one
        // parameter-sized list, updated in place
        c.transient = mul(n, sb);
      else
        // the for-loop (torch's default for Adafactor, _adafactor.py:639): one temporary per
        // tensor, counted here as two fp32 copies of the largest projection. Measured
        // (torch_train_optimizer_impl_h200.json), the step holds the largest parameter's
        // var_estimate (_adafactor.py:402, the embedding) plus 8·h² bytes: this figure is not that.
        c.transient = mul(largest, 4, 2);
      break;
    }
  }
  if (master) c.transient += mul(n, 4);  // fp32 copy of the bf16 gradients
  return c;
}

// The slot of a layer's parameter in the inventory's LayerParams; nullptr for a tensor the torch
// inventory does not simulate (check_torch_coverage refuses such models first).
TensorId* slot_of(LayerParams& lp, const ParamTensor& t) {
  switch (t.module) {
    case Module::attn_norm: return t.bias ? nullptr : &lp.norm1;
    case Module::mlp_norm: return t.bias ? nullptr : &lp.norm2;
    case Module::attn_out_norm: return t.bias ? nullptr : &lp.norm3;
    case Module::mlp_out_norm: return t.bias ? nullptr : &lp.norm4;
    case Module::q:
    case Module::qkv: return t.bias ? &lp.qb : &lp.q;
    case Module::k: return t.bias ? &lp.kb : &lp.k;
    case Module::v: return t.bias ? &lp.vb : &lp.v;
    case Module::o: return t.bias ? nullptr : &lp.o;
    case Module::gate:
    case Module::gate_up: return t.bias ? nullptr : &lp.gate;
    case Module::up: return t.bias ? nullptr : &lp.up;
    case Module::down: return t.bias ? nullptr : &lp.down;
    case Module::q_norm: return &lp.q_norm;
    case Module::k_norm: return &lp.k_norm;
    default: return nullptr;
  }
}

Adapter* adapter_of(LayerParams& lp, Module m) {
  switch (m) {
    case Module::q: return &lp.aq;
    case Module::k: return &lp.ak;
    case Module::v: return &lp.av;
    case Module::o: return &lp.ao;
    case Module::gate: return &lp.agate;
    case Module::up: return &lp.aup;
    case Module::down: return &lp.adown;
    default: return nullptr;
  }
}

// What the op walk of Step::layer covers: a Llama-style decoder (RMSNorm, gated MLP, separate or
// fused projections, q/k/v biases). Anything else would be simulated as something it is not.
void check_torch_coverage(const ModelSpec& m, const Job& job) {
  auto refuse = [&](const std::string& what) {
    throw Error(ErrorKind::unsupported, m.name + ": " + what + " is not modelled by the training inventory (serving, --mode infer, is)");
  };
  if (m.mla.enabled()) refuse("multi-head latent attention (mla) in training");
  if (m.norm != NormKind::rmsnorm) refuse("norm: layernorm");
  if (m.mlp == MlpKind::plain_gelu) refuse("mlp: plain_gelu");
  if (m.bias.o) refuse("bias.o (an o_proj bias)");
  if (m.bias.mlp) refuse("bias.mlp (MLP biases)");
  if (m.norms_per_layer != 2 && m.norms_per_layer != 4) refuse("norms_per_layer " + std::to_string(m.norms_per_layer) + " (2 or 4 are)");
  if (job.lora_rank && (m.quirks.fused_qkv || m.quirks.fused_gate_up))
    throw Error(ErrorKind::unsupported, "--lora: Phi-3's fused qkv_proj and gate_up_proj are not modelled with LoRA");
}

// The model's parameters as transformers allocates them (ModelSpec's tensor description), then
// peft's adapters. Under LoRA the base is frozen (requires_grad=False) and the adapters are fp32.
void build_parameters(Step& st) {
  AutogradSim& sim = st.sim;
  const ModelSpec& m = st.m;
  const bytes_t rank = st.job.lora_rank;
  auto P = [&](bytes_t n) {
    return sim.param("parameters", mul(n, st.r.param), Term::model_states, st.r.param_name, rank == 0);
  };
  const auto outer = m.outer_tensors();
  st.emb = P(outer.front().elements());
  st.layers.resize(st.d.L);
  for (std::size_t il = 0; il < st.layers.size(); ++il)
    for (const ParamTensor& t : m.layer_tensors(il)) {
      TensorId* slot = slot_of(st.layers[il], t);
      if (!slot) throw Error(ErrorKind::unsupported, std::string("internal: no inventory slot for ") + to_string(t.module));
      *slot = P(t.elements());
      if (il == 0) st.layer0_params.push_back(*slot);
    }
  if (rank)  // peft adds the adapters after the model is built, on every decoder projection
    for (std::size_t il = 0; il < st.layers.size(); ++il)
      for (const ParamTensor& t : m.layer_tensors(il))
        if (Adapter* a = t.projection() ? adapter_of(st.layers[il], t.module) : nullptr) {
          a->a = sim.param("LoRA adapters (fp32)", mul(rank, t.in, 4), Term::model_states, "fp32", true, Role::adapter);
          a->b = sim.param("LoRA adapters (fp32)", mul(t.out, rank, 4), Term::model_states, "fp32", true, Role::adapter);
          if (il == 0) st.layer0_params.insert(st.layer0_params.end(), {a->a, a->b});
        }
  st.lm_head = st.emb;
  for (const ParamTensor& t : outer) {
    if (t.module == Module::final_norm) st.final_norm = P(t.elements());
    if (t.module == Module::lm_head) st.lm_head = P(t.elements());
  }
}

// Parameters of rank-r adapters (A: r × in, B: out × r) on every decoder projection.
std::uint64_t lora_parameters(const ModelSpec& m, std::uint64_t rank) {
  std::uint64_t per_layer = 0;
  for (const ParamTensor& t : m.layer_tensors(0))
    if (t.projection()) per_layer = checked_add(per_layer, checked_add(t.in, t.out, "LoRA parameters"), "LoRA parameters");
  return checked_product("LoRA parameters", m.num_layers, rank, per_layer);
}

// The long-lived tensors a run allocates once — the parameters (built on the device by
// from_config), torch.optim's state (zeros_like(p) per parameter at the first step) and the fp32
// master copy — mostly get segments of their own: each then holds its whole segment
// (own_segment_block). The extra bytes, per parameter tensor, for the full model (`sizing`): the
// fast path simulates fewer layers, and all layers are alike.
struct SegmentTails {
  bytes_t params = 0, state = 0;
};

SegmentTails segment_tails(const Step& st, const ModelSpec& sizing) {
  const Job& job = st.job;
  const bytes_t rank = job.lora_rank;
  const Recipe recipe = recipe_of(job.precision);
  const bool master = recipe.master && !rank;
  const bytes_t sb = rank ? 4 : element_size(recipe.state);
  const bytes_t per_param = job.optimizer == Optimizer::adamw                                                  ? 2
                            : job.optimizer == Optimizer::sgd_momentum || job.optimizer == Optimizer::lion ? 1
                                                                                                            : 0;
  auto tail = [](bytes_t b) { return own_segment_block(b) - round512(b); };
  std::vector<char> in_layer0(static_cast<std::size_t>(st.input_ids), 0);
  for (TensorId t : st.layer0_params) in_layer0[static_cast<std::size_t>(t)] = 1;
  SegmentTails out;
  bytes_t layer0_state = 0;
  for (TensorId p = 0; p < st.input_ids; ++p) {
    const TensorInfo& info = st.sim.info(p);
    if (!info.param) continue;
    const bytes_t elems = info.bytes / (rank ? 4 : st.r.param);  // a trainable parameter's elements
    const bytes_t state = !info.requires_grad ? 0
                                              : per_param * tail(mul(elems, sb)) +
                                                    (master ? tail(mul(elems, 4)) : 0);
    out.params += tail(info.bytes);
    out.state += state;
    if (in_layer0[static_cast<std::size_t>(p)]) layer0_state += state;
  }
  // state for the full model's layer count; the parameters are those simulated
  out.state = out.state - layer0_state * st.d.L + layer0_state * sizing.num_layers;
  return out;
}

}  // namespace

// transformers materialises an SDPA mask for a sliding window once the sequence reaches the window
// (forward() says why), for a window on every layer (Mistral, Phi-3) or on every other one
// (Gemma 2: the mask goes to the sliding layers only, Step::layer()).
bool sliding_window_mask(const ModelSpec& m, const Job& job) {
  return job.attention == Attention::flash && m.sliding.enabled() && job.seq >= m.sliding.window;
}

TorchStepResult simulate_torch_train(const ModelSpec& m, const Job& job, bool explain, const ModelSpec* sizing,
                                     std::array<SimTrace, 2>* traces) {
  TorchStepResult res;
  const ModelSpec& sm = sizing ? *sizing : m;
  const std::uint64_t n_params = sm.parameters().total;
  for (int pass = 0; pass < 2; ++pass) {
    const bool steady = pass == 1;
    AutogradSim sim(explain);
    if (traces) sim.record_to(&(*traces)[pass]);
    check_torch_coverage(m, job);
    Step st{m, job, {}, RecipeBytes(recipe_of(job.precision)), sim, {}};
    st.masked = sliding_window_mask(m, job);
    auto& d = st.d;
    d.b = job.batch; d.s = job.seq; d.T = mul(job.batch, job.seq);
    d.h = m.hidden_size; d.I = m.intermediate_size; d.V = m.vocab_size;
    d.qd = m.q_dim(); d.kvd = m.kv_dim(); d.a = m.num_heads; d.kva = m.num_kv_heads;
    d.hd = m.head_dim; d.L = m.num_layers;
    const RecipeBytes& r = st.r;

    build_parameters(st);
    const bytes_t weights = sim.live();
    st.input_ids = sim.make("input_ids and labels", mul(d.T, 8), Term::other, Role::input, "inputs", "int64", "b·s", false);
    st.labels = sim.make("input_ids and labels", mul(d.T, 8), Term::other, Role::input, "inputs", "int64", "b·s", false);
    // The optimizer holds the trainable parameters: all of them, or the sizing model's fp32 adapters.
    const bytes_t rank = job.lora_rank;
    const OptimizerCost oc =
        optimizer_cost(job, sm, rank ? lora_parameters(sm, rank) : n_params);
    const SegmentTails tails = segment_tails(st, sm);
    sim.alloc_raw("allocator: whole segments held by parameters", tails.params, Term::other, Role::workspace, "caching allocator");
    // Optimizer state (and the fp32 master copy) stay allocated for the rest of the run.
    auto allocate_optimizer_state = [&] {
      sim.alloc_raw("optimizer state", oc.state, Term::model_states, Role::optimizer_state, "optimizer", "", "");
      sim.alloc_raw("master weights (fp32)", oc.master, Term::model_states, Role::master_weight, "optimizer", "fp32", "");
      sim.alloc_raw("allocator: whole segments held by optimizer state", tails.state, Term::other, Role::workspace, "caching allocator");
    };
    if (steady) allocate_optimizer_state();
    // cuBLAS workspace, one per handle: the forward thread's appears at the first matmul of step 0,
    // the autograd thread's at the first matmul of its backward; both stay (32 MiB each on Hopper,
    // CUBLAS_WORKSPACE_CONFIG :4096:8).
    if (steady) {
      sim.alloc_raw("cuBLAS workspaces (forward and autograd threads)", kCublasWorkspace, Term::other, Role::workspace, "cublas");
      sim.alloc_raw("cuBLAS workspaces (forward and autograd threads)", kCublasWorkspace, Term::other, Role::workspace, "cublas");
    }
    sim.begin_phase(Phase::floor);
    const bytes_t floor = sim.live();
    sim.begin_phase(Phase::forward_peak);
    if (!steady)
      sim.alloc_raw("cuBLAS workspaces (forward and autograd threads)", kCublasWorkspace, Term::other, Role::workspace, "cublas");
    const bool ckpt = job.recompute == Recompute::full;
    TensorId loss = forward(st, ckpt);
    if (steady) {
      const auto by_term = sim.live_by_term();
      res.after_forward_activations = by_term[static_cast<int>(Term::activations)];
      res.after_forward_logits = by_term[static_cast<int>(Term::logits_loss)];
      res.after_forward_autocast = by_term[static_cast<int>(Term::model_states)] - weights - oc.state - oc.master;
      res.saved = sim.live_groups(Term::activations);
      res.saved_logits = sim.live_groups(Term::logits_loss);
    }
    sim.begin_phase(Phase::backward_peak);
    if (!steady)
      sim.alloc_raw("cuBLAS workspaces (forward and autograd threads)", kCublasWorkspace, Term::other, Role::workspace, "cublas");
    sim.backward(loss, ckpt ? recompute_layer : nullptr, &st);
    sim.drop(loss);
    if (ckpt) {
      sim.drop(st.cos);
      sim.drop(st.sin);
      sim.drop(st.mask);
    }
    bytes_t grads = 0;
    std::vector<TensorId> grad_ids;
    for (TensorId p = 0; p < st.input_ids; ++p) {
      if (!sim.info(p).param) continue;
      TensorId g = sim.grad_of(p);
      if (g != kNone) { grad_ids.push_back(g); grads += sim.info(g).rounded; }
    }
    sim.begin_phase(Phase::optimizer_peak);
    if (!steady) allocate_optimizer_state();  // torch.optim creates its state lazily in the first step()
    TensorId tmp = sim.alloc_raw("optimizer temporaries", oc.transient, Term::model_states, Role::optimizer_temporary, "optimizer.step", "", "");
    sim.drop(tmp);
    for (TensorId g : grad_ids) sim.drop(g);  // zero_grad(set_to_none=True)
    sim.finish_trace();
    auto phases = sim.take_phases();
    phases.erase(phases.begin());  // "floor" phase holds just the floor; keep it below
    std::vector<PhasePeak> out;
    PhasePeak fl;
    fl.phase = Phase::floor;
    fl.bytes = floor;
    out.push_back(fl);
    for (auto& p : phases) out.push_back(std::move(p));
    if (steady) {
      res.steady = std::move(out);
      res.weights = weights;
      res.gradients = grads;
      res.optimizer_state = oc.state;
      res.master = oc.master;
    } else {
      res.step0 = std::move(out);
    }
  }
  return res;
}

}  // namespace membudget::detail
