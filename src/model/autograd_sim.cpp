#include "autograd_sim.hpp"

#include <algorithm>

#include <cstring>
#include <map>

namespace membudget::detail {

TensorId AutogradSim::add(TensorInfo info) {
  info.rounded = round512(info.bytes);
  tensors_.push_back(info);
  grads_.push_back(kNone);
  grad_view_.push_back(0);
  subclass_grad_.push_back(dtensor_scope_ && !info.param ? 1 : 0);  // (a parameter's .grad: AccumulateGrad, in place)
  live_slot_.push_back(0);
  const auto id = static_cast<TensorId>(tensors_.size() - 1);
  if (info.param) params_.push_back(id);
  return id;
}

void AutogradSim::allocate(TensorId t) {
  auto& ti = tensors_[t];
  ti.alive = true;
  live_ = checked_add(live_, ti.rounded, ti.name);
  live_by_term_[static_cast<std::size_t>(ti.term)] += ti.rounded;
  live_slot_[t] = static_cast<std::uint32_t>(live_list_.size());
  live_list_.push_back(t);
  if (explain_) log_.push_back(t);
  if (trace_) trace_->events.push_back({t, section_});
  note_peak();
}

void AutogradSim::note_peak() {
  if (phases_.empty()) return;
  auto& p = phases_.back();
  if (live_ <= p.bytes) return;
  p.bytes = live_;
  // With explain, remember where in the allocation log the peak is; take_phases() rebuilds the
  // live set there (rebuilding it at every new peak would be quadratic in the step's size).
  if (explain_) peak_event_.back() = log_.size();
}

std::vector<TensorBytes> AutogradSim::groups_at(std::size_t event) const {
  std::vector<char> alive(tensors_.size(), 0);
  for (std::size_t k = 0; k < event && k < log_.size(); ++k) {
    const TensorId t = log_[k];
    if (t >= 0) alive[t] = 1;
    else alive[~t] = 0;
  }
  std::map<std::string, TensorBytes> groups;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    if (!alive[i]) continue;
    const auto& t = tensors_[i];
    auto& g = groups[t.name];
    if (g.name.empty()) {
      g.name = t.name;
      g.op = t.op;
      g.dtype = t.dtype;
      g.shape = t.shape;
      g.term = t.term;
      g.role = t.role;
      g.count = 0;
    }
    g.count += 1;
    g.bytes += t.rounded;
  }
  std::vector<TensorBytes> out;
  for (auto& [_, g] : groups) out.push_back(std::move(g));
  return out;
}

void AutogradSim::release(TensorId t) {
  auto& ti = tensors_[t];
  ti.alive = false;
  live_ -= ti.rounded;
  live_by_term_[static_cast<std::size_t>(ti.term)] -= ti.rounded;
  const TensorId moved = live_list_.back();
  live_list_[live_slot_[t]] = moved;
  live_slot_[moved] = live_slot_[t];
  live_list_.pop_back();
  if (explain_) log_.push_back(~t);
  if (trace_) trace_->events.push_back({~t, section_});
}

void AutogradSim::release_if_dead(TensorId t) {
  auto& ti = tensors_[t];
  if (!ti.alive || ti.holders > 0 || ti.saved > 0) return;
  release(t);
  if (ti.base != kNone) drop(ti.base);  // a view lets go of the storage it views
}

TensorId AutogradSim::view_of(TensorId base, const char* name, bytes_t grad_bytes, const char* dtype) {
  TensorId v = make(name, 0, Term::activations, "view", dtype, "", true);
  set_grad_bytes(v, grad_bytes);
  if (base != kNone && tensors_[v].alive) {
    tensors_[v].base = base;
    hold(base);
  }
  return v;
}

TensorId AutogradSim::make(const char* name, bytes_t bytes, Term term, const char* op,
                           const char* dtype, const char* shape, bool requires_grad) {
  return make(name, bytes, term, default_role(term), op, dtype, shape, requires_grad);
}

