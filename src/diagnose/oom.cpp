// Reading PyTorch out-of-memory messages and the decision table of first fixes (see oom.hpp).
#include "membudget/oom.hpp"

#include <algorithm>
#include <unordered_map>
#include <array>
#include <cctype>
#include <optional>
#include <string>
#include <utility>

#include "json_out.hpp"
#include "membudget/input.hpp"

namespace membudget {

const char* to_string(OomTemplate t) noexcept {
  switch (t) {
    case OomTemplate::pre_1_5: return "pre-1.5";
    case OomTemplate::pre_2_1: return "pre-2.1";
    case OomTemplate::v2_1: return "2.1";
    case OomTemplate::v2_2_plus: return "2.2+";
  }
  return "unknown";
}

const char* to_string(OomClass c) noexcept {
  switch (c) {
    case OomClass::fragmentation: return "fragmentation";
    case OomClass::non_pytorch_memory: return "non_pytorch_memory";
    case OomClass::shortage: return "shortage";
  }
  return "unknown";
}

bytes_t OomReport::non_pytorch() const noexcept {
  bytes_t used = 0;
  if (__builtin_add_overflow(free, reserved, &used) || used >= capacity) return 0;
  return capacity - used;
}

bytes_t OomReport::reserved_beyond_device() const noexcept {
  const unsigned __int128 used = static_cast<unsigned __int128>(free) + reserved;
  return used > capacity ? static_cast<bytes_t>(used - capacity) : 0;  // (< 2^64: each term is)
}

namespace {

// ---------------------------------------------------------------------------------------------
// Normalisation: the message may be wrapped over several lines, each continuation carrying the
// prefix of a comment, a quote, a table cell or a torchrun rank tag. Lines are joined with one
// space after those prefixes are stripped; runs of blanks become one space.

struct Normalized {
  std::string text;
  std::vector<std::uint32_t> line_starts;  // offset in `text` where each input line begins (the
                                          // text is at most limits::kMaxOomTextBytes)
};

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

// The tag on each line of a distributed worker's output: "[rank3]: " (the global rank, which
// init_process_group's excepthook puts on an uncaught exception's lines, PyTorch 2.3 and later; c10's
// log lines carry it too), "[default0]:" (torchrun --tee: the role's name and the local rank), or
// both ("[default0]:[rank0]: Traceback"), after leading blanks and any timestamp a log collector put
// first ("2026-12-07 12:00:00,123 ", "[2026-12-07T12:00:00Z] ").
struct LineTag {
  std::string_view name;              // the first tag: "rank3", "default0" (a worker's lines share it)
  std::optional<std::uint64_t> rank;  // a "[rankN]:" among the tags
  std::string_view worker;            // the first tag, where it is not a rank's
  std::size_t end = 0;                // the offset just past the last tag's "]:"
};

bool timestamp_char(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) || is_blank(c) || std::string_view("-:.,/TZ+[]").find(c) != std::string_view::npos;
}

// One tag opening at `at` ('['): letters (the role, at most 32), then a number (at most 9 digits),
// then "]:". Its name ("rank3"), whether it is a rank's, its number, and the offset past it.
struct OneTag {
  std::string_view name;
  bool is_rank = false;
  std::uint64_t number = 0;
  std::size_t end = 0;
};
std::optional<OneTag> tag_at(std::string_view line, std::size_t at) {
  std::size_t j = at + 1;
  const std::size_t role = j;
  while (j < line.size() && j - role < 33 && (std::isalpha(static_cast<unsigned char>(line[j])) || line[j] == '_')) ++j;
  const std::size_t digits = j;
  if (digits == role || digits - role > 32) return std::nullopt;
  std::uint64_t number = 0;
  for (; j < line.size() && j - digits < 10 && std::isdigit(static_cast<unsigned char>(line[j])); ++j)
    number = number * 10 + static_cast<std::uint64_t>(line[j] - '0');  // (9 digits at most: no overflow)
  if (j == digits || j - digits > 9 || !line.substr(j).starts_with("]:")) return std::nullopt;
  return OneTag{line.substr(role, j - role), line.substr(role, digits - role) == "rank", number, j + 2};
}

std::optional<LineTag> line_tag(std::string_view line) {
  constexpr std::size_t kMaxLead = 48;  // a timestamp's length and then some
  std::optional<OneTag> first;
  for (std::size_t p = 0; p < line.size() && p <= kMaxLead && !first; ++p) {
    if (line[p] == '[') first = tag_at(line, p);
    if (!first && !timestamp_char(line[p])) return std::nullopt;
  }
  if (!first) return std::nullopt;
  LineTag tag{first->name, std::nullopt, first->is_rank ? std::string_view() : first->name, first->end};
  if (first->is_rank) tag.rank = first->number;
  // a rank's tag right after a worker's ("[default0]:[rank0]: ...")
  std::size_t next = tag.end;
  while (next < line.size() && is_blank(line[next])) ++next;
  const auto second = next < line.size() && line[next] == '[' ? tag_at(line, next) : std::nullopt;
  if (second && second->is_rank && !first->is_rank) {
    tag.rank = second->number;
    tag.end = second->end;
  }
  return tag;
}

std::string_view strip_line_prefix(std::string_view line) {
  for (;;) {
    std::size_t i = 0;
    while (i < line.size() && is_blank(line[i])) ++i;
    line.remove_prefix(i);
    if (line.starts_with("//")) {
      line.remove_prefix(2);
    } else if (!line.empty() && (line[0] == '#' || line[0] == '>' || line[0] == '|')) {
      line.remove_prefix(1);
    } else if (const auto tag = line_tag(line)) {  // torchrun: "[rank0]: ...", "[default0]: ..."
      line.remove_prefix(tag->end);
    } else {
      return line;
    }
  }
}

// Calls visit(line) for each '\n'-separated line of `input` (the last one may be empty), each found
// once, until visit returns false.
template <class Visit>
void for_each_line(std::string_view input, Visit visit) {
  for (std::size_t start = 0; start <= input.size();) {
    std::size_t end = input.find('\n', start);
    if (end == std::string_view::npos) end = input.size();
    if (!visit(input.substr(start, end - start))) return;
    start = end + 1;
  }
}

Normalized normalize(std::string_view input) {
  Normalized n;
  n.text.reserve(input.size());
  for_each_line(input, [&n](std::string_view raw) {
    const std::string_view line = strip_line_prefix(raw);
    if (!n.text.empty() && n.text.back() != ' ') n.text.push_back(' ');
    n.line_starts.push_back(static_cast<std::uint32_t>(n.text.size()));
    for (char c : line) {
      if (is_blank(c)) {
        if (!n.text.empty() && n.text.back() != ' ') n.text.push_back(' ');
      } else {
        n.text.push_back(c);
      }
    }
    return true;
  });
  return n;
}

// ---------------------------------------------------------------------------------------------
// A cursor over the normalised text. Literals match ignoring blanks on both sides, so a message
// hard-wrapped in the middle of a word ("alloca\ncated") still reads.

class Cursor {
 public:
  Cursor(std::string_view s, std::size_t pos, std::size_t end) : s_(s), pos_(pos), end_(end) {}

