// membudget/attribute.hpp: which code holds the memory at the peak of a recorded step.
//
// attribute_snapshot() reads a torch.cuda.memory._dump_snapshot pickle (no Python needed), replays
// the allocation trace (src/diagnose/trace.hpp: alloc / free_requested, with allocations made
// before recording counted from the start), finds the first moment of peak allocated bytes, and
// groups the allocations live then by the Python frame that made them. Each group is mapped to a
// budget term by the rules of docs/diagnose.md, first match wins:
//   1. born before recording: still live at the end → parameters (with a model: parameters up to
//      the predicted weights, then optimizer_state up to the predicted optimizer state + master
//      weights, then other, in address order); freed by zero_grad / the optimizer → gradients;
//      freed otherwise → activations
//   2. a frame in an optimizer (/optim/, optimizer.py, zero_grad)           → optimizer_state
//   3. module set-up frames (torch nn/modules __init__ / _apply / to / cuda / reset_parameters,
//      from_pretrained, from_config, load_state_dict, nn/init.py)            → parameters
//   4. never freed and exactly a cuBLAS workspace (32 MiB, or 8 MiB + 128 KiB) → other
//   5. born in backward (a frame named *backward*, torch/autograd/, the autograd engine, or no
//      Python frame while the trace has frames: the engine's thread) and freed by zero_grad /
//      the optimizer, or never freed in a trace without zero_grad frees    → gradients;
//      never freed although zero_grad frees exist                          → other
//   6. with a model and job: a block of b·s·V × 2 or × 4 bytes (rounded to 512) → logits_loss
//   7. a loss frame (cross_entropy, nll_loss, log_softmax, loss_utils, ForCausalLMLoss, loss.py)
//                                                                           → logits_loss
//   8. everything else (forward activations, activation gradients)          → activations
// The frame of a group is the innermost Python frame outside torch/ and the Python standard
// library ("file:line name"), falling back to the innermost frame; "<before recording>" and
// "<no Python frame>" name the others. The groups' bytes sum exactly to peak_bytes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "membudget/budget.hpp"

namespace membudget {

enum class MemoryTerm { parameters, gradients, optimizer_state, activations, logits_loss, other };
inline constexpr std::size_t kMemoryTerms = 6;
const char* to_string(MemoryTerm t) noexcept;

struct AttributeOptions {
  std::optional<ModelSpec> model;  // enables rules 1 (split) and 5, and the predicted column
  Job job;
};

struct AllocationGroup {
  std::string frame;  // "train.py:42 step" or "modeling_llama.py:310 forward"
  bytes_t bytes = 0;
  std::uint64_t count = 0;
  MemoryTerm term = MemoryTerm::activations;
};

struct Attribution {
  std::size_t device = 0;
  bool has_trace = false;
  std::size_t trace_entries = 0;
  bytes_t peak_bytes = 0;
  std::int64_t peak_time_us = 0;  // time of the event that reached the peak (0: before the trace)
  std::int64_t peak_index = -1;   // that event's index (-1: the peak is the state before the trace)
  bytes_t before_recording = 0;   // bytes live when recording started
  bytes_t end_bytes = 0;          // live after the last event
  std::size_t inconsistent_events = 0;
  // Live bytes over the trace (before the first event, then after each), at most kTimelinePoints
  // values, each the highest of the stretch of events it stands for (attribute --plot draws it).
  static constexpr std::size_t kTimelinePoints = 2000;
  std::vector<bytes_t> timeline;
  std::vector<AllocationGroup> groups;  // by bytes, largest first
  std::array<bytes_t, kMemoryTerms> measured{};
  // with a model: bytes live at the predicted peak, by term
  std::optional<std::array<bytes_t, kMemoryTerms>> predicted;
  bytes_t predicted_peak = 0;
  std::string predicted_phase;
};

// Throws Error(parse) for anything that is not a snapshot, Error(io) for an unreadable file.
Attribution attribute_snapshot(std::string pickle_bytes, const std::string& where = "snapshot",
                               const AttributeOptions& options = {});
Attribution attribute_snapshot_file(const std::string& path, const AttributeOptions& options = {});

// Bytes of the prediction's live tensors at its peak, by MemoryTerm (autocast weight copies count
// as activations: in a trace they are allocated by the forward).
std::array<bytes_t, kMemoryTerms> predicted_terms(const Budget& budget_with_explain);

}  // namespace membudget
