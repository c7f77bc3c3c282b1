// Gradient accumulation (Job::grad_accum_steps, --grad-accum-steps): micro-batches run forward and
// backward before each optimizer step, and from the second on the first one's gradients are
// allocated through the forward. The measured steps are in test_accuracy_measured.cpp and
// test_reserved.cpp; this file holds the mechanism and the flags.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "helpers.hpp"
#include "membudget/advise.hpp"
#include "membudget/api.hpp"
#include "membudget/budget.hpp"
#include "membudget/job.hpp"
#include "membudget/job_yaml.hpp"
#include "membudget/spec.hpp"
#include "membudget/trainer_args.hpp"
#include "model/step_plan.hpp"

using namespace membudget;

namespace {
Budget simulated(const ModelSpec& m, Job j, std::uint64_t steps) {
  j.grad_accum_steps = steps;
  PredictOptions o;
  o.full_simulation = true;
  return predict(m, j, o);
}

std::string refusal(const ModelSpec& m, const Job& j) {
  try {
    (void)predict(m, j);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}
}  // namespace

TEST_CASE("from the second micro-batch on, the gradients stay allocated through the forward") {
  struct Case {
    const char* spec;
    Precision precision;
    Recompute recompute;
    std::uint64_t lora = 0;
  };
  const Case cases[] = {
      {"configs/llama-3.2-1b.yaml", Precision::bf16, Recompute::none},
      {"configs/llama-3.2-1b.yaml", Precision::amp_bf16, Recompute::full},
      {"configs/hf/qwen2.5-0.5b.json", Precision::amp_bf16, Recompute::none},
      {"configs/hf/gemma-2-2b.json", Precision::bf16, Recompute::full},
      {"configs/hf/qwen2.5-0.5b.json", Precision::bf16, Recompute::none, 16},
  };
  for (const Case& c : cases) {
    const ModelSpec m = load_model(test::source_path(c.spec));
    Job j;
    j.batch = 2;
    j.seq = 1024;
    j.precision = c.precision;
    j.recompute = c.recompute;
    j.lora_rank = c.lora;
    CAPTURE(c.spec);
    CAPTURE(to_string(c.precision));
    CAPTURE(to_string(c.recompute));
    const Budget one = simulated(m, j, 1), two = simulated(m, j, 2), three = simulated(m, j, 3);
    const bytes_t grads = one.states.gradients;
    REQUIRE(grads > 0);
    // the second forward runs on the floor plus every gradient: the first forward's peak plus them
    CHECK(two.phase(Phase::floor) == one.phase(Phase::floor));
    CHECK(two.phase(Phase::forward_peak) == one.phase(Phase::forward_peak) + grads);
    // its backward adds into them in place: above the first's, by at most the gradients
    CHECK(two.phase(Phase::backward_peak) > one.phase(Phase::backward_peak));
    CHECK(two.phase(Phase::backward_peak) <= one.phase(Phase::backward_peak) + grads);
    // the optimizer steps the same gradients
    CHECK(two.phase(Phase::optimizer_peak) == one.phase(Phase::optimizer_peak));
    CHECK(two.states.gradients == grads);
    // the third micro-batch finds what the second did
    for (Phase ph : kTrainPhases) CHECK(three.phase(ph) == two.phase(ph));
    CHECK(two.peak > one.peak);
  }
}

TEST_CASE("a DDP rank accumulates in .grad under no_sync(), its buckets beside") {
  const ModelSpec m = load_model(test::source_path("configs/hf/qwen2.5-0.5b.json"));
  for (bool view : {false, true}) {
    Job j;
    j.batch = 2;
    j.seq = 1024;
    j.precision = Precision::bf16;
    j.parallel.data = 4;
    j.parallel.ddp_bucket_view = view;
    CAPTURE(view);
    const Budget one = simulated(m, j, 1), two = simulated(m, j, 2);
    Job single = j;
    single.parallel = {};
    const bytes_t grads = simulated(m, single, 1).states.gradients;
    // the first micro-batch's gradients are plain tensors through the second forward (under
    // no_sync() a bucket view is made only by the last micro-batch's hooks), the buckets in the floor
    CHECK(two.phase(Phase::floor) == one.phase(Phase::floor));
    CHECK(two.phase(Phase::forward_peak) == one.phase(Phase::forward_peak) + grads);
    CHECK(two.phase(Phase::optimizer_peak) == one.phase(Phase::optimizer_peak));
  }
}

TEST_CASE("an FSDP2 rank keeps its sharded gradients (every) or every unsharded one (last) between micro-batches") {
  const ModelSpec m = load_model(test::source_path("configs/hf/qwen2.5-0.5b.json"));
  Job j;
  j.batch = 2;
  j.seq = 1024;
  j.precision = Precision::bf16;
  Job single = j;
  const bytes_t whole = simulated(m, single, 1).states.gradients;  // every parameter's bf16 gradient
  j.parallel.fsdp = 4;
  j.parallel.rank = 0;
  const Budget one = simulated(m, j, 1);
  const bytes_t sharded = one.states.gradients;  // the rank's reduce-scatter outputs
  REQUIRE(sharded < whole);
  // every: each micro-batch reduce-scatters; the second forward runs beside the first's shards,
  // and its reduction's output is added into them and freed
  const Budget every = simulated(m, j, 2);
  CHECK(every.phase(Phase::forward_peak) == one.phase(Phase::forward_peak) + sharded);
  CHECK(every.states.gradients == sharded);
  CHECK(every.phase(Phase::optimizer_peak) == one.phase(Phase::optimizer_peak));
  // last: set_requires_gradient_sync(False) before the last micro-batch keeps each parameter's
  // whole unsharded gradient (bf16, the reduce dtype: no fp32 accumulator), resharding the parameters
  j.parallel.fsdp_grad_sync_last = true;
  const Budget last = simulated(m, j, 2);
  CHECK(last.phase(Phase::forward_peak) == one.phase(Phase::forward_peak) + whole);
  CHECK(last.states.gradients == sharded);
  CHECK(last.phase(Phase::optimizer_peak) == one.phase(Phase::optimizer_peak));
  // the flag means nothing without accumulation or without FSDP2; HSDP and offload are refused
  CHECK(refusal(m, [&] { Job k = j; k.grad_accum_steps = 1; return k; }()).find("--fsdp-grad-sync: applies to FSDP2") !=
        std::string::npos);
  Job hsdp = j;
  hsdp.grad_accum_steps = 2;
  hsdp.parallel.data = 2;
  hsdp.parallel.fsdp = 2;
  CHECK(refusal(m, hsdp).find("with HSDP") != std::string::npos);
  Job offload = j;
  offload.grad_accum_steps = 2;
  offload.parallel.fsdp_offload = true;
  CHECK(refusal(m, offload).find("with --fsdp-offload") != std::string::npos);
  Job k;
  CHECK_THROWS_AS(set_job_option(k, "fsdp-grad-sync", "sometimes"), Error);
  set_job_option(k, "fsdp_grad_sync", "last");
  CHECK(k.parallel.fsdp_grad_sync_last);
}

TEST_CASE("gradient accumulation: the compiled plan and the reserved replay answer as the walk does") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  for (Precision p : {Precision::bf16, Precision::amp_bf16})
    for (std::uint64_t steps : {2ull, 3ull, 8ull, 1000ull}) {
      Job j;
      j.batch = 3;
      j.seq = 1536;
      j.precision = p;
      j.grad_accum_steps = steps;
      CAPTURE(steps);
      CAPTURE(to_string(p));
      const Budget walked = simulated(m, j, steps);
      // the plan compiles for accumulation (else estimate() would walk the step too)
      REQUIRE(detail::StepPlan::compile(m, j) != nullptr);
      const Estimate e = estimate(m, j);  // from the plan compiled for the job
      CHECK(e.peak == walked.peak);
      REQUIRE(e.n_phases == 4);
      for (std::size_t i = 0; i < 4; ++i) CHECK(e.phases[i].bytes == walked.phase(kTrainPhases[i]));
    }
  // the replay: reserved memory after a step with accumulation holds at least its allocated peak,
  // and more than the step without it
  Job j;
  j.batch = 2;
  j.seq = 2048;
  j.precision = Precision::bf16;
  PredictOptions o;
  o.reserved = true;
  const Budget one = predict(m, j, o);
  j.grad_accum_steps = 4;
  const Budget four = predict(m, j, o);
  CHECK(four.reserved_peak >= four.peak);
  CHECK(four.reserved_peak > one.reserved_peak);
}

