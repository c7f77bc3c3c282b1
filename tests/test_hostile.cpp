// Hostile and absurd input (issue 13, docs/robustness.md): one test per class of input. Expected
// values are worked out by hand or by an independent computation, never read back from the code
// under test.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include <sys/stat.h>

#include "diagnose/pickle.hpp"
#include "helpers.hpp"
#include "membudget/api.hpp"
#include "membudget/input.hpp"
#include "membudget/job_sources.hpp"
#include "membudget/job_yaml.hpp"
#include "membudget/leaks.hpp"
#include "membudget/oom.hpp"
#include "membudget/trainer_args.hpp"

using namespace membudget;

namespace {

constexpr std::uint64_t kMax64 = std::numeric_limits<std::uint64_t>::max();

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / ("membudget_hostile_" + name)).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

ErrorKind kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  FAIL("no membudget::Error thrown");
  return ErrorKind::invalid_argument;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("no membudget::Error thrown");
  return {};
}

const char* const kTinyYaml =
    "name: tiny\nvocab_size: 256\nhidden_size: 64\nintermediate_size: 160\nnum_layers: 2\nnum_heads: 4\n"
    "num_kv_heads: 2\nmax_positions: 512\n";

}  // namespace

// ---- 1. capacities near 2^64: no hang, the exact limit --------------------------------------------

TEST_CASE("usable_bytes: headroom 0 keeps every byte of any capacity, up to 2^64 - 1, at once") {
  // With no headroom the limit is the capacity itself: every r <= capacity has double(r) <= double(capacity).
  for (std::uint64_t cap : {std::uint64_t{1}, std::uint64_t{1} << 53, (std::uint64_t{1} << 53) + 1,
                            std::uint64_t{1} << 63, (std::uint64_t{1} << 63) + 1, kMax64 - 1024, kMax64 - 1, kMax64}) {
    CAPTURE(cap);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(usable_bytes(Device{"x", cap}, 0.0) == cap);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100));
  }
  CHECK(usable_bytes(Device{"x", 1000}, 0.5) == 500);
  // The limit is what check_fit accepts, comparing in doubles: at 2^62 doubles are 1024 apart, so
  // 2^62 + 512 (a tie, rounding to the even 2^62) still compares equal to 2^63 · 0.5, and 2^62 + 513
  // does not.
  CHECK(usable_bytes(Device{"x", std::uint64_t{1} << 63}, 0.5) == (std::uint64_t{1} << 62) + 512);
  for (std::uint64_t cap : {std::uint64_t{80} << 30, kMax64, kMax64 / 3, std::uint64_t{1} << 63})
    for (double h : {0.0, 1e-300, 0.05, 0.5, 0.999999}) {
      CAPTURE(cap);
      CAPTURE(h);
      const double lim = static_cast<double>(cap) * (1.0 - h);
      const bytes_t r = usable_bytes(Device{"x", cap}, h);
      CHECK(static_cast<double>(r) <= lim);
      CHECK((r == cap || static_cast<double>(r + 1) > lim));
    }
}

TEST_CASE("fits and the searches answer at once for a capacity of 2^64 - 1 and no headroom") {
  const ModelSpec m = load_model(test::source_path("configs/tiny-llama.yaml"));
  Job j;
  j.batch = 1;
  j.seq = 64;
  const Device huge{"unlimited", kMax64};
  const auto t0 = std::chrono::steady_clock::now();
  const FitResult f = fits(m, j, huge, 0.0);
  CHECK(f.fits);
  CHECK(f.limit == kMax64);
  SearchOptions o;
  o.headroom = 0.0;
  const MaxBatchResult b = max_micro_batch(m, j, huge, o);
  CHECK(b.max_micro_batch == 65536);  // everything fits: the search stops at its default bound
  const MaxSeqResult s = max_sequence_length(m, j, huge, o);
  CHECK(s.max_seq == m.max_positions);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

// ---- 2. sizes parsed exactly ----------------------------------------------------------------------

TEST_CASE("parse_bytes is exact over the whole 64-bit range and refuses what does not fit") {
  CHECK(parse_bytes("18446744073709551615") == kMax64);
  CHECK(parse_bytes("9223372036854775808") == std::uint64_t{1} << 63);
  CHECK(parse_bytes("9223372036854775809") == (std::uint64_t{1} << 63) + 1);
  CHECK(parse_bytes("18446744073709551000") == 18446744073709551000ull);  // was 2^63 through llround
  CHECK(parse_bytes("9007199254740993") == 9007199254740993ull);          // 2^53 + 1: no double holds it
  CHECK(parse_bytes("1.8446744073709551615e19") == kMax64);
  CHECK(parse_bytes("15.999999999999999999TiB") == 17592186044416ull);  // 16 TiB - 2^40·1e-18 B: rounds up
  CHECK(parse_bytes("0.5") == 1);   // halves round up
  CHECK(parse_bytes("0.49") == 0);
  CHECK(parse_bytes("1.37 GiB") == 1471026299ull);  // 1.37 · 2^30 = 1471026298.88
  CHECK(parse_bytes("141e9") == 141000000000ull);
  CHECK(parse_bytes("1.8e19") == 18000000000000000000ull);  // below 2^64 - 1: refused before
  CHECK(parse_bytes("1e-3KiB") == 1);  // 1.024 bytes
  CHECK(parse_bytes("+80GiB") == 80 * GiB);
  CHECK(parse_bytes("0000000000000000000000000000000000000000001") == 1);
  CHECK(parse_bytes("16777215TiB") == 16777215ull << 40);  // 2^64 - 2^40
  for (const char* bad : {"18446744073709551616", "18446744073709551615.5", "16777216TiB", "1e400",
                          "-1", "-0", "nan", "inf", "1e", "1.2.3", "1,5GiB", "0x10", "", " ", "GiB", "1.8446744073709551616e19",
                          "1.00000000000000000000000000000000000000001", "16EiB"}) {
    CAPTURE(bad);
    CHECK(kind_of([&] { parse_bytes(bad); }) == ErrorKind::invalid_argument);
  }
  CHECK(message_of([] { parse_bytes("18446744073709551616", "--device-memory"); }).find("--device-memory") == 0);
}

TEST_CASE("--device-memory keeps the last digit of a size above 2^63; --overhead past 1 PiB is refused, not wrapped") {
  const std::string spec = test::source_path("configs/tiny-llama.yaml");
  // nvidia_smi = reserved_peak + overhead: near 2^64 it wrapped to less than reserved_peak
  auto r = test::run_cli("predict " + spec + " --batch 1 --seq 64 --overhead 9223372036854775809 --format json");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("--overhead: 8.00 EiB is more than any GPU holds") != std::string::npos);
  r = test::run_cli("predict " + spec + " --batch 1 --seq 64 --overhead 1125899906842624 --format json 2>/dev/null");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["terms"]["overhead"].get<std::uint64_t>() == 1125899906842624ull);
  CHECK(j["nvidia_smi"].get<std::uint64_t>() == j["reserved_peak"].get<std::uint64_t>() + 1125899906842624ull);
  r = test::run_cli("predict " + spec + " --batch 1 --seq 64 --device-memory 18446744073709551615 --headroom 0 --format json");
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(r.out)["device"]["capacity"].get<std::uint64_t>() == kMax64);
  CHECK(test::run_cli("predict " + spec + " --device-memory 18446744073709551616").exit_code == 2);
}

// ---- 3. numbers no double holds in a config.json ---------------------------------------------------

TEST_CASE("a number beyond a double anywhere in a config.json is a parse error, exit 2") {
  const std::string base = R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 160,
      "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512)";
  for (const char* extra : {R"(, "rope_theta": 1e400})", R"(, "ignored": {"deep": [1, -1e400]}})",
                            R"(, "vocab_size_2": 1e309})"}) {
    CAPTURE(extra);
    CHECK(kind_of([&] { parse_hf_config(base + extra, "c.json"); }) == ErrorKind::parse);
  }
  const std::string path = temp_file("huge_number.json", base + R"(, "initializer_range": 2e400})");
  const auto r = test::run_cli("predict " + path);
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("internal error") == std::string::npos);
  CHECK(r.out.find("parse error") == std::string::npos);  // the message itself, not the kind's name
  CHECK(r.out.find(path) != std::string::npos);
}

// ---- 4. sweep grids bounded before the work ---------------------------------------------------------

