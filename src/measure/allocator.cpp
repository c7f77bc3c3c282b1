// The caching allocator: PyTorch's native CUDA caching allocator policy, one device; each block
// belongs to the stream that allocated its segment, and only that stream's requests reuse it.
// The policy and its worked numbers are in allocator.hpp; this file follows c10's structure
// (get_free_block, alloc_block, release_cached_blocks, free_block) so the two can be compared.
#include "measure/allocator.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <array>
#include <bit>
#include <deque>

#include "membudget/error.hpp"

namespace membudget::measure {

// RawMemory's defaults: no virtual-memory mapping.
void* RawMemory::reserve_range(std::size_t) { return nullptr; }
void RawMemory::release_range(void*, std::size_t) {}
bool RawMemory::map_range(void*, std::size_t) { return false; }
void RawMemory::unmap_range(void*, std::size_t) {}

namespace {
void* as_ptr(DeviceAddr a) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(a)); }
DeviceAddr as_addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
// A size the pointer forms can take: on a 32-bit target, none past 4 GiB.
bool fits_size_t(bytes_t b) { return b <= std::numeric_limits<std::size_t>::max(); }
}  // namespace

DeviceAddr RawMemory::raw_alloc_at(bytes_t bytes) {
  return fits_size_t(bytes) ? as_addr(raw_alloc(static_cast<std::size_t>(bytes))) : 0;
}
void RawMemory::raw_free_at(DeviceAddr addr, bytes_t bytes) { raw_free(as_ptr(addr), static_cast<std::size_t>(bytes)); }
DeviceAddr RawMemory::reserve_range_at(bytes_t bytes) {
  return fits_size_t(bytes) ? as_addr(reserve_range(static_cast<std::size_t>(bytes))) : 0;
}
void RawMemory::release_range_at(DeviceAddr base, bytes_t bytes) {
  release_range(as_ptr(base), static_cast<std::size_t>(bytes));
}
bool RawMemory::map_range_at(DeviceAddr addr, bytes_t bytes) {
  return fits_size_t(bytes) && map_range(as_ptr(addr), static_cast<std::size_t>(bytes));
}
void RawMemory::unmap_range_at(DeviceAddr addr, bytes_t bytes) { unmap_range(as_ptr(addr), static_cast<std::size_t>(bytes)); }

