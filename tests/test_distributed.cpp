// One rank of a data-parallel job (DDP, DDP + ZeRO-1, FSDP2, HSDP): the prediction against the
// ranks measured on the H200 through PyTorch's fake process group (tools/torch_profile_dist.py,
// tests/data/torch_train_dist_*fakepg_h200.json), the layouts refused, and the mechanisms that
// tell ranks apart.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "helpers.hpp"
#include "measured_model.hpp"
#include "membudget/budget.hpp"
#include "membudget/api.hpp"
#include "membudget/job_yaml.hpp"
#include "model/pipeline.hpp"
#include "model/reserved.hpp"
#include "model/step_plan.hpp"

using namespace membudget;

namespace {

// The job a measured case ran: its strategy as membudget's flags (docs/distributed.md).
Job job_of(const nlohmann::json& j) {
  Job job;
  job.batch = j["batch"].get<std::uint64_t>();
  job.seq = j["seq"].get<std::uint64_t>();
  job.precision = parse_precision(j["precision"].get<std::string>());
  job.recompute = parse_recompute(j["recompute"].get<std::string>());
  Parallelism& p = job.parallel;
  if (j.contains("stages")) {  // tools/torch_profile_pp.py: one pipeline stage (shard 0 of its FSDP2 group)
    p.pipeline = j["stages"].get<std::uint64_t>();
    p.fsdp = j.value("fsdp", std::uint64_t{1});
    p.data = j.value("ddp", std::uint64_t{1});
    p.tensor = j.value("tp", std::uint64_t{1});
    p.ddp_bucket_view = j.value("bucket_view", false);
    p.reshard_after_forward = j.value("reshard", true);
    p.rank = j["stage"].get<std::uint64_t>() * p.fsdp * p.data * p.tensor;  // the ("pp", "dp", "tp") mesh
    p.microbatches = j["microbatches"].get<std::uint64_t>();
    p.pp_schedule = parse_pipeline_schedule(j["schedule"].get<std::string>());
    if (p.pp_schedule == PipelineSchedule::interleaved) p.virtual_stages = j["virtual_stages"].get<std::uint64_t>();
    if (j.contains("layers") && j["layers"].is_array()) p.pp_layers = j["layers"].get<std::vector<std::uint64_t>>();
    return job;
  }
  const std::string st = j["strategy"].get<std::string>();
  const std::uint64_t W = j["world"].get<std::uint64_t>();
  if (st == "fsdp") {
    p.fsdp = W;
    p.reshard_after_forward = j.value("reshard", true);
    p.fsdp_offload = j.value("offload", false);
  } else if (st == "hsdp") {
    p.data = j["replicate"].get<std::uint64_t>();
    p.fsdp = W / p.data;
    p.reshard_after_forward = j.value("reshard", true);
  } else if (st == "ddp") {
    p.data = W;
    p.ddp_bucket_view = j.value("bucket_view", false);
  } else if (st == "zero1") {
    p.data = W;
    p.zero_stage = 1;
  } else if (st == "fsdp_tp") {  // with "replicate" R > 1: HSDP (R × shard) across, TP within
    p.tensor = j["tp"].get<std::uint64_t>();
    p.data = j.value("replicate", std::uint64_t{1});
    p.fsdp = W / (p.data * p.tensor);
    p.reshard_after_forward = j.value("reshard", true);
    p.sequence_parallel = j.value("sp", false);
  } else if (st == "cp") {  // torchtitan's FSDP2 over the cp ranks (fsdp_over_cp)
    p.context = W;
    p.reshard_after_forward = j.value("reshard", true);
  } else if (st == "ep" || st == "ep_fsdp") {  // transformers' expert parallelism, alone or with FSDP2 across
    p.expert = st == "ep" ? W : j["ep"].get<std::uint64_t>();
    p.fsdp = W / p.expert;
    if (st == "ep_fsdp") p.reshard_after_forward = j.value("reshard", true);
    if (j.contains("experts_implementation")) job.experts = parse_experts_impl(j["experts_implementation"].get<std::string>());
  } else if (st == "tp") {
    p.tensor = W;
    p.sequence_parallel = j.value("sp", false);
    p.loss_parallel = j.value("loss_parallel", false);
  }
  p.rank = j.value("rank", 0);
  job.grad_accum_steps = j.value("grad_accum", std::uint64_t{1});
  if (j.contains("optimizer_impl") && j["optimizer_impl"].is_string())
    job.optimizer_impl = parse_optimizer_impl(j["optimizer_impl"].get<std::string>());
  return job;
}

ModelSpec model_of(const nlohmann::json& j) {
  ModelSpec m = load_model(test::source_path(j["config"].get<std::string>()));
  if (j.contains("overrides") && j["overrides"].is_object() && j["overrides"].contains("num_hidden_layers"))
    m.num_layers = j["overrides"]["num_hidden_layers"].get<std::uint64_t>();
  return m;
}
}  // namespace
namespace {

struct Worst {
  double steady = 0, step0 = 0, reserved = 0;
  std::string where, reserved_where;
  int cases = 0;
};

// Every steady phase within `tol`, step 0's forward and backward within 2% (its floor holds what
// earlier cases of the measuring process left allocated: cuBLAS workspaces).
// `reserved_high`, `reserved_low`: the band of the reserved replay's error the file's cases hold. The
// files measured many cases in one process; a process keeps its first case's cuBLAS workspaces and
// its earlier cases' cached segments, which the replay (a fresh process) does not have, so their
// bands are wide; the ranks measured alone are held tightly (the FSDP2 test below).
void check_file(const char* rel, double tol, bool (*skip)(const nlohmann::json& c), Worst& w,
                double reserved_high = 0.16, double reserved_low = -0.05, double step0_tol = 0.02) {
  std::ifstream in(test::source_path(rel));
  REQUIRE(in.good());
  const auto data = nlohmann::json::parse(in);
  for (const auto& c : data["cases"]) {
    if (c["status"] != "ok" || skip(c)) continue;
    const auto& j = c["job"];
    PredictOptions o;
    o.reserved = true;
    // the run's allocator settings, as the measuring process had them (as test_reserved reads them)
    o.allocator_conf = test::allocator_conf_as_measured(data);
    const Budget b = predict(model_of(j), job_of(j), o);
    const std::string name = c["name"].get<std::string>();
    CAPTURE(name);
    // reserved memory within the band docs/distributed.md reports (every layout has it: FSDP2's
    // all-gather and reduce-scatter streams are replayed as streams of their own)
    const double reserved = c["steady"]["reserved"].get<double>();
    REQUIRE(b.reserved_peak > 0);
    const double rerr = (static_cast<double>(b.reserved_peak) - reserved) / reserved;
    if (std::getenv("MEMBUDGET_RESERVED_VERBOSE"))  // one line per case, as test_reserved prints
      std::printf("%+7.2f%%  %s  [%s]\n", rerr * 100, name.c_str(), rel);
    CHECK(rerr >= reserved_low);
    CHECK(rerr <= reserved_high);
    if (std::fabs(rerr) > std::fabs(w.reserved)) w.reserved = rerr, w.reserved_where = name;
    for (Phase ph : kTrainPhases) {
      const double measured = c["steady"][to_string(ph)].get<double>();
      const double err = (static_cast<double>(b.phase(ph)) - measured) / measured;
      CAPTURE(to_string(ph));
      CHECK(std::fabs(err) <= tol);
      if (std::fabs(err) > std::fabs(w.steady)) w.steady = err, w.where = name + " " + to_string(ph);
      if (ph != Phase::forward_peak && ph != Phase::backward_peak) continue;
      bytes_t want0 = 0;
      for (const auto& p : b.step0)
        if (p.phase == ph) want0 = p.bytes;
      const double m0 = c["step0"][to_string(ph)].get<double>();
      const double err0 = (static_cast<double>(want0) - m0) / m0;
      CHECK(std::fabs(err0) <= step0_tol);
      w.step0 = std::max(w.step0, std::fabs(err0));
    }
    ++w.cases;
  }
}

// The worst errors of a file's cases, printed by the test (docs/distributed.md quotes them).
void report(const Worst& w, const char* what) {
  MESSAGE(std::string(what) << ": worst steady-state error " << w.steady * 100 << "% (" << w.where << ") over " << w.cases
                           << " cases; worst step-0 error " << w.step0 * 100 << "%; worst reserved error "
                           << w.reserved * 100 << "% (" << w.reserved_where << ")");
}

// The first run built the DDP, ZeRO-1 and TP models on the meta device and lost the tying of
// lm_head to the embedding in to_empty: those cases of the tied models were measured again
// (torch_train_dist_tied_fakepg_h200.json) and are left out here. (Sequence parallelism unties
// them anyway: its cases stay.)
bool untied_by_the_first_run(const nlohmann::json& c) {
  const std::string st = c["job"]["strategy"];
  const std::string cfg = c["job"]["config"];
  const bool tied_model = cfg.find("llama-3.2-1b") != std::string::npos || cfg.find("qwen2.5-1.5b") != std::string::npos;
  return tied_model && (st == "ddp" || st == "zero1" || (st == "tp" && !c["job"].value("sp", false)));
}
bool none(const nlohmann::json&) { return false; }

}  // namespace

TEST_CASE("one rank of DDP, ZeRO-1, FSDP2, HSDP and tensor parallelism lands within 2% of the fake-process-group measurement") {
  Worst w;
  // reserved: +17.1% for the first case's neighbour, 2-layer Llama 3.2 1B FSDP2 without reshard (its
  // step 0 finds the first case's cuBLAS workspaces); FSDP2's ranks measured alone are the test below
  check_file("tests/data/torch_train_dist_fakepg_h200.json", 0.02, untied_by_the_first_run, w, 0.18);
  // reserved: −15% allowed for one case, Llama 3.2 1B DDP bf16 full b2s4096, measured after other
  // cases in one process (2,004 MiB already reserved when it began); measured alone it reserves
  // 23,910 MiB, not 27,860, and the prediction is within 0.2% (the test below)
  check_file("tests/data/torch_train_dist_tied_fakepg_h200.json", 0.02, none, w, 0.16, -0.15);
  CHECK(w.cases >= 45);
  report(w, "distributed ranks");
}