  std::size_t pos() const { return pos_; }
  void seek(std::size_t p) { pos_ = p; }

  bool lit(std::string_view l) {
    std::size_t p = pos_, i = 0;
    for (;;) {
      while (i < l.size() && l[i] == ' ') ++i;
      while (p < end_ && s_[p] == ' ') ++p;
      if (i == l.size()) {
        pos_ = p;
        return true;
      }
      if (p >= end_ || s_[p] != l[i]) return false;
      ++p;
      ++i;
    }
  }

  std::optional<std::uint64_t> integer() {
    std::size_t p = skip_blanks(pos_);
    std::uint64_t v = 0;
    std::size_t digits = 0;
    while (p < end_ && std::isdigit(static_cast<unsigned char>(s_[p]))) {
      if (__builtin_mul_overflow(v, 10u, &v) ||
          __builtin_add_overflow(v, static_cast<std::uint64_t>(s_[p] - '0'), &v))
        return std::nullopt;
      ++p;
      ++digits;
    }
    if (digits == 0) return std::nullopt;
    pos_ = p;
    return v;
  }

  // "1.50 GiB", "512.00 MiB", "20.00 KiB", "100 bytes", "0 B": the nearest integer of value x unit,
  // computed exactly (no floating point), so "1.50 GiB" is 1610612736.
  std::optional<bytes_t> size() {
    past_64_bits_ = false;
    std::size_t p = skip_blanks(pos_);
    unsigned __int128 whole = 0, frac = 0, scale = 1;
    std::size_t digits = 0;
    while (p < end_ && std::isdigit(static_cast<unsigned char>(s_[p]))) {
      whole = whole * 10 + static_cast<unsigned>(s_[p] - '0');
      if (whole > UINT64_MAX) return past_64_bits_ = true, std::nullopt;
      ++p;
      ++digits;
    }
    if (digits == 0) return std::nullopt;
    if (p + 1 < end_ && s_[p] == '.' && std::isdigit(static_cast<unsigned char>(s_[p + 1]))) {
      ++p;
      std::size_t fdigits = 0;
      while (p < end_ && std::isdigit(static_cast<unsigned char>(s_[p]))) {
        if (fdigits < 18) {  // beyond 1e-18 a digit cannot change the nearest byte
          frac = frac * 10 + static_cast<unsigned>(s_[p] - '0');
          scale *= 10;
        }
        ++fdigits;
        ++p;
      }
    }
    p = skip_blanks(p);
    struct Unit {
      std::string_view name;
      bytes_t mult;
    };
    // Binary units; the XPU and MPS allocators print "KB"/"MB"/"GB" for the same binary values.
    static constexpr std::array<Unit, 11> units{{{"bytes", 1},
                                                 {"KiB", KiB},
                                                 {"MiB", MiB},
                                                 {"GiB", GiB},
                                                 {"TiB", 1024 * GiB},
                                                 {"PiB", 1024 * 1024 * GiB},
                                                 {"KB", KiB},
                                                 {"MB", MiB},
                                                 {"GB", GiB},
                                                 {"TB", 1024 * GiB},
                                                 {"B", 1}}};
    for (const auto& u : units) {
      if (s_.substr(p, std::min(u.name.size(), end_ - p)) != u.name) continue;
      std::size_t after = p + u.name.size();
      if (after < end_ && std::isalpha(static_cast<unsigned char>(s_[after]))) continue;
      unsigned __int128 total = whole * u.mult + (frac * u.mult + scale / 2) / scale;
      if (total > UINT64_MAX) return past_64_bits_ = true, std::nullopt;
      pos_ = after;
      return static_cast<bytes_t>(total);
    }
    return std::nullopt;
  }