TensorInfo AutogradSim::describe(const char* name, bytes_t bytes, Term term, Role role, const char* op, const char* dtype,
                                 const char* shape, bool requires_grad) const {
  TensorInfo info;
  info.role = role;
  info.name = name;
  info.op = op;
  info.dtype = dtype;
  info.shape = shape;
  info.bytes = bytes;
  info.term = term;
  info.requires_grad = requires_grad && recording();
  info.holders = 1;
  return info;
}

TensorId AutogradSim::make(const char* name, bytes_t bytes, Term term, Role role, const char* op,
                           const char* dtype, const char* shape, bool requires_grad) {
  TensorId id = add(describe(name, bytes, term, role, op, dtype, shape, requires_grad));
  if (replay_stopped_) return id;  // the recompute has stopped: never allocated (see stop_replay)
  if (replay_cursor_ != kNoReplay && replay_cursor_ == replay_stop_) {
    deferred_outputs_.push_back(id);
    return id;
  }
  allocate(id);
  return id;
}

void AutogradSim::stop_replay(std::initializer_list<TensorId> outputs, std::initializer_list<TensorId> saved) {
  bool saves_output = false;
  for (TensorId s : saved)
    for (TensorId o : outputs)
      if (s != kNone && s == o) saves_output = true;
  // An op packs its saved inputs before its kernel runs (autograd records the node first), so the
  // stop comes before the outputs exist; an op that saves its result has made it by then.
  if (saves_output)
    for (TensorId t : deferred_outputs_) {
      allocate(t);
      release_if_dead(t);  // a temporary made and dropped before the node recorded
    }
  deferred_outputs_.clear();
  replay_stopped_ = true;
}

TensorId AutogradSim::param(const char* name, bytes_t bytes, Term term, const char* dtype,
                            bool requires_grad, Role role) {
  const TensorId id = meta_param(name, bytes, term, dtype, requires_grad, role);
  allocate(id);
  return id;
}

TensorId AutogradSim::meta_param(const char* name, bytes_t bytes, Term term, const char* dtype, bool requires_grad,
                                 Role role) {
  TensorInfo info = describe(name, bytes, term, role, "parameter", dtype, "", requires_grad);
  info.param = true;
  return add(info);
}

TensorId AutogradSim::alloc_raw(const char* name, bytes_t bytes, Term term, Role role, const char* op,
                                const char* dtype, const char* shape) {
  return make(name, bytes, term, role, op, dtype, shape, false);
}

void AutogradSim::free_raw(TensorId t) { drop(t); }

void AutogradSim::hold(TensorId t) {
  if (t != kNone) ++tensors_[t].holders;
}

void AutogradSim::drop(TensorId t) {
  if (t == kNone) return;
  auto& ti = tensors_[t];
  if (ti.holders > 0) --ti.holders;
  release_if_dead(t);
}

void AutogradSim::transient(const char* name, bytes_t bytes, Term term, Role role) {
  if (bytes == 0) return;
  TensorId t = make(name, bytes, term, role, name, "", "", false);
  drop(t);
}

void AutogradSim::kernel_temporaries(const char* op, const std::array<LaunchSize, 2>& temporaries) {
  // made at every shape (empty where the kernel needs none) so that the step's stream is the same
  // at every shape (the compiled plans and streams evaluate each at the shape)
  TensorId made[2] = {kNone, kNone};
  for (std::size_t p = 0; p < 2; ++p) {
    const LaunchSize& l = temporaries[p];
    if (l.kind == LaunchSize::Kind::none) continue;
    const bool sums = l.kind == LaunchSize::Kind::reduce_buffer || l.kind == LaunchSize::Kind::embedding_partial_sums;
    made[p] = make(sums ? "kernel temporaries: partial sums" : "kernel temporaries: offsets and semaphores", launch_bytes(l),
                   Term::activations, Role::temporary, op, "", "", false);
    tensors_[made[p]].launch = l;
  }
  drop(made[1]);
  drop(made[0]);
}

void AutogradSim::allocate_at_next_matmul(const char* name, bytes_t bytes) { deferred_ = {name, bytes}; }

bool AutogradSim::runs_matmul(const char* op) {
  for (const char* mm : {"LinearBackward", "BmmBackward", "GroupedMmBackward", "FusedLinearCrossEntropyBackward"})
    if (std::strncmp(op, mm, std::strlen(mm)) == 0) return true;
  return false;
}