namespace {

struct Segment;

struct Block {
  DeviceAddr addr = 0;
  bytes_t size = 0;
  bytes_t requested = 0;  // the caller's size while allocated
  bool allocated = false;
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
  Segment* seg = nullptr;
  // The tensor that holds (or last held) the block; null when untagged, as every block of the
  // reserved-memory replay is. Out of line, a Block is 64 bytes rather than 152: the replay
  // reaches thousands of them.
  std::unique_ptr<AllocTag> tag;

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct Segment {
  DeviceAddr base = 0;
  bytes_t size = 0;          // bytes held from the raw memory (mapped bytes if expandable)
  bytes_t virtual_size = 0;  // reserved address range (expandable only)
  bool small = false;
  bool expandable = false;
  StreamId stream = 0;  // every block of the segment is this stream's
  Block* head = nullptr;

  Block* tail() const {
    Block* b = head;
    while (b && b->next) b = b->next;
    return b;
  }
};

// A pool's cached free blocks, ordered for best fit: smallest block that is large enough, ties
// broken by the lower address (c10's BlockComparatorSize, one std::set there). Here the same order
// in size classes (sixteen per power of two), each a sorted array of (size, address) keys, and a bit
// per class that holds any: a pool holds hundreds of free blocks while a step is replayed (some
// 10^4 inserts and erases per step), and a search in one short contiguous array costs less than a
// walk through a tree's nodes. Every block of a class is smaller than every block of a later
// class, so the smallest block >= size is the smallest >= size in its class, else the smallest
// of the next class that holds any. A block's size and address change only while it is out of
// the set.
// Each array is kept in descending order, the best fit last: most of a class's blocks have one
// size (a step's many equal tensors), the best fit is the block taken most often, and freed blocks
// land nearer the low addresses too, so an insert or erase moves fewer entries behind it (the 8B
// and 70B reserved replays: 19 per insert and 11 per erase of 65 on average, against 47 and 52
// in ascending order). take_best_fit searches once where finding and erasing searched twice.
class FreeBlocks {
 public:
  void insert(Block* b) {
    const Entry e{b->size, b->addr, b};
    const std::size_t c = size_class(b->size);
    auto& v = classes_[c];
    v.insert(position(v, key(e.size, e.addr)), e);
    held_[c / 64] |= std::uint64_t{1} << (c % 64);
  }
  void erase(Block* b) {
    const std::size_t c = size_class(b->size);
    auto& v = classes_[c];
    // the last entry, the lowest, is the one most often erased (4 times in 10 in the replays)
    const auto it = !v.empty() && v.back().block == b ? v.end() - 1 : position(v, key(b->size, b->addr));
    if (it == v.end() || it->block != b) return;
    erase_at(c, it);
  }
  // Takes out and returns the smallest block of at least `size` bytes (lowest address among
  // equals) if `take(block)` accepts it; nullptr (and nothing taken) otherwise.
  template <class Take>
  Block* take_best_fit(bytes_t size, Take&& take) {
    std::size_t c = size_class(size);
    auto& v = classes_[c];
    // the last entry of at least `size` bytes, the one before the first not above (size, 0) (no
    // block has address 0)
    const auto below = position(v, key(size, 0));
    if (below != v.begin()) return take_at(c, below - 1, take);
    for (++c; c < kClasses; c = (c / 64 + 1) * 64) {  // the next class holding any
      const std::uint64_t w = held_[c / 64] & (~std::uint64_t{0} << (c % 64));
      if (w) {
        const std::size_t next = c / 64 * 64 + static_cast<std::size_t>(std::countr_zero(w));
        return take_at(next, classes_[next].end() - 1, take);
      }
    }
    return nullptr;
  }
  // Calls f(block) for each block of at least `size` bytes in (size, address) order, the best fit
  // first, until f returns false.
  template <class F>
  void scan_from(bytes_t size, F&& f) {
    std::size_t c = size_class(size);
    auto& v = classes_[c];
    for (auto it = position(v, key(size, 0)); it != v.begin();)
      if (!f((--it)->block)) return;
    for (++c; c < kClasses; ++c)
      if (held_[c / 64] >> (c % 64) & 1)
        for (auto it = classes_[c].rbegin(); it != classes_[c].rend(); ++it)
          if (!f(it->block)) return;
  }
  // The largest block's size; 0 when there is none.
  bytes_t largest() const {
    for (std::size_t w = held_.size(); w-- > 0;)
      if (held_[w]) return classes_[w * 64 + 63 - static_cast<std::size_t>(std::countl_zero(held_[w]))].front().size;
    return 0;
  }
  void clear() {  // the classes keep their room
    for (std::size_t w = 0; w < held_.size(); ++w)
      for (std::uint64_t bits = held_[w]; bits; bits &= bits - 1)
        classes_[w * 64 + static_cast<std::size_t>(std::countr_zero(bits))].clear();
    held_ = {};
  }
  template <class F>
  void for_each(F&& f) const {  // in (size, address) order
    for (const auto& v : classes_)
      for (auto it = v.rbegin(); it != v.rend(); ++it) f(it->block);
  }

