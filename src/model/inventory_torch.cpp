// The inventory model of a Hugging Face transformers 5.x training step on PyTorch 2.11.
//
// This drives AutogradSim op by op through what LlamaForCausalLM (and its Mistral / Qwen2 / Qwen3 /
// Gemma / Phi-3 relatives) executes in eager mode, with the dtype of every tensor that the recipe
// implies, and the tensors each autograd node saves (tools/torch_saved_tensors.py lists them from a
// real run; tests/data/torch_saved_tensors_h200.json). The transformers ops themselves (RMSNorm,
// nn.Linear, rotary, the MLP, the residual add) are torch_ops.hpp's, shared with the serving walk;
// what is here is training's own: autocast's casts and weight cache, LoRA, the DynamicCache copies
// made while training, the attention variants and their backward, checkpointing, the loss, the
// optimizer. Each op below says which framework behaviour it models. Phase names follow
// tools/torch_profile_step.py.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "autograd_sim.hpp"
#include "data_parallel.hpp"
#include "inventory.hpp"
#include "optimizer_loop.hpp"
#include "parallel.hpp"
#include "pipeline.hpp"
#include "predictors.hpp"
#include "torch_ops.hpp"

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
  // a mixture-of-experts layer: the router, the packed routed experts, the shared expert and its gate
  TensorId router = kNone, experts_gate_up = kNone, experts_down = kNone;
  TensorId shared_gate = kNone, shared_up = kNone, shared_down = kNone, shared_expert_gate = kNone;
  // multi-head latent attention (q is q_proj; q_a, q_a_norm, q_b with a q LoRA rank)
  TensorId q_a = kNone, q_a_norm = kNone, q_b = kNone, kv_a = kNone, kv_a_norm = kNone, kv_b = kNone;
  Adapter aq, ak, av, ao, agate, aup, adown;  // LoRA (job.lora_rank > 0)
};