TEST_CASE("gradient accumulation settings the model does not cover are refused by name") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job j;
  j.batch = 1;
  j.seq = 1024;
  j.grad_accum_steps = 0;
  CHECK(refusal(m, j).find("--grad-accum-steps: must be at least 1") != std::string::npos);
  j.grad_accum_steps = (1ull << 20) + 1;
  CHECK(refusal(m, j).find("absurdly large") != std::string::npos);
  j.grad_accum_steps = 4;
  // DDP and ZeRO-1 ranks are walked (no_sync() before the last micro-batch); the layouts whose
  // collectives between micro-batches are not modelled are refused
  Job dp = j;
  dp.parallel.data = 2;
  CHECK(refusal(m, dp) == "accepted");
  dp.parallel.zero_stage = 1;
  CHECK(refusal(m, dp) == "accepted");
  Job fsdp = j;
  fsdp.parallel.fsdp = 4;
  fsdp.precision = Precision::bf16;
  CHECK(refusal(m, fsdp) == "accepted");
  Job zero3 = j;
  zero3.parallel.data = 4;
  zero3.parallel.zero_stage = 3;
  CHECK(refusal(m, zero3) == "accepted");
  Job tp = j;
  tp.parallel.tensor = 2;
  CHECK(refusal(m, tp) == "accepted");
  Job cp = j;
  cp.parallel.context = 2;
  cp.precision = Precision::bf16;
  CHECK(refusal(m, cp).find("--grad-accum-steps 4 with --cp") != std::string::npos);
  Job pp = j;
  pp.parallel.pipeline = 2;
  pp.precision = Precision::bf16;  // (amp-bf16 across a schedule is refused first)
  CHECK(refusal(m, pp).find("give --microbatches") != std::string::npos);
  Job harness = j;
  harness.profile = Profile::harness;
  harness.optimizer_impl = OptimizerImpl::fused;
  CHECK(refusal(m, harness).find("the harness runs one micro-batch per step") != std::string::npos);
  Job infer = j;
  infer.mode = Mode::infer;
  CHECK(refusal(m, infer).find("applies to training") != std::string::npos);
}

