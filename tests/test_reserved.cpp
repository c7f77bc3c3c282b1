// Reserved memory: the simulated step replayed through the caching allocator (src/model/reserved.cpp)
// against torch.cuda.memory_reserved() after the last measured (steady) step of every committed
// PyTorch measurement (tests/data/torch_train_*.json), and the PYTORCH_CUDA_ALLOC_CONF parser.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "measured_model.hpp"
#include "membudget/api.hpp"
#include "membudget/budget.hpp"
#include "model/autograd_sim.hpp"
#include "model/reserved.hpp"

using namespace membudget;

namespace {

struct Err {
  std::string name;
  double err;
};

// Every ok case of the file: predicted reserved_peak against the last step's `reserved`.
// The case's last measured step (its steady state).
nlohmann::json last_step(const nlohmann::json& c) {
  nlohmann::json last;
  for (const auto& s : c["steps"])
    if (s.value("phase", "") == "done") last = s;
  REQUIRE(!last.is_null());
  return last;
}

std::vector<Err> reserved_errors(const char* rel) {
  std::ifstream in(test::source_path(rel));
  REQUIRE(in.good());
  const auto data = nlohmann::json::parse(in);
  std::vector<Err> out;
  for (const auto& c : data["cases"]) {
    if (c["status"] != "ok") continue;
    const auto& j = c["job"];
    const ModelSpec m = test::model_as_measured(j);
    const Job job = test::job_as_measured(j);
    PredictOptions po;
    po.reserved = true;
    po.allocator_conf = test::allocator_conf_as_measured(data);
    const Budget b = predict(m, job, po);
    const nlohmann::json last = last_step(c);
    const double measured = last["reserved"].get<double>();
    const double predicted = static_cast<double>(b.reserved_peak);
    out.push_back({c["name"].get<std::string>(), (predicted - measured) / measured});
    if (std::getenv("MEMBUDGET_RESERVED_VERBOSE"))  // one line per case
      std::printf("%+7.2f%%  %s  [%s]\n", out.back().err * 100, out.back().name.c_str(), rel);
  }
  return out;
}

// The cases of several files, one after the other.
std::vector<Err> reserved_errors(std::initializer_list<const char*> files) {
  std::vector<Err> out;
  for (const char* f : files) {
    const auto errs = reserved_errors(f);
    out.insert(out.end(), errs.begin(), errs.end());
  }
  return out;
}

// The names of the tensors the trace allocates from event `from` on.
std::vector<std::string> allocated_since(const membudget::detail::AutogradSim& sim, const membudget::detail::SimTrace& trace,
                                         std::size_t from) {
  std::vector<std::string> out;
  for (std::size_t k = from; k < trace.events.size(); ++k)
    if (trace.events[k].t >= 0) out.push_back(sim.info(trace.events[k].t).name);
  return out;
}

// CHECKs every case within `bound`; returns how many are within `tight`.
int count_within(const std::vector<Err>& errs, double bound, double tight) {
  int within = 0;
  for (const Err& e : errs) {
    CAPTURE(e.name);
    CHECK(std::fabs(e.err) <= bound);
    within += std::fabs(e.err) <= tight;
  }
  return within;
}

}  // namespace

// The measured distribution (2026-12-01, every case of the seven files): see docs/accuracy.md.
TEST_CASE("reserved_peak against memory_reserved() after the steady step, every committed case") {
  const char* files[] = {"tests/data/torch_train_h200.json",          "tests/data/torch_train_holdout_h200.json",
                         "tests/data/torch_train_8b_class_h200.json", "tests/data/torch_train_lora_h200.json",
                         "tests/data/torch_train_gemma2_long_h200.json", "tests/data/torch_train_smoke_h200.json"};
  std::vector<Err> all;
  for (const char* f : files) {
    auto e = reserved_errors(f);
    all.insert(all.end(), e.begin(), e.end());
  }
  std::sort(all.begin(), all.end(), [](const Err& a, const Err& b) { return std::fabs(a.err) < std::fabs(b.err); });
  int within1 = 0, within3 = 0, within5 = 0;
  for (const Err& e : all) {
    within1 += std::fabs(e.err) <= 0.01;
    within3 += std::fabs(e.err) <= 0.03;
    within5 += std::fabs(e.err) <= 0.05;
  }
  MESSAGE(all.size() << " cases: " << within1 << " within 1%, " << within3 << " within 3%, " << within5
                     << " within 5%; worst " << all.back().err * 100 << "% (" << all.back().name << ")");
  CHECK(all.size() >= 100);
  // These files ran many cases in one process, and a process keeps what its earlier cases left:
  // cached segments, and above all the two cuBLAS workspaces its first case allocated at its first
  // matmuls (empty_cache does not free them). The replay places them as a fresh process does (at
  // step 0's first matmul of each thread), so a later case of such a file can differ from the
  // replay by a placement the fresh process would not have: the test below measures the worst of
  // them alone. 2026-12-02: 93 of 104 within 3% (97 before the workspaces moved to their first
  // matmul), every case within 10.3%; the fresh-process measurements of the misses are within
  // 0.3% but one (docs/accuracy.md). The bars hold what is measured, so that a regression shows.
  CHECK(within3 >= 93);
  for (const Err& e : all) {
    CAPTURE(e.name);
    CHECK(std::fabs(e.err) <= 0.105);
  }
}

// Mixtures of experts (tests/data/torch_train_moe_h200.json: Qwen3-30B-A3B, Qwen1.5-MoE and OLMoE at
// 4 layers, Mixtral and the DeepSeeks at 2; torch_train_moe_impl_h200.json: the eager and
// batched_mm experts and the auxiliary loss) and the optimizer implementations
// (torch_train_optimizer_impl_h200.json: foreach, fused and for-loop AdamW, SGD with momentum,
// Adafactor on Llama 3.2 1B and Qwen2.5 1.5B), each file measured in one process (the cases beyond
// 3% were measured again alone: the next test). 2026-12-03: MoE 26 of 26 and 18 of 21 within 3%,
// every case within 6.4% (the 2-layer amp-bf16 eager and batched_mm steps up to +6.3%; the bf16
// eager Qwen3-30B-A3B −5.4% before the mask's sum counted one mask-sized temporary, not two; Qwen3-30B-A3B
// amp-bf16 full was +3.6% before the adds handed their gradient through, Mixtral bf16 full +4.4%
// before grouped_mm's weight gradient came first); optimizer implementations 27 of 36 within 3%,
// every case within 6.5% (Llama 3.2 1B's amp-bf16 for-loop Adafactor −6.5%, 0.00% alone; Qwen2.5's
// SGD with momentum +3.1% to +3.4%; the for-loop AdamW, +7.0% before the replay ran its temporaries
// one parameter at a time, is within 0.4%, and the bf16 for-loop Adafactor, +10.4% before the
// replay ran its loop parameter by parameter, 0.00%: docs/accuracy.md).
TEST_CASE("reserved_peak of MoE steps and of every optimizer implementation") {
  struct File {
    const char* path;
    std::size_t cases;
    int within3;
    double worst;
  };
  // 2026-12-03, since the replay follows autograd's engine closely (docs/accuracy.md, "The step as
  // autograd runs it"): Qwen3-30B-A3B's 4-layer amp-bf16 full-recompute step +3.55% in its file
  // (0.00% alone, below); OLMoE's 4-layer bf16 full recompute with the auxiliary loss, −6.3% then,
  // +0.57% since the MoE block follows its whole-run snapshot (tests/data/inprocess_alone/, −0.01%
  // alone there).
  for (const File& f : {File{"tests/data/torch_train_moe_h200.json", 26, 25, 0.04},
                        File{"tests/data/torch_train_moe_impl_h200.json", 21, 18, 0.065},
                        File{"tests/data/torch_train_optimizer_impl_h200.json", 36, 27, 0.066}}) {
    CAPTURE(f.path);
    const auto errs = reserved_errors(f.path);
    CHECK(errs.size() == f.cases);
    int within3 = 0;
    for (const Err& e : errs) {
      CAPTURE(e.name);
      CHECK(std::fabs(e.err) <= f.worst);
      within3 += std::fabs(e.err) <= 0.03;
      }
    CHECK(within3 >= f.within3);
  }
}

// The same seven steps measured in one H200 run with the default allocator and with
// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (tools/device/reserved_run.sh). 2026-12-02: 13 of
// the 14 within 0.3%; Llama 3.2 1B bf16 full recompute with expandable segments is +4.02%. (Before
// the cuBLAS workspaces moved to their first matmul: 11 of 14 within 0.3%, Qwen2.5 1.5B −2.79%,
// +3.28% and −3.62%.)
// 2026-12-03, since the rotary embedding's matmul takes step 0's cuBLAS workspace: 12 of 14,
// Qwen2.5 1.5B amp-bf16 full recompute at 2 × 2048 with expandable segments −3.5% in this process
// (+0.38% measured alone, below).
TEST_CASE("reserved_peak with and without expandable segments, the same steps") {
  for (const char* f : {"tests/data/torch_train_reserved_h200.json", "tests/data/torch_train_reserved_expandable_h200.json"}) {
    CAPTURE(f);
    const auto errs = reserved_errors(f);
    CHECK(errs.size() == 7);
    CHECK(count_within(errs, 0.045, 0.005) >= 5);
  }
}

