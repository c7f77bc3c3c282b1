// membudget/snapshot_leaks.hpp: leak detection from a torch.cuda.memory._dump_snapshot trace.
//
// The allocated-after-step series is read off the replayed trace (src/diagnose/trace.hpp) at step
// boundaries, found in this order (docs/diagnose.md):
//   1. external_annotations: the END of each Optimizer.zero_grad range (the profiler marks that
//      torch.optim logs), or failing that of each Optimizer.step range;
//   2. frames: the last event of each run of events made inside the optimizer (frames in /optim/,
//      optimizer.py or zero_grad) — alloc of its state and temporaries, frees of zero_grad;
//   3. neither: Error(unsupported) — record with stacks, or write a steps.csv.
// Then detect_leak() (membudget/leaks.hpp) judges the series, and the allocations born after the
// first boundary (warm-up: step 0 creates gradients and optimizer state) and before the last one
// that are never freed are listed, grouped by frame (as in attribute), largest first. cuBLAS
// workspaces (never freed by design) are left out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "membudget/leaks.hpp"

namespace membudget {

struct SurvivorGroup {
  std::string frame;
  bytes_t bytes = 0;
  std::uint64_t count = 0;
  std::int64_t first_step = 0;  // the step the first of them was born in (step 0 = before boundary 0)
};

struct SnapshotLeaks {
  StepSeries series;          // steps 0, 1, …: live bytes at each boundary
  std::vector<std::int64_t> boundary_time_us;
  std::string boundaries;     // "annotations: Optimizer.zero_grad", "frames: optimizer"
  LeakReport report;
  std::vector<SurvivorGroup> survivors;
  bytes_t survivor_bytes = 0;
};

// Error(parse) for a bad snapshot, Error(unsupported) when no step boundary can be found.
SnapshotLeaks snapshot_leaks(std::string pickle_bytes, const std::string& where = "snapshot",
                             const LeakOptions& options = {});
SnapshotLeaks snapshot_leaks_file(const std::string& path, const LeakOptions& options = {});

// to_json(LeakReport)'s keys plus {"boundaries", "allocated_after_step", "boundary_time_us",
// "survivor_bytes", "survivors": [{"frame", "bytes", "count", "first_step"}]}; frames that are not
// valid UTF-8 are written with U+FFFD in place of the bad bytes.
std::string to_json(const SnapshotLeaks& leaks, int indent = -1);

}  // namespace membudget
