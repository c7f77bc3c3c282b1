// yaml_spec.cpp: our YAML model-spec schema (docs/model-spec.md) read into a ModelSpec.
// One of the two translation units that use yaml-cpp (with yaml_job.cpp): the web page's build,
// which has no yaml-cpp, leaves both out and links web/yaml_stub.cpp in their place.

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <vector>

#include "membudget/input.hpp"
#include "membudget/spec.hpp"
#include "spec_internal.hpp"
#include "yaml_number.hpp"

namespace membudget {

using detail::find_problem;
using detail::quirks_of_family;
using detail::yaml_leading_zero_problem;
using detail::yaml_number_scalar;

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join(const std::vector<std::string_view>& v) {
  std::string out;
  for (auto s : v) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

class YamlReader {
 public:
  explicit YamlReader(std::string where) : where_(std::move(where)) {}

  struct Entry {
    YAML::Mark mark;
    YAML::Node value;
  };
  using Entries = std::map<std::string, Entry, std::less<>>;

  std::string at(const YAML::Mark& m) const {
    if (m.is_null() || m.line < 0) return where_;
    return where_ + ":" + std::to_string(m.line + 1);
  }

  // The entries of a mapping (prefix "" for the top level, "bias." etc. for nested ones),
  // rejecting duplicate and unknown keys; keys in `ignored` are skipped.
  Entries mapping(const YAML::Node& node, const std::string& prefix,
                  const std::vector<std::string_view>& known,
                  const std::vector<std::string_view>& ignored = {}) {
    Entries out;
    for (const auto& kv : node) {
      const YAML::Node k = kv.first;
      if (!k.IsScalar())
        throw Error(ErrorKind::invalid_spec,
                    at(k.Mark()) + ": " + (prefix.empty() ? "top level" : prefix) +
                        ": keys must be plain names");
      const std::string key = k.Scalar();
      if (std::find(ignored.begin(), ignored.end(), key) != ignored.end()) continue;
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        std::string what = "unknown key";
        std::string_view best;
        std::size_t best_d = 3;  // suggest only close matches
        for (auto cand : known) {
          std::size_t d = edit_distance(key, cand);
          if (d < best_d) best_d = d, best = cand;
        }
        if (!best.empty()) what += "; did you mean '" + std::string(best) + "'?";
        what += " (known keys: " + join(known) + ")";
        throw Error::field(ErrorKind::invalid_spec, at(k.Mark()), prefix + key, what);
      }
      if (out.count(key))
        throw Error::field(ErrorKind::invalid_spec, at(k.Mark()), prefix + key,
                           "duplicate key; give each key once");
      out.emplace(key, Entry{k.Mark(), kv.second});
      lines_[prefix + key] = k.Mark();
    }
    return out;
  }

  static const Entry* find(const Entries& e, std::string_view key) {
    auto it = e.find(key);
    if (it == e.end() || it->second.value.IsNull()) return nullptr;
    return &it->second;
  }

  Error field_error(const Entry& e, const std::string& field, const std::string& what,
                    ErrorKind kind = ErrorKind::invalid_spec) const {
    return Error::field(kind, at(e.mark), field, what);
  }

  std::string describe(const YAML::Node& n) const {
    if (n.IsSequence()) return "a sequence";
    if (n.IsMap()) return "a mapping";
    if (n.Tag() == "!") return "the quoted string \"" + n.Scalar() + "\"";
    if (n.Tag() != "?") return "'" + n.Scalar() + "' tagged " + n.Tag();
    return "'" + n.Scalar() + "'";
  }

  // A value written plain: neither quoted ("!") nor given a tag (`!!str 256` is the string "256").
  bool plain_scalar(const YAML::Node& n) const { return n.IsScalar() && n.Tag() == "?"; }

  std::optional<std::uint64_t> opt_uint(const Entries& e, std::string_view key,
                                        const std::string& field) const {
    const Entry* en = find(e, key);
    if (!en) return std::nullopt;
    const YAML::Node& n = en->value;
    if (!yaml_number_scalar(n, false))
      throw field_error(*en, field, "expected a non-negative integer, got " + describe(n));
    const std::string& s = n.Scalar();
    if (!s.empty() && s[0] == '-')
      throw field_error(*en, field, "must not be negative (got " + s + ")");
    if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      char* end = nullptr;
      errno = 0;
      std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0')
        throw field_error(*en, field, "must be a whole number (got " + s + ")");
      throw field_error(*en, field, "expected a non-negative integer, got " + describe(n));
    }
    if (const std::string zero = yaml_leading_zero_problem(s); !zero.empty()) throw field_error(*en, field, zero);
    std::uint64_t v = 0;
    for (char c : s) {
      if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, std::uint64_t(c - '0'), &v))
        throw field_error(*en, field, s + " does not fit in 64 bits; check the value",
                          ErrorKind::overflow);
    }
    return v;
  }

  std::uint64_t req_uint(const Entries& e, std::string_view key) const {
    auto v = opt_uint(e, key, std::string(key));
    if (!v)
      throw Error(ErrorKind::invalid_spec, where_ + ": field '" + std::string(key) +
                                               "' is missing; add '" + std::string(key) +
                                               ": <integer>'");
    return *v;
  }

  std::optional<bool> opt_bool(const Entries& e, std::string_view key,
                               const std::string& field) const {
    const Entry* en = find(e, key);
    if (!en) return std::nullopt;
    const YAML::Node& n = en->value;
    if (plain_scalar(n) || (n.IsScalar() && n.Tag() == "tag:yaml.org,2002:bool")) {
      const std::string& s = n.Scalar();
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
    }
    throw field_error(*en, field, "expected true or false, got " + describe(n));
  }

  std::optional<double> opt_double(const Entries& e, std::string_view key,
                                   const std::string& field) const {
    const Entry* en = find(e, key);
    if (!en) return std::nullopt;
    const YAML::Node& n = en->value;
    if (yaml_number_scalar(n, true) && decimal_number(n.Scalar())) {
      const std::string& s = n.Scalar();
      errno = 0;
      const double v = std::strtod(s.c_str(), nullptr);
      if (std::isfinite(v) && v < 0) throw field_error(*en, field, "must not be negative (got " + s + ")");
      if (errno == ERANGE && std::isfinite(v))  // a nonzero value read as 0 would silently mean "none"
        throw field_error(*en, field, s + " is too small for a double (it would be read as " + (v == 0 ? "0" : "a denormal") + ")");
      if (std::isfinite(v)) return v;
      throw field_error(*en, field, s + " is too large for a double");
    }
    throw field_error(*en, field, "expected a number, got " + describe(n));
  }

  // Decimal notation, as YAML's float and int resolvers take it: [-+]digits[.digits][e[-+]digits]
  // (strtod alone would take hex, inf and nan too).
  static bool decimal_number(std::string_view s) {
    std::size_t i = 0, digits = 0;
    auto run = [&] {
      const std::size_t from = i;
      while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
      return i - from;
    };
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    digits += run();
    if (i < s.size() && s[i] == '.') {
      ++i;
      digits += run();
    }
    if (digits == 0) return false;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
      ++i;
      if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
      if (run() == 0) return false;
    }
    return i == s.size();
  }

  std::optional<std::string> opt_string(const Entries& e, std::string_view key,
                                        const std::string& field) const {
    const Entry* en = find(e, key);
    if (!en) return std::nullopt;
    if (!en->value.IsScalar())
      throw field_error(*en, field, "expected a string, got " + describe(en->value));
    return en->value.Scalar();
  }

  // A nested mapping (or nullopt if absent / null).
  std::optional<YAML::Node> opt_map(const Entries& e, std::string_view key,
                                    const std::string& field) const {
    const Entry* en = find(e, key);
    if (!en) return std::nullopt;
    if (!en->value.IsMap())
      throw field_error(*en, field, "expected a mapping (key: value lines), got " +
                                        describe(en->value));
    return en->value;
  }

  std::string line_of(const std::string& field) const {
    auto it = lines_.find(field);
    return it == lines_.end() ? where_ : at(it->second);
  }

  const std::string& where() const { return where_; }

 private:
  std::string where_;
  std::map<std::string, YAML::Mark> lines_;
};

