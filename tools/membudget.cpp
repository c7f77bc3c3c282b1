// membudget: predict, verify and explain the GPU memory of a transformer step.
#include "cli.hpp"

#if defined(__GLIBC__)
#include <malloc.h>

#include <climits>
#endif

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // A command simulates several steps one after another (a pipeline's stages, the reserved
  // replay's streams), each growing vectors of up to hundreds of MiB, then freeing them. glibc's
  // defaults give such memory back to the kernel (blocks over an mmap threshold of 128 KiB to
  // 32 MiB, the heap's top past 128 KiB), so every growth and the next simulation fault the pages
  // in again. A short-lived process keeps it in its heap instead: Llama 3.1 70B over 8 stages
  // takes 0.72x the time at 64 microbatches, 1.5 s instead of 4.6 s at 256, at up to a fifth more
  // peak memory (docs/api.md, "Speed").
  mallopt(M_MMAP_MAX, 0);  // no block of its own mapping: all from the heap, reused once freed
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
  return membudget::cli::run(argc, argv);
}
