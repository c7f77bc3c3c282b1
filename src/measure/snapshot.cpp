#include "measure/snapshot.hpp"

#include <fstream>

#include "diagnose/pickle_writer.hpp"
#include "membudget/error.hpp"

namespace membudget::measure {

namespace {

using diagnose::PickleWriter;

const char* action_name(TraceEvent::Action a) {
  switch (a) {
    case TraceEvent::Action::alloc: return "alloc";
    case TraceEvent::Action::free_requested: return "free_requested";
    case TraceEvent::Action::free_completed: return "free_completed";
    case TraceEvent::Action::segment_alloc: return "segment_alloc";
    case TraceEvent::Action::segment_free: return "segment_free";
    case TraceEvent::Action::segment_map: return "segment_map";
    case TraceEvent::Action::segment_unmap: return "segment_unmap";
    case TraceEvent::Action::oom: return "oom";
  }
  return "alloc";
}

void write_frames(PickleWriter& w, const AllocTag& tag) {
  w.begin_list();
  std::string name = frame_name(tag);
  if (!name.empty()) {
    w.begin_dict();
    w.string("filename");
    w.string("membudget/harness");
    w.string("line");
    w.integer(0);
    w.string("name");
    w.string(name);
    w.end_dict();
  }
  w.end_list();
}

void key_uint(PickleWriter& w, const char* key, std::uint64_t v) {
  w.string(key);
  w.uinteger(v);
}

void write_segment(PickleWriter& w, const SegmentInfo& s) {
  w.begin_dict();
  key_uint(w, "device", 0);
  key_uint(w, "address", s.address);
  key_uint(w, "total_size", s.total_size);
  key_uint(w, "allocated_size", s.allocated_size);
  key_uint(w, "active_size", s.active_size);
  key_uint(w, "requested_size", s.requested_size);
  key_uint(w, "stream", s.stream);
  w.string("segment_type");
  w.string(s.small ? "small" : "large");
  w.string("segment_pool_id");
  w.begin_tuple();
  w.integer(0);
  w.integer(0);
  w.end_tuple();
  w.string("is_expandable");
  w.boolean(s.expandable);
  w.string("frames");
  w.begin_list();
  w.end_list();
  w.string("blocks");
  w.begin_list();
  for (const BlockInfo& b : s.blocks) {
    const bool live = b.state == BlockInfo::State::active_allocated;
    w.begin_dict();
    key_uint(w, "address", b.address);
    key_uint(w, "size", b.size);
    key_uint(w, "requested_size", b.requested_size);
    w.string("state");
    w.string(live ? "active_allocated" : "inactive");
    w.string("frames");
    write_frames(w, live ? b.tag : AllocTag{});
    w.end_dict();
  }
  w.end_list();
  w.end_dict();
}

void write_trace(PickleWriter& w, const TraceEvent& e) {
  w.begin_dict();
  w.string("action");
  w.string(action_name(e.action));
  key_uint(w, e.action == TraceEvent::Action::oom ? "device_free" : "addr", e.addr);
  key_uint(w, "size", e.size);
  key_uint(w, "stream", e.stream);
  key_uint(w, "time_us", e.time_us);
  w.string("frames");
  write_frames(w, e.tag);
  w.end_dict();
}

}  // namespace

std::string frame_name(const AllocTag& tag) {
  std::string name = tag.phase;
  if (!tag.tensor.empty()) {
    if (!name.empty()) name += ':';
    name += tag.tensor;
  }
  if (!tag.op.empty()) {
    if (!name.empty()) name += ' ';
    name += '(';
    name += tag.op;
    name += ')';
  }
  return name;
}

std::string snapshot_pickle(const CachingAllocator& allocator) {
  PickleWriter w;
  w.begin_dict();
  w.string("segments");
  w.begin_list();
  for (const SegmentInfo& s : allocator.segments()) write_segment(w, s);
  w.end_list();
  w.string("device_traces");
  w.begin_list();
  w.begin_list();
  for (const TraceEvent& e : allocator.history()) write_trace(w, e);
  w.end_list();
  w.end_list();
  w.string("allocator_settings");
  w.begin_dict();
  w.end_dict();
  w.end_dict();
  return w.finish();
}

void write_snapshot(const CachingAllocator& allocator, const std::string& path) {
  std::string bytes = snapshot_pickle(allocator);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(ErrorKind::io, path + ": cannot create the snapshot file");
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) throw Error(ErrorKind::io, path + ": write failed");
}

}  // namespace membudget::measure
