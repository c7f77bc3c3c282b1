#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "membudget/budget.hpp"
#include "membudget/spec.hpp"

using namespace membudget;
namespace fs = std::filesystem;

namespace {

const std::string kSource = MEMBUDGET_SOURCE_DIR;
std::string config(const std::string& name) { return kSource + "/configs/" + name + ".yaml"; }
std::string hf(const std::string& name) { return kSource + "/tests/data/hf/" + name + ".json"; }

// Runs f, which must throw membudget::Error; returns it for inspection.
template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected membudget::Error");
  return Error(ErrorKind::io, "unreachable");
}

bool contains(const Error& e, const std::string& s) {
  return std::string(e.what()).find(s) != std::string::npos;
}

// Every field but the name: HF configs carry a repository path, our YAML a short name.
void check_same_architecture(const ModelSpec& a, const ModelSpec& b) {
  CHECK(a.family == b.family);
  CHECK(a.quirks == b.quirks);
  CHECK(a.vocab_size == b.vocab_size);
  CHECK(a.hidden_size == b.hidden_size);
  CHECK(a.intermediate_size == b.intermediate_size);
  CHECK(a.num_layers == b.num_layers);
  CHECK(a.num_heads == b.num_heads);
  CHECK(a.num_kv_heads == b.num_kv_heads);
  CHECK(a.head_dim == b.head_dim);
  CHECK(a.tied_embeddings == b.tied_embeddings);
  CHECK(a.mlp == b.mlp);
  CHECK(a.norm == b.norm);
  CHECK(a.bias.qkv == b.bias.qkv);
  CHECK(a.bias.o == b.bias.o);
  CHECK(a.bias.mlp == b.bias.mlp);
  CHECK(a.max_positions == b.max_positions);
  CHECK(a.norms_per_layer == b.norms_per_layer);
  CHECK(a.qk_norm == b.qk_norm);
  CHECK(a.final_logit_softcap == b.final_logit_softcap);
  CHECK(a.attn_logit_softcap == b.attn_logit_softcap);
  CHECK(a.sliding.window == b.sliding.window);
  CHECK(a.sliding.windowed_layers(a.num_layers) == b.sliding.windowed_layers(b.num_layers));
  CHECK(a.mla.kv_lora_rank == b.mla.kv_lora_rank);
  CHECK(a.mla.q_lora_rank == b.mla.q_lora_rank);
  CHECK(a.parameters().total == b.parameters().total);
  CHECK(a.parameters().tensors == b.parameters().tensors);
}

// The tiny-llama spec, for the bad-input tests to mutate.
const char* kTinyYaml = R"(name: tiny
vocab_size: 256
hidden_size: 64
intermediate_size: 160
num_layers: 2
num_heads: 4
num_kv_heads: 2
head_dim: 16
tied_embeddings: true
max_positions: 512
)";

std::string replace(std::string text, const std::string& from, const std::string& to) {
  auto pos = text.find(from);
  REQUIRE(pos != std::string::npos);
  return text.replace(pos, from.size(), to);
}

ModelSpec tiny() { return parse_model_yaml(kTinyYaml, "tiny.yaml"); }

}  // namespace

TEST_CASE("to_string of the enums") {
  CHECK(std::string(to_string(MlpKind::gated_silu)) == "gated_silu");
  CHECK(std::string(to_string(MlpKind::gated_gelu)) == "gated_gelu");
  CHECK(std::string(to_string(MlpKind::plain_gelu)) == "plain_gelu");
  CHECK(std::string(to_string(NormKind::rmsnorm)) == "rmsnorm");
  CHECK(std::string(to_string(NormKind::layernorm)) == "layernorm");
}

