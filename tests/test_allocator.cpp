// The caching allocator, one action per step, exact bookkeeping after each (cub's habit).
// Expected sizes are computed with the allocator's own policy (src/common/allocator_policy.hpp).
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "measure/allocator.hpp"
#include "model/autograd_sim.hpp"

using namespace membudget;
using namespace membudget::measure;
using CA = CachingAllocator;
constexpr const AllocatorPolicy& P = kPyTorchAllocator;  // the policy the allocator follows by default

namespace {

std::int64_t i64(std::size_t v) { return static_cast<std::int64_t>(v); }

}  // namespace

TEST_CASE("rounding and segment sizes follow c10") {
  CHECK(P.round_size(1) == 512);
  CHECK(P.round_size(512) == 512);
  CHECK(P.round_size(513) == 1024);
  CHECK(P.round_size(1000) == 1024);
  CHECK(P.round_size(30000000) == 30000128);
  CHECK(P.segment_size(1024) == 2 * MiB);
  CHECK(P.segment_size(1 * MiB) == 2 * MiB);
  CHECK(P.segment_size(1 * MiB + 512) == 20 * MiB);
  CHECK(P.segment_size(10 * MiB - 512) == 20 * MiB);
  CHECK(P.segment_size(10 * MiB) == 10 * MiB);
  CHECK(P.segment_size(30000128) == 31457280);
}

TEST_CASE("a small request carves a block from a new 2 MiB segment") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* p = a.allocate(1000);
  REQUIRE(p != nullptr);
  std::memset(p, 0xab, 1000);  // the memory is real
  auto s = a.stats();
  CHECK(s.allocated.current == i64(P.round_size(1000)));
  CHECK(s.reserved.current == i64(P.segment_size(P.round_size(1000))));
  CHECK(s.requested.current == 1000);
  CHECK(s.active.current == 1024);
  CHECK(s.inactive_split.current == i64(2 * MiB - 1024));
  CHECK(s.num_segments == 1);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 512 == 0);

  a.deallocate(p);
  s = a.stats();
  CHECK(s.allocated.current == 0);
  CHECK(s.allocated.peak == 1024);
  CHECK(s.reserved.current == i64(2 * MiB));  // cached, not returned
  CHECK(s.inactive_split.current == 0);        // coalesced back into one whole free block
  CHECK(s.requested.current == 0);
}

TEST_CASE("a large request below 10 MiB gets a 20 MiB segment and leaves the rest cached") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* p = a.allocate(5 * MiB);
  auto s = a.stats();
  CHECK(s.allocated.current == i64(5 * MiB));
  CHECK(s.reserved.current == i64(P.segment_size(5 * MiB)));
  CHECK(s.inactive_split.current == i64(15 * MiB));
  auto segs = a.segments();
  REQUIRE(segs.size() == 1);
  CHECK_FALSE(segs[0].small);
  REQUIRE(segs[0].blocks.size() == 2);
  CHECK(segs[0].blocks[0].size == 5 * MiB);
  CHECK(segs[0].blocks[1].size == 15 * MiB);
  CHECK(segs[0].blocks[1].state == BlockInfo::State::inactive);
  a.deallocate(p);
}

TEST_CASE("a large request above 10 MiB rounds its segment to 2 MiB and splits a >1 MiB tail") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* p = a.allocate(30000000);
  const std::size_t rounded = P.round_size(30000000);
  const std::size_t seg = P.segment_size(rounded);
  auto s = a.stats();
  CHECK(s.allocated.current == i64(rounded));
  CHECK(s.reserved.current == i64(seg));
  CHECK(s.inactive_split.current == i64(seg - rounded));  // 1,457,152 > 1 MiB: split
  CHECK(s.requested.current == 30000000);
  a.deallocate(p);
}

TEST_CASE("a large-pool remainder of at most 1 MiB is not split") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* p = a.allocate(19 * MiB + 512);  // segment 20 MiB, remainder 1 MiB - 512: not split
  auto s = a.stats();
  CHECK(s.allocated.current == i64(20 * MiB));
  CHECK(s.requested.current == i64(19 * MiB + 512));
  CHECK(s.inactive_split.current == 0);
  a.deallocate(p);
  CHECK(a.stats().allocated.current == 0);
}

