// advise(): candidate fixes for a job that does not fit, each re-predicted, ranked cheapest first.
//
// The fixes are one table (fix_table): a row names a fix, says what it costs, why it would not
// apply to this job, and how it transforms the step. Every row is evaluated the same way
// (Context::measure), so adding a fix is adding a row.
#include "membudget/advise.hpp"
#include "membudget/input.hpp"
#include "model/job_key.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace membudget {

const char* to_string(CostClass c) noexcept {
  switch (c) {
    case CostClass::free: return "free";
    case CostClass::recompute: return "recompute";
    case CostClass::numerics: return "numerics";
    case CostClass::sharding: return "sharding";
    case CostClass::model: return "model";
    case CostClass::offload: return "offload";
    case CostClass::micro_batch: return "micro-batch";
  }
  return "free";
}

namespace {

// The step a fix leads to: the job predict() runs and, for what predict cannot express yet, the
// fraction kept of each role's bytes live at every phase peak, plus bytes added to every phase.
struct Plan {
  explicit Plan(Job j) : job(std::move(j)) {}
  Job job;
  std::map<Role, double> keep;  // a role that is absent keeps all its bytes
  bytes_t extra = 0;

  void scale(Role r, double f) { keep.try_emplace(r, 1.0).first->second *= f; }
};

// A fix's transformation. A job change is a Job → Job function that predict() evaluates. A fix
// predict cannot express yet (ZeRO, CPU offload, QLoRA's quantized base) changes the plan instead,
// until the job can say it. Both act on a plan, so that fixes stack.
struct Transform {
  std::function<Job(Job)> job;
  std::function<void(Plan&)> plan;

  Plan operator()(Plan p) const {
    if (job) p.job = job(std::move(p.job));
    if (plan) plan(p);
    return p;
  }
  // The figure is predict() of the changed job, so the job is reported with the fix.
  bool is_job_change() const { return job && !plan; }
};

// One candidate fix: what is shown (name, change, cost class and compute, cost and note texts),
// why it does not apply to this job (empty: it applies), and what it does to the step.
struct FixRow {
  Fix fix;
  std::string skip;
  Transform apply;
  bool stackable = false;  // joins the "combined" stack of single-GPU fixes
  bool listed = true;      // false: not offered for this job at all
  // A fix with a size to choose (GPUs, micro-batch): `sizes` of them, cheapest first, and at_size
  // completes the row for the i-th. The cheapest that fits is reported, else the last (it saves
  // most); the note opens with fits_note or fails_note.
  std::uint64_t sizes = 0;
  std::function<void(FixRow&, std::uint64_t i)> at_size;
  std::string fits_note, fails_note;
};

std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.0f%%", f * 100);
  return buf;
}