 private:
  using Key = unsigned __int128;  // (size, address) in one number, compared at once
  static Key key(bytes_t size, DeviceAddr addr) { return Key{size} << 64 | addr; }
  struct Entry {
    bytes_t size;
    DeviceAddr addr;
    Block* block;
  };
  using Class = std::vector<Entry>;
  // The first entry of `v` not above `k`: std::lower_bound in the descending order. The end is
  // tried first: it is the answer for most inserts and nearly every best fit (the 8B and 70B
  // reserved replays: 62% and 98%).
  static Class::iterator position(Class& v, Key k) {
    const auto above = [](const Entry& e, Key k) { return key(e.size, e.addr) > k; };
    if (v.empty() || above(v.back(), k)) return v.end();
    return std::lower_bound(v.begin(), v.end() - 1, k, above);
  }
  template <class Take>
  Block* take_at(std::size_t c, Class::iterator it, Take&& take) {
    Block* b = it->block;
    if (!take(b)) return nullptr;
    erase_at(c, it);
    return b;
  }
  void erase_at(std::size_t c, Class::iterator it) {
    auto& v = classes_[c];
    v.erase(it);
    if (v.empty()) held_[c / 64] &= ~(std::uint64_t{1} << (c % 64));
  }
  // Sixteen classes per power of two: a search passes fewer blocks of other sizes than with four
  // (the 8B and 70B reserved replays: 5-10% faster); 64 gained nothing more.
  static constexpr std::size_t kSubBits = 4;
  static constexpr std::size_t kClasses = 65 << kSubBits;
  // Monotonic in the size: the bit length, then the kSubBits bits after the leading one.
  static std::size_t size_class(bytes_t size) {
    const auto w = static_cast<std::size_t>(std::bit_width(size));
    return w <= kSubBits ? w << kSubBits
                         : (w << kSubBits) + static_cast<std::size_t>((size >> (w - 1 - kSubBits)) & ((1u << kSubBits) - 1));
  }
  std::array<Class, kClasses> classes_;
  std::array<std::uint64_t, (kClasses + 63) / 64> held_{};
};

// Every segment, owned here, in address order (for layout_hash and the snapshot). The order is
// kept descending, so that a segment below all the others is appended: the replay's fake memory
// hands out each segment below the last, and cudaMalloc mostly did on the H200 (fake_memory.hpp).
// Segments live in a deque and a released one's place is reused: an 8B reserved replay makes
// some 900 segments, and a map node and a heap object for each were some 5% of its time.
class SegmentList {
 public:
  Segment* add(const Segment& s) {
    Segment* seg;
    if (spare_.empty()) {
      if (used_ == store_.size()) store_.emplace_back();
      seg = &store_[used_++];
      *seg = s;
    } else {
      seg = spare_.back();
      spare_.pop_back();
      *seg = s;
    }
    by_address_.insert(position(seg->base), seg);
    return seg;
  }
  void remove(Segment* seg) {
    by_address_.erase(position(seg->base) - 1);  // the one at seg->base precedes the first below it
    spare_.push_back(seg);
  }
  void clear() {  // the store keeps its room
    used_ = 0;
    spare_.clear();
    by_address_.clear();
  }
  template <class F>
  void for_each(F&& f) const {  // in ascending address order
    for (auto it = by_address_.rbegin(); it != by_address_.rend(); ++it) f(**it);
  }

 private:
  // The first segment below `base` (the end first: the usual new segment is the lowest).
  std::vector<Segment*>::iterator position(DeviceAddr base) {
    if (by_address_.empty() || by_address_.back()->base > base) return by_address_.end();
    return std::upper_bound(by_address_.begin(), by_address_.end(), base,
                            [](DeviceAddr a, const Segment* s) { return a > s->base; });
  }
  std::deque<Segment> store_;
  std::size_t used_ = 0;  // store_'s segments in use or in spare_; the rest are room
  std::vector<Segment*> spare_;
  std::vector<Segment*> by_address_;  // descending
};

// Live blocks by address (c10's active blocks): open addressing with linear probing, so that a
// lookup is a multiply and a probe or two rather than a node of a std::unordered_map.
class AddressMap {
 public:
  void insert(DeviceAddr a, Block* b) {
    if (2 * (count_ + 1) > slots_.size()) grow();
    std::size_t i = home(a);
    while (slots_[i].addr) i = (i + 1) & mask_;
    slots_[i] = {a, b};
    ++count_;
  }
  void clear() {  // the table keeps its room
    if (count_) std::fill(slots_.begin(), slots_.end(), Slot{});
    count_ = 0;
  }
  // Removes a's entry and returns its block; nullptr (and nothing removed) if a has none. One
  // probe sequence, then backward-shift deletion: no tombstones.
  Block* take(DeviceAddr a) {
    if (slots_.empty()) return nullptr;
    std::size_t i = home(a);
    for (; slots_[i].addr != a; i = (i + 1) & mask_)
      if (!slots_[i].addr) return nullptr;
    Block* const taken = slots_[i].block;
    for (std::size_t j = (i + 1) & mask_; slots_[j].addr; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].addr);
      // slot j's entry may move to the hole i unless its home lies cyclically in (i, j]
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {};
    --count_;
    return taken;
  }

 private:
  struct Slot {
    DeviceAddr addr = 0;  // 0: empty (no block has address 0)
    Block* block = nullptr;
  };
  std::size_t home(DeviceAddr a) const { return static_cast<std::size_t>((a * 0x9e3779b97f4a7c15ull) >> shift_); }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    const std::size_t n = old.empty() ? 1024 : 2 * old.size();
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(n));
    count_ = 0;
    for (const Slot& s : old)
      if (s.addr) insert(s.addr, s.block);
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0, count_ = 0;
  unsigned shift_ = 64;
};

// One stream's share of a pool. c10 keeps one set per pool ordered by (stream, size, address) and
// searches only the requesting stream's range; a set per stream is the same search.
struct StreamBlocks {
  FreeBlocks free_blocks;
  Segment* expandable = nullptr;  // the stream's one growing segment of the pool in expandable mode
};

