// src/model/json_input.hpp: a JSON input file as the loaders read it (config.json, TrainingArguments).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "membudget/error.hpp"

namespace membudget::detail {

// nlohmann's parse (its exceptions as they are), with a key given twice in one object refused as
// Error(kind) "<where>: key '<key>' is given twice in one object": a JSON reader keeps one of the
// two (nlohmann and Python's json the last) and which one the file meant is not known. A number
// whose digits are not all zero but which a double reads as 0 or a denormal (1e-400) is refused
// the same way: read as 0 it would silently mean "none".
nlohmann::json parse_json_once_per_key(std::string_view text, const std::string& where, ErrorKind kind);

}  // namespace membudget::detail