TEST_CASE("a freed block is reused for the next request of its size") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* p = a.allocate(4096);
  a.deallocate(p);
  void* q = a.allocate(4000);
  CHECK(q == p);
  auto s = a.stats();
  CHECK(s.num_segments == 1);
  CHECK(s.reserved.current == i64(2 * MiB));
  CHECK(s.allocated.current == i64(P.round_size(4000)));
  a.deallocate(q);
}

TEST_CASE("best fit picks the smallest cached block, then the lowest address") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* b1 = a.allocate(8192);
  void* sep1 = a.allocate(512);
  void* b2 = a.allocate(4096);
  void* sep2 = a.allocate(512);
  void* b3 = a.allocate(4096);
  void* sep3 = a.allocate(512);
  a.deallocate(b1);
  a.deallocate(b3);
  a.deallocate(b2);
  // free: 8192 @b1, 4096 @b2, 4096 @b3, and the big tail; 4096 exact fits, lowest address wins
  CHECK(a.allocate(4096) == b2);
  CHECK(a.allocate(4096) == b3);
  CHECK(a.allocate(6000) == b1);  // 6144 from the 8192 block, the 2048 remainder is split off
  auto s = a.stats();
  CHECK(s.allocated.current == i64(6144 + 4096 + 4096 + 3 * 512));
  (void)sep1;
  (void)sep2;
  (void)sep3;
}

TEST_CASE("small and large requests never share a pool") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* big = a.allocate(5 * MiB);
  a.deallocate(big);  // a 20 MiB large block is cached
  void* small = a.allocate(1000);
  auto s = a.stats();
  CHECK(s.num_segments == 2);
  CHECK(s.reserved.current == i64(20 * MiB + 2 * MiB));
  a.deallocate(small);
  void* mid = a.allocate(1 * MiB + 1);  // large pool: must not take the 2 MiB small segment
  CHECK(a.stats().num_segments == 2);
  CHECK(reinterpret_cast<std::uintptr_t>(mid) == reinterpret_cast<std::uintptr_t>(big));
  a.deallocate(mid);
}

// c10 files a block under the stream that allocated its segment, and a request searches only its
// own stream's blocks: FSDP2's all-gather and reduce-scatter buffers keep segments of their own.
TEST_CASE("a stream reuses only its own cached blocks") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  const DeviceAddr side = a.allocate_at(5 * MiB, {}, 1);
  a.deallocate_at(side);  // a 20 MiB block cached for stream 1
  const DeviceAddr main = a.allocate_at(5 * MiB);  // stream 0: not that block, a segment of its own
  CHECK(main != side);
  auto s = a.stats();
  CHECK(s.num_segments == 2);
  CHECK(s.reserved.current == i64(2 * P.large_buffer));
  CHECK(a.allocate_at(5 * MiB, {}, 1) == side);  // stream 1 finds its block again
  auto segs = a.segments();
  REQUIRE(segs.size() == 2);
  for (const SegmentInfo& seg : segs) CHECK(seg.stream == (seg.address <= side && side < seg.address + seg.total_size ? 1u : 0u));
  // a freed block merges with its neighbours, within its own segment and stream
  a.deallocate_at(side);
  a.deallocate_at(main);
  a.empty_cache();  // every stream's whole free segments go
  CHECK(a.stats().reserved.current == 0);
  CHECK(a.stats().num_segments == 0);
}

TEST_CASE("expandable segments: one growing segment per pool and stream") {
  auto raw = make_host_memory(0);
  CA a(*raw, AllocatorOptions{.policy = {.expandable_segments = true}});
  const DeviceAddr p = a.allocate_at(5 * MiB);
  const DeviceAddr q = a.allocate_at(5 * MiB, {}, 2);
  CHECK(a.stats().num_segments == 2);
  CHECK(a.stats().reserved.current == i64(2 * P.large_buffer));
  a.deallocate_at(q);
  const DeviceAddr r = a.allocate_at(5 * MiB);  // stream 0 grows within its own page
  CHECK(r == p + 5 * MiB);
  CHECK(a.stats().reserved.current == i64(2 * P.large_buffer));
  a.deallocate_at(p);
  a.deallocate_at(r);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
}

