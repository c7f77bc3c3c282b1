// A toy scheduler: for each queued job, pick the largest micro-batch that fits the card and the
// accumulation steps that reach the job's global batch.
//   scheduler MODEL.yaml [DEVICE]
#include <cstdio>
#include <membudget/membudget.hpp>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: scheduler MODEL [DEVICE]\n");
    return 2;
  }
  try {
    const membudget::ModelSpec model = membudget::load_model(argv[1]);
    const membudget::Device device = membudget::find_device(argc > 2 ? argv[2] : "H100");
    struct Queued { std::uint64_t seq, global_batch; membudget::Recompute recompute; };
    const Queued queue[] = {{1024, 256, membudget::Recompute::none},
                            {4096, 64, membudget::Recompute::none},
                            {8192, 32, membudget::Recompute::full}};
    for (const Queued& q : queue) {
      membudget::Job job;
      job.seq = q.seq;
      job.recompute = q.recompute;
      membudget::SearchOptions o;
      o.global_batch = q.global_batch;
      const membudget::MaxBatchResult r = membudget::max_micro_batch(model, job, device, o);
      if (r.max_micro_batch == 0) {
        std::printf("%s seq %llu: does not fit %s\n", model.name.c_str(), (unsigned long long)q.seq,
                    device.name.c_str());
        continue;
      }
      std::printf("%s seq %llu recompute %s: micro-batch %llu x %llu steps (max %llu, %.2f GiB of %.2f)\n",
                  model.name.c_str(), (unsigned long long)q.seq, membudget::to_string(q.recompute),
                  (unsigned long long)r.accum_micro_batch, (unsigned long long)r.grad_accum_steps,
                  (unsigned long long)r.max_micro_batch, r.at_max.required / double(membudget::GiB),
                  r.limit / double(membudget::GiB));
    }
  } catch (const membudget::Error& e) {
    std::fprintf(stderr, "scheduler: %s\n", e.what());
    return 2;
  }
  return 0;
}
