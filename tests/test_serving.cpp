// Serving: KV cache bytes, quantized weights, vLLM's pool, traffic, errors, and the serve command.
#include <doctest/doctest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "membudget/api.hpp"
#include "membudget/budget.hpp"
#include "membudget/error.hpp"
#include "membudget/serving.hpp"

using namespace membudget;

namespace {
ModelSpec cfg(const std::string& rel) { return load_model(test::source_path(rel)); }
}  // namespace

TEST_CASE("KV cache: Llama 3.1 8B in bf16 is 131,072 bytes per token") {
  const ModelSpec m = cfg("configs/llama-3.1-8b.yaml");
  CHECK(kv_bytes_per_token(m, DType::bf16) == 131072);
  CHECK(kv_bytes_per_token(m, DType::fp16) == 131072);
  CHECK(kv_bytes_per_token(m, DType::fp8) == 65536);  // fp8 halves it
  CHECK(kv_bytes_per_token(m, DType::int8) == 65536);
  CHECK(kv_cache_bytes(m, DType::bf16, 4, 4096) == 4ull * 4096 * 131072);
  CHECK(kv_bytes_per_token(cfg("tests/data/hf/llama-3.1-8b.json"), DType::bf16) == 131072);
}

TEST_CASE("KV cache: MHA, GQA and MQA differ only in kv_heads") {
  ModelSpec m = test::toy_llama();  // 3 layers, 8 heads of 16
  m.num_kv_heads = 8;               // MHA
  CHECK(kv_bytes_per_token(m, DType::bf16) == 2ull * 3 * 8 * 16 * 2);
  m.num_kv_heads = 2;  // GQA
  CHECK(kv_bytes_per_token(m, DType::bf16) == 2ull * 3 * 2 * 16 * 2);
  m.num_kv_heads = 1;  // MQA
  CHECK(kv_bytes_per_token(m, DType::bf16) == 2ull * 3 * 1 * 16 * 2);
  CHECK(kv_bytes_per_token(m, DType::fp8) == 2ull * 3 * 1 * 16 * 1);
  CHECK_THROWS_AS(kv_bytes_per_token(m, DType::int4), Error);
}

TEST_CASE("KV cache: an MLA spec caches the latent and the rotary key, without the factor 2") {
  const ModelSpec m = cfg("tests/data/hf/tiny-mla.json");  // kv_lora_rank 32, rope 8, 2 layers
  REQUIRE(m.mla.enabled());
  CHECK(kv_bytes_per_token_layer(m, DType::bf16) == (32 + 8) * 2);
  CHECK(kv_bytes_per_token(m, DType::bf16) == 2 * (32 + 8) * 2);
  CHECK(kv_bytes_per_token(m, DType::fp8) == 2 * (32 + 8));
}

TEST_CASE("KV cache: Mistral's sliding window caps a sequence at 4096 tokens") {
  const ModelSpec m = cfg("configs/mistral-7b.yaml");
  const bytes_t per = kv_bytes_per_token(m, DType::bf16);
  CHECK(per == 2ull * 32 * 8 * 128 * 2);
  CHECK(kv_bytes_per_sequence(m, DType::bf16, 1000) == 1000 * per);
  CHECK(kv_bytes_per_sequence(m, DType::bf16, 4096) == 4096 * per);
  CHECK(kv_bytes_per_sequence(m, DType::bf16, 32768) == 4096 * per);
}

TEST_CASE("KV cache: Gemma 2 windows every other layer") {
  const ModelSpec m = cfg("configs/gemma-2-9b.yaml");  // 42 layers, 21 windowed at 4096
  const bytes_t layer = 2ull * 8 * 256 * 2;
  CHECK(kv_bytes_per_token_layer(m, DType::bf16) == layer);
  CHECK(kv_bytes_per_sequence(m, DType::bf16, 2048) == 42 * 2048 * layer);
  CHECK(kv_bytes_per_sequence(m, DType::bf16, 8192) == (21 * 8192 + 21 * 4096) * layer);
}

