// The C ABI (include/membudget/membudget.h) over the C++ API. Nothing escapes as an exception.
#include "membudget/membudget.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "membudget/api.hpp"
#include "membudget/report.hpp"

struct mb_model {
  membudget::ModelSpec spec;
};
struct mb_job {
  membudget::Job job;
  std::vector<std::string> given;  // keys set through mb_job_set: each must apply to the mode
};

namespace {

using namespace membudget;

thread_local std::string g_last_error;

mb_status status_of(ErrorKind k) {
  switch (k) {
    case ErrorKind::invalid_spec: return MB_INVALID_SPEC;
    case ErrorKind::invalid_job: return MB_INVALID_JOB;
    case ErrorKind::invalid_argument: return MB_INVALID_ARGUMENT;
    case ErrorKind::parse: return MB_PARSE;
    case ErrorKind::overflow: return MB_OVERFLOW;
    case ErrorKind::unsupported: return MB_UNSUPPORTED;
    case ErrorKind::io: return MB_IO;
    default: return MB_INTERNAL;
  }
}

template <typename F>
mb_status guarded(F&& f) {
  try {
    g_last_error.clear();
    f();
    return MB_OK;
  } catch (const Error& e) {
    g_last_error = e.what();
    return status_of(e.kind());
  } catch (const std::bad_alloc&) {
    g_last_error = "out of host memory";
    return MB_INTERNAL;
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return MB_INTERNAL;
  } catch (...) {
    g_last_error = "internal error";
    return MB_INTERNAL;
  }
}

void need(const void* p, const char* what) {
  if (!p) throw Error(ErrorKind::invalid_argument, std::string(what) + ": NULL");
}

// The job, once every option set through mb_job_set is one its mode reads (check_options_apply).
const Job& checked(const mb_job* j) {
  check_options_apply(j->job, j->given);
  return j->job;
}

void fill(const Estimate& e, mb_estimate* out) {
  if (!out) return;
  out->peak = e.peak;
  out->overhead = e.overhead;
  out->required = e.required;
  out->model_states = e.terms.model_states;
  out->activations = e.terms.activations;
  out->logits_loss = e.terms.logits_loss;
  out->kv_cache = e.terms.kv_cache;
  out->peak_phase = e.peak_phase;
}

Device device_of(const char* name, std::uint64_t capacity) {
  if (name && capacity)
    throw Error(ErrorKind::invalid_argument, "device: give a name or a capacity in bytes, not both");
  if (name) return find_device(name);
  if (capacity == 0) throw Error(ErrorKind::invalid_argument, "device: give a name or a capacity in bytes");
  return Device{"custom", capacity};
}

}  // namespace

