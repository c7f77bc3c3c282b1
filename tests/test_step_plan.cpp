// The compiled training step (src/model/step_plan.cpp) behind estimate(): at every (b, s) it must
// give exactly what predict() computes by simulating the step at that (b, s).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "helpers.hpp"
#include "membudget/api.hpp"
#include "membudget/budget.hpp"
#include "model/cuda_reduce.hpp"
#include "model/inventory.hpp"
#include "model/job_key.hpp"
#include "model/plan_common.hpp"
#include "model/step_plan.hpp"

using namespace membudget;

namespace {

void check_same(const Estimate& got, const Estimate& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.n_phases == want.n_phases);
  REQUIRE(got.n_step0 == want.n_step0);
  for (std::size_t i = 0; i < want.n_phases; ++i) {
    CHECK(std::string(got.phases[i].name) == want.phases[i].name);
    CHECK(got.phases[i].bytes == want.phases[i].bytes);
  }
  for (std::size_t i = 0; i < want.n_step0; ++i) {
    CHECK(std::string(got.step0[i].name) == want.step0[i].name);
    CHECK(got.step0[i].bytes == want.step0[i].bytes);
  }
  CHECK(got.peak == want.peak);
  CHECK(std::string(got.peak_phase) == want.peak_phase);
  CHECK(got.required == want.required);
  CHECK(got.overhead == want.overhead);
  CHECK(got.terms.model_states == want.terms.model_states);
  CHECK(got.terms.activations == want.terms.activations);
  CHECK(got.terms.logits_loss == want.terms.logits_loss);
  CHECK(got.terms.kv_cache == want.terms.kv_cache);
  CHECK(got.states.weights == want.states.weights);
  CHECK(got.states.gradients == want.states.gradients);
  CHECK(got.states.master == want.states.master);
  CHECK(got.states.optimizer == want.states.optimizer);
}

std::vector<std::string> all_configs() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(test::source_path("configs")))
    if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string describe(const std::string& model, const Job& j) {
  return model + " b=" + std::to_string(j.batch) + " s=" + std::to_string(j.seq) + " " + to_string(j.recompute) +
         " " + to_string(j.precision) + " " + to_string(j.loss) + "/" + std::to_string(j.loss_chunk) + " " +
         to_string(j.attention) + " " + to_string(j.optimizer) + " " + to_string(j.activations);
}

}  // namespace

TEST_CASE("estimate() from a plan == predict() at every shape: every config and recipe") {
  const auto failures_before = detail::step_plan_failures();
  // Shapes with odd token counts (nothing 512-aligned), powers of two, and long sequences.
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> shapes = {
      {1, 1}, {1, 7}, {3, 129}, {2, 1000}, {4, 4096}, {1, 16384}, {7, 333}, {64, 2048}};
  int compared = 0;
  for (const auto& path : all_configs()) {
    const ModelSpec m = load_model(path);
    const bool huge = m.num_layers > 100;
    for (Precision p : {Precision::fp32, Precision::amp_bf16, Precision::bf16, Precision::bf16_master})
      for (Recompute rc : {Recompute::none, Recompute::full})
        for (Loss loss : {Loss::full, Loss::chunked}) {
          if (huge && (p == Precision::fp32 || loss == Loss::chunked)) continue;
          for (auto [b, s] : shapes) {
            Job j;
            j.batch = b;
            j.seq = s;
            j.precision = p;
            j.recompute = rc;
            j.loss = loss;
            j.attention = (compared % 4 == 1 && b * s <= 8192) ? Attention::math : Attention::flash;
            j.optimizer = compared % 3 == 0 ? Optimizer::adamw : compared % 3 == 1 ? Optimizer::adafactor : Optimizer::lion;
            j.activations = compared % 5 == 0 ? ActivationModel::korthikanti : ActivationModel::inventory;
            check_same(estimate(m, j), summarize(predict(m, j)), describe(path, j));
            ++compared;
          }
        }
  }
  CHECK(compared > 1000);
  CHECK(detail::step_plan_failures() == failures_before);  // every step compiled
}

