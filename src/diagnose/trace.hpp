// src/diagnose/trace.hpp: the allocation history of a torch.cuda.memory._dump_snapshot pickle.
//
// decode_snapshot() checks the structure (torch.cuda.memory._snapshot()'s format, documented in
// PyTorch's torch/cuda/memory.py; src/measure/snapshot.hpp writes it) and keeps what attribute and
// leaks need: one device's trace events and the blocks still allocated when the snapshot was taken. Any
// missing key or wrong type is an Error(parse) naming the entry; unknown keys and actions are
// ignored. Frames are decoded lazily (frames_of), each checked the same way.
//
// replay() turns the events into lifetimes, one per allocation:
//   alloc → an allocation is born, of the requested size rounded up to 512 bytes (what the
//   allocator's memory_allocated() counts; a block still allocated at the end takes its exact
//   size from the final segments); free_requested → it dies (that is when
//   torch.cuda.memory_allocated() drops; free_completed is used only when a trace has no
//   free_requested events at all). A free of an address that is not live, never allocated in the
//   trace, is an allocation made before recording began (or dropped from the ring buffer): it is
//   live from the start. A block still allocated in the final segments without a live alloc is
//   live from the start to the end. An alloc over a live address ends the old lifetime first;
//   a free of an address freed before is ignored. Both are counted as inconsistent.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "membudget/bytes.hpp"
#include "pickle.hpp"

namespace membudget::diagnose {

enum class Action { alloc, free_requested, free_completed, segment_alloc, segment_free, oom, other };

struct TraceEvent {
  Action action = Action::other;
  std::uint64_t addr = 0;
  bytes_t size = 0;
  std::int64_t time_us = 0;
  const PickleValue* frames = nullptr;  // the entry's frames list (nullptr: none)
};

struct EndBlock {
  std::uint64_t addr = 0;
  bytes_t size = 0;
  const PickleValue* frames = nullptr;
};

// external_annotations: record_function ranges the profiler hooks log (Optimizer.step#AdamW.step,
// Optimizer.zero_grad#AdamW.zero_grad), START and END with a time.
struct Annotation {
  bool start = false;
  std::string_view name;
  std::int64_t time_us = 0;
};

struct DecodedSnapshot {
  PickleDocument doc;
  std::string where;
  std::size_t device = 0;    // index into device_traces
  bool has_trace = false;    // device_traces present with at least one event
  std::vector<TraceEvent> events;
  std::vector<EndBlock> end_blocks;  // state active_allocated in segments of `device`
  std::vector<Annotation> annotations;  // of `device` (or without a device), in file order
};

// Takes the parsed document (kept alive: frames point into it). The device is the trace with the
// most alloc events (the first on a tie); without traces, device 0's segments.
DecodedSnapshot decode_snapshot(PickleDocument doc, const std::string& where);
DecodedSnapshot read_snapshot_file(const std::string& path);

struct Frame {
  std::string_view filename;
  std::int64_t line = 0;
  std::string_view name;
};
// Error(parse) naming `what` when frames is not a list of {filename: str, line: int, name: str}.
std::vector<Frame> frames_of(const PickleValue* frames, std::string_view what);

inline constexpr std::int64_t kBeforeRecording = -1;  // born before the first event
inline constexpr std::int64_t kAliveAtEnd = std::numeric_limits<std::int64_t>::max();  // never freed in the trace

struct Lifetime {
  std::uint64_t addr = 0;
  bytes_t size = 0;
  std::int64_t born = kBeforeRecording;  // event index of the alloc
  std::int64_t died = kAliveAtEnd;       // event index of the free
  const PickleValue* frames = nullptr;   // the alloc's frames (or the end block's)
  const PickleValue* free_frames = nullptr;
};

struct Replay {
  std::vector<Lifetime> lifetimes;  // in order of birth (pre-recording ones first)
  std::vector<bytes_t> live;        // live bytes after each event (live.size() == events.size())
  bytes_t initial = 0;              // live before the first event
  std::size_t inconsistent = 0;
  bool used_free_completed = false;
};

// Error(parse) when the live bytes would overflow (absurd sizes).
Replay replay(const DecodedSnapshot& snap);

}  // namespace membudget::diagnose