// The same seven steps, each measured alone in a fresh process, as a user's run starts
// (tools/device/reserved_expandable_alone_run.sh, tests/data/reserved_expandable_alone/, with a
// whole-run snapshot of the Qwen2.5 step each way). 2026-12-03: 13 of 14 within 0.2% (Qwen2.5 1.5B
// amp-bf16 full recompute with expandable segments +0.19%, +0.38% before the replay followed
// autograd's engine). The same step without them was +3.2%, its snapshot's allocations and frees
// the replay's in sizes, event for event; taken for an address tie, it was the MLP product's two
// equal gradients made in the other order, and since MulBackward0 computes `other`'s first
// (2026-12-04) it is −0.01%, all 14 within 0.2% (docs/accuracy.md, "The ties").
TEST_CASE("reserved_peak with and without expandable segments, each step measured alone") {
  const auto plain = reserved_errors("tests/data/reserved_expandable_alone/torch_train_reserved_alone_default_h200.json");
  CHECK(plain.size() == 7);
  CHECK(count_within(plain, 0.005, 0.005) == 7);
  const auto expandable = reserved_errors("tests/data/reserved_expandable_alone/torch_train_reserved_alone_expandable_h200.json");
  CHECK(expandable.size() == 7);
  CHECK(count_within(expandable, 0.005, 0.005) == 7);
}

// Expandable segments on the kinds of single-GPU step the seven above are not: LoRA, two MoE models
// (OLMoE's grouped_mm experts; Qwen3-30B-A3B's eager experts under full recompute), fused AdamW and
// for-loop Adafactor, each alone in a fresh process with a whole-run snapshot
// (tools/device/expandable_more_run.sh 2, tests/data/expandable_more/). 2026-12-04: LoRA +8.98% and
// Adafactor +7.56% until the best fit followed c10's for expandable segments (a free block at the
// end of the mapped pages counts as the size it can grow to: allocator.cpp,
// get_free_expandable_block); now four of five 0.00%, the eager experts −1.15% (their routed
// token counts are the run's random router's, the replay's balanced: docs/moe.md).
TEST_CASE("reserved_peak with expandable segments: LoRA, MoE and optimizer implementations, each measured alone") {
  const auto errs = reserved_errors("tests/data/expandable_more/torch_train_expandable_more_h200.json");
  CHECK(errs.size() == 5);
  CHECK(count_within(errs, 0.015, 0.0005) >= 4);
}

// Single-GPU steps measured in fresh processes, as a user's run starts
// (tools/device/reserved_fresh_run.sh: tests/data/reserved_fresh/, the nine steps the table above
// misses by the most, each alone; tools/device/reserved_full_run.sh: tests/data/reserved_snapshots/,
// four full-recompute steps one after another in one process, the first alone). 2026-12-02: 12 of 13 within 0.33%, most to the MiB; Llama 3.1 8B bf16 full
// recompute at 4 × 4096 is +3.97% (docs/accuracy.md). Before the replay placed each thread's cuBLAS
// workspace at its first matmul and computed a linear's weight gradient before its input's, Llama
// 3.2 1B SGD was −9.6%, Llama 3.1 8B at 8,192 tokens −4.5% and Llama 3.2 3B +2.8%.
TEST_CASE("reserved_peak of single-GPU steps measured in fresh processes") {
  const auto errs = reserved_errors({"tests/data/reserved_snapshots/reserved_full_h200.json",
                                     "tests/data/reserved_fresh/torch_train_reserved_fresh_h200.json"});
  CHECK(errs.size() == 13);
  // 2026-12-03, since the replay follows autograd's engine (docs/accuracy.md): all 13 within 0.5%,
  // most to the MiB. Before, Qwen2.5 1.5B amp-bf16 full was −3.2%, Qwen2.5 7B bf16 full −2.7% and
  // Llama 3.1 8B bf16 full at 4 × 4096 +4.0% (their whole-run snapshots are in
  // tests/data/handthrough_snapshots/ and tests/data/reserved_8b_snapshot/).
  CHECK(count_within(errs, 0.005, 0.005) == 13);
}

// The MoE, experts-implementation and optimizer-implementation steps that the replay missed by
// more than 3% when their files ran many cases in one process, each measured again alone in a fresh
// process with a whole-run snapshot (tools/device/alone_run.sh with tools/matrices/reserved_alone_h200.json, tests/data/reserved_alone/).
// 2026-12-03: 11 of 13 within 0.5%, the for-loop AdamW among them (−4.7% in amp-bf16 and +6.8% in
// bf16 before the replay ran its temporaries one parameter at a time, as its snapshots show), the
// for-loop Adafactor (+10.4% in bf16 before its loop ran parameter by parameter) and Qwen3-30B-A3B's
// bf16 eager experts (−5.4% before the mask's sum counted one mask-sized temporary, not two: the
// backward's cuBLAS workspace then lands where the run's does); its amp-bf16 eager experts +1.5% and
// its 4-layer amp-bf16 full-recompute step −3.5%.
// 2026-12-03, later: 12 of 13 within 0.2%, the 4-layer full-recompute step 0.00% (−3.5% before the
// replay followed autograd's engine); the amp-bf16 eager experts +1.5%.
TEST_CASE("reserved_peak of MoE and optimizer-implementation steps measured alone") {
  const auto errs = reserved_errors("tests/data/reserved_alone/torch_train_reserved_alone_h200.json");
  CHECK(errs.size() == 13);
  CHECK(count_within(errs, 0.016, 0.002) >= 12);
}

// Held out from the engine-order work (docs/accuracy.md, "The step as autograd runs it"): seven
// steps of models and shapes it did not look at, predicted first and then each measured alone in a
// fresh process with a whole-run snapshot (tools/device/alone_run.sh with
// tools/matrices/engine_holdout_h200.json, tests/data/engine_holdout/). 2026-12-03: the snapshots'
// large-pool streams and the predicted ones differ in at most 1 of their first 6,000 entries; six
// reserved figures within 0.03%, five to the MiB; Gemma 2 2B amp-bf16 full recompute −3.8% (one
// 2,000 MiB segment fewer). 2026-12-04: all seven within 0.03%, Gemma 2's 0.00%, since its scaled
// embedding frees the unscaled lookup as the module returns (its construction-to-step snapshot,
// tests/data/inprocess_alone/*_build; inventory_torch.cpp, embed_tokens).
TEST_CASE("reserved_peak of held-out steps measured alone") {
  const auto errs = reserved_errors("tests/data/engine_holdout/torch_train_engine_holdout_h200.json");
  CHECK(errs.size() == 7);
  CHECK(count_within(errs, 0.0004, 0.0004) == 7);
}

// The two single-GPU steps still missed by more than 3% alone, measured again with the model's
// construction recorded (tools/device/inprocess_alone_run.sh 7, tests/data/inprocess_alone/):
// Gemma 2 2B amp-bf16 full 1 × 2048 0.00%; Qwen2.5 1.5B amp-bf16 full 2 × 2048 −0.01% since
// MulBackward0 computes `other`'s gradient first (2026-12-04; +3.17% before, when its stream
// matched the run's in sizes but up_proj's backward freed the MLP product's other gradient:
// docs/accuracy.md, "The ties").
TEST_CASE("reserved_peak of the steps measured with their construction recorded") {
  const auto errs = reserved_errors("tests/data/inprocess_alone/torch_train_construction_snapshots_single_h200.json");
  CHECK(errs.size() == 2);
  CHECK(count_within(errs, 0.001, 0.001) == 2);
}

// The steps of the files above that the replay missed by more than 3% in their one process and
// that had no measurement alone, each measured alone in a fresh process with a whole-run snapshot
// (tools/device/inprocess_alone_run.sh and inprocess_alone2_run.sh, tests/data/inprocess_alone/).
// 2026-12-03: all 8 within 0.3%. Six were within 0.25% as the replay stood; OLMoE's 4-layer bf16
// full recompute with the auxiliary loss was −6.8% and Qwen1.5-MoE's 4-layer bf16 full recompute
// +6.3% until the MoE block followed their snapshots: IndexBackward0 makes no copy of an already
// contiguous gradient and sorts after it, the weighting and the shared expert's gating multiply
// their second factor first with the first's product reduced after the node, the MoE block's
// linears take 2-D inputs (their gradients summed in place), the router softmax's backward holds a
// second T × E buffer, the aux loss's column sum stages as the reduction kernel does and the
// logits live until the forward returns, OLMoE's q/k/v views come after v_proj.
// 2026-12-04: the last two of them never measured alone (Qwen2.5 1.5B's SGD with momentum, amp-bf16
// for-loop and bf16 fused, +3.4% and +3.1% in their process; tools/device/expandable_more_run.sh 1):
// −0.01% and −0.02%. Since MulBackward0 computes `other`'s gradient first (2026-12-04),
// Qwen1.5-MoE's is +0.70% (−0.08% before): its stream still lacks the sliding-window mask's 16 MiB
// transients, and the blocks fall otherwise.
TEST_CASE("reserved_peak of the in-process misses, each measured alone") {
  const auto errs = reserved_errors({"tests/data/inprocess_alone/torch_train_inprocess_alone_h200.json",
                                     "tests/data/inprocess_alone/torch_train_inprocess_alone2_h200.json",
                                     "tests/data/inprocess_alone/torch_train_inprocess_alone3_h200.json"});
  CHECK(errs.size() == 10);
  CHECK(count_within(errs, 0.01, 0.005) >= 9);
}

