// job_yaml.cpp: the `job:` section of a spec file. A config.json has none; YAML text is read by
// yaml_job.cpp (yaml-cpp), which the web page's build replaces with web/yaml_stub.cpp.
#include "membudget/job_yaml.hpp"

#include "job_yaml_internal.hpp"
#include "membudget/input.hpp"
#include "membudget/spec.hpp"

namespace membudget {

Job load_job_section(const std::string& path, Job job, JobSources* sources) {
  return parse_job_section(read_spec_file(path), path, job, sources);
}

Job parse_job_section(std::string_view spec_text, const std::string& path, Job job, JobSources* sources) {
  const std::string_view text = strip_bom(spec_text);
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] == '{') return job;  // JSON: no job section
  return detail::apply_yaml_job_section(text, path, job, sources);
}

}  // namespace membudget
