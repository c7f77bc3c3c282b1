// The one name table of each budget enum (Term, Role, Phase): what JSON, CSV, the C ABI and the
// measurement scripts print and parse.
#include "membudget/budget.hpp"

namespace membudget {

const char* to_string(Term t) noexcept {
  switch (t) {
    case Term::model_states: return "model_states";
    case Term::activations: return "activations";
    case Term::logits_loss: return "logits_loss";
    case Term::kv_cache: return "kv_cache";
    case Term::overhead: return "overhead";
    case Term::other: return "other";
  }
  return "other";
}

const char* to_string(Role r) noexcept {
  switch (r) {
    case Role::parameter: return "parameter";
    case Role::adapter: return "adapter";
    case Role::gradient: return "gradient";
    case Role::master_weight: return "master_weight";
    case Role::optimizer_state: return "optimizer_state";
    case Role::optimizer_temporary: return "optimizer_temporary";
    case Role::weight_copy: return "weight_copy";
    case Role::saved_activation: return "saved_activation";
    case Role::temporary: return "temporary";
    case Role::logits_loss: return "logits_loss";
    case Role::workspace: return "workspace";
    case Role::kv_cache: return "kv_cache";
    case Role::input: return "input";
    case Role::communication: return "communication";
  }
  return "temporary";
}

const char* to_string(Phase p) noexcept {
  switch (p) {
    case Phase::floor: return "floor";
    case Phase::forward_peak: return "forward_peak";
    case Phase::backward_peak: return "backward_peak";
    case Phase::optimizer_peak: return "optimizer_peak";
    case Phase::prefill_peak: return "prefill_peak";
    case Phase::decode_peak: return "decode_peak";
  }
  return "floor";
}

const char* phase_label(Phase p, bool step0) noexcept {
  if (!step0) return to_string(p);
  switch (p) {
    case Phase::floor: return "step0.floor";
    case Phase::forward_peak: return "step0.forward_peak";
    case Phase::backward_peak: return "step0.backward_peak";
    case Phase::optimizer_peak: return "step0.optimizer_peak";
    case Phase::prefill_peak: return "step0.prefill_peak";
    case Phase::decode_peak: return "step0.decode_peak";
  }
  return "step0.floor";
}

bool parse_phase(std::string_view name, Phase* out) noexcept {
  for (Phase p : kAllPhases)
    if (name == to_string(p)) {
      *out = p;
      return true;
    }
  return false;
}

}  // namespace membudget
