// predict()'s fast path (the compiled plan, src/model/step_plan.cpp) gives the full simulation's
// numbers, saved tensors by name included.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>

#include "helpers.hpp"
#include "membudget/budget.hpp"
#include "model/inventory.hpp"
#include "model/step_plan.hpp"

using namespace membudget;

namespace {

void check_same(const Budget& fast, const Budget& full, const std::string& what) {
  INFO(what);
  REQUIRE(fast.phases.size() == full.phases.size());
  REQUIRE(fast.step0.size() == full.step0.size());
  for (std::size_t i = 0; i < full.phases.size(); ++i) {
    CHECK(fast.phases[i].phase == full.phases[i].phase);
    CHECK(fast.phases[i].bytes == full.phases[i].bytes);
  }
  for (std::size_t i = 0; i < full.step0.size(); ++i) CHECK(fast.step0[i].bytes == full.step0[i].bytes);
  CHECK(fast.peak == full.peak);
  CHECK(fast.peak_phase == full.peak_phase);
  CHECK(fast.states.weights == full.states.weights);
  CHECK(fast.states.gradients == full.states.gradients);
  CHECK(fast.states.optimizer == full.states.optimizer);
  CHECK(fast.states.master == full.states.master);
  CHECK(fast.autocast_cache == full.autocast_cache);
  CHECK(fast.terms.activations == full.terms.activations);
  CHECK(fast.terms.logits_loss == full.terms.logits_loss);
  CHECK(fast.activations.per_layer == full.activations.per_layer);
  CHECK(fast.activations.other == full.activations.other);
  REQUIRE(fast.activations.layer_tensors.size() == full.activations.layer_tensors.size());
  for (std::size_t i = 0; i < full.activations.layer_tensors.size(); ++i) {
    CHECK(fast.activations.layer_tensors[i].name == full.activations.layer_tensors[i].name);
    CHECK(fast.activations.layer_tensors[i].count == full.activations.layer_tensors[i].count);
    CHECK(fast.activations.layer_tensors[i].bytes == full.activations.layer_tensors[i].bytes);
  }
}

std::vector<std::string> all_configs() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(test::source_path("configs")))
    if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("fast path == full simulation: every config, recompute, precision, loss, attention, shape") {
  const auto failures_before = detail::step_plan_failures();
  PredictOptions full;
  full.full_simulation = true;
  int compared = 0;
  for (const auto& path : all_configs()) {
    const ModelSpec m = load_model(path);
    // The 405B model's full simulation is slow in a debug build: fewer shapes for it.
    const bool huge = m.num_layers > 100;
    const std::vector<std::pair<std::uint64_t, std::uint64_t>> shapes =
        huge ? std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1, 1000}}
             : std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1, 128}, {3, 1000}, {2, 4096}, {16, 77}};
    for (auto [b, s] : shapes)
      for (Recompute rc : {Recompute::none, Recompute::full})
        for (Precision p : {Precision::fp32, Precision::amp_bf16, Precision::bf16, Precision::bf16_master})
          for (Loss loss : {Loss::full, Loss::chunked}) {
            if (huge && (p == Precision::fp32 || loss == Loss::chunked)) continue;
            Job j;
            j.batch = b;
            j.seq = std::min<std::uint64_t>(s, m.max_positions);
            j.recompute = rc;
            j.precision = p;
            j.loss = loss;
            j.attention = (b * s <= 1024) ? Attention::math : Attention::flash;
            j.optimizer = (compared % 3 == 0) ? Optimizer::adamw : (compared % 3 == 1) ? Optimizer::adafactor
                                                                                       : Optimizer::adamw_8bit;
            const std::string what = path + " b=" + std::to_string(b) + " s=" + std::to_string(j.seq) + " " +
                                     to_string(rc) + " " + to_string(p) + " " + to_string(loss) + " " +
                                     to_string(j.attention) + " " + to_string(j.optimizer);
            check_same(predict(m, j), predict(m, j, full), what);
            ++compared;
          }
  }
  CHECK(compared > 500);
  CHECK(detail::step_plan_failures() == failures_before);  // every step compiled: no fallback
}