TEST_CASE("rank counts a C++ caller sets near 2^64 saturate world() and are refused, never wrap past the limit") {
  Job j;
  j.parallel.data = j.parallel.fsdp = j.parallel.tensor = std::uint64_t{1} << 43;  // 2^129: 2 in 128 bits
  CHECK(j.parallel.world() == kMax64);
  CHECK(j.parallel.data_ranks() == kMax64);  // 2^86 saturates too
  const std::string m = message_of([&] { j.validate(); });
  CHECK(m.find("absurdly large") != std::string::npos);
  Job k;
  k.parallel.data = kMax64;
  k.parallel.fsdp = 1;
  CHECK(k.parallel.data_ranks() == kMax64);
  k.parallel.tensor = 0;
  CHECK(k.parallel.world() == 0);  // a zero count is validate's "must be at least 1"
  Job fits;
  fits.parallel.data = 4;
  fits.parallel.fsdp = 8;
  fits.parallel.tensor = 2;
  CHECK(fits.parallel.world() == 64);
  CHECK(fits.parallel.data_ranks() == 32);
  // a pipeline's counts: 2 × 2^63 virtual stages wrapped to 0 stages (a division by zero), layer
  // counts of 2^64 − 1 and 2 summed to 1
  Job pp;
  pp.parallel.pipeline = 2;
  pp.parallel.pp_schedule = PipelineSchedule::interleaved;
  pp.parallel.virtual_stages = std::uint64_t{1} << 63;
  CHECK(message_of([&] { pp.validate(); }).find("--virtual-stages: 9223372036854775808 is absurdly large") != std::string::npos);
  pp.parallel.pp_schedule = PipelineSchedule::one_f_one_b;
  pp.parallel.virtual_stages = 1;
  pp.parallel.pp_layers = {kMax64, 2};
  CHECK(message_of([&] { pp.validate(); }).find("--pp-layers: 18446744073709551615 layers in a stage is absurdly large") !=
        std::string::npos);
  const ModelSpec one = [] {
    ModelSpec m = load_model(temp_file("one_layer.yaml", std::string(kTinyYaml)));
    m.num_layers = 1;
    return m;
  }();
  PredictOptions o;
  CHECK_THROWS_AS(predict(one, pp, o), Error);
  // a schedule of 2^20 microbatches ran for minutes: more than 256 is refused, at once
  pp.parallel.pp_layers.clear();
  pp.parallel.microbatches = 257;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(message_of([&] { (void)predict(load_model(test::source_path("configs/llama-3.2-1b.yaml")), pp, o); })
            .find("--microbatches: 257 is more than the 256 modelled") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  CHECK(test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") + " --pp 2 --microbatches 1048576 --precision bf16")
            .exit_code == 2);
  // 0 microbatches, as text, silently meant the field's default (as many as stages)
  {
    const auto r = test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") + " --pp 2 --microbatches 0 --precision bf16");
    CHECK(r.exit_code == 2);
    CHECK(r.out.find("--microbatches: '0' is not a whole number from 1 to") != std::string::npos);
    Job section;
    CHECK(message_of([&] { set_parallel_option(section, "microbatches", "0", "spec.yaml:5: job.parallel.microbatches"); })
              .find("spec.yaml:5: job.parallel.microbatches: '0' is not a whole number from 1") != std::string::npos);
  }
  // ZeRO-1's partition over 2^20 ranks took 16 s
  Job zero;
  zero.parallel.zero_stage = 1;
  zero.parallel.data = 65537;
  CHECK(message_of([&] { zero.validate(); }).find("--zero: 1 over 65537 ranks is absurdly large") != std::string::npos);
  zero.parallel.data = 65536;
  CHECK_NOTHROW(zero.validate());
}

TEST_CASE("fields a C++ caller sets past the loaders' checks: MoE groups, a group size near 2^64") {
  // group-limited routing's groups must divide the experts: 2^24 groups of 8 experts grew the
  // peak to terabytes (the loaders refuse it with the line; ModelSpec::validate for everyone)
  ModelSpec m = load_model(test::source_path("tests/data/hf/moe/deepseek-v2-lite.json"));
  // (a pair, not a structured binding: clang before 16 cannot capture a binding in CAPTURE's lambda)
  for (const std::pair<std::uint64_t, std::uint64_t> groups_top : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
           {m.moe.experts + 1, 1}, {std::uint64_t{1} << 24, 1}, {0, 1}, {2, 3}, {2, 0}}) {
    CAPTURE(groups_top.first);
    CAPTURE(groups_top.second);
    ModelSpec g = m;
    g.moe.groups = groups_top.first;
    g.moe.group_top_k = groups_top.second;
    g.moe.group_limited = groups_top.first > 1;
    CHECK(message_of([&] { g.validate(); }).find("moe.groups (config.json: n_group): must divide moe.experts") != std::string::npos);
  }
  // a layer listed many times among the dense ones: each layer's lookup read the whole list (10
  // million repeats took max_micro_batch past 6 s); each at most once keeps it the layers long
  ModelSpec repeats = load_model(test::source_path("tests/data/hf/moe/qwen3-30b-a3b.json"));
  repeats.moe.dense_layers.assign(10'000'000, 1);
  CHECK(message_of([&] { repeats.validate(); }).find("layer 1 is listed twice") != std::string::npos);
  // int4 scales per group: ceil(n / group) wrapped to 0 for a group near 2^64 (fewer bytes than
  // at 2^63, where every row has one scale)
  const ModelSpec dense = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job serve;
  serve.mode = Mode::infer;
  serve.weights = DType::int4;
  serve.group_size = std::uint64_t{1} << 63;
  const bytes_t at_2_63 = predict(dense, serve).states.total();
  serve.group_size = kMax64;
  CHECK(predict(dense, serve).states.total() == at_2_63);
}

TEST_CASE("an enum a C++ caller casts from another number is refused, naming the setting") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  auto refused = [&](auto set, const char* flag, const ModelSpec& model) {
    Job j;
    set(j);
    const std::string message = message_of([&] { (void)predict(model, j); });
    CAPTURE(message);
    CHECK(message.find(std::string(flag) + ": is not one of its values") != std::string::npos);
  };
  refused([](Job& j) { j.mode = static_cast<Mode>(77); }, "--mode", m);
  refused([](Job& j) { j.optimizer = static_cast<Optimizer>(77); }, "--optimizer", m);
  refused([](Job& j) { j.optimizer_impl = static_cast<OptimizerImpl>(77); }, "--optimizer-impl", m);
  refused([](Job& j) { j.loss = static_cast<Loss>(77); }, "--loss", m);
  refused([](Job& j) { j.activations = static_cast<ActivationModel>(77); }, "--activations", m);
  refused([](Job& j) { j.kv_dtype = static_cast<DType>(77); }, "--kv-dtype", m);
  refused([](Job& j) { j.parallel.pp_schedule = static_cast<PipelineSchedule>(77); }, "--pp-schedule", m);
  refused([](Job& j) { j.precision = static_cast<Precision>(77); }, "--precision", m);
  refused([](Job& j) { j.recompute = static_cast<Recompute>(77); }, "--recompute", m);
  refused([](Job& j) { j.attention = static_cast<Attention>(77); }, "--attention", m);
  refused([](Job& j) { j.profile = static_cast<Profile>(77); }, "--profile", m);
  refused([](Job& j) { j.weights = static_cast<DType>(77); }, "--weights", m);
  // (on a dense model these two are refused first as settings it has no part for)
  const ModelSpec moe = load_model(test::source_path("tests/data/hf/moe/mixtral-8x7b.json"));
  refused([](Job& j) { j.experts = static_cast<ExpertsImpl>(77); }, "--experts", moe);
  refused([](Job& j) { j.routing = static_cast<Routing>(77); }, "--routing", moe);
  ModelSpec bad_router = moe;
  bad_router.moe.router = static_cast<MixtureOfExperts::Router>(77);
  CHECK(message_of([&] { bad_router.validate(); }).find("moe.router: is not one of its kinds") != std::string::npos);
  CHECK_NOTHROW(moe.validate());
  ModelSpec bad = m;
  bad.norm = static_cast<NormKind>(77);
  CHECK(message_of([&] { bad.validate(); }).find("norm: is not one of its kinds") != std::string::npos);
  bad = m;
  bad.mlp = static_cast<MlpKind>(77);
  CHECK(message_of([&] { bad.validate(); }).find("mlp: is not one of its kinds") != std::string::npos);
  CHECK_NOTHROW(m.validate());
}

TEST_CASE("a sweep of --experts eager is bounded by its expert iterations, refused before any point") {
  // each point walks transformers' eager loop at its shape: 512 points of Qwen3-30B-A3B took 19 s
  const ModelSpec m = load_model(test::source_path("tests/data/hf/moe/qwen3-30b-a3b.json"));
  Job j;
  j.experts = ExpertsImpl::eager;
  j.precision = Precision::bf16;
  SweepGrid g;
  const std::uint64_t per_point = m.moe.local_experts() * m.moe_layers();
  for (std::uint64_t b = 1; b <= limits::kMaxSweepEagerIterations / per_point + 1; ++b) g.batches.push_back(b);
  g.seqs = {64};
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = message_of([&] { sweep(m, j, g); });
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100));
  CHECK(msg.find("sweep --experts eager: " + std::to_string(g.batches.size()) + " points") != std::string::npos);
  CHECK(msg.find("more than the " + std::to_string(limits::kMaxSweepEagerIterations) + " expert iterations") !=
        std::string::npos);
  j.experts = ExpertsImpl::grouped_mm;  // planned once: any number of points
  CHECK(sweep(m, j, g).size() == g.batches.size());
  j.experts = ExpertsImpl::eager;
  g.batches = {1, 2};  // within the bound: walked
  const auto points = sweep(m, j, g);
  REQUIRE(points.size() == 2);
  CHECK(points[1].ok);
}

