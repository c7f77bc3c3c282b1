// The calculator core: terms, the textbook model, the inventory's phases, the worked example.
#include <doctest/doctest.h>

#include <array>
#include <string>

#include "helpers.hpp"
#include "membudget/budget.hpp"
#include "model/autograd_sim.hpp"
#include "model/inventory.hpp"
#include "model/korthikanti.hpp"

using namespace membudget;

namespace {
Job train_job(std::uint64_t b, std::uint64_t s) {
  Job j;
  j.batch = b;
  j.seq = s;
  return j;
}
}  // namespace

TEST_CASE("Korthikanti: the paper's canonical layer is 34sbh + 5as²b") {
  const ModelSpec m = test::toy_textbook(64, 4);
  Job j = train_job(2, 32);
  j.activations = ActivationModel::korthikanti;
  j.attention = Attention::math;  // unfused attention keeps the s×s matrices
  const ActivationsBreakdown b = detail::korthikanti(m, j);
  const bytes_t s = 32, bb = 2, h = 64, a = 4;
  CHECK(b.per_layer == 34 * s * bb * h + 5 * a * s * s * bb);
  CHECK(detail::korthikanti_total(m, j) == m.num_layers * (34 * s * bb * h + 5 * a * s * s * bb));
}

TEST_CASE("Korthikanti variants: fused attention, selective and full recompute") {
  const ModelSpec m = test::toy_textbook(64, 4);
  const bytes_t s = 64, bb = 2, h = 64, a = 4;
  Job j = train_job(bb, s);
  j.activations = ActivationModel::korthikanti;
  SUBCASE("flash drops 5as²b and keeps the fp32 log-sum-exp") {
    j.attention = Attention::flash;
    CHECK(detail::korthikanti(m, j).per_layer == 34 * s * bb * h + 4 * a * s * bb);
  }
  SUBCASE("selective recompute: 34sbh") {
    j.attention = Attention::math;
    j.recompute = Recompute::selective;
    CHECK(detail::korthikanti(m, j).per_layer == 34 * s * bb * h);
  }
  SUBCASE("full recompute: the layer input only, 2sbh in 16-bit, 4sbh with an fp32 residual stream") {
    j.recompute = Recompute::full;
    j.precision = Precision::bf16;
    CHECK(detail::korthikanti(m, j).per_layer == 2 * s * bb * h);
    j.precision = Precision::amp_bf16;
    CHECK(detail::korthikanti(m, j).per_layer == 4 * s * bb * h);
  }
  SUBCASE("a gated MLP counts gate, up, activation and product at width I") {
    ModelSpec g = m;
    g.mlp = MlpKind::gated_silu;
    g.intermediate_size = 96;
    j.attention = Attention::math;
    const bytes_t I = 96;
    CHECK(detail::korthikanti(g, j).per_layer == (11 + 3 + 4) * s * bb * h + 8 * s * bb * I + 5 * a * s * s * bb);
  }
}

TEST_CASE("Korthikanti differences: doubling s or b") {
  const ModelSpec m = test::toy_textbook(64, 4);
  Job j = train_job(2, 64);
  j.activations = ActivationModel::korthikanti;
  j.attention = Attention::math;
  const bytes_t base = detail::korthikanti(m, j).per_layer;
  j.batch = 4;
  CHECK(detail::korthikanti(m, j).per_layer == 2 * base);  // everything is linear in b
  j.batch = 2;
  j.seq = 128;
  const bytes_t sbh = 64 * 2 * 64, as2b = 4 * 64 * 64 * 2;
  // 34sbh doubles, 5as²b quadruples
  CHECK(detail::korthikanti(m, j).per_layer == 2 * 34 * sbh + 4 * 5 * as2b);
}