  // Skips "(...)" of at most `limit` characters; false (and nothing consumed) when absent.
  // The last size() read a number of bytes past 2^64 - 1 (no card has them).
  bool past_64_bits() const { return past_64_bits_; }

  bool parenthetical(std::size_t limit) {
    std::size_t p = skip_blanks(pos_);
    if (p >= end_ || s_[p] != '(') return false;
    std::size_t close = s_.find(')', p);
    if (close == std::string_view::npos || close >= end_ || close - p > limit) return false;
    pos_ = close + 1;
    return true;
  }

 private:
  std::size_t skip_blanks(std::size_t p) const {
    while (p < end_ && s_[p] == ' ') ++p;
    return p;
  }

  std::string_view s_;
  std::size_t pos_;
  std::size_t end_;
  bool past_64_bits_ = false;
};

// One attempt at reading a message whose backend name starts at `start`; on failure `why` says
// what was expected and `reached` how far the reading got.
struct Attempt {
  std::optional<OomReport> report;
  std::string why;
  std::size_t reached = 0;
};

std::string excerpt_before(std::string_view s, std::size_t from, std::size_t to) {
  std::size_t begin = to > from + 60 ? to - 60 : from;
  std::string e(s.substr(begin, to - begin));
  while (!e.empty() && e.back() == ' ') e.pop_back();
  return (begin > from ? "..." : "") + e;
}

// `after_anchor` follows "<backend> out of memory" (with_backend) or precedes "Tried to allocate".
Attempt read_message(std::string_view s, std::size_t start, std::size_t after_anchor,
                     std::string backend, bool with_backend) {
  constexpr std::size_t kWindow = 64 * 1024;  // no message is longer, however many processes
  Cursor c(s, after_anchor, std::min(s.size(), after_anchor + kWindow));
  OomReport r;
  r.backend = std::move(backend);
  Attempt a;
  auto fail = [&](std::string what) {
    a.why = "expected " + what + " after '" + excerpt_before(s, start, c.pos()) + "'";
    a.reached = c.pos();
    return a;
  };
  auto need_size = [&](bytes_t& out, const char* what) {
    auto v = c.size();
    if (v) out = *v;
    if (!v && c.past_64_bits()) return fail(std::string("a size (") + what + ") of at most 2^64 - 1 bytes"), false;
    return v.has_value() || (fail(std::string("a size (") + what + ", e.g. '1.50 GiB')"), false);
  };
  auto need = [&](std::string_view l) {
    return c.lit(l) || (fail("'" + std::string(l) + "'"), false);
  };

  if ((with_backend && !need(".")) || !need("Tried to allocate") ||
      !need_size(r.requested, "the request"))
    return a;

  if (c.lit("(")) {  // <= 2.0: "(GPU 0; T total capacity; A already allocated; F free; ...)"
    r.template_version = OomTemplate::pre_2_1;
    if (!need("GPU")) return a;
    auto gpu = c.integer();
    if (!gpu || *gpu > 1u << 20) return fail("a GPU index");
    r.gpu = static_cast<int>(*gpu);
    if (!need(";") || !need_size(r.capacity, "the total capacity") || !need("total capacity;") ||
        !need_size(r.allocated, "the allocated memory") || !need("already allocated;") ||
        !need_size(r.free, "the free memory") || !need("free;"))
      return a;
    bytes_t last = 0;
    if (!need_size(last, "the reserved memory")) return a;
    if (c.lit("allowed;")) {
      r.allowed = last;
      if (!need_size(last, "the reserved memory")) return a;
    }
    if (c.lit("reserved in total by PyTorch")) {
      r.reserved = last;
      r.reserved_unallocated = last > r.allocated ? last - r.allocated : 0;
      r.reserved_unallocated_derived = true;
    } else if (c.lit("cached")) {  // <= 1.4: "cached" is what 1.5 calls reserved minus allocated
      r.template_version = OomTemplate::pre_1_5;
      r.reserved_unallocated = last;
      if (__builtin_add_overflow(r.allocated, last, &r.reserved))
        return fail("figures that fit in 64 bits");
      r.reserved_derived = true;
    } else {
      return fail("'reserved in total by PyTorch' or 'cached'");
    }
    c.lit(")");
  } else {  // >= 2.1: ". GPU 0 has a total capacity of T of which F is free. ..."
    if (!need(". GPU")) return fail("'(GPU' or '. GPU'");
    auto gpu = c.integer();
    if (!gpu || *gpu > 1u << 20) return fail("a GPU index");
    r.gpu = static_cast<int>(*gpu);
    if (!need("has a total")) return a;
    if (c.lit("capacity of")) {
      r.template_version = OomTemplate::v2_2_plus;
    } else if (c.lit("capacty of")) {
      r.template_version = OomTemplate::v2_1;
    } else {
      return fail("'capacity of'");
    }
    if (!need_size(r.capacity, "the total capacity") || !need("of which") ||
        !need_size(r.free, "the free memory") || !need("is free."))
      return a;
    for (;;) {  // one sentence per process on the GPU, this one included
      if (c.lit("Including non-PyTorch memory, this process has")) {
        bytes_t p = 0;
        if (!need_size(p, "this process's memory") || !need("memory in use.")) return a;
        r.process_in_use = p;
      } else if (c.lit("Process")) {
        auto pid = c.integer();
        if (!pid) return fail("a process id");
        OomProcess proc{*pid, 0};
        if (!need("has") || !need_size(proc.in_use, "the process's memory") ||
            !need("memory in use."))
          return a;
        r.other_processes.push_back(proc);
      } else {
        break;
      }
    }
    std::size_t before_allowed = c.pos();
    if (auto allowed = c.size(); allowed && c.lit("allowed;")) {
      r.allowed = *allowed;
    } else {
      c.seek(before_allowed);
    }
    if (!need("Of the allocated memory") || !need_size(r.allocated, "the allocated memory") ||
        !need("is allocated by PyTorch,"))
      return a;
    if (c.lit("with")) {  // >= 2.4, only when CUDA graphs hold private pools
      bytes_t pools = 0;
      if (!need_size(pools, "the private pools") || !need("allocated in private pools"))
        return a;
      c.parenthetical(64);  // "(e.g., CUDA Graphs)" or "(e.g., HIP Graphs)"
      c.lit(",");
      r.private_pools = pools;
    }
    if (!need("and") || !need_size(r.reserved_unallocated, "the reserved but unallocated memory") ||
        !need("is reserved by PyTorch but unallocated"))
      return a;
    if (__builtin_add_overflow(r.allocated, r.reserved_unallocated, &r.reserved))
      return fail("figures that fit in 64 bits");
    r.reserved_derived = true;
    c.lit(".");
  }
  // cudaMemGetInfo never reports more free memory than the device has, and PyTorch prints both
  // with the same rounding: a message saying so was edited or corrupted.
  if (r.free > r.capacity) {
    a.why = "its figures contradict each other: the free memory (" + format_bytes(r.free) + ") exceeds the total capacity (" +
            format_bytes(r.capacity) + "), so it was edited or corrupted";
    a.reached = c.pos();
    return a;
  }
  // PyTorch's allocated memory lies inside its reserved segments: a message (the templates before
  // 2.1 print both) saying otherwise by more than its two-decimal rounding could (1%, or 16 MiB) was
  // edited or corrupted too. (Not the process's memory in use against the reserved: where the
  // driver spills into shared memory, below, the process's device memory can be the smaller.)
  if (r.allocated > r.reserved && r.allocated - r.reserved > std::max<bytes_t>(r.reserved / 100, 16 * MiB)) {
    a.why = "its figures contradict each other: the allocated memory (" + format_bytes(r.allocated) + ") exceeds the reserved (" +
            format_bytes(r.reserved) + "), so it was edited or corrupted";
    a.reached = c.pos();
    return a;
  }
  // (PyTorch's reserved memory may exceed the capacity: on Windows the driver spills into shared
  // system memory; test_oom's message from iPASSR issue 9 reserves 19.15 GiB of an 8 GiB card.)
  r.message = std::string(s.substr(start, c.pos() - start));
  a.report = std::move(r);
  a.reached = c.pos();
  return a;
}

std::size_t line_of(const Normalized& n, std::size_t offset) {
  auto it = std::upper_bound(n.line_starts.begin(), n.line_starts.end(), static_cast<std::uint32_t>(offset));
  return static_cast<std::size_t>(it - n.line_starts.begin());  // 1-based
}

}  // namespace

