// The reserved-memory replay's compiled stream (src/model/reserved.cpp, ReservedStream): for a
// model and recipe seen before, simulate_reserved replays the streams simulated once at probe
// shapes with the sizes evaluated at the new shape. Every figure must equal the plain replay of
// the step simulated at that shape (simulate_reserved_full), for every shape and recipe.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "helpers.hpp"
#include "membudget/api.hpp"
#include "model/reserved.hpp"

using namespace membudget;

namespace {

struct Shape {
  std::uint64_t b, s;
};

// Small, odd, power-of-two and large shapes; the sequences are multiples of 4 (sequence
// parallelism over 2 and 4 divides them).
const std::vector<Shape> kShapes{{1, 4}, {1, 1000}, {3, 4092}, {2, 8192}, {4, 12}, {1, 20000}, {5, 76}, {2, 2052}};

void same_as_full(const ModelSpec& m, const Job& base, const AllocatorPolicy& policy, bool must_compile,
                  const std::vector<Shape>& shapes = kShapes) {
  for (const Shape& sh : shapes) {
    Job job = base;
    job.batch = sh.b;
    job.seq = sh.s;
    job.validate();
    CAPTURE(sh.b);
    CAPTURE(sh.s);
    if (must_compile) CHECK(detail::reserved_stream_compiles(m, job));
    const detail::ReservedResult fast = detail::simulate_reserved(m, job, policy);
    const detail::ReservedResult full = detail::simulate_reserved_full(m, job, policy);
    CHECK(fast.reserved_peak == full.reserved_peak);
    CHECK(fast.allocated_peak == full.allocated_peak);
    for (std::size_t p = 0; p < 4; ++p) {
      CAPTURE(p);
      CHECK(fast.steady[p] == full.steady[p]);
      CHECK(fast.step0[p] == full.step0[p]);
    }
    CHECK(full.reserved_peak > 0);
  }
}

// The caches' tests start from Llama 3.2 1B at 2 × 1000 with no stream compiled and no answer
// remembered.
Job first_question_of_1b() {
  detail::clear_reserved_streams();
  Job job;
  job.batch = 2;
  job.seq = 1000;
  return job;
}

AllocatorPolicy expandable() {
  AllocatorPolicy p;
  p.expandable_segments = true;
  return p;
}

}  // namespace

TEST_CASE("compiled reserved stream: dense Llama 1B and 8B, the figures of the full replay at every shape") {
  for (const char* cfg : {"configs/llama-3.2-1b.yaml", "configs/llama-3.1-8b.yaml"}) {
    CAPTURE(cfg);
    const ModelSpec m = load_model(test::source_path(cfg));
    Job job;
    SUBCASE("defaults") { same_as_full(m, job, kPyTorchAllocator, true); }
    SUBCASE("expandable segments") { same_as_full(m, job, expandable(), true); }
    SUBCASE("bf16, full recompute, SGD") {
      job.precision = Precision::bf16;
      job.recompute = Recompute::full;
      job.optimizer = Optimizer::sgd;
      same_as_full(m, job, kPyTorchAllocator, true);
      same_as_full(m, job, expandable(), true);
    }
    SUBCASE("chunked loss on either side of b·s = loss_chunk") {
      job.loss = Loss::chunked;
      job.loss_chunk = 1024;
      same_as_full(m, job, kPyTorchAllocator, false, {{1, 4}, {1, 1000}, {1, 1024}, {1, 1028}, {3, 4092}, {2, 8192}});
    }
    SUBCASE("max_split_size_mb") {
      AllocatorPolicy p;
      p.max_split_size = 64 * MiB;
      same_as_full(m, job, p, true);
    }
  }
}