TEST_CASE("a layer the training inventory does not walk is an error, never a Llama layer in disguise") {
  Job j = train_job(2, 32);
  for (auto activations : {ActivationModel::inventory, ActivationModel::korthikanti}) {
    j.activations = activations;
    ModelSpec m = test::toy_textbook(64, 4);  // layernorm, plain GeLU MLP
    CHECK_THROWS_WITH_AS(predict(m, j), doctest::Contains("norm: layernorm"), Error);
    m.norm = NormKind::rmsnorm;
    CHECK_THROWS_WITH_AS(predict(m, j), doctest::Contains("mlp: plain_gelu"), Error);
    m = test::toy_llama();
    m.bias.o = true;
    CHECK_THROWS_WITH_AS(predict(m, j), doctest::Contains("bias.o"), Error);
    if (activations == ActivationModel::korthikanti) continue;
    // latent attention is walked (docs/moe.md), with each of DeepSeek's rotary forms
    m = test::toy_llama();
    m.mla = {16, 8, 0, 8, 8};
    m.head_dim = 16;
    const bytes_t rotate_half = predict(m, j).phase(Phase::forward_peak);
    m.quirks.interleaved_rotary = true;
    const bytes_t interleaved = predict(m, j).phase(Phase::forward_peak);
    m.quirks.interleaved_rotary = false;
    m.quirks.complex_rotary = true;
    const bytes_t complex = predict(m, j).phase(Phase::forward_peak);
    CHECK(rotate_half > 0);
    CHECK(complex != rotate_half);  // the fp32 copies and complex products
    CHECK(interleaved != complex);
  }
}

// Qwen2-MoE's forward makes the sliding-window mask though no layer slides (ArchQuirks::
// unused_sliding_mask): four s·s bools, the last held until the model's forward returns (before
// the loss), the rest freed at once; no checkpoint frame holds it under recompute.
TEST_CASE("a mask no layer takes: s·s bools made once per forward and freed as the model returns") {
  ModelSpec m = load_model(test::source_path("tests/data/hf/moe/qwen1.5-moe-a2.7b.json"));
  m.num_layers = 2;
  REQUIRE(m.quirks.unused_sliding_mask);
  const std::uint64_t s = 2048;
  for (Recompute recompute : {Recompute::none, Recompute::full}) {
    Job j = train_job(1, s);
    j.attention = Attention::flash;
    j.recompute = recompute;
    const std::string recompute_name = to_string(recompute);
    CAPTURE(recompute_name);
    for (bool quirk : {true, false}) {
      m.quirks.unused_sliding_mask = quirk;
      std::array<detail::SimTrace, 2> traces;
      detail::simulate_torch_train(m, j, false, nullptr, &traces);
      const detail::SimTrace& t = traces[1];
      int made = 0;
      std::size_t made_at = 0, freed_at = 0, loss_at = 0;
      for (std::size_t k = 0; k < t.events.size(); ++k) {
        const std::int32_t ev = t.events[k].t;
        if (ev == detail::SimTrace::kPhase) continue;
        const detail::TensorInfo& info = t.tensors[static_cast<std::size_t>(ev < 0 ? ~ev : ev)];
        const std::string name = info.name;
        if (name == "sliding-window attention mask (bool)") {
          if (ev >= 0) made += 1, made_at = k;
          else freed_at = k;
          CHECK(info.bytes == s * s);
        }
        if (ev >= 0 && !loss_at && name == "logits") loss_at = k;  // lm_head's output
      }
      CAPTURE(quirk);
      CHECK(made == (quirk ? 1 : 0));
      if (quirk) {
        REQUIRE(loss_at > 0);
        CHECK(made_at < freed_at);
        CHECK(freed_at < loss_at);  // gone as the model's forward returns, before the logits
      }
    }
  }
}

