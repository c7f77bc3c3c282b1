// Rendering a Budget. Computing is kept apart from printing: nothing here changes a number.
#include "membudget/report.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "membudget/input.hpp"
#include "pipeline.hpp"

namespace membudget {
namespace {

using nlohmann::ordered_json;

// A parameter count as the table writes it: 1.23581B, 119.104K, 48 (never 1.19104e-04B).
std::string parameter_count(std::uint64_t n) {
  static constexpr std::pair<double, const char*> kUnits[] = {{1e9, "B"}, {1e6, "M"}, {1e3, "K"}};
  std::ostringstream out;
  for (const auto& [unit, suffix] : kUnits)
    if (static_cast<double>(n) >= unit) {
      out << static_cast<double>(n) / unit << suffix;
      return out.str();
    }
  out << n;
  return out.str();
}

ordered_json tensors_json(const std::vector<TensorBytes>& ts) {
  ordered_json a = ordered_json::array();
  for (const auto& t : ts)
    a.push_back({{"name", t.name}, {"op", t.op}, {"dtype", t.dtype}, {"shape", t.shape},
                 {"count", t.count}, {"bytes", t.bytes}, {"term", to_string(t.term)},
                 {"role", to_string(t.role)}});
  return a;
}

ordered_json phases_json(const std::vector<PhasePeak>& phases) {
  ordered_json o = ordered_json::object();
  for (const auto& p : phases) o[p.name()] = p.bytes;
  return o;
}

ordered_json job_json(const Job& j) {
  ordered_json o = {{"mode", to_string(j.mode)},
                    {"batch", j.batch},
                    {"seq", j.seq},
                    {"precision", to_string(j.precision)},
                    {"optimizer", to_string(j.optimizer)},
                    {"recompute", to_string(j.recompute)},
                    {"attention", to_string(j.attention)},
                    {"loss", to_string(j.loss)},
                    {"activations", to_string(j.activations)},
                    {"profile", to_string(j.profile)}};
  // torch.optim's implementation the step runs (null for adamw-8bit and lion: not torch.optim)
  if (const auto impl = effective_optimizer_impl(j)) o["optimizer_impl"] = to_string(*impl);
  else o["optimizer_impl"] = nullptr;
  if (j.loss == Loss::chunked) o["loss_chunk"] = j.loss_chunk;
  if (j.mode == Mode::train && j.lora_rank) o["lora_rank"] = j.lora_rank;
  if (j.mode == Mode::train && j.grad_accum_steps > 1) o["grad_accum_steps"] = j.grad_accum_steps;
  if (!j.parallel.single()) {
    const Parallelism& p = j.parallel;
    ordered_json par = {{"dp", p.data}, {"fsdp", p.fsdp}, {"zero", p.zero_stage}, {"tp", p.tensor}, {"pp", p.pipeline},
                        {"cp", p.context}, {"ep", p.expert}, {"world", p.world()}};
    if (p.pipeline > 1) {
      par["pp_schedule"] = to_string(p.pp_schedule);
      par["microbatches"] = p.microbatches ? p.microbatches : p.pipeline;
      if (!p.pp_layers.empty()) par["pp_layers"] = p.pp_layers;
    }
    if (p.fsdp > 1 || p.zero_stage >= 2 || p.context > 1) par["reshard_after_forward"] = p.zero_stage >= 2 ? p.zero_stage == 3 : p.reshard_after_forward;
    if (p.ddp_bucket_view) par["ddp_bucket_view"] = true;
    if (p.sequence_parallel) par["sp"] = true;
    if (p.fsdp_offload) par["fsdp_offload"] = true;
    if ((p.fsdp > 1 || p.zero_stage >= 2) && j.mode == Mode::train && j.grad_accum_steps > 1)
      par["fsdp_grad_sync"] = p.fsdp_grad_sync_last ? "last" : "every";
    if (p.loss_parallel) par["loss_parallel"] = true;
    par["rank"] = p.rank ? ordered_json(*p.rank) : ordered_json(nullptr);
    o["parallel"] = par;
  }
  if (j.mode == Mode::infer) {
    o["weights"] = to_string(j.weights);
    o["kv_dtype"] = to_string(j.kv_dtype);
    if (j.weights == DType::int4 || j.weights == DType::int8) o["group_size"] = j.group_size;
  }
  return o;
}


std::vector<TensorBytes> top_tensors(const PhasePeak* p, std::size_t n) {
  if (!p) return {};
  std::vector<TensorBytes> v = p->live;
  std::sort(v.begin(), v.end(), [](const TensorBytes& a, const TensorBytes& b) { return a.bytes > b.bytes; });
  if (v.size() > n) v.resize(n);
  return v;
}

std::string bar(bytes_t v, bytes_t max, int width = 30) {
  if (max == 0) return "";
  int n = static_cast<int>(static_cast<double>(v) / static_cast<double>(max) * width + 0.5);
  std::string s;
  for (int i = 0; i < n; ++i) s += "█";
  return s;
}

std::string rpad(std::string s, std::size_t w) {
  if (s.size() < w) s.insert(0, w - s.size(), ' ');
  return s;
}

}  // namespace

std::string layout_label(const Parallelism& p) {
  const std::string n = std::to_string(p.world());
  if (p.expert > 1)
    return "expert parallel over " + n + " ranks (transformers' ep_plan: experts / " + std::to_string(p.expert) +
           " per rank, the rest replicated" +
           (p.fsdp > 1 ? ", FSDP2 across over " + std::to_string(p.fsdp) + (p.reshard_after_forward ? "" : ", no reshard after forward")
                       : std::string()) +
           ")";
  if (p.tensor > 1 && p.pipeline <= 1) {
    // the data-parallel dimension across the TP groups: FSDP2, or HSDP
    const std::string across = p.fsdp <= 1 ? ""
                               : p.data > 1 ? ", HSDP across: " + std::to_string(p.data) + " replicas × FSDP2 over " + std::to_string(p.fsdp)
                                            : ", FSDP2 across over " + std::to_string(p.fsdp);
    return "tensor parallel over " + n + " ranks (DTensor over " + std::to_string(p.tensor) +
           (p.sequence_parallel ? ", sequence parallel" : "") + (p.loss_parallel ? ", vocabulary-parallel loss" : "") + across + ")";
  }
  if (p.pipeline > 1) {
    const std::string schedule = p.pp_schedule == PipelineSchedule::gpipe ? "GPipe"
                                 : p.pp_schedule == PipelineSchedule::interleaved
                                     ? "interleaved 1F1B, " + std::to_string(p.virtual_stages) + " stage modules per rank"
                                     : "1F1B";
    // within each stage (the ("pp", "dp", "tp") mesh): tensor parallel, then FSDP2 or DDP
    std::string within = p.tensor > 1 ? ", DTensor over " + std::to_string(p.tensor) + " ranks" : "";
    if (p.fsdp > 1)
      within += ", FSDP2 over " + std::to_string(p.fsdp) + (p.tensor > 1 ? " across them" : " ranks") +
                (p.reshard_after_forward ? ", reshard after forward" : ", no reshard after forward");
    else if (p.data > 1)
      within += ", DDP over " + std::to_string(p.data) + " replicas" + (p.ddp_bucket_view ? " (gradient_as_bucket_view)" : "");
    if (!within.empty()) within += " within each stage";
    return "pipeline of " + std::to_string(p.pipeline) + " stages over " + n + " ranks (" + schedule + ", " +
           std::to_string(p.microbatches ? p.microbatches : p.pipeline) + " microbatches" + within + ")";
  }
  if (p.context > 1)
    return "context parallel over " + std::to_string(p.context) + " ranks (ring attention), FSDP2 over " + n + " ranks" +
           (p.reshard_after_forward ? " (reshard after forward)" : " (no reshard after forward)");
  if (p.fsdp > 1 && p.data > 1)
    return "HSDP: FSDP2 over " + std::to_string(p.fsdp) + " ranks × " + std::to_string(p.data) + " replicas" +
           (p.reshard_after_forward ? " (reshard after forward)" : " (no reshard after forward)");
  if (p.fsdp > 1)
    return "FSDP2 over " + n + " ranks" + (p.reshard_after_forward ? " (reshard after forward" : " (no reshard after forward") +
           (p.fsdp_offload ? ", CPU offload)" : ")");
  if (p.zero_stage >= 2) return "ZeRO-" + std::to_string(p.zero_stage) + " (FSDP2) over " + n + " ranks";
  if (p.zero_stage == 1) return "DDP + ZeRO-1 (ZeroRedundancyOptimizer) over " + n + " ranks";
  return "DDP over " + n + " ranks" + (p.ddp_bucket_view ? " (gradient_as_bucket_view)" : "");
}

std::string pad_columns(std::string s, std::size_t width) {
  std::size_t cols = 0;  // display columns: UTF-8 continuation bytes do not count
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++cols;
  if (cols < width) s.append(width - cols, ' ');
  return s;
}

Format parse_format(std::string_view s) {
  if (s == "table") return Format::table;
  if (s == "json") return Format::json;
  if (s == "csv") return Format::csv;
  if (s == "markdown" || s == "md") return Format::markdown;
  throw Error(ErrorKind::invalid_argument,
              "--format: '" + std::string(s) + "' is not one of table, json, csv, markdown");
}

std::string to_json_string(const Budget& b, const std::optional<Fit>& fit, bool explain, int indent) {
  ordered_json j;
  j["model"] = {{"name", b.model.name}, {"parameters", b.parameters.total}, {"active_parameters", b.parameters.active}};
  if (b.model.moe.enabled())
    j["model"]["moe"] = {{"experts", b.model.moe.experts}, {"top_k", b.model.moe.top_k}};
  j["job"] = job_json(b.job);
  if (b.model.moe.enabled()) {
    j["job"]["experts"] = to_string(b.job.experts);
    j["job"]["routing"] = to_string(b.job.routing);
    if (b.job.mode == Mode::train) j["job"]["router_aux_loss"] = b.job.router_aux_loss || b.model.moe.output_router_logits;
  }
  j["terms"] = {{"model_states", b.terms.model_states},
                {"activations", b.terms.activations},
                {"logits_loss", b.terms.logits_loss},
                {"kv_cache", b.terms.kv_cache},
                {"overhead", b.terms.overhead}};
  ordered_json br;
  br["model_states"] = {{"weights", b.states.weights},
                        {"gradients", b.states.gradients},
                        {"master", b.states.master},
                        {"optimizer", b.states.optimizer}};
  br["activations"] = {{"model", to_string(b.job.activations)},
                       {"per_layer", b.activations.per_layer},
                       {"layers", b.activations.layers},
                       {"other", b.activations.other},
                       {"tensors", tensors_json(b.activations.layer_tensors)}};
  br["logits_loss"] = {{"logits", b.logits.logits},
                       {"upcast", b.logits.upcast},
                       {"loss_saved", b.logits.loss_saved},
                       {"logits_grad", b.logits.logits_grad}};
  br["autocast_cache"] = b.autocast_cache;
  j["breakdown"] = br;
  j["phases"] = phases_json(b.phases);
  if (!b.step0.empty()) j["step0"] = phases_json(b.step0);
  j["peak"] = b.peak;
  j["peak_phase"] = b.peak_phase;
  if (!b.job.parallel.single()) {
    j["rank"] = b.rank;  // the rank these figures are for (the most loaded unless --rank)
    if (b.job.parallel.pipeline > 1) {  // that rank's stage
      const detail::PipelineStage st = detail::pipeline_stage(b.model, b.job, b.rank);
      j["stage"] = {{"first_layer", st.chunks.front().first_layer}, {"layers", st.layers}, {"embedding", st.first()}, {"lm_head", st.last()}};
      if (st.chunks.size() > 1) {  // interleaved 1F1B: the rank's stage modules
        ordered_json chunks = ordered_json::array();
        for (const auto& c : st.chunks) chunks.push_back({{"stage", c.index}, {"first_layer", c.first_layer}, {"layers", c.layers}});
        j["stage"]["chunks"] = chunks;
      }
    }
    if (!b.ranks.empty()) {
      ordered_json groups = ordered_json::array();
      for (const auto& g : b.ranks)
        groups.push_back({{"ranks", g.ranks}, {"phases", phases_json(g.phases)}, {"step0", phases_json(g.step0)}, {"peak", g.peak}});
      j["ranks"] = groups;
    }
  }
  if (b.job.parallel.fsdp_offload)
    j["host"] = {{"parameters", b.host.parameters}, {"gradients", b.host.gradients},
                 {"optimizer_state", b.host.optimizer_state}, {"total", b.host.total()}};
  if (b.reserved_peak) {  // PredictOptions::reserved
    j["reserved_peak"] = b.reserved_peak;
    j["nvidia_smi"] = b.nvidia_smi();
    j["reserved_phases"] = phases_json(b.reserved);
    j["reserved_step0"] = phases_json(b.reserved_step0);
  }
  if (explain) {
    ordered_json ex = ordered_json::object();
    for (const auto& p : b.phases) ex[p.name()] = tensors_json(p.live);
    for (const auto& p : b.step0) ex[phase_label(p.phase, true)] = tensors_json(p.live);
    j["explain"] = ex;
  }
  if (fit) {
    j["device"] = {{"name", fit->device.name},
                   {"capacity", fit->capacity},
                   {"required", fit->required},
                   {"basis", fit->on_reserved ? "reserved" : "allocated"},
                   {"allocated_required", fit->allocated_required},
                   {"headroom", fit->headroom},
                   {"fits", fit->fits}};
  }
  return j.dump(indent);
}

std::string render(const Budget& b, const std::optional<Fit>& fit, const ReportOptions& o) {
  std::ostringstream out;
  switch (o.format) {
    case Format::json: return to_json_string(b, fit, o.explain) + "\n";
    case Format::csv: {
      out << "section,name,bytes\n";
      out << "terms,model_states," << b.terms.model_states << "\n";
      out << "terms,activations," << b.terms.activations << "\n";
      out << "terms,logits_loss," << b.terms.logits_loss << "\n";
      out << "terms,kv_cache," << b.terms.kv_cache << "\n";
      out << "terms,overhead," << b.terms.overhead << "\n";
      for (const auto& p : b.phases) out << "phases," << p.name() << "," << p.bytes << "\n";
      for (const auto& p : b.step0) out << "step0," << p.name() << "," << p.bytes << "\n";
      out << "peak," << b.peak_phase << "," << b.peak << "\n";
      if (fit) out << "device," << fit->device.name << "," << fit->required << "\n";
      return out.str();
    }
    case Format::markdown: {
      out << "## " << printable(b.model.name) << " — " << to_string(b.job.mode) << ", batch " << b.job.batch << " × seq "
          << b.job.seq << ", " << to_string(b.job.precision) << "\n\n";
      out << "| term | bytes | size |\n|---|---:|---:|\n";
      const std::pair<const char*, bytes_t> terms[] = {{"model states", b.terms.model_states},
                                                       {"activations", b.terms.activations},
                                                       {"logits and loss", b.terms.logits_loss},
                                                       {"KV cache", b.terms.kv_cache},
                                                       {"overhead", b.terms.overhead}};
      for (const auto& [n, v] : terms) out << "| " << n << " | " << v << " | " << format_bytes(v) << " |\n";
      out << "\n| phase | bytes | size |\n|---|---:|---:|\n";
      for (const auto& p : b.phases) out << "| " << p.name() << " | " << p.bytes << " | " << format_bytes(p.bytes) << " |\n";
      for (const auto& p : b.step0)
        out << "| " << phase_label(p.phase, true) << " | " << p.bytes << " | " << format_bytes(p.bytes) << " |\n";
      out << "\nPeak: **" << format_bytes(b.peak) << "** in `" << b.peak_phase << "`.\n";
      if (fit)
        out << "\n" << (fit->fits ? "Fits" : "Does not fit") << " " << fit->device.name << " ("
            << format_bytes(fit->required) << " required of " << format_bytes(fit->capacity) << ", "
            << static_cast<int>(fit->headroom * 100 + 0.5) << "% headroom).\n";
      return out.str();
    }
    case Format::table: break;
  }
  // A readable table.
  out << printable(b.model.name) << " · " << parameter_count(b.parameters.total) << " parameters";
  if (b.model.moe.enabled())
    out << " (" << parameter_count(b.parameters.active) << " active: top " << b.model.moe.top_k << " of "
        << b.model.moe.experts << " experts)";
  out << " · " << to_string(b.job.mode) << " · batch " << b.job.batch << " × seq " << b.job.seq << " · ";
  if (b.job.mode == Mode::infer)
    out << "weights " << to_string(b.job.weights) << " · KV " << to_string(b.job.kv_dtype)
        << (b.job.profile == Profile::harness ? " · membudget harness: prefill into a KV pool of seq + 1 tokens, then one decode step"
                                              : " · HF prefill with logits_to_keep=1, then one decode step");
  else
    out << to_string(b.job.precision);
  if (b.job.mode == Mode::train)
    out << " · " << to_string(b.job.optimizer)
        << (b.job.optimizer_impl ? std::string(" (") + to_string(*b.job.optimizer_impl) + ")" : std::string())
        << " · recompute " << to_string(b.job.recompute) << " · "
        << to_string(b.job.attention) << " attention · " << to_string(b.job.loss) << " loss"
        << (b.job.lora_rank ? " · LoRA rank " + std::to_string(b.job.lora_rank) + " (base frozen)" : std::string())
        << (b.job.grad_accum_steps > 1 ? " · " + std::to_string(b.job.grad_accum_steps) + " accumulation steps" : std::string());
  if (!b.job.parallel.single())
    out << "\n" << layout_label(b.job.parallel) << " · rank " << b.rank << " of " << b.world
        << (b.job.parallel.rank ? "" : " (the most loaded)")
        << (b.ranks.size() > 1 ? " · " + std::to_string(b.ranks.size()) + " groups of ranks differ (--format json: ranks)" : std::string());
  out << "\n\nTerms\n";
  const std::pair<const char*, bytes_t> terms[] = {{"model states", b.terms.model_states},
                                                   {"activations", b.terms.activations},
                                                   {"logits and loss", b.terms.logits_loss},
                                                   {"KV cache", b.terms.kv_cache},
                                                   {"overhead", b.terms.overhead}};
  bytes_t tmax = 0;
  for (const auto& [n, v] : terms) tmax = std::max(tmax, v);
  for (const auto& [n, v] : terms)
    out << "  " << pad_columns(n, 17) << rpad(format_bytes(v), 11) << "  " << bar(v, tmax) << "\n";
  if (b.job.mode == Mode::train) {
    out << "    weights " << format_bytes(b.states.weights) << ", gradients " << format_bytes(b.states.gradients)
        << ", master " << format_bytes(b.states.master) << ", optimizer " << format_bytes(b.states.optimizer) << "\n";
    if (b.job.parallel.fsdp_offload)
      out << "    host memory (CPU offload): " << format_bytes(b.host.total()) << " — shards "
          << format_bytes(b.host.parameters) << ", gradients " << format_bytes(b.host.gradients) << ", optimizer state "
          << format_bytes(b.host.optimizer_state) << "\n";
    out << "    activations (" << to_string(b.job.activations) << "): " << format_bytes(b.activations.per_layer)
        << " per layer × " << b.activations.layers << " layers";
    if (b.activations.other) out << " + " << format_bytes(b.activations.other) << " outside the layers";
    out << "\n";
  }
  if (b.job.mode == Mode::infer) {
    out << "    weights " << format_bytes(b.states.weights) << " (" << to_string(b.job.weights) << "); KV cache "
        << b.terms.kv_cache << " B for " << b.job.batch << " × "
        << (b.job.profile == Profile::harness ? b.job.seq + 1 : b.job.seq) << " tokens; activations: "
        << format_bytes(b.activations.other) << " transient at the prefill peak\n";
  }
  // With reserved memory: allocated and reserved side by side.
  const bool with_reserved = b.reserved_peak != 0;
  auto reserved_of = [with_reserved](const std::vector<PhasePeak>& list, Phase ph) -> std::string {
    std::string cell;
    if (!with_reserved) return cell;
    for (const auto& p : list)
      if (p.phase == ph) cell = format_bytes(p.bytes);
    cell = rpad(cell, 12);
    return cell;
  };
  if (with_reserved)
    out << "\nPhases            allocated    reserved\n";
  else
    out << "\nPhases (max_memory_allocated)\n";
  bytes_t pmax = b.peak;
  for (const auto& p : b.phases)
    out << "  " << pad_columns(p.name(), 17) << rpad(format_bytes(p.bytes), 11)
        << reserved_of(b.reserved, p.phase) << "  " << bar(p.bytes, pmax)
        << (p.name() == b.peak_phase ? "  ← peak" : "") << "\n";
  if (!b.step0.empty()) {
    out << "  step 0 (no optimizer state yet)\n";
    for (const auto& p : b.step0)
      out << "  " << pad_columns(std::string("  ") + p.name(), 17) << rpad(format_bytes(p.bytes), 11)
          << reserved_of(b.reserved_step0, p.phase) << "  "
          << bar(p.bytes, pmax) << (phase_label(p.phase, true) == b.peak_phase ? "  ← peak" : "") << "\n";
  }
  if (with_reserved)
    out << "  reserved after a steady step " << format_bytes(b.reserved_peak) << " (memory_reserved()); nvidia-smi "
        << format_bytes(b.nvidia_smi()) << " with " << format_bytes(b.terms.overhead) << " outside the allocator\n";
  out << "\nPeak " << format_bytes(b.peak) << " in " << b.peak_phase;
  auto top = top_tensors(b.peak_entry(), o.top);
  if (!top.empty()) {
    out << ", made of:\n";
    for (const auto& t : top) {
      out << "  " << rpad(format_bytes(t.bytes), 11) << "  " << t.name;
      if (t.count > 1) out << " ×" << t.count;
      if (t.dtype[0]) out << " (" << t.dtype << ")";
      out << "\n";
    }
  } else {
    out << "\n";
  }
  if (fit) {
    out << "\n" << (fit->fits ? "FITS " : "DOES NOT FIT ") << fit->device.name << ": needs "
        << format_bytes(fit->required) << " ("
        << (fit->on_reserved ? "reserved after a steady step + " : "peak + ") << format_bytes(b.terms.overhead)
        << " outside the allocator";
    if (fit->on_reserved) out << "; the allocated peak + outside is " << format_bytes(fit->allocated_required);
    out << ") of " << format_bytes(fit->capacity) << " with " << static_cast<int>(fit->headroom * 100 + 0.5)
        << "% headroom\n";
  }
  return out.str();
}

}  // namespace membudget
