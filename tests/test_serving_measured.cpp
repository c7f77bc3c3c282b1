// Measured ground truth: Hugging Face prefill on an H200 (tests/data/torch_prefill_h200.json, from
// tools/torch_profile_prefill.py). Every measured case: prefill_peak within 3%, KV bytes exact.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "membudget/budget.hpp"

using namespace membudget;

TEST_CASE("HF prefill on the H200: prefill_peak within 3%, KV cache exact") {
  std::ifstream in(test::source_path("tests/data/torch_prefill_h200.json"));
  REQUIRE(in.good());
  const auto doc = nlohmann::json::parse(in);
  int cases = 0;
  for (const auto& model : doc["models"]) {
    REQUIRE(model["status"] == "ok");
    const ModelSpec spec = load_model(test::source_path("configs/hf/" + model["config"].get<std::string>()));
    for (const auto& r : model["shapes"]) {
      if (r["status"] != "ok") continue;
      Job j;
      j.mode = Mode::infer;
      j.batch = r["batch"].get<std::uint64_t>();
      j.seq = r["seq"].get<std::uint64_t>();
      const Budget b = predict(spec, j);
      const double measured = r["prefill_peak"].get<double>();
      const double predicted = static_cast<double>(b.phase(Phase::prefill_peak));
      const double err = (predicted - measured) / measured;
      const double derr = (static_cast<double>(b.phase(Phase::decode_peak)) - r["decode_peak"].get<double>()) /
                          r["decode_peak"].get<double>();
      MESSAGE(model["config"].get<std::string>() << " " << j.batch << "x" << j.seq << ": prefill_peak measured "
                                                 << measured << " predicted " << predicted << " error "
                                                 << err * 100 << "%, decode_peak error " << derr * 100 << "%");
      CHECK(std::abs(err) <= 0.03);
      CHECK(b.terms.kv_cache == r["kv_cache_bytes"].get<bytes_t>());
      ++cases;
    }
  }
  CHECK(cases >= 10);
}