void AutogradSim::allocate_deferred(const char* op) {
  if (!deferred_.bytes || !runs_matmul(op)) return;
  make(deferred_.name, deferred_.bytes, Term::other, Role::workspace, "cublas", "", "", false);  // held for the run
  deferred_ = {};
}

void AutogradSim::node(const char* op, std::initializer_list<TensorId> inputs,
                       std::initializer_list<TensorId> outputs, std::initializer_list<TensorId> saved,
                       bytes_t bwd_workspace, std::uint8_t view_grads) {
  if (replay_stopped_) return;
  allocate_deferred(op);  // the matmul's output exists: its first cuBLAS call takes the workspace
  last_node_recorded_ = false;
  if (!recording()) return;
  bool any_grad = false;
  for (TensorId i : inputs)
    if (i != kNone && tensors_[i].requires_grad) any_grad = true;
  // An op's output requires grad only when one of its inputs does: with frozen parameters (LoRA)
  // the activations before the first adapter need no gradient, and autograd records nothing for
  // the ops that make them.
  for (TensorId o : outputs)
    if (o != kNone && !any_grad) tensors_[o].requires_grad = false;
  if (!any_grad) return;
  if (replaying()) {
    const bool stop = replay_cursor_ == replay_stop_;
    Node& n = nodes_.at(replay_cursor_++);
    n.saved = Ids(saved, true);
    n.saved_unpacked_once = true;
    for (TensorId s : n.saved) ++tensors_[s].saved;
    if (stop) stop_replay(outputs, saved);
    return;
  }
  Node n{op, Ids(inputs), Ids(outputs), {}, bwd_workspace, section_, view_grads};
  n.saves = Ids(saved, true).n > 0;
  if (!discard_saves_) {
    n.saved = Ids(saved, true);  // kNone: a tensor saved only for a gradient nobody needs
    for (TensorId s : n.saved) ++tensors_[s].saved;
  }
  nodes_.push_back(n);
  last_node_recorded_ = true;
}

void AutogradSim::pass_through_node(const char* op, std::initializer_list<TensorId> inputs, TensorId output,
                                    std::initializer_list<TensorId> saved) {
  node(op, inputs, {output}, saved);
  if (last_node_recorded_) nodes_.back().hands_through = true;
}

void AutogradSim::split_last_workspace(std::uint8_t pieces, std::uint8_t freed_before_gradient) {
  if (!last_node_recorded_) return;
  nodes_.back().workspace_pieces = std::clamp<std::uint8_t>(pieces, 1, 8);
  nodes_.back().pieces_freed_before_gradient = freed_before_gradient;
}

void AutogradSim::release_saved(Node& n) {
  for (TensorId s : n.saved) {
    --tensors_[s].saved;
    release_if_dead(s);
  }
  n.saved = Ids();
}

void AutogradSim::saved_outlive_last_node() {
  if (last_node_recorded_) nodes_.back().saved_outlive_node = true;
}

void AutogradSim::workspace_after_gradients(LaunchSize size) {
  if (!last_node_recorded_) return;
  Node& n = nodes_.back();
  n.workspace_slot = kNoSlot;
  n.workspace = launch_bytes(size);
  n.workspace_launch = size;
  n.workspace_pieces = 1;
}

void AutogradSim::temporaries_before_workspace(std::array<bytes_t, 3> pieces, std::uint8_t kept) {
  if (!last_node_recorded_) return;
  nodes_.back().before_workspace = pieces;
  nodes_.back().before_workspace_kept = kept;
}

void AutogradSim::promote_last_gradient(std::uint8_t slot, bytes_t computed_bytes) {
  if (!last_node_recorded_) return;
  nodes_.back().promoted_slot = slot;
  nodes_.back().promoted_bytes = computed_bytes;
}

void AutogradSim::workspace_before_gradient(std::uint8_t slot) {
  if (last_node_recorded_) nodes_.back().workspace_slot = slot;
}

void AutogradSim::views_through_node(const char* op, std::initializer_list<TensorId> inputs, TensorId output,
                                     std::uint8_t cast_grads) {
  node(op, inputs, {output}, {});
  if (!last_node_recorded_) return;
  nodes_.back().views_through = true;
  nodes_.back().cast_grads = cast_grads;
}

