// The transformers ops of torch_ops.hpp.
#include "torch_ops.hpp"

#include <algorithm>

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
TensorId TorchOps::rmsnorm(TensorId x, TensorId w, const char* tag, bytes_t width, bytes_t groups) {
  const bytes_t Tw = mul(T, width), Tg = mul(T, groups);
  const bytes_t in_b = sim.info(x).bytes / Tw;  // element bytes of the input
  const bool gemma = m.quirks.norm_weight_offset;
  TensorId hs32 = x;  // .to(float32) of an fp32 tensor is the tensor itself
  if (in_b != 4) {
    hs32 = sim.make(name("rmsnorm fp32 input copy (saved by pow, mul)", "rmsnorm fp32 input copy"), mul(Tw, 4),
                    Term::activations, "x.to(float32)", "fp32", "b·s·h", true);
    sim.node("ToCopyBackward", {x}, {hs32}, {});
  } else {
    sim.hold(hs32);
  }
  TensorId sq = sim.make("rmsnorm pow output", mul(Tw, 4), Term::activations, "pow", "fp32", "b·s·h", true);
  sim.node("PowBackward0", {hs32}, {sq}, {hs32}, mul(Tw, 4));
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
  sim.node("MulBackward0", {hs32, rs}, {n32}, {hs32, rs}, mul(Tw, 4));
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
    sim.node("AddBackward1", {w}, {w1}, {});
    sim.drop(w32);
    TensorId y32 = sim.make(in_b == 4 ? tag : "gemma norm fp32 output", mul(Tw, 4), Term::activations, "hs * (1 + w)",
                            "fp32", "b·s·h", true);
    if (sim.recording()) {
      const bool w1g = grad(w1), n32g = grad(n32);
      sim.node("MulBackward0", {n32, w1}, {y32}, {w1g ? n32 : kNone, n32g ? w1 : kNone}, w1g ? mul(Tw, 4) : 0);
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
    sim.node("MulBackward0", {w, nc}, {y}, {ng ? w : kNone, wg ? nc : kNone}, wg ? mul(Tw, out_b) : 0);
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
// Where it shows: with tied embeddings in bf16 or fp32, lm_head's weight gradient waits in the
// embedding's input buffer through the whole backward, and EmbeddingBackward's V×h gradient
// (embedding_dense_backward_cuda: at::zeros(V, h)) is added as old + new, so three V×h buffers
// coexist at the end of backward. Under autocast the weight cast's ToCopyBackward hands the buffer a
// fresh fp32 tensor, and the embedding's gradient is added to it in place.
TensorId TorchOps::linear(TensorId xin, TensorId w, TensorId bias, bytes_t out, bytes_t ob, const char* name,
                          const char* dtype, const char* shape, bytes_t bwd_ws) {
  constexpr std::uint8_t kLinearViewGrads = 0b011;
  TensorId y = sim.make(name, mul(T, out, ob), Term::activations, "linear output", dtype, shape, true);
  if (sim.recording()) {
    const bool wg = grad(w), xg = grad(xin);
    sim.node("LinearBackward", {xin, w, bias}, {y}, {wg ? xin : kNone, xg ? w : kNone}, xg ? bwd_ws : 0, kLinearViewGrads);
  }
  return y;
}

// apply_rotary_pos_emb: q_embed = (q * cos) + (rotate_half(q) * sin), rotate_half = cat(-x2, x1).
// cos/sin carry the hidden states' dtype, so the products promote to the wider of the two (fp32
// under autocast). mul saves only cos/sin (q's gradient needs cos, not q).
TensorId TorchOps::rotary(TensorId t, TensorId cos, TensorId sin, bytes_t width, bytes_t eb, bytes_t cs_b,
                          const char* tname) {
  const bytes_t rb = std::max(cs_b, eb);
  TensorId a1 = sim.make("rotary q*cos", mul(T, width, rb), Term::activations, "mul", "", "", true);
  sim.node("MulBackward0", {t, cos}, {a1}, {cos});
  TensorId neg = sim.make("rotate_half neg", mul(T, width / 2, eb), Term::activations, "neg", "", "", true);
  sim.node("NegBackward0", {t}, {neg}, {});
  TensorId rh = sim.make("rotate_half cat", mul(T, width, eb), Term::activations, "cat", "", "", true);
  sim.node("CatBackward0", {neg, t}, {rh}, {});
  sim.drop(neg);
  TensorId a2 = sim.make("rotary rot*sin", mul(T, width, rb), Term::activations, "mul", "", "", true);
  sim.node("MulBackward0", {rh, sin}, {a2}, {sin});
  sim.drop(rh);
  const bool partial = m.quirks.partial_rotary;
  TensorId e = sim.make(partial ? "rotary q*cos + rot*sin" : tname, mul(T, width, rb), Term::activations, "add", "",
                        "b·s·n·hd", true);
  sim.node("AddBackward0", {a1, a2}, {e}, {});
  sim.drop(a1);
  sim.drop(a2);
  if (partial) {
    // Phi-3's apply_rotary_pos_emb supports partial rotary: q_embed = torch.cat([q_rot*cos +
    // rotate_half(q_rot)*sin, q_pass], -1) with an empty q_pass. The cat is a copy, and a
    // contiguous one (b·n·s·hd): the rotated tensor keeps qkv_proj's b·s·n·hd layout, cat does not
    // (its output takes the inputs' suggested memory format, which for this permutation is the
    // default contiguous one).
    TensorId ec = sim.make(tname, mul(T, width, rb), Term::activations, "cat (partial rotary)", "", "b·n·s·hd", true);
    sim.node("CatBackward0", {e}, {ec}, {});
    sim.drop(e);
    e = ec;
  }
  return e;
}

TensorId TorchOps::residual_add(TensorId residual, TensorId branch, bytes_t eb, const char* dtype, const char* tname) {
  TensorId out = sim.make(tname, mul(T, m.hidden_size, eb), Term::activations, "residual add", dtype, "b·s·h", true);
  sim.node("AddBackward0", {residual, branch}, {out}, {});
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
