// Mixture-of-experts models (issue 14): the config.json families membudget describes, their
// parameters counted exactly as transformers 5.17 builds them (tests/data/torch_train_moe_h200.json
// records sum(p.numel()) and the parameter tensors of each measured model), the active parameters
// per token, and what is refused until the MoE block's step is simulated.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "helpers.hpp"
#include "membudget/api.hpp"
#include "membudget/budget.hpp"
#include "membudget/serving.hpp"
#include "model/parallel.hpp"

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
  Job tp = j;
  tp.mode = Mode::train;
  tp.parallel.tensor = 4;
  refused_job(m, tp, "--tp: a mixture of experts");
  Job int4 = j;
  int4.mode = Mode::infer;
  int4.weights = DType::int4;
  refused_job(m, int4, "--weights int4 on a mixture of experts");
  Job harness = j;
  harness.mode = Mode::train;
  harness.profile = Profile::harness;
  refused_job(m, harness, "mixture of experts");
  // --experts eager is walked expert by expert: beyond 32,768 experts × MoE layers it is refused
  // (65,536 experts in 32 layers took 13 GB), in both modes; grouped_mm takes the same model
  ModelSpec wide = m;
  wide.num_layers = 2;
  wide.moe.experts = 16385;
  wide.moe.top_k = 2;
  Job eager = j;
  eager.experts = ExpertsImpl::eager;
  for (Mode mode : {Mode::train, Mode::infer}) {
    eager.mode = mode;
    refused_job(wide, eager, "16385 experts × 2 MoE layers is more than the 32768 expert iterations modelled");
  }
  Job grouped = eager;
  grouped.experts = ExpertsImpl::grouped_mm;
  CHECK(predict(wide, grouped).peak > 0);
  wide.moe.experts = 16384;  // at the limit: walked
  eager.seq = 64;
  CHECK(predict(wide, eager).peak > 0);
  // a pipeline walks the loop for every microbatch a stage runs (Qwen3-30B-A3B over 2 stages at 32
  // microbatches took 2.4 GiB)
  Job piped = j;
  piped.mode = Mode::train;
  piped.precision = Precision::bf16;
  piped.experts = ExpertsImpl::eager;
  piped.parallel.pipeline = 2;
  piped.parallel.microbatches = 16;
  refused_job(m, piped, "128 experts × 48 MoE layers × 16 microbatches over 2 stages is more than the 32768");
  // DeepSeek-V2's and V3's routers and latent attention are walked
  for (const char* c : {"tests/data/hf/moe/deepseek-v2-lite.json", "tests/data/hf/moe/deepseek-v3.json"}) {
    ModelSpec ds = load_model(test::source_path(c));
    ds.num_layers = 4;  // V3's 61 layers of 256 experts are a large simulation in a debug build
    for (Mode mode : {Mode::train, Mode::infer}) {
      j.mode = mode;
      CHECK(predict(ds, j).peak > ds.parameters().total);
    }
  }
  // vLLM's sizing runs its 16-bit fused MoE kernel (modelled); its quantized MoE kernels are refused
  CHECK(vllm_profile_activation_peak(m, 8192, 256) > 0);
  CHECK_THROWS_WITH_AS((void)vllm_profile_activation_peak(m, 8192, 256, DType::int4), doctest::Contains("mixture-of-experts kernels"), Error);
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
  v3["output_router_logits"] = true;  // loads: the load-balancing loss is the job's default then
  CHECK(parse_hf_config(v3.dump(), "config.json").moe.output_router_logits);
  refused(R"({"model_type": "jamba", "vocab_size": 10, "hidden_size": 8})", "jamba");
  refused(R"({"model_type": "llama", "num_local_experts": 4, "vocab_size": 10, "hidden_size": 8})", "mixture-of-experts");
}

