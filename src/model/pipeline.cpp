#include "pipeline.hpp"

#include <algorithm>
#include <string>

#include "membudget/error.hpp"
#include "parallel.hpp"

namespace membudget::detail {

std::vector<std::uint64_t> stage_layer_counts(const ModelSpec& m, const Parallelism& p) {
  const std::uint64_t n = p.pipeline * p.virtual_stages, L = m.num_layers;  // every stage module (validated: ≤ 2^40)
  if (!p.pp_layers.empty()) {
    std::uint64_t sum = 0;
    for (std::uint64_t c : p.pp_layers) sum += c;  // each ≤ 2^20, at most 2^20 of them (Job::validate)
    if (sum != L)
      throw Error(ErrorKind::invalid_job, "--pp-layers: the stages' layer counts add up to " + std::to_string(sum) + ", but " +
                                              m.display_name() + " has " +
                                              std::to_string(L) + " decoder layers");
    return p.pp_layers;
  }
  if (L < n)  // (named as given: the stage modules are --pp × --virtual-stages)
    throw Error(ErrorKind::invalid_job,
                "--pp " + std::to_string(p.pipeline) +
                    (p.virtual_stages > 1 ? " × --virtual-stages " + std::to_string(p.virtual_stages) : std::string()) +
                    ": " + m.display_name() + " has only " + std::to_string(L) + " decoder layers, fewer than the " +
                    std::to_string(n) + (p.virtual_stages > 1 ? " stage modules" : " stages"));
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(n), L / n);
  for (std::uint64_t s = 0; s < L % n; ++s) ++counts[static_cast<std::size_t>(s)];
  return counts;
}

std::uint64_t most_layers_of_a_stage_rank(const ModelSpec& m, const Parallelism& p) {
  if (p.pipeline < 2 || p.virtual_stages == 0) return 0;
  const unsigned __int128 modules = static_cast<unsigned __int128>(p.pipeline) * p.virtual_stages;
  if (p.pp_layers.empty()) return static_cast<std::uint64_t>((m.num_layers + p.pipeline - 1) / p.pipeline);
  if (p.pp_layers.size() != modules) return 0;
  std::uint64_t most = 0;
  for (std::uint64_t r = 0; r < p.pipeline; ++r) {
    std::uint64_t layers = 0;
    for (std::size_t i = static_cast<std::size_t>(r); i < p.pp_layers.size(); i += static_cast<std::size_t>(p.pipeline))
      layers += std::min<std::uint64_t>(p.pp_layers[i], 1ull << 20);  // (bounded by Job::validate)
    most = std::max(most, layers);
  }
  return most;
}

std::uint64_t pipeline_layer_passes(const ModelSpec& m, const Parallelism& p) {
  const std::uint64_t layers = most_layers_of_a_stage_rank(m, p);
  const std::uint64_t microbatches = p.microbatches ? p.microbatches : p.pipeline;
  const unsigned __int128 passes = static_cast<unsigned __int128>(layers) * microbatches;
  return passes > ~std::uint64_t{0} ? ~std::uint64_t{0} : static_cast<std::uint64_t>(passes);
}

PipelineStage pipeline_stage(const ModelSpec& m, const Job& job, std::uint64_t rank) {
  const Parallelism& p = job.parallel;
  const std::uint64_t stage = rank / ranks_per_stage(p);
  const std::vector<std::uint64_t> counts = stage_layer_counts(m, p);
  PipelineStage s;
  s.stages = p.pipeline;
  s.stage = stage;
  s.microbatches = p.microbatches ? p.microbatches : p.pipeline;
  s.schedule = p.pp_schedule;
  std::vector<std::uint64_t> first(counts.size(), 0);  // each stage's first layer
  for (std::size_t i = 1; i < counts.size(); ++i) first[i] = first[i - 1] + counts[i - 1];
  for (std::uint64_t index = stage; index < counts.size(); index += p.pipeline) {  // stages r, r + N, …
    s.chunks.push_back({index, first[static_cast<std::size_t>(index)], counts[static_cast<std::size_t>(index)]});
    s.layers += counts[static_cast<std::size_t>(index)];
  }
  return s;
}

namespace {
// One stage module's tensors, each decoder layer's as `layer` gives them.
template <class LayerTensors>
std::vector<ParamTensor> chunk_tensors(const ModelSpec& m, const PipelineStage& s, std::size_t chunk, LayerTensors layer) {
  std::vector<ParamTensor> out;
  const std::vector<ParamTensor> outer = m.outer_tensors();
  const PipelineStage::Chunk& c = s.chunks[chunk];
  if (s.chunk_first(chunk)) out.push_back(outer.front());
  for (std::uint64_t il = c.first_layer; il < c.first_layer + c.layers; ++il)
    for (const ParamTensor& t : layer(il)) out.push_back(t);
  if (s.chunk_last(chunk)) {
    for (const ParamTensor& t : outer)
      if (t.module != Module::embedding) out.push_back(t);
    if (m.tied_embeddings) out.push_back(outer.front());
  }
  return out;
}

// Every stage module's tensors of the rank, chunk after chunk, each decoder layer's as `layer` gives them.
template <class LayerTensors>
std::vector<ParamTensor> all_chunk_tensors(const ModelSpec& m, const PipelineStage& s, LayerTensors layer) {
  std::vector<ParamTensor> out;
  for (std::size_t c = 0; c < s.chunks.size(); ++c)
    for (const ParamTensor& t : chunk_tensors(m, s, c, layer)) out.push_back(t);
  return out;
}
}  // namespace