template <typename Enum>
Enum parse_enum(const YamlReader& r, const YamlReader::Entries& e, std::string_view key,
                Enum fallback, std::initializer_list<std::pair<std::string_view, Enum>> values) {
  auto s = r.opt_string(e, key, std::string(key));
  if (!s) return fallback;
  std::vector<std::string_view> names;
  for (const auto& [name, v] : values) {
    if (*s == name) return v;
    names.push_back(name);
  }
  throw r.field_error(*YamlReader::find(e, key), std::string(key),
                      "'" + *s + "' is not one of " + join(names));
}

}  // namespace

namespace {
// YAML::Load reads the first document and drops the rest silently: a spec with a second one (a
// `---` line after the first's content, or content after a `...` line) is refused. Found in the
// text, not by YAML::LoadAll, which loops forever on some malformed input (the fuzzer's "!\n,#").
void refuse_second_document(std::string_view text, const std::string& where) {
  const auto marker = [](std::string_view line, std::string_view m) {
    return line.starts_with(m) && (line.size() == m.size() || line[m.size()] == ' ' || line[m.size()] == '\t');
  };
  bool content = false, ended = false;
  std::size_t line_no = 0;
  for (std::size_t from = 0; from <= text.size();) {
    const std::size_t nl = std::min(text.find('\n', from), text.size());
    std::string_view line = text.substr(from, nl - from);
    from = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const bool start = marker(line, "---"), end = marker(line, "...");
    if (start) line.remove_prefix(3);  // "--- name: x" starts a document with content
    const std::size_t first = line.find_first_not_of(" \t");
    const bool words = first != std::string_view::npos && line[first] != '#';  // neither blank nor a comment
    if ((start && content) || (ended && !start && !end && words))
      throw Error(ErrorKind::parse, where + ":" + std::to_string(line_no) +
                                        ": a second YAML document begins here; a spec is one document");
    if (end && content) ended = true;
    if (!end && words && line[first] != '%') content = true;  // (a directive is not content)
  }
}
}  // namespace

