// spec.cpp: ModelSpec derived counts, validation, the Hugging Face config.json loader and
// load_model. Our YAML schema (docs/model-spec.md) is read in yaml_spec.cpp, the one translation
// unit with yaml-cpp besides yaml_job.cpp, so a build without yaml-cpp (the web page) leaves both out.

#include "membudget/spec.hpp"

#include "membudget/input.hpp"
#include "json_input.hpp"
#include "spec_internal.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

namespace membudget {

const char* to_string(MlpKind k) noexcept {
  switch (k) {
    case MlpKind::gated_silu: return "gated_silu";
    case MlpKind::gated_gelu: return "gated_gelu";
    case MlpKind::plain_gelu: return "plain_gelu";
  }
  return "unknown";
}

const char* to_string(NormKind k) noexcept {
  switch (k) {
    case NormKind::rmsnorm: return "rmsnorm";
    case NormKind::layernorm: return "layernorm";
  }
  return "unknown";
}

namespace {

// Sanity limits: far above any published model, low enough that a typo (an extra digit or two)
// or a garbage value is caught before it turns into a meaningless byte count.
constexpr std::uint64_t kMaxDim = 1ull << 24;        // any width, vocabulary or head count
// (the deepest published model has 126 layers; every question walks each layer, and at 4,096 a
// tiny spec took advise 26 s and max-batch 1.2 GiB; at 1,024 about 9 s and 320 MiB)
constexpr std::uint64_t kMaxLayers = 1024;
constexpr std::uint64_t kMaxPositions = 1ull << 30;  // context length, sliding window

}  // namespace

namespace detail {

std::optional<Problem> find_problem(const ModelSpec& s) {
  auto invalid = [](std::string field, std::string what) {
    return Problem{ErrorKind::invalid_spec, std::move(field), std::move(what)};
  };
  const std::pair<const char*, std::uint64_t> required[] = {
      {"vocab_size", s.vocab_size},     {"hidden_size", s.hidden_size},
      {"intermediate_size", s.intermediate_size}, {"num_layers", s.num_layers},
      {"num_heads", s.num_heads},       {"num_kv_heads", s.num_kv_heads},
      {"head_dim", s.head_dim},         {"max_positions", s.max_positions},
  };
  for (const auto& [name, v] : required)
    if (v == 0) return invalid(name, "must be > 0; set it to the model's value");
  // (a C++ caller can cast any number to an enum)
  auto one_of = [](auto value, std::initializer_list<decltype(value)> kinds) {
    return std::find(kinds.begin(), kinds.end(), value) != kinds.end();
  };
  using Router = MixtureOfExperts::Router;
  const std::pair<const char*, bool> kinds[] = {
      {"mlp", one_of(s.mlp, {MlpKind::gated_silu, MlpKind::gated_gelu, MlpKind::plain_gelu})},
      {"norm", one_of(s.norm, {NormKind::rmsnorm, NormKind::layernorm})},
      {"moe.router", !s.moe.enabled() || one_of(s.moe.router, {Router::softmax_top_k, Router::deepseek_v2, Router::deepseek_v3})}};
  for (const auto& [field, ok] : kinds)
    if (!ok) return invalid(field, "is not one of its kinds (a number cast to the enum)");
  if (s.moe.enabled()) {
    // Each field named as a YAML spec and as a config.json give it (the families' keys differ:
    // Mixtral's num_local_experts, DeepSeek's n_routed_experts).
    const MixtureOfExperts& e = s.moe;
    if (e.top_k == 0 || e.top_k > e.experts)
      return invalid("moe.top_k (config.json: num_experts_per_tok)",
                     "must be from 1 to the number of experts (" + std::to_string(e.experts) + ")");
    if (e.expert_ff == 0) return invalid("moe.expert_ff (config.json: moe_intermediate_size)", "must be > 0");
    if (e.experts > (1u << 16))
      return invalid("moe.experts (config.json: num_experts, num_local_experts or n_routed_experts)", "is absurdly large (limit 65536)");
    if (e.sparse_step == 0) return invalid("moe.sparse_step (config.json: decoder_sparse_step)", "must be at least 1");
    // The shared expert: Qwen2-MoE's beside a softmax top-k router is always gated (its
    // shared_expert_gate), DeepSeek's never; the two are the shapes the MoE block walks.
    const bool softmax_router = e.router == MixtureOfExperts::Router::softmax_top_k;
    if (e.shared_gate && e.shared_ff == 0)
      return invalid("moe.shared_gate", "gates a shared expert, and there is none: set moe.shared_ff or remove shared_gate");
    if (e.shared_ff && softmax_router && !e.shared_gate)
      return Problem{ErrorKind::unsupported, "moe.shared_gate",
                     "a shared expert beside the softmax top-k router is Qwen2-MoE's, gated: set shared_gate: true (an "
                     "ungated one is DeepSeek's: router deepseek_v2 or deepseek_v3)"};
    if (e.shared_gate && !softmax_router)
      return Problem{ErrorKind::unsupported, "moe.shared_gate",
                     "DeepSeek's shared experts are summed ungated; a gate on them is not modelled"};
    // Each layer at most once, so the list is at most the layers long: ModelSpec::moe_layer looks
    // through it for every layer (10 million repeats through the C++ API took max_micro_batch
    // past 6 s).
    std::vector<char> listed(std::min<std::uint64_t>(s.num_layers, kMaxLayers), 0);
    for (std::uint64_t il : e.dense_layers) {
      if (il >= s.num_layers)
        return invalid("moe.dense_layers (config.json: mlp_only_layers)",
                       "layer " + std::to_string(il) + " is not one of the model's " + std::to_string(s.num_layers) + " layers");
      if (il < listed.size() && std::exchange(listed[il], 1))
        return invalid("moe.dense_layers (config.json: mlp_only_layers)", "layer " + std::to_string(il) + " is listed twice");
    }
    // (the loaders refuse these with the line; a C++ caller sets the fields directly)
    if (!e.groups_well_formed())
      return invalid("moe.groups (config.json: n_group)", "must divide moe.experts (" + std::to_string(e.experts) +
                                                              "), with 1 ≤ group_top_k (topk_group) ≤ groups");
    // Group-limited routing picks its top k among the experts of its top groups only.
    if (e.groups > 1 && e.top_k > e.group_top_k * (e.experts / e.groups))
      return invalid("moe.top_k (config.json: num_experts_per_tok)",
                     std::to_string(e.top_k) + " experts cannot be chosen from the " + std::to_string(e.group_top_k) +
                         " groups of " + std::to_string(e.experts / e.groups) + " that routing keeps (group_top_k / topk_group)");
    if (s.num_layers <= kMaxLayers && s.moe_layers() == 0)
      return invalid("moe.first_dense, moe.sparse_step or moe.dense_layers (config.json: first_k_dense_replace, "
                     "decoder_sparse_step, mlp_only_layers)",
                     "leave no layer a mixture of experts; remove the moe section (config.json: the experts) for a dense model");
  }

  const std::pair<const char*, std::uint64_t> dims[] = {
      {"vocab_size", s.vocab_size}, {"hidden_size", s.hidden_size},
      {"intermediate_size", s.intermediate_size}, {"num_heads", s.num_heads},
      {"num_kv_heads", s.num_kv_heads}, {"head_dim", s.head_dim},
      {"moe.expert_ff (config.json: moe_intermediate_size)", s.moe.expert_ff},
      {"moe.shared_ff (config.json: shared_expert_intermediate_size, or n_shared_experts × moe_intermediate_size)",
       s.moe.shared_ff},
  };
  for (const auto& [name, v] : dims)
    if (v > kMaxDim)
      return invalid(name, std::to_string(v) + " exceeds the limit of " + std::to_string(kMaxDim) +
                               "; check the value for a typo");
  if (s.num_layers > kMaxLayers)
    return invalid("num_layers", std::to_string(s.num_layers) + " exceeds the limit of " +
                                     std::to_string(kMaxLayers) + "; check the value for a typo");
  if (s.max_positions > kMaxPositions)
    return invalid("max_positions", std::to_string(s.max_positions) +
                                        " exceeds the limit of " + std::to_string(kMaxPositions) +
                                        "; check the value for a typo");
  if (s.num_kv_heads > s.num_heads || s.num_heads % s.num_kv_heads != 0)
    return invalid("num_kv_heads", "num_heads " + std::to_string(s.num_heads) +
                                       " is not divisible by num_kv_heads " +
                                       std::to_string(s.num_kv_heads) +
                                       "; use a divisor of num_heads (num_heads for multi-head "
                                       "attention, 1 for multi-query)");
  if (s.norms_per_layer < 1 || s.norms_per_layer > 4)
    return invalid("norms_per_layer", "must be between 1 and 4 (got " +
                                          std::to_string(s.norms_per_layer) +
                                          "); 2 for Llama-style layers, 4 for Gemma 2");
  if (!std::isfinite(s.final_logit_softcap) || s.final_logit_softcap < 0)
    return invalid("final_logit_softcap", "must be a finite number >= 0 (0 = no soft-capping)");
  if (s.lm_head_rows && (s.tied_embeddings || s.lm_head_rows > s.vocab_size))
    return invalid("lm_head_rows", "a shard of lm_head's rows needs an untied head and at most vocab_size rows");
  if (!std::isfinite(s.attn_logit_softcap) || s.attn_logit_softcap < 0)
    return invalid("attn_logit_softcap", "must be a finite number >= 0 (0 = no soft-capping)");

  if (s.sliding.enabled()) {
    if (s.sliding.window > kMaxPositions)
      return invalid("sliding_window.window",
                     std::to_string(s.sliding.window) + " exceeds the limit of " +
                         std::to_string(kMaxPositions) + "; check the value for a typo");
    if (s.sliding.every_nth < 1 || s.sliding.every_nth > kMaxLayers)
      return invalid("sliding_window.every_nth",
                     "must be between 1 and " + std::to_string(kMaxLayers) +
                         " (1 = every layer, 2 = every other layer)");
  }

  const auto& m = s.mla;
  const bool any_mla = m.kv_lora_rank || m.qk_rope_head_dim || m.q_lora_rank ||
                       m.qk_nope_head_dim || m.v_head_dim;
  if (any_mla) {
    if (!m.enabled())
      return invalid("mla.kv_lora_rank", "must be > 0 when other mla fields are set");
    const std::pair<const char*, std::uint64_t> mla_dims[] = {
        {"mla.kv_lora_rank", m.kv_lora_rank},         {"mla.qk_rope_head_dim", m.qk_rope_head_dim},
        {"mla.qk_nope_head_dim", m.qk_nope_head_dim}, {"mla.v_head_dim", m.v_head_dim},
    };
    for (const auto& [name, v] : mla_dims) {
      if (v == 0) return invalid(name, "must be > 0 for multi-head latent attention");
      if (v > kMaxDim)
        return invalid(name, std::to_string(v) + " exceeds the limit of " +
                                 std::to_string(kMaxDim) + "; check the value for a typo");
    }
    if (m.q_lora_rank > kMaxDim)
      return invalid("mla.q_lora_rank", std::to_string(m.q_lora_rank) +
                                            " exceeds the limit of " + std::to_string(kMaxDim) +
                                            "; check the value for a typo");
    if (s.head_dim != m.qk_nope_head_dim + m.qk_rope_head_dim)
      return invalid("head_dim", "with mla, head_dim is the query/key head dimension and must "
                                 "equal mla.qk_nope_head_dim + mla.qk_rope_head_dim (" +
                                     std::to_string(m.qk_nope_head_dim + m.qk_rope_head_dim) +
                                     "); got " + std::to_string(s.head_dim));
    if (s.bias.qkv)
      return Problem{ErrorKind::unsupported, "bias.qkv",
                     "projection biases are not supported with mla; set bias.qkv: false"};
    if (s.qk_norm)
      return Problem{ErrorKind::unsupported, "qk_norm",
                     "qk_norm is not supported with mla; set qk_norm: false"};
    // The latent attention walk has no window and no fused projection (DeepSeek's have neither)
    if (s.sliding.enabled())
      return Problem{ErrorKind::unsupported, "sliding_window", "a sliding window is not modelled with mla"};
    if (s.quirks.fused_qkv)
      return Problem{ErrorKind::unsupported, "quirks.fused_qkv", "a fused qkv_proj is not modelled with mla"};
  }
  return std::nullopt;
}

}  // namespace detail

using detail::find_problem;
using detail::quirks_of_family;

void ModelSpec::validate(std::string_view where) const {
  if (auto p = find_problem(*this)) throw Error::field(p->kind, std::string(where), p->field, p->what);
}

const char* to_string(Module m) noexcept {
  switch (m) {
    case Module::embedding: return "embed_tokens";
    case Module::final_norm: return "norm";
    case Module::lm_head: return "lm_head";
    case Module::attn_norm: return "attn_norm";
    case Module::mlp_norm: return "mlp_norm";
    case Module::attn_out_norm: return "attn_out_norm";
    case Module::mlp_out_norm: return "mlp_out_norm";
    case Module::q: return "q_proj";
    case Module::k: return "k_proj";
    case Module::v: return "v_proj";
    case Module::qkv: return "qkv_proj";
    case Module::o: return "o_proj";
    case Module::q_norm: return "q_norm";
    case Module::k_norm: return "k_norm";
    case Module::q_a: return "q_a_proj";
    case Module::q_a_norm: return "q_a_layernorm";
    case Module::q_b: return "q_b_proj";
    case Module::kv_a: return "kv_a_proj_with_mqa";
    case Module::kv_a_norm: return "kv_a_layernorm";
    case Module::kv_b: return "kv_b_proj";
    case Module::gate: return "gate_proj";
    case Module::up: return "up_proj";
    case Module::gate_up: return "gate_up_proj";
    case Module::down: return "down_proj";
    case Module::fc1: return "fc1";
    case Module::fc2: return "fc2";
    case Module::router: return "mlp.gate (router)";
    case Module::experts_gate_up: return "experts.gate_up_proj";
    case Module::experts_down: return "experts.down_proj";
    case Module::shared_gate: return "shared_expert.gate_proj";
    case Module::shared_up: return "shared_expert.up_proj";
    case Module::shared_down: return "shared_expert.down_proj";
    case Module::shared_expert_gate: return "shared_expert_gate";
  }
  return "unknown";
}

std::uint64_t ParamTensor::elements() const {
  const std::string what = std::string("parameters: ") + to_string(module);
  return checked_mul(count, in ? checked_mul(in, out, what) : out, what);
}

std::uint64_t ModelSpec::moe_layers() const noexcept {
  std::uint64_t n = 0;
  for (std::uint64_t il = 0; il < num_layers; ++il) n += moe_layer(il) ? 1 : 0;
  return n;
}

bool ModelSpec::moe_layer(std::uint64_t il) const noexcept {
  if (!moe.enabled() || il < moe.first_dense) return false;
  if (moe.sparse_step > 1 && (il + 1) % moe.sparse_step != 0) return false;
  return std::find(moe.dense_layers.begin(), moe.dense_layers.end(), il) == moe.dense_layers.end();
}

namespace {
// Products of two dimensions, each below 2^24 once validated: checked for specs not validated yet.
std::uint64_t dim_mul(std::uint64_t a, std::uint64_t b, const char* what) {
  return checked_mul(a, b, std::string("parameters: ") + what);
}
}  // namespace

std::vector<ParamTensor> ModelSpec::layer_tensors(std::uint64_t il) const {
  // In data-flow order, each bias right after its weight: the order the harness allocates and
  // initialises them in (src/measure/harness_buffer.hpp), and peft's order of adapted projections.
  std::vector<ParamTensor> v;
  v.reserve(24);
  const std::uint64_t h = hidden_size, I = n_ff(il);
  const bool layernorm = norm == NormKind::layernorm;
  auto vec = [&](Module m, std::uint64_t n, bool is_bias = false) { v.push_back({m, 0, n, is_bias}); };
  auto proj = [&](Module m, std::uint64_t in, std::uint64_t out, bool with_bias = false) {
    v.push_back({m, in, out, false});
    if (with_bias) vec(m, out, true);
  };
  auto norm_of = [&](Module m, std::uint64_t n) {
    vec(m, n);
    if (layernorm) vec(m, n, true);
  };
  // norms_per_layer: 1 the attention norm; 2 + the MLP norm (Llama); 4 + the norms on the attention
  // and MLP branches (Gemma 2)
  norm_of(Module::attn_norm, h);

  if (mla.enabled()) {
    const std::uint64_t q_out = dim_mul(num_heads, checked_add(mla.qk_nope_head_dim, mla.qk_rope_head_dim, "mla qk head"),
                                        "mla query width");
    if (mla.q_lora_rank > 0) {
      proj(Module::q_a, h, mla.q_lora_rank);
      norm_of(Module::q_a_norm, mla.q_lora_rank);
      proj(Module::q_b, mla.q_lora_rank, q_out);
    } else {
      proj(Module::q, h, q_out);
    }
    proj(Module::kv_a, h, checked_add(mla.kv_lora_rank, mla.qk_rope_head_dim, "parameters: mla kv_a width"));
    norm_of(Module::kv_a_norm, mla.kv_lora_rank);
    proj(Module::kv_b, mla.kv_lora_rank,
         dim_mul(num_heads, checked_add(mla.qk_nope_head_dim, mla.v_head_dim, "mla kv_b head"), "mla kv_b width"));
    proj(Module::o, dim_mul(num_heads, mla.v_head_dim, "mla o width"), h, bias.o);
  } else {
    const std::uint64_t qd = dim_mul(num_heads, head_dim, "q_dim"), kvd = dim_mul(num_kv_heads, head_dim, "kv_dim");
    if (quirks.fused_qkv) {
      proj(Module::qkv, h, checked_add(qd, dim_mul(2, kvd, "k and v widths"), "parameters: qkv width"), bias.qkv);
    } else {
      proj(Module::q, h, qd, bias.qkv);
      proj(Module::k, h, kvd, bias.qkv);
      proj(Module::v, h, kvd, bias.qkv);
    }
    proj(Module::o, qd, h, bias.o);
    if (qk_norm) {
      vec(Module::q_norm, quirks.qk_norm_full_width ? qd : head_dim);
      vec(Module::k_norm, quirks.qk_norm_full_width ? kvd : head_dim);
    }
  }
  if (norms_per_layer >= 3) norm_of(Module::attn_out_norm, h);
  if (norms_per_layer >= 2) norm_of(Module::mlp_norm, h);

  if (moe_layer(il)) {
    // transformers 5's MoE block: the router, the packed routed experts, then a shared expert
    proj(Module::router, h, moe.experts);  // (DeepSeek-V3's e_score_correction_bias is a buffer, not a parameter)
    v.push_back({Module::experts_gate_up, h, dim_mul(2, moe.expert_ff, "experts gate_up width"), false, moe.local_experts()});
    v.push_back({Module::experts_down, moe.expert_ff, h, false, moe.local_experts()});
    if (moe.shared_ff) {
      proj(Module::shared_gate, h, moe.shared_ff);
      proj(Module::shared_up, h, moe.shared_ff);
      proj(Module::shared_down, moe.shared_ff, h);
      if (moe.shared_gate) proj(Module::shared_expert_gate, h, 1);
    }
  } else if (mlp == MlpKind::plain_gelu) {
    proj(Module::fc1, h, I, bias.mlp);
    proj(Module::fc2, I, h, bias.mlp);
  } else {
    if (quirks.fused_gate_up) {
      proj(Module::gate_up, h, dim_mul(2, I, "gate_up width"), bias.mlp);
    } else {
      proj(Module::gate, h, I, bias.mlp);
      proj(Module::up, h, I, bias.mlp);
    }
    proj(Module::down, I, h, bias.mlp);
  }
  if (norms_per_layer >= 4) norm_of(Module::mlp_out_norm, h);
  return v;
}

std::vector<ParamTensor> ModelSpec::outer_tensors() const {
  (void)dim_mul(vocab_size, hidden_size, "embedding (vocab_size x hidden_size)");  // names the fields on overflow
  std::vector<ParamTensor> v;
  v.push_back({Module::embedding, vocab_size, hidden_size, false});
  v.push_back({Module::final_norm, 0, hidden_size, false});
  if (norm == NormKind::layernorm) v.push_back({Module::final_norm, 0, hidden_size, true});
  if (!tied_embeddings) v.push_back({Module::lm_head, hidden_size, lm_head_vocab(), false});
  return v;
}

ParameterCounts ModelSpec::parameters() const {
  ParameterCounts c;
  for (const ParamTensor& t : outer_tensors()) {
    const std::uint64_t n = t.elements();
    switch (t.module) {
      case Module::embedding: c.embedding = n; break;
      case Module::lm_head: c.lm_head = n; break;
      default: c.final_norm = checked_add(c.final_norm, n, "parameters: final norm"); break;
    }
    ++c.tensors;
  }
  // Dense layers are alike: layer 0 times L. A mixture-of-experts model sums its layers (dense ones
  // first, MoE ones after), and counts what a token does not use: the routed experts beyond top_k.
  const auto tensors = layer_tensors(0);
  for (const ParamTensor& t : tensors) c.per_layer = checked_add(c.per_layer, t.elements(), "parameters: decoder layer");
  c.per_layer_tensors = tensors.size();
  std::uint64_t idle = 0;
  if (!moe.enabled()) {
    c.layers = checked_mul(c.per_layer, num_layers, "parameters: layers (per layer x num_layers)");
    c.tensors = checked_add(c.tensors, checked_mul(tensors.size(), num_layers, "parameters: tensors"), "parameters: tensors");
  } else {
    if (num_layers > (1u << 20)) throw Error(ErrorKind::invalid_spec, "num_layers: absurdly large for a mixture of experts");
    for (std::uint64_t il = 0; il < num_layers; ++il)
      for (const ParamTensor& t : layer_tensors(il)) {
        c.layers = checked_add(c.layers, t.elements(), "parameters: layers");
        ++c.tensors;
        if (t.count > 1) idle = checked_add(idle, t.elements() / t.count * (t.count - moe.top_k), "parameters: idle experts");
      }
  }
  c.total = checked_add(checked_add(checked_add(c.embedding, c.layers, "parameters: total"), c.final_norm,
                                    "parameters: total"),
                        c.lm_head, "parameters: total");
  c.active = c.total - idle;
  return c;
}

namespace detail {
// The quirks a family implies: the one place that reads a family name (config.json's model_type or
// the YAML `family`). Gemma's RMSNorm and embedding scale hold for every Gemma generation, so the
// match is on the prefix.
ArchQuirks quirks_of_family(std::string_view name) {
  // A YAML family is written by hand: "Gemma2" and "deepseek-v2" are the families they name
  std::string family(name);
  for (char& c : family) c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  ArchQuirks q;
  if (family == "olmoe") q.qk_norm_full_width = true;
  if (family == "deepseek_v2") q.complex_rotary = true;
  if (family == "deepseek_v3") q.interleaved_rotary = true;  // config.json's rope_interleave, its default
  if (family.rfind("gemma", 0) == 0) q.norm_weight_offset = q.embedding_scale = true;
  if (family == "phi3") q.fused_qkv = q.fused_gate_up = q.partial_rotary = true;
  if (family == "qwen2_moe") q.unused_sliding_mask = true;
  return q;
}
}  // namespace detail

// ------------------------------------------------------------------------------------------------
// Hugging Face config.json
// ------------------------------------------------------------------------------------------------

namespace {

using nlohmann::json;

// Every config.json model_type membudget describes, as the messages list them (the dense families,
// then those with experts).
constexpr const char* kSupportedTypes =
    "llama, mistral, qwen2, qwen3, gemma, gemma2, phi3; with experts: mixtral, qwen2_moe, qwen3_moe, olmoe, "
    "deepseek_v2, deepseek_v3";

// A value as it appears in a message: scalars as JSON (at most 64 characters; dump() would
// recurse through a deeply nested value and copy a huge one), containers by their kind.
std::string brief(const json& v) {
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

class JsonReader {
 public:
  JsonReader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  const json* find(std::string_view key) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  // Whether the key is there at all, null included: an absent key takes transformers' default for
  // the family (the config class's field), where null is the value None.
  bool has(std::string_view key) const { return j_.contains(key); }
  // The key as transformers reads it: absent, the config class's default `when_absent`; null, None
  // (nullopt); else its value.
  std::optional<std::uint64_t> uint_or_default(std::string_view key, std::optional<std::uint64_t> when_absent) const {
    return has(key) ? opt_uint(key) : when_absent;
  }
  std::optional<double> double_or_default(std::string_view key, std::optional<double> when_absent) const {
    return has(key) ? opt_double(key) : when_absent;
  }
  // A flag transformers tests with `if config.key:`: absent, the class's default; null, None, false.
  bool flag_or_default(std::string_view key, bool when_absent) const {
    return has(key) ? opt_bool(key).value_or(false) : when_absent;
  }

  Error error(std::string_view key, const std::string& what,
              ErrorKind kind = ErrorKind::invalid_spec) const {
    return Error::field(kind, where_, std::string(key), what);
  }

  std::optional<std::uint64_t> opt_uint(std::string_view key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) return v->get<std::uint64_t>();
    if (v->is_number_integer())
      throw error(key, "must not be negative (got " + brief(*v) + ")");
    if (v->is_number_float()) {
      // (JSON's reader keeps a whole number past 2^64 - 1 as a float)
      const double d = v->get<double>();
      if (std::isfinite(d) && d >= 0x1p64 && d == std::floor(d))
        throw error(key, "is absurdly large (more than 64 bits: " + brief(*v) + ")");
      throw error(key, "must be a whole number (got " + brief(*v) + ")");
    }
    throw error(key, "expected a non-negative integer, got " + brief(*v));
  }

  std::uint64_t req_uint(std::string_view key) const {
    auto v = opt_uint(key);
    if (!v)
      throw Error(ErrorKind::invalid_spec,
                  where_ + ": field '" + std::string(key) + "' is missing from the config");
    return *v;
  }

  std::optional<bool> opt_bool(std::string_view key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw error(key, "expected true or false, got " + brief(*v));
    return v->get<bool>();
  }

  std::optional<double> opt_double(std::string_view key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw error(key, "expected a number, got " + brief(*v));
    double d = v->get<double>();
    if (!std::isfinite(d) || d < 0) throw error(key, "must be a finite number >= 0");
    return d;
  }

  std::optional<std::string> opt_string(std::string_view key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw error(key, "expected a string, got " + brief(*v));
    return v->get<std::string>();
  }

 private:
  const json& j_;
  std::string where_;
};

// A RoPE parameter that must be a whole number >= 1 (original_max_position_embeddings).
std::uint64_t rope_whole_number(const JsonReader& r, const json& v, const std::string& where) {
  if (!v.is_number_unsigned() || v.get<std::uint64_t>() == 0)
    throw r.error(where, "expected a whole number >= 1, got " + brief(v));
  return v.get<std::uint64_t>();
}
// `name` in the object `p`; null when absent or null, as transformers reads both.
const json* rope_member(const json& p, const char* name) { return p.contains(name) && !p[name].is_null() ? &p[name] : nullptr; }

// A config's RoPE field: transformers 5 calls it rope_parameters (per layer type when nested), 4
// rope_scaling; `sets` holds its one parameter set, or one per attention layer type.
struct RopeField {
  std::string key;
  const json* given = nullptr;  // null: the config scales nothing
  bool nested = false;
  std::vector<std::pair<std::string, const json*>> sets;  // (where, for messages; the parameters)
};
RopeField rope_field(const JsonReader& r) {
  RopeField f{"rope_parameters", r.find("rope_parameters"), false, {}};
  if (const json* old = r.find("rope_scaling")) {
    if (f.given && *f.given != *old)
      throw r.error("rope_scaling", "differs from rope_parameters (transformers 5's name for it); give one of the two");
    if (!f.given) f.given = old, f.key = "rope_scaling";
  }
  if (!f.given) return f;
  if (!f.given->is_object()) throw r.error(f.key, "expected an object of RoPE parameters, got " + brief(*f.given));
  // transformers 5 nests the parameters by attention layer type (Gemma's full and sliding layers)
  static const std::array<std::string_view, 4> kLayerTypes = {"full_attention", "sliding_attention",
                                                              "chunked_attention", "linear_attention"};
  f.nested = !f.given->empty();
  for (const auto& [name, value] : f.given->items())
    f.nested = f.nested && std::find(kLayerTypes.begin(), kLayerTypes.end(), name) != kLayerTypes.end();
  if (!f.nested) {
    f.sets.emplace_back(f.key, f.given);
    return f;
  }
  for (const auto& [name, value] : f.given->items())
    if (!value.is_null()) f.sets.emplace_back(f.key + "." + name, &value);
  return f;
}

// One parameter set as it bears on the context: its type (`type`, the old name, and `rope_type`
// agreeing; su is longrope, mrope default), its factor, and yarn's original context.
struct RopeSet {
  std::string type;
  std::optional<double> factor;
  std::optional<std::uint64_t> yarn_original;
};
RopeSet read_rope_set(const JsonReader& r, const std::string& where, const json& p) {
  if (!p.is_object()) throw r.error(where, "expected an object of RoPE parameters, got " + brief(p));
  auto type_of = [&](const char* name) -> std::string {
    if (!p.contains(name)) return "";
    if (!p[name].is_string()) throw r.error(where + "." + name, "expected a string, got " + brief(p[name]));
    const std::string t = p[name].get<std::string>();
    if (t.empty()) throw r.error(where + "." + name, "is empty, which names no RoPE type");
    return t == "su" ? "longrope" : t == "mrope" ? "default" : t;
  };
  const std::string rope_type = type_of("rope_type"), old_type = type_of("type");
  if (!rope_type.empty() && !old_type.empty() && rope_type != old_type)
    throw r.error(where, "rope_type '" + rope_type + "' and type '" + old_type + "' disagree");
  RopeSet set;
  set.type = !rope_type.empty() ? rope_type : !old_type.empty() ? old_type : "default";
  static const std::array<std::string_view, 6> kTypes = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
  if (std::find(kTypes.begin(), kTypes.end(), set.type) == kTypes.end())
    throw r.error(where + ".rope_type",
                  "'" + set.type + "' is not a RoPE type membudget knows vLLM's context length for (default, linear, "
                  "dynamic, yarn, longrope, llama3)",
                  ErrorKind::unsupported);
  const json* factor = rope_member(p, "factor");
  const std::string& t = set.type;
  if (!factor && (t == "linear" || t == "dynamic" || t == "yarn" || t == "llama3"))
    throw r.error(where + ".factor", "is missing; rope type " + t + " needs it, as transformers requires");
  if (factor && (!factor->is_number() || !std::isfinite(factor->get<double>()) || factor->get<double>() < 1))
    throw r.error(where + ".factor", "must be a number >= 1 (got " + brief(*factor) +
                                         "; transformers warns below 1, and vLLM would shrink the context)");
  if (factor) set.factor = factor->get<double>();
  if (const json* original = rope_member(p, "original_max_position_embeddings"); original && t == "yarn")
    set.yarn_original = rope_whole_number(r, *original, where + ".original_max_position_embeddings");
  return set;
}

// LongRoPE's default max_model_len: vLLM reads the config's own original_max_position_embeddings
// (Phi3Config's, 4096, when the file leaves it out), else the parameters'.
void set_longrope_default_len(const JsonReader& r, const RopeField& field, ModelSpec& s) {
  constexpr const char* kOriginal = "original_max_position_embeddings";
  if (const json* original = r.find(kOriginal)) {
    s.default_max_model_len = std::min(rope_whole_number(r, *original, kOriginal), s.max_positions);
    return;
  }
  if (!r.has(kOriginal) && s.family == "phi3") {
    s.default_max_model_len = std::min<std::uint64_t>(4096, s.max_positions);
    return;
  }
  if (const json* original = field.nested ? nullptr : rope_member(*field.given, kOriginal))
    s.default_max_model_len =
        std::min(rope_whole_number(r, *original, field.key + "." + kOriginal), s.max_positions);
}

// The context a config.json's RoPE scaling gives, as vLLM derives max_model_len from it
// (ModelConfig's _get_and_verify_max_len; model_arch_config_convertor.py in 2026): every type but
// longrope and llama3 (whose max_position_embeddings is already the scaled context) multiplies it by
// `factor`; yarn multiplies its original_max_position_embeddings instead (absent: the config's
// max_position_embeddings, as transformers 5 fills it). LongRoPE's default max_model_len is its
// original context (vLLM since late 2025), set as default_max_model_len. What transformers refuses
// (a missing factor), a factor below 1 (transformers warns; vLLM would shrink the context) and a
// rope type whose context vLLM might derive otherwise are refused.
void apply_rope_scaling(const JsonReader& r, ModelSpec& s) {
  const RopeField field = rope_field(r);
  if (!field.given) return;
  double derived = static_cast<double>(s.max_positions), scaling = 1.0;
  bool longrope = false;
  // (per layer type, the scalings that change the context must agree: vLLM takes the last in the
  // file's order, which a parsed object no longer has)
  std::optional<std::pair<double, double>> scaled_by;  // (factor, the context it multiplies)
  for (const auto& [where, parameters] : field.sets) {
    const RopeSet set = read_rope_set(r, where, *parameters);
    if (set.type == "longrope") {
      longrope = true;
      continue;
    }
    if (set.type == "llama3") continue;
    const double set_scaling = set.factor.value_or(1.0);
    const double set_derived = static_cast<double>(set.yarn_original.value_or(s.max_positions));
    // a set without a factor leaves vLLM's running factor as it was (rp.get("factor", scaling_factor))
    if (!set.factor && set_derived == static_cast<double>(s.max_positions)) continue;
    if (scaled_by && *scaled_by != std::pair{set_scaling, set_derived})
      throw r.error(field.key, "the layer types scale the context differently; vLLM takes one of them (the last in "
                               "the file), membudget does not guess which",
                    ErrorKind::unsupported);
    scaled_by = std::pair{set_scaling, set_derived};
    scaling = set_scaling;
    derived = set_derived;
  }
  const double scaled = derived * scaling;  // vLLM: int(derived * factor), a float product truncated
  if (scaled > static_cast<double>(kMaxPositions))
    throw r.error(field.key, "its factor scales the context past the limit of " + std::to_string(kMaxPositions) +
                                 " tokens; check the factor for a typo");
  s.max_positions = static_cast<std::uint64_t>(scaled);
  if (longrope) set_longrope_default_len(r, field, s);
}

MlpKind mlp_from_activation(const JsonReader& r, const std::string& family) {
  std::string key = "hidden_activation";
  auto act = r.opt_string(key);
  if (!act) act = r.opt_string(key = "hidden_act");
  const bool gemma = family == "gemma" || family == "gemma2";
  if (!act) {
    // null is not absent: the MLP looks its activation up (ACT2FN[config.hidden_act]) and there is
    // none named None; Gemma's falls back to gelu_pytorch_tanh when hidden_activation is None
    if (!gemma && r.has("hidden_act"))
      throw r.error("hidden_act", "is null, which names no activation (give silu, gelu or gelu_pytorch_tanh)");
    // The transformers config classes' own defaults for an absent activation.
    return gemma ? MlpKind::gated_gelu : MlpKind::gated_silu;
  }
  if (*act == "silu" || *act == "swish") return MlpKind::gated_silu;
  if (*act == "gelu" || *act == "gelu_pytorch_tanh" || *act == "gelu_new" ||
      *act == "gelu_fast" || *act == "gelu_python")
    return MlpKind::gated_gelu;
  throw r.error(key, "activation '" + *act + "' is not supported (supported: silu, gelu, "
                     "gelu_pytorch_tanh)", ErrorKind::unsupported);
}

// nlohmann's message without its "[json.exception.parse_error.101] " tag, which names the library's
// exception class rather than anything in the user's file.
std::string json_message(const json::exception& e) {
  std::string_view m = e.what();
  if (m.starts_with("[json.exception.")) {
    const auto close = m.find("] ");
    if (close != std::string_view::npos) m.remove_prefix(close + 2);
  }
  return std::string(m);
}

}  // namespace

ModelSpec parse_hf_config(std::string_view json_text, const std::string& where) {
  json j;
  try {
    j = detail::parse_json_once_per_key(json_text, where, ErrorKind::parse);
  } catch (const json::parse_error& e) {
    std::size_t line = 1, col = 1;
    const std::size_t end = std::min<std::size_t>(e.byte ? e.byte - 1 : 0, json_text.size());
    for (std::size_t i = 0; i < end; ++i) {
      if (json_text[i] == '\n') ++line, col = 1;
      else ++col;
    }
    throw Error(ErrorKind::parse, where + ":" + std::to_string(line) + ":" + std::to_string(col) +
                                      ": malformed JSON: " + json_message(e));
  } catch (const json::exception& e) {
    // A number beyond a double (1e400), anywhere in the file, even under a key we ignore.
    throw Error(ErrorKind::parse, where + ": malformed JSON: " + json_message(e));
  }
  if (!j.is_object())
    throw Error(ErrorKind::parse, where + ": expected a JSON object (a Hugging Face config.json)");

  JsonReader r(j, where);
  auto type = r.opt_string("model_type");
  if (!type)
    throw Error(ErrorKind::invalid_spec,
                where + ": field 'model_type' is missing; is this a Hugging Face config.json?");
  const std::string& t = *type;

  // Mixture-of-experts families whose layers are described (mixtral, qwen2_moe, qwen3_moe, olmoe,
  // deepseek_v2/v3); any other with experts is refused by name.
  static const char* const moe_types[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};
  const bool moe_family = std::find(std::begin(moe_types), std::end(moe_types), t) != std::end(moe_types);
  const bool deepseek = t == "deepseek_v2" || t == "deepseek_v3";
  bool experts = false;
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    const json* v = r.find(key);
    if (v && v->is_number() && v->get<double>() > 0) experts = true;
  }
  static const char* const other_moe[] = {"phimoe", "dbrx", "jamba", "granitemoe", "llama4", "gpt_oss"};
  if (std::find(std::begin(other_moe), std::end(other_moe), t) != std::end(other_moe) ||
      (experts && !moe_family && !deepseek))
    throw Error(ErrorKind::unsupported,
                where + ": model_type '" + t + "' is a mixture-of-experts model membudget does not describe yet (it "
                        "describes " + kSupportedTypes + ")");