// The reserved replay runs steady steps until one leaves every block where the step before left it.
TEST_CASE("layout_hash: equal for the same blocks, different when a block moved") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  const DeviceAddr keep = a.allocate_at(3 * MiB);
  const std::uint64_t before = a.layout_hash();
  const DeviceAddr t = a.allocate_at(2 * MiB);
  CHECK(a.layout_hash() != before);
  a.deallocate_at(t);
  CHECK(a.layout_hash() == before);  // merged back: the same blocks as before
  a.deallocate_at(keep);
  const std::uint64_t freed = a.layout_hash();
  CHECK(freed != before);
  const DeviceAddr again = a.allocate_at(3 * MiB);
  CHECK(again == keep);
  CHECK(a.layout_hash() == before);
  a.deallocate_at(again);
}

TEST_CASE("splitting: remainders and inactive_split, one step at a time") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* x = a.allocate(512);
  CHECK(a.stats().inactive_split.current == i64(2 * MiB - 512));
  void* y = a.allocate(1024);  // taken from the split remainder: it shrinks by 1024
  CHECK(a.stats().inactive_split.current == i64(2 * MiB - 512 - 1024));
  CHECK(reinterpret_cast<std::uintptr_t>(y) == reinterpret_cast<std::uintptr_t>(x) + 512);
  a.deallocate(x);  // x cannot merge (y is live): a new inactive split block
  CHECK(a.stats().inactive_split.current == i64(2 * MiB - 1024));
  void* z = a.allocate(512);  // reuses x exactly: that inactive split block becomes active
  CHECK(z == x);
  CHECK(a.stats().inactive_split.current == i64(2 * MiB - 512 - 1024));
  a.deallocate(y);
  a.deallocate(z);
  CHECK(a.stats().inactive_split.current == 0);
  CHECK(a.stats().inactive_split.peak == i64(2 * MiB - 512));
}

TEST_CASE("coalescing: free the middle, then the neighbours, ends as one block") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* p1 = a.allocate(1 * MiB / 2);
  void* p2 = a.allocate(1 * MiB / 2);
  void* p3 = a.allocate(1 * MiB / 2);
  REQUIRE(a.segments().size() == 1);
  CHECK(a.segments()[0].blocks.size() == 4);
  a.deallocate(p2);
  CHECK(a.segments()[0].blocks.size() == 4);
  a.deallocate(p1);
  CHECK(a.segments()[0].blocks.size() == 3);  // p1+p2 merged
  a.deallocate(p3);
  auto segs = a.segments();
  REQUIRE(segs[0].blocks.size() == 1);
  CHECK(segs[0].blocks[0].size == 2 * MiB);
  CHECK(segs[0].blocks[0].state == BlockInfo::State::inactive);
  CHECK(a.stats().inactive_split.current == 0);
  CHECK(a.stats().allocated.current == 0);
}

TEST_CASE("reset_peak_stats sets every peak to current") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* p = a.allocate(5 * MiB);
  void* q = a.allocate(1000);
  a.deallocate(p);
  auto s = a.stats();
  CHECK(s.allocated.peak == i64(5 * MiB + 1024));
  a.reset_peak_stats();
  s = a.stats();
  CHECK(s.allocated.peak == 1024);
  CHECK(s.reserved.peak == s.reserved.current);
  CHECK(s.requested.peak == 1000);
  CHECK(s.inactive_split.peak == s.inactive_split.current);
  a.deallocate(q);
}

TEST_CASE("empty_cache returns whole free segments only") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  void* keep = a.allocate(1000);
  void* drop = a.allocate(5 * MiB);
  a.deallocate(drop);
  CHECK(a.stats().reserved.current == i64(22 * MiB));
  a.empty_cache();
  auto s = a.stats();
  CHECK(s.reserved.current == i64(2 * MiB));  // the small segment holds a live block
  CHECK(s.num_segments == 1);
  a.deallocate(keep);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
  CHECK(a.stats().num_segments == 0);
  CHECK(raw->free_bytes() == raw->capacity());
}