// The for-loop optimizers, each step alone in a fresh process: Adafactor on five architectures
// (tests/data/adafactor_loop/: Qwen2.5 1.5B, Phi-3 mini at 8 layers, Gemma 2 2B, Qwen3-30B-A3B at 2
// layers, TinyLlama in amp-bf16) and AdamW over a wide MLP (tests/data/adamw_loop/): the replay runs
// each loop allocation by allocation. 2026-12-03: every one within 0.05%.
TEST_CASE("reserved_peak of the for-loop optimizers on more architectures, each measured alone") {
  const auto errs = reserved_errors({"tests/data/adafactor_loop/torch_train_adafactor_loop_h200.json",
                                     "tests/data/adamw_loop/torch_train_adamw_loop_h200.json"});
  CHECK(errs.size() == 7);
  CHECK(count_within(errs, 0.005, 0.001) >= 7);
}

// What the replay is fed: the trace's order of allocations around a thread's first matmul, and a
// model built on the meta device.
TEST_CASE("the trace: a thread's cuBLAS workspace follows its first matmul's output; meta parameters allocate nothing") {
  using namespace membudget::detail;
  AutogradSim sim(false);
  SimTrace trace;
  sim.record_to(&trace);
  const TensorId w = sim.meta_param("weight", 4 * MiB, Term::model_states, "bf16");
  CHECK(trace.events.empty());  // on the meta device: no allocation yet
  CHECK(!sim.storage_alive(w));
  sim.restore_storage(w);  // its first all-gather
  const TensorId x = sim.make("x", MiB, Term::activations, "input", "bf16", "", true);
  sim.allocate_at_next_matmul("workspace", 32 * MiB);
  const TensorId y = sim.make("y", 2 * MiB, Term::activations, "linear output", "bf16", "", true);
  sim.node("MulBackward0", {x}, {y}, {});  // not a matmul: the workspace waits
  const TensorId z = sim.make("z", 2 * MiB, Term::activations, "linear output", "bf16", "", true);
  sim.node("LinearBackward", {w, y}, {z}, {y, w});
  auto name_at = [&](std::size_t k) { return std::string(sim.info(trace.events[k].t).name); };
  REQUIRE(trace.events.size() == 5);  // w, x, y, z, then the workspace
  CHECK(name_at(3) == "z");
  CHECK(name_at(4) == "workspace");
  // the backward's: after the first gradient its first matmul computes (the weight's)
  sim.allocate_at_next_matmul("workspace", 32 * MiB);
  const std::size_t before = trace.events.size();
  sim.backward(z);
  const std::vector<std::string> allocated = allocated_since(sim, trace, before);
  REQUIRE(allocated.size() >= 3);
  CHECK(allocated[0] == "loss gradient");
  CHECK(std::string(sim.info(trace.events[before + 1].t).op) == "LinearBackward");
  CHECK(allocated[2] == "workspace");
}

// AddBackward0 launches nothing: it hands its incoming gradient to each addend of the sum's size
// and dtype. A residual stream's gradient is then one buffer from the loss down, summed into in
// place (the pipeline stages' whole-run snapshots, tests/data/pp_fresh_snapshots/: the last
// stage's input gradient is the block allocated at the first layer's backward).
TEST_CASE("the trace: an add hands its gradient through; a residual stream's gradient is one buffer") {
  using namespace membudget::detail;
  AutogradSim sim(false);
  SimTrace trace;
  sim.record_to(&trace);
  const TensorId w = sim.param("embedding", 4 * MiB, Term::model_states, "bf16");
  TensorId x = sim.make("x0", MiB, Term::activations, "embedding", "bf16", "b·s·h", true);
  sim.node("EmbeddingBackward0", {w}, {x}, {});
  const TensorId bias = sim.make("bias-like addend", 64 * 1024, Term::activations, "input", "bf16", "h", true);
  for (int layer = 0; layer < 2; ++layer) {
    const TensorId branch = sim.make("branch", MiB, Term::activations, "mul", "bf16", "b·s·h", true);
    sim.node("MulBackward0", {x}, {branch}, {});  // x's second contribution: computed, added in place
    const TensorId h = sim.make("h", MiB, Term::activations, "add", "bf16", "b·s·h", true);
    sim.pass_through_node("AddBackward0", {x, branch}, h);
    sim.drop(x);
    sim.drop(branch);
    x = h;
  }
  const TensorId y = sim.make("y", MiB, Term::activations, "add", "bf16", "b·s·h", true);
  sim.pass_through_node("AddBackward1", {x, bias}, y);  // the broadcast addend gets a reduced gradient of its own
  sim.drop(x);
  const TensorId loss = sim.make("loss", 4, Term::logits_loss, "sum", "fp32", "1", true);
  sim.node("SumBackward0", {y}, {loss}, {});
  const std::size_t before = trace.events.size();
  sim.backward(loss);
  const std::vector<std::string> allocated = allocated_since(sim, trace, before);
  auto count = [&](const char* name) { return std::count(allocated.begin(), allocated.end(), name); };
  CHECK(count("activation gradients") == 2);  // y's (SumBackward0), the bias's; none at the adds
  CHECK(count("gradient accumulation temporary") == 2);  // MulBackward0's, added in place
  CHECK(count("parameter gradients (.grad)") == 1);
}

// PYTORCH_CUDA_ALLOC_CONF's other settings, each step and rank alone in a fresh process with a
// whole-run snapshot (tools/device/allocator_conf_run.sh, tests/data/allocator_conf/):
// max_split_size_mb:128 on a dense, a fully recomputed, a MoE and a LoRA step;
// roundup_power2_divisions:4 on three dense steps; max_split_size_mb:512 with per-interval
// divisions [256:1,512:2,1024:4,>:8] on two (the FSDP2 and ZeRO-1 ranks with max_split_size_mb:256
// are in test_distributed). 2026-12-04: every one within 0.01%, seven of nine 0.00% (run in one
// process after the files above, TinyLlama read −5.4% until a thread's replay reset its rounding:
// below).
TEST_CASE("reserved_peak under max_split_size_mb and roundup_power2_divisions, each measured alone") {
  const auto errs = reserved_errors({"tests/data/allocator_conf/torch_train_max_split_h200.json",
                                     "tests/data/allocator_conf/torch_train_roundup_h200.json",
                                     "tests/data/allocator_conf/torch_train_max_split_roundup_h200.json"});
  CHECK(errs.size() == 9);
  CHECK(count_within(errs, 0.004, 0.0001) >= 6);
}

// Held out: combinations of model, shape and allocator setting no committed measurement had,
// predicted before they were measured (tests/data/heldout_conf/predicted_before.json, by febdba3),
// each alone in a fresh process with a whole-run snapshot (tools/device/heldout_conf_run.sh):
// Phi-3 mini amp-bf16 full 2 × 2048, Gemma 2 9B (8 layers) LoRA, DeepSeek-V2-Lite (4 layers) bf16
// full recompute, Mistral 7B (8 layers) with expandable segments, Qwen2.5 7B (8 layers) with
// roundup_power2_divisions:2 (the ranks are in test_distributed). 2026-12-04, as predicted: Gemma
// +0.04%, Qwen2.5 0.00%, Mistral −0.55%, Phi-3 +0.63%, DeepSeek-V2-Lite +3.39%; every phase
// within 0.1%. Since the latent attention follows that snapshot its large-pool stream is the
// run's, event for event; it was +3.44%, taken for an address tie, and is 0.00% since MulBackward0
// computes `other`'s gradient first (the experts' act(gate) * up; docs/accuracy.md, "The ties").
// Mistral went from −0.55% to −2.26% with that order: its stream is not the run's (the sliding
// window's SDPA mask and the repeated keys and values come in another order), so the blocks fall
// otherwise.
TEST_CASE("reserved_peak of held-out steps under several allocator settings, predicted before they were measured") {
  const auto errs = reserved_errors({"tests/data/heldout_conf/torch_train_heldout_default_h200.json",
                                     "tests/data/heldout_conf/torch_train_heldout_expandable_h200.json",
                                     "tests/data/heldout_conf/torch_train_heldout_roundup_h200.json"});
  CHECK(errs.size() == 5);
  CHECK(count_within(errs, 0.025, 0.007) >= 4);
}

// The held-out DeepSeek-V2-Lite step again, each alone with a whole-run snapshot
// (tools/device/deepseek_tie_run.sh): with c10's default allocator the run reserved 23,240 MiB as
// the first did, and with expandable segments the replay is 0.00%. With the default allocator it
// was +3.44% until MulBackward0 computed `other`'s gradient first (2026-12-04): 0.00% since.
TEST_CASE("the held-out DeepSeek-V2-Lite step, with and without expandable segments") {
  const auto expandable = reserved_errors("tests/data/heldout_conf/torch_train_deepseek_tie_expandable_h200.json");
  CHECK(expandable.size() == 1);
  CHECK(count_within(expandable, 0.0005, 0.0005) == 1);
  const auto plain = reserved_errors("tests/data/heldout_conf/torch_train_deepseek_tie_default_h200.json");
  CHECK(plain.size() == 1);
  CHECK(count_within(plain, 0.0005, 0.0005) == 1);
}

