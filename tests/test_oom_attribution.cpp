// oom --model: the failed request matched against the prediction's live tensors.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "membudget/oom_attribution.hpp"

using namespace membudget;

namespace {
std::string message(const std::string& request) {
  return "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate " + request +
         ". GPU 0 has a total capacity of 44.39 GiB of which 3.12 GiB is free. Including non-PyTorch memory, this "
         "process has 41.26 GiB memory in use. Of the allocated memory 38.12 GiB is allocated by PyTorch, and 2.62 "
         "GiB is reserved by PyTorch but unallocated.";
}
}  // namespace

TEST_CASE("a failed request the size of the fp32 logits belongs to the logits and loss term") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job job;  // 4 × 4096: b·s·V fp32 = 16384 × 128256 × 4 B = 7.83 GiB
  const OomAttribution a = attribute_oom(parse_oom_message(message("7.83 GiB")), m, job);
  CHECK(a.matched);
  CHECK(a.term == "logits_loss");
  CHECK(a.tensor_bytes == 16384ull * 128256 * 4);
  CHECK(a.predicted_required > 44ull * GiB);
  CHECK(a.note.find("cannot fit") != std::string::npos);
}

TEST_CASE("a request the size of one MLP activation belongs to the activations") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job job;  // b·s·I bf16 = 16384 × 8192 × 2 B = 256 MiB
  const OomAttribution a = attribute_oom(parse_oom_message(message("256.00 MiB")), m, job);
  CHECK(a.matched);
  CHECK(a.term == "activations");
  CHECK(a.tensor_bytes == 16384ull * 8192 * 2);
}

TEST_CASE("a request matching nothing says so instead of guessing") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job job;
  const OomAttribution a = attribute_oom(parse_oom_message(message("3.33 GiB")), m, job);
  CHECK_FALSE(a.matched);
  CHECK(a.term == "unknown");
}

TEST_CASE("oom --model --format json carries the attribution") {
  auto r = test::run_cli("oom --format json --model " + test::source_path("configs/llama-3.2-1b.yaml") + " '" +
                         message("7.83 GiB") + "'");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["attribution"]["term"] == "logits_loss");
  CHECK(j["classification"].is_string());
  auto bad = test::run_cli("oom --model /nonexistent.yaml '" + message("7.83 GiB") + "'");
  CHECK(bad.exit_code == 5);
}
