// tools/grid_flags.hpp: value lists for sweep: "1..64", "1..64:8", "1024,2048,4096", "1,2,8..16".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "membudget/job.hpp"

namespace membudget::cli {

// Positive integers; a..b is inclusive, a..b:k steps by k. Error(invalid_argument) names `option`.
std::vector<std::uint64_t> parse_count_list(const std::string& text, const char* option);
// Comma-separated names: "amp-bf16,bf16".
std::vector<Precision> parse_precision_list(const std::string& text);
std::vector<Recompute> parse_recompute_list(const std::string& text);

}  // namespace membudget::cli