TEST_CASE("weights: bf16, fp8, int8 and int4 with group-wise scales, exact on a toy spec") {
  // toy llama: h 128, I 384, 3 layers, q 128, kv 32, vocab 1024, tied
  const ModelSpec m = test::toy_llama();
  const std::uint64_t P = m.parameters().total;
  CHECK(serving_weight_bytes(m, DType::bf16) == 2 * P);
  // linear layers per decoder layer: q 128×128, k 128×32, v 128×32, o 128×128, gate/up 128×384, down 384×128
  const std::uint64_t lin = 3 * (128 * 128 + 2 * 128 * 32 + 128 * 128 + 3 * 128 * 384);
  const std::uint64_t rest = P - lin;  // embedding, norms
  CHECK(rest == 1024 * 128 + 3 * 2 * 128 + 128);
  CHECK(serving_weight_bytes(m, DType::fp8) == lin + 3 * 7 * 4 + 2 * rest);
  // int8, group 128: one fp16 scale per 128 inputs per output
  const std::uint64_t scales8 = 3 * 2 * (1 * 128 + 1 * 32 + 1 * 32 + 1 * 128 + 1 * 384 + 1 * 384 + 3 * 128);
  CHECK(serving_weight_bytes(m, DType::int8, 128) == lin + scales8 + 2 * rest);
  // int4, group 64: qweight K/8·N int32, scales ceil(K/64)·N fp16, qzeros ceil(K/64)·ceil(N/8) int32
  auto q4 = [](std::uint64_t K, std::uint64_t N) {
    return (K / 8) * N * 4 + ((K + 63) / 64) * N * 2 + ((K + 63) / 64) * ((N + 7) / 8) * 4;
  };
  const std::uint64_t int4 = 3 * (q4(128, 128) + 2 * q4(128, 32) + q4(128, 128) + 2 * q4(128, 384) + q4(384, 128));
  CHECK(serving_weight_bytes(m, DType::int4, 64) == int4 + 2 * rest);
  // by hand for q_proj: 16·128·4 = 8192 B of weights (0.5 B/param), 2·128·2 = 512 B of scales, 2·16·4 = 128 B of zeros
  CHECK(q4(128, 128) == 8192 + 512 + 128);
  const WeightBytes w = serving_weights(m, DType::int4, 64);
  CHECK(w.quantized_params == lin);
  CHECK(w.quantized == lin / 2);
}

TEST_CASE("vLLM pool arithmetic on a hand-checkable toy") {
  // toy llama: page = 2 × 16 × 2 × 16 × 2 = 2048 B per layer; 3 layers → 6144 B per block
  const ModelSpec m = test::toy_llama();
  ServeOptions o;
  o.total_memory = 100 * MiB;
  o.gpu_memory_utilization = 0.5;
  o.max_model_len = 1000;
  o.max_num_batched_tokens = 256;
  o.max_num_seqs = 4;
  o.non_torch = 1 * MiB;
  const ServePlan p = plan_serving(m, o);
  CHECK(p.requested == 50 * MiB);
  CHECK(p.weights == 2 * m.parameters().total);
  CHECK(p.page_size == 2048);
  CHECK(p.group_size == 3);
  CHECK(p.non_kv == p.weights + p.activation_peak + 1 * MiB);
  CHECK(p.available == static_cast<std::int64_t>(50 * MiB - p.non_kv));
  CHECK(p.num_blocks == static_cast<std::uint64_t>(p.available) / 2048 / 3);
  CHECK(p.kv_tokens == p.num_blocks * 16);
  CHECK(p.blocks_per_request == 63);  // cdiv(1000, 16)
  CHECK(p.max_concurrency == doctest::Approx(static_cast<double>(p.num_blocks) / 63));
  CHECK(p.needed_one_request == 63ull * 3 * 2048);
  CHECK(p.fits_one_request);
  CHECK(p.kv_cache_size_line() == "GPU KV cache size: " + [&] {
          std::string s = std::to_string(p.kv_tokens);
          for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<std::size_t>(i), ",");
          return s;
        }() + " tokens");
  CHECK(p.concurrency_line().rfind("Maximum concurrency for 1,000 tokens per request: ", 0) == 0);
  // profiling peak: 256 tokens; the sampler over 4 rows of 1024 logits at 27 B
  CHECK(p.activation_peak == vllm_profile_activation_peak(m, 256, 4));
}