TEST_CASE("compiled reserved stream: parallel layouts (a pipeline stage, tensor and sequence parallelism, DDP)") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job job;
  job.precision = Precision::bf16;
  SUBCASE("no pipeline") { same_as_full(m, job, kPyTorchAllocator, true); }
  SUBCASE("1F1B over 4 stages, 8 microbatches") {
    job.parallel.pipeline = 4;
    job.parallel.microbatches = 8;
    same_as_full(m, job, kPyTorchAllocator, true);
    job.parallel.rank = 3;
    same_as_full(m, job, expandable(), true);
  }
  SUBCASE("tensor parallel over 2 with sequence parallelism") {
    job.parallel.tensor = 2;
    job.parallel.sequence_parallel = true;
    same_as_full(m, job, kPyTorchAllocator, true);
  }
  SUBCASE("DDP over 2") {
    job.parallel.data = 2;
    same_as_full(m, job, kPyTorchAllocator, true);
  }
}

TEST_CASE("compiled reserved stream: mixtures of experts") {
  const ModelSpec m = load_model(test::source_path("tests/data/hf/moe/olmoe-1b-7b.json"));
  Job job;
  job.precision = Precision::bf16;
  const std::vector<Shape> shapes{{1, 4}, {2, 1000}, {1, 4092}, {3, 12}};
  SUBCASE("grouped_mm experts") {
    same_as_full(m, job, kPyTorchAllocator, true, shapes);
    same_as_full(m, job, expandable(), true, shapes);
  }
  SUBCASE("full recompute, worst-case routing") {
    job.recompute = Recompute::full;
    job.routing = Routing::worst;
    same_as_full(m, job, kPyTorchAllocator, true, shapes);
  }
  SUBCASE("eager experts: how many experts run depends on b·s, so no stream; simulated") {
    job.experts = ExpertsImpl::eager;
    Job at = job;
    at.batch = 1;
    at.seq = 4;
    CHECK_FALSE(detail::reserved_stream_compiles(m, at));
    same_as_full(m, job, kPyTorchAllocator, false, shapes);
  }
}

// The replay skips closed windows (reserved.cpp, skip_closed_window: a run of events that frees
// every block it allocates, where the pool's largest free block holds all its requests at once)
// by their frees of older tensors alone. Its reserved figures must be the replay of every event's,
// for dense, LoRA, MoE and parallel steps of every recipe and optimizer implementation; the
// allocated figures count the windows' blocks at their rounded sizes (an unsplit block's extra
// bytes, at most 1 MiB each, are not counted).
TEST_CASE("closed windows skipped: the reserved figures of the replay of every event") {
  struct Case {
    const char* config;
    Job job;
  };
  std::vector<Case> cases;
  const auto add = [&](const char* config, auto&& set) {
    Job job;
    set(job);
    cases.push_back({config, job});
  };
  for (const char* cfg : {"configs/llama-3.2-1b.yaml", "configs/qwen2.5-0.5b.yaml", "configs/hf/gemma-2-2b.json",
                          "configs/hf/phi-3-mini-4k.json", "configs/mistral-7b.yaml"}) {
    add(cfg, [](Job&) {});
    add(cfg, [](Job& j) { j.precision = Precision::bf16; j.recompute = Recompute::full; });
    add(cfg, [](Job& j) { j.precision = Precision::fp32; j.attention = Attention::math; });
    add(cfg, [](Job& j) { j.optimizer_impl = OptimizerImpl::fused; j.recompute = Recompute::selective; });
  }
  add("configs/llama-3.2-1b.yaml", [](Job& j) { j.optimizer_impl = OptimizerImpl::for_loop; });
  add("configs/llama-3.2-1b.yaml", [](Job& j) { j.optimizer = Optimizer::adafactor; j.precision = Precision::bf16; });
  add("configs/llama-3.2-1b.yaml", [](Job& j) { j.optimizer = Optimizer::sgd_momentum; j.loss = Loss::chunked; j.loss_chunk = 1024; });
  add("configs/llama-3.2-1b.yaml", [](Job& j) { j.lora_rank = 16; });
  add("configs/llama-3.1-8b.yaml", [](Job& j) { j.parallel.fsdp = 4; });
  add("configs/llama-3.1-8b.yaml", [](Job& j) { j.parallel.tensor = 2; j.parallel.sequence_parallel = true; });
  add("configs/llama-3.1-8b.yaml", [](Job& j) { j.precision = Precision::bf16; j.parallel.pipeline = 4; j.parallel.microbatches = 8; j.parallel.rank = 3; });
  add("configs/llama-3.2-1b.yaml", [](Job& j) { j.parallel.data = 2; });
  add("configs/llama-3.2-1b.yaml", [](Job& j) { j.parallel.data = 2; j.parallel.zero_stage = 1; });
  add("tests/data/hf/moe/olmoe-1b-7b.json", [](Job& j) { j.precision = Precision::bf16; });
  add("tests/data/hf/moe/olmoe-1b-7b.json", [](Job& j) { j.experts = ExpertsImpl::eager; j.recompute = Recompute::full; });
  std::size_t skipped = 0, events_cases = 0;
  for (const Case& c : cases) {
    CAPTURE(c.config);
    const ModelSpec m = load_model(test::source_path(c.config));
    for (const Shape& sh : {Shape{1, 1024}, Shape{2, 4092}, Shape{3, 76}}) {
      Job job = c.job;
      job.batch = sh.b;
      job.seq = sh.s;
      job.validate();
      CAPTURE(to_string(job.precision));
      CAPTURE(sh.b);
      CAPTURE(sh.s);
      const detail::ReservedResult with = detail::simulate_reserved_full(m, job, AllocatorPolicy{});
      const detail::ReservedResult every = detail::simulate_reserved_full(m, job, AllocatorPolicy{}, false);
      CHECK(every.skipped_events == 0);
      CHECK(with.reserved_peak == every.reserved_peak);
      CHECK(with.steady_steps == every.steady_steps);
      for (std::size_t p = 0; p < 4; ++p) {
        CAPTURE(p);
        CHECK(with.steady[p] == every.steady[p]);
        CHECK(with.step0[p] == every.step0[p]);
        CHECK(with.allocated_steady[p] <= every.allocated_steady[p]);
        CHECK(with.allocated_steady[p] >= every.allocated_steady[p] - every.allocated_steady[p] / 200);
      }
      skipped += with.skipped_events;
      events_cases += with.skipped_events > 0;
    }
  }
  // the windows are skipped at all: in most steps
  CHECK(events_cases * 4 >= cases.size() * 3 * 3);
  CHECK(skipped > 0);
}

