/* membudget/membudget.h: the C ABI of membudget (docs/api.md).
 *
 * Opaque handles (mb_model, mb_job), status codes, and a per-thread message for the last error.
 * No function throws or aborts; every function returns MB_OK or an error status, and
 * mb_last_error() says what went wrong ("configs/x.yaml:3: hidden_size: missing"). "Does not fit"
 * is a result (*fits = 0, *max_batch = 0), not an error. Strings returned by the library are freed
 * with mb_string_free. All functions are thread-safe; handles may be shared read-only.
 */
#ifndef MEMBUDGET_H
#define MEMBUDGET_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mb_model mb_model;
typedef struct mb_job mb_job;

typedef enum mb_status {
  MB_OK = 0,
  MB_INVALID_SPEC = 1,     /* a model spec field is missing, negative or inconsistent */
  MB_INVALID_JOB = 2,      /* a job option is out of range or unknown */
  MB_INVALID_ARGUMENT = 3, /* an argument is malformed (NULL handle, unknown device, bad headroom) */
  MB_PARSE = 4,            /* a file could not be parsed */
  MB_OVERFLOW = 5,         /* a byte count would not fit in 64 bits */
  MB_UNSUPPORTED = 6,      /* a valid combination this version does not model */
  MB_IO = 7,               /* a file could not be read */
  MB_INTERNAL = 8          /* anything else (out of host memory, a bug) */
} mb_status;

/* The numbers of one prediction, in bytes. */
typedef struct mb_estimate {
  uint64_t peak;         /* max over the step's phases (what the allocator counts) */
  uint64_t overhead;     /* memory outside the allocator */
  uint64_t required;     /* peak + overhead */
  uint64_t model_states; /* weights + gradients + master + optimizer state */
  uint64_t activations;  /* saved activations after the forward */
  uint64_t logits_loss;  /* logits and loss tensors */
  uint64_t kv_cache;     /* serving only */
  const char* peak_phase;/* static string: "backward_peak", "step0.optimizer_peak", … */
} mb_estimate;

const char* mb_version(void);
/* The message of the last error on this thread ("" when none). Valid until the next call. */
const char* mb_last_error(void);
const char* mb_status_name(mb_status status);

/* A model from our YAML schema or a Hugging Face config.json; from text with mb_model_parse
 * (format: "yaml" or "json"). */
mb_status mb_model_load(const char* path, mb_model** out);
mb_status mb_model_parse(const char* text, const char* format, mb_model** out);
void mb_model_free(mb_model* model);
/* Total parameter count. */
mb_status mb_model_parameters(const mb_model* model, uint64_t* out);

/* A job with the defaults (train, batch 4, seq 4096, amp-bf16, AdamW, no recompute, flash). */
mb_status mb_job_new(mb_job** out);
mb_job* mb_job_clone(const mb_job* job);
void mb_job_free(mb_job* job);
/* Sets one option by its command-line name without dashes: "batch", "seq", "mode", "precision",
 * "optimizer", "optimizer-impl" (foreach, fused, for-loop: torch.optim's foreach=True, fused=True,
 * foreach=False; unset: torch.optim's default), "recompute", "attention", "loss", "loss-chunk", "activations", "profile",
 * "overhead" ("800MiB"), "kv-dtype", "weights", "group-size", "lora" (LoRA rank, 0: full fine-tune),
 * the parallel layout (docs/distributed.md): "dp", "fsdp", "zero", "reshard-after-forward",
 * "ddp-bucket-view", "fsdp-offload", "rank" (the rank predicted; unset: the most loaded), "tp", "sp",
 * "loss-parallel", "pp", "pp-schedule", "microbatches", "virtual-stages", "pp-layers" ("4,4,4,4"),
 * "cp"; "data-parallel", "tensor-parallel", "pipeline-parallel", "context-parallel", "zero-stage",
 * "sequence-parallel" are the same keys. A layout not modelled makes mb_predict and the searches
 * return MB_UNSUPPORTED. */

mb_status mb_job_set(mb_job* job, const char* key, const char* value);
mb_status mb_job_set_batch(mb_job* job, uint64_t batch);
mb_status mb_job_set_seq(mb_job* job, uint64_t seq);

mb_status mb_predict(const mb_model* model, const mb_job* job, mb_estimate* out);
/* The full budget as JSON (docs/json.md); free *json with mb_string_free. */
mb_status mb_predict_json(const mb_model* model, const mb_job* job, char** json);
void mb_string_free(char* s);

/* A device: a known name ("H100", "A100-40GB") or, when device is NULL, capacity_bytes.
 * headroom: fraction kept free (0.05 is the CLI default). */
mb_status mb_fits(const mb_model* model, const mb_job* job, const char* device, uint64_t capacity_bytes,
                  double headroom, int* fits, mb_estimate* out);
/* The largest micro-batch that fits (0: none); at_max may be NULL. The search stops at 65,536 (and at
 * 2^32 tokens a micro-batch): an answer equal to that limit means every batch tried fits. */
mb_status mb_max_micro_batch(const mb_model* model, const mb_job* job, const char* device,
                             uint64_t capacity_bytes, double headroom, uint64_t* max_batch, mb_estimate* at_max);
/* The longest sequence that fits at the job's batch, a multiple of multiple_of (0 or 1: any). */
mb_status mb_max_sequence_length(const mb_model* model, const mb_job* job, const char* device,
                                 uint64_t capacity_bytes, double headroom, uint64_t multiple_of,
                                 uint64_t* max_seq, mb_estimate* at_max);

#ifdef __cplusplus
}
#endif

#endif /* MEMBUDGET_H */