namespace {

// The lines messages are read from: the whole input, or, where torchrun tags the lines of its
// workers ("[rank0]: ..." and "[rank1]: ..." taking turns, or a launcher's own untagged lines among
// one worker's), each worker's lines, then the untagged ones, so that each message reads whole.
struct LineGroup {
  std::string text;
  std::vector<std::uint32_t> input_line;  // the 1-based input line of each of `text`'s lines
  std::optional<LineTag> tag;             // the worker whose lines these are (none: untagged)
};

std::vector<LineGroup> line_groups(std::string_view input) {
  const std::vector<LineGroup> whole{LineGroup{std::string(input), {}, std::nullopt}};
  // A log no worker tagged is read whole, with nothing kept per line (a log of millions of lines).
  bool tagged = false;
  for_each_line(input, [&tagged](std::string_view line) { return !(tagged = line_tag(line).has_value()); });
  if (!tagged) return whole;
  // Each line's group, 4 bytes a line: the workers in order of first appearance, then the untagged.
  constexpr std::uint32_t kUntagged = ~std::uint32_t{0};
  constexpr std::size_t kMaxWorkers = 1 << 16;  // more tags than any job has workers: read whole
  std::vector<std::uint32_t> group_of_line;
  std::unordered_map<std::string_view, std::uint32_t> group_of_tag;
  std::vector<LineTag> tags;
  bool too_many = false;
  for_each_line(input, [&](std::string_view line) {
    const auto tag = line_tag(line);
    if (!tag) {
      group_of_line.push_back(kUntagged);
      return true;
    }
    const auto [at, added] = group_of_tag.emplace(tag->name, static_cast<std::uint32_t>(tags.size()));
    if (added && (too_many = tags.size() == kMaxWorkers)) return false;
    if (added) tags.push_back(*tag);
    group_of_line.push_back(at->second);
    return true;
  });
  if (too_many) return whole;
  std::vector<LineGroup> groups(tags.size() + 1);
  for (std::size_t g = 0; g < tags.size(); ++g) groups[g].tag = tags[g];
  std::size_t l = 0;
  for_each_line(input, [&](std::string_view line) {
    LineGroup& g = groups[group_of_line[l] == kUntagged ? tags.size() : group_of_line[l]];
    if (!g.input_line.empty()) g.text += '\n';
    g.text += line;
    g.input_line.push_back(static_cast<std::uint32_t>(++l));
    return true;
  });
  return groups;
}

}  // namespace