TEST_CASE("closed windows skipped: not under a setting whose best fit or rounding differs, nor recording") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job job;
  job.batch = 2;
  job.seq = 1024;
  CHECK(detail::simulate_reserved_full(m, job, AllocatorPolicy{}).skipped_events > 0);
  for (const char* conf : {"expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:4"}) {
    CAPTURE(conf);
    const AllocatorPolicy policy = detail::parse_allocator_conf(conf).policy;
    CHECK(detail::simulate_reserved_full(m, job, policy).skipped_events == 0);
  }
}

TEST_CASE("the stream is compiled at a regime's second question: the first is answered by one simulated step") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job job = first_question_of_1b();
  const detail::ReservedResult first = detail::simulate_reserved(m, job, AllocatorPolicy{});
  CHECK_FALSE(detail::reserved_stream_held(m, job));
  job.seq = 1004;  // another shape of the same regime
  const detail::ReservedResult second = detail::simulate_reserved(m, job, AllocatorPolicy{});
  CHECK(detail::reserved_stream_held(m, job));
  CHECK(second.reserved_peak == detail::simulate_reserved_full(m, job, AllocatorPolicy{}).reserved_peak);
  job.seq = 1000;
  detail::clear_reserved_answers();  // (else the first answer, remembered, is given again)
  CHECK(detail::simulate_reserved(m, job, AllocatorPolicy{}).reserved_peak == first.reserved_peak);  // now replayed compiled
  // another recipe is another regime: asked once, not compiled
  job.recompute = Recompute::full;
  (void)detail::simulate_reserved(m, job, AllocatorPolicy{});
  CHECK_FALSE(detail::reserved_stream_held(m, job));
  detail::clear_reserved_streams();
  job.recompute = Recompute::none;
  CHECK_FALSE(detail::reserved_stream_held(m, job));
}