TEST_CASE("plans against the full simulation, and on both sides of the chunked loss's chunk") {
  PredictOptions full;
  full.full_simulation = true;
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  for (std::uint64_t chunk : {64, 1024})
    for (std::uint64_t T : {chunk - 1, chunk, chunk + 1, 3 * chunk + 5}) {
      Job j;
      j.loss = Loss::chunked;
      j.loss_chunk = chunk;
      j.batch = T % 2 == 0 ? 2 : 1;
      j.seq = T / j.batch;
      check_same(estimate(m, j), summarize(predict(m, j, full)), describe("llama-3.2-1b", j));
    }
  for (Attention a : {Attention::flash, Attention::math}) {
    Job j;
    j.attention = a;
    j.batch = 3;
    j.seq = 777;
    check_same(estimate(m, j), summarize(predict(m, j, full)), describe("llama-3.2-1b", j));
  }
}

TEST_CASE("plans on both sides of a sliding window's SDPA mask") {
  const auto failures_before = detail::step_plan_failures();
  PredictOptions full;
  full.full_simulation = true;
  for (const char* path : {"configs/phi-3-mini.yaml", "configs/mistral-7b.yaml"}) {
    ModelSpec m = load_model(test::source_path(path));
    m.num_layers = 3;  // the mask regime is per step, not per layer: three layers keep this quick
    const std::uint64_t w = m.sliding.window;
    for (std::uint64_t s : {w - 1, w, w + 1, 2 * w + 3})
      for (Precision p : {Precision::bf16, Precision::amp_bf16})
        for (Loss loss : {Loss::full, Loss::chunked}) {
          Job j;
          j.batch = 1;
          j.seq = s;
          j.precision = p;
          j.loss = loss;
          j.recompute = s % 2 == 0 ? Recompute::full : Recompute::none;
          check_same(estimate(m, j), summarize(predict(m, j, full)), describe(path, j));
        }
  }
  // Gemma 2: the window on every other layer. Past the window the layers alternate, and the plan
  // steps its layer counts by two (even and odd depths, and one too shallow for that).
  for (std::uint64_t L : {5, 10, 13}) {
    ModelSpec m = load_model(test::source_path("configs/gemma-2-9b.yaml"));
    m.num_layers = L;
    const std::uint64_t w = m.sliding.window;
    for (std::uint64_t s : {w - 1, w, 2 * w + 3})
      for (Precision p : {Precision::bf16, Precision::amp_bf16}) {
        Job j;
        j.batch = 1;
        j.seq = s;
        j.precision = p;
        j.recompute = (s + L) % 2 == 0 ? Recompute::full : Recompute::none;
        check_same(estimate(m, j), summarize(predict(m, j, full)), describe("gemma-2-9b L=" + std::to_string(L), j));
      }
  }
  CHECK(detail::step_plan_failures() == failures_before);
}

TEST_CASE("plans for small and unusual models: 1 to 12 layers, qk-norm, biases, 4 norms, tiny chunks") {
  const auto failures_before = detail::step_plan_failures();
  for (std::uint64_t L = 1; L <= 12; ++L) {
    const ModelSpec m = test::toy_llama_variant(L);
    for (std::uint64_t b : {1, 2, 5})
      for (std::uint64_t s : {1, 96, 1001})
        for (Attention a : {Attention::flash, Attention::math}) {
          Job j;
          j.batch = b;
          j.seq = s;
          j.attention = a;
          j.optimizer = b == 1 ? Optimizer::sgd : b == 2 ? Optimizer::sgd_momentum : Optimizer::adamw_8bit;
          check_same(estimate(m, j), summarize(predict(m, j)), describe("toy L=" + std::to_string(L), j));
        }
  }
  CHECK(detail::step_plan_failures() == failures_before);
  // A chunk below 35 tokens cannot be probed below the chunk: such jobs are simulated instead,
  // with the same answer.
  ModelSpec m = test::toy_llama();
  m.num_layers = 8;
  Job j;
  j.loss = Loss::chunked;
  j.loss_chunk = 20;
  j.batch = 1;
  j.seq = 10;
  check_same(estimate(m, j), summarize(predict(m, j)), "toy chunk 20, 10 tokens");
  CHECK(detail::step_plan_failures() == failures_before + 1);
}