TEST_CASE("parameter counts match the published figures") {
  // Published counts (model cards / safetensors totals); each also re-derived by hand from the
  // hyper-parameters: embedding V·h + L·(attention + MLP + 2 norms) + final norm (+ lm_head).
  struct Case {
    const char* config;
    std::uint64_t total;
  };
  const Case cases[] = {
      {"llama-3.2-1b", 1'235'814'400ull},    {"llama-3.2-3b", 3'212'749'824ull},
      {"llama-3.1-8b", 8'030'261'248ull},    {"llama-3.1-70b", 70'553'706'496ull},
      {"llama-3.1-405b", 405'853'388'800ull}, {"mistral-7b", 7'241'732'096ull},
      {"qwen2.5-7b", 7'615'616'512ull},      {"qwen2.5-1.5b", 1'543'714'304ull},
      {"qwen2.5-0.5b", 494'032'768ull},      {"gemma-2-9b", 9'241'705'984ull},
      {"tinyllama-1.1b", 1'100'048'384ull},  {"phi-3-mini", 3'821'079'552ull},
  };
  for (const auto& c : cases) {
    CAPTURE(c.config);
    CHECK(load_model(config(c.config)).parameters().total == c.total);
  }
}

TEST_CASE("Llama 3.2 1B parameter breakdown") {
  const ModelSpec s = load_model(config("llama-3.2-1b"));
  const ParameterCounts p = s.parameters();
  CHECK(p.embedding == 128256ull * 2048);
  CHECK(p.lm_head == 0);
  CHECK(p.final_norm == 2048);
  // q 2048·2048 + k, v 2048·512 each + o 2048·2048 + MLP 3·2048·8192 + 2 norms · 2048
  CHECK(p.per_layer == 4194304ull + 2 * 1048576 + 4194304 + 50331648 + 4096);
  CHECK(p.layers == p.per_layer * 16);
  CHECK(p.total == p.embedding + p.layers + p.final_norm + p.lm_head);
  CHECK(p.per_layer_tensors == 4 + 3 + 2);
  CHECK(p.tensors == 16 * 9 + 2);  // + embedding + final norm (lm_head tied)
}

TEST_CASE("toy sizes by hand") {
  SUBCASE("tiny-llama") {
    const ModelSpec s = load_model(config("tiny-llama"));
    // emb 256·64 = 16384; layer: q 64·64 + k,v 2·64·32 + o 64·64 + mlp 3·64·160 + norms 128
    //   = 4096 + 4096 + 4096 + 30720 + 128 = 43136; total 16384 + 2·43136 + 64 = 102720
    const ParameterCounts p = s.parameters();
    CHECK(p.per_layer == 43136);
    CHECK(p.total == 102720);
    CHECK(p.per_layer_tensors == 9);
    CHECK(p.tensors == 2 * 9 + 2);
  }
  SUBCASE("tiny-qwen: q/k/v biases add q_dim + 2·kv_dim per layer") {
    const ParameterCounts p = load_model(config("tiny-qwen")).parameters();
    CHECK(p.per_layer == 43136 + 64 + 2 * 32);
    CHECK(p.total == 102976);
    CHECK(p.per_layer_tensors == 12);
  }
  SUBCASE("o and mlp biases, gated") {
    ModelSpec s = tiny();
    s.bias.o = true;
    s.bias.mlp = true;
    // + o bias 64 + gate/up biases 2·160 + down bias 64
    CHECK(s.parameters().per_layer == 43136 + 64 + 2 * 160 + 64);
    CHECK(s.parameters().per_layer_tensors == 9 + 1 + 3);
  }
  SUBCASE("plain GeLU MLP with LayerNorm (GPT-2 style)") {
    ModelSpec s = tiny();
    s.mlp = MlpKind::plain_gelu;
    s.norm = NormKind::layernorm;
    s.bias = {true, true, true};
    s.num_kv_heads = 4;
    // attention 4·64·64 + biases 3·64 + 64; mlp 2·64·160 + 160 + 64; 2 LayerNorms 2·2·64
    const std::uint64_t layer = 4 * 4096 + 3 * 64 + 64 + 2 * 10240 + 160 + 64 + 256;
    CHECK(s.parameters().per_layer == layer);
    CHECK(s.parameters().final_norm == 128);
    CHECK(s.parameters().total == 16384 + 2 * layer + 128);
    CHECK(s.parameters().per_layer_tensors == 4 + 4 + 2 + 2 + 4);
    CHECK(s.parameters().tensors == 2 * 16 + 1 + 2);
  }
  SUBCASE("qk_norm adds 2·head_dim per layer; norms_per_layer counts") {
    ModelSpec s = tiny();
    s.qk_norm = true;
    CHECK(s.parameters().per_layer == 43136 + 32);
    s.qk_norm = false;
    s.norms_per_layer = 4;
    CHECK(s.parameters().per_layer == 43136 + 128);
  }
  SUBCASE("gated GeLU counts as gated SiLU") {
    ModelSpec s = tiny();
    s.mlp = MlpKind::gated_gelu;
    CHECK(s.parameters().total == 102720);
  }
}

TEST_CASE("multi-head latent attention (DeepSeek style)") {
  ModelSpec s = tiny();
  s.tied_embeddings = false;
  s.mla = {32, 8, 0, 16, 16};  // kv_lora 32, rope 8, q_lora 0, nope 16, v 16
  s.head_dim = 24;
  s.num_kv_heads = 4;
  REQUIRE_NOTHROW(s.validate("mla"));
  // q 64·4·24 + kv_a 64·(32+8) + kv_a_norm 32 + kv_b 32·4·(16+16) + o 4·16·64
  //   + mlp 3·64·160 + norms 2·64
  const std::uint64_t plain_q = 6144 + 2560 + 32 + 4096 + 4096 + 30720 + 128;
  CHECK(s.parameters().per_layer == plain_q);
  CHECK(s.parameters().per_layer_tensors == 5 + 3 + 2);
  CHECK(s.parameters().total == 2 * 16384 + 2 * plain_q + 64);

  s.mla.q_lora_rank = 24;  // q_a 64·24 + q_a_norm 24 + q_b 24·4·24 instead of q
  const std::uint64_t lora_q = plain_q - 6144 + 1536 + 24 + 2304;
  CHECK(s.parameters().per_layer == lora_q);
  CHECK(s.parameters().per_layer_tensors == 12);

  // The same model from a (dense) deepseek_v3 config.json.
  const ModelSpec j = load_model(hf("tiny-mla"));
  CHECK(j.family == "deepseek_v3");
  CHECK(j.head_dim == 24);  // nope + rope, not the config's rotary head_dim
  CHECK(j.mla.q_lora_rank == 24);
  CHECK(j.parameters().per_layer == lora_q);
  CHECK(j.parameters().total == s.parameters().total);

  SUBCASE("DeepSeek-V3 attention block") {
    ModelSpec v3 = s;
    v3.hidden_size = 7168;
    v3.num_heads = v3.num_kv_heads = 128;
    v3.head_dim = 192;
    v3.mla = {512, 64, 1536, 128, 128};
    v3.intermediate_size = 1;
    v3.norms_per_layer = 1;
    // 187,107,328 attention parameters per layer (q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o)
    CHECK(v3.parameters().per_layer == 187'107'328ull + 3 * 7168 + 7168);
  }
  SUBCASE("inconsistent MLA fields are rejected") {
    ModelSpec bad = s;
    bad.head_dim = 16;
    CHECK(contains(error_of([&] { bad.validate(); }), "head_dim"));
    bad = s;
    bad.mla.kv_lora_rank = 0;
    CHECK(contains(error_of([&] { bad.validate(); }), "mla.kv_lora_rank"));
    bad = s;
    bad.mla.v_head_dim = 0;
    CHECK(contains(error_of([&] { bad.validate(); }), "mla.v_head_dim"));
  }
}

TEST_CASE("tied and untied differ by exactly V·h") {
  for (const char* name : {"llama-3.2-1b", "llama-3.1-8b", "gemma-2-9b", "tiny-llama"}) {
    CAPTURE(name);
    ModelSpec s = load_model(config(name));
    s.tied_embeddings = true;
    const ParameterCounts tied = s.parameters();
    s.tied_embeddings = false;
    const ParameterCounts untied = s.parameters();
    CHECK(untied.total - tied.total == s.vocab_size * s.hidden_size);
    CHECK(untied.tensors - tied.tensors == 1);
    CHECK(untied.per_layer == tied.per_layer);
  }
  CHECK(load_model(config("tiny-llama-untied")).parameters().total -
            load_model(config("tiny-llama")).parameters().total ==
        256 * 64);
}

TEST_CASE("every config in configs/ loads and validates") {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(kSource + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    CAPTURE(entry.path().string());
    ModelSpec s;
    REQUIRE_NOTHROW(s = load_model(entry.path().string()));
    CHECK(s.name == entry.path().stem().string());
    CHECK_NOTHROW(s.validate(entry.path().string()));
    CHECK(s.parameters().total > 0);
    CHECK(!s.family.empty());
    ++n;
  }
  CHECK(n >= 15);
}

TEST_CASE("derived dimensions and feature fields of the shipped configs") {
  const ModelSpec g = load_model(config("gemma-2-9b"));
  CHECK(g.q_dim() == 4096);
  CHECK(g.kv_dim() == 2048);
  CHECK(g.kv_groups() == 2);
  CHECK(g.norms_per_layer == 4);
  CHECK(g.final_logit_softcap == 30.0);
  CHECK(g.attn_logit_softcap == 50.0);
  CHECK(g.mlp == MlpKind::gated_gelu);
  CHECK(g.sliding.window == 4096);
  CHECK(g.sliding.windowed_layers(g.num_layers) == 21);
  const ModelSpec m = load_model(config("mistral-7b"));
  CHECK(m.sliding.windowed_layers(m.num_layers) == 32);
  const ModelSpec q = load_model(config("qwen2.5-7b"));
  CHECK(q.bias.qkv);
  CHECK(!q.bias.o);
  CHECK(!q.sliding.enabled());
}

TEST_CASE("Hugging Face config.json gives the same spec as our YAML") {
  for (const char* name : {"llama-3.2-1b", "llama-3.1-8b", "mistral-7b", "qwen2.5-7b",
                           "qwen2.5-0.5b", "gemma-2-9b", "tinyllama-1.1b", "phi-3-mini",
                           "tiny-llama", "tiny-qwen"}) {
    CAPTURE(name);
    const ModelSpec y = load_model(config(name));
    const ModelSpec j = load_model(hf(name));
    check_same_architecture(y, j);
  }
  CHECK(load_model(hf("llama-3.2-1b")).name == "meta-llama/Llama-3.2-1B");  // _name_or_path
  CHECK(load_model(hf("llama-3.1-8b")).name == "llama-3.1-8b");             // file stem
}

TEST_CASE("Hugging Face families without a YAML twin") {
  SUBCASE("gemma: head_dim 256, tied by default, GeGLU") {
    const ModelSpec s = load_model(hf("gemma-2b"));
    CHECK(s.tied_embeddings);
    CHECK(s.head_dim == 256);
    CHECK(s.num_kv_heads == 1);
    CHECK(s.mlp == MlpKind::gated_gelu);
    CHECK(s.parameters().total == 2'506'172'416ull);  // published Gemma 2B
  }
  SUBCASE("qwen3: qk_norm and an explicit head_dim") {
    const ModelSpec s = load_model(hf("qwen3-0.6b"));
    CHECK(s.qk_norm);
    CHECK(s.head_dim == 128);
    CHECK(s.q_dim() == 2048);
    CHECK(!s.bias.qkv);
    CHECK(!s.sliding.enabled());
    CHECK(s.parameters().total == 596'049'920ull);  // published Qwen3-0.6B
  }
}

TEST_CASE("Hugging Face field mapping rules") {
  const std::string base = R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
    "max_position_embeddings": 512)";
  auto with = [&](const std::string& extra) { return parse_hf_config(base + extra + "}"); };

  const ModelSpec d = with("");
  CHECK(d.num_kv_heads == 4);  // default = heads
  CHECK(d.head_dim == 16);     // default = hidden / heads
  CHECK(!d.tied_embeddings);   // llama default
  CHECK(d.mlp == MlpKind::gated_silu);
  CHECK(with(R"(, "attention_bias": true)").bias.qkv);
  CHECK(with(R"(, "attention_bias": true)").bias.o);
  CHECK(with(R"(, "mlp_bias": true)").bias.mlp);

  auto typed = [&](const std::string& type, const std::string& extra = "") {
    return parse_hf_config(replace(base, "\"llama\"", "\"" + type + "\"") + extra + "}");
  };
  CHECK(typed("qwen2").bias.qkv);
  CHECK(!typed("qwen2").bias.o);
  CHECK(typed("gemma2").tied_embeddings);
  CHECK(typed("gemma2").norms_per_layer == 4);
  CHECK(typed("gemma").mlp == MlpKind::gated_gelu);
  // an absent window is the config class's default: MistralConfig's 4096, none for Mixtral
  CHECK(typed("mistral").sliding.window == 4096);
  CHECK(!typed("mixtral", R"(, "num_local_experts": 4, "num_experts_per_tok": 2)").sliding.enabled());
  CHECK(!typed("mistral", R"(, "sliding_window": null)").sliding.enabled());
  CHECK(typed("mistral", R"(, "sliding_window": 128)").sliding.windowed_layers(2) == 2);
  CHECK(!typed("qwen2", R"(, "sliding_window": 128, "use_sliding_window": false)").sliding.enabled());
  CHECK(typed("qwen2", R"(, "sliding_window": 128, "use_sliding_window": true,
                          "max_window_layers": 0)").sliding.window == 128);
  CHECK(error_of([&] {
          typed("qwen2", R"(, "sliding_window": 128, "use_sliding_window": true,
                           "max_window_layers": 1)");
        }).kind() == ErrorKind::unsupported);
  const ModelSpec g2 = typed("gemma2", R"(, "sliding_window": 64, "final_logit_softcapping": 30.0)");
  CHECK(g2.sliding.every_nth == 2);
  CHECK(g2.final_logit_softcap == 30.0);
  CHECK(typed("qwen3").qk_norm);

  SUBCASE("bad fields name themselves") {
    Error e = error_of([&] { parse_hf_config(replace(base, "\"hidden_size\": 64", "\"hidden_size\": -64") + "}"); });
    CHECK(e.kind() == ErrorKind::invalid_spec);
    CHECK(contains(e, "hidden_size"));
    e = error_of([&] { parse_hf_config(replace(base, "\"hidden_size\": 64", "\"hidden_size\": \"64\"") + "}"); });
    CHECK(contains(e, "hidden_size"));
    e = error_of([&] { parse_hf_config(replace(base, "\"hidden_size\": 64,", "") + "}"); });
    CHECK(e.kind() == ErrorKind::invalid_spec);
    CHECK(contains(e, "'hidden_size' is missing"));
    e = error_of([&] { with(R"(, "tie_word_embeddings": "yes")"); });
    CHECK(contains(e, "tie_word_embeddings"));
    e = error_of([&] { with(R"(, "hidden_act": "relu")"); });
    CHECK(e.kind() == ErrorKind::unsupported);
    CHECK(contains(e, "relu"));
    e = error_of([&] { with(R"(, "num_key_value_heads": 3)"); });
    CHECK(contains(e, "num_kv_heads"));
    e = error_of([&] { parse_hf_config(replace(base, "\"model_type\": \"llama\",", "") + "}"); });
    CHECK(contains(e, "model_type"));
  }
}

TEST_CASE("a config.json key left out takes its config class's default in transformers; null is None") {
  auto config = [](const std::string& type, const std::string& extra) {
    return parse_hf_config(R"({"model_type": ")" + type + R"(", "vocab_size": 256, "hidden_size": 64,
      "intermediate_size": 160, "num_hidden_layers": 4, "num_attention_heads": 4,
      "max_position_embeddings": 8192)" + extra + "}");
  };
  // head_dim: GemmaConfig's and Gemma2Config's 256, Qwen3Config's 128 (Gemma 7B's 3072 / 16 = 192
  // is not its 256); where the class derives it, hidden / heads
  CHECK(config("gemma", "").head_dim == 256);
  CHECK(config("gemma2", "").head_dim == 256);
  CHECK(config("qwen3", "").head_dim == 128);
  CHECK(config("qwen3", R"(, "head_dim": 32)").head_dim == 32);
  CHECK(config("llama", "").head_dim == 16);
  CHECK(config("mistral", "").head_dim == 16);
  // Gemma 2's soft-capping, 30 and 50 when absent, none when null
  const ModelSpec g2 = config("gemma2", "");
  CHECK(g2.final_logit_softcap == 30.0);
  CHECK(g2.attn_logit_softcap == 50.0);
  const ModelSpec uncapped = config("gemma2", R"(, "final_logit_softcapping": null, "attn_logit_softcapping": null)");
  CHECK(uncapped.final_logit_softcap == 0.0);
  CHECK(uncapped.attn_logit_softcap == 0.0);
  // the sliding window: 4096 for Gemma 2 (every other layer) and Mistral, none for Mixtral and Phi-3
  CHECK(g2.sliding.window == 4096);
  CHECK(g2.sliding.every_nth == 2);
  CHECK(!config("gemma2", R"(, "sliding_window": null)").sliding.enabled());
  CHECK(config("mistral", "").sliding.window == 4096);
  CHECK(!config("mistral", R"(, "sliding_window": null)").sliding.enabled());
  CHECK(!config("phi3", "").sliding.enabled());
  // Qwen2-MoE's shared expert: Qwen2MoeConfig's 5632, gated
  const std::string qwen_moe = R"(, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32)";
  CHECK(config("qwen2_moe", qwen_moe).moe.shared_ff == 5632);
  CHECK(config("qwen2_moe", qwen_moe).moe.shared_gate);
  CHECK(config("qwen2_moe", qwen_moe + R"(, "shared_expert_intermediate_size": 96)").moe.shared_ff == 96);
  // DeepSeek: transformers builds the MoE block on every layer from first_k_dense_replace (V2 0,
  // V3 3) on, with n_routed_experts (V2 64, V3 256) and n_shared_experts (V2 2, V3 1) as defaulted
  const std::string mla = R"(, "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
      "moe_intermediate_size": 32, "num_experts_per_tok": 2)";
  const ModelSpec v2 = config("deepseek_v2", mla);
  CHECK(v2.moe.experts == 64);
  CHECK(v2.moe.first_dense == 0);
  CHECK(v2.moe.shared_ff == 2 * 32);
  const ModelSpec v3 = config("deepseek_v3", mla);
  CHECK(v3.moe.experts == 256);
  CHECK(v3.moe.first_dense == 3);
  CHECK(v3.moe.shared_ff == 32);
  CHECK(v3.moe_layers() == 1);
  // n_routed_experts 0 or null on a layer that gets the block is refused, no longer a dense model
  CHECK(contains(error_of([&] { config("deepseek_v2", mla + R"(, "n_routed_experts": 0)"); }), "n_routed_experts"));
  CHECK(contains(error_of([&] { config("deepseek_v2", mla + R"(, "n_routed_experts": null)"); }), "n_routed_experts: null"));
  // every layer dense (first_k_dense_replace past the layers): no experts, whatever n_routed_experts says
  CHECK(!config("deepseek_v3", mla + R"(, "first_k_dense_replace": 4, "n_routed_experts": null)").moe.enabled());
}