// FSDP2's ranks measured each alone in a fresh process over six steps (tools/device/
// fsdp_reserved_run.sh and pp_reserved_run.sh; whole-run snapshots in tests/data/
// fsdp_reserved_snapshots/): FSDP2, HSDP, CPU offload, MoE, and pipeline stages with FSDP2 or FSDP2 ×
// TP, the ranks the replay missed most when they were measured after other cases. The replay gives
// FSDP2's all-gather and reduce-scatter buffers streams of their own (c10 reuses a block only for
// its stream), builds the model on the meta device, and runs steady steps until the allocator's
// layout repeats (Llama 3.1 8B under amp-bf16 grows at its second and third steps: 37,048 ->
// 38,050 -> 42,060 MiB, and so does the replay). 2026-12-02: all 20 within 0.56% (before: +16%
// to −12%, and FSDP2 had no reserved figure at all).
bool interleaved(const nlohmann::json& c) { return c["name"].get<std::string>().find("interleaved") != std::string::npos; }
bool fsdp4_last_stage(const nlohmann::json& c) {
  return c["name"] == "llama-3.2-1b/pp-1f1b-fsdp4/s2r1m4/amp-bf16/none/reshard-true/b1s2048";
}
TEST_CASE("FSDP2's reserved memory: ranks measured in a fresh process land within 0.6%") {
  Worst w;
  check_file("tests/data/torch_train_fsdp_reserved_fakepg_h200.json", 0.02, none, w, 0.006, -0.006);
  check_file("tests/data/torch_train_fsdp_reserved_more_fakepg_h200.json", 0.02, none, w, 0.006, -0.006);
  // The last stage of Llama 3.2 1B under 1F1B × FSDP2 4 (amp-bf16): +6.6% since the residual
  // stream's gradient became one buffer (0.00% before; its snapshot is
  // tests/data/handthrough_snapshots/, its stream the replay's, event for event, since the stage's
  // last layer output lives until lm_head returns and the root's accumulators outlive the
  // reduce-scatter output): one 1,002 MiB segment more, where the same rank measured after other
  // cases in one process reserved 16,256 MiB (alone, every time 15,226: the test of
  // tests/data/ties_repeat/ below; docs/accuracy.md); bounded below. Its
  // construction recorded (tests/data/inprocess_alone/*_build): the stream is the run's from there
  // on too, and the blocks part at a best fit between two free 4 MiB blocks, the run taking the
  // other (the three other misses once taken for such address ties were the MLP product's
  // gradients in the other order: docs/accuracy.md, "The ties").
  // Llama 3.1 8B's first stage under 1F1B × TP 2 × FSDP2 (amp-bf16, 8 layers) was −4.8% until the
  // replay followed its whole-run snapshot (tests/data/inprocess_alone/): each projection's TP
  // all-reduce a node of its own, the RowwiseParallel output the all-reduce's clone, FSDP2's
  // microbatch accumulators freed as foreach_reduce drops them; now 0.00%.
  auto not_fsdp2_alone = [](const nlohmann::json& c) { return interleaved(c) || fsdp4_last_stage(c); };
  check_file("tests/data/torch_train_pp_reserved_fakepg_h200.json", 0.02, not_fsdp2_alone, w, 0.006, -0.006);
  check_file("tests/data/inprocess_alone/torch_train_pp_tp_fsdp_8b_alone_fakepg_h200.json", 0.02, none, w, 0.006, -0.006);
  CHECK(w.cases == 20);
  report(w, "FSDP2 ranks measured alone");
  Worst l;
  check_file("tests/data/torch_train_pp_reserved_fakepg_h200.json", 0.02,
             [](const nlohmann::json& c) { return !fsdp4_last_stage(c); }, l, 0.07, -0.006);
  CHECK(l.cases == 1);
  // the same run's interleaved 1F1B first rank with full recompute (no FSDP2): −0.4% alone since
  // each stage module's optimizer steps its own parameters (+5.3% before: stage_optimizer)
  Worst i;
  check_file("tests/data/torch_train_pp_reserved_fakepg_h200.json", 0.01, [](const nlohmann::json& c) { return !interleaved(c); }, i,
             0.006, -0.006);
  CHECK(i.cases == 1);
}

// DDP's second step, where Reducer::rebuild_buckets frees step 0's bucket of every parameter
// before the rebuilt buckets are allocated, measured in one fresh process with whole-step
// snapshots (tools/device/ddp_rebuild_run.sh; tests/data/ddp_rebuild_snapshots/: bf16 full
// recompute first, then amp-bf16 after it in the same process): the reserved replay frees what a
// steady step does not find (Replay::release_not_carried_over) and allocates each bucket on its own.
TEST_CASE("DDP's reserved memory after the bucket rebuild, measured in one fresh process") {
  Worst w;
  // reserved within 3% (2026-12-02: bf16 full +0.13%, +16.9% before; amp-bf16 +2.33%, +1.3%)
  check_file("tests/data/ddp_rebuild_snapshots/ddp_rebuild_fakepg_h200.json", 0.02, none, w, 0.03, -0.03);
  CHECK(w.cases == 2);
}


// Mixture-of-experts ranks (tools/matrices/dist_moe_h200.json): the packed experts shard along dim 0
// (the experts: OLMoE's 64 over 6 ranks give chunks of 11 and a last one of 9), bucket and
// partition like any parameter; the MoE block runs on the unsharded parameters. The reserved
// replay: FSDP2's and HSDP's ranks within 0.3% but OLMoE's amp-bf16 rank, −2.5% (measured after
// other cases; alone, +0.05%: the test above); DDP within 1.7%; ZeRO-1's Qwen3-30B-A3B ranks −0.15%
// and +1.44% (+4.2% and +4.7% before each rank's optimizer stepped the whole tensors it owns, largest
// first, and the replay made DDP's construction broadcast). Rank 3 measured again alone with a
// whole-run snapshot (tests/data/inprocess_alone/) reserves 24,512 MiB, not 24,164: the replay is
// 0.00% there, its stream the run's.
TEST_CASE("MoE ranks of FSDP2, HSDP, DDP and ZeRO-1 land within 1% of the fake-process-group measurement") {
  Worst w;
  check_file("tests/data/torch_train_dist_moe_fakepg_h200.json", 0.01, none, w, 0.05, -0.05);
  CHECK(w.cases >= 15);
  report(w, "MoE ranks");
  Worst z;
  check_file("tests/data/inprocess_alone/torch_train_zero1_moe_alone_fakepg_h200.json", 0.01, none, z, 0.02, -0.02);
  CHECK(z.cases == 1);
}

// Two dense ZeRO-1 ranks whose in-process reserved figures moved most when each rank's optimizer
// began to step the whole tensors it owns (Llama 3.1 8B rank 0 of 4: −2.9% -> +4.4%; Llama 3.2 1B
// rank 3 of 4: +2.1% -> +4.9%), each measured again alone with a whole-run snapshot
// (tools/device/inprocess_alone_run.sh 3, tests/data/inprocess_alone/). 2026-12-03: every phase of
// both within 0.02%; reserved 0.00% for Llama 3.2 1B and, for the 8B, −0.50% since the replay
// makes DDP's construction broadcast (DataParallelSim::sync_module_states): its snapshot begins with
// the 384, 386, 448 and 2,006 MiB segments that broadcast's buckets leave cached (the replay makes
// all four since the broadcast goes in registration order, 2026-12-04), and it was +4.55% before
// (its allocations and frees the snapshot's either way).
TEST_CASE("dense ZeRO-1 ranks measured alone") {
  Worst w;
  check_file("tests/data/inprocess_alone/torch_train_zero1_dense_alone_fakepg_h200.json", 0.005, none, w, 0.01, -0.01);
  CHECK(w.cases == 2);
  report(w, "dense ZeRO-1 ranks measured alone");
}

// Four ranks whose in-process reserved figures the replay missed by more than 3% and that had
// never run alone, each measured alone with a whole-run snapshot (tools/device/
// inprocess_alone_run.sh 4, tests/data/inprocess_alone/, 2026-12-04): Llama 3.2 1B under FSDP2 8
// with CPU offload (+9.5% in one process), Qwen2.5 1.5B under TP 2 (+4.6%), Llama 3.2 1B under TP 4
// with SP (−3.0%) are 0.00% alone (Qwen2.5's −0.26% until TP's construction copied its dim-1
// chunks, below). Llama 3.1 8B's DDP rank (8 layers) is +3.0%:
// its allocations and frees from step 0's forward on are the snapshot's, event for event, and so
// are its segments but one 2,004 MiB segment more (step 1's second foreach temporary does not find
// room in the freed first-iteration bucket's segment, where the run's does). It was +3.4% before
// the construction's broadcast went through the parameters in registration order (its snapshot's
// 384 MiB segment: the first layer's bucket closes before its norms). Measured again with its
// construction recorded (tests/data/inprocess_alone/*_build): its stream is the run's from the
// construction on; the first placement that parts is step 0's first rotary product (8 MiB), which
// finds two free 16 MiB blocks, one in a 20 MiB segment and one in a 16 MiB one, and takes the one
// at the lower address. That was taken for the driver's address order; it was the MLP product's
// two equal gradients made in the other order (MulBackward0 computes `other`'s first), and since
// 2026-12-04 the rank is 0.00% (docs/accuracy.md, "The ties").
bool ddp_8b(const nlohmann::json& c) { return c["name"] == "llama-3.1-8b/ddp/w8r0/amp-bf16/none/b1s2048/L8"; }
bool not_ddp_8b(const nlohmann::json& c) { return !ddp_8b(c); }
// Llama 3.1 8B's last stage under 1F1B × DDP 2: its in-process and alone figures are held apart
// (the tests of torch_train_pp_tp_ddp_fakepg_h200.json and of tests/data/mul_order_alone/)
bool ddp_8b_last_stage(const nlohmann::json& c) { return c["name"] == "llama-3.1-8b/pp-1f1b-ddp2/s2r1m4/bf16/none/b1s2048/L8"; }
// The last such rank never measured alone, Llama 3.2 1B's TP 4 rank 0 in amp-bf16 (+3.6% in its
// process; tools/device/expandable_more_run.sh 1): +0.02%.
TEST_CASE("ranks the replay missed in one process, measured alone: FSDP2 with offload, TP, TP with SP, DDP") {
  Worst w;
  check_file("tests/data/inprocess_alone/torch_train_dist_misses_alone_fakepg_h200.json", 0.02, ddp_8b, w, 0.005, -0.005);
  check_file("tests/data/inprocess_alone/torch_train_dist_misses_alone2_fakepg_h200.json", 0.01, none, w, 0.005, -0.005);
  CHECK(w.cases == 4);
  report(w, "in-process misses measured alone");
  Worst d;
  check_file("tests/data/inprocess_alone/torch_train_dist_misses_alone_fakepg_h200.json", 0.02, not_ddp_8b, d, 0.001, -0.001);
  CHECK(d.cases == 1);
}

// The two ranks measured alone that the replay missed by more than 3% (tools/device/
// ties_repeat_run.sh 2, tests/data/ties_repeat/): Llama 3.1 8B's DDP rank (8 layers, amp-bf16) and
// Llama 3.2 1B's last 1F1B × FSDP2 4 stage (amp-bf16), each three more times alone in a fresh
// process with a whole-run snapshot. Every process reserved what the first did (66,772 and 15,226
// MiB; the 16,256 MiB of the stage in tests/data/torch_train_pp_fsdp_fakepg_h200.json was measured
// after other cases in one process), its segments in the same address order. The DDP rank's +3.00%
// was the MLP product's gradients made in the other order and is 0.00% since (docs/accuracy.md,
// "The ties"); the stage's +6.58% is the one left.
TEST_CASE("the ranks once taken for address ties, measured three more times alone: every process reserves the same") {
  Worst ddp, stage;
  check_file("tests/data/ties_repeat/torch_train_ties_repeat_dist_fakepg_h200.json", 0.02, none, ddp, 0.001, -0.001);
  check_file("tests/data/ties_repeat/torch_train_ties_repeat_pp_fakepg_h200.json", 0.02, none, stage, 0.07, -0.006);
  CHECK(ddp.cases == 3);
  CHECK(stage.cases == 3);
  for (const char* rel : {"tests/data/ties_repeat/torch_train_ties_repeat_dist_fakepg_h200.json",
                          "tests/data/ties_repeat/torch_train_ties_repeat_pp_fakepg_h200.json"}) {
    std::ifstream in(test::source_path(rel));
    REQUIRE(in.good());
    const auto data = nlohmann::json::parse(in);
    std::set<double> reserved;
    for (const auto& c : data["cases"]) reserved.insert(c["steady"]["reserved"].get<double>());
    CAPTURE(std::string(rel));
    CHECK(reserved.size() == 1);
  }
}

