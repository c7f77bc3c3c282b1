/* The same question through the C ABI: the largest micro-batch for one job. */
#include <membudget/membudget.h>
#include <stdio.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: scheduler_c MODEL [DEVICE]\n");
    return 2;
  }
  mb_model* model = NULL;
  mb_job* job = NULL;
  if (mb_model_load(argv[1], &model) != MB_OK || mb_job_new(&job) != MB_OK) {
    fprintf(stderr, "scheduler_c: %s\n", mb_last_error());
    return 2;
  }
  mb_job_set(job, "seq", "4096");
  uint64_t max_batch = 0;
  mb_estimate at;
  if (mb_max_micro_batch(model, job, argc > 2 ? argv[2] : "H100", 0, 0.05, &max_batch, &at) != MB_OK) {
    fprintf(stderr, "scheduler_c: %s\n", mb_last_error());
    return 2;
  }
  printf("max micro-batch %llu (needs %llu bytes, peak in %s)\n", (unsigned long long)max_batch,
         (unsigned long long)at.required, at.peak_phase);
  mb_job_free(job);
  mb_model_free(model);
  return 0;
}