  const bool llama = t == "llama" || t == "olmoe", mistral = t == "mistral" || t == "mixtral",
             qwen2 = t == "qwen2" || t == "qwen2_moe", qwen3 = t == "qwen3" || t == "qwen3_moe", gemma = t == "gemma",
             gemma2 = t == "gemma2", phi3 = t == "phi3";
  if (!(llama || mistral || qwen2 || qwen3 || gemma || gemma2 || phi3 || deepseek))
    throw Error(ErrorKind::unsupported, where + ": model_type '" + t +
                                            "' is not supported (supported: " + kSupportedTypes +
                                            "); write a YAML spec instead (docs/model-spec.md)");

  // The model class: membudget predicts the causal language model (its lm_head and logits). Another
  // head (…ForSequenceClassification, …ForTokenClassification, a bare …Model) has none of those and
  // a head of its own, and vLLM serves by this field, so a prediction would be another model's.
  if (const json* archs = r.find("architectures")) {
    if (!archs->is_array()) throw r.error("architectures", "expected a list of class names, got " + brief(*archs));
    for (const json& a : *archs) {
      if (!a.is_string()) throw r.error("architectures", "expected a list of class names, got " + brief(a) + " in it");
      const std::string name = a.get<std::string>();
      if (!name.ends_with("ForCausalLM"))
        throw r.error("architectures", "'" + printable(name) + "' is not a causal language model (…ForCausalLM); membudget "
                                       "predicts that head's memory (the logits and the loss), not this one's",
                      ErrorKind::unsupported);
    }
  }