// The ranks whose reserved figure moved by more than 1.5% when MulBackward0 began computing
// `other`'s gradient first, measured alone (tools/device/mul_order_alone_run.sh,
// tests/data/mul_order_alone/): Qwen1.5-MoE's DDP rank (4 layers, amp-bf16) +0.67% (−0.09% with the
// old order), Qwen2.5 1.5B's first stage under 1F1B × FSDP2 4 −0.05% (+0.84%), each before only
// measured after other cases in one process; and Llama 3.1 8B's last stage under 1F1B × DDP 2 (8
// layers), −0.01% (−11.9% with the old order, −4.1% with the new until DDP's bucket rebuild waited
// for the step's first forward, after the last stage frees the step before's output chunks:
// docs/accuracy.md, "The ties").
TEST_CASE("ranks the MulBackward0 order moved, measured alone") {
  Worst w;
  check_file("tests/data/mul_order_alone/torch_train_mul_order_alone_dist_fakepg_h200.json", 0.02, none, w, 0.01, -0.01);
  check_file("tests/data/mul_order_alone/torch_train_mul_order_alone_pp_fakepg_h200.json", 0.02, none, w, 0.01, -0.01);
  CHECK(w.cases == 3);
  report(w, "ranks the MulBackward0 order moved, measured alone");
}

// Allocator settings on ranks, each alone in a fresh process with a whole-run snapshot. Expandable
// segments on one rank of each layout (FSDP2 with its all-gather and reduce-scatter streams, each of
// which grows a segment of its own; DDP; ZeRO-1; TP; transformers' expert parallelism) and a
// pipeline stage (tools/device/expandable_more_run.sh 2, tests/data/expandable_more/): 2026-12-04,
// every one within 0.2% (within 1.2% before the best fit followed c10's for expandable segments).
// max_split_size_mb:256 on an FSDP2 and a ZeRO-1 rank (tools/device/allocator_conf_run.sh,
// tests/data/allocator_conf/): +0.05% and 0.00%.
TEST_CASE("ranks under allocator settings, each measured alone: expandable segments, max_split_size_mb") {
  Worst w;
  for (const char* f : {"tests/data/expandable_more/torch_train_dist_expandable_fakepg_h200.json",
                        "tests/data/expandable_more/torch_train_pp_expandable_fakepg_h200.json",
                        "tests/data/allocator_conf/torch_train_dist_max_split_fakepg_h200.json"})
    check_file(f, 0.01, none, w, 0.002, -0.002);
  CHECK(w.cases == 8);
  report(w, "ranks under allocator settings");
}

// Held-out ranks, predicted before they were measured (tests/data/heldout_conf/, as test_reserved's
// held-out steps): Qwen3-30B-A3B (4 layers) EP 4 rank 2 amp-bf16 full recompute 1 × 4096, Llama 3.2
// 3B FSDP2 4 rank 1 with expandable segments, Llama 3.1 8B (8 layers) DDP 4 rank 0 with
// max_split_size_mb:256. 2026-12-04: all three 0.00%, every phase within 0.02%.
TEST_CASE("held-out ranks under several allocator settings, predicted before they were measured") {
  Worst w;
  for (const char* f : {"tests/data/heldout_conf/torch_train_heldout_dist_fakepg_h200.json",
                        "tests/data/heldout_conf/torch_train_heldout_expandable_dist_fakepg_h200.json",
                        "tests/data/heldout_conf/torch_train_heldout_max_split_dist_fakepg_h200.json"})
    check_file(f, 0.005, none, w, 0.001, -0.001, 0.01);
  CHECK(w.cases == 3);
  report(w, "held-out ranks");
}

// Ranks measured again, each alone in a fresh process (tools/device/ep_tp_fresh_run.sh), whose
// first measurement ran after other cases in one process: four tensor-parallel ranks and the
// FSDP2 and pipeline ranks whose in-process reserved figures the replay missed most (+17%, +10%).
// Reserved, 2026-12-03, 7 within 0.06%, and Llama 3.1 8B's vocabulary-parallel rank over 4 (L8)
// −0.17%, one 20 MiB segment of 11,590 MiB fewer, since the rotary embedding's matmul takes step
// 0's cuBLAS workspace (as its snapshot shows; 0.00% while the first linear took it). Before an add's backward handed its gradient through
// (a residual stream's gradient one buffer, the pipeline stage's input gradient allocated at its
// first layer's backward), the pipeline ranks were −3.1% (Llama 3.1 8B's last of 4 stages) and
// −6.6% (Llama 3.2 1B, 1F1B × TP 2 × FSDP2 2, amp-bf16); before the vocabulary-parallel loss's
// backward kept zeros_like(x) alive through (grad_input + exp(x)) * grad_output and log_softmax's
// handler passed the gradient on, Llama 3.1 8B's rank over 4 (L8) was −8.8% (its snapshot: the
// replay's lm_head gradient took the freed to_empty segment the embedding's gradient needed).
// 2026-12-03, later: since each projection's TP all-reduce is a node of its own (the snapshot of
// Llama 3.1 8B's first stage under 1F1B × TP 2 × FSDP2), the vocabulary-parallel rank's stream is
// its snapshot's, event for event, and its reserved figure was −8.6%: one 1,002 MiB segment fewer,
// the blocks parting at step 0's first forward allocation. 2026-12-04: measured again with its
// construction recorded (tools/device/inprocess_alone_run.sh 5), the run's parallelize_module
// copies each RowwiseParallel weight's four dim-1 chunks before it makes the rank's own and frees
// them after (distribute_tensor's _split_tensor), which the replay now does: its stream is the
// run's from the construction on, its segments the snapshot's, and it is 0.00% (held with the
// others below; test_measured_allocations.py checks the stream). The same rank measured after
// other cases is +9.75% (+0.27% before).
TEST_CASE("ranks measured again alone: TP, FSDP2 and pipeline ranks") {
  Worst w;
  check_file("tests/data/torch_train_tp_fresh_fakepg_h200.json", 0.02, none, w, 0.001, -0.001);
  check_file("tests/data/torch_train_dist_fresh_fakepg_h200.json", 0.02, none, w, 0.001, -0.001);
  check_file("tests/data/torch_train_pp_fresh_fakepg_h200.json", 0.02, none, w, 0.001, -0.001);
  check_file("tests/data/inprocess_alone/torch_train_construction_snapshots_fakepg_h200.json", 0.02,
             [](const nlohmann::json& c) { return c["name"].get<std::string>().starts_with("llama-3.1-8b/ddp/"); }, w, 0.001,
             -0.001);
  CHECK(w.cases == 9);
  report(w, "ranks measured alone");
}

// Ten layouts on eight models no distributed run had measured (tools/matrices/dist_new_models_h200.json:
// Qwen3 4B FSDP2 8 and TP 4, Gemma 7B FSDP2 8 with full recompute at 4,096 and DDP 4, Phi-3 mini
// ZeRO-1 rank 1 of 4, Mistral NeMo 12B FSDP2 without resharding, SmolLM2 1.7B HSDP and 360M DDP with
// gradient_as_bucket_view in fp32, Qwen2.5 3B FSDP2 × TP 2, Qwen3 1.7B TP 2 with sequence
// parallelism), predicted before they were measured (tests/data/dist_new_models/predicted_before.json,
// by b3611ad), each rank alone in a fresh process (tools/device/dist_alone_run.sh dist_new_models ...).
TEST_CASE("held-out layouts on new models, predicted before they were measured: FSDP2, HSDP, DDP, ZeRO-1, TP, SP, FSDP2 × TP") {
  Worst w;
  check_file("tests/data/dist_new_models/torch_train_dist_new_models_fakepg.json", 0.01, none, w, 0.005, -0.005, 0.01);
  CHECK(w.cases == 10);
  report(w, "held-out layouts on new models");
}

// Where the DTensor sums (AutogradSim::dtensor_scope) and SP's all-gather concat moved the
// prediction (tools/matrices/sp_sums_heldout_h200.json: the golden grid's four TP 2 + SP ranks at
// b = 1, by -1.1% to -4.1% of reserved, and Qwen2.5 1.5B at b = 4 with full recompute), predicted
// before measured (tests/data/sp_sums_heldout/), each rank alone. 2026-12-06, on an H100: reserved
// -0.92%, -0.14%, +0.45%, +0.79% and -0.01% (before those mechanisms +0.27%, +4.30%, +4.01%, +3.20%;
// predicted_without.json); every phase within 0.05%. Llama 3.2 1B's -0.92%: its first foreach
// AdamW step redistributes the tied embedding's 501 MiB replicated state to a shard
// (_replicate_to_shard), which the replay does not make.
TEST_CASE("TP + SP ranks where the DTensor sums moved the prediction, predicted before measured") {
  Worst w;
  check_file("tests/data/sp_sums_heldout/torch_train_sp_sums_fakepg.json", 0.01, none, w, 0.01, -0.01, 0.01);
  CHECK(w.cases == 5);
  report(w, "TP + SP ranks, DTensor sums");
}

// Expert parallelism as transformers 5.17 runs it (tools/matrices/ep_h200.json, each rank measured
// alone in a fresh process): Qwen3-30B-A3B over 8 and 4 ranks, Mixtral 8x7B over 8 (one expert
// per rank: the ep_router's other path) and 4, OLMoE over 4 and 8, Qwen1.5-MoE (a shared expert)
// over 4 and 2, grouped_mm and batched_mm, bf16 and amp-bf16, recompute none and full. Every phase
// within 0.07% and the reserved memory within 0.6% (2026-12-03; −9.0% to +0.2% before each
// optimizer made its own state and temporaries, one after the other).
TEST_CASE("expert-parallel ranks land within 1.5% of the fake-process-group measurement") {
  Worst w;
  check_file("tests/data/torch_train_ep_fakepg_h200.json", 0.015, none, w, 0.01, -0.01, 0.015);
  CHECK(w.cases >= 10);
  report(w, "expert-parallel ranks");
  // Holdouts, predicted before they ran (tools/matrices/ep_holdout_h200.json, committed first):
  // 2 and 16 ranks, 3 layers, 8192 tokens, batched_mm at 4 ranks, fused AdamW. Every phase within
  // 0.25%, reserved within 2.8% (2026-12-03: Mixtral's and OLMoE's full-recompute ranks over 2,
  // −2.4% and +2.8% (−1.8% before the adds handed their gradient through); the rest within 0.8%).
  Worst h;
  check_file("tests/data/torch_train_ep_holdout_fakepg_h200.json", 0.015, none, h, 0.03, -0.03, 0.015);
  CHECK(h.cases == 6);
  report(h, "expert-parallel holdouts");
  // DeepSeek-V2-Lite and DeepSeek-V3 (tools/matrices/ep_deepseek_h200.json, each alone; 2 to 5
  // layers, over 2 to 16 ranks, bf16 and amp-bf16, recompute none and full), predicted by the
  // same ep_router walk as the softmax routers, nothing changed but the refusal lifted: every phase within 0.12%, reserved
  // within 0.08% but DeepSeek-V2-Lite over 2 ranks, +2.35% (2026-12-03; its step snapshot is in
  // tests/data/ep_snapshots/). The case the run could not hold (V2-Lite, batched_mm, 4,096 tokens
  // over 8 ranks) asked for 264 GiB, the per-pair gate_up weights the prediction names.
  Worst d;
  check_file("tests/data/torch_train_ep_deepseek_fakepg_h200.json", 0.015, none, d, 0.03, -0.03, 0.015);
  CHECK(d.cases == 5);
  report(d, "DeepSeek expert-parallel ranks");
}

