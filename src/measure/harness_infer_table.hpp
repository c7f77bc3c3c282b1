// src/measure/harness_infer_table.hpp: every buffer of the harness's inference step.
//
// The sibling of harness_table.hpp for `membudget verify --mode infer`: harness_infer.cpp allocates
// a buffer only through a row of this table (name, shape and element type come from here), and
// `membudget predict --mode infer --profile harness` does not read it: it walks docs/harness.md
// ("Inference mode"), so `verify --mode infer` catches a wrong table and a wrong prediction alike.
//
// One forward runs S new tokens of each of B sequences (T = B·S): the prefill has S = the prompt
// length, the decode step S = 1. P is the pool's tokens per sequence (prompt + 1), h hidden, I
// intermediate, V vocabulary, a heads, kv KV heads, hd head dim. "act" is the weights' dtype
// (bf16 or fp32), "kv" the --kv-dtype of the pool; statistics fp32, token ids int32.
//
// Nothing is saved for a backward: every activation is freed as soon as the op that reads it last
// has run (rule `temp`); only the pool lives from construction to the end (rule `pool`).
#pragma once

#include <array>
#include <cstdint>

namespace membudget::measure {

struct InferDims {
  std::uint64_t B, S, T, P, h, I, V, a, kv, hd, L;
  std::uint64_t qd() const { return a * hd; }
  std::uint64_t kvd() const { return kv * hd; }
};

enum class IElem { act, kv, f32, i32 };
enum class IRule { temp, pool };

enum class IBuf {
  tokens, x,
  // one decoder layer, in the order it allocates them
  ln1, ln1_rstd, q, k, v, att, attproj, res1, ln2, ln2_rstd, gate, up, act, mlpout,
  // the head: last position of each sequence only
  last, lnf, lnf_rstd, logits,
  // the KV pool: one K and one V buffer per layer
  k_pool, v_pool,
  count
};

struct IBufRow {
  IBuf buf;
  const char* name;
  const char* shape;
  IElem elem;
  IRule rule;
  std::uint64_t (*numel)(const InferDims&);
  const char* life;  // which op creates it and which consumes it last
};

// clang-format off
inline constexpr std::array<IBufRow, static_cast<std::size_t>(IBuf::count)> kInferTable{{
  {IBuf::tokens,  "tokens",  "(T)",        IElem::i32, IRule::temp, [](const InferDims& d) { return d.T; },          "forward start → embedding"},
  {IBuf::x,       "x",       "(T, h)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.h; },    "embedding / mlp residual add → the attention residual add of the next layer (last: the gather)"},
  {IBuf::ln1,     "ln1",     "(T, h)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.h; },    "rmsnorm → v matmul"},
  {IBuf::ln1_rstd,"ln1_rstd","(T)",        IElem::f32, IRule::temp, [](const InferDims& d) { return d.T; },          "rmsnorm → rmsnorm (no backward reads it)"},
  {IBuf::q,       "q",       "(B,S,a,hd)", IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.qd(); }, "q matmul, rotary in place → cached attention"},
  {IBuf::k,       "k",       "(B,S,kv,hd)",IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.kvd(); },"k matmul, rotary in place → written into k_pool"},
  {IBuf::v,       "v",       "(B,S,kv,hd)",IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.kvd(); },"v matmul → written into v_pool"},
  {IBuf::att,     "att",     "(B,S,a,hd)", IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.qd(); }, "cached attention → o matmul"},
  {IBuf::attproj, "attproj", "(T, h)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.h; },    "o matmul → residual add"},
  {IBuf::res1,    "res1",    "(T, h)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.h; },    "residual add (attention) → residual add (mlp)"},
  {IBuf::ln2,     "ln2",     "(T, h)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.h; },    "rmsnorm → up matmul"},
  {IBuf::ln2_rstd,"ln2_rstd","(T)",        IElem::f32, IRule::temp, [](const InferDims& d) { return d.T; },          "rmsnorm → rmsnorm"},
  {IBuf::gate,    "gate",    "(T, I)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.I; },    "gate matmul → swiglu"},
  {IBuf::up,      "up",      "(T, I)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.I; },    "up matmul → swiglu"},
  {IBuf::act,     "act",     "(T, I)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.I; },    "swiglu → down matmul"},
  {IBuf::mlpout,  "mlpout",  "(T, h)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.T * d.h; },    "down matmul → residual add"},
  {IBuf::last,    "last",    "(B, h)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.B * d.h; },    "gather of each sequence's last position → final rmsnorm"},
  {IBuf::lnf,     "lnf",     "(B, h)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.B * d.h; },    "final rmsnorm → lm_head matmul"},
  {IBuf::lnf_rstd,"lnf_rstd","(B)",        IElem::f32, IRule::temp, [](const InferDims& d) { return d.B; },          "final rmsnorm → final rmsnorm"},
  {IBuf::logits,  "logits",  "(B, V)",     IElem::act, IRule::temp, [](const InferDims& d) { return d.B * d.V; },    "lm_head matmul → copied to the host (greedy next token)"},
  {IBuf::k_pool,  "k_pool",  "(B,P,kv,hd)",IElem::kv,  IRule::pool, [](const InferDims& d) { return d.B * d.P * d.kvd(); }, "construction → harness end (one per layer)"},
  {IBuf::v_pool,  "v_pool",  "(B,P,kv,hd)",IElem::kv,  IRule::pool, [](const InferDims& d) { return d.B * d.P * d.kvd(); }, "construction → harness end (one per layer)"},
}};
// clang-format on

constexpr const IBufRow& row_of(IBuf b) { return kInferTable[static_cast<std::size_t>(b)]; }

constexpr bool infer_table_in_order() {
  for (std::size_t i = 0; i < kInferTable.size(); ++i)
    if (static_cast<std::size_t>(kInferTable[i].buf) != i) return false;
  return true;
}
static_assert(infer_table_in_order(), "kInferTable rows must follow the IBuf enum");

}  // namespace membudget::measure
