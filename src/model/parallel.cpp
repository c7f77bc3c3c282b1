// One rank of a data-parallel job: the layout and the sizes each strategy allocates (parallel.hpp).
#include "parallel.hpp"
#include "pipeline.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "membudget/bytes.hpp"

namespace membudget::detail {

namespace {
// transformers 5.17's expert parallelism on the models it was measured on (docs/moe.md): the
// routers whose outputs its ep_router masks (the softmax top-k routers of Mixtral, Qwen2-MoE,
// Qwen3-MoE and OLMoE, and DeepSeek-V2's and V3's), and the grouped_mm and batched_mm experts,
// which skip the sentinel pairs it makes.
void check_expert_parallel(const ModelSpec& m, const Job& job) {
  const std::uint64_t ep = job.parallel.expert;
  if (ep <= 1) return;
  const std::string flag = "--ep " + std::to_string(ep) + ": " + m.display_name();
  if (!m.moe.enabled()) throw Error(ErrorKind::invalid_job, flag + " has no mixture of experts to shard");
  if (m.moe.experts % ep)
    throw Error(ErrorKind::invalid_job, flag + ": num_experts " + std::to_string(m.moe.experts) + " is not divisible by " +
                                            std::to_string(ep) + " (each rank holds an equal share of the experts)");
  if (job.experts == ExpertsImpl::eager)
    throw Error(ErrorKind::unsupported, flag + ": --experts eager under expert parallelism is not modelled (grouped_mm and "
                                               "batched_mm are)");
}
}  // namespace

void check_layout(const ModelSpec& m, const Job& job) {
  check_pipeline(m, job);
  if (job.parallel.context > 1) {
    // ring attention takes SDPA's causal path: no mask, the attention transformers' Llama-style
    // layers run (measured on Llama and Qwen2)
    const std::string model = m.display_name();
    auto refuse = [&](const std::string& what) {
      throw Error(ErrorKind::unsupported, "--cp: " + model + ": " + what + " is not modelled with context parallelism");
    };
    if (m.sliding.enabled()) refuse("sliding-window attention (a mask)");
    if (m.mla.enabled()) refuse("multi-head latent attention");
    if (m.moe.enabled()) refuse("a mixture of experts");
    if (m.quirks.fused_qkv || m.quirks.embedding_scale || m.final_logit_softcap > 0 || m.attn_logit_softcap > 0)
      refuse("Phi-3's fused projections and Gemma's scales and soft-capping");
  }
  check_expert_parallel(m, job);
  const std::uint64_t t = job.parallel.tensor;
  if (t <= 1) return;
  auto even = [&](const char* field, std::uint64_t n) {
    if (n % t)
      throw Error(ErrorKind::invalid_job, "--tp " + std::to_string(t) + ": " + field + " " + std::to_string(n) +
                                              " is not divisible by " + std::to_string(t) +
                                              " (each rank takes an equal share)");
  };
  even("num_attention_heads", m.num_heads);
  even("num_key_value_heads", m.num_kv_heads);
  even("intermediate_size", m.intermediate_size);
  if (m.quirks.fused_qkv || m.quirks.fused_gate_up)
    throw Error(ErrorKind::unsupported, "--tp: fused projections (Phi-3's qkv_proj, gate_up_proj) are not modelled with tensor parallelism");
  if (m.mla.enabled()) throw Error(ErrorKind::unsupported, "--tp: multi-head latent attention is not modelled with tensor parallelism");
  if (m.moe.enabled())
    throw Error(ErrorKind::unsupported, "--tp: a mixture of experts is not modelled with tensor parallelism (expert "
                                        "parallelism, --ep, is not modelled yet either)");
  if (job.parallel.loss_parallel && !job.parallel.sequence_parallel) even("vocab_size", m.vocab_size);  // lm_head's shards
  if (!job.parallel.sequence_parallel) return;
  // Sequence parallelism shards the residual stream along the sequence and the embedding and
  // lm_head along the vocabulary: both evenly here.
  if (job.seq % t)
    throw Error(ErrorKind::invalid_job, "--sp: --seq " + std::to_string(job.seq) + " is not divisible by --tp " + std::to_string(t) +
                                            " (each rank keeps an equal share of the sequence)");
  even("vocab_size", m.vocab_size);
  if (m.quirks.embedding_scale || m.final_logit_softcap > 0 || m.sliding.enabled() || m.norms_per_layer >= 4)
    throw Error(ErrorKind::unsupported, "--sp: " + m.display_name() +
                                            ": Gemma's norms and scales and sliding-window attention are not modelled "
                                            "with sequence parallelism (Llama-style layers are)");
}

ModelSpec tp_local_spec(const ModelSpec& m, std::uint64_t t, bool sp, bool loss_parallel) {
  ModelSpec local = m;
  if (t <= 1) return local;
  local.num_heads /= t;
  local.num_kv_heads /= t;
  local.intermediate_size /= t;
  if (sp) {
    local.vocab_size /= t;
    local.untied_by_plan = m.tied_embeddings;
    local.tied_embeddings = false;
  } else if (loss_parallel) {  // lm_head alone is ColwiseParallel: its own shard, the embedding whole
    local.lm_head_rows = m.vocab_size / t;
    local.untied_by_plan = m.tied_embeddings;
    local.tied_embeddings = false;
  }
  // head_dim stays: q_dim() = heads · head_dim shrinks with the heads
  return local;
}

bool tp_sharded(const ParamTensor& t, const Parallelism& p) {
  if (p.tensor <= 1) return false;
  switch (t.module) {
    case Module::embedding: return p.sequence_parallel;
    case Module::lm_head: return p.sequence_parallel || p.loss_parallel;
    default: return t.projection();
  }
}

namespace {
// The embedding, each decoder layer's tensors as `layer_of` lists them, the final norm, an untied lm_head.
template <class LayerOf>
std::vector<ParamTensor> whole_model(const ModelSpec& m, LayerOf&& layer_of) {
  std::vector<ParamTensor> out;
  const auto outer = m.outer_tensors();
  out.push_back(outer.front());  // the embedding
  for (std::uint64_t il = 0; il < m.num_layers; ++il) {
    const std::vector<ParamTensor> layer = layer_of(il);
    out.insert(out.end(), layer.begin(), layer.end());
  }
  out.insert(out.end(), outer.begin() + 1, outer.end());
  return out;
}
}  // namespace

std::vector<ParamTensor> model_tensors(const ModelSpec& m) {
  return whole_model(m, [&](std::uint64_t il) { return m.layer_tensors(il); });
}

std::vector<ParamTensor> registered_layer_tensors(const ModelSpec& m, std::uint64_t il) {
  auto rank = [&](const ParamTensor& t) {
    switch (t.module) {
      case Module::attn_norm:
      case Module::mlp_norm:
      case Module::attn_out_norm:
      case Module::mlp_out_norm: return 5;  // the decoder layer's own norms, after its blocks
      case Module::o: return m.quirks.fused_qkv ? 0 : 1;
      case Module::gate: case Module::up: case Module::gate_up: case Module::down: case Module::fc1: case Module::fc2: return 2;
      // the MoE block: its router and routed experts in the order it registers them, then its shared expert
      case Module::router: return m.moe.router_first ? 2 : 3;
      case Module::experts_gate_up: case Module::experts_down: return m.moe.router_first ? 3 : 2;
      case Module::shared_gate: case Module::shared_up: case Module::shared_down: case Module::shared_expert_gate: return 4;
      default: return 1;  // the attention's
    }
  };
  std::vector<ParamTensor> layer = m.layer_tensors(il);
  std::stable_sort(layer.begin(), layer.end(), [&](const ParamTensor& a, const ParamTensor& b) { return rank(a) < rank(b); });
  return layer;
}

std::vector<ParamTensor> registered_tensors(const ModelSpec& m) {
  return whole_model(m, [&](std::uint64_t il) { return registered_layer_tensors(m, il); });
}

std::uint64_t dim0_rows(const ParamTensor& t) {
  // nn.Embedding's weight is (V, h) — its `in` is the vocabulary; nn.Linear's is (out, in); a
  // vector is its own dim 0; packed experts (E, out, in) have the experts.
  if (t.count > 1) return t.count;
  return t.module == Module::embedding ? t.in : t.out;
}

std::uint64_t fsdp_padded_shard(const ParamTensor& t, std::uint64_t shard) {
  const std::uint64_t rows = dim0_rows(t);
  const std::uint64_t per_row = rows ? t.elements() / rows : 0;
  return checked_mul((rows + shard - 1) / shard, per_row, "FSDP2 shard size");
}

std::uint64_t fsdp_local_shard(const ParamTensor& t, std::uint64_t shard, std::uint64_t shard_rank) {
  const std::uint64_t rows = dim0_rows(t);
  const std::uint64_t chunk = (rows + shard - 1) / shard;
  const std::uint64_t first = std::min(rows, chunk * shard_rank);  // torch.chunk: full chunks, then the rest
  const std::uint64_t mine = std::min(chunk, rows - first);
  return rows ? checked_mul(mine, t.elements() / rows, "FSDP2 shard size") : 0;
}

Zero1Assignment zero1_assign(const std::vector<std::uint64_t>& elements, std::uint64_t ranks) {
  // ZeroRedundancyOptimizer._partition_parameters: largest first (a stable sort), each to the rank
  // with the fewest elements so far (the first of equals)
  Zero1Assignment a;
  a.largest_first.resize(elements.size());
  for (std::size_t i = 0; i < elements.size(); ++i) a.largest_first[i] = i;
  std::stable_sort(a.largest_first.begin(), a.largest_first.end(),
                   [&](std::size_t x, std::size_t y) { return elements[x] > elements[y]; });
  std::vector<std::uint64_t> held(static_cast<std::size_t>(ranks), 0);
  a.owner.assign(elements.size(), 0);
  for (std::size_t i : a.largest_first) {
    const auto r = static_cast<std::size_t>(std::min_element(held.begin(), held.end()) - held.begin());
    held[r] += elements[i];
    a.owner[i] = r;
  }
  return a;
}

std::vector<Partition> zero1_partition(const ModelSpec& m, std::uint64_t ranks) {
  std::vector<std::uint64_t> sizes;
  for (const ParamTensor& t : model_tensors(m)) sizes.push_back(t.elements());
  const Zero1Assignment a = zero1_assign(sizes, ranks);
  std::vector<Partition> parts(static_cast<std::size_t>(ranks));
  for (std::size_t i : a.largest_first) {  // each rank's tensors largest first, as assigned
    Partition& p = parts[a.owner[i]];
    p.elements += sizes[i];
    p.largest = std::max(p.largest, sizes[i]);
    p.owned.push_back(sizes[i]);
  }
  return parts;
}

std::vector<std::uint64_t> ddp_buckets(const std::vector<ParamTensor>& tensors, std::uint64_t elem_bytes, bool rebuilt) {
  std::vector<std::uint64_t> out;
  if (!rebuilt) {
    std::uint64_t all = 0;
    for (const ParamTensor& t : tensors) all = checked_add(all, t.elements(), "DDP bucket");
    out.push_back(all);
    return out;
  }
  // torch/nn/parallel/distributed.py: _DEFAULT_FIRST_BUCKET_BYTES (1 MiB), then bucket_cap_mb 25;
  // the reducer closes a bucket once its size reaches the cap (compute_bucket_assignment_by_size).
  std::uint64_t cap = 1 * MiB, cur = 0;
  for (auto it = tensors.rbegin(); it != tensors.rend(); ++it) {
    cur = checked_add(cur, it->elements(), "DDP bucket");
    if (checked_mul(cur, elem_bytes, "DDP bucket") >= cap) {
      out.push_back(cur);
      cur = 0;
      cap = 25 * MiB;
    }
  }
  if (cur) out.push_back(cur);
  return out;
}

namespace {
// Which of S shards look alike: those with the same local chunk sizes of `tensors` (and, for
// ZeRO-1, the same owned tensors). Each shard's group, numbered from 0 in order of first shard.
std::vector<std::size_t> shard_groups(const std::vector<ParamTensor>& tensors, std::uint64_t S,
                                      const std::vector<Partition>* zero1) {
  std::map<std::vector<std::uint64_t>, std::size_t> group_of_signature;
  std::vector<std::size_t> group_of_shard(static_cast<std::size_t>(S));
  std::vector<std::uint64_t> signature;
  for (std::uint64_t s = 0; s < S; ++s) {
    signature.clear();
    if (zero1) signature = (*zero1)[s].owned;
    for (const ParamTensor& t : tensors) signature.push_back(fsdp_local_shard(t, S, s));
    group_of_shard[s] = group_of_signature.try_emplace(signature, group_of_signature.size()).first->second;
  }
  return group_of_shard;
}
std::size_t group_count(const std::vector<std::size_t>& group_of_shard) {
  return group_of_shard.empty() ? 0 : *std::max_element(group_of_shard.begin(), group_of_shard.end()) + 1;
}
}  // namespace

std::vector<std::vector<std::uint64_t>> distinct_ranks(const ModelSpec& m, const Job& job) {
  const RankLayout l = layout_of(m, job);
  if (l.world > 65536)
    throw Error(ErrorKind::unsupported, "ranks: listing the memory of " + std::to_string(l.world) +
                                            " ranks is not supported (at most 65,536); give --rank");
  std::vector<std::vector<std::uint64_t>> groups;
  if (l.pipeline > 1) {
    // Every stage holds other layers; with FSDP2 within the stages, the stage's shards group by
    // their local chunk sizes of the stage's tensors (of each rank's TP share); DDP's replicas and
    // a shard's tensor-parallel ranks hold alike (pipeline_stage: the ("pp", "dp", "tp") mesh).
    const std::uint64_t per_stage = ranks_per_stage(job.parallel), T = l.tensor;
    const ModelSpec local = rank_spec(m, job.parallel);
    for (std::uint64_t stage = 0; stage < l.pipeline; ++stage) {
      const PipelineStage ps = pipeline_stage(local, job, stage * per_stage);
      const std::vector<std::size_t> group_of_shard = shard_groups(stage_tensors(local, ps), job.parallel.fsdp, nullptr);
      const std::size_t first = groups.size();
      groups.resize(first + group_count(group_of_shard));
      for (std::uint64_t k = 0; k < per_stage; ++k)
        groups[first + group_of_shard[job.parallel.fsdp > 1 ? static_cast<std::size_t>(k / T) : 0]].push_back(stage * per_stage + k);
    }
    return groups;
  }
  // What tells one shard rank from another: ZeRO-1's owned tensor sizes, FSDP2's local chunk sizes
  // (computed rank by rank; only the distinct ones are kept).
  std::vector<Partition> parts;
  if (l.strategy == DataStrategy::zero1) parts = zero1_partition(m, l.shard);
  // (with tensor parallelism FSDP2 shards each rank's TP share)
  const auto tensors = l.strategy == DataStrategy::fsdp
                           ? model_tensors(rank_spec(m, job.parallel))
                           : std::vector<ParamTensor>{};
  const std::vector<std::size_t> group_of_shard =
      shard_groups(tensors, l.shard, l.strategy == DataStrategy::zero1 ? &parts : nullptr);
  groups.resize(group_count(group_of_shard));
  for (std::uint64_t r = 0; r < l.world; ++r)
    groups[group_of_shard[l.strategy == DataStrategy::ddp ? 0 : static_cast<std::size_t>((r / l.inner()) % l.shard)]].push_back(r);
  return groups;
}

RankLayout layout_of(const ModelSpec& m, const Job& job) {
  const Parallelism& p = job.parallel;
  RankLayout l;
  l.world = p.world();
  l.reshard = p.reshard_after_forward;
  l.offload = p.fsdp_offload;
  l.bucket_view = p.ddp_bucket_view;
  l.tensor = p.tensor;
  l.expert = p.expert;
  l.pipeline = p.pipeline;
  if (l.world == 1) return l;
  // every tensor-parallel (or expert-parallel) rank holds the same shares
  if (((p.tensor > 1 || p.expert > 1) && p.fsdp <= 1) || p.pipeline > 1) {
    l.rank = p.rank.value_or(0);
    if (p.pipeline > 1 && p.fsdp > 1) {  // FSDP2 within each stage: the ("pp", "dp", "tp") mesh
      l.strategy = DataStrategy::fsdp;
      l.shard = p.fsdp;
      l.shard_rank = (l.rank / l.inner()) % l.shard;
    } else if (p.pipeline > 1 && p.data > 1) {  // DDP around each stage module
      l.strategy = DataStrategy::ddp;
    }
    return l;
  }
  if (p.fsdp > 1 || p.context > 1) {
    l.strategy = DataStrategy::fsdp;
    l.shard = p.fsdp * p.context;  // context parallelism: torchtitan's dp_shard_cp mesh
    l.replicate = p.data;  // HSDP when > 1
  } else if (p.zero_stage >= 2) {
    l.strategy = DataStrategy::fsdp;  // PyTorch's ZeRO-2 / ZeRO-3: FSDP2 over the data-parallel ranks
    l.shard = p.data;
    l.reshard = p.zero_stage == 3;
  } else if (p.zero_stage == 1) {
    l.strategy = DataStrategy::zero1;
    l.shard = p.data;
  } else {
    l.strategy = DataStrategy::ddp;
  }
  if (p.rank) {
    l.rank = *p.rank;
  } else if (l.strategy == DataStrategy::zero1) {
    // the most loaded rank: the most optimizer state (then the largest tensor), the lowest index
    const auto parts = zero1_partition(m, l.shard);
    std::size_t best = 0;
    for (std::size_t r = 1; r < parts.size(); ++r)
      if (parts[r].elements > parts[best].elements ||
          (parts[r].elements == parts[best].elements && parts[r].largest > parts[best].largest))
        best = r;
    l.rank = best;
  }  // FSDP2: rank 0 holds full chunks of every parameter, the most
  // HSDP's mesh is (replicate, shard): rank r is shard r mod S of replica r / S. FSDP2 with tensor
  // (expert) parallelism: the mesh is (dp, tp) ((fsdp, ep)), rank r shards index r / t of the dp dimension.
  l.shard_rank = l.strategy == DataStrategy::ddp ? 0 : (l.rank / l.inner()) % l.shard;
  return l;
}

}  // namespace membudget::detail