// Expert parallelism within, FSDP2 across: the (fsdp, ep) mesh (tools/matrices/ep_fsdp_h200.json,
// each rank alone in a fresh process): OLMoE, Qwen3-MoE, Mixtral and Qwen1.5-MoE over 4 to 8
// ranks, bf16 and amp-bf16, recompute none and full, without reshard, batched_mm, and an uneven
// split (32 local experts over 3 shards: the last rank holds 10 of the 11 rows it stores). Every
// phase within 0.3%; reserved within 0.2% (2026-12-03; the uneven last rank was −6.5% while the
// replay split the optimizer state in proportion to the padded storage, not the rank's own rows,
// and −0.65% before the rotary embedding's matmul took step 0's cuBLAS workspace).
// The last ranks of an uneven FSDP2 split, each measured alone (tools/matrices/fsdp_uneven_h200.json,
// tests/data/fsdp_uneven/, whole-run snapshots of two): OLMoE (4 layers) over 3 FSDP2 ranks, alone
// and across 2 expert-parallel ranks, amp-bf16 and bf16 with full recompute, the first and the last
// fsdp index (64 experts over 3: 22, 22 and 20 rows; 32 local over 3: 11, 11 and 10). Reserved,
// 2026-12-03: within 0.6% (the last plain rank +9.75% and the last EP rank −7.04% before the replay
// built the padded shards as to_empty and FSDP2's re-padding do and took step 0's cuBLAS workspace at
// the rotary embedding's matmul).
TEST_CASE("the last ranks of an uneven FSDP2 split land within 1%") {
  Worst w;
  check_file("tests/data/fsdp_uneven/torch_train_fsdp_uneven_fakepg_h200.json", 0.01, none, w, 0.01, -0.01, 0.01);
  CHECK(w.cases == 6);
  report(w, "uneven FSDP2 ranks");
}

TEST_CASE("expert-parallel ranks with FSDP2 across land within 1% of the fake-process-group measurement") {
  Worst w;
  check_file("tests/data/torch_train_ep_fsdp_fakepg_h200.json", 0.01, none, w, 0.01, -0.01, 0.01);
  CHECK(w.cases == 8);
  report(w, "expert-parallel ranks with FSDP2");
}

// Sequence parallelism and the vocabulary-parallel loss (tools/matrices/sp_h200.json): torchtitan's
// layouts over 2 and 4 ranks, bf16 and amp-bf16, Llama 3.2 1B and Qwen2.5 1.5B (tied: SP unties
// them) and Llama 3.1 8B; and the vocabulary-parallel loss without SP (lm_head alone sharded, the
// embedding whole: the tied 1B's two become separate tensors).
bool measured_alone_too(const nlohmann::json& c) { return c["name"] == "llama-3.1-8b/tp-lp/w4r0/bf16/none/b1s2048/L8"; }
TEST_CASE("tensor-parallel ranks with sequence parallelism and the vocabulary-parallel loss land within 2%") {
  Worst w;
  // The second case's step 0 starts with the first's cuBLAS workspaces allocated (+64 MiB, 2.4%).
  // Reserved within 3% (2026-12-03, −2.9% to +0.6%; 2026-12-04, since TP's construction copies
  // each RowwiseParallel weight's dim-1 chunks, −2.9% to +2.0%; up to +19% before the replay built the rank
  // as the script does, every parameter whole and then sharded module by module) but Llama 3.1
  // 8B's vocabulary-parallel loss without SP, +9.8% here: this process's earlier cases left it
  // room the user's run does not have (measured alone, tests/data/torch_train_tp_fresh_*: 0.00%).
  check_file("tests/data/torch_train_sp_fakepg_h200.json", 0.02, measured_alone_too, w, 0.03, -0.03, 0.025);
  CHECK(w.cases >= 12);
  Worst a;
  check_file("tests/data/torch_train_sp_fakepg_h200.json", 0.02, [](const nlohmann::json& c) { return !measured_alone_too(c); },
             a, 0.10, -0.03, 0.025);
  CHECK(a.cases == 1);
  report(w, "sequence-parallel ranks");
}

// torchtitan's 2-D layout, TP within and FSDP2 across (tools/matrices/fsdp_tp_h200.json, and
// tools/matrices/fsdp_tp_rerun_h200.json for two 2-layer allocator snapshots). The first run's
// sequence-parallel case of tied Llama 3.2 1B is left out: the script re-tied lm_head to the
// embedding after SP had untied them (one tensor fewer than a user's run holds); the re-run
// measured it as SP leaves it.
bool retied_by_the_first_run(const nlohmann::json& c) { return c["name"] == "llama-3.2-1b/fsdp2-tp4-sp/w8r0/bf16/none/b1s2048"; }
TEST_CASE("ranks of FSDP2 over tensor-parallel groups land within 2% of the fake-process-group measurement") {
  Worst w;
  check_file("tests/data/torch_train_fsdp_tp_fakepg_h200.json", 0.02, retied_by_the_first_run, w);
  check_file("tests/data/torch_train_fsdp_tp_rerun_fakepg_h200.json", 0.02, none, w);
  // HSDP across, TP within (tools/matrices/hsdp_tp_h200.json): a (replicate, shard, tp) mesh of 2 × 2 × 2
  check_file("tests/data/torch_train_hsdp_tp_fakepg_h200.json", 0.02, none, w);
  CHECK(w.cases >= 15);
  report(w, "FSDP2 (and HSDP) × TP ranks");
}

// Context parallelism (tools/matrices/cp_h200.json): context_parallel's ring attention with FSDP2
// over the cp ranks, as torchtitan shards them; allgather and alltoall rotation, bf16 and
// amp-bf16, full recompute, 2 to 8 ranks up to 65,536 tokens, Llama 3.2 1B, Qwen2.5 1.5B, Llama
// 3.1 8B. Two cases ran context_parallel without FSDP2 (replicated parameters whose gradients no
// one synchronises: not a training layout, measured to isolate the attention's own buffers).
bool cp_without_fsdp(const nlohmann::json& c) { return !c["job"].value("fsdp_over_cp", false); }
TEST_CASE("context-parallel ranks land within 1.5% of the fake-process-group measurement") {
  Worst w;
  // 1.5%: Qwen2.5's floor (−1.19%) is its FSDP2 floor gap; every other phase is within 0.73%
  check_file("tests/data/torch_train_cp_fakepg_h200.json", 0.015, cp_without_fsdp, w);
  CHECK(w.cases >= 9);
  report(w, "context-parallel ranks");
}

// A context-parallel rank is its FSDP2 step at its share of the sequence, plus what ring attention
// adds: the measured difference, not the prediction, says so.
TEST_CASE("a context-parallel rank holds FSDP2's step at s / cp plus one attention-output copy per layer") {
  std::ifstream in(test::source_path("tests/data/torch_train_cp_fakepg_h200.json"));
  const auto data = nlohmann::json::parse(in);
  const ModelSpec m = load_model(test::source_path("configs/hf/llama-3.2-1b.json"));
  for (const auto& c : data["cases"]) {
    if (c["name"] != "llama-3.2-1b/fsdp-cp4-allgather/w4r0/bf16/none/b1s16384") continue;
    Job cp = job_of(c["job"]);
    Job fsdp = cp;  // the same ranks without context parallelism, on a quarter of the sequence
    fsdp.parallel.context = 1;
    fsdp.parallel.fsdp = 4;
    fsdp.seq = cp.seq / 4;
    const Budget with = predict(m, cp), without = predict(m, fsdp);
    const bytes_t copies = m.num_layers * fsdp.seq * m.q_dim() * 2;  // b = 1, bf16
    CHECK(with.phase(Phase::forward_peak) - without.phase(Phase::forward_peak) == copies);
    const double measured = c["steady"]["forward_peak"].get<double>();
    CHECK(std::fabs(static_cast<double>(without.phase(Phase::forward_peak)) - measured) > 0.015 * measured);  // not enough alone
    return;
  }
  FAIL("the case is missing");
}

// FSDP2 with CPUOffloadPolicy (tools/matrices/offload_h200.json): the GPU keeps the all-gathered
// parameters, their host-to-device copies, the reduce-scatter buffers and the activations; the
// host keeps the shards, the gradients and the optimizer state, which the data reads off the
// tensors after each step (parameters and state; the gradients are gone by then).
TEST_CASE("FSDP2 ranks with CPU offload land within 2% on the GPU, and the host memory is the measured one") {
  Worst w;
  // 2%: the floor is only the cuBLAS workspaces (64 MiB), and Qwen2.5's and the 8B's hold 1 MiB more
  // (1.5%); Qwen2.5's forward misses its per-layer 3.5 MiB (−1.24%) as on one GPU
  check_file("tests/data/torch_train_offload_fakepg_h200.json", 0.02, none, w);
  CHECK(w.cases >= 7);
  report(w, "offloaded ranks");
  std::ifstream in(test::source_path("tests/data/torch_train_offload_fakepg_h200.json"));
  const auto data = nlohmann::json::parse(in);
  for (const auto& c : data["cases"]) {
    const Budget b = predict(model_of(c["job"]), job_of(c["job"]));
    const auto& host = c["steps"].back()["host"];
    const std::string name = c["name"];
    CAPTURE(name);
    CHECK(std::fabs(static_cast<double>(b.host.parameters) - host["params"].get<double>()) <= 0.002 * host["params"].get<double>());
    CHECK(std::fabs(static_cast<double>(b.host.optimizer_state) - host["state"].get<double>()) <=
          0.002 * host["state"].get<double>());
    CHECK(b.host.gradients > 0);
    CHECK(b.states.weights == 0);
  }
}

// Pipeline stages (tools/matrices/pp_h200.json, tools/torch_profile_pp.py): GPipe and 1F1B, first,
// middle and last stages, an uneven split, full recompute, fp32, on Llama 3.2 1B (tied), Qwen2.5
// 1.5B (tied) and Llama 3.1 8B (GQA). forward_peak and backward_peak are the highest memory during
// any forward / backward action of the schedule (docs/distributed.md).
TEST_CASE("pipeline stages under GPipe and 1F1B land within 1% of the fake-process-group measurement") {
  Worst w;
  // reserved: within 1% on every stage but one since the replay's addresses grow downward as
  // cudaMalloc's do (the last stages' logits blocks were −2.8% to −9.4% before); Llama 3.1 8B's last
  // of four stages is −2.8% since the replay places the cuBLAS workspaces as a fresh process does
  // (the file's cases ran in one process: docs/distributed.md)
  check_file("tests/data/torch_train_pp_fakepg_h200.json", 0.01, none, w, 0.01, -0.03);
  CHECK(w.cases >= 21);
  report(w, "pipeline stages");
}

