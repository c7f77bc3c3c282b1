// Out-of-memory messages as users pasted them, one or more per PyTorch template; the source of each
// is cited. Expected byte counts are written out as integers (nearest byte of value x unit).
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "membudget/input.hpp"
#include "membudget/oom.hpp"

using namespace membudget;

namespace {

OomReport parse(const std::string& s) { return parse_oom_message(s); }

std::string parse_error(const std::string& s) {
  try {
    parse_oom_message(s);
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::parse);
    return e.what();
  }
  FAIL("no error for: " << s);
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Two messages of GPUs 0 and 1, for the logs of several messages and ranks below.
const std::string gpu0 =
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 100.00 KiB "
    "is free. Of the allocated memory 70.00 GiB is allocated by PyTorch, and 9.00 GiB is reserved by PyTorch but "
    "unallocated.";
const std::string gpu1 =
    "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 1 has a total capacity of 79.10 GiB of which 100.00 KiB "
    "is free. Of the allocated memory 78.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but "
    "unallocated.";
// A message hard-wrapped at 60 characters, as a terminal or a log collector cuts it (at 60 these
// two are cut inside no number).
std::vector<std::string> wrap(const std::string& m) {
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < m.size(); i += 60) lines.push_back(m.substr(i, 60));
  return lines;
}
// Two wrapped messages' lines taking turns, each with its worker's prefix (a's line first).
std::string interleaved(const std::string& prefix_a, const std::vector<std::string>& a, const std::string& prefix_b,
                        const std::vector<std::string>& b) {
  std::string log;
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    if (i < a.size()) log += prefix_a + a[i] + "\n";
    if (i < b.size()) log += prefix_b + b[i] + "\n";
  }
  return log;
}

}  // namespace

// ---- <= 1.4: "... F free; C cached)" ----

TEST_CASE("pre-1.5 'cached' form") {
  // github.com/shllln/GenerativeGraph/issues/5
  auto r = parse(
      "RuntimeError: CUDA out of memory. Tried to allocate 1024.00 KiB (GPU 0; 11.17 GiB total "
      "capacity; 10.90 GiB already allocated; 576.00 KiB free; 30.96 MiB cached)");
  CHECK(r.template_version == OomTemplate::pre_1_5);
  CHECK(r.requested == 1048576);
  CHECK(r.capacity == 11993696174ull);
  CHECK(r.allocated == 11703785882ull);
  CHECK(r.free == 589824);
  CHECK(r.reserved_unallocated == 32463913);
  CHECK(r.reserved == 11703785882ull + 32463913);
  CHECK(r.reserved_derived);
  CHECK_FALSE(r.allowed);
  CHECK(r.backend == "CUDA");
  CHECK(r.gpu == 0);
}

// ---- 1.5-2.0: "(GPU 0; T total capacity; A already allocated; F free; R reserved in total ...)" ----

TEST_CASE("1.5-2.0 form wrapped over comment lines: memory held outside PyTorch") {
  // github.com/inha15/Camera_YOLOv5-HJ, E2E_Camera/scripts/clean_cache.py (a comment)
  const std::string text =
      "torch.cuda.caching_allocator_alloc(1000000)\n"
      "\n"
      "# RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total "
      "capacity; 130.35 MiB already\n"
      "# allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch) If reserved memory "
      "is >> allocated memory try\n"
      "# setting max_split_size_mb to avoid fragmentation.\n"
      "# See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF\n";
  auto r = parse(text);
  CHECK(r.template_version == OomTemplate::pre_2_1);
  CHECK(r.line == 3);
  CHECK(r.requested == 36 * MiB);
  CHECK(r.capacity == 8514772664ull);
  CHECK(r.allocated == 136681882);
  CHECK(r.free == 49345987);
  CHECK(r.reserved == 197132288);
  CHECK(r.reserved_unallocated == 197132288 - 136681882);
  CHECK(r.reserved_unallocated_derived);
  CHECK(r.non_pytorch() == 8514772664ull - 49345987 - 197132288);
  auto d = classify(r);
  CHECK(d.classification == OomClass::non_pytorch_memory);
  CHECK(contains(d.first_fix, "nvidia-smi"));
}

