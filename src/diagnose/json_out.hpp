// src/diagnose/json_out.hpp: the JSON objects behind the diagnose readers' to_json (internal).
//
// The public headers (oom.hpp, oom_attribution.hpp, leaks.hpp, snapshot_leaks.hpp) return JSON as
// text so that they depend on the standard library only; the objects are built here with
// nlohmann::json, which the library links privately, so that one reader's object can extend
// another's (snapshot leaks extend the leak verdict, an attributed OOM the OOM report).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "membudget/leaks.hpp"
#include "membudget/oom.hpp"
#include "membudget/oom_attribution.hpp"

namespace membudget::diagnose {

nlohmann::json oom_json(const OomReport& report, const OomContext& context);
// oom_json with the prediction's reading of the message under "attribution".
nlohmann::json oom_json(const OomReport& report, const OomContext& context, const OomAttribution& attribution);
nlohmann::json leak_json(const LeakReport& report);

// Serialised as the CLI prints it (indent -1: one line); text read from a file (frames, messages)
// may hold invalid UTF-8, which is replaced rather than fatal.
inline std::string dump(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace membudget::diagnose