struct Pool {
  bool small;
  std::vector<std::unique_ptr<StreamBlocks>> streams;  // by StreamId, made on first use

  StreamBlocks& of(StreamId s) {
    if (s >= streams.size()) streams.resize(s + 1);
    if (!streams[s]) streams[s] = std::make_unique<StreamBlocks>();
    return *streams[s];
  }
  FreeBlocks& free_blocks(const Block* b) { return of(b->seg->stream).free_blocks; }
};

void update(Stat& s, std::int64_t delta) {
  s.current += delta;
  s.peak = std::max(s.peak, s.current);
}

std::int64_t as_i64(bytes_t v) { return static_cast<std::int64_t>(v); }

bytes_t round_up(bytes_t v, bytes_t unit) { return (v + unit - 1) / unit * unit; }

std::string describe(const AllocTag& tag) {
  if (tag.tensor.empty() && tag.op.empty() && tag.phase.empty()) return "an untagged tensor";
  std::string s = "tensor '" + (tag.tensor.empty() ? std::string("?") : tag.tensor) + "'";
  if (!tag.op.empty() || !tag.phase.empty()) {
    s += " (";
    if (!tag.op.empty()) s += "op " + tag.op;
    if (!tag.op.empty() && !tag.phase.empty()) s += ", ";
    if (!tag.phase.empty()) s += "phase " + tag.phase;
    s += ")";
  }
  return s;
}

}  // namespace

struct CachingAllocator::Impl {
  RawMemory& raw;
  AllocatorOptions options;
  const AllocatorPolicy& policy = options.policy;
  AllocatorStats stats;
  Pool small_pool{true, {}};
  Pool large_pool{false, {}};
  SegmentList segments;
  AddressMap active;  // live blocks by address
  // Blocks are made and merged away at every split and free: they come from chunks owned here and
  // return to `spare_blocks`, rather than from new and delete.
  static constexpr std::size_t kBlockChunk = 256;
  std::vector<std::unique_ptr<Block[]>> block_chunks;
  std::size_t blocks_used = 0;  // of block_chunks' blocks, in order: in use or in spare_blocks
  std::vector<Block*> spare_blocks;
  std::vector<TraceEvent> history;
  std::uint64_t last_time_us = 0;

  // round_size's case: a power-of-two unit and no roundup_power2_divisions. Of the policy, so set
  // again by reset() (a thread's replay allocator serves jobs of several allocator settings).
  bool plain_rounding = is_plain_rounding(policy);
  static bool is_plain_rounding(const AllocatorPolicy& p) {
    return std::has_single_bit(p.min_block_size) && !p.rounds_to_divisions();
  }

  Impl(RawMemory& r, AllocatorOptions o) : raw(r), options(o) {}

  ~Impl() { release_segments(); }  // the blocks go with block_chunks

  // As constructed with `o`: every segment given back to the raw memory, every container kept
  // with the room it has grown to.
  void reset(const AllocatorOptions& o) {
    release_segments();
    segments.clear();
    options = o;
    plain_rounding = is_plain_rounding(policy);
    stats = {};
    for (Pool* pool : {&small_pool, &large_pool})
      for (auto& stream : pool->streams)
        if (stream) {
          stream->free_blocks.clear();
          stream->expandable = nullptr;
        }
    active.clear();
    spare_blocks.clear();
    blocks_used = 0;
    history.clear();
    last_time_us = 0;
  }

  void release_segments() {
    segments.for_each([&](const Segment& seg) {
      if (seg.expandable) {
        if (seg.size) raw.unmap_range_at(seg.base, seg.size);
        raw.release_range_at(seg.base, seg.virtual_size);
      } else {
        raw.raw_free_at(seg.base, seg.size);
      }
    });
  }

  // A block as Block{} is (one deleted, else the next of the chunks).
  Block* new_block() {
    if (!spare_blocks.empty()) {
      Block* b = spare_blocks.back();
      spare_blocks.pop_back();
      return b;
    }
    if (blocks_used == block_chunks.size() * kBlockChunk) block_chunks.push_back(std::make_unique<Block[]>(kBlockChunk));
    Block* b = &block_chunks[blocks_used / kBlockChunk][blocks_used % kBlockChunk];
    ++blocks_used;
    *b = Block{};  // (after a reset it may have been used)
    return b;
  }
  void delete_block(Block* b) {
    b->addr = b->size = b->requested = 0;
    b->allocated = false;
    b->prev = b->next = nullptr;
    b->seg = nullptr;
    b->tag.reset();
    spare_blocks.push_back(b);
  }
  // A block's tag; most callers (the reserved-memory replay) tag nothing, and then nothing is
  // allocated or copied.
  static void set_tag(Block& b, const AllocTag& tag) {
    if (tag.op.empty() && tag.tensor.empty() && tag.phase.empty())
      b.tag.reset();
    else if (b.tag)
      *b.tag = tag;
    else
      b.tag = std::make_unique<AllocTag>(tag);
  }
  static const AllocTag& untagged() {
    static const AllocTag none;
    return none;
  }
  static const AllocTag& tag_of(const Block& b) { return b.tag ? *b.tag : untagged(); }

