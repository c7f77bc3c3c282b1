// membudget/spec.hpp: what a model is, as an immutable value with derived dimensions.
//
// A ModelSpec holds the raw hyper-parameters (one field each, with an example value from
// Llama 3.2 1B) and derives the rest (q_dim(), kv_dim(), parameters()). Optional architecture
// features (sliding windows, MLA latent caches) are grouped in their own structs. Specs come from
// our YAML schema (docs/model-spec.md) or a Hugging Face config.json, both through load_model().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "membudget/bytes.hpp"

namespace membudget {

enum class MlpKind {
  gated_silu,  // SwiGLU: gate, up (h→I), down (I→h); Llama, Mistral, Qwen
  gated_gelu,  // GeGLU with tanh GeLU; Gemma
  plain_gelu,  // fc1 (h→I), GeLU, fc2 (I→h); GPT-2 style, the textbook 4h MLP
};
enum class NormKind { rmsnorm, layernorm };

const char* to_string(MlpKind k) noexcept;
const char* to_string(NormKind k) noexcept;

// Sliding-window attention (Mistral: every layer; Gemma 2: every other layer).
struct SlidingWindow {
  std::uint64_t window = 0;        // tokens; 0 = no sliding window. Mistral 7B v0.1: 4096
  std::uint64_t every_nth = 1;     // 1 = all layers; 2 = layers 0, 2, 4, … (Gemma 2)
  bool enabled() const noexcept { return window > 0; }
  // Number of layers (of n) that use the window.
  std::uint64_t windowed_layers(std::uint64_t n) const noexcept {
    if (!enabled()) return 0;
    return every_nth <= 1 ? n : (n + every_nth - 1) / every_nth;
  }
};

// DeepSeek-style multi-head latent attention: the KV cache holds a latent of kv_lora_rank plus a
// shared rotary key of qk_rope_head_dim per token and layer.
struct LatentAttention {
  std::uint64_t kv_lora_rank = 0;      // DeepSeek-V3: 512
  std::uint64_t qk_rope_head_dim = 0;  // DeepSeek-V3: 64
  std::uint64_t q_lora_rank = 0;       // DeepSeek-V3: 1536 (0 = plain q projection)
  std::uint64_t qk_nope_head_dim = 0;  // DeepSeek-V3: 128
  std::uint64_t v_head_dim = 0;        // DeepSeek-V3: 128
  bool enabled() const noexcept { return kv_lora_rank > 0; }
};

// Mixture-of-experts MLPs (transformers 5: the routed experts of a layer are two packed 3-D
// parameters, gate_up_proj (E, 2·I_e, h) and down_proj (E, h, I_e), beside a router h → E).
struct MixtureOfExperts {
  std::uint64_t experts = 0;         // routed experts per MoE layer; Mixtral 8x7B: 8 (0: a dense model)
  std::uint64_t top_k = 0;           // experts per token; Mixtral: 2
  std::uint64_t expert_ff = 0;       // one expert's intermediate width; Qwen3-30B-A3B: 768
  std::uint64_t shared_ff = 0;       // a shared expert's MLP width beside the routed ones (0: none);
                                     // Qwen1.5-MoE: 5632, DeepSeek-V2-Lite: 2 × 1408
  bool shared_gate = false;          // Qwen2-MoE's sigmoid gate on the shared expert (h → 1)
  // The MoE block registers its router before the routed experts (Mixtral's, Qwen2-MoE's and
  // OLMoE's SparseMoeBlock: self.gate, then self.experts); Qwen3-MoE and DeepSeek register the
  // experts first. model.parameters() follows it, and with it the order parameters are built, and
  // an optimizer makes its state and steps.
  bool router_first = false;
  bool router_bias = false;          // DeepSeek-V3's noaux_tc routing: an e_score_correction_bias buffer (E fp32)
  std::uint64_t first_dense = 0;     // layers 0 … first_dense − 1 are dense (DeepSeek first_k_dense_replace)
  std::uint64_t sparse_step = 1;     // MoE on every step-th layer (Qwen decoder_sparse_step: (il + 1) % step == 0)
  std::vector<std::uint64_t> dense_layers;  // layers that stay dense (Qwen mlp_only_layers)
  // The router. softmax_top_k: transformers 5.17's Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE
  // TopKRouter (softmax over the experts in fp32, top-k, then the options below). deepseek_v2:
  // DeepseekV2TopkRouter (an fp32 gate, greedy or group-limited top-k over `groups` groups keeping
  // `group_top_k`, the weights times routed_scaling_factor; the shared experts run after the routed
  // ones, ungated). deepseek_v3: sigmoid scores with a correction bias (noaux_tc), described for
  // counting but not yet walked.
  enum class Router : std::uint8_t { softmax_top_k, deepseek_v2, deepseek_v3 };
  Router router = Router::softmax_top_k;
  std::uint64_t groups = 1, group_top_k = 1;  // deepseek_v2 group_limited_greedy (n_group, topk_group)
  bool group_limited = false;
  // The groups split the experts evenly and routing keeps 1 to all of them.
  bool groups_well_formed() const noexcept {
    return groups != 0 && experts % groups == 0 && group_top_k != 0 && group_top_k <= groups;
  }
  bool normalize_top_k = false;      // the k weights divided by their sum (norm_topk_prob; Mixtral always)
  bool weights_fp32 = false;         // the weights stay fp32 (Mixtral); else cast to the router logits' dtype
  // config.json's output_router_logits: the load-balancing loss joins training by default (as
  // Job::router_aux_loss does; transformers reads the config when the call does not say)
  bool output_router_logits = false;
  // One expert-parallel rank's view (rank_spec in the simulator; 1 in every loaded model): the
  // packed experts hold experts / expert_ranks of them, the router still scores all `experts`.
  std::uint64_t expert_ranks = 1;
  std::uint64_t local_experts() const noexcept { return expert_ranks > 1 ? experts / expert_ranks : experts; }
  bool enabled() const noexcept { return experts > 0; }
  bool operator==(const MixtureOfExperts&) const = default;
};

// Architecture quirks: behaviour that differs between families of the same layer layout, as typed
// fields. The loaders set them once (from config.json's model_type, or the YAML `family` and
// `quirks:` keys); nothing downstream compares family names.
struct ArchQuirks {
  bool fused_qkv = false;           // one qkv_proj whose output is sliced into q, k, v (Phi-3)
  bool fused_gate_up = false;       // one gate_up_proj whose output is chunked (Phi-3)
  bool norm_weight_offset = false;  // RMSNorm scales by (1 + w), in fp32 (Gemma, Gemma 2)
  bool embedding_scale = false;     // embeddings multiplied by sqrt(hidden_size) (Gemma, Gemma 2)
  bool partial_rotary = false;      // rotary through the partial-rotary path: rotated part cat'ed
                                    // with the pass-through part, a copy (Phi-3)
  bool qk_norm_full_width = false;  // q_norm / k_norm over the whole q and k width, not per head (OLMoE)
  bool complex_rotary = false;      // rotary through complex multiplication (DeepSeek-V2's apply_rotary_emb)
  bool interleaved_rotary = false;  // rotary over even/odd slices (DeepSeek-V3's rope_interleave, its default)
  // the model's forward makes a sliding-window attention mask that no layer takes, and holds it
  // until it returns (transformers' Qwen2-MoE: causal_mask_mapping's sliding entry, though
  // use_sliding_window is false)
  bool unused_sliding_mask = false;
  bool operator==(const ArchQuirks&) const = default;
};

// The modules of a decoder layer (and of the model's two ends) that own parameters.
enum class Module : std::uint8_t {
  embedding, final_norm, lm_head,
  attn_norm,      // before attention (input_layernorm)
  mlp_norm,       // before the MLP (Llama's post_attention_layernorm, Gemma 2's pre_feedforward_layernorm)
  attn_out_norm,  // on the attention branch (Gemma 2's post_attention_layernorm)
  mlp_out_norm,   // on the MLP branch (Gemma 2's post_feedforward_layernorm)
  q, k, v, qkv, o, q_norm, k_norm,
  q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b,  // multi-head latent attention
  gate, up, gate_up, down, fc1, fc2,
  router,            // a mixture-of-experts layer's router (h → E)
  experts_gate_up,   // the routed experts' packed gate and up projections (E × h → 2·I_e)
  experts_down,      // the routed experts' packed down projections (E × I_e → h)
  shared_gate, shared_up, shared_down,  // the shared expert's MLP
  shared_expert_gate,  // Qwen2-MoE's gate on the shared expert (h → 1)
};
const char* to_string(Module m) noexcept;

// One parameter tensor: a projection's weight (in → out features), or a vector of `out` values (a
// norm's weight, any bias).
struct ParamTensor {
  Module module = Module::embedding;
  std::uint64_t in = 0;   // input features of a projection weight; 0 for a vector
  std::uint64_t out = 0;  // output features, or the vector's length
  bool bias = false;      // the module's bias (a layernorm's too), not its weight
  std::uint64_t count = 1;  // matrices packed in one tensor (routed experts: E), else 1
  bool projection() const noexcept { return in > 0; }  // LoRA's targets; what quantization packs
  std::uint64_t elements() const;                      // checked count·in·out (or out)
};

struct Biases {
  bool qkv = false;   // Qwen2/2.5: true
  bool o = false;     // attention output projection
  bool mlp = false;   // GPT-2 style MLPs
};

struct ParameterCounts {
  std::uint64_t embedding = 0;   // V·h
  std::uint64_t per_layer = 0;   // attention + MLP + norms of decoder layer 0
  std::uint64_t layers = 0;      // all decoder layers (per_layer · L when they are alike)
  std::uint64_t final_norm = 0;  // h (RMSNorm) or 2h (LayerNorm)
  std::uint64_t lm_head = 0;     // V·h when untied, else 0
  std::uint64_t total = 0;
  // Number of distinct parameter tensors (the allocator rounds each to 512 B).
  std::uint64_t tensors = 0;
  std::uint64_t per_layer_tensors = 0;  // layer 0's
  // What one token uses: every parameter but the routed experts it is not sent to (a dense model:
  // total).
  std::uint64_t active = 0;
};

struct ModelSpec {
  std::string name;                   // "llama-3.2-1b"
  // How an error message names the model: its name, or "the model" for a spec without one.
  std::string display_name() const { return name.empty() ? std::string("the model") : name; }
  std::string family;                 // "llama", "qwen2", "gemma2", …: the loader sets `quirks` from it
  std::uint64_t vocab_size = 0;       // 128256
  std::uint64_t hidden_size = 0;      // 2048
  std::uint64_t intermediate_size = 0;// 8192
  std::uint64_t num_layers = 0;       // 16
  std::uint64_t num_heads = 0;        // 32
  std::uint64_t num_kv_heads = 0;     // 8 (GQA); = num_heads for MHA; 1 for MQA
  std::uint64_t head_dim = 0;         // 64
  bool tied_embeddings = false;       // true for Llama 3.2 1B / 3B
  // lm_head's rows when they are not the vocabulary: 0 (the vocabulary) for a model as loaded; a
  // tensor-parallel rank's vocabulary shard under the vocabulary-parallel loss without sequence
  // parallelism (the embedding stays whole; detail::tp_local_spec sets it). Needs an untied head.
  std::uint64_t lm_head_rows = 0;
  // A tensor-parallel rank's view only (false for a model as loaded): the model ties lm_head to the
  // embedding and the rank's plan (sequence parallelism, the vocabulary-parallel loss) made them
  // two tensors (tied_embeddings is then false).
  bool untied_by_plan = false;
  std::uint64_t lm_head_vocab() const noexcept { return lm_head_rows ? lm_head_rows : vocab_size; }  // the logits' width
  MlpKind mlp = MlpKind::gated_silu;
  NormKind norm = NormKind::rmsnorm;
  Biases bias;
  std::uint64_t max_positions = 0;    // 131072 (a config.json's RoPE scaling applied as vLLM derives it)
  // vLLM's default max_model_len where it is not max_positions: LongRoPE's original context
  // (config.json's original_max_position_embeddings; Phi-3 128K: 4096); 0 otherwise. Only `serve`
  // reads it, so the plans' keys (job_key.hpp) leave it out.
  std::uint64_t default_max_model_len = 0;
  std::uint64_t norms_per_layer = 2;  // Gemma 2: 4 (pre/post attention and feed-forward)
  bool qk_norm = false;               // Qwen3: RMSNorm over head_dim on q and k
  double final_logit_softcap = 0;     // Gemma 2: 30 (adds elementwise ops over the logits)
  double attn_logit_softcap = 0;      // Gemma 2: 50 (tanh-capped attention scores; eager attention only)
  SlidingWindow sliding;
  LatentAttention mla;
  ArchQuirks quirks;
  MixtureOfExperts moe;