TEST_CASE("a failed segment allocation releases the cache and retries once") {
  auto raw = make_host_memory(20 * MiB);
  CA a(*raw);
  void* big = a.allocate(5 * MiB);
  a.deallocate(big);  // the whole 20 MiB segment is cached and fills the capacity
  void* p = a.allocate(1000);  // needs a 2 MiB small segment: fails, flush, retry succeeds
  CHECK(p != nullptr);
  auto s = a.stats();
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_ooms == 0);
  CHECK(s.reserved.current == i64(2 * MiB));
  CHECK(s.num_segments == 1);
  a.deallocate(p);
}

TEST_CASE("out of memory: num_ooms, kind and a PyTorch-like message") {
  auto raw = make_host_memory(20 * MiB);
  CA a(*raw);
  void* live = a.allocate(5 * MiB);  // split segment: cannot be released
  AllocTag tag{"matmul", "layers.3.attn.q", "forward"};
  try {
    a.allocate(30000000, tag);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::out_of_memory);
    std::string m = e.what();
    CHECK(m.find("Tried to allocate " + format_bytes(P.segment_size(P.round_size(30000000)))) !=
          std::string::npos);
    CHECK(m.find(format_bytes(30000000)) != std::string::npos);
    CHECK(m.find("30000000") != std::string::npos);
    CHECK(m.find("layers.3.attn.q") != std::string::npos);
    CHECK(m.find("matmul") != std::string::npos);
    CHECK(m.find("forward") != std::string::npos);
    CHECK(m.find("total capacity of 20.00 MiB") != std::string::npos);
    CHECK(m.find("of which 0 B is free") != std::string::npos);
    CHECK(m.find("5.00 MiB is allocated by the harness") != std::string::npos);
    CHECK(m.find("15.00 MiB is reserved but unallocated") != std::string::npos);
  }
  auto s = a.stats();
  CHECK(s.num_ooms == 1);
  CHECK(s.num_alloc_retries == 1);  // as in c10, the retry is counted even when it fails
  CHECK(s.allocated.current == i64(5 * MiB));
  CHECK(s.reserved.current == i64(20 * MiB));
  a.deallocate(live);
}

TEST_CASE("deallocating a foreign pointer is an error, nullptr is a no-op") {
  auto raw = make_host_memory(0);
  CA a(*raw);
  int x = 0;
  CHECK_THROWS_AS(a.deallocate(&x), Error);
  a.deallocate(nullptr);
  CHECK(a.allocate(0) == nullptr);
  void* p = a.allocate(100);
  a.deallocate(p);
  CHECK_THROWS_AS(a.deallocate(p), Error);
}

TEST_CASE("history records allocations and segments with monotonic time") {
  auto raw = make_host_memory(0);
  CA a(*raw, AllocatorOptions{.policy = {}, .record_history = true});
  void* p = a.allocate(1000, AllocTag{"embed", "wte", "forward"});
  a.deallocate(p);
  a.empty_cache();
  const auto& h = a.history();
  REQUIRE(h.size() == 5);
  CHECK(h[0].action == TraceEvent::Action::segment_alloc);
  CHECK(h[0].size == 2 * MiB);
  CHECK(h[1].action == TraceEvent::Action::alloc);
  CHECK(h[1].size == 1000);
  CHECK(h[1].tag.tensor == "wte");
  CHECK(h[2].action == TraceEvent::Action::free_requested);
  CHECK(h[3].action == TraceEvent::Action::free_completed);
  CHECK(h[4].action == TraceEvent::Action::segment_free);
  for (std::size_t i = 1; i < h.size(); ++i) CHECK(h[i].time_us >= h[i - 1].time_us);
  CA quiet(*raw);
  quiet.deallocate(quiet.allocate(10));
  CHECK(quiet.history().empty());
}