bool fp32_case(const nlohmann::json& c) { return c["job"]["precision"] == "fp32"; }

// Interleaved 1F1B (tools/matrices/pp_interleaved_h200.json): V = 2 and 4 stage modules per rank
// over 2 and 4 ranks, first, middle and last ranks, 4, 6 and 8 microbatches, full recompute, fp32,
// Llama 3.2 1B, Qwen2.5 1.5B and Llama 3.1 8B (8 layers).
TEST_CASE("ranks of interleaved 1F1B pipelines land within 1% of the fake-process-group measurement") {
  Worst w;
  // reserved: within 0.7% (2026-12-03) since each stage module's optimizer makes its own state and
  // temporaries for its own parameters, module after module (stage_optimizer; the replay split one
  // module's temporaries over both modules' parameters before: +5.3% with full recompute, +4.4%
  // and +3.1% on the 8B, −1.0% over 4 ranks)
  // The fp32 rank was measured 10th of the file's 14 cases in one process, whose earlier cases'
  // cached segments it found: alone (below) its reserved is 1.3% above the in-process figure.
  check_file("tests/data/torch_train_pp_interleaved_fakepg_h200.json", 0.01, fp32_case, w, 0.007, -0.007);
  CHECK(w.cases >= 13);
  report(w, "interleaved pipeline ranks");
}

// That fp32 rank alone in a fresh process with its whole-run snapshot (tools/matrices/
// pp_fp32_alone_h200.json, on an H100, predicted in tests/data/pp_fp32_alone/predicted_before.json
// before it was measured): every phase within 0.12% and reserved 0.00% (SDPA's math kernel, its
// layers' attention, walked as its locals live since 0f63d7e).
TEST_CASE("the fp32 interleaved 1F1B rank measured alone: phases and reserved") {
  Worst w;
  check_file("tests/data/pp_fp32_alone/pp_fp32_alone_fakepg_h100.json", 0.002, none, w, 0.002, -0.002);
  CHECK(w.cases == 1);
  report(w, "the fp32 interleaved rank alone");
}

// FSDP2 within the stages (tools/matrices/pp_fsdp_h200.json): fully_shard on each decoder layer and
// the stage module over 4 ranks, 1F1B and GPipe, reshard_after_forward true and false, bf16 and
// amp-bf16 (MixedPrecisionPolicy), full recompute, both stages of Llama 3.2 1B (tied). Each
// microbatch's backward keeps the parameters unsharded and accumulates unsharded gradients (fp32
// under amp-bf16); REDUCE_GRAD reduce-scatters them after the last (docs/distributed.md).
bool qwen_small(const nlohmann::json& c) { return c["name"].get<std::string>().starts_with("qwen2.5-0.5b/"); }
bool not_qwen_small(const nlohmann::json& c) { return !qwen_small(c); }
TEST_CASE("ranks of pipelines with FSDP2 within the stages land within 1% of the fake-process-group measurement") {
  Worst w;
  // reserved: within 0.5% but the amp-bf16 last stage with reshard, −6.3% here after other cases
  // and +0.00% measured alone (the FSDP2 test above)
  check_file("tests/data/torch_train_pp_fsdp_fakepg_h200.json", 0.01, qwen_small, w, 0.16, -0.07);
  CHECK(w.cases >= 12);
  report(w, "pipeline × FSDP2 ranks");
  // Llama 3.1 8B (8 layers; bf16 without reshard, amp-bf16 with) within 0.3%; Qwen2.5 1.5B within
  // 1.6%, its floor low as under FSDP2 alone (docs/distributed.md)
  Worst more;
  check_file("tests/data/torch_train_pp_fsdp_more_fakepg_h200.json", 0.02, none, more);
  CHECK(more.cases == 6);
  report(more, "pipeline × FSDP2 ranks, Llama 3.1 8B and Qwen2.5 1.5B");
  // Qwen2.5 0.5B (never measured before) misses by up to 3.0% on its first stage with FSDP2 and
  // by 2.5% without it (torch_train_pp_qwen_small_fakepg_h200.json): the allocator's block slack,
  // which the walk does not count (the test below), not the composition (docs/distributed.md).
  Worst q;
  check_file("tests/data/torch_train_pp_fsdp_fakepg_h200.json", 0.035, not_qwen_small, q, 0.16, -0.05, 0.035);
  check_file("tests/data/torch_train_pp_qwen_small_fakepg_h200.json", 0.035, none, q, 0.16, -0.10, 0.035);
  CHECK(q.cases == 5);
  report(q, "Qwen2.5 0.5B pipeline ranks");
}

// Pipelines beside other layouts on the ("pp", "dp", "tp") mesh (tools/matrices/pp_tp_ddp_h200.json):
// each stage module tensor-parallel (its decoder layers' DTensor plan over 2 or 4 ranks, applied on
// the meta device), alone or then sharded by FSDP2 (torchtitan's 3-D layout), or replicated by DDP
// (no_sync for every microbatch's backward but the last; gradient_as_bucket_view too), 1F1B and
// GPipe, bf16, amp-bf16 (FSDP2's policy) and fp32, full recompute, 2 and 4 stages, on Llama 3.2 1B,
// Qwen2.5 1.5B and Llama 3.1 8B (8 layers).
TEST_CASE("ranks of pipelines beside tensor parallelism, FSDP2 × TP and DDP land within 2% of the fake-process-group measurement") {
  Worst w;
  // reserved (2026-12-03): every stage within 1.7%, since the adds hand their gradient through (Llama
  // 3.2 1B's amp-bf16 FSDP2 × TP last stage was −6.6%) and each stage module's optimizers step their
  // own parameters (the GPipe × TP full-recompute stage was +1.5%, the 8B's 1F1B × TP 4 −1.35%);
  // the 8B's first stage under 1F1B × TP 2 × FSDP2 in amp-bf16 within it since each projection's TP
  // all-reduce is a node of its own (−4.8% before: the FSDP2 test above). Since the replay makes
  // DDP's construction broadcast, Qwen2.5 1.5B's first stage under 1F1B × DDP 2 is +2.74% (+1.05%
  // before; measured after other cases in one process), the other DDP stages closer than before
  // (the GPipe full-recompute last stage +1.66% -> −0.37%). Since MulBackward0 computes `other`'s
  // gradient first (2026-12-04), Qwen2.5 1.5B's is +0.17%, and Llama 3.1 8B's last stage under
  // 1F1B × DDP 2 reads +13.8% here (+9.1% before DDP's bucket rebuild waited for the first forward,
  // +0.2% before MulBackward0's order); measured alone it reserved 2,942 MiB more than in this
  // process, and the replay is −0.01% from it: the test of tests/data/mul_order_alone/ holds it,
  // this one the rest of the file.
  check_file("tests/data/torch_train_pp_tp_ddp_fakepg_h200.json", 0.02, ddp_8b_last_stage, w, 0.03, -0.017);
  CHECK(w.cases == 29);
  CHECK(std::fabs(w.steady) <= 0.012);  // measured: Qwen2.5's FSDP2 floor −1.16%, every Llama phase within 0.4%
  report(w, "pipeline × TP, × FSDP2 × TP and × DDP ranks");
}

// What Qwen2.5 0.5B's pipeline stages lack: memory_allocated() counts whole blocks, and c10 does
// not split a cached large block whose remainder would be 1 MiB or less, so a 3.5 MiB activation
// (b·s·h at h = 896) served from a 4 MiB block counts 4 MiB. The walk counts the tensors' rounded
// sizes and misses that slack (−2.5%); the caching-allocator replay (reserved.cpp), which places
// every block, finds the measured peak within 0.1%. Not yet used for the allocated phases.
TEST_CASE("pipeline stages of Qwen2.5 0.5B: the allocator replay's allocated peak holds the block slack the walk lacks") {
  std::ifstream in(test::source_path("tests/data/torch_train_pp_qwen_small_fakepg_h200.json"));
  REQUIRE(in.good());
  const auto data = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& c : data["cases"]) {
    const auto& j = c["job"];
    if (j.value("fsdp", std::uint64_t{1}) > 1) continue;  // (several streams: no replay)
    const std::string name = c["name"];
    CAPTURE(name);
    const ModelSpec m = model_of(j);
    const Job job = job_of(j);
    double measured_peak = 0;
    for (Phase ph : kTrainPhases) measured_peak = std::max(measured_peak, c["steady"][to_string(ph)].get<double>());
    const detail::ReservedResult r = detail::simulate_reserved(m, job, AllocatorPolicy{});
    const Budget walk = predict(m, job);
    CHECK(std::fabs(static_cast<double>(r.allocated_peak) - measured_peak) <= 0.002 * measured_peak);
    CHECK(static_cast<double>(walk.peak) < measured_peak);  // the slack the walk does not see
    ++checked;
  }
  CHECK(checked == 2);
}

// The order of a stage's actions (pipeline.cpp's schedule_actions) is what torch 2.11's schedules
// ran: each measured step records its actions (and, interleaved, the stage module each ran on,
// and the schedule's own pipeline_order for the rank).
TEST_CASE("a stage's forward and backward actions come in the order ScheduleGPipe, Schedule1F1B and ScheduleInterleaved1F1B run them") {
  int checked = 0;
  for (const char* file : {"tests/data/torch_train_pp_fakepg_h200.json", "tests/data/torch_train_pp_interleaved_fakepg_h200.json",
                           "tests/data/torch_train_pp_fsdp_fakepg_h200.json", "tests/data/torch_train_pp_fsdp_more_fakepg_h200.json"}) {
    std::ifstream in(test::source_path(file));
    REQUIRE(in.good());
    const auto data = nlohmann::json::parse(in);
    for (const auto& c : data["cases"]) {
      const auto& j = c["job"];
      const ModelSpec m = model_of(j);
      const Job job = job_of(j);
      const std::string name = c["name"];
      CAPTURE(name);
      const detail::PipelineStage stage = detail::pipeline_stage(m, job, *job.parallel.rank);
      const auto actions = detail::schedule_actions(stage);
      for (const auto& step : c["steps"]) {
        const auto& measured = step["actions"];
        REQUIRE(measured.size() == actions.size());
        for (std::size_t i = 0; i < actions.size(); ++i) {
          CHECK((measured[i][0] == "forward") == actions[i].forward);
          CHECK(measured[i][1].get<std::uint64_t>() == actions[i].microbatch);
          if (measured[i].size() > 4) CHECK(measured[i][4].get<std::uint64_t>() == stage.chunks[actions[i].chunk].index);
        }
        ++checked;
      }
      if (c.contains("pipeline_order")) {  // e.g. "2B0": stage 2's backward of microbatch 0
        std::vector<std::string> order;
        for (const auto& a : c["pipeline_order"])
          if (!a.is_null()) order.push_back(a.get<std::string>());
        // with FSDP2 in the stage the schedule ends with the stage's REDUCE_GRAD (perform_reduce_grad:
        // DataParallelSim::reduce_grads, after every backward); without it, the plain schedules have none
        const bool reduce = !order.empty() && order.back().ends_with("REDUCE_GRAD");
        CHECK(reduce == (job.parallel.fsdp > 1));
        if (reduce) order.pop_back();
        // (Schedule1F1B's own pipeline_order numbers a later stage's microbatches otherwise than it
        // runs them — stage 1 of 2 lists 1F1 … 1F4 — so only the interleaved order is compared)
        if (job.parallel.pp_schedule != PipelineSchedule::interleaved) continue;
        REQUIRE(order.size() == actions.size());
        for (std::size_t i = 0; i < actions.size(); ++i)
          CHECK(order[i] == std::to_string(stage.chunks[actions[i].chunk].index) + (actions[i].forward ? "F" : "B") +
                                std::to_string(actions[i].microbatch));
      }
    }
  }
  CHECK(checked >= 130);
}