// The two single-GPU steps measured alone that the replay missed by more than 3%, Qwen2.5 1.5B
// amp-bf16 full recompute 2 × 2048 and DeepSeek-V2-Lite (4 layers) bf16 full recompute
// (tools/device/ties_repeat_run.sh 1, tests/data/ties_repeat/): each three more times, each alone
// in a fresh process with a whole-run snapshot. Every process reserved the same bytes as the first
// (37,470 and 23,240 MiB), and the snapshots put the segments in the same address order, though
// not at the same offsets. Replayed with the run's own segment addresses the Qwen step still made
// one segment more, so the addresses were not what decided it: the MLP product's two equal
// gradients were made in the other order (MulBackward0 computes `other`'s first). With that, both
// are within 0.01% (+3.17% and +3.44% before; docs/accuracy.md, "The ties").
TEST_CASE("the single-GPU steps once taken for address ties, measured three more times alone: every process reserves the same") {
  const char* rel = "tests/data/ties_repeat/torch_train_ties_repeat_h200.json";
  std::ifstream in(test::source_path(rel));
  REQUIRE(in.good());
  const auto data = nlohmann::json::parse(in);
  std::map<std::string, std::set<double>> reserved_by_step;  // the name without its /repeatN
  for (const auto& c : data["cases"]) {
    REQUIRE(c["status"] == "ok");
    const std::string name = c["name"];
    reserved_by_step[name.substr(0, name.rfind("/repeat"))].insert(last_step(c)["reserved"].get<double>());
  }
  CHECK(reserved_by_step.size() == 2);
  for (const auto& entry : reserved_by_step) {  // (not a structured binding: CAPTURE's lambda takes it)
    const std::string& step = entry.first;
    CAPTURE(step);
    CHECK(entry.second.size() == 1);
  }
  const auto errs = reserved_errors(rel);
  CHECK(errs.size() == 6);
  CHECK(count_within(errs, 0.001, 0.001) == 6);
}

// The single-GPU steps whose reserved figure moved by more than 1.5% when MulBackward0 began
// computing `other`'s gradient first, measured alone (tools/device/mul_order_alone_run.sh,
// tests/data/mul_order_alone/), each before only measured after other cases in one process: Gemma
// 2 9B bf16 full recompute 0.00% (+2.00% with the old order); Llama 3.2 1B amp-bf16 full recompute
// with the math (eager) attention −5.80% (−3.84%), a miss of its own. Its snapshot showed the
// eager attention repeating the fp32 keys before autocast's casts, the float mask made once per
// forward and the attention weights kept until the decoder layer returns (its forward stream the
// run's since, −3.83%); then BmmBackward0 computing mat2's gradient first, v's gradient copied
// into v_proj's output layout, o_proj's input gradient a view at batch 1, and the mask going with
// layer 0's checkpoint frame (2026-12-04: its whole stream the run's, 0.00%;
// test_measured_allocations.py holds the stream).
TEST_CASE("reserved_peak of the steps the MulBackward0 order moved, measured alone") {
  const auto errs = reserved_errors("tests/data/mul_order_alone/torch_train_mul_order_alone_h200.json");
  CHECK(errs.size() == 2);
  CHECK(count_within(errs, 0.01, 0.001) == 2);
}

// Eager (math) attention steps, each measured alone with a whole-run snapshot
// (tools/device/eager_alone_run.sh, tests/data/eager_alone/). Four were held out from the eager
// backward's order and predicted before measured (2026-12-04): Gemma 2 2B amp-bf16 full recompute
// 0.00%, Llama 3.2 1B amp-bf16 full at 2 × 1,024 −0.06%, Qwen3 0.6B bf16 −1.13%, and Gemma 2 2B
// amp-bf16 at 2 × 2,048 −4.73% (−4.70% after other cases in one process). Their snapshots showed
// matmul copying the query at b > 1, softmax(dtype=float32) converting a bf16 input first, the
// sliding mask's and_masks intermediates and a bool mask of s·s bytes whatever b, and the rotary
// cos and sin freed with layer 0's checkpoint frame; with those every stream is the run's
// (test_measured_allocations.py) and every figure within 0.01%. The last two cases: steps that
// moved past 3% in their in-process files with those mechanisms (Llama 3.2 1B bf16 math −0.21% ->
// +3.63%, Gemma 2 2B amp-bf16 full at 4,096 −0.01% -> −3.02%), 0.00% alone.
TEST_CASE("reserved_peak of eager attention steps, each measured alone") {
  const auto errs = reserved_errors({"tests/data/eager_alone/torch_train_eager_alone_h200.json",
                                     "tests/data/eager_alone/torch_train_eager_alone_more_h200.json"});
  CHECK(errs.size() == 6);
  CHECK(count_within(errs, 0.001, 0.0002) == 6);
  // Held out a second time with those mechanisms in, predicted before measured
  // (tools/matrices/eager_heldout_h200.json): Mistral 7B at its 4,096-token window under full
  // recompute, Qwen2.5 0.5B fp32 at 2 × 1,024 and Gemma 2 9B bf16 full at 2 × 1,024 (8 layers
  // each but Qwen's) 0.00%, their whole streams the runs'; Phi-3 mini bf16 at 2 × 1,024 +2.68%,
  // its forward off by the copies matmul does not make (its partial rotary's cat and the cache's
  // leave q, k and v contiguous) and its local qkv, kept until the attention returns: +1.98% with
  // those, and 0.00% since its fused projections' backward runs as the run's (q, k and v slice
  // views of qkv_proj's output, the rotary's empty q_pass slice, gate_up's chunk views: its
  // whole stream the run's).
  const auto heldout = reserved_errors("tests/data/eager_alone/torch_train_eager_heldout_h200.json");
  CHECK(heldout.size() == 4);
  CHECK(count_within(heldout, 0.0002, 0.0002) == 4);
}

// Phi-3 mini held out again after its fused projections' backward (d2011d1), predicted before
// measured (tests/data/phi3_heldout/predicted_before.json, by 47d3d3a), each alone with a whole-run
// snapshot (tools/device/eager_alone_run.sh phi3_heldout): flash amp-bf16 full recompute and bf16
// at 2 x 2,048 (past the 2,047-token window: SDPA gets the mask), eager amp-bf16 full recompute at
// 1 x 2,048 and eager fp32 at 1 x 1,024. As predicted: +0.23%, -0.12%, +2.75% and 0.00%, every
// phase within 0.3%. Their snapshots showed the mask made before the rotary embeddings, SDPA's
// bias made before its output (where(mask, 0, -inf), no logical_not), the memory-efficient
// kernel's backward taking the output gradient and v's view as they are, and the partial
// rotary's pass slice getting a cast gradient of its own under autocast: all four 0.00% since,
// their whole streams the runs' (test_measured_allocations.py).
TEST_CASE("reserved_peak of Phi-3 mini held out after its fused projections, predicted before measured") {
  const auto errs = reserved_errors("tests/data/phi3_heldout/torch_train_phi3_heldout_h200.json");
  CHECK(errs.size() == 4);
  CHECK(count_within(errs, 0.0002, 0.0002) == 4);
}

// SDPA past the sliding window held out once the masked SDPA followed Phi-3's snapshots, predicted
// before measured (tests/data/sdpa_window_heldout/predicted_before.json, by 13f849f), each alone
// with a whole-run snapshot, measured on an H100 (the H200s were lent to none that hour; the same
// torch and transformers): Mistral 7B (8 layers) bf16 at 1 x 4,096 and amp-bf16 at 2 x 4,096 under
// full recompute, Gemma 2 2B amp-bf16 full recompute at 4,096. As predicted: -2.34%, 0.00%, 0.00%,
// every phase within 0.15%. Mistral's snapshot showed v's view copied where the mask makes SDPA
// repeat the keys and values (repeat_kv's sum comes back b·kv·s·hd): 0.00% since, every stream
// the run's (test_measured_allocations.py).
TEST_CASE("reserved_peak of SDPA past the sliding window, held out and predicted before measured") {
  const auto errs = reserved_errors("tests/data/sdpa_window_heldout/torch_train_sdpa_window_heldout_h100.json");
  CHECK(errs.size() == 3);
  CHECK(count_within(errs, 0.0002, 0.0002) == 3);
  // Held out a second time with that copy in, without recompute (tests/data/sdpa_window_heldout2/,
  // predicted by a23792e, measured on an H100): Gemma 2 9B (8 layers) bf16 at 2 x 4,096, Mistral 7B
  // (8 layers) amp-bf16 at 8,192 tokens, Phi-3 mini (8 layers) amp-bf16 at 2 x 4,096: 0.00% as
  // predicted, every phase within 0.01%, every stream the run's.
  const auto again = reserved_errors("tests/data/sdpa_window_heldout2/torch_train_sdpa_window_heldout2_h100.json");
  CHECK(again.size() == 3);
  CHECK(count_within(again, 0.0002, 0.0002) == 3);
}

