// The max-batch and sweep subcommands.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "membudget/api.hpp"

using namespace membudget;

TEST_CASE("max-batch --format json: max_micro_batch, the budget there, accumulation steps") {
  const std::string model = test::source_path("configs/llama-3.2-1b.yaml");
  const auto r = test::run_cli("max-batch " + model + " --device H100 --seq 2048 --global-batch 48 --format json");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  Job job;
  job.seq = 2048;
  SearchOptions o;
  o.reserved = true;  // the CLI decides on what nvidia-smi will show
  const auto expect = max_micro_batch(load_model(model), job, find_device("H100"), o);
  CHECK(j["max_micro_batch"].get<std::uint64_t>() == expect.max_micro_batch);
  CHECK(j["basis"] == "reserved");
  CHECK(j["required"].get<std::uint64_t>() == expect.reserved_required);
  // the allocated figures at the answer are its budget's: predict with the replay, whose phases stand
  Job at = job;
  at.batch = expect.max_micro_batch;
  PredictOptions po;
  po.reserved = true;
  const Budget budget = predict(load_model(model), at, po);
  CHECK(j["allocated_required"].get<std::uint64_t>() == budget.peak + budget.terms.overhead);
  CHECK(j["peak"].get<std::uint64_t>() == budget.peak);
  CHECK(j["budget"]["device"]["required"].get<std::uint64_t>() == expect.reserved_required);
  CHECK(j["budget"]["job"]["batch"].get<std::uint64_t>() == expect.max_micro_batch);
  CHECK(j["budget"]["peak"].get<std::uint64_t>() == budget.peak);
  // the search's estimate (the simulation's phases) is within a fraction of a percent of it
  CHECK(static_cast<double>(expect.at_max.peak) == doctest::Approx(static_cast<double>(budget.peak)).epsilon(0.01));
  const auto mb = j["accum_micro_batch"].get<std::uint64_t>();
  CHECK(mb * j["grad_accum_steps"].get<std::uint64_t>() == 48);
  CHECK(mb <= expect.max_micro_batch);
}

TEST_CASE("max-batch at the search's limit says so: every batch tried fits, a larger one may too") {
  const std::string model = test::source_path("configs/tiny-llama.yaml");
  const ModelSpec m = load_model(model);
  Job job;
  job.seq = 64;
  SearchOptions o;
  o.limit = 16;
  const auto capped = max_micro_batch(m, job, find_device("H100"), o);
  CHECK(capped.max_micro_batch == 16);
  CHECK(capped.at_limit);
  o.limit = 0;
  const auto whole = max_micro_batch(m, job, find_device("H100"), o);
  CHECK(whole.max_micro_batch > 16);
  // a card the search fills before its limit
  const auto tight = max_micro_batch(load_model(test::source_path("configs/llama-3.2-1b.yaml")), job, find_device("H100"), o);
  CHECK(tight.max_micro_batch < 65536);
  CHECK(!tight.at_limit);
  auto r = test::run_cli("max-batch " + model + " --device H100 --seq 64 --max 16 --format json");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["max_micro_batch"] == 16);
  CHECK(j["at_limit"] == true);
  r = test::run_cli("max-batch " + model + " --device H100 --seq 64 --max 16");
  CHECK(r.out.find("the search's limit: every micro-batch up to 16 fits") != std::string::npos);
  r = test::run_cli("max-batch " + test::source_path("configs/llama-3.2-1b.yaml") + " --device H100 --seq 64 --format json");
  CHECK(nlohmann::json::parse(r.out)["at_limit"] == false);
}

TEST_CASE("max-batch's table names a serving job's recipe, not training settings it does not have") {
  const std::string model = test::source_path("configs/llama-3.2-1b.yaml");
  auto r = test::run_cli("max-batch " + model + " --device H100 --seq 1024 --mode infer");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("serving, weights bf16, KV bf16") != std::string::npos);
  CHECK(r.out.find("recompute") == std::string::npos);
  CHECK(test::run_cli("max-batch " + model + " --device H100 --seq 1024 --mode infer --kv-dtype fp8").out.find("KV fp8") !=
        std::string::npos);
  r = test::run_cli("max-batch " + model + " --device H100 --seq 1024");
  CHECK(r.out.find("amp-bf16, recompute none") != std::string::npos);
}

TEST_CASE("max-batch --global-batch: divided over the job's own data-parallel ranks, a different count refused") {
  const std::string model = test::source_path("configs/llama-3.2-1b.yaml");
  const auto r = test::run_cli("max-batch " + model + " --device H100 --seq 1024 --global-batch 64 --dp 8 --format json");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["data_parallel"] == 8);
  CHECK(j["accum_micro_batch"].get<std::uint64_t>() * j["grad_accum_steps"].get<std::uint64_t>() * 8 == 64);
  // HSDP: replicas × shards take micro-batches of their own; the same count given again is accepted
  const auto hsdp = test::run_cli("max-batch " + model + " --device H100 --seq 1024 --global-batch 64 --dp 2 --fsdp 4 "
                                  "--data-parallel 8 --format json");
  REQUIRE(hsdp.exit_code == 0);
  CHECK(nlohmann::json::parse(hsdp.out)["data_parallel"] == 8);
  const auto other = test::run_cli("max-batch " + model + " --device H100 --seq 1024 --global-batch 64 --dp 8 --data-parallel 4");
  CHECK(other.exit_code == 2);
  CHECK(other.out.find("has 8 data-parallel ranks") != std::string::npos);
  const auto uneven = test::run_cli("max-batch " + model + " --device H100 --seq 1024 --global-batch 60 --dp 8");
  CHECK(uneven.exit_code == 2);
  CHECK(uneven.out.find("not a multiple of the data-parallel size 8") != std::string::npos);
  // tensor-parallel ranks share their micro-batch: a single replica
  const auto tp = test::run_cli("max-batch " + model + " --device H100 --seq 1024 --global-batch 64 --tp 2 --format json");
  REQUIRE(tp.exit_code == 0);
  CHECK(nlohmann::json::parse(tp.out)["data_parallel"] == 1);
}