TEST_CASE("1.5-2.0 form: fragmentation") {
  // github.com/pytorch/pytorch/issues/35901
  auto r = parse(
      "CUDA out of memory. Tried to allocate 10.84 GiB (GPU 0; 23.65 GiB total capacity; 1.06 GiB "
      "already allocated; 10.26 GiB free; 12.53 GiB reserved in total by PyTorch)");
  CHECK(r.capacity == 25393994138ull);
  CHECK(r.reserved_unallocated == r.reserved - r.allocated);
  auto d = classify(r);
  CHECK(d.classification == OomClass::fragmentation);
  CHECK(contains(d.first_fix, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
}

TEST_CASE("1.13-2.0 torch.cuda.OutOfMemoryError prefix, request larger than the GPU") {
  // github.com/YingqianWang/iPASSR/issues/9 (Windows: allocated exceeds capacity via shared memory)
  auto r = parse(
      "Hi I ran into this problem:\n"
      "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 10.73 GiB (GPU 0; 8.00 "
      "GiB total capacity; 17.20 GiB already allocated; 0 bytes free; 19.15 GiB reserved in total "
      "by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to "
      "avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF\n"
      "How can I solve this ?");
  CHECK(r.free == 0);
  CHECK(r.capacity == 8 * GiB);
  CHECK(r.non_pytorch() == 0);  // clamped, reserved exceeds capacity
  // ... and the excess is reported, not hidden in the clamp: 0 + 19.15 GiB against 8 GiB
  CHECK(r.reserved_beyond_device() == r.reserved - 8 * GiB);
  auto d = classify(r);
  CHECK(d.classification == OomClass::shortage);
  CHECK(d.situation == "request_exceeds_device");
}

TEST_CASE("1.8-2.0 form with the allowed fraction") {
  // Constructed from the 1.8-2.0 template (CUDACachingAllocator.cpp: "F free; L allowed; R
  // reserved in total by PyTorch)"); no pasted sample with set_per_process_memory_fraction found.
  auto r = parse(
      "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 39.59 GiB total "
      "capacity; 9.50 GiB already allocated; 28.00 GiB free; 10.00 GiB allowed; 9.80 GiB reserved "
      "in total by PyTorch)");
  CHECK(r.gpu == 1);
  REQUIRE(r.allowed);
  CHECK(*r.allowed == 10 * GiB);
  CHECK(r.reserved == 10522669875ull);  // 9.80 GiB
  auto d = classify(r);
  CHECK(d.classification == OomClass::shortage);
  CHECK(d.situation == "allowed_fraction");
}

// ---- 2.1: "total capacty" ----

TEST_CASE("2.1 typo form, several processes, inside a log line") {
  // github.com/chatchat-space/Langchain-Chatchat/issues/3992
  auto r = parse(
      "2024-05-11 02:24:26,980 - es_kb_service.py[line:147] - ERROR: Error 发生 : CUDA out of "
      "memory. Tried to allocate 128.00 GiB. GPU 0 has a total capacty of 23.65 GiB of which 7.95 "
      "GiB is free. Process 1957120 has 7.10 GiB memory in use. Including non-PyTorch memory, this "
      "process has 8.58 GiB memory in use. Of the allocated memory 8.13 GiB is allocated by "
      "PyTorch, and 8.94 MiB is reserved by PyTorch but unallocated. If reserved but unallocated "
      "memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation "
      "for Memory Management and PYTORCH_CUDA_ALLOC_CONF\n");
  CHECK(r.template_version == OomTemplate::v2_1);
  CHECK(r.requested == 137438953472ull);
  CHECK(r.capacity == 25393994138ull);
  CHECK(r.free == 8536247501ull);
  REQUIRE(r.other_processes.size() == 1);
  CHECK(r.other_processes[0].pid == 1957120);
  CHECK(r.other_processes[0].in_use == 7623566950ull);
  REQUIRE(r.process_in_use);
  CHECK(*r.process_in_use == 9212704850ull);
  CHECK(r.allocated == 8729521029ull);
  CHECK(r.reserved_unallocated == 9374269);
  CHECK(r.reserved == 8729521029ull + 9374269);
  CHECK(classify(r).situation == "request_exceeds_device");
}

TEST_CASE("2.1 form with 0 bytes allocated") {
  // github.com/levihsu/OOTDiffusion/issues/167
  auto r = parse(
      "when trying to python run_ootd.py i get this error: torch.cuda.OutOfMemoryError: CUDA out "
      "of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacty of 4.00 GiB of which 2.80 "
      "GiB is free. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is "
      "reserved by PyTorch but unallocated.");
  CHECK(r.allocated == 0);
  CHECK(r.reserved == 0);
  CHECK_FALSE(r.process_in_use);
  // 1.20 GiB of a 4 GiB GPU is used outside PyTorch (a display, another application).
  CHECK(classify(r).classification == OomClass::non_pytorch_memory);
}

// ---- >= 2.2 ----

TEST_CASE("2.2+ form inside a traceback: shortage") {
  // github.com/murong-xu/CADS/issues/4
  auto r = parse(
      "  File \"x.py\", line 3, in f\n"
      "    return F.linear(input, self.weight, self.bias)\n"
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total "
      "capacity of 31.47 GiB of which 12.73 GiB is free. Including non-PyTorch memory, this "
      "process has 18.73 GiB memory in use. Of the allocated memory 9.08 GiB is allocated by "
      "PyTorch, and 9.35 GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
      "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
      "fragmentation.  See documentation for Memory Management  "
      "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
      "\n"
      "During handling of the above exception, another exception occurred:\n");
  CHECK(r.template_version == OomTemplate::v2_2_plus);
  CHECK(r.line == 3);
  CHECK(r.process_in_use);
  auto d = classify(r);
  CHECK(d.classification == OomClass::shortage);
  CHECK(d.situation == "shortage");
  CHECK_FALSE(contains(d.explanation, "may also help"));  // 12.73 + 9.35 GiB < 22.78 GiB
}

TEST_CASE("2.2+ form, GPU 1, 'Process PID' (a container sees itself under another PID)") {
  // vllm-project/vllm issue "meta-llama/Llama-4-Scout-17B-16E-Instruct not supported on VLLM,
  // 2xH100 NVL 196GB", as quoted in a summary found through the code search
  auto r = parse(
      "VllmWorker rank=1 pid=254) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
      "1.25 GiB. GPU 1 has a total capacity of 93.02 GiB of which 1.18 GiB is free. Process "
      "2752205 has 91.82 GiB memory in use. Of the allocated memory 90.63 GiB is allocated by "
      "PyTorch, and 120.54 MiB is reserved by PyTorch but unallocated. If reserved but "
      "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
      "to avoid fragmentation. See documentation for Memory Management");
  CHECK(r.gpu == 1);
  REQUIRE(r.other_processes.size() == 1);
  CHECK(r.other_processes[0].pid == 2752205);
  OomContext first{.step = 0};
  CHECK(classify(r, first).classification == OomClass::shortage);
  CHECK(classify(r, first).situation == "first_steps");
  OomContext later{.step = 40};
  CHECK(classify(r, later).situation == "after_steps_that_fit");
  CHECK(classify(r, {.phase = OomPhase::eval}).situation == "eval_only");
  CHECK(contains(classify(r, {.phase = OomPhase::eval}).first_fix, "inference_mode"));
  CHECK(classify(r, {.long_sequences_only = true}).situation == "long_sequences");
}

TEST_CASE("2.2+ message quoted one sentence per line, without its first sentence") {
  // A debugging guide found through the code search (its section "4.1 VRAM math")
  auto r = parse(
      "When `torch.OutOfMemoryError` says:\n\n```\nTried to allocate 15.00 GiB.\n"
      "GPU 0 has a total capacity of 14.56 GiB of which 6.91 GiB is free.\n"
      "Including non-PyTorch memory, this process has 7.65 GiB memory in use.\n"
      "Of the allocated memory 7.23 GiB is allocated by PyTorch,\n"
      "and 301.94 MiB is reserved by PyTorch but unallocated.\n```\n");
  CHECK(r.backend == "unknown");
  CHECK(r.requested == 15 * GiB);
  CHECK(classify(r).situation == "request_exceeds_device");
}

TEST_CASE("HIP, fragmentation") {
  // github.com/pytorch/pytorch/issues/138002
  auto r = parse(
      "!!! Exception during processing !!! HIP out of memory. Tried to allocate 6.64 GiB. GPU 0 "
      "has a total capacity of 19.92 GiB of which 6.22 GiB is free. Of the allocated memory 5.34 "
      "GiB is allocated by PyTorch, and 7.10 GiB is reserved by PyTorch but unallocated. If "
      "reserved but unallocated memory is large try setting "
      "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.");
  CHECK(r.backend == "HIP");
  CHECK(r.requested == 7129645711ull);
  CHECK(r.capacity == 21388937134ull);
  CHECK(r.free == 6678674145ull);
  CHECK(r.allocated == 5733781340ull);
  CHECK(r.reserved_unallocated == 7623566950ull);
  auto d = classify(r);
  CHECK(d.classification == OomClass::fragmentation);
  CHECK(d.situation == "fragmentation");
}

TEST_CASE("HIP with allowed fraction and CUDA-graph private pools, in a CI log") {
  // github.com/ROCm/TheRock/issues/2118
  auto r = parse(
      "2025-11-12T11:25:13.4961658Z FAILED [0.0005s] test_autograd.py::TestAutogradDeviceTypeCUDA"
      "::test_inplace_on_view_multi_output_safe_cuda - torch.OutOfMemoryError: HIP out of memory. "
      "Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 255.98 GiB of which 244.65 GiB "
      "is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is allocated by PyTorch, "
      "with 17.00 MiB allocated in private pools (e.g., HIP Graphs), and 54.99 MiB is reserved by "
      "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.");
  CHECK(r.requested == 2 * MiB);
  CHECK(r.capacity == 274856432108ull);
  CHECK(r.free == 262690937242ull);
  REQUIRE(r.allowed);
  CHECK(*r.allowed == 1127428915ull);
  REQUIRE(r.private_pools);
  CHECK(*r.private_pools == 17825792);
  CHECK(r.allocated == 1066412278ull);
  CHECK(r.reserved_unallocated == 57661194);
  CHECK(r.reserved == 1066412278ull + 57661194);
  auto d = classify(r);
  CHECK(d.classification == OomClass::shortage);
  CHECK(d.situation == "allowed_fraction");
}

TEST_CASE("torchrun rank prefixes and a hard wrap in the middle of a word") {
  // Constructed from the murong-xu/CADS#4 message as torchrun prints it, wrapped at 80 columns.
  auto r = parse(
      "[rank0]: Traceback (most recent call last):\n"
      "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 "
      "has a t\n"
      "[rank0]: otal capacity of 31.47 GiB of which 12.73 GiB is free. Including non-PyTorch mem\n"
      "[rank0]: ory, this process has 18.73 GiB memory in use. Of the allocated memory 9.08 GiB i\n"
      "[rank0]: s allocated by PyTorch, and 9.35 GiB is reserved by PyTorch but unallocated.\n");
  CHECK(r.line == 2);
  CHECK(r.process_in_use);
  CHECK(r.reserved_unallocated == 10039486054ull);  // 9.35 GiB
}

TEST_CASE("the first complete message wins; a truncated earlier one is skipped") {
  auto r = parse(
      "CUDA out of memory. Tried to allocate 764.00 MiB\n"
      "... retrying ...\n"
      "CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 79.10 GiB "
      "of which 100.00 KiB is free. Of the allocated memory 70.00 GiB is allocated by PyTorch, "
      "and 9.00 GiB is reserved by PyTorch but unallocated.");
  CHECK(r.requested == 512 * MiB);
  CHECK(r.line == 3);
  CHECK(r.free == 100 * KiB);
  CHECK(classify(r).classification == OomClass::fragmentation);
}

TEST_CASE("every message is read, in line order; interleaved torchrun ranks are read apart") {
  const auto two = parse_oom_messages(gpu0 + "\nTraceback ...\n" + gpu1 + "\n");
  REQUIRE(two.size() == 2);
  CHECK(two[0].gpu == 0);
  CHECK(two[0].line == 1);
  CHECK(two[1].gpu == 1);
  CHECK(two[1].line == 3);
  CHECK(two[1].requested == 8 * GiB);
  CHECK(!two[0].rank);
  CHECK(classify(two[0]).classification == OomClass::fragmentation);
  CHECK(classify(two[1]).classification == OomClass::shortage);
  // torchrun interleaves the ranks' lines, each message wrapped at 60 characters
  const auto r0 = wrap(gpu0), r1 = wrap(gpu1);
  std::string log = "W1207 launcher: sending SIGTERM\n";
  for (std::size_t i = 0; i < std::max(r0.size(), r1.size()); ++i) {
    if (i < r1.size()) log += "[rank1]: " + r1[i] + "\n";
    if (i < r0.size()) log += "[rank0]: " + r0[i] + "\n";
  }
  const auto ranks = parse_oom_messages(log);
  REQUIRE(ranks.size() == 2);
  CHECK(ranks[0].rank == 1);  // its first line comes first
  CHECK(ranks[0].line == 2);
  CHECK(ranks[0].requested == 8 * GiB);
  CHECK(ranks[1].rank == 0);
  CHECK(ranks[1].line == 3);
  CHECK(ranks[1].reserved_unallocated == 9 * GiB);
  CHECK(nlohmann::json::parse(to_json(ranks[1]))["rank"] == 0);
  CHECK(!nlohmann::json::parse(to_json(two[0])).contains("rank"));
  // past limits::kMaxOomMessages starts the reading stops, and says so
  std::string flood;
  for (int i = 0; i < limits::kMaxOomMessages + 10; ++i) flood += gpu0 + "\n";
  bool stopped = false;
  CHECK(parse_oom_messages(flood, &stopped).size() == static_cast<std::size_t>(limits::kMaxOomMessages));
  CHECK(stopped);
  CHECK(parse_oom_messages(gpu0, &stopped).size() == 1);
  CHECK(!stopped);
  // one rank's lines alone read as before: the prefix is stripped
  CHECK(parse_oom_message("[rank3]: " + gpu0).line == 1);
  CHECK(parse_oom_message("[rank3]: " + gpu0).rank == 3);
}

TEST_CASE("torchrun's other tags, a timestamp before the tag, and a launcher's line inside a message") {
  const auto r0 = wrap(gpu0), r1 = wrap(gpu1);
  // --tee 3: "[default<local rank>]:", each line taking turns (read as one text, the two mixed)
  const std::string tee = interleaved("[default0]:", r0, "[default1]:", r1);
  const auto workers = parse_oom_messages(tee);
  REQUIRE(workers.size() == 2);
  CHECK(workers[0].worker == "default0");
  CHECK(!workers[0].rank);
  CHECK(workers[0].requested == 2 * GiB);
  CHECK(workers[1].worker == "default1");
  CHECK(workers[1].requested == 8 * GiB);
  CHECK(nlohmann::json::parse(to_json(workers[1]))["worker"] == "default1");
  // --tee over init_process_group's excepthook: the worker's tag, then the global rank's
  const std::string both = interleaved("[default0]:[rank4]: ", r0, "[default1]:[rank5]: ", r1);
  const auto tee_ranks = parse_oom_messages(both);
  REQUIRE(tee_ranks.size() == 2);
  CHECK(tee_ranks[0].worker == "default0");
  CHECK(tee_ranks[0].rank == 4);
  CHECK(tee_ranks[1].worker == "default1");
  CHECK(tee_ranks[1].rank == 5);
  CHECK(tee_ranks[1].requested == 8 * GiB);
  // a log collector's timestamp before each tag
  const std::string stamped =
      interleaved("2026-12-07 12:00:01,123 [rank0]: ", r0, "[2026-12-07T12:00:00.5Z] [rank1]: ", r1);
  const auto ranks = parse_oom_messages(stamped);
  REQUIRE(ranks.size() == 2);
  CHECK(ranks[0].rank == 0);
  CHECK(ranks[0].reserved_unallocated == 9 * GiB);
  CHECK(ranks[1].rank == 1);
  CHECK(ranks[1].requested == 8 * GiB);
  // one rank's message with the launcher's untagged warning between its lines
  std::string one;
  for (std::size_t i = 0; i < r0.size(); ++i) {
    one += "[rank0]: " + r0[i] + "\n";
    if (i == 1) one += "W1207 12:00:00.000000 123 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 7 closing signal SIGTERM\n";
  }
  const auto alone = parse_oom_messages(one);
  REQUIRE(alone.size() == 1);
  CHECK(alone[0].rank == 0);
  CHECK(alone[0].line == 1);
  CHECK(alone[0].reserved_unallocated == 9 * GiB);
  // a copy whose continuation lines lost their tag reads whole, as before
  const auto lost = parse_oom_messages("[rank2]: " + r0[0] + "\n" + gpu0.substr(60) + "\n");
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].requested == 2 * GiB);
  CHECK(!lost[0].rank);
  // only the first line tagged, the wrap right after the first sentence: the untagged rest read
  // alone found a message without its backend; the whole input reads it with its backend
  const std::string hip =
      "[rank0]: torch.OutOfMemoryError: HIP out of memory.\nTried to allocate 6.64 GiB. GPU 0 has a total capacity of "
      "19.92 GiB of which 6.22 GiB is free. Of the allocated memory 5.34 GiB is allocated by PyTorch, and 7.10 GiB is "
      "reserved by PyTorch but unallocated.\n";
  const auto first_only = parse_oom_messages(hip);
  REQUIRE(first_only.size() == 1);
  CHECK(first_only[0].backend == "HIP");
  CHECK(first_only[0].line == 1);
  // one rank whole, another's continuation lines untagged: both read (one went unreported)
  std::string two_ranks;
  for (const auto& l : r0) two_ranks += "[rank0]: " + l + "\n";
  two_ranks += "[rank1]: " + r1[0] + "\n";
  for (std::size_t i = 1; i < r1.size(); ++i) two_ranks += r1[i] + "\n";
  const auto both_read = parse_oom_messages(two_ranks);
  REQUIRE(both_read.size() == 2);
  CHECK(both_read[0].reserved_unallocated == 9 * GiB);
  CHECK(both_read[1].requested == 8 * GiB);
  // a bracket that is no tag is text
  const OomReport untagged = parse_oom_message("[rank]: " + gpu0);
  CHECK(!untagged.rank);
  CHECK(untagged.worker.empty());
  const OomReport long_number = parse_oom_message("[rank12345678901]: " + gpu0);  // (ten digits: no tag)
  CHECK(!long_number.rank);
  CHECK(long_number.requested == 2 * GiB);
}

