// membudget/input.hpp: every bound membudget puts on its input, in one place (namespace limits),
// and the checks that enforce them (docs/robustness.md states the rules).
//
// A scheduler calls membudget in loops with values nobody typed ("unlimited" as UINT64_MAX, a
// headroom of 0) and users hand it whatever file they have. So every input file, every grid and
// every decoded structure has a limit far above any real use, checked before the work starts; an
// input beyond it is an Error naming the input, the limit and what to do, never a long wait or
// gigabytes of memory. A limit changes only here.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <string_view>

#include "membudget/bytes.hpp"

namespace membudget::limits {

// ---- input files (read_input_file) ----
// A model spec: our YAML or a Hugging Face config.json (real ones are 1-10 KiB).
inline constexpr bytes_t kMaxSpecBytes = 4 * MiB;
// Text holding a PyTorch out-of-memory message: a message, a traceback, a whole log.
inline constexpr bytes_t kMaxOomTextBytes = 64 * MiB;
// A TrainingArguments JSON (to_json_string() writes some 5 KiB).
inline constexpr bytes_t kMaxTrainerArgsBytes = 1 * MiB;
// Out-of-memory messages read from one text (each start tried costs at most one message's length).
inline constexpr int kMaxOomMessages = 4096;
// steps.csv for `leaks` (a million steps is about 30 MiB).
inline constexpr bytes_t kMaxCsvBytes = 64 * MiB;
// A torch.cuda.memory._dump_snapshot pickle.
inline constexpr bytes_t kMaxSnapshotBytes = 128 * MiB;

// ---- decoded structures ----
// Values a pickle may hold once read (containers, list items, dict keys and values, memo entries):
// the reader keeps about 32-72 bytes a value, so this keeps it well under 1 GiB whatever the bytes
// say. A real snapshot holds about one value per 4 bytes of file: the limit is a snapshot of
// about 30 MiB; record fewer steps (torch.cuda.memory._record_memory_history(max_entries=...))
// for a larger job.
inline constexpr std::uint64_t kMaxPickleValues = 1ull << 23;

// ---- grids and searches ----
// Points of one sweep (batches × sequences × precisions × recompute modes); a point costs a few
// hundred bytes in memory and in the output.
inline constexpr std::uint64_t kMaxSweepPoints = 100'000;
// Values of one list flag (--batch 1..64, --seq 1024,2048).
inline constexpr std::uint64_t kMaxListValues = kMaxSweepPoints;

// ---- walks ----
// --experts eager: experts × MoE layers (× microbatches / stages in a pipeline). transformers' eager
// experts loop over the experts hit, and the walk records every iteration's tensors, nodes and
// events (8,192 in one layer: 160 MiB, 0.7 s; 32,768: 680 MiB, 3.4 s; Qwen3-30B-A3B over 2 stages
// at 8 microbatches, 24,576: 590 MiB, 4.9 s, and at 32, 98,304: 2.4 GiB, 25 s). DeepSeek-V3 is
// 256 × 58 = 14,848.
inline constexpr std::uint64_t kMaxEagerExpertIterations = 32768;
// --microbatches: the schedule is simulated microbatch by microbatch, every tensor of every
// microbatch recorded, so time and memory grow with the count (docs/robustness.md has the figures);
// 256 covers the accumulation steps pipelines run.
inline constexpr std::uint64_t kMaxMicrobatches = 256;
// --grad-accum-steps: the walk runs at most kWalkedAccumSteps micro-batches whatever the count
// (from the second on each finds the same live set and makes the same tensors; the third lets the
// reserved replay's layout settle: simulated_accum_steps in inventory.hpp), so the count costs
// nothing; past 2^20 it is a typo.
inline constexpr std::uint64_t kMaxGradAccumSteps = 1ull << 20;
// A pipeline stage's walk: the decoder layers one rank holds × the microbatches it runs. Each pass
// records a layer's tensors, nodes and events (some 90 KiB: Llama 3.1 405B over 2 stages at 256
// microbatches, 16,128 passes, took 1.5 GB and 2 s; 1,024 layers over 2 stages at 64, 32,768 passes,
// 3.0 GB and 5 s; at 4,096, max-batch with full recompute 1.3 GB). 70B over 8 stages at 256
// microbatches is 2,560.
inline constexpr std::uint64_t kMaxPipelineLayerPasses = 2048;
// The same over a sweep's points (each simulated at its own shape): 6 points at 4,096 passes took
// 4.9 s and 1.6 GB.
inline constexpr std::uint64_t kMaxSweepPipelineLayerPasses = 8192;
// --experts eager over a sweep: experts × MoE layers × points. Each point walks the loop at its own
// shape (the eager loop's iterations follow the routing, so no plan is compiled for it): some 6 µs an
// iteration for Qwen3-30B-A3B, 40 µs for DeepSeek-V3; 512 points of Qwen3-30B-A3B (3.1 M) took 19 s
// and 64 of DeepSeek-V3 (950,000) 40 s; at the limit, 8 points of DeepSeek-V3, 4.8 s.
inline constexpr std::uint64_t kMaxSweepEagerIterations = 131'072;

// ---- counts given as text ----
// `oom --step`: the 0-based step that failed.
inline constexpr std::uint64_t kMaxStep = 1'000'000'000;
// `verify --steps` and `--warmup`: each runs a whole training or serving step of the harness.
inline constexpr std::uint64_t kMaxVerifySteps = 1000;

}  // namespace membudget::limits

namespace membudget {

// The file's bytes, at most `limit` of them. Error(io) naming the path when it cannot be opened,
// is a directory or another non-file that cannot be read, or a read fails; Error(invalid_argument)
// naming `what`, the path and the limit when the file holds more. Pipes and character devices
// (/dev/stdin, /dev/zero) are read up to the limit, never further.
std::string read_input_file(const std::string& path, bytes_t limit, std::string_view what);
// The same for a stream already open (standard input); `name` stands for the path in messages.
std::string read_input_stream(std::istream& in, bytes_t limit, std::string_view what, std::string_view name);

// A UTF-8 byte-order mark at the start, if any, removed.
std::string_view strip_bom(std::string_view text) noexcept;

// v as an integer number of bytes (truncated toward zero), or Error(overflow) naming `what` when v
// is not finite, negative or at least 2^64: a float cast to an integer out of range is undefined
// behaviour, never a value.
bytes_t bytes_from_double(double v, std::string_view what);

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view text) noexcept;

// `text` made safe for a terminal: control characters (C0, DEL, C1) and bytes that are not UTF-8
// become \xNN (or \u{NNNN}), a backslash stays a backslash; printable UTF-8 is kept as is. Names and
// frames that come from a file go through it before a table, Markdown or an error message shows them.
std::string printable(std::string_view text);

}  // namespace membudget