TEST_CASE("max-batch: nothing fits exits 1; no device is an error") {
  const std::string model = test::source_path("configs/llama-3.1-8b.yaml");
  const auto r = test::run_cli("max-batch " + model + " --device RTX-4090");
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("no micro-batch fits") != std::string::npos);
  const auto e = test::run_cli("max-batch " + model);
  CHECK(e.exit_code == 2);
  CHECK(e.out.find("--device") != std::string::npos);
}

TEST_CASE("sweep's table names each row's layout where the grid has layouts (its rows were alike)") {
  const std::string model = test::source_path("configs/llama-3.2-1b.yaml");
  const auto t = test::run_cli("sweep " + model + " -b 1 -s 128 --precision bf16 --tp 1,2 --format table");
  REQUIRE(t.exit_code == 0);
  CHECK(t.out.find(" layout ") != std::string::npos);
  CHECK(t.out.find("dp1 fsdp1 tp1 pp1") != std::string::npos);
  CHECK(t.out.find("dp1 fsdp1 tp2 pp1") != std::string::npos);
  const auto plain = test::run_cli("sweep " + model + " -b 1 -s 128 --format table");
  CHECK(plain.out.find("layout") == std::string::npos);  // no layouts in the grid: no column
}

TEST_CASE("sweep --mode infer leaves the training columns empty (they printed the defaults)") {
  const std::string model = test::source_path("configs/tiny-llama.yaml");
  const auto csv = test::run_cli("sweep " + model + " --mode infer --batch 1,2 --seq 64");
  REQUIRE(csv.exit_code == 0);
  CHECK(csv.out.find("\n1,64,,,") != std::string::npos);
  CHECK(csv.out.find("amp-bf16") == std::string::npos);
  const auto js = test::run_cli("sweep " + model + " --mode infer --batch 1 --seq 64 --format json");
  REQUIRE(js.exit_code == 0);
  const auto p = nlohmann::json::parse(js.out)["points"][0];
  CHECK(p["precision"].is_null());
  CHECK(p["recompute"].is_null());
  CHECK(p["peak"].is_number_unsigned());
  const auto train = nlohmann::json::parse(test::run_cli("sweep " + model + " --batch 1 --seq 64 --format json").out);
  CHECK(train["points"][0]["precision"] == "amp-bf16");  // training keeps them
}

TEST_CASE("sweep: csv and json over ranges and lists") {
  const std::string model = test::source_path("configs/tiny-llama.yaml");
  const auto r = test::run_cli("sweep " + model + " --batch 1..4 --seq 64,128 --precision amp-bf16,bf16 --device H100");
  REQUIRE(r.exit_code == 0);
  std::size_t lines = 0;
  for (char c : r.out) lines += c == '\n';
  CHECK(lines == 1 + 4 * 2 * 2);
  CHECK(r.out.rfind("batch,seq,precision,recompute,peak,required", 0) == 0);
  const auto js = test::run_cli("sweep " + model + " --batch 1..8:2 --seq 64 --format json");
  REQUIRE(js.exit_code == 0);
  const auto j = nlohmann::json::parse(js.out);
  REQUIRE(j["points"].size() == 4);
  CHECK(j["points"][1]["batch"] == 3);
  Job job;
  job.batch = 3;
  job.seq = 64;
  CHECK(j["points"][1]["peak"].get<std::uint64_t>() == predict(load_model(model), job).peak);
  CHECK(test::run_cli("sweep " + model + " --batch 4..1").exit_code == 2);
  CHECK(test::run_cli("sweep " + model + " --batch x").exit_code == 2);
  CHECK(test::run_cli("sweep " + model + " --precision fp64").exit_code == 2);
}

TEST_CASE("a sequence beyond max_positions: predicted everywhere, with a warning on stderr") {
  const std::string model = test::source_path("configs/tiny-llama.yaml");  // max_positions 512
  const auto p = test::run_cli("predict " + model + " --seq 2048 --batch 2 --format json 2>/dev/null");
  REQUIRE(p.exit_code == 0);
  CHECK(nlohmann::json::parse(p.out)["peak"].get<std::uint64_t>() > 0);
  const auto w = test::run_cli("predict " + model + " --seq 2048 --batch 2 --format json 2>&1 >/dev/null");
  CHECK(w.out.find("exceeds tiny-llama's max_positions (512)") != std::string::npos);
  const auto m = test::run_cli("max-batch " + model + " --device H100 --seq 100000 --format json 2>/dev/null");
  REQUIRE(m.exit_code == 0);
  const auto j = nlohmann::json::parse(m.out);
  CHECK(j["max_micro_batch"].get<std::uint64_t>() > 1);
  const auto s = test::run_cli("sweep " + model + " --batch 1 --seq 256,1024 --format json 2>/dev/null");
  REQUIRE(s.exit_code == 0);
  const auto sj = nlohmann::json::parse(s.out);
  CHECK(sj["points"][0]["ok"] == true);
  CHECK_FALSE(sj["points"][0].contains("beyond_max_positions"));
  CHECK(sj["points"][1]["ok"] == true);
  CHECK(sj["points"][1]["beyond_max_positions"] == true);
}
