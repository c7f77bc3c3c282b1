// libFuzzer target: the CLI's job flags (tools/job_flags.cpp through CLI11) on any command line.
// The input is split into arguments at newlines; the spec is configs/tiny-llama.yaml. Any command
// line must end in a job that validates and an estimate whose figures add up (or an overflow), or
// in a CLI11 parse error or a membudget::Error of the kinds bad input gives: never a crash, hang or
// other exception.
// fuzz-requires: tools/job_flags.cpp src/model/api.cpp
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../tools/job_flags.hpp"
#include "membudget/api.hpp"

using namespace membudget;

namespace {

bool input_error(ErrorKind k) {
  return k == ErrorKind::invalid_job || k == ErrorKind::invalid_argument || k == ErrorKind::unsupported ||
         k == ErrorKind::overflow || k == ErrorKind::parse;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 4096) return 0;
  static const ModelSpec spec = load_model(MEMBUDGET_SOURCE_DIR "/configs/tiny-llama.yaml");
  std::vector<std::string> args{"membudget"};
  std::string cur;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  if (!cur.empty()) args.push_back(cur);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());

  CLI::App app{"fuzz"};
  cli::JobFlags flags;
  flags.add_job_options(&app);
  flags.model_path = MEMBUDGET_SOURCE_DIR "/configs/tiny-llama.yaml";
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
    return 0;
  }
  try {
    const Job job = flags.job(spec, false);
    job.validate();
    (void)flags.device_choice();
    try {
      const Estimate e = estimate(spec, job);
      if (e.required != e.peak + e.overhead || e.peak == 0) std::abort();
    } catch (const Error& e) {
      // a valid job the model cannot run is Error(invalid_job) naming the field: --tp 3 over 4
      // heads, --router-aux-loss on a dense model (check_layout, check_simulated)
      if (e.kind() != ErrorKind::overflow && e.kind() != ErrorKind::unsupported && e.kind() != ErrorKind::invalid_job)
        std::abort();
    }
  } catch (const Error& e) {
    // --trainer-args names a file: one that cannot be read is Error(io), naming the path
    const bool unreadable_file = e.kind() == ErrorKind::io && !flags.trainer_args.empty();
    if (!input_error(e.kind()) && !unreadable_file) std::abort();
  }
  return 0;
}