TEST_CASE("--experts, --routing and --router-aux-loss: the job as given, each changing what it should") {
  const ModelSpec m = load_model(test::source_path("tests/data/hf/moe/qwen3-30b-a3b.json"));
  Job j;
  j.batch = 1;
  j.seq = 512;
  j.precision = Precision::bf16;
  const Budget grouped = predict(m, j);
  Job worst = j;
  worst.routing = Routing::worst;
  CHECK(predict(m, worst).peak == grouped.peak);  // grouped_mm's sizes do not depend on the routing
  Job batched = j;
  batched.experts = ExpertsImpl::batched_mm;
  // every pair keeps its expert's gathered weights: S × (2I·h + h·I) × 2 bytes per layer
  const bytes_t pairs = j.batch * j.seq * m.moe.top_k;
  const Budget b = predict(m, batched);
  CHECK(b.terms.activations > pairs * 3 * m.moe.expert_ff * m.hidden_size * 2 * m.num_layers);
  CHECK(b.terms.activations > grouped.terms.activations);
  Job eager = j;
  eager.experts = ExpertsImpl::eager;
  const Budget e = predict(m, eager);
  // the loop's weight-slice gradients: a parameter-sized temporary per expert in backward
  CHECK(e.phase(Phase::backward_peak) > grouped.phase(Phase::backward_peak));
  Job eager_worst = eager;
  eager_worst.routing = Routing::worst;
  CHECK(predict(m, eager_worst).phase(Phase::forward_peak) != e.phase(Phase::forward_peak));
  Job aux = j;
  aux.router_aux_loss = true;
  // every layer's logits (T × E bf16) stay to the loss, and the loss's softmax is saved
  CHECK(predict(m, aux).phase(Phase::forward_peak) > grouped.phase(Phase::forward_peak));
  // the names as the CLI, YAML and C ABI take them
  Job o;
  CHECK(set_moe_option(o, "experts", "batched_mm", "--experts"));
  CHECK(o.experts == ExpertsImpl::batched_mm);
  CHECK(set_moe_option(o, "routing", "worst", "--routing"));
  CHECK(o.routing == Routing::worst);
  CHECK(set_moe_option(o, "router_aux_loss", "true", "--router-aux-loss"));
  CHECK(o.router_aux_loss);
  CHECK(!set_moe_option(o, "dp", "2", "--dp"));
  CHECK_THROWS_WITH_AS(set_moe_option(o, "experts", "deepgemm", "--experts"), doctest::Contains("'deepgemm' is not one of"), Error);
  // a dense model refuses them
  const ModelSpec dense = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  for (const Job& bad : {batched, worst, aux})
    CHECK_THROWS_WITH_AS((void)predict(dense, bad), doctest::Contains("has no mixture of experts"), Error);
}

TEST_CASE("CLI: the MoE flags echo in the JSON, with the active parameters") {
  const std::string mixtral = test::source_path("tests/data/hf/moe/mixtral-8x7b.json");
  const auto r = test::run_cli("predict " + mixtral + " --batch 1 --seq 256 --experts eager --routing worst "
                               "--router-aux-loss --format json 2>/dev/null");
  REQUIRE(r.exit_code <= 1);
  const auto o = nlohmann::json::parse(r.out);
  CHECK(o["job"]["experts"] == "eager");
  CHECK(o["job"]["routing"] == "worst");
  CHECK(o["job"]["router_aux_loss"] == true);
  CHECK(o["model"]["active_parameters"].get<std::uint64_t>() < o["model"]["parameters"].get<std::uint64_t>());
  CHECK(o["model"]["moe"]["experts"] == 8);
  const auto dense = test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") + " --experts eager");
  CHECK(dense.exit_code == 2);
  CHECK(dense.out.find("has no mixture of experts") != std::string::npos);
  const auto serve = test::run_cli("predict " + mixtral + " --mode infer --router-aux-loss");
  CHECK(serve.exit_code == 2);
  CHECK(serve.out.find("--router-aux-loss") != std::string::npos);
}

