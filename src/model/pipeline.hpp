// src/model/pipeline.hpp: what one stage of a torch.distributed.pipelining job runs (internal).
//
// `--pp N` splits the decoder layers over N stages (rank r is stage r); each step runs
// `--microbatches M` micro-batches of `--batch` sequences through every stage under a schedule.
// The stage's parameters, its layers and the order of its forward and backward actions come from
// here; what each action allocates is the training walk's (inventory_torch.cpp, TrainPass::
// pipeline_schedule). docs/distributed.md says which torch 2.11 code each piece models.
#pragma once

#include <cstdint>
#include <vector>

#include "membudget/job.hpp"
#include "membudget/spec.hpp"

namespace membudget::detail {

struct PipelineStage {
  std::uint64_t stages = 1, stage = 0, microbatches = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  std::uint64_t first_layer = 0, layers = 0;  // decoder layers [first_layer, first_layer + layers)
  bool first() const { return stage == 0; }
  bool last() const { return stage + 1 == stages; }
};

// Decoder layers per stage: --pp-layers, else an even split with the first L mod N stages taking
// one more. Error(invalid_job) when the counts do not add up to the model's layers or a stage
// would get none.
std::vector<std::uint64_t> stage_layer_counts(const ModelSpec& m, const Parallelism& p);
// Stage `stage` of a validated pipeline job.
PipelineStage pipeline_stage(const ModelSpec& m, const Job& job, std::uint64_t stage);

// The parameter tensors the stage holds, in module order: the embedding (first stage), its
// decoder layers, the final norm and lm_head (last stage; a tied model's last stage holds lm_head
// as a tensor of its own, the embedding's shape).
std::vector<ParamTensor> stage_tensors(const ModelSpec& m, const PipelineStage& s);

// What the stage does, in order: a microbatch's forward or its backward.
struct PipelineAction {
  bool forward;
  std::uint64_t microbatch;
};
// ScheduleGPipe: F0 … F(M−1), then B0 … B(M−1). Schedule1F1B (schedules.py, _step_microbatches): a
// warm-up of min(M, N − stage) forwards, then one backward and one forward alternately while
// forwards remain, then the remaining backwards.
std::vector<PipelineAction> schedule_actions(const PipelineStage& s);

// The pipeline layout's checks that need the model (check_layout calls it): the layer split, and
// the model features the stage module does not reproduce (refused by name).
void check_pipeline(const ModelSpec& m, const Job& job);

}  // namespace membudget::detail