TEST_CASE("expandable segments grow by whole pages and unmap the free tail on empty_cache") {
  auto raw = make_host_memory(0);
  CA a(*raw, AllocatorOptions{.policy = {.expandable_segments = true}});
  void* p = a.allocate(5 * MiB);
  auto s = a.stats();
  CHECK(s.reserved.current == i64(P.large_buffer));  // one 20 MiB page
  CHECK(s.allocated.current == i64(5 * MiB));
  CHECK(s.inactive_split.current == 0);  // not tracked for expandable segments
  CHECK(s.num_segments == 1);
  std::memset(p, 1, 5 * MiB);

  void* q = a.allocate(30 * MiB);  // 15 MiB free at the tail + one more 20 MiB page
  CHECK(reinterpret_cast<std::uintptr_t>(q) == reinterpret_cast<std::uintptr_t>(p) + 5 * MiB);
  s = a.stats();
  CHECK(s.reserved.current == i64(2 * P.large_buffer));
  CHECK(s.num_segments == 1);
  std::memset(q, 2, 30 * MiB);

  a.deallocate(q);
  CHECK(a.stats().reserved.current == i64(2 * P.large_buffer));  // kept until empty_cache
  a.empty_cache();
  CHECK(a.stats().reserved.current == i64(P.large_buffer));  // the page holding p stays
  a.deallocate(p);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
  CHECK(a.stats().num_segments == 0);

  void* r = a.allocate(1000);  // small pool: 2 MiB pages
  CHECK(a.stats().reserved.current == i64(P.small_buffer));
  a.deallocate(r);
  auto segs = a.segments();
  REQUIRE(segs.size() == 1);
  CHECK(segs[0].expandable);
  CHECK(segs[0].small);
}

TEST_CASE("expandable segments reuse freed space in the middle without a new page") {
  auto raw = make_host_memory(0);
  CA a(*raw, AllocatorOptions{.policy = {.expandable_segments = true}});
  void* p1 = a.allocate(6 * MiB);
  void* p2 = a.allocate(6 * MiB);
  void* p3 = a.allocate(6 * MiB);
  a.deallocate(p2);
  void* p4 = a.allocate(6 * MiB);
  CHECK(p4 == p2);
  CHECK(a.stats().reserved.current == i64(P.large_buffer));
  a.deallocate(p1);
  a.deallocate(p3);
  a.deallocate(p4);
}

// c10's get_free_block under expandable segments: the free block that ends the mapped pages counts
// as the size it could grow to, so a hole inside the segment is taken before it, even a larger one
// (by size alone the 4 MiB at the end would be the best fit for 3 MiB; the snapshots in
// tests/data/expandable_more/ show the hole taken).
TEST_CASE("expandable segments: a hole inside the segment is a better fit than the end of the mapped pages") {
  auto raw = make_host_memory(0);
  CA a(*raw, AllocatorOptions{.policy = {.expandable_segments = true}});
  void* p1 = a.allocate(4 * MiB);
  void* p2 = a.allocate(8 * MiB);
  void* p3 = a.allocate(4 * MiB);  // 16 of the page's 20 MiB: 4 MiB free at the end
  a.deallocate(p2);                // an 8 MiB hole
  void* p4 = a.allocate(3 * MiB);
  CHECK(p4 == p2);
  void* p5 = a.allocate(4 * MiB);  // the hole's 5 MiB left, not the 4 MiB at the end
  CHECK(reinterpret_cast<char*>(p5) == reinterpret_cast<char*>(p2) + 3 * MiB);
  void* p6 = a.allocate(4 * MiB);  // only the end holds it now
  CHECK(reinterpret_cast<char*>(p6) == reinterpret_cast<char*>(p3) + 4 * MiB);
  CHECK(a.stats().reserved.current == i64(P.large_buffer));
  for (void* p : {p1, p3, p4, p5, p6}) a.deallocate(p);
}

TEST_CASE("expandable segments: the retry unmaps free pages of the other pool, then OOM") {
  auto raw = make_host_memory(20 * MiB);
  CA a(*raw, AllocatorOptions{.policy = {.expandable_segments = true}});
  void* s = a.allocate(1000);  // a 2 MiB small page
  a.deallocate(s);
  void* p = a.allocate(5 * MiB);  // a 20 MiB page does not fit beside it: unmap, retry
  auto st = a.stats();
  CHECK(st.num_alloc_retries == 1);
  CHECK(st.reserved.current == i64(P.large_buffer));
  CHECK(st.num_segments == 1);
  CHECK_THROWS_AS(a.allocate(30 * MiB), Error);  // needs one more 20 MiB page
  st = a.stats();
  CHECK(st.num_alloc_retries == 2);
  CHECK(st.num_ooms == 1);
  CHECK(st.reserved.current == i64(P.large_buffer));
  a.deallocate(p);
}