TEST_CASE("a sweep grid past the point limit is refused before any point is computed") {
  const ModelSpec m = load_model(test::source_path("configs/tiny-llama.yaml"));
  SweepGrid g;
  for (std::uint64_t b = 1; b <= 1000; ++b) g.batches.push_back(b);
  for (std::uint64_t s = 1; s <= 101; ++s) g.seqs.push_back(s);  // 101,000 points > 100,000
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = message_of([&] { sweep(m, Job{}, g); });
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  CHECK(msg.find(std::to_string(limits::kMaxSweepPoints)) != std::string::npos);
  g.seqs.resize(100);  // 100,000 points: at the limit, computed
  CHECK(sweep(m, Job{}, g).size() == 100000);
  // The CLI: a grid whose product would wrap 64 bits, and one list past its own limit.
  const std::string spec = test::source_path("configs/tiny-llama.yaml");
  auto r = test::run_cli("sweep " + spec + " --batch 1..10000 --seq 1..1000");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("100000") != std::string::npos);
  r = test::run_cli("sweep " + spec + " --batch 1..99999,1..99999");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("100000") != std::string::npos);
}

// ---- 5. pickles: what the reader holds is bounded --------------------------------------------------

TEST_CASE("a pickle of empty containers stops at the value limit, in linear time") {
  using diagnose::parse_pickle;
  // A list of 2^23 + 1 empty lists: each costs a container although it expands to nothing.
  const std::size_t n = limits::kMaxPickleValues / 2 + 1;
  std::string p = "\x80\x04]";
  p.reserve(3 + 2 * n + 1);
  for (std::size_t i = 0; i < n; ++i) p += "]a";
  p += ".";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = message_of([&] { parse_pickle(p, "lists.pickle"); });
  CHECK(msg.find(std::to_string(limits::kMaxPickleValues)) != std::string::npos);
  // One-item APPENDS grow the list geometrically: a million of them take well under a second.
  std::string q = "\x80\x04]";
  for (int i = 0; i < 1000000; ++i) q += "(Ne";
  q += ".";
  CHECK(parse_pickle(q, "appends.pickle").root().size() == 1000000);
  // MEMOIZE costs a value too.
  std::string r = "\x80\x04N" + std::string(limits::kMaxPickleValues + 1, '\x94') + ".";
  CHECK(message_of([&] { parse_pickle(r, "memo.pickle"); }).find("MEMOIZE") != std::string::npos);
  // (generous: the sanitizer build is several times slower; the quadratic reader took minutes)
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
}

// ---- 6. and 13. input files: bounded, and I/O errors for what is not a file -------------------------

TEST_CASE("input files: the limit before reading, pipes read up to it, directories are I/O errors") {
  const std::string big = temp_file("big.yaml", std::string(limits::kMaxSpecBytes + 1, '#'));
  std::string msg = message_of([&] { load_model(big); });
  CHECK(msg.find(std::to_string(limits::kMaxSpecBytes)) != std::string::npos);
  CHECK(kind_of([&] { load_model("/dev/zero"); }) == ErrorKind::invalid_argument);
  const std::string dir = std::filesystem::temp_directory_path().string();
  CHECK(kind_of([&] { load_model(dir); }) == ErrorKind::io);
  CHECK(kind_of([&] { read_steps_csv_file(dir); }) == ErrorKind::io);
  CHECK(kind_of([&] { diagnose::read_pickle_file(dir); }) == ErrorKind::io);
  CHECK(kind_of([&] { load_model("/nonexistent/spec.yaml"); }) == ErrorKind::io);
  // The CLI: exit 5 for a directory, 2 for an endless device, for every file-reading command.
  for (const char* cmd : {"predict", "attribute", "leaks", "oom --file"}) {
    CAPTURE(cmd);
    CHECK(test::run_cli(std::string(cmd) + " " + dir).exit_code == 5);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(test::run_cli(std::string(cmd) + " /dev/zero").exit_code == 2);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  }
  CHECK(test::run_cli("oom < /dev/zero").exit_code == 2);
}

// ---- 7. and 14. oom: the step and the figures --------------------------------------------------------

TEST_CASE("oom --step is a whole number up to 10^9; a message whose free memory exceeds the capacity is refused") {
  const std::string msg = test::source_path("tests/data/snapshots/oom_fragmented_2gib.txt");
  CHECK(test::run_cli("oom --file " + msg + " --step 0").exit_code == 0);
  CHECK(test::run_cli("oom --file " + msg + " --step 1000000000").exit_code == 0);
  for (const char* bad : {"-1", "1000000001", "18446744073709551615", "1e3", "2.0", "' '"}) {
    CAPTURE(bad);
    const auto r = test::run_cli("oom --file " + msg + " --step " + bad);
    CHECK(r.exit_code == 2);
    CHECK(r.out.find("--step") != std::string::npos);
  }
  const std::string text =
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.00 GiB "
      "of which 80.00 GiB is free. Of the allocated memory 60.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved "
      "by PyTorch but unallocated.";
  const std::string what = message_of([&] { parse_oom_message(text); });
  CHECK(what.find("80.00 GiB") != std::string::npos);
  CHECK(what.find("79.00 GiB") != std::string::npos);
  // free == capacity is possible (nothing allocated yet) and read.
  std::string equal = text;
  equal.replace(equal.find("80.00 GiB is free"), 9, "79.00 GiB");
  CHECK(parse_oom_message(equal).free == 79 * GiB);
  // allocated above reserved (the pre-2.1 template): edited figures, refused; equal figures, and
  // those within the print's rounding, are read
  const std::string old_template = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
                                   "ALLOCATED already allocated; 3.75 MiB free; 14.74 GiB reserved in total by PyTorch)";
  auto with = [](std::string t, const std::string& key, const std::string& value) { return t.replace(t.find(key), key.size(), value); };
  CHECK(message_of([&] { parse_oom_message(with(old_template, "ALLOCATED", "44.56 GiB")); })
            .find("the allocated memory (44.56 GiB) exceeds the reserved (14.74 GiB)") != std::string::npos);
  CHECK(parse_oom_message(with(old_template, "ALLOCATED", "14.74 GiB")).allocated == parse_oom_message(with(old_template, "ALLOCATED", "14.74 GiB")).reserved);
  CHECK_NOTHROW(parse_oom_message(with(old_template, "ALLOCATED", "14.75 GiB")));
}

// ---- 8. every option used or refused for the mode ----------------------------------------------------

TEST_CASE("check_options_apply refuses what the mode does not read, naming the option and the mode") {
  Job train;
  for (const char* o : {"kv-dtype", "--weights", "group_size"}) {
    CAPTURE(o);
    const std::string m = message_of([&] { check_options_apply(train, {o}); });
    CHECK(m.find("training") != std::string::npos);
  }
  for (const char* o : {"precision", "optimizer", "recompute", "attention", "loss", "activations", "lora"})
    CHECK_NOTHROW(check_options_apply(train, {o, "batch", "seq", "mode", "profile", "overhead"}));
  Job serve;
  serve.mode = Mode::infer;
  for (const char* o : {"precision", "optimizer", "recompute", "attention", "loss", "loss-chunk", "activations", "lora"}) {
    CAPTURE(o);
    const std::string m = message_of([&] { check_options_apply(serve, {o}); });
    CHECK(m.find("--mode infer") != std::string::npos);
  }
  CHECK_NOTHROW(check_options_apply(serve, {"kv-dtype", "weights", "batch", "seq", "profile", "overhead"}));
  CHECK_THROWS(check_options_apply(serve, {"group-size"}));  // weights bf16: no groups
  serve.weights = DType::int4;
  CHECK_NOTHROW(check_options_apply(serve, {"group-size"}));
  CHECK_THROWS(check_options_apply(train, {"loss-chunk"}));
  train.loss = Loss::chunked;
  CHECK_NOTHROW(check_options_apply(train, {"loss-chunk"}));
}

