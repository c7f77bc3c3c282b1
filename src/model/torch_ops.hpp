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
  // The same MLP as a mixture-of-experts layer's shared expert (width m.moe.shared_ff, the linears
  // asked for as Module::shared_gate / shared_up / shared_down).
  template <class Linear>
  TensorId shared_expert(TensorId x, bytes_t eb, const char* dtype, Linear&& linear);

  // transformers 5.17's sparse MoE block on `x` (the post-attention norm's output, T × h): the
  // shared expert (Qwen2-MoE), the router, the routed experts through `experts_impl` (grouped_mm),
  // the shared expert's sigmoid gate and the sum. `gate_up` and `down`: the packed expert weights as
  // the experts see them, `wb` bytes per value (torch.nn.functional.grouped_mm is not autocast:
  // transformers casts its input to the weights' dtype). `linear` as for mlp(), for the router
  // (Module::router) and the shared expert. torch_ops.cpp lists the buffers and where they were seen.
  template <class Linear>
  TensorId moe(TensorId x, TensorId gate_up, TensorId down, bytes_t wb, bytes_t eb, const char* dtype, Linear&& linear);

 private:
  template <class Linear>
  TensorId gated_mlp(TensorId x, bytes_t I, bool shared, bytes_t eb, const char* dtype, Linear&& linear);
  // The router's softmax and top-k from its logits (T × E): returns the routing weights (T × k) and
  // sets `indices` (T × k int64).
  TensorId route(TensorId logits, TensorId* indices);
  // grouped_mm_experts_forward (transformers/integrations/moe.py): the routed experts' output, T × h.
  TensorId grouped_mm_experts(TensorId x, TensorId weights, TensorId gate_up, TensorId down, bytes_t wb);
  // A view: no storage of its own (the tensor it views keeps the bytes alive), a gradient of `bytes`.
  TensorId view(const char* name, bytes_t grad_bytes);
};

template <class Linear>
TensorId TorchOps::mlp(TensorId x, bytes_t eb, const char* dtype, Linear&& linear) {
  return gated_mlp(x, m.n_ff(0), false, eb, dtype, linear);
}

template <class Linear>
TensorId TorchOps::shared_expert(TensorId x, bytes_t eb, const char* dtype, Linear&& linear) {
  return gated_mlp(x, m.moe.shared_ff, true, eb, dtype, linear);
}

template <class Linear>
TensorId TorchOps::gated_mlp(TensorId x, bytes_t I, bool shared, bytes_t eb, const char* dtype, Linear&& linear) {
  const bytes_t h = m.hidden_size;
  const bytes_t TI = checked_product("activation size", T, I, eb);
  const Module gate_m = shared ? Module::shared_gate : Module::gate, up_m = shared ? Module::shared_up : Module::up,
               down_m = shared ? Module::shared_down : Module::down;
  if (!shared && m.mlp == MlpKind::plain_gelu) {
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
  const bool fused = !shared && m.quirks.fused_gate_up;
  TensorId g = fused ? linear(x, h, 2 * I, Module::gate_up, name("gate_up_proj output (saved by act and mul)",
                                                                  "gate_up_proj output (chunked into gate, up)"),
                              "b·s·2I")
                     : linear(x, h, I, gate_m, name("gate_proj output (saved by act)", "gate_proj output"), "b·s·I");
  TensorId act = sim.make(name("activation output (saved by mul)", "activation output"), TI, Term::activations,
                          gelu ? "gelu_tanh" : "silu", dtype, "b·s·I", true);
  sim.node(gelu ? "GeluBackward0" : "SiluBackward0", {g}, {act}, {g});
  TensorId u = g;
  if (fused) {
    sim.hold(u);
  } else {
    sim.drop(g);  // the gate output is a temporary of the expression
    u = linear(x, h, I, up_m, name("up_proj output (saved by mul)", "up_proj output"), "b·s·I");
  }
  TensorId prod = sim.make(name("act*up (saved by down_proj)", "act*up"), TI, Term::activations, "mul", dtype, "b·s·I", true);
  sim.node("MulBackward0", {act, u}, {prod}, {act, u});
  sim.drop(act);
  sim.drop(u);
  TensorId out = linear(prod, I, h, down_m, "down_proj output", "b·s·h");
  sim.drop(prod);
  if (fused) sim.drop(g);  // the MLP returns: the gate view goes
  return out;
}

template <class Linear>
TensorId TorchOps::moe(TensorId x, TensorId gate_up, TensorId down, bytes_t wb, bytes_t eb, const char* dtype,
                       Linear&& linear) {
  const bytes_t h = m.hidden_size;
  // Qwen2MoeSparseMoeBlock: shared_expert_output = self.shared_expert(hidden_states) comes first
  TensorId shared = m.moe.shared_ff ? shared_expert(x, eb, dtype, linear) : kNone;
  // _, routing_weights, selected_experts = self.gate(hidden_states): the logits stay bound to `_`
  // until the block returns
  TensorId logits = linear(x, h, m.moe.experts, Module::router, name("router logits", "router logits"), "b·s·E");
  TensorId indices = kNone;
  TensorId weights = route(logits, &indices);
  TensorId out = grouped_mm_experts(x, weights, gate_up, down, wb);
  if (shared != kNone) {
    // F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output; expert_output + that
    TensorId g = linear(x, h, 1, Module::shared_expert_gate, "shared expert gate logit", "b·s·1");
    const bytes_t gb = sim.info(g).bytes / T;
    TensorId sg = sim.make(name("shared expert gate sigmoid (saved)", "shared expert gate sigmoid"), checked_product("activation size", T, gb),
                           Term::activations, "sigmoid", dtype, "b·s·1", true);
    sim.node("SigmoidBackward0", {g}, {sg}, {sg});
    sim.drop(g);
    const bytes_t sb = sim.info(shared).bytes / checked_product("activation size", T, h);
    TensorId gated = sim.make("gated shared expert output", checked_product("activation size", T, h, std::max(gb, sb)),
                              Term::activations, "mul", dtype, "b·s·h", true);
    sim.node("MulBackward0", {sg, shared}, {gated}, {sg, shared});
    sim.drop(sg);
    sim.drop(shared);
    const bytes_t ob = std::max(sim.info(out).bytes, sim.info(gated).bytes) / checked_product("activation size", T, h);
    TensorId sum = sim.make("experts + shared expert", checked_product("activation size", T, h, ob), Term::activations,
                            "add", dtype, "b·s·h", true);
    sim.node("AddBackward0", {out, gated}, {sum}, {});
    sim.drop(out);
    sim.drop(gated);
    out = sum;
  }
  sim.drop(weights);  // the block returns: routing_weights, selected_experts and `_` go
  sim.drop(indices);
  sim.drop(logits);
  return out;
}

}  // namespace membudget::detail
