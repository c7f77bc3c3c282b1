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

// One rank of the pipeline. Under GPipe and 1F1B a rank is one stage; under interleaved 1F1B
// (ScheduleInterleaved1F1B, --virtual-stages V) rank r holds the V stage modules r, r + N, …,
// r + (V−1)·N of an N·V-stage pipeline: its `chunks`, in that order.
struct PipelineStage {
  struct Chunk {
    std::uint64_t index = 0;                    // the stage's index in the whole pipeline
    std::uint64_t first_layer = 0, layers = 0;  // its decoder layers [first_layer, first_layer + layers)
  };
  std::uint64_t stages = 1, stage = 0, microbatches = 1;  // ranks, this rank, microbatches per step
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  std::vector<Chunk> chunks;  // one, or V under interleaved 1F1B
  std::uint64_t layers = 0;   // decoder layers over all chunks
  std::uint64_t total_stages() const { return stages * chunks.size(); }
  bool chunk_first(std::size_t c) const { return chunks[c].index == 0; }                   // holds the embedding
  bool chunk_last(std::size_t c) const { return chunks[c].index + 1 == total_stages(); }  // the final norm, lm_head, loss
  bool first() const { return chunk_first(0); }
  bool last() const { return chunk_last(chunks.size() - 1); }
};

// Decoder layers per stage, over all N·V stages: --pp-layers, else an even split with the first
// stages taking one more. Error(invalid_job) when the counts do not add up to the model's layers or
// a stage would get none.
std::vector<std::uint64_t> stage_layer_counts(const ModelSpec& m, const Parallelism& p);
// The decoder layers the most loaded pipeline rank holds (its stage modules' together), rounded up
// where the layers split unevenly; 0 where the layout is not a pipeline's or is malformed (Job::
// validate refuses it then). Callable before the job is validated.
std::uint64_t most_layers_of_a_stage_rank(const ModelSpec& m, const Parallelism& p);
// Those layers × the microbatches the rank runs: the layer passes its walk simulates (the bound
// limits::kMaxPipelineLayerPasses is on it); 0 outside a pipeline, 2^64 - 1 past 64 bits.
std::uint64_t pipeline_layer_passes(const ModelSpec& m, const Parallelism& p);
// The stage of rank `rank` of a validated pipeline job. The mesh is ("pp", "dp", "tp"), tensor
// parallelism innermost (torchtitan's order): a stage has D·R·T ranks (FSDP2's D shards or DDP's R
// replicas, each T tensor-parallel ranks), and rank r runs stage r / (D·R·T).
PipelineStage pipeline_stage(const ModelSpec& m, const Job& job, std::uint64_t rank);
inline std::uint64_t ranks_per_stage(const Parallelism& p) { return p.fsdp * p.data * p.tensor; }

// The parameter tensors one stage module holds, in module order: the embedding (first stage), its
// decoder layers, the final norm and lm_head (last stage; a tied model's last stage holds lm_head
// as a tensor of its own, the embedding's shape). Each module has its own optimizer under
// interleaved 1F1B (torchtitan's OptimizersContainer: one per model part).
std::vector<ParamTensor> stage_tensors(const ModelSpec& m, const PipelineStage& s, std::size_t chunk);
// Every stage module's tensors of the rank, chunk after chunk (what a wrapper of each holds in all).
std::vector<ParamTensor> stage_tensors(const ModelSpec& m, const PipelineStage& s);
// The same with each layer's tensors in model.parameters() order (registered_layer_tensors), as
// module.parameters() yields them.
std::vector<ParamTensor> registered_stage_tensors(const ModelSpec& m, const PipelineStage& s);

// What the rank does, in order: a microbatch's forward or its backward through one of its chunks.
struct PipelineAction {
  bool forward;
  std::uint64_t microbatch;
  std::size_t chunk = 0;  // index into PipelineStage::chunks
};
// ScheduleGPipe: F0 … F(M−1), then B0 … B(M−1). Schedule1F1B (schedules.py, _step_microbatches): a
// warm-up of min(M, N − stage) forwards, then one backward and one forward alternately while
// forwards remain, then the remaining backwards. ScheduleInterleaved1F1B (its
// _calculate_single_rank_operations and _get_1f1b_rank_ops): rounds = max(1, M / N) of M / rounds
// microbatches; a warm-up of min(M·V, (V − 1)·M/rounds + 2·(N − 1 − rank)) forwards, then forward
// and backward alternately, then the backwards; op k's forward runs chunk (k / (M/rounds)) mod V
// and its backward chunk V − 1 − ((k − warm-up) / (M/rounds)) mod V, each chunk taking its
// microbatches in order.
std::vector<PipelineAction> schedule_actions(const PipelineStage& s);

// The most decoder layers whose activations the schedule keeps at once: a microbatch's forward
// through a chunk adds the chunk's layers until its backward (the textbook's per-stage figure).
std::uint64_t most_layers_in_flight(const PipelineStage& s);

// The pipeline layout's checks that need the model (check_layout calls it): the layer split, and
// the model features the stage module does not reproduce (refused by name).
void check_pipeline(const ModelSpec& m, const Job& job);

}  // namespace membudget::detail
