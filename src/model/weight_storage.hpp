// src/model/weight_storage.hpp: how a parameter tensor is stored when a model is served (internal).
//
// One definition for the exact weight bytes (serving_weights) and the serving walk's allocations
// (serving.cpp): a decoder projection in a quantized dtype is its packed values plus scales and
// zero points; every other tensor (embedding, lm_head, norms, biases) stays 16-bit, or fp32 when
// the weights are fp32 (docs/serving.md §2).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "membudget/error.hpp"
#include "membudget/job.hpp"
#include "membudget/spec.hpp"

namespace membudget::detail {

enum class Stored { value, quantized, scale };  // unquantized values, packed values, scales/zeros

struct StoredPiece {
  bytes_t bytes = 0;
  const char* dtype = "";
  Stored kind = Stored::value;
};

struct StoredTensor {
  std::array<StoredPiece, 3> pieces{};
  std::uint8_t n = 0;
  const StoredPiece* begin() const { return pieces.data(); }
  const StoredPiece* end() const { return pieces.data() + n; }
};

// `t` stored as `weights`; `quantizable`: a decoder-layer projection (the embedding and lm_head
// stay 16-bit).
inline StoredTensor stored_tensor(const ParamTensor& t, bool quantizable, DType weights, std::uint64_t group) {
  auto cdiv = [](std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0); };  // (a + b - 1 wraps for b near 2^64)
  auto bytes = [](std::uint64_t a, std::uint64_t b, std::uint64_t c = 1) {
    return checked_product("served weight bytes", a, b, c);
  };
  StoredTensor s;
  auto add = [&](bytes_t b, const char* dtype, Stored kind) { s.pieces[s.n++] = {b, dtype, kind}; };
  const std::uint64_t n = t.elements();
  if (!quantizable || !t.projection() || weights == DType::bf16 || weights == DType::fp16 || weights == DType::fp32) {
    if (weights == DType::fp32) add(bytes(n, 4), "fp32", Stored::value);
    else add(bytes(n, 2), "bf16", Stored::value);
    return s;
  }
  // Each of the tensor's `count` matrices (a packed expert tensor holds E) is quantized as one.
  const std::uint64_t K = t.in, N = t.out, E = t.count;
  // A group of inputs shares a scale. vLLM's GPTQ, AWQ and grouped int8 layers refuse a row that
  // the groups do not split evenly (create_weights: "The input size is not aligned with the
  // quantized weight shape"); a group of at least the row is one scale per row (vLLM's
  // group_size -1, channelwise), as the ceilings below count it.
  if ((weights == DType::int8 || weights == DType::int4) && group > 0 && group < K && K % group != 0)
    throw Error(ErrorKind::invalid_job, "--group-size: " + std::to_string(group) + " does not divide " + to_string(t.module) + "'s " +
                                            std::to_string(K) + " inputs: vLLM's GPTQ, AWQ and grouped int8 layers refuse it (a group of "
                                            "at least the widest row, " + "one scale per row, is vLLM's group_size -1)");
  switch (weights) {
    case DType::fp8:  // one fp32 scale per matrix
      add(n, "fp8", Stored::quantized);
      add(bytes(E, 4), "fp32", Stored::scale);
      break;
    case DType::int8:  // one fp16 scale per group of K
      add(n, "int8", Stored::quantized);
      add(bytes(cdiv(K, group), N, 2 * E), "fp16", Stored::scale);
      break;
    case DType::int4:  // GPTQ/AWQ: qweight int32[K/8][N], scales fp16[K/g][N], qzeros int32[K/g][N/8]
      add(bytes(cdiv(K, 8), N, 4 * E), "int32", Stored::quantized);
      add(bytes(cdiv(K, group), N, 2 * E), "fp16", Stored::scale);
      add(bytes(cdiv(K, group), cdiv(N, 8), 4 * E), "int32", Stored::scale);
      break;
    default: break;
  }
  return s;
}

}  // namespace membudget::detail
