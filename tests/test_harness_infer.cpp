// The harness's inference step (verify --mode infer) on the CPU backend: measured phases equal the
// independent prediction, the KV pool is exactly the KV formula, and a decode step over the cache
// computes what a prefill of one more token computes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "measure/harness_infer.hpp"
#include "measure/verify.hpp"
#include "membudget/budget.hpp"
#include "membudget/serving.hpp"

using namespace membudget;
using namespace membudget::measure;

namespace {

ModelSpec tiny(const char* name = "tiny-llama") {
  return load_model(test::source_path(std::string("configs/") + name + ".yaml"));
}

Job infer_job(std::uint64_t B, std::uint64_t S, DType weights = DType::bf16, DType kv = DType::bf16) {
  Job j;
  j.mode = Mode::infer;
  j.profile = Profile::harness;
  j.batch = B;
  j.seq = S;
  j.weights = weights;
  j.kv_dtype = kv;
  return j;
}

}  // namespace

TEST_CASE("verify --mode infer: floor, prefill and decode peaks equal the prediction within 1%") {
  const std::pair<std::uint64_t, std::uint64_t> shapes[] = {{1, 1}, {1, 17}, {2, 32}, {3, 24}, {4, 64}};
  for (const char* cfg : {"tiny-llama", "tiny-llama-untied", "tiny-qwen", "tiny-llama-mha"})
    for (auto [B, S] : shapes)
      for (DType w : {DType::bf16, DType::fp32})
        for (DType kv : {DType::bf16, DType::fp32}) {
          CAPTURE(cfg);
          const std::uint64_t batch = B, seq = S;  // clang 14 cannot capture a structured binding
          CAPTURE(batch);
          CAPTURE(seq);
          CAPTURE(to_string(w));
          CAPTURE(to_string(kv));
          VerifyOptions o;
          o.warmup = 0;
          o.steps = 2;
          const VerifyResult r = run_verify(tiny(cfg), infer_job(B, S, w, kv), o);
          CHECK(r.infer);
          CHECK(r.within_tolerance);
          CHECK_FALSE(r.leak_step);
          REQUIRE(r.steps.size() == 2);
          for (const auto& sc : r.steps) {
            REQUIRE(sc.phases.size() == 3);
            for (const auto& pc : sc.phases) {
              CAPTURE(pc.phase);
              CHECK(std::fabs(pc.error_pct) <= 1.0);
              CHECK(pc.error == 0);  // both sides count the same allocations
              CHECK(pc.measured > 0);
            }
            CHECK(sc.measure.prefill_peak >= sc.measure.decode_peak);
            CHECK(sc.measure.decode_peak > sc.measure.floor);
            CHECK(sc.measure.allocated_end == sc.measure.floor);  // nothing outlives the step but the pool
          }
        }
}

