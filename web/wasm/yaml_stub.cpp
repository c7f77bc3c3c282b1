// yaml_stub.cpp: the web page's stand-in for src/model/yaml_spec.cpp and yaml_job.cpp.
// yaml-cpp has no WebAssembly build, so the page's wasm leaves both readers out and links this in
// their place: a YAML spec is refused with the library's usual Error (exit code 2), and config.json
// (which load_model and parse_job_section recognise before they reach here) works as natively.
#include "membudget/error.hpp"
#include "membudget/spec.hpp"
#include "model/job_yaml_internal.hpp"

namespace membudget {

namespace {
[[noreturn]] void refuse_yaml(const std::string& where) {
  throw Error(ErrorKind::unsupported,
              where + ": YAML specs are read by the native CLI; the page reads a Hugging Face config.json");
}
}  // namespace

ModelSpec parse_model_yaml(std::string_view, const std::string& where) { refuse_yaml(where); }

namespace detail {
Job apply_yaml_job_section(std::string_view, const std::string& path, Job, JobSources*) { refuse_yaml(path); }
}  // namespace detail

}  // namespace membudget