std::string gbs(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

bool fits(bytes_t required, const Device& d, double headroom) {
  return static_cast<double>(required) <= static_cast<double>(d.capacity) * (1.0 - headroom);
}

// One phase's bytes under a plan. Each role's live bytes are summed before they are scaled, so the
// figure does not depend on how the simulator groups tensors.
bytes_t phase_bytes(const PhasePeak& p, const Plan& plan) {
  std::map<Role, bytes_t> live;
  for (const auto& t : p.live)
    if (plan.keep.count(t.role)) live[t.role] += t.bytes;
  double removed = 0;
  for (const auto& [role, kept] : plan.keep) removed += static_cast<double>(live[role]) * (1.0 - kept);
  const double v = static_cast<double>(p.bytes) - removed;
  const bytes_t kept = v <= 0 ? 0 : bytes_from_double(std::round(v), "advise: phase peak");
  return checked_add(kept, plan.extra, "advise: phase peak");
}

// The divisors of `batch` below it, largest first: the micro-batches that keep the optimizer's batch
// with whole accumulation steps (1 for a prime batch).
std::vector<std::uint64_t> smaller_divisors(std::uint64_t batch) {
  std::vector<std::uint64_t> d;
  for (std::uint64_t k = 1; k <= batch / k; ++k)
    if (batch % k == 0) {
      if (k < batch) d.push_back(k);
      if (batch / k != k && batch / k < batch) d.push_back(batch / k);
    }
  std::sort(d.rbegin(), d.rend());
  return d;
}

// The job being advised and its device, with the predictions made so far: plans, sizes and stacks
// come back to the same few jobs many times.
struct Context {
  const ModelSpec& model;
  const Job& job;
  const Device& device;
  double headroom;
  const std::string allocator_conf;  // PYTORCH_CUDA_ALLOC_CONF for the reserved replay
  std::deque<std::pair<Job, Budget>> predictions;  // a deque keeps references to its budgets valid
  const Budget& base;
  const bytes_t base_peak;
  bytes_t base_required = 0;  // what the job as it is requires (requirement(), set once)

  Context(const ModelSpec& m, const Job& j, const Device& d, double h, std::string conf)
      : model(m), job(j), device(d), headroom(h), allocator_conf(std::move(conf)), base(predicted(j)),
        base_peak(peak(Plan{j})) {
    base_required = requirement(Plan{j}).required;
  }

  const Budget& predicted(const Job& j) {
    for (const auto& [k, b] : predictions)
      if (detail::key_of(model, k) == detail::key_of(model, j)) return b;  // every field that changes a number
    PredictOptions po;
    po.explain = true;
    po.reserved = true;  // fits is decided on what nvidia-smi will show, where the job has that model
    po.allocator_conf = allocator_conf;
    return predictions.emplace_back(j, predict(model, j, po)).second;
  }

  bytes_t peak(const Plan& plan) {
    const Budget& b = predicted(plan.job);
    bytes_t top = 0;
    // The floor carries no live list; everything in it stays live through the forward, so the
    // forward peak bounds it after any scaling.
    for (const auto* phases : {&b.phases, &b.step0})
      for (const auto& p : *phases)
        if (!p.live.empty() || p.bytes == 0) top = std::max(top, phase_bytes(p, plan));
    return top ? top : b.peak;
  }

  // What a plan requires of the card: a job change's reserved memory + outside (nvidia-smi) where
  // the job has a reserved model; else, and for a plan that scales roles (the replay cannot scale
  // a tensor it did not simulate), its allocated peak + outside.
  struct Requirement {
    bytes_t peak = 0, required = 0;
    bool on_reserved = false;
  };
  Requirement requirement(const Plan& plan) {
    Requirement r;
    r.peak = peak(plan);
    const Budget& b = predicted(plan.job);
    if (plan.keep.empty() && plan.extra == 0 && b.reserved_peak) {
      r.required = b.nvidia_smi();
      r.on_reserved = true;
    } else {
      r.required = checked_add(r.peak, base.terms.overhead, "advise: required");
    }
    return r;
  }

  // The one evaluation of every fix: its plan's peak, what that requires, and whether it fits.
  void measure(const Plan& plan, Fix& f) {
    const Requirement r = requirement(plan);
    f.predicted = true;
    f.peak = r.peak;
    f.required = r.required;
    f.on_reserved = r.on_reserved;
    f.fits = fits(f.required, device, headroom);
  }
};

Fix measure_row(Context& c, const FixRow& row) {
  Fix f = row.fix;
  const Plan plan = row.apply(Plan{c.job});
  c.measure(plan, f);
  if (row.apply.is_job_change()) f.job = plan.job;
  return f;
}

// The cheapest size that fits, by bisection (a size that saves more never fits less). The upper
// middle keeps the probes of the micro-batch search the golden record was made with.
Fix best_size(Context& c, const FixRow& row) {
  auto at = [&](std::int64_t i) {
    FixRow sized = row;
    row.at_size(sized, static_cast<std::uint64_t>(i));
    return measure_row(c, sized);
  };
  std::int64_t lo = 0, hi = static_cast<std::int64_t>(row.sizes) - 1, best = hi;
  while (lo <= hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (at(mid).fits) {
      best = mid;
      hi = mid - 1;
    } else {
      lo = mid + 1;
    }
  }
  Fix f = at(best);
  f.note = (f.fits ? row.fits_note : row.fails_note) + (f.note.empty() ? "" : "; " + f.note);
  return f;
}

Fix evaluate(Context& c, const FixRow& row) {
  Fix f = row.fix;
  if (!row.skip.empty()) {
    f.skipped = true;
    f.note = row.skip;
    return f;
  }
  try {
    if (row.sizes) return best_size(c, row);  // reported at its best size, saving or not
    f = measure_row(c, row);
    // a saving on either basis counts; a fix decided on allocated bytes is compared on those
    if (f.peak >= c.base_peak && (!f.on_reserved || f.required >= c.base_required)) {
      f.skipped = true;
      f.note = "no saving predicted: neither the peak (" + c.base.peak_phase + ") nor the memory it requires " +
               "changes (" + f.note + ")";
    }
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported && e.kind() != ErrorKind::invalid_job) throw;
    f = row.fix;
    f.skipped = true;
    f.note = std::string("not modelled: ") + e.what();
  }
  return f;
}