TEST_CASE("the CLI refuses options the mode or the command does not use, exit 2, naming them") {
  const std::string spec = test::source_path("configs/tiny-llama.yaml");
  const std::pair<std::string, const char*> cases[] = {
      {"predict " + spec + " --weights int4", "--weights"},
      {"predict " + spec + " --kv-dtype fp8", "--kv-dtype"},
      {"predict " + spec + " --group-size 64", "--group-size"},
      {"predict " + spec + " --mode infer --lora 16", "--lora"},
      {"predict " + spec + " --mode infer --recompute full", "--recompute"},
      {"predict " + spec + " --mode infer --precision bf16", "--precision"},
      {"predict " + spec + " --mode infer --weights bf16 --group-size 64", "--group-size"},
      {"predict " + spec + " --loss-chunk 512", "--loss-chunk"},
      {"predict " + spec + " --profile harness --activations korthikanti", "--activations"},
      {"predict " + spec + " --device ''", "--device"},
      {"predict " + spec + " --device-memory ''", "--device-memory"},
      {"predict " + spec + " --headroom 0.1", "--headroom"},
      {"max-batch " + spec + " --device H100 --global-batch 0", "--global-batch"},
      {"max-batch " + spec + " --device H100 --global-batch -1", "--global-batch"},
      {"max-batch " + spec + " --device H100 --max 0", "--max"},
      {"max-batch " + spec + " --device H100 --data-parallel 2", "--data-parallel"},
      {"max-batch " + spec + " --device H100 --format markdown", "--format: 'markdown' is not one of table, json, csv"},
      {"max-batch " + spec + " --device H100 --format xml", "--format: 'xml' is not one of table, json, csv"},
      {"predict " + spec + " --plot -", "--plot: give a file name"},
      {"attribute " + test::source_path("tests/data/snapshots/train_tiny_llama_amp_bf16_ctx_all.pickle") + " --model " + spec +
           " --plot -",
       "--plot: give a file name"},
      {"predict " + spec + " --device A100", "--device: 'A100' is two cards"},
      {"predict " + spec + " --snapshot -", "--snapshot: give a file name"},
      {"predict " + spec + " --plot same.x --snapshot same.x", "--plot and --snapshot: the same file 'same.x'"},
      {"sweep " + spec + " --mode infer --precision bf16,fp32", "--precision"},
      {"serve " + spec + " --device H100 --group-size 64", "--group-size"},
      {"serve " + spec + " --device ''", "--device"},
      {"advise " + spec + " --device H100 --explain", "--explain"},
      {"verify " + spec + " --headroom 0.1", "--headroom"},
      {"verify " + spec + " --mode infer --lr 0.1", "--lr"},
      {"verify " + spec + " --steps 1000000", "--steps"},
      {"attribute " + test::source_path("tests/data/snapshots/train_tiny_llama_amp_bf16_ctx_all.pickle") + " --batch 2",
       "--batch"},
      {"attribute " + test::source_path("tests/data/snapshots/train_tiny_llama_amp_bf16_ctx_all.pickle") +
           " --device H100",
       "--device"},
      {"attribute " + test::source_path("tests/data/snapshots/train_tiny_llama_amp_bf16_ctx_all.pickle") + " --top -1",
       "--top"},
      {"oom --batch 4 'CUDA out of memory'", "--batch"},
      // an empty value is no value (each was read as "not given": the default, silently)
      {"predict " + spec + " --batch ''", "--batch: the value is empty"},
      {"predict " + spec + " --tp ''", "--tp: the value is empty"},
      {"predict " + spec + " --allocator-conf ''", "--allocator-conf: the value is empty"},
      {"sweep " + spec + " --batch ''", "--batch: the value is empty"},
      {"serve " + spec + " --device H100 --traffic ''", "--traffic: the value is empty"},
      {"max-batch " + spec + " --device H100 --max ''", "--max: the value is empty"},
      {"oom x --format ''", "--format: the value is empty"},
      {"leaks x --format ''", "--format: the value is empty"},
      {"oom x --format xml", "--format: 'xml' is not one of table, json"},
      // each command lists the formats it writes (advise and attribute listed all four for an unknown one)
      {"advise " + spec + " --device H100 --format xml", "--format: 'xml' is not one of table, json"},
      {"attribute x --format csv", "--format: 'csv' is not one of table, json"},
      {"sweep " + spec + " --format markdown", "--format: 'markdown' is not one of csv, json, table"},
      {"serve " + spec + " --device H100 --format csv", "--format: 'csv' is not one of table, json"},
      {"predict " + spec + " --mode infer --kv-dtype int4", "--kv-dtype: int4 is not a KV cache dtype"},
      {"oom x --phase bogus", "--phase: 'bogus' is not one of train, eval"},
      {"serve " + spec + " --device H100 --kv-dtype bogus", "--kv-dtype: 'bogus' is not one of fp32, bf16, fp16, fp8, int8"},
      {"serve " + spec + " --device H100 --kv-dtype int4", "--kv-dtype: int4 is not a KV cache dtype; use fp32, bf16"},
      {"max-batch " + spec + " --device H100 --max 18446744073709551616", "is absurdly large (more than 64 bits)"},
      {"oom --file " + test::source_path("tests/data/snapshots/oom_fragmented_2gib.txt") + " 'CUDA out of memory'",
       "TEXT or --file FILE, not both"},
  };
  for (const auto& c : cases) {
    const std::string& args = c.first;
    const char* flag = c.second;
    CAPTURE(args);
    const auto r = test::run_cli(args);
    CHECK(r.exit_code == 2);
    CHECK(r.out.find(flag) != std::string::npos);
  }
  // What each mode does read still works.
  CHECK(test::run_cli("predict " + spec + " --mode infer --weights int4 --group-size 32 --kv-dtype fp8").exit_code == 0);
  CHECK(test::run_cli("predict " + spec + " --loss chunked --loss-chunk 512 --lora 4").exit_code == 0);
  CHECK(test::run_cli("predict " + spec + " --device H100 --headroom 0").exit_code == 0);
  // The spec's job section holds defaults, not options given: a training section does not stop serving.
  CHECK(test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") + " --mode infer").exit_code == 0);
}

// ---- 9. the job section: one of each ----------------------------------------------------------------

TEST_CASE("a key given twice in job:, and a second job: section, are errors naming the line") {
  const std::string dup = std::string(kTinyYaml) + "job:\n  batch: 2\n  seq: 128\n  batch: 8\n";
  std::string m = message_of([&] { parse_job_section(dup, "dup.yaml", Job{}); });
  CHECK(m.find("dup.yaml:12") != std::string::npos);
  CHECK(m.find("job.batch") != std::string::npos);
  const std::string two = std::string(kTinyYaml) + "job:\n  batch: 2\njob:\n  batch: 8\n";
  m = message_of([&] { parse_job_section(two, "two.yaml", Job{}); });
  CHECK(m.find("two.yaml:11") != std::string::npos);
  const std::string one = std::string(kTinyYaml) + "job:\n  batch: 2\n  seq: 128\n";
  const Job j = parse_job_section(one, "one.yaml", Job{});
  CHECK(j.batch == 2);
  CHECK(j.seq == 128);
  CHECK(test::run_cli("predict " + temp_file("dup_job.yaml", dup)).exit_code == 2);
}

TEST_CASE("a job setting a check refuses is named where it was given: flag, job: line, TrainingArguments field") {
  // kTinyYaml is lines 1-8: job: is line 9, its keys from line 10
  const std::string zero = temp_file("zero_batch.yaml", std::string(kTinyYaml) + "job:\n  seq: 128\n  batch: 0\n");
  auto r = test::run_cli("predict " + zero);
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("zero_batch.yaml:11: job.batch: must be at least 1") != std::string::npos);
  // given as a flag after, the flag is its place (and the section's value is gone)
  r = test::run_cli("predict " + zero + " --batch 0");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("--batch: must be at least 1") != std::string::npos);
  CHECK(r.out.find("zero_batch.yaml") == std::string::npos);
  CHECK(test::run_cli("predict " + zero + " --batch 1").exit_code == 0);
  // a message naming several settings lists the places of those not given as flags
  const std::string tp = temp_file("tp_dp.yaml", std::string(kTinyYaml) + "job:\n  seq: 128\n  parallel:\n    tensor_parallel: 2\n");
  r = test::run_cli("predict " + tp + " --dp 2");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("(--tp is job.parallel.tensor_parallel at ") != std::string::npos);
  CHECK(r.out.find("tp_dp.yaml:12)") != std::string::npos);
  // a key the section's own job does not read is refused, as the flag would be
  const std::string chunk = temp_file("chunk.yaml", std::string(kTinyYaml) + "job:\n  seq: 128\n  loss: full\n  loss_chunk: 64\n");
  r = test::run_cli("predict " + chunk);
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("chunk.yaml:12: job.loss_chunk: applies only with --loss chunked (--loss is job.loss at ") != std::string::npos);
  CHECK(r.out.find("chunk.yaml:11)") != std::string::npos);
  CHECK(test::run_cli("predict " + chunk + " --loss chunked").exit_code == 2);  // the section contradicts itself
  const std::string infer = temp_file("infer_precision.yaml", std::string(kTinyYaml) + "job:\n  mode: infer\n  precision: bf16\n");
  r = test::run_cli("predict " + infer);
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("infer_precision.yaml:11: job.precision: applies to training") != std::string::npos);
  // a TrainingArguments field read as the setting
  const std::string args = temp_file("huge_batch_args.json", R"({"per_device_train_batch_size": 8589934592})");
  r = test::run_cli("predict " + temp_file("tiny.yaml", kTinyYaml) + " --seq 64 --trainer-args " + args);
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("huge_batch_args.json: TrainingArguments.per_device_train_batch_size: 8589934592 is absurdly large") != std::string::npos);
}