TEST_CASE("max-batch's accumulation plan is predicted with its accumulation steps") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job j;
  j.seq = 2048;
  j.precision = Precision::bf16;
  j.batch = 4;
  const bytes_t alone = estimate(m, j).required;
  j.grad_accum_steps = 2;
  const bytes_t accumulated = estimate(m, j).required;
  REQUIRE(accumulated > alone);
  j.grad_accum_steps = 1;
  // a card that holds batch 4 alone but not batch 4 with a second micro-batch's gradients
  const Device card{"between", (alone + accumulated) / 2};
  SearchOptions o;
  o.headroom = 0;
  o.global_batch = 8;
  const MaxBatchResult r = max_micro_batch(m, j, card, o);
  REQUIRE(r.max_micro_batch >= 4);
  REQUIRE(r.max_micro_batch < 8);
  REQUIRE(r.accum_micro_batch > 0);
  CHECK(r.accum_micro_batch < 4);  // 4 × 2 steps does not fit
  CHECK(r.accum_micro_batch * r.grad_accum_steps == 8);
  Job planned = j;
  planned.batch = r.accum_micro_batch;
  planned.grad_accum_steps = r.grad_accum_steps;
  CHECK(fits(m, planned, card, 0.0).fits);
  // given steps and a global batch would plan two accumulations: refused
  j.grad_accum_steps = 2;
  CHECK_THROWS_AS(max_micro_batch(m, j, card, o), Error);
}

