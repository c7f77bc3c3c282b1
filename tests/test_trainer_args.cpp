// --trainer-args: TrainingArguments JSON written by transformers 5.17 itself
// (tests/data/trainer_args/, tools/trainer_args_fixtures.py on the H200) mapped onto a job.
#include <doctest/doctest.h>

#include <string>

#include "helpers.hpp"
#include "membudget/error.hpp"
#include "membudget/input.hpp"
#include "membudget/trainer_args.hpp"

using namespace membudget;

namespace {
Job from_fixture(const std::string& name) {
  const std::string path = test::source_path("tests/data/trainer_args/" + name + ".json");
  return apply_training_arguments(Job{}, read_input_file(path, 1 << 20, "TrainingArguments JSON"), path);
}
void refused(const std::string& name, const char* field) {
  try {
    (void)from_fixture(name);
    FAIL("accepted " << name);
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::unsupported);
    CHECK_MESSAGE(std::string(e.what()).find(std::string("TrainingArguments.") + field) != std::string::npos, e.what());
  }
}
// The error a TrainingArguments JSON (read as "args.json") is refused with; "accepted" if none.
std::string message(const std::string& json) {
  try {
    (void)apply_training_arguments(Job{}, json, "args.json");
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("accepted");
}
}  // namespace

TEST_CASE("TrainingArguments as transformers writes them become the job the Trainer runs") {
  // transformers 5.17's defaults: batch 8, fp32, optim adamw_torch_fused
  const Job d = from_fixture("defaults");
  CHECK(d.batch == 8);
  CHECK(d.precision == Precision::fp32);
  CHECK(d.optimizer == Optimizer::adamw);
  REQUIRE(d.optimizer_impl.has_value());
  CHECK(*d.optimizer_impl == OptimizerImpl::fused);
  CHECK(d.recompute == Recompute::none);
  const Job c = from_fixture("bf16_fused_checkpointing");
  CHECK(c.batch == 4);
  CHECK(c.precision == Precision::amp_bf16);
  CHECK(c.recompute == Recompute::full);
  const Job s = from_fixture("bf16_sgd");
  CHECK(s.optimizer == Optimizer::sgd);
  CHECK(s.batch == 1);
  // what changes memory in a way not modelled is refused by field
  refused("fp16_adamw_torch", "fp16");
  // gradient accumulation: the micro-batches before each optimizer step (Job::grad_accum_steps)
  const Job a = from_fixture("bf16_adamw_8bit_accumulation");
  CHECK(a.grad_accum_steps == 4);
  CHECK(a.optimizer == Optimizer::adamw_8bit);
  CHECK(d.grad_accum_steps == 1);
  refused("fsdp_full_shard", "fsdp");
}

TEST_CASE("TrainingArguments JSON that is not: clear errors naming the source") {
  CHECK_THROWS_AS(apply_training_arguments(Job{}, "{", "args.json"), Error);
  CHECK_THROWS_AS(apply_training_arguments(Job{}, "[1]", "args.json"), Error);
  CHECK_THROWS_AS(apply_training_arguments(Job{}, R"({"per_device_train_batch_size": 0})", "args.json"), Error);
  CHECK_THROWS_AS(apply_training_arguments(Job{}, R"({"per_device_train_batch_size": -2})", "args.json"), Error);
  CHECK_THROWS_AS(apply_training_arguments(Job{}, R"({"optim": "adafactor"})", "args.json"), Error);
  CHECK_THROWS_AS(apply_training_arguments(Job{}, R"({"gradient_checkpointing": true, "gradient_checkpointing_kwargs": {"use_reentrant": true}})", "args.json"), Error);
  // settings that change memory but were read as nothing: each refused by name
  for (const char* field : {"use_liger_kernel", "auto_find_batch_size"})
    CHECK(message(std::string(R"({")") + field + R"(": true})").find(std::string("TrainingArguments.") + field) != std::string::npos);
  // either of these turns torch_compile on
  CHECK(message(R"({"torch_compile_backend": "inductor"})").find("torch_compile_backend") != std::string::npos);
  CHECK(message(R"({"torch_compile_mode": "max-autotune"})").find("torch_compile_mode") != std::string::npos);
  CHECK(message(R"({"use_liger_kernel": false, "auto_find_batch_size": false, "torch_compile_mode": null})") == "accepted");
  // the checkpoint's arguments: a string use_reentrant, a non-object, another argument
  CHECK(message(R"({"gradient_checkpointing": true, "gradient_checkpointing_kwargs": {"use_reentrant": "true"}})")
            .find("use_reentrant is not true or false") != std::string::npos);
  CHECK(message(R"({"gradient_checkpointing": true, "gradient_checkpointing_kwargs": "x"})")
            .find("is not an object") != std::string::npos);
  CHECK(message(R"({"gradient_checkpointing": true, "gradient_checkpointing_kwargs": {"preserve_rng_state": false}})")
            .find("'preserve_rng_state' is not modelled") != std::string::npos);
  CHECK(message(R"({"gradient_checkpointing": true, "gradient_checkpointing_kwargs": {"use_reentrant": false}})") == "accepted");
  try {
    (void)apply_training_arguments(Job{}, R"({"bf16": "yes"})", "args.json");
    FAIL("accepted bf16: yes");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("args.json: TrainingArguments.bf16") != std::string::npos);
  }
  // a field the JSON leaves out takes TrainingArguments' default, as TrainingArguments(**json) does,
  // whatever the job before said
  Job base;
  base.precision = Precision::bf16;
  base.recompute = Recompute::full;
  base.optimizer = Optimizer::sgd;
  const Job j = apply_training_arguments(base, R"({"per_device_train_batch_size": 3})", "args.json");
  CHECK(j.batch == 3);
  CHECK(j.precision == Precision::fp32);
  CHECK(j.recompute == Recompute::none);
  CHECK(j.optimizer == Optimizer::adamw);
  REQUIRE(j.optimizer_impl.has_value());
  CHECK(*j.optimizer_impl == OptimizerImpl::fused);
  CHECK(apply_training_arguments(base, "{}", "args.json").batch == 8);
  CHECK(message(R"({"optim": null})").find("TrainingArguments.optim: is not a string") != std::string::npos);
}