// Interleaved 1F1B's chunks: rank r holds stages r, r + N, …, the layers split over all N·V stages.
TEST_CASE("an interleaved rank holds every N-th stage module of the N·V-stage split") {
  const ModelSpec m = load_model(test::source_path("configs/hf/qwen2.5-1.5b.json"));  // 28 layers
  Job j;
  j.precision = Precision::bf16;
  j.parallel.pipeline = 3;
  j.parallel.pp_schedule = PipelineSchedule::interleaved;
  j.parallel.virtual_stages = 2;
  j.parallel.microbatches = 6;
  CHECK(detail::stage_layer_counts(m, j.parallel) == std::vector<std::uint64_t>{5, 5, 5, 5, 4, 4});
  const auto r1 = detail::pipeline_stage(m, j, 1);
  REQUIRE(r1.chunks.size() == 2);
  CHECK(r1.chunks[0].index == 1);
  CHECK(r1.chunks[0].first_layer == 5);
  CHECK(r1.chunks[1].index == 4);
  CHECK(r1.chunks[1].first_layer == 20);
  CHECK(r1.layers == 9);
  CHECK(!r1.first());
  CHECK(!r1.last());
  CHECK(detail::pipeline_stage(m, j, 0).first());
  CHECK(detail::pipeline_stage(m, j, 2).last());
  // every forward is matched by its backward, each chunk taking its microbatches in order
  std::vector<std::uint64_t> forwards(2, 0), backwards(2, 0);
  for (const auto& a : detail::schedule_actions(r1)) {
    auto& next = a.forward ? forwards[a.chunk] : backwards[a.chunk];
    CHECK(a.microbatch == next);
    ++next;
    if (!a.forward) CHECK(backwards[a.chunk] <= forwards[a.chunk]);
  }
  CHECK(forwards == std::vector<std::uint64_t>{6, 6});
  CHECK(backwards == std::vector<std::uint64_t>{6, 6});
  // the layers a rank keeps in flight: more on the first rank than on the last, and at most all
  // microbatches' of all its layers
  const std::uint64_t first = detail::most_layers_in_flight(detail::pipeline_stage(m, j, 0));
  const std::uint64_t last = detail::most_layers_in_flight(detail::pipeline_stage(m, j, 2));
  CHECK(first > last);
  CHECK(first <= 6 * detail::pipeline_stage(m, j, 0).layers);
  j.parallel.pp_layers = {5, 5, 5, 5, 4};
  CHECK_THROWS_AS(j.validate(), Error);
}

TEST_CASE("the layers split evenly over the stages, the first stages taking the remainder, or as --pp-layers says") {
  ModelSpec m = load_model(test::source_path("configs/hf/qwen2.5-1.5b.json"));  // 28 layers
  Job j;
  j.precision = Precision::bf16;
  j.parallel.pipeline = 3;
  CHECK(detail::stage_layer_counts(m, j.parallel) == std::vector<std::uint64_t>{10, 9, 9});
  const auto last = detail::pipeline_stage(m, j, 2);
  REQUIRE(last.chunks.size() == 1);
  CHECK(last.chunks[0].first_layer == 19);
  CHECK(last.layers == 9);
  CHECK(last.microbatches == 3);  // default: as many as stages
  j.parallel.pp_layers = {4, 20, 4};
  CHECK(detail::pipeline_stage(m, j, 1).chunks[0].first_layer == 4);
  j.parallel.pp_layers = {4, 20, 5};
  CHECK_THROWS_AS(detail::stage_layer_counts(m, j.parallel), Error);
  // the stage's tensors: the embedding first, the tied model's lm_head last (its own tensor)
  j.parallel.pp_layers.clear();
  const auto first = detail::stage_tensors(m, detail::pipeline_stage(m, j, 0), 0);
  const auto tail = detail::stage_tensors(m, last, 0);
  CHECK(first.front().module == Module::embedding);
  CHECK(tail.back().elements() == m.vocab_size * m.hidden_size);
  std::uint64_t total = 0;
  for (std::uint64_t s = 0; s < 3; ++s)
    for (const ParamTensor& t : detail::stage_tensors(m, detail::pipeline_stage(m, j, s), 0)) total += t.elements();
  CHECK(total == m.parameters().total + m.vocab_size * m.hidden_size);  // every parameter once, plus the untied head
}

namespace {
const ModelSpec& llama1b() {
  static const ModelSpec m = load_model(test::source_path("configs/hf/llama-3.2-1b.json"));
  return m;
}
Job small_job() {
  Job j;
  j.batch = 1;
  j.seq = 1024;
  return j;
}
}  // namespace

TEST_CASE("layouts that do not make sense, or are not modelled, are refused by name") {
  auto refused = [](Job j, ErrorKind kind, const char* needle) {
    try {
      (void)predict(llama1b(), j);
      FAIL("accepted");
    } catch (const Error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(e.kind() == kind);
      CHECK(what.find(needle) != std::string::npos);
    }
  };
  Job j = small_job();
  j.parallel.zero_stage = 1;
  refused(j, ErrorKind::invalid_job, "--zero");  // no --dp to shard over
  j.parallel.fsdp = 4;
  refused(j, ErrorKind::invalid_job, "--fsdp");  // FSDP2 already shards
  j = small_job();
  j.parallel.ddp_bucket_view = true;
  j.parallel.fsdp = 2;
  refused(j, ErrorKind::invalid_job, "--ddp-bucket-view");
  j = small_job();
  j.parallel.reshard_after_forward = false;
  j.parallel.data = 2;
  refused(j, ErrorKind::invalid_job, "--reshard-after-forward");
  j = small_job();
  j.parallel.fsdp = 8;
  j.parallel.rank = 8;
  refused(j, ErrorKind::invalid_job, "--rank");
  j = small_job();
  j.parallel.tensor = 2;
  j.parallel.data = 2;
  j.parallel.zero_stage = 3;
  refused(j, ErrorKind::unsupported, "--fsdp N --tp T");  // ZeRO-3 with TP is the FSDP2 layout: named
  j.parallel.zero_stage = 0;
  j.parallel.fsdp = 2;
  j.parallel.rank = 8;
  refused(j, ErrorKind::invalid_job, "--rank");  // HSDP × TP over 2 × 2 × 2 ranks
  j = small_job();
  j.parallel.tensor = 16;
  refused(j, ErrorKind::invalid_job, "num_key_value_heads 8 is not divisible by 16");
  try {  // the compiled fast path checks the same
    (void)estimate(llama1b(), j);
    FAIL("estimate accepted --tp 16");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_job);
  }
  j = small_job();
  j.parallel.sequence_parallel = true;
  refused(j, ErrorKind::invalid_job, "--sp");  // without --tp
  j.parallel.tensor = 4;
  j.parallel.loss_parallel = true;
  j.parallel.sequence_parallel = false;
  j.loss = Loss::chunked;
  refused(j, ErrorKind::unsupported, "--loss-parallel with --loss chunked");
  j.loss = Loss::full;
  j.parallel.sequence_parallel = true;
  j.seq = 1022;
  refused(j, ErrorKind::invalid_job, "--seq 1022 is not divisible by --tp 4");
  j = small_job();  // beside pipelines: TP, FSDP2 and DDP within the stages, not ZeRO-1, HSDP, DDP × TP or SP
  j.parallel.pipeline = 2;
  j.parallel.data = 2;
  j.parallel.zero_stage = 1;
  refused(j, ErrorKind::unsupported, "--pp 2 with --zero");
  j.parallel.zero_stage = 0;
  j.parallel.fsdp = 2;
  refused(j, ErrorKind::unsupported, "HSDP within the stages");
  j.parallel.fsdp = 1;
  j.parallel.tensor = 2;
  refused(j, ErrorKind::unsupported, "--tp 2 with --dp");  // (the rule without pipelines says it)
  j.parallel.data = 1;
  j.parallel.sequence_parallel = true;
  refused(j, ErrorKind::unsupported, "--pp 2 with --sp");
  j.parallel.sequence_parallel = false;
  j.parallel.pp_schedule = PipelineSchedule::interleaved;
  j.parallel.virtual_stages = 2;
  refused(j, ErrorKind::unsupported, "--pp-schedule interleaved with");
  j.parallel.pp_schedule = PipelineSchedule::one_f_one_b;
  j.parallel.virtual_stages = 1;
  j.parallel.rank = 4;  // 2 stages × 2 tensor-parallel ranks
  refused(j, ErrorKind::invalid_job, "--rank");
  j = small_job();  // FSDP2 within the stages: GPipe and 1F1B, without CPU offload
  j.parallel.pipeline = 2;
  j.parallel.fsdp = 2;
  j.parallel.pp_schedule = PipelineSchedule::interleaved;
  j.parallel.virtual_stages = 2;
  refused(j, ErrorKind::unsupported, "--pp-schedule interleaved");
  j.parallel.pp_schedule = PipelineSchedule::one_f_one_b;
  j.parallel.virtual_stages = 1;
  j.parallel.fsdp_offload = true;
  refused(j, ErrorKind::unsupported, "--fsdp-offload");
  j.parallel.fsdp_offload = false;
  j.parallel.rank = 4;  // 2 stages × 2 shards
  refused(j, ErrorKind::invalid_job, "--rank");
  j = small_job();
  j.parallel.tensor = 2;
  j.parallel.data = 2;
  refused(j, ErrorKind::unsupported, "--tp 2 with --dp");
  j = small_job();
  j.parallel.fsdp = 2;
  j.mode = Mode::infer;
  refused(j, ErrorKind::unsupported, "serving");
  j = small_job();
  j.parallel.fsdp = 2;
  j.lora_rank = 8;
  refused(j, ErrorKind::unsupported, "--lora");
  j = small_job();
  j.parallel.data = 2;
  j.optimizer = Optimizer::adafactor;
  refused(j, ErrorKind::unsupported, "adafactor");
  j = small_job();
  j.parallel.data = 1ull << 21;
  refused(j, ErrorKind::invalid_job, "absurdly large");
}