// scaled_dot_product_attention's kernel (sdp_utils.cpp, torch 2.11): flash and cuDNN take 16-bit
// inputs and no mask; the memory-efficient kernel takes fp32 and an attention bias but not
// enable_gqa, which transformers passes for GQA without a mask (use_gqa_in_sdpa); the math
// implementation takes the rest. So fp32 runs the memory-efficient kernel under MHA or a mask
// (Mistral 7B fp32 past its window, tests/data/common_heldout/) and math under GQA without one
// (Llama 3.2 1B fp32, tests/data/torch_train_h200.json). Under autocast q and k (fp32 after
// rotary) are cast to bf16.
// Eager attention, and SDPA's math implementation, run attention as plain batched matmuls (where
// they fold the batch into the heads: attention_folds_batch); the other kernels are fused.
bool attention_runs_as_matmuls(Attention attention, bool fp32_compute, bool masked, bool grouped_query) {
  return attention == Attention::math || (fp32_compute && !masked && grouped_query);
}

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
  // The decoder layers this step runs: all of the model's (layers[i] is model layer i), or a
  // pipeline rank's, chunk after chunk (pipeline.hpp): layers[i] is model layer model_layers[i].
  std::vector<std::size_t> model_layers{};
  std::size_t model_layer(std::size_t i) const { return model_layers.empty() ? i : model_layers[i]; }
  // transformers' DynamicCache while training (use_cache); a pipeline stage runs without one
  bool dynamic_cache = true;
  std::vector<TensorId> layer_inputs{};  // checkpoint keeps each layer's input (by recompute region)
  // Each recorded graph's rotary cos/sin (a pipeline stage records one graph per microbatch and
  // chunk), and each checkpointed layer's (graph, layer): the recompute of region r runs layer
  // recompute_sites[r].second on graph recompute_sites[r].first's cos/sin.
  std::vector<std::pair<TensorId, TensorId>> graph_rotary{};
  std::vector<std::pair<std::size_t, std::size_t>> recompute_sites{};
  const PipelineStage* stage = nullptr;  // a pipeline stage's step (pipeline.hpp), else the whole model
  std::vector<TensorId> kv_cache{};     // DynamicCache entries (use_cache=True while training)
  std::vector<TensorId> router_logits{};  // output_router_logits: every MoE layer's logits, for the aux loss
  // transformers materialises a sliding-window mask for SDPA (see forward()); `mask` is its bool
  // b·1·s·s tensor while the model holds it. `layer_masked`: the layer being run is one of the
  // sliding layers (all of them, or Gemma 2's every other one) and gets the mask. Under eager
  // attention `mask` is the float causal mask instead, and `mask2` Gemma 2's sliding-window one
  // beside it (forward(): each made once per forward, held alike).
  bool masked = false;
  bool layer_masked = false;
  TensorId mask = kNone;
  TensorId mask2 = kNone;
  // a mask the model makes and holds through its forward that no layer takes
  // (ArchQuirks::unused_sliding_mask)
  TensorId unused_mask = kNone;
  // eager attention's attn_weights: LlamaAttention returns them and the decoder layer keeps them in
  // `_` (hidden_states, _ = self.self_attn(...)) until it returns
  TensorId layer_attn_weights = kNone;
  // The attention mask the model calls decoder layer i with (kNone: none): Gemma 2's
  // causal_mask_mapping[layer.attention_type] under eager attention (the full layers' mask, the
  // sliding layers' mask2), the sliding layers' bool mask under SDPA, eager attention's one mask
  // otherwise.
  TensorId layer_mask(std::size_t i) const {
    const bool sliding = m.sliding_layer(model_layer(i));
    if (mask2 != kNone) return sliding ? mask2 : mask;
    if (masked) return sliding ? mask : kNone;
    return mask;
  }
  // The data-parallel wrapper's hooks around the forward (FSDP2's all-gathers and reshards), and
  // the parameters by FSDP2 group (0: the root, 1 + i: layer i) as build_parameters made them.
  DataParallelSim* dp = nullptr;
  std::vector<std::vector<std::pair<TensorId, ParamTensor>>> groups{};

  // The shared transformers ops (torch_ops.hpp) over this step's tokens; norm weights in the
  // parameters' dtype.
  TorchOps ops() { return {sim, m, d.T, r.param}; }

  // Tensor parallelism (DTensor, use_local_output): a ColwiseParallel linear's input gradient is a
  // partial sum that backward all-reduces into a new tensor (funcol.all_reduce clones, then
  // reduces in place). A RowwiseParallel linear's output likewise, in the forward.
  // (Under sequence parallelism the column-parallel input is the all-gather's output: its gradient
  // is reduce-scattered by sp_all_gather's backward instead.)
  bool tp_input_grad_allreduce() const { return job.parallel.tensor > 1 && !sp(); }
  // The module's input hook, DTensor.from_local(x, Replicate): a view whose backward redistributes
  // the partial gradient to Replicate, a node of its own after the linear's. The linear's node
  // returns first and frees its incoming gradient; then the all-reduce clones the partial input
  // gradient and frees it (the Llama 3.1 8B stage's snapshot under 1F1B × TP 2 × FSDP2,
  // tests/data/inprocess_alone/, events 1282-1288: up_proj's 56 MiB weight gradient, its 16 MiB
  // input gradient, the 28 MiB incoming one freed, the 16 MiB clone, the partial freed). Each
  // projection's hook makes its own: gate_proj's clone is then summed in place into up_proj's,
  // a gradient of its own rather than a matmul's view (events 1301-1305).
  TensorId tp_replicated(TensorId x) {
    TensorId xr = sim.view_of(x, "TP input (DTensor.from_local, Replicate)", sim.logical_bytes(x), sim.info(x).dtype);
    sim.node("all_reduce of the input gradient (Partial → Replicate)", {x}, {xr}, {});
    return xr;
  }
  // A RowwiseParallel linear's output: all-reduced (TP), or reduce-scattered onto this rank's part
  // of the sequence (SP). Returns the tensor the model goes on with: under TP the all-reduce's
  // clone, the partial sum freed (the Llama 3.1 8B stage's snapshot under 1F1B × TP 2 × FSDP2,
  // tests/data/inprocess_alone/, events 139-143: o_proj's output, its clone, the output freed, and
  // the residual add in its place). The redistribute's backward hands the gradient through.
  TensorId tp_row_output(TensorId partial, const char* sp_name) {
    if (sp()) return sp_reduce_scatter(partial, sp_name);
    if (job.parallel.tensor == 1) return partial;
    const TensorInfo p = sim.info(partial);  // (a copy: make may move the table)
    TensorId out = sim.make("TP all-reduce output (the partial sum's clone)", p.bytes, Term::activations,
                            "all_reduce (Partial → Replicate)", p.dtype, p.shape, true);
    sim.pass_through_node("all_reduce backward (Replicate: the gradient as it is)", {partial}, out);
    sim.drop(partial);
    return out;
  }

  // Sequence parallelism (--sp; torchtitan's layouts, tools/torch_profile_dist.py): the residual
  // stream and the norms hold b·(s/t)·h on each rank; PrepareModuleInput all-gathers a norm's
  // output before the column-parallel projections (which save the gathered copy), and the
  // row-parallel outputs are reduce-scattered back (RowwiseParallel(output_layouts=Shard(1))).
  // Read off tests/data/dist_snapshots/llama-3.2-1b_tp-sp_w4r0_bf16_none_b1s2048_L2.pickle.gz.
  bool sp() const { return job.parallel.sequence_parallel; }
  // Context parallelism (--cp): SDPA runs as context_parallel's ring attention (torch's
  // tensor/experimental/_attention.py, allgather rotation) over this rank's queries and every
  // rank's keys and values. Read off tests/data/dist_snapshots/llama-3.2-1b_fsdp-cp2-*.pickle.gz.
  bool cp() const { return job.parallel.context > 1; }
  bytes_t stream_rows() const { return sp() ? d.T / job.parallel.tensor : d.T; }
  TorchOps stream_ops() { return {sim, m, stream_rows(), r.param}; }
  // Under SP the norms are SequenceParallel modules: their ops run on DTensors, whose gradients
  // autograd sums out of place (AutogradSim::dtensor_scope; the fp32 input's two contributions, from
  // the pow and the product, make a third tensor: Qwen3 1.7B TP 2 with SP, tests/data/dist_new_models/).
  // The residual stream's adds too (RowwiseParallel's Shard(1) outputs stay DTensors).
  template <class Op>
  TensorId on_stream(Op&& op) {
    const bool outside = sim.dtensor_scope(sp());
    TensorId out = op();
    sim.dtensor_scope(outside);
    return out;
  }
  TensorId stream_norm(TensorId x, TensorId w, const char* tag) {
    return on_stream([&] { return stream_ops().rmsnorm(x, w, tag, d.h, 1); });
  }
  TensorId stream_close_block(TensorId x, TensorId branch, TensorId norm, const char* norm_name, const char* out_name) {
    return on_stream([&] { return stream_ops().close_block(x, branch, norm, norm_name, r.resid, r.resid_name, out_name); });
  }
  // Shard(1) → Replicate: the whole sequence, in the local tensor's dtype. all_gather_tensor
  // gathers the ranks' shares along dim 0 (t·b rows of s/t) and _maybe_view_chunk_cat puts them
  // along the sequence: a view where the batch is 1, else a torch.cat into a second whole tensor
  // while the gathered one lives (Qwen3 1.7B TP 2 with SP at b = 2, tests/data/dist_new_models/:
  // such a 32 MiB pair at each of a layer's two all-gathers, and at the two in its backward,
  // sp_reduce_scatter's). Its backward reduce-scatters the gradient: a contiguous b·s copy, then
  // the local share.
  bytes_t sp_gather_concat_buffer(bytes_t whole) const { return d.b > 1 ? whole : 0; }
  TensorId sp_all_gather(TensorId local, const char* name) {
    const bytes_t whole = sim.info(local).bytes * job.parallel.tensor;
    const TensorId gathered =
        sp_gather_concat_buffer(whole) ? sim.make("SP all-gather output along the batch (before the sequence concat)", whole,
                                                  Term::other, Role::communication, "all_gather", "", "t·b·(s/t)·h", false)
                                       : kNone;
    TensorId out =
        on_stream([&] { return sim.make(name, whole, Term::activations, "all_gather (Shard(1) → Replicate)", "", "b·s·h", true); });
    if (gathered != kNone) sim.drop(gathered);
    sim.node("all_gather backward: reduce_scatter", {local}, {out}, {}, whole);
    return out;
  }
  // Partial → Shard(1): _reduce_shard_tensor copies the partial sum into a contiguous buffer, the
  // collective writes this rank's share, the copy and the partial go. Backward all-gathers the
  // gradient (a whole b·s·h tensor; at b > 1 through a second one, sp_all_gather's concat).
  TensorId sp_reduce_scatter(TensorId partial, const char* name) {
    const bytes_t whole = sim.info(partial).bytes;
    TensorId copy = sim.make("SP reduce-scatter input (contiguous copy)", whole, Term::other, Role::communication,
                             "reduce_scatter", "", "b·s·h", false);
    TensorId out = on_stream([&] {
      return sim.make(name, whole / job.parallel.tensor, Term::activations, "reduce_scatter (Partial → Shard(1))", "", "b·(s/t)·h", true);
    });
    sim.drop(copy);
    sim.node("reduce_scatter backward: all_gather", {partial}, {out}, {}, sp_gather_concat_buffer(whole));
    sim.drop(partial);
    return out;
  }
  // lm_head's ColwiseParallel(output_layouts=Replicate): the vocabulary shards of the logits
  // all-gathered into the whole b·s·V (gathered along the last dim: a second whole buffer while the
  // chunks are put in place); its backward takes this rank's chunk of the gradient (a copy).
  TensorId sp_gather_logits(TensorId local) {
    const bytes_t whole = sim.info(local).bytes * job.parallel.tensor;
    TensorId out = sim.make("logits (all-gathered over the vocabulary)", whole, Term::logits_loss, "all_gather (Shard(-1) → Replicate)",
                            r.compute_name, "b·s·V", true);
    sim.transient("logits all-gather: the gathered chunks before the last-dim concat", whole, Term::other, Role::communication);
    sim.node("all_gather backward: the local chunk", {local}, {out}, {});
    sim.drop(local);
    return out;
  }

  // load_balancing_loss_func (transformers 5.17; every MoE family here copies it), over the logits
  // the outputs hold, layer by layer:
  //     routing_weights = softmax(layer_gate, dim=-1)            # T × E, the logits' dtype (saved)
  //     _, selected_experts = topk(routing_weights, top_k, dim=-1) # alive until rebound
  //     tokens_per_expert_sum += bincount(selected_experts.reshape(-1), minlength=E).float()
  //     router_prob_sum += routing_weights.float().sum(dim=0)    # an fp32 copy of T × E
  // then E-sized arithmetic to a scalar, and loss += router_aux_loss_coef * aux_loss. The allocator
  // snapshot qwen3-30b-a3b_L2_bf16_none_flash_adamw_grouped_mm_aux_b1s1024_snapshot-forward shows
  // these after the cross-entropy, the column sum's staging buffer (the reduction kernel's: 1 MiB
  // there, for 128 experts over 1,024 tokens; 0.5 MiB in OLMoE's, tests/data/inprocess_alone/, for
  // 64 over 4,096), and every layer's logits freed with the outputs. The E-sized vectors (a few KiB) are left out.
  bool aux_loss() const { return job.router_aux_loss || m.moe.output_router_logits; }
  TensorId router_aux_loss(TensorId loss) {
    const bytes_t E = m.moe.experts, k = m.moe.top_k;
    TensorId acc = kNone, topv = kNone, topi = kNone;
    for (TensorId lg : router_logits) {
      const bytes_t lb = sim.info(lg).bytes / mul(d.T, E);
      TensorId rw = sim.make("aux loss: router probabilities (saved by softmax)", mul(d.T, E, lb), Term::activations, "softmax",
                             "", "b·s·E", true);
      sim.node("SoftmaxBackward0", {lg}, {rw}, {rw});
      TensorId v = sim.make("aux loss: top-k values", mul(d.T, k, lb), Term::activations, "topk", "", "b·s·k", true);
      TensorId i = sim.make("aux loss: top-k experts", mul(d.T, k, 8), Term::activations, "topk", "int64", "b·s·k", false);
      sim.node("TopkBackward0", {rw}, {v}, {i});
      sim.drop(topv);  // `_, selected_experts` rebound
      sim.drop(topi);
      topv = v;
      topi = i;
      TensorId f = rw;
      if (lb != 4) {
        f = sim.make("aux loss: router probabilities in fp32", mul(d.T, E, 4), Term::activations, "float", "fp32", "b·s·E", true);
        sim.node("ToCopyBackward0", {rw}, {f}, {});
      } else {
        sim.hold(f);
      }
      sim.kernel_temporaries("aux loss: sum(dim=0)", reduce_launch(E, d.T, false));
      TensorId s = sim.make("aux loss: router probability sums", mul(E, 4), Term::activations, "sum", "fp32", "E", true);
      sim.views_through_node("SumBackward1", {f}, s);  // sum(dim=0)'s gradient is an expand, no copy
      sim.drop(f);
      sim.drop(rw);
      TensorId a = sim.make("aux loss: router probability sums", mul(E, 4), Term::activations, "add", "fp32", "E", true);
      sim.pass_through_node("AddBackward0", {acc, s}, a);
      sim.drop(acc);
      sim.drop(s);
      acc = a;
    }
    TensorId aux = sim.make("aux loss", 4, Term::logits_loss, "load_balancing_loss_func", "fp32", "1", true);
    sim.node("MulBackward0 (tokens per expert x router probability)", {acc}, {aux}, {});
    sim.drop(acc);
    TensorId total = sim.make("loss", 4, Term::logits_loss, "add", "fp32", "1", true);
    sim.pass_through_node("AddBackward0", {loss, aux}, total);
    sim.drop(aux);
    sim.drop(loss);
    sim.drop(topv);  // the function returns
    sim.drop(topi);
    for (TensorId t : router_logits) sim.drop(t);  // the outputs go once .loss is taken
    router_logits.clear();
    return total;
  }

  // DynamicLayer.update while training (use_cache, no checkpointing): torch.cat copies of the new
  // keys and values (`key_width`, `value_width` values per token) onto empty tensors made in the
  // *keys'* dtype; the cache holds them until the model's output dies and the layer goes on with
  // the copies (`key` and `value` are rebound; the originals go). `value_src`: what the values'
  // cat reads (Phi-3's qkv_proj output, of which `value` is the slice).
  // `narrow_grads`: the cat's backward hands the new keys and values narrows of its gradient
  // (cat_tensors_backward; the cache's earlier part is empty), which is how the Llama-style
  // attention records it (the latent attention still counts a copy).
  void cache_update(TensorId& key, TensorId& value, TensorId value_src, bytes_t key_width, bytes_t value_width,
                    const char* key_name, const char* value_name, const char* key_shape, const char* value_shape,
                    bool narrow_grads = false) {
    const bytes_t kb = sim.info(key).bytes / mul(d.T, key_width);
    // (a source of another dtype, the values promoted to fp32 keys under autocast, gets the narrow
    // cast back: a copy)
    auto cat = [&](TensorId src, TensorId out, bytes_t src_width) {
      if (narrow_grads && sim.logical_bytes(src) == mul(d.T, src_width, kb)) sim.views_through_node("CatBackward0", {src}, out);
      else sim.node("CatBackward0", {src}, {out}, {});
    };
    TensorId kc = sim.make(key_name, mul(d.T, key_width, kb), Term::activations, "cat", "", key_shape, true);
    cat(key, kc, key_width);
    TensorId vc = sim.make(value_name, mul(d.T, value_width, kb), Term::activations, "cat", "", value_shape, true);
    cat(value_src, vc, value_width);
    sim.drop(key);
    sim.drop(value);
    key = kc;
    value = vc;
    sim.hold(kc);
    sim.hold(vc);
    kv_cache.push_back(kc);
    kv_cache.push_back(vc);
  }

  // LlamaModel creates a DynamicCache when config.use_cache is true, also in training; transformers
  // turns it off under gradient checkpointing.
  bool kv_cached() const { return dynamic_cache && job.recompute == Recompute::none; }

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
    // not cached: a frozen weight, or a tensor that is not a leaf (an expert's slice of a packed
    // parameter, per-pair gathered weights)
    const bool frozen = !cacheable(w);
    TensorId c = sim.make(!frozen        ? "autocast cache: bf16 weight copies"
                          : wi.param     ? "autocast: bf16 copies of frozen weights (saved by their matmul)"
                                         : "autocast: bf16 copies of expert weights (saved by their matmul)",
                          sim.logical_bytes(w) / r.param * r.compute, wi.param ? Term::model_states : Term::activations,
                          "autocast cast", "bf16", "weight", true);
    sim.node("ToCopyBackward (weight cast)", {w}, {c}, {});
    if (!frozen) cast_cache.push_back({w, c});  // the cache holds it (one holder)
    return c;
  }
  bool cacheable(TensorId w) const { return sim.info(w).param && sim.info(w).requires_grad; }
  void release_weight(TensorId w, TensorId c) {
    if (r.autocast && w != kNone && !cacheable(w)) sim.drop(c);
  }
  void clear_cast_cache() {
    for (auto& [p, c] : cast_cache) sim.drop(c);
    cast_cache.clear();
  }

  // A projection's output viewed and transposed to b·a·s·hd (`.view(...).transpose(1, 2)`), which
  // replaces it: the view keeps its storage alive until the view goes itself. Where the gradient
  // comes back contiguous in b·a·s·hd, the view's backward copies it to b·s·h before the
  // projection's gradients. `gradient_in_layout`: the gradient comes back in the view's own
  // layout (a kernel that allocates it like its input), and the view hands it on uncopied.
  TensorId transposed(TensorId t, const char* name, bool gradient_in_layout = false) {
    TensorId tv = sim.view_of(t, name, sim.logical_bytes(t), sim.info(t).dtype);
    if (gradient_in_layout)
      sim.pass_through_node("TransposeBackward0", {t}, tv);
    else
      sim.node("ViewBackward0 (copy of the transposed gradient)", {t}, {tv}, {});
    sim.drop(t);
    return tv;
  }

  // transformers' repeat_kv (expand + reshape): a copy of the keys and one of the values at every
  // query head, each in its own dtype, which backward sums back to the kv heads. Returns them as
  // {keys, values}.
  std::pair<TensorId, TensorId> repeat_kv(TensorId k, TensorId v, const char* keys_name, const char* values_name) {
    const bytes_t kb = sim.logical_bytes(k) / mul(d.T, d.kvd), vb = sim.logical_bytes(v) / mul(d.T, d.kvd);  // views too
    TensorId kr = sim.make(keys_name, mul(d.T, d.qd, kb), Term::activations, "repeat_kv", "", "b·a·s·hd", true);
    sim.node("ExpandBackward0", {k}, {kr}, {});
    TensorId vr = sim.make(values_name, mul(d.T, d.qd, vb), Term::activations, "repeat_kv", "", "b·a·s·hd", true);
    sim.node("ExpandBackward0", {v}, {vr}, {});
    return {kr, vr};
  }

  // Activation as used by a matmul: under autocast a fresh bf16 copy (non-leaf casts are not cached).
  TensorId cast_input(TensorId x, bytes_t elems, const char* name) {
    if (!r.autocast || sim.logical_bytes(x) == mul(elems, r.compute)) {
      sim.hold(x);
      return x;
    }
    TensorId c = sim.make(name, mul(elems, r.compute), Term::activations, "autocast cast (saved by linear)",
                          r.compute_name, "b·s·in", true);
    sim.node("ToCopyBackward", {x}, {c}, {});
    return c;
  }

  // y = x W^T (+ bias): TorchOps::linear between autocast's casts, then peft's adapter.
  // `out_b`: the output's element bytes when autocast is off (default: the compute dtype).
  // `ad`: the linear's LoRA adapter, if any. Linear saves the input for the weight's gradient and
  // the weight for the input's: with a frozen weight (LoRA's base) it keeps no input.
  // `rows`: a 2-D input's rows (a mixture of experts' pairs, or the tokens a MoE block flattened);
  // 0: the step's tokens in b·s·features, whose gradient the matmul hands back as a view.
  TensorId linear(TensorId x, bytes_t in, bytes_t out, TensorId w, TensorId bias, const char* name,
                  const char* shape, const Adapter* ad = nullptr, bytes_t out_b = 0, bool tp_colwise_input = false,
                  bytes_t rows = 0) {
    const bytes_t n = rows ? rows : d.T;
    TensorId xr = tp_colwise_input ? tp_replicated(x) : x;
    // autocast's wrapper casts the arguments of linear(input, weight, bias) in one pack expansion,
    // which GCC evaluates right to left: the bias, the weight, then the input (the 4.5 MiB q_proj
    // weight copy before the 6 MiB input copy in the snapshot above, events 73-74)
    TensorId bc = bias == kNone ? kNone : weight(bias);
    TensorId wc = weight(w);
    TensorId xin = cast_input(xr, mul(n, in), "linear inputs (autocast bf16 copies)");
    const bytes_t ob = r.autocast || out_b == 0 ? r.compute : out_b;
    TorchOps op = ops();
    op.T = n;
    TensorId y = op.linear(xin, wc, bc, out, ob, name, ob == 4 ? "fp32" : r.compute_name, shape, rows != 0);
    sim.drop(xin);
    if (xr != x) sim.drop(xr);
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
    sim.pass_through_node("AddBackward0", {y, sc}, sum);
    sim.drop(y);
    sim.drop(sc);
    if (sb == yb) return sum;
    TensorId back = sim.make("LoRA: result cast back to the base dtype", mul(d.T, out, yb), Term::activations,
                             "to(dtype)", r.compute_name, "b·s·out", true);
    sim.node("ToCopyBackward", {sum}, {back}, {});
    sim.drop(sum);
    return back;
  }

  // RMSNorm (TorchOps::rmsnorm) over the hidden size, or `width` values per token in `rows` groups.
  // `in_b`: the input's element bytes where `x` is a view (0: from its size)
  TensorId rmsnorm(TensorId x, TensorId w, const char* tag, bytes_t width = 0, bytes_t rows = 1, bytes_t in_b = 0) {
    return ops().rmsnorm(x, w, tag, width == 0 ? d.h : width, rows, in_b);
  }

  void layer(std::size_t i, TensorId x, TensorId* out) {
    const auto& p = layers[i];
    // Gemma 2 alternates: config.layer_types is "sliding_attention" for layers 0, 2, 4, … and
    // "full_attention" for the others, and each decoder layer gets
    // causal_mask_mapping[layer.attention_type]. The full layers' create_causal_mask is skipped for
    // SDPA (no padding, no local window: _ignore_causal_mask_sdpa), so only the sliding layers see
    // the mask, repeat their keys and values and save the additive mask.
    layer_masked = masked && m.sliding_layer(model_layer(i));
    // residual = hidden_states; hidden_states = input_layernorm(hidden_states)
    TensorId n1 = stream_norm(x, p.norm1, "input_layernorm output");
    TensorId n1_local = kNone;  // SP: the local norm output, held until self_attn returns
    if (sp()) n1 = sp_all_gather(n1_local = n1, "SP all-gather of input_layernorm output (saved by q/k/v)");
    TensorId o = m.mla.enabled() ? mla_attention(p, n1) : attention_block(p, n1);
    sim.drop(n1_local);
    // Gemma 2's post_attention_layernorm on the branch, then the residual add
    TensorId h1 = stream_close_block(x, o, p.norm3, "post-attention norm output", "residual stream (saved by the next norm)");
    TensorId n2 = stream_norm(h1, p.norm2, "post_attention_layernorm output");
    TensorId n2_local = kNone;  // SP: held until the MLP returns
    if (sp()) n2 = sp_all_gather(n2_local = n2, "SP all-gather of post_attention_layernorm output (saved by gate/up)");
    // MLP (TorchOps::mlp, or TorchOps::moe on a mixture-of-experts layer) through this step's
    // linear: autocast casts and LoRA adapters
    TensorId dn = m.moe_layer(model_layer(i)) ? moe(p, n2) : ops().mlp(n2, r.compute, r.compute_name,
                            [&](TensorId in_x, bytes_t in, bytes_t out, Module mod, const char* name, const char* shape) {
                              switch (mod) {
                                case Module::gate_up: return linear(in_x, in, out, p.gate, kNone, name, shape);
                                case Module::gate:
                                  return linear(in_x, in, out, p.gate, kNone, name, shape, &p.agate, 0, tp_input_grad_allreduce());
                                case Module::up:
                                  return linear(in_x, in, out, p.up, kNone, name, shape, &p.aup, 0, tp_input_grad_allreduce());
                                case Module::down:
                                  return tp_row_output(linear(in_x, in, out, p.down, kNone, name, shape, &p.adown),
                                                       "SP reduce-scatter of down_proj output");
                                default: throw Error(ErrorKind::unsupported, "internal: no training MLP linear for " + std::string(to_string(mod)));
                              }
                            });
    sim.drop(n2);  // hidden_states = self.mlp(hidden_states)
    sim.drop(n2_local);
    TensorId h2 = stream_close_block(h1, dn, p.norm4, "post-feedforward norm output", "residual stream (layer output)");
    sim.drop(h1);
    sim.drop(layer_attn_weights);  // the layer returns: its `_` goes
    layer_attn_weights = kNone;
    *out = h2;
  }

  // DeepseekV2Attention.forward (transformers 5.17), multi-head latent attention: a = heads,
  // nope/rope/v head dims, r = kv_lora_rank. What stays for backward and when the rest goes is read
  // off deepseek-v2-lite_L2_bf16_none_flash_adamw_b1s1024_snapshot-forward (events 34-89):
  //     q = q_proj(x) (or q_b_proj(q_a_layernorm(q_a_proj(x)))); q_nope, q_pe = split(q)   # views
  //     compressed_kv = kv_a_proj_with_mqa(x); kv_nope, k_pe = split(compressed_kv)       # views
  //     k_nope = kv_a_layernorm(kv_nope)           # the norm of a strided view: its fp32 copy
  //     q_pe, k_pe = apply_rotary_emb(q_pe, k_pe, freqs_cis)   # x.float().reshape (a copy),
  //                    view_as_complex * freqs, view_as_real(...).type_as(x) (a copy back)
  //     k_nope, k_pe = past_key_values.update(k_nope, k_pe)   # torch.cat copies (use_cache)
  //     query_states = cat(q_nope, q_pe)                       # saved by sdpa
  //     kv = kv_b_proj(k_nope); k_nope', value = split(kv)     # value: a view sdpa keeps
  //     key_states = kv.new_empty(...); [..., :nope].copy_(k_nope'); [..., nope:].copy_(k_pe)
  //     attn = sdpa(query, key, value)   # out a × s × v, the log-sum-exp; then .contiguous()
  //     o_proj(attn)
  // The attention block of a Llama-style layer on `n1` (input_layernorm's output, which it drops):
  // q/k/v (or Phi-3's fused qkv_proj), Qwen3's and OLMoE's q/k norms, rotary, the DynamicCache,
  // SDPA and o_proj. Returns o_proj's output.
  TensorId attention_block(const LayerParams& p, TensorId n1) {
    // Phi-3 fuses the projections: qkv_proj's output is sliced into q, k, v views (their gradients
    // come back as full-size slice_backward buffers), and SDPA makes v contiguous.
    const bool fused = m.quirks.fused_qkv;
    TensorId q, k, v, qkv = kNone;
    if (fused) {
      // query_states = qkv[..., :query_pos] (and the keys and values alike), each then
      // .view(hidden_shape).transpose(1, 2): a slice view of the output, whose SliceBackward0 makes
      // a zeroed gradient of qkv's size, and a transposed view of it, whose gradient comes back
      // contiguous in b·a·s·hd and is copied (Phi-3 mini's whole-run snapshot in
      // tests/data/eager_alone/: after the rotary's backward, three 12 MiB copies, then three 36 MiB
      // slice gradients, the later two summed into the first in place).
      qkv = linear(n1, d.h, d.qd + 2 * d.kvd, p.q, p.qb, "qkv_proj output (sliced into q, k, v)", "b·s·(q+2kv)");
      auto slice = [&](bytes_t width, const char* name) {
        TensorId s = sim.view_of(qkv, name, mul(d.T, width, r.compute), r.compute_name);
        sim.node("SliceBackward0", {qkv}, {s}, {});
        return s;
      };
      q = slice(d.qd, "q (slice view of qkv_proj output)");
      k = slice(d.kvd, "k (slice view of qkv_proj output)");
      v = slice(d.kvd, "v (slice view of qkv_proj output)");
      q = transposed(q, "q (transposed view)");
      k = transposed(k, "k (transposed view)");
      // v's view goes to the kernel as it is where the memory-efficient kernel a mask selects runs
      // without the cache's cat (under recompute) or repeat_kv (MHA), and that kernel returns dv
      // in v's own layout: no copy (Phi-3 mini amp-bf16 full recompute at 2 x 2,048 in
      // tests/data/phi3_heldout/: q's and k's copies, then v's slice gradient)
      v = transposed(v, "v (transposed view)", !kv_cached() && memory_efficient_sdpa() && !repeats_kv_for_mask());
      // cuDNN's SDPA makes the values contiguous (without the DynamicCache's cat, under recompute),
      // as SDPA's math kernel is taken to (fp32); the memory-efficient kernel a mask selects and the
      // eager matmuls take the view as it is (Phi-3 mini's whole-run snapshots in
      // tests/data/phi3_heldout/, flash from s = window on and math, both under full recompute)
      if (job.recompute != Recompute::none && job.attention != Attention::math && !memory_efficient_sdpa()) {
        TensorId vc = sim.make("v contiguous copy (saved by sdpa)", mul(d.T, d.kvd, r.compute), Term::activations,
                               "contiguous", r.compute_name, "b·kv·s·hd", true);
        sim.node("CloneBackward", {v}, {vc}, {});
        sim.drop(v);
        v = vc;
      }
    } else {
      // q_proj(x).view(hidden_shape).transpose(1, 2), and k's and v's alike (`transposed`): the
      // gradient comes back contiguous in b·a·s·hd for q's and k's (the rotary's SliceBackward0
      // makes them), and for v's when the DynamicCache's cat made the values contiguous (the Llama
      // 3.2 1B snapshot below, events 2046-2065: v's 0.5 MiB copy, then k's, then q's 2 MiB, each
      // just before its projection's gradients).
      auto projection_view = [&](TensorId t) { return transposed(t, "projection output (transposed view)"); };
      // Qwen3's and OLMoE's q/k norms (RMSNorm over head_dim, or over all of q and k) run on each
      // projection before the next: q_norm(q_proj(x)), then k_norm(k_proj(x)), then v_proj(x)
      // (tests/data/reserved_alone/qwen3-30b-a3b_L4_amp-bf16_full_flash_adamw_b1s4096.pickle.gz,
      // events 103-107: k_proj's casts and output after q_norm's)
      // (the view's copy comes after the norm's backward there: Qwen3-30B-A3B's k, events 1810-1815)
      auto qk_norm = [&](TensorId t, TensorId w, const char* name, bytes_t width, bytes_t heads) {
        const bytes_t eb = sim.logical_bytes(t) / mul(d.T, width);
        TensorId tn = rmsnorm(t, w, name, width, m.quirks.qk_norm_full_width ? 1 : heads, eb);
        sim.drop(t);  // the projection's view, a temporary of the expression
        return tn;
      };
      // Qwen3 normalises each head, q_norm(q_proj(x).view(hidden_shape)).transpose(1, 2), each
      // projection before the next. OLMoE normalises all of q and k, q_norm(q_proj(x)), and views
      // and transposes q, k and v after v_proj: their view's copies come before v_proj's gradients,
      // right after the rotary's (OLMoE's whole-run snapshot in tests/data/inprocess_alone/).
      const bool norm_before_view = m.qk_norm && m.quirks.qk_norm_full_width;
      // q's or k's projection as the attention goes on with it before v_proj runs
      auto headed = [&](TensorId t, TensorId w, const char* name, bytes_t width, bytes_t heads) {
        if (norm_before_view) return qk_norm(t, w, name, width, heads);  // viewed after v_proj
        return m.qk_norm ? qk_norm(projection_view(t), w, name, width, heads) : projection_view(t);
      };
      const bool colwise = tp_input_grad_allreduce();
      q = linear(n1, d.h, d.qd, p.q, p.qb, "q_proj output", "b·s·a·hd", &p.aq, 0, colwise);
      q = headed(q, p.q_norm, "q_norm output", d.qd, d.a);
      k = linear(n1, d.h, d.kvd, p.k, p.kb, "k_proj output", "b·s·kv·hd", &p.ak, 0, colwise);
      k = headed(k, p.k_norm, "k_norm output", d.kvd, d.kva);
      v = linear(n1, d.h, d.kvd, p.v, p.vb, "v_proj output", "b·s·kv·hd", &p.av, 0, colwise);
      if (norm_before_view) {
        q = projection_view(q);
        k = projection_view(k);
      }
      // v's gradient comes back contiguous in b·kv·s·hd too where matmuls compute the attention
      // (eager, or SDPA's math kernel): repeat_kv's sum, or the bmm's (Llama 3.2 1B amp-bf16 full
      // recompute, math attention: v_proj's 2 MiB copy, tests/data/mul_order_alone/); and where a
      // mask makes sdpa_attention_forward repeat the keys and values for a fused kernel (Mistral 7B
      // and Gemma 2 2B's sliding layers past the window under recompute, tests/data/sdpa_window_heldout/:
      // v's copy just before v_proj's gradients)
      if (kv_cached() || !fused_sdpa() || repeats_kv_for_mask()) v = projection_view(v);
    }
    // apply_rotary_pos_emb (TorchOps::rotary): cos/sin carry the residual dtype, so under autocast
    // the products promote to fp32; q, k and v of Phi-3's qkv_proj are views in the compute dtype.
    // (Phi-3's partial rotary slices q and k before it rotates either: TorchOps::partial_rotary_slices)
    std::pair<TensorId, TensorId> q_parts{q, kNone}, k_parts{k, kNone};
    if (m.quirks.partial_rotary) {
      q_parts = ops().partial_rotary_slices(q);
      k_parts = ops().partial_rotary_slices(k);
    }
    auto rotary = [&](std::pair<TensorId, TensorId> parts, bytes_t width, const char* name) {
      const bytes_t eb = sim.logical_bytes(parts.first) / mul(d.T, width);
      return ops().rotary(parts.first, cos, sin, width, eb, r.resid, name, parts.second);
    };
    // query_states, key_states = apply_rotary_pos_emb(...): both products exist before the names
    // are rebound, which frees the projections' outputs (q's, then k's)
    TensorId qe = rotary(q_parts, d.qd, "q after rotary");
    TensorId ke = rotary(k_parts, d.kvd, "k after rotary");
    sim.drop(q);
    sim.drop(k);
    // LlamaModel creates a DynamicCache when config.use_cache is true, also in training (HF turns
    // it off only under gradient checkpointing). DynamicLayer.update concatenates the new keys and
    // values onto empty tensors created in the *keys'* dtype and hands the concatenations to
    // attention: under autocast the keys are fp32 after rotary, so both copies are fp32 (the values
    // are promoted). The cache holds them until the model's output dies.
    if (kv_cached())
      cache_update(ke, v, v, d.kvd, d.kvd, "DynamicCache keys (torch.cat copy)",
                   "DynamicCache values (torch.cat copy, keys' dtype)", "b·kv·s·hd", "b·kv·s·hd", true);
    TensorId att = attention(qe, ke, v);
    // attn_output.transpose(1, 2).contiguous(): cuDNN writes its output in q's layout (flash in
    // b·s·a·hd). q keeps q_proj's b·s·a·hd layout through rotary, so this is a view that o_proj
    // saves; Phi-3's partial-rotary cat makes q contiguous b·a·s·hd, and then it is a copy, saved by
    // o_proj beside the output SDPA saves. The math paths copy (below). In fp32 the kernel is the
    // memory-efficient one, whose output ATen allocates b·s·a·hd whatever q's layout
    // (_efficient_attention_forward's {B, M, num_heads, Kv}): a view again. (Phi-3 mini fp32 at
    // 2 x 1,024, tools/matrices/sdpa_fp32_heldout_h200.json: forward and backward peaks measured
    // 96 MiB below the prediction with the copy, its four layers' b·s·h fp32.)
    // In the backward, cuDNN's kernel wants the output's gradient in the output's layout (a copy
    // of o_proj's input gradient); the memory-efficient kernel a mask selects takes it as it is
    // (Phi-3 mini bf16 at 2 x 2,048 in tests/data/phi3_heldout/: dq, dk and dv come first).
    TensorId attc = att;
    if (m.quirks.partial_rotary && fused_sdpa() && r.compute != 4) {
      attc = sim.make("attention output (contiguous copy, saved by o_proj)", mul(d.T, d.qd, r.compute), Term::activations,
                      "contiguous", r.compute_name, "b·s·a·hd", true);
      if (memory_efficient_sdpa())
        sim.pass_through_node("CloneBackward0", {att}, attc);
      else
        sim.node("CloneBackward0", {att}, {attc}, {});
      sim.drop(att);
    }
    TensorId o = linear(attc, d.qd, d.h, p.o, kNone, "o_proj output", "b·s·h", &p.ao);
    sim.drop(attc);
    o = tp_row_output(o, "SP reduce-scatter of o_proj output");
    // The attention returns: its locals query_states, key_states and value_states go, then the
    // decoder layer's `hidden_states, _ = self.self_attn(...)` frees input_layernorm's output. Both
    // matter where nothing saved them (the checkpointed forward, an fp32 norm output or fp32 rotary
    // products under autocast), as the step-0 forward of
    // tests/data/handthrough_snapshots/qwen2.5-1.5b_amp-bf16_full_flash_adamw_b1s2048.pickle.gz shows
    // (events 123-156: the frees of q, k and v carry `_call_impl`, the norm output's the layer's
    // line after o_proj's output was made).
    // (Phi-3's local `qkv` too: its output lives until the attention returns, Phi-3 mini's
    // whole-run snapshot in tests/data/eager_alone/, the 36 MiB freed after o_proj's output)
    for (TensorId t : {qe, ke, v, n1, qkv}) sim.drop(t);
    return o;
  }

  // DeepSeek-V3's rotary on a latent-attention view `x` (width values per token, `eb` bytes each):
  // with rope_interleave, four products of half width, their difference and sum, and the cat; the
  // products promote to cos/sin's dtype (the residual's). Without it, TorchOps::rotary.
  TensorId rotary_mla(TensorId x, bytes_t width, bytes_t eb, const char* tag) {
    const bytes_t pb = std::max(eb, r.resid), half = mul(d.T, width / 2, pb);
    if (!m.quirks.interleaved_rotary) {
      TorchOps op = ops();
      return op.rotary(x, cos, sin, width, eb, r.resid, tag);
    }
    auto product = [&](TensorId by) {
      TensorId t = sim.make("rotary: half-width product", half, Term::activations, "mul", "", "", true);
      sim.node("MulBackward0", {x}, {t}, {by});
      return t;
    };
    auto combine = [&](const char* op) {
      TensorId a1 = product(cos), a2 = product(sin);
      TensorId c = sim.make("rotary: half-width sum", half, Term::activations, op, "", "", true);
      sim.node(op, {a1, a2}, {c}, {});
      sim.drop(a1);
      sim.drop(a2);
      return c;
    };
    TensorId r1 = combine("SubBackward0"), r2 = combine("AddBackward0");
    TensorId out = sim.make(tag, mul(d.T, width, pb), Term::activations, "cat", "", "", true);
    sim.node("CatBackward0", {r1, r2}, {out}, {});
    sim.drop(r1);
    sim.drop(r2);
    return out;
  }

  // The fused kernel's backward after the node's dq, dk, dv (`ws`: its accumulators' bytes; `out_width`
  // the output's elements a token, `qk_head_dim` the query's per head). The fp32 memory-efficient
  // kernel leaves delta to ATen (kKernelComputesDelta is the 16-bit kernels'): (grad_out * out)
  // and its .sum(-1) go once the sum is transposed into a contiguous b·a·s, which stays through the
  // kernel; then the dq accumulators (mem_efficient_grad_q_bytes). Mistral 7B fp32 at 6,144 tokens,
  // tests/data/common_heldout/: 96 MiB, 768 KiB, 768 KiB, then 100,712,448 bytes; DeepSeek-V2-Lite's
  // latent attention in fp32, tests/data/attention_fix_heldout/: 8 MiB, then 12,589,056 bytes. The
  // 16-bit kernels request the accumulators 256 bytes larger than they are (Qwen2.5 7B: 56, 8, 8,
  // 224.9 MiB; the same on Llama 3.2 1B, Llama 3.1 8B and Qwen2.5 1.5B and 7B: 8,454,400 bytes for
  // the 1B at 512 tokens; with a bias, Phi-3 mini's), which rounds it up a block.
  void fused_sdpa_backward_workspace(bytes_t out_width, bytes_t qk_head_dim, bytes_t ws) {
    if (r.compute == 4) {
      const bytes_t per_query = mul(d.b, d.a, d.s, 4);
      sim.temporaries_before_workspace({mul(d.T, out_width, 4), per_query, per_query}, 0b100);
      sim.workspace_after_gradients(LaunchSize{LaunchSize::Kind::mem_efficient_grad_q, false, {mul(d.b, d.a), d.s, qk_head_dim}});
    } else {
      sim.workspace_after_gradients(LaunchSize{LaunchSize::Kind::sum, false, {ws, 256, 0}});
    }
  }

  TensorId mla_attention(const LayerParams& p, TensorId n1) {
    const LatentAttention& la = m.mla;
    const bytes_t a = m.num_heads, nope = la.qk_nope_head_dim, rope = la.qk_rope_head_dim, vd = la.v_head_dim,
                  kvr = la.kv_lora_rank, qk = nope + rope;
    TensorId q = kNone;
    if (la.q_lora_rank) {
      TensorId qa = linear(n1, d.h, la.q_lora_rank, p.q_a, kNone, "q_a_proj output", "b·s·q_r");
      TensorId qan = rmsnorm(qa, p.q_a_norm, "q_a_layernorm output", la.q_lora_rank);
      sim.drop(qa);
      q = linear(qan, la.q_lora_rank, mul(a, qk), p.q_b, kNone, "q_b_proj output", "b·s·a·qk");
      sim.drop(qan);
    } else {
      q = linear(n1, d.h, mul(a, qk), p.q, kNone, "q_proj output", "b·s·a·qk");
    }
    const bytes_t qb = sim.info(q).bytes / mul(d.T, a, qk);
    // .view(query_shape).transpose(1, 2) (`transposed`: DeepSeek-V2-Lite's whole-run snapshot,
    // tests/data/heldout_conf/, events 1103-1108: the split's 12 MiB, then its copy, then q_proj's
    // weight gradient)
    q = transposed(q, "q (transposed view)");
    TensorId q_nope = ops().view("q_nope (view of q)", mul(d.T, a, nope, qb)),
             q_pe = ops().view("q_pe (view of q)", mul(d.T, a, rope, qb));
    sim.node("SplitBackward0", {q}, {q_nope, q_pe}, {});
    TensorId ckv = linear(n1, d.h, kvr + rope, p.kv_a, kNone, "kv_a_proj_with_mqa output", "b·s·(r+rope)");
    const bytes_t cb = sim.info(ckv).bytes / mul(d.T, kvr + rope);
    // (in fp32 the latent's norm saves kv_nope itself, its .to(float32) a no-op: the view then
    // holds compressed_kv until backward, as DeepSeek-V2-Lite fp32's snapshot keeps it)
    TensorId kv_nope = cb == 4 ? sim.view_of(ckv, "kv_nope (view of compressed_kv)", mul(d.T, kvr, cb), sim.info(ckv).dtype)
                               : ops().view("kv_nope (view of compressed_kv)", mul(d.T, kvr, cb)),
             k_pe = ops().view("k_pe (view of compressed_kv)", mul(d.T, rope, cb));
    sim.node("SplitBackward0", {ckv}, {kv_nope, k_pe}, {});
    TensorId k_nope = ops().rmsnorm(kv_nope, p.kv_a_norm, "kv_a_layernorm output", kvr, 1, cb);
    sim.drop(kv_nope);
    TensorId q_rot = kNone, k_rot = kNone;
    if (!m.quirks.complex_rotary) {
      // DeepSeek-V3: apply_rotary_pos_emb_interleave (even/odd slices: q1·cos − q2·sin and
      // q2·cos + q1·sin, then cat) or, without rope_interleave, the rotate_half form. The products
      // keep only cos/sin for backward.
      q_rot = rotary_mla(q_pe, mul(a, rope), qb, "q_pe after rotary");
      k_rot = rotary_mla(k_pe, rope, cb, "k_pe after rotary");
      sim.drop(q_pe);
      sim.drop(k_pe);
    } else {
    // apply_rotary_emb: the fp32 copies live until it returns (view_as_complex views of them)
    // (.float() of an fp32 tensor is the tensor itself: DeepSeek-V2-Lite fp32's snapshot has only the products)
    auto as_fp32 = [&](TensorId x, bytes_t width, bytes_t eb, const char* name, const char* shape) {
      if (eb == 4) {
        sim.hold(x);
        return x;
      }
      TensorId c = sim.make(name, mul(d.T, width, 4), Term::activations, "float + reshape", "fp32", shape, true);
      sim.node("ToCopyBackward0", {x}, {c}, {});
      return c;
    };
    TensorId xq = as_fp32(q_pe, mul(a, rope), qb, "rotary: q_pe.float() (copy)", "b·a·s·rope");
    TensorId xk = as_fp32(k_pe, rope, cb, "rotary: k_pe.float() (copy)", "b·s·rope");
    auto rotate = [&](TensorId xf, bytes_t width, bytes_t eb, const char* tag) {
      TensorId c = sim.make("rotary: x * freqs_cis (complex64)", mul(d.T, width, 4), Term::activations, "mul", "complex64", "", true);
      sim.node("MulBackward0", {xf}, {c}, {cos});
      if (eb == 4) return c;  // type_as(x) of an fp32 x: the same tensor (view_as_real, flatten: views)
      TensorId back = sim.make(tag, mul(d.T, width, eb), Term::activations, "type_as", "", "", true);
      sim.node("ToCopyBackward0", {c}, {back}, {});
      sim.drop(c);
      return back;
    };
    q_rot = rotate(xq, mul(a, rope), qb, "q_pe after rotary");
    k_rot = rotate(xk, rope, cb, "k_pe after rotary");
    sim.drop(xq);
    sim.drop(xk);
    sim.drop(q_pe);
    sim.drop(k_pe);
    }
    if (kv_cached())  // the cache's "keys" are the latent, its "values" the rotary key
      cache_update(k_nope, k_rot, k_rot, kvr, rope, "DynamicCache latent (torch.cat copy)",
                   "DynamicCache rotary key (torch.cat copy, keys' dtype)", "b·1·s·r", "b·1·s·rope");
    TensorId qs = sim.make("query_states: cat(q_nope, q_pe) (saved by sdpa)", mul(d.T, a, qk, qb), Term::activations, "cat", "",
                           "b·a·s·qk", true);
    // its backward narrows dq for each input: no copy (DeepSeek-V2-Lite's snapshot allocates nothing
    // there), unless the rotary half is wider than the cat (DeepSeek-V3's interleaved rotary under
    // autocast is fp32), whose gradient autograd then casts (validate_outputs): copies, as a node's
    if (sim.info(q_rot).bytes == mul(d.T, a, rope, qb))
      sim.views_through_node("CatBackward0", {q_nope, q_rot}, qs);
    else
      sim.node("CatBackward0", {q_nope, q_rot}, {qs}, {});
    // kv_b_proj(k_pass).view(...).transpose(1, 2) (`transposed`), split into k_pass and
    // value_states; sdpa saves the value view's storage, kv_b_proj's output
    TensorId kvb = linear(k_nope, kvr, mul(a, nope + vd), p.kv_b, kNone, "kv_b_proj output (its value view saved by sdpa)",
                          "b·s·a·(nope+v)");
    const bytes_t vb = sim.info(kvb).bytes / mul(d.T, a, nope + vd);
    TensorId kvbt = transposed(kvb, "kv_b_proj output (transposed view)");
    // (sdpa's backward names kv_b_proj's output among its saved tensors, for the order it frees
    // them in; eager attention's `@ v` saves the value view, which holds the output as its base)
    TensorId kn = ops().view("k_nope (view of kv_b_proj output)", mul(d.T, a, nope, vb)),
             val = job.attention == Attention::math
                       ? sim.view_of(kvbt, "value_states (view of kv_b_proj output)", mul(d.T, a, vd, vb), sim.info(kvb).dtype)
                       : ops().view("value_states (view of kv_b_proj output)", mul(d.T, a, vd, vb));
    sim.node("SplitBackward0", {kvbt}, {kn, val}, {});
    // key_states = k_pass.new_empty(...); key_states[..., :nope] = k_pass; key_states[..., nope:] =
    // k_rot expanded over the heads: two CopySlices. Each backward copies its incoming gradient
    // whole (the result), then its slice (the source's gradient); the second also makes zeros for
    // the slice of its self, and its result is the first's incoming gradient, which the first
    // frees as its self (new_empty's) needs none. The expanded k_rot's gradient is summed over the
    // heads after both (DeepSeek-V2-Lite's whole-run snapshot, tests/data/heldout_conf/, events
    // 1026-1036).
    TensorId k_rot_heads = kNone, key_nope = kNone, key = kNone;
    if (m.quirks.complex_rotary) {  // DeepSeek-V2's expand_kv
      k_rot_heads = sim.view_of(k_rot, "k_rot expanded over the heads", mul(d.T, a, rope, vb), sim.info(k_rot).dtype);
      sim.node("ExpandBackward0", {k_rot}, {k_rot_heads}, {});
      key_nope = sim.make("key_states (new_empty, two copy_) (saved by sdpa)", mul(d.T, a, qk, vb), Term::activations,
                          "new_empty + copy_", "", "b·a·s·qk", true);
      sim.node("CopySlices (key_states[..., :nope] = k_pass)", {kn}, {key_nope}, {}, mul(d.T, a, qk, vb));
      key = sim.view_of(key_nope, "key_states (after its second copy_)", mul(d.T, a, qk, vb), sim.info(key_nope).dtype);
      sim.node("CopySlices (key_states[..., nope:] = k_rot)", {key_nope, k_rot_heads}, {key}, {});
      sim.workspace_after_gradients(LaunchSize{LaunchSize::Kind::sum, false, {mul(d.T, a, rope, vb), 0, 0}});
    } else {
      // DeepSeek-V3: torch.cat((k_pass, k_rot.expand(...)), dim=-1), held to its bf16 whole-run
      // snapshot only (tests/data/moe_snapshots/deepseek-v3_*_run: reserved within 0.02%)
      key_nope = sim.make("key_states: cat(k_pass, k_rot) (saved by sdpa)", mul(d.T, a, qk, vb), Term::activations, "cat", "",
                          "b·a·s·qk", true);
      sim.node("CatBackward0", {kn, k_rot}, {key_nope}, {});
      key = key_nope;
      sim.hold(key);
    }
    TensorId oc = kNone;
    if (job.attention == Attention::math) {
      // eager_attention_forward (repeat_kv a no-op: as many key heads as query heads): the query
      // and the keys are contiguous (cat, new_empty), the values a view of kv_b_proj's b·s·a·(nope+v)
      oc = eager_attention(qs, key, val, EagerOperands{mul(a, qk), mul(a, vd), false, false, true});
    } else {
      // sdpa: q, k at qk, v at v width (the memory-efficient kernel); saves q, k, v, out, lse. Its
      // backward makes dq, dk, dv, then its accumulators (fused_sdpa_backward_workspace: in 16-bit
      // one request for the fp32 dq accumulator and delta, as flash's); after them and the incoming gradient
      // the saved tensors go, in the order lse, v's base, q, k, out (DeepSeek-V2-Lite's whole-run
      // snapshot in tests/data/heldout_conf/: events 1013-1025 of the first recomputed layer's backward).
      TensorId out = sim.make("sdpa output (saved)", mul(d.T, a, vd, r.compute), Term::activations, "sdpa", r.compute_name,
                              "b·a·s·v", true);
      TensorId lse = sim.make("sdpa log-sum-exp (saved)", mul(d.b, a, d.s, 4), Term::activations, "sdpa", "fp32", "b·a·s", false);
      const bytes_t ws = mul(d.T, a, qk, 4) + mul(d.b, a, d.s, 4);
      sim.node("EfficientAttentionBackward", {qs, key, val}, {out}, {lse, kvb, qs, key_nope, out}, ws);
      fused_sdpa_backward_workspace(mul(a, vd), qk, ws);
      sim.saved_outlive_last_node();
      sim.drop(lse);
      // attn_output.transpose(1, 2).contiguous(): in 16-bit a copy o_proj saves (the kernel's
      // output follows the contiguous query's layout, b·a·s·v); its backward hands o_proj's input
      // gradient on as it is (the kernel takes it strided: no copy in the snapshot's backward). In
      // fp32 the memory-efficient kernel allocates its output b·s·a·v, so the transpose is a view
      // (DeepSeek-V2-Lite fp32, tests/data/attention_fix_heldout/: o_proj straight after sdpa).
      if (r.compute == 4) {
        oc = out;
      } else {
        oc = sim.make("attention output (contiguous copy, saved by o_proj)", mul(d.T, a, vd, r.compute), Term::activations,
                      "contiguous", r.compute_name, "b·s·a·v", true);
        sim.pass_through_node("CloneBackward0", {out}, oc);
        sim.drop(out);
      }
    }
    TensorId o = linear(oc, mul(a, vd), d.h, p.o, kNone, "o_proj output", "b·s·h");
    sim.drop(oc);
    // the attention returns: its locals go, in the order the snapshot frees them (q_pe's rotary
    // before the latent's norm, the keys before kv_b_proj's output), and the decoder layer's
    // `hidden_states, _ = self.self_attn(...)` frees the norm output
    for (TensorId t : {q, q_nope, q_rot, ckv, k_rot, k_rot_heads, k_nope, qs, key_nope, key, kvbt, kn, val, n1}) sim.drop(t);
    return o;
  }

  // The sparse MoE block (TorchOps::moe): the router and the shared expert are nn.Linear (autocast
  // casts them); the packed experts run grouped_mm on the parameters themselves.
  TensorId moe(const LayerParams& p, TensorId x) {
    const MoeRun run{job.experts, job.routing, aux_loss() ? &router_logits : nullptr};
    return ops().moe(x, p.experts_gate_up, p.experts_down, r.param, r.compute, r.compute_name, run,
                     [&](TensorId in_x, bytes_t in, bytes_t out, Module mod, const char* name, const char* shape) {
                       // The block flattens the tokens, hidden_states.view(-1, hidden_dim), before its
                       // linears (2-D inputs: `rows`); DeepSeek's shared experts take the 3-D residuals.
                       const bytes_t flat = d.T;
                       const bytes_t shared_rows = m.moe.router == MixtureOfExperts::Router::softmax_top_k ? flat : 0;
                       switch (mod) {
                         case Module::router:
                           // DeepSeek's fp32 gate (TorchOps::fp32_gate); under autocast its casts are
                           // no-ops and autocast casts to bf16, as for any nn.Linear
                           return m.moe.router != MixtureOfExperts::Router::softmax_top_k && !r.autocast
                                      ? ops().fp32_gate(in_x, p.router, r.param, in, out, name)
                                      : linear(in_x, in, out, p.router, kNone, name, shape, nullptr, 0, false, flat);
                         case Module::shared_gate:
                           return linear(in_x, in, out, p.shared_gate, kNone, name, shape, nullptr, 0, false, shared_rows);
                         case Module::shared_up:
                           return linear(in_x, in, out, p.shared_up, kNone, name, shape, nullptr, 0, false, shared_rows);
                         case Module::shared_down:
                           return linear(in_x, in, out, p.shared_down, kNone, name, shape, nullptr, 0, false, shared_rows);
                         case Module::shared_expert_gate:
                           return linear(in_x, in, out, p.shared_expert_gate, kNone, name, shape, nullptr, 0, false, flat);
                         default: throw Error(ErrorKind::unsupported, "internal: no training MoE linear for " + std::string(to_string(mod)));
                       }
                     },
                     [&](TensorId in_x, TensorId w, bytes_t rows, bytes_t in, bytes_t out, const char* name) {
                       return linear(in_x, in, out, w, kNone, name, "n·out", nullptr, 0, false, rows);
                     });
  }

  // SDPA's flash, cuDNN or memory-efficient kernel (attention_runs_as_matmuls says which runs).
  bool fused_sdpa() const { return !attention_runs_as_matmuls(job.attention, r.compute == 4, layer_masked, d.a != d.kva); }
  // A mask (the sliding window's, from s = window on) makes SDPA pass an attention bias.
  bool sdpa_bias() const { return layer_masked && fused_sdpa(); }
  // transformers' sdpa_attention_forward passes enable_gqa only without a mask (use_gqa_in_sdpa);
  // with one it repeat_kv's the keys and values first.
  bool repeats_kv_for_mask() const { return sdpa_bias() && d.a != d.kva; }
  // The memory-efficient kernel: a bias selects it over cuDNN's and flash's, and fp32 has no other.
  bool memory_efficient_sdpa() const { return fused_sdpa() && (layer_masked || r.compute == 4); }

  TensorId attention(TensorId qe, TensorId ke, TensorId v) {
    // transformers' eager attention repeats the keys and values and leaves the casts to each
    // matmul's autocast (eager())
    if (job.attention == Attention::math) return eager(qe, ke, v);
    const bool repeat = repeats_kv_for_mask();
    if (repeat)
      std::tie(ke, v) = repeat_kv(ke, v, "repeat_kv keys (mask given: no enable_gqa)", "repeat_kv values (mask given: no enable_gqa)");
    const bytes_t kw = repeat ? d.qd : d.kvd;
    // autocast casts value, key, then query (right to left, as linear's arguments above)
    TensorId vin = cast_input(v, kw * d.T, "sdpa inputs (bf16 cast of the cached fp32 values)");
    TensorId k = cast_input(ke, kw * d.T, "sdpa inputs (bf16 casts of q, k)");
    TensorId q = cast_input(qe, d.qd * d.T, "sdpa inputs (bf16 casts of q, k)");
    const TensorId repeated_k = repeat ? ke : kNone, repeated_v = repeat ? v : kNone;
    v = vin;
    TensorId out = kNone;
    if (fused_sdpa()) {
      // With a mask, SDPA first (convert_boolean_attn_mask, before it picks a kernel) turns the
      // bool mask into an additive one in q's dtype, at::where(mask, 0, -inf) of two 0-d tensors:
      // a b·1·s·s tensor per layer (the mask's batch expansion made real), which the kernel takes
      // as attn_bias and saves for backward (Phi-3 mini's whole-run snapshot with flash attention
      // in tests/data/phi3_heldout/: the two scalars, the bias, then the output).
      TensorId bias = kNone;
      if (sdpa_bias())
        bias = sim.make("sdpa attn_bias: additive mask (saved)", mul(d.b, d.s, d.s, r.compute), Term::activations,
                        "convert_boolean_attn_mask", r.compute_name, "b·1·s·s", false);
      // cuDNN / flash: saves q, k, v (not repeated), the output and the fp32 log-sum-exp
      out = sim.make("sdpa output (saved)", mul(d.T, d.qd, r.compute), Term::activations, "sdpa",
                     r.compute_name, "b·s·a·hd", true);
      TensorId lse = sim.make("sdpa log-sum-exp (saved)", mul(d.b, d.a, d.s, 4), Term::activations,
                              "flash attention", "fp32", "b·a·s", false);
      // backward: dq accumulator in fp32, and k/v gradients expanded to all query heads under GQA
      bytes_t ws = mul(d.T, d.qd, 4) + mul(d.b, d.a, d.s, 4);
      if (d.a != d.kva && !repeat) ws += mul(d.T, d.qd, r.compute, 2);
      if (cp()) {
        // ring attention: the whole sequence's keys and values all-gathered, and the merge's fp32
        // output and log-sum-exp accumulators, while the output is made; in backward the gathered
        // keys and values again with their fp32 gradient accumulators (reduce-scattered after)
        const bytes_t kv_all = mul(d.T, job.parallel.context, 2 * d.kvd);
        sim.transient("ring attention: all-gathered keys and values, fp32 output accumulator",
                      mul(kv_all, r.compute) + mul(d.T, d.qd, 4) + mul(d.b, d.a, d.s, 4), Term::activations, Role::temporary);
        ws += mul(kv_all, r.compute) + mul(kv_all, 4);
      }
      // With a bias the memory-efficient kernel runs (its philox seed and offset, two 8-byte
      // tensors, in Phi-3 mini's snapshots in tests/data/phi3_heldout/) and saves the bias too.
      if (bias != kNone)
        sim.node("EfficientAttentionBackward (attn_bias)", {q, k, v}, {out}, {q, k, v, out, lse, bias}, ws);
      else if (memory_efficient_sdpa())
        sim.node("EfficientAttentionBackward", {q, k, v}, {out}, {q, k, v, out, lse}, ws);
      else
        sim.node("FlashAttentionBackward", {q, k, v}, {out}, {q, k, v, out, lse}, ws);
      fused_sdpa_backward_workspace(d.qd, d.hd, ws);
      sim.drop(lse);
      sim.drop(bias);
      if (cp()) {
        // the merged result is b·a·s·hd: transformers' transpose(1, 2).contiguous() copies it (a
        // fused kernel's output is already b·s·a·hd), and o_proj saves the copy
        TensorId oc = sim.make("attention output (contiguous copy of ring attention's result, saved by o_proj)",
                               mul(d.T, d.qd, r.compute), Term::activations, "contiguous", r.compute_name, "b·s·a·hd", true);
        sim.node("CloneBackward", {out}, {oc}, {});
        sim.drop(out);
        out = oc;
      }
    } else {  // flash asked for, but fp32 under GQA without a mask: SDPA's math kernel (eager attention returned above)
      out = sdpa_math(q, k, v);
    }
    // sdpa_attention_forward's locals `key` and `value`, the repeated ones, go as it returns, after
    // the output (Mistral 7B amp-bf16 at its window in tests/data/heldout_conf/: both 64 MiB
    // repeats freed after the bias and the output, not once autocast has cast them)
    sim.drop(repeated_k);
    sim.drop(repeated_v);
    sim.drop(q);
    sim.drop(k);
    sim.drop(v);
    return out;
  }

  // matmul folds b·a into bmm's batch: an operand laid out b·s·a·hd (as projected: the query
  // after a rotary that does not end in a cat, keys and values nothing copied) folds as a view only
  // where b is 1 and is copied otherwise; the copy is what bmm saves (Llama 3.2 1B amp-bf16 full
  // recompute at 2 × 1,024, tests/data/eager_alone/).
  // `width`: the operand's elements a token (a·hd).
  TensorId matmul_operand(TensorId x, bytes_t width, bool laid_out_b_s_a_hd, const char* name) {
    if (matmul_folds_batch_as_view(job) || !laid_out_b_s_a_hd) {
      sim.hold(x);
      return x;
    }
    TensorId copy = sim.make(name, mul(d.T, width, r.compute), Term::activations, "matmul: reshape", r.compute_name, "b·a·s·hd", true);
    sim.pass_through_node("CloneBackward", {x}, copy);  // its gradient folds back as a view
    return copy;
  }

  // A matmul attention's b·a·s·hd output (`width` elements a token) as HF's transpose(1, 2)
  // .contiguous() leaves it for o_proj: a copy o_proj saves; `o` goes. The output's gradient reaches
  // the bmm as the transpose of o_proj's b·s·a·hd input gradient; matmul's _unsafe_view backward
  // reshapes it to (b·a)·s·hd, a view where b is 1 (a dimension of size 1 merges with any), a copy
  // otherwise (Llama 3.2 1B eager at 1 × 2048 makes none: tests/data/mul_order_alone/; SDPA's math
  // kernel, TinyLlama at 1 × 3,000: tests/data/attention_fix_heldout/).
  TensorId contiguous_output(TensorId o, bytes_t width) {
    TensorId oc = sim.make("attention output (contiguous, saved by o_proj)", mul(d.T, width, r.compute), Term::activations,
                           "contiguous", r.compute_name, "b·s·a·hd", true);
    if (matmul_folds_batch_as_view(job))
      sim.pass_through_node("CloneBackward", {o}, oc);
    else
      sim.node("CloneBackward", {o}, {oc}, {});
    sim.drop(o);
    return oc;
  }

  // at::_scaled_dot_product_attention_math with is_causal (SDPA's fp32 kernel under GQA without a
  // mask), as its locals live: q·√scale (the query's layout); the causal mask, ones(s, s) bool,
  // .tril(), then at::where into s² floats (the bools freed as it is made); k and v repeated
  // (enable_gqa); k·√scale; matmul(q, kᵀ), its copy of q where b > 1; the mask added in place;
  // _safe_softmax: softmax, then eq(-inf) (b·a·s·s bools) and their all(-1) for the fully masked
  // rows, freed before the scores; @ v. The scaled q, the repeated k and v and the mask go as the
  // function returns. TinyLlama 1.1B fp32 full recompute at 2 × 2,000 (tests/data/combos_heldout/):
  // 31.25 MiB, 3.8 MiB twice, 15.3 MiB, four 31.25 MiB, 976.6 MiB twice, 244.1 MiB.
  TensorId sdpa_math(TensorId q, TensorId k, TensorId v) {
    const bytes_t e = r.compute;
    const bytes_t bas2 = mul(d.b, d.a, d.s, d.s);
    TensorId qs = sim.make("sdpa math: scaled q", mul(d.T, d.qd, e), Term::activations, "mul", r.compute_name, "b·s·a·hd", true);
    sim.node("MulBackward1", {q}, {qs}, {});
    TensorId ones = sim.make("sdpa math: ones(s, s)", mul(d.s, d.s), Term::activations, "ones", "bool", "s·s", false);
    TensorId tril = sim.make("sdpa math: tril", mul(d.s, d.s), Term::activations, "tril", "bool", "s·s", false);
    sim.drop(ones);
    TensorId mask = sim.make("sdpa math: causal mask", mul(d.s, d.s, e), Term::activations, "where", r.compute_name, "s·s", false);
    sim.drop(tril);
    TensorId kr = k, vr = v;
    if (d.a != d.kva) {
      kr = sim.make("sdpa math: repeated k", mul(d.T, d.qd, e), Term::activations, "repeat_interleave", r.compute_name, "b·a·s·hd", true);
      sim.node("RepeatInterleaveBackward", {k}, {kr}, {});
      vr = sim.make("sdpa math: repeated v", mul(d.T, d.qd, e), Term::activations, "repeat_interleave", r.compute_name, "b·a·s·hd", true);
      sim.node("RepeatInterleaveBackward", {v}, {vr}, {});
    } else {
      sim.hold(kr);
      sim.hold(vr);
    }
    TensorId ks = sim.make("sdpa math: scaled k", mul(d.T, d.qd, e), Term::activations, "mul", r.compute_name, "b·a·s·hd", true);
    sim.node("MulBackward1", {kr}, {ks}, {});
    TensorId qf = matmul_operand(qs, d.qd, !m.quirks.partial_rotary, "sdpa math: matmul's copy of q (b > 1)");
    TensorId sc = sim.make("sdpa math: scores", mul(bas2, e), Term::activations, "matmul", r.compute_name, "b·a·s·s", true);
    sim.node("BmmBackward", {ks, qf}, {sc}, {qf, ks});
    sim.drop(qf);
    sim.drop(ks);
    TensorId sm = sim.make("sdpa math: softmax output (saved)", mul(bas2, e), Term::activations, "softmax", r.compute_name, "b·a·s·s", true);
    // _safe_softmax's backward is _softmax_backward_data; on CUDA (SoftMax.cu,
    // softmax_backward_cuda_out) it computes `Tensor tmp = grad * output` before the reduction:
    // a temporary the size of the scores beside grad_input.
    sim.node("SoftmaxBackward", {sc}, {sm}, {sm}, mul(bas2, e));
    TensorId masked = sim.make("sdpa math: _safe_softmax's eq(-inf)", bas2, Term::activations, "eq", "bool", "b·a·s·s", false);
    sim.transient("sdpa math: _safe_softmax's fully masked rows", mul(d.b, d.a, d.s));
    sim.drop(masked);
    sim.drop(sc);
    TensorId o = sim.make("sdpa output", mul(d.T, d.qd, e), Term::activations, "matmul", r.compute_name, "b·a·s·hd", true);
    sim.node("BmmBackward", {vr, sm}, {o}, {sm, vr});  // the values' gradient, then the weights'
    for (TensorId t : {sm, qs, kr, vr, mask}) sim.drop(t);
    return contiguous_output(o, d.qd);
  }

  // transformers' eager_attention_forward: repeat_kv (a copy in the keys' and values' dtypes: fp32
  // keys after the rotary under autocast), q @ kᵀ (autocast casts the key, then the query, each
  // freed after the matmul unless saved), · scaling (a copy), Gemma 2's soft-capping (/ cap, tanh —
  // which saves its output —, · cap: three score-sized copies), + causal mask (in the residual
  // dtype, so fp32 under autocast), softmax in fp32 (saves its result), .to(query.dtype) (a no-op
  // for fp32 queries), @ v (autocast casts the weights), then transpose(1, 2).contiguous() (a copy).
  // The keys and values go as the function returns; the weights it returns stay with the decoder
  // layer (layer_attn_weights). The snapshot of Llama 3.2 1B amp-bf16 full recompute with this
  // attention (tests/data/mul_order_alone/) shows each of these.
  TensorId eager(TensorId q, TensorId k, TensorId v) {
    TensorId kr = k, vr = v;
    if (d.a != d.kva) {
      std::tie(kr, vr) = repeat_kv(k, v, "repeat_kv keys", "repeat_kv values");
    } else {
      sim.hold(kr);
      sim.hold(vr);
    }
    // Which are laid out b·s·a·hd: the query, unless the rotary ends in a cat (Phi-3's partial
    // rotary: contiguous); the keys and values only where nothing copied them (repeat_kv, the
    // DynamicCache's cat, the rotary's cat for the keys; Phi-3's values are a slice of qkv_proj's
    // b·s·(q+2kv) output, the same layout with a larger stride)
    const bool repeated = d.a != d.kva, rotary_cat = m.quirks.partial_rotary;
    const EagerOperands operands{d.qd, d.qd, !rotary_cat, !repeated && !kv_cached() && !rotary_cat, !repeated && !kv_cached()};
    TensorId out = eager_attention(q, kr, vr, operands);
    sim.drop(kr);
    sim.drop(vr);
    return out;
  }

  // eager_attention_forward's operands once repeated: q and k of `qk` elements a token (a·hd;
  // the latent attention's a·(nope + rope)), v and the output of `vw` (a·hd; its a·v), and which
  // are laid out b·s·a·hd (matmul_operand).
  struct EagerOperands {
    bytes_t qk, vw;
    bool q_as_projected, k_as_projected, v_as_projected;
  };
  TensorId eager_attention(TensorId q, TensorId kr, TensorId vr, const EagerOperands& x) {
    const bytes_t e = r.compute;
    const bytes_t bas2 = mul(d.b, d.a, d.s, d.s);
    const bytes_t qb = sim.info(q).bytes / mul(d.T, x.qk);  // the query's element size: .to(query.dtype)
    // (under autocast, the cast before matmul's copy goes as matmul returns)
    TensorId kc = cast_input(kr, mul(d.T, x.qk), "eager attention: autocast casts of k, q");
    TensorId qc = cast_input(q, mul(d.T, x.qk), "eager attention: autocast casts of k, q");
    TensorId kf = matmul_operand(kc, x.qk, x.k_as_projected, "eager attention: matmul's copy of k (b > 1)");
    TensorId qf = matmul_operand(qc, x.qk, x.q_as_projected, "eager attention: matmul's copy of q (b > 1)");
    TensorId sc = sim.make("attention scores", mul(bas2, e), Term::activations, "matmul", r.compute_name, "b·a·s·s", true);
    // BmmBackward0 computes mat2's gradient before self's (the generated code takes a function's
    // inputs last first, as MulBackward0's): the keys', then the queries'
    sim.node("BmmBackward", {kf, qf}, {sc}, {qf, kf});
    for (TensorId t : {qf, kf, qc, kc}) sim.drop(t);
    TensorId scl = sim.make("attention scores × scaling", mul(bas2, e), Term::activations, "mul", r.compute_name, "b·a·s·s", true);
    sim.node("MulBackward1", {sc}, {scl}, {});
    sim.drop(sc);
    if (m.attn_logit_softcap > 0) {  // attn_weights = tanh(attn_weights / softcap) * softcap
      TensorId dv = sim.make("attention scores / softcap", mul(bas2, e), Term::activations, "div", r.compute_name, "b·a·s·s", true);
      sim.node("DivBackward1", {scl}, {dv}, {});
      sim.drop(scl);
      TensorId th = sim.make("tanh(scores / softcap) (saved)", mul(bas2, e), Term::activations, "tanh", r.compute_name,
                             "b·a·s·s", true);
      sim.node("TanhBackward0", {dv}, {th}, {th});
      sim.drop(dv);
      scl = sim.make("attention scores (soft-capped)", mul(bas2, e), Term::activations, "mul", r.compute_name, "b·a·s·s", true);
      sim.node("MulBackward1", {th}, {scl}, {});
      sim.drop(th);
    }
    const bytes_t mb = std::max(e, r.resid);  // + the model's mask (forward(): made once)
    TensorId msk = sim.make("attention scores + mask", mul(bas2, mb), Term::activations, "add", "", "b·a·s·s", true);
    sim.pass_through_node("AddBackward0", {scl}, msk);
    sim.drop(scl);
    // softmax(x, dtype=float32) converts x first unless it is fp32 (or half: at::softmax's
    // half_to_float kernel takes only that), a copy freed once the softmax is made
    // (Qwen3 0.6B bf16 with eager attention, tests/data/eager_alone/)
    TensorId soft_in = msk;
    if (mb != 4) {
      soft_in = sim.make("softmax input as fp32 (softmax(dtype=float32))", mul(bas2, 4), Term::activations, "to(float32)",
                         "fp32", "b·a·s·s", true);
      sim.node("ToCopyBackward", {msk}, {soft_in}, {});
    } else {
      sim.hold(msk);
    }
    TensorId sm32 = sim.make("softmax output fp32 (saved)", mul(bas2, 4), Term::activations, "softmax(float32)", "fp32",
                             "b·a·s·s", true);
    // _softmax_backward_data on CUDA allocates `tmp = grad * output` (fp32 here) beside grad_input
    // (SoftMax.cu, softmax_backward_cuda_out).
    sim.node("SoftmaxBackward", {soft_in}, {sm32}, {sm32}, mul(bas2, 4));
    sim.drop(soft_in);
    TensorId sm = sm32;
    if (qb != 4) {
      sm = sim.make("attention weights (.to(query.dtype))", mul(bas2, qb), Term::activations, "to(dtype)", "", "b·a·s·s", true);
      sim.node("ToCopyBackward", {sm32}, {sm}, {});
      sim.drop(sm32);
    }
    // `attn_weights = softmax(attn_weights, ...).to(query.dtype)`: the masked scores' variable
    // lets them go once the whole statement has run
    sim.drop(msk);
    TensorId vc = cast_input(vr, mul(d.T, x.vw), "eager attention: autocast cast of v");
    TensorId wc = cast_input(sm, bas2, "eager attention: autocast cast of the weights (saved by @ v)");
    TensorId vf = matmul_operand(vc, x.vw, x.v_as_projected, "eager attention: matmul's copy of v (b > 1)");
    TensorId o = sim.make("attention probs @ v", mul(d.T, x.vw, e), Term::activations, "matmul", r.compute_name,
                          "b·a·s·hd", true);
    sim.node("BmmBackward", {vf, wc}, {o}, {wc, vf});  // the values' gradient, then the weights'
    for (TensorId t : {wc, vf, vc}) sim.drop(t);
    TensorId oc = contiguous_output(o, x.vw);
    sim.drop(layer_attn_weights);
    layer_attn_weights = sm;
    return oc;
  }
};

}  // namespace


