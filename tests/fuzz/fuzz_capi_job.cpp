// libFuzzer target: the C ABI's job setter, fed a JSON object of options ({"batch": 2, "precision":
// "bf16", "kv-dtype": "fp8", …}; each value is set through mb_job_set as its text), then predict,
// fits and the micro-batch search on configs/tiny-llama.yaml. "_capacity" (bytes, up to 2^64 − 1)
// and "_headroom" pick the card. Every call must return a status of the enum (never MB_INTERNAL)
// with a message when it is not MB_OK, and never crash or hang; the figures must add up, and the
// largest micro-batch found must fit when the next one does not.
// fuzz-requires: src/model/capi.cpp
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "membudget/membudget.h"

namespace {

void check(mb_status s) {
  if (s == MB_INTERNAL || s < MB_OK || s > MB_INTERNAL) std::abort();
  if (s != MB_OK && std::strlen(mb_last_error()) == 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static mb_model* model = [] {
    mb_model* m = nullptr;
    if (mb_model_load(MEMBUDGET_SOURCE_DIR "/configs/tiny-llama.yaml", &m) != MB_OK) std::abort();
    return m;
  }();
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (!j.is_object()) return 0;
  mb_job* job = nullptr;
  check(mb_job_new(&job));
  std::uint64_t capacity = 80ull << 30;
  double headroom = 0.05;
  for (const auto& [key, value] : j.items()) {
    if (key == "_capacity" && value.is_number_unsigned()) {
      capacity = value.get<std::uint64_t>();
      continue;
    }
    if (key == "_headroom" && value.is_number()) {
      headroom = value.get<double>();
      continue;
    }
    const std::string text = value.is_string() ? value.get<std::string>()
                                               : value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    check(mb_job_set(job, key.c_str(), text.c_str()));
  }
  mb_estimate e{};
  const mb_status ps = mb_predict(model, job, &e);
  check(ps);
  if (ps == MB_OK && e.required != e.peak + e.overhead) std::abort();
  int fits = -1;
  const mb_status fs = mb_fits(model, job, nullptr, capacity, headroom, &fits, &e);
  check(fs);
  if (fs == MB_OK && fits != 0 && fits != 1) std::abort();
  std::uint64_t best = 0;
  const mb_status ms = mb_max_micro_batch(model, job, nullptr, capacity, headroom, &best, nullptr);
  check(ms);
  if (ms == MB_OK && best > 0 && best < 65536) {
    mb_job* at = mb_job_clone(job);
    if (!at) std::abort();
    check(mb_job_set_batch(at, best));
    if (mb_fits(model, at, nullptr, capacity, headroom, &fits, nullptr) == MB_OK && fits != 1) std::abort();
    check(mb_job_set_batch(at, best + 1));
    if (mb_fits(model, at, nullptr, capacity, headroom, &fits, nullptr) == MB_OK && fits != 0) std::abort();
    mb_job_free(at);
  }
  char* json = nullptr;
  const mb_status js = mb_predict_json(model, job, &json);
  check(js);
  mb_string_free(json);
  mb_job_free(job);
  return 0;
}