TEST_CASE("YAML moe: the same model as its config.json, and bad sections named") {
  const ModelSpec hf = load_model(test::source_path("tests/data/hf/moe/qwen3-30b-a3b.json"));
  const std::string yaml = R"(name: qwen3-30b-a3b
family: qwen3
vocab_size: 151936
hidden_size: 2048
intermediate_size: 6144
num_layers: 48
num_heads: 32
num_kv_heads: 4
head_dim: 128
max_positions: 40960
qk_norm: true
moe:
  experts: 128
  top_k: 8
  expert_ff: 768
  normalize_top_k: true
)";
  const ModelSpec y = parse_model_yaml(yaml, "qwen3-moe.yaml");
  CHECK(y.moe == hf.moe);
  CHECK(y.parameters().total == hf.parameters().total);
  CHECK(y.parameters().active == hf.parameters().active);
  Job j;
  j.batch = 1;
  j.seq = 1024;
  CHECK(predict(y, j).peak == predict(hf, j).peak);
  auto bad = [&](const std::string& from, const std::string& to, const char* needle) {
    std::string text = yaml;
    text.replace(text.find(from), from.size(), to);
    try {
      (void)parse_model_yaml(text, "qwen3-moe.yaml");
      FAIL("loaded");
    } catch (const Error& e) {
      CAPTURE(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  bad("experts: 128", "experts: 0", "moe.experts");
  bad("top_k: 8", "top_k: 0", "num_experts_per_tok");
  bad("  expert_ff: 768\n", "", "expert_ff");
  bad("normalize_top_k: true", "normalize_top_k: true\n  dense_layers: [1, -2]", "moe.dense_layers");
  bad("normalize_top_k: true", "normalize_top_k: true\n  router: sinkhorn", "moe.router");
  bad("normalize_top_k: true", "normalize_top_k: true\n  gating: 2", "unknown key");
  // settings the block would ignore, or a block that is not there (a shared expert without its
  // gate beside this router walked a gate parameter that did not exist: a crash)
  bad("normalize_top_k: true", "normalize_top_k: true\n  shared_ff: 512", "shared_gate: true");
  bad("normalize_top_k: true", "normalize_top_k: true\n  shared_gate: true", "there is none");
  bad("normalize_top_k: true", "normalize_top_k: true\n  dense_layers: [48]", "layer 48 is not one of the model's 48");
  bad("normalize_top_k: true", "normalize_top_k: true\n  dense_layers: [3, 7, 3]", "layer 3 is listed twice");
  bad("normalize_top_k: true", "normalize_top_k: true\n  first_dense: 48", "no layer a mixture of experts");
  bad("normalize_top_k: true", "normalize_top_k: true\n  sparse_step: 49", "no layer a mixture of experts");
  bad("  expert_ff: 768\n", "  expert_ff: 99999999\n", "moe.expert_ff");
  bad("normalize_top_k: true", "normalize_top_k: true\n  shared_ff: 99999999\n  shared_gate: true", "moe.shared_ff");
  bad("normalize_top_k: true", "normalize_top_k: true\n  router: deepseek_v3\n  groups: 32\n  group_top_k: 1",
      "cannot be chosen from the 1 groups of 4");
  CHECK(parse_model_yaml(yaml + "  shared_ff: 512\n  shared_gate: true\n", "gated.yaml").parameters().total >
        y.parameters().total);  // the gated shared expert, as Qwen2-MoE's
}

TEST_CASE("config.json MoE fields that would be ignored or mean a dense model are refused by name") {
  const auto edited = [](const char* file, auto&& edit) {
    std::ifstream in(test::source_path(file));
    nlohmann::json cfg = nlohmann::json::parse(in);
    edit(cfg);
    try {
      (void)parse_hf_config(cfg.dump(), "config.json");
      return std::string("loaded");
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  auto has = [](const std::string& what, const char* needle) {
    CAPTURE(what);
    CHECK(what.find(needle) != std::string::npos);
  };
  has(edited("tests/data/hf/moe/mixtral-8x7b.json", [](nlohmann::json& c) { c["num_local_experts"] = 0; }),
      "num_local_experts: must be at least 1");
  has(edited("tests/data/hf/moe/qwen3-30b-a3b.json", [](nlohmann::json& c) { c["num_experts"] = 0; }),
      "num_experts: must be at least 1");
  // a whole number past 64 bits (JSON keeps it as a float) is too large, not "not whole"
  has(edited("tests/data/hf/moe/qwen3-30b-a3b.json",
             [](nlohmann::json& c) { c["num_experts"] = nlohmann::json::parse("18446744073709551616"); }),
      "num_experts: is absurdly large (more than 64 bits");
  has(edited("tests/data/hf/moe/qwen3-30b-a3b.json", [](nlohmann::json& c) { c["num_experts"] = 1.5; }),
      "num_experts: must be a whole number");
  has(edited("tests/data/hf/moe/qwen3-30b-a3b.json", [](nlohmann::json& c) { c["mlp_only_layers"] = "0"; }),
      "mlp_only_layers: must be a list");
  has(edited("tests/data/hf/moe/qwen3-30b-a3b.json", [](nlohmann::json& c) { c["mlp_only_layers"] = {0, 48}; }),
      "layer 48 is not one of");
  has(edited("tests/data/hf/moe/qwen3-30b-a3b.json", [](nlohmann::json& c) { c["mlp_only_layers"] = {0, 5, 0}; }),
      "mlp_only_layers): layer 0 is listed twice");
  has(edited("tests/data/hf/moe/deepseek-v3.json", [](nlohmann::json& c) { c["n_shared_experts"] = 1000000; }),
      "exceeds the limit");
  has(edited("tests/data/hf/moe/deepseek-v3.json", [](nlohmann::json& c) { c["topk_group"] = 1; c["num_experts_per_tok"] = 64; }),
      "cannot be chosen");
  CHECK(edited("tests/data/hf/moe/deepseek-v3.json", [](nlohmann::json&) {}) == "loaded");
  // transformers' DeepseekV3 has no topk_method (its router is always noaux_tc), and None where a
  // number belongs fails in the router
  has(edited("tests/data/hf/moe/deepseek-v3.json", [](nlohmann::json& c) { c["topk_method"] = "greedy"; }),
      "topk_method: is 'greedy', but transformers' DeepseekV3 always routes noaux_tc");
  has(edited("tests/data/hf/moe/deepseek-v3.json", [](nlohmann::json& c) { c["n_group"] = nullptr; }),
      "n_group: is null");
  has(edited("tests/data/hf/moe/deepseek-v3.json", [](nlohmann::json& c) { c["topk_group"] = nullptr; }),
      "topk_group: is null");
  // a default the config left out is named as one
  has(edited("tests/data/hf/moe/deepseek-v3.json",
             [](nlohmann::json& c) {
               c.erase("n_group");
               c["n_routed_experts"] = 12;
             }),
      "n_group: must divide n_routed_experts (12), with 1 ≤ topk_group ≤ n_group (n_group 8, the config class's default, "
      "topk_group 4)");
  has(edited("tests/data/hf/moe/deepseek-v2-lite.json", [](nlohmann::json& c) { c["moe_layer_freq"] = nullptr; }),
      "moe_layer_freq: must be at least 1");
}

TEST_CASE("DeepSeek-V3's router as transformers builds it when the config leaves fields out or null") {
  std::ifstream in(test::source_path("tests/data/hf/moe/deepseek-v3.json"));
  const nlohmann::json full = nlohmann::json::parse(in);
  const ModelSpec given = parse_hf_config(full.dump(), "config.json");
  // the fields left out: DeepseekV3Config's defaults (n_group 8, topk_group 4, norm_topk_prob true),
  // and noaux_tc, not V2's greedy softmax router
  nlohmann::json bare = full;
  for (const char* k : {"topk_method", "n_group", "topk_group", "norm_topk_prob"}) bare.erase(k);
  const ModelSpec defaults = parse_hf_config(bare.dump(), "config.json");
  CHECK(defaults.moe.router == MixtureOfExperts::Router::deepseek_v3);
  CHECK(defaults.moe.router_bias);
  CHECK(defaults.moe.groups == 8);
  CHECK(defaults.moe.group_top_k == 4);
  CHECK(defaults.moe.normalize_top_k);
  Job j;
  j.batch = 1;
  j.seq = 512;
  j.precision = Precision::bf16;
  CHECK(estimate(defaults, j).peak == estimate(given, j).peak);
  // norm_topk_prob null is None: `if self.norm_topk_prob:` does not normalise
  nlohmann::json none = full;
  none["norm_topk_prob"] = nullptr;
  CHECK_FALSE(parse_hf_config(none.dump(), "config.json").moe.normalize_top_k);
}

// transformers 5.17's MoE blocks: Mixtral's, Qwen2-MoE's and OLMoE's __init__ assign self.gate, then
// self.experts; Qwen3-MoE's and DeepSeek's self.experts, then self.gate (model.parameters() order,
// which the measured optimizer state of OLMoE and Qwen3-30B-A3B follows: tests/data/fsdp_uneven/,
// tests/data/reserved_alone/).
TEST_CASE("the MoE block's registration order: the router before the experts where transformers registers it so") {
  struct Family {
    const char* config;
    bool router_first;
  };
  for (const Family& f : {Family{"tests/data/hf/moe/mixtral-8x7b.json", true}, Family{"tests/data/hf/moe/olmoe-1b-7b.json", true},
                          Family{"tests/data/hf/moe/qwen1.5-moe-a2.7b.json", true}, Family{"tests/data/hf/moe/qwen3-30b-a3b.json", false},
                          Family{"tests/data/hf/moe/deepseek-v2-lite.json", false}}) {
    CAPTURE(f.config);
    const ModelSpec m = load_model(test::source_path(f.config));
    CHECK(m.moe.router_first == f.router_first);
    const std::uint64_t moe_layer = m.moe.first_dense;  // DeepSeek's first layers are dense
    const auto layer = detail::registered_layer_tensors(m, moe_layer);
    auto first = [&](auto&& is) {
      return std::find_if(layer.begin(), layer.end(), [&](const ParamTensor& t) { return is(t.module); }) - layer.begin();
    };
    const auto router = first([](Module x) { return x == Module::router; });
    const auto experts = first([](Module x) { return x == Module::experts_gate_up || x == Module::experts_down; });
    const auto shared = first([](Module x) { return x == Module::shared_gate || x == Module::shared_up || x == Module::shared_down; });
    const auto norm = first([](Module x) { return x == Module::attn_norm || x == Module::mlp_norm; });
    REQUIRE(router < static_cast<std::ptrdiff_t>(layer.size()));
    REQUIRE(experts < static_cast<std::ptrdiff_t>(layer.size()));
    CHECK((router < experts) == f.router_first);
    if (m.moe.shared_ff) CHECK(shared > std::max(router, experts));  // the shared expert after both
    CHECK(norm > std::max(router, experts));                          // the layer's norms last
  }
  // YAML: moe.router_first, false unless given
  const std::string yaml = "name: tiny-moe\nfamily: llama\nvocab_size: 1000\nhidden_size: 64\nintermediate_size: 128\n"
                           "num_layers: 2\nnum_heads: 4\nnum_kv_heads: 4\nmax_positions: 512\nmoe:\n  experts: 4\n  top_k: 2\n"
                           "  expert_ff: 32\n";
  CHECK_FALSE(parse_model_yaml(yaml, "m.yaml").moe.router_first);
  CHECK(parse_model_yaml(yaml + "  router_first: true\n", "m.yaml").moe.router_first);
  CHECK_THROWS_WITH_AS(parse_model_yaml(yaml + "  router_first: 3\n", "m.yaml"), doctest::Contains("moe.router_first"), Error);
}

TEST_CASE("DeepSeek-V2's group-limited routing: the group scores and masks are temporaries, nothing more is kept") {
  const ModelSpec greedy = load_model(test::source_path("tests/data/hf/moe/deepseek-v2-lite.json"));
  ModelSpec grouped = greedy;
  grouped.moe.group_limited = true;
  grouped.moe.groups = 8;
  grouped.moe.group_top_k = 3;
  Job j;
  j.batch = 1;
  j.seq = 2048;
  j.precision = Precision::bf16;
  const Budget a = predict(greedy, j), b = predict(grouped, j);
  // softmax keeps the scores either way and topk keeps only its indices: the one addition is the
  // inverted bool mask masked_fill keeps (T × E bytes, rounded) per MoE layer
  const bytes_t moe_layers = greedy.num_layers - greedy.moe.first_dense;
  const bytes_t mask = (j.seq * greedy.moe.experts + 511) / 512 * 512;
  CHECK(b.terms.activations - a.terms.activations == moe_layers * mask);
  CHECK(b.phase(Phase::forward_peak) > a.phase(Phase::forward_peak));
}

namespace {
bytes_t r512(bytes_t v) { return (v + 511) / 512 * 512; }
}  // namespace

TEST_CASE("vLLM's pool for a mixture of experts: the fused MoE kernel's workspace, routing buffers and shared expert") {
  // Qwen3-30B-A3B: 128 experts, top-8, expert width 768, hidden 2048, no shared expert, every layer MoE
  const ModelSpec q = load_model(test::source_path("tests/data/hf/moe/qwen3-30b-a3b.json"));
  REQUIRE(q.moe.top_k == 8);
  const std::uint64_t T = 8192, h = q.hidden_size, k = q.moe.top_k, N = 2 * q.moe.expert_ff, E = q.moe.experts;
  // one sampler row: the forward decides; by hand from docs/serving.md §3.2's terms
  const bytes_t workspace = T * k * std::max(N / 2, h) * 2 + T * k * std::max(N, h) * 2;  // 256-aligned already
  CHECK(workspace == 512 * MiB);
  const bytes_t stream = 2 * r512(T * h * 2);
  const bytes_t attn = r512(T * (q.q_dim() + 2 * q.kv_dim()) * 2) + r512(T * q.q_dim() * 2);
  const bytes_t padded = T * k + E * 63;
  const bytes_t routed = r512(T * E * 2) + 2 * r512(T * k * 4) + r512(padded * 4) + r512((padded + 63) / 64 * 4) + 512 + r512(T * h * 2);
  CHECK(vllm_profile_activation_peak(q, T, 1) == stream + std::max(attn, routed) + workspace);
  // the workspace is one buffer for every layer: the depth does not change the peak
  ModelSpec deeper = q;
  deeper.num_layers *= 2;
  CHECK(vllm_profile_activation_peak(deeper, T, 1) == vllm_profile_activation_peak(q, T, 1));
  // the sampler run still holds the workspace
  const bytes_t sampler = r512(T * h * 2) + 1024 * q.vocab_size * 27 + workspace;
  CHECK(vllm_profile_activation_peak(q, T, 1024) == std::max(stream + std::max(attn, routed) + workspace, sampler));

  // a shared expert (Qwen1.5-MoE: 5632 wide, sigmoid-gated) runs first; its output stays through the
  // routed pass and the sum is a third (T, h)
  const ModelSpec s = load_model(test::source_path("tests/data/hf/moe/qwen1.5-moe-a2.7b.json"));
  REQUIRE(s.moe.shared_ff > 0);
  ModelSpec unshared = s;
  unshared.moe.shared_ff = 0;
  const bytes_t with = vllm_profile_activation_peak(s, T, 1), without = vllm_profile_activation_peak(unshared, T, 1);
  const bytes_t th = r512(T * s.hidden_size * 2);
  const bytes_t shared_mlp = r512(T * 2 * s.moe.shared_ff * 2) + r512(T * s.moe.shared_ff * 2);
  CHECK(with > without);
  CHECK(with - without <= std::max<bytes_t>(2 * th, shared_mlp));

  // the serve plan subtracts it: a pool smaller than the dense estimate would give
  ServeOptions o;
  o.total_memory = find_device("H200").capacity;
  o.device_name = "H200";
  const ServePlan p = plan_serving(q, o);
  CHECK(p.activation_peak == vllm_profile_activation_peak(q, p.max_num_batched_tokens, p.max_num_seqs));
  o.weights = DType::fp8;
  CHECK_THROWS_WITH_AS((void)plan_serving(q, o), doctest::Contains("fp8 mixture-of-experts kernels"), Error);
}

TEST_CASE("quantized serving weights count every matrix of a packed expert tensor") {
  const ModelSpec m = load_model(test::source_path("tests/data/hf/mixtral-8x7b.json"));
  // an expert tensor (E, out, in) is E matrices, each quantized with its own scales
  bytes_t experts = 0;
  for (const ParamTensor& t : m.layer_tensors(0))
    if (t.count > 1) experts += t.elements();
  REQUIRE(experts > 0);
  experts *= m.num_layers;
  const bytes_t int4 = serving_weight_bytes(m, DType::int4), int8 = serving_weight_bytes(m, DType::int8),
                fp8 = serving_weight_bytes(m, DType::fp8), bf16 = serving_weight_bytes(m, DType::bf16);
  // int4 (GPTQ, groups of 128 inputs; Mixtral's inputs are multiples of 128): per weight half a
  // byte of value, 2/128 of fp16 scale and 1/256 of packed zero point: 133/256 bytes, every expert
  CHECK(int4 >= experts / 256 * 133);
  CHECK(int4 < experts / 256 * 133 + (bf16 - 2 * experts));  // the rest is at most its 16-bit size
  CHECK(int8 > experts);
  CHECK(fp8 > experts);
  CHECK(int4 < int8);
  CHECK(int8 < bf16);
}

// Expert parallelism (--ep N, transformers 5.17's ep_plan): each rank holds experts / N of every
// packed expert tensor; everything else is replicated and every rank runs the same tokens. The
// measured ranks are held by test_distributed; here the mechanism against the model's own tensor
// description, and the layouts that are refused.
namespace {
// Qwen3-30B-A3B cut to two layers and a bf16 step of 512 tokens: the expert-parallel tests' job.
ModelSpec qwen3_moe_two_layers() {
  ModelSpec m = load_model(test::source_path("tests/data/hf/moe/qwen3-30b-a3b.json"));
  m.num_layers = 2;
  return m;
}
Job short_bf16_step() {
  Job j;
  j.batch = 1;
  j.seq = 512;
  j.precision = Precision::bf16;
  return j;
}
}  // namespace

TEST_CASE("--ep N: a rank's packed experts are 1/N of them, the rest as on one GPU; other layouts refused") {
  const ModelSpec m = qwen3_moe_two_layers();
  const Job j = short_bf16_step();
  // the packed experts' bytes on one GPU, from the tensor description
  std::uint64_t experts = 0;
  for (std::size_t il = 0; il < m.num_layers; ++il)
    for (const ParamTensor& t : m.layer_tensors(il))
      if (t.module == Module::experts_gate_up || t.module == Module::experts_down) experts += t.elements() * 2;
  REQUIRE(experts > 0);
  const Budget one = predict(m, j);
  for (std::uint64_t ep : {2u, 8u, 128u}) {
    CAPTURE(ep);
    Job e = j;
    e.parallel.expert = ep;
    e.parallel.rank = ep - 1;
    const Budget b = predict(m, e);
    const std::uint64_t local_share = experts / ep;
    CHECK(b.states.weights == one.states.weights - experts + local_share);
    CHECK(b.states.gradients == one.states.gradients - experts + local_share);
    CHECK(b.states.optimizer == one.states.optimizer - 2 * (experts - local_share));
    CHECK(b.parameters.total == one.parameters.total);  // the model's, not the rank's
    // the ep_router's masks and remapped indices are T·k buffers: the forward keeps a few per layer
    const std::uint64_t Tk = j.batch * j.seq * m.moe.top_k;
    auto activations = [](const Budget& x) {  // the steady forward's peak above the model states it carries
      return static_cast<std::int64_t>(x.phase(Phase::forward_peak) - x.states.weights - x.states.optimizer);
    };
    const std::int64_t forward_extra = activations(b) - activations(one);
    CHECK(forward_extra >= 0);
    CHECK(forward_extra <= static_cast<std::int64_t>(m.num_layers * 4 * ((Tk * 8 + 511) / 512 * 512)));
  }
  auto refused = [&](Job e, ErrorKind kind, const char* needle, const ModelSpec* spec = nullptr) {
    try {
      (void)predict(spec ? *spec : m, e);
      FAIL("predicted");
    } catch (const Error& err) {
      CAPTURE(err.what());
      CHECK(err.kind() == kind);
      CHECK(std::string(err.what()).find(needle) != std::string::npos);
    }
  };
  Job e = j;
  e.parallel.expert = 3;
  refused(e, ErrorKind::invalid_job, "num_experts 128 is not divisible by 3");
  e.parallel.expert = 0;
  refused(e, ErrorKind::invalid_job, "--ep: must be at least 1");
  e.parallel.expert = 4;
  for (auto other : {&Parallelism::tensor, &Parallelism::data, &Parallelism::pipeline, &Parallelism::context}) {
    Job x = e;
    x.parallel.*other = 2;
    refused(x, ErrorKind::unsupported, "expert parallelism is modelled alone or with FSDP2 across it");
  }
  Job offload = e;
  offload.parallel.fsdp = 2;
  offload.parallel.fsdp_offload = true;
  refused(offload, ErrorKind::unsupported, "--fsdp-offload");
  Job eager = e;
  eager.experts = ExpertsImpl::eager;
  refused(eager, ErrorKind::unsupported, "--experts eager");
  Job serve = e;
  serve.mode = Mode::infer;
  refused(serve, ErrorKind::unsupported, "--ep: serving");
  Job master = e;
  master.precision = Precision::bf16_master;
  refused(master, ErrorKind::unsupported, "bf16-master");
  const ModelSpec dense = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  refused(e, ErrorKind::invalid_job, "has no mixture of experts", &dense);
  // DeepSeek's routers are expert-parallel too (measured: tests/data/torch_train_ep_deepseek_fakepg_h200.json)
  ModelSpec ds = load_model(test::source_path("tests/data/hf/moe/deepseek-v2-lite.json"));
  ds.num_layers = 2;
  Job dse = e;
  dse.parallel.expert = 2;
  const Budget ds_one = predict(ds, j);
  const Budget ds_ep = predict(ds, dse);
  CHECK(ds_ep.states.weights < ds_one.states.weights);
  CHECK(ds_ep.parameters.total == ds_one.parameters.total);
  dse.parallel.expert = 3;
  refused(dse, ErrorKind::invalid_job, "num_experts 64 is not divisible by 3", &ds);
}

TEST_CASE("--ep E --fsdp F: FSDP2 shards each rank's share of the experts and every other parameter F ways") {
  const ModelSpec m = qwen3_moe_two_layers();
  Job j = short_bf16_step();
  j.parallel.expert = 4;
  const Budget ep = predict(m, j);
  for (std::uint64_t f : {2u, 4u}) {
    CAPTURE(f);
    Job x = j;
    x.parallel.fsdp = f;
    // Qwen3-30B-A3B's dims divide evenly: each rank stores 1/F of the --ep rank's parameters (and
    // their state), up to each shard's 512-byte rounding
    const Budget b = predict(m, x);
    const double tensors = 2 * 16 + 3;  // per layer at most 16, plus the embedding, norm and lm_head
    CHECK(static_cast<double>(b.states.weights * f) == doctest::Approx(static_cast<double>(ep.states.weights)).epsilon(tensors * 512 * f / 1.9e9));
    CHECK(static_cast<double>(b.states.optimizer * f) == doctest::Approx(static_cast<double>(ep.states.optimizer)).epsilon(2 * tensors * 512 * f / 3.8e9));
    CHECK(b.parameters.total == ep.parameters.total);
    // the ranks of one expert-parallel group (r / E the same) hold alike; so do the fsdp indices here
    for (std::uint64_t r : {std::uint64_t{0}, std::uint64_t{3}, 4 * f - 1}) {
      Job y = x;
      y.parallel.rank = r;
      CHECK(predict(m, y).phase(Phase::backward_peak) == b.phase(Phase::backward_peak));
    }
  }
  // an uneven split: 32 local experts over 3 shards stores 11 rows on every rank, the last holds 10
  ModelSpec olmoe = load_model(test::source_path("tests/data/hf/moe/olmoe-1b-7b.json"));
  olmoe.num_layers = 2;
  Job u = j;
  u.parallel.expert = 2;
  u.parallel.fsdp = 3;
  u.parallel.rank = 0;
  const Budget first = predict(olmoe, u);
  u.parallel.rank = 5;
  const Budget last = predict(olmoe, u);
  CHECK(last.states.weights == first.states.weights);  // the padded storage
  CHECK(last.states.optimizer < first.states.optimizer);  // the state of its own rows
}

TEST_CASE("CLI and YAML: --ep and job.parallel.ep echo in the JSON") {
  const std::string qwen = test::source_path("tests/data/hf/moe/qwen3-30b-a3b.json");
  const auto r = test::run_cli("predict " + qwen + " --batch 1 --seq 256 --ep 8 --rank 3 --format json 2>/dev/null");
  REQUIRE(r.exit_code <= 1);
  const auto o = nlohmann::json::parse(r.out);
  CHECK(o["job"]["parallel"]["ep"] == 8);
  CHECK(o["job"]["parallel"]["world"] == 8);
  const auto bad = test::run_cli("predict " + qwen + " --ep 3");
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.find("not divisible by 3") != std::string::npos);
  const auto text = test::run_cli("predict " + qwen + " --batch 1 --seq 256 --ep 4");
  CHECK(text.out.find("expert parallel over 4 ranks") != std::string::npos);
  // YAML's job.parallel (and the C ABI's and Python's options) take the same key
  Job y;
  CHECK(set_parallel_option(y, "ep", "4", "job.parallel.ep"));
  CHECK(y.parallel.expert == 4);
  CHECK(set_parallel_option(y, "expert_parallel", "2", "job.parallel.expert_parallel"));
  CHECK(y.parallel.expert == 2);
  CHECK_THROWS_WITH_AS(set_parallel_option(y, "ep", "two", "job.parallel.ep"), doctest::Contains("job.parallel.ep"), Error);
}