// The two batches `max-batch configs/hf/phi-3-mini-4k.json --device H100 --precision bf16 --seq
// 2048` decides between since the masked SDPA (5 before, 4 after), all 32 layers, predicted before
// measured (tests/data/phi3_maxbatch/predicted_before.json, by c97514b) and measured alone on an
// H100: reserved 0.00% at both, and what nvidia-smi shows (the card's used memory after the steps:
// 78,173 MiB at 5 x 2,048, 95.8% of the H100) the prediction's nvidia_smi to the MiB. The step at 5
// ran; max-batch answers 4 because the default headroom keeps 5% of the card free.
TEST_CASE("Phi-3 mini at the max-batch edge on an H100: reserved and nvidia-smi as measured") {
  const char* rel = "tests/data/phi3_maxbatch/torch_train_phi3_maxbatch_h100.json";
  const auto errs = reserved_errors(rel);
  CHECK(errs.size() == 2);
  CHECK(count_within(errs, 0.0002, 0.0002) == 2);
  std::ifstream in(test::source_path(rel));
  REQUIRE(in.good());
  const auto data = nlohmann::json::parse(in);
  for (const auto& c : data["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    PredictOptions po;
    po.reserved = true;
    const Budget b = predict(test::model_as_measured(c["job"]), test::job_as_measured(c["job"]), po);
    const double used = c["after_case_before_empty_cache"]["device_used"].get<double>();
    CHECK(std::fabs(static_cast<double>(b.nvidia_smi()) - used) <= 0.001 * used);
  }
}

// The other committed files with reserved figures: Gemma 2 with eager attention and fused AdamW,
// each measured after other cases in one process, and the steps measured alone for their whole-run
// snapshots (Qwen2.5 1.5B and 7B full recompute, Llama 3.1 8B at 4 × 4,096).
TEST_CASE("reserved_peak of the remaining files") {
  const auto in_process = reserved_errors({"tests/data/torch_train_gemma2_eager_h200.json",
                                           "tests/data/torch_train_fused_adamw_h200.json"});
  CHECK(in_process.size() == 10);
  CHECK(count_within(in_process, 0.035, 0.01) >= 8);  // 2026-12-04: 8 within 0.1%, +1.61%, −3.02%
  const auto alone = reserved_errors({"tests/data/handthrough_snapshots/torch_train_handthrough_h200.json",
                                      "tests/data/reserved_8b_snapshot/torch_train_reserved_8b_snapshot_h200.json"});
  CHECK(alone.size() == 3);
  CHECK(count_within(alone, 0.001, 0.001) == 3);
}

// A thread's replay reuses one allocator, reset for each job (simulate_reserved). The reset once
// kept the first job's rounding: a roundup_power2_divisions job replayed after a default one was
// rounded as the default (the tests above, run in one process, read −5.4% on TinyLlama, 0.00%
// each file alone). The figure must not depend on what the thread replayed before.
TEST_CASE("a thread's replay follows each job's allocator settings, whatever it replayed before") {
  const ModelSpec m = load_model(test::source_path("configs/hf/tinyllama-1.1b.json"));
  Job job;
  job.batch = 1;
  job.seq = 1024;
  job.precision = Precision::amp_bf16;
  job.recompute = Recompute::none;
  PredictOptions plain;
  plain.reserved = true;
  PredictOptions roundup = plain;
  roundup.allocator_conf = "roundup_power2_divisions:4";
  const bytes_t first = predict(m, job, plain).reserved_peak;
  const bytes_t rounded = predict(m, job, roundup).reserved_peak;
  const auto fresh = membudget::detail::simulate_reserved_full(
      m, job, membudget::detail::parse_allocator_conf("roundup_power2_divisions:4").policy);
  CHECK(rounded == fresh.reserved_peak);
  CHECK(rounded != first);  // the setting moves the figure at this shape (else the check above proves little)
  CHECK(predict(m, job, plain).reserved_peak == first);
}

TEST_CASE("roundup_power2_divisions: the phases count the rounded blocks, or the job is refused") {
  const ModelSpec m = load_model(test::source_path("configs/hf/tinyllama-1.1b.json"));
  Job job;
  job.batch = 1;
  job.seq = 1024;
  PredictOptions rounded;
  rounded.allocator_conf = "roundup_power2_divisions:4";
  rounded.explain = true;
  PredictOptions plain;
  plain.explain = true;
  const Budget b = predict(m, job, rounded);  // the replay runs though reserved was not asked
  const Budget d = predict(m, job, plain);
  CHECK(b.reserved_peak > 0);
  const auto r = membudget::detail::simulate_reserved_full(
      m, job, membudget::detail::parse_allocator_conf("roundup_power2_divisions:4").policy);
  int explained = 0;
  for (std::size_t i = 0; i < b.phases.size(); ++i) {
    CAPTURE(b.phases[i].name());
    CHECK(b.phases[i].bytes == r.allocated_steady[i]);
    CHECK(b.phases[i].bytes >= d.phases[i].bytes);
    // the simulation's slack entries give way to one entry of the replay's: the tensors plus it
    // make the phase
    bytes_t listed = 0, slack = 0, simulated_slack = 0;
    for (const TensorBytes& t : b.phases[i].live) {
      CHECK(t.op != membudget::detail::kCachingAllocatorOp);
      (t.name == membudget::detail::kAllocatorSlack ? slack : listed) += t.bytes;
    }
    for (const TensorBytes& t : d.phases[i].live)
      if (t.op == membudget::detail::kCachingAllocatorOp) simulated_slack += t.bytes;
    if (d.phases[i].live.empty()) continue;  // (the floor lists nothing)
    CHECK(listed == d.phases[i].bytes - simulated_slack);
    CHECK(listed + slack == b.phases[i].bytes);
    ++explained;
  }
  CHECK(explained == 3);
  CHECK(b.peak > d.peak);
  Job serve = job;
  serve.mode = Mode::infer;
  CHECK_THROWS_AS(predict(m, serve, rounded), Error);
}

// Wherever the replay runs, its allocated peaks are the phases (predict.cpp): with c10's defaults
// too, where they differ from the simulation's by the blocks taken whole. SmolLM2 360M: its k and v
// projections (1.17 MiB) take free blocks of up to 2.17 MiB whole; measured, the replay's phases are
// within 0.15% and the simulation's optimizer phase 1.8% low (tests/data/new_models_heldout/).
TEST_CASE("predict with the replay reports the replay's allocated phases, step 0 and steady") {
  const ModelSpec m = load_model(test::source_path("tests/data/hf/smollm2-360m.json"));
  Job job;
  job.batch = 2;
  job.seq = 1000;
  job.precision = Precision::fp32;
  PredictOptions replayed;
  replayed.reserved = true;
  const Budget b = predict(m, job, replayed);
  const Budget d = predict(m, job);
  const auto r = membudget::detail::simulate_reserved(m, job, AllocatorPolicy{});
  bool differs = false;
  for (std::size_t i = 0; i < b.phases.size(); ++i) {
    CAPTURE(b.phases[i].name());
    CHECK(b.phases[i].bytes == r.allocated_steady[i]);
    CHECK(b.step0[i].bytes == r.allocated_step0[i]);
    differs = differs || b.phases[i].bytes != d.phases[i].bytes;
  }
  CHECK(differs);  // (else this proves nothing)
  bytes_t peak = 0;
  for (const auto& p : b.phases) peak = std::max(peak, p.bytes);
  for (const auto& p : b.step0) peak = std::max(peak, p.bytes);
  CHECK(b.peak == peak);
  // the CLI's JSON says the same
  const auto out = test::run_cli("predict " + test::source_path("tests/data/hf/smollm2-360m.json") +
                                 " --batch 2 --seq 1000 --precision fp32 --format json 2>/dev/null");
  REQUIRE(out.exit_code == 0);
  const auto json = nlohmann::json::parse(out.out);
  for (std::size_t i = 0; i < b.phases.size(); ++i)
    CHECK(json["phases"][b.phases[i].name()].get<bytes_t>() == b.phases[i].bytes);
}

TEST_CASE("PYTORCH_CUDA_ALLOC_CONF parsing") {
  using detail::parse_allocator_conf;
  CHECK(!parse_allocator_conf("").policy.expandable_segments);
  const auto a = parse_allocator_conf("expandable_segments:True, max_split_size_mb:512,garbage_collection_threshold:0.6");
  CHECK(a.policy.expandable_segments);
  CHECK(a.policy.max_split_size == 512 * MiB);
  CHECK(a.garbage_collection_threshold == doctest::Approx(0.6));
  const auto r = parse_allocator_conf("roundup_power2_divisions:4");
  CHECK(r.policy.roundup_power2_divisions[0] == 4);
  CHECK(r.policy.roundup_power2_divisions[15] == 4);
  CHECK(r.policy.round_size(5 * MiB + 1) == 6 * MiB);  // [4, 8) MiB in 4 steps of 1 MiB
  const auto l = parse_allocator_conf("roundup_power2_divisions:[1:2,4:4,>:8]");
  CHECK(l.policy.roundup_power2_divisions[0] == 2);
  CHECK(l.policy.roundup_power2_divisions[2] == 4);
  CHECK(l.policy.roundup_power2_divisions[3] == 8);
  // c10 (AcceleratorAllocatorConfig::parseMaxSplitSize) refuses a max split below a large
  // segment at startup: "max_split_size_mb too small, must be >= 20"
  CHECK(parse_allocator_conf("max_split_size_mb:20").policy.max_split_size == 20 * MiB);
  auto fails = [](const char* conf, const char* needle) {
    try {
      parse_allocator_conf(conf);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::invalid_job);
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
      return;
    }
    FAIL("accepted " << conf);
  };
  fails("pinned_use_cuda_host_register:True", "'pinned_use_cuda_host_register' is not modelled");
  fails("expandable_segments:true", "'true' is not True or False (PyTorch refuses it at startup");  // c10 spells them so
  fails("backend:cudaMallocAsync", "'backend' is not modelled");
  fails("expandable_segments:yes", "expandable_segments");
  fails("max_split_size_mb:19", "max_split_size_mb: 19 is below 20");
  fails("max_split_size_mb:0", "max_split_size_mb: 0 is below 20");
  fails("max_split_size_mb:x", "max_split_size_mb");
  fails("roundup_power2_divisions:3", "power of 2");
  fails("garbage_collection_threshold:1.5", "garbage_collection_threshold");
  fails("expandable_segments", "key:value");
  // c10's tokenizer reads the comma after an empty item as a key ("Unrecognized key"); a trailing one it takes
  fails(",", "an empty item before a ','");
  // inside the brackets too: c10 takes "[]" (no rounding) and a trailing comma, and stops at an empty
  // item before a ',' (it reads the ',' as a size)
  fails("roundup_power2_divisions:[256:4,,512:2]", "roundup_power2_divisions: an empty item before a ','");
  fails("roundup_power2_divisions:[,256:4]", "an empty item before a ','");
  fails("roundup_power2_divisions:[256:4,,]", "an empty item before a ','");
  fails("roundup_power2_divisions:[,]", "an empty item before a ','");
  CHECK(parse_allocator_conf("roundup_power2_divisions:[256:4,]").policy.roundup_power2_divisions ==
        parse_allocator_conf("roundup_power2_divisions:[256:4]").policy.roundup_power2_divisions);
  CHECK(parse_allocator_conf("roundup_power2_divisions:[]").policy.roundup_power2_divisions ==
        parse_allocator_conf("").policy.roundup_power2_divisions);
  fails("expandable_segments:True,,max_split_size_mb:512", "an empty item before a ','");
  fails(",expandable_segments:True", "an empty item before a ','");
  CHECK(parse_allocator_conf("expandable_segments:True,").policy.expandable_segments);
  CHECK(!parse_allocator_conf("").policy.expandable_segments);
}

