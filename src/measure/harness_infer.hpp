// src/measure/harness_infer.hpp: the harness's inference step (`membudget verify --mode infer`).
//
// An InferHarness owns the weights (one allocation per tensor, in --weights bf16 or fp32) and a KV
// pool: one K and one V buffer per layer of B × P × kv_heads × head_dim elements in --kv-dtype
// (bf16 or fp32), P = prompt + 1 tokens per sequence, all allocated through the CachingAllocator
// at construction. step() prefills B prompts of S tokens (no autograd: every activation is freed
// as soon as the op that reads it last has run), writing keys and values into the pool and
// computing logits for the last position only; then one decode step (one greedy token per sequence,
// attending over the S + 1 cached positions). Phases: floor (weights + pool), prefill, decode, each
// measured as the training phases are (reset the peak, read allocated.peak). Every buffer comes from
// harness_infer_table.hpp. docs/harness.md ("Inference mode") is the design.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "measure/harness.hpp"
#include "measure/harness_infer_table.hpp"

namespace membudget::measure {

struct InferOptions {
  std::uint64_t seed = 1234;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  // B·S prompt token ids, sequence after sequence; empty: random ids from the seed.
  std::vector<std::int32_t> prompt;
  bool leak_per_step = false;  // debug: keep 4 KiB from every step
};

struct InferStep {
  StepMeasure measure;                       // floor, prefill_peak, decode_peak, allocated_end, reserved_peak
  std::vector<std::int32_t> next_tokens;     // (B) greedy tokens from the prefill's logits
  std::vector<float> prefill_logits;         // (B, V) last prompt position, on the host in fp32
  std::vector<float> decode_logits;          // (B, V) the decode step's
};

// Error(unsupported) for what the inference step does not implement: the training harness's model
// limits, --weights other than bf16/fp32, --kv-dtype other than bf16/fp32 (parallelism: Job::validate).
void check_harness_infer_supported(const ModelSpec& model, const Job& job);

// The prefill's dims (S = the prompt, P = S + 1).
InferDims harness_infer_dims(const ModelSpec& model, const Job& job);

class InferHarness {
 public:
  // The allocator must outlive the harness.
  InferHarness(const ModelSpec& model, const Job& job, Backend& backend, CachingAllocator& allocator,
               InferOptions options = {});
  ~InferHarness();
  InferHarness(const InferHarness&) = delete;
  InferHarness& operator=(const InferHarness&) = delete;

  // One prefill and one decode step. Error(out_of_memory) names the step, phase and tensor.
  InferStep step();

  const InferDims& dims() const;
  const std::vector<PhaseMark>& marks() const;
  bytes_t weight_bytes() const;   // requested bytes of the weights
  bytes_t kv_pool_bytes() const;  // requested bytes of the pool (2 · layers buffers)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace membudget::measure