std::vector<OomReport> parse_oom_messages(std::string_view text, bool* stopped_early) {
  static constexpr std::array<std::string_view, 3> kBackends{"CUDA", "HIP", "XPU"};
  // Each attempt reads one message's length at most; the bound keeps a log of millions of
  // "out of memory" texts to a fraction of a second.
  constexpr int kMaxAttempts = limits::kMaxOomMessages;
  std::vector<OomReport> reports;
  Attempt best;  // the failed attempt that read furthest, for the error when none reads
  std::size_t best_reach = 0, best_line = 0;
  bool found = false;
  int attempts = 0;
  std::vector<LineGroup> groups = line_groups(text);
  // A second pass reads the input whole where a message began in a worker's lines but did not read
  // whole there, or none read: a copy whose continuation lines lost their tag. The reading with
  // more messages is kept, the whole one where they tie (interleaved ranks read whole read fewer).
  bool tagged_miss = false;
  std::vector<OomReport> read_apart;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      if (groups.size() == 1 || (!reports.empty() && !tagged_miss)) break;
      read_apart = std::exchange(reports, {});
      groups = {LineGroup{std::string(text), {}, std::nullopt}};
    }
    for (const LineGroup& g : groups) {
      const Normalized n = normalize(g.text);
      const std::string_view s = n.text;
      auto input_line = [&](std::size_t offset) {
        const std::size_t l = line_of(n, offset);
        return g.input_line.empty() ? l : g.input_line[l - 1];
      };
      bool anchored = false;
      auto consider = [&](Attempt a, std::size_t start) {
        if (a.report) {
          a.report->line = input_line(start);
          if (g.tag) {
            a.report->rank = g.tag->rank;
            a.report->worker = std::string(g.tag->worker);
          }
          reports.push_back(std::move(*a.report));
          return a.reached;
        }
        tagged_miss = tagged_miss || g.tag.has_value();
        if (!found || a.reached - start > best_reach) {
          best_reach = a.reached - start;
          best_line = input_line(start);
          best = std::move(a);
          found = true;
        }
        return a.reached;
      };
      // "<backend> out of memory. Tried to allocate ...": the backend name is the word just before.
      // After a message is read, the search goes on past its end.
      constexpr std::string_view kAnchor = "out of memory";
      for (std::size_t at = s.find(kAnchor); at != std::string_view::npos && attempts < kMaxAttempts;
           at = s.find(kAnchor, at + 1)) {
        if (at < 2 || s[at - 1] != ' ') continue;
        std::string_view backend;
        for (auto b : kBackends)
          if (at - 1 >= b.size() && s.substr(at - 1 - b.size(), b.size()) == b &&
              (at - 1 == b.size() || !std::isalnum(static_cast<unsigned char>(s[at - 2 - b.size()]))))
            backend = b;
        if (backend.empty()) continue;
        ++attempts;
        anchored = true;
        const std::size_t start = at - 1 - backend.size();
        const std::size_t before = reports.size();
        const std::size_t reached = consider(read_message(s, start, at + kAnchor.size(), std::string(backend), true), start);
        if (reports.size() > before && reached > at) at = reached - 1;
      }
      // Quoted without its first sentence: "Tried to allocate 15.00 GiB. GPU 0 has ...".
      if (!anchored) {
        constexpr std::string_view kTried = "Tried to allocate";
        for (std::size_t at = s.find(kTried); at != std::string_view::npos && attempts < kMaxAttempts;
             at = s.find(kTried, at + 1)) {
          ++attempts;
          const std::size_t before = reports.size();
          const std::size_t reached = consider(read_message(s, at, at, "unknown", false), at);
          if (reports.size() > before && reached > at) at = reached - 1;
        }
      }
    }
  }
  if (read_apart.size() > reports.size()) reports = std::move(read_apart);
  if (stopped_early) *stopped_early = attempts >= kMaxAttempts;
  if (!reports.empty()) {
    std::stable_sort(reports.begin(), reports.end(), [](const OomReport& a, const OomReport& b) { return a.line < b.line; });
    return reports;
  }
  if (found)
    throw Error(ErrorKind::parse,
                "line " + std::to_string(best_line) +
                    ": found a PyTorch out-of-memory message but could not read it: " + best.why +
                    "; paste the whole message, from 'out of memory' to 'reserved'");
  const std::string joined = normalize(text).text;  // (a message wrapped over lines reads joined)
  if (joined.find("CUDA error: out of memory") != std::string::npos ||
      joined.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos)
    throw Error(ErrorKind::parse,
                "this is a CUDA runtime 'out of memory' error raised outside PyTorch's caching "
                "allocator (a kernel, cuBLAS/cuDNN workspace or NCCL): it carries no figures to "
                "read; rerun with CUDA_LAUNCH_BLOCKING=1 to find the call");
  throw Error(ErrorKind::parse,
              "no PyTorch out-of-memory message found: expected text like 'CUDA out of memory. "
              "Tried to allocate 20.00 MiB ...' (or 'HIP out of memory. ...')");
}