TEST_CASE("sizes: units, bytes and exact rounding") {
  auto msg = [](const std::string& req) {
    return "CUDA out of memory. Tried to allocate " + req +
           ". GPU 0 has a total capacity of 1.00 TiB of which 0 B is free. Of the allocated "
           "memory 1024 bytes is allocated by PyTorch, and 0.01 KiB is reserved by PyTorch but "
           "unallocated.";
  };
  CHECK(parse(msg("1.50 GiB")).requested == 1610612736ull);
  CHECK(parse(msg("512.00 MiB")).requested == 536870912ull);
  CHECK(parse(msg("20.00 KiB")).requested == 20480);
  CHECK(parse(msg("100 bytes")).requested == 100);
  CHECK(parse(msg("100 B")).requested == 100);
  CHECK(parse(msg("130206.04 GiB")).requested == 139807670885417ull);
  auto r = parse(msg("1 bytes"));
  CHECK(r.capacity == 1024 * GiB);
  CHECK(r.free == 0);
  CHECK(r.allocated == 1024);
  CHECK(r.reserved_unallocated == 10);  // 10.24 rounds to 10
}

TEST_CASE("garbage and near misses are parse errors that say why") {
  CHECK(contains(parse_error(""), "no PyTorch out-of-memory message"));
  CHECK(contains(parse_error("hello world\nout of memory\n"), "no PyTorch out-of-memory message"));
  CHECK(contains(parse_error("RuntimeError: CUDA error: out of memory\nCUDA kernel errors"),
                 "outside PyTorch's caching allocator"));
  std::string cut = parse_error(
      "line one\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 764.00 MiB");
  CHECK(contains(cut, "line 2"));
  CHECK(contains(cut, "'(GPU' or '. GPU'"));
  std::string bad = parse_error(
      "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of lots");
  CHECK(contains(bad, "the total capacity"));
  CHECK(contains(parse_error("CUDA out of memory. Tried to allocate 99999999999999999999 GiB."),
                 "the request"));
}

