// src/model/parallel.hpp: one rank of a data-parallel job, as the simulator sees it (internal).
//
// Job::parallel (job.hpp) says how the job is spread; layout_of() turns it into the strategy that
// runs (DDP, DDP with ZeroRedundancyOptimizer, FSDP2) and the rank predicted, and the functions
// below give the sizes each strategy allocates from the model's one tensor description
// (ModelSpec::layer_tensors / outer_tensors). What each buffer is and when it lives:
// docs/distributed.md.
#pragma once

#include <cstdint>
#include <vector>

#include "membudget/job.hpp"
#include "membudget/spec.hpp"

namespace membudget::detail {

enum class DataStrategy : std::uint8_t { single, ddp, zero1, fsdp };

struct RankLayout {
  DataStrategy strategy = DataStrategy::single;
  std::uint64_t world = 1;      // ranks in the job
  std::uint64_t shard = 1;      // FSDP2: ranks a parameter is sharded over (--fsdp × --cp); ZeRO-1: ranks the state is
  std::uint64_t replicate = 1;  // HSDP: replicas of each shard (FSDP2 all-reduces in place: no memory)
  bool reshard = true;          // FSDP2 reshard_after_forward
  bool offload = false;         // FSDP2 CPUOffloadPolicy: shards, gradients, optimizer state on the host
  bool bucket_view = false;     // DDP gradient_as_bucket_view
  std::uint64_t tensor = 1;     // tensor-parallel ranks (DTensor's plan: docs/distributed.md)
  std::uint64_t expert = 1;     // expert-parallel ranks (transformers' ep_plan: docs/moe.md)
  std::uint64_t pipeline = 1;   // pipeline stages (pipeline.hpp); the rank is the stage
  std::uint64_t rank = 0;       // the global rank predicted
  std::uint64_t shard_rank = 0; // its index in the shard group (FSDP2) or the partition (ZeRO-1)

