// Instructions per estimate() at a new shape, a figure the build machine's speed does not move:
// tools/bench_instructions.sh runs this under callgrind, counting only run_loop (the plan is
// compiled before it). Usage: membudget_estimate_loop MODEL [pp|pp-fsdp]  ("pp": a 4-stage 1F1B
// pipeline, 8 microbatches, bf16: the most loaded of four stage plans, as
// BM_estimate_new_shape_parallel/8/6; "pp-fsdp": the same with FSDP2 over 8 within each stage, /8/9).
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "membudget/api.hpp"
#include "shapes.hpp"

using namespace membudget;


__attribute__((noinline)) std::uint64_t run_loop(const ModelSpec& m, Job j,
                                                 const std::vector<std::pair<std::uint64_t, std::uint64_t>>& sh) {
  std::uint64_t sum = 0;
  for (const auto& [b, s] : sh) {
    j.batch = b;
    j.seq = s;
    sum += estimate(m, j).required;
  }
  return sum;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [pp]\n", argv[0]);
    return 2;
  }
  try {
    const ModelSpec m = load_model(argv[1]);
    Job j;
    if (argc > 2 && (std::string(argv[2]) == "pp" || std::string(argv[2]) == "pp-fsdp")) {
      j.parallel.pipeline = 4;
      j.parallel.microbatches = 8;
      j.precision = Precision::bf16;
      if (std::string(argv[2]) == "pp-fsdp") j.parallel.fsdp = 8;  // BM_estimate_new_shape_parallel/8/9
    }
    estimate(m, j);  // compiles the plan(s), outside run_loop
    const auto& sh = shapes();  // bench_api.cpp's 4,096 shapes
    std::printf("%zu estimates, checksum %llu\n", sh.size(), static_cast<unsigned long long>(run_loop(m, j, sh)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
