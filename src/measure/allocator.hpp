// src/measure/allocator.hpp: an instrumented caching allocator with PyTorch's policy and statistics.
//
// Policy: PyTorch's, as the value AllocatorPolicy (src/common/allocator_policy.hpp, shared with the
// simulator) states it: 512-byte rounding, a small pool of 2 MiB segments for requests <= 1 MiB, a
// large pool of 20 MiB segments below 10 MiB and of the request rounded to 2 MiB above, c10's split
// and oversize rules, best fit among the pool's cached free blocks of the requesting stream (a
// segment, and every block carved from it, belongs to the stream that allocated it). On a
// miss: ask the raw memory for a segment; if that fails, release every cached segment that is
// entirely free and retry once (num_alloc_retries += 1); if that fails too, num_ooms += 1 and
// Error(out_of_memory) is thrown with PyTorch's figures.
//
// Optional expandable-segments mode (policy.expandable_segments) maps pages into one growing
// segment per pool and stream (2 MiB pages for the small pool, 20 MiB for the large), so freed space is
// reused without fragmentation.
//   Choices made here (PyTorch's own bookkeeping is finer): each pool reserves one virtual address
//   range (RawMemory::reserve_range, sized to the capacity) and maps a growing prefix of it. A miss
//   maps just enough whole pages after the last block (merging with a free tail block); the best
//   fit counts a free block that ends the mapped pages as the size it could grow to, as c10's
//   get_free_block does in this mode, so holes inside the segment fill first; blocks split
//   whenever the remainder is >= 512 B in both pools, as PyTorch does in this mode. Freed pages stay
//   mapped (reserved) until empty_cache() or the OOM retry unmaps the whole free pages at the tail.
//   inactive_split is not counted for expandable segments (PyTorch excludes them too), and such a
//   segment counts in num_segments while it has pages mapped.
//
// The OOM message follows PyTorch >= 2.1: "Tried to allocate" prints the size asked of the raw
// memory (the segment size, c10's alloc_size; the pages to map in expandable mode), then membudget
// appends the request itself and the tensor's tag.
//
// Statistics mirror torch.cuda.memory_stats(): allocated, reserved, active, inactive_split and
// requested bytes, each with current and peak; reset_peak_stats() sets every peak to current.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/allocator_policy.hpp"
#include "membudget/bytes.hpp"

namespace membudget::measure {

// Where the bytes under the allocator come from: cudaMalloc on a GPU, host memory on the CPU.
//
// Device addresses are a DeviceAddr (64 bits) and sizes a bytes_t on every target. The pointer
// forms (raw_alloc, ...) are what real memory implements; the allocator calls the 64-bit forms
// (raw_alloc_at, ...), which by default forward to them. Memory without real addresses (the
// reserved-memory replay's fake device memory, src/model/reserved.cpp, up to 2^50 bytes)
// overrides the 64-bit forms instead: on a 32-bit target (the web page's wasm32) a pointer and a
// size_t hold only 4 GiB, and a replayed 80 GiB step would wrap.
using DeviceAddr = std::uint64_t;  // 0: none
// A CUDA stream as the allocator sees it: 0 the default (compute) stream; others are the caller's
// numbering (FSDP2's all-gather and reduce-scatter streams in the reserved-memory replay).
using StreamId = std::uint32_t;

class RawMemory {
 public:
  virtual ~RawMemory() = default;
  // Returns nullptr when the memory is exhausted (never throws for that).
  virtual void* raw_alloc(std::size_t bytes) = 0;
  virtual void raw_free(void* ptr, std::size_t bytes) = 0;
  // Capacity and free bytes as the device reports them (cudaMemGetInfo on a GPU).
  virtual bytes_t capacity() const = 0;
  virtual bytes_t free_bytes() const = 0;
  virtual std::string name() const = 0;
  // Virtual-memory mapping for expandable segments (cuMemAddressReserve / cuMemMap on a GPU,
  // mmap / mprotect on the host). Defaults say "not supported": reserve_range returns nullptr.
  // reserve_range only reserves addresses; map_range makes [ptr, ptr+bytes) usable and counts it
  // against the capacity (false when exhausted); unmap_range returns it.
  virtual void* reserve_range(std::size_t bytes);
  virtual void release_range(void* base, std::size_t bytes);
  virtual bool map_range(void* ptr, std::size_t bytes);
  virtual void unmap_range(void* ptr, std::size_t bytes);

  // The same in 64 bits, as the allocator calls them (0 for nullptr). The defaults forward to the
  // pointer forms and return 0 (exhausted) for a size the target's size_t cannot hold.
  virtual DeviceAddr raw_alloc_at(bytes_t bytes);
  virtual void raw_free_at(DeviceAddr addr, bytes_t bytes);
  virtual DeviceAddr reserve_range_at(bytes_t bytes);
  virtual void release_range_at(DeviceAddr base, bytes_t bytes);
  virtual bool map_range_at(DeviceAddr addr, bytes_t bytes);
  virtual void unmap_range_at(DeviceAddr addr, bytes_t bytes);
};

// Host memory with an optional simulated capacity, so tests can drive retries and OOM.
// Allocations are real (512-byte aligned); raw_alloc / map_range fail once capacity bytes are in use.
// capacity 0 means unlimited: capacity() then reports the machine's physical memory.
std::unique_ptr<RawMemory> make_host_memory(bytes_t capacity);

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
};

