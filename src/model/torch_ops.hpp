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

// How a MoE block runs (the job's --experts and --routing) and where the router logits go: with
// output_router_logits (--router-aux-loss) the model's outputs hold every layer's logits for the
// load-balancing loss (`kept_logits`); otherwise they die when the block returns.
struct MoeRun {
  ExpertsImpl experts = ExpertsImpl::grouped_mm;
  Routing routing = Routing::balanced;
  std::vector<TensorId>* kept_logits = nullptr;
};

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
  // `in_b`: the input's element bytes where `x` is a view without storage of its own (0: read off x).
  TensorId rmsnorm(TensorId x, TensorId w, const char* tag, bytes_t width, bytes_t groups = 1, bytes_t in_b = 0);

  // nn.Linear's output, `out` features of `ob` bytes per token, from `xin` (the input as the matmul
  // sees it) and the weight `w` (and `bias`) as the matmul sees them. `flat_input`: the input is
  // 2-D (tokens × features), so its gradient is the matmul's own result, not a reshaped view.
  TensorId linear(TensorId xin, TensorId w, TensorId bias, bytes_t out, bytes_t ob, const char* name,
                  const char* dtype, const char* shape, bool flat_input = false);

  // apply_rotary_pos_emb on one tensor `t` of `width` values per token and `eb` bytes each, with
  // cos/sin of `cs_b` bytes each.
  // `pass`: with partial rotary (Phi-3), t is already x_rot and `pass` x_pass
  // (partial_rotary_slices); kNone: the slices are made here.
  TensorId rotary(TensorId t, TensorId cos, TensorId sin, bytes_t width, bytes_t eb, bytes_t cs_b, const char* name,
                  TensorId pass = kNone);
  std::pair<TensorId, TensorId> partial_rotary_slices(TensorId t);

  // transformers' sdpa_mask over `s` tokens: the mask function evaluated on broadcast indices, then
  // expanded to the batch (a view: without a padding mask the bool mask is s·s bytes whatever b). A
  // sliding window's function is and_masks(causal, sliding_window_overlay): `result & mask(...)` per
  // function, from a 0-d True, so the causal bool, its and with True, the overlay's bool and their
  // and, each s·s, the first freed by the second and, the middle two by the last (Gemma 2 2B
  // amp-bf16 full recompute with eager attention, tests/data/eager_alone/, events 6-11; Qwen1.5-MoE's
  // snapshots make the overlay's first, the same sizes in the same order). Returns the mask, held.
  TensorId bool_causal_mask(bytes_t s, bool sliding_window);

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
  // shared expert (Qwen2-MoE), the router, the routed experts as `run.experts` runs them, the shared
  // expert's sigmoid gate and the sum. `gate_up` and `down`: the packed expert weights (kNone where
  // the driver does not track them), `wb` bytes per value. `linear` as for mlp(), for the router
  // (Module::router) and the shared expert; `expert_linear(x, w, rows, in, out, name)` is F.linear (or
  // bmm) with a weight tensor the experts made: a slice of a packed parameter (eager) or a
  // per-pair gather (batched_mm). torch_ops.cpp lists the buffers and where they were seen.
  template <class Linear, class ExpertLinear>
  TensorId moe(TensorId x, TensorId gate_up, TensorId down, bytes_t wb, bytes_t eb, const char* dtype, const MoeRun& run,
               Linear&& linear, ExpertLinear&& expert_linear);

  // DeepSeek's router gate, F.linear(x.type(torch.float32), weight.type(torch.float32)), outside
  // autocast: fp32 copies of the input and of the weight (`wb` bytes per value; the matmul keeps
  // both) and fp32 logits, `out` per token.
  TensorId fp32_gate(TensorId x, TensorId w, bytes_t wb, bytes_t in, bytes_t out, const char* name);

  // A view: no storage of its own (the tensor it views keeps the bytes alive), a gradient of `bytes`.
  TensorId view(const char* name, bytes_t grad_bytes);

 private:
  template <class Linear>
  TensorId gated_mlp(TensorId x, bytes_t I, bool shared, bytes_t eb, const char* dtype, Linear&& linear);
  // The router's softmax and top-k from its logits (T × E): returns the routing weights (T × k) and
  // sets `indices` (T × k int64).
  TensorId route(TensorId logits, TensorId* indices);
  // DeepseekV2TopkRouter after its gate: softmax, greedy or group-limited top-k, routed scaling.
  TensorId route_deepseek_v2(TensorId logits, TensorId* indices);
  // DeepseekV3TopkRouter after its gate: sigmoid scores, noaux_tc group top-k, gathered weights.
  TensorId route_deepseek_v3(TensorId logits, TensorId* indices);
  // Expert parallelism's ep_router on the router's outputs (T × k each): the weights of the pairs
  // whose expert another rank holds zeroed (replaces *weights), and the indices remapped to this
  // rank's experts with a sentinel for the others (returned; the experts take those).
  TensorId expert_parallel_routing(TensorId* weights);
  // grouped_mm_experts_forward (transformers/integrations/moe.py): the routed experts' output, T × h.
  TensorId grouped_mm_experts(TensorId x, TensorId weights, TensorId gate_up, TensorId down, bytes_t wb);
  // batched_mm_experts_forward: every token-expert pair gathers its expert's weights.
  template <class ExpertLinear>
  TensorId batched_mm_experts(TensorId x, TensorId weights, TensorId gate_up, TensorId down, bytes_t wb,
                              ExpertLinear&& expert_linear);
  // The experts' own forward (config._experts_implementation "eager"): a loop over the experts hit.
  template <class ExpertLinear>
  TensorId eager_experts(TensorId x, TensorId weights, TensorId gate_up, TensorId down, bytes_t wb, Routing routing,
                         ExpertLinear&& expert_linear);
  // a + b for two T × h outputs (the wider dtype), dropping both: the block's sum of its experts.
  TensorId add_outputs(TensorId a, TensorId b, const char* what, const char* dtype);
  // softmax(logits, dtype=float32): the fp32 copy it makes of 16-bit logits (freed) and the
  // probabilities softmax saves.
  TensorId softmax_fp32(TensorId logits, bytes_t rows_by_cols, const char* what_saved, const char* what);
  // _default_apply_gate on an n × 2I gate_up output: act(gate) * up, the chunks as views.
  TensorId apply_gate(TensorId gu, bytes_t rows, bytes_t wb, const char* what_act, const char* what_prod, const char* shape);
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
  // The fused output's chunks are views whose gradients SplitBackward0 concatenates into one
  // 2I-wide buffer once both are in (Phi-3 mini's whole-run snapshot, tests/data/eager_alone/: act's
  // and up's I-wide gradients, gate's, then the 2I-wide one), as for the experts (apply_gate).
  TensorId gate = g, u = kNone;
  if (fused) {
    gate = view("gate (chunk view of gate_up_proj output)", TI);
    u = view("up (chunk view of gate_up_proj output)", TI);
    sim.node("SplitBackward0", {g}, {gate, u}, {});
  }
  TensorId act = sim.make(name("activation output (saved by mul)", "activation output"), TI, Term::activations,
                          gelu ? "gelu_tanh" : "silu", dtype, "b·s·I", true);
  sim.node(gelu ? "GeluBackward0" : "SiluBackward0", {gate}, {act}, {g});
  if (!fused) {
    sim.drop(g);  // the gate output is a temporary of the expression
    u = linear(x, h, I, up_m, name("up_proj output (saved by mul)", "up_proj output"), "b·s·I");
  }
  TensorId prod = sim.make(name("act*up (saved by down_proj)", "act*up"), TI, Term::activations, "mul", dtype, "b·s·I", true);
  // MulBackward0 computes `other`'s gradient before `self`'s (its generated apply): Llama's
  // act_fn(gate_proj(x)) * up_proj(x) makes up's first, Phi-3's up_states * act_fn(gate) act's.
  // The two are the same size, so only the blocks' identities tell (the snapshot of Qwen2.5 1.5B
  // amp-bf16 full 2 × 2048, tests/data/ties_repeat/: up_proj's backward frees the first made).
  const TensorId other = fused ? act : u, self = fused ? u : act;
  sim.node("MulBackward0", {other, self}, {prod}, {act, fused ? g : u});
  sim.drop(act);
  sim.drop(u);
  if (fused) sim.drop(gate);
  TensorId out = linear(prod, I, h, down_m, "down_proj output", "b·s·h");
  sim.drop(prod);
  if (fused) sim.drop(g);  // the MLP returns: the gate view goes
  return out;
}