TEST_CASE("max-batch: a global batch no micro-batch reaches with its accumulation steps exits 1, saying so") {
  // Gemma 2 2B in bf16 at 2,048 tokens on an A100-40GB: micro-batch 1 fits alone, not with a
  // second micro-batch's 5 GiB of gradients beside it
  const std::string spec = test::source_path("configs/hf/gemma-2-2b.json");
  const std::string flags = " --device A100-40GB --precision bf16 --seq 2048 --global-batch 64 --data-parallel 2";
  const auto r = test::run_cli("max-batch " + spec + flags);
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("max micro-batch  1") != std::string::npos);
  CHECK(r.out.find("no micro-batch dividing its 32 sequences per rank fits") != std::string::npos);
  const auto j = test::run_cli("max-batch " + spec + flags + " --format json");
  CHECK(j.exit_code == 1);
  const auto parsed = nlohmann::json::parse(j.out);
  CHECK(parsed["max_micro_batch"] == 1);
  CHECK(parsed["accum_micro_batch"] == 0);
}

TEST_CASE("--grad-accum-steps, job.grad_accum_steps, the C ABI key and TrainingArguments give the same job") {
  const std::string spec = test::source_path("configs/llama-3.2-1b.yaml");
  const auto flag = test::run_cli("predict " + spec + " --batch 1 --seq 1024 --grad-accum-steps 4 --format json");
  REQUIRE(flag.exit_code == 0);
  CHECK(flag.out.find("\"grad_accum_steps\": 4") != std::string::npos);
  const auto none = test::run_cli("predict " + spec + " --batch 1 --seq 1024 --format json");
  REQUIRE(none.exit_code == 0);
  CHECK(none.out.find("grad_accum_steps") == std::string::npos);  // 1: no accumulation, not echoed
  const auto table = test::run_cli("predict " + spec + " --batch 1 --seq 1024 --grad-accum-steps 4");
  CHECK(table.out.find("4 accumulation steps") != std::string::npos);
  const auto bad = test::run_cli("predict " + spec + " --grad-accum-steps x");
  CHECK(bad.exit_code != 0);
  CHECK(bad.out.find("--grad-accum-steps") != std::string::npos);
  // a parallel layout's rank is predicted, not yet measured: the answer says so on stderr
  CHECK(flag.out.find("not yet measured") == std::string::npos);
  const auto ddp = test::run_cli("predict " + spec + " --batch 1 --seq 1024 --precision bf16 --dp 2 --grad-accum-steps 2 "
                                 "2>&1 >/dev/null");
  CHECK(ddp.exit_code == 0);
  CHECK(ddp.out.find("note: --grad-accum-steps on a parallel layout's rank is predicted, not yet measured") !=
        std::string::npos);
  const auto serving = test::run_cli("predict " + spec + " --mode infer --grad-accum-steps 2");
  CHECK(serving.exit_code != 0);
  CHECK(serving.out.find("applies to training") != std::string::npos);

  const ModelSpec m = load_model(spec);
  Job j;
  set_job_option(j, "grad_accum_steps", "4");
  CHECK(j.grad_accum_steps == 4);
  set_job_option(j, "grad-accum-steps", "2");
  CHECK(j.grad_accum_steps == 2);
  CHECK_THROWS_AS(set_job_option(j, "grad-accum-steps", "-1"), Error);
  const Job yaml = parse_job_section("job:\n  batch: 1\n  grad_accum_steps: 8\n", "spec.yaml", Job{});
  CHECK(yaml.grad_accum_steps == 8);
  const Job hf = apply_training_arguments(Job{}, R"({"gradient_accumulation_steps": 16})", "args.json");
  CHECK(hf.grad_accum_steps == 16);
  CHECK(apply_training_arguments(Job{}, "{}", "args.json").grad_accum_steps == 1);  // TrainingArguments' default
}