  // A quantized checkpoint's weights are what its quantization_config says, not the 16-bit
  // tensors the rest of the config describes; read as such, every weight figure would be wrong.
  if (const json* q = r.find("quantization_config")) {
    std::string how = "quantized";
    if (q->is_object() && q->contains("quant_method") && (*q)["quant_method"].is_string())
      how = (*q)["quant_method"].get<std::string>();
    throw r.error("quantization_config",
                  "a " + brief(json(how)) + " checkpoint's quantized weights are not read from config.json; remove "
                  "quantization_config to predict the 16-bit model, and serve with --weights fp8, int8 or int4 for "
                  "quantized weights (QLoRA training is not modelled)",
                  ErrorKind::unsupported);
  }
  ModelSpec s;
  s.name = r.opt_string("_name_or_path").value_or("");
  s.family = t;
  s.vocab_size = r.req_uint("vocab_size");
  s.hidden_size = r.req_uint("hidden_size");
  s.intermediate_size = r.req_uint("intermediate_size");
  s.num_layers = r.req_uint("num_hidden_layers");
  s.num_heads = r.req_uint("num_attention_heads");
  s.num_kv_heads = r.opt_uint("num_key_value_heads").value_or(s.num_heads);
  s.max_positions = r.req_uint("max_position_embeddings");
  apply_rope_scaling(r, s);
  s.tied_embeddings = r.opt_bool("tie_word_embeddings").value_or(gemma || gemma2);
  s.mlp = mlp_from_activation(r, t);
  s.norm = NormKind::rmsnorm;
  s.quirks = quirks_of_family(t);
  if (t == "deepseek_v3") s.quirks.interleaved_rotary = r.opt_bool("rope_interleave").value_or(true);