TEST_CASE("config.json's layer_types must be the pattern the other fields give, layer by layer") {
  auto config = [](const std::string& type, const std::string& extra) {
    return parse_hf_config(R"({"model_type": ")" + type + R"(", "vocab_size": 256, "hidden_size": 64,
      "intermediate_size": 160, "num_hidden_layers": 4, "num_attention_heads": 4,
      "max_position_embeddings": 8192)" + extra + "}");
  };
  const std::string alternating =
      R"(, "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"])";
  const std::string full = R"(, "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention"])";
  // what transformers 5 writes for Gemma 2 and for Qwen2 without its window: read as before
  CHECK(config("gemma2", alternating).sliding.every_nth == 2);
  CHECK(!config("qwen2", full).sliding.enabled());
  CHECK(config("qwen2", R"(, "sliding_window": 128, "use_sliding_window": true, "max_window_layers": 0,
      "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention"])")
            .sliding.window == 128);
  // a pattern of its own is refused, naming the first layer that parts
  Error e = error_of([&] { config("gemma2", full); });
  CHECK(e.kind() == ErrorKind::unsupported);
  CHECK(contains(e, "layer_types: layer 0 is full_attention where the config's other fields (sliding_window) give it a "
                    "sliding window"));
  e = error_of([&] { config("qwen2", alternating); });
  CHECK(e.kind() == ErrorKind::unsupported);
  CHECK(contains(e, "layer 0 is sliding_attention"));
  CHECK(contains(error_of([&] { config("qwen2", R"(, "layer_types": ["full_attention"])"); }),
                 "must list one attention kind for each of the 4 layers"));
  CHECK(contains(error_of([&] { config("qwen2", R"(, "layer_types": ["full_attention", "linear_attention", 3, null])"); }),
                 "layer 1 is \"linear_attention\""));
}