TEST_CASE("JobSources::locate: an opening flag becomes its place, others are listed once, the kind is kept") {
  JobSources s;
  s.note("--batch", "a.yaml:3", "job.batch");
  s.note("--seq", "a.yaml:4", "job.seq");
  s.note("--seq", "b.json", "TrainingArguments.x");  // a later read replaces
  s.note("--pp", "a.yaml:5", "job.parallel.pp");
  const Error opening = s.locate(Error(ErrorKind::invalid_job, "--batch: must be at least 1 (--batch again)"));
  CHECK(std::string(opening.what()) == "a.yaml:3: job.batch: must be at least 1 (--batch again)");
  CHECK(opening.kind() == ErrorKind::invalid_job);
  const Error listed = s.locate(Error(ErrorKind::unsupported, "--batch × --seq: too many; --pp-schedule and --pp too"));
  CHECK(std::string(listed.what()) ==
        "--batch × --seq: too many; --pp-schedule and --pp too (--batch is job.batch at a.yaml:3; --seq is "
        "TrainingArguments.x at b.json; --pp is job.parallel.pp at a.yaml:5)");
  CHECK(listed.kind() == ErrorKind::unsupported);
  s.given_as_flag("--batch");
  CHECK(std::string(s.locate(Error(ErrorKind::invalid_job, "--batch: must be at least 1")).what()) == "--batch: must be at least 1");
  CHECK(s.flags() == std::vector<std::string>{"--pp", "--seq"});
  CHECK(std::string(s.locate(Error(ErrorKind::io, "no flags here")).what()) == "no flags here");
}

// ---- 10. names escaped for the terminal ------------------------------------------------------------

