// The transformers ops of torch_ops.hpp.
#include "torch_ops.hpp"

#include <algorithm>
#include <tuple>

namespace membudget::detail {
namespace {

bytes_t mul(bytes_t a, bytes_t b, bytes_t c = 1, bytes_t d = 1) {
  return checked_product("activation size", a, b, c, d);
}

}  // namespace

// LlamaRMSNorm.forward (Qwen2/Qwen3/Mistral/Phi-3 copy it):
//     input_dtype = hidden_states.dtype
//     hidden_states = hidden_states.to(torch.float32)
//     variance = hidden_states.pow(2).mean(-1, keepdim=True)
//     hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
//     return self.weight * hidden_states.to(input_dtype)
// GemmaRMSNorm.forward:
//     output = self._norm(x.float())       # x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
//     output = output * (1.0 + self.weight.float())
//     return output.type_as(x)
// Autograd saves: pow saves its input; rsqrt its result; the normalising mul both factors; the
// weight mul each factor for the other's gradient (w * x promotes to the weight's dtype); Gemma's
// (1 + w) mul saves the fp32 normalised tensor and (1 + w).
//
// The allocation order and lifetimes below are read off allocator snapshots of real training
// forwards (torch.cuda.memory._record_memory_history, stack frames per event):
// tests/data/gaps/qwen2.5-1.5b_bf16_none_flash_adamw_b1s2048.pickle.gz (Qwen2RMSNorm, T = 2048,
// h = 1536; trace events 28-43) shows, per norm: the fp32 copy (12 MiB), pow (12 MiB), mean (8 KiB),
// pow freed, `variance + eps` (8 KiB), rsqrt (8 KiB), `variance + eps` freed, the normalised fp32
// tensor (12 MiB), the bf16 cast and the output (6 MiB each); the fp32 normalised tensor and the
// variance are freed only when the function returns (the free carries the decoder layer's frame),
// after the output exists. tests/data/gaps/gemma-2-2b_bf16_none_flash_adamw_b1s4096.pickle.gz
// (Gemma2RMSNorm, T = 4096, h = 2304; events 65-84) shows `variance + eps` too, with the variance
// freed at once (a temporary inside _norm), and weight.float() (9 KiB) freed after 1 + w. A graph
// does not change which temporaries exist, only which ones autograd keeps: inference_mode allocates
// the same tensors and frees the unsaved ones at the same points (the serving walk's copy, which
// had the `variance + eps` temporary and these lifetimes, agreed; the training copy lacked the
// temporary and freed the variance and the fp32 normalised tensor before the output existed).
TensorId TorchOps::rmsnorm(TensorId x, TensorId w, const char* tag, bytes_t width, bytes_t groups, bytes_t in_bytes) {
  const bytes_t Tw = mul(T, width), Tg = mul(T, groups);
  const bytes_t in_b = in_bytes ? in_bytes : sim.info(x).bytes / Tw;  // element bytes of the input
  const bool gemma = m.quirks.norm_weight_offset;
  // the weight's gradient: the per-token products summed over the tokens (and groups)
  auto weight_staging = [&](bytes_t n) { return reduce_launch(n, Tw / n, false, n); };
  TensorId hs32 = x;  // .to(float32) of an fp32 tensor is the tensor itself
  if (in_b != 4) {
    hs32 = sim.make(name("rmsnorm fp32 input copy (saved by pow, mul)", "rmsnorm fp32 input copy"), mul(Tw, 4),
                    Term::activations, "x.to(float32)", "fp32", "b·s·h", true);
    sim.node("ToCopyBackward", {x}, {hs32}, {});
  } else {
    sim.hold(hs32);
  }
  TensorId sq = sim.make("rmsnorm pow output", mul(Tw, 4), Term::activations, "pow", "fp32", "b·s·h", true);
  // pow_backward: grad * (2 * x.pow(1)): x.pow(1) and 2 * x.pow(1) are both alive while the
  // gradient is made (the C++ full expression's temporaries), freed after it in reverse order
  sim.node("PowBackward0", {hs32}, {sq}, {hs32}, mul(Tw, 8));
  sim.split_last_workspace(2);
  TensorId var = sim.make("rmsnorm variance", mul(Tg, 4), Term::activations, "mean", "fp32", "b·s", true);
  sim.node("MeanBackward1", {sq}, {var}, {});
  sim.drop(sq);
  // variance + eps: a temporary that rsqrt consumes. Its AddBackward1 hands the gradient through
  // without allocating, so the graph records rsqrt straight from the variance.
  TensorId ve = sim.make("rmsnorm variance + eps", mul(Tg, 4), Term::activations, "add", "fp32", "b·s", false);
  if (gemma) sim.drop(var);  // Gemma: the mean is a temporary of the expression
  TensorId rs = sim.make(name("rmsnorm rsqrt (saved)", "rmsnorm rsqrt"), mul(Tg, 4), Term::activations, "rsqrt", "fp32",
                         "b·s", true);
  sim.node("RsqrtBackward0", {var}, {rs}, {rs});
  sim.drop(ve);
  const bool n32_saved = gemma || in_b == 4;
  TensorId n32 = sim.make(n32_saved ? name("rmsnorm normalized (saved by weight mul)", "rmsnorm normalized")
                                    : "rmsnorm normalized fp32",
                          mul(Tw, 4), Term::activations, "hs * rsqrt", "fp32", "b·s·h", true);
  // MulBackward0 computes other's gradient first (here rsqrt's: the full product, reduced over the
  // width once the node returns), then self's; see reduce_last_gradient
  sim.node("MulBackward0", {rs, hs32}, {n32}, {hs32, rs}, mul(Tw, 4));
  sim.reduce_last_gradient(0, true, reduce_launch(Tg, width / groups, true));
  sim.drop(hs32);
  sim.drop(rs);
  if (gemma) {
    // self.weight.float(): a copy unless the weight is fp32 (outside the graph here: the weight's
    // gradient is recorded straight from 1 + w).
    TensorId w32 = norm_weight == 4 ? kNone
                                    : sim.make("gemma norm weight.float()", mul(width, 4), Term::activations, "float",
                                               "fp32", "h", false);
    TensorId w1 = sim.make(name("gemma norm (1 + w) (saved)", "gemma norm (1 + w)"), mul(width, 4), Term::activations,
                           "1.0 + w.float()", "fp32", "h", true);
    sim.pass_through_node("AddBackward1", {w}, w1);
    sim.drop(w32);
    TensorId y32 = sim.make(in_b == 4 ? tag : "gemma norm fp32 output", mul(Tw, 4), Term::activations, "hs * (1 + w)",
                            "fp32", "b·s·h", true);
    if (sim.recording()) {
      const bool w1g = grad(w1), n32g = grad(n32);
      sim.node("MulBackward0", {w1, n32}, {y32}, {w1g ? n32 : kNone, n32g ? w1 : kNone}, w1g ? mul(Tw, 4) : 0);
      sim.reduce_last_gradient(0, true, weight_staging(width / groups));
    }
    sim.drop(w1);
    sim.drop(n32);
    if (in_b == 4) return y32;  // type_as(x) of an fp32 tensor is the tensor itself
    TensorId y = sim.make(tag, mul(Tw, in_b), Term::activations, "type_as(x)", "", "b·s·h", true);
    sim.node("ToCopyBackward", {y32}, {y}, {});
    sim.drop(y32);
    return y;
  }
  TensorId nc = n32;  // .to(input_dtype) of an fp32 tensor is the tensor itself
  if (in_b != 4) {
    nc = sim.make(name("rmsnorm normalized (saved by weight mul)", "rmsnorm normalized cast"), mul(Tw, in_b),
                  Term::activations, "to(input_dtype)", "", "b·s·h", true);
    sim.node("ToCopyBackward", {n32}, {nc}, {});
  } else {
    sim.hold(nc);
  }
  const bytes_t out_b = std::max<bytes_t>(in_b, norm_weight);  // weight * x promotes
  TensorId y = sim.make(tag, mul(Tw, out_b), Term::activations, "weight * hs", "", "b·s·h", true);
  // MulBackward0 keeps each factor only for the other's gradient; a frozen weight (LoRA) needs no
  // normalised input and no per-token product to sum into its gradient.
  if (sim.recording()) {
    const bool wg = grad(w), ng = grad(nc);
    // other's (the normalized input's) gradient first, then the weight's full product, summed over
    // the tokens after the node returns (tests/data/handthrough_snapshots/qwen2.5-7b_bf16_full_flash_adamw_b2s4096.pickle.gz,
    // events 3597-3607: 56 MiB, 56 MiB, the 7 KiB gradient, its 133 MiB staging, the product freed)
    sim.node("MulBackward0", {nc, w}, {y}, {ng ? w : kNone, wg ? nc : kNone}, wg ? mul(Tw, out_b) : 0);
    sim.reduce_last_gradient(1, true, weight_staging(width / groups));
    if (out_b != in_b) sim.promote_last_gradient(0, mul(Tw, out_b));  // a 16-bit input times an fp32 weight
  }
  sim.drop(nc);
  sim.drop(n32);  // the function returns: hidden_states and variance go
  sim.drop(var);
  return y;
}

// Linear saves its input and weight (aten::linear → mm; addmm with a bias), each only for the
// other's gradient. Both gradients come back as views (see AutogradSim::node): the weight's is
// mm_mat2_backward's transpose (W^T is column-major) transposed again by TBackward0, the input's is
// ViewBackward0's reshape of the 2-D mm over the flattened tokens (matmul's fold, or
// _flatten_nd_linear with a bias). A second contribution to such a gradient is summed out of place.
// A 2-D input (the MoE blocks flatten the tokens first) gets the mm's result itself, into which a
// later contribution is summed in place (Qwen1.5-MoE's whole-run snapshot in
// tests/data/inprocess_alone/, events 1487-1511: the experts' 32 MiB contribution freed after it is
// added to the shared expert's and the gates').
// Where it shows: with tied embeddings in bf16 or fp32, lm_head's weight gradient waits in the
// embedding's input buffer through the whole backward, and EmbeddingBackward's V×h gradient
// (embedding_dense_backward_cuda: at::zeros(V, h)) is added as old + new, so three V×h buffers
// coexist at the end of backward. Under autocast the weight cast's ToCopyBackward hands the buffer a
// fresh fp32 tensor, and the embedding's gradient is added to it in place.
TensorId TorchOps::linear(TensorId xin, TensorId w, TensorId bias, bytes_t out, bytes_t ob, const char* name,
                          const char* dtype, const char* shape, bool flat_input) {
  TensorId y = sim.make(name, mul(T, out, ob), Term::activations, "linear output", dtype, shape, true);
  if (sim.recording()) {
    const bool wg = grad(w), xg = grad(xin);
    // inputs in the order autograd computes their gradients: the weight's first (MmBackward0's
    // mat2 before its self, as the snapshots show: lm_head's V×h gradient, then the autograd
    // thread's cuBLAS workspace at step 0, then the input's)
    if (bias == kNone) {
      sim.node("LinearBackward", {w, xin}, {y}, {wg ? xin : kNone, xg ? w : kNone}, 0, flat_input ? 0b01 : 0b11);
    } else {
      // with a bias, aten::linear is addmm: AddmmBackward0 computes the input's gradient, then the
      // weight's, and the bias's is the incoming gradient summed over the tokens after it returns
      // (the Qwen2.5 7B snapshot above: 56 MiB, 3.5 MiB, then k_proj's 1 KiB bias gradient and its
      // 32 MiB staging)
      sim.node("LinearBackward", {xin, w, bias}, {y}, {wg ? xin : kNone, xg ? w : kNone}, 0, flat_input ? 0b10 : 0b11);
      sim.reduce_last_gradient(2, false, reduce_launch(out, T, false, out));
    }
  }
  return y;
}

// apply_rotary_pos_emb: q_embed = (q * cos) + (rotate_half(q) * sin), rotate_half = cat(-x2, x1).
// cos/sin carry the hidden states' dtype, so the products promote to the wider of the two (fp32
// under autocast). mul saves only cos/sin (q's gradient needs cos, not q).
// Phi-3's apply_rotary_pos_emb supports partial rotary: q_rot, q_pass = q[..., :rotary_dim],
// q[..., rotary_dim:] (and k's alike, before either is rotated), then q_embed = torch.cat([q_rot*cos +
// rotate_half(q_rot)*sin, q_pass], -1). Its rotary_dim is the head's: q_rot is q itself (Python
// indexing returns the tensor for a slice of the whole dimension, no node) and q_pass is empty, a
// slice whose SliceBackward0 makes a zeroed gradient of q's size for the empty narrow the cat hands
// it. Made before the products, it runs after both rotaries' backward (Phi-3 mini's whole-run
// snapshot, tests/data/eager_alone/: k's and q's rotary backward, then one q-sized gradient each,
// summed in place into the rotary's). Returns {x_rot, x_pass}.
std::pair<TensorId, TensorId> TorchOps::partial_rotary_slices(TensorId t) {
  TensorId pass = view("partial rotary x[..., rotary_dim:] (empty slice view)", 0);
  sim.node("SliceBackward0", {t}, {pass}, {});
  return {t, pass};
}

TensorId TorchOps::rotary(TensorId t, TensorId cos, TensorId sin, bytes_t width, bytes_t eb, bytes_t cs_b,
                          const char* tname, TensorId pass) {
  const bytes_t rb = std::max(cs_b, eb);
  const bool partial = m.quirks.partial_rotary;
  if (partial && pass == kNone) std::tie(t, pass) = partial_rotary_slices(t);
  // Promoted (a 16-bit q times fp32 cos/sin under autocast), each product's backward computes the
  // gradient in fp32 and autograd casts it to q's dtype (the Llama 3.2 1B amp-bf16 snapshot, events
  // 2147-2150: 4 MiB, 2 MiB, 4 MiB freed): promote_last_gradient.
  auto promote = [&] {
    if (rb != eb) sim.promote_last_gradient(0, mul(T, width, rb));
  };
  TensorId a1 = sim.make("rotary q*cos", mul(T, width, rb), Term::activations, "mul", "", "", true);
  sim.node("MulBackward0", {t, cos}, {a1}, {cos});
  promote();
  // rotate_half: x1 = x[..., :d/2], x2 = x[..., d/2:] (views; each SliceBackward0 makes a
  // full-size zeroed gradient), cat((-x2, x1)), whose CatBackward0 hands each input a narrow of its
  // gradient. Backward thus runs rot*sin's product, neg's, then x2's and x1's full-size slices
  // (tests/data/reserved_alone/llama-3.2-1b_bf16_none_flash_adamw_for-loop_b1s512.pickle.gz, events
  // 2031-2045: 2 MiB, 1 MiB, 2 MiB, the 1 MiB freed, 2 MiB, then the product freed).
  TensorId x1 = view("rotate_half x1 (slice view)", mul(T, width / 2, eb));
  sim.node("SliceBackward0", {t}, {x1}, {});
  TensorId x2 = view("rotate_half x2 (slice view)", mul(T, width / 2, eb));
  sim.node("SliceBackward0", {t}, {x2}, {});
  TensorId neg = sim.make("rotate_half neg", mul(T, width / 2, eb), Term::activations, "neg", "", "", true);
  sim.node("NegBackward0", {x2}, {neg}, {});
  sim.drop(x2);
  TensorId rh = sim.make("rotate_half cat", mul(T, width, eb), Term::activations, "cat", "", "", true);
  sim.views_through_node("CatBackward0", {neg, x1}, rh);
  sim.drop(neg);
  sim.drop(x1);
  TensorId a2 = sim.make("rotary rot*sin", mul(T, width, rb), Term::activations, "mul", "", "", true);
  sim.node("MulBackward0", {rh, sin}, {a2}, {sin});
  promote();
  sim.drop(rh);
  TensorId e = sim.make(partial ? "rotary q*cos + rot*sin" : tname, mul(T, width, rb), Term::activations, "add", "",
                        "b·s·n·hd", true);
  sim.pass_through_node("AddBackward0", {a1, a2}, e);
  sim.drop(a1);
  sim.drop(a2);
  if (partial) {
    // The cat is a copy, and a contiguous one (b·n·s·hd): the rotated tensor keeps qkv_proj's
    // b·s·n·hd layout, cat does not (its output takes the inputs' suggested memory format, which
    // for this permutation is the default contiguous one). Its backward hands each input a narrow;
    // the pass slice's is cast to its own tensor where the rotated half was promoted (under
    // autocast: Phi-3 mini amp-bf16's snapshots in tests/data/phi3_heldout/, the cat's fp32
    // gradient freed once the rotated half's backward has run, before the pass slice's).
    TensorId ec = sim.make(tname, mul(T, width, rb), Term::activations, "cat (partial rotary)", "", "b·n·s·hd", true);
    sim.views_through_node("CatBackward0", {e, pass}, ec, rb != eb ? 0b10 : 0);
    sim.drop(e);
    sim.drop(pass);
    e = ec;
  }
  return e;
}

TensorId TorchOps::residual_add(TensorId residual, TensorId branch, bytes_t eb, const char* dtype, const char* tname) {
  TensorId out = sim.make(tname, mul(T, m.hidden_size, eb), Term::activations, "residual add", dtype, "b·s·h", true);
  sim.pass_through_node("AddBackward0", {residual, branch}, out);
  return out;
}

TensorId TorchOps::close_block(TensorId residual, TensorId branch, TensorId norm_w, const char* norm_tag, bytes_t eb,
                               const char* dtype, const char* tname) {
  if (m.norms_per_layer >= 4) {
    TensorId normed = rmsnorm(branch, norm_w, norm_tag, m.hidden_size);
    sim.drop(branch);
    branch = normed;
  }
  TensorId out = residual_add(residual, branch, eb, dtype, tname);
  sim.drop(branch);
  return out;
}

}  // namespace membudget::detail

