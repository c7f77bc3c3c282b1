// src/measure/snapshot.hpp: the allocator's state as a torch.cuda.memory._dump_snapshot pickle.
//
// The file loads in pytorch.org/memory_viz (the format of PyTorch's torch.cuda.memory._snapshot(),
// documented in torch/cuda/memory.py and read by torch/cuda/_memory_viz.py): a dict with
//   segments:           [{device, address, total_size, allocated_size, active_size, requested_size,
//                         stream, segment_type, segment_pool_id, is_expandable, frames, blocks}],
//                       blocks: [{address, size, requested_size, state, frames}]
//   device_traces:      [[{action, addr, size, stream, time_us, frames}]]  (one list: device 0;
//                       an oom entry carries device_free instead of addr)
//   allocator_settings: {}
// Frames name the harness's phase, tensor and op where PyTorch has Python frames:
//   {"filename": "membudget/harness", "line": 0, "name": "forward:layers.3.attn.q (matmul)"}.
// device_traces is empty unless the allocator ran with options.record_history.
#pragma once

#include <string>

#include "measure/allocator.hpp"

namespace membudget::measure {

// The frame name for a tag: "phase:tensor (op)"; parts that are empty are left out.
std::string frame_name(const AllocTag& tag);

// The pickle's bytes (protocol 2).
std::string snapshot_pickle(const CachingAllocator& allocator);

// Writes snapshot_pickle() to path; Error(io) if the file cannot be written.
void write_snapshot(const CachingAllocator& allocator, const std::string& path);

}  // namespace membudget::measure
