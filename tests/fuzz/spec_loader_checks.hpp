// What the spec fuzzers hold every loader to: a spec that loads is valid, its name is UTF-8 and its
// parameter count is computed or an overflow; any other input is an Error of the kinds the loaders
// document (invalid_spec, parse, overflow, unsupported). `extra` adds a loader's own promises.
// Anything else aborts, which libFuzzer reports.
#pragma once

#include <cstdlib>
#include <string>

#include "membudget/error.hpp"
#include "membudget/input.hpp"
#include "membudget/spec.hpp"

template <class Load, class Extra>
int check_spec_loader(Load&& load, Extra&& extra) {
  using namespace membudget;
  try {
    const ModelSpec s = load();
    s.validate();  // the loader promises a valid spec
    if (!valid_utf8(s.name)) std::abort();
    extra(s);
    try {
      const ParameterCounts c = s.parameters();
      if (c.total < c.embedding || c.layers < c.per_layer) std::abort();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::overflow) std::abort();
    }
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::invalid_spec && e.kind() != ErrorKind::parse && e.kind() != ErrorKind::overflow &&
        e.kind() != ErrorKind::unsupported)
      std::abort();
  }
  return 0;
}