TEST_CASE("FSDP2 shards what one GPU holds: the sharded weights are the padded dim-0 chunks") {
  Job one = small_job();
  one.precision = Precision::bf16;
  const Budget b1 = predict(llama1b(), one);
  Job eight = one;
  eight.parallel.fsdp = 8;
  const Budget b8 = predict(llama1b(), eight);
  // every dim 0 of Llama 3.2 1B divides by 8: the shards are exactly an eighth (plus nothing)
  CHECK(b8.states.weights * 8 == b1.states.weights);
  CHECK(b8.states.optimizer * 8 == b1.states.optimizer);
  CHECK(b8.peak < b1.peak);
  // six ranks do not divide 2048 rows: each rank stores ⌈2048 / 6⌉ = 342 rows, so the weights are
  // more than a sixth; rank 5's last chunks are short, so its optimizer state is smaller
  Job six = one;
  six.parallel.fsdp = 6;
  const Budget r0 = predict(llama1b(), six);
  CHECK(r0.states.weights * 6 > b1.states.weights);
  six.parallel.rank = 5;
  const Budget r5 = predict(llama1b(), six);
  CHECK(r5.states.weights == r0.states.weights);
  CHECK(r5.states.optimizer < r0.states.optimizer);
  // without the rank, the most loaded one (rank 0) is predicted, and --format json lists both groups
  six.parallel.rank.reset();
  PredictOptions o;
  o.ranks = true;
  const Budget all = predict(llama1b(), six, o);
  CHECK(all.rank == 0);
  REQUIRE(all.ranks.size() == 2);
  CHECK(all.ranks[0].ranks == std::vector<std::uint64_t>{0, 1, 2, 3, 4});
  CHECK(all.ranks[1].ranks == std::vector<std::uint64_t>{5});
  CHECK(all.ranks[1].peak == r5.peak);
  CHECK(all.ranks[0].peak == all.peak);
}

TEST_CASE("without reshard after forward the forward keeps every layer's parameters gathered") {
  Job j = small_job();
  j.precision = Precision::bf16;
  j.parallel.fsdp = 8;
  const Budget keep_sharded = predict(llama1b(), j);
  j.parallel.reshard_after_forward = false;
  const Budget gathered = predict(llama1b(), j);
  // the floor is the same; the forward peak grows by about the 15 other layers' bf16 parameters
  CHECK(gathered.phase(Phase::floor) == keep_sharded.phase(Phase::floor));
  const auto p = llama1b().parameters();
  const double layer_bytes = static_cast<double>(p.per_layer) * 2;
  const double grown = static_cast<double>(gathered.phase(Phase::forward_peak) - keep_sharded.phase(Phase::forward_peak));
  CHECK(grown > 14 * layer_bytes);
  CHECK(grown < 17 * layer_bytes);
  // --zero 2 and 3 over --dp are FSDP2 without and with reshard after forward
  Job z = small_job();
  z.precision = Precision::bf16;
  z.parallel.data = 8;
  z.parallel.zero_stage = 2;
  CHECK(predict(llama1b(), z).phase(Phase::forward_peak) == gathered.phase(Phase::forward_peak));
  z.parallel.zero_stage = 3;
  CHECK(predict(llama1b(), z).phase(Phase::forward_peak) == keep_sharded.phase(Phase::forward_peak));
}

TEST_CASE("DDP adds one gradient-sized bucket; ZeRO-1 splits the optimizer state by whole tensors") {
  Job one = small_job();
  const Budget b1 = predict(llama1b(), one);
  Job ddp = one;
  ddp.parallel.data = 4;
  const Budget bd = predict(llama1b(), ddp);
  const double grads = static_cast<double>(llama1b().parameters().total) * 4;  // fp32 under amp-bf16
  const double extra = static_cast<double>(bd.phase(Phase::floor) - b1.phase(Phase::floor));
  CHECK(extra >= grads);
  CHECK(extra < grads * 1.001);
  // gradient_as_bucket_view: the gradients are the bucket's views, so the optimizer step, which
  // holds every gradient, drops by about them
  Job view = ddp;
  view.parallel.ddp_bucket_view = true;
  CHECK(static_cast<double>(predict(llama1b(), view).phase(Phase::optimizer_peak)) <
        static_cast<double>(bd.phase(Phase::optimizer_peak)) - grads * 0.9);
  // ZeRO-1: the ranks' states add up to the whole state, and the most loaded rank is predicted
  Job z = ddp;
  z.parallel.zero_stage = 1;
  PredictOptions o;
  o.ranks = true;
  const Budget bz = predict(llama1b(), z, o);
  bytes_t sum = 0, most = 0;
  for (std::uint64_t r = 0; r < 4; ++r) {
    Job at = z;
    at.parallel.rank = r;
    const bytes_t s = predict(llama1b(), at).states.optimizer;
    sum += s;
    most = std::max(most, s);
  }
  CHECK(sum == b1.states.optimizer);
  CHECK(bz.states.optimizer == most);
  CHECK(!bz.ranks.empty());
}

TEST_CASE("tensor parallelism: the projections are sharded, the embedding and norms replicated") {
  Job one = small_job();
  one.precision = Precision::bf16;
  Job two = one;
  two.parallel.tensor = 2;
  const Budget b1 = predict(llama1b(), one), b2 = predict(llama1b(), two);
  const auto p = llama1b().parameters();
  // the decoder's projections halve; the tied embedding and the norms stay whole
  const bytes_t layer_norms = 2 * llama1b().hidden_size * llama1b().num_layers;
  const bytes_t projections = p.layers - layer_norms;
  CHECK(b2.states.weights == (p.embedding + p.final_norm + layer_norms + projections / 2) * 2);
  CHECK(b2.peak < b1.peak);
}

TEST_CASE("the compiled plan gives a parallel job's simulation exactly, at any shape") {
  const ModelSpec qwen = load_model(test::source_path("configs/hf/qwen2.5-1.5b.json"));
  for (const ModelSpec* m : {&llama1b(), &qwen})
    for (int layout = 0; layout < 26; ++layout) {
      Job j = small_job();
      Parallelism& p = j.parallel;
      switch (layout) {
        case 0: p.fsdp = 8; break;
        case 1: p.fsdp = 6; p.reshard_after_forward = false; j.precision = Precision::bf16; break;
        case 2: p.data = 2; p.fsdp = 4; j.recompute = Recompute::full; break;
        case 3: p.data = 8; p.ddp_bucket_view = true; break;
        case 4: p.data = 4; p.zero_stage = 1; j.precision = Precision::bf16; break;
        case 5: p.tensor = 2; break;
        // sequence parallelism: the plan is in the local sequence s / t
        case 6: p.tensor = 2; p.sequence_parallel = true; break;
        case 7: p.tensor = 2; p.sequence_parallel = true; p.loss_parallel = true; j.precision = Precision::bf16; break;
        case 8: p.tensor = 2; p.sequence_parallel = true; j.recompute = Recompute::full; break;
        // FSDP2's CPU offload: the GPU copies and staging buffers compiled, the host memory constant
        case 9: p.fsdp = 4; p.fsdp_offload = true; break;
        case 10: p.fsdp = 8; p.fsdp_offload = true; p.reshard_after_forward = false; j.precision = Precision::bf16; break;
        // pipeline stages: one plan per stage, the most loaded chosen as predict() chooses it
        case 11: p.pipeline = 2; p.microbatches = 4; j.precision = Precision::bf16; break;
        case 12: p.pipeline = 2; p.microbatches = 3; p.pp_schedule = PipelineSchedule::gpipe; j.precision = Precision::bf16; break;
        case 13: p.pipeline = 4; p.microbatches = 4; j.precision = Precision::bf16; j.recompute = Recompute::full; break;
        case 14: p.pipeline = 2; p.pp_schedule = PipelineSchedule::interleaved; p.virtual_stages = 2; p.microbatches = 4;
                 j.precision = Precision::bf16; break;
        case 15: p.data = 2; p.fsdp = 2; p.tensor = 2; j.precision = Precision::bf16; break;
        // context parallelism: the plan is in the rank's share of the sequence
        case 16: p.context = 2; j.precision = Precision::bf16; break;
        case 17: p.context = 4; p.fsdp = 2; j.recompute = Recompute::full; break;
        // the vocabulary-parallel loss without SP: lm_head's shard, the embedding whole
        case 18: p.tensor = 2; p.loss_parallel = true; j.precision = Precision::bf16; break;
        // FSDP2 within pipeline stages: each stage's first shard compiled, the most loaded chosen
        case 19: p.pipeline = 2; p.fsdp = 4; p.microbatches = 4; j.precision = Precision::bf16; break;
        case 20: p.pipeline = 2; p.fsdp = 3; p.microbatches = 4; p.reshard_after_forward = false; break;
        case 21: p.pipeline = 4; p.fsdp = 2; p.microbatches = 8; p.pp_schedule = PipelineSchedule::gpipe;
                 j.recompute = Recompute::full; j.precision = Precision::bf16; break;
        // tensor parallelism, FSDP2 × TP and DDP within pipeline stages
        case 22: p.pipeline = 2; p.tensor = 2; p.microbatches = 4; j.precision = Precision::bf16; break;
        case 23: p.pipeline = 2; p.tensor = 2; p.fsdp = 2; p.microbatches = 4; break;
        case 24: p.pipeline = 2; p.data = 2; p.microbatches = 4; p.pp_schedule = PipelineSchedule::gpipe;
                 j.precision = Precision::bf16; j.recompute = Recompute::full; break;
        case 25: p.pipeline = 4; p.data = 2; p.ddp_bucket_view = true; p.microbatches = 4; j.precision = Precision::bf16; break;
      }
      j.batch = 1;
      j.seq = 1024;
      CAPTURE(layout);
      for (std::uint64_t stage = 0; stage < p.pipeline; ++stage) {  // compiled, not simulated
        Job at = j;
        if (p.pipeline > 1) at.parallel.rank = stage * detail::ranks_per_stage(p);
        CHECK(detail::StepPlan::cached(*m, at) != nullptr);
      }
      for (const auto& shape : {std::pair<std::uint64_t, std::uint64_t>{1, 776}, {3, 2048}, {2, 5000}}) {
        // (no structured binding: clang 14 cannot capture one in a doctest CAPTURE)
        const std::uint64_t b = shape.first, s = shape.second;
        j.batch = b;
        j.seq = s;
        PredictOptions full;
        full.full_simulation = true;
        const Budget fast = predict(*m, j), sim = predict(*m, j, full);
        CAPTURE(layout);
        CAPTURE(b);
        CAPTURE(s);
        for (Phase ph : kTrainPhases) CHECK(fast.phase(ph) == sim.phase(ph));
        CHECK(fast.peak == sim.peak);
        // estimate() from the plan reports the same terms as predict() (the logits of a vocabulary shard)
        const Estimate e = estimate(*m, j);
        CHECK(e.peak == fast.peak);
        CHECK(e.terms.logits_loss == fast.terms.logits_loss);
        CHECK(e.terms.activations == fast.terms.activations);
        CHECK(e.terms.model_states == fast.terms.model_states);
        CHECK(fast.host.total() == sim.host.total());
        CHECK(fast.host.optimizer_state == sim.host.optimizer_state);
        if (p.fsdp_offload) CHECK(fast.host.parameters > 0);
      }
    }
}

