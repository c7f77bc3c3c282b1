// membudget/job_sources.hpp: where a job's settings were given, so that an error names the place.
//
// Job::validate and check_options_apply name a setting by its command-line flag ("--batch: must be
// at least 1"), the one name every front end shares. A setting read from a spec's `job:` section
// or a TrainingArguments JSON was not given as that flag: the CLI records each such setting's
// place while it reads them and, when a check refuses the job, names the place instead
// ("spec.yaml:22: job.batch: must be at least 1").
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "membudget/error.hpp"

namespace membudget {

class JobSources {
 public:
  // The setting `flag` ("--batch") was read at `location` ("spec.yaml:22", "args.json") as `key`
  // ("job.batch", "TrainingArguments.per_device_train_batch_size"); a later read replaces it.
  void note(std::string_view flag, std::string location, std::string key);
  // The setting was given on the command line after: the flag is its place.
  void given_as_flag(std::string_view flag);
  // The settings read elsewhere, by flag ("--batch"), as check_options_apply takes them.
  std::vector<std::string> flags() const;

  // `e` with the settings it names traced to their places: a message that opens with one such flag
  // opens with its place and key instead; other such flags it names are listed at its end.
  Error locate(const Error& e) const;

 private:
  struct Place {
    std::string location, key;
  };
  std::map<std::string, Place, std::less<>> by_flag_;
};

}  // namespace membudget