TEST_CASE("vLLM pool: Llama 3.1 8B on an H100 at max_model_len 8192") {
  const ModelSpec m = cfg("configs/llama-3.1-8b.yaml");
  ServeOptions o;
  o.total_memory = find_device("H100").capacity;
  o.device_name = "H100-80GB";
  o.max_model_len = 8192;
  const ServePlan p = plan_serving(m, o);
  CHECK(p.max_num_batched_tokens == 8192);  // ≥ 70 GiB and not an A100
  CHECK(p.max_num_seqs == 1024);
  CHECK(p.page_size == 2ull * 16 * 8 * 128 * 2);
  CHECK(p.num_blocks == static_cast<std::uint64_t>(p.available) / p.page_size / 32);
  CHECK(p.kv_tokens == p.num_blocks * 16);
  CHECK(p.blocks_per_request == 512);
  o.device_name = "A100-80GB";
  CHECK(plan_serving(m, o).max_num_batched_tokens == 2048);
}

TEST_CASE("vLLM pool: hybrid sliding-window groups (Gemma 2)") {
  const ModelSpec m = cfg("configs/gemma-2-9b.yaml");
  ServeOptions o;
  o.total_memory = 80 * GiB;
  o.max_num_batched_tokens = 2048;
  const ServePlan p = plan_serving(m, o);
  REQUIRE(p.groups.size() == 2);
  CHECK(p.group_size == 21);
  CHECK(p.kv_tokens == p.num_blocks / 2 * 16);
  // full: cdiv(8192, 16) = 512 blocks; sliding: cdiv(min(4095 + 2048, 8192), 16) + 1 = 385
  CHECK(p.blocks_per_request == 512 + 385);
}

TEST_CASE("vLLM pool: bad inputs and a pool too small for one request") {
  const ModelSpec m = cfg("configs/llama-3.1-8b.yaml");
  ServeOptions o;
  o.total_memory = find_device("L4").capacity;
  o.gpu_memory_utilization = 0;
  CHECK_THROWS_WITH_AS(plan_serving(m, o), doctest::Contains("--gpu-memory-utilization"), Error);
  o.gpu_memory_utilization = 1.5;
  CHECK_THROWS_WITH_AS(plan_serving(m, o), doctest::Contains("(0, 1]"), Error);
  o.gpu_memory_utilization = 0.9;
  o.max_model_len = 200000;
  CHECK_THROWS_WITH_AS(plan_serving(m, o), doctest::Contains("max_positions 131072"), Error);
  o.max_model_len.reset();
  // vLLM's scheduler gives every sequence of a step a token at least (L4: 256 sequences by default)
  o.max_num_batched_tokens = 1;
  CHECK_THROWS_WITH_AS(plan_serving(m, o), doctest::Contains("must be greater than or equal to max_num_seqs (256)"), Error);
  o.max_num_seqs = 1;
  CHECK(plan_serving(m, o).max_num_batched_tokens == 1);
  o.max_num_batched_tokens.reset();
  o.max_num_seqs.reset();
  // vLLM's block sizes: 1, 8, 16, ..., 256
  o.block_size = 3;
  CHECK_THROWS_WITH_AS(plan_serving(m, o), doctest::Contains("--block-size: 3 is not one vLLM takes"), Error);
  o.block_size = 32;
  CHECK(plan_serving(m, o).block_size == 32);
  o.block_size = 16;
  const ServePlan p = plan_serving(m, o);  // 131072 tokens need 16 GiB; an L4 has ~4 GiB left
  CHECK_FALSE(p.fits_one_request);
  CHECK(p.error.rfind("To serve at least one request with the models's max seq len (131072), (16.0 GiB KV cache is "
                      "needed, which is larger than the available KV cache memory (",
                      0) == 0);
  CHECK(p.error.find("Based on the available memory, the estimated maximum model length is ") != std::string::npos);
  CHECK(p.error.find("Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
                     "engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.") !=
        std::string::npos);
  // the estimate is the longest max_model_len whose blocks fit
  ServeOptions o2 = o;
  o2.max_model_len = p.estimated_max_model_len;
  CHECK(plan_serving(m, o2).fits_one_request);
  o2.max_model_len = p.estimated_max_model_len + 16;
  CHECK_FALSE(plan_serving(m, o2).fits_one_request);
  CHECK_THROWS_AS(require_one_request(p), Error);
  // no memory left at all
  o.gpu_memory_utilization = 0.5;
  const ServePlan none = plan_serving(m, o);
  CHECK(none.error.rfind("No available memory for the cache blocks.", 0) == 0);
}