TEST_CASE("reserved memory follows the allocator settings, and is asked for") {
  const ModelSpec m = load_model(test::source_path("configs/hf/llama-3.2-1b.json"));
  Job job;
  job.batch = 1;
  job.seq = 2048;
  const Budget plain = predict(m, job);
  CHECK(plain.reserved_peak == 0);  // estimate-speed path: not computed unless asked
  CHECK(plain.reserved.empty());
  PredictOptions po;
  po.reserved = true;
  const Budget b = predict(m, job, po);
  REQUIRE(b.reserved.size() == b.phases.size());
  CHECK(b.peak == plain.peak);  // the allocated figures do not change
  CHECK(b.reserved_peak >= b.peak);
  for (std::size_t i = 0; i < b.phases.size(); ++i) CHECK(b.reserved[i].bytes >= b.phases[i].bytes);
  CHECK(b.nvidia_smi() == b.reserved_peak + b.terms.overhead);
  po.allocator_conf = "expandable_segments:True";
  const Budget e = predict(m, job, po);
  CHECK(e.reserved_peak < b.reserved_peak);  // no fragmentation: close to the allocated peak
  CHECK(e.reserved_peak >= b.peak);
  po.allocator_conf = "backend:native";
  CHECK_THROWS_AS(predict(m, job, po), Error);
  // serving: nothing to replay yet
  Job serve;
  serve.mode = Mode::infer;
  po.allocator_conf.clear();
  CHECK(predict(m, serve, po).reserved_peak == 0);
}

TEST_CASE("CLI: reserved_peak and nvidia_smi in the JSON, reserved beside allocated in the table") {
  auto j = test::run_cli("predict " + test::source_path("configs/hf/llama-3.2-1b.json") + " -b 1 -s 2048 --format json");
  REQUIRE(j.exit_code == 0);
  const auto o = nlohmann::json::parse(j.out);
  CHECK(o["reserved_peak"].get<bytes_t>() >= o["peak"].get<bytes_t>());
  CHECK(o["nvidia_smi"].get<bytes_t>() == o["reserved_peak"].get<bytes_t>() + o["terms"]["overhead"].get<bytes_t>());
  CHECK(o["reserved_phases"].contains("backward_peak"));
  auto t = test::run_cli("predict " + test::source_path("configs/hf/llama-3.2-1b.json") + " -b 1 -s 2048");
  CHECK(t.out.find("allocated    reserved") != std::string::npos);
  CHECK(t.out.find("nvidia-smi") != std::string::npos);
  auto bad = test::run_cli("predict " + test::source_path("configs/hf/llama-3.2-1b.json") + " --allocator-conf foo:1");
  CHECK(bad.exit_code != 0);
  CHECK(bad.out.find("'foo' is not modelled") != std::string::npos);
  auto ex = test::run_cli("predict " + test::source_path("configs/hf/llama-3.2-1b.json") + " -b 1 -s 2048 --format json --allocator-conf expandable_segments:True");
  REQUIRE(ex.exit_code == 0);
  CHECK(nlohmann::json::parse(ex.out)["reserved_peak"].get<bytes_t>() < o["reserved_peak"].get<bytes_t>());
}

TEST_CASE("fit and max-batch decide on the reserved memory where the budget has it") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job j;
  j.batch = 4;
  j.seq = 2048;
  j.precision = Precision::bf16;
  PredictOptions po;
  po.reserved = true;
  const Budget with = predict(m, j, po), without = predict(m, j);
  REQUIRE(with.reserved_peak > with.peak);
  // a card between the two: the allocated figure fits, what nvidia-smi will show does not
  const Device card = test::card_between_allocated_and_reserved(with);
  const Fit on_reserved = check_fit(with, card), on_allocated = check_fit(without, card);
  CHECK(on_reserved.on_reserved);
  CHECK(on_reserved.required == with.nvidia_smi());
  CHECK(on_reserved.allocated_required == with.peak + with.terms.overhead);
  CHECK(!on_reserved.fits);
  CHECK(!on_allocated.on_reserved);
  CHECK(on_allocated.fits);
  // the API's fits() decides on allocated bytes (microseconds) unless asked for the reserved memory
  const FitResult quick = fits(m, j, card), strict = fits(m, j, card, 0.05, true);
  CHECK(quick.fits);
  CHECK(!quick.on_reserved);
  CHECK(!strict.fits);
  CHECK(strict.on_reserved);
  CHECK(strict.required == with.nvidia_smi());
  Job harness = j;  // no reserved model (the harness's own step): the allocated decision stands, and says so
  harness.profile = Profile::harness;
  const FitResult own = fits(m, harness, card, 0.05, true);
  CHECK(!own.on_reserved);
  CHECK(own.required == estimate(m, harness).required);
  Job fsdp = j;  // FSDP2's ranks have one (its all-gather and reduce-scatter streams replayed)
  fsdp.parallel.fsdp = 2;
  const FitResult sharded = fits(m, fsdp, card, 0.05, true);
  CHECK(sharded.on_reserved);
  CHECK(sharded.required > estimate(m, fsdp).required);
  // max-batch: the allocated search says 4 fits; the reserved one stops below it
  SearchOptions o;
  const MaxBatchResult a = max_micro_batch(m, j, card, o);
  o.reserved = true;
  const MaxBatchResult r = max_micro_batch(m, j, card, o);
  CHECK(a.max_micro_batch >= 4);
  CHECK(r.max_micro_batch < a.max_micro_batch);
  CHECK(r.max_micro_batch >= 1);
  CHECK(r.reserved_required <= usable_bytes(card));
  CHECK(r.reserved_evaluations >= 2);
  Job next = j;
  next.batch = r.max_micro_batch + 1;
  CHECK(predict(m, next, po).nvidia_smi() > usable_bytes(card));  // the next batch would not fit
  // short sequences: the allocated peak is the optimizer's, nearly flat in the batch, so a card just
  // under batch 1's reserved figure takes several micro-batches by allocated memory and none by
  // reserved memory; the figure reported is then batch 1's (what the CLI prints as "batch 1 needs")
  Job one = j;
  one.batch = 1;
  one.seq = 128;
  const Budget at1 = predict(m, one, po);
  const Device small = test::card_between_allocated_and_reserved(at1, "small");
  SearchOptions allocated_only;
  REQUIRE(max_micro_batch(m, one, small, allocated_only).max_micro_batch > 1);
  const MaxBatchResult none = max_micro_batch(m, one, small, o);
  CHECK(none.max_micro_batch == 0);
  CHECK(none.reserved_required == at1.nvidia_smi());
}