TEST_CASE("plans: bad jobs are errors, absurd sizes overflow like the simulation") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.1-8b.yaml"));
  Job j;
  j.batch = 0;
  CHECK_THROWS_AS(estimate(m, j), Error);
  j.batch = 1;
  j.seq = 0;
  CHECK_THROWS_AS(estimate(m, j), Error);
  // b·a·s² of the math path does not fit 64 bits at s = 2^31: both paths say overflow.
  j.seq = 1ull << 31;
  j.attention = Attention::math;
  ErrorKind want = ErrorKind::invalid_job, got = ErrorKind::invalid_job;
  try {
    predict(m, j);
  } catch (const Error& e) {
    want = e.kind();
  }
  try {
    estimate(m, j);
  } catch (const Error& e) {
    got = e.kind();
  }
  CHECK(want == ErrorKind::overflow);
  CHECK(got == want);
  // A model field the plan's key must see: a quirk switches Phi-3's fused projections.
  ModelSpec phi = m;
  phi.quirks.fused_qkv = phi.quirks.fused_gate_up = phi.quirks.partial_rotary = true;
  Job k;
  CHECK(estimate(phi, k).peak == summarize(predict(phi, k)).peak);
  CHECK(estimate(phi, k).peak != estimate(m, k).peak);
}

// Eager attention's two structural regimes: at micro-batch 1 its output gradient is a view, at
// 2 or more a copy (StepPlan::kBatchOne); and under full recompute Gemma 2's layer 1 frees the full
// layers' mask with its checkpoint frame, which no layer above it does (last_mask_holder). Each
// must compile and give the full simulation's figures, at shapes on both sides.
TEST_CASE("plans for eager attention: batch 1 and more, Gemma 2's mask freed by layer 1") {
  const auto failures_before = detail::step_plan_failures();
  for (const char* path : {"configs/llama-3.2-1b.yaml", "configs/gemma-2-9b.yaml"}) {
    const ModelSpec m = load_model(test::source_path(path));
    for (Recompute rc : {Recompute::none, Recompute::full})
      for (auto [b, s] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1, 7}, {1, 2048}, {2, 7}, {3, 1000}}) {
        Job j;
        j.attention = Attention::math;
        j.precision = Precision::amp_bf16;
        j.recompute = rc;
        j.batch = b;
        j.seq = s;
        CHECK(detail::StepPlan::cached(m, j) != nullptr);
        check_same(estimate(m, j), summarize(predict(m, j)), describe(path, j));
      }
  }
  CHECK(detail::step_plan_failures() == failures_before);
  const ModelSpec gemma = load_model(test::source_path("configs/gemma-2-9b.yaml"));
  Job full;
  full.attention = Attention::math;
  full.recompute = Recompute::full;
  CHECK(detail::last_mask_holder(gemma, full) == 1);
  full.attention = Attention::flash;  // no mask below the window
  CHECK(detail::last_mask_holder(gemma, full) == 0);
}

TEST_CASE("a plan is small: few basis components and rows") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.1-70b.yaml"));
  for (Attention a : {Attention::flash, Attention::math}) {
    Job j;
    j.attention = a;
    auto plan = detail::StepPlan::compile(m, j);
    REQUIRE(plan);
    MESSAGE("70B ", std::string(to_string(a)), ": ", plan->basis_size(), " basis components, ", plan->rows(), " rows");
    // (math: 17 and 168 since eager attention's weights stay until the decoder layer returns,
    // over the MLP: 16 and 160 before; flash 15 and 138)
    CHECK(plan->basis_size() <= 17);
    CHECK(plan->rows() <= 200);
  }
}