TEST_CASE("vllm_gib prints like Python's round(x, 2)") {
  CHECK(vllm_gib(16 * GiB) == "16.0");
  CHECK(vllm_gib(GiB + GiB / 4) == "1.25");
  CHECK(vllm_gib(GiB / 5) == "0.2");
}

TEST_CASE("traffic: fits, by how much, and when it does not") {
  const ModelSpec m = cfg("configs/llama-3.1-8b.yaml");
  ServeOptions o;
  o.total_memory = find_device("H100").capacity;
  o.max_model_len = 16384;
  const ServePlan p = plan_serving(m, o);
  const Traffic t = parse_traffic("64:2048:8192");
  CHECK(t.concurrency == 64);
  CHECK(t.mean_context == 2048);
  CHECK(t.max_context == 8192);
  const TrafficFit f = fit_traffic(m, p, t);
  CHECK(f.fits);
  CHECK(f.blocks_needed == 64 * 128);
  CHECK(f.bytes_needed == 64ull * 2048 * 131072);
  CHECK(f.oversize == doctest::Approx(static_cast<double>(p.num_blocks) / (64 * 128)));
  CHECK(f.excess_bytes == (p.num_blocks - 64 * 128) * p.page_size * 32);
  CHECK(f.suggested_utilization < 0.9);
  const TrafficFit big = fit_traffic(m, p, parse_traffic("1000x16384"));
  CHECK_FALSE(big.fits);
  CHECK(big.reason.find("blocks") != std::string::npos);
  CHECK(big.suggested_utilization > 0.9);  // more memory would hold it (more than the card has)
  // beyond max_model_len: no utilization mends that, the flag does (or nothing, past the model's context)
  const TrafficFit longer = fit_traffic(m, p, parse_traffic("1x32768"));
  CHECK_FALSE(longer.fits);
  CHECK(longer.reason.find("give --max-model-len 32768 or more") != std::string::npos);
  CHECK(longer.suggested_utilization == 0);
  CHECK(fit_traffic(m, p, parse_traffic("1x200000")).reason.find("the model's context is 131,072 tokens") != std::string::npos);
  // more requests in flight than vLLM runs at once (max_num_seqs: 1024 on an H100) queue, whatever the memory
  const TrafficFit crowd = fit_traffic(m, p, parse_traffic("2000x16"));
  CHECK_FALSE(crowd.fits);
  CHECK(crowd.reason.find("vLLM runs at most max_num_seqs (1,024) at once") != std::string::npos);
  CHECK(crowd.suggested_utilization == 0);
  CHECK(crowd.reason.find("(give --max-num-seqs 2000)") != std::string::npos);
  // past max_num_batched_tokens (8,192) the advice raises it too: vLLM refuses max_num_seqs above it
  const TrafficFit throng = fit_traffic(m, p, parse_traffic("10000x16"));
  CHECK(throng.reason.find("give --max-num-seqs 10000 and --max-num-batched-tokens 10000 or more") != std::string::npos);
  o.max_num_seqs = 10000;
  CHECK_THROWS_WITH_AS(plan_serving(m, o), doctest::Contains("must be greater than or equal to max_num_seqs"), Error);
  o.max_num_batched_tokens = 10000;
  CHECK(fit_traffic(m, plan_serving(m, o), parse_traffic("10000x16")).fits);
  o.max_num_seqs = 2000;
  o.max_num_batched_tokens = 8192;
  CHECK(fit_traffic(m, plan_serving(m, o), parse_traffic("2000x16")).fits);
  CHECK_THROWS_AS(parse_traffic("64"), Error);
  CHECK_THROWS_AS(parse_traffic("0x10"), Error);
  CHECK_THROWS_AS(parse_traffic("4:100:50"), Error);
}