OomReport parse_oom_message(std::string_view text) { return std::move(parse_oom_messages(text, nullptr).front()); }

// ---------------------------------------------------------------------------------------------
// Classification.
//
// At the moment PyTorch raises, it has already released every cached segment that held no live
// block (release_cached_blocks), so the reserved-but-unallocated memory left is made of free
// blocks inside segments that also hold live tensors: it cannot be given back to the driver and
// can serve a request only if one of those blocks is large enough. Hence:
//
//   fragmentation       reserved_unallocated >= requested: the request would have fit in the
//                       cache's free blocks had they been contiguous. expandable_segments maps
//                       pages into one growing segment per stream and unmaps free pages on OOM,
//                       which removes exactly this waste.
//   non_pytorch_memory  non_pytorch = capacity - free - reserved is >= 10% of the capacity and
//                       non_pytorch + free >= requested. A CUDA context with cuBLAS/cuDNN/NCCL
//                       workspaces takes 0.3-1.5 GiB, under 10% on a datacenter GPU; more than
//                       that is another process or another library's allocations, and freeing
//                       it would have made room. (A process listed as "Process PID" may be this
//                       very process seen from inside a container, so the rule uses the
//                       arithmetic, not the labels.)
//   both                the larger of reserved_unallocated and non_pytorch names the cause.
//   shortage            otherwise: live tensors need more than the GPU has. Two facts of the
//                       message refine it before the context does: a single request larger than
//                       the GPU (or the allowed fraction), and an allowed fraction that is the
//                       binding limit (reserved + requested > allowed, to the 1% precision of
//                       the printed figure).