TEST_CASE("the KV pool is exactly kv_cache_bytes(batch, seq + 1), measured and predicted") {
  for (const char* cfg : {"tiny-llama", "tiny-llama-mha"})
    for (DType kv : {DType::bf16, DType::fp32})
      for (auto [B, S] : {std::pair<std::uint64_t, std::uint64_t>{1, 7}, {2, 32}, {5, 40}}) {
        CAPTURE(cfg);
        CAPTURE(to_string(kv));
        const ModelSpec m = tiny(cfg);
        const Job j = infer_job(B, S, DType::bf16, kv);
        auto be = make_cpu_backend(0);
        CachingAllocator alloc(be->memory());
        InferHarness h(m, j, *be, alloc);
        const bytes_t formula = kv_cache_bytes(m, kv, B, S + 1);
        CHECK(h.kv_pool_bytes() == formula);
        CHECK(predict(m, j).terms.kv_cache == formula);
        // by hand: layers × (K, V) × B × (S + 1) × kv_heads × head_dim × bytes
        CHECK(formula == m.num_layers * 2 * B * (S + 1) * m.num_kv_heads * m.head_dim * (kv == DType::fp32 ? 4 : 2));
        // the floor is the weights plus the pool, each buffer rounded to 512 B
        const Budget b = predict(m, j);
        CHECK(b.phase(Phase::floor) == static_cast<bytes_t>(alloc.stats().allocated.current));
      }
  // tiny-llama in bf16 at 2 × 32: 2 layers × 2 × 2 × 33 × 32 × 2 B = 16,896 B
  CHECK(kv_cache_bytes(tiny(), DType::bf16, 2, 33) == 16'896);
}

TEST_CASE("decode attends over the cache: its logits equal a prefill of seq + 1 tokens") {
  for (const char* cfg : {"tiny-llama", "tiny-qwen", "tiny-llama-mha"})
    for (DType w : {DType::fp32, DType::bf16})
      for (auto [B, S] : {std::pair<std::uint64_t, std::uint64_t>{1, 5}, {3, 20}}) {
        CAPTURE(cfg);
        CAPTURE(to_string(w));
        const std::uint64_t batch = B, seq = S;  // clang 14 cannot capture a structured binding
        CAPTURE(batch);
        CAPTURE(seq);
        const ModelSpec m = tiny(cfg);
        const DType kv = w;  // fp32 all through, or bf16 all through
        auto be = make_cpu_backend(0);
        CachingAllocator alloc(be->memory());
        InferOptions o;
        o.prompt.resize(B * S);
        for (std::size_t i = 0; i < o.prompt.size(); ++i) o.prompt[i] = static_cast<std::int32_t>((i * 37 + 11) % m.vocab_size);
        InferStep a;
        {
          InferHarness h(m, infer_job(B, S, w, kv), *be, alloc, o);
          a = h.step();
        }
        // the same prompts followed by each sequence's greedy token, prefilled at once
        InferOptions o2 = o;
        o2.prompt.clear();
        for (std::uint64_t b = 0; b < B; ++b) {
          o2.prompt.insert(o2.prompt.end(), o.prompt.begin() + b * S, o.prompt.begin() + (b + 1) * S);
          o2.prompt.push_back(a.next_tokens[b]);
        }
        InferHarness h2(m, infer_job(B, S + 1, w, kv), *be, alloc, o2);
        const InferStep full = h2.step();
        REQUIRE(a.decode_logits.size() == B * m.vocab_size);
        REQUIRE(full.prefill_logits.size() == a.decode_logits.size());
        float scale = 0, diff = 0, moved = 0;
        for (std::size_t i = 0; i < a.decode_logits.size(); ++i) {
          scale = std::max(scale, std::fabs(full.prefill_logits[i]));
          diff = std::max(diff, std::fabs(a.decode_logits[i] - full.prefill_logits[i]));
          moved = std::max(moved, std::fabs(a.decode_logits[i] - a.prefill_logits[i]));
        }
        CAPTURE(scale);
        CAPTURE(diff);
        REQUIRE(scale > 0);
        CHECK(diff <= (w == DType::fp32 ? 1e-5f : 2e-2f) * scale);
        CHECK(moved > 10 * diff);  // the decode step's logits are not the prefill's again
      }
}

TEST_CASE("the inference step returns every byte and rejects what it does not implement") {
  auto be = make_cpu_backend(0);
  CachingAllocator alloc(be->memory());
  {
    InferHarness h(tiny(), infer_job(2, 16), *be, alloc);
    const auto floor = alloc.stats().allocated.current;
    for (int i = 0; i < 3; ++i) CHECK(static_cast<std::int64_t>(h.step().measure.allocated_end) == floor);
  }
  CHECK(alloc.stats().allocated.current == 0);
  for (auto mutate : std::vector<void (*)(Job&)>{[](Job& x) { x.kv_dtype = DType::fp8; },
                                                [](Job& x) { x.kv_dtype = DType::int8; },
                                                [](Job& x) { x.weights = DType::int4; },
                                                [](Job& x) { x.weights = DType::fp8; }}) {
    Job j = infer_job(1, 8);
    mutate(j);
    CHECK_THROWS_AS(predict(tiny(), j), Error);
    try {
      InferHarness h(tiny(), j, *be, alloc);
      FAIL("expected unsupported");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::unsupported);
    }
  }
  ModelSpec gelu = test::toy_textbook();
  CHECK_THROWS_AS(predict(gelu, infer_job(1, 8)), Error);
  // the HF walk is still the default profile of --mode infer
  Job torch = infer_job(1, 8);
  torch.profile = Profile::torch;
  CHECK(predict(tiny(), torch).phase(Phase::prefill_peak) != predict(tiny(), infer_job(1, 8)).phase(Phase::prefill_peak));
}