// When no single-GPU fix fits alone, the stackable ones are stacked cheapest first until the job
// fits (or all are stacked).
std::optional<Fix> combined(Context& c, const std::vector<FixRow>& rows, const std::vector<Fix>& fixes) {
  for (const Fix& f : fixes)
    if (!f.skipped && f.fits && f.cost_class <= CostClass::numerics) return std::nullopt;
  if (fits(c.base_required, c.device, c.headroom)) return std::nullopt;
  std::vector<const FixRow*> stack;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].stackable && !fixes[i].skipped) stack.push_back(&rows[i]);
  if (stack.empty()) return std::nullopt;
  std::stable_sort(stack.begin(), stack.end(), [](const FixRow* a, const FixRow* b) {
    return std::tie(a->fix.cost_class, a->fix.compute) < std::tie(b->fix.cost_class, b->fix.compute);
  });
  Plan p{c.job};
  Fix f;
  f.name = "combined";
  f.cost_class = CostClass::numerics;
  std::string names;
  for (std::size_t i = 0; i < stack.size() && !f.fits; ++i) {
    const Fix& part = stack[i]->fix;
    p = stack[i]->apply(p);
    names += (i ? " + " : "") + part.name;
    f.change += (i ? "; " : "") + part.change;
    f.compute += part.compute;
    f.cost_class = std::max(f.cost_class, part.cost_class);
    c.measure(p, f);
  }
  f.cost = pct(f.compute) + " compute: the costs of its parts";
  f.note = (f.fits ? "the cheapest fixes above stacked in rank order until the job fits: "
                   : "all single-GPU fixes above stacked, still does not fit: ") + names;
  f.job = p.job;
  return f;
}

// Linear weights of one decoder layer (what LoRA adapts and QLoRA quantizes), and their sum of
// in + out dimensions (a rank-r adapter on W: out×in has r·(in + out) parameters).
struct Linears {
  std::uint64_t params = 0;   // Σ in·out
  std::uint64_t in_out = 0;   // Σ (in + out)
  std::uint64_t largest = 0;  // largest single matrix
};

Linears layer_linears(const ModelSpec& m) {
  Linears l;
  auto add = [&](std::uint64_t in, std::uint64_t out) {
    l.params += in * out;
    l.in_out += in + out;
    l.largest = std::max(l.largest, in * out);
  };
  for (const ParamTensor& t : m.layer_tensors(0))
    if (t.projection()) add(t.in, t.out);
  return l;
}

// Bytes of a parameter, and of its gradient, in the job's storage dtype.
bytes_t param_bytes(Precision p) { return element_size(recipe_of(p).param); }

// Fused q/k/v or gate/up projections: the LoRA step is simulated for separate linears only.
bool fused_projections(const ModelSpec& model) {
  return model.quirks.fused_qkv || model.quirks.fused_gate_up;
}

constexpr std::uint64_t kLoraRank = 16;
const std::string kRank = std::to_string(kLoraRank);

Job with_lora(Job j) {
  j.lora_rank = kLoraRank;
  return j;
}

// The rows below name only the members they set; GCC 12 warns about designated initializers that
// leave the others at their defaults.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

// ZeRO stage 1, 2 or 3 over N ∈ {2, 4, 8} GPUs, as PyTorch runs them (docs/distributed.md): DDP +
// ZeroRedundancyOptimizer, FSDP2 without and with reshard after forward. A job change: predict()
// simulates the rank (the most loaded one), its buffers included.
FixRow zero(const Context& c, int stage) {
  const double grad_bytes = static_cast<double>(c.base.states.gradients);
  const std::string name = "ZeRO-" + std::to_string(stage);
  return {
      .fix = {.name = name,
              .cost_class = CostClass::sharding,
              .compute = stage == 3 ? 0.15 : (stage == 2 ? 0.07 : 0.05),
              .cost = stage == 3 ? "N GPUs; communication ≈ 1.5 × data-parallel all-reduce (" + gbs(3 * grad_bytes) +
                                       " per GPU per step), mostly overlapped"
                                 : "N GPUs; communication as data-parallel all-reduce (" + gbs(2 * grad_bytes) +
                                       " per GPU per step: reduce-scatter + all-gather)",
              .note = std::string("shards the ") +
                      (stage == 1   ? "optimizer state (DDP + ZeroRedundancyOptimizer)"
                       : stage == 2 ? "optimizer state and gradients, and the parameters between steps (FSDP2 without "
                                      "reshard after forward)"
                                    : "optimizer state, gradients and parameters (FSDP2)") +
                      " over N data-parallel GPUs, the rank's buffers predicted; the global batch grows N-fold "
                      "unless gradient accumulation is reduced"},
      .skip = c.job.parallel.single() ? "" : "the job is already spread over GPUs",
      .sizes = 3,
      .at_size =
          [stage, name](FixRow& row, std::uint64_t i) {
            const std::uint64_t gpus = 2ull << i;
            row.fix.gpus = gpus;
            row.fix.change = "--dp " + std::to_string(gpus) + " --zero " + std::to_string(stage);
            row.apply.job = [stage, gpus](Job j) {
              j.parallel.data = gpus;
              j.parallel.zero_stage = stage;
              return j;
            };
          },
      .fits_note = "smallest N in {2, 4, 8} that fits",
      .fails_note = "does not fit even over 8 GPUs",
  };
}

