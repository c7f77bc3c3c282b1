// Decoding and replaying a snapshot's allocation trace (trace.hpp).
#include "trace.hpp"

#include <algorithm>
#include <climits>
#include <unordered_map>

#include "membudget/error.hpp"

namespace membudget::diagnose {
namespace {

constexpr bytes_t kMaxBlock = 1ull << 50;  // 1 PiB: larger is not a GPU allocation

// Trace sizes are the requested bytes; the allocator's counters (memory_allocated) count blocks,
// which are requests rounded up to 512 bytes (kMinBlockSize).
bytes_t round_block(bytes_t size) { return (size + 511) / 512 * 512; }

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw Error(ErrorKind::parse, where + ": " + what);
}

Action action_of(std::string_view s) {
  if (s == "alloc") return Action::alloc;
  if (s == "free_requested") return Action::free_requested;
  if (s == "free_completed") return Action::free_completed;
  if (s == "segment_alloc") return Action::segment_alloc;
  if (s == "segment_free") return Action::segment_free;
  if (s == "oom") return Action::oom;
  return Action::other;
}

bytes_t block_size(const PickleValue& v, const std::string& what) {
  const bytes_t s = v.as_uint(what);
  if (s > kMaxBlock) throw Error(ErrorKind::parse, what + ": " + std::to_string(s) + " bytes is not a GPU allocation");
  return s;
}

const PickleValue& need(const PickleValue& dict, std::string_view key, const std::string& what) {
  if (!dict.is_dict()) bad(what, "expected a dict");
  const PickleValue* v = dict.find(key);
  if (!v) bad(what, "missing key '" + std::string(key) + "'");
  return *v;
}

const PickleValue* frames_field(const PickleValue& entry, const std::string& what) {
  const PickleValue* f = entry.find("frames");
  if (!f || f->is_none()) return nullptr;
  if (!f->is_sequence()) bad(what + ".frames", "expected a list");
  return f;
}

}  // namespace

DecodedSnapshot decode_snapshot(PickleDocument doc, const std::string& where) {
  DecodedSnapshot s;
  s.where = where;
  s.doc = std::move(doc);
  const PickleValue& root = s.doc.root();
  if (!root.is_dict()) bad(where, "a memory snapshot is a dict with 'segments' and 'device_traces'");
  const PickleValue* segments = root.find("segments");
  const PickleValue* traces = root.find("device_traces");
  if (!segments && !traces) bad(where, "not a memory snapshot: neither 'segments' nor 'device_traces'");

  // The device: the trace with the most alloc events.
  if (traces && !traces->is_none()) {
    const auto& devs = traces->items(where + ": device_traces");
    std::size_t best_allocs = 0;
    bool chosen = false;
    for (std::size_t d = 0; d < devs.size(); ++d) {
      const std::string w = where + ": device_traces[" + std::to_string(d) + "]";
      if (devs[d].is_none()) continue;
      std::size_t allocs = 0;
      for (const auto& e : devs[d].items(w)) {
        if (!e.is_dict()) bad(w, "expected trace entries to be dicts");
        const PickleValue* a = e.find("action");
        if (a && a->is_string() && a->as_string() == "alloc") ++allocs;
      }
      if (devs[d].size() == 0) continue;
      if (!chosen || allocs > best_allocs) {
        s.device = d;
        best_allocs = allocs;
        chosen = true;
      }
    }
    s.has_trace = chosen;
    if (s.has_trace) {
      const auto& entries = devs[s.device].items();
      s.events.reserve(entries.size());
      for (std::size_t i = 0; i < entries.size(); ++i) {
        const std::string w = where + ": device_traces[" + std::to_string(s.device) + "][" + std::to_string(i) + "]";
        const PickleValue& e = entries[i];
        TraceEvent ev;
        ev.action = action_of(need(e, "action", w).as_string(w + ".action"));
        if (const PickleValue* t = e.find("time_us"); t && !t->is_none()) ev.time_us = t->as_int(w + ".time_us");
        if (ev.action == Action::alloc || ev.action == Action::free_requested || ev.action == Action::free_completed ||
            ev.action == Action::segment_alloc || ev.action == Action::segment_free) {
          ev.addr = need(e, "addr", w).as_uint(w + ".addr");
          ev.size = block_size(need(e, "size", w), w + ".size");
        }
        ev.frames = frames_field(e, w);
        s.events.push_back(ev);
      }
    }
  }

  if (segments && !segments->is_none()) {
    const auto& segs = segments->items(where + ": segments");
    for (std::size_t i = 0; i < segs.size(); ++i) {
      const std::string w = where + ": segments[" + std::to_string(i) + "]";
      const PickleValue& seg = segs[i];
      if (!seg.is_dict()) bad(w, "expected a dict");
      if (const PickleValue* d = seg.find("device"); d && !d->is_none()) {
        if (d->as_uint(w + ".device") != s.device) continue;
      }
      const PickleValue* blocks = seg.find("blocks");
      if (!blocks || blocks->is_none()) continue;
      const auto& bl = blocks->items(w + ".blocks");
      for (std::size_t j = 0; j < bl.size(); ++j) {
        const std::string bw = w + ".blocks[" + std::to_string(j) + "]";
        const PickleValue& b = bl[j];
        const std::string_view state = need(b, "state", bw).as_string(bw + ".state");
        if (state != "active_allocated") continue;
        EndBlock eb;
        eb.addr = need(b, "address", bw).as_uint(bw + ".address");
        eb.size = block_size(need(b, "size", bw), bw + ".size");
        eb.frames = frames_field(b, bw);
        s.end_blocks.push_back(eb);
      }
    }
  }
  if (const PickleValue* ann = root.find("external_annotations"); ann && !ann->is_none()) {
    const auto& items = ann->items(where + ": external_annotations");
    for (std::size_t i = 0; i < items.size(); ++i) {
      const std::string w = where + ": external_annotations[" + std::to_string(i) + "]";
      const PickleValue& a = items[i];
      if (!a.is_dict()) bad(w, "expected a dict");
      if (const PickleValue* d = a.find("device"); d && !d->is_none() && d->as_uint(w + ".device") != s.device)
        continue;
      Annotation an;
      const PickleValue* stage = a.find("stage");
      const PickleValue* name = a.find("name");
      const PickleValue* t = a.find("time_us");
      if (!stage || !name || !t) continue;  // not a range marker
      an.start = stage->as_string(w + ".stage") == "START";
      an.name = name->as_string(w + ".name");
      an.time_us = t->as_int(w + ".time_us");
      s.annotations.push_back(an);
    }
  }
  return s;
}