TEST_CASE("unsupported Hugging Face architectures") {
  // Mixtral and DeepSeek-V2 (MLA + MoE) load with their experts described (tests/test_moe.cpp);
  // Mixtral's step is walked, DeepSeek's router is refused by name
  for (const char* name : {"mixtral-8x7b", "deepseek-v2-lite"}) {
    const ModelSpec m = load_model(hf(name));
    CHECK(m.moe.enabled());
  }
  CHECK(predict(load_model(hf("mixtral-8x7b")), Job{}).peak > 0);
  CHECK(predict(load_model(hf("deepseek-v2-lite")), Job{}).peak > 0);

  Error e = error_of([] { load_model(hf("gpt2")); });
  CHECK(e.kind() == ErrorKind::unsupported);
  CHECK(contains(e, "model_type 'gpt2' is not supported"));
  // lists every supported family, those with experts too
  for (const char* family : {"llama", "gemma2", "phi3", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3"})
    CHECK(contains(e, family));

  e = error_of([] { parse_hf_config(R"({"model_type": "llama", "hidden_size": 64,)", "c.json"); });
  CHECK(e.kind() == ErrorKind::parse);
  CHECK(contains(e, "c.json:1:"));
  CHECK(error_of([] { parse_hf_config("[1, 2]"); }).kind() == ErrorKind::parse);
}

TEST_CASE("YAML defaults") {
  ModelSpec s = parse_model_yaml(replace(kTinyYaml, "head_dim: 16\n", ""));
  CHECK(s.head_dim == 16);  // hidden / heads
  CHECK(s.mlp == MlpKind::gated_silu);
  CHECK(s.norm == NormKind::rmsnorm);
  CHECK(s.norms_per_layer == 2);
  CHECK(!s.bias.qkv);
  CHECK(!s.sliding.enabled());
  CHECK(!s.mla.enabled());
  s = parse_model_yaml(replace(kTinyYaml, "tied_embeddings: true\n", ""));
  CHECK(!s.tied_embeddings);
  s = parse_model_yaml(std::string(kTinyYaml) + "sliding_window: {window: 64}\nbias: {o: true}\n");
  CHECK(s.sliding.every_nth == 1);
  CHECK(s.bias.o);
  CHECK(!s.bias.qkv);
  s = parse_model_yaml(std::string(kTinyYaml) + "sliding_window: null\nfinal_logit_softcap: 30\n");
  CHECK(!s.sliding.enabled());
  CHECK(s.final_logit_softcap == 30.0);
  s = parse_model_yaml(std::string(kTinyYaml) + "attn_logit_softcap: 50\n");
  CHECK(s.attn_logit_softcap == 50.0);
  CHECK_THROWS_AS(parse_model_yaml(std::string(kTinyYaml) + "attn_logit_softcap: -1\n"), Error);
  // MLA head_dim defaults to nope + rope.
  s = parse_model_yaml(
      replace(replace(kTinyYaml, "head_dim: 16\n", ""), "num_kv_heads: 2", "num_kv_heads: 4") +
      "mla: {kv_lora_rank: 32, qk_rope_head_dim: 8, qk_nope_head_dim: 16, v_head_dim: 16}\n");
  CHECK(s.head_dim == 24);
  CHECK(s.mla.enabled());
}

TEST_CASE("the job section is ignored, other unknown keys are not") {
  const std::string with_job = std::string(kTinyYaml) +
                               "job:\n  batch: 4\n  seq: 4096\n  precision: amp-bf16\n"
                               "  anything: [1, 2]\n";
  CHECK(parse_model_yaml(with_job).parameters().total == 102720);

  Error e = error_of([] { parse_model_yaml(replace(kTinyYaml, "hidden_size", "hiden_size"), "t.yaml"); });
  CHECK(e.kind() == ErrorKind::invalid_spec);
  CHECK(contains(e, "hiden_size"));
  CHECK(contains(e, "t.yaml:3"));
  CHECK(contains(e, "did you mean 'hidden_size'"));

  e = error_of([] { parse_model_yaml(std::string(kTinyYaml) + "bias: {qkv: true, out: true}\n", "t.yaml"); });
  CHECK(contains(e, "bias.out"));
  CHECK(contains(e, "t.yaml:11"));

  e = error_of([] { parse_model_yaml(std::string(kTinyYaml) + "vocab_size: 512\n", "t.yaml"); });
  CHECK(contains(e, "duplicate"));
  CHECK(contains(e, "vocab_size"));
}

TEST_CASE("bad YAML inputs are errors naming file, line and field") {
  SUBCASE("malformed YAML") {
    Error e = error_of([] { parse_model_yaml("name: x\nhidden_size: [1, 2\nvocab_size: 3\n", "bad.yaml"); });
    CHECK(e.kind() == ErrorKind::parse);
    CHECK(contains(e, "bad.yaml:"));
    e = error_of([] { parse_model_yaml("name: x\n  hidden_size: 3\n bad: : :\n", "bad.yaml"); });
    CHECK(e.kind() == ErrorKind::parse);
    CHECK(contains(e, "bad.yaml:2:"));
  }
  SUBCASE("not a mapping") {
    CHECK(error_of([] { parse_model_yaml("- 1\n- 2\n"); }).kind() == ErrorKind::invalid_spec);
    CHECK(error_of([] { parse_model_yaml(""); }).kind() == ErrorKind::invalid_spec);
  }
  SUBCASE("missing field") {
    Error e = error_of([] { parse_model_yaml(replace(kTinyYaml, "hidden_size: 64\n", ""), "t.yaml"); });
    CHECK(e.kind() == ErrorKind::invalid_spec);
    CHECK(contains(e, "t.yaml: field 'hidden_size' is missing"));
    e = error_of([] { parse_model_yaml(replace(kTinyYaml, "hidden_size: 64", "hidden_size:"), "t.yaml"); });
    CHECK(contains(e, "'hidden_size' is missing"));
  }
  SUBCASE("negative field") {
    Error e = error_of([] { parse_model_yaml(replace(kTinyYaml, "num_layers: 2", "num_layers: -2"), "t.yaml"); });
    CHECK(e.kind() == ErrorKind::invalid_spec);
    CHECK(contains(e, "t.yaml:5: num_layers: must not be negative"));
  }
  SUBCASE("zero field") {
    Error e = error_of([] { parse_model_yaml(replace(kTinyYaml, "num_layers: 2", "num_layers: 0"), "t.yaml"); });
    CHECK(contains(e, "t.yaml:5: num_layers: must be > 0"));
  }
  SUBCASE("string or fraction where an integer is expected") {
    Error e = error_of([] { parse_model_yaml(replace(kTinyYaml, "hidden_size: 64", "hidden_size: sixty-four"), "t.yaml"); });
    CHECK(e.kind() == ErrorKind::invalid_spec);
    CHECK(contains(e, "t.yaml:3: hidden_size"));
    CHECK(contains(e, "sixty-four"));
    e = error_of([] { parse_model_yaml(replace(kTinyYaml, "hidden_size: 64", "hidden_size: \"64\""), "t.yaml"); });
    CHECK(contains(e, "hidden_size"));
    CHECK(contains(e, "quoted"));
    e = error_of([] { parse_model_yaml(replace(kTinyYaml, "hidden_size: 64", "hidden_size: 64.5"), "t.yaml"); });
    CHECK(contains(e, "whole number"));
    e = error_of([] { parse_model_yaml(replace(kTinyYaml, "hidden_size: 64", "hidden_size: [64]"), "t.yaml"); });
    CHECK(contains(e, "hidden_size"));
  }
  SUBCASE("booleans must be booleans") {
    Error e = error_of([] { parse_model_yaml(replace(kTinyYaml, "tied_embeddings: true", "tied_embeddings: 1"), "t.yaml"); });
    CHECK(contains(e, "t.yaml:9: tied_embeddings: expected true or false"));
    e = error_of([] { parse_model_yaml(replace(kTinyYaml, "tied_embeddings: true", "tied_embeddings: \"true\""), "t.yaml"); });
    CHECK(contains(e, "tied_embeddings"));
    e = error_of([] { parse_model_yaml(std::string(kTinyYaml) + "bias: {qkv: yes}\n", "t.yaml"); });
    CHECK(contains(e, "bias.qkv"));
  }
  SUBCASE("unknown enum value") {
    Error e = error_of([] { parse_model_yaml(std::string(kTinyYaml) + "mlp: swiglu\n", "t.yaml"); });
    CHECK(e.kind() == ErrorKind::invalid_spec);
    CHECK(contains(e, "t.yaml:11: mlp: 'swiglu' is not one of gated_silu, gated_gelu, plain_gelu"));
    e = error_of([] { parse_model_yaml(std::string(kTinyYaml) + "norm: batchnorm\n", "t.yaml"); });
    CHECK(contains(e, "norm: 'batchnorm'"));
  }
  SUBCASE("heads not divisible by kv heads") {
    Error e = error_of([] { parse_model_yaml(replace(kTinyYaml, "num_kv_heads: 2", "num_kv_heads: 3"), "t.yaml"); });
    CHECK(e.kind() == ErrorKind::invalid_spec);
    CHECK(contains(e, "t.yaml:7: num_kv_heads"));
    CHECK(contains(e, "not divisible"));
    e = error_of([] { parse_model_yaml(replace(replace(kTinyYaml, "hidden_size: 64", "hidden_size: 66"), "head_dim: 16\n", ""), "t.yaml"); });
    CHECK(contains(e, "head_dim"));
  }
  SUBCASE("norms_per_layer out of range") {
    Error e = error_of([] { parse_model_yaml(std::string(kTinyYaml) + "norms_per_layer: 5\n", "t.yaml"); });
    CHECK(contains(e, "t.yaml:11: norms_per_layer"));
  }
  SUBCASE("sliding window needs a window") {
    Error e = error_of([] { parse_model_yaml(std::string(kTinyYaml) + "sliding_window: {every_nth: 2}\n", "t.yaml"); });
    CHECK(contains(e, "sliding_window.window"));
    e = error_of([] { parse_model_yaml(std::string(kTinyYaml) + "sliding_window: {window: 8, every_nth: 0}\n", "t.yaml"); });
    CHECK(contains(e, "sliding_window.every_nth"));
  }
  SUBCASE("absurd sizes: an error, never a wrong number") {
    Error e = error_of([] {
      parse_model_yaml(replace(replace(kTinyYaml, "vocab_size: 256", "vocab_size: 1099511627776"),
                               "hidden_size: 64", "hidden_size: 1099511627776"), "t.yaml");
    });
    CHECK(e.kind() == ErrorKind::invalid_spec);
    CHECK(contains(e, "vocab_size"));
    e = error_of([] { parse_model_yaml(replace(kTinyYaml, "vocab_size: 256", "vocab_size: 99999999999999999999999"), "t.yaml"); });
    CHECK(e.kind() == ErrorKind::overflow);
    CHECK(contains(e, "vocab_size"));
    e = error_of([] { parse_model_yaml(replace(kTinyYaml, "num_layers: 2", "num_layers: 100000"), "t.yaml"); });
    CHECK(contains(e, "num_layers"));
    CHECK(parse_model_yaml(replace(kTinyYaml, "num_layers: 2", "num_layers: 1024"), "t.yaml").num_layers == 1024);
    e = error_of([] { parse_model_yaml(replace(kTinyYaml, "num_layers: 2", "num_layers: 1025"), "t.yaml"); });
    CHECK(contains(e, "num_layers: 1025 exceeds the limit of 1024"));

    // A spec built in code skips the loader's checks; parameters() still refuses to wrap.
    ModelSpec s = tiny();
    s.vocab_size = 1ull << 40;
    s.hidden_size = 1ull << 40;
    e = error_of([&] { (void)s.parameters(); });
    CHECK(e.kind() == ErrorKind::overflow);
    CHECK(contains(e, "vocab_size"));
    CHECK(error_of([&] { s.validate("api"); }).kind() == ErrorKind::invalid_spec);
  }
}

TEST_CASE("validate") {
  ModelSpec s = tiny();
  CHECK_NOTHROW(s.validate());
  s.head_dim = 0;
  Error e = error_of([&] { s.validate("my-spec"); });
  CHECK(e.kind() == ErrorKind::invalid_spec);
  CHECK(contains(e, "my-spec: head_dim: must be > 0"));
  s = tiny();
  s.num_kv_heads = 8;  // more kv heads than heads
  CHECK(contains(error_of([&] { s.validate(); }), "num_kv_heads"));
  s = tiny();
  s.norms_per_layer = 0;
  CHECK(contains(error_of([&] { s.validate(); }), "norms_per_layer"));
  s = tiny();
  s.final_logit_softcap = -1;
  CHECK(contains(error_of([&] { s.validate(); }), "final_logit_softcap"));
  s = tiny();
  s.hidden_size = (1ull << 24) + 1;
  CHECK(contains(error_of([&] { s.validate(); }), "hidden_size"));
}

TEST_CASE("load_model: files, names and content sniffing") {
  const fs::path dir =
      fs::temp_directory_path() / ("membudget_test_spec_" + std::to_string(std::random_device{}()));
  fs::create_directories(dir / "Some-Model");
  {
    std::ofstream(dir / "Some-Model" / "config.json") << "\n  " << R"({"model_type": "llama",
      "vocab_size": 256, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
      "tie_word_embeddings": true})";
    std::ofstream(dir / "my-model.txt") << replace(kTinyYaml, "name: tiny\n", "");
  }
  // JSON recognised by its first character, named after its directory.
  const ModelSpec j = load_model((dir / "Some-Model" / "config.json").string());
  CHECK(j.name == "Some-Model");
  CHECK(j.parameters().total == 102720);
  // YAML regardless of extension; the name defaults to the file stem.
  const ModelSpec y = load_model((dir / "my-model.txt").string());
  CHECK(y.name == "my-model");
  CHECK(y.parameters().total == 102720);

  const std::string missing = (dir / "nope.yaml").string();
  Error e = error_of([&] { load_model(missing); });
  CHECK(e.kind() == ErrorKind::io);
  CHECK(contains(e, missing));
  CHECK(e.exit_code() == 5);
  fs::remove_all(dir);
}