TEST_CASE("printable escapes control characters and stray bytes and keeps UTF-8") {
  CHECK(printable("llama-3") == "llama-3");
  CHECK(printable("Ünïcødé × 2 — ok") == "Ünïcødé × 2 — ok");
  CHECK(printable("a\x1b[31mb") == "a\\x1B[31mb");
  CHECK(printable(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(printable("\x7f") == "\\x7F");
  CHECK(printable("\xc2\x9b") == "\\u{009B}");  // C1 CSI
  CHECK(printable("\xff\xfe") == "\\xFF\\xFE");
  CHECK(printable("\xe2\x82") == "\\xE2\\x82");  // a cut sequence
  CHECK(valid_utf8("Ünïcødé"));
  CHECK_FALSE(valid_utf8("\xc0\xaf"));          // overlong '/'
  CHECK_FALSE(valid_utf8("\xed\xa0\x80"));      // a surrogate
  CHECK_FALSE(valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
}

TEST_CASE("a spec's name reaches no terminal raw: table, markdown, csv, errors; JSON stays valid") {
  std::string yaml = std::string(kTinyYaml);
  yaml.replace(yaml.find("name: tiny"), 10, "name: \"evil\\e[2J\\0name\"");
  const std::string path = temp_file("evil_name.yaml", yaml);
  for (const char* fmt : {"table", "markdown", "csv"}) {
    CAPTURE(fmt);
    const auto r = test::run_cli("predict " + path + " --seq 64 --format " + std::string(fmt) + " --device H100");
    CHECK(r.exit_code == 0);
    CHECK(r.out.find('\x1b') == std::string::npos);
    CHECK(r.out.find('\0') == std::string::npos);
  }
  const auto j = test::run_cli("predict " + path + " --seq 64 --format json");
  REQUIRE(j.exit_code == 0);
  CHECK(nlohmann::json::parse(j.out)["model"]["name"] == std::string("evil\x1b[2J\0name", 13));
  for (const char* cmd : {"serve", "max-batch", "advise"}) {
    CAPTURE(cmd);
    const auto r = test::run_cli(std::string(cmd) + " " + path + " --device H100");
    CHECK(r.out.find('\x1b') == std::string::npos);
  }
  // An error quoting a hostile key: escaped too.
  const std::string bad = temp_file("evil_key.yaml", std::string(kTinyYaml) + "\"\\e]0;pwned\\a\": 1\n");
  const auto r = test::run_cli("predict " + bad);
  CHECK(r.exit_code == 2);
  CHECK(r.out.find('\x1b') == std::string::npos);
  CHECK(r.out.find('\a') == std::string::npos);
  // A name that is not UTF-8 would make the JSON invalid: refused.
  std::string latin1 = std::string(kTinyYaml);
  latin1.replace(latin1.find("name: tiny"), 10, "name: caf\xe9");
  const ErrorKind k = kind_of([&] { parse_model_yaml(latin1, "latin1.yaml"); });
  CHECK((k == ErrorKind::invalid_spec || k == ErrorKind::parse));
}

// ---- 11. values that would silently mean "absent" ------------------------------------------------

TEST_CASE("what a spec file holds beyond the model is refused, not dropped: a second YAML document, a quantized checkpoint") {
  const std::string yaml = "name: t\nvocab_size: 256\nhidden_size: 64\nintermediate_size: 128\nnum_layers: 2\n"
                           "num_heads: 4\nnum_kv_heads: 2\nmax_positions: 512\n";
  CHECK(parse_model_yaml(yaml, "t.yaml").num_layers == 2);
  CHECK(parse_model_yaml("---\n" + yaml, "t.yaml").num_layers == 2);  // one document, marked
  CHECK(parse_model_yaml("# a spec\n---\n" + yaml + "...\n# the end\n", "t.yaml").num_layers == 2);
  const std::string two = message_of([&] { parse_model_yaml(yaml + "---\nnum_layers: 1\n", "t.yaml"); });
  CHECK(two.find("t.yaml:9: a second YAML document begins here") != std::string::npos);
  const std::string after_end = message_of([&] { parse_model_yaml(yaml + "...\nnum_layers: 1\n", "t.yaml"); });
  CHECK(after_end.find("t.yaml:10: a second YAML document") != std::string::npos);
  // yaml-cpp's LoadAll looped forever on this (the fuzzer's find): read as one malformed document
  CHECK(kind_of([] { parse_model_yaml("!\n,#", "t.yaml"); }) == ErrorKind::invalid_spec);
  std::ifstream in(test::source_path("tests/data/hf/llama-3.1-8b.json"));
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  const std::string quantized = message_of([&] { parse_hf_config(cfg.dump(), "config.json"); });
  CHECK(quantized.find("quantization_config: a \"gptq\" checkpoint's quantized weights are not read") != std::string::npos);
}

TEST_CASE("sliding_window 0 and an all-zero mla section are refused, not read as absent") {
  CHECK(kind_of([] { parse_model_yaml(std::string(kTinyYaml) + "sliding_window:\n  window: 0\n"); }) ==
        ErrorKind::invalid_spec);
  CHECK(message_of([] { parse_model_yaml(std::string(kTinyYaml) + "sliding_window:\n  window: 0\n", "w.yaml"); })
            .find("w.yaml:10") != std::string::npos);
  CHECK(parse_model_yaml(std::string(kTinyYaml) + "sliding_window:\n  window: 128\n").sliding.window == 128);
  for (const char* mla : {"mla:\n  kv_lora_rank: 0\n  qk_rope_head_dim: 0\n  qk_nope_head_dim: 0\n  v_head_dim: 0\n",
                          "mla: {}\n", "mla:\n  q_lora_rank: 0\n"}) {
    CAPTURE(mla);
    CHECK(kind_of([&] { parse_model_yaml(std::string(kTinyYaml) + mla); }) == ErrorKind::invalid_spec);
  }
  const std::string mistral = R"({"model_type": "mistral", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 160,
      "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512, "sliding_window": )";
  CHECK(kind_of([&] { parse_hf_config(mistral + "0}"); }) == ErrorKind::invalid_spec);
  CHECK_FALSE(parse_hf_config(mistral + "null}").sliding.enabled());
  CHECK(parse_hf_config(mistral + "128}").sliding.window == 128);
  // the latent attention walk has no window: training ignored it while serving applied it
  const std::string mla = std::string(kTinyYaml) +
                          "head_dim: 24\nmla:\n  kv_lora_rank: 32\n  qk_rope_head_dim: 8\n  qk_nope_head_dim: 16\n  v_head_dim: 16\n";
  CHECK(parse_model_yaml(mla).mla.enabled());
  CHECK(message_of([&] { parse_model_yaml(mla + "sliding_window:\n  window: 128\n"); }).find("not modelled with mla") !=
        std::string::npos);
  // and config.json's parse errors name the file's place, not nlohmann's exception class
  const std::string broken = message_of([] { parse_hf_config("{\"model_type\": \"llama\",", "c.json"); });
  CHECK(broken.find("c.json:1:") != std::string::npos);
  CHECK(broken.find("json.exception") == std::string::npos);
}

// ---- 12. byte-order marks ----------------------------------------------------------------------

TEST_CASE("a config.json or a YAML spec that starts with a UTF-8 byte-order mark is read as such") {
  const std::string json = test::source_path("configs/hf/llama-3.2-1b.json");
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const ModelSpec plain = parse_hf_config(text);
  const ModelSpec bom = load_model(temp_file("bom_config.json", "\xEF\xBB\xBF" + text));
  CHECK(bom.family == "llama");
  CHECK(bom.parameters().total == plain.parameters().total);
  const ModelSpec y = load_model(temp_file("bom.yaml", "\xEF\xBB\xBF" + std::string(kTinyYaml) + "job:\n  batch: 3\n"));
  CHECK(y.name == "tiny");
  CHECK(load_job_section(temp_file("bom.yaml", "\xEF\xBB\xBF" + std::string(kTinyYaml) + "job:\n  batch: 3\n"), Job{})
            .batch == 3);
}

// ---- 15 (C++ side): floating point to integer ---------------------------------------------------------

TEST_CASE("bytes_from_double refuses what no 64-bit integer holds") {
  CHECK(bytes_from_double(0.0, "x") == 0);
  CHECK(bytes_from_double(1.9, "x") == 1);
  CHECK(bytes_from_double(18446744073709549568.0, "x") == 18446744073709549568ull);  // the largest double < 2^64
  for (double bad : {18446744073709551616.0, 1e300, -1.0, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    CHECK(kind_of([&] { bytes_from_double(bad, "x"); }) == ErrorKind::overflow);
  }
  // vLLM's budget on a card of 2^64 - 1 bytes: refused as an overflow (its signed available memory
  // would wrap), not answered "no memory for the cache".
  const std::string spec = test::source_path("configs/tiny-llama.yaml");
  auto r = test::run_cli("serve " + spec + " --device-memory 18446744073709551615 --gpu-memory-utilization 1");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("overflow") == std::string::npos);
  CHECK(r.out.find("2^63") != std::string::npos);
  r = test::run_cli("serve " + spec + " --device-memory 9223372036854775807 --gpu-memory-utilization 1 --format json");
  CHECK(r.exit_code == 0);
}

TEST_CASE("output that cannot be written is a failure: a full disk gives exit 5, not an empty success") {
  for (const char* command : {"predict", "max-batch"}) {
    INFO(command);
    const std::string args = std::string(command) + " " + test::source_path("configs/tiny-llama.yaml") + " --seq 64" +
                             (std::string(command) == "max-batch" ? " --device H100" : "");
    CHECK(test::run_cli(args + " > /dev/null").exit_code == 0);
    CHECK(test::run_cli(args + " > /dev/full").exit_code == 5);
    CHECK(test::run_cli(args + " --format json > /dev/full").exit_code == 5);
  }
  const auto r = test::run_cli("predict " + test::source_path("configs/tiny-llama.yaml") + " --seq 64 2>&1 > /dev/full");
  CHECK(r.exit_code == 5);
  CHECK(r.out.find("the output could not be written to standard output") != std::string::npos);
}

TEST_CASE("a JSON key given twice in one object is refused, not the last one silently kept") {
  const std::string tiny = R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512)";
  CHECK(parse_hf_config(tiny + "}", "config.json").vocab_size == 256);
  // the same key in two objects is two keys
  CHECK(parse_hf_config(tiny + R"(, "rope_scaling": {"factor": 8.0}, "text": {"factor": 2})" + "}", "config.json").vocab_size == 256);
  std::string m = message_of([&] { parse_hf_config(tiny + R"(, "vocab_size": 1000000})", "config.json"); });
  CHECK(m.find("config.json: key 'vocab_size' is given twice in one object") != std::string::npos);
  CHECK(kind_of([&] { parse_hf_config(tiny + R"(, "vocab_size": 1000000})", "config.json"); }) == ErrorKind::parse);
  m = message_of([&] { parse_hf_config(tiny + R"(, "rope_scaling": {"factor": 8.0, "factor": 2.0}})", "config.json"); });
  CHECK(m.find("key 'factor' is given twice") != std::string::npos);
  // a model_type given twice named itself, not a field of the family the last one chose
  m = message_of([&] { parse_hf_config(R"({"model_type": "llama", "model_type": "mixtral"})", "config.json"); });
  CHECK(m.find("key 'model_type' is given twice") != std::string::npos);
  // TrainingArguments too
  m = message_of([] {
    (void)apply_training_arguments(Job{}, R"({"per_device_train_batch_size": 2, "per_device_train_batch_size": 64})", "args.json");
  });
  CHECK(m.find("args.json: key 'per_device_train_batch_size' is given twice in one object") != std::string::npos);
  CHECK(apply_training_arguments(Job{}, R"({"per_device_train_batch_size": 2})", "args.json").batch == 2);
  // and the CLI exits 2
  const std::string path = temp_file("dup_key.json", tiny + R"(, "vocab_size": 1000000})");
  CHECK(test::run_cli("predict " + path).exit_code == 2);
}

TEST_CASE("a config.json 0 that would silently mean none is refused: Gemma 2's soft-caps, DeepSeek's q_lora_rank") {
  const std::string gemma2 = R"({"model_type": "gemma2", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
    "sliding_window": 128)";
  CHECK(parse_hf_config(gemma2 + R"(, "final_logit_softcapping": null, "attn_logit_softcapping": null})", "g.json").final_logit_softcap == 0);
  CHECK(message_of([&] { parse_hf_config(gemma2 + R"(, "final_logit_softcapping": 0})", "g.json"); })
            .find("g.json: final_logit_softcapping: 0 would divide the logits by zero; use null") != std::string::npos);
  CHECK(message_of([&] { parse_hf_config(gemma2 + R"(, "attn_logit_softcapping": 0.0})", "g.json"); })
            .find("attn_logit_softcapping: 0 would divide") != std::string::npos);
  std::ifstream lite_file(test::source_path("tests/data/hf/deepseek-v2-lite.json"));
  const nlohmann::json lite = nlohmann::json::parse(lite_file);
  auto with_q_lora = [&](const nlohmann::json* value) {
    nlohmann::json c = lite;
    if (value) c["q_lora_rank"] = *value;
    else c.erase("q_lora_rank");
    return parse_hf_config(c.dump(), "d.json");
  };
  const nlohmann::json null_rank = nullptr, rank24 = 24, rank0 = 0;
  CHECK(with_q_lora(&null_rank).mla.q_lora_rank == 0);  // a plain q_proj, as the Lite model has
  CHECK(with_q_lora(&rank24).mla.q_lora_rank == 24);
  CHECK(with_q_lora(nullptr).mla.q_lora_rank == 1536);  // absent: DeepseekV2Config's
  CHECK(message_of([&] { (void)with_q_lora(&rank0); }).find("d.json: q_lora_rank: 0 is not a rank; use null") != std::string::npos);
}

TEST_CASE("a config.json number that a double reads as 0 although its digits are not is refused (1e-400)") {
  const std::string gemma2 = R"({"model_type": "gemma2", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
    "sliding_window": 128, "attn_logit_softcapping": 50.0, "final_logit_softcapping": )";
  CHECK(parse_hf_config(gemma2 + "30.0}", "c.json").final_logit_softcap == 30.0);
  // zero as written is not an underflow (and a soft-cap of 0 is refused for a reason of its own)
  CHECK(message_of([&] { parse_hf_config(gemma2 + "0.0e-400}", "c.json"); }).find("0 would divide the logits by zero") != std::string::npos);
  const std::string m = message_of([&] { parse_hf_config(gemma2 + "1e-400}", "c.json"); });
  CHECK(m.find("c.json: the number 1e-400 is too small for a double (it would be read as 0)") != std::string::npos);
  CHECK(kind_of([&] { parse_hf_config(gemma2 + "4e-320}", "c.json"); }) == ErrorKind::parse);  // a denormal
  // anywhere in the file, as a number past a double is
  CHECK(kind_of([&] { parse_hf_config(gemma2 + R"(30.0, "unused": [1e-999]})", "c.json"); }) == ErrorKind::parse);
  // malformed text keeps its position
  CHECK(message_of([&] { parse_hf_config(gemma2 + "}", "c.json"); }).find("c.json:3:") != std::string::npos);
}