namespace membudget::detail {

TensorId TorchOps::view(const char* name, bytes_t grad_bytes) { return sim.view_of(kNone, name, grad_bytes, ""); }

// Qwen3MoeTopKRouter.forward (Qwen2-MoE and OLMoE copy it; MixtralTopKRouter differs where noted):
//     router_logits = F.linear(hidden_states, self.weight)
//     router_probs = softmax(router_logits, dtype=torch.float)        # Mixtral: softmax(logits.float())
//     router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
//     if self.norm_topk_prob: router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
//     router_top_value = router_top_value.to(router_logits.dtype)    # Mixtral: stays fp32
// Read off the allocator snapshot of Qwen3-30B-A3B's forward
// (tests/data/moe_snapshots/qwen3-30b-a3b_L2_bf16_none_flash_adamw_b1s1024_snapshot-forward.pickle.gz,
// events 146-157): the logits, their fp32 copy (freed after softmax), the probabilities (kept by
// SoftmaxBackward), the top-k values and int64 indices (kept by TopkBackward), the sum, and for the
// in-place division a copy of the same size as the values (autograd keeps the original for the
// divisor's gradient; here the values before `/=` are what the node saves, the same bytes), then
// the cast, which frees the divided values.
TensorId TorchOps::softmax_fp32(TensorId logits, bytes_t TE, const char* what_saved, const char* what) {
  TensorId l32 = logits;
  if (sim.info(logits).bytes != mul(TE, 4)) {
    l32 = sim.make("router logits fp32 copy", mul(TE, 4), Term::activations, "to(float32)", "fp32", "b·s·E", true);
    sim.node("ToCopyBackward0", {logits}, {l32}, {});
  } else {
    sim.hold(l32);
  }
  TensorId probs = sim.make(name(what_saved, what), mul(TE, 4), Term::activations, "softmax", "fp32", "b·s·E", true);
  // Its backward makes the gradient, then a second T × E fp32 buffer, freed within the node (the
  // whole-run snapshots of OLMoE's, Qwen3-30B-A3B's and Qwen1.5-MoE's steps in
  // tests/data/inprocess_alone/ and reserved_alone/: 1, 2 and 1.9 MiB each)
  sim.node("SoftmaxBackward0", {l32}, {probs}, {probs}, mul(TE, 4));
  sim.workspace_before_gradient(1);  // past its one input: after the gradient
  sim.drop(l32);
  return probs;
}

TensorId TorchOps::fp32_gate(TensorId x, TensorId w, bytes_t wb, bytes_t in, bytes_t out, const char* tensor_name) {
  TensorId x32 = x, w32 = w;
  if (sim.info(x).bytes != mul(T, in, 4)) {
    x32 = sim.make(name("router gate input in fp32 (saved by the gate)", "router gate input in fp32"), mul(T, in, 4),
                   Term::activations, "type(float32)", "fp32", "b·s·h", true);
    sim.node("ToCopyBackward0", {x}, {x32}, {});
  } else {
    sim.hold(x32);
  }
  if (wb != 4) {
    w32 = sim.make(name("router gate weight in fp32 (saved by the gate)", "router gate weight in fp32"), mul(out, in, 4),
                   Term::activations, "type(float32)", "fp32", "E·h", true);
    sim.node("ToCopyBackward0", {w}, {w32}, {});
  }
  TensorId y = linear(x32, w32, kNone, out, 4, tensor_name, "fp32", "b·s·E");
  sim.drop(x32);
  if (w32 != w) sim.drop(w32);
  return y;
}

TensorId TorchOps::add_outputs(TensorId a, TensorId b, const char* what, const char* dtype) {
  const bytes_t Th = mul(T, m.hidden_size);
  const bytes_t ob = std::max(sim.info(a).bytes, sim.info(b).bytes) / Th;
  TensorId sum = sim.make(what, mul(Th, ob), Term::activations, "add", dtype, "b·s·h", true);
  sim.pass_through_node("AddBackward0", {a, b}, sum);
  sim.drop(a);
  sim.drop(b);
  return sum;
}

TensorId TorchOps::route(TensorId logits, TensorId* indices) {
  const bytes_t E = m.moe.experts, k = m.moe.top_k;
  const bytes_t TE = checked_product("activation size", T, E), Tk = checked_product("activation size", T, k);
  TensorId probs = softmax_fp32(logits, TE, "router probabilities (saved by softmax)", "router probabilities");
  TensorId top = sim.make("router top-k weights", mul(Tk, 4), Term::activations, "topk", "fp32", "b·s·k", true);
  *indices = sim.make(name("router top-k indices (saved by topk)", "router top-k indices"), mul(Tk, 8),
                      Term::activations, "topk", "int64", "b·s·k", false);
  sim.node("TopkBackward0", {probs}, {top}, {*indices});
  sim.drop(probs);
  if (m.moe.normalize_top_k) {
    TensorId sum = sim.make(name("router top-k sum (saved by div)", "router top-k sum"), mul(T, 4), Term::activations,
                            "sum", "fp32", "b·s·1", true);
    sim.node("SumBackward1", {top}, {sum}, {});
    TensorId div = sim.make(name("router top-k weights before /= (saved by div)", "router top-k weights / sum"),
                            mul(Tk, 4), Term::activations, "div_", "fp32", "b·s·k", true);
    sim.node("DivBackward0", {top, sum}, {div}, {top, sum});
    sim.drop(sum);
    sim.drop(top);
    top = div;
  }
  if (m.moe.weights_fp32) return top;
  const bytes_t lb = sim.info(logits).bytes / TE;
  TensorId w = sim.make("router weights in the logits' dtype", mul(Tk, lb), Term::activations, "to(dtype)", "",
                        "b·s·k", true);
  sim.node("ToCopyBackward0", {top}, {w}, {});
  sim.drop(top);
  return w;
}

// _default_apply_gate (integrations/moe.py): gate, up = gate_up_out.chunk(2, dim=-1) are views of
// the gate_up output, which the act and the mul keep alive; their gradients come back through
// SplitBackward0 as one rows × 2I buffer (the grouped_mm backward snapshot: two S × I gradients,
// then their S × 2I concatenation).
TensorId TorchOps::apply_gate(TensorId gu, bytes_t rows, bytes_t wb, const char* what_act, const char* what_prod,
                              const char* shape) {
  const bytes_t I = m.moe.expert_ff;
  TensorId gate = view("experts: gate view", mul(rows, I, wb)), up = view("experts: up view", mul(rows, I, wb));
  sim.node("SplitBackward0", {gu}, {gate, up}, {});
  const bool gelu = m.mlp == MlpKind::gated_gelu;
  TensorId act = sim.make(name(what_act, "experts: act(gate)"), mul(rows, I, wb), Term::activations, gelu ? "gelu_tanh" : "silu",
                          "", shape, true);
  sim.node(gelu ? "GeluBackward0" : "SiluBackward0", {gate}, {act}, {gu});
  TensorId prod = sim.make(name(what_prod, "experts: act*up"), mul(rows, I, wb), Term::activations, "mul", "", shape, true);
  sim.node("MulBackward0", {up, act}, {prod}, {act, gu});  // act(gate) * up: up's gradient first (MulBackward0's other)
  sim.drop(act);
  sim.drop(gate);
  sim.drop(up);
  return prod;
}

// DeepseekV2TopkRouter.forward after router_logits = F.linear(x.float(), weight.float()):
//     scores = router_logits.softmax(dim=-1, dtype=torch.float32)        # saved by softmax
//     greedy:               topk_weights, topk_indices = torch.topk(scores, k, sorted=False)
//     group_limited_greedy: group_scores = scores.view(-1, G, E // G).max(dim=-1).values
//                           group_idx = torch.topk(group_scores, k=topk_group)[1]
//                           group_mask = zeros_like(group_scores).scatter_(1, group_idx, 1)
//                           score_mask = group_mask.unsqueeze(-1).expand(...).reshape(-1, E)
//                           scores = scores.masked_fill(~score_mask.bool(), 0.0)
//                           topk_weights, topk_indices = torch.topk(scores, k, sorted=False)
//     topk_weights = topk_weights * self.routed_scaling_factor           # fp32, not cast back
// The group scores only choose a mask: no gradient flows through them, so nothing of theirs is
// kept for backward (their graph dies with them).
TensorId TorchOps::route_deepseek_v2(TensorId logits, TensorId* indices) {
  const bytes_t E = m.moe.experts, k = m.moe.top_k, G = m.moe.groups;
  const bytes_t TE = checked_product("activation size", T, E), Tk = checked_product("activation size", T, k);
  TensorId scores = softmax_fp32(logits, TE, "router scores (saved by softmax)", "router scores");
  if (m.moe.group_limited) {
    const bytes_t TG = checked_product("activation size", T, G);
    TensorId gs = sim.make("router group scores", mul(TG, 4), Term::activations, "max", "fp32", "b·s·G", false);
    sim.transient("router group max indices", mul(TG, 8));
    TensorId gi = sim.make("router top groups", mul(T, m.moe.group_top_k, 8), Term::activations, "topk", "int64", "b·s·g", false);
    sim.transient("router top group scores", mul(T, m.moe.group_top_k, 4));
    TensorId gm = sim.make("router group mask", mul(TG, 4), Term::activations, "zeros_like", "fp32", "b·s·G", false);
    TensorId sm = sim.make("router score mask", mul(TE, 4), Term::activations, "expand + reshape", "fp32", "b·s·E", false);
    TensorId smb = sim.make("router score mask (bool)", TE, Term::activations, "bool", "bool", "b·s·E", false);
    TensorId inv = sim.make(name("router score mask inverted (saved by masked_fill)", "router score mask inverted"), TE,
                            Term::activations, "bitwise_not", "bool", "b·s·E", false);
    sim.drop(smb);
    TensorId masked = sim.make("router scores outside the top groups zeroed", mul(TE, 4), Term::activations,
                               "masked_fill", "fp32", "b·s·E", true);
    sim.node("MaskedFillBackward0", {scores}, {masked}, {inv});
    sim.drop(inv);
    for (TensorId t : {gs, gi, gm, sm}) sim.drop(t);  // the router's locals (dropped at return; kept no longer)
    sim.drop(scores);  // `scores` rebound
    scores = masked;
  }
  TensorId top = sim.make("router top-k weights", mul(Tk, 4), Term::activations, "topk", "fp32", "b·s·k", true);
  *indices = sim.make(name("router top-k indices (saved by topk)", "router top-k indices"), mul(Tk, 8),
                      Term::activations, "topk", "int64", "b·s·k", false);
  sim.node("TopkBackward0", {scores}, {top}, {*indices});
  sim.drop(scores);
  TensorId w = sim.make("router weights × routed_scaling_factor", mul(Tk, 4), Term::activations, "mul", "fp32", "b·s·k", true);
  sim.node("MulBackward1", {top}, {w}, {});
  sim.drop(top);
  return w;
}

// DeepseekV3TopkRouter.forward after router_logits = F.linear(x.float(), weight.float()):
//     scores = router_logits.sigmoid()                                   # saved by sigmoid
//     scores_for_choice = scores + self.e_score_correction_bias
//     group_scores = scores_for_choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
//     group_idx = torch.topk(group_scores, k=topk_group, sorted=False)[1]
//     group_mask = zeros_like(group_scores).scatter_(1, group_idx, 1); score_mask = expand + reshape
//     scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), -inf)
//     topk_indices = torch.topk(scores_for_choice, k=top_k, sorted=False)[1]
//     topk_weights = scores.gather(1, topk_indices)                      # saved: the indices
//     if norm_topk_prob: topk_weights /= topk_weights.sum(dim=-1, keepdim=True) + 1e-20
//     topk_weights = topk_weights * self.routed_scaling_factor
// scores_for_choice only picks indices: no gradient flows through it, so none of its chain is kept.
TensorId TorchOps::route_deepseek_v3(TensorId logits, TensorId* indices) {
  const bytes_t E = m.moe.experts, k = m.moe.top_k, G = std::max<bytes_t>(1, m.moe.groups);
  const bytes_t TE = checked_product("activation size", T, E), Tk = checked_product("activation size", T, k);
  const bytes_t TG = checked_product("activation size", T, G), tg = std::max<bytes_t>(1, m.moe.group_top_k);
  const bytes_t lb = sim.info(logits).bytes / TE;
  TensorId scores = sim.make(name("router scores (saved by sigmoid)", "router scores"), mul(TE, lb), Term::activations, "sigmoid",
                             "", "b·s·E", true);
  sim.node("SigmoidBackward0", {logits}, {scores}, {scores});
  TensorId choice = sim.make("router scores + correction bias", mul(TE, std::max<bytes_t>(lb, 4)), Term::activations, "add",
                             "fp32", "b·s·E", false);
  sim.transient("router group top-2 values and indices", mul(TG, 2, 4) + mul(TG, 2, 8));
  TensorId gs = sim.make("router group scores", mul(TG, 4), Term::activations, "sum", "fp32", "b·s·G", false);
  sim.transient("router top group scores", mul(T, tg, 4));
  TensorId gi = sim.make("router top groups", mul(T, tg, 8), Term::activations, "topk", "int64", "b·s·g", false);
  TensorId gm = sim.make("router group mask", mul(TG, 4), Term::activations, "zeros_like", "fp32", "b·s·G", false);
  TensorId sm = sim.make("router score mask", mul(TE, 4), Term::activations, "expand + reshape", "fp32", "b·s·E", false);
  TensorId smb = sim.make("router score mask (bool)", TE, Term::activations, "bool", "bool", "b·s·E", false);
  TensorId inv = sim.make("router score mask inverted", TE, Term::activations, "bitwise_not", "bool", "b·s·E", false);
  sim.drop(smb);
  TensorId masked = sim.make("router scores for choice, masked", mul(TE, 4), Term::activations, "masked_fill", "fp32", "b·s·E",
                             false);
  sim.drop(inv);
  sim.drop(choice);  // scores_for_choice rebound
  sim.transient("router top-k values (unused)", mul(Tk, 4));
  *indices = sim.make(name("router top-k indices (saved by gather)", "router top-k indices"), mul(Tk, 8), Term::activations,
                      "topk", "int64", "b·s·k", false);
  TensorId w = sim.make("router weights (gathered scores)", mul(Tk, lb), Term::activations, "gather", "", "b·s·k", true);
  sim.node("GatherBackward0", {scores}, {w}, {*indices});
  for (TensorId t : {gs, gi, gm, sm, masked}) sim.drop(t);
  sim.drop(scores);
  if (m.moe.normalize_top_k) {
    TensorId sum = sim.make("router top-k sum", mul(T, lb), Term::activations, "sum", "", "b·s·1", true);
    sim.node("SumBackward1", {w}, {sum}, {});
    TensorId den = sim.make(name("router top-k denominator (saved by div)", "router top-k denominator"), mul(T, lb),
                            Term::activations, "add", "", "b·s·1", true);
    sim.pass_through_node("AddBackward1", {sum}, den);
    sim.drop(sum);
    TensorId div = sim.make(name("router top-k weights before /= (saved by div)", "router top-k weights / sum"), mul(Tk, lb),
                            Term::activations, "div_", "", "b·s·k", true);
    sim.node("DivBackward0", {w, den}, {div}, {w, den});
    sim.drop(den);
    sim.drop(w);
    w = div;
  }
  TensorId scaled = sim.make("router weights × routed_scaling_factor", mul(Tk, lb), Term::activations, "mul", "", "b·s·k", true);
  sim.node("MulBackward1", {w}, {scaled}, {});
  sim.drop(w);
  return scaled;
}

// EpRouterParallel.transform_output_post_forward (transformers 5.17, distributed/tensor_parallel.py),
// the ep_router of a model's base_model_ep_plan, on the router's outputs with n = E / ep local experts:
//     router_scores = _AllReduceBackward.apply(router_scores, group)  # identity forward: no copy
//     non_local_mask = (router_indices // n) != ep_rank               # T·k int64, then T·k bool
//     router_scores = router_scores.masked_fill(non_local_mask, 0.0)  # saves the mask
//     router_indices = router_indices.masked_fill(non_local_mask, -1)
//     if n > 1: router_indices = torch.fmod(router_indices, n)
//     else:     router_indices = router_indices.masked_fill(router_indices > 0, 0).masked_fill(router_indices < 0, -1)
//     router_indices = router_indices.masked_fill(router_indices == -1, n)
// Every buffer is T·k: the routing changes no size. The experts then run with n experts (their
// offsets n int32), the sentinel pairs masked, and moe_tp_experts all-reduces their output in place.
TensorId TorchOps::expert_parallel_routing(TensorId* weights) {
  const bytes_t Tk = checked_product("activation size", T, m.moe.top_k);
  const bytes_t wb = sim.info(*weights).bytes / Tk;
  TensorId owner = sim.make("ep_router: owning rank (indices // local experts)", mul(Tk, 8), Term::activations, "floor_divide",
                            "int64", "b·s·k", false);
  TensorId mask = sim.make(name("ep_router: non-local mask (saved by masked_fill)", "ep_router: non-local mask"), Tk,
                           Term::activations, "ne", "bool", "b·s·k", false);
  sim.drop(owner);
  TensorId masked = sim.make("ep_router: routing weights of this rank's experts", mul(Tk, wb), Term::activations, "masked_fill",
                             "", "b·s·k", true);
  sim.node("MaskedFillBackward0", {*weights}, {masked}, {mask});
  TensorId local = sim.make("ep_router: indices, non-local -1", mul(Tk, 8), Term::activations, "masked_fill", "int64", "b·s·k", false);
  auto rebind = [&](const char* what, const char* op) {
    TensorId next = sim.make(what, mul(Tk, 8), Term::activations, op, "int64", "b·s·k", false);
    sim.drop(local);
    local = next;
  };
  auto with_bool = [&](const char* cond, const char* what) {
    TensorId b = sim.make(cond, Tk, Term::activations, "compare", "bool", "b·s·k", false);
    rebind(what, "masked_fill");
    sim.drop(b);
  };
  if (m.moe.local_experts() > 1) {
    rebind("ep_router: indices mod local experts", "fmod");
  } else {
    with_bool("ep_router: indices > 0", "ep_router: indices, positive to 0");
    with_bool("ep_router: indices < 0", "ep_router: indices, negative to -1");
  }
  with_bool("ep_router: indices == -1", "ep_router: local indices, sentinel for other ranks'");
  // the hook returns: its locals go (the masked_fill keeps the mask), and the router's own
  // scores with the `output` tuple that held them (nothing saved them)
  sim.drop(mask);
  sim.drop(*weights);
  *weights = masked;
  return local;
}

// grouped_mm_experts_forward (transformers 5.17, integrations/moe.py), S = T·k token-expert pairs:
//     expert_ids_g, perm = torch.sort(expert_ids)                   # int64 S each
//     selected_hidden_states_g = hidden_states[perm // num_top_k]   # S × h, saved by grouped_mm
//     sample_weights_g = sample_weights[perm]                       # S, saved by the weighting mul
//     histc_input = expert_ids_g.int(); tokens_per_expert = torch.histc(...); offsets = cumsum(...)
//     sentinel_mask = (expert_ids_g >= num_experts).unsqueeze(-1)   # S bool, saved by masked_fill
//     selected_hidden_states_g.masked_fill_(sentinel_mask, 0.0)
//     proj_out = grouped_mm(selected, gate_up_proj.T, offsets).masked_fill(sentinel_mask, 0.0)
//     proj_out = act_fn(gate) * up                                  # gate, up = proj_out.chunk(2)
//     proj_out = grouped_mm(proj_out, down_proj.T, offsets).masked_fill(sentinel_mask, 0.0)
//     weighted_out = proj_out * sample_weights_g.unsqueeze(-1)
//     inv_perm = torch.empty_like(perm); inv_perm[perm] = torch.arange(S)
//     weighted_out = weighted_out[inv_perm]
//     return weighted_out.view(T, k, h).sum(dim=1).to(hidden_states.dtype)
// Every size is S·(something): how the router spreads the tokens over the experts changes none of
// them (tokens_per_expert only moves the group boundaries). The forward's order and lifetimes are
// those of the Qwen3-30B-A3B snapshot (events 158-214); its backward
// (..._snapshot-backward.pickle.gz) shows the transients given as workspaces below: each
// IndexBackward0 is new_zeros + index_put_(accumulate=True), the gradient first, then the sort of
// the indices (index_backward below); the incoming gradient of the weighted outputs' gather is
// already contiguous, the S × h copy that reshaping the sum's expanded gradient made (SumBackward1's
// here; the whole-run snapshots of OLMoE's and Qwen3-30B-A3B's full-recompute steps in
// tests/data/inprocess_alone/ and reserved_alone/ show no second copy, 128 and 256 MiB there).
// The weighting mul's gradient for the S weights is an S × h product summed over h; where the
// weights are fp32 and the outputs bf16 (Mixtral, DeepSeek) both products are fp32 and the outputs'
// gradient is a cast of its own (the MulBackward0 below).
TensorId TorchOps::grouped_mm_experts(TensorId x, TensorId weights, TensorId gate_up, TensorId down, bytes_t wb) {
  // E: the experts this rank runs (all of them, or its share under expert parallelism)
  const bytes_t h = m.hidden_size, E = m.moe.local_experts(), I = m.moe.expert_ff;
  const bytes_t S = checked_product("activation size", T, m.moe.top_k);
  const bytes_t xb = sim.info(x).bytes / mul(T, h);        // the block's input dtype
  const bytes_t sb = sim.info(weights).bytes / S;          // the routing weights' dtype
  // IndexBackward0: new_zeros(input) + index_put_(accumulate=True), whose sort of the S indices
  // (index_put_with_sort_kernel) then holds six S-long int64 buffers at its peak, each its own
  // allocation but one of twice the length, freed after (the snapshots above: 0.25 MiB pieces at
  // S = 32,768 after the gradient); six equal pieces after the gradient stand for them.
  auto index_backward = [&](TensorId input, TensorId output, TensorId index) {
    sim.node("IndexBackward0", {input}, {output}, {index}, mul(S, 8, 6));
    sim.workspace_before_gradient(1);  // past its one input: after the gradient
    sim.split_last_workspace(6);
  };
  TensorId ids = sim.make("experts: sorted expert ids", mul(S, 8), Term::activations, "sort", "int64", "S", false);
  TensorId perm = sim.make(name("experts: sort permutation (saved by the weights' gather)", "experts: sort permutation"),
                           mul(S, 8), Term::activations, "sort", "int64", "S", false);
  sim.transient("experts: torch.sort's key copy and temporary storage", mul(S, 8, 2));
  TensorId tok = sim.make(name("experts: token of each pair, perm // k (saved by the gather)", "experts: perm // k"),
                          mul(S, 8), Term::activations, "floor_divide", "int64", "S", false);
  TensorId sel = sim.make(name("experts: gathered inputs (saved by grouped_mm)", "experts: gathered inputs"), mul(S, h, xb),
                          Term::activations, "index", "", "S·h", true);
  index_backward(x, sel, tok);
  sim.drop(tok);
  TensorId sw = sim.make(name("experts: gathered routing weights (saved by the weighting mul)", "experts: gathered routing weights"),
                         mul(S, sb), Term::activations, "index", "", "S", true);
  index_backward(weights, sw, perm);
  TensorId hist_in = sim.make("experts: expert ids as int32 (histc input)", mul(S, 4), Term::activations, "int", "int32", "S", false);
  TensorId counts = sim.make("experts: tokens per expert", mul(E, 4), Term::activations, "histc", "int32", "E", false);
  TensorId offs = sim.make(name("experts: group offsets (saved by grouped_mm)", "experts: group offsets"), mul(E, 4),
                           Term::activations, "cumsum", "int32", "E", false);
  TensorId mask = sim.make(name("experts: sentinel mask (saved by masked_fill)", "experts: sentinel mask"), S,
                           Term::activations, "ge", "bool", "S·1", false);
  // masked_fill_ in place: the gathered inputs are the node's output as well as its input
  TensorId sel_filled = view("experts: gathered inputs after masked_fill_", mul(S, h, xb));
  sim.node("MaskedFillBackward0", {sel}, {sel_filled}, {mask});
  // _grouped_mm: input.to(weight.dtype)
  TensorId in = sel_filled, in_store = sel;
  if (xb != wb) {
    in = in_store = sim.make(name("experts: inputs in the experts' dtype (saved by grouped_mm)", "experts: inputs in the experts' dtype"),
                             mul(S, h, wb), Term::activations, "to(dtype)", "", "S·h", true);
    sim.node("ToCopyBackward0", {sel_filled}, {in}, {});
  }
  TensorId gu = sim.make("experts: gate_up grouped_mm output", mul(S, 2 * I, wb), Term::activations, "grouped_mm", "", "S·2I", true);
  // inputs in the order autograd computes their gradients: the weight's first (the snapshot
  // tests/data/moe_snapshots/qwen3-30b-a3b_L2_..._b1s1024_snapshot-backward: down_proj's 384 MiB
  // gradient before the 12 MiB input gradient, gate_up's 768 MiB before 32 MiB), as for a linear
  sim.node("GroupedMmBackward0", {gate_up, in}, {gu}, {in_store, gate_up, offs});
  if (in != sel_filled) sim.drop(in);
  TensorId gum = sim.make(name("experts: gate_up output, masked (saved by act and mul)", "experts: gate_up output, masked"),
                          mul(S, 2 * I, wb), Term::activations, "masked_fill", "", "S·2I", true);
  sim.node("MaskedFillBackward0", {gu}, {gum}, {mask});
  sim.drop(gu);
  TensorId prod = apply_gate(gum, S, wb, "experts: act(gate) (saved by mul)", "experts: act*up (saved by grouped_mm)", "S·I");
  sim.drop(gum);
  TensorId dn = sim.make("experts: down grouped_mm output", mul(S, h, wb), Term::activations, "grouped_mm", "", "S·h", true);
  sim.node("GroupedMmBackward0", {down, prod}, {dn}, {prod, down, offs});
  sim.drop(prod);
  TensorId dnm = sim.make(name("experts: down output, masked (saved by the weighting mul)", "experts: down output, masked"),
                          mul(S, h, wb), Term::activations, "masked_fill", "", "S·h", true);
  sim.node("MaskedFillBackward0", {dn}, {dnm}, {mask});
  sim.drop(dn);
  const bytes_t ob = std::max(wb, sb);  // type promotion of the product
  TensorId wo = sim.make("experts: weighted outputs", mul(S, h, ob), Term::activations, "mul", "", "S·h", true);
  // MulBackward0, the second factor first: the weights' gradient is an S × h product reduced over
  // h (validate_outputs, after the node), the outputs' is the other product, cast to their dtype
  // after the node where it is wider (fp32 weights: DeepSeek-V3's whole-run snapshot,
  // tests/data/moe_snapshots/deepseek-v3_..._run, events 1435-1446: both fp32 products, then the
  // saved outputs freed, the bf16 cast, the products freed last first)
  sim.node("MulBackward0", {sw, dnm}, {wo}, {dnm, sw}, mul(S, h, ob));
  sim.reduce_last_gradient(0, true, reduce_launch(S, h, true));
  if (ob != wb) sim.promote_last_gradient(1, mul(S, h, ob));
  TensorId inv = sim.make(name("experts: inverse permutation (saved by the gather)", "experts: inverse permutation"),
                          mul(S, 8), Term::activations, "empty_like", "int64", "S", false);
  sim.transient("experts: arange for the inverse permutation", mul(S, 8));
  TensorId wp = sim.make("experts: weighted outputs in token order", mul(S, h, ob), Term::activations, "index", "", "S·h", true);
  index_backward(wo, wp, inv);
  sim.drop(wo);  // weighted_out is rebound
  TensorId out = sim.make("experts: output (sum over the top k)", mul(T, h, ob), Term::activations, "sum", "", "b·s·h", true);
  sim.node("SumBackward1", {wp}, {out}, {});
  TensorId wide = kNone;  // the sum in the weights' wider dtype, a local until the function returns
  if (ob != xb) {
    TensorId cast = sim.make("experts: output in the input's dtype", mul(T, h, xb), Term::activations, "to(dtype)", "",
                             "b·s·h", true);
    sim.node("ToCopyBackward0", {out}, {cast}, {});
    wide = out;
    out = cast;
  }
  // the function returns: its locals go (the saved ones stay with their nodes) in the order
  // DeepSeek-V2-Lite's whole-run snapshot frees them (tests/data/heldout_conf/, events 267-278: the
  // gathered inputs before the int32 ids, the token-order outputs before the inverse permutation,
  // the wide sum last). Until then they hold the gathered inputs and weights,
  // the masked down output (the last binding of proj_out) and the inverse permutation: under
  // inference_mode the prefill peaks beside them (the Qwen3 and OLMoE prefills of
  // tests/data/torch_prefill_moe_h200.json were one S × h buffer low without).
  for (TensorId t : {ids, perm, sel, sel_filled, sw, hist_in, counts, offs, mask, dnm, wp, inv, wide}) sim.drop(t);
  return out;
}

TensorId TorchOps::bool_causal_mask(bytes_t s, bool sliding_window) {
  const bytes_t ss = mul(s, s);
  TensorId causal = sim.make("attention mask: causal bool (kv_idx <= q_idx)", ss, Term::activations,
                             "causal_mask_function", "bool", "1·1·s·s", false);
  if (!sliding_window) return causal;
  TensorId first = sim.make("attention mask: True & causal", ss, Term::activations, "and_masks", "bool", "1·1·s·s", false);
  sim.drop(causal);
  TensorId overlay = sim.make("attention mask: sliding_window_overlay bool", ss, Term::activations,
                              "sliding_window_overlay", "bool", "1·1·s·s", false);
  TensorId both = sim.make("sliding-window attention mask (bool)", ss, Term::activations, "and_masks", "bool", "1·1·s·s", false);
  sim.drop(first);
  sim.drop(overlay);
  return both;
}

}  // namespace membudget::detail
