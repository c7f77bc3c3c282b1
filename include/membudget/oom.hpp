// membudget/oom.hpp: read a PyTorch out-of-memory message and say what to fix first.
//
// PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) raises one message when a
// cudaMalloc fails even after it has released every cached block it could. The figures in it tell
// three situations apart:
//
//   fragmentation       PyTorch holds enough reserved-but-unallocated memory for the request, but
//                       only in pieces of partly used segments (the allocator had already returned
//                       every wholly free segment to the driver before raising).
//   non_pytorch_memory  a large share of the GPU is used by something other than PyTorch's cache:
//                       another process, or CUDA context / NCCL / cuDNN / other libraries in this
//                       one (capacity - free - reserved).
//   shortage            the live tensors simply need more than the GPU has.
//
// Templates understood (X etc. printed by format_size with two decimals: "bytes", KiB, MiB, GiB):
//   <= 1.4   CUDA out of memory. Tried to allocate X (GPU N; T total capacity; A already allocated;
//            F free; C cached)                                   C = reserved - allocated
//   1.5-2.0  ... (GPU N; T total capacity; A already allocated; F free; [L allowed; ]R reserved in
//            total by PyTorch) [If reserved memory is >> allocated memory try setting
//            max_split_size_mb ...]
//   2.1      CUDA out of memory. Tried to allocate X. GPU N has a total capacty of T of which F is
//            free. [Process PID has P memory in use. | Including non-PyTorch memory, this process
//            has P memory in use. ]... Of the allocated memory A is allocated by PyTorch, and U is
//            reserved by PyTorch but unallocated. If ... max_split_size_mb ...
//   >= 2.2   same with "total capacity", "[L allowed; ]" before "Of the allocated memory",
//            ">= 2.4: "is allocated by PyTorch, [with Y allocated in private pools (e.g., CUDA
//            Graphs), ]and U is reserved ...", and the expandable_segments hint.
//   ROCm prints "HIP out of memory" (and "HIP Graphs"); XPU prints "XPU out of memory".
// "Tried to allocate" is the allocator's rounded size (a 2 MiB small-pool segment, a 20 MiB
// segment for requests of 1-10 MiB, else the request rounded up to 2 MiB), not the tensor size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "membudget/bytes.hpp"

namespace membudget {

enum class OomTemplate {
  pre_1_5,   // "... F free; C cached)"
  pre_2_1,   // "(GPU 0; T total capacity; ... R reserved in total by PyTorch)"
  v2_1,      // "GPU 0 has a total capacty of" (the 2.1 typo)
  v2_2_plus  // "GPU 0 has a total capacity of"
};
const char* to_string(OomTemplate t) noexcept;  // "pre-1.5", "pre-2.1", "2.1", "2.2+"

struct OomProcess {
  std::uint64_t pid = 0;
  bytes_t in_use = 0;
};

// The figures of one message, in bytes (nearest integer of the printed value x unit).
struct OomReport {
  std::string backend = "CUDA";  // "CUDA", "HIP" (ROCm) or "XPU"
  OomTemplate template_version = OomTemplate::v2_2_plus;
  int gpu = 0;
  bytes_t requested = 0;             // "Tried to allocate"
  bytes_t capacity = 0;              // "total capacity"
  bytes_t free = 0;                  // free on the device (cudaMemGetInfo) at the time of the OOM
  bytes_t allocated = 0;             // allocated by PyTorch (>= 2.4: including private pools)
  bytes_t reserved = 0;              // reserved by PyTorch in total
  bytes_t reserved_unallocated = 0;  // reserved but not allocated (the cache's free blocks)
  bool reserved_derived = false;     // reserved = allocated + reserved_unallocated (>= 2.1)
  bool reserved_unallocated_derived = false;  // = reserved - allocated (1.5-2.0)
  std::optional<bytes_t> process_in_use;      // "Including non-PyTorch memory, this process has P"
  std::vector<OomProcess> other_processes;    // "Process PID has P memory in use" (a PID seen from
                                              // inside a container may be this process itself)
  std::optional<bytes_t> allowed;             // set_per_process_memory_fraction limit
  std::optional<bytes_t> private_pools;       // "with Y allocated in private pools (e.g., CUDA Graphs)"
  std::size_t line = 0;                       // 1-based line of the input where the message starts
  std::optional<std::uint64_t> rank;          // torchrun's "[rankN]:" on the message's lines
  std::string worker;                         // torchrun's other tag on them, role and local rank
                                              // ("default0": --tee, --redirects); else empty
  std::string message;                        // the message as read, whitespace-normalised

  // Device memory in use outside PyTorch's reserved memory: capacity - free - reserved, >= 0.
  bytes_t non_pytorch() const noexcept;
  // How far free + reserved exceed the capacity (0 when they do not): PyTorch reserving more than
  // the device reports in use, as when Windows' driver spills into shared system memory, or an
  // edited message. non_pytorch() is 0 then, and says nothing.
  bytes_t reserved_beyond_device() const noexcept;
};

// Finds every complete out-of-memory message in `text` (a traceback, a log, a message wrapped
// over several lines, lines prefixed with "# ", "> ", "| " or torchrun's "[rank0]: " or
// "[default0]: ", a timestamp before the tag too) and reads their figures, in the order of the lines
// they start at. Where torchrun tags the lines (several ranks' interleaving, or a launcher's untagged
// lines among them), each worker's lines are read apart and each report names its rank or worker. Throws Error(parse) when there is none, or when the only one found is cut
// short (naming what is missing). At most limits::kMaxOomMessages message starts are tried;
// `stopped_early`, when given, says whether the text holds more than were tried.
std::vector<OomReport> parse_oom_messages(std::string_view text, bool* stopped_early = nullptr);
// The first of them.
OomReport parse_oom_message(std::string_view text);

// ---- classification ----

enum class OomClass { fragmentation, non_pytorch_memory, shortage };
const char* to_string(OomClass c) noexcept;  // "fragmentation", "non_pytorch_memory", "shortage"

enum class OomPhase { unknown, train, eval };

// What the user knows about when the OOM happens; every field is optional.
struct OomContext {
  std::optional<std::uint64_t> step;  // 0-based index of the step that failed
  OomPhase phase = OomPhase::unknown;
  bool long_sequences_only = false;   // it fails only on the longest sequences
};

struct OomDiagnosis {
  OomClass classification = OomClass::shortage;
  std::string situation;    // the decision-table row that matched, e.g. "first_steps"
  std::string first_fix;    // what to try first
  std::string explanation;  // the figures behind the classification
};

// Rules (documented with the decision table in src/diagnose/oom.cpp):
//   fragmentation       reserved_unallocated >= requested: the request would have fit in the
//                       cache's free blocks had they been contiguous.
//   non_pytorch_memory  non_pytorch() >= 10% of capacity and non_pytorch() + free >= requested:
//                       freeing it would have made room. When both hold, the larger amount wins.
//   shortage            otherwise; refined by the context (and by a request larger than the GPU or
//                       the allowed fraction).
OomDiagnosis classify(const OomReport& report, const OomContext& context = {});

// {"requested", "capacity", "free", "allocated", "reserved", "reserved_unallocated", "non_pytorch",
//  "process_in_use", "other_processes", "allowed", "private_pools", "gpu", "backend", "template",
//  "derived", "classification", "situation", "first_fix", "explanation"}; sizes are integer bytes,
// absent optional figures are null. Keys in alphabetical order; indent -1 is one line, n >= 0
// pretty-prints with n spaces (as `membudget oom --format json`, which uses 2).
std::string to_json(const OomReport& report, const OomContext& context = {}, int indent = -1);

}  // namespace membudget
