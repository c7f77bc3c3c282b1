// advise(): candidate fixes for a job that does not fit, each re-predicted, ranked cheapest first.
#include "membudget/advise.hpp"
#include "membudget/input.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <tuple>

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

// A fix as a plan: a job for predict(), then factors on the model-state tensors live at each phase
// peak and bytes the fix adds to every phase.
struct Plan {
  Job job;
  double weights = 1, grads = 1, master = 1, optimizer = 1, temporaries = 1, autocast = 1;
  bytes_t extra = 0;  // added to every phase peak
};

// Model-state bytes live at one phase peak, from the prediction's live tensors (their names are
// those of inventory_torch.cpp / autograd_sim.cpp).
struct LiveStates {
  bytes_t weights = 0, grads = 0, master = 0, optimizer = 0, temporaries = 0, autocast = 0;
};

LiveStates live_states(const PhasePeak& p) {
  LiveStates s;
  for (const auto& t : p.live) {
    if (t.name == "parameters") s.weights += t.bytes;
    else if (t.name == "parameter gradients (.grad)") s.grads += t.bytes;
    else if (t.name == "master weights (fp32)") s.master += t.bytes;
    else if (t.name == "optimizer state") s.optimizer += t.bytes;
    else if (t.name == "optimizer temporaries") s.temporaries += t.bytes;
    else if (t.name.rfind("autocast", 0) == 0) s.autocast += t.bytes;  // cached, or frozen weights' copies
  }
  return s;
}

double scaled(bytes_t v, double f) { return static_cast<double>(v) * (1.0 - f); }

struct Evaluated {
  Budget budget;
  bytes_t peak = 0;
};

// predict() with explain for each distinct job, kept: the plan factors reuse one prediction.
struct PredictCache {
  const ModelSpec* model = nullptr;
  std::vector<std::pair<Job, std::shared_ptr<const Budget>>> entries;
  static bool same(const Job& a, const Job& b) {
    return a.batch == b.batch && a.seq == b.seq && a.precision == b.precision && a.optimizer == b.optimizer &&
           a.recompute == b.recompute && a.attention == b.attention && a.loss == b.loss &&
           a.loss_chunk == b.loss_chunk && a.activations == b.activations && a.profile == b.profile &&
           a.lora_rank == b.lora_rank;
  }
  std::shared_ptr<const Budget> get(const Job& job) {
    for (const auto& [j, b] : entries)
      if (same(j, job)) return b;
    PredictOptions po;
    po.explain = true;
    auto b = std::make_shared<const Budget>(predict(*model, job, po));
    entries.emplace_back(job, b);
    return b;
  }
};
thread_local PredictCache* g_cache = nullptr;

Evaluated evaluate(const ModelSpec& model, const Plan& plan) {
  Evaluated e;
  if (g_cache && g_cache->model == &model) {
    e.budget = *g_cache->get(plan.job);
  } else {
    PredictOptions po;
    po.explain = true;
    e.budget = predict(model, plan.job, po);
  }
  auto phase_bytes = [&](const PhasePeak& p) {
    const LiveStates s = live_states(p);
    double removed = scaled(s.weights, plan.weights) + scaled(s.grads, plan.grads) + scaled(s.master, plan.master) +
                     scaled(s.optimizer, plan.optimizer) + scaled(s.temporaries, plan.temporaries) +
                     scaled(s.autocast, plan.autocast);
    const double v = static_cast<double>(p.bytes) - removed;
    const bytes_t kept = v <= 0 ? 0 : bytes_from_double(std::round(v), "advise: phase peak");
    return checked_add(kept, plan.extra, "advise: phase peak");
  };
  // The floor carries no live list; everything in it stays live through the forward, so the
  // forward peak bounds it after any scaling.
  for (const auto& p : e.budget.phases)
    if (!p.live.empty() || p.bytes == 0) e.peak = std::max(e.peak, phase_bytes(p));
  for (const auto& p : e.budget.step0)
    if (!p.live.empty() || p.bytes == 0) e.peak = std::max(e.peak, phase_bytes(p));
  if (e.peak == 0) e.peak = e.budget.peak;
  return e;
}