// The candidate fixes for this job, in the order they are listed before ranking.
std::vector<FixRow> fix_table(const Context& c) {
  const Job& job = c.job;
  const ModelStates& states = c.base.states;
  const std::uint64_t n = c.base.parameters.total;
  const Linears lin = layer_linears(c.model);
  const std::string lora_skip = job.lora_rank ? "already LoRA"
                                : fused_projections(c.model) || job.optimizer == Optimizer::adafactor
                                    ? "not modelled for this job (Phi-3's fused projections or Adafactor)"
                                    : "";
  // QLoRA: the decoder-layer linears in NF4 (4 bits + one double-quantized scale per 64 values).
  const double pbytes = static_cast<double>(param_bytes(job.precision));
  const std::uint64_t qparams = lin.params * c.model.num_layers;
  const double qbytes = static_cast<double>(qparams) * (0.5 + 1.0 / 64) + static_cast<double>(n - qparams) * pbytes;
  const double wbytes = static_cast<double>(n) * pbytes;
  const double quantized = wbytes > 0 ? std::min(1.0, qbytes / wbytes) : 1.0;
  const bytes_t dequantized = checked_mul(lin.largest, 2, "advise: dequantized weight");
  // CPU offload: gradients go down and parameters come up every step.
  const double traffic = static_cast<double>(states.gradients) + static_cast<double>(states.weights);
  char offload_cost[160];
  std::snprintf(offload_cost, sizeof offload_cost,
                "%.2f s per step over PCIe (%s of gradients down and parameters up at ~25 GB/s)", traffic / 25e9,
                gbs(traffic).c_str());

  return {
      // ---- free ----
      {.fix = {.name = "chunked loss",
               .change = "--loss chunked",
               .cost_class = CostClass::free,
               .cost = "≈ 0: the same cross-entropy computed over chunks of 1024 tokens (fused linear + "
                       "cross-entropy, e.g. Liger); usually as fast or faster",
               .note = "the b·s·V logits, their fp32 copy and the log-softmax are never materialised whole"},
       .skip = job.loss == Loss::chunked ? "already --loss chunked" : "",
       .apply = {.job = [](Job j) { j.loss = Loss::chunked; return j; }},
       .stackable = true},
      {.fix = {.name = "flash attention",
               .change = "--attention flash",
               .cost_class = CostClass::free,
               .cost = "≈ 0: exact attention, faster than the math path",
               .note = "no b·a·s² scores or softmax saved for backward"},
       .apply = {.job = [](Job j) { j.attention = Attention::flash; return j; }},
       .stackable = true,
       .listed = job.attention == Attention::math},
      // A job change: --optimizer-impl fused, predicted.
      {.fix = {.name = "fused optimizer",
               .change = "--optimizer-impl fused (torch.optim's fused=True; Hugging Face Trainer's adamw_torch_fused)",
               .cost_class = CostClass::free,
               .cost = "≈ 0: the same update in one kernel per parameter; usually faster",
               .note = std::string("the multi-tensor step's parameter-sized temporaries (sqrt of exp_avg_sq for all "
                                   "parameters at once) are not allocated") +
                       (job.precision == Precision::bf16_master
                            ? "; the fp32 copy of the gradients (bf16-master) is made outside the optimizer and stays"
                            : "")},
       .skip = effective_optimizer_impl(job) == OptimizerImpl::fused
                   ? std::string(job.profile == Profile::harness ? "the harness's AdamW is already one fused kernel"
                                                                 : "already --optimizer-impl fused")
               : job.optimizer == Optimizer::adafactor || job.optimizer == Optimizer::adamw_8bit ||
                       job.optimizer == Optimizer::lion
                   ? std::string("--optimizer ") + to_string(job.optimizer) + " has no fused torch.optim implementation"
                   : "",
       .apply = {.job = [](Job j) { j.optimizer_impl = OptimizerImpl::fused; return j; }},
       .stackable = true},
      // ---- recompute ----
      {.fix = {.name = "selective recompute",
               .change = "--recompute selective",
               .cost_class = CostClass::recompute,
               .compute = 0.05,
               .cost = "+5% compute: only the attention core is recomputed in backward (Korthikanti et al.)",
               .note = "drops the attention scores/softmax saved for backward"},
       .skip = job.recompute != Recompute::none ? "already --recompute " + std::string(to_string(job.recompute))
               : job.attention == Attention::flash
                   ? "no saving with flash attention: it already saves no b·a·s² tensors (use full recompute)"
                   : "",
       .apply = {.job = [](Job j) { j.recompute = Recompute::selective; return j; }}},
      {.fix = {.name = "full recompute",
               .change = "--recompute full",
               .cost_class = CostClass::recompute,
               .compute = 0.33,
               .cost = "+33% compute: each layer's forward runs again in backward (one extra forward ≈ a third "
                       "of forward + backward)",
               .note = "activation checkpointing per decoder layer: only each layer's input is kept"},
       .skip = job.recompute == Recompute::full ? "already --recompute full" : "",
       .apply = {.job = [](Job j) { j.recompute = Recompute::full; return j; }},
       .stackable = true},
      // ---- numerics ----
      {.fix = {.name = "8-bit optimizer",
               .change = "--optimizer adamw-8bit (bitsandbytes AdamW8bit)",
               .cost_class = CostClass::numerics,
               .cost = "≈ 0 compute; small accuracy risk (block-wise quantized moments)",
               .note = "AdamW moments in uint8 with one absmax per 256 values: 2 bytes per parameter instead of 8"},
       .skip = job.optimizer == Optimizer::adamw_8bit || job.optimizer == Optimizer::sgd
                   ? std::string("--optimizer ") + to_string(job.optimizer) + " already keeps less state"
                   : "",
       // bitsandbytes' optimizer replaces torch.optim's: no implementation to choose (a stacked
       // "fused optimizer" before it no longer applies)
       .apply = {.job = [](Job j) { j.optimizer = Optimizer::adamw_8bit; j.optimizer_impl.reset(); return j; }},
       .stackable = true},
      {.fix = {.name = "pure bf16",
               .change = "--precision bf16",
               .cost_class = CostClass::numerics,
               .cost = "≈ 0 compute (faster); accuracy risk: bf16 weight updates lose small increments "
                       "(use stochastic rounding or Kahan summation)",
               .note = "parameters, gradients and optimizer state in bf16 (8 bytes per parameter with AdamW "
                       "instead of 16); no autocast weight copies"},
       .skip = job.precision == Precision::bf16 ? "already --precision bf16" : "",
       .apply = {.job = [](Job j) { j.precision = Precision::bf16; return j; }}},
      // ---- sharding ----
      zero(c, 1),
      zero(c, 2),
      zero(c, 3),
      // ---- model ----
      {.fix = {.name = "LoRA",
               .change = "--lora " + kRank + " (rank " + kRank + " on q,k,v,o,gate,up,down; base frozen)",
               .cost_class = CostClass::model,
               .compute = -0.25,
               .cost = "≈ −25% compute (no weight gradients for the base); trains " +
                       std::to_string(c.model.num_layers * kLoraRank * lin.in_out) +
                       " adapter parameters instead of the full model: a different fine-tune",
               .note = "the adapted step simulated (peft: fp32 adapters, alpha 32, no dropout): no gradients, "
                       "master weights or optimizer state for the base; 16-bit adapted inputs are cast to fp32 "
                       "and saved by lora_A; frozen linears and norms save no inputs for their weights"},
       .skip = lora_skip,
       .apply = {.job = with_lora}},
      // QLoRA's base is not a job yet: the LoRA step, its layer linears' bytes scaled to NF4.
      {.fix = {.name = "QLoRA",
               .change = "base linears in 4-bit NF4 (bitsandbytes) + LoRA rank " + kRank,
               .cost_class = CostClass::model,
               .compute = 0.05,
               .cost = "≈ +5% compute vs full fine-tuning (dequantization, no base weight gradients); 4-bit "
                       "base: slightly lower quality than LoRA",
               .note = "the LoRA step simulated, then its decoder-layer linears as NF4 (4 bits + one "
                       "double-quantized scale per 64 values; embeddings, norms and lm_head kept), no bf16 copies "
                       "of the frozen weights, one layer weight dequantized at a time (modelled, not measured)"},
       .skip = lora_skip,
       .apply = {.job = with_lora,
                 .plan =
                     [quantized, dequantized](Plan& p) {
                       p.scale(Role::parameter, quantized);
                       p.scale(Role::weight_copy, 0);  // the 4-bit matmul saves the packed weight
                       p.extra += dequantized;
                     }}},
      // ---- offload: not a job yet, the optimizer's state leaves the GPU ----
      {.fix = {.name = "CPU offload",
               .change = "optimizer state and step on the CPU (DeepSpeed ZeRO-Offload)",
               .cost_class = CostClass::offload,
               .transfer_s = traffic / 25e9,
               .cost = std::string(offload_cost) + ", plus the CPU's optimizer step; partly overlapped with backward",
               .note = "optimizer state, master weights and optimizer temporaries leave the GPU; gradients stay "
                       "(conservative); needs " +
                       gbs(static_cast<double>(states.optimizer + states.master) + static_cast<double>(n) * 4) +
                       " of pinned host memory"},
       .skip = states.optimizer + states.master == 0 ? "no optimizer state to offload" : "",
       .apply = {.plan =
                     [](Plan& p) {
                       for (Role r : {Role::optimizer_state, Role::master_weight, Role::optimizer_temporary})
                         p.scale(r, 0);
                     }}},
      // ---- micro-batch: the largest divisor b' < b that fits, with b / b' accumulation steps ----
      // (only a divisor keeps the optimizer's batch: 3 × 2 for a batch of 4 is 6 sequences)
      {.fix = {.name = "smaller micro-batch", .cost_class = CostClass::micro_batch, .compute = 0.10},
       .skip = job.batch <= 1 ? "micro-batch is already 1 (shorten --seq, or use the fixes above)" : "",
       .sizes = smaller_divisors(job.batch).size(),
       .at_size =
           [batch = job.batch, steps = job.grad_accum_steps, divisors = smaller_divisors(job.batch)](FixRow& row,
                                                                                                    std::uint64_t i) {
             // predicted with its accumulation steps: from the second micro-batch on, the
             // gradients stay allocated through the forward (Job::grad_accum_steps)
             const std::uint64_t b = divisors[i], accum = steps * (batch / b);
             row.fix.change = "--batch " + std::to_string(b) + " --grad-accum-steps " + std::to_string(accum);
             row.fix.cost = "same tokens per optimizer step (" + std::to_string(batch * steps) +
                            " sequences); smaller matmuls use the GPU less efficiently (~+10% time), more steps per update";
             row.apply.job = [b, accum](Job j) {
               j.batch = b;
               j.grad_accum_steps = accum;
               return j;
             };
           },
       .fits_note = "the largest micro-batch that fits",
       .fails_note = "does not fit even at micro-batch 1"},
  };
}