template <class Linear, class ExpertLinear>
TensorId TorchOps::moe(TensorId x, TensorId gate_up, TensorId down, bytes_t wb, bytes_t eb, const char* dtype,
                       const MoeRun& run, Linear&& linear, ExpertLinear&& expert_linear) {
  const bytes_t h = m.hidden_size;
  // DeepseekV2Moe runs its shared experts after the routed ones, ungated; Qwen2MoeSparseMoeBlock
  // (shared_expert_output = self.shared_expert(hidden_states)) before the router
  const bool deepseek = m.moe.router != MixtureOfExperts::Router::softmax_top_k;
  TensorId shared = m.moe.shared_ff && !deepseek ? shared_expert(x, eb, dtype, linear) : kNone;
  // _, routing_weights, selected_experts = self.gate(hidden_states): the logits stay bound to `_`
  // until the block returns (and in the model's outputs with output_router_logits). DeepSeek's
  // gate is F.linear(hidden_states.type(float32), weight.type(float32)): the driver's `linear`
  // makes those casts for Module::router.
  TensorId logits = linear(x, h, m.moe.experts, Module::router, name("router logits", "router logits"), "b·s·E");
  TensorId indices = kNone;
  TensorId weights = m.moe.router == MixtureOfExperts::Router::deepseek_v3 ? route_deepseek_v3(logits, &indices)
                     : deepseek                                             ? route_deepseek_v2(logits, &indices)
                                                                            : route(logits, &indices);
  TensorId local_indices = m.moe.expert_ranks > 1 ? expert_parallel_routing(&weights) : kNone;
  TensorId out = run.experts == ExpertsImpl::grouped_mm ? grouped_mm_experts(x, weights, gate_up, down, wb)
                 : run.experts == ExpertsImpl::batched_mm
                     ? batched_mm_experts(x, weights, gate_up, down, wb, expert_linear)
                     : eager_experts(x, weights, gate_up, down, wb, run.routing, expert_linear);
  if (deepseek && m.moe.shared_ff) {
    // hidden_states = hidden_states + self.shared_experts(residuals)
    out = add_outputs(out, shared_expert(x, eb, dtype, linear), "experts + shared experts", dtype);
  } else if (shared != kNone) {
    // F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output; expert_output + that
    TensorId g = linear(x, h, 1, Module::shared_expert_gate, "shared expert gate logit", "b·s·1");
    const bytes_t gb = sim.info(g).bytes / T;
    TensorId sg = sim.make(name("shared expert gate sigmoid (saved)", "shared expert gate sigmoid"), checked_product("activation size", T, gb),
                           Term::activations, "sigmoid", dtype, "b·s·1", true);
    sim.node("SigmoidBackward0", {g}, {sg}, {sg});
    sim.drop(g);
    const bytes_t sb = sim.info(shared).bytes / checked_product("activation size", T, h);
    const bytes_t gated_bytes = checked_product("activation size", T, h, std::max(gb, sb));
    TensorId gated = sim.make("gated shared expert output", gated_bytes, Term::activations, "mul", dtype, "b·s·h", true);
    // MulBackward0, the second factor first: the shared expert's gradient, then the gate's as a
    // b·s·h product summed over h after the node (Qwen1.5-MoE's whole-run snapshot in
    // tests/data/inprocess_alone/, events 1348-1354: 32 MiB, 32 MiB, the product freed last)
    sim.node("MulBackward0", {shared, sg}, {gated}, {sg, shared}, gated_bytes);
    sim.reduce_last_gradient(1, true, reduce_launch(T, h, true));
    sim.drop(sg);
    sim.drop(shared);
    out = add_outputs(out, gated, "experts + shared expert", dtype);
  }
  sim.drop(weights);  // the block returns: routing_weights, selected_experts and `_` go
  sim.drop(indices);
  sim.drop(local_indices);  // (kNone without expert parallelism: nothing)
  if (run.kept_logits && !sim.replaying()) run.kept_logits->push_back(logits);  // the outputs hold them
  else sim.drop(logits);
  return out;
}