void AutogradSim::reduce_last_gradient(std::uint8_t slot, bool from_workspace, std::array<LaunchSize, 2> temporaries) {
  if (!last_node_recorded_) return;
  Node& n = nodes_.back();
  if (slot >= n.inputs.n) throw Error(ErrorKind::unsupported, "internal: reduced gradient of a missing input");
  n.reduced_slot = slot;
  n.reduced_from_workspace = from_workspace;
  n.reduction_temporaries = temporaries;
}

TensorId AutogradSim::grad_of(TensorId t) const {
  return t >= 0 && static_cast<std::size_t>(t) < grads_.size() ? grads_[t] : kNone;
}

bytes_t AutogradSim::grad_bytes(TensorId input) const {
  // (an op walked with a parameter the spec never made passes kNone here: refused, not read)
  if (input < 0 || static_cast<std::size_t>(input) >= tensors_.size())
    throw Error(ErrorKind::unsupported, "internal: a gradient of a tensor that does not exist (id " + std::to_string(input) + ")");
  // a gradient has its tensor's dtype and shape
  return tensors_[input].grad_bytes ? tensors_[input].grad_bytes : tensors_[input].bytes;
}

void AutogradSim::release_storage(TensorId t) {
  auto& ti = tensors_[t];
  if (!ti.alive) throw Error(ErrorKind::unsupported, std::string("internal: storage of ") + ti.name + " released twice");
  release(t);
}

void AutogradSim::restore_storage(TensorId t) {
  if (tensors_[t].alive) throw Error(ErrorKind::unsupported, std::string("internal: storage of ") + tensors_[t].name + " allocated twice");
  allocate(t);
}

void AutogradSim::drop_grad(TensorId param) {
  if (grads_[param] == kNone) return;
  drop(grads_[param]);
  grads_[param] = kNone;
}

TensorId AutogradSim::handed_through(TensorId incoming, TensorId input) const {
  if (incoming == kNone || tensors_[input].param) return kNone;  // AccumulateGrad would copy a shared one
  const TensorInfo& g = tensors_[incoming];
  const char* dtype = tensors_[input].dtype;
  const bool same_dtype = !*g.dtype || !*dtype || std::strcmp(g.dtype, dtype) == 0;
  return g.bytes == grad_bytes(input) && same_dtype ? incoming : kNone;
}

TensorId AutogradSim::make_grad(TensorId input, const char* op) {
  const auto& ti = tensors_[input];
  TensorInfo g;
  g.name = ti.param ? "parameter gradients (.grad)" : "activation gradients";
  g.op = op;
  g.dtype = ti.dtype;
  g.bytes = grad_bytes(input);
  g.term = ti.param ? Term::model_states : Term::activations;
  g.role = ti.param ? Role::gradient : Role::temporary;  // activation gradients live only in backward
  g.holders = 1;
  TensorId gid = add(g);
  allocate(gid);
  return gid;
}