#pragma GCC diagnostic pop

}  // namespace

std::vector<Fix> advise(const ModelSpec& model, const Job& job, const Device& device, double headroom,
                        const std::string& allocator_conf) {
  if (job.mode != Mode::train)
    throw Error(ErrorKind::unsupported, "advise: only training jobs are advised (--mode train)");
  if (!(headroom >= 0.0 && headroom < 1.0))
    throw Error(ErrorKind::invalid_argument, "--headroom: must be in [0, 1), e.g. 0.05 for 5%");
  if (device.capacity == 0) throw Error(ErrorKind::invalid_argument, "--device-memory: capacity must be positive");

  Context c{model, job, device, headroom, allocator_conf};
  std::vector<FixRow> rows = fix_table(c);
  std::erase_if(rows, [](const FixRow& r) { return !r.listed; });
  std::vector<Fix> fixes;
  for (const FixRow& row : rows) fixes.push_back(evaluate(c, row));
  if (auto f = combined(c, rows, fixes)) fixes.push_back(std::move(*f));

  std::stable_sort(fixes.begin(), fixes.end(), [](const Fix& a, const Fix& b) {
    return std::make_tuple(a.skipped, a.cost_class, a.compute, a.transfer_s) <
           std::make_tuple(b.skipped, b.cost_class, b.compute, b.transfer_s);
  });
  return fixes;
}

}  // namespace membudget
