// membudget/job_yaml.hpp: the optional `job:` section of a YAML model spec.
#pragma once

#include <string>

#include "membudget/job.hpp"

namespace membudget {

// Applies the `job:` mapping of a YAML spec over `base` (keys: batch, seq, mode, precision,
// optimizer, recompute, attention, loss, loss_chunk, activations, profile, overhead). A JSON file or
// a spec without the section returns `base`. Unknown keys and bad values are errors naming file,
// line and key.
Job load_job_section(const std::string& path, Job base);

}  // namespace membudget