  // ---- the model's tensors: the one description that the parameter count, weight bytes, the
  // inventories, serving, advise and the KV cache derive from ----
  // Decoder layer `il`'s parameter tensors, in a fixed order (norms, attention, biases, MLP, q/k
  // norms). Per-layer accessors take the layer index so that layers may differ (a dense first
  // layer before mixture-of-experts layers; today every layer has the same shapes).
  std::vector<ParamTensor> layer_tensors(std::uint64_t il) const;
  // The embedding, the final norm and an untied lm_head.
  std::vector<ParamTensor> outer_tensors() const;
  std::uint64_t n_ff(std::uint64_t il) const noexcept { (void)il; return intermediate_size; }  // a dense layer's
  // Whether layer il's MLP is a mixture of experts (moe.first_dense, sparse_step, dense_layers).
  bool moe_layer(std::uint64_t il) const noexcept;
  // How many layers are mixtures of experts (the rest keep a dense MLP).
  std::uint64_t moe_layers() const noexcept;
  bool sliding_layer(std::uint64_t il) const noexcept {
    return sliding.enabled() && (sliding.every_nth <= 1 || il % sliding.every_nth == 0);
  }

  std::uint64_t q_dim() const noexcept { return num_heads * head_dim; }
  std::uint64_t kv_dim() const noexcept { return num_kv_heads * head_dim; }
  std::uint64_t kv_groups() const noexcept { return num_kv_heads ? num_heads / num_kv_heads : 0; }
  ParameterCounts parameters() const;

  // Throws Error(invalid_spec) naming the first inconsistent field; `where` prefixes messages.
  void validate(std::string_view where = {}) const;
};

// Loads a spec from our YAML schema or a Hugging Face config.json (recognised by its contents,
// not its extension). Throws Error(invalid_spec / parse / io) naming file, line and field.
ModelSpec load_model(const std::string& path);
// A spec file's bytes, as every reader of one reads them (limits::kMaxSpecBytes; Error(io) when
// unreadable).
std::string read_spec_file(const std::string& path);
// The same from the spec's text, read once by a caller that reads its job: section too (a pipe or a
// FIFO cannot be read twice); `path` names it in messages and names a model whose spec does not.
ModelSpec parse_model(std::string_view text, const std::string& path);
ModelSpec parse_model_yaml(std::string_view text, const std::string& where = "<yaml>");
ModelSpec parse_hf_config(std::string_view json_text, const std::string& where = "<config.json>");

}  // namespace membudget
