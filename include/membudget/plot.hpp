// membudget/plot.hpp: the predicted step as a picture (predict --plot FILE.svg).
#pragma once

#include <optional>
#include <string>

#include "membudget/budget.hpp"

namespace membudget {

// The steady-state training step (or the serving step) of `budget` (predict()'s result for `model` and `budget.job`) as an
// SVG timeline: the simulated allocation stream replayed event by event, live bytes stacked by role
// (parameters, gradients, optimizer state, saved activations, temporaries, logits and loss,
// workspace, and, where the reserved replay runs, the allocator's slack above the tensors: the
// stack's top is then the replay's memory_allocated(), the phases' own figure), each phase's start marked and its peak labelled with the budget's own figure
// (`data-phase` / `data-bytes` attributes), the peak's largest tensors named, the reserved memory
// event by event (when the budget has it: the stream replayed through the caching allocator with
// `allocator_conf`, a PYTORCH_CUDA_ALLOC_CONF), and, with a card, its capacity and the usable limit. A rank of a parallel job is drawn as predicted (a pipeline stage's phases
// recur). A serving job (--mode infer) is drawn over its prefill and decode step. The harness
// profile is Error(unsupported).
std::string render_timeline_svg(const ModelSpec& model, const Budget& budget, const std::optional<Fit>& fit,
                                const std::string& allocator_conf = "");

// A measured step beside its prediction (attribute SNAPSHOT --model … --plot FILE.svg): the
// snapshot's live bytes over its trace and the predicted steady step's over its allocation stream,
// each drawn over its own events from start to end (a trace may cover more or less than one
// step: the axis says so), their peaks marked (`data-bytes`: the measured peak_bytes and the
// predicted stream's highest moment), and two stacked bars of the bytes live at each peak by budget
// term (`data-term` / `data-bytes`: Attribution::measured and ::predicted).
struct Attribution;
std::string render_attribution_svg(const ModelSpec& model, const Budget& predicted, const Attribution& measured);

// The predicted step as an allocator trace (predict --snapshot FILE.pickle): step 0 and a steady
// step replayed through the c10-policy caching allocator with its history recorded, written as a
// torch.cuda.memory._dump_snapshot pickle that pytorch.org/memory_viz opens beside a measured one.
// Every block's frame is {"filename": "membudget/harness", "line": 0, "name": "phase:tensor (op)"}.
// `allocator_conf` is the job's PYTORCH_CUDA_ALLOC_CONF. Training with --profile torch only.
std::string predicted_snapshot(const ModelSpec& model, const Budget& budget, const std::string& allocator_conf = "");

}  // namespace membudget
