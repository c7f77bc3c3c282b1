// src/model/yaml_number.hpp: how a number is written in a YAML spec and its job: section, the rule
// both YAML readers (yaml_spec.cpp, yaml_job.cpp) hold it to. Internal; yaml-cpp only.
#pragma once

#include <string>

#include <yaml-cpp/yaml.h>

namespace membudget::detail {

// Written as a number: plain, or tagged as one (!!int; !!float where a fraction is read). A quoted
// scalar ("!") or one tagged !!str is a string.
inline bool yaml_number_scalar(const YAML::Node& n, bool fraction) {
  return n.IsScalar() &&
         (n.Tag() == "?" || n.Tag() == "tag:yaml.org,2002:int" || (fraction && n.Tag() == "tag:yaml.org,2002:float"));
}

// The problem with a count's leading zero, or "": YAML 1.1 readers (PyYAML) read 0256 as octal 174,
// YAML 1.2 readers as 256.
inline std::string yaml_leading_zero_problem(const std::string& digits) {
  if (digits.size() > 1 && digits[0] == '0')
    return "'" + digits + "' has a leading zero, which YAML readers disagree on (octal or not); write it without";
  return "";
}

}  // namespace membudget::detail
