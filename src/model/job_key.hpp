// src/model/job_key.hpp: a (model, job) as a fixed array of words, for the per-thread tables of
// plans (step_plan.cpp) and estimates (api.cpp).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "inventory.hpp"
#include "membudget/job.hpp"
#include "membudget/spec.hpp"

namespace membudget::detail {

// A list's word in a key (moe.dense_layers, parallel.pp_layers): 0 for the empty list, else the
// number this thread gave the list when it first saw it. Lists are compared whole, so two lists
// never share a number (a digest of them could: two jobs would share a cached answer). Numbers are
// never given twice: when its table is full the thread forgets the lists, and one seen again gets a
// new number (a cache miss, not another list's answer).
std::uint64_t list_number(const std::vector<std::uint64_t>& list);

// Every field that can change a number (the quirks select Gemma's norms and Phi-3's fused
// projections; the name and the family change nothing once the loader has set the quirks).
constexpr std::size_t kKeyWords = 68;
constexpr std::size_t kBatchWord = 0, kSeqWord = 1;  // where key_of puts job.batch and job.seq
using Key = std::array<std::uint64_t, kKeyWords>;

inline Key key_of(const ModelSpec& m, const Job& j) {
  Key k{};
  std::size_t i = 0;
  auto put = [&](std::uint64_t v) { k.at(i++) = v; };  // at(): a field added past kKeyWords throws
  put(j.batch); put(j.seq);  // words kBatchWord and kSeqWord
  put(m.vocab_size); put(m.hidden_size); put(m.intermediate_size); put(m.num_layers); put(m.num_heads);
  put(m.num_kv_heads); put(m.head_dim); put(m.tied_embeddings); put(static_cast<std::uint64_t>(m.mlp));
  put(static_cast<std::uint64_t>(m.norm)); put(m.bias.qkv | (m.bias.o << 1) | (m.bias.mlp << 2));
  put(m.max_positions); put(m.norms_per_layer); put(m.qk_norm); put(std::bit_cast<std::uint64_t>(m.final_logit_softcap));
  put(std::bit_cast<std::uint64_t>(m.attn_logit_softcap)); put(m.lm_head_rows); put(m.untied_by_plan);
  put(m.sliding.window); put(m.sliding.every_nth); put(m.mla.kv_lora_rank); put(m.mla.qk_rope_head_dim);
  put(m.mla.q_lora_rank); put(m.mla.qk_nope_head_dim); put(m.mla.v_head_dim);
  put(static_cast<std::uint64_t>(j.mode)); put(static_cast<std::uint64_t>(j.precision));
  put(static_cast<std::uint64_t>(j.optimizer)); put(static_cast<std::uint64_t>(j.recompute));
  put(static_cast<std::uint64_t>(j.attention)); put(static_cast<std::uint64_t>(j.loss)); put(j.loss_chunk);
  put(static_cast<std::uint64_t>(j.activations)); put(static_cast<std::uint64_t>(j.profile));
  put(j.parallel.tensor); put(j.parallel.pipeline); put(j.parallel.data);
  put(static_cast<std::uint64_t>(j.parallel.zero_stage)); put(j.parallel.sequence_parallel);
  put(j.parallel.context);
  put(j.parallel.fsdp);
  put(j.parallel.expert); put(m.moe.expert_ranks);
  put(j.parallel.reshard_after_forward | (j.parallel.ddp_bucket_view << 1) | (j.parallel.rank.has_value() << 2));
  put(j.parallel.rank.value_or(0));
  put(m.moe.experts); put(m.moe.top_k); put(m.moe.expert_ff); put(m.moe.shared_ff);
  put(m.moe.shared_gate | (m.moe.router_bias << 1) | (m.quirks.qk_norm_full_width << 2) |
      (m.moe.normalize_top_k << 3) | (m.moe.weights_fp32 << 4) | (static_cast<std::uint64_t>(m.moe.router) << 5) |
      (std::uint64_t{m.moe.output_router_logits} << 8) | (std::uint64_t{m.moe.group_limited} << 9));
  put(m.moe.groups | (m.moe.group_top_k << 32));
  put(m.moe.first_dense); put(m.moe.sparse_step);
  put(list_number(m.moe.dense_layers));
  put(j.overhead.has_value()); put(j.overhead.value_or(0)); put(static_cast<std::uint64_t>(j.kv_dtype));
  put(static_cast<std::uint64_t>(j.weights)); put(j.group_size);
  const ArchQuirks& q = m.quirks;
  put(q.fused_qkv | (q.fused_gate_up << 1) | (q.norm_weight_offset << 2) | (q.embedding_scale << 3) |
      (q.partial_rotary << 4) | (q.complex_rotary << 5) | (q.interleaved_rotary << 6) | (q.unused_sliding_mask << 7));
  put(j.lora_rank);
  // the accumulation steps walked, not given: every count from three on has the same figures
  // (simulated_accum_steps), so they share plans and answers
  put(static_cast<std::uint64_t>(j.experts) | (static_cast<std::uint64_t>(j.routing) << 8) | (std::uint64_t{j.router_aux_loss} << 16) |
      (simulated_accum_steps(j) << 24));
  // 0: torch.optim's default for the optimizer (a different answer from an explicit impl only where
  // they differ, but kept apart: the key is the job as given)
  put(j.optimizer_impl ? 1 + static_cast<std::uint64_t>(*j.optimizer_impl) : 0);
  put(static_cast<std::uint64_t>(j.parallel.pp_schedule) | (std::uint64_t{j.parallel.loss_parallel} << 4) |
      (std::uint64_t{j.parallel.fsdp_offload} << 5) | (std::uint64_t{j.parallel.fsdp_grad_sync_last} << 6) |
      (j.parallel.virtual_stages << 8));
  put(j.parallel.microbatches);
  put(list_number(j.parallel.pp_layers));
  return k;
}

struct KeyHash {
  std::size_t operator()(const Key& k) const noexcept {
    // Four independent multiply-xor lanes (a serial chain over 64 words costs more than a plan's
    // evaluation), mixed at the end.
    std::uint64_t h[4] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull, 0x2545f4914f6cdd1dull};
    for (std::size_t i = 0; i < kKeyWords; i += 4)
      for (std::size_t l = 0; l < 4; ++l) h[l] = (h[l] ^ k[i + l]) * 0xff51afd7ed558ccdull;
    std::uint64_t x = h[0] ^ (h[1] >> 17) ^ (h[2] << 23) ^ (h[3] >> 31);
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return static_cast<std::size_t>(x ^ (x >> 29));
  }
};
static_assert(kKeyWords % 4 == 0);

}  // namespace membudget::detail