DecodedSnapshot read_snapshot_file(const std::string& path) {
  return decode_snapshot(read_pickle_file(path), path);
}

std::vector<Frame> frames_of(const PickleValue* frames, std::string_view what) {
  std::vector<Frame> out;
  if (!frames) return out;
  const auto& items = frames->items(what);
  out.reserve(items.size());
  for (const auto& f : items) {
    if (!f.is_dict()) throw Error(ErrorKind::parse, std::string(what) + ": a frame is not a dict");
    Frame fr;
    if (const PickleValue* v = f.find("filename")) fr.filename = v->as_string(std::string(what) + ".filename");
    if (const PickleValue* v = f.find("line"); v && !v->is_none()) fr.line = v->as_int(std::string(what) + ".line");
    if (const PickleValue* v = f.find("name")) fr.name = v->as_string(std::string(what) + ".name");
    out.push_back(fr);
  }
  return out;
}

Replay replay(const DecodedSnapshot& snap) {
  Replay r;
  const auto& ev = snap.events;
  bool any_requested = false;
  for (const auto& e : ev)
    if (e.action == Action::free_requested) any_requested = true;
  const Action free_action = any_requested ? Action::free_requested : Action::free_completed;
  r.used_free_completed = !any_requested;

  // Pass 1: lifetimes. live_index: addr → lifetime index (alive); seen: addresses allocated or
  // freed so far (a second free without an alloc is ignored).
  std::unordered_map<std::uint64_t, std::size_t> alive;
  std::unordered_map<std::uint64_t, bool> seen;
  alive.reserve(ev.size() / 2 + 16);
  seen.reserve(ev.size() / 2 + 16);
  std::vector<Lifetime> pre;  // born before recording
  std::vector<Lifetime> traced;
  std::vector<bytes_t> plus(ev.size(), 0), minus(ev.size(), 0);
  for (std::size_t i = 0; i < ev.size(); ++i) {
    const TraceEvent& e = ev[i];
    if (e.action == Action::alloc) {
      auto it = alive.find(e.addr);
      if (it != alive.end()) {  // an alloc over a live address: the free was lost
        Lifetime& old = traced[it->second];
        old.died = static_cast<std::int64_t>(i);
        minus[i] += old.size;
        ++r.inconsistent;
        alive.erase(it);
      }
      Lifetime l;
      l.addr = e.addr;
      l.size = round_block(e.size);
      l.born = static_cast<std::int64_t>(i);
      l.frames = e.frames;
      alive.emplace(e.addr, traced.size());
      traced.push_back(l);
      seen[e.addr] = true;
      plus[i] += l.size;
    } else if (e.action == free_action) {
      auto it = alive.find(e.addr);
      if (it != alive.end()) {
        Lifetime& l = traced[it->second];
        l.died = static_cast<std::int64_t>(i);
        l.free_frames = e.frames;
        minus[i] += l.size;
        alive.erase(it);
      } else if (!seen.count(e.addr)) {  // allocated before recording
        Lifetime l;
        l.addr = e.addr;
        l.size = round_block(e.size);
        l.born = kBeforeRecording;
        l.died = static_cast<std::int64_t>(i);
        l.free_frames = e.frames;
        pre.push_back(l);
        seen[e.addr] = true;
        minus[i] += l.size;
      } else {
        ++r.inconsistent;
      }
    }
  }
  // Blocks allocated at the end without a live alloc: before recording, never freed.
  for (const auto& b : snap.end_blocks) {
    if (auto it = alive.find(b.addr); it != alive.end()) {
      // the final block's size is exact (a large block that was not split is bigger than the
      // rounded request): correct the lifetime and every live count since its birth
      Lifetime& l = traced[it->second];
      if (b.size > l.size) {
        plus[static_cast<std::size_t>(l.born)] += b.size - l.size;
        l.size = b.size;
      }
      continue;
    }
    Lifetime l;
    l.addr = b.addr;
    l.size = b.size;
    l.frames = b.frames;
    pre.push_back(l);
  }
  auto add = [&](bytes_t a, bytes_t b) {
    bytes_t s = 0;
    if (__builtin_add_overflow(a, b, &s))
      throw Error(ErrorKind::parse, snap.where + ": live bytes overflow 64 bits; the sizes are absurd");
    return s;
  };
  for (const auto& l : pre) r.initial = add(r.initial, l.size);
  r.live.resize(ev.size());
  bytes_t live = r.initial;
  for (std::size_t i = 0; i < ev.size(); ++i) {
    live = add(live, plus[i]);
    live -= std::min(live, minus[i]);  // never below zero (minus ⊆ what was added)
    r.live[i] = live;
  }
  r.lifetimes = std::move(pre);
  r.lifetimes.insert(r.lifetimes.end(), traced.begin(), traced.end());
  return r;
}

}  // namespace membudget::diagnose