TEST_CASE("the full example in docs/model-spec.md parses to Gemma 2 9B") {
  std::ifstream in(kSource + "/docs/model-spec.md");
  REQUIRE(in);
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto begin = doc.find("```yaml\n");
  REQUIRE(begin != std::string::npos);
  const auto end = doc.find("```", begin + 8);
  REQUIRE(end != std::string::npos);
  const ModelSpec s = parse_model_yaml(doc.substr(begin + 8, end - begin - 8), "docs/model-spec.md");
  check_same_architecture(s, load_model(config("gemma-2-9b")));
  CHECK(s.parameters().total == 9'241'705'984ull);
}

TEST_CASE("the loaders set the architecture quirks once, from the family") {
  const ModelSpec phi = load_model(hf("phi-3-mini"));
  CHECK(phi.quirks.fused_qkv);
  CHECK(phi.quirks.fused_gate_up);
  CHECK(phi.quirks.partial_rotary);
  CHECK(!phi.quirks.norm_weight_offset);
  for (const char* g : {"gemma-2b", "gemma-2-9b"}) {
    CAPTURE(g);
    const ModelSpec s = load_model(hf(g));
    CHECK(s.quirks.norm_weight_offset);
    CHECK(s.quirks.embedding_scale);
    CHECK(!s.quirks.fused_qkv);
  }
  for (const char* plain : {"llama-3.2-1b", "qwen2.5-7b", "mistral-7b", "qwen3-0.6b"}) {
    CAPTURE(plain);
    CHECK(load_model(hf(plain)).quirks == ArchQuirks{});
  }
  // Qwen2-MoE makes a sliding-window mask for no layer; its dense relative Qwen2 does not
  const ModelSpec qwen_moe = load_model(hf("moe/qwen1.5-moe-a2.7b"));
  CHECK(qwen_moe.quirks.unused_sliding_mask);
  CHECK(!qwen_moe.sliding.enabled());
  CHECK(!parse_model_yaml(std::string(kTinyYaml) + "family: qwen2_moe\nquirks: {unused_sliding_mask: false}\n", "t.yaml")
             .quirks.unused_sliding_mask);
  // YAML: the family implies them; a quirks: mapping sets each one explicitly
  CHECK(parse_model_yaml(replace(kTinyYaml, "name: tiny\n", "name: tiny\nfamily: phi3\n")).quirks.fused_qkv);
  // a hand-written family in another case or with dashes is the family it names
  CHECK(parse_model_yaml(replace(kTinyYaml, "name: tiny\n", "name: tiny\nfamily: Gemma2\n")).quirks.norm_weight_offset);
  CHECK(parse_model_yaml(replace(kTinyYaml, "name: tiny\n", "name: tiny\nfamily: PHI3\n")).quirks.fused_qkv);
  CHECK(parse_model_yaml(replace(kTinyYaml, "name: tiny\n", "name: tiny\nfamily: qwen2-moe\n")).quirks.unused_sliding_mask);
  CHECK(parse_model_yaml(replace(kTinyYaml, "name: tiny\n", "name: tiny\nfamily: zzz\n")).quirks == ArchQuirks{});
  const ModelSpec custom = parse_model_yaml(
      std::string(kTinyYaml) + "quirks: {embedding_scale: true, fused_gate_up: true}\n", "t.yaml");
  CHECK(custom.quirks.embedding_scale);
  CHECK(custom.quirks.fused_gate_up);
  CHECK(!custom.quirks.fused_qkv);
  const Error e = error_of([] { parse_model_yaml(std::string(kTinyYaml) + "quirks: {fused_kqv: true}\n", "t.yaml"); });
  CHECK(contains(e, "quirks.fused_kqv"));
  CHECK(contains(e, "did you mean 'fused_qkv'"));
}

TEST_CASE("the tensor description: modules, order and per-layer accessors") {
  auto modules = [](const std::vector<ParamTensor>& ts) {
    std::string out;
    for (const auto& t : ts) out += std::string(to_string(t.module)) + (t.bias ? ".bias " : " ");
    return out;
  };
  // Llama: norms around attention and MLP, separate projections, no biases
  CHECK(modules(load_model(hf("llama-3.2-1b")).layer_tensors(0)) ==
        "attn_norm q_proj k_proj v_proj o_proj mlp_norm gate_proj up_proj down_proj ");
  // Qwen2: each bias right after its weight
  CHECK(modules(load_model(hf("qwen2.5-0.5b")).layer_tensors(3)) ==
        "attn_norm q_proj q_proj.bias k_proj k_proj.bias v_proj v_proj.bias o_proj mlp_norm gate_proj up_proj "
        "down_proj ");
  // Phi-3: the fused projections are one tensor each
  const ModelSpec phi = load_model(hf("phi-3-mini"));
  CHECK(modules(phi.layer_tensors(0)) == "attn_norm qkv_proj o_proj mlp_norm gate_up_proj down_proj ");
  CHECK(phi.layer_tensors(0)[1].out == phi.q_dim() + 2 * phi.kv_dim());
  CHECK(phi.layer_tensors(0)[4].out == 2 * phi.intermediate_size);
  // Gemma 2: four norms, q/k norm free; every other layer slides, starting at layer 0
  const ModelSpec g2 = load_model(hf("gemma-2-9b"));
  CHECK(modules(g2.layer_tensors(0)) ==
        "attn_norm q_proj k_proj v_proj o_proj attn_out_norm mlp_norm gate_proj up_proj down_proj mlp_out_norm ");
  std::uint64_t sliding = 0;
  for (std::uint64_t il = 0; il < g2.num_layers; ++il) sliding += g2.sliding_layer(il);
  CHECK(sliding == g2.sliding.windowed_layers(g2.num_layers));
  CHECK(g2.sliding_layer(0));
  CHECK(!g2.sliding_layer(1));
  // Qwen3: per-head q and k norms of head_dim values
  const auto q3 = load_model(hf("qwen3-0.6b")).layer_tensors(0);
  CHECK(modules(q3) == "attn_norm q_proj k_proj v_proj o_proj q_norm k_norm mlp_norm gate_proj up_proj down_proj ");
  CHECK(q3[5].out == 128);
  // the ends: embedding, final norm, and lm_head only when untied
  CHECK(modules(load_model(hf("llama-3.2-1b")).outer_tensors()) == "embed_tokens norm ");
  CHECK(modules(load_model(hf("llama-3.1-8b")).outer_tensors()) == "embed_tokens norm lm_head ");
}

TEST_CASE("config.json architectures: a causal language model's class, or refused by name") {
  std::ifstream in(kSource + "/tests/data/hf/llama-3.2-1b.json");
  const nlohmann::json cfg = nlohmann::json::parse(in);
  auto with = [&](const nlohmann::json& archs) {
    nlohmann::json c = cfg;
    c["architectures"] = archs;
    return c.dump();
  };
  auto message = [](const std::string& text) {
    try {
      (void)parse_hf_config(text, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  // the head decides the logits and the loss: another head's prediction would be another model's
  const std::string head = message(with({"LlamaForSequenceClassification"}));
  CHECK(head.find("architectures") != std::string::npos);
  CHECK(head.find("'LlamaForSequenceClassification' is not a causal language model") != std::string::npos);
  CHECK(message(with({"LlamaModel"})).find("is not a causal language model") != std::string::npos);
  CHECK(message(with("LlamaForCausalLM")).find("expected a list of class names") != std::string::npos);
  CHECK(message(with({42})).find("expected a list of class names") != std::string::npos);
  CHECK(message(with({"LlamaForCausalLM"})) == "loaded");
  CHECK(message(with({"MistralForCausalLM"})) == "loaded");  // (vLLM's class for the same layers)
  CHECK(message(with(nlohmann::json::array())) == "loaded");
  CHECK(message(with(nullptr)) == "loaded");
}

TEST_CASE("a config.json field the spec's checks refuse is named by its config.json key") {
  std::ifstream in(kSource + "/tests/data/hf/llama-3.2-1b.json");
  const nlohmann::json cfg = nlohmann::json::parse(in);
  const std::pair<const char*, const char*> keys[] = {{"num_key_value_heads", "num_key_value_heads: must be > 0"},
                                                      {"num_hidden_layers", "num_hidden_layers: must be > 0"}};
  for (const auto& k : keys) {
    nlohmann::json c = cfg;
    c[k.first] = 0;
    std::string what;
    try {
      (void)parse_hf_config(c.dump(), "config.json");
    } catch (const Error& e) {
      what = e.what();
    }
    CAPTURE(what);
    CHECK(what.find(k.second) != std::string::npos);  // (it named num_kv_heads, num_layers: YAML fields)
  }
}