TEST_CASE("predict() at a regime's first question (one simulated step for the estimate and the replay) equals its compiled answer") {
  for (const char* cfg : {"configs/llama-3.2-1b.yaml", "configs/qwen2.5-0.5b.yaml"}) {
    CAPTURE(cfg);
    const ModelSpec m = load_model(test::source_path(cfg));
    Job job;
    job.batch = 3;
    job.seq = 1500;
    PredictOptions o;
    o.reserved = true;
    clear_estimate_cache();
    const Budget first = predict(m, job, o);
    CHECK_FALSE(detail::reserved_stream_held(m, job));
    Job other = job;
    other.seq = 700;
    (void)predict(m, other, o);  // the second question compiles
    REQUIRE(detail::reserved_stream_held(m, job));
    detail::clear_reserved_answers();  // (else the first answer, remembered, is given again)
    const Budget compiled = predict(m, job, o);
    CHECK(first.reserved_peak == compiled.reserved_peak);
    CHECK(first.peak == compiled.peak);
    CHECK(first.states.total() == compiled.states.total());
    CHECK(first.activations.total() == compiled.activations.total());
    CHECK(first.logits.total() == compiled.logits.total());
    REQUIRE(first.phases.size() == compiled.phases.size());
    for (std::size_t p = 0; p < first.phases.size(); ++p) CHECK(first.phases[p].bytes == compiled.phases[p].bytes);
    REQUIRE(first.step0.size() == compiled.step0.size());
    for (std::size_t p = 0; p < first.step0.size(); ++p) CHECK(first.step0[p].bytes == compiled.step0[p].bytes);
  }
}

TEST_CASE("a question asked again is answered as before, compiling nothing; another policy or shape is another question") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job job = first_question_of_1b();
  const detail::ReservedResult first = detail::simulate_reserved(m, job, AllocatorPolicy{});
  const detail::ReservedResult again = detail::simulate_reserved(m, job, AllocatorPolicy{});
  CHECK_FALSE(detail::reserved_stream_held(m, job));  // no second question of the regime
  CHECK(again.reserved_peak == first.reserved_peak);
  CHECK(again.steady == first.steady);
  CHECK(again.allocated_steady == first.allocated_steady);
  CHECK_FALSE(again.step_simulated);
  // expandable segments reserve another figure at this shape: a remembered answer would repeat the first
  const bytes_t with_expandable = detail::simulate_reserved(m, job, expandable()).reserved_peak;
  CHECK(with_expandable == detail::simulate_reserved_full(m, job, expandable()).reserved_peak);
  CHECK(with_expandable != first.reserved_peak);
  job.seq = 1004;  // another shape: the regime's second question, which compiles
  CHECK(detail::simulate_reserved(m, job, AllocatorPolicy{}).reserved_peak ==
        detail::simulate_reserved_full(m, job, AllocatorPolicy{}).reserved_peak);
  CHECK(detail::reserved_stream_held(m, job));
}

TEST_CASE("predict --explain of a pipeline asks its chosen stage twice, and compiles no stream for it") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  clear_estimate_cache();
  Job job;
  job.precision = Precision::bf16;
  job.parallel.pipeline = 2;
  PredictOptions o;
  o.reserved = true;
  o.explain = true;
  const Budget b = predict(m, job, o);
  for (std::uint64_t rank : {0u, 1u}) {
    CAPTURE(rank);
    Job stage = job;
    stage.parallel.rank = rank;
    CHECK_FALSE(detail::reserved_stream_held(m, stage));
  }
  // and the figures are those of a fresh answer
  clear_estimate_cache();
  PredictOptions plain = o;
  plain.explain = false;
  const Budget fresh = predict(m, job, plain);
  CHECK(b.reserved_peak == fresh.reserved_peak);
  CHECK(b.peak == fresh.peak);
  REQUIRE(b.phases.size() == fresh.phases.size());
  for (std::size_t p = 0; p < b.phases.size(); ++p) CHECK(b.phases[p].bytes == fresh.phases[p].bytes);
}
