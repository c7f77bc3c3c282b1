// The scheduler API: estimate, fits, max_micro_batch, max_sequence_length, sweep.
#include <doctest/doctest.h>

#include "helpers.hpp"
#include "membudget/api.hpp"

using namespace membudget;

TEST_CASE("estimate equals predict and is memoized") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job j;
  const Budget b = predict(m, j);
  const Estimate e = estimate(m, j);
  CHECK(e.peak == b.peak);
  CHECK(std::string(e.peak_phase) == b.peak_phase);
  CHECK(e.required == b.peak + b.terms.overhead);
  CHECK(e.n_phases == 4);
  CHECK(e.n_step0 == 4);
  CHECK(e.phases[2].bytes == b.phase(Phase::backward_peak));
  CHECK(e.terms.activations == b.terms.activations);
  const Estimate again = estimate(m, j);
  CHECK(again.peak == e.peak);
  ModelSpec renamed = m;
  renamed.name = "another name";  // names do not change numbers
  CHECK(estimate(renamed, j).peak == e.peak);
  j.batch = 5;
  CHECK(estimate(m, j).peak == predict(m, j).peak);
}

TEST_CASE("fits is a result; bad input is a typed error") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job j;
  const FitResult big = fits(m, j, find_device("H100"));
  CHECK(big.fits);
  CHECK(big.required == estimate(m, j).required);
  CHECK(big.limit == static_cast<bytes_t>(static_cast<double>(big.capacity) * 0.95));
  CHECK_FALSE(fits(m, j, find_device("L40S")).fits);
  // agrees with check_fit
  CHECK(fits(m, j, find_device("L40S")).fits == check_fit(predict(m, j), find_device("L40S")).fits);
  Job bad = j;
  bad.batch = 0;
  try {
    fits(m, bad, find_device("H100"));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_job);
  }
  ModelSpec broken = m;
  broken.hidden_size = 0;
  try {
    estimate(broken, j);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_spec);
  }
  CHECK_THROWS_AS(fits(m, j, find_device("H100"), 1.5), Error);
}

TEST_CASE("find_device: short names mean the documented part; A100 and V100, two common parts each, are refused") {
  CHECK(find_device("h100").name == "H100-80GB");
  CHECK(find_device("a100-80g").name == "A100-80GB");
  CHECK_THROWS_WITH_AS(find_device("A100"), doctest::Contains("give A100-40GB or A100-80GB"), Error);
  CHECK(find_device("v100-16gb").capacity == 16384ull * MiB);
  CHECK_THROWS_WITH_AS(find_device("V100"), doctest::Contains("give V100-16GB or V100-32GB"), Error);
  CHECK_THROWS_WITH_AS(find_device("Z9000"), doctest::Contains("unknown card 'Z9000'"), Error);
}

TEST_CASE("max_micro_batch is the largest batch that fits, found by search") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job j;
  j.seq = 2048;
  const Device d = find_device("H100");
  const MaxBatchResult r = max_micro_batch(m, j, d);
  REQUIRE(r.max_micro_batch > 0);
  Job at = j;
  at.batch = r.max_micro_batch;
  CHECK(fits(m, at, d).fits);
  at.batch = r.max_micro_batch + 1;
  CHECK_FALSE(fits(m, at, d).fits);
  CHECK(r.at_max.required <= r.limit);
  CHECK(r.evaluations < 40);
  // linear scan agrees
  std::uint64_t scan = 0;
  for (std::uint64_t b = 1; b <= r.max_micro_batch + 2; ++b) {
    at.batch = b;
    if (fits(m, at, d).fits) scan = b;
  }
  CHECK(scan == r.max_micro_batch);
  SUBCASE("global batch: a dividing micro-batch and the accumulation steps") {
    SearchOptions o;
    o.global_batch = 96;
    o.data_parallel = 2;
    const MaxBatchResult g = max_micro_batch(m, j, d, o);
    CHECK(g.accum_micro_batch <= g.max_micro_batch);
    CHECK(g.accum_micro_batch * g.grad_accum_steps * 2 == 96);
    o.global_batch = 97;
    CHECK_THROWS_AS(max_micro_batch(m, j, d, o), Error);
  }
  SUBCASE("nothing fits: 0, not an error") {
    const MaxBatchResult none = max_micro_batch(m, j, Device{"tiny", 1 * GiB});
    CHECK(none.max_micro_batch == 0);
    CHECK(none.at_max.required > none.limit);
  }
  SUBCASE("a limit caps the search") {
    SearchOptions o;
    o.limit = 3;
    CHECK(max_micro_batch(test::toy_llama(), j, d, o).max_micro_batch == 3);
  }
}