TEST_CASE("the plans' keys hold a job's layer lists whole: equal lists one number, different lists never one") {
  using detail::list_number;
  CHECK(list_number({}) == 0);
  const std::vector<std::uint64_t> split{4, 4, 4, 4};
  CHECK(list_number(split) != 0);
  CHECK(list_number(split) == list_number(std::vector<std::uint64_t>{4, 4, 4, 4}));
  CHECK(list_number(split) != list_number(std::vector<std::uint64_t>{4, 4, 4, 5}));
  CHECK(list_number(std::vector<std::uint64_t>{3, 5}) != list_number(std::vector<std::uint64_t>{5, 3}));
  // more lists than a thread remembers: each its own number, and one forgotten and seen again a
  // number no other list has had
  std::set<std::uint64_t> given;
  for (std::uint64_t i = 0; i < 10000; ++i) CHECK(given.insert(list_number(std::vector<std::uint64_t>{i, 7})).second);
  CHECK(!given.contains(list_number(std::vector<std::uint64_t>{0, 7})));
  // the keys: a pipeline's split and an MoE model's dense layers each change the key
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job a;
  a.parallel.pipeline = 2;
  a.parallel.pp_layers = {6, 10};
  Job b = a;
  b.parallel.pp_layers = {10, 6};
  CHECK(detail::key_of(m, a) != detail::key_of(m, b));
  b.parallel.pp_layers = {6, 10};
  CHECK(detail::key_of(m, a) == detail::key_of(m, b));
  ModelSpec dense = m;
  dense.moe.dense_layers = {1};
  CHECK(detail::key_of(dense, a) != detail::key_of(m, a));
}

TEST_CASE("plans for LoRA jobs (frozen base, fp32 adapters) == the full simulation") {
  const auto failures_before = detail::step_plan_failures();
  PredictOptions full;
  full.full_simulation = true;
  std::vector<ModelSpec> models;
  for (const char* c : {"configs/llama-3.2-1b.yaml", "configs/qwen2.5-1.5b.yaml", "configs/gemma-2-9b.yaml"})
    models.push_back(load_model(test::source_path(c)));
  for (std::uint64_t L : {1, 3, 7, 10}) models.push_back(test::toy_llama_variant(L));
  int compared = 0;
  for (const ModelSpec& m : models)
    for (Precision p : {Precision::fp32, Precision::amp_bf16, Precision::bf16, Precision::bf16_master})
      for (Recompute rc : {Recompute::none, Recompute::full})
        for (auto [b, s] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1, 7}, {3, 129}, {2, 1024}}) {
          Job j;
          j.lora_rank = compared % 2 ? 16 : 8;
          j.batch = b;
          j.seq = s;
          j.precision = p;
          j.recompute = rc;
          j.loss = compared % 3 == 0 ? Loss::chunked : Loss::full;
          j.attention = compared % 4 == 1 ? Attention::math : Attention::flash;
          const std::string what = m.name + " lora " + std::to_string(j.lora_rank) + " " + describe(m.name, j);
          check_same(estimate(m, j), summarize(predict(m, j, full)), what);
          ++compared;
        }
  CHECK(compared == 7 * 4 * 2 * 3);
  CHECK(detail::step_plan_failures() == failures_before);
  // LoRA changes the prediction (a frozen base needs no gradients or optimizer state for it)
  Job full_ft, lora;
  lora.lora_rank = 16;
  const Estimate a = estimate(models[0], full_ft), l = estimate(models[0], lora);
  CHECK(l.states.gradients < a.states.gradients / 100);
  CHECK(l.states.optimizer < a.states.optimizer / 100);
  CHECK(l.peak < a.peak);
  // Phi-3's fused projections are refused with LoRA, Adafactor over adapters too
  Job phi_job;
  phi_job.lora_rank = 16;
  CHECK_THROWS_AS(estimate(load_model(test::source_path("configs/phi-3-mini.yaml")), phi_job), Error);
  phi_job.optimizer = Optimizer::adafactor;
  CHECK_THROWS_AS(estimate(models[0], phi_job), Error);
}

