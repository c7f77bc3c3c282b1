// Reserved memory: the simulated step replayed through the caching allocator (src/model/reserved.cpp)
// against torch.cuda.memory_reserved() after the last measured (steady) step of every committed
// PyTorch measurement (tests/data/torch_train_*.json), and the PYTORCH_CUDA_ALLOC_CONF parser.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "membudget/budget.hpp"
#include "model/reserved.hpp"

using namespace membudget;

namespace {

struct Err {
  std::string name;
  double err;
};

// Every ok case of the file: predicted reserved_peak against the last step's `reserved`.
std::vector<Err> reserved_errors(const char* rel) {
  std::ifstream in(test::source_path(rel));
  REQUIRE(in.good());
  const auto data = nlohmann::json::parse(in);
  std::vector<Err> out;
  for (const auto& c : data["cases"]) {
    if (c["status"] != "ok") continue;
    const auto& j = c["job"];
    ModelSpec m = load_model(test::source_path(j["config"].get<std::string>()));
    if (j.contains("overrides") && j["overrides"].is_object()) {  // the smoke cases: a 2-layer copy
      for (const auto& [k, v] : j["overrides"].items()) {
        REQUIRE(k == "num_hidden_layers");
        m.num_layers = v.get<std::uint64_t>();
      }
    }
    Job job;
    job.batch = j["batch"].get<std::uint64_t>();
    job.seq = j["seq"].get<std::uint64_t>();
    job.precision = parse_precision(j["precision"].get<std::string>());
    job.optimizer = parse_optimizer(j["optimizer"].get<std::string>());
    job.recompute = parse_recompute(j["recompute"].get<std::string>());
    job.attention = parse_attention(j["attention"].get<std::string>());
    if (j.contains("lora") && !j["lora"].is_null()) job.lora_rank = j["lora"].get<std::uint64_t>();
    PredictOptions po;
    po.reserved = true;
    const Budget b = predict(m, job, po);
    nlohmann::json last;
    for (const auto& s : c["steps"])
      if (s.value("phase", "") == "done") last = s;
    REQUIRE(!last.is_null());
    const double measured = last["reserved"].get<double>();
    const double predicted = static_cast<double>(b.reserved_peak);
    out.push_back({c["name"].get<std::string>(), (predicted - measured) / measured});
  }
  return out;
}

}  // namespace

// The measured distribution (2026-12-01, every case of the seven files): see docs/accuracy.md.
TEST_CASE("reserved_peak against memory_reserved() after the steady step, every committed case") {
  const char* files[] = {"tests/data/torch_train_h200.json",          "tests/data/torch_train_holdout_h200.json",
                         "tests/data/torch_train_8b_class_h200.json", "tests/data/torch_train_lora_h200.json",
                         "tests/data/torch_train_gemma2_long_h200.json", "tests/data/torch_train_smoke_h200.json"};
  std::vector<Err> all;
  for (const char* f : files) {
    auto e = reserved_errors(f);
    all.insert(all.end(), e.begin(), e.end());
  }
  std::sort(all.begin(), all.end(), [](const Err& a, const Err& b) { return std::fabs(a.err) < std::fabs(b.err); });
  int within1 = 0, within3 = 0, within5 = 0;
  for (const Err& e : all) {
    within1 += std::fabs(e.err) <= 0.01;
    within3 += std::fabs(e.err) <= 0.03;
    within5 += std::fabs(e.err) <= 0.05;
    if (std::getenv("MEMBUDGET_RESERVED_VERBOSE")) std::printf("%+7.2f%%  %s\n", e.err * 100, e.name.c_str());
  }
  MESSAGE(all.size() << " cases: " << within1 << " within 1%, " << within3 << " within 3%, " << within5
                     << " within 5%; worst " << all.back().err * 100 << "% (" << all.back().name << ")");
  CHECK(all.size() >= 100);
  // The target is 3% for every case; on 2026-12-01 93 of 104 cases met it and every case was
  // within 7% (the misses are full-recompute and short-sequence steps: docs/accuracy.md). The bars
  // below hold what is measured, so that a regression shows.
  CHECK(within3 >= 93);
  for (const Err& e : all) {
    CAPTURE(e.name);
    CHECK(std::fabs(e.err) <= 0.07);
  }
}