TEST_CASE("max_sequence_length") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job j;
  j.batch = 2;
  const Device d = find_device("A100-40GB");
  SearchOptions o;
  o.multiple_of = 128;
  const MaxSeqResult r = max_sequence_length(m, j, d, o);
  REQUIRE(r.max_seq > 0);
  CHECK(r.max_seq % 128 == 0);
  Job at = j;
  at.seq = r.max_seq;
  CHECK(fits(m, at, d).fits);
  at.seq = r.max_seq + 128;
  CHECK_FALSE(fits(m, at, d).fits);
  // a tiny model fits at its max_positions
  ModelSpec t = test::toy_llama();
  t.max_positions = 512;
  CHECK(max_sequence_length(t, j, d).max_seq == 512);
}

TEST_CASE("sweep: the grid, invalid points reported, fits against the device") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  SweepGrid g;
  g.batches = {1, 2, 4};
  g.seqs = {1024, 4096, 1u << 20, 1u << 31};  // 2^20 and 2^31 exceed max_positions (131,072)
  g.precisions = {Precision::amp_bf16, Precision::bf16};
  const auto pts = sweep(m, Job{}, g, find_device("H100"));
  REQUIRE(pts.size() == 24);
  int invalid = 0, beyond = 0;
  for (const auto& p : pts) {
    CHECK(p.beyond_max_positions == (p.seq > m.max_positions));
    if (!p.ok) {  // only 4 × 2^31 tokens, over the 2^32 limit
      ++invalid;
      CHECK(p.batch * p.seq > (1ull << 32));
      CHECK(p.error.find("absurdly large") != std::string::npos);
      continue;
    }
    beyond += p.beyond_max_positions;
    Job j;
    j.batch = p.batch;
    j.seq = p.seq;
    j.precision = p.precision;
    CHECK(p.estimate.peak == predict(m, j).peak);
    CHECK(p.fits == fits(m, j, find_device("H100")).fits);
  }
  CHECK(invalid == 2);
  CHECK(beyond == 10);
  CHECK(to_json(pts[0].estimate).find("\"peak\"") != std::string::npos);
}

TEST_CASE("a sequence beyond max_positions: predict, estimate, max_micro_batch and sweep agree") {
  ModelSpec t = test::toy_llama();
  t.max_positions = 512;
  Job j;
  j.seq = 4096;
  const Device d = find_device("H100");
  const auto r = max_micro_batch(t, j, d);
  REQUIRE(r.max_micro_batch > 1);  // once, only batch 1 was allowed past max_positions
  j.batch = r.max_micro_batch;
  CHECK(fits(t, j, d).fits);
  CHECK(r.at_max.peak == predict(t, j).peak);
  j.batch = r.max_micro_batch + 1;
  CHECK_FALSE(fits(t, j, d).fits);
  SearchOptions o;
  o.limit = 8192;  // an explicit limit searches past max_positions
  j.batch = 1;
  CHECK(max_sequence_length(t, j, d, o).max_seq == 8192);
  CHECK(max_sequence_length(t, j, d).max_seq == 512);  // by default max_positions bounds the search
}