namespace {

enum class Situation {
  any,
  request_exceeds_device,  // requested > capacity (or > allowed)
  allowed_limit,           // reserved + requested > allowed
  eval_phase,              // context: the OOM happens in evaluation only
  long_sequences,          // context: it happens only on the longest sequences
  first_steps,             // context: step 0 or 1 (step 0 creates the optimizer state; step 1 is
                           // the first to hold weights, gradients, states and activations at once)
  later_steps,             // context: step >= 2, after steps that fit
};

struct Facts {
  const OomReport& r;
  const OomContext& ctx;
};

bool holds(Situation s, const Facts& f) {
  const OomReport& r = f.r;
  switch (s) {
    case Situation::any: return true;
    case Situation::request_exceeds_device:
      return r.requested > r.capacity || (r.allowed && r.requested > *r.allowed);
    case Situation::allowed_limit: {
      if (!r.allowed) return false;
      unsigned __int128 need = static_cast<unsigned __int128>(r.reserved) + r.requested + *r.allowed / 100;
      return need > *r.allowed;
    }
    case Situation::eval_phase: return f.ctx.phase == OomPhase::eval;
    case Situation::long_sequences: return f.ctx.long_sequences_only;
    case Situation::first_steps: return f.ctx.step && *f.ctx.step <= 1;
    case Situation::later_steps: return f.ctx.step && *f.ctx.step >= 2;
  }
  return false;
}

// The decision table: the first row whose class and situation hold gives the first fix.
struct FixRow {
  OomClass cls;
  Situation when;
  const char* name;
  const char* fix;
};

constexpr FixRow kFixTable[] = {
    {OomClass::fragmentation, Situation::any, "fragmentation",
     "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so free pages are reused across "
     "segments; if sequence lengths vary, bucket (pad) them to a few fixed lengths so block sizes "
     "repeat"},
    {OomClass::non_pytorch_memory, Situation::any, "memory_outside_pytorch",
     "find what holds the memory outside PyTorch: run nvidia-smi (rocm-smi on ROCm) for other "
     "processes and stop them or pick a free GPU with CUDA_VISIBLE_DEVICES; in this process, free "
     "memory held by other libraries (CuPy, TensorRT, JAX/TF preallocation, NCCL buffers)"},
    {OomClass::shortage, Situation::request_exceeds_device, "request_exceeds_device",
     "a single allocation is larger than the GPU: check the tensor shapes (an unbounded sequence "
     "length, a wrong dimension, a full attention matrix); no amount of freed memory can fit it"},
    {OomClass::shortage, Situation::allowed_limit, "allowed_fraction",
     "the per-process memory fraction is the limit: raise torch.cuda.set_per_process_memory_"
     "fraction (or per_process_memory_fraction in PYTORCH_CUDA_ALLOC_CONF), or plan the job within it"},
    {OomClass::shortage, Situation::eval_phase, "eval_only",
     "run evaluation under torch.inference_mode() (or torch.no_grad()) so no autograd graph is "
     "kept, and drop the training step's activations and gradients "
     "(optimizer.zero_grad(set_to_none=True)) before evaluating"},
    {OomClass::shortage, Situation::long_sequences, "long_sequences",
     "activations grow with sequence length: enable activation checkpointing, use fused attention "
     "(FlashAttention / scaled_dot_product_attention), or cap the tokens per micro-batch"},
    {OomClass::shortage, Situation::first_steps, "first_steps",
     "the fixed costs (weights, gradients, optimizer states) do not fit: shard them (FSDP, ZeRO), "
     "train adapters only (LoRA), or keep optimizer states in 8 bits or on the CPU"},
    {OomClass::shortage, Situation::later_steps, "after_steps_that_fit",
     "memory grows after steps that fit: look for a retained graph (summing losses without "
     ".item(), keeping outputs) with `membudget leaks`, or a longer batch than before (cap or "
     "bucket sequence lengths)"},
    {OomClass::shortage, Situation::any, "shortage",
     "reduce the micro-batch size (keep the global batch with gradient accumulation) or enable "
     "activation checkpointing"},
};

}  // namespace

