// Mixture-of-experts models (issue 14): the config.json families membudget describes, their
// parameters counted exactly as transformers 5.17 builds them (tests/data/torch_train_moe_h200.json
// records sum(p.numel()) and the parameter tensors of each measured model), the active parameters
// per token, and what is refused until the MoE block's step is simulated.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "helpers.hpp"
#include "membudget/api.hpp"
#include "membudget/budget.hpp"
#include "membudget/serving.hpp"

using namespace membudget;

namespace {
// The spec of a measured case: its config.json, with the case's overrides applied as transformers
// applied them (fewer layers, fewer experts).
ModelSpec spec_of(const nlohmann::json& job) {
  std::ifstream in(test::source_path(job["config"].get<std::string>()));
  nlohmann::json cfg = nlohmann::json::parse(in);
  if (job.contains("overrides") && job["overrides"].is_object())
    for (const auto& [k, v] : job["overrides"].items()) cfg[k] = v;
  return parse_hf_config(cfg.dump(), job["config"].get<std::string>());
}
}  // namespace

TEST_CASE("MoE parameters and parameter tensors are transformers' own, for every measured family") {
  std::ifstream in(test::source_path("tests/data/torch_train_moe_h200.json"));
  REQUIRE(in.good());
  const auto data = nlohmann::json::parse(in);
  std::set<std::string> families;
  for (const auto& c : data["cases"]) {
    if (c["status"] != "ok") continue;
    const ModelSpec m = spec_of(c["job"]);
    CAPTURE(c["name"].get<std::string>());
    REQUIRE(m.moe.enabled());
    const ParameterCounts p = m.parameters();
    CHECK(p.total == c["model"]["parameters"].get<std::uint64_t>());
    CHECK(p.tensors == c["model"]["parameter_tensors"].get<std::uint64_t>());
    families.insert(m.family);
  }
  CHECK(families == std::set<std::string>{"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3"});
}

TEST_CASE("active parameters: everything but the routed experts a token is not sent to") {
  const ModelSpec m = load_model(test::source_path("tests/data/hf/moe/mixtral-8x7b.json"));
  const ParameterCounts p = m.parameters();
  // one layer's routed experts: 8 × (2 · 14336 · 4096 + 4096 · 14336); a token uses 2 of the 8
  const std::uint64_t experts_per_layer = 8ull * 3 * 14336 * 4096;
  CHECK(p.total - p.active == 32 * experts_per_layer / 8 * 6);
  CHECK(p.total == 46702792704ull);  // Mixtral 8x7B's published count
  // DeepSeek-V2-Lite: layer 0 is dense, its 26 others hold 64 experts and 2 shared ones
  const ModelSpec d = load_model(test::source_path("tests/data/hf/moe/deepseek-v2-lite.json"));
  CHECK_FALSE(d.moe_layer(0));
  CHECK(d.moe_layer(1));
  CHECK(d.moe.shared_ff == 2 * 1408);
  // a dense model is all active
  const ModelSpec dense = load_model(test::source_path("configs/hf/llama-3.2-1b.json"));
  CHECK(dense.parameters().active == dense.parameters().total);
}

TEST_CASE("MoE jobs the walks do not cover are refused by name; the rest are predicted") {
  const ModelSpec m = load_model(test::source_path("tests/data/hf/moe/qwen3-30b-a3b.json"));
  auto refused_job = [&](const ModelSpec& spec, const Job& j, const char* needle) {
    try {
      (void)predict(spec, j);
      FAIL("predicted");
    } catch (const Error& e) {
      CAPTURE(e.what());
      CHECK(e.kind() == ErrorKind::unsupported);
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
    CHECK_THROWS_AS((void)estimate(spec, j), Error);
  };
  Job j;
  j.batch = 1;
  j.seq = 1024;
  for (Mode mode : {Mode::train, Mode::infer}) {
    j.mode = mode;
    const Budget b = predict(m, j);
    CHECK(b.peak > b.states.weights);
    CHECK(estimate(m, j).peak == b.peak);
  }
  Job lora = j;
  lora.mode = Mode::train;
  lora.lora_rank = 8;
  refused_job(m, lora, "--lora");
  Job fsdp = j;
  fsdp.mode = Mode::train;
  fsdp.parallel.fsdp = 8;
  refused_job(m, fsdp, "parallel layout");
  Job int4 = j;
  int4.mode = Mode::infer;
  int4.weights = DType::int4;
  refused_job(m, int4, "--weights int4 on a mixture of experts");
  Job harness = j;
  harness.mode = Mode::train;
  harness.profile = Profile::harness;
  refused_job(m, harness, "mixture of experts");
  // DeepSeek's router is described (parameters are exact) but not walked
  const ModelSpec ds = load_model(test::source_path("tests/data/hf/moe/deepseek-v2-lite.json"));
  for (Mode mode : {Mode::train, Mode::infer}) {
    j.mode = mode;
    refused_job(ds, j, "DeepSeek's MoE router");
  }
  // vLLM's sizing runs its fused MoE kernels: refused
  CHECK_THROWS_WITH_AS((void)vllm_profile_activation_peak(m, 8192, 256), doctest::Contains("fused mixture-of-experts"), Error);
  // routing schemes and MoE families not described are refused at load, naming what is missing
  auto refused = [](const std::string& json, const char* needle) {
    try {
      (void)parse_hf_config(json, "config.json");
      FAIL("loaded");
    } catch (const Error& e) {
      CAPTURE(e.what());
      CHECK(e.kind() == ErrorKind::unsupported);
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  std::ifstream in(test::source_path("tests/data/hf/moe/deepseek-v3.json"));
  nlohmann::json v3 = nlohmann::json::parse(in);
  v3["topk_method"] = "sinkhorn";
  refused(v3.dump(), "topk_method");
  v3["topk_method"] = "noaux_tc";
  v3["output_router_logits"] = true;
  refused(v3.dump(), "output_router_logits");
  refused(R"({"model_type": "jamba", "vocab_size": 10, "hidden_size": 8})", "jamba");
  refused(R"({"model_type": "llama", "num_local_experts": 4, "vocab_size": 10, "hidden_size": 8})", "mixture-of-experts");
}
