// The command line: predict's output contract and its errors.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "membudget/api.hpp"

using namespace membudget;

namespace {
std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = "/tmp/membudget_test_" + name;
  std::ofstream(path) << text;
  return path;
}
}  // namespace

TEST_CASE("predict --format json keeps the contract's keys, all sizes integer bytes") {
  auto r = test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") +
                         " --format json --device H200");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["model"]["name"] == "llama-3.2-1b");
  CHECK(j["model"]["parameters"] == 1235814400);
  for (const char* k : {"model_states", "activations", "logits_loss", "kv_cache", "overhead"})
    CHECK(j["terms"][k].is_number_unsigned());
  for (const char* k : {"floor", "forward_peak", "backward_peak", "optimizer_peak"}) {
    CHECK(j["phases"][k].is_number_unsigned());
    CHECK(j["step0"][k].is_number_unsigned());
  }
  CHECK(j["peak"].is_number_unsigned());
  CHECK(j["peak_phase"].is_string());
  CHECK(j["job"]["batch"] == 4);
  CHECK(j["job"]["seq"] == 4096);
  CHECK(j["job"]["precision"] == "amp-bf16");
  for (const char* k : {"name", "capacity", "required", "headroom", "fits"}) CHECK(j["device"].contains(k));
  // the fit is decided on what nvidia-smi will show; the allocated figure is beside it
  CHECK(j["device"]["basis"] == "reserved");
  CHECK(j["device"]["required"].get<std::uint64_t>() == j["nvidia_smi"].get<std::uint64_t>());
  CHECK(j["device"]["allocated_required"].get<std::uint64_t>() ==
        j["peak"].get<std::uint64_t>() + j["terms"]["overhead"].get<std::uint64_t>());
}