  // policy.round_size(bytes) (0 < bytes <= 2^62), its common case inline: with c10's defaults (no
  // roundup_power2_divisions, 512-byte blocks) the rounding is a mask, where the general form (a
  // division and the divisions' lookup) was some 5% of a reserved replay.
  bytes_t round_size(bytes_t bytes) const {
    const bytes_t unit = policy.min_block_size;
    if (plain_rounding) return bytes <= unit ? unit : (bytes + unit - 1) & ~(unit - 1);
    return policy.round_size(bytes);
  }

  Pool& pool_for(bytes_t rounded) { return policy.is_small(rounded) ? small_pool : large_pool; }
  Pool& pool_of(const Segment& seg) { return seg.small ? small_pool : large_pool; }

  bytes_t page_size(const Pool& pool) const { return policy.page_size(pool.small); }

  std::uint64_t now_us() {
    auto t = std::chrono::duration_cast<std::chrono::microseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
                 .count();
    last_time_us = std::max(last_time_us, static_cast<std::uint64_t>(t));
    return last_time_us;
  }

  // The test inline and the recording out of line, so that an allocator without history (the
  // reserved replay's) pays a test per event rather than a call.
  void record(TraceEvent::Action action, std::uint64_t addr, std::uint64_t size, const AllocTag& tag = untagged(),
              StreamId stream = 0) {
    if (options.record_history) [[unlikely]]
      record_event(action, addr, size, tag, stream);
  }
  [[gnu::noinline]] void record_event(TraceEvent::Action action, std::uint64_t addr, std::uint64_t size,
                                      const AllocTag& tag, StreamId stream) {
    history.push_back(TraceEvent{action, addr, size, now_us(), tag, stream});
  }

  // c10 get_free_block: the smallest cached block >= size in the pool, unless the policy's
  // oversize rules (max_split_size; unlimited by default) keep it for other requests.
  Block* get_free_block(FreeBlocks& free_blocks, bytes_t size) {
    if (policy.expandable_segments) return get_free_expandable_block(free_blocks, size);
    return free_blocks.take_best_fit(size, [&](const Block* b) { return policy.may_reuse(size, b->size); });
  }
  // c10's get_free_block with expandable segments: a free block at the end of a segment's mapped
  // pages counts, for the best fit, as the size it can grow to (its own and the unmapped rest of
  // the segment's addresses), so that from the smallest block that holds the request the search
  // moves on to each larger one that could grow less, while there is one. The end of the mapped
  // pages is thus taken last: a request fills a hole inside the segment before it, even a larger
  // hole (the LoRA and for-loop Adafactor steps under expandable segments in
  // tests/data/expandable_more/: an 8 MiB request into a 16 MiB hole rather than the 11 MiB free
  // at the end; best fit by size alone mapped one fp32 logits tensor more, +9% and +7.6%).
  Block* get_free_expandable_block(FreeBlocks& free_blocks, bytes_t size) {
    const auto could_grow_to = [](const Block* b) {
      return b->size + (b->next == nullptr ? b->seg->virtual_size - b->seg->size : 0);
    };
    Block* best = nullptr;
    bytes_t best_size = 0;
    free_blocks.scan_from(size, [&](Block* b) {
      const bytes_t grow = could_grow_to(b);
      if (best && grow >= best_size) return false;
      best = b;
      best_size = grow;
      return true;
    });
    if (!best || !policy.may_reuse(size, best->size)) return nullptr;
    free_blocks.erase(best);
    return best;
  }