bool fits(bytes_t required, const Device& d, double headroom) {
  return static_cast<double>(required) <= static_cast<double>(d.capacity) * (1.0 - headroom);
}

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

// Linear weights of one decoder layer (what LoRA adapts and QLoRA quantizes), and their sum of
// in + out dimensions (a rank-r adapter on W: out×in has r·(in + out) parameters).
struct Linears {
  std::uint64_t params = 0;   // Σ in·out
  std::uint64_t in_out = 0;   // Σ (in + out)
  std::uint64_t largest = 0;  // largest single matrix
  std::uint64_t count = 0;
};

Linears layer_linears(const ModelSpec& m) {
  Linears l;
  auto add = [&](std::uint64_t in, std::uint64_t out) {
    l.params += in * out;
    l.in_out += in + out;
    l.largest = std::max(l.largest, in * out);
    l.count += 1;
  };
  const std::uint64_t h = m.hidden_size, I = m.intermediate_size;
  add(h, m.q_dim());
  add(h, m.kv_dim());
  add(h, m.kv_dim());
  add(m.q_dim(), h);
  if (m.mlp == MlpKind::plain_gelu) {
    add(h, I);
    add(I, h);
  } else {
    add(h, I);
    add(h, I);
    add(I, h);
  }
  return l;
}

bytes_t param_bytes(Precision p) { return (p == Precision::bf16 || p == Precision::bf16_master) ? 2 : 4; }

struct Candidate {
  Fix fix;
  std::function<Plan(Plan)> apply;  // applied on top of a plan (so fixes can be combined)
  bool single_gpu_stackable = false;
};

}  // namespace

