// Shared fixtures for the tests.
#pragma once

#include <array>
#include <cstdio>
#include <string>

#include "membudget/budget.hpp"
#include "membudget/spec.hpp"

namespace test {

// Time bounds are multiplied by this in a sanitizer build (tools/sanitize.sh): AddressSanitizer and
// UBSan make the code several times slower, and a bound that still catches a quadratic or unbounded
// algorithm is what the test is for.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr double kTimeScale = 10;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr double kTimeScale = 10;
#else
inline constexpr double kTimeScale = 1;
#endif
#else
inline constexpr double kTimeScale = 1;
#endif

inline std::string source_path(const std::string& rel) { return std::string(MEMBUDGET_SOURCE_DIR) + "/" + rel; }

// A toy MHA model with a plain 4h GeLU MLP: the textbook layer of Korthikanti et al.
inline membudget::ModelSpec toy_textbook(std::uint64_t h = 64, std::uint64_t heads = 4) {
  membudget::ModelSpec m;
  m.name = "toy-textbook";
  m.vocab_size = 512;
  m.hidden_size = h;
  m.intermediate_size = 4 * h;
  m.num_layers = 2;
  m.num_heads = heads;
  m.num_kv_heads = heads;
  m.head_dim = h / heads;
  m.mlp = membudget::MlpKind::plain_gelu;
  m.norm = membudget::NormKind::layernorm;
  m.max_positions = 1 << 20;
  return m;
}

// A toy Llama: GQA, SwiGLU, RMSNorm.
inline membudget::ModelSpec toy_llama() {
  membudget::ModelSpec m;
  m.name = "toy-llama";
  m.vocab_size = 1024;
  m.hidden_size = 128;
  m.intermediate_size = 384;
  m.num_layers = 3;
  m.num_heads = 8;
  m.num_kv_heads = 2;
  m.head_dim = 16;
  m.tied_embeddings = true;
  m.max_positions = 1 << 20;
  return m;
}

// toy_llama with L layers and features varied by L: qk-norm on even L, qkv biases when 3 divides L,
// four norms per layer from L = 10, tied embeddings on odd L.
inline membudget::ModelSpec toy_llama_variant(std::uint64_t L) {
  membudget::ModelSpec m = toy_llama();
  m.num_layers = L;
  m.qk_norm = L % 2 == 0;
  m.bias.qkv = L % 3 == 0;
  m.norms_per_layer = L >= 10 ? 4 : 2;
  m.tied_embeddings = L % 2 == 1;
  return m;
}

// A card whose usable bytes (capacity · 0.95) lie halfway between `b`'s allocated requirement
// (peak + overhead) and its reserved one (reserved_peak + overhead): the step fits by allocated
// bytes and not by what nvidia-smi will show. `b` must carry the reserved memory.
inline membudget::Device card_between_allocated_and_reserved(const membudget::Budget& b, std::string name = "between") {
  const membudget::bytes_t between = (b.peak + b.reserved_peak) / 2 + b.terms.overhead;
  return {std::move(name), static_cast<membudget::bytes_t>(static_cast<double>(between) / 0.95) + 1};
}

struct RunResult {
  int exit_code;
  std::string out;
};

// Runs the built CLI with arguments (a shell string) and captures stdout and stderr.
// `env` (optional) prefixes the command with variable assignments, e.g. "NAME=value". stderr is
// captured with stdout unless `args` redirects it itself ("2>/dev/null", "2>&1 >/dev/null").
inline RunResult run_cli(const std::string& args, const std::string& env = "") {
  std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(MEMBUDGET_CLI) + " " + args +
                    (args.find("2>") == std::string::npos ? " 2>&1" : "");
  FILE* p = popen(cmd.c_str(), "r");
  RunResult r{-1, ""};
  if (!p) return r;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace test