TEST_CASE("predict --mode infer: phases, exact KV, weights by dtype") {
  const ModelSpec m = cfg("configs/llama-3.1-8b.yaml");
  Job j;
  j.mode = Mode::infer;
  j.batch = 2;
  j.seq = 1024;
  const Budget b = predict(m, j);
  CHECK(b.terms.kv_cache == 2ull * 1024 * 131072);
  REQUIRE(b.find_phase(Phase::floor));
  REQUIRE(b.find_phase(Phase::prefill_peak));
  REQUIRE(b.find_phase(Phase::decode_peak));
  CHECK(b.phase(Phase::prefill_peak) > b.phase(Phase::floor) + b.terms.kv_cache);
  CHECK(b.phase(Phase::decode_peak) > b.phase(Phase::floor) + b.terms.kv_cache);
  CHECK(b.peak_phase == "prefill_peak");
  CHECK(b.states.gradients == 0);
  CHECK(b.states.optimizer == 0);
  j.weights = DType::int4;
  const Budget q = predict(m, j);
  CHECK(q.states.weights < b.states.weights * 4 / 10);  // embedding and lm_head stay bf16
  j.weights = DType::bf16;
  j.kv_dtype = DType::fp8;
  CHECK(predict(m, j).terms.kv_cache == 1024ull * 131072);
}

// Past a sliding window (Mistral 7B v0.1: 4,096 tokens on every layer, GQA 32/8) the prompt's whole
// torch.cat stays held through the prefill (the cache keeps a view of its last window - 1 tokens)
// and the decode step's cat holds the window's; the prompt's mask and each layer's bias and repeated
// keys and values come and go with the prefill (docs/serving.md).
TEST_CASE("predict --mode infer past a sliding window: the prompt's whole keys and values through the prefill") {
  const ModelSpec m = cfg("configs/hf/mistral-7b-v0.1.json");
  const std::uint64_t w = m.sliding.window;
  REQUIRE(w == 4096);
  Job j;
  j.mode = Mode::infer;
  j.batch = 2;
  const auto kv_of_tokens = [&](std::uint64_t tokens) { return j.batch * tokens * kv_bytes_per_token(m, DType::bf16); };
  j.seq = 2 * w;
  const Budget past = predict(m, j);
  CHECK(past.terms.kv_cache == kv_of_tokens(w));  // the cache's tokens: the window
  // what stays beyond the floor through the prefill: every prompt token's keys and values
  CHECK(past.phase(Phase::prefill_peak) - past.phase(Phase::floor) > kv_of_tokens(2 * w));
  // the decode step replaces each layer's cat layer by layer: the prompt's and the window's
  CHECK(past.phase(Phase::decode_peak) - past.phase(Phase::floor) >= kv_of_tokens(2 * w));
  CHECK(past.phase(Phase::decode_peak) - past.phase(Phase::floor) < kv_of_tokens(2 * w) + kv_of_tokens(w));
  // a prompt of window - 1 tokens is not masked, but its decode step is: both walked, the plan
  // stands aside there (no plan for that one length), and estimate() agrees with predict()
  for (std::uint64_t s : {w - 2, w - 1, w}) {
    j.seq = s;
    PredictOptions full;
    full.full_simulation = true;
    CAPTURE(s);
    CHECK(predict(m, j).phase(Phase::decode_peak) == predict(m, j, full).phase(Phase::decode_peak));
    CHECK(estimate(m, j).peak == predict(m, j, full).peak);
  }
  // the decode step's repeated keys and values over the window (no enable_gqa with a mask): one
  // layer's two b·a·window·hd tensors beside the attention at w - 1, none at w - 2, where the
  // cache grows by one token only (the peak is then the MLP's, so not all of them show)
  j.seq = w - 2;
  const bytes_t before = predict(m, j).phase(Phase::decode_peak);
  j.seq = w - 1;
  const bytes_t at = predict(m, j).phase(Phase::decode_peak);
  CHECK(at - before > j.batch * w * m.q_dim() * 2);
}

