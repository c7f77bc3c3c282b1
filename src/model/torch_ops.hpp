// src/model/torch_ops.hpp: the transformers ops, defined once for training and serving (internal).
//
// What Hugging Face transformers 5.17 (LlamaForCausalLM and its Qwen2 / Qwen3 / Mistral / Gemma /
// Phi-3 relatives) allocates, op by op, on PyTorch 2.11: each op creates its outputs and
// temporaries in the order the Python code runs, drops a tensor when Python drops its last
// reference, and records the autograd node with what it saves for backward. Both drivers of
// AutogradSim call these:
//   - the training inventory (inventory_torch.cpp), with the graph recorded (GradMode::record);
//   - the serving walk (serving.cpp), under torch.inference_mode() (GradMode::off: node() records
//     nothing, so a tensor lives exactly while a Python reference holds it).
// What only one of them does stays with it: autocast's casts, LoRA and checkpointing with training;
// the DynamicCache, the decode step, logits_to_keep=1 and MLA's latent cache with serving.
//
// An op takes its inputs as tensors and reads their element size off them; it never drops its
// inputs (the caller's Python reference does that).
#pragma once

#include "autograd_sim.hpp"
#include "membudget/spec.hpp"

namespace membudget::detail {

struct TorchOps {
  AutogradSim& sim;
  const ModelSpec& m;
  bytes_t T = 0;            // tokens in this forward: batch × new tokens per sequence
  bytes_t norm_weight = 2;  // element bytes of the norm weights (LlamaRMSNorm's weight * x promotes)

  // Whether `t` is part of the graph (kNone, and everything under GradMode::off, is not).
  bool grad(TensorId t) const { return t != kNone && sim.info(t).requires_grad; }
  // A tensor's name: the training inventory's names say which node keeps it; under inference_mode
  // nothing does.
  const char* name(const char* saved, const char* plain) const { return sim.recording() ? saved : plain; }

  // LlamaRMSNorm (or GemmaRMSNorm, m.quirks.norm_weight_offset) over `width` values per token in
  // `groups` normalised groups (1, or the heads of Qwen3's q_norm / k_norm). `w`: the norm weight
  // (kNone where the driver does not track it).
  TensorId rmsnorm(TensorId x, TensorId w, const char* tag, bytes_t width, bytes_t groups = 1);

  // nn.Linear's output, `out` features of `ob` bytes per token, from `xin` (the input as the matmul
  // sees it) and the weight `w` (and `bias`) as the matmul sees them. `bwd_ws`: transient memory of
  // its backward beyond the gradients (a tensor-parallel all-reduce of the input gradient).
  TensorId linear(TensorId xin, TensorId w, TensorId bias, bytes_t out, bytes_t ob, const char* name,
                  const char* dtype, const char* shape, bytes_t bwd_ws = 0);

  // apply_rotary_pos_emb on one tensor `t` of `width` values per token and `eb` bytes each, with
  // cos/sin of `cs_b` bytes each.
  TensorId rotary(TensorId t, TensorId cos, TensorId sin, bytes_t width, bytes_t eb, bytes_t cs_b, const char* name);

  // hidden_states = residual + hidden_states: a new b·s·h tensor of `eb` bytes per value.
  TensorId residual_add(TensorId residual, TensorId branch, bytes_t eb, const char* dtype, const char* name);
  // The end of a decoder layer's attention or MLP block: Gemma 2's norm on the branch
  // (norms_per_layer 4: post_attention_layernorm / post_feedforward_layernorm, weight `norm_w`,
  // output `norm_tag`), then the residual add. Drops the branch; returns the new residual stream.
  TensorId close_block(TensorId residual, TensorId branch, TensorId norm_w, const char* norm_tag, bytes_t eb,
                       const char* dtype, const char* name);

  // The MLP on `x`, activations of `eb` bytes: Llama's down_proj(act_fn(gate_proj(x)) * up_proj(x)),
  // Phi-3's chunked gate_up_proj, or the plain fc1 → GeLU → fc2. `linear(x, in, out, module, name,
  // shape)` is the driver's nn.Linear (training adds autocast and LoRA around TorchOps::linear).
  template <class Linear>
  TensorId mlp(TensorId x, bytes_t eb, const char* dtype, Linear&& linear);
};

template <class Linear>
TensorId TorchOps::mlp(TensorId x, bytes_t eb, const char* dtype, Linear&& linear) {
  const bytes_t h = m.hidden_size, I = m.n_ff(0);
  const bytes_t TI = checked_product("activation size", T, I, eb);
  if (m.mlp == MlpKind::plain_gelu) {
    TensorId f1 = linear(x, h, I, Module::fc1, "fc1 output", "b·s·I");
    TensorId a = sim.make("mlp activation", TI, Term::activations, "gelu", dtype, "b·s·I", true);
    sim.node("GeluBackward0", {f1}, {a}, {f1});
    sim.drop(f1);
    TensorId out = linear(a, I, h, Module::fc2, "mlp output", "b·s·h");
    sim.drop(a);
    return out;
  }
  const bool gelu = m.mlp == MlpKind::gated_gelu;
  // Phi3MLP: up_states = gate_up_proj(x); gate, up_states = up_states.chunk(2, dim=-1): both are
  // views of one buffer, and the `gate` view holds it until the MLP returns, so the down_proj runs
  // beside the whole 2I-wide buffer. Measured (tests/data/torch_prefill_phi3_h200.json, Phi-3 mini
  // under inference_mode at 1×2048): prefill peak 8,670,862,848 B; this definition predicts 0.06%
  // low, the serving walk's former own MLP (separate gate and up) 0.44% low. The MLP's input `x`
  // lives on until the caller rebinds hidden_states after the MLP returns (the free of the fp32
  // pre-MLP norm output carries the decoder layer's `hidden_states = self.mlp(...)` frame, after
  // down_proj's output, in tests/data/gaps/gemma-2-2b_amp-bf16_none_flash_adamw_b1s2048.pickle.gz):
  // the caller drops it.
  const bool fused = m.quirks.fused_gate_up;
  TensorId g = fused ? linear(x, h, 2 * I, Module::gate_up, name("gate_up_proj output (saved by act and mul)",
                                                                  "gate_up_proj output (chunked into gate, up)"),
                              "b·s·2I")
                     : linear(x, h, I, Module::gate, name("gate_proj output (saved by act)", "gate_proj output"), "b·s·I");
  TensorId act = sim.make(name("activation output (saved by mul)", "activation output"), TI, Term::activations,
                          gelu ? "gelu_tanh" : "silu", dtype, "b·s·I", true);
  sim.node(gelu ? "GeluBackward0" : "SiluBackward0", {g}, {act}, {g});
  TensorId u = g;
  if (fused) {
    sim.hold(u);
  } else {
    sim.drop(g);  // the gate output is a temporary of the expression
    u = linear(x, h, I, Module::up, name("up_proj output (saved by mul)", "up_proj output"), "b·s·I");
  }
  TensorId prod = sim.make(name("act*up (saved by down_proj)", "act*up"), TI, Term::activations, "mul", dtype, "b·s·I", true);
  sim.node("MulBackward0", {act, u}, {prod}, {act, u});
  sim.drop(act);
  sim.drop(u);
  TensorId out = linear(prod, I, h, Module::down, "down_proj output", "b·s·h");
  sim.drop(prod);
  if (fused) sim.drop(g);  // the MLP returns: the gate view goes
  return out;
}

}  // namespace membudget::detail
