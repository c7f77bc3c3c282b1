// membudget serve MODEL --device NAME: the KV pool vLLM would allocate, in vLLM's own words.
#include <cctype>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.hpp"
#include "job_flags.hpp"
#include "membudget/input.hpp"
#include "membudget/job_yaml.hpp"
#include "membudget/serving.hpp"
#include "membudget/spec.hpp"

namespace membudget::cli {
namespace {

struct ServeFlags {
  std::string model_path, device, device_memory, utilization = "0.9", max_model_len, max_batched, max_seqs,
      block_size = "16", kv_dtype = "bf16", weights = "bf16", group_size = "128", non_torch, cudagraph, traffic,
      format = "table";
};

std::uint64_t count(const std::string& text, const char* option) {
  const std::uint64_t v = parse_whole(text, option, 0, ~std::uint64_t{0});  // (past 64 bits: absurdly large)
  if (v == 0) throw Error(ErrorKind::invalid_argument, std::string(option) + ": must be at least 1");
  return v;
}

double fraction(const std::string& text, const char* option) {
  if (const std::optional<double> v = decimal_fraction(text)) return *v;
  throw Error(ErrorKind::invalid_argument, std::string(option) + ": '" + text + "' is not a decimal fraction such as 0.9");
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string row(const std::string& label, const std::string& value, const std::string& note = "") {
  std::string s = "  " + label;
  std::size_t cols = 0;
  for (unsigned char c : label)
    if ((c & 0xC0) != 0x80) ++cols;
  if (cols < 22) s.append(22 - cols, ' ');
  std::string v = value;
  if (v.size() < 12) v.insert(0, 12 - v.size(), ' ');
  s += v;
  if (!note.empty()) s += "   " + note;
  return s + "\n";
}

nlohmann::ordered_json plan_json(const ModelSpec& m, const Device& dev, const ServePlan& p,
                                 const std::optional<TrafficFit>& tf) {
  nlohmann::ordered_json j;
  j["model"] = {{"name", m.name}, {"parameters", m.parameters().total}, {"active_parameters", m.parameters().active}};
  j["device"] = {{"name", dev.name}, {"total_memory", p.total_memory}};
  j["config"] = {{"gpu_memory_utilization", p.gpu_memory_utilization},
                 {"max_model_len", p.max_model_len},
                 {"max_num_batched_tokens", p.max_num_batched_tokens},
                 {"max_num_seqs", p.max_num_seqs},
                 {"block_size", p.block_size},
                 {"kv_dtype", to_string(p.kv_dtype)},
                 {"weights", to_string(p.weights_dtype)}};
  j["memory"] = {{"requested", p.requested},           {"weights", p.weights},
                 {"activation_peak", p.activation_peak}, {"non_torch", p.non_torch},
                 {"cudagraph", p.cudagraph},           {"non_kv", p.non_kv},
                 {"available_kv", p.available}};
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const auto& g : p.groups)
    groups.push_back({{"kind", g.kind}, {"layers", g.layers}, {"window", g.window},
                      {"max_usage_per_layer", g.max_usage_per_layer}});
  j["pool"] = {{"kv_bytes_per_token", kv_bytes_per_token(m, p.kv_dtype)},
               {"page_size", p.page_size},
               {"layers_per_group", p.group_size},
               {"groups", groups},
               {"num_blocks", p.num_blocks},
               {"pool_bytes", p.pool_bytes},
               {"kv_tokens", p.kv_tokens},
               {"blocks_per_request", p.blocks_per_request},
               {"max_concurrency", p.max_concurrency},
               {"needed_one_request", p.needed_one_request}};
  j["log"] = nlohmann::ordered_json::array();
  if (p.available > 0) {
    j["log"].push_back(p.kv_cache_size_line());
    j["log"].push_back(p.concurrency_line());
  }
  j["fits_one_request"] = p.fits_one_request;
  if (!p.fits_one_request) {
    j["error"] = p.error;
    if (p.estimated_max_model_len) j["estimated_max_model_len"] = p.estimated_max_model_len;
  }
  if (tf) {
    j["traffic"] = {{"concurrency", tf->traffic.concurrency},
                    {"mean_context", tf->traffic.mean_context},
                    {"max_context", tf->traffic.max_context},
                    {"blocks_needed", tf->blocks_needed},
                    {"bytes_needed", tf->bytes_needed},
                    {"fits", tf->fits},
                    {"oversize", tf->oversize},
                    {"excess_bytes", tf->excess_bytes}};
    if (tf->suggested_utilization > 0) j["traffic"]["suggested_gpu_memory_utilization"] = tf->suggested_utilization;
    if (!tf->fits) j["traffic"]["reason"] = tf->reason;
  }
  return j;
}

std::string plan_text(const ModelSpec& m, const Device& dev, const ServePlan& p, const std::optional<TrafficFit>& tf) {
  std::ostringstream out;
  out << printable(m.name) << " on " << dev.name << " (" << format_bytes(p.total_memory) << ") · vLLM · weights "
      << to_string(p.weights_dtype) << " · KV " << to_string(p.kv_dtype) << " · max_model_len " << p.max_model_len
      << " · max_num_batched_tokens " << p.max_num_batched_tokens << " · block " << p.block_size << "\n\n";
  out << row("requested memory", format_bytes(p.requested),
             "total × gpu_memory_utilization " + fixed(p.gpu_memory_utilization, 2));
  out << row("− model weights", format_bytes(p.weights), to_string(p.weights_dtype));
  out << row("− activation peak", format_bytes(p.activation_peak),
             "profiling run: " + std::to_string(p.max_num_batched_tokens) + " tokens, sampler over " +
                 std::to_string(std::min(p.max_num_seqs, p.max_num_batched_tokens)) + " sequences");
  out << row("− non-torch memory", format_bytes(p.non_torch), "growth outside PyTorch during profiling");
  if (p.cudagraph) out << row("− CUDA graphs", format_bytes(p.cudagraph));
  if (p.available > 0) {
    out << row("= KV cache memory", format_bytes(static_cast<bytes_t>(p.available)),
               "\"Available KV cache memory: " + vllm_gib(static_cast<bytes_t>(p.available)) + " GiB\"");
  } else {
    out << row("= KV cache memory", "none", "requested memory is used up before the cache");
  }
  out << "\n";
  out << row("KV per token", format_bytes(kv_bytes_per_token(m, p.kv_dtype)),
             std::to_string(m.num_layers) + " layers" + (m.mla.enabled() ? " (MLA latent)" : ""));
  out << row("page (block × layer)", format_bytes(p.page_size),
             std::to_string(p.block_size) + " tokens");
  std::string groups;
  for (const auto& g : p.groups) {
    if (!groups.empty()) groups += ", ";
    groups += g.kind + (g.window ? " (window " + std::to_string(g.window) + ")" : "");
  }
  out << row("KV cache groups", std::to_string(p.groups.size()),
             std::to_string(p.group_size) + " layers each: " + groups);
  out << row("blocks", std::to_string(p.num_blocks), format_bytes(p.pool_bytes) + " pool");
  out << row("blocks per request", std::to_string(p.blocks_per_request),
             "at max_model_len " + std::to_string(p.max_model_len));
  out << "\n";
  if (p.available > 0) {
    out << p.kv_cache_size_line() << "\n" << p.concurrency_line() << "\n";
  }
  if (tf) {
    const auto& t = tf->traffic;
    out << "\nTraffic: " << t.concurrency << " requests × " << t.mean_context << " tokens (max " << t.max_context
        << "): " << tf->blocks_needed << " blocks, " << format_bytes(tf->bytes_needed) << "\n";
    if (tf->fits) {
      out << "  FITS: the pool is " << fixed(tf->oversize, 2) << "× what this traffic needs; "
          << format_bytes(tf->excess_bytes) << " of it stays idle (--gpu-memory-utilization "
          << fixed(tf->suggested_utilization, 2) << " would hold it)\n";
    } else {
      out << "  DOES NOT FIT: " << tf->reason;
      if (tf->suggested_utilization > 0 && tf->suggested_utilization <= 1.0)
        out << " (--gpu-memory-utilization " << fixed(tf->suggested_utilization, 2) << " would hold it)";
      out << "\n";
    }
  }
  return out.str();
}

Registrar reg("serve", 20, [](CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "size vLLM's KV cache pool: blocks, tokens, maximum concurrency");
  cmd->add_option("model", f->model_path, "model spec: our YAML (configs/*.yaml) or a Hugging Face config.json")
      ->required();
  cmd->add_option("--device", f->device, "card: H100, H200, A100-80GB, L40S, …");
  cmd->add_option("--device-memory", f->device_memory, "total memory instead of --device, e.g. 80GiB");
  cmd->add_option("--gpu-memory-utilization", f->utilization, "fraction of the card vLLM may use, in (0, 1] (default 0.9)");
  cmd->add_option("--max-model-len", f->max_model_len, "context length per request (default: the model's)");
  cmd->add_option("--max-num-batched-tokens", f->max_batched,
                  "tokens per scheduler step, the profiling run's size (default 8192 on ≥70 GiB cards but A100, else 2048)");
  cmd->add_option("--max-num-seqs", f->max_seqs, "sequences per step (default 1024 on ≥70 GiB cards but A100, else 256)");
  cmd->add_option("--block-size", f->block_size, "tokens per KV block (default 16)");
  cmd->add_option("--kv-dtype", f->kv_dtype, "KV cache dtype: bf16 (default) | fp16 | fp8 | int8 | fp32");
  cmd->add_option("--weights", f->weights, "weight precision: bf16 (default) | fp16 | fp8 | int8 | int4 | fp32");
  cmd->add_option("--group-size", f->group_size, "group size of int4/int8 scales (default 128)");
  cmd->add_option("--non-torch", f->non_torch, "memory growth outside PyTorch during profiling (default 128MiB)");
  cmd->add_option("--cudagraph-memory", f->cudagraph, "CUDA graph memory vLLM subtracts (default 0)");
  cmd->add_option("--traffic", f->traffic, "requests × context to check: 64x2048 or CONCURRENCY:MEAN:MAX");
  cmd->add_option("--format", f->format, "table (default) | json");
  cmd->callback([f, cmd] {
    // (read once: a pipe or a FIFO given as the spec cannot be read twice)
    const std::string spec_text = read_spec_file(f->model_path);
    const ModelSpec spec = parse_model(spec_text, f->model_path);
    // A YAML spec's job: section is the training (or predict) job, none of whose settings is a vLLM
    // option; it is checked as predict checks it, so that one file is valid for both commands, and
    // not applied.
    (void)parse_job_section(spec_text, f->model_path, Job{});
    require_one_of(f->format, "--format", {"table", "json"});
    if (!f->device.empty() && !f->device_memory.empty())
      throw Error(ErrorKind::invalid_argument, "--device and --device-memory: give one, not both");
    if (f->device.empty() && f->device_memory.empty())
      throw Error(ErrorKind::invalid_argument, "serve: --device NAME (or --device-memory SIZE) is required");
    const Device dev = f->device.empty()
                           ? Device{"custom (" + f->device_memory + ")", parse_bytes(f->device_memory, "--device-memory")}
                           : find_device(f->device);
    ServeOptions o;
    o.total_memory = dev.capacity;
    o.device_name = dev.name;
    o.gpu_memory_utilization = fraction(f->utilization, "--gpu-memory-utilization");
    if (!f->max_model_len.empty()) o.max_model_len = count(f->max_model_len, "--max-model-len");
    if (!f->max_batched.empty()) o.max_num_batched_tokens = count(f->max_batched, "--max-num-batched-tokens");
    if (!f->max_seqs.empty()) o.max_num_seqs = count(f->max_seqs, "--max-num-seqs");
    o.block_size = count(f->block_size, "--block-size");
    o.kv_dtype = parse_kv_dtype(f->kv_dtype);
    o.weights = parse_dtype(f->weights, "--weights");
    o.group_size = count(f->group_size, "--group-size");
    if (cmd->count("--group-size") && o.weights != DType::int4 && o.weights != DType::int8)
      throw Error(ErrorKind::invalid_argument, std::string("--group-size: applies only with --weights int4 or int8, not ") +
                                                   to_string(o.weights));
    if (!f->non_torch.empty()) o.non_torch = parse_bytes(f->non_torch, "--non-torch");
    if (!f->cudagraph.empty()) o.cudagraph = parse_bytes(f->cudagraph, "--cudagraph-memory");
    const ServePlan plan = plan_serving(spec, o);
    std::optional<TrafficFit> tf;
    if (!f->traffic.empty()) tf = fit_traffic(spec, plan, parse_traffic(f->traffic));
    if (f->format == "json")
      std::cout << plan_json(spec, dev, plan, tf).dump(2) << "\n";
    else
      std::cout << plan_text(spec, dev, plan, tf);
    std::cout.flush();
    require_one_request(plan);
    if (tf && !tf->fits) set_exit_status(1);
  });
});

}  // namespace
}  // namespace membudget::cli