TEST_CASE("PhaseRows: the per-phase maxima with blocks skipped by their bounds == every row's dot product") {
  // Random vectors over a random basis, phases of 1 to 90 rows: the bounded evaluation must find
  // what summing every row finds, whichever block holds the maximum (including a phase's padded
  // last block) and on both sides of the exact-in-doubles limit (2^53).
  using namespace membudget::detail::plan;
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t D = 1 + next() % 12, P = 1 + next() % 8;
    std::vector<Basis> basis{{Kind::constant, 0, 0, 0, 0}};
    for (std::size_t d = 1; d < D; ++d)
      basis.push_back({Kind::exact, static_cast<std::uint8_t>(next() % 3), static_cast<std::uint8_t>(1 + next() % 2), 0, 0});
    std::vector<std::vector<std::uint64_t>> per_phase(P);
    const int magnitude = trial % 2 ? 30 : 44;  // the second: sums past 2^53 at large shapes
    for (auto& rows : per_phase) {
      const std::size_t n = 1 + next() % 90;
      for (std::size_t i = 0; i < n * D; ++i) rows.push_back(next() % (1ull << magnitude));
    }
    PhaseRows pr;
    pr.set(basis, per_phase);
    for (std::uint64_t b : {1ull, 3ull, 16ull}) {
      for (std::uint64_t s : {1ull, 100ull, 4096ull}) {
        std::array<std::uint64_t, kMaxBasis> vals{};
        std::array<bytes_t, 8> got{};
        if (!pr.max_per_phase(b, s, vals.data(), got.data())) continue;
        for (std::size_t p = 0; p < P; ++p) {
          u128 want = 0;
          for (std::size_t r = 0; r < per_phase[p].size() / D; ++r) want = std::max(want, dot(&per_phase[p][r * D], vals.data(), D));
          CHECK(got[p] == static_cast<bytes_t>(want));
        }
      }
    }
  }
}

TEST_CASE("basis_values: 64-bit arithmetic gives what monomial() and sat_mul() give, overflow included") {
  using namespace membudget::detail::plan;
  const std::uint64_t big = std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t values[] = {0, 1, 2, 3, 511, 512, 4096, 65535, 1ull << 21, 1ull << 31, 1ull << 32,
                                  (1ull << 32) + 1, 1ull << 63, big - 511, big - 1, big};
  std::vector<Basis> basis{{Kind::constant, 0, 0, 0, 0}};
  for (unsigned i = 0; i < 4; ++i)
    for (unsigned j = 0; j < 4; ++j)
      for (unsigned l = 0; l < 3; ++l)
        if (i + j + l) basis.push_back({Kind::exact, static_cast<std::uint8_t>(i), static_cast<std::uint8_t>(j), static_cast<std::uint8_t>(l), 0});
  for (std::uint64_t c : {1ull, 3ull, 513ull, 1ull << 40})
    for (unsigned i = 0; i < 3; ++i)
      for (unsigned j = 0; j < 3; ++j)
        basis.push_back({Kind::rounded, static_cast<std::uint8_t>(i), static_cast<std::uint8_t>(j), static_cast<std::uint8_t>(i == 1), c});
  for (std::uint64_t b : values)
    for (std::uint64_t s : values)
      for (const Basis& e : basis) {
        u128 want = e.kind == Kind::constant ? 1 : monomial(b, e.i, s, e.j, e.l);
        if (e.kind == Kind::rounded) {
          want = sat_mul(want, e.c);
          if (want <= kMax64) want = ((want + 511) >> 9) << 9;
        }
        std::uint64_t got = 0;
        const bool fits = basis_values({e}, b, s, &got);
        INFO("b " << b << " s " << s << " i " << int(e.i) << " j " << int(e.j) << " l " << int(e.l) << " c " << e.c);
        CHECK(fits == (want <= kMax64));
        if (fits) CHECK(got == static_cast<std::uint64_t>(want));
      }
}