  const bool attention_bias = r.opt_bool("attention_bias").value_or(false);
  if (qwen2) {
    s.bias.qkv = true;  // Qwen2 always has q/k/v biases and no o bias
  } else if (llama || qwen3 || gemma || gemma2) {
    s.bias.qkv = s.bias.o = attention_bias;  // attention_bias applies to q, k, v and o
  } else if (deepseek && attention_bias) {
    throw r.error("attention_bias", "projection biases are not supported with mla",
                  ErrorKind::unsupported);
  }
  if (llama) s.bias.mlp = r.opt_bool("mlp_bias").value_or(false);

  if (deepseek) {
    s.mla.kv_lora_rank = r.req_uint("kv_lora_rank");
    s.mla.qk_rope_head_dim = r.req_uint("qk_rope_head_dim");
    s.mla.qk_nope_head_dim = r.req_uint("qk_nope_head_dim");
    s.mla.v_head_dim = r.req_uint("v_head_dim");
    // null: a plain q_proj; absent: DeepseekV2Config's and DeepseekV3Config's 1536; 0 is no rank
    // (q_a_proj would have no outputs), refused rather than read as null
    const auto q_lora = r.uint_or_default("q_lora_rank", 1536);
    if (q_lora && *q_lora == 0) throw r.error("q_lora_rank", "0 is not a rank; use null for a plain q_proj");
    s.mla.q_lora_rank = q_lora.value_or(0);
    // transformers sets head_dim to the rotary part; ours is the full query/key head.
    s.head_dim = s.mla.qk_nope_head_dim + s.mla.qk_rope_head_dim;
  } else if (auto hd = r.opt_uint("head_dim")) {
    s.head_dim = *hd;
  } else if (!r.has("head_dim") && (gemma || gemma2 || t == "qwen3")) {
    s.head_dim = t == "qwen3" ? 128 : 256;  // GemmaConfig's, Gemma2Config's and Qwen3Config's head_dim when absent
  } else if (s.num_heads > 0) {
    if (s.hidden_size % s.num_heads != 0)
      throw r.error("head_dim", "missing, and hidden_size " + std::to_string(s.hidden_size) +
                                    " is not divisible by num_attention_heads " +
                                    std::to_string(s.num_heads));
    s.head_dim = s.hidden_size / s.num_heads;
  }