TEST_CASE("model states: bytes per parameter follow the recipe") {
  const ModelSpec m = test::toy_llama();
  const std::uint64_t P = m.parameters().total;
  const std::uint64_t tensors = m.parameters().tensors;
  Job j = train_job(1, 64);
  auto within_rounding = [&](bytes_t v, bytes_t exact) { return v >= exact && v <= exact + 512 * (tensors + 2); };
  SUBCASE("amp-bf16 AdamW: fp32 weights 4, grads 4, moments 8") {
    const Budget b = predict(m, j);
    CHECK(within_rounding(b.states.weights, 4 * P));
    CHECK(within_rounding(b.states.gradients, 4 * P));
    CHECK(b.states.optimizer == 8 * P);
    CHECK(b.states.master == 0);
  }
  SUBCASE("bf16 AdamW: state follows the parameter dtype") {
    j.precision = Precision::bf16;
    const Budget b = predict(m, j);
    CHECK(within_rounding(b.states.weights, 2 * P));
    CHECK(within_rounding(b.states.gradients, 2 * P));
    CHECK(b.states.optimizer == 4 * P);
  }
  SUBCASE("bf16-master: fp32 master and fp32 moments") {
    j.precision = Precision::bf16_master;
    const Budget b = predict(m, j);
    CHECK(b.states.master == 4 * P);
    CHECK(b.states.optimizer == 8 * P);
  }
  SUBCASE("SGD keeps no state, momentum one copy") {
    j.optimizer = Optimizer::sgd;
    CHECK(predict(m, j).states.optimizer == 0);
    j.optimizer = Optimizer::sgd_momentum;
    CHECK(predict(m, j).states.optimizer == 4 * P);
  }
}

TEST_CASE("phases: ordering and step 0") {
  const ModelSpec m = test::toy_llama();
  const Budget b = predict(m, train_job(2, 128));
  REQUIRE(b.phases.size() == 4);
  CHECK(b.phases[0].phase == Phase::floor);
  CHECK(b.phases[1].phase == Phase::forward_peak);
  CHECK(b.phases[2].phase == Phase::backward_peak);
  CHECK(b.phases[3].phase == Phase::optimizer_peak);
  CHECK(b.phase(Phase::forward_peak) > b.phase(Phase::floor));
  CHECK(b.phase(Phase::backward_peak) > b.phase(Phase::floor));
  // The optimizer step runs with the gradients present.
  CHECK(b.phase(Phase::optimizer_peak) >= b.phase(Phase::floor) + b.states.gradients);
  // Step 0 starts without optimizer state and before cuBLAS has made its two 32 MiB workspaces
  // (forward thread, autograd thread): its floor is lower by exactly those.
  REQUIRE(b.step0.size() == 4);
  CHECK(b.phase(Phase::floor) - b.step0[0].bytes == b.states.optimizer + 2 * 32 * MiB);
  CHECK(b.peak >= b.phase(Phase::backward_peak));
}

TEST_CASE("inventory differences: activations are linear in b; full recompute saves less") {
  const ModelSpec m = test::toy_llama();
  const Budget b1 = predict(m, train_job(2, 256));
  const Budget b2 = predict(m, train_job(4, 256));
  const double ratio = static_cast<double>(b2.terms.activations) / static_cast<double>(b1.terms.activations);
  CHECK(ratio == doctest::Approx(2.0).epsilon(0.01));
  Job full = train_job(2, 256);
  full.recompute = Recompute::full;
  const Budget bf = predict(m, full);
  CHECK(bf.terms.activations < b1.terms.activations / 4);
  CHECK(bf.phase(Phase::forward_peak) < b1.phase(Phase::forward_peak));
  // Full recompute leaves the model states alone.
  CHECK(bf.terms.model_states == b1.terms.model_states);
}

