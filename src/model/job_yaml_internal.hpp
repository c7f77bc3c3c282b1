// job_yaml_internal.hpp: the YAML half of parse_job_section (job_yaml.cpp), in its own translation
// unit (yaml_job.cpp) so that a build without yaml-cpp links a stub in its place. Not public.
#pragma once

#include <string>
#include <string_view>

#include "membudget/job.hpp"
#include "membudget/job_sources.hpp"

namespace membudget::detail {

// Applies the `job:` section of YAML spec text (BOM already stripped, not JSON) over `job`,
// noting each key's place in `sources` when given.
Job apply_yaml_job_section(std::string_view text, const std::string& path, Job job, JobSources* sources);

}  // namespace membudget::detail