OomDiagnosis classify(const OomReport& r, const OomContext& ctx) {
  const Facts facts{r, ctx};
  const bytes_t unalloc = r.reserved_unallocated;
  const bytes_t outside = r.non_pytorch();
  const bool hard_limit =
      holds(Situation::request_exceeds_device, facts) || holds(Situation::allowed_limit, facts);
  const bool fragmented = unalloc > 0 && unalloc >= r.requested;
  unsigned __int128 outside_plus_free = static_cast<unsigned __int128>(outside) + r.free;
  const bool foreign = outside >= r.capacity / 10 && outside > 0 && outside_plus_free >= r.requested;

  OomDiagnosis d;
  std::string need = format_bytes(r.requested);
  if (hard_limit) {
    d.classification = OomClass::shortage;
  } else if (fragmented && (!foreign || unalloc >= outside)) {
    d.classification = OomClass::fragmentation;
  } else if (foreign) {
    d.classification = OomClass::non_pytorch_memory;
  } else {
    d.classification = OomClass::shortage;
  }

  switch (d.classification) {
    case OomClass::fragmentation:
      d.explanation = "PyTorch holds " + format_bytes(unalloc) +
                      " reserved but unallocated, at least the " + need +
                      " requested, but only in free blocks of segments that also hold live "
                      "tensors";
      break;
    case OomClass::non_pytorch_memory:
      d.explanation = format_bytes(outside) + " of the " + format_bytes(r.capacity) +
                      " GPU is in use outside PyTorch's " + format_bytes(r.reserved) +
                      " reserved (capacity - free - reserved); freeing it would make room for " +
                      need;
      break;
    case OomClass::shortage:
      if (holds(Situation::request_exceeds_device, facts))
        d.explanation = "the request of " + need + " exceeds the " +
                        format_bytes(r.allowed && *r.allowed < r.capacity ? *r.allowed : r.capacity) +
                        (r.allowed && *r.allowed < r.capacity ? " allowed" : " GPU");
      else if (holds(Situation::allowed_limit, facts))
        d.explanation = "PyTorch reserves " + format_bytes(r.reserved) + " of the " +
                        format_bytes(*r.allowed) + " allowed; " + need + " more does not fit";
      else
        d.explanation = "PyTorch has " + format_bytes(r.allocated) + " allocated on a " +
                        format_bytes(r.capacity) + " GPU; neither the " + format_bytes(r.free) +
                        " free nor the " + format_bytes(unalloc) +
                        " reserved but unallocated can hold " + need;
      break;
  }
  if (d.classification == OomClass::shortage && !hard_limit && unalloc > 0) {
    unsigned __int128 both = static_cast<unsigned __int128>(unalloc) + r.free;
    if (both >= r.requested)
      d.explanation += " (free and reserved-but-unallocated together could: expandable_segments "
                       "may also help)";
  }

  for (const FixRow& row : kFixTable) {
    if (row.cls != d.classification || !holds(row.when, facts)) continue;
    d.situation = row.name;
    d.first_fix = row.fix;
    break;
  }
  return d;
}

namespace diagnose {

nlohmann::json oom_json(const OomReport& r, const OomContext& ctx) {
  using nlohmann::json;
  auto opt = [](const std::optional<bytes_t>& v) { return v ? json(*v) : json(nullptr); };
  json procs = json::array();
  for (const auto& p : r.other_processes) procs.push_back({{"pid", p.pid}, {"in_use", p.in_use}});
  json derived = json::array();
  if (r.reserved_derived) derived.push_back("reserved");
  if (r.reserved_unallocated_derived) derived.push_back("reserved_unallocated");
  OomDiagnosis d = classify(r, ctx);
  json j{{"backend", r.backend},
              {"template", to_string(r.template_version)},
              {"gpu", r.gpu},
              {"line", r.line},
              {"requested", r.requested},
              {"capacity", r.capacity},
              {"free", r.free},
              {"allocated", r.allocated},
              {"reserved", r.reserved},
              {"reserved_unallocated", r.reserved_unallocated},
              {"non_pytorch", r.non_pytorch()},
              {"reserved_beyond_device", r.reserved_beyond_device()},
              {"process_in_use", opt(r.process_in_use)},
              {"other_processes", procs},
              {"allowed", opt(r.allowed)},
              {"private_pools", opt(r.private_pools)},
              {"derived", derived},
              {"classification", to_string(d.classification)},
              {"situation", d.situation},
              {"first_fix", d.first_fix},
              {"explanation", d.explanation}};
  if (r.rank) j["rank"] = *r.rank;  // (only where torchrun tagged the message's lines)
  if (!r.worker.empty()) j["worker"] = r.worker;
  return j;
}

}  // namespace diagnose

std::string to_json(const OomReport& report, const OomContext& context, int indent) {
  return diagnose::dump(diagnose::oom_json(report, context), indent);
}

}  // namespace membudget