TEST_CASE("fast path == full simulation: toy models with 7 to 12 layers, qk-norm, biases, 4 norms") {
  const auto failures_before = detail::step_plan_failures();
  PredictOptions full;
  full.full_simulation = true;
  for (std::uint64_t L = 7; L <= 12; ++L) {
    const ModelSpec m = test::toy_llama_variant(L);
    for (std::uint64_t b : {1, 2, 5})
      for (Attention a : {Attention::flash, Attention::math}) {
        Job j;
        j.batch = b;
        j.seq = 96;
        j.attention = a;
        j.optimizer = b == 1 ? Optimizer::sgd : b == 2 ? Optimizer::lion : Optimizer::sgd_momentum;
        check_same(predict(m, j), predict(m, j, full), "toy L=" + std::to_string(L));
      }
  }
  CHECK(detail::step_plan_failures() == failures_before);
}

TEST_CASE("fast path == full simulation for LoRA jobs, saved tensors by name included") {
  PredictOptions full;
  full.full_simulation = true;
  for (const char* c : {"configs/llama-3.2-1b.yaml", "configs/llama-3.1-8b.yaml"})
    for (Precision p : {Precision::amp_bf16, Precision::bf16})
      for (Recompute rc : {Recompute::none, Recompute::full}) {
        const ModelSpec m = load_model(test::source_path(c));
        Job j;
        j.lora_rank = 16;
        j.batch = 2;
        j.seq = 777;
        j.precision = p;
        j.recompute = rc;
        check_same(predict(m, j), predict(m, j, full), std::string(c) + " lora");
      }
}

TEST_CASE("fast path == full simulation for mixture-of-experts models, and for layer patterns it does not compile") {
  PredictOptions full;
  full.full_simulation = true;
  for (const char* c : {"tests/data/hf/moe/qwen3-30b-a3b.json", "tests/data/hf/moe/qwen1.5-moe-a2.7b.json",
                        "tests/data/hf/moe/olmoe-1b-7b.json", "tests/data/hf/moe/mixtral-8x7b.json",
                        "tests/data/hf/moe/deepseek-v2-lite.json"}) {
    ModelSpec m = load_model(test::source_path(c));
    m.num_layers = 9;  // deep enough to be compiled from copies (a debug build simulates each)
    for (Precision p : {Precision::amp_bf16, Precision::bf16})
      for (Recompute rc : {Recompute::none, Recompute::full}) {
        Job j;
        j.batch = 2;
        j.seq = 1000;
        j.precision = p;
        j.recompute = rc;
        const auto failures_before = detail::step_plan_failures();
        check_same(predict(m, j), predict(m, j, full), std::string(c) + " " + to_string(p) + " " + to_string(rc));
        CHECK(detail::step_plan_failures() == failures_before);  // compiled
        // a rank of transformers' expert parallelism
        j.parallel.expert = m.moe.experts % 4 == 0 ? 4 : 2;
        j.parallel.rank = 1;
        check_same(predict(m, j), predict(m, j, full), std::string(c) + " --ep " + std::to_string(j.parallel.expert));
        CHECK(detail::step_plan_failures() == failures_before);
      }
    // the other experts implementations, the routing and the load-balancing loss
    for (int variant = 0; variant < 4; ++variant) {
      Job j;
      j.batch = 1;
      j.seq = 48;
      j.experts = variant == 0 ? ExpertsImpl::batched_mm : ExpertsImpl::eager;
      if (variant == 2) j.routing = Routing::worst;
      if (variant == 3) {
        j.experts = ExpertsImpl::grouped_mm;
        j.router_aux_loss = true;
        j.precision = Precision::bf16;
        j.recompute = Recompute::full;
      }
      const auto failures_before = detail::step_plan_failures();
      check_same(predict(m, j), predict(m, j, full), std::string(c) + " variant " + std::to_string(variant));
      // batched_mm's tensors are c · b^i · s^j: compiled. The eager loop's per-expert rows (T·k/E,
      // rounded) are not, and the aux loss walks every layer's logits after the layers, which the
      // depth copies cannot line up: both are simulated.
      if (variant == 0) CHECK(detail::step_plan_failures() == failures_before);
    }
    // dense layers between the MoE ones: the copies would leave them out, so the step is simulated
    for (int pattern = 0; pattern < 3; ++pattern) {
      ModelSpec v = m;
      if (pattern == 0) v.moe.sparse_step = 2;
      if (pattern == 1) v.moe.dense_layers = {7};
      if (pattern == 2) v.moe.first_dense = 3;
      Job j;
      j.batch = 1;
      j.seq = 512;
      check_same(predict(v, j), predict(v, j, full), std::string(c) + " pattern " + std::to_string(pattern));
      CHECK(predict(v, j).peak != predict(m, j).peak);  // the dense layers count
    }
  }
}