std::vector<ParamTensor> stage_tensors(const ModelSpec& m, const PipelineStage& s, std::size_t chunk) {
  return chunk_tensors(m, s, chunk, [&](std::uint64_t il) { return m.layer_tensors(static_cast<std::size_t>(il)); });
}

std::vector<ParamTensor> stage_tensors(const ModelSpec& m, const PipelineStage& s) {
  return all_chunk_tensors(m, s, [&](std::uint64_t il) { return m.layer_tensors(static_cast<std::size_t>(il)); });
}

std::vector<ParamTensor> registered_stage_tensors(const ModelSpec& m, const PipelineStage& s) {
  return all_chunk_tensors(m, s, [&](std::uint64_t il) { return registered_layer_tensors(m, il); });
}

namespace {
std::vector<PipelineAction> interleaved_actions(const PipelineStage& s) {
  const std::uint64_t M = s.microbatches, N = s.stages, V = s.chunks.size();
  const std::uint64_t rounds = std::max<std::uint64_t>(1, M / N), per_round = M / rounds;
  const std::uint64_t ops = M * V;
  const std::uint64_t warmup = std::min(ops, (V - 1) * per_round + 2 * (N - 1 - s.stage));
  std::vector<std::uint64_t> next_forward(static_cast<std::size_t>(V), 0), next_backward(static_cast<std::size_t>(V), 0);
  std::vector<PipelineAction> out;
  out.reserve(static_cast<std::size_t>(2 * ops));
  auto forward = [&](std::uint64_t op) {
    const std::size_t c = static_cast<std::size_t>((op / per_round) % V);
    out.push_back({true, next_forward[c]++, c});
  };
  auto backward = [&](std::uint64_t op) {
    const std::size_t c = static_cast<std::size_t>(V - 1 - ((op - warmup) / per_round) % V);
    out.push_back({false, next_backward[c]++, c});
  };
  for (std::uint64_t op = 0; op < warmup; ++op) forward(op);
  for (std::uint64_t op = warmup; op < ops; ++op) {
    forward(op);
    backward(op);
  }
  for (std::uint64_t op = ops; op < ops + warmup; ++op) backward(op);
  return out;
}
}  // namespace

std::vector<PipelineAction> schedule_actions(const PipelineStage& s) {
  if (s.schedule == PipelineSchedule::interleaved) return interleaved_actions(s);
  const std::uint64_t M = s.microbatches;
  std::vector<PipelineAction> out;
  out.reserve(static_cast<std::size_t>(2 * M));
  if (s.schedule == PipelineSchedule::gpipe) {
    for (std::uint64_t i = 0; i < M; ++i) out.push_back({true, i});
    for (std::uint64_t i = 0; i < M; ++i) out.push_back({false, i});
    return out;
  }
  const std::uint64_t warmup = std::min(M, s.stages - s.stage);
  std::uint64_t f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back({true, f});
  while (true) {
    out.push_back({false, b++});
    if (f == M) break;
    out.push_back({true, f++});
  }
  while (b < M) out.push_back({false, b++});
  return out;
}

std::uint64_t most_layers_in_flight(const PipelineStage& s) {
  std::uint64_t now = 0, most = 0;
  for (const PipelineAction& a : schedule_actions(s)) {
    const std::uint64_t layers = s.chunks[a.chunk].layers;
    now = a.forward ? now + layers : now - layers;
    most = std::max(most, now);
  }
  return most;
}

void check_pipeline(const ModelSpec& m, const Job& job) {
  if (job.parallel.pipeline <= 1) return;
  stage_layer_counts(m, job.parallel);  // throws on a bad split
  const std::string model = m.display_name();
  auto refuse = [&](const std::string& what) {
    throw Error(ErrorKind::unsupported, "--pp: " + model + ": " + what + " is not modelled with pipeline parallelism");
  };
  // The stage module runs the decoder layers on the rotary module's position embeddings with no
  // attention mask and no KV cache (torchtitan's models): features outside that are refused.
  if (m.sliding.enabled()) refuse("sliding-window attention (the stage passes no attention mask)");
  if (m.quirks.embedding_scale || m.final_logit_softcap > 0) refuse("Gemma's embedding scale and logit soft-capping");
  if (m.mla.enabled()) refuse("multi-head latent attention");
  if (m.moe.enabled() && (job.router_aux_loss || m.moe.output_router_logits))
    refuse("the router's auxiliary loss (every stage's router logits would go to the last stage)");
}

}  // namespace membudget::detail