TEST_CASE("a parallel setting not modelled yet is unsupported, by name, at every entry point") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  const Device d = find_device("H100");
  struct Case {
    const char* key;    // set_job_option's key (the C ABI and the Python module)
    const char* value;
    const char* named;  // what the error names
  };
  // (a pipeline of the default amp-bf16 recipe: autocast across microbatches is not modelled)
  const Case cases[] = {{"pipeline-parallel", "4", "--pp"},
                        {"pp", "2", "--pp"}};
  auto unsupported = [](auto&& call, const std::string& named) {
    try {
      call();
      FAIL("no error for " << named);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::unsupported);
      CHECK_MESSAGE(std::string(e.what()).find(named) != std::string::npos, e.what());
    }
  };
  for (const Case& c : cases) {
    for (Mode mode : {Mode::train, Mode::infer}) {
      for (Profile profile : {Profile::torch, Profile::harness}) {
        CAPTURE(c.key);
        Job j;
        j.mode = mode;
        j.profile = profile;
        j.batch = 2;
        j.seq = 1024;
        set_job_option(j, c.key, c.value);
        unsupported([&] { j.validate(); }, c.named);
        unsupported([&] { (void)predict(m, j); }, c.named);
        unsupported([&] { (void)estimate(m, j); }, c.named);
        unsupported([&] { (void)fits(m, j, d); }, c.named);
        unsupported([&] { (void)max_micro_batch(m, j, d); }, c.named);
        unsupported([&] { (void)max_sequence_length(m, j, d); }, c.named);
        const auto pts = sweep(m, j, SweepGrid{});
        REQUIRE(pts.size() == 1);
        CHECK_FALSE(pts[0].ok);
        CHECK(pts[0].error_kind == ErrorKind::unsupported);
        CHECK(pts[0].error.find(c.named) != std::string::npos);
      }
    }
  }
  // Data parallelism is modelled for training with the torch profile (docs/distributed.md), at
  // every entry point; serving and the harness refuse it by name.
  Job j;
  j.batch = 2;
  j.seq = 1024;
  set_job_option(j, "data-parallel", "8");
  set_job_option(j, "zero-stage", "3");
  Job one_gpu = j;
  one_gpu.parallel = {};
  CHECK(estimate(m, j).peak == predict(m, j).peak);
  CHECK(predict(m, j).peak < predict(m, one_gpu).peak);
  CHECK(max_micro_batch(m, j, d).max_micro_batch > max_micro_batch(m, one_gpu, d).max_micro_batch);
  j.mode = Mode::infer;
  unsupported([&] { (void)predict(m, j); }, "serving");
  j.mode = Mode::train;
  j.profile = Profile::harness;
  unsupported([&] { (void)predict(m, j); }, "harness");
  // Out of range is invalid, and names the flag.
  j = Job{};
  j.parallel.zero_stage = 5;
  try {
    j.validate();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_job);
    CHECK(std::string(e.what()).find("--zero") != std::string::npos);
  }
  j.parallel = {};
  j.parallel.tensor = 0;
  CHECK_THROWS_AS(j.validate(), Error);
  // One rank is the default and predicts as before; SearchOptions::data_parallel (a global batch
  // divided over ranks that each hold the whole model) is not a parallel setting of the job.
  j.parallel = {};
  CHECK(estimate(m, j).peak == predict(m, j).peak);
  SearchOptions o;
  o.global_batch = 64;
  o.data_parallel = 8;
  const MaxBatchResult r = max_micro_batch(m, j, d, o);
  CHECK(r.max_micro_batch > 0);
  CHECK(r.accum_micro_batch * r.grad_accum_steps * 8 == 64);
}

TEST_CASE("estimate keeps optimizer implementations apart (the plan cache key)") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job j;
  j.batch = 1;
  j.seq = 1024;
  const Estimate foreach = estimate(m, j);
  for (OptimizerImpl impl : {OptimizerImpl::fused, OptimizerImpl::for_loop, OptimizerImpl::foreach}) {
    Job k = j;
    k.optimizer_impl = impl;
    const Estimate e = estimate(m, k);
    CAPTURE(to_string(impl));
    CHECK(e.phases[3].bytes == predict(m, k).phase(Phase::optimizer_peak));
    CHECK((e.phases[3].bytes == foreach.phases[3].bytes) == (impl == OptimizerImpl::foreach));
  }
}