  // sliding_window: null is "none" (absent: the family's default, 4096 for Gemma 2 and Mistral,
  // none for Mixtral and Phi-3); 0 is refused rather than read as "none".
  auto window = [&](std::optional<std::uint64_t> when_absent) -> std::optional<std::uint64_t> {
    auto w = r.uint_or_default("sliding_window", when_absent);
    if (w && *w == 0) throw r.error("sliding_window", "0 is not a window; use null for full attention");
    return w;
  };
  if (gemma2) {
    s.norms_per_layer = 4;
    // (null: no soft-capping; absent: Gemma2Config's 30 and 50; 0 refused: transformers tests
    // only `is not None` and divides by it, so 0 is no "none")
    auto softcap = [&](const char* key, double when_absent) {
      const auto cap = r.double_or_default(key, when_absent);
      if (cap && *cap == 0) throw r.error(key, "0 would divide the logits by zero; use null for no soft-capping");
      return cap.value_or(0);
    };
    s.final_logit_softcap = softcap("final_logit_softcapping", 30.0);
    s.attn_logit_softcap = softcap("attn_logit_softcapping", 50.0);
    if (auto w = window(4096)) {
      s.sliding.window = *w;
      s.sliding.every_nth = 2;
    }
  } else if (mistral || phi3) {
    if (auto w = window(t == "mistral" ? std::optional<std::uint64_t>(4096) : std::nullopt)) s.sliding.window = *w;
  } else if (qwen2 || qwen3) {
    if (r.opt_bool("use_sliding_window").value_or(false)) {
      auto w = r.opt_uint("sliding_window");
      if (!w || *w == 0)
        throw r.error("sliding_window", "use_sliding_window is true but no window is given");
      const std::uint64_t max_window_layers = r.opt_uint("max_window_layers").value_or(0);
      if (max_window_layers == 0) {
        s.sliding.window = *w;
      } else if (max_window_layers < s.num_layers) {
        throw r.error("max_window_layers",
                      "a sliding window on only some layers (max_window_layers " +
                          std::to_string(max_window_layers) + " of " +
                          std::to_string(s.num_layers) + ") is not supported",
                      ErrorKind::unsupported);
      }
      // max_window_layers >= num_layers: no layer uses the window.
    }
  }
  if (qwen3) s.qk_norm = true;
  if (t == "olmoe") {
    s.qk_norm = true;  // OLMoE's q_norm / k_norm span the whole q and k (quirks.qk_norm_full_width)
    if (const json* c = r.find("clip_qkv"); c && !c->is_null())
      throw r.error("clip_qkv", "clipping q, k and v is not modelled", ErrorKind::unsupported);
  }
  // DeepSeek's first dense layers (absent: DeepseekV2Config's 0, V3's 3): where they are all the
  // layers, transformers builds no MoE block, whatever n_routed_experts says
  const std::uint64_t deepseek_dense =
      deepseek ? r.uint_or_default("first_k_dense_replace", t == "deepseek_v3" ? 3 : 0).value_or(0) : 0;
  if (moe_family || (deepseek && deepseek_dense < s.num_layers)) {
    MixtureOfExperts& e = s.moe;
    if (t == "mixtral") {
      e.experts = r.req_uint("num_local_experts");
      e.expert_ff = s.intermediate_size;
      e.normalize_top_k = true;  // MixtralTopKRouter divides by the sum unconditionally
      e.weights_fp32 = true;     // and hands the fp32 weights to the experts
      if (r.opt_double("router_jitter_noise").value_or(0.0) != 0.0)
        throw r.error("router_jitter_noise", "the training-time jitter on the router input is not modelled",
                      ErrorKind::unsupported);
    } else if (deepseek) {
      // transformers builds the MoE block on every layer from first_k_dense_replace on, whatever
      // n_routed_experts says; absent keys take DeepseekV2Config's and V3's defaults
      const bool v3 = t == "deepseek_v3";
      const auto routed = r.uint_or_default("n_routed_experts", v3 ? 256 : 64);
      if (!routed)
        throw r.error("n_routed_experts", "null is no number of experts (transformers builds the routed experts on every "
                                          "layer from first_k_dense_replace on)");
      e.experts = *routed;
      e.expert_ff = r.req_uint("moe_intermediate_size");
      const std::uint64_t shared = r.uint_or_default("n_shared_experts", v3 ? 1 : 2).value_or(0);
      e.shared_ff = checked_mul(shared, e.expert_ff, "n_shared_experts x moe_intermediate_size");
      e.first_dense = deepseek_dense;
      const auto moe_every = r.uint_or_default("moe_layer_freq", 1);
      if (!moe_every || *moe_every == 0)
        throw r.error("moe_layer_freq", "must be at least 1 (1: every layer after first_k_dense_replace)");
      if (*moe_every != 1)
        throw r.error("moe_layer_freq", "MoE on every n-th layer only (n > 1) is not modelled", ErrorKind::unsupported);
      // transformers' DeepseekV3 has no topk_method: its router is always noaux_tc (sigmoid scores,
      // a correction bias, group-limited), n_group 8 and topk_group 4 when absent
      const std::string method = r.opt_string("topk_method").value_or(v3 ? "noaux_tc" : "greedy");
      if (method != "greedy" && method != "group_limited_greedy" && method != "noaux_tc")
        throw r.error("topk_method", "routing '" + method + "' is not modelled (greedy, group_limited_greedy, noaux_tc are)",
                      ErrorKind::unsupported);
      if (v3 && method != "noaux_tc")
        throw r.error("topk_method", "is '" + method + "', but transformers' DeepseekV3 always routes noaux_tc (it has no "
                                     "such field); give noaux_tc or leave it out");
      e.router_bias = method == "noaux_tc";
      e.router = method == "noaux_tc" ? MixtureOfExperts::Router::deepseek_v3 : MixtureOfExperts::Router::deepseek_v2;
      e.weights_fp32 = true;  // the gate runs in fp32 and its weights stay so
      if (method == "noaux_tc") e.normalize_top_k = r.flag_or_default("norm_topk_prob", true);  // V2 never normalises
      if (method == "group_limited_greedy" || method == "noaux_tc") {
        e.group_limited = method == "group_limited_greedy";
        // (null is None, on which the router's view() fails)
        const auto groups = r.uint_or_default("n_group", v3 ? 8 : 1), top = r.uint_or_default("topk_group", v3 ? 4 : 1);
        if (!groups) throw r.error("n_group", "is null, which is no number of expert groups");
        if (!top) throw r.error("topk_group", "is null, which is no number of groups to keep");
        e.groups = *groups;
        e.group_top_k = *top;
        if (!e.groups_well_formed())
          throw r.error("n_group", "must divide n_routed_experts (" + std::to_string(e.experts) + "), with 1 ≤ topk_group ≤ n_group (n_group " +
                                       std::to_string(e.groups) + (r.has("n_group") ? "" : ", the config class's default") +
                                       ", topk_group " + std::to_string(e.group_top_k) +
                                       (r.has("topk_group") ? "" : ", the config class's default") + ")");
      }
    } else {  // qwen2_moe, qwen3_moe, olmoe
      e.experts = r.req_uint("num_experts");
      e.expert_ff = t == "olmoe" ? s.intermediate_size : r.req_uint("moe_intermediate_size");
      e.normalize_top_k = r.opt_bool("norm_topk_prob").value_or(false);  // the configs' default
      if (t == "qwen2_moe") {
        e.shared_ff = r.uint_or_default("shared_expert_intermediate_size", 5632).value_or(0);  // Qwen2MoeConfig's
        e.shared_gate = e.shared_ff > 0;
      }
      if (t != "olmoe") {
        e.sparse_step = r.opt_uint("decoder_sparse_step").value_or(1);
        if (const json* d = r.find("mlp_only_layers"); d && !d->is_array())
          throw r.error("mlp_only_layers", "must be a list of layer indices (got " + brief(*d) + ")");
        else if (d)
          for (const json& x : *d) {
            if (!x.is_number_unsigned()) throw r.error("mlp_only_layers", "must be a list of layer indices");
            e.dense_layers.push_back(x.get<std::uint64_t>());
          }
      }
    }
    if (e.experts == 0)  // 0 would silently mean a dense model
      throw r.error(t == "mixtral" ? "num_local_experts" : deepseek ? "n_routed_experts" : "num_experts",
                    "must be at least 1 for model_type '" + t + "'");
    e.router_first = t == "mixtral" || t == "qwen2_moe" || t == "olmoe";
    e.top_k = r.req_uint("num_experts_per_tok");
    e.output_router_logits = r.opt_bool("output_router_logits").value_or(false);
  }