TEST_CASE("a YAML number is written plain and in decimal: leading zeros, string tags, hex and underflow are refused") {
  const std::string base = "name: t\nhidden_size: 64\nintermediate_size: 160\nnum_layers: 2\nnum_heads: 4\nnum_kv_heads: 2\n"
                           "max_positions: 512\n";
  auto spec = [&](const std::string& vocab, const std::string& more = "") {
    return parse_model_yaml(base + "vocab_size: " + vocab + "\n" + more, "s.yaml");
  };
  CHECK(spec("256").vocab_size == 256);
  CHECK(spec("!!int 256").vocab_size == 256);  // tagged as what it is
  // YAML 1.1 (PyYAML) reads 0256 as octal 174; a string tag makes a string
  CHECK(message_of([&] { spec("0256"); }).find("s.yaml:8: vocab_size: '0256' has a leading zero") != std::string::npos);
  CHECK(message_of([&] { spec("!!str 256"); }).find("got '256' tagged tag:yaml.org,2002:str") != std::string::npos);
  CHECK(message_of([&] { spec("\"256\""); }).find("the quoted string \"256\"") != std::string::npos);
  // the soft-capping value: decimal only; a value that underflows would silently mean "no capping"
  auto softcap = [&](const std::string& v) { return spec("256", "final_logit_softcap: " + v + "\n").final_logit_softcap; };
  CHECK(softcap("30") == 30.0);
  CHECK(softcap("30.0") == 30.0);
  CHECK(softcap("3e1") == 30.0);
  CHECK(softcap("!!float 30") == 30.0);
  for (const char* bad : {"0x10", "0x1p4", "inf", ".inf", ".nan", "1e400", "1e-400", "3e", "e3", "."}) {
    INFO(bad);
    CHECK(kind_of([&] { softcap(bad); }) == ErrorKind::invalid_spec);
  }
  CHECK(message_of([&] { softcap("1e-400"); }).find("1e-400 is too small for a double (it would be read as 0)") != std::string::npos);
  // the job: section's counts the same way
  auto job = [&](const std::string& batch) {
    return parse_job_section(std::string(kTinyYaml) + "job:\n  batch: " + batch + "\n", "j.yaml", Job{}).batch;
  };
  CHECK(job("4") == 4);
  CHECK(job("!!int 4") == 4);
  CHECK(message_of([&] { job("\"4\""); }).find("j.yaml:10: job.batch: expected a whole number, got '4' quoted") != std::string::npos);
  CHECK(message_of([&] { job("04"); }).find("'04' has a leading zero") != std::string::npos);
  CHECK(message_of([&] { job("99999999999999999999"); }).find("is absurdly large (more than 64 bits)") != std::string::npos);
}

TEST_CASE("parse_count: digits only, the range named when out of it, past 64 bits absurdly large") {
  CHECK(parse_count("0", "--x") == 0);
  CHECK(parse_count("18446744073709551615", "--x") == kMax64);
  CHECK(parse_count("7", "--x", 1, 7) == 7);
  CHECK(message_of([] { parse_count("18446744073709551616", "--x"); }) == "--x: '18446744073709551616' is absurdly large (more than 64 bits)");
  CHECK(message_of([] { parse_count("99999999999999999999999", "--x"); }).find("absurdly large") != std::string::npos);
  CHECK(message_of([] { parse_count("8", "--x", 1, 7); }) == "--x: '8' is not a whole number from 1 to 7");
  CHECK(message_of([] { parse_count("0", "--x", 1, 7); }) == "--x: '0' is not a whole number from 1 to 7");
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "0x10", "1e3", "1.0", "１"}) {
    INFO(bad);
    CHECK(message_of([&] { parse_count(bad, "--x"); }).find("is not a whole number") != std::string::npos);
    CHECK(kind_of([&] { parse_count(bad, "--x"); }) == ErrorKind::invalid_job);
  }
}

TEST_CASE("the CLI: values only too large are called that, --headroom is read strictly, CLI11's errors carry the prefix") {
  const std::string llama = test::source_path("configs/llama-3.2-1b.yaml");
  auto refused = [&](const std::string& args, const std::string& message) {
    INFO(args);
    const auto r = test::run_cli(args);
    CHECK(r.exit_code == 2);
    CHECK(r.out.find(message) != std::string::npos);
  };
  refused("predict " + llama + " --batch 18446744073709551615", "--batch: 18446744073709551615 is absurdly large (limit 2^32)");
  // a sweep whose every point is refused is bad input too; its rows name each point's error
  refused("sweep " + llama + " --batch 18446744073709551615 --format csv", "\"--batch: 18446744073709551615 is absurdly large");
  refused("sweep " + llama + " --batch 4294967297,8589934592 --seq 1 --device H100", "--batch: 4294967297 is absurdly large");
  CHECK(test::run_cli("sweep " + llama + " --batch 1,18446744073709551615 --seq 64 --fit-on allocated --device H100").exit_code == 0);
  refused("predict " + llama + " --batch 18446744073709551616", "--batch: '18446744073709551616' is absurdly large");
  refused("predict " + llama + " --pp 2 --pp-layers 18446744073709551615,17",
          "--pp-layers: a stage's layers: '18446744073709551615' is not a whole number from 0 to 1048576");
  refused("sweep " + llama + " --batch 1..184467440737095516150", "is absurdly large (more than 64 bits)");
  refused("predict " + llama + " --allocator-conf max_split_size_mb:17592186044415", "is not a whole number from 0 to 8796093022208");
  refused("predict " + llama + " --device H100 --headroom 0.1abc", "membudget: error: --headroom: '0.1abc' is not a decimal fraction");
  refused("predict " + llama + " --device H100 --headroom 0x0.1p0", "is not a decimal fraction");
  refused("predict " + llama + " --device H100 --headroom 1e-320", "is not a decimal fraction");
  refused("predict " + llama + " --device H100 --headroom 1.0", "--headroom: must be in [0, 1)");
  refused("predict " + llama + " --batch 1 --batch 2", "membudget: error: --batch: At Most 1 required but received 2");
  // serve's own fractions and counts the same way
  refused("serve " + llama + " --device H100 --gpu-memory-utilization 0x0.8p0", "--gpu-memory-utilization: '0x0.8p0' is not a decimal fraction");
  refused("serve " + llama + " --device H100 --max-num-seqs 99999999999999999999999", "--max-num-seqs: '99999999999999999999999' is absurdly large");
  refused("serve " + llama + " --device H100 --max-num-seqs 0", "--max-num-seqs: must be at least 1");
  // an oversized count is named as such, not as a malformed value
  refused("serve " + llama + " --device H100 --traffic 99999999999999999999x1", "--traffic: 99999999999999999999 is absurdly large");
  refused("serve " + llama + " --device H100 --traffic 1:1:18446744073709551615", "--traffic: 18446744073709551615 is absurdly large");
  refused("sweep " + llama + " --batch 1..10:0", "--batch: '1..10:0' has a step of 0");
  refused("sweep " + llama + " --batch 1..10:00", "--batch: '1..10:00' has a step of 0");
  CHECK(test::run_cli("serve " + llama + " --device H100 --traffic 0000000000064x1").exit_code == 0);  // 64: leading zeros
  CHECK(test::run_cli("serve " + llama + " --device H100 --gpu-memory-utilization .85 --max-num-seqs 64").exit_code == 0);
  const auto r = test::run_cli("predict " + test::source_path("configs/tiny-llama.yaml") + " --seq 64 --device H100 --headroom .2 --format json");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("\"headroom\": 0.2") != std::string::npos);
  CHECK(test::run_cli("predict --help").exit_code == 0);
}

TEST_CASE("a job: section's MoE setting on a dense model is named where it was given; a null hidden_act is refused") {
  const std::string eager = temp_file("job_eager.yaml", std::string(kTinyYaml) + "job:\n  seq: 64\n  experts: eager\n");
  auto r = test::run_cli("predict " + eager);
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("job_eager.yaml:11: job.experts: tiny has no mixture of experts") != std::string::npos);
  r = test::run_cli("predict " + temp_file("tiny.yaml", kTinyYaml) + " --seq 64 --routing worst");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("--routing: tiny has no mixture of experts") != std::string::npos);
  const std::string llama = R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512)";
  CHECK(message_of([&] { parse_hf_config(llama + R"(, "hidden_act": null})", "c.json"); })
            .find("c.json: hidden_act: is null, which names no activation") != std::string::npos);
  CHECK(parse_hf_config(llama + "}", "c.json").mlp == MlpKind::gated_silu);  // absent: LlamaConfig's silu
  // Gemma's MLP reads hidden_activation, None falling back to gelu_pytorch_tanh
  const std::string gemma = R"({"model_type": "gemma", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 512,
    "hidden_act": null, "hidden_activation": null})";
  CHECK(parse_hf_config(gemma, "g.json").mlp == MlpKind::gated_gelu);
}

TEST_CASE("the table writes a small model's parameter count with a unit, never in scientific notation") {
  const auto r = test::run_cli("predict " + temp_file("tiny.yaml", kTinyYaml) + " --seq 64");
  CHECK(r.exit_code == 0);
  // kTinyYaml: embedding 256 × 64 untied twice (32,768), per layer 4 × 64 × 64 attention less the
  // kv heads' half (2 × 64 × 32 instead of 2 × 64 × 64: 12,288), 3 × 64 × 160 MLP (30,720) and two
  // norms (128), two layers (86,272), the final norm (64): 119,104
  CHECK(r.out.find("tiny · 119.104K parameters") != std::string::npos);
  CHECK(r.out.find("e-0") == std::string::npos);
}

TEST_CASE("an oom message's size past 2^64 - 1 bytes is called that, not a missing size") {
  const std::string m = message_of([] {
    (void)parse_oom_message("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 99999999999999999999.00 GiB. GPU 0 "
                            "has a total capacity of 79.19 GiB of which 10.00 GiB is free.");
  });
  CHECK(m.find("expected a size (the request) of at most 2^64 - 1 bytes") != std::string::npos);
}