TEST_CASE("flags override the YAML job section") {
  auto a = nlohmann::json::parse(
      test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") + " --format json").out);
  auto b = nlohmann::json::parse(
      test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") + " --format json --batch 2").out);
  CHECK(b["job"]["batch"] == 2);
  CHECK(b["peak"].get<std::uint64_t>() < a["peak"].get<std::uint64_t>());
}

TEST_CASE("a job that does not fit exits 1; the table names the peak") {
  auto r = test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") + " --device RTX-4090");
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("DOES NOT FIT") != std::string::npos);
  CHECK(r.out.find("Peak") != std::string::npos);
  auto csv = test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") + " --format csv");
  CHECK(csv.exit_code == 0);
  CHECK(csv.out.find("phases,backward_peak,") != std::string::npos);
  auto md = test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") + " --format markdown");
  CHECK(md.out.find("| phase | bytes | size |") != std::string::npos);
}

TEST_CASE("bad inputs: clear errors and exit code 2, never a crash") {
  const std::string cfg = test::source_path("configs/llama-3.2-1b.yaml");
  struct Case {
    std::string args;
    std::string expect;
  };
  const Case cases[] = {
      {"predict " + cfg + " --precision fp64", "--precision"},
      {"predict " + cfg + " --optimizer adam9", "--optimizer"},
      {"predict " + cfg + " --batch -3", "--batch"},
      {"predict " + cfg + " --batch 0", "--batch"},
      {"predict " + cfg + " --seq 99999999999999999999", "--seq"},
      {"predict " + cfg + " --device-memory eighty", "--device-memory"},
      {"predict " + cfg + " --device Z80", "--device"},
      {"predict " + cfg + " --format yaml", "--format"},
      {"predict " + write_temp("bad.yaml", "name: x\nhidden_size: [1, 2\n"), "bad.yaml"},
      {"predict " + write_temp("neg.yaml", "name: x\nvocab_size: 100\nhidden_size: -64\n"), "hidden_size"},
      {"predict " + write_temp("badjob.yaml",
                               "name: t\nvocab_size: 256\nhidden_size: 64\nintermediate_size: 160\nnum_layers: 2\n"
                               "num_heads: 4\nnum_kv_heads: 2\nmax_positions: 512\njob:\n  batch: 2\n  precisoin: bf16\n"),
       "precisoin"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    auto r = test::run_cli(c.args);
    CHECK(r.exit_code == 2);
    CHECK(r.out.find(c.expect) != std::string::npos);
    CHECK(r.out.find("internal error") == std::string::npos);
  }
  // A file that cannot be read is an I/O error: exit 5.
  auto missing = test::run_cli("predict /nonexistent/model.yaml");
  CHECK(missing.exit_code == 5);
  CHECK(missing.out.find("/nonexistent/model.yaml") != std::string::npos);
  // An unknown subcommand option is CLI11's error, still exit 2.
  CHECK(test::run_cli("predict " + cfg + " --frobnicate").exit_code == 2);
}

TEST_CASE("a Hugging Face config.json predicts the same as our YAML") {
  auto a = nlohmann::json::parse(
      test::run_cli("predict " + test::source_path("configs/llama-3.2-1b.yaml") + " --format json --batch 1 --seq 512").out);
  auto b = nlohmann::json::parse(
      test::run_cli("predict " + test::source_path("tests/data/hf/llama-3.2-1b.json") + " --format json --batch 1 --seq 512").out);
  CHECK(a["phases"] == b["phases"]);
  CHECK(a["model"]["parameters"] == b["model"]["parameters"]);
}

TEST_CASE("--lora: the LoRA job from the flag, the YAML job section and set_job_option; bad ranks are errors") {
  const std::string model = test::source_path("configs/llama-3.2-1b.yaml");
  const auto r = test::run_cli("predict " + model + " --lora 16 --batch 1 --seq 2048 --precision bf16 --format json");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["job"]["lora_rank"] == 16);
  const auto full = nlohmann::json::parse(
      test::run_cli("predict " + model + " --batch 1 --seq 2048 --precision bf16 --format json").out);
  CHECK_FALSE(full["job"].contains("lora_rank"));
  CHECK(j["breakdown"]["model_states"]["gradients"].get<std::uint64_t>() * 50 <
        full["breakdown"]["model_states"]["gradients"].get<std::uint64_t>());
  Job viaopt;
  set_job_option(viaopt, "lora", "8");
  CHECK(viaopt.lora_rank == 8);
  CHECK_THROWS_AS(set_job_option(viaopt, "lora", "-1"), Error);
  const std::string yaml = write_temp("lora.yaml",
      "name: t\nfamily: llama\nvocab_size: 1024\nhidden_size: 128\nintermediate_size: 384\nnum_layers: 2\n"
      "num_heads: 8\nnum_kv_heads: 2\nmax_positions: 4096\njob:\n  lora: 4\n  seq: 64\n");
  const auto y = test::run_cli("predict " + yaml + " --format json");
  REQUIRE(y.exit_code == 0);
  CHECK(nlohmann::json::parse(y.out)["job"]["lora_rank"] == 4);
  CHECK(test::run_cli("predict " + model + " --lora x").exit_code == 2);
  CHECK(test::run_cli("predict " + model + " --lora 100000").exit_code == 2);
  CHECK(test::run_cli("predict " + model + " --lora 16 --optimizer adafactor").exit_code == 2);
}

TEST_CASE("--optimizer-impl: the flag, the YAML job section, set_job_option and the JSON echo; impls torch does not offer are errors") {
  const std::string model = test::source_path("configs/llama-3.2-1b.yaml");
  auto predict_json = [&](const std::string& flags) {
    const auto r = test::run_cli("predict " + model + " --batch 1 --seq 512 --format json " + flags);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.out);
  };
  // the default is torch.optim's: foreach for AdamW and SGD, the for-loop for Adafactor; none for
  // optimizers outside torch.optim
  CHECK(predict_json("")["job"]["optimizer_impl"] == "foreach");
  CHECK(predict_json("--optimizer sgd-momentum")["job"]["optimizer_impl"] == "foreach");
  CHECK(predict_json("--optimizer adafactor")["job"]["optimizer_impl"] == "for-loop");
  CHECK(predict_json("--optimizer lion")["job"]["optimizer_impl"].is_null());
  CHECK(predict_json("--optimizer adamw-8bit")["job"]["optimizer_impl"].is_null());
  const auto foreach = predict_json("--optimizer-impl foreach");
  const auto fused = predict_json("--optimizer-impl fused");
  const auto loop = predict_json("--optimizer-impl for-loop");
  CHECK(fused["job"]["optimizer_impl"] == "fused");
  CHECK(loop["job"]["optimizer_impl"] == "for-loop");
  CHECK(foreach["phases"] == predict_json("")["phases"]);  // explicit foreach is the default
  // the step's temporaries: all parameters at once > the largest parameter's two > none
  const auto opt = [](const nlohmann::json& j) { return j["phases"]["optimizer_peak"].get<std::uint64_t>(); };
  CHECK(opt(foreach) > opt(loop));
  CHECK(opt(loop) > opt(fused));
  CHECK(fused["phases"]["backward_peak"] == foreach["phases"]["backward_peak"]);
  // AdamW for-loop, Llama 3.2 1B in amp-bf16: two fp32 copies of the 128256 × 2048 embedding
  CHECK(opt(loop) - opt(fused) == 2 * 1002ull * MiB);
  // SGD with momentum: no temporary in any implementation
  CHECK(predict_json("--optimizer sgd-momentum --optimizer-impl fused")["phases"] ==
        predict_json("--optimizer sgd-momentum --optimizer-impl for-loop")["phases"]);
  // Adafactor's foreach: one parameter-sized list
  CHECK(opt(predict_json("--optimizer adafactor --optimizer-impl foreach")) >
        opt(predict_json("--optimizer adafactor")));

  Job viaopt;
  set_job_option(viaopt, "optimizer-impl", "fused");
  CHECK(viaopt.optimizer_impl == OptimizerImpl::fused);
  set_job_option(viaopt, "optimizer_impl", "for_loop");
  CHECK(viaopt.optimizer_impl == OptimizerImpl::for_loop);
  CHECK_THROWS_AS(set_job_option(viaopt, "optimizer-impl", "vectorized"), Error);
  const std::string yaml = write_temp("optimizer_impl.yaml",
      "name: t\nfamily: llama\nvocab_size: 1024\nhidden_size: 128\nintermediate_size: 384\nnum_layers: 2\n"
      "num_heads: 8\nnum_kv_heads: 2\nmax_positions: 4096\njob:\n  optimizer_impl: fused\n  seq: 64\n");
  const auto y = test::run_cli("predict " + yaml + " --format json");
  REQUIRE(y.exit_code == 0);
  CHECK(nlohmann::json::parse(y.out)["job"]["optimizer_impl"] == "fused");
  const auto flag_over_yaml = test::run_cli("predict " + yaml + " --optimizer-impl for-loop --format json");
  CHECK(nlohmann::json::parse(flag_over_yaml.out)["job"]["optimizer_impl"] == "for-loop");

  // what torch.optim does not offer is an error naming both
  const auto adafactor_fused = test::run_cli("predict " + model + " --optimizer adafactor --optimizer-impl fused");
  CHECK(adafactor_fused.exit_code == 2);
  CHECK(adafactor_fused.out.find("fused") != std::string::npos);
  CHECK(adafactor_fused.out.find("adafactor") != std::string::npos);
  for (const char* o : {"adamw-8bit", "lion"}) {
    const auto r = test::run_cli("predict " + model + " --optimizer " + o + " --optimizer-impl fused");
    CHECK(r.exit_code == 2);
    CHECK(r.out.find(o) != std::string::npos);
  }
  CHECK(test::run_cli("predict " + model + " --optimizer-impl fast").exit_code == 2);
  CHECK(test::run_cli("predict " + model + " --profile harness --optimizer-impl foreach").exit_code == 2);
  CHECK(test::run_cli("predict " + model + " --profile harness --optimizer-impl fused --batch 1 --seq 256").exit_code == 0);
  // the other job commands take it
  CHECK(test::run_cli("max-batch " + model + " --device H100 --seq 2048 --optimizer-impl fused").exit_code == 0);
  CHECK(test::run_cli("sweep " + model + " --batch 1..2 --seq 512 --optimizer-impl for-loop --format csv").exit_code == 0);
  CHECK(test::run_cli("advise " + model + " --device L40S --optimizer-impl fused").exit_code == 0);
}