// batched_mm_experts_forward (transformers 5.17, integrations/moe.py), S = T·k pairs:
//     selected_hidden_states = hidden_states.repeat_interleave(num_top_k, dim=0)   # S × h
//     expert_ids = expert_ids.clamp(0, num_experts - 1)                            # S int64
//     selected_weights = self.gate_up_proj[expert_ids]                             # S × 2I × h
//     proj_out = torch.bmm(selected_weights, selected_hidden_states.unsqueeze(-1)).squeeze(-1)
//     proj_out = self._apply_gate(proj_out)
//     selected_weights = self.down_proj[expert_ids]                                # S × h × I
//     proj_out = torch.bmm(selected_weights, proj_out.unsqueeze(-1)).squeeze(-1)
//     weighted_out = proj_out * sample_weights.unsqueeze(-1)
//     return weighted_out.view(T, k, h).sum(dim=1).to(hidden_states.dtype)
// bmm saves both operands, so every pair keeps a copy of its expert's weights until backward
// (under autocast the bf16 casts, bmm being an autocast op): the
// qwen3-30b-a3b_L2_bf16_none_flash_adamw_batched_mm_b1s64 snapshot holds 3 GiB of gathered gate_up
// weights for 512 pairs. No size depends on the routing.
template <class ExpertLinear>
TensorId TorchOps::batched_mm_experts(TensorId x, TensorId weights, TensorId gate_up, TensorId down, bytes_t wb,
                                      ExpertLinear&& expert_linear) {
  const bytes_t h = m.hidden_size, I = m.moe.expert_ff;
  const bytes_t S = checked_product("activation size", T, m.moe.top_k);
  const bytes_t xb = sim.info(x).bytes / checked_product("activation size", T, h);
  const bytes_t sb = sim.info(weights).bytes / S;
  const bytes_t index_sort = checked_product("activation size", S, 8, 4);
  TensorId sel = sim.make(name("experts: inputs repeated per pair (saved by bmm)", "experts: inputs repeated per pair"),
                          checked_product("activation size", S, h, xb), Term::activations, "repeat_interleave", "", "S·h", true);
  sim.node("RepeatInterleaveBackward0", {x}, {sel}, {});
  TensorId ids = sim.make(name("experts: clamped expert ids (saved by the weight gathers)", "experts: clamped expert ids"),
                          checked_product("activation size", S, 8), Term::activations, "clamp", "int64", "S", false);
  TensorId gw = sim.make(name("experts: gate_up weights gathered per pair (saved by bmm)", "experts: gate_up weights gathered per pair"),
                         checked_product("activation size", S, 2 * I, h, wb), Term::activations, "index", "", "S·2I·h", true);
  sim.node("IndexBackward0", {gate_up}, {gw}, {ids}, index_sort);
  TensorId gu = expert_linear(sel, gw, S, h, 2 * I, "experts: gate_up bmm output");
  TensorId prod = apply_gate(gu, S, sim.info(gu).bytes / checked_product("activation size", S, 2 * I),
                             "experts: act(gate) (saved by mul)", "experts: act*up (saved by bmm)", "S·I");
  sim.drop(gu);
  TensorId dw = sim.make(name("experts: down weights gathered per pair (saved by bmm)", "experts: down weights gathered per pair"),
                         checked_product("activation size", S, h, I, wb), Term::activations, "index", "", "S·h·I", true);
  sim.node("IndexBackward0", {down}, {dw}, {ids}, index_sort);
  sim.drop(gw);  // selected_weights is rebound
  TensorId dn = expert_linear(prod, dw, S, I, h, "experts: down bmm output (saved by the weighting mul)");
  sim.drop(prod);
  const bytes_t pb = sim.info(dn).bytes / checked_product("activation size", S, h);
  const bytes_t ob = std::max(pb, sb);
  TensorId wo = sim.make("experts: weighted outputs", checked_product("activation size", S, h, ob), Term::activations, "mul", "",
                         "S·h", true);
  sim.node("MulBackward0", {dn, weights}, {wo}, {dn, weights},
           checked_product("activation size", S, h, ob) + (ob != pb ? checked_product("activation size", S, h, ob) : 0));
  TensorId out = sim.make("experts: output (sum over the top k)", checked_product("activation size", T, h, ob),
                          Term::activations, "sum", "", "b·s·h", true);
  sim.node("SumBackward1", {wo}, {out}, {});
  if (ob != xb) {
    TensorId cast = sim.make("experts: output in the input's dtype", checked_product("activation size", T, h, xb),
                             Term::activations, "to(dtype)", "", "b·s·h", true);
    sim.node("ToCopyBackward0", {out}, {cast}, {});
    sim.drop(out);
    out = cast;
  }
  for (TensorId t : {sel, ids, dw, dn, wo}) sim.drop(t);  // the function's locals
  return out;
}

