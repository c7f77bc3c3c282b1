// src/measure/harness_table.hpp: every activation and gradient buffer of the synthetic step.
//
// This is THE table of the harness: harness.cpp allocates a buffer only through a row of it
// (name, shape and dtype come from here, never from the call site), and frees layer buffers by
// their recompute rule. `membudget predict --profile harness` does not read this file: it walks
// the step as docs/harness.md describes it (src/model/inventory_harness.cpp), so `verify` catches
// a wrong table and a wrong prediction alike.
//
// T = B·S tokens, h hidden, I intermediate, V vocabulary, a heads, kv key/value heads, hd head
// dim, c the loss chunk (min(loss_chunk, T)). "act" is the recipe's activation dtype: fp32 under
// fp32, bf16 under amp-bf16 and bf16. Statistics are fp32, token ids int32.
//
// Rules (recompute none | full):
//   kept        saved until its backward use in both modes (the residual stream: each layer's input)
//   recomputed  saved until backward (none) | freed at the end of the layer's forward and re-made
//               by re-running the layer's forward just before its backward (full)
//   temp        freed inside the phase that creates it
#pragma once

#include <array>
#include <cstdint>

namespace membudget::measure {

struct HarnessDims {
  std::uint64_t B, S, T, h, I, V, a, kv, hd, L, c;
  std::uint64_t qd() const { return a * hd; }
  std::uint64_t kvd() const { return kv * hd; }
};

enum class Elem { act, f32, i32 };
enum class Rule { kept, recomputed, temp };
enum class Scope { step, layer };  // one buffer per step, or one per layer

enum class Buf {
  // inputs (created before the forward phase, freed at the end of the step)
  tokens, targets,
  // the residual stream: x[0] = embedding output, x[l+1] = layer l's output
  x,
  // one decoder layer, in forward order
  ln1, ln1_rstd, q, k, v, att, lse, attproj, res1, ln2, ln2_rstd, gate, up, act, mlpout,
  // head and loss
  lnf, lnf_rstd, losses, logits, logits_chunk,
  // backward: activation gradients and workspace
  dres, dln, dact, dgate, dup, datt, dq, dk, dv, delta,
  count
};

struct BufRow {
  Buf buf;
  const char* name;
  const char* shape;
  Elem elem;
  Scope scope;
  Rule rule;
  std::uint64_t (*numel)(const HarnessDims&);
  const char* life;  // which op creates it and which frees it
};

// clang-format off
inline constexpr std::array<BufRow, static_cast<std::size_t>(Buf::count)> kHarnessTable{{
  {Buf::tokens,   "tokens",   "(T)",       Elem::i32, Scope::step,  Rule::kept,       [](const HarnessDims& d) { return d.T; },          "step start → step end"},
  {Buf::targets,  "targets",  "(T)",       Elem::i32, Scope::step,  Rule::kept,       [](const HarnessDims& d) { return d.T; },          "step start → step end"},
  {Buf::x,        "x",        "(T, h)",    Elem::act, Scope::layer, Rule::kept,       [](const HarnessDims& d) { return d.T * d.h; },    "embedding / residual add (mlp) → rmsnorm backward of its reader"},
  {Buf::ln1,      "ln1",      "(T, h)",    Elem::act, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T * d.h; },    "rmsnorm → q/k/v matmul backward"},
  {Buf::ln1_rstd, "ln1_rstd", "(T)",       Elem::f32, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T; },          "rmsnorm → rmsnorm backward"},
  {Buf::q,        "q",        "(B,S,a,hd)",Elem::act, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T * d.qd(); }, "matmul, rotary in place → attention backward"},
  {Buf::k,        "k",        "(B,S,kv,hd)",Elem::act,Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T * d.kvd(); },"matmul, rotary in place → attention backward"},
  {Buf::v,        "v",        "(B,S,kv,hd)",Elem::act,Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T * d.kvd(); },"matmul → attention backward"},
  {Buf::att,      "att",      "(B,S,a,hd)",Elem::act, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T * d.qd(); }, "attention → attention backward"},
  {Buf::lse,      "lse",      "(B,a,S)",   Elem::f32, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.B * d.a * d.S; },"attention → attention backward"},
  {Buf::attproj,  "attproj",  "(T, h)",    Elem::act, Scope::layer, Rule::temp,       [](const HarnessDims& d) { return d.T * d.h; },    "o matmul → residual add"},
  {Buf::res1,     "res1",     "(T, h)",    Elem::act, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T * d.h; },    "residual add (attention) → rmsnorm backward (ln2)"},
  {Buf::ln2,      "ln2",      "(T, h)",    Elem::act, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T * d.h; },    "rmsnorm → gate/up matmul backward"},
  {Buf::ln2_rstd, "ln2_rstd", "(T)",       Elem::f32, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T; },          "rmsnorm → rmsnorm backward"},
  {Buf::gate,     "gate",     "(T, I)",    Elem::act, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T * d.I; },    "matmul → swiglu backward"},
  {Buf::up,       "up",       "(T, I)",    Elem::act, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T * d.I; },    "matmul → swiglu backward"},
  {Buf::act,      "act",      "(T, I)",    Elem::act, Scope::layer, Rule::recomputed, [](const HarnessDims& d) { return d.T * d.I; },    "swiglu → down matmul backward"},
  {Buf::mlpout,   "mlpout",   "(T, h)",    Elem::act, Scope::layer, Rule::temp,       [](const HarnessDims& d) { return d.T * d.h; },    "down matmul → residual add"},
  {Buf::lnf,      "lnf",      "(T, h)",    Elem::act, Scope::step,  Rule::kept,       [](const HarnessDims& d) { return d.T * d.h; },    "final rmsnorm → lm_head matmul backward"},
  {Buf::lnf_rstd, "lnf_rstd", "(T)",       Elem::f32, Scope::step,  Rule::kept,       [](const HarnessDims& d) { return d.T; },          "final rmsnorm → its backward"},
  {Buf::losses,   "losses",   "(T)",       Elem::f32, Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.T; },          "before the loss → read back at the end of forward"},
  {Buf::logits,   "logits",   "(T, V)",    Elem::act, Scope::step,  Rule::kept,       [](const HarnessDims& d) { return d.T * d.V; },    "full loss: lm_head matmul → (dlogits in place) lm_head backward"},
  {Buf::logits_chunk,"logits_chunk","(c, V)",Elem::act,Scope::step, Rule::temp,       [](const HarnessDims& d) { return d.c * d.V; },    "chunked loss: one buffer per pass over the chunks, forward and again in backward"},
  {Buf::dres,     "dres",     "(T, h)",    Elem::act, Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.T * d.h; },    "final rmsnorm backward → embedding backward (the residual gradient)"},
  {Buf::dln,      "dln",      "(T, h)",    Elem::act, Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.T * d.h; },    "matmul backward into a norm output → that rmsnorm backward"},
  {Buf::dact,     "dact",     "(T, I)",    Elem::act, Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.T * d.I; },    "down matmul backward → swiglu backward"},
  {Buf::dgate,    "dgate",    "(T, I)",    Elem::act, Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.T * d.I; },    "swiglu backward → gate/up matmul backward"},
  {Buf::dup,      "dup",      "(T, I)",    Elem::act, Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.T * d.I; },    "swiglu backward → gate/up matmul backward"},
  {Buf::datt,     "datt",     "(B,S,a,hd)",Elem::act, Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.T * d.qd(); }, "o matmul backward → attention backward"},
  {Buf::dq,       "dq",       "(B,S,a,hd)",Elem::act, Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.T * d.qd(); }, "attention backward → q/k/v matmul backward"},
  {Buf::dk,       "dk",       "(B,S,kv,hd)",Elem::act,Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.T * d.kvd(); },"attention backward → q/k/v matmul backward"},
  {Buf::dv,       "dv",       "(B,S,kv,hd)",Elem::act,Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.T * d.kvd(); },"attention backward → q/k/v matmul backward"},
  {Buf::delta,    "delta",    "(B,a,S)",   Elem::f32, Scope::step,  Rule::temp,       [](const HarnessDims& d) { return d.B * d.a * d.S; },"attention backward workspace: rowsum(dout ∘ out)"},
}};
// clang-format on

constexpr const BufRow& row_of(Buf b) { return kHarnessTable[static_cast<std::size_t>(b)]; }

// The table is in enum order, so row_of is an index.
constexpr bool table_in_order() {
  for (std::size_t i = 0; i < kHarnessTable.size(); ++i)
    if (static_cast<std::size_t>(kHarnessTable[i].buf) != i) return false;
  return true;
}
static_assert(table_in_order(), "kHarnessTable rows must follow the Buf enum");

// Per-layer buffers in forward order (the order the layer allocates them).
inline constexpr std::array<Buf, 15> kLayerForward{Buf::ln1, Buf::ln1_rstd, Buf::q,     Buf::k,        Buf::v,
                                                  Buf::att, Buf::lse,      Buf::attproj, Buf::res1,  Buf::ln2,
                                                  Buf::ln2_rstd, Buf::gate, Buf::up,    Buf::act,     Buf::mlpout};

}  // namespace membudget::measure