TEST_CASE("sweep decides on the reserved memory: the boundary max-batch finds, and no point fits on reserved alone") {
  const ModelSpec m = load_model(test::source_path("configs/llama-3.2-1b.yaml"));
  Job j;
  j.precision = Precision::bf16;
  PredictOptions po;
  po.reserved = true;
  // a card between batch 4's allocated and reserved figures at 2048 tokens, as above
  Job four = j;
  four.batch = 4;
  four.seq = 2048;
  const Budget at4 = predict(m, four, po);
  REQUIRE(at4.reserved_peak > at4.peak);
  const Device card = test::card_between_allocated_and_reserved(at4);
  SweepGrid g;
  g.batches = {8, 1, 2, 3, 4, 5, 6};  // not sorted: runs are searched by batch, not by position
  g.seqs = {1024, 2048};
  const auto allocated = sweep(m, j, g, card);
  const auto reserved = sweep(m, j, g, card, 0.05, true);
  REQUIRE(reserved.size() == allocated.size());
  int flipped = 0;
  for (std::size_t i = 0; i < reserved.size(); ++i) {
    const SweepPoint& r = reserved[i];
    CAPTURE(r.batch);
    CAPTURE(r.seq);
    REQUIRE(r.ok);
    CHECK(r.on_reserved);
    CHECK(!allocated[i].on_reserved);
    CHECK(allocated[i].reserved_required == 0);
    CHECK((!r.fits || allocated[i].fits));  // reserved ≥ allocated: nothing fits on reserved alone
    flipped += allocated[i].fits && !r.fits;
    if (r.reserved_required) {  // a replayed point: its figure is predict()'s, and decides it
      Job at = j;
      at.batch = r.batch;
      at.seq = r.seq;
      CHECK(r.reserved_required == predict(m, at, po).nvidia_smi());
      CHECK(r.fits == (r.reserved_required <= usable_bytes(card)));
    }
  }
  CHECK(flipped >= 1);
  // the largest fitting batch of each run is max-batch's reserved answer (a search of its own)
  SearchOptions o;
  o.reserved = true;
  for (std::uint64_t seq : g.seqs) {
    Job at = j;
    at.seq = seq;
    const std::uint64_t answer = max_micro_batch(m, at, card, o).max_micro_batch;
    std::uint64_t largest = 0, largest_in_grid = 0;
    for (const auto& p : reserved)
      if (p.seq == seq && p.fits) largest = std::max(largest, p.batch);
    for (std::uint64_t b : g.batches)
      if (b <= answer) largest_in_grid = std::max(largest_in_grid, b);
    CAPTURE(seq);
    CHECK(largest == largest_in_grid);
    for (const auto& p : reserved)
      if (p.seq == seq) CHECK(p.fits == (p.batch <= answer));
  }
  // a job without a reserved model keeps the allocated decision: the harness's own step
  Job harness = j;
  harness.profile = Profile::harness;
  SweepGrid small;
  small.batches = {1, 2};
  for (const auto& p : sweep(m, harness, small, find_device("H100"), 0.05, true)) {
    CHECK(!p.on_reserved);
    CHECK(p.reserved_required == 0);
    CHECK(p.fits == (p.estimate.required <= usable_bytes(find_device("H100"))));
  }
}

// Reserved memory need not grow with the batch: the allocator's segments round, and Qwen2.5 0.5B at
// 2,048 tokens reserves less at batch 9 than at 8 (found by a probe of the CLI, 2026-12-07). On a
// card between the two, max-batch offered micro-batch 8 for a global batch of 16 and sweep marked
// batch 8 as fitting, both decided by batch 9, while predict said batch 8 does not fit.
TEST_CASE("where reserved memory dips as the batch grows, every sweep point and max-batch's micro-batch are predict's own decision") {
  const ModelSpec m = load_model(test::source_path("configs/qwen2.5-0.5b.yaml"));
  Job j;
  j.seq = 2048;
  auto required = [&](std::uint64_t b) {
    Job at = j;
    at.batch = b;
    return fits(m, at, Device{"any", ~bytes_t{0}}, 0.0, true).required;
  };
  // the first batch that needs less than the one before it
  std::uint64_t dip = 0;
  for (std::uint64_t b = 2; b <= 16 && !dip; ++b)
    if (required(b) < required(b - 1)) dip = b;
  REQUIRE(dip != 0);
  CAPTURE(dip);
  const Device card{"between", (required(dip) + required(dip - 1)) / 2};  // holds `dip`, not `dip - 1`
  SweepGrid g;
  for (std::uint64_t b = 1; b <= dip + 1; ++b) g.batches.push_back(b);
  for (const SweepPoint& p : sweep(m, j, g, card, 0.0, true)) {
    CAPTURE(p.batch);
    Job at = j;
    at.batch = p.batch;
    CHECK(p.fits == fits(m, at, card, 0.0, true).fits);
  }
  SearchOptions o;
  o.reserved = true;
  o.headroom = 0.0;
  o.global_batch = 2 * (dip - 1);  // its largest divisor up to the answer is dip - 1, which does not fit
  const MaxBatchResult r = max_micro_batch(m, j, card, o);
  CHECK(r.max_micro_batch >= dip);
  REQUIRE(r.accum_micro_batch > 0);
  CHECK(r.accum_micro_batch < dip - 1);
  CHECK(o.global_batch % r.accum_micro_batch == 0);
  CHECK(r.accum_micro_batch * r.grad_accum_steps == o.global_batch);
  Job at = j;
  at.batch = r.accum_micro_batch;
  CHECK(fits(m, at, card, 0.0, true).fits);
}

TEST_CASE("CLI sweep: fits on reserved by default with a device, --fit-on allocated for the fast grid") {
  const std::string model = "sweep " + test::source_path("configs/llama-3.2-1b.yaml");
  const std::string base = model + " --batch 1,2 --seq 1024 --device H100 --format json";
  const auto r = test::run_cli(base + " 2>/dev/null");
  REQUIRE(r.exit_code == 0);
  const auto on_reserved = nlohmann::json::parse(r.out);
  for (const auto& p : on_reserved["points"]) CHECK(p["basis"] == "reserved");
  CHECK(on_reserved["points"][1].contains("reserved_required"));
  const auto a = test::run_cli(base + " --fit-on allocated 2>/dev/null");
  REQUIRE(a.exit_code == 0);
  const auto on_allocated = nlohmann::json::parse(a.out);  // (kept: a loop over a temporary's member dangles)
  for (const auto& p : on_allocated["points"]) {
    CHECK(p["basis"] == "allocated");
    CHECK(!p.contains("reserved_required"));
  }
  const auto bad = test::run_cli(base + " --fit-on nvidia");
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.find("--fit-on") != std::string::npos);
  const auto no_device = test::run_cli(model + " --fit-on reserved");
  CHECK(no_device.exit_code == 2);
  CHECK(no_device.out.find("--device") != std::string::npos);
  const auto conf_alone = test::run_cli(model + " --allocator-conf expandable_segments:True");
  CHECK(conf_alone.exit_code == 2);
  // the allocator settings reach the replay: expandable segments change the reserved figure
  const auto ex = test::run_cli(base + " --allocator-conf expandable_segments:True 2>/dev/null");
  REQUIRE(ex.exit_code == 0);
  CHECK(nlohmann::json::parse(ex.out)["points"][1]["reserved_required"] != on_reserved["points"][1]["reserved_required"]);
  // the CSV carries the basis and the replayed figure in its last two columns
  const auto csv = test::run_cli(model + " --batch 1 --seq 1024 --device H100 2>/dev/null");
  CHECK(csv.out.find("dp,fsdp,tp,pp,basis,reserved_required\n") != std::string::npos);
  CHECK(csv.out.find(",1,1,1,1,reserved,") != std::string::npos);
}