struct AllocatorStats {
  Stat allocated;       // bytes of live blocks (rounded sizes): max_memory_allocated()
  Stat reserved;        // bytes of segments held from the raw memory: memory_reserved()
  Stat active;          // live blocks plus blocks freed but not yet reusable (same as allocated here)
  Stat inactive_split;  // free bytes inside segments that also hold live blocks
  Stat requested;       // bytes as requested, before rounding
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_segments = 0;
};

// What a tensor is, for the OOM report and the snapshot's frames.
struct AllocTag {
  std::string op;      // "rmsnorm_forward"
  std::string tensor;  // "layers.3.attn.q"
  std::string phase;   // "forward", "backward", "optimizer"
};

struct AllocatorOptions {
  AllocatorPolicy policy;       // PyTorch's defaults; policy.expandable_segments for that mode
  bool record_history = false;  // keep trace events for the snapshot
};

// One event of the allocation history (the snapshot's device_traces entries).
struct TraceEvent {
  enum class Action { alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom };
  Action action;
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t time_us;
  AllocTag tag;
  StreamId stream = 0;
};

// The segment and block state, for the snapshot (torch.cuda.memory._snapshot()["segments"]).
struct BlockInfo {
  enum class State { active_allocated, inactive };
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t requested_size = 0;  // 0 for a free block
  State state = State::inactive;
  AllocTag tag;  // the tensor that holds (active) or last held the block
};

struct SegmentInfo {
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;  // mapped bytes for an expandable segment
  std::uint64_t allocated_size = 0;
  std::uint64_t active_size = 0;
  std::uint64_t requested_size = 0;
  bool small = false;  // segment_type "small" / "large"
  bool expandable = false;
  StreamId stream = 0;
  std::vector<BlockInfo> blocks;  // in address order, covering the segment
};

// A live block as CachingAllocator::allocate_block hands it out, for deallocate_block; empty for a
// zero-byte request.
class BlockRef {
 public:
  BlockRef() = default;
  explicit operator bool() const { return block_ != nullptr; }

 private:
  friend class CachingAllocator;
  explicit BlockRef(void* block) : block_(block) {}
  void* block_ = nullptr;
};

class CachingAllocator {
 public:
  explicit CachingAllocator(RawMemory& raw, AllocatorOptions options = {});
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Throws Error(out_of_memory) with PyTorch's figures after the flush-and-retry fails.
  // `stream`: the stream the request runs on; only that stream's cached blocks serve it.
  DeviceAddr allocate_at(bytes_t bytes, const AllocTag& tag = {}, StreamId stream = 0);
  void deallocate_at(DeviceAddr addr);
  // The same as pointers, for the harness, whose memory is real and pointer-sized.
  void* allocate(std::size_t bytes, const AllocTag& tag = {}) {
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(allocate_at(bytes, tag)));
  }
  void deallocate(void* ptr) { deallocate_at(reinterpret_cast<std::uintptr_t>(ptr)); }
  // The same for a caller that keeps what it allocated (the reserved-memory replay): the block
  // itself is the handle, so a free looks nothing up by address. Such a block is freed only by
  // deallocate_block (deallocate_at does not know its address).
  BlockRef allocate_block(bytes_t bytes, const AllocTag& tag = {}, StreamId stream = 0);
  void deallocate_block(BlockRef block);

  const AllocatorStats& stats() const { return *stats_; }  // as of now (it changes with every call below)
  void reset_peak_stats();
  void empty_cache();  // release every entirely free segment
  // Starts over as if constructed with `options` (every segment given back to the raw memory),
  // keeping the room its containers have grown to: the reserved replay runs one per thread.
  void reset(AllocatorOptions options = {});

  // The rounding, pools and split rules it follows (tests compute expectations with it).
  const AllocatorPolicy& policy() const;

  // The largest cached free block of the pool (small: requests of 1 MiB or less) that serves
  // `stream`'s requests; 0 when it has none. (The reserved replay's test that a run of requests
  // cannot need a new segment: Replay::skip_closed_window.)
  bytes_t largest_free_block(bool small_pool, StreamId stream) const;

  // A hash of every segment's blocks (address, size, allocated, stream): equal after two steps
  // when the second left every block where the first did (the reserved replay's steady state).
  std::uint64_t layout_hash() const;

  // Segments in address order with their blocks (for write_snapshot and for tests).
  std::vector<SegmentInfo> segments() const;
  const AllocatorOptions& options() const;

  const std::vector<TraceEvent>& history() const;
  RawMemory& raw() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  const AllocatorStats* stats_;  // impl_'s, inline: the reserved replay reads them at every event
};

}  // namespace membudget::measure