std::vector<Fix> advise(const ModelSpec& model, const Job& job, const Device& device, double headroom) {
  if (job.mode != Mode::train)
    throw Error(ErrorKind::unsupported, "advise: only training jobs are advised (--mode train)");
  if (!(headroom >= 0.0 && headroom < 1.0))
    throw Error(ErrorKind::invalid_argument, "--headroom: must be in [0, 1), e.g. 0.05 for 5%");
  if (device.capacity == 0) throw Error(ErrorKind::invalid_argument, "--device-memory: capacity must be positive");

  PredictCache cache;
  cache.model = &model;
  g_cache = &cache;
  struct Reset {
    ~Reset() { g_cache = nullptr; }
  } reset;
  const Plan base{job};
  const Evaluated baseline = evaluate(model, base);
  const Budget& bb = baseline.budget;
  const bytes_t overhead = bb.terms.overhead;
  const ParameterCounts pc = bb.parameters;
  const std::uint64_t n = pc.total;
  const Linears lin = layer_linears(model);
  const std::uint64_t L = model.num_layers;
  const bytes_t pbytes = param_bytes(job.precision);

  std::vector<Candidate> cands;
  auto job_fix = [&](std::string name, std::string change, CostClass cls, double compute, std::string cost,
                     std::string note, std::function<void(Job&)> edit, bool stackable) {
    Candidate c;
    c.fix.name = std::move(name);
    c.fix.change = std::move(change);
    c.fix.cost_class = cls;
    c.fix.compute = compute;
    c.fix.cost = std::move(cost);
    c.fix.note = std::move(note);
    c.apply = [edit](Plan p) {
      edit(p.job);
      return p;
    };
    c.single_gpu_stackable = stackable;
    cands.push_back(std::move(c));
    return &cands.back();
  };
  auto skip = [](Candidate* c, std::string why) {
    c->fix.skipped = true;
    c->fix.note = std::move(why);
  };

  // ---- free ----
  {
    auto* c = job_fix("chunked loss", "--loss chunked", CostClass::free, 0.0,
                      "≈ 0: the same cross-entropy computed over chunks of 1024 tokens (fused linear + "
                      "cross-entropy, e.g. Liger); usually as fast or faster",
                      "the b·s·V logits, their fp32 copy and the log-softmax are never materialised whole",
                      [](Job& j) { j.loss = Loss::chunked; }, true);
    if (job.loss == Loss::chunked) skip(c, "already --loss chunked");
  }
  if (job.attention == Attention::math) {
    job_fix("flash attention", "--attention flash", CostClass::free, 0.0,
            "≈ 0: exact attention, faster than the math path",
            "no b·a·s² scores or softmax saved for backward", [](Job& j) { j.attention = Attention::flash; }, true);
  }
  {
    Candidate c;
    c.fix.name = "fused optimizer";
    c.fix.change = "torch.optim.AdamW(fused=True) (or foreach=False)";
    c.fix.cost_class = CostClass::free;
    c.fix.compute = 0.0;
    c.fix.cost = "≈ 0: the same update in one kernel per parameter; usually faster";
    c.fix.note = "the multi-tensor step's parameter-sized temporaries (sqrt of exp_avg_sq for all parameters at "
                 "once) are not allocated";
    c.apply = [](Plan p) {
      p.temporaries = 0;
      return p;
    };
    c.single_gpu_stackable = true;
    if (job.optimizer != Optimizer::adamw && job.optimizer != Optimizer::lion)
      skip(&c, std::string("--optimizer ") + to_string(job.optimizer) + " allocates no multi-tensor temporaries here");
    else if (job.precision == Precision::bf16_master)
      c.fix.note += "; the fp32 copy of the gradients (bf16-master) is also step-local";
    cands.push_back(std::move(c));
  }
  // ---- recompute ----
  {
    auto* c = job_fix("selective recompute", "--recompute selective", CostClass::recompute, 0.05,
                      "+5% compute: only the attention core is recomputed in backward (Korthikanti et al.)",
                      "drops the attention scores/softmax saved for backward",
                      [](Job& j) { j.recompute = Recompute::selective; }, false);
    if (job.recompute != Recompute::none)
      skip(c, std::string("already --recompute ") + to_string(job.recompute));
    else if (job.attention == Attention::flash)
      skip(c, "no saving with flash attention: it already saves no b·a·s² tensors (use full recompute)");
  }
  {
    auto* c = job_fix("full recompute", "--recompute full", CostClass::recompute, 0.33,
                      "+33% compute: each layer's forward runs again in backward (one extra forward ≈ a third "
                      "of forward + backward)",
                      "activation checkpointing per decoder layer: only each layer's input is kept",
                      [](Job& j) { j.recompute = Recompute::full; }, true);
    if (job.recompute == Recompute::full) skip(c, "already --recompute full");
  }
  // ---- numerics ----
  {
    auto* c = job_fix("8-bit optimizer", "--optimizer adamw-8bit (bitsandbytes AdamW8bit)", CostClass::numerics, 0.0,
                      "≈ 0 compute; small accuracy risk (block-wise quantized moments)",
                      "AdamW moments in uint8 with one absmax per 256 values: 2 bytes per parameter instead of 8",
                      [](Job& j) { j.optimizer = Optimizer::adamw_8bit; }, true);
    if (job.optimizer == Optimizer::adamw_8bit || job.optimizer == Optimizer::sgd)
      skip(c, std::string("--optimizer ") + to_string(job.optimizer) + " already keeps less state");
  }
  {
    auto* c = job_fix("pure bf16", "--precision bf16", CostClass::numerics, 0.0,
                      "≈ 0 compute (faster); accuracy risk: bf16 weight updates lose small increments "
                      "(use stochastic rounding or Kahan summation)",
                      "parameters, gradients and optimizer state in bf16 (8 bytes per parameter with AdamW "
                      "instead of 16); no autocast weight copies",
                      [](Job& j) { j.precision = Precision::bf16; }, false);
    if (job.precision == Precision::bf16) skip(c, "already --precision bf16");
  }

  // ---- sharding: ZeRO-1/2/3 over the smallest N that fits ----
  const bytes_t layer_weight_bytes = checked_mul(pc.per_layer, pbytes, "advise: layer weights");
  for (int stage = 1; stage <= 3; ++stage) {
    Candidate c;
    c.fix.name = "ZeRO-" + std::to_string(stage);
    c.fix.cost_class = CostClass::sharding;
    c.fix.compute = stage == 3 ? 0.15 : (stage == 2 ? 0.07 : 0.05);
    const char* what = stage == 1 ? "optimizer state" : stage == 2 ? "optimizer state and gradients"
                                                                   : "optimizer state, gradients and parameters";
    c.fix.note = std::string("shards the ") + what + " over N data-parallel GPUs (DeepSpeed / FSDP)";
    if (stage == 2) c.fix.note += "; plus one layer's gradients as the reduce bucket";
    if (stage == 3) c.fix.note += "; plus two layers' parameters gathered (current + prefetch)";
    c.fix.note += "; the global batch grows N-fold unless gradient accumulation is reduced";
    const double grad_bytes = static_cast<double>(bb.states.gradients);
    c.fix.cost = stage == 3 ? "N GPUs; communication ≈ 1.5 × data-parallel all-reduce (" + gbs(3 * grad_bytes) +
                                  " per GPU per step), mostly overlapped"
                            : "N GPUs; communication as data-parallel all-reduce (" + gbs(2 * grad_bytes) +
                                  " per GPU per step: reduce-scatter + all-gather)";
    Fix best = c.fix;
    bool found = false;
    for (std::uint64_t gpus : {2ull, 4ull, 8ull}) {
      Plan p = base;
      const double inv = 1.0 / static_cast<double>(gpus);
      p.optimizer = p.master = p.temporaries = inv;
      if (stage >= 2) {
        p.grads = inv;
        p.extra += static_cast<bytes_t>(pc.per_layer) * (job.precision == Precision::fp32 ||
                                                                 job.precision == Precision::amp_bf16 ? 4 : 2);
      }
      if (stage >= 3) {
        p.weights = inv;
        p.extra += 2 * layer_weight_bytes;
      }
      const Evaluated e = evaluate(model, p);
      best.peak = e.peak;
      best.required = checked_add(e.peak, overhead, "advise: required");
      best.fits = fits(best.required, device, headroom);
      best.gpus = gpus;
      best.change = "ZeRO-" + std::to_string(stage) + " over " + std::to_string(gpus) + " GPUs";
      if (best.fits) {
        found = true;
        break;
      }
    }
    if (found) best.note = "smallest N in {2, 4, 8} that fits; " + best.note;
    else best.note = "does not fit even over 8 GPUs; " + best.note;
    Candidate done;
    done.fix = best;
    done.apply = nullptr;  // evaluated above
    cands.push_back(std::move(done));
  }

  // ---- model: LoRA and QLoRA ----
  // LoRA is a job change: the inventory simulates the adapted step (frozen base, peft's fp32
  // adapters and casts; --lora). QLoRA starts from the same step and quantizes the frozen base.
  const std::uint64_t rank = 16;
  const std::uint64_t adapter_params = L * rank * lin.in_out;
  const bool lora_applies = job.lora_rank == 0 && model.family != "phi3" && job.optimizer != Optimizer::adafactor;
  {
    auto* c = job_fix("LoRA", "--lora 16 (rank 16 on q,k,v,o,gate,up,down; base frozen)", CostClass::model, -0.25,
                      "≈ −25% compute (no weight gradients for the base); trains " + std::to_string(adapter_params) +
                          " adapter parameters instead of the full model: a different fine-tune",
                      "the adapted step simulated (peft: fp32 adapters, alpha 32, no dropout): no gradients, master "
                      "weights or optimizer state for the base; 16-bit adapted inputs are cast to fp32 and saved by "
                      "lora_A; frozen linears and norms save no inputs for their weights",
                      [](Job& j) { j.lora_rank = 16; }, false);
    if (!lora_applies)
      skip(c, job.lora_rank ? "already LoRA" : "not modelled for this job (Phi-3's fused projections or Adafactor)");
  }
  {
    Candidate c;
    c.fix.name = "QLoRA";
    c.fix.change = "base linears in 4-bit NF4 (bitsandbytes) + LoRA rank 16";
    c.fix.cost_class = CostClass::model;
    c.fix.compute = 0.05;
    c.fix.cost = "≈ +5% compute vs full fine-tuning (dequantization, no base weight gradients); 4-bit base: "
                 "slightly lower quality than LoRA";
    c.fix.note = "the LoRA step simulated, then its decoder-layer linears as NF4 (4 bits + one double-quantized "
                 "scale per 64 values; embeddings, norms and lm_head kept), no bf16 copies of the frozen weights, "
                 "one layer weight dequantized at a time (modelled, not measured)";
    const std::uint64_t qparams = lin.params * L;
    const double pbytes = static_cast<double>(param_bytes(job.precision));
    const double qbytes = static_cast<double>(qparams) * (0.5 + 1.0 / 64) + static_cast<double>(n - qparams) * pbytes;
    const double wbytes = static_cast<double>(n) * pbytes;
    const double f = wbytes > 0 ? std::min(1.0, qbytes / wbytes) : 1.0;
    const bytes_t dequant = checked_mul(lin.largest, 2, "advise: dequantized weight");
    c.apply = [f, dequant](Plan p) {
      p.job.lora_rank = 16;
      p.weights *= f;
      p.autocast = 0;
      p.extra += dequant;
      return p;
    };
    if (!lora_applies) {
      c.fix.skipped = true;
      c.fix.note = job.lora_rank ? "already LoRA" : "not modelled for this job (Phi-3's fused projections or Adafactor)";
    }
    cands.push_back(std::move(c));
  }
  // ---- offload ----
  {
    Candidate c;
    c.fix.name = "CPU offload";
    c.fix.change = "optimizer state and step on the CPU (DeepSpeed ZeRO-Offload)";
    c.fix.cost_class = CostClass::offload;
    const double traffic = static_cast<double>(bb.states.gradients) + static_cast<double>(bb.states.weights);
    c.fix.transfer_s = traffic / 25e9;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.2f s per step over PCIe (%s of gradients down and parameters up at ~25 GB/s)",
                  c.fix.transfer_s, gbs(traffic).c_str());
    c.fix.cost = std::string(buf) + ", plus the CPU's optimizer step; partly overlapped with backward";
    c.fix.note = "optimizer state, master weights and optimizer temporaries leave the GPU; gradients stay "
                 "(conservative); needs " + gbs(static_cast<double>(bb.states.optimizer + bb.states.master) +
                                                static_cast<double>(n) * 4) + " of pinned host memory";
    c.apply = [](Plan p) {
      p.optimizer = p.master = p.temporaries = 0;
      return p;
    };
    if (bb.states.optimizer + bb.states.master == 0) {
      c.fix.skipped = true;
      c.fix.note = "no optimizer state to offload";
    }
    cands.push_back(std::move(c));
  }

  // ---- evaluate the plan-based candidates ----
  for (auto& c : cands) {
    if (c.fix.skipped || !c.apply) continue;
    try {
      const Plan p = c.apply(base);
      const Evaluated e = evaluate(model, p);
      c.fix.peak = e.peak;
      c.fix.required = checked_add(e.peak, overhead, "advise: required");
      c.fix.fits = fits(c.fix.required, device, headroom);
      if (p.job.loss != job.loss || p.job.recompute != job.recompute || p.job.optimizer != job.optimizer ||
          p.job.precision != job.precision || p.job.attention != job.attention)
        c.fix.job = p.job;
      if (c.fix.peak >= baseline.peak) {
        c.fix.skipped = true;
        c.fix.note = "no saving predicted: the peak (" + bb.peak_phase + ") does not change (" + c.fix.note + ")";
      }
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::unsupported && e.kind() != ErrorKind::invalid_job) throw;
      c.fix.skipped = true;
      c.fix.note = std::string("not modelled: ") + e.what();
    }
  }

  // ---- combined: stack the single-GPU job-equivalent fixes until the job fits ----
  bool single_fits = false;
  for (const auto& c : cands)
    if (!c.fix.skipped && c.fix.fits && c.fix.cost_class <= CostClass::numerics) single_fits = true;
  if (!single_fits && !fits(baseline.peak + overhead, device, headroom)) {
    std::vector<const Candidate*> stack;
    for (const auto& c : cands)
      if (!c.fix.skipped && c.single_gpu_stackable && c.apply) stack.push_back(&c);
    std::sort(stack.begin(), stack.end(), [](const Candidate* a, const Candidate* b) {
      return std::tie(a->fix.cost_class, a->fix.compute) < std::tie(b->fix.cost_class, b->fix.compute);
    });
    Plan p = base;
    Fix f;
    f.name = "combined";
    f.cost_class = CostClass::numerics;
    std::string names;
    for (std::size_t i = 0; i < stack.size(); ++i) {
      p = stack[i]->apply(p);
      names += (i ? " + " : "") + stack[i]->fix.name;
      f.change += (i ? "; " : "") + stack[i]->fix.change;
      f.compute += stack[i]->fix.compute;
      f.cost_class = std::max(f.cost_class, stack[i]->fix.cost_class);
      const Evaluated e = evaluate(model, p);
      f.peak = e.peak;
      f.required = checked_add(e.peak, overhead, "advise: required");
      f.fits = fits(f.required, device, headroom);
      if (f.fits) break;
    }
    if (!stack.empty()) {
      f.name = "combined";
      f.cost = pct(f.compute) + " compute: the costs of its parts";
      f.note = (f.fits ? "the cheapest fixes above stacked in rank order until the job fits: "
                       : "all single-GPU fixes above stacked, still does not fit: ") + names;
      f.job = p.job;
      Candidate c;
      c.fix = f;
      cands.push_back(std::move(c));
    }
  }

  // ---- micro-batch with gradient accumulation: the largest b' < b that fits ----
  {
    Fix f;
    f.name = "smaller micro-batch";
    f.cost_class = CostClass::micro_batch;
    f.compute = 0.10;
    if (job.batch <= 1) {
      f.skipped = true;
      f.note = "micro-batch is already 1 (shorten --seq, or use the fixes above)";
    } else {
      std::uint64_t lo = 1, hi = job.batch - 1, best = 0;
      Evaluated at_best{};
      while (lo <= hi) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        Plan p = base;
        p.job.batch = mid;
        Evaluated e = evaluate(model, p);
        if (fits(e.peak + overhead, device, headroom)) {
          best = mid;
          at_best = std::move(e);
          lo = mid + 1;
        } else {
          hi = mid - 1;
        }
      }
      const std::uint64_t b2 = best ? best : 1;
      if (!best) {
        Plan p = base;
        p.job.batch = 1;
        at_best = evaluate(model, p);
      }
      const std::uint64_t accum = (job.batch + b2 - 1) / b2;
      f.peak = at_best.peak;
      f.required = checked_add(f.peak, overhead, "advise: required");
      f.fits = fits(f.required, device, headroom);
      Job j = job;
      j.batch = b2;
      f.job = j;
      f.change = "--batch " + std::to_string(b2) + " with " + std::to_string(accum) + " gradient-accumulation steps";
      f.cost = "same tokens per optimizer step (" + std::to_string(b2 * accum) + " sequences" +
               (b2 * accum != job.batch ? ", not exactly " + std::to_string(job.batch) : std::string()) +
               "); smaller matmuls use the GPU less efficiently (~+10% time), more steps per update";
      f.note = f.fits ? "the largest micro-batch that fits" : "does not fit even at micro-batch 1";
    }
    Candidate c;
    c.fix = f;
    cands.push_back(std::move(c));
  }

  std::vector<Fix> out;
  for (auto& c : cands) out.push_back(std::move(c.fix));
  std::stable_sort(out.begin(), out.end(), [](const Fix& a, const Fix& b) {
    return std::make_tuple(a.skipped, a.cost_class, a.compute, a.transfer_s) <
           std::make_tuple(b.skipped, b.cost_class, b.compute, b.transfer_s);
  });
  return out;
}

}  // namespace membudget