  // The ranks of the innermost mesh dimension, which share a data-parallel index: tensor- or
  // expert-parallel (the two are not combined).
  std::uint64_t inner() const { return tensor * expert; }
};

// The layout of a validated job; the rank is the job's, else the most loaded (most_loaded_rank; a
// pipeline's stages differ by more than sizes, so predict() finds its most loaded stage itself).
RankLayout layout_of(const ModelSpec& m, const Job& job);

// What needs the model to check: tensor parallelism splits heads, KV heads and the MLP width
// evenly. Error(invalid_job) naming the field and the degree.
void check_layout(const ModelSpec& m, const Job& job);

// One tensor-parallel rank's view of the model (PyTorch's DTensor plan for Llama-family layers:
// q, k, v, gate, up ColwiseParallel, o, down RowwiseParallel; embedding, norms, lm_head
// replicated): the heads, KV heads and MLP width divided by t. Its parameters are the rank's local
// shards, its decoder layer the rank's computation.
// With sequence parallelism (`sp`, torchtitan's plan) the embedding is RowwiseParallel and lm_head
// ColwiseParallel as well: both sharded on the vocabulary (vocab_size / t), and a tied model's two
// become separate shards (parallelize_module replaces each module's parameter on its own).
// With the vocabulary-parallel loss but no sequence parallelism (`loss_parallel`), lm_head alone is
// ColwiseParallel(output_layouts=Shard(-1)): a shard of V / t rows of its own (lm_head_rows; a tied
// model's two become separate tensors), the embedding replicated whole.
ModelSpec tp_local_spec(const ModelSpec& m, std::uint64_t t, bool sp = false, bool loss_parallel = false);
// One rank's view of the model under the job's layout: its tensor-parallel shares
// (tp_local_spec) and, under expert parallelism (--ep N), its experts / N of each MoE layer's
// packed experts (MixtureOfExperts::expert_ranks; the router still scores every expert).
inline ModelSpec rank_spec(const ModelSpec& m, const Parallelism& p) {
  ModelSpec local = tp_local_spec(m, p.tensor, p.sequence_parallel, p.loss_parallel);
  local.moe.expert_ranks = p.expert;
  return local;
}

// Whether the --tp plan makes a parameter a shard (a DTensor of 1/t of it): the decoder layers'
// projections; with sequence parallelism the embedding and lm_head too, with the vocabulary-parallel
// loss lm_head.
bool tp_sharded(const ParamTensor& t, const Parallelism& p);
// Whether --ep makes a parameter a shard (a DTensor of experts / N of the packed experts): the
// packed routed experts (grouped_gemm in the model's base_model_ep_plan).
inline bool ep_sharded(const ParamTensor& t, const Parallelism& p) {
  return p.expert > 1 && (t.module == Module::experts_gate_up || t.module == Module::experts_down);
}
// Tensor parallelism without sequence parallelism, FSDP2 or a pipeline, and expert parallelism
// without FSDP2, leave some parameters plain beside the DTensors: torch.optim takes one optimizer per kind (one
// over both fails, "got mixed torch.Tensor and DTensor"; fused AdamW refuses them too), the
// DTensors' stepped first (tools/torch_profile_dist.py, as measured). Each makes its state and its
// foreach temporaries for its own parameters.
inline bool optimizer_per_tensor_kind(const Parallelism& p) {
  return (p.tensor > 1 && !p.sequence_parallel && p.fsdp <= 1 && p.pipeline <= 1) || (p.expert > 1 && p.fsdp <= 1);
}
inline bool dtensor_parameter(const ParamTensor& t, const Parallelism& p) { return tp_sharded(t, p) || ep_sharded(t, p); }

// The tokens of a sequence one rank runs: all of them, or its share under context parallelism.
inline std::uint64_t rank_seq(const Job& job) { return job.seq / job.parallel.context; }

// Every parameter tensor of the model once, in module order: the embedding, layer 0 … L−1, the final
// norm, an untied lm_head (a tied lm_head is the embedding).
std::vector<ParamTensor> model_tensors(const ModelSpec& m);
// The same tensors in model.parameters() order, as transformers registers each decoder layer's
// modules: the attention (Phi-3's o_proj before its qkv_proj), the MLP or MoE block (its router and
// routed experts in the order the block registers them, MixtureOfExperts::router_first, then its
// shared expert), then the layer's norms. A for-loop optimizer steps them
// in this order (optimizer_loop.hpp). (model_tensors keeps the data-flow order within a layer.)
std::vector<ParamTensor> registered_tensors(const ModelSpec& m);
// Decoder layer il's tensors in that order.
std::vector<ParamTensor> registered_layer_tensors(const ModelSpec& m, std::uint64_t il);

// FSDP2 chunks each parameter on dim 0 with torch.chunk: every rank stores ⌈dim0 / S⌉ rows
// (padded; _fsdp_param.py, _init_sharded_param), and rank r's real rows are those of its chunk.
std::uint64_t dim0_rows(const ParamTensor& t);
std::uint64_t fsdp_padded_shard(const ParamTensor& t, std::uint64_t shard);  // elements, every rank
std::uint64_t fsdp_local_shard(const ParamTensor& t, std::uint64_t shard, std::uint64_t shard_rank);

// ZeroRedundancyOptimizer._partition_parameters: parameters sorted by numel, largest first, each to
// the rank whose partition holds the fewest elements so far (the lowest such rank). Per rank: the
// elements it owns and its largest tensor.
struct Partition {
  std::uint64_t elements = 0, largest = 0;
  std::vector<std::uint64_t> owned;  // the elements of each tensor it owns
};
std::vector<Partition> zero1_partition(const ModelSpec& m, std::uint64_t ranks);
// The partition above, tensor by tensor, for these tensors (their elements, in model.parameters()
// order): the order it takes them in, largest first (which is also the order a rank's local
// optimizer holds its own), and the rank that owns each.
struct Zero1Assignment {
  std::vector<std::size_t> largest_first;  // indices into the tensors
  std::vector<std::uint64_t> owner;        // by tensor
};
Zero1Assignment zero1_assign(const std::vector<std::uint64_t>& elements, std::uint64_t ranks);

// DDP's gradient buckets in elements. Step 0: one bucket per dtype holding every parameter (the
// reducer's first iteration, bucket_cap [sys.maxsize]); rebuilt at the second forward in the order
// gradients became ready (the reverse of the forward's), closing a bucket once it reaches 1 MiB
// (the first) or bucket_cap_mb 25 (the rest) of `elem_bytes`-byte gradients.
std::vector<std::uint64_t> ddp_buckets(const std::vector<ParamTensor>& params, std::uint64_t elem_bytes, bool rebuilt);
inline std::vector<std::uint64_t> ddp_buckets(const ModelSpec& m, std::uint64_t elem_bytes, bool rebuilt) {
  return ddp_buckets(model_tensors(m), elem_bytes, rebuilt);
}

// The job's ranks grouped by what they hold (equal memory within a group), each group's ranks in
// order, the groups by their first rank: one group for DDP and for evenly sharded FSDP2; ZeRO-1's
// partition and FSDP2's last chunks make more. Error(unsupported) past 65,536 ranks (too many to list).
std::vector<std::vector<std::uint64_t>> distinct_ranks(const ModelSpec& m, const Job& job);

}  // namespace membudget::detail