  // transformers 5's layer_types, where a config gives them, overrides the pattern the fields above
  // describe; a pattern of its own is not modelled, so the two must agree layer by layer.
  if (const json* types = r.find("layer_types")) {
    if (!types->is_array() || types->size() != s.num_layers)
      throw r.error("layer_types", "must list one attention kind for each of the " + std::to_string(s.num_layers) + " layers");
    for (std::size_t il = 0; il < types->size(); ++il) {
      const json& kind = (*types)[il];
      const std::string name = kind.is_string() ? kind.get<std::string>() : std::string();
      if (name != "full_attention" && name != "sliding_attention")
        throw r.error("layer_types", "layer " + std::to_string(il) + " is " + brief(kind) +
                                         "; full_attention and sliding_attention are modelled",
                      ErrorKind::unsupported);
      const bool derived = s.sliding_layer(il);
      if ((name == "sliding_attention") != derived)
        throw r.error("layer_types",
                      "layer " + std::to_string(il) + " is " + name + " where the config's other fields (sliding_window" +
                          (gemma2 ? "" : ", use_sliding_window, max_window_layers") + ") give it " +
                          (derived ? "a sliding window" : "full attention") +
                          "; a per-layer pattern of its own is not modelled",
                      ErrorKind::unsupported);
    }
  }