// The experts' forward as the model defines it (Qwen3MoeExperts.forward; the other families copy
// it), with E_hit experts hit and n_e pairs for expert e:
//     final_hidden_states = torch.zeros_like(hidden_states)
//     with torch.no_grad():
//         expert_mask = one_hot(top_k_index, num_classes=E).permute(2, 1, 0)     # T × k × E int64
//         expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
//     for expert_idx in expert_hit:
//         top_k_pos, token_idx = torch.where(expert_mask[expert_idx])            # 2 × n_e int64
//         current_state = hidden_states[token_idx]                               # n_e × h
//         gate, up = F.linear(current_state, self.gate_up_proj[expert_idx]).chunk(2, dim=-1)
//         current_hidden_states = self.act_fn(gate) * up
//         current_hidden_states = F.linear(current_hidden_states, self.down_proj[expert_idx])
//         current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
//         final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
// What the snapshot of qwen3-30b-a3b_L2_bf16_none_flash_adamw_eager_b1s1024 shows: every
// iteration's tensors stay (saved by linear, the act, the mul and index_add_, which keeps its
// source), the one-hot mask lives to the return, and F.linear on a slice of a packed parameter is
// an ordinary matmul whose weight gradient SelectBackward0 scatters into a zero tensor of the whole
// parameter — a parameter-sized temporary per expert in backward. Under autocast the slice is not a
// leaf, so each use casts it anew and the matmul keeps the copy. The saved bytes sum to
// S·(per pair) whatever the routing; the routing sets E_hit and the n_e: balanced spreads the S
// pairs evenly over min(E, S) experts, worst sends every token to the same k experts (n_e = T).
template <class ExpertLinear>
TensorId TorchOps::eager_experts(TensorId x, TensorId weights, TensorId gate_up, TensorId down, bytes_t wb,
                                 Routing routing, ExpertLinear&& expert_linear) {
  const bytes_t h = m.hidden_size, I = m.moe.expert_ff, E = m.moe.experts, k = m.moe.top_k;
  const bytes_t S = checked_product("activation size", T, k);
  const bytes_t xb = sim.info(x).bytes / checked_product("activation size", T, h);
  const bytes_t sb = sim.info(weights).bytes / S;
  const bytes_t mask_bytes = checked_product("activation size", S, E, 8);
  // the running sum (index_add_ in place): its versions are views of one T × h buffer; each
  // IndexAddBackward0 hands the gradient through, modelled as a copy (one T × h, at most)
  TensorId fin = sim.make("experts: output (zeros_like, index_add_ in place)", checked_product("activation size", T, h, xb),
                          Term::activations, "zeros_like", "", "b·s·h", true);
  TensorId mask = sim.make("experts: one-hot expert mask", mask_bytes, Term::activations, "one_hot", "int64", "T·k·E", false);
  // expert_mask.sum(dim=(-1, -2)) on the permuted mask: one mask-sized temporary (the snapshots at
  // 1,024 and 2,048 tokens: 8 and 16 MiB beside an 8 and 16 MiB mask)
  sim.transient("experts: the mask's sum over tokens and slots", mask_bytes);
  const bytes_t hit = routing == Routing::worst ? std::min(k, E) : std::min(E, S);
  const bytes_t base = routing == Routing::worst ? T : S / hit, extra = routing == Routing::worst ? 0 : S % hit;
  const bytes_t slice_gu = checked_product("activation size", 2 * I, h, wb), slice_dn = checked_product("activation size", h, I, wb);
  TensorId cur = kNone;  // the latest version of final_hidden_states (a view until the last)
  for (bytes_t e = 0; e < hit; ++e) {
    const bytes_t n = base + (e < extra ? 1 : 0);
    sim.transient("experts: torch.where's scan of the mask", checked_product("activation size", T, k, 8));
    TensorId where = sim.make(name("experts: token and slot indices of an expert (saved by the gathers)", "experts: token and slot indices"),
                              checked_product("activation size", 2, n, 8), Term::activations, "nonzero", "int64", "2·n_e", false);
    TensorId cs = sim.make(name("experts: an expert's tokens (saved by its linear)", "experts: an expert's tokens"),
                           checked_product("activation size", n, h, xb), Term::activations, "index", "", "n_e·h", true);
    sim.node("IndexBackward0", {x}, {cs}, {where});
    TensorId wgu = view("experts: gate_up slice of one expert", slice_gu);
    sim.node("SelectBackward0", {gate_up}, {wgu}, {});
    TensorId gu = expert_linear(cs, wgu, n, h, 2 * I, "experts: an expert's gate_up output");
    sim.drop(cs);
    sim.drop(wgu);
    TensorId prod = apply_gate(gu, n, sim.info(gu).bytes / checked_product("activation size", n, 2 * I),
                               "experts: an expert's act(gate) (saved by mul)", "experts: an expert's act*up (saved by its linear)", "n_e·I");
    sim.drop(gu);
    TensorId wdn = view("experts: down slice of one expert", slice_dn);
    sim.node("SelectBackward0", {down}, {wdn}, {});
    TensorId dn = expert_linear(prod, wdn, n, I, h, "experts: an expert's down output (saved by the weighting mul)");
    sim.drop(prod);
    sim.drop(wdn);
    TensorId w = sim.make(name("experts: an expert's routing weights (saved by the weighting mul)", "experts: an expert's routing weights"),
                          checked_product("activation size", n, sb), Term::activations, "index", "", "n_e·1", true);
    sim.node("IndexBackward0", {weights}, {w}, {where});
    const bytes_t pb = sim.info(dn).bytes / checked_product("activation size", n, h);
    const bytes_t ob = std::max(pb, sb);
    TensorId wo = sim.make(name("experts: an expert's weighted output (saved by index_add_)", "experts: an expert's weighted output"),
                           checked_product("activation size", n, h, ob), Term::activations, "mul", "", "n_e·h", true);
    sim.node("MulBackward0", {dn, w}, {wo}, {dn, w});
    sim.drop(dn);
    sim.drop(w);
    TensorId src = wo;
    if (ob != xb) {
      src = sim.make(name("experts: an expert's output in the sum's dtype (saved by index_add_)", "experts: an expert's output in the sum's dtype"),
                     checked_product("activation size", n, h, xb), Term::activations, "to(dtype)", "", "n_e·h", true);
      sim.node("ToCopyBackward0", {wo}, {src}, {});
      sim.drop(wo);
    }
    // the last index_add_'s output is the buffer itself; the earlier versions are views of it
    const bool last = e + 1 == hit;
    TensorId next = last ? fin : view("experts: output after index_add_", checked_product("activation size", T, h, xb));
    sim.node("IndexAddBackward0", {e == 0 ? kNone : cur, src}, {next}, {where, src});
    sim.drop(src);
    sim.drop(where);
    if (e > 0) sim.drop(cur);
    cur = next;
  }
  sim.drop(mask);  // the function returns
  return fin;
}

}  // namespace membudget::detail