  // c10 alloc_block: a new segment from the raw memory (or more pages in expandable mode).
  // `asked` receives the bytes requested from the raw memory, for the OOM message.
  Block* alloc_block(Pool& pool, StreamId stream, bytes_t size, bool is_retry, bytes_t& asked) {
    if (is_retry) stats.num_alloc_retries += 1;
    if (policy.expandable_segments) return grow_expandable(pool, stream, size, asked);
    bytes_t bytes = policy.segment_size(size);
    asked = bytes;
    const DeviceAddr p = raw.raw_alloc_at(bytes);
    if (!p) return nullptr;
    Segment* seg = segments.add(Segment{.base = p, .size = bytes, .small = pool.small, .stream = stream});
    Block* b = new_block();
    b->addr = seg->base;
    b->size = bytes;
    b->seg = seg;
    seg->head = b;
    update(stats.reserved, as_i64(bytes));
    stats.num_segments += 1;
    record(TraceEvent::Action::segment_alloc, b->addr, bytes, untagged(), stream);
    return b;
  }

  // Maps just enough whole pages after the segment's last block; a free last block is extended
  // rather than left as a separate piece. The returned block is out of the free set.
  Block* grow_expandable(Pool& pool, StreamId stream, bytes_t size, bytes_t& asked) {
    const bytes_t page = page_size(pool);
    StreamBlocks& mine = pool.of(stream);
    Segment* seg = mine.expandable;
    if (!seg) {
      bytes_t virtual_size = round_up(std::max<bytes_t>(raw.capacity(), page), page);
      const DeviceAddr base = raw.reserve_range_at(virtual_size);
      if (!base)
        throw Error(ErrorKind::unsupported,
                    "expandable segments: the raw memory '" + raw.name() +
                        "' cannot reserve and map address ranges; run without expandable segments");
      seg = segments.add(Segment{.base = base, .virtual_size = virtual_size, .small = pool.small, .expandable = true, .stream = stream});
      mine.expandable = seg;
    }
    Block* last = seg->tail();
    bytes_t have = (last && !last->allocated) ? last->size : 0;
    bytes_t bytes = round_up(size - have, page);
    asked = bytes;
    if (bytes > seg->virtual_size - seg->size) return nullptr;
    DeviceAddr at = seg->base + seg->size;
    if (!raw.map_range_at(at, bytes)) return nullptr;
    record(TraceEvent::Action::segment_map, at, bytes, untagged(), stream);
    update(stats.reserved, as_i64(bytes));
    if (seg->size == 0) stats.num_segments += 1;
    seg->size += bytes;
    if (have) {
      mine.free_blocks.erase(last);
      last->size += bytes;
      return last;
    }
    Block* b = new_block();
    b->addr = at;
    b->size = bytes;
    b->seg = seg;
    b->prev = last;
    if (last)
      last->next = b;
    else
      seg->head = b;
    return b;
  }

  // c10 release_cached_blocks: return every segment that is one free block; in expandable mode,
  // unmap the whole free pages at the end of each pool's segment.
  void release_cached_blocks() {
    for (Pool* pool : {&large_pool, &small_pool})
      for (auto& stream : pool->streams) {
        if (!stream) continue;
        std::vector<Block*> whole;
        stream->free_blocks.for_each([&](Block* b) {
          if (!b->is_split() && !b->seg->expandable) whole.push_back(b);
        });
        for (Block* b : whole) release_segment(*pool, b);
        if (stream->expandable) unmap_free_tail(*pool, *stream->expandable);
      }
  }

  void release_segment(Pool& pool, Block* b) {
    pool.free_blocks(b).erase(b);
    Segment* seg = b->seg;
    record(TraceEvent::Action::segment_free, seg->base, seg->size, untagged(), seg->stream);
    raw.raw_free_at(seg->base, seg->size);
    update(stats.reserved, -as_i64(seg->size));
    stats.num_segments -= 1;
    delete_block(b);
    segments.remove(seg);
  }

  void unmap_free_tail(Pool& pool, Segment& seg) {
    Block* last = seg.tail();
    if (!last || last->allocated) return;
    const bytes_t page = page_size(pool);
    DeviceAddr cut = seg.base + round_up(last->addr - seg.base, page);
    DeviceAddr end = seg.base + seg.size;
    if (cut >= end) return;
    bytes_t bytes = end - cut;
    FreeBlocks& free_blocks = pool.of(seg.stream).free_blocks;
    free_blocks.erase(last);
    if (cut == last->addr) {
      if (last->prev)
        last->prev->next = nullptr;
      else
        seg.head = nullptr;
      delete_block(last);
    } else {
      last->size = cut - last->addr;
      free_blocks.insert(last);
    }
    raw.unmap_range_at(cut, bytes);
    record(TraceEvent::Action::segment_unmap, cut, bytes, untagged(), seg.stream);
    update(stats.reserved, -as_i64(bytes));
    seg.size -= bytes;
    if (seg.size == 0) stats.num_segments -= 1;
  }