// The fp32 memory-efficient attention backward's dq accumulators: a 64-query by 128-column fp32
// tile with a 16-byte header per (batch·head, query block, column block). Mistral 7B fp32 at 6,144
// tokens (32 heads of 128) measured 100,712,448 bytes beside its backward's output gradient
// (tests/data/common_heldout/); the tiles round up, and sizes past 2^64 are an error, not a wrap.
TEST_CASE("the memory-efficient attention's dq accumulators round to whole tiles and never wrap") {
  using membudget::detail::mem_efficient_grad_q_bytes;
  CHECK(mem_efficient_grad_q_bytes(32, 6144, 128) == 100712448);
  CHECK(mem_efficient_grad_q_bytes(32, 6145, 128) == mem_efficient_grad_q_bytes(32, 6144 + 64, 128));
  CHECK(mem_efficient_grad_q_bytes(32, 6145, 128) > mem_efficient_grad_q_bytes(32, 6144, 128));
  CHECK(mem_efficient_grad_q_bytes(32, 6144, 256) == 2 * mem_efficient_grad_q_bytes(32, 6144, 128));
  CHECK(mem_efficient_grad_q_bytes(32, 6144, 96) == mem_efficient_grad_q_bytes(32, 6144, 128));
  // heads wider than 128 tile 128 queries by 64 columns: DeepSeek-V2-Lite's 16 heads of 192 at
  // 1,024 tokens measured 12,589,056 bytes (tests/data/attention_fix_heldout/)
  CHECK(mem_efficient_grad_q_bytes(16, 1024, 192) == 12589056);
  CHECK(mem_efficient_grad_q_bytes(16, 1025, 192) == mem_efficient_grad_q_bytes(16, 1024 + 128, 192));
  CHECK(mem_efficient_grad_q_bytes(0, 6144, 128) == 0);
  CHECK_THROWS_AS(mem_efficient_grad_q_bytes(1ull << 40, 1ull << 40, 128), Error);
  CHECK_THROWS_AS(mem_efficient_grad_q_bytes(1, ~0ull, ~0ull), Error);
}

// Phi-3's partial-rotary cat leaves q contiguous b·a·s·hd. cuDNN allocates its output in q's layout,
// so HF's transpose(1, 2).contiguous() copies it for o_proj (tests/data/phi3_heldout/); the fp32
// memory-efficient kernel allocates b·s·a·hd whatever q's layout, so there the transpose is a view
// (Phi-3 mini fp32 at 2 x 1,024: 96 MiB over four layers, tools/matrices/sdpa_fp32_heldout_h200.json).
TEST_CASE("Phi-3's attention output is copied for o_proj under cuDNN, not under the fp32 memory-efficient kernel") {
  ModelSpec phi = load_model(test::source_path("configs/phi-3-mini.yaml"));
  phi.num_layers = 2;
  Job j;
  j.batch = 2;
  j.seq = 1024;
  j.attention = Attention::flash;
  PredictOptions o;
  o.explain = true;
  const auto copies_at_forward_peak = [&](Precision p) {
    j.precision = p;
    const Budget b = predict(phi, j, o);
    std::uint64_t n = 0;
    for (const PhasePeak& ph : b.phases)
      if (ph.phase == Phase::forward_peak)
        for (const TensorBytes& t : ph.live)
          if (t.name.find("attention output (contiguous copy") != std::string::npos) n += t.count;
    return n;
  };
  CHECK(copies_at_forward_peak(Precision::bf16) == 2);
  CHECK(copies_at_forward_peak(Precision::amp_bf16) == 2);
  CHECK(copies_at_forward_peak(Precision::fp32) == 0);
}
