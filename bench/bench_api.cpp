// Benchmarks of the scheduler API and the CLI (docs/api.md lists the figures and the command).
//   build/bench/membudget_bench [--benchmark_filter=…]
#include <benchmark/benchmark.h>
#include <spawn.h>
#include <fcntl.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "membudget/api.hpp"

extern char** environ;

namespace {
using namespace membudget;

const ModelSpec& model8b() {
  static const ModelSpec m = load_model(std::string(MEMBUDGET_SOURCE_DIR) + "/configs/llama-3.1-8b.yaml");
  return m;
}
const ModelSpec& model70b() {
  static const ModelSpec m = load_model(std::string(MEMBUDGET_SOURCE_DIR) + "/configs/llama-3.1-70b.yaml");
  return m;
}

// estimate(): the memoized path a scheduler loop hits (same model and job again).
void BM_estimate_memoized(benchmark::State& state) {
  Job j;
  j.batch = 2;
  estimate(model8b(), j);
  for (auto _ : state) benchmark::DoNotOptimize(estimate(model8b(), j).required);
}
BENCHMARK(BM_estimate_memoized);

// estimate() on a new (model, job) every time: the fast path (4-6 layer simulations, extrapolated).
void BM_estimate_uncached(benchmark::State& state) {
  const ModelSpec& m = state.range(0) == 8 ? model8b() : model70b();
  Job j;
  std::uint64_t i = 0;
  for (auto _ : state) {
    j.batch = 1 + (i++ % 16);
    clear_estimate_cache();
    benchmark::DoNotOptimize(estimate(m, j).required);
  }
}
BENCHMARK(BM_estimate_uncached)->Arg(8)->Arg(70)->Unit(benchmark::kMicrosecond);

// predict() with every layer simulated (what the fast path replaces), for reference.
void BM_predict_full_simulation(benchmark::State& state) {
  const ModelSpec& m = state.range(0) == 8 ? model8b() : model70b();
  Job j;
  j.batch = 2;
  PredictOptions o;
  o.full_simulation = true;
  for (auto _ : state) benchmark::DoNotOptimize(predict(m, j, o).peak);
}
BENCHMARK(BM_predict_full_simulation)->Arg(8)->Arg(70)->Unit(benchmark::kMicrosecond);

// max_micro_batch(): galloping + binary search over memoized estimates.
void BM_max_micro_batch_memoized(benchmark::State& state) {
  Job j;
  j.seq = 2048;
  j.precision = Precision::bf16;  // fits an H200 with a micro-batch of several sequences
  const Device d = find_device("H200");
  max_micro_batch(model8b(), j, d);
  for (auto _ : state) benchmark::DoNotOptimize(max_micro_batch(model8b(), j, d).max_micro_batch);
}
BENCHMARK(BM_max_micro_batch_memoized);

void BM_max_micro_batch_evaluations(benchmark::State& state) {  // how many estimates one search makes
  Job j;
  j.seq = 2048;
  j.precision = Precision::bf16;
  MaxBatchResult r;
  for (auto _ : state) r = max_micro_batch(model8b(), j, find_device("H200"));
  state.counters["max_micro_batch"] = static_cast<double>(r.max_micro_batch);
  state.counters["evaluations"] = r.evaluations;
}
BENCHMARK(BM_max_micro_batch_evaluations)->Iterations(1);

void BM_max_micro_batch_uncached(benchmark::State& state) {
  Job j;
  j.seq = 2048;
  j.precision = Precision::bf16;
  const Device d = find_device("H200");
  for (auto _ : state) {
    clear_estimate_cache();
    benchmark::DoNotOptimize(max_micro_batch(model8b(), j, d).max_micro_batch);
  }
}
BENCHMARK(BM_max_micro_batch_uncached)->Unit(benchmark::kMicrosecond);

// sweep(): 100 micro-batches × 100 sequence lengths = 10,000 points.
SweepGrid grid10k() {
  SweepGrid g;
  for (std::uint64_t b = 1; b <= 100; ++b) g.batches.push_back(b);
  for (std::uint64_t s = 1; s <= 100; ++s) g.seqs.push_back(128 * s);
  return g;
}
void BM_sweep_10000_memoized(benchmark::State& state) {
  const SweepGrid g = grid10k();
  const Device d = find_device("H200");
  sweep(model8b(), Job{}, g, d);
  for (auto _ : state) benchmark::DoNotOptimize(sweep(model8b(), Job{}, g, d).size());
}
BENCHMARK(BM_sweep_10000_memoized)->Unit(benchmark::kMillisecond);

void BM_sweep_10000_uncached(benchmark::State& state) {
  const SweepGrid g = grid10k();
  const Device d = find_device("H200");
  for (auto _ : state) {
    clear_estimate_cache();
    benchmark::DoNotOptimize(sweep(model8b(), Job{}, g, d).size());
  }
}
BENCHMARK(BM_sweep_10000_uncached)->Unit(benchmark::kMillisecond)->Iterations(1);

// The CLI from start to exit: `membudget predict configs/llama-3.1-8b.yaml --format json`.
void run_cli(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) throw std::runtime_error("spawn failed");
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("membudget predict failed");
}
void BM_cli_predict(benchmark::State& state) {
  const std::vector<std::string> args = {MEMBUDGET_CLI, "predict",
                                         std::string(MEMBUDGET_SOURCE_DIR) + "/configs/llama-3.1-8b.yaml", "--format",
                                         state.range(0) ? "table" : "json"};
  for (auto _ : state) run_cli(args);
}
BENCHMARK(BM_cli_predict)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