// The replay counts memory_allocated() as well as memory_reserved(): its allocator rounds and splits
// blocks as c10 does, so its per-phase allocated peaks are what a run's phases measure, and predict()
// gives them for the phases wherever the replay runs (PredictOptions::reserved, the CLI; and every
// job whose allocator settings round beyond 512 bytes: predict.cpp, allocated_as_replayed). So they
// are held here on every committed single-GPU step, whatever its settings: 2026-12-06, 298 steps
// (every file test_accuracy_measured reads, the held-out ones too, and the reserved-memory runs), every phase within 0.15%. The
// simulation's own phases (estimate(), predict() without the replay) are within 1% but where blocks
// are taken whole: Qwen2.5 1.5B's bf16 1 × 512 forward peaks −1.6%, SmolLM2 360M's optimizer phase
// −1.8% (its k and v projections, 1.17 MiB, take free blocks of up to 2.17 MiB whole), and 5-6% low
// under roundup_power2_divisions. Gemma 2 2B fp32's floor (sdpa_fp32_heldout) is within 0.05% here
// and +0.22% in the simulation: 23 of its 24 fp32 Adam states of 81 MiB are carved from cached
// activation segments (the run's snapshot), where the simulation gives each its own 82 MiB.
TEST_CASE("the replay's allocated phase peaks, on every committed single-GPU step") {
  int steps = 0;
  double worst = 0;
  for (const char* rel : {"tests/data/torch_train_h200.json",
                          "tests/data/torch_train_holdout_h200.json",
                          "tests/data/torch_train_reserved_h200.json",
                          "tests/data/torch_train_reserved_expandable_h200.json",
                          "tests/data/torch_train_moe_h200.json",
                          "tests/data/torch_train_lora_h200.json",
                          "tests/data/torch_train_optimizer_impl_h200.json",
                          "tests/data/expandable_more/torch_train_expandable_more_h200.json",
                          "tests/data/allocator_conf/torch_train_max_split_h200.json",
                          "tests/data/allocator_conf/torch_train_roundup_h200.json",
                          "tests/data/allocator_conf/torch_train_max_split_roundup_h200.json",
                          "tests/data/heldout_conf/torch_train_heldout_default_h200.json",
                          "tests/data/heldout_conf/torch_train_heldout_expandable_h200.json",
                          "tests/data/heldout_conf/torch_train_heldout_roundup_h200.json",
                          "tests/data/sdpa_fp32_heldout/torch_train_sdpa_fp32_heldout_h100.json",
                          "tests/data/common_heldout/torch_train_common_heldout_h100.json",
                          "tests/data/qwen2moe_mask/torch_train_qwen2moe_mask_h100.json",
                          "tests/data/combos_heldout/torch_train_combos_heldout_h100.json",
                          "tests/data/attention_fix_heldout/torch_train_attention_fix_heldout_h100.json",
                          "tests/data/torch_train_8b_class_h200.json",
                          "tests/data/torch_train_gemma2_long_h200.json",
                          "tests/data/torch_train_gemma2_eager_h200.json",
                          "tests/data/torch_train_fused_adamw_h200.json",
                          "tests/data/adafactor_loop/torch_train_adafactor_loop_h200.json",
                          "tests/data/adamw_loop/torch_train_adamw_loop_h200.json",
                          "tests/data/torch_train_moe_impl_h200.json",
                          "tests/data/inprocess_alone/torch_train_inprocess_alone3_h200.json",
                          "tests/data/heldout_conf/torch_train_deepseek_tie_default_h200.json",
                          "tests/data/heldout_conf/torch_train_deepseek_tie_expandable_h200.json",
                          "tests/data/ties_repeat/torch_train_ties_repeat_h200.json",
                          "tests/data/mul_order_alone/torch_train_mul_order_alone_h200.json",
                          "tests/data/eager_alone/torch_train_eager_alone_h200.json",
                          "tests/data/eager_alone/torch_train_eager_alone_more_h200.json",
                          "tests/data/eager_alone/torch_train_eager_heldout_h200.json",
                          "tests/data/phi3_heldout/torch_train_phi3_heldout_h200.json",
                          "tests/data/sdpa_window_heldout/torch_train_sdpa_window_heldout_h100.json",
                          "tests/data/sdpa_window_heldout2/torch_train_sdpa_window_heldout2_h100.json",
                          "tests/data/phi3_maxbatch/torch_train_phi3_maxbatch_h100.json",
                          "tests/data/new_models_heldout/torch_train_new_models_heldout_h100.json",
                          "tests/data/new_models_heldout2/torch_train_new_models_heldout2_h100.json",
                          "tests/data/lora_large_heldout/torch_train_lora_large_heldout_h100.json"}) {
    std::ifstream in(test::source_path(rel));
    REQUIRE(in.good());
    const auto data = nlohmann::json::parse(in);
    const AllocatorPolicy policy = membudget::detail::parse_allocator_conf(test::allocator_conf_as_measured(data)).policy;
    for (const auto& c : data["cases"]) {
      if (c["status"] != "ok") continue;
      const std::string name = c["name"].get<std::string>();
      // eager experts under a random router: their token counts are the run's (docs/moe.md)
      if (c["job"].contains("experts_implementation") && c["job"]["experts_implementation"] == "eager") continue;
      const auto r = membudget::detail::simulate_reserved_full(test::model_as_measured(c["job"]), test::job_as_measured(c["job"]), policy);
      const nlohmann::json last = last_step(c);
      for (std::size_t i = 0; i < std::size(kTrainPhases); ++i) {
        const double measured = last[to_string(kTrainPhases[i])].get<double>();
        const double err = (static_cast<double>(r.allocated_steady[i]) - measured) / measured;
        CAPTURE(name);
        CAPTURE(to_string(kTrainPhases[i]));
        CHECK(std::fabs(err) <= 0.002);
        if (std::getenv("MEMBUDGET_RESERVED_VERBOSE") && std::fabs(err) > 0.0005)
          std::printf("%+7.3f%%  %s %s\n", err * 100, name.c_str(), to_string(kTrainPhases[i]));
        worst = std::max(worst, std::fabs(err));
      }
      ++steps;
    }
  }
  CHECK(steps >= 280);
  MESSAGE(steps << " steps: the replay's allocated phases within " << worst * 100 << "% of the measured");
}

// The common fine-tuning setups held out (tests/data/common_heldout/, predicted by 225f768) and
// Qwen1.5-MoE's masks (tests/data/qwen2moe_mask/, by 539f442 and 8af2c7a), each measured alone on
// an H100: reserved as predicted within 0.11% for every case but Mistral 7B fp32 at 6,144 tokens
// (+115.17%, the math attention predicted where PyTorch runs the memory-efficient kernel: 0.00%
// since, 35653fe).
TEST_CASE("reserved_peak of common fine-tuning setups and Qwen1.5-MoE's masks, held out") {
  const auto common = reserved_errors("tests/data/common_heldout/torch_train_common_heldout_h100.json");
  CHECK(common.size() == 6);
  CHECK(count_within(common, 0.002, 0.002) == 6);
  const auto moe = reserved_errors("tests/data/qwen2moe_mask/torch_train_qwen2moe_mask_h100.json");
  CHECK(moe.size() == 3);
  CHECK(count_within(moe, 0.002, 0.002) == 3);
}

// SDPA's fp32 kernel held out (tests/data/sdpa_fp32_heldout/, predicted by 35653fe), each measured
// alone on an H100: reserved as predicted within 0.18% but Phi-3 mini (+0.68%, the attention
// output's copy that the memory-efficient kernel makes a view: 0.00% since 0a7c372).
TEST_CASE("reserved_peak of SDPA's fp32 memory-efficient kernel, held out") {
  const auto fp32 = reserved_errors("tests/data/sdpa_fp32_heldout/torch_train_sdpa_fp32_heldout_h100.json");
  CHECK(fp32.size() == 4);
  CHECK(count_within(fp32, 0.002, 0.002) == 4);
}

// The combinations held out in tests/data/combos_heldout/ (predicted by ca653f6), each measured
// alone on an H100: reserved as predicted within 0.21% but DeepSeek-V2-Lite under eager attention
// (−0.86%, its attention walked as SDPA: 0.00% since 0f63d7e).
TEST_CASE("reserved_peak of combinations no earlier run measured, held out") {
  const auto combos = reserved_errors("tests/data/combos_heldout/torch_train_combos_heldout_h100.json");
  CHECK(combos.size() == 12);
  CHECK(count_within(combos, 0.002, 0.002) == 12);
}

// The same, reserved (tests/data/attention_fix_heldout/): within 0.19% as predicted by 9d80da3
// (the build before 0f63d7e: Qwen2.5 1.5B +0.66%, Llama 3.2 3B −0.20%, DeepSeek's eager −1.68%).
TEST_CASE("reserved_peak of the corrected attention paths, held out again") {
  const auto fixed = reserved_errors("tests/data/attention_fix_heldout/torch_train_attention_fix_heldout_h100.json");
  CHECK(fixed.size() == 5);
  CHECK(count_within(fixed, 0.002, 0.002) == 5);
}

// Models no earlier run measured (tests/data/new_models_heldout/, predicted by 7e4ad22), each alone
// on an H100: reserved as predicted within 0.29% (SmolLM2 360M fp32 eager under full recompute), the
// other eight within 0.01%.
TEST_CASE("reserved_peak of models no earlier run measured, held out") {
  const auto fresh = reserved_errors("tests/data/new_models_heldout/torch_train_new_models_heldout_h100.json");
  CHECK(fresh.size() == 9);
  CHECK(count_within(fresh, 0.003, 0.001) == 8);
}

// LoRA r16 on Qwen2.5 14B, Qwen3 14B and Mistral Small 24B (tests/data/lora_large_heldout/,
// predicted by 620c1fa), each alone on an H100: reserved as predicted −0.31% (Qwen3 14B, full
// recompute at 2 × 4,096), −0.12% (Mistral Small 24B at 1 × 4,096), the other two −0.01%.
TEST_CASE("reserved_peak of LoRA on 14B-24B models no earlier run measured, held out") {
  const auto fresh = reserved_errors("tests/data/lora_large_heldout/torch_train_lora_large_heldout_h100.json");
  CHECK(fresh.size() == 4);
  CHECK(count_within(fresh, 0.004, 0.0015) == 3);
}

// Four more (tests/data/new_models_heldout2/, predicted by cf3065c): reserved within 0.02%.
TEST_CASE("reserved_peak of four more models no earlier run measured, held out") {
  const auto fresh = reserved_errors("tests/data/new_models_heldout2/torch_train_new_models_heldout2_h100.json");
  CHECK(fresh.size() == 9);
  CHECK(count_within(fresh, 0.001, 0.0005) == 9);
}

// Gradient accumulation's steps (test_accuracy_measured.cpp has their phases): reserved memory
// after the steady step of 2 to 4 micro-batches, each step alone in a fresh process on an H100
// (tests/data/grad_accum/).
TEST_CASE("reserved_peak of steps with gradient accumulation measured alone") {
  const auto errs = reserved_errors("tests/data/grad_accum/torch_train_grad_accum_h100.json");
  CHECK(errs.size() == 11);
  // 2026-12-07, predicted before the run: all eleven within 0.01%
  CHECK(count_within(errs, 0.03, 0.001) == 11);
}