// torch/csrc/autograd/input_buffer.cpp, InputBuffer::add / accumulate: the first contribution to a
// tensor's gradient is moved into the buffer (and AccumulateGrad steals it for .grad). A later one
// is added with old_var.add_(var) when can_accumulate_inplace(old_var) — a dense tensor whose
// TensorImpl *and storage* have one reference — and otherwise as old_var + var, a new tensor.
// A gradient that the backward formula returned as a view (linear's weight gradient is
// mm_mat2_backward's (gradᵀ·x)ᵀ, transposed again by TBackward0; its input gradient is the
// reshape of a 2-D mm by ViewBackward0) shares its storage with the base that the view's ViewInfo
// keeps alive (views made in no-grad backward are still autograd views), so its storage count is
// two. A gradient handed through (pass_through_node) is shared while another buffer holds it too.
void AutogradSim::grad_contribution(TensorId input, const char* op, bool view, TensorId through) {
  const TensorId old = grads_[input];
  if (old == kNone) {
    if (through != kNone) {
      hold(through);
      grads_[input] = through;
      grad_view_[input] = view ? 1 : 0;  // a narrow of the incoming gradient (views_through_node)
    } else {
      grads_[input] = make_grad(input, op);
      grad_view_[input] = view ? 1 : 0;
    }
    return;
  }
  const bool param = tensors_[input].param;
  const bool old_shared = grad_view_[input] || tensors_[old].holders > 1 || subclass_grad_[input];
  // the contribution this node computes, alive until the input buffer takes it after the node
  auto computed = [&] {
    return make("gradient accumulation temporary", grad_bytes(input), param ? Term::model_states : Term::activations,
                Role::temporary, op, tensors_[input].dtype, "", false);
  };
  if (param && !old_shared) {
    // A parameter's later contribution: AccumulateGrad, a node of its own, adds it into .grad in
    // place once this node has returned and released its incoming gradients (the Llama 3.1 8B
    // pipeline stage's snapshot, tests/data/pp_fresh_snapshots/: lm_head's second microbatch
    // gradient is freed after the logits' gradient).
    pending_.push_back({input, computed(), true});
    return;
  }
  if (!old_shared) {
    // old_var.add_(var): a contribution handed through costs nothing; a computed one is a
    // temporary, added in place once the node has returned, so it outlives the node's later
    // gradients (Qwen2.5 1.5B's q_proj: its input's contribution is freed after its weight's
    // gradient is made, tests/data/reserved_alone/qwen2.5-1.5b_bf16_none_flash_sgd-momentum_foreach_b1s512.pickle.gz
    // events 2998-3006)
    if (through == kNone) pending_.push_back({input, computed(), true});
    return;
  }
  // The engine adds to the input buffer after the node returns (Engine::evaluate_function:
  // call_function, then release_variables, then InputBuffer::add): the contribution stays
  // allocated until then, and the sum, old_var + var unless the node's release left old_var with
  // one reference, is made after the node's incoming gradients are freed. The sum is a plain
  // tensor, so later contributions go into it in place.
  if (through != kNone) {
    hold(through);
    pending_.push_back({input, through, false});
  } else {
    pending_.push_back({input, computed(), false});
  }
}