TEST_CASE("CLI: serve prints vLLM's phrases, JSON, and vLLM's error") {
  const std::string model = test::source_path("configs/llama-3.1-8b.yaml");
  auto r = test::run_cli("serve " + model + " --device H100 --max-model-len 8192");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("GPU KV cache size: ") != std::string::npos);
  CHECK(r.out.find("Maximum concurrency for 8,192 tokens per request: ") != std::string::npos);

  r = test::run_cli("serve " + model + " --device H100 --max-model-len 8192 --format json --traffic 32x4096");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["pool"]["kv_bytes_per_token"] == 131072);
  CHECK(j["pool"]["kv_tokens"].get<std::uint64_t>() == j["pool"]["num_blocks"].get<std::uint64_t>() * 16);
  CHECK(j["fits_one_request"] == true);
  CHECK(j["traffic"]["fits"] == true);
  CHECK(j["log"][0].get<std::string>().rfind("GPU KV cache size: ", 0) == 0);

  r = test::run_cli("serve " + model + " --device L4");
  CHECK(r.exit_code == 3);
  CHECK(r.out.find("To serve at least one request with the models's max seq len (131072)") != std::string::npos);

  r = test::run_cli("serve " + model + " --device H100 --gpu-memory-utilization 1.5");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("--gpu-memory-utilization") != std::string::npos);
  r = test::run_cli("serve " + model + " --device H100 --gpu-memory-utilization 0");
  CHECK(r.exit_code == 2);
  r = test::run_cli("serve " + model + " --device H100 --max-model-len 262144");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("max_model_len") != std::string::npos);
  r = test::run_cli("serve " + model + " --device H100 --max-model-len 8192 --traffic 100000x8192");
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("DOES NOT FIT") != std::string::npos);
}

TEST_CASE("CLI: predict --mode infer keeps the JSON keys") {
  const std::string model = test::source_path("configs/llama-3.2-1b.yaml");
  auto r = test::run_cli("predict " + model + " --mode infer --batch 2 --seq 512 --format json");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["phases"].contains("floor"));
  CHECK(j["phases"].contains("prefill_peak"));
  CHECK(j["phases"].contains("decode_peak"));
  CHECK(j["terms"]["kv_cache"] == 2 * 512 * 32768);
  r = test::run_cli("predict " + model + " --mode infer --batch 2 --seq 512");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("prefill_peak") != std::string::npos);
  CHECK(r.out.find("KV cache") != std::string::npos);
}

