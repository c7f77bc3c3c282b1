// The snapshot pickle: written from the allocator, read back with the reader, field by field.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "diagnose/pickle.hpp"
#include "measure/allocator.hpp"
#include "measure/snapshot.hpp"

using namespace membudget;
using namespace membudget::measure;
using membudget::diagnose::PickleValue;

TEST_CASE("frame names carry phase, tensor and op") {
  CHECK(frame_name(AllocTag{"matmul", "layers.3.attn.q", "forward"}) == "forward:layers.3.attn.q (matmul)");
  CHECK(frame_name(AllocTag{"", "wte", ""}) == "wte");
  CHECK(frame_name(AllocTag{}).empty());
}

TEST_CASE("a snapshot lists segments, blocks and the trace as memory_viz expects") {
  auto raw = make_host_memory(0);
  CachingAllocator a(*raw, AllocatorOptions{.policy = {}, .record_history = true});
  void* q = a.allocate(1000, AllocTag{"matmul", "layers.3.attn.q", "forward"});
  void* big = a.allocate(5 * MiB, AllocTag{"adamw", "exp_avg", "optimizer"});
  a.deallocate(big);

  auto doc = diagnose::parse_pickle(snapshot_pickle(a));
  CHECK(doc.protocol() == 2);
  const PickleValue& root = doc.root();
  CHECK(root.at("allocator_settings").is_dict());
  CHECK(root.at("allocator_settings").size() == 0);

  const auto& segs = root.at("segments").items();
  REQUIRE(segs.size() == 2);
  std::size_t small_index = segs[0].at("segment_type").as_string() == "small" ? 0 : 1;
  const PickleValue& small = segs[small_index];
  const PickleValue& large = segs[1 - small_index];
  CHECK(small.at("address").as_uint() == reinterpret_cast<std::uintptr_t>(q));
  CHECK(small.at("total_size").as_int() == static_cast<std::int64_t>(2 * MiB));
  CHECK(small.at("allocated_size").as_int() == 1024);
  CHECK(small.at("active_size").as_int() == 1024);
  CHECK(small.at("requested_size").as_int() == 1000);
  CHECK(small.at("device").as_int() == 0);
  CHECK(small.at("stream").as_int() == 0);
  CHECK(small.at("segment_pool_id").repr() == "(0, 0)");
  CHECK(small.at("is_expandable").as_bool() == false);
  CHECK(small.at("frames").size() == 0);
  const auto& blocks = small.at("blocks").items();
  REQUIRE(blocks.size() == 2);
  CHECK(blocks[0].at("state").as_string() == "active_allocated");
  CHECK(blocks[0].at("size").as_int() == 1024);
  CHECK(blocks[0].at("requested_size").as_int() == 1000);
  const auto& frames = blocks[0].at("frames").items();
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].at("filename").as_string() == "membudget/harness");
  CHECK(frames[0].at("line").as_int() == 0);
  CHECK(frames[0].at("name").as_string() == "forward:layers.3.attn.q (matmul)");
  CHECK(blocks[1].at("state").as_string() == "inactive");
  CHECK(blocks[1].at("size").as_int() == static_cast<std::int64_t>(2 * MiB - 1024));
  CHECK(large.at("segment_type").as_string() == "large");
  CHECK(large.at("allocated_size").as_int() == 0);
  CHECK(large.at("blocks").size() == 1);

  const auto& traces = root.at("device_traces").items();
  REQUIRE(traces.size() == 1);
  const auto& t = traces[0].items();
  REQUIRE(t.size() == 6);  // segment_alloc, alloc, segment_alloc, alloc, free_requested, free_completed
  CHECK(t[0].at("action").as_string() == "segment_alloc");
  CHECK(t[1].at("action").as_string() == "alloc");
  CHECK(t[1].at("addr").as_uint() == reinterpret_cast<std::uintptr_t>(q));
  CHECK(t[1].at("size").as_int() == 1000);
  CHECK(t[1].at("frames").items()[0].at("name").as_string() == "forward:layers.3.attn.q (matmul)");
  CHECK(t[5].at("action").as_string() == "free_completed");
  CHECK(t[5].at("frames").items()[0].at("name").as_string() == "optimizer:exp_avg (adamw)");
  for (const auto& e : t) CHECK(e.at("time_us").as_uint() > 0);
  a.deallocate(q);
}

TEST_CASE("an oom trace entry carries device_free; write_snapshot writes a readable file") {
  auto raw = make_host_memory(4 * MiB);
  CachingAllocator a(*raw, AllocatorOptions{.policy = {}, .record_history = true});
  CHECK_THROWS_AS(a.allocate(5 * MiB, AllocTag{"mlp", "layers.0.mlp.up", "forward"}), Error);
  const std::string path = "test_snapshot_oom.pickle";  // in the test's working directory
  write_snapshot(a, path);
  auto doc = diagnose::read_pickle_file(path);
  std::remove(path.c_str());
  const auto& t = doc.root().at("device_traces").items()[0].items();
  REQUIRE(t.size() == 1);
  CHECK(t[0].at("action").as_string() == "oom");
  CHECK(t[0].at("device_free").as_int() == static_cast<std::int64_t>(4 * MiB));
  CHECK(t[0].at("size").as_int() == static_cast<std::int64_t>(20 * MiB));
  CHECK(t[0].find("addr") == nullptr);
  CHECK_THROWS_AS(write_snapshot(a, "/nonexistent-dir/x.pickle"), Error);
}

TEST_CASE("expandable segments are marked in the snapshot") {
  auto raw = make_host_memory(0);
  CachingAllocator a(*raw, AllocatorOptions{.policy = {.expandable_segments = true}, .record_history = true});
  void* p = a.allocate(3 * MiB);
  auto doc = diagnose::parse_pickle(snapshot_pickle(a));
  const auto& segs = doc.root().at("segments").items();
  REQUIRE(segs.size() == 1);
  CHECK(segs[0].at("is_expandable").as_bool());
  CHECK(segs[0].at("total_size").as_int() == static_cast<std::int64_t>(20 * MiB));
  const auto& t = doc.root().at("device_traces").items()[0].items();
  CHECK(t[0].at("action").as_string() == "segment_map");
  a.deallocate(p);
}