  [[noreturn]] void out_of_memory(bytes_t requested, bytes_t rounded, bytes_t asked,
                                  const AllocTag& tag) {
    stats.num_ooms += 1;
    bytes_t device_free = raw.free_bytes();
    record(TraceEvent::Action::oom, device_free, asked, tag);
    auto allocated = static_cast<bytes_t>(stats.allocated.current);
    auto reserved = static_cast<bytes_t>(stats.reserved.current);
    std::string msg = raw.name() + " out of memory. Tried to allocate " + format_bytes(asked) +
                      ". Device has a total capacity of " + format_bytes(raw.capacity()) +
                      " of which " + format_bytes(device_free) +
                      " is free. Of the allocated memory " + format_bytes(allocated) +
                      " is allocated by the harness, and " + format_bytes(reserved - allocated) +
                      " is reserved but unallocated. The request was " + format_bytes(requested) +
                      " (" + std::to_string(requested) + " B, rounded to " + std::to_string(rounded) +
                      " B) for " + describe(tag) + ".";
    throw Error(ErrorKind::out_of_memory, msg);
  }

  // A live block of `bytes` (nullptr for zero bytes, as c10: such an allocation has no block);
  // allocate_at also enters it in `active`.
  Block* allocate(bytes_t bytes, const AllocTag& tag, StreamId stream) {
    if (bytes == 0) return nullptr;
    if (bytes > (bytes_t{1} << 62))
      throw Error(ErrorKind::invalid_argument,
                  "allocate: " + std::to_string(bytes) + " bytes for " + describe(tag) + " is absurd");
    const bytes_t size = round_size(bytes);
    Pool& pool = pool_for(size);

    // the stream's free blocks: the block found or made, and the rest of it when split, are its
    FreeBlocks& free_blocks = pool.of(stream).free_blocks;
    Block* b = get_free_block(free_blocks, size);
    if (!b) {
      bytes_t asked = 0;
      b = alloc_block(pool, stream, size, false, asked);
      if (!b) {
        // The OOM path in full: give every cached whole segment back, then try once more.
        release_cached_blocks();
        b = alloc_block(pool, stream, size, true, asked);
      }
      if (!b) out_of_memory(bytes, size, asked, tag);
    }

    const bool expandable = b->seg->expandable;
    const bool already_split = b->is_split();
    const bytes_t remaining = b->size - size;
    const bool split = policy.should_split(pool.small || expandable, size, remaining);
    if (split) {
      Block* rest = new_block();
      rest->addr = b->addr + size;
      rest->size = remaining;
      rest->seg = b->seg;
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      free_blocks.insert(rest);
      if (!expandable) {
        if (already_split)
          update(stats.inactive_split, -as_i64(size));  // an inactive split block shrinks
        else
          update(stats.inactive_split, as_i64(remaining));  // a new inactive split block
      }
    } else if (already_split && !expandable) {
      update(stats.inactive_split, -as_i64(b->size));  // an inactive split block becomes active
    }

    b->allocated = true;
    b->requested = bytes;
    set_tag(*b, tag);
    update(stats.allocated, as_i64(b->size));
    update(stats.active, as_i64(b->size));
    update(stats.requested, as_i64(bytes));
    record(TraceEvent::Action::alloc, b->addr, bytes, tag, stream);
    return b;
  }

  DeviceAddr allocate_at(bytes_t bytes, const AllocTag& tag, StreamId stream) {
    Block* b = allocate(bytes, tag, stream);
    if (!b) return 0;
    active.insert(b->addr, b);
    return b->addr;
  }

  void deallocate_at(DeviceAddr ptr) {
    if (!ptr) return;
    Block* b = active.take(ptr);
    if (!b)
      throw Error(ErrorKind::invalid_argument,
                  "deallocate: the pointer was not returned by this allocator or is already free");
    deallocate(b);
  }

  void deallocate(Block* b) {
    b->allocated = false;
    update(stats.allocated, -as_i64(b->size));
    record(TraceEvent::Action::free_requested, b->addr, b->requested, tag_of(*b), b->seg->stream);
    record(TraceEvent::Action::free_completed, b->addr, b->requested, tag_of(*b), b->seg->stream);
    free_block(b);
  }

