// membudget/job_yaml.hpp: the optional `job:` section of a YAML model spec.
#pragma once

#include <string>
#include <string_view>

#include "membudget/job.hpp"
#include "membudget/job_sources.hpp"

namespace membudget {

// Applies the `job:` mapping of a YAML spec over `base` (keys: batch, seq, mode, precision,
// optimizer, recompute, attention, loss, loss_chunk, activations, profile, overhead, lora). A JSON
// file or a spec without the section returns `base`. Unknown or duplicate keys, a second job
// section and bad values are errors naming file, line and key. `sources`, when given, records
// each key's file and line (the CLI's messages name them: job_sources.hpp).
Job load_job_section(const std::string& path, Job base, JobSources* sources = nullptr);
// The same from the spec's text; `path` names it in messages.
Job parse_job_section(std::string_view spec_text, const std::string& path, Job base, JobSources* sources = nullptr);

}  // namespace membudget