TEST_CASE("a compressed snapshot is named as such; leaks reads a pickle by its bytes, whatever its name") {
  const std::string gz = test::source_path("tests/data/ep_snapshots/deepseek-v2-lite_ep2r0_bf16_none_b1s1024_L2.pickle.gz");
  for (const char* command : {"attribute ", "leaks "}) {
    const auto r = test::run_cli(command + gz);
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(r.out.find("gzip-compressed (it opens with gzip's bytes 1f 8b") != std::string::npos, command << r.out);
  }
  // the other compressions and zip (torch.save's format) by their opening bytes, whatever the name
  // (bzip2's was read as the pickle opcode 'B', a zip as a CSV whose column names were its bytes)
  const std::pair<std::string, const char*> packed[] = {
      {std::string("BZh91AY&SY"), "bzip2-compressed (it opens with bzip2's bytes 42 5a 68"},
      {std::string("\xfd" "7zXZ\0\0\x04", 8), "xz-compressed (it opens with xz's bytes fd 37 7a 58 5a 00"},
      {std::string("\x28\xb5\x2f\xfd\x24\x00"), "zstd-compressed (it opens with zstd's bytes 28 b5 2f fd"},
      {std::string("PK\x03\x04\x14\x00"), "a zip archive (it opens with zip's bytes 50 4b 03 04"}};
  for (const auto& p : packed) {
    const char* expected = p.second;
    const std::string file = temp_file("snapshot_packed.dat", p.first + std::string(64, 'x'));
    for (const char* command : {"attribute ", "leaks "}) {
      const auto r = test::run_cli(command + file);
      CHECK(r.exit_code == 2);
      CHECK_MESSAGE(r.out.find(expected) != std::string::npos, command << r.out);
    }
  }
  // a snapshot saved under another name was read as a CSV and its bytes printed as column names
  std::ifstream in(test::source_path("tests/data/snapshots/train_tiny_llama_amp_bf16_ctx_all.pickle"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 2);
  const auto as_pickle = test::run_cli("leaks " + temp_file("snapshot.pickle", bytes) + " --format json");
  const auto as_bin = test::run_cli("leaks " + temp_file("snapshot.bin", bytes) + " --format json");
  CHECK(as_bin.exit_code == as_pickle.exit_code);
  CHECK(as_bin.out == as_pickle.out);
  CHECK(as_bin.out.find("\"boundaries\"") != std::string::npos);
}

TEST_CASE("a spec read from a pipe or a FIFO is read once: its job: section applies, nothing blocks") {
  const std::string spec = temp_file("piped_job.yaml", std::string(kTinyYaml) + "job:\n  batch: 3\n  seq: 32\n  precision: bf16\n");
  const auto named = test::run_cli("predict " + spec + " --format json");
  REQUIRE(named.exit_code == 0);
  CHECK(named.out.find("\"batch\": 3") != std::string::npos);
  // the model was read from the pipe, then the job: section from it again (empty: the defaults, silently)
  auto piped = [](const std::string& command) {
    test::RunResult r{-1, ""};
    FILE* p = popen(command.c_str(), "r");
    REQUIRE(p != nullptr);
    std::array<char, 4096> buf{};
    for (std::size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) r.out.append(buf.data(), n);
    const int status = pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  };
  const auto from_pipe = piped("cat '" + spec + "' | " + MEMBUDGET_CLI + " predict /dev/stdin --format json 2>&1");
  CHECK(from_pipe.exit_code == 0);
  CHECK(from_pipe.out == named.out);
  // a FIFO blocked on its second open once the writer had closed it (timeout: a hang fails, not waits)
  const std::string fifo = temp_file("spec.fifo", "");
  std::remove(fifo.c_str());
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  for (const char* command : {" predict ", " serve "}) {
    const std::string extra = std::string(command) == " serve " ? " --device H100" : " --format json";
    const auto r = piped("(cat '" + spec + "' > '" + fifo + "' &) ; timeout 20 " + MEMBUDGET_CLI + command + "'" + fifo +
                         "'" + extra + " 2>&1");
    CHECK_MESSAGE(r.exit_code == 0, command << r.out);
    if (std::string(command) == " predict ") CHECK(r.out == named.out);
  }
  std::remove(fifo.c_str());
}

TEST_CASE("leaks reads its file once: a CSV piped in keeps every row") {
  // the sniff for a pickle read a block of the pipe, and the CSV read after it lost those rows
  std::string csv = "step,allocated\n";
  for (int i = 0; i < 3000; ++i) csv += std::to_string(i) + "," + std::to_string(1000000000 + i % 7) + "\n";
  const std::string file = temp_file("steps_piped.csv", csv);
  const auto named = test::run_cli("leaks " + file + " --format json");
  REQUIRE(named.exit_code == 0);
  CHECK(nlohmann::json::parse(named.out)["steps"] == 3000);
  FILE* p = popen(("cat '" + file + "' | " + std::string(MEMBUDGET_CLI) + " leaks /dev/stdin --format json").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  for (std::size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  CHECK(WEXITSTATUS(pclose(p)) == 0);
  CHECK(out == named.out);
}

TEST_CASE("serve checks a YAML spec's job: section as predict does (it applies none of it)") {
  const std::string bad = temp_file("serve_job_kv.yaml", std::string(kTinyYaml) + "job:\n  seq: 128\n  kv_dtype: fp8\n");
  for (const char* command : {"predict ", "serve "}) {
    const auto r = test::run_cli(command + bad + (std::string(command) == "serve " ? " --device H100" : ""));
    CHECK_MESSAGE(r.exit_code == 2, command);
    CHECK_MESSAGE(r.out.find("serve_job_kv.yaml:11: job.kv_dtype: unknown job key") != std::string::npos, command << r.out);
  }
  const std::string good = temp_file("serve_job_ok.yaml", std::string(kTinyYaml) + "job:\n  seq: 128\n  batch: 2\n");
  CHECK(test::run_cli("serve " + good + " --device H100").exit_code == 0);
}

TEST_CASE("an input's NUL byte or bidirectional control cannot cut or reorder an error message") {
  // what() is a C string: a NUL quoted from the input ended the message there
  const std::string nul = temp_file("nul_key.json", std::string("{\"per_device_train_batch_size\\u0000\": 4, \"zz_typo\": 1}"));
  auto r = test::run_cli("predict " + temp_file("tiny.yaml", kTinyYaml) + " --seq 64 --trainer-args " + nul);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.out.find("'per_device_train_batch_size\\x00', 'zz_typo' are not fields") != std::string::npos, r.out);
  CHECK(printable("a\u202Eb") == "a\\u{202E}b");
  CHECK(printable("a\u2066b\u2069") == "a\\u{2066}b\\u{2069}");
  CHECK(printable("caf\u00e9 \u2014 ok") == "caf\u00e9 \u2014 ok");  // other text as it is
}

TEST_CASE("a pipeline stage's walk is bounded: layers a rank holds × microbatches") {
  // 64 layers over 2 stages: 32 a rank; at kMaxPipelineLayerPasses / 32 microbatches the limit, one
  // more past it (405B over 2 stages at 256 took 1.5 GB and 2 s, and max-batch 3 GB)
  std::string yaml = kTinyYaml;
  yaml.replace(yaml.find("num_layers: 2"), 13, "num_layers: 64");
  ModelSpec m = parse_model_yaml(yaml, "deep.yaml");
  Job j;
  j.batch = 1;
  j.seq = 64;
  j.precision = Precision::bf16;
  j.parallel.pipeline = 2;
  const std::uint64_t at_limit = limits::kMaxPipelineLayerPasses / 32;
  j.parallel.microbatches = at_limit;
  CHECK(estimate(m, j).peak > 0);
  j.parallel.microbatches = at_limit + 1;
  const std::string past = message_of([&] { (void)estimate(m, j); });
  CAPTURE(past);
  CHECK(past.find("--microbatches " + std::to_string(at_limit + 1) + " over --pp 2: a stage rank runs 32 of tiny's decoder "
                  "layers for each of " + std::to_string(at_limit + 1) + " microbatches, more than the " +
                  std::to_string(limits::kMaxPipelineLayerPasses) + " layer passes walked") != std::string::npos);
  // uneven --pp-layers: the most loaded rank's (60 layers)
  j.parallel.pp_layers = {60, 4};
  j.parallel.microbatches = limits::kMaxPipelineLayerPasses / 60 + 1;
  CHECK(message_of([&] { (void)estimate(m, j); }).find("a stage rank runs 60 of") != std::string::npos);
  j.parallel.microbatches = limits::kMaxPipelineLayerPasses / 60;
  CHECK(estimate(m, j).peak > 0);
  // a sweep's points together: each is simulated at its own shape
  j.parallel.pp_layers.clear();
  j.parallel.microbatches = at_limit;
  SweepGrid g;
  for (std::uint64_t b = 1; b <= limits::kMaxSweepPipelineLayerPasses / limits::kMaxPipelineLayerPasses + 1; ++b)
    g.batches.push_back(b);
  CHECK(message_of([&] { (void)sweep(m, j, g); }).find("pipeline layer passes a sweep walks") != std::string::npos);
  g.batches.pop_back();
  CHECK(sweep(m, j, g).size() == g.batches.size());
}
