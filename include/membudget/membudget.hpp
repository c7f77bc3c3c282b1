// membudget/membudget.hpp: the umbrella header of the membudget library.
//
//   #include <membudget/membudget.hpp>
//   auto spec = membudget::load_model("configs/llama-3.2-1b.yaml");
//   membudget::Job job;                      // micro-batch 4 × 4096, amp-bf16, AdamW
//   auto budget = membudget::predict(spec, job);
//   auto fit = membudget::check_fit(budget, membudget::find_device("H100"));
//
// It includes every C++ header of the library (the install test checks that none is missing); the
// C ABI is membudget/membudget.h, for C callers, and is not included here.
#pragma once

#include "membudget/advise.hpp"
#include "membudget/api.hpp"
#include "membudget/attribute.hpp"
#include "membudget/budget.hpp"
#include "membudget/bytes.hpp"
#include "membudget/error.hpp"
#include "membudget/input.hpp"
#include "membudget/job.hpp"
#include "membudget/job_sources.hpp"
#include "membudget/job_yaml.hpp"
#include "membudget/leaks.hpp"
#include "membudget/oom.hpp"
#include "membudget/oom_attribution.hpp"
#include "membudget/report.hpp"
#include "membudget/plot.hpp"
#include "membudget/serving.hpp"
#include "membudget/snapshot_leaks.hpp"
#include "membudget/spec.hpp"
#include "membudget/trainer_args.hpp"