namespace {

// Forward of layers, final norm, lm_head and loss. Returns the loss tensor.
// inputs_embeds = embed_tokens(input_ids): the embedding saves only the indices. Gemma scales the
// embeddings by sqrt(h) inside its embedding module (Gemma2TextScaledWordEmbedding.forward: the
// lookup times embed_scale): a new tensor, the unscaled lookup freed as the module returns (Gemma 2
// 2B's construction-to-step snapshot, tests/data/inprocess_alone/*_build, events 490-494).
TensorId embed_tokens(Step& st) {
  auto& sim = st.sim;
  const auto& d = st.d;
  const auto& r = st.r;
  TensorId x = sim.make("embedding output", mul(d.T, d.h, r.param), Term::activations, "embedding",
                        r.param_name, "b·s·h", true);
  sim.node("EmbeddingBackward0", {st.emb}, {x}, {st.input_ids});
  {
    // embedding_dense_backward_cuda: the rows × h gradient, then its partial segments' offsets and
    // fp32 sums, sized for the most segments there can be (Qwen2.5 7B at 8,192 tokens: 72,088 bytes
    // and 123.2 MiB after the 1,039.5 MiB gradient, tests/data/handthrough_snapshots/, events 12964-12982)
    using K = LaunchSize::Kind;
    const std::array<std::uint64_t, 3> args{sim.info(x).bytes / mul(d.h, r.param), sim.logical_bytes(st.emb) / mul(d.h, r.param), d.h};
    sim.reduce_last_gradient(0, false, {LaunchSize{K::embedding_partial_offsets, false, args},
                                        LaunchSize{K::embedding_partial_sums, false, args}});
  }
  // SP: RowwiseParallel(input_layouts=Replicate, output_layouts=Shard(1)): the vocabulary shard's
  // lookup is a partial sum over the whole sequence, reduce-scattered onto this rank's part
  if (st.sp()) x = st.sp_reduce_scatter(x, "SP reduce-scatter of the embedding output");
  if (st.m.quirks.embedding_scale) {
    const TensorId unscaled = x;
    x = sim.make("embedding × sqrt(h)", mul(d.T, d.h, r.param), Term::activations, "mul", r.param_name, "b·s·h", true);
    sim.node("MulBackward0", {unscaled}, {x}, {});
    sim.drop(unscaled);
  }
  return x;
}

// LlamaRotaryEmbedding: cos and sin in the hidden states' dtype, shared by every layer.
// DeepSeek-V2's rotary embedding returns freqs_cis instead: complex64, s × rope/2. DeepSeek-V3's
// returns cos and sin over the rotary dims only. Sets st.cos and st.sin (and records them as this
// graph's).
// Under no_grad, in fp32 (autocast off), for one sequence (position_ids is cache_position[None]):
// the positions as float, freqs = inv_freq @ positions (the step's first matmul: step 0's forward
// cuBLAS workspace is taken here: the whole-run snapshots in tests/data/reserved_alone/,
// reserved_expandable_alone/ and fsdp_uneven/),
// emb = cat(freqs, freqs), cos = emb.cos() * attention_scaling and the same for sin, then each cast
// to the hidden states' dtype (no copy when that is fp32). The temporaries go when the function
// returns, in the order they were made.
void rotary_embeddings(Step& st) {
  auto& sim = st.sim;
  const auto& d = st.d;
  const auto& r = st.r;
  st.sin = kNone;
  const bool complex = st.m.mla.enabled() && st.m.quirks.complex_rotary;
  const bytes_t rot = st.m.mla.enabled() ? st.m.mla.qk_rope_head_dim : d.hd;  // the rotary dims
  const char* shape = st.m.mla.enabled() ? "s·rope" : "s·hd";
  auto temporary = [&](const char* name, bytes_t bytes) {
    return sim.make(name, bytes, Term::other, Role::workspace, "rotary", "fp32", "s", false);
  };
  std::vector<TensorId> temporaries;
  temporaries.push_back(temporary("rotary: positions as float", mul(d.s, 4)));
  temporaries.push_back(temporary("rotary: inv_freq @ positions", mul(d.s, rot / 2, 4)));
  sim.matmul_without_grad();
  if (complex) {  // torch.polar(torch.ones_like(freqs), freqs)
    const TensorId ones = temporary("rotary: ones_like(freqs)", mul(d.s, rot / 2, 4));
    st.cos = sim.make("rotary freqs_cis (complex64)", mul(d.s, rot / 2, 8), Term::activations, "rotary", "complex64",
                      "s·rope/2", false);
    sim.drop(ones);
  } else {
    temporaries.push_back(temporary("rotary: cat(freqs, freqs)", mul(d.s, rot, 4)));
    auto fp32_of = [&](const char* name) {  // emb.cos() (or .sin()), then × attention_scaling
      const TensorId raw = temporary(name, mul(d.s, rot, 4));
      const TensorId scaled = sim.make("rotary cos/sin", mul(d.s, rot, 4), Term::activations, "rotary", "fp32", shape, false);
      sim.drop(raw);
      return scaled;
    };
    st.cos = fp32_of("rotary: emb.cos()");
    st.sin = fp32_of("rotary: emb.sin()");
    if (r.resid != 4) {
      temporaries.push_back(st.cos);
      temporaries.push_back(st.sin);
      st.cos = sim.make("rotary cos/sin", mul(d.s, rot, r.resid), Term::activations, "rotary", r.resid_name, shape, false);
      st.sin = sim.make("rotary cos/sin", mul(d.s, rot, r.resid), Term::activations, "rotary", r.resid_name, shape, false);
    }
  }
  for (TensorId t : temporaries) sim.drop(t);
  st.graph_rotary.push_back({st.cos, st.sin});
}

// The decoder layers [begin, end) on x (which they consume; default all): each layer's output
// replaces its input. Under torch.utils.checkpoint(use_reentrant=False) the saved tensors are
// dropped and the layer input (held by the checkpoint frame) is kept; backward re-runs the layer
// when it first unpacks one of them (recompute_layer; AutogradSim::backward says when it starts,
// stops and lets the input go).
TensorId decoder_layers(Step& st, TensorId x, bool checkpoint, std::size_t begin = 0, std::size_t end = SIZE_MAX) {
  auto& sim = st.sim;
  for (std::size_t i = begin; i < std::min<std::size_t>(end, st.d.L); ++i) {
    TensorId out = kNone;
    sim.set_section(static_cast<int>(i) + 1);  // plans: layer i's section
    st.dp->pre_forward(i + 1);
    if (checkpoint) {
      const std::size_t first = sim.node_count();
      sim.set_discard_saves(true);
      st.layer(i, x, &out);
      sim.set_discard_saves(false);
      // the frame holds the layer's arguments: x (its reference kept here), the mask, cos and sin
      const TensorId mask = st.layer_mask(i);
      for (TensorId held : {mask, st.cos, st.sin}) sim.hold(held);
      sim.add_recompute_region(first, sim.node_count(), static_cast<int>(st.layer_inputs.size()),
                               {x, mask, st.cos, st.sin});
      st.layer_inputs.push_back(x);  // keep holding x: the simulation drops it with the frame
      st.recompute_sites.push_back({st.graph_rotary.size() - 1, i});
    } else {
      st.layer(i, x, &out);
      sim.drop(x);
    }
    st.dp->post_forward(i + 1);
    x = out;
  }
  return x;
}

TensorId forward(Step& st, bool checkpoint) {
  auto& sim = st.sim;
  const auto& d = st.d;
  const auto& r = st.r;
  st.dp->pre_forward(0);  // the root (embedding, final norm, lm_head) is all-gathered first
  TensorId x = embed_tokens(st);
  // LlamaModel.forward's local inputs_embeds (the embedding module's output) lives until the
  // forward returns, after the final norm: freed there even where no layer saves it
  // (tests/data/reserved_alone/qwen2.5-1.5b_bf16_none_flash_sgd-momentum_foreach_b1s512.pickle.gz,
  // event 12904: the embedding output freed by the output-capturing wrapper after the norm)
  const TensorId inputs_embeds = x;
  sim.hold(x);
  // Eager attention takes a float b·1·s·s mask in the residual dtype: create_causal_mask (and for
  // sliding layers create_sliding_window_causal_mask) makes it before the rotary embeddings, from
  // the bool mask (Llama 3.2 1B amp-bf16 full recompute's snapshot, tests/data/mul_order_alone/,
  // events 1-3), freed once the float one is made. Held like the sliding-window mask below.
  if (st.job.attention == Attention::math) {
    auto eager_mask = [&](bool sliding_kind) {
      TensorId bool_mask = st.ops().bool_causal_mask(d.s, sliding_kind);
      TensorId made = sim.make("causal mask (4-D, residual dtype)", mul(d.b, d.s, d.s, st.r.resid), Term::activations,
                               "create_causal_mask", st.r.resid_name, "b·1·s·s", false);
      sim.drop(bool_mask);
      return made;
    };
    bool sliding = false, full = false;
    for (std::uint64_t l = 0; l < d.L; ++l) (st.m.sliding_layer(st.model_layer(l)) ? sliding : full) = true;
    st.mask = eager_mask(!full);  // Gemma 2: causal_mask_mapping's full mask, then the sliding one
    if (sliding && full) st.mask2 = eager_mask(true);
  }
  // Sliding-window attention (Mistral, Phi-3: the window on every layer; Gemma 2: on every other
  // layer) through SDPA: create_sliding_window_causal_mask skips the mask and lets SDPA use
  // is_causal only while kv_length < sliding_window (masking_utils._ignore_causal_mask_sdpa); from
  // s = window on it materialises a bool b·1·s·s mask, once per forward, shared by the sliding
  // layers, before the rotary embeddings as the eager mask above (Phi-3 mini's whole-run snapshot
  // with flash attention in tests/data/phi3_heldout/: the mask's four bools, then the rotary's
  // matmul takes the cuBLAS workspace). The model's forward holds it through the layers; under
  // checkpointing each sliding layer's recompute closure holds it too, until that layer's frame
  // goes in its backward (layer 0's, the last: layer 0 is a sliding layer in Gemma 2 as well).
  if (st.masked) st.mask = st.ops().bool_causal_mask(d.s, true);
  // Qwen2-MoE's forward makes causal_mask_mapping's sliding-window entry though no layer slides,
  // whatever the sequence (the bool mask is not skipped for SDPA: its window, 32,768, is no local
  // size sdpa_mask skips for), and holds it to the end of the forward (Qwen1.5-MoE's whole-run
  // snapshots at 2,048 and 4,096 tokens, tests/data/mul_order_alone/ and inprocess_alone/: the four
  // s·s bools, then the rotary embeddings; the last freed as the model returns).
  else if (st.m.quirks.unused_sliding_mask && st.job.attention == Attention::flash)
    st.unused_mask = st.ops().bool_causal_mask(d.s, true);
  rotary_embeddings(st);
  x = decoder_layers(st, x, checkpoint);
  sim.set_section(static_cast<int>(d.L) + 1);  // after the layers
  // LlamaModel returns the final norm output as last_hidden_state: the CausalLM forward holds it
  // (and the DynamicCache) until it returns, i.e. through the loss.
  TensorId hn = st.stream_norm(x, st.final_norm, "final norm output");
  sim.drop(x);
  // the model's forward returns: its inputs_embeds and masks go (a checkpoint frame holds its
  // layer's mask on: decoder_layers)
  sim.drop(inputs_embeds);
  for (TensorId* held : {&st.mask, &st.mask2, &st.unused_mask}) {
    sim.drop(*held);
    *held = kNone;
  }
  sim.hold(hn);
  TensorId loss = kNone;
  TensorId output_logits = kNone;  // the full loss's logits, held by the output object
  // the logits' vocabulary: the whole of it (SP gathers lm_head's shards), or this rank's shard
  // under the vocabulary-parallel loss
  const bool vocab_parallel = st.job.parallel.loss_parallel;
  const bytes_t V = st.sp() && !vocab_parallel ? mul(d.V, st.job.parallel.tensor) : d.V;
  const bytes_t TV = mul(d.T, V);
  if (st.job.loss == Loss::full) {
    TensorId head_in = st.sp() ? st.sp_all_gather(hn, "SP all-gather of the final norm output (saved by lm_head)") : hn;
    if (!st.sp()) sim.hold(hn);
    // lm_head ColwiseParallel on a replicated input (the vocabulary-parallel loss without SP): its
    // input gradient is a partial sum, all-reduced into a new tensor as the projections' are
    const bool head_grad_allreduce = vocab_parallel && !st.sp() && st.tp_input_grad_allreduce();
    TensorId logits = st.linear(head_in, d.h, d.V, st.lm_head, kNone, "logits", "b·s·V", nullptr, 0, head_grad_allreduce);
    sim.drop(head_in);
    if (st.sp() && !vocab_parallel) logits = st.sp_gather_logits(logits);
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
    // loss_parallel() (torch/distributed/tensor/parallel/loss.py) on the vocabulary shards:
    // _log_softmax computes x − max (kept until the result), its exp, then x − max − log Σexp;
    // _nll_loss_and_log_softmax_backward makes the input gradient directly, as
    // (grad_input + exp(x)) * grad_output with grad_input = zeros_like(x) alive throughout: the
    // exp dies once the sum exists, the sum once the gradient does, then grad_input (the Llama
    // 3.1 8B rank's snapshot, tests/data/tp_fresh_snapshots/*tp-lp*). log_softmax's backward
    // handler computes nothing: it passes that gradient on.
    TensorId shifted = kNone;
    if (vocab_parallel) {
      shifted = sim.make("loss_parallel: logits − max (until the log-softmax)", mul(TV, 4), Term::logits_loss, "_log_softmax",
                         "fp32", "b·s·V/t", false);
      sim.transient("loss_parallel: exp(logits − max)", mul(TV, 4), Term::logits_loss, Role::temporary);
    }
    TensorId lsm = sim.make("log-softmax output (saved by the loss)", mul(TV, 4), Term::logits_loss, "log_softmax", "fp32", "b·s·V", true);
    if (vocab_parallel)
      sim.pass_through_node("LogSoftmaxBackward0 (loss_parallel)", {l32}, lsm, {lsm});  // the node still saves it
    else
      sim.node("LogSoftmaxBackward0", {l32}, {lsm}, {lsm});
    sim.drop(shifted);
    sim.drop(l32);
    loss = sim.make("loss", 4, Term::logits_loss, "nll_loss", "fp32", "1", true);
    sim.node("NllLossBackward0", {lsm}, {loss}, {shift}, vocab_parallel ? mul(TV, 4, 3) : 0);
    sim.split_last_workspace(3, 0b010);  // grad_input, exp(x) (freed first), their sum
    sim.drop(lsm);
    sim.drop(shift);
    output_logits = logits;
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
  if (st.aux_loss()) loss = st.router_aux_loss(loss);
  // The output object is dropped once .loss is taken: the forward's `logits` lives until it
  // returns, past the auxiliary loss it computes after the cross-entropy (OLMoE's whole-run
  // snapshot in tests/data/inprocess_alone/: the 393 MiB logits freed with the aux loss's last
  // temporaries, not after the cross-entropy).
  sim.drop(output_logits);
  // leaving torch.autocast clears its weight cache; saved copies live on in the graph
  st.clear_cast_cache();
  sim.drop(st.cos);  // (checkpoint frames hold theirs: decoder_layers)
  sim.drop(st.sin);
  st.drop_kv_cache();
  sim.drop(hn);
  st.dp->root_post_forward();  // the root module's forward ends with the loss
  return loss;
}

// The last stage's output of a microbatch; the steady step's prologue makes the previous step's
// under the same name (the reserved replay carries step 0's blocks over by name and size).
constexpr const char* kOutputChunk = "pipeline: the stage's output chunks (logits, kept until the next step())";

// A pipeline stage's forward of one microbatch (tools/torch_profile_pp.py's StageModule, what
// torchtitan's splitter leaves of the model): the embedding on the first stage, else `input` (the
// stage's receive buffer for this microbatch, which the stage keeps); the rotary module's cos and
// sin; the stage's decoder layers, with no attention mask and no KV cache; on the last stage the
// final norm and lm_head. Returns the stage's output: the logits on the last stage, else the hidden
// states sent on.
TensorId stage_forward(Step& st, const PipelineStage& stage, std::size_t chunk, TensorId input, bool checkpoint) {
  auto& sim = st.sim;
  TensorId x = input;
  std::size_t begin = 0;  // the chunk's layers in st.layers
  for (std::size_t c = 0; c < chunk; ++c) begin += static_cast<std::size_t>(stage.chunks[c].layers);
  sim.set_section(0);     // before the layers (FSDP2's root group; plans)
  st.dp->pre_forward(0);  // FSDP2 within the stage: the stage module is the root (embedding, final norm, lm_head)
  if (stage.chunk_first(chunk)) {
    x = embed_tokens(st);  // (Gemma's scale is refused under --pp: check_pipeline)
  } else {
    sim.hold(x);  // the layers consume their input; the buffer stays the stage's
  }
  rotary_embeddings(st);
  x = decoder_layers(st, x, checkpoint, begin, begin + static_cast<std::size_t>(stage.chunks[chunk].layers));
  sim.drop(st.cos);  // the stage's forward returns (checkpoint frames hold theirs: decoder_layers)
  sim.drop(st.sin);
  sim.set_section(static_cast<int>(st.d.L) + 1);  // after the layers
  if (stage.chunk_last(chunk)) {
    // h = self.lm_head(self.norm(h)): the last layer's output lives until lm_head returns (the
    // snapshot of Llama 3.2 1B's last stage under 1F1B × FSDP2 4, tests/data/handthrough_snapshots/,
    // events 1137-1141: the 501 MiB logits chunk, then the 8 MiB layer output freed)
    TensorId hn = st.rmsnorm(x, st.final_norm, "final norm output");
    TensorId logits = st.linear(hn, st.d.h, st.d.V, st.lm_head, kNone, kOutputChunk, "b·s·V");
    sim.drop(hn);
    sim.drop(x);
    x = logits;
  }
  st.dp->root_post_forward();  // the stage module's forward returns (the loss is the schedule's)
  return x;
}

// torchtitan's pipeline loss on the last stage's output, as the schedule calls it per microbatch:
// cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1)) — the fp32 upcast (freed once
// log_softmax has its saved output), log_softmax, nll_loss. The labels are the stage's own.
TensorId pipeline_loss(Step& st, TensorId logits) {
  auto& sim = st.sim;
  const bytes_t TV = mul(st.d.T, st.d.V);
  TensorId l32 = logits;
  if (st.r.compute != 4) {
    l32 = sim.make("logits fp32 upcast (in the loss)", mul(TV, 4), Term::logits_loss, "pred.float()", "fp32", "b·s·V", true);
    sim.node("ToCopyBackward", {logits}, {l32}, {});
  } else {
    sim.hold(l32);
  }
  TensorId lsm = sim.make("log-softmax output (saved by the loss)", mul(TV, 4), Term::logits_loss, "log_softmax", "fp32", "b·s·V", true);
  sim.node("LogSoftmaxBackward0", {l32}, {lsm}, {lsm});
  sim.drop(l32);
  TensorId loss = sim.make("loss", 4, Term::logits_loss, "nll_loss", "fp32", "1", true);
  sim.node("NllLossBackward0", {lsm}, {loss}, {st.labels});
  sim.drop(lsm);
  return loss;
}

void recompute_layer(AutogradSim& sim, void* ctx, int region) {
  Step& st = *static_cast<Step*>(ctx);
  TensorId out = kNone;
  const auto [graph, layer] = st.recompute_sites.at(static_cast<std::size_t>(region));
  std::tie(st.cos, st.sin) = st.graph_rotary.at(graph);
  // checkpoint restores the autocast state: weights are cast again into a fresh cache
  st.layer(layer, st.layer_inputs[region], &out);
  st.clear_cast_cache();
  sim.drop(out);
}

struct OptimizerCost {
  bytes_t state = 0;      // persistent
  bytes_t master = 0;     // fp32 master copy
  bytes_t transient = 0;  // temporaries at the peak of optimizer.step()
  // With several optimizers stepped one after the other (one per tensor kind,
  // optimizer_per_tensor_kind; one per pipeline stage module, and per kind within it): each one's
  // state and temporaries (the sums are `state`, and `transient` for all but foreach, whose
  // temporaries are per call and `transient` the largest call's). Empty with one optimizer.
  std::vector<bytes_t> state_of, transient_of;
  bool several() const { return !state_of.empty(); }
  // A for-loop whose temporaries are modelled parameter by parameter (Adafactor's; AdamW's over a
  // whole model): `transient` is its peak, and the reserved-memory replay runs it in place of the
  // temporaries' one block.
  std::vector<LoopOp> loop;
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
// `largest_tensor`: the elements of the largest of them (the for-loop's temporaries);
// `per_step_call`: the most elements one step() call takes (foreach's temporaries); `whole_model`:
// one optimizer steps every parameter of `m`, whole, in model.parameters() order (one GPU, DDP).
OptimizerCost optimizer_cost(const Job& job, const ModelSpec& m, std::uint64_t params, std::uint64_t largest_tensor,
                             std::uint64_t per_step_call, const std::vector<std::uint64_t>& per_optimizer,
                             bool whole_model) {
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
      if (impl == OptimizerImpl::foreach) {
        // _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)
        // (adam.py:791) for every parameter of the call at once; the rest is in place
        c.transient = mul(per_step_call, sb);
      } else if (impl == OptimizerImpl::for_loop) {
        // _single_tensor_adam: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        // (adam.py:545): sqrt() and the division's result are both live, for one parameter at a
        // time, and `denom` keeps the quotient until the next parameter's replaces it. Over a
        // whole model the loop runs parameter by parameter (a large MLP projection's quotient
        // beside the next one's two can top the embedding's two); over shards, the largest
        // parameter's two, each a block of its own (own_segment_block: a 501 MiB bf16 embedding
        // takes a 502 MiB block, as measured)
        if (whole_model) {
          c.loop = adamw_for_loop(registered_tensors(m), sb);
          c.transient = loop_peak(c.loop);
        } else {
          c.transient = mul(own_segment_block(mul(largest_tensor, sb)), 2);
        }
      }
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
      // torch.optim.Adafactor: factored second moment over the last two dimensions (row and column
      // vectors; a packed (E, out, in) expert tensor keeps E of each) for matrices, full for
      // vectors; no first moment. (The vectors' state is not counted: norms are a few KiB.)
      bytes_t rows_cols = 0;
      auto factored = [&](const ParamTensor& t) {
        if (!t.projection()) return;
        rows_cols = checked_add(rows_cols, checked_mul(t.count, t.in + t.out, "Adafactor state"), "Adafactor state");
      };
      // layers alike but for a mixture of experts' dense layers: one of each kind, times its count
      const std::uint64_t moe_layers = m.moe_layers();
      for (std::uint64_t kind = 0; kind < 2; ++kind) {
        const std::uint64_t layers = kind ? moe_layers : m.num_layers - moe_layers;
        if (layers == 0) continue;
        std::uint64_t il = 0;
        while (m.moe_layer(il) != (kind == 1)) ++il;
        const bytes_t before = rows_cols;
        for (const ParamTensor& t : m.layer_tensors(il)) factored(t);
        rows_cols = checked_add(before, checked_mul(rows_cols - before, layers, "Adafactor state"), "Adafactor state");
      }
      for (const ParamTensor& t : m.outer_tensors()) factored(t);
      c.state = mul(rows_cols, sb);
      if (impl == OptimizerImpl::foreach)
        // _multi_tensor_adafactor: var_estimates = [row_var @ col_var ...] (_adafactor.py:567) for
        // every matrix at once and [v.clone() ...] (_adafactor.py:589) for every vector: one
        // parameter-sized list, updated in place
        c.transient = mul(n, sb);
      else {
        // the for-loop (torch's default for Adafactor, _adafactor.py:639), parameter by parameter:
        // the peak is one parameter's var_estimate still bound while the next one's column norm
        // stages its partial sums (the embedding's, 501 MiB in bf16, and 32 MiB for Llama 3.2 1B's
        // first q_proj), or while the next var_estimate is made
        c.loop = adafactor_for_loop(registered_tensors(m), sb);
        c.transient = loop_peak(c.loop);
      }
      break;
    }
  }
  if (master) {
    c.transient += mul(n, 4);  // fp32 copy of the bf16 gradients
    c.loop.clear();            // (one block with the loop's peak in the replay, as other temporaries)
  }
  if (per_optimizer.size() > 1) {  // each optimizer's share of what is proportional to its parameters
    auto shares = [&](bytes_t b) {
      std::vector<bytes_t> out;
      bytes_t given = 0;
      for (std::size_t o = 0; o < per_optimizer.size(); ++o) {
        const bytes_t share = o + 1 == per_optimizer.size()
                                  ? b - given
                                  : static_cast<bytes_t>(static_cast<unsigned __int128>(b) * per_optimizer[o] / n);
        out.push_back(share);
        given += share;
      }
      return out;
    };
    c.state_of = shares(c.state);
    if (impl == OptimizerImpl::foreach && job.optimizer == Optimizer::adamw)
      for (std::uint64_t e : per_optimizer) c.transient_of.push_back(mul(e, sb));  // per call: its own parameters
    else
      c.transient_of = shares(c.transient);
  }
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
    case Module::q_a: return &lp.q_a;
    case Module::q_a_norm: return &lp.q_a_norm;
    case Module::q_b: return &lp.q_b;
    case Module::kv_a: return &lp.kv_a;
    case Module::kv_a_norm: return &lp.kv_a_norm;
    case Module::kv_b: return &lp.kv_b;
    case Module::router: return &lp.router;
    case Module::experts_gate_up: return &lp.experts_gate_up;
    case Module::experts_down: return &lp.experts_down;
    case Module::shared_gate: return &lp.shared_gate;
    case Module::shared_up: return &lp.shared_up;
    case Module::shared_down: return &lp.shared_down;
    case Module::shared_expert_gate: return &lp.shared_expert_gate;
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
  if (m.mla.enabled() && job.lora_rank) refuse("--lora with multi-head latent attention");
  if (m.norm != NormKind::rmsnorm) refuse("norm: layernorm");
  if (m.mlp == MlpKind::plain_gelu) refuse("mlp: plain_gelu");
  if (m.bias.o) refuse("bias.o (an o_proj bias)");
  if (m.bias.mlp) refuse("bias.mlp (MLP biases)");
  if (m.norms_per_layer != 2 && m.norms_per_layer != 4) refuse("norms_per_layer " + std::to_string(m.norms_per_layer) + " (2 or 4 are)");
  if (job.lora_rank && (m.quirks.fused_qkv || m.quirks.fused_gate_up))
    throw Error(ErrorKind::unsupported, "--lora: Phi-3's fused qkv_proj and gate_up_proj are not modelled with LoRA");
  // The MoE block (TorchOps::moe) is measured with the whole model trained, on one GPU and under
  // data parallelism (which shards and buckets the packed experts like any parameter; tensor
  // parallelism is refused by check_layout).
  if (m.moe.enabled() && job.lora_rank)
    throw Error(ErrorKind::unsupported, "--lora: adapters on a mixture of experts are not modelled");
}

// A pipeline stage's optimizers (tools/torch_profile_pp.py, torchtitan's OptimizersContainer): one
// per stage module, stepped module after module; under tensor parallelism without FSDP2 one per
// tensor kind within each (DTensor, then plain: fused AdamW refuses the two in one call).
std::size_t stage_optimizer_kinds(const RankLayout& l) { return l.tensor > 1 && l.strategy != DataStrategy::fsdp ? 2 : 1; }
std::uint8_t stage_optimizer(const RankLayout& l, const Parallelism& p, const ParamTensor& t, std::size_t chunk) {
  const std::size_t kinds = stage_optimizer_kinds(l);
  const std::size_t o = chunk * kinds + (kinds == 2 && !tp_sharded(t, p) ? 1 : 0);
  if (o > 255) throw Error(ErrorKind::unsupported, "a pipeline rank with more than 255 optimizers (stage modules) is not modelled");
  return static_cast<std::uint8_t>(o);
}

// The stage module (chunk) holding a parameter built into `group` (0: the embedding, final norm
// and lm_head; 1 + i: the rank's decoder layer i, counted over its chunks in order).
std::size_t stage_chunk_of(const PipelineStage& s, const ParamTensor& t, std::size_t group) {
  if (group == 0) return t.module == Module::embedding && s.first() ? 0 : s.chunks.size() - 1;
  std::uint64_t before = 0;
  for (std::size_t c = 0; c < s.chunks.size(); ++c) {
    before += s.chunks[c].layers;
    if (group - 1 < before) return c;
  }
  return s.chunks.size() - 1;
}

// The model's parameters as transformers allocates them (ModelSpec's tensor description), then
// peft's adapters. Under LoRA the base is frozen (requires_grad=False) and the adapters are fp32.
// `building`: the model is being built (step 0's pass), not found built (a steady step's prologue,
// which lists what step 0 left allocated).
void build_parameters(Step& st, bool building) {
  AutogradSim& sim = st.sim;
  const ModelSpec& m = st.m;
  const bytes_t rank = st.job.lora_rank;
  const bool fsdp = st.dp->fsdp();
  const std::uint64_t S = st.dp->layout().shard;
  st.groups.assign(st.d.L + 1, {});
  const PipelineStage* stage = st.stage;
  // Tensor parallelism on a model built on the device (the --tp measurements, without FSDP2 or a
  // pipeline, whose modules are parallelized on the meta device): to_empty allocates every
  // parameter whole, then parallelize_module replaces each sharded one, module by module in the
  // plan's order, with its shard (made from the whole one, which is then freed). Nothing of it
  // is left allocated, but the caching allocator keeps the whole parameters' segments (the
  // snapshots in tests/data/tp_fresh_snapshots/: Llama 3.2 1B over 4 ranks holds 48 segments of
  // a whole MLP projection, 64 MiB in fp32). pending_shards: each shard and the whole parameter
  // its parallelize_module frees (kNone: none). A tied model's lm_head (untied_by_plan) gets a
  // storage of its own from to_empty, freed at once when the script ties it again; the tied whole
  // (the embedding's) goes when the last of the two modules holding it is sharded.
  TensorId tied_whole = kNone;
  const bool whole_first = building && st.job.parallel.tensor > 1 && !fsdp && !stage;
  struct PendingShard {
    std::uint64_t order;
    TensorId shard, whole;
    bytes_t chunk_copies = 0;  // each of S chunk copies' bytes (a Shard(1) weight), else 0
  };
  std::vector<PendingShard> pending_shards;
  // every parameter in the order it is made, which is model.parameters()'s (ZeRO-1's partition)
  std::vector<std::pair<TensorId, std::uint64_t>> created;
  // A rank built on the device (DDP, ZeRO-1, TP: tools/torch_profile_dist.py's materialise):
  // to_empty gives a tied lm_head a storage of its own, freed at once when the script ties it
  // again; its segment stays reserved (Llama 3.2 1B over 4 TP ranks, amp-bf16: 5,762 MiB reserved
  // after the build, as measured, 4,760 without it). (from_config on one GPU does the same: the
  // ForCausalLM's nn.Linear, freed by post_init's tie_weights, as the construction snapshots in
  // tests/data/inprocess_alone/ show; but the single-GPU measurements empty the cache after the
  // build, so no segment of it is left when their step begins, and the replay leaves it out.)
  auto lm_head_storage_until_retie = [&](bytes_t bytes) {
    sim.drop(sim.alloc_raw("to_empty: a tied lm_head's own storage, until the retie", bytes, Term::other, Role::workspace,
                           "to_empty", st.r.param_name, ""));
  };
  auto plan_order = [&](const ParamTensor& t, std::size_t group) -> std::uint64_t {
    // the measured plan's order within a decoder layer (tools/torch_profile_dist.py apply_tp_layers):
    // q, k, v, gate, up, then o and down; the embedding and lm_head after every layer
    std::uint64_t within = 7;
    switch (t.module) {
      case Module::q: within = 0; break;
      case Module::k: within = 1; break;
      case Module::v: within = 2; break;
      case Module::gate: within = 3; break;
      case Module::up: within = 4; break;
      case Module::o: within = 5; break;
      case Module::down: within = 6; break;
      case Module::embedding: return std::uint64_t{1} << 40;
      case Module::lm_head: return (std::uint64_t{1} << 40) + 1;
      default: break;
    }
    return group * 16 + within * 2 + (t.bias ? 1 : 0);
  };
  // Under FSDP2 these are the unsharded parameters the forward uses (param_dtype), each one padded
  // storage of S shards; their gradients have the parameter's own size. The model is built on the
  // meta device (torchtitan's recipe, and the measurements'): fully_shard then allocates the shards
  // alone, and an unsharded parameter's storage first exists at its first all-gather.
  auto P = [&](const ParamTensor& t, std::size_t group) {
    const bytes_t n = t.elements();
    const bool shard_later = whole_first && tp_sharded(t, st.job.parallel);
    const TensorId id =
        fsdp ? sim.meta_param("FSDP2 unsharded parameters (all-gathered)", mul(mul(S, fsdp_padded_shard(t, S)), st.r.param),
                              Term::other, st.r.param_name, rank == 0)
        : shard_later ? sim.meta_param("parameters", mul(n, st.r.param), Term::model_states, st.r.param_name, rank == 0)
                      : sim.param("parameters", mul(n, st.r.param), Term::model_states, st.r.param_name, rank == 0);
    if (shard_later) {  // the whole parameter to_empty allocated: the shard's bytes on every rank
      const bytes_t whole_bytes = mul(n, st.r.param, st.job.parallel.tensor);
      TensorId whole = kNone;
      if (m.untied_by_plan && t.module == Module::lm_head) {
        lm_head_storage_until_retie(whole_bytes);
        whole = tied_whole;  // the tied whole (the embedding's) goes with this last shard
      } else {
        whole = sim.alloc_raw("to_empty: a whole parameter, until parallelize_module shards it", whole_bytes, Term::other,
                              Role::workspace, "to_empty", st.r.param_name, "");
        if (m.untied_by_plan && t.module == Module::embedding) {  // lm_head still holds it after this shard
          tied_whole = whole;
          whole = kNone;
        }
      }
      // RowwiseParallel shards a Linear's weight on dim 1, whose chunks are not contiguous:
      // distribute_tensor's _split_tensor copies every chunk (S of them) before the rank's own is
      // made, and they go last first after it (the Llama 3.1 8B vocabulary-parallel rank's
      // construction snapshot, tests/data/inprocess_alone/: o_proj's four 8 MiB copies). Dim-0
      // shards (ColwiseParallel, the embedding's rows) are views: no copies.
      const bool dim1 = (t.module == Module::o || t.module == Module::down) && !t.bias;
      pending_shards.push_back({plan_order(t, group), id, whole, dim1 ? mul(n, st.r.param) : 0});
    }
    if (fsdp) {
      sim.set_grad_bytes(id, mul(n, st.r.param));
      sim.set_state_elements(id, fsdp_local_shard(t, S, st.dp->layout().shard_rank));
    }
    // the plain parameters' optimizer steps after the DTensors' (optimizer_per_tensor_kind); a
    // pipeline stage's modules each have their own (stage_optimizer)
    if (stage)
      sim.set_optimizer(id, stage_optimizer(st.dp->layout(), st.job.parallel, t, stage_chunk_of(*stage, t, group)));
    else if (optimizer_per_tensor_kind(st.job.parallel) && !dtensor_parameter(t, st.job.parallel))
      sim.set_optimizer(id, 1);
    st.groups[group].push_back({id, t});
    created.push_back({id, t.elements()});
    return id;
  };
  const auto outer = m.outer_tensors();
  // A pipeline stage holds the embedding on the first stage only, and the final norm and lm_head
  // on the last only; the last stage of a tied model keeps lm_head as a tensor of its own.
  if (!stage || stage->first()) st.emb = P(outer.front(), 0);
  st.layers.resize(st.d.L);
  // each layer's parameters in the order transformers registers its modules, the order from_config
  // allocates them and torch.optim makes their state in (Phi-3: o_proj before qkv_proj; the norms last)
  for (std::size_t il = 0; il < st.layers.size(); ++il)
    for (const ParamTensor& t : registered_layer_tensors(m, st.model_layer(il))) {
      TensorId* slot = slot_of(st.layers[il], t);
      if (!slot) throw Error(ErrorKind::unsupported, std::string("internal: no inventory slot for ") + to_string(t.module));
      *slot = P(t, il + 1);
      if (il == 0) st.layer0_params.push_back(*slot);
    }
  if (rank)  // peft adds the adapters after the model is built, on every decoder projection
    for (std::size_t il = 0; il < st.layers.size(); ++il)
      for (const ParamTensor& t : m.layer_tensors(st.model_layer(il)))
        if (Adapter* a = t.projection() ? adapter_of(st.layers[il], t.module) : nullptr) {
          a->a = sim.param("LoRA adapters (fp32)", mul(rank, t.in, 4), Term::model_states, "fp32", true, Role::adapter);
          a->b = sim.param("LoRA adapters (fp32)", mul(t.out, rank, 4), Term::model_states, "fp32", true, Role::adapter);
          if (il == 0) st.layer0_params.insert(st.layer0_params.end(), {a->a, a->b});
        }
  if (stage && !stage->last()) return;
  st.lm_head = st.emb;
  for (const ParamTensor& t : outer) {
    if (t.module == Module::final_norm) st.final_norm = P(t, 0);
    if (t.module == Module::lm_head) st.lm_head = P(t, 0);
  }
  if (stage && m.tied_embeddings) st.lm_head = P(outer.front(), 0);  // (shape of the embedding: V × h)
  // (under --sp or --loss-parallel the plan keeps the two apart: its lm_head shard above)
  if (building && !fsdp && !stage && m.tied_embeddings && st.job.parallel.world() > 1)
    lm_head_storage_until_retie(mul(m.vocab_size, m.hidden_size, st.r.param));
  if (st.dp && st.dp->layout().strategy == DataStrategy::zero1) {
    // ZeroRedundancyOptimizer steps (and keeps state for) the whole tensors it gives this rank,
    // in the order it gave them, largest first (Qwen3-30B-A3B's rank in
    // tests/data/inprocess_alone/: its state made 768, 768, then 384 MiB, ...)
    std::vector<std::uint64_t> elements;
    for (const auto& c : created) elements.push_back(c.second);
    const Zero1Assignment a = zero1_assign(elements, st.dp->layout().shard);
    for (std::size_t k = 0; k < a.largest_first.size(); ++k) {
      const std::size_t i = a.largest_first[k];
      sim.set_stepped(created[i].first, a.owner[i] == st.dp->layout().shard_rank, static_cast<std::uint32_t>(k + 1));
    }
  }
  std::stable_sort(pending_shards.begin(), pending_shards.end(),
                   [](const PendingShard& a, const PendingShard& b) { return a.order < b.order; });
  for (const PendingShard& p : pending_shards) {  // parallelize_module: the shard, then the whole one goes
    std::vector<TensorId> copies;
    if (p.chunk_copies)
      for (std::uint64_t c = 0; c < st.job.parallel.tensor; ++c)
        copies.push_back(sim.alloc_raw("parallelize_module: a dim-1 chunk's contiguous copy (_split_tensor)",
                                       p.chunk_copies, Term::other, Role::workspace, "distribute_tensor",
                                       st.r.param_name, ""));
    sim.restore_storage(p.shard);
    for (auto c = copies.rbegin(); c != copies.rend(); ++c) sim.drop(*c);
    if (p.whole != kNone) sim.drop(p.whole);
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

SegmentTails segment_tails(const Step& st, const ModelSpec& sizing, const RankLayout& layout, std::uint64_t state_layers) {
  const Job& job = st.job;
  const bytes_t rank = job.lora_rank;
  const Recipe recipe = recipe_of(job.precision);
  const bool master = recipe.master && !rank;
  const bytes_t sb = rank ? 4 : element_size(recipe.state);
  const bytes_t per_param = job.optimizer == Optimizer::adamw                                                  ? 2
                            : job.optimizer == Optimizer::sgd_momentum || job.optimizer == Optimizer::lion ? 1
                                                                                                            : 0;
  auto tail = [](bytes_t b) { return own_segment_block(b) - round512(b); };
  auto state_tail = [&](bytes_t elems) { return per_param * tail(mul(elems, sb)) + (master ? tail(mul(elems, 4)) : 0); };
  SegmentTails out;
  bytes_t layer0_state = 0;
  if (layout.strategy == DataStrategy::fsdp) {
    // the sharded parameters (their original dtype) and the state of this rank's part of each
    const bytes_t stored = element_size(recipe.param);
    for (std::size_t g = 0; g < st.groups.size(); ++g)
      for (const auto& [id, t] : st.groups[g]) {
        out.params += tail(mul(fsdp_padded_shard(t, layout.shard), stored));
        const bytes_t state = state_tail(fsdp_local_shard(t, layout.shard, layout.shard_rank));
        out.state += state;
        if (g == 1) layer0_state += state;
      }
  } else if (layout.tensor > 1) {
    // parallelize_module makes each rank's shard of a projection from the whole parameter that
    // to_empty allocated, and frees the whole one: the shards (and the optimizer state shaped like
    // them) take blocks carved from those freed ones, not segments of their own (measured: Qwen2.5
    // 1.5B at --tp 2 holds no such tails). The replicated tensors keep theirs.
    // A pipeline's stage modules are parallelized on the meta device first, as torchtitan does:
    // to_empty then allocates each local shard itself, with its tail, while the state shaped like
    // them still fits the blocks the first backward freed (Qwen2.5 1.5B, --pp 2 --tp 2: −0.14%
    // floor with this, +2.1% counting the state's tails, −1.2% counting neither).
    const bool meta_shards = layout.pipeline > 1;
    for (const auto& group : st.groups)
      for (const auto& [id, t] : group) {
        const TensorInfo& info = st.sim.info(id);
        if (tp_sharded(t, job.parallel)) {
          if (meta_shards) out.params += tail(info.bytes);
          continue;
        }
        out.params += tail(info.bytes);
        out.state += state_tail(info.bytes / st.r.param);
      }
  } else {
    std::vector<char> in_layer0(static_cast<std::size_t>(st.input_ids), 0);
    for (TensorId t : st.layer0_params) in_layer0[static_cast<std::size_t>(t)] = 1;
    for (TensorId p = 0; p < st.input_ids; ++p) {
      const TensorInfo& info = st.sim.info(p);
      if (!info.param) continue;
      const bytes_t elems = info.bytes / (rank ? 4 : st.r.param);  // a trainable parameter's elements
      const bytes_t state = !info.requires_grad ? 0 : state_tail(elems);
      out.params += tail(info.bytes);
      out.state += state;
      if (in_layer0[static_cast<std::size_t>(p)]) layer0_state += state;
    }
  }
  // state for the full model's layer count; the parameters are those simulated
  out.state = out.state - layer0_state * st.d.L + layer0_state * state_layers;
  if (layout.strategy == DataStrategy::zero1) {  // the state of the tensors this rank owns (full model)
    out.state = 0;
    const std::vector<Partition> parts = zero1_partition(sizing, layout.shard);
    for (std::uint64_t n : parts[layout.shard_rank].owned) out.state += state_tail(n);
  }
  return out;
}

// The trainable elements this rank's optimizer steps, the largest of its tensors, and the most
// elements one optimizer.step() call takes at once (foreach's temporaries are per call): every
// parameter (or LoRA's adapters), the tensors ZeRO-1 gives this rank, or FSDP2's local shards; under
// tensor parallelism (a local spec) the sharded projections and the replicated rest are two
// optimizers, since torch.optim's fused AdamW refuses DTensor and plain tensors in one call.
struct Trainable {
  std::uint64_t elements = 0, largest = 0, per_step_call = 0;
  // With several optimizers (stage_optimizer, optimizer_per_tensor_kind): each one's elements, in
  // the order they step; empty with one.
  std::vector<std::uint64_t> per_optimizer;
  bool whole_model = false;  // one optimizer over every parameter, whole (one GPU, DDP)

  // One optimizer stepping every trainable element of the rank in one call.
  static Trainable one_optimizer(std::uint64_t elements, std::uint64_t largest) {
    Trainable t;
    t.elements = t.per_step_call = elements;
    t.largest = largest;
    return t;
  }
};
Trainable trainable_elements(const Job& job, const ModelSpec& sizing, const RankLayout& l, const PipelineStage* stage) {
  if (stage) {
    // the stage modules' own parameters (their local shards under FSDP2), each module stepped by
    // its own optimizer; under tensor parallelism without FSDP2 two per module (DTensor and plain)
    Trainable out;
    out.per_optimizer.assign(stage->chunks.size() * stage_optimizer_kinds(l), 0);
    for (std::size_t c = 0; c < stage->chunks.size(); ++c)
      for (const ParamTensor& t : stage_tensors(sizing, *stage, c)) {
        const std::uint64_t mine = l.strategy == DataStrategy::fsdp ? fsdp_local_shard(t, l.shard, l.shard_rank) : t.elements();
        std::uint64_t& o = out.per_optimizer[stage_optimizer(l, job.parallel, t, c)];
        o = checked_add(o, mine, "pipeline stage parameters");
        out.elements = checked_add(out.elements, mine, "pipeline stage parameters");
        out.largest = std::max(out.largest, mine);
      }
    out.per_step_call = *std::max_element(out.per_optimizer.begin(), out.per_optimizer.end());
    if (out.per_optimizer.size() == 1) out.per_optimizer.clear();
    return out;
  }
  if (job.lora_rank) {
    const std::uint64_t n = lora_parameters(sizing, job.lora_rank);
    return Trainable::one_optimizer(n, largest_trainable(sizing, job.lora_rank));
  }
  switch (l.strategy) {
    case DataStrategy::zero1: {
      const Partition p = zero1_partition(sizing, l.shard)[l.shard_rank];
      return Trainable::one_optimizer(p.elements, p.largest);
    }
    case DataStrategy::fsdp: {
      std::uint64_t n = 0, largest = 0;
      for (const ParamTensor& t : model_tensors(sizing)) {
        const std::uint64_t mine = fsdp_local_shard(t, l.shard, l.shard_rank);
        n = checked_add(n, mine, "FSDP2 local shards");
        largest = std::max(largest, mine);
      }
      return Trainable::one_optimizer(n, largest);
    }
    default: break;
  }
  const std::uint64_t n = sizing.parameters().total;
  // (under sequence parallelism every parameter is a DTensor, the norms' replicated: one optimizer)
  if (!optimizer_per_tensor_kind(job.parallel))  // (sequence parallelism's DTensors are shards)
    return {n, largest_trainable(sizing, 0), n, {}, job.parallel.tensor == 1 && job.parallel.expert == 1};
  std::uint64_t dtensors = 0;
  for (const ParamTensor& t : model_tensors(sizing))
    if (dtensor_parameter(t, job.parallel)) dtensors = checked_add(dtensors, t.elements(), "DTensor parameters");
  return {n, largest_trainable(sizing, 0), std::max(dtensors, n - dtensors), {dtensors, n - dtensors}};
}

}  // namespace

// transformers materialises an SDPA mask for a sliding window once the sequence reaches the window
// (forward() says why), for a window on every layer (Mistral, Phi-3) or on every other one
// (Gemma 2: the mask goes to the sliding layers only, Step::layer()).
bool matmul_folds_batch_as_view(const Job& job) { return job.batch == 1; }
bool attention_folds_batch(const ModelSpec& m, const Job& job) {
  // (an unmasked layer: a layer the sliding window masks may still run a fused kernel)
  return attention_runs_as_matmuls(job.attention, job.precision == Precision::fp32, false, m.num_heads != m.num_kv_heads);
}

bool stream_differs_at_batch_one(const ModelSpec& m, const Job& job) {
  return attention_folds_batch(m, job) || (job.parallel.sequence_parallel && job.parallel.tensor > 1);
}

std::uint64_t last_mask_holder(const ModelSpec& m, const Job& job) {
  const bool eager = job.attention == Attention::math;
  if (job.recompute != Recompute::full || (!eager && !sliding_window_mask(m, job))) return 0;
  // the lowest layer of each kind holds that kind's mask last
  std::uint64_t first_sliding = m.num_layers, first_full = m.num_layers;
  for (std::uint64_t l = m.num_layers; l-- > 0;) (m.sliding_layer(l) ? first_sliding : first_full) = l;
  if (!eager) return first_sliding;  // SDPA: only the sliding layers get the bool mask
  // eager: one mask for every layer, or Gemma 2's two (Step::layer_mask)
  return first_sliding < m.num_layers && first_full < m.num_layers ? std::max(first_sliding, first_full) : 0;
}

bool sliding_window_mask(const ModelSpec& m, const Job& job) {
  return job.attention == Attention::flash && m.sliding.enabled() && job.seq >= m.sliding.window;
}

namespace {

// The recipe the model's ops run in: the job's, except that FSDP2's amp-bf16
// (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), no autocast) computes on bf16
// unsharded parameters exactly as the bf16 recipe does; its shards, gradients and optimizer state
// stay fp32 (the stored dtype, optimizer_cost's recipe_of(job.precision)).
Recipe walk_recipe(const Job& job, const RankLayout& l) {
  if (l.strategy == DataStrategy::fsdp && job.precision == Precision::amp_bf16) return recipe_of(Precision::bf16);
  return recipe_of(job.precision);
}

// One simulated training step (step 0, or a steady-state step), in the stages a real step runs:
// the model and batch on the device, the persistent optimizer state and library workspaces, the
// forward, the backward, the optimizer step. Each stage marks the phase whose peak it makes.
class TrainPass {
 public:
  // Writes into `res`: step 0's phases, or the steady step's phases, model states and inventory.
  TrainPass(const ModelSpec& m, const Job& job, const ModelSpec& sizing, bool steady, bool explain, SimTrace* trace,
            TorchStepResult& res, std::optional<PipelineStage> stage = std::nullopt)
      : res_(res),
        stage_(stage),
        sim_(explain),
        layout_(layout_of(sizing, job)),
        // the sharded gradients are in reduce_dtype: fp32 under amp-bf16's policy, else the
        // parameters' dtype, i.e. the shards' dtype either way
        dp_(sim_, layout_, element_size(walk_recipe(job, layout_).param), element_size(recipe_of(job.precision).param),
            element_size(recipe_of(job.precision).param)),
        st_{m, job, {}, RecipeBytes(walk_recipe(job, layout_)), sim_, {}},
        sizing_(sizing),
        steady_(steady) {
    if (trace) sim_.record_to(trace);
    trace_ = trace;
    st_.dp = &dp_;
    st_.masked = sliding_window_mask(m, job);
    auto& d = st_.d;
    // a context-parallel rank runs its share of the sequence (context_parallel shards the batch)
    d.b = job.batch; d.s = rank_seq(job); d.T = mul(job.batch, d.s);
    // (the logits' width: lm_head's rows, a vocabulary shard under the vocabulary-parallel loss)
    d.h = m.hidden_size; d.I = m.intermediate_size; d.V = m.lm_head_vocab();
    d.qd = m.q_dim(); d.kvd = m.kv_dim(); d.a = m.num_heads; d.kva = m.num_kv_heads;
    d.hd = m.head_dim; d.L = m.num_layers;
    if (stage_) {  // a pipeline stage: its layers, no DynamicCache (stage_forward)
      st_.stage = &*stage_;
      for (const PipelineStage::Chunk& c : stage_->chunks)
        for (std::uint64_t il = c.first_layer; il < c.first_layer + c.layers; ++il)
          st_.model_layers.push_back(static_cast<std::size_t>(il));
      st_.dynamic_cache = false;
      d.L = stage_->layers;
    }
  }

  // The parameters (and adapters), the batch, and the whole segments the parameters hold.
  void load_model_and_batch() {
    build_parameters(st_, !steady_);
    // SP's vocabulary-sharded embedding: its backward computes the whole V × h weight gradient
    // (Replicate) and keeps this rank's rows as a view of it (Replicate → Shard(0) narrows dim 0
    // without a copy), so the whole buffer lives as long as .grad (the snapshot frees it in zero_grad).
    if (st_.sp())
      sim_.set_grad_bytes(st_.emb, mul(st_.d.V, st_.job.parallel.tensor, st_.d.h, st_.r.param));
    if (dp_.fsdp()) {
      for (auto& g : st_.groups) dp_.add_group(std::move(g));
      dp_.shard(!steady_);
    }
    weights_ = sim_.live();
    if (dp_.ddp()) {
      const bytes_t before = sim_.live();
      // DDP wraps the model, or each pipeline stage module
      const std::vector<ParamTensor> wrapped = stage_ ? stage_tensors(sizing_, *stage_) : model_tensors(sizing_);
      // the construction's broadcast goes through module.parameters() as registered: within a
      // layer the attention, the MLP, then the norms, so the first layer's bucket closes without
      // its norms (Llama 3.1 8B: 384 MiB, then 384.03 MiB buckets: a 384 and a 386 MiB segment)
      if (!steady_)
        dp_.sync_module_states(stage_ ? registered_stage_tensors(sizing_, *stage_) : registered_tensors(sizing_));
      dp_.allocate_buckets(wrapped, steady_);
      buckets_ = sim_.live() - before;
    }
    // a pipeline step's batch is every microbatch's sequences (the schedule splits it)
    const bytes_t T = stage_ ? mul(st_.d.T, stage_->microbatches) : st_.d.T;
    st_.input_ids = sim_.make("input_ids and labels", mul(T, 8), Term::other, Role::input, "inputs", "int64", "b·s", false);
    st_.labels = sim_.make("input_ids and labels", mul(T, 8), Term::other, Role::input, "inputs", "int64", "b·s", false);
    // The optimizer holds the trainable parameters: all of them, or the sizing model's fp32 adapters.
    const Trainable tr = trainable_elements(st_.job, sizing_, layout_, st_.stage);
    oc_ = optimizer_cost(st_.job, sizing_, tr.elements, tr.largest, tr.per_step_call, tr.per_optimizer, tr.whole_model);
    tails_ = segment_tails(st_, sizing_, layout_, stage_ ? stage_->layers : sizing_.num_layers);
    if (layout_.offload) {  // FSDP2's CPUOffloadPolicy: the optimizer steps host tensors; nothing of it on the GPU
      host_state_ = checked_add(oc_.state, oc_.master, "host optimizer state");
      oc_ = {};
      tails_ = {};
    }
    if (trace_) trace_->optimizer_loop = oc_.loop;
    sim_.alloc_raw("allocator: whole segments held by parameters", tails_.params, Term::other, Role::workspace,
                   kCachingAllocatorOp);
  }

  // What a steady step finds allocated: the optimizer state (and the fp32 master copy), which stay
  // for the rest of the run, and both cuBLAS workspaces.
  void allocate_persistent_state() {
    if (oc_.several()) {
      for (std::size_t o = 0; o < oc_.state_of.size(); ++o) allocate_optimizer_state(static_cast<std::uint8_t>(o));
    } else {
      allocate_optimizer_state();
    }
    cublas_workspace();
    cublas_workspace();
    if (!stage_) return;
    allocate_pipeline_buffers();
    // the last stage's output_chunks from the previous step, until this step's clear_runtime_states
    if (stage_->last())
      for (std::uint64_t i = 0; i < stage_->microbatches; ++i)
        previous_chunks_.push_back(sim_.alloc_raw(kOutputChunk, mul(st_.d.T, st_.d.V, st_.r.compute), Term::logits_loss,
                                                  Role::logits_loss, "PipelineStage.output_chunks", st_.r.compute_name, "b·s·V"));
  }

  // A pipeline step (pipeline.hpp): the schedule's forward and backward actions, one recorded graph
  // per microbatch; tools/torch_profile_pp.py measures it. A stage keeps, per microbatch, its
  // forward's saved tensors and output until that microbatch's backward; the last stage also keeps
  // every output (the logits: PipelineStage.output_chunks) until the next step starts, and step()
  // returns their torch.cat. forward_peak and backward_peak are the highest memory during any
  // forward action (with the loss, on the last stage) and any backward action.
  void pipeline_schedule() {
    const PipelineStage& ps = *stage_;
    sim_.begin_phase(Phase::floor);
    floor_ = sim_.live();
    sim_.begin_phase(Phase::forward_peak);
    Phase current = Phase::forward_peak;
    if (!steady_) {
      cublas_workspace_at_first_matmul();  // the forward thread's handle
      allocate_pipeline_buffers();  // _prepare_forward_infra / _prepare_backward_infra, in the first step()
    }
    for (TensorId t : previous_chunks_) sim_.drop(t);  // clear_runtime_states
    previous_chunks_.clear();
    struct Graph {
      std::size_t first = 0, end = 0;  // its nodes
      TensorId root = kNone;  // the loss (last stage) or the output sent on
    };
    const std::size_t M = static_cast<std::size_t>(ps.microbatches);
    std::vector<Graph> graphs(ps.chunks.size() * M);  // [chunk · M + microbatch]
    std::vector<TensorId> chunks, losses;
    // each stage module's last input gradient (PipelineStage.grads_input), still referenced until
    // the module's next backward replaces it
    std::vector<TensorId> pending_input_grad(ps.chunks.size(), kNone);
    bool autograd_workspace = steady_;
    // FSDP2 within the stage: each microbatch's backward keeps the parameters unsharded and
    // accumulates their unsharded gradients; REDUCE_GRAD after the last reduces them.
    dp_.install_backward_hooks(st_.d.L);
    dp_.set_microbatch_backwards(true);
    bytes_t most_in_flight = 0;
    for (const PipelineAction& a : schedule_actions(ps)) {
      const Phase phase = a.forward ? Phase::forward_peak : Phase::backward_peak;
      if (phase != current) sim_.begin_phase(current = phase);
      const std::size_t mb = static_cast<std::size_t>(a.microbatch);
      Graph& g = graphs[a.chunk * M + mb];
      const bool first = ps.chunk_first(a.chunk), last = ps.chunk_last(a.chunk);
      const TensorId recv = first ? kNone : recv_[a.chunk][mb];
      if (a.forward) {
        g.first = sim_.node_count();
        const TensorId out = stage_forward(st_, ps, a.chunk, recv, checkpointed());
        if (last) {
          chunks.push_back(out);  // output_chunks holds the logits (their one reference)
          sim_.set_section(static_cast<int>(st_.d.L) + 2);  // the loss is the schedule's, outside the stage module
          g.root = pipeline_loss(st_, out);
        } else {
          g.root = out;  // fwd_cache holds it until the backward
        }
        g.end = sim_.node_count();
        if (steady_ && sim_.live() > most_in_flight) {  // the activations with the most microbatches in flight
          most_in_flight = sim_.live();
          note_after_forward();
        }
        continue;
      }
      if (!autograd_workspace) cublas_workspace_at_first_matmul();  // the autograd thread's handle, in step 0's first backward
      autograd_workspace = true;
      // ScheduleGPipe releases the previous microbatch's gradient send before the next backward;
      // Schedule1F1B and interleaved 1F1B keep it until the module's next backward has run.
      TensorId& pending = pending_input_grad[a.chunk];
      const bool release_first = ps.schedule == PipelineSchedule::gpipe;
      if (release_first && pending != kNone) sim_.drop_grad(std::exchange(pending, kNone));
      const TensorId seed = last ? kNone : grad_recv_[a.chunk][mb];
      dp_.set_last_microbatch(a.microbatch + 1 == ps.microbatches);  // DDP: the backward outside no_sync()
      sim_.backward(g.root, {g.first, g.end, seed, recv}, checkpointed() ? recompute_layer : nullptr, &st_);
      if (last) losses.push_back(g.root);  // the schedule's list of losses
      else sim_.drop(g.root);
      if (pending != kNone) sim_.drop_grad(pending);
      pending = recv;
    }
    dp_.set_microbatch_backwards(false);
    dp_.reduce_grads();  // perform_reduce_grad, after every microbatch's backward
    // the last input gradients go when _step_microbatches returns, after REDUCE_GRAD (Llama 3.2 1B's
    // last stage under 1F1B x FSDP2 4: freed at step()'s line 604, after the reduce-scatter output's
    // final callback; tests/data/inprocess_alone/*_build)
    for (TensorId pending : pending_input_grad)
      if (pending != kNone) sim_.drop_grad(pending);
    if (ps.last())  // step() returns merge_chunks(output_chunks): the caller drops it
      sim_.transient("pipeline: step()'s merged output (torch.cat of the chunks, dropped by the caller)",
                     mul(st_.d.T, st_.d.V, st_.r.compute, ps.microbatches), Term::logits_loss, Role::logits_loss);
    for (TensorId l : losses) sim_.drop(l);
    collect_gradients();
  }

  // The step's micro-batches (Job::grad_accum_steps; simulated_accum_steps of them are walked),
  // each a forward and a backward of its own graph: from the second on, the gradients the first
  // made are allocated through the forward, and the backward adds into them in place
  // (AutogradSim::grad_contribution's AccumulateGrad). The phases are each one's highest over the
  // micro-batches (AutogradSim::take_phases), as max_memory_allocated() over the phase would read.
  // Under DDP every micro-batch but the last runs in no_sync(): the reducer leaves the gradients
  // in .grad (with gradient_as_bucket_view, the last one's hooks move them into the buckets).
  // FSDP2 reduce-scatters every micro-batch, the later ones adding into the first's sharded
  // gradients, or (--fsdp-grad-sync last) keeps the unsharded gradients until the last reduces them.
  void micro_batches() {
    const std::uint64_t n = simulated_accum_steps(st_.job);
    const bool fsdp_sync_last = dp_.fsdp() && st_.job.parallel.fsdp_grad_sync_last;
    for (std::uint64_t i = 0; i < n; ++i) {
      const bool last = i + 1 == n;
      dp_.set_last_microbatch(last);
      if (dp_.fsdp()) dp_.set_microbatch_backwards(fsdp_sync_last && !last, /*reshard_after_backward=*/true);
      else dp_.set_microbatch_backwards(n > 1);
      // (the first graph from node 0, as a step without accumulation walks it)
      const std::size_t first_node = i == 0 ? 0 : sim_.node_count();
      forward(i == 0);
      backward({first_node, sim_.node_count()}, i == 0);
    }
    dp_.set_microbatch_backwards(false);
    collect_gradients();
  }

  void forward(bool first_micro_batch) {
    if (first_micro_batch) {
      sim_.begin_phase(Phase::floor);
      floor_ = sim_.live();
    }
    sim_.begin_phase(Phase::forward_peak);
    if (!steady_ && first_micro_batch) cublas_workspace_at_first_matmul();  // the forward thread's handle, in step 0
    loss_ = membudget::detail::forward(st_, checkpointed());
    // what a forward leaves for backward: the first micro-batch's (the later ones' are the same
    // tensors, beside the gradients)
    if (steady_ && first_micro_batch) note_after_forward();
  }

  void backward(AutogradSim::Graph graph, bool first_micro_batch) {
    sim_.begin_phase(Phase::backward_peak);
    if (!steady_ && first_micro_batch) cublas_workspace_at_first_matmul();  // the autograd thread's handle, in step 0
    dp_.install_backward_hooks(st_.d.L);
    sim_.backward(loss_, graph, checkpointed() ? recompute_layer : nullptr, &st_);
    sim_.drop(loss_);
  }

  // The parameters' gradients the optimizer steps (and zero_grad frees).
  void collect_gradients() {
    for (TensorId p = 0; p < st_.input_ids; ++p) {
      if (!sim_.info(p).param) continue;
      const TensorId g = sim_.grad_of(p);
      if (g == kNone) continue;
      grad_ids_.push_back(g);
    }
    // FSDP2's gradients are its reduce-scatter outputs (the unsharded ones are gone)
    for (TensorId g : dp_.sharded_grads()) grad_ids_.push_back(g);
    for (TensorId g : grad_ids_) grads_ += sim_.info(g).rounded;
    grads_ += buckets_;  // DDP's buckets hold a copy of every gradient
  }

  // What the forward leaves for backward, by term (the report's activation figures).
  void note_after_forward() {
    sim_.mark_after_forward();
    const auto by_term = sim_.live_by_term();
    res_.after_forward_activations = by_term[static_cast<int>(Term::activations)];
    res_.after_forward_logits = by_term[static_cast<int>(Term::logits_loss)];
    res_.after_forward_autocast = by_term[static_cast<int>(Term::model_states)] - weights_ - oc_.state - oc_.master;
    // the saved tensors by name are grouped once the step is over (finish): a GPipe schedule
    // comes here after every microbatch's forward, and grouping its whole live set each time made
    // half of a 256-microbatch step
    after_forward_live_ = sim_.live_tensors();
  }

  // optimizer.step(), then zero_grad(set_to_none=True).
  // torch.optim creates its state lazily in the first step(); with several optimizers (per tensor
  // kind, per pipeline stage module) each step() makes its own parameters' state, then its
  // temporaries, one optimizer after the other.
  void optimizer_step() {
    sim_.begin_phase(Phase::optimizer_peak);
    auto temporaries = [&](bytes_t bytes, std::uint8_t optimizer) {
      const TensorId tmp = sim_.alloc_raw("optimizer temporaries", bytes, Term::model_states, Role::optimizer_temporary,
                                          "optimizer.step", "", "");
      sim_.set_optimizer(tmp, optimizer);
      sim_.drop(tmp);
    };
    if (!oc_.several()) {
      if (!steady_) allocate_optimizer_state();
      temporaries(oc_.transient, 0);
    } else {
      for (std::size_t o = 0; o < oc_.state_of.size(); ++o) {
        if (!steady_) allocate_optimizer_state(static_cast<std::uint8_t>(o));
        temporaries(oc_.transient_of[o], static_cast<std::uint8_t>(o));
      }
    }
    for (TensorId g : grad_ids_) sim_.drop(g);
  }

  // The phases (the floor as measured at the step's start) and, for a steady step, the model states.
  void finish() {
    if (steady_) {
      res_.saved = sim_.groups_of(after_forward_live_, Term::activations);
      res_.saved_logits = sim_.groups_of(after_forward_live_, Term::logits_loss);
    }
    std::vector<PhasePeak> out = sim_.take_phases();  // each phase once (a schedule's at its highest entry)
    sim_.finish_trace();
    out.front() = {Phase::floor, floor_, {}};  // the "floor" phase's peak is the forward's first moment: use floor_
    if (!steady_) {
      res_.step0 = std::move(out);
      return;
    }
    res_.steady = std::move(out);
    res_.weights = weights_;
    res_.gradients = grads_;
    res_.optimizer_state = oc_.state;
    res_.master = oc_.master;
    res_.host_parameters = dp_.host_parameters();
    res_.host_gradients = dp_.host_gradients();
    res_.host_optimizer_state = host_state_;
  }

 private:
  bool checkpointed() const { return st_.job.recompute == Recompute::full; }
  // PipelineStage's receive buffers, one per microbatch, made in the first step() and kept: the
  // activations from the previous stage (a leaf that requires grad: backward gives it the gradient
  // sent back) on every stage but the first, the gradients from the next on every stage but the last.
  // Each stage module (chunk) has its own.
  void allocate_pipeline_buffers() {
    const bytes_t hidden = mul(st_.d.T, st_.d.h, st_.r.compute);
    const std::size_t chunks = stage_->chunks.size();
    recv_.assign(chunks, {});
    grad_recv_.assign(chunks, {});
    for (std::size_t c = 0; c < chunks; ++c)
      for (std::uint64_t i = 0; i < stage_->microbatches; ++i) {
        if (!stage_->chunk_first(c))
          recv_[c].push_back(sim_.make("pipeline: activation receive buffers (one per microbatch)", hidden, Term::other,
                                       Role::communication, "PipelineStage._prepare_forward_infra", st_.r.compute_name, "b·s·h",
                                       true));
        if (!stage_->chunk_last(c))
          grad_recv_[c].push_back(sim_.make("pipeline: gradient receive buffers (one per microbatch)", hidden, Term::other,
                                            Role::communication, "PipelineStage._prepare_backward_infra", st_.r.compute_name,
                                            "b·s·h", false));
      }
  }
  // The optimizer state and master copy: all of it, or (several optimizers) optimizer o's.
  void allocate_optimizer_state(std::optional<std::uint8_t> o = std::nullopt) {
    const TensorId state = sim_.alloc_raw("optimizer state", o ? oc_.state_of[*o] : oc_.state, Term::model_states,
                                          Role::optimizer_state, "optimizer", "", "");
    if (o) {
      sim_.set_optimizer(state, *o);
      if (*o + 1u < oc_.state_of.size()) return;  // (the master copy and the segment tails once, after the last)
    }
    sim_.alloc_raw("master weights (fp32)", oc_.master, Term::model_states, Role::master_weight, "optimizer", "fp32", "");
    sim_.alloc_raw("allocator: whole segments held by optimizer state", tails_.state, Term::other, Role::workspace,
                   kCachingAllocatorOp);
  }
  // cuBLAS workspace, one per handle (forward and autograd threads), kept once made: 32 MiB on
  // Hopper (CUBLAS_WORKSPACE_CONFIG :4096:8).
  static constexpr const char* kCublasWorkspaceName = "cuBLAS workspaces (forward and autograd threads)";
  void cublas_workspace() {
    sim_.alloc_raw(kCublasWorkspaceName, kCublasWorkspace, Term::other, Role::workspace, "cublas");
  }
  // A handle's first matmul: cuBLAS takes its workspace inside the call, after the call's output
  // is allocated (the snapshot of tests/data/fsdp_reserved_snapshots/qwen2.5-1.5b_fsdp-offload: the
  // autograd thread's 32 MiB lands right after lm_head's weight gradient, splitting the freed
  // logits-sized block it shares, so a later step needs one logits-sized segment more).
  void cublas_workspace_at_first_matmul() { sim_.allocate_at_next_matmul(kCublasWorkspaceName, kCublasWorkspace); }

  TorchStepResult& res_;
  std::optional<PipelineStage> stage_;  // a pipeline stage's step (st_.stage points here)
  AutogradSim sim_;
  RankLayout layout_;
  DataParallelSim dp_;
  Step st_;
  const ModelSpec& sizing_;
  bool steady_;
  SimTrace* trace_ = nullptr;  // where the step is recorded (for the replay), if anywhere
  OptimizerCost oc_;
  SegmentTails tails_;
  bytes_t weights_ = 0, floor_ = 0, grads_ = 0, buckets_ = 0, host_state_ = 0;
  TensorId loss_ = kNone;
  std::vector<TensorId> grad_ids_;
  std::vector<std::vector<TensorId>> recv_, grad_recv_;  // a pipeline rank's buffers, [chunk][microbatch]
  std::vector<TensorId> previous_chunks_;
  std::vector<TensorId> after_forward_live_;  // the live tensors when the after-forward figures were taken
};

}  // namespace

TorchStepResult simulate_torch_train(const ModelSpec& full, const Job& job, bool explain, const ModelSpec* full_sizing,
                                     std::array<SimTrace, 2>* traces) {
  // A tensor-parallel rank runs the decoder on its share of the heads and of the MLP width.
  check_simulated(full, job);
  const ModelSpec m = rank_spec(full, job.parallel);
  const ModelSpec sizing = rank_spec(full_sizing ? *full_sizing : full, job.parallel);
  check_torch_coverage(m, job);
  TorchStepResult res;
  // A pipeline stage (the rank is the stage): its layers, its schedule.
  const std::optional<PipelineStage> stage =
      job.parallel.pipeline > 1 ? std::optional(pipeline_stage(sizing, job, layout_of(sizing, job).rank)) : std::nullopt;
  for (int pass = 0; pass < 2; ++pass) {  // step 0, then a steady-state step
    const bool steady = pass == 1;
    TrainPass step(m, job, sizing, steady, explain, traces ? &(*traces)[pass] : nullptr, res, stage);
    step.load_model_and_batch();
    if (steady) step.allocate_persistent_state();
    if (stage) step.pipeline_schedule();
    else step.micro_batches();
    step.optimizer_step();
    step.finish();
  }
  return res;
}

}  // namespace membudget::detail