TEST_CASE("one policy: the simulator's own_segment_block is what the allocator counts for a lone tensor") {
  // own_segment_block(b): the block a tensor of b bytes holds in a segment of its own. A fresh
  // allocator gives such a tensor a new segment, so its allocated bytes must agree, on both sides
  // of every rule (512 B rounding, the small pool, the 20 MiB segment below 10 MiB, 2 MiB
  // rounding above and the > 1 MiB split threshold).
  const std::size_t sizes[] = {1,        511,          512,          513,          1 * MiB,      1 * MiB + 1,
                               5 * MiB,  10 * MiB - 1, 10 * MiB,     11 * MiB,     81 * MiB,     81 * MiB + 512,
                               80 * MiB + 1, 82 * MiB - 1, 30000000, 123456789};
  for (std::size_t b : sizes) {
    CAPTURE(b);
    auto raw = make_host_memory(0);
    CA a(*raw);
    void* p = a.allocate(b);
    CHECK(a.stats().allocated.current == i64(detail::own_segment_block(b)));
    CHECK(detail::round512(b) == P.round_size(b));
    a.deallocate(p);
  }
  CHECK(detail::own_segment_block(81 * MiB) == 82 * MiB);  // an fp32 Gemma 2 MLP weight
  CHECK(detail::own_segment_block(0) == 0);
  CHECK(detail::round512(0) == 0);
}

TEST_CASE("policy settings: roundup_power2_divisions and max_split_size, as c10 applies them") {
  AllocatorPolicy p;
  // PyTorch's documented example: 1200 MB with 4 divisions between 1024 and 2048 rounds to 1280.
  p.roundup_power2_divisions[10] = 4;  // the [1 GiB, 2 GiB) interval
  CHECK(p.round_size(1200 * MiB) == 1280 * MiB);
  CHECK(p.round_size(1024 * MiB) == 1024 * MiB);  // a power of two is its own
  CHECK(p.round_size(1280 * MiB) == 1280 * MiB);
  CHECK(p.round_size(1280 * MiB + 1) == 1536 * MiB);
  CHECK(p.round_size(600 * MiB) == 600 * MiB);    // another interval: plain 512-byte rounding
  CHECK(P.round_size(1200 * MiB + 1) == 1200 * MiB + 512);

  // max_split_size 32 MiB: a large request at least that big takes its block whole, and a cached
  // block at least that big serves neither small requests nor requests 20 MiB or more shorter.
  p = AllocatorPolicy{};
  p.max_split_size = 32 * MiB;
  CHECK(p.should_split(false, 16 * MiB, 4 * MiB));
  CHECK_FALSE(p.should_split(false, 40 * MiB, 4 * MiB));
  CHECK(p.may_reuse(40 * MiB, 50 * MiB));
  CHECK_FALSE(p.may_reuse(40 * MiB, 60 * MiB));
  CHECK_FALSE(p.may_reuse(16 * MiB, 40 * MiB));
  auto raw = make_host_memory(0);
  CA a(*raw, AllocatorOptions{.policy = p});
  a.deallocate(a.allocate(100 * MiB));  // one cached 100 MiB segment
  void* q = a.allocate(40 * MiB);       // 60 MiB shorter: a new segment, the cached one stays
  CHECK(a.stats().reserved.current == i64(140 * MiB));
  void* r = a.allocate(16 * MiB);  // small for this policy: not from the 100 MiB block either
  CHECK(a.stats().reserved.current == i64(140 * MiB + 16 * MiB));
  a.deallocate(q);
  a.deallocate(r);
  // the default policy reuses the cached block for both
  CA d(*raw);
  d.deallocate(d.allocate(100 * MiB));
  void* q2 = d.allocate(40 * MiB);
  CHECK(d.stats().reserved.current == i64(100 * MiB));
  d.deallocate(q2);
}
