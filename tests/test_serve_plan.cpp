// The compiled serving walk (src/model/serve_plan.cpp) behind predict() and estimate() for
// `--mode infer`: at every (batch, prompt length) it must give what the walk gives when run.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>

#include "helpers.hpp"
#include "membudget/api.hpp"
#include "membudget/budget.hpp"
#include "model/serve_plan.hpp"

using namespace membudget;

namespace {

void check_same(const Budget& got, const Budget& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.phases.size() == want.phases.size());
  for (std::size_t i = 0; i < want.phases.size(); ++i) {
    CHECK(got.phases[i].phase == want.phases[i].phase);
    CHECK(got.phases[i].bytes == want.phases[i].bytes);
  }
  CHECK(got.peak == want.peak);
  CHECK(got.peak_phase == want.peak_phase);
  CHECK(got.states.weights == want.states.weights);
  CHECK(got.terms.activations == want.terms.activations);
  CHECK(got.terms.kv_cache == want.terms.kv_cache);
  CHECK(got.terms.logits_loss == want.terms.logits_loss);
}

void check_estimate(const Estimate& got, const Estimate& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.n_phases == want.n_phases);
  for (std::size_t i = 0; i < want.n_phases; ++i) {
    CHECK(std::string(got.phases[i].name) == want.phases[i].name);
    CHECK(got.phases[i].bytes == want.phases[i].bytes);
  }
  CHECK(got.n_step0 == want.n_step0);
  CHECK(got.peak == want.peak);
  CHECK(std::string(got.peak_phase) == want.peak_phase);
  CHECK(got.required == want.required);
  CHECK(got.terms.model_states == want.terms.model_states);
  CHECK(got.terms.activations == want.terms.activations);
  CHECK(got.terms.kv_cache == want.terms.kv_cache);
  CHECK(got.terms.logits_loss == want.terms.logits_loss);
  CHECK(got.states.weights == want.states.weights);
}

std::vector<ModelSpec> models() {
  std::vector<ModelSpec> out;
  for (const auto& e : std::filesystem::directory_iterator(test::source_path("configs")))
    if (e.path().extension() == ".yaml") out.push_back(load_model(e.path().string()));
  out.push_back(load_model(test::source_path("tests/data/hf/tiny-mla.json")));
  std::sort(out.begin(), out.end(), [](const ModelSpec& a, const ModelSpec& b) { return a.name < b.name; });
  return out;
}

}  // namespace

TEST_CASE("serving plans == the walk: every config, KV and weight dtypes, shapes around sliding windows") {
  const auto failures_before = detail::serve_plan_failures();
  PredictOptions full;
  full.full_simulation = true;
  int compared = 0;
  for (const ModelSpec& m : models()) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> shapes = {{1, 1}, {1, 7}, {3, 129}, {8, 4096}, {1, 32768}};
    if (m.sliding.enabled())
      for (std::uint64_t s : {m.sliding.window - 1, m.sliding.window, m.sliding.window + 1, 2 * m.sliding.window + 3})
        shapes.push_back({2, s});
    const bool huge = m.num_layers > 100;
    // int4's group: 128 where it splits every projection's rows evenly (vLLM refuses one that does
    // not), else the largest power of two that does (the toy specs' 160-wide rows: 32)
    std::uint64_t group = 128;
    for (const ParamTensor& t : m.layer_tensors(0))
      if (t.projection())
        while (group > 1 && t.in % group != 0) group /= 2;
    for (auto [b, s] : shapes)
      for (DType kv : {DType::bf16, DType::fp8})
        for (DType w : {DType::bf16, DType::int4}) {
          if (huge && (kv != DType::bf16 || s > 4096)) continue;
          Job j;
          j.mode = Mode::infer;
          j.batch = b;
          j.seq = s;
          j.kv_dtype = kv;
          j.weights = w;
          j.group_size = group;
          const std::string what = m.name + " b=" + std::to_string(b) + " s=" + std::to_string(s) + " kv " +
                                   to_string(kv) + " weights " + to_string(w);
          const Budget walk = predict(m, j, full);
          check_same(predict(m, j), walk, what);
          check_estimate(estimate(m, j), summarize(walk), what);
          ++compared;
        }
  }
  CHECK(compared > 300);
  CHECK(detail::serve_plan_failures() == failures_before);  // every walk compiled
}

TEST_CASE("serving plans: a plan is small, absurd sizes overflow like the walk") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.1-70b.yaml"));
  Job j;
  j.mode = Mode::infer;
  auto plan = detail::ServePlan::compile(m, j);
  REQUIRE(plan);
  MESSAGE("70B serving: ", plan->basis_size(), " basis components, ", plan->rows(), " rows");
  CHECK(plan->rows() <= 200);
  j.batch = 1u << 16;
  j.seq = 1u << 16;  // 2^32 tokens: valid, and its logits-free walk fits 64 bits
  CHECK(estimate(m, j).peak == predict(m, j, PredictOptions{false, true}).peak);
}