TEST_CASE("the layout reaches the job from YAML's job.parallel and the C ABI's keys") {
  const std::string yaml = "job:\n  batch: 2\n  parallel:\n    fsdp: 8\n    reshard_after_forward: false\n    rank: 3\n";
  const Job j = parse_job_section(yaml, "spec.yaml", Job{});
  CHECK(j.parallel.fsdp == 8);
  CHECK_FALSE(j.parallel.reshard_after_forward);
  CHECK(j.parallel.rank == 3u);
  CHECK_THROWS_AS(parse_job_section("job:\n  parallel:\n    fsdpp: 8\n", "spec.yaml", Job{}), Error);
  const Job pp = parse_job_section(
      "job:\n  precision: bf16\n  parallel:\n    pp: 2\n    pp_schedule: gpipe\n    microbatches: 6\n    pp_layers: 10,6\n",
      "spec.yaml", Job{});
  CHECK(pp.parallel.pipeline == 2);
  CHECK(pp.parallel.pp_schedule == PipelineSchedule::gpipe);
  CHECK(pp.parallel.microbatches == 6);
  CHECK(pp.parallel.pp_layers == std::vector<std::uint64_t>{10, 6});
  try {  // a bad value names the file, line and key
    (void)parse_job_section("job:\n  parallel:\n    pp: 2\n    pp_layers: 10,,6\n", "spec.yaml", Job{});
    FAIL("accepted pp_layers 10,,6");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("spec.yaml:4: job.parallel.pp_layers") != std::string::npos);
  }
  CHECK_THROWS_AS(parse_job_section("job:\n  parallel: 8\n", "spec.yaml", Job{}), Error);
  Job k;
  set_job_option(k, "dp", "4");
  set_job_option(k, "zero", "1");
  set_job_option(k, "ddp_bucket_view", "true");
  CHECK(k.parallel.data == 4);
  CHECK(k.parallel.zero_stage == 1);
  CHECK(k.parallel.ddp_bucket_view);
  CHECK_THROWS_AS(set_job_option(k, "zero", "4"), Error);
}

TEST_CASE("sweep takes lists of layouts: each point is that layout's estimate, a layout not modelled is an invalid point") {
  SweepGrid g;
  g.batches = {1, 2};
  g.dps = {1, 2};
  g.fsdps = {1, 8};
  g.tps = {1, 4};
  const auto pts = sweep(llama1b(), small_job(), g, find_device("H100"));
  REQUIRE(pts.size() == 16);
  int invalid = 0;
  for (const auto& p : pts) {
    CAPTURE(p.dp);
    CAPTURE(p.fsdp);
    CAPTURE(p.tp);
    if (p.dp > 1 && p.tp > 1 && p.fsdp == 1) {  // DDP with TP: not a PyTorch layout
      CHECK_FALSE(p.ok);
      CHECK(p.error_kind == ErrorKind::unsupported);
      ++invalid;
      continue;
    }
    REQUIRE(p.ok);  // FSDP2 and HSDP over TP groups (--fsdp 8 --tp 4, --dp 2 --fsdp 8 --tp 4) included
    Job j = small_job();
    j.batch = p.batch;
    j.parallel.data = p.dp;
    j.parallel.fsdp = p.fsdp;
    j.parallel.tensor = p.tp;
    CHECK(p.estimate.peak == predict(llama1b(), j).peak);
  }
  CHECK(invalid == 2);
  SweepGrid big;
  for (std::uint64_t f = 1; f <= 1024; ++f) big.fsdps.push_back(f);
  for (std::uint64_t b = 1; b <= 100; ++b) big.batches.push_back(b);
  big.seqs = {1024, 2048};
  CHECK_THROWS_AS(sweep(llama1b(), small_job(), big), Error);  // 204,800 points: over the limit, refused first
}

TEST_CASE("sweep on the command line takes the layout's own options beside its lists") {
  const std::string cfg = test::source_path("configs/llama-3.2-1b.yaml");
  // each was refused as if the --pp, --dp, --tp or --fsdp beside it had not been given
  struct Case {
    const char* flags;
    const char* predict_flags;  // the same job, one point
  };
  for (const Case& c : {Case{"--pp 2 --microbatches 4", "--pp 2 --microbatches 4"},
                        Case{"--pp 2 --pp-layers 10,6", "--pp 2 --pp-layers 10,6"},
                        Case{"--tp 2 --sp", "--tp 2 --sp"},
                        Case{"--dp 4 --zero 1", "--dp 4 --zero 1"},
                        Case{"--dp 4 --rank 3", "--dp 4 --rank 3"},
                        Case{"--fsdp 2 --reshard-after-forward false", "--fsdp 2 --reshard-after-forward false"}}) {
    CAPTURE(c.flags);
    const auto swept = test::run_cli("sweep " + cfg + " -b 1 -s 128 --precision bf16 --format json " + c.flags + " 2>/dev/null");
    REQUIRE(swept.exit_code == 0);
    const auto points = nlohmann::json::parse(swept.out)["points"];
    REQUIRE(points.size() == 1);
    REQUIRE(points[0]["ok"] == true);
    const auto one = test::run_cli("predict " + cfg + " -b 1 -s 128 --precision bf16 --format json " + c.predict_flags +
                                   " 2>/dev/null");
    REQUIRE(one.exit_code == 0);
    // (the sweep's allocated figures are estimate()'s, predict's the replay's: the same model states)
    CHECK(points[0]["model_states"] == nlohmann::json::parse(one.out)["terms"]["model_states"]);
  }
  // a point whose layout does not take an option is a row with its error, the others computed
  const auto mixed = test::run_cli("sweep " + cfg + " -b 1 -s 128 --precision bf16 --format json --pp 1,2 --microbatches 4");
  REQUIRE(mixed.exit_code == 0);
  const auto rows = nlohmann::json::parse(mixed.out)["points"];
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["ok"] == false);
  CHECK(rows[0]["error"].get<std::string>().find("--microbatches: applies to pipeline parallelism") != std::string::npos);
  CHECK(rows[1]["ok"] == true);
  // with no layout of the grid taking it, every point is a row with the refusal, and the exit is 2
  const auto none = test::run_cli("sweep " + cfg + " -b 1 -s 128 --microbatches 4");
  CHECK(none.exit_code == 2);
  CHECK(none.out.find("--microbatches: applies to pipeline parallelism") != std::string::npos);
  // a grid past the point limit is refused at once, whatever options ride on it (a search for a
  // layout that takes them ran over a million layouts first)
  const auto t0 = std::chrono::steady_clock::now();
  const auto huge = test::run_cli("sweep " + cfg + " --dp 1..1000 --tp 1..1000 --microbatches 4 -b 1 -s 128");
  CHECK(huge.exit_code == 2);
  CHECK(huge.out.find("more than the limit of 100000 points") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  // the TrainingArguments from standard input are read once, whatever the layouts
  const auto piped = test::run_cli("sweep " + cfg + " -b 1 -s 128 --precision bf16 --pp 1,2 --microbatches 4 --format json --trainer-args - < " +
                                   test::source_path("tests/data/trainer_args/bf16_fused_checkpointing.json"));
  REQUIRE(piped.exit_code == 0);
  const auto piped_rows = nlohmann::json::parse(piped.out)["points"];
  REQUIRE(piped_rows.size() == 2);
  CHECK(piped_rows[0]["recompute"] == "full");  // the file's gradient checkpointing, at both points
  CHECK(piped_rows[1]["recompute"] == "full");
}

TEST_CASE("the layout flags on the command line: predicted per rank, bad values exit 2 naming the flag") {
  const std::string cfg = test::source_path("configs/llama-3.2-1b.yaml");
  auto r = test::run_cli("predict " + cfg + " --batch 1 --seq 1024 --fsdp 6 --format json 2>/dev/null");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["rank"] == 0);
  CHECK(j["job"]["parallel"]["fsdp"] == 6);
  CHECK(j["job"]["parallel"]["world"] == 6);
  REQUIRE(j["ranks"].size() == 2);  // ranks 0-4 hold full chunks, rank 5 the short ones
  CHECK(j["ranks"][1]["ranks"] == nlohmann::json::array({5}));
  CHECK(j["reserved_peak"].get<std::uint64_t>() > 0);  // FSDP2's streams replayed
  auto table = test::run_cli("predict " + cfg + " --batch 1 --seq 1024 --dp 4 --zero 1");
  CHECK(table.exit_code == 0);
  CHECK(table.out.find("ZeRO-1") != std::string::npos);
  CHECK(table.out.find("(the most loaded)") != std::string::npos);
  // max-batch searches one rank of the layout and says so
  auto mb = test::run_cli("max-batch " + cfg + " --device H100 --seq 1024 --fsdp 8");
  CHECK(mb.exit_code == 0);
  CHECK(mb.out.find("one rank of FSDP2 over 8 ranks") != std::string::npos);
  struct Bad {
    const char* flags;
    const char* named;
  };
  for (const Bad& b : {Bad{"--fsdp 0", "--fsdp"}, Bad{"--fsdp x", "--fsdp"}, Bad{"--zero 4", "--zero"},
                       Bad{"--zero 1", "--zero"}, Bad{"--reshard-after-forward maybe", "--reshard-after-forward"},
                       Bad{"--fsdp 8 --rank 9", "--rank"}, Bad{"--rank -1", "--rank"}, Bad{"--ddp-bucket-view", "--ddp-bucket-view"},
                       Bad{"--tp 3", "--tp 3"}, Bad{"--pp 2 --tp 2 --sp", "--pp 2"}, Bad{"--sp", "--sp"}, Bad{"--loss-parallel", "--loss-parallel"}, Bad{"--dp 2 --fsdp-offload", "--fsdp-offload"},
                       Bad{"--precision bf16 --pp 17", "--pp 17"}, Bad{"--precision bf16 --pp 2 --pp-layers 8,7", "--pp-layers"},
                       Bad{"--precision bf16 --pp 2 --pp-layers 8,8,0", "--pp-layers"},
                       Bad{"--precision bf16 --pp 2 --pp-layers 8,x", "--pp-layers"},
                       Bad{"--precision bf16 --pp 4 --microbatches 2", "--microbatches"},
                       Bad{"--precision bf16 --microbatches 4", "--microbatches"},
                       Bad{"--precision bf16 --pp 2 --pp-schedule interleaved", "--virtual-stages"},
                       Bad{"--precision bf16 --pp 2 --pp-schedule interleaved --virtual-stages 2 --microbatches 5", "--microbatches"},
                       Bad{"--precision bf16 --pp 4 --pp-schedule interleaved --virtual-stages 8",
                           "--pp 4 × --virtual-stages 8: llama-3.2-1b has only 16 decoder layers, fewer than the 32 stage modules"},
                       Bad{"--precision bf16 --pp 2 --pp-schedule zigzag", "--pp-schedule"},
                       Bad{"--precision bf16 --pp 2 --virtual-stages 2", "--virtual-stages"},
                       Bad{"--tp 2 --dp 2", "HSDP"}, Bad{"--tp 2 --dp 2 --zero 1", "--tp 2"},
                       Bad{"--precision bf16 --cp 0", "--cp"}, Bad{"--precision bf16 --cp 2 --tp 2", "--cp 2"},
                       Bad{"--precision bf16 --cp 3 --seq 1024", "--seq 1024 is not divisible by 2 × 3"},
                       Bad{"--precision bf16 --cp 2 --attention math", "ring attention"},
                       Bad{"--precision fp32 --cp 2", "--precision fp32"}, Bad{"--mode infer --cp 2", "--cp"},
                       Bad{"--pp 2", "--precision amp-bf16"}, Bad{"--mode infer --pp 2", "--pp"},
                       Bad{"--dp 99999999999999999999", "--dp"}, Bad{"--mode infer --fsdp 2", "--fsdp"}}) {
    CAPTURE(b.flags);
    auto e = test::run_cli("predict " + cfg + " " + b.flags);
    CHECK(e.exit_code == 2);
    CHECK(e.out.find(b.named) != std::string::npos);
  }
}