ModelSpec parse_model_yaml(std::string_view text, const std::string& where) {
  refuse_second_document(text, where);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    std::string loc = where;
    if (!e.mark.is_null())
      loc += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    throw Error(ErrorKind::parse, loc + ": malformed YAML: " + e.msg);
  }
  if (!root.IsMap())
    throw Error(ErrorKind::invalid_spec,
                where + ": expected a mapping of model fields (name, hidden_size, …) at the top "
                        "level; see docs/model-spec.md");

  YamlReader r(where);
  const auto top = r.mapping(
      root, "",
      {"name", "family", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
       "num_heads", "num_kv_heads", "head_dim", "tied_embeddings", "mlp", "norm", "bias",
       "max_positions", "norms_per_layer", "qk_norm", "final_logit_softcap", "attn_logit_softcap", "sliding_window",
       "mla", "moe", "quirks"},
      {"job"});

  ModelSpec s;
  s.name = r.opt_string(top, "name", "name").value_or("");
  if (!valid_utf8(s.name))
    throw Error::field(ErrorKind::invalid_spec, r.line_of("name"), "name", "is not valid UTF-8");
  s.family = r.opt_string(top, "family", "family").value_or("");
  s.vocab_size = r.req_uint(top, "vocab_size");
  s.hidden_size = r.req_uint(top, "hidden_size");
  s.intermediate_size = r.req_uint(top, "intermediate_size");
  s.num_layers = r.req_uint(top, "num_layers");
  s.num_heads = r.req_uint(top, "num_heads");
  s.num_kv_heads = r.req_uint(top, "num_kv_heads");
  s.max_positions = r.req_uint(top, "max_positions");
  s.tied_embeddings = r.opt_bool(top, "tied_embeddings", "tied_embeddings").value_or(false);
  s.mlp = parse_enum(r, top, "mlp", MlpKind::gated_silu,
                     {{"gated_silu", MlpKind::gated_silu},
                      {"gated_gelu", MlpKind::gated_gelu},
                      {"plain_gelu", MlpKind::plain_gelu}});
  s.norm = parse_enum(r, top, "norm", NormKind::rmsnorm,
                      {{"rmsnorm", NormKind::rmsnorm}, {"layernorm", NormKind::layernorm}});
  if (auto b = r.opt_map(top, "bias", "bias")) {
    const auto e = r.mapping(*b, "bias.", {"qkv", "o", "mlp"});
    s.bias.qkv = r.opt_bool(e, "qkv", "bias.qkv").value_or(false);
    s.bias.o = r.opt_bool(e, "o", "bias.o").value_or(false);
    s.bias.mlp = r.opt_bool(e, "mlp", "bias.mlp").value_or(false);
  }
  s.norms_per_layer = r.opt_uint(top, "norms_per_layer", "norms_per_layer").value_or(2);
  s.qk_norm = r.opt_bool(top, "qk_norm", "qk_norm").value_or(false);
  s.final_logit_softcap = r.opt_double(top, "final_logit_softcap", "final_logit_softcap").value_or(0);
  s.attn_logit_softcap = r.opt_double(top, "attn_logit_softcap", "attn_logit_softcap").value_or(0);
  if (auto w = r.opt_map(top, "sliding_window", "sliding_window")) {
    const auto e = r.mapping(*w, "sliding_window.", {"window", "every_nth"});
    auto window = r.opt_uint(e, "window", "sliding_window.window");
    if (!window)
      throw Error(ErrorKind::invalid_spec,
                  r.line_of("sliding_window") +
                      ": sliding_window.window: missing; give the window in tokens, or remove "
                      "sliding_window");
    if (*window == 0)  // 0 would silently mean "no window": remove the section instead
      throw Error::field(ErrorKind::invalid_spec, r.line_of("sliding_window.window"), "sliding_window.window",
                         "must be at least 1 token; remove sliding_window for full attention");
    s.sliding.window = *window;
    s.sliding.every_nth = r.opt_uint(e, "every_nth", "sliding_window.every_nth").value_or(1);
  }
  if (auto m = r.opt_map(top, "mla", "mla")) {
    const auto e = r.mapping(
        *m, "mla.",
        {"kv_lora_rank", "qk_rope_head_dim", "q_lora_rank", "qk_nope_head_dim", "v_head_dim"});
    s.mla.kv_lora_rank = r.opt_uint(e, "kv_lora_rank", "mla.kv_lora_rank").value_or(0);
    s.mla.qk_rope_head_dim = r.opt_uint(e, "qk_rope_head_dim", "mla.qk_rope_head_dim").value_or(0);
    s.mla.q_lora_rank = r.opt_uint(e, "q_lora_rank", "mla.q_lora_rank").value_or(0);
    s.mla.qk_nope_head_dim = r.opt_uint(e, "qk_nope_head_dim", "mla.qk_nope_head_dim").value_or(0);
    s.mla.v_head_dim = r.opt_uint(e, "v_head_dim", "mla.v_head_dim").value_or(0);
    if (!s.mla.enabled())  // an empty or all-zero section would silently mean "no MLA"
      throw Error::field(ErrorKind::invalid_spec, r.line_of(e.count("kv_lora_rank") ? "mla.kv_lora_rank" : "mla"),
                         "mla.kv_lora_rank", "must be > 0 in an mla section; remove mla for standard attention");
  }
  if (auto m = r.opt_map(top, "moe", "moe")) {
    // the same fields as config.json's (docs/model-spec.md, "Mixture of experts")
    const auto e = r.mapping(*m, "moe.",
                             {"experts", "top_k", "expert_ff", "shared_ff", "shared_gate", "first_dense", "sparse_step",
                              "dense_layers", "normalize_top_k", "weights_fp32", "output_router_logits", "router",
                              "groups", "group_top_k", "router_first"});
    MixtureOfExperts& x = s.moe;
    x.experts = r.req_uint(e, "experts");
    if (x.experts == 0)  // 0 would silently mean a dense model: remove the section instead
      throw Error::field(ErrorKind::invalid_spec, r.line_of("moe.experts"), "moe.experts",
                         "must be at least 1; remove moe for a dense MLP");
    x.top_k = r.req_uint(e, "top_k");
    x.expert_ff = r.req_uint(e, "expert_ff");
    x.shared_ff = r.opt_uint(e, "shared_ff", "moe.shared_ff").value_or(0);
    x.shared_gate = r.opt_bool(e, "shared_gate", "moe.shared_gate").value_or(false);
    x.first_dense = r.opt_uint(e, "first_dense", "moe.first_dense").value_or(0);
    x.sparse_step = r.opt_uint(e, "sparse_step", "moe.sparse_step").value_or(1);
    x.normalize_top_k = r.opt_bool(e, "normalize_top_k", "moe.normalize_top_k").value_or(false);
    x.weights_fp32 = r.opt_bool(e, "weights_fp32", "moe.weights_fp32").value_or(false);
    x.router_first = r.opt_bool(e, "router_first", "moe.router_first").value_or(false);
    x.output_router_logits = r.opt_bool(e, "output_router_logits", "moe.output_router_logits").value_or(false);
    const std::string router = r.opt_string(e, "router", "moe.router").value_or("softmax_top_k");
    x.groups = r.opt_uint(e, "groups", "moe.groups").value_or(1);
    x.group_top_k = r.opt_uint(e, "group_top_k", "moe.group_top_k").value_or(x.groups);
    x.group_limited = x.groups > 1;
    if (!x.groups_well_formed())
      throw Error::field(ErrorKind::invalid_spec, r.line_of("moe.groups"), "moe.groups",
                         "must divide moe.experts, with 1 ≤ group_top_k ≤ groups");
    if (router == "deepseek_v2") x.router = MixtureOfExperts::Router::deepseek_v2;
    else if (router == "deepseek_v3") x.router = MixtureOfExperts::Router::deepseek_v3;
    else if (router != "softmax_top_k")
      throw Error::field(ErrorKind::invalid_spec, r.line_of("moe.router"), "moe.router",
                         "'" + router + "' is not one of softmax_top_k, deepseek_v2, deepseek_v3");
    if (auto it = e.find("dense_layers"); it != e.end()) {
      const YAML::Node& list = it->second.value;
      if (!list.IsSequence())
        throw Error::field(ErrorKind::invalid_spec, r.line_of("moe.dense_layers"), "moe.dense_layers",
                           "must be a list of layer indices");
      for (const auto& item : list) {
        std::uint64_t il = 0;
        if (!item.IsScalar() || !YAML::convert<std::uint64_t>::decode(item, il) || item.Scalar().find('-') != std::string::npos)
          throw Error::field(ErrorKind::invalid_spec, r.line_of("moe.dense_layers"), "moe.dense_layers",
                             "'" + (item.IsScalar() ? item.Scalar() : std::string("?")) + "' is not a layer index");
        x.dense_layers.push_back(il);
      }
    }
  }
  s.quirks = quirks_of_family(s.family);
  if (auto q = r.opt_map(top, "quirks", "quirks")) {
    const auto e = r.mapping(*q, "quirks.",
                             {"fused_qkv", "fused_gate_up", "norm_weight_offset", "embedding_scale", "partial_rotary",
                              "qk_norm_full_width", "complex_rotary", "interleaved_rotary", "unused_sliding_mask"});
    auto set = [&](std::string_view key, bool& field) {
      if (auto v = r.opt_bool(e, key, "quirks." + std::string(key))) field = *v;
    };
    set("fused_qkv", s.quirks.fused_qkv);
    set("fused_gate_up", s.quirks.fused_gate_up);
    set("norm_weight_offset", s.quirks.norm_weight_offset);
    set("embedding_scale", s.quirks.embedding_scale);
    set("partial_rotary", s.quirks.partial_rotary);
    set("qk_norm_full_width", s.quirks.qk_norm_full_width);
    set("complex_rotary", s.quirks.complex_rotary);
    set("interleaved_rotary", s.quirks.interleaved_rotary);
    set("unused_sliding_mask", s.quirks.unused_sliding_mask);
  }
  if (auto hd = r.opt_uint(top, "head_dim", "head_dim")) {
    s.head_dim = *hd;
  } else if (s.mla.enabled()) {
    s.head_dim = s.mla.qk_nope_head_dim + s.mla.qk_rope_head_dim;
  } else if (s.num_heads > 0) {
    if (s.hidden_size % s.num_heads != 0)
      throw Error(ErrorKind::invalid_spec,
                  r.line_of("num_heads") + ": head_dim: hidden_size " +
                      std::to_string(s.hidden_size) + " is not divisible by num_heads " +
                      std::to_string(s.num_heads) + "; set head_dim explicitly");
    s.head_dim = s.hidden_size / s.num_heads;
  }

  if (auto p = find_problem(s)) throw Error::field(p->kind, r.line_of(p->field), p->field, p->what);
  return s;
}

}  // namespace membudget