  if (auto p = find_problem(s)) {
    // named by the config.json key the field was read from, where the two names differ
    static const std::pair<std::string_view, std::string_view> kKeys[] = {
        {"num_layers", "num_hidden_layers"},
        {"num_heads", "num_attention_heads"},
        {"num_kv_heads", "num_key_value_heads"},
        {"max_positions", "max_position_embeddings"}};
    for (const auto& [field, key] : kKeys)
      if (p->field == field) p->field = key;
    throw Error::field(p->kind, where, p->field, p->what);
  }
  return s;
}

// ------------------------------------------------------------------------------------------------
// Files
// ------------------------------------------------------------------------------------------------

std::string read_spec_file(const std::string& path) { return read_input_file(path, limits::kMaxSpecBytes, "model spec"); }

ModelSpec load_model(const std::string& path) { return parse_model(read_spec_file(path), path); }

ModelSpec parse_model(std::string_view bytes, const std::string& path) {
  const std::string_view text = strip_bom(bytes);  // editors on Windows write one

  const auto first = text.find_first_not_of(" \t\r\n");
  const bool is_json = first != std::string::npos && text[first] == '{';
  ModelSpec s = is_json ? parse_hf_config(text, path) : parse_model_yaml(text, path);
  if (s.name.empty()) {
    std::filesystem::path p(path);
    std::string stem = p.stem().string();
    // A Hugging Face checkout is a directory holding config.json: its name is the model's.
    if (stem == "config" && p.has_parent_path() && !p.parent_path().filename().empty())
      stem = p.parent_path().filename().string();
    // A file name need not be UTF-8; the name goes into JSON, which must be.
    s.name = valid_utf8(stem) ? stem : printable(stem);
  }
  return s;
}

}  // namespace membudget
