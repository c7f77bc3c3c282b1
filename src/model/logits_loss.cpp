// The logits/loss term of a torch training step (predictors.hpp).
#include <algorithm>

#include "parallel.hpp"
#include "pipeline.hpp"
#include "predictors.hpp"

namespace membudget::detail {

namespace {
LogitsLossBreakdown whole_logits(const ModelSpec& m, const Job& job) {
  auto mul = [](bytes_t a, bytes_t b, bytes_t c) { return checked_product("logits/loss size", a, b, c); };
  LogitsLossBreakdown l;
  // (a context-parallel rank's tokens are its share of the sequence)
  const bytes_t T = checked_product("tokens", job.batch, rank_seq(job)), V = m.vocab_size;
  const bytes_t compute = job.precision == Precision::fp32 ? 4 : 2;
  if (job.loss == Loss::chunked) {
    const bytes_t c = std::min<bytes_t>(job.loss_chunk, T);
    l.logits = mul(c, V, compute);
    l.upcast = compute == 4 ? 0 : mul(c, V, 4);
    l.loss_saved = 0;
    l.logits_grad = mul(c, V, 4);
    return l;
  }
  l.logits = mul(T, V, compute);
  l.upcast = compute == 4 ? 0 : mul(T, V, 4);
  l.loss_saved = mul(T, V, 4);
  l.logits_grad = mul(T, V, 4);
  return l;
}
}  // namespace

LogitsLossBreakdown logits_breakdown(const ModelSpec& m, const Job& job) {
  // only a pipeline's last stage computes logits (one microbatch's at a time)
  if (job.parallel.pipeline > 1 && job.parallel.rank && !pipeline_stage(m, job, *job.parallel.rank).last()) return {};
  LogitsLossBreakdown l = whole_logits(m, job);
  if (job.parallel.loss_parallel)  // each rank's logits and loss cover its vocabulary shard
    for (bytes_t* f : {&l.logits, &l.upcast, &l.loss_saved, &l.logits_grad}) *f /= job.parallel.tensor;
  return l;
}

}  // namespace membudget::detail