TEST_CASE("--trainer-args on the command line: the job's flags override it") {
  const std::string cfg = test::source_path("configs/llama-3.2-1b.yaml");
  const std::string args = test::source_path("tests/data/trainer_args/bf16_fused_checkpointing.json");
  auto r = test::run_cli("predict " + cfg + " --trainer-args " + args + " --seq 1024 --format json");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("\"batch\": 4") != std::string::npos);
  CHECK(r.out.find("\"recompute\": \"full\"") != std::string::npos);
  CHECK(r.out.find("\"optimizer_impl\": \"fused\"") != std::string::npos);
  auto o = test::run_cli("predict " + cfg + " --trainer-args " + args + " --seq 1024 --batch 2 --format json");
  REQUIRE(o.exit_code == 0);
  CHECK(o.out.find("\"batch\": 2") != std::string::npos);
  // another optimizer given as a flag takes its own implementation, not the JSON's fused AdamW's
  auto eight = test::run_cli("predict " + cfg + " --trainer-args " + args + " --seq 1024 --optimizer adamw-8bit --format json");
  REQUIRE(eight.exit_code == 0);
  CHECK(eight.out.find("\"optimizer\": \"adamw-8bit\"") != std::string::npos);
  CHECK(eight.out.find("\"optimizer_impl\": \"fused\"") == std::string::npos);
  auto same = test::run_cli("predict " + cfg + " --trainer-args " + args + " --seq 1024 --optimizer adamw --format json");
  CHECK(same.out.find("\"optimizer_impl\": \"fused\"") != std::string::npos);  // the same optimizer keeps it
  auto bad = test::run_cli("predict " + cfg + " --trainer-args " + test::source_path("tests/data/trainer_args/fp16_adamw_torch.json"));
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.find("TrainingArguments.fp16") != std::string::npos);
}

TEST_CASE("--trainer-args - reads the JSON from standard input, and its errors name it") {
  const std::string cfg = test::source_path("configs/llama-3.2-1b.yaml");
  const std::string args = test::source_path("tests/data/trainer_args/bf16_fused_checkpointing.json");
  auto piped = test::run_cli("predict " + cfg + " --trainer-args - --seq 1024 --format json < " + args);
  auto named = test::run_cli("predict " + cfg + " --trainer-args " + args + " --seq 1024 --format json");
  REQUIRE(piped.exit_code == 0);
  CHECK(piped.out.find("\"batch\": 4") != std::string::npos);  // the file's, not the default's 8
  CHECK(piped.out.find("\"recompute\": \"full\"") != std::string::npos);
  CHECK(piped.out == named.out);
  auto bad = test::run_cli("predict " + cfg + " --trainer-args - < " +
                           test::source_path("tests/data/trainer_args/fp16_adamw_torch.json"));
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.find("standard input: TrainingArguments.fp16") != std::string::npos);
}

TEST_CASE("TrainingArguments: a key that is not a field, and fields that change memory unmodelled, are refused") {
  // a misspelling is named, every unknown key at once, as TrainingArguments(**json) refuses it
  const std::string typo = message(R"({"per_device_train_batch_sise": 16, "bf16": true, "packing": true})");
  CHECK_MESSAGE(typo.find("args.json: 'packing', 'per_device_train_batch_sise' are not fields of transformers 5.17's "
                          "TrainingArguments") != std::string::npos, typo);
  // a file of garbage keys gets a message of a few lines
  std::string many = "{";
  for (int i = 0; i < 1000; ++i) many += (i ? ", \"k" : "\"k") + std::to_string(1000 + i) + std::string(100, 'x') + "\": 1";
  const std::string bounded = message(many + "}");
  CHECK(bounded.find("and 990 more are not fields") != std::string::npos);
  CHECK(bounded.size() < 1500);
  // a model's config.json given by mistake is not read as defaults
  const std::string config = test::source_path("tests/data/hf/llama-3.1-8b.json");
  try {
    (void)apply_training_arguments(Job{}, read_input_file(config, 1 << 20, "TrainingArguments JSON"), config);
    FAIL("a config.json was read as TrainingArguments");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("'architectures'") != std::string::npos);
    CHECK(std::string(e.what()).find("more are not fields of transformers 5.17's TrainingArguments") != std::string::npos);
  }
  // the label smoother's log_softmax, NEFTune's noise, the model's key-value cache
  for (const char* json : {R"({"label_smoothing_factor": 0.1})", R"({"neftune_noise_alpha": 5})", R"({"use_cache": true})"}) {
    const std::string m = message(json);
    CHECK_MESSAGE(m.find("changes memory in a way not modelled") != std::string::npos, json << ": " << m);
  }
  CHECK(message(R"({"label_smoothing_factor": 0.0, "neftune_noise_alpha": null, "use_cache": false})") == "accepted");
  CHECK(message(R"({"parallelism_config": {"tp_size": 2}})").find("TrainingArguments.parallelism_config: a sharded") !=
        std::string::npos);
}
