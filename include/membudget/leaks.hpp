// membudget/leaks.hpp: is memory flat from step to step, or a staircase?
//
// Input: the bytes allocated by PyTorch after each training step (torch.cuda.memory_allocated()
// after optimizer.step()). A healthy loop is flat once in steady state. Step 0 allocates the
// gradients and its optimizer.step() creates the optimizer state, so the series usually jumps
// once between the first steps: that is not a leak. A leak (a loss summed without .item(), outputs
// appended to a list, a growing cache) adds about the same amount every step, from some step on.
//
// Rule (detect_leak):
//   d_i = a_{i+1} - a_i. noise = a robust standard deviation of the d_i, estimated from the
//   second differences (1.4826 * MAD / sqrt(3)), which a clean staircase does not inflate however
//   long its flat prefix. A step "grows" when d_i >= min_growth and d_i > 3 * noise; min_growth
//   defaults to 512 bytes, the allocator's rounding unit: a leaked tensor adds at least that much.
//   leak  <=> the last min_run (default 3) or more steps all grow, and the last value exceeds
//             every value before the run by a growing amount (a new high-water mark, so a
//             sawtooth that returns to earlier heights is not a leak).
//   The run's leading steps larger than 3x the run's median are a one-time jump (optimizer
//   state), not part of the staircase, and are trimmed from it.
//   start_step: the step the staircase starts from (its first growing step is start_step ->
//   start_step + 1); growth_per_step: the median growth over the run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "membudget/bytes.hpp"

namespace membudget {

struct LeakOptions {
  bytes_t min_growth = 512;  // smallest per-step growth that can be a leak
  std::size_t min_run = 3;   // growing steps in a row needed (4 points)
};

struct LeakReport {
  bool leak = false;
  bytes_t growth_per_step = 0;           // median growth over the staircase; 0 without a leak
  std::optional<std::int64_t> start_step;  // step label the staircase starts from
  std::size_t steps = 0;                 // points in the series
  bytes_t growth_total = 0;              // last value - value at start_step
  std::string explanation;
};

// `steps` labels the points (same length as `allocated`); empty means 0, 1, 2, ...
LeakReport detect_leak(std::span<const bytes_t> allocated_after_step,
                       std::span<const std::int64_t> steps = {}, const LeakOptions& options = {});

// A steps.csv file: "step,allocated[,...]" with a header line naming the columns (the allocated
// column is "allocated", or failing that the first whose name contains "allocated"; "step" is
// optional), or no header with one column (allocated) or two or more (step, allocated). Blank lines
// and lines starting with '#' are skipped. Values are integer bytes or sizes with a unit
// ("1.5 GiB"); steps are integers, strictly increasing.
struct StepSeries {
  std::vector<std::int64_t> steps;
  std::vector<bytes_t> allocated;
};

// Throws Error(parse) naming `name`, the line and the column of the first bad field.
StepSeries read_steps_csv(std::string_view text, std::string_view name = "steps.csv");
StepSeries read_steps_csv_file(const std::string& path);  // + Error(io) when unreadable

// {"leak", "growth_per_step", "start_step" (null without a leak), "steps", "growth_total",
//  "explanation"}, keys in alphabetical order; indent -1 is one line, n >= 0 pretty-prints.
std::string to_json(const LeakReport& report, int indent = -1);

}  // namespace membudget
