// spec_internal.hpp: what the two model-spec readers share (spec.cpp reads config.json,
// yaml_spec.cpp our YAML schema): the validation every loaded spec passes and the quirks a family
// implies. Not a public header.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "membudget/error.hpp"
#include "membudget/spec.hpp"

namespace membudget::detail {

// What is wrong with a spec, if anything: the field to name and what to do about it. The reader
// turns it into an Error that names its own location (a YAML line, a config.json path).
struct Problem {
  ErrorKind kind;
  std::string field;
  std::string what;
};
std::optional<Problem> find_problem(const ModelSpec& s);

// The quirks a family implies: the one place that reads a family name (config.json's model_type
// or the YAML `family`).
ArchQuirks quirks_of_family(std::string_view family);

}  // namespace membudget::detail