TEST_CASE("invariance: serving-only fields change nothing in a training budget") {
  ModelSpec m = test::toy_llama();
  const Budget a = predict(m, train_job(2, 128));
  // A sliding window longer than the sequence changes nothing in training (SDPA keeps is_causal).
  m.sliding.window = 256;
  m.sliding.every_nth = 2;
  Job j = train_job(2, 128);
  j.kv_dtype = DType::fp8;
  j.weights = DType::int4;
  const Budget b = predict(m, j);
  CHECK(a.peak == b.peak);
  CHECK(a.terms.activations == b.terms.activations);
  // From s = window on, transformers builds the mask for the sliding layers (every other one here).
  m.sliding.window = 64;
  const Budget c = predict(m, j);
  CHECK(c.terms.activations > a.terms.activations);
  m.sliding.every_nth = 1;
  CHECK(predict(m, j).terms.activations > c.terms.activations);
}

TEST_CASE("worked example: Llama 3.2 1B, micro-batch 4 × 4096, amp-bf16 AdamW") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job j;  // the defaults are the worked example
  SUBCASE("textbook: the logits term outweighs the saved activations of all 16 layers") {
    j.activations = ActivationModel::korthikanti;
    const Budget b = predict(m, j);
    CHECK(b.terms.logits_loss > b.terms.activations);
    j.recompute = Recompute::full;
    const Budget f = predict(m, j);
    // 4 × 4096 × 2048 × 16 layers of fp32 layer inputs: about 2.2 GB
    CHECK(static_cast<double>(f.terms.activations) == doctest::Approx(2.2e9).epsilon(0.05));
  }
  SUBCASE("inventory: fits 80 GB, not 48 GB; full recompute fits 48 GB") {
    const Budget b = predict(m, j);
    CHECK(check_fit(b, find_device("H100-80GB")).fits);
    CHECK_FALSE(check_fit(b, find_device("L40S")).fits);
    j.recompute = Recompute::full;
    const Budget f = predict(m, j);
    CHECK(check_fit(f, find_device("L40S")).fits);
  }
}

TEST_CASE("device fit uses peak + overhead against capacity minus headroom") {
  const ModelSpec m = test::toy_llama();
  Budget b = predict(m, train_job(1, 64));
  const bytes_t need = b.peak + b.terms.overhead;
  Device exact{"exact", static_cast<bytes_t>(static_cast<double>(need) / 0.95) + 1};
  CHECK(check_fit(b, exact).fits);
  Device small{"small", need};
  CHECK_FALSE(check_fit(b, small).fits);        // 5% headroom by default
  CHECK(check_fit(b, small, 0.0).fits);          // no headroom
  CHECK_THROWS_AS(check_fit(b, small, 1.5), Error);
}

TEST_CASE("bad jobs are errors naming the option") {
  const ModelSpec m = test::toy_llama();
  auto kind_of = [&](Job j) {
    try {
      predict(m, j);
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::io;  // no error: a value the checks below never expect
  };
  Job j = train_job(0, 64);
  CHECK(kind_of(j) == ErrorKind::invalid_job);
  j = train_job(1, 0);
  CHECK(kind_of(j) == ErrorKind::invalid_job);
  j = train_job(1ull << 20, 1ull << 20);  // 2^40 tokens
  CHECK(kind_of(j) == ErrorKind::invalid_job);
  CHECK_THROWS_AS(parse_precision("fp64"), Error);
  CHECK_THROWS_AS(parse_optimizer("adam9000"), Error);
  try {
    parse_recompute("sometimes");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("--recompute") != std::string::npos);
    CHECK(std::string(e.what()).find("selective") != std::string::npos);
  }
}

TEST_CASE("absurd sizes overflow into an error, never a wrong number") {
  ModelSpec m = test::toy_llama();
  m.vocab_size = 1ull << 24;
  m.hidden_size = 1ull << 24;
  m.intermediate_size = 1ull << 24;
  m.num_heads = 1ull << 10;
  m.num_kv_heads = 1ull << 10;
  m.head_dim = 1ull << 14;
  m.num_layers = 4096;
  Job j = train_job(1ull << 16, 1ull << 16);
  m.max_positions = 1ull << 20;
  CHECK_THROWS_AS(predict(m, j), Error);
}
