// src/measure/verify.hpp: run the harness, measure each phase, compare with the prediction.
//
// With job.mode == infer it runs the inference step instead (harness_infer.hpp): phases floor,
// prefill_peak and decode_peak against Budget::phases (there is no step 0 to tell apart).
//
// run_verify builds the backend and a CachingAllocator on its memory, runs `warmup` steps and then
// `steps` measured steps of the synthetic step, and compares every measured phase peak (floor,
// forward, backward, optimizer) with predict(model, job) for the harness profile: step 0 against
// Budget::step0, later steps against Budget::phases. A phase is within tolerance when
// |measured − predicted| ≤ tolerance · predicted. The leak check asks that allocated bytes after
// each step from step 1 on are flat; the first step that ends higher than the one before is
// reported as the start of the staircase.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "measure/harness.hpp"
#include "measure/harness_infer.hpp"
#include "membudget/budget.hpp"
#include "membudget/report.hpp"

namespace membudget::measure {

struct VerifyOptions {
  std::string backend = "cpu";
  int steps = 3;
  int warmup = 1;
  double tolerance = 0.01;  // fraction of the predicted bytes
  bytes_t capacity = 0;     // 0: the device's (CPU: unlimited)
  std::string snapshot_path;
  std::string plot_path;
  bool leak_per_step = false;  // debug: inject a leak
  bool expandable_segments = false;
  float lr = 3e-3f;  // AdamW learning rate of the training step (--lr)
};

struct PhaseCheck {
  std::string phase;  // "floor", "forward_peak", …
  bytes_t predicted = 0;
  bytes_t measured = 0;
  std::int64_t error = 0;  // measured − predicted
  double error_pct = 0;
  bool ok = true;
};

struct StepCheck {
  StepMeasure measure;
  std::vector<PhaseCheck> phases;
};

struct VerifyResult {
  Budget predicted;
  std::string backend;
  VerifyOptions options;
  std::vector<StepCheck> steps;  // the measured steps (warm-up steps are not compared)
  std::vector<bytes_t> allocated_after;  // after every step, warm-up included
  bytes_t reserved = 0;      // reserved.peak over the run
  bytes_t outside = 0;       // device memory in use outside the allocator
  std::int64_t alloc_retries = 0;
  std::optional<int> leak_step;  // the step where allocated-after-step starts to climb
  bytes_t leak_bytes = 0;        // growth per step there
  bool infer = false;         // --mode infer: phases floor, prefill_peak, decode_peak
  bytes_t kv_pool = 0;        // infer: requested bytes of the KV pool (2 · layers buffers)
  bytes_t weights = 0;        // infer: requested bytes of the weights
  bool within_tolerance = true;
  bool ok() const { return within_tolerance && !leak_step; }
};

// Error(out_of_memory) when the step does not fit the capacity (message: the allocator's figures,
// the step, phase and tensor, and the predicted peak); Error(unsupported) for what the harness
// does not implement.
VerifyResult run_verify(const ModelSpec& model, const Job& job, const VerifyOptions& options);

std::string render_verify(const VerifyResult& result, Format format);

// The measured timeline (allocated bytes after every allocator event) with phases marked and the
// predicted phase peaks drawn over it, as a standalone SVG document.
std::string timeline_svg(const std::vector<TraceEvent>& history, const std::vector<PhaseMark>& marks,
                         const VerifyResult& result);

}  // namespace membudget::measure