  // c10 free_block: merge with free neighbours, then account the inactive split bytes.
  void free_block(Block* b) {
    FreeBlocks& free_blocks = pool_of(*b->seg).free_blocks(b);  // its neighbours' too (one segment)
    const bytes_t original_size = b->size;
    const bytes_t requested = b->requested;
    std::int64_t split_change = 0;
    for (Block* candidate : {b->prev, b->next}) {
      if (!candidate || candidate->allocated) continue;
      free_blocks.erase(candidate);
      if (candidate == b->prev) {
        b->addr = candidate->addr;
        b->prev = candidate->prev;
        if (b->prev)
          b->prev->next = b;
        else
          b->seg->head = b;
      } else {
        b->next = candidate->next;
        if (b->next) b->next->prev = b;
      }
      b->size += candidate->size;
      split_change -= as_i64(candidate->size);
      delete_block(candidate);
    }
    b->requested = 0;
    free_blocks.insert(b);
    if (b->is_split()) split_change += as_i64(b->size);
    if (!b->seg->expandable) update(stats.inactive_split, split_change);
    update(stats.active, -as_i64(original_size));
    update(stats.requested, -as_i64(requested));
  }

  std::vector<SegmentInfo> snapshot_segments() const {
    std::vector<SegmentInfo> out;
    segments.for_each([&](const Segment& s) {
      const Segment* seg = &s;
      if (seg->size == 0) return;
      SegmentInfo info;
      info.address = seg->base;
      info.total_size = seg->size;
      info.small = seg->small;
      info.expandable = seg->expandable;
      info.stream = seg->stream;
      for (Block* b = seg->head; b; b = b->next) {
        BlockInfo bi;
        bi.address = b->addr;
        bi.size = b->size;
        bi.requested_size = b->allocated ? b->requested : 0;
        bi.state = b->allocated ? BlockInfo::State::active_allocated : BlockInfo::State::inactive;
        bi.tag = tag_of(*b);
        if (b->allocated) {
          info.allocated_size += b->size;
          info.active_size += b->size;
          info.requested_size += b->requested;
        }
        info.blocks.push_back(std::move(bi));
      }
      out.push_back(std::move(info));
    });
    return out;
  }
};

CachingAllocator::CachingAllocator(RawMemory& raw, AllocatorOptions options)
    : impl_(std::make_unique<Impl>(raw, options)), stats_(&impl_->stats) {}

CachingAllocator::~CachingAllocator() = default;

DeviceAddr CachingAllocator::allocate_at(bytes_t bytes, const AllocTag& tag, StreamId stream) {
  return impl_->allocate_at(bytes, tag, stream);
}

void CachingAllocator::deallocate_at(DeviceAddr addr) { impl_->deallocate_at(addr); }

BlockRef CachingAllocator::allocate_block(bytes_t bytes, const AllocTag& tag, StreamId stream) {
  return BlockRef(impl_->allocate(bytes, tag, stream));
}

void CachingAllocator::deallocate_block(BlockRef block) {
  if (block) impl_->deallocate(static_cast<Block*>(block.block_));
}


void CachingAllocator::reset_peak_stats() {
  for (Stat* s : {&impl_->stats.allocated, &impl_->stats.reserved, &impl_->stats.active,
                  &impl_->stats.inactive_split, &impl_->stats.requested})
    s->peak = s->current;
}

void CachingAllocator::empty_cache() { impl_->release_cached_blocks(); }

void CachingAllocator::reset(AllocatorOptions options) { impl_->reset(options); }

const AllocatorPolicy& CachingAllocator::policy() const { return impl_->policy; }

bytes_t CachingAllocator::largest_free_block(bool small_pool, StreamId stream) const {
  const Pool& pool = small_pool ? impl_->small_pool : impl_->large_pool;
  return stream < pool.streams.size() && pool.streams[stream] ? pool.streams[stream]->free_blocks.largest() : 0;
}

std::vector<SegmentInfo> CachingAllocator::segments() const { return impl_->snapshot_segments(); }

std::uint64_t CachingAllocator::layout_hash() const {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 0x100000001b3ull; h ^= h >> 29; };
  impl_->segments.for_each([&](const Segment& seg) {
    mix(seg.base);
    mix(seg.size);
    mix(seg.stream);
    for (const Block* b = seg.head; b; b = b->next) {
      mix(b->addr);
      mix(b->size * 2 + (b->allocated ? 1 : 0));
    }
  });
  return h;
}

const AllocatorOptions& CachingAllocator::options() const { return impl_->options; }

const std::vector<TraceEvent>& CachingAllocator::history() const { return impl_->history; }

RawMemory& CachingAllocator::raw() const { return impl_->raw; }

}  // namespace membudget::measure