void AutogradSim::backward(TensorId root, const Graph& graph, RecomputeFn recompute, void* ctx) {
  if (!recording()) throw Error(ErrorKind::unsupported, "internal: backward of a simulation run with GradMode::off");
  const std::size_t first = graph.first_node, end = std::min(graph.end_node, nodes_.size());
  if (graph.seed != kNone) {
    hold(graph.seed);  // the caller's tensor: this backward drops only its own reference
    grads_[root] = graph.seed;
  } else {
    // d(loss)/d(loss): a one-element tensor.
    TensorInfo seed;
    seed.name = "loss gradient";
    seed.bytes = 4;
    seed.holders = 1;
    seed.term = Term::logits_loss;
    seed.role = Role::logits_loss;
    TensorId g = add(seed);
    allocate(g);
    grads_[root] = g;
  }
  for (TensorId p : params_)
    if (grads_[p] != kNone) grad_view_[p] = 0;  // accumulated in place (see above)

  // (What follows visits the graph's nodes, not every node and tensor made so far: a pipeline
  // stage runs a backward per microbatch, and scans of the whole simulation made its cost grow
  // with the square of the microbatches.)
  std::vector<TensorId> grad_holders{root};  // tensors that have been given a gradient
  // grad_ready: each parameter's gradient is complete after the earliest node that has it as input
  std::vector<std::vector<TensorId>> ready_after;  // by node, from `first`
  if (hooks_.grad_ready) {
    ready_after.resize(end > first ? end - first : 0);
    param_seen_.resize(tensors_.size(), 0);
    for (std::size_t k = first; k < end; ++k)
      for (TensorId i : nodes_[k].inputs)
        if (i != kNone && tensors_[i].param && tensors_[i].requires_grad && !param_seen_[i]) {
          param_seen_[i] = 1;
          ready_after[k - first].push_back(i);
        }
    for (const auto& ready : ready_after)
      for (TensorId p : ready) param_seen_[p] = 0;
  }
  // Each checkpointed region's recompute trigger (its last node that saves: see below) and the
  // node after which its frame goes (its first that saves), in the order backward reaches them.
  // (Only this graph's regions: the loop below reaches no node outside it.)
  std::vector<std::pair<std::size_t, const Region*>> triggers;
  std::vector<std::pair<std::size_t, TensorId>> frames;
  for (const auto& r : regions_) {
    if (r.end_node <= first || r.first_node >= end) continue;
    std::size_t last = r.end_node, first_saving = r.first_node;
    while (last-- > r.first_node && !nodes_[last].saves) {}
    while (first_saving < r.end_node && !nodes_[first_saving].saves) ++first_saving;
    if (last >= r.first_node && last < r.end_node) triggers.push_back({last, &r});
    for (TensorId held : r.frame)
      if (held != kNone) frames.push_back({first_saving < r.end_node ? first_saving : r.end_node - 1, held});
  }
  std::sort(triggers.begin(), triggers.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::sort(frames.begin(), frames.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::size_t next_trigger = 0, next_frame = 0;
  int section_run = -1;  // the section of the last node run (hooks_.section)
  for (std::size_t k = end; k-- > first;) {
    if (hooks_.section && nodes_[k].section != section_run) {
      section_ = nodes_[k].section;
      hooks_.section(*this, hooks_.ctx, section_run, nodes_[k].section);
      section_run = nodes_[k].section;
    }
    // A checkpointed region recomputes its forward when backward first unpacks one of its saved
    // tensors, i.e. before its last node that saves (the nodes after it, an add that hands its
    // gradient through or casts it, run first: the Qwen2.5 1.5B amp-bf16 full-recompute step
    // makes the residual add's bf16 gradient before the layer's recompute,
    // tests/data/reserved_expandable_alone/, event 4820), and stops once that node's saved tensors
    // are packed again (stop_replay). A region that saves nothing is never recomputed.
    while (next_trigger < triggers.size() && triggers[next_trigger].first > k) ++next_trigger;  // outside this graph
    for (; next_trigger < triggers.size() && triggers[next_trigger].first == k; ++next_trigger) {
      if (!recompute) continue;
      const Region& r = *triggers[next_trigger].second;
      replay_cursor_ = r.first_node;
      replay_stop_ = k;
      section_ = nodes_[r.first_node].section;
      recompute(*this, ctx, r.index);
      if (!replay_stopped_)
        throw Error(ErrorKind::unsupported, "internal: recompute replay did not reach the checkpointed region's last saving node");
      replay_cursor_ = replay_stop_ = kNoReplay;
      replay_stopped_ = false;
    }
    Node& n = nodes_[k];
    section_ = n.section;
    bool active = false;
    for (TensorId o : n.outputs)
      if (grads_[o] != kNone) active = true;
    if (active) {
      TensorId ws[8] = {kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone};
      TensorId before[3] = {kNone, kNone, kNone};  // temporaries_before_workspace's kept pieces
      auto make_workspace = [&] {
        for (std::size_t p = 0; p < std::size(before); ++p)
          if (n.before_workspace[p])
            before[p] = make("backward temporaries (an expression before the workspace)", n.before_workspace[p], Term::activations,
                             n.op, "", "", false);
        for (std::size_t p = std::size(before); p-- > 0;)
          if (!((n.before_workspace_kept >> p) & 1u)) {
            drop(before[p]);
            before[p] = kNone;
          }
        for (std::uint8_t p = 0; p < n.workspace_pieces; ++p)  // equal pieces, the first taking the remainder
          ws[p] = make("backward workspace", n.workspace / n.workspace_pieces + (p == 0 ? n.workspace % n.workspace_pieces : 0),
                       Term::activations, n.op, "", "", false);
        if (n.workspace_launch.kind != LaunchSize::Kind::none) tensors_[ws[0]].launch = n.workspace_launch;
        for (std::uint8_t p = 0; p < n.workspace_pieces; ++p)
          if ((n.pieces_freed_before_gradient >> p) & 1u) {
            drop(ws[p]);
            ws[p] = kNone;
          }
      };
      auto drop_before = [&] {
        for (std::size_t p = std::size(before); p-- > 0;) {
          drop(before[p]);
          before[p] = kNone;
        }
      };
      const bool reduced = n.reduced_slot != kNoSlot;
      // the workspace is made before input `workspace_slot`'s gradient (after every gradient when
      // that is past the last input), or as the reduced input's product
      const bool ws_at_reduced = reduced && n.reduced_from_workspace;
      const bool ws_placed = n.workspace && !ws_at_reduced;
      const TensorId incoming = n.hands_through || n.views_through ? grads_[n.outputs.v[0]] : kNone;
      auto gradient = [&](std::size_t slot) {
        const TensorId i = n.inputs.v[slot];
        if (i == kNone || !tensors_[i].requires_grad) return false;
        if (grads_[i] == kNone) grad_holders.push_back(i);
        if (n.views_through) {
          if ((n.cast_grads >> slot) & 1u)
            grad_contribution(i, n.op, false, kNone);  // the narrow cast to the input's dtype
          else
            grad_contribution(i, n.op, true, incoming);  // a narrow of the incoming gradient
          return true;
        }
        grad_contribution(i, n.op, (n.view_grads >> slot) & 1u, handed_through(incoming, i));
        allocate_deferred(n.op);  // after the first gradient a matmul computes
        return true;
      };
      const bool promoted = n.promoted_slot != kNoSlot && n.inputs.v[n.promoted_slot] != kNone &&
                            tensors_[n.inputs.v[n.promoted_slot]].requires_grad;
      TensorId promoted_product = kNone;
      for (std::size_t slot = 0; slot < n.inputs.n; ++slot) {
        if (ws_placed && slot == n.workspace_slot) make_workspace();
        if (slot == n.reduced_slot) {
          if (n.workspace && ws_at_reduced) make_workspace();  // the broadcast factor's full-size product, reduced below
        } else if (promoted && slot == n.promoted_slot) {
          promoted_product = make("gradient in the product's dtype (cast after the node)", n.promoted_bytes,
                                  Term::activations, Role::temporary, n.op, "fp32", "", false);
        } else {
          gradient(slot);
        }
      }
      if (ws_placed && n.workspace_slot >= n.inputs.n) make_workspace();
      if (n.saved_unpacked_once && !n.saved_outlive_node) {
        // The kernel's own temporaries go as it returns, before the backward function's locals
        // (flash attention's fp32 dq accumulator, then the recomputed q, k, v and output: the
        // snapshot of Qwen1.5-MoE's 4-layer bf16 full recompute, tests/data/inprocess_alone/).
        // A product that validate_outputs reduces below stays until then.
        if (!ws_at_reduced) {
          drop_before();
          for (std::size_t p = std::size(ws); p-- > 0;) {
            drop(ws[p]);
            ws[p] = kNone;
          }
        }
        release_saved(n);
      }
      // autograd's validate_outputs, input by input in the function's order (the reverse of the
      // order this node computes them): a broadcast input's reduction (its product freed once
      // reduced), a promoted input's cast (the product's dtype freed after)
      for (std::size_t slot = n.inputs.n; slot-- > 0;) {
        if (reduced && slot == n.reduced_slot && gradient(slot)) {
          kernel_temporaries(n.op, n.reduction_temporaries);
          if (ws_at_reduced) {
            for (std::size_t p = std::size(ws); p-- > 0;) drop(ws[p]);
            std::fill(std::begin(ws), std::end(ws), kNone);
          }
        }
        if (promoted && slot == n.promoted_slot) {
          gradient(slot);
          drop(promoted_product);
        }
      }
      drop_before();
      for (std::size_t p = std::size(ws); p-- > 0;) drop(ws[p]);  // the last allocated first
      for (TensorId o : n.outputs) {
        if (grads_[o] == kNone) continue;
        if (tensors_[o].param) continue;  // .grad of a parameter stays
        drop(grads_[o]);
        grads_[o] = kNone;
      }
    }
    release_saved(n);
    while (next_frame < frames.size() && frames[next_frame].first > k) ++next_frame;
    for (; next_frame < frames.size() && frames[next_frame].first == k; ++next_frame) drop(frames[next_frame].second);
    // Engine::evaluate_function hands the node's outputs to the next nodes' input buffers, then
    // the ready queue runs the AccumulateGrad nodes first (their sequence_nr is UINT64_MAX). So
    // the sums into activations' buffers come first, and only then does each parameter's .grad
    // take its contribution: Llama 3.1 8B's last 1F1B x DDP 2 stage sums gate_proj's and
    // up_proj's input gradients before it frees gate_proj's later-microbatch weight gradient
    // (tests/data/mul_order_alone/, events 1007-1014).
    auto settle = [&](const PendingSum& p) {
      const TensorId old = grads_[p.input];
      // Decided now that the node's incoming gradients are released: a buffer that an add shared
      // with this node's own input may have become the last reference (old_var.add_(var)).
      if (p.in_place || (!grad_view_[p.input] && !subclass_grad_[p.input] && tensors_[old].holders == 1)) {
        drop(p.incoming);
        return;
      }
      // out of place (see grad_contribution): old_var + var, then both operands die
      grads_[p.input] = make_grad(p.input, n.op);
      grad_view_[p.input] = 0;
      drop(old);
      drop(p.incoming);
    };
    for (const PendingSum& p : pending_)
      if (!tensors_[p.input].param) settle(p);
    for (const PendingSum& p : pending_)
      if (tensors_[p.input].param) settle(p);
    pending_.clear();
    if (hooks_.grad_ready)
      for (TensorId p : ready_after[k - first])
        if (grads_[p] != kNone) hooks_.grad_ready(*this, hooks_.ctx, p);
  }
  if (hooks_.section) hooks_.section(*this, hooks_.ctx, section_run, -1);
  // The seed gradient and any gradient left on non-parameter leaves die with the graph.
  for (TensorId t : grad_holders) {
    if (grads_[t] != kNone && !tensors_[t].param && t != graph.keep) {
      drop(grads_[t]);
      grads_[t] = kNone;
    }
  }
}

void AutogradSim::begin_phase(Phase phase) {
  PhasePeak p;
  p.phase = phase;
  p.bytes = 0;
  phases_.push_back(std::move(p));
  peak_event_.push_back(log_.size());
  if (trace_) {
    trace_->events.push_back({SimTrace::kPhase, section_});
    trace_->phases.push_back(phase);
  }
  note_peak();
}

void AutogradSim::finish_trace() {
  if (!trace_) return;
  last_sizes().events = trace_->events.size();
  trace_->tensors = std::move(tensors_);
}

std::vector<TensorBytes> AutogradSim::groups_of(std::vector<TensorId> ids, Term term) const {
  std::sort(ids.begin(), ids.end());  // each group described as its first tensor made
  std::map<std::string, TensorBytes> groups;
  for (const TensorId id : ids) {
    const TensorInfo& t = tensors_[id];
    if (t.term != term) continue;
    auto& g = groups[t.name];
    if (g.name.empty()) {
      g.name = t.name; g.op = t.op; g.dtype = t.dtype; g.shape = t.shape; g.term = t.term; g.role = t.role; g.count = 0;
    }
    g.count += 1;
    g.bytes += t.rounded;
  }
  std::vector<TensorBytes> out;
  for (auto& [_, g] : groups) out.push_back(std::move(g));
  return out;
}

std::vector<PhasePeak> AutogradSim::take_phases() {
  // A phase entered many times (a pipeline schedule's forwards and backwards) is reported once, at
  // its highest entry (the first of equals), where its first entry stood; only that entry's live
  // set is rebuilt (each rebuild reads the whole log).
  std::vector<PhasePeak> out;
  std::vector<std::size_t> at;  // out[i]'s entry in phases_
  for (std::size_t i = 0; i < phases_.size(); ++i) {
    const auto same = std::find_if(out.begin(), out.end(), [&](const PhasePeak& q) { return q.phase == phases_[i].phase; });
    if (same == out.end()) {
      out.push_back(std::move(phases_[i]));
      at.push_back(i);
    } else if (phases_[i].bytes > same->bytes) {
      *same = std::move(phases_[i]);
      at[static_cast<std::size_t>(same - out.begin())] = i;
    }
  }
  if (explain_)
    for (std::size_t k = 0; k < out.size(); ++k) out[k].live = groups_at(peak_event_[at[k]]);
  phases_.clear();
  return out;
}

}  // namespace membudget::detail