TEST_CASE("to_json carries the figures, the class and the first fix") {
  auto r = parse(
      "HIP out of memory. Tried to allocate 6.64 GiB. GPU 0 has a total capacity of 19.92 GiB of "
      "which 6.22 GiB is free. Of the allocated memory 5.34 GiB is allocated by PyTorch, and 7.10 "
      "GiB is reserved by PyTorch but unallocated.");
  const auto j = nlohmann::json::parse(to_json(r));
  CHECK(j["requested"] == 7129645711ull);
  CHECK(j["capacity"] == 21388937134ull);
  CHECK(j["free"] == 6678674145ull);
  CHECK(j["allocated"] == 5733781340ull);
  CHECK(j["reserved_unallocated"] == 7623566950ull);
  CHECK(j["reserved"] == 5733781340ull + 7623566950ull);
  CHECK(j["classification"] == "fragmentation");
  CHECK(contains(j["first_fix"].get<std::string>(), "expandable_segments:True"));
  CHECK(j["process_in_use"].is_null());
  CHECK(j["allowed"].is_null());
  CHECK(j["template"] == "2.2+");
  CHECK(j["backend"] == "HIP");
  CHECK(j["derived"] == nlohmann::json::array({"reserved"}));
  CHECK(j["reserved_beyond_device"] == 0);
}

TEST_CASE("oom: figures that exceed the card are shown as such, not as nothing outside PyTorch") {
  const std::string text =
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
      "of which 0 bytes is free. Including non-PyTorch memory, this process has 79.18 GiB memory in use. Of the "
      "allocated memory 78.00 GiB is allocated by PyTorch, and 90.00 GiB is reserved by PyTorch but unallocated.";
  const auto r = parse(text);
  CHECK(r.non_pytorch() == 0);
  CHECK(r.reserved_beyond_device() == r.reserved - r.capacity);
  CHECK(nlohmann::json::parse(to_json(r))["reserved_beyond_device"].get<std::uint64_t>() == r.reserved - r.capacity);
  const auto cli = test::run_cli("oom \"" + text + "\"");
  CHECK(cli.exit_code == 0);
  CHECK(cli.out.find("unknown: free + reserved exceed the capacity by 88.81 GiB") != std::string::npos);
}