TEST_CASE("verify --mode infer: out of memory is Error(out_of_memory) with the prediction beside it") {
  VerifyOptions o;
  o.capacity = 128 * 1024;  // below the weights
  try {
    run_verify(tiny(), infer_job(2, 32), o);
    FAIL("expected out of memory");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::out_of_memory);
    CHECK(std::string(e.what()).find("predicted peak") != std::string::npos);
  }
}

TEST_CASE("CLI: predict and verify --mode infer --profile harness, table and JSON") {
  const std::string tiny_cfg = test::source_path("configs/tiny-llama.yaml");
  auto p = test::run_cli("predict " + tiny_cfg + " --mode infer --profile harness -b 2 -s 32 --format json");
  REQUIRE(p.exit_code == 0);
  auto pj = nlohmann::json::parse(p.out);
  CHECK(pj.dump().find("prefill_peak") != std::string::npos);
  CHECK(pj.dump().find("decode_peak") != std::string::npos);

  auto r = test::run_cli("verify " + tiny_cfg + " --mode infer -b 2 -s 32 --format json --steps 2");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"floor", "prefill_peak", "decode_peak"}) {
    CAPTURE(k);
    CHECK(j["predicted"].contains(k));
    CHECK(j["measured"].contains(k));
    CHECK(j["error"].contains(k));
    CHECK(j["error"][k].contains("bytes"));
    CHECK(j["error"][k].contains("percent"));
    CHECK(j["measured"][k] == j["predicted"][k]);
  }
  CHECK_FALSE(j["measured"].contains("forward_peak"));
  CHECK(j["job"]["mode"] == "infer");
  CHECK(j["job"]["pool_tokens"] == 33);
  CHECK(j["measured"]["kv_pool"] == 16'896);
  CHECK(j["predicted"]["kv_cache"] == 16'896);
  CHECK(j["measured"]["per_step"].size() == 2);
  CHECK(j["measured"]["per_step"][0]["error"]["decode_peak"]["ok"] == true);
  CHECK(j["within_tolerance"] == true);

  auto t = test::run_cli("verify " + tiny_cfg + " --mode infer -b 3 -s 24 --weights fp32 --kv-dtype fp32");
  CHECK(t.exit_code == 0);
  CHECK(t.out.find("prefill_peak") != std::string::npos);
  CHECK(t.out.find("every phase within tolerance") != std::string::npos);
  CHECK(t.out.find("KV pool") != std::string::npos);

  // the torch profile's HF walk does not describe this step: a negative control, exit 1
  CHECK(test::run_cli("verify " + tiny_cfg + " --mode infer -b 2 -s 32 --profile torch --tolerance 1%").exit_code == 1);
  CHECK(test::run_cli("verify " + tiny_cfg + " --mode infer -b 2 -s 32 --kv-dtype fp8").exit_code == 2);
  CHECK(test::run_cli("verify " + tiny_cfg + " --mode infer -b 2 -s 32 --device-memory 100KiB").exit_code == 3);
}

TEST_CASE("the inference step's index limit counts its own widest tensors, not the training logits") {
  // 8 × 4096 tokens: T × vocab is past 2^31 (a training step would refuse), T × intermediate is not
  const ModelSpec m1 = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  CHECK_NOTHROW(check_harness_infer_supported(m1, infer_job(8, 4096)));
  const ModelSpec m8 = load_model(test::source_path("configs/llama-3.1-8b.yaml"));
  CHECK_NOTHROW(check_harness_infer_supported(m8, infer_job(4, 8192)));
  CHECK_THROWS_AS(check_harness_infer_supported(m8, infer_job(64, 8192)), Error);
}