TEST_CASE("vLLM's max_model_len from a config.json's RoPE scaling: factor, yarn's original context, LongRoPE's default") {
  std::ifstream file(test::source_path("configs/hf/qwen2.5-0.5b.json"));
  const nlohmann::json qwen = nlohmann::json::parse(file);  // max_position_embeddings 32768, no scaling
  auto with = [&](const std::string& key, const nlohmann::json& rope, const nlohmann::json* original = nullptr) {
    nlohmann::json c = qwen;
    c[key] = rope;
    if (original) c["original_max_position_embeddings"] = *original;
    return parse_hf_config(c.dump(), "c.json");
  };
  auto message = [&](const std::string& key, const nlohmann::json& rope) {
    try {
      (void)with(key, rope);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  using nlohmann::json;
  CHECK(parse_hf_config(qwen.dump(), "c.json").max_positions == 32768);
  // Qwen2.5's 128K recipe: yarn × 4 over its original 32768
  CHECK(with("rope_scaling", json{{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}).max_positions == 131072);
  // yarn's own original context replaces max_position_embeddings; absent, transformers 5 fills it with that
  CHECK(with("rope_scaling", json{{"rope_type", "yarn"}, {"factor", 2}, {"original_max_position_embeddings", 4096}}).max_positions == 8192);
  CHECK(with("rope_scaling", json{{"rope_type", "yarn"}, {"factor", 2}}).max_positions == 65536);
  CHECK(with("rope_scaling", json{{"type", "linear"}, {"factor", 1.5}}).max_positions == 49152);
  CHECK(with("rope_scaling", json{{"type", "dynamic"}, {"factor", 2.0}}).max_positions == 65536);
  // transformers 5's name, nested by layer type; mrope is default (no factor)
  CHECK(with("rope_parameters", json{{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1e6}}).max_positions == 65536);
  CHECK(with("rope_parameters", json{{"full_attention", {{"rope_type", "linear"}, {"factor", 2.0}}},
                                     {"sliding_attention", {{"rope_type", "default"}}}}).max_positions == 65536);
  CHECK(with("rope_scaling", json{{"type", "mrope"}, {"mrope_section", {16, 24, 24}}}).max_positions == 32768);
  // llama3 and longrope carry the scaled context in max_position_embeddings already
  CHECK(with("rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}, {"original_max_position_embeddings", 8192},
                                  {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}}).max_positions == 32768);
  const json original = 4096;
  const ModelSpec phi = with("rope_scaling", json{{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {2.0}}}, &original);
  CHECK(phi.max_positions == 32768);
  CHECK(phi.default_max_model_len == 4096);
  ServeOptions o;
  o.total_memory = find_device("H100").capacity;
  CHECK(plan_serving(phi, o).max_model_len == 4096);  // vLLM's default for LongRoPE: the original context
  o.max_model_len = 32768;
  CHECK(plan_serving(phi, o).max_model_len == 32768);  // the whole context, asked for
  o.max_model_len.reset();
  CHECK(plan_serving(with("rope_scaling", json{{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}), o)
            .max_model_len == 131072);
  // what transformers refuses, and what vLLM's derivation is not known for
  CHECK(message("rope_scaling", json{{"type", "linear"}}).find("c.json: rope_scaling.factor: is missing") != std::string::npos);
  CHECK(message("rope_scaling", json{{"type", "linear"}, {"factor", 0.5}}).find("rope_scaling.factor: must be a number >= 1") != std::string::npos);
  CHECK(message("rope_scaling", json{{"type", "linear"}, {"factor", "8"}}).find("must be a number >= 1") != std::string::npos);
  CHECK(message("rope_scaling", json{{"type", "dynamic"}, {"factor", 1e300}}).find("past the limit") != std::string::npos);
  CHECK(message("rope_scaling", json::array({1, 2})).find("rope_scaling: expected an object") != std::string::npos);
  CHECK(message("rope_scaling", "linear").find("rope_scaling: expected an object") != std::string::npos);
  CHECK(message("rope_scaling", json{{"rope_type", "ntk_by_parts"}, {"factor", 2.0}}).find("'ntk_by_parts' is not a RoPE type") != std::string::npos);
  CHECK(message("rope_scaling", json{{"rope_type", "yarn"}, {"type", "linear"}, {"factor", 2.0}}).find("disagree") != std::string::npos);
  CHECK(message("rope_scaling", json{{"rope_type", ""}, {"factor", 2.0}}).find("rope_scaling.rope_type: is empty") != std::string::npos);
  // layer types that scale the context differently: vLLM takes the last in the file, which a parsed object has lost
  CHECK(message("rope_parameters", json{{"full_attention", {{"rope_type", "linear"}, {"factor", 2.0}}},
                                        {"sliding_attention", {{"rope_type", "linear"}, {"factor", 4.0}}}})
            .find("the layer types scale the context differently") != std::string::npos);
  // Phi-3's LongRoPE: Phi3Config's original_max_position_embeddings (4096) when the file leaves it out
  nlohmann::json phi3 = qwen;
  phi3["model_type"] = "phi3";
  phi3["rope_scaling"] = json{{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {2.0}}, {"original_max_position_embeddings", 1024}};
  CHECK(parse_hf_config(phi3.dump(), "c.json").default_max_model_len == 4096);
  phi3["original_max_position_embeddings"] = 2048;
  CHECK(parse_hf_config(phi3.dump(), "c.json").default_max_model_len == 2048);
  nlohmann::json both = qwen;
  both["rope_scaling"] = json{{"type", "linear"}, {"factor", 2.0}};
  both["rope_parameters"] = json{{"rope_type", "default"}};
  CHECK_THROWS_WITH_AS(parse_hf_config(both.dump(), "c.json"), doctest::Contains("rope_scaling: differs from rope_parameters"), Error);
}