extern "C" {

const char* mb_version(void) { return "0.1.0"; }
const char* mb_last_error(void) { return g_last_error.c_str(); }

const char* mb_status_name(mb_status s) {
  switch (s) {
    case MB_OK: return "ok";
    case MB_INVALID_SPEC: return "invalid model spec";
    case MB_INVALID_JOB: return "invalid job";
    case MB_INVALID_ARGUMENT: return "invalid argument";
    case MB_PARSE: return "parse error";
    case MB_OVERFLOW: return "overflow";
    case MB_UNSUPPORTED: return "unsupported";
    case MB_IO: return "I/O error";
    case MB_INTERNAL: return "internal error";
  }
  return "unknown status";
}

mb_status mb_model_load(const char* path, mb_model** out) {
  return guarded([&] {
    need(path, "path");
    need(out, "out");
    *out = nullptr;
    auto* m = new mb_model{load_model(path)};
    *out = m;
  });
}

mb_status mb_model_parse(const char* text, const char* format, mb_model** out) {
  return guarded([&] {
    need(text, "text");
    need(format, "format");
    need(out, "out");
    *out = nullptr;
    const std::string f = format;
    if (f == "yaml") *out = new mb_model{parse_model_yaml(text)};
    else if (f == "json") *out = new mb_model{parse_hf_config(text)};
    else throw Error(ErrorKind::invalid_argument, "format: '" + f + "' is not yaml or json");
  });
}

void mb_model_free(mb_model* model) { delete model; }

mb_status mb_model_parameters(const mb_model* model, uint64_t* out) {
  return guarded([&] {
    need(model, "model");
    need(out, "out");
    *out = model->spec.parameters().total;
  });
}

mb_status mb_job_new(mb_job** out) {
  return guarded([&] {
    need(out, "out");
    *out = new mb_job{};
  });
}

mb_job* mb_job_clone(const mb_job* job) {
  if (!job) return nullptr;
  try {
    return new mb_job{*job};
  } catch (...) {
    return nullptr;
  }
}

void mb_job_free(mb_job* job) { delete job; }

mb_status mb_job_set(mb_job* job, const char* key, const char* value) {
  return guarded([&] {
    need(job, "job");
    need(key, "key");
    need(value, "value");
    set_job_option(job->job, key, value);
    job->given.emplace_back(key);
  });
}

mb_status mb_job_set_batch(mb_job* job, uint64_t batch) {
  return guarded([&] {
    need(job, "job");
    job->job.batch = batch;
  });
}

mb_status mb_job_set_seq(mb_job* job, uint64_t seq) {
  return guarded([&] {
    need(job, "job");
    job->job.seq = seq;
  });
}

mb_status mb_predict(const mb_model* model, const mb_job* job, mb_estimate* out) {
  return guarded([&] {
    need(model, "model");
    need(job, "job");
    need(out, "out");
    fill(estimate(model->spec, checked(job)), out);
  });
}

mb_status mb_predict_json(const mb_model* model, const mb_job* job, char** json) {
  return guarded([&] {
    need(model, "model");
    need(job, "job");
    need(json, "json");
    *json = nullptr;
    const std::string s = to_json_string(predict(model->spec, checked(job)), std::nullopt, false, 2);
    char* p = static_cast<char*>(std::malloc(s.size() + 1));
    if (!p) throw std::bad_alloc();
    std::memcpy(p, s.c_str(), s.size() + 1);
    *json = p;
  });
}

void mb_string_free(char* s) { std::free(s); }

mb_status mb_fits(const mb_model* model, const mb_job* job, const char* device, uint64_t capacity_bytes,
                  double headroom, int* fits_out, mb_estimate* out) {
  return guarded([&] {
    need(model, "model");
    need(job, "job");
    need(fits_out, "fits");
    const FitResult f = fits(model->spec, checked(job), device_of(device, capacity_bytes), headroom);
    *fits_out = f.fits ? 1 : 0;
    fill(f.estimate, out);
  });
}

mb_status mb_max_micro_batch(const mb_model* model, const mb_job* job, const char* device, uint64_t capacity_bytes,
                             double headroom, uint64_t* max_batch, mb_estimate* at_max) {
  return guarded([&] {
    need(model, "model");
    need(job, "job");
    need(max_batch, "max_batch");
    SearchOptions o;
    o.headroom = headroom;
    const MaxBatchResult r = max_micro_batch(model->spec, checked(job), device_of(device, capacity_bytes), o);
    *max_batch = r.max_micro_batch;
    fill(r.at_max, at_max);
  });
}

mb_status mb_max_sequence_length(const mb_model* model, const mb_job* job, const char* device,
                                 uint64_t capacity_bytes, double headroom, uint64_t multiple_of, uint64_t* max_seq,
                                 mb_estimate* at_max) {
  return guarded([&] {
    need(model, "model");
    need(job, "job");
    need(max_seq, "max_seq");
    SearchOptions o;
    o.headroom = headroom;
    o.multiple_of = multiple_of ? multiple_of : 1;
    const MaxSeqResult r = max_sequence_length(model->spec, checked(job), device_of(device, capacity_bytes), o);
    *max_seq = r.max_seq;
    fill(r.at_max, at_max);
  });
}

}  // extern "C"
