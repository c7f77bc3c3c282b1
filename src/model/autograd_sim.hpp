// src/model/autograd_sim.hpp: a byte-level simulation of an eager autograd step.
//
// The inventory activation model describes a step the way PyTorch executes it: forward ops create
// tensors, Python references keep some alive, each op saves some tensors for backward, and the
// caching allocator's "allocated" counter is the sum of live tensors, each rounded to 512 B. Backward
// visits the recorded nodes in reverse, allocates the gradients of each node's inputs (and any
// workspace the kernel needs), frees the gradients of its outputs, and releases the node's saved
// tensors. Gradients are accumulated in autograd's input buffer and then into .grad (the first
// contribution is stolen; a later one is added in place, unless the buffered gradient is a view,
// which makes the engine allocate the sum out of place: see grad_contribution).
//
// The simulator knows nothing about transformers: the profile code drives it op by op (the
// transformers ops in torch_ops.hpp, for the training inventory, inventory_torch.cpp, and the
// serving walk, serving.cpp; the harness's inventory, inventory_harness.cpp). Phases are marked by
// the driver; each phase records its peak (and, with explain, the live tensors at that peak,
// grouped by name).
//
// GradMode::off is torch.inference_mode() / torch.no_grad(): no tensor requires grad, node()
// records nothing and saves nothing, so a tensor lives exactly while a Python reference holds it.
#pragma once

#include <algorithm>
#include <array>
#include <initializer_list>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_reduce.hpp"
#include "membudget/budget.hpp"
#include "optimizer_loop.hpp"

namespace membudget::detail {

using TensorId = int;
inline constexpr TensorId kNone = -1;

// The CUDA stream a tensor's memory is allocated on. The caching allocator files a block under the
// stream that allocated it and reuses it only for that stream's requests, so the reserved-memory
// replay (reserved.cpp) needs it; allocated bytes do not depend on it. FSDP2 allocates its
// all-gather input and output on the all-gather copy-in stream and the reduce-scatter output on
// the reduce-scatter stream (torch 2.11's _fsdp_collectives.py; the streams of the snapshots in
// tests/data/dist_snapshots).
enum class AllocStream : std::uint8_t { compute, all_gather, reduce_scatter };

struct TensorInfo {
  const char* name = "";   // template name: "layers.*.mlp.up_out"
  const char* op = "";     // op that creates it
  const char* dtype = "";  // "bf16"
  const char* shape = "";  // "b·s·I"
  bytes_t bytes = 0;       // logical size (numel × element size)
  bytes_t rounded = 0;     // what the allocator counts (multiple of 512)
  bytes_t grad_bytes = 0;  // its gradient's logical size when that differs from `bytes` (an FSDP2
                           // unsharded parameter's storage is padded, its gradient is not); 0: bytes
  Term term = Term::activations;
  Role role = Role::saved_activation;
  AllocStream stream = AllocStream::compute;
  // A trainable parameter's optimizer (and an optimizer state's or temporary's), numbered in the
  // order they step: 0 with one optimizer; 1 for the plain tensors beside DTensors
  // (optimizer_per_tensor_kind, parallel.hpp: under tensor and expert parallelism torch.optim
  // takes an optimizer per kind, the DTensors' first); a pipeline stage module's otherwise
  // (stage_optimizer, inventory_torch.cpp).
  std::uint8_t optimizer = 0;
  // A trainable parameter's elements in this rank's optimizer state when its share of the state is
  // not in proportion to `bytes`: an FSDP2 rank's own chunk (fsdp_local_shard), where the storage
  // is the padded one (the last ranks of an uneven split hold fewer rows than they store). 0: bytes.
  std::uint64_t state_elements = 0;
  // Whether this rank's optimizer steps the parameter (ZeRO-1: only the tensors it owns), and its
  // place in the optimizer's list where that is not the order parameters are made (ZeRO-1's local
  // optimizer takes them largest first; 0: in the order made).
  bool stepped = true;
  std::uint32_t step_order = 0;
  // A kernel's temporary sized by its launch configuration (cuda_reduce.hpp): `bytes` is
  // launch_bytes(launch) at this shape, and the compiled plans evaluate it at theirs.
  LaunchSize launch{};
  TensorId base = kNone;  // a view's storage, which it keeps alive (AutogradSim::view_of)
  bool param = false;
  bool requires_grad = false;
  int holders = 0;  // Python references / autocast cache
  int saved = 0;    // saved-for-backward references
  bool alive = false;
};

// The allocation stream of one simulation, recorded for the compiled estimator
// (src/model/step_plan.cpp): every allocation and free in order, and every phase start, each with
// the section it happened in; then every tensor's description (finish_trace).
struct SimTrace {
  static constexpr std::int32_t kPhase = std::numeric_limits<std::int32_t>::min();
  struct Event {
    std::int32_t t;        // ≥ 0: tensor t is allocated; kPhase: a phase begins; else ~t is freed
    std::int32_t section;  // the section (see set_section) at that moment
    bool operator==(const Event&) const = default;
  };
  std::vector<Event> events;
  std::vector<Phase> phases;        // which phase each kPhase event begins (a pipeline schedule repeats them)
  std::vector<TensorInfo> tensors;  // by tensor id
  // How many events were recorded when the step noted what its forward leaves for backward
  // (TorchStepResult's after_forward figures; a pipeline stage notes the moment with the most
  // microbatches in flight): the compiled plans take their activation groups at the same place.
  std::size_t after_forward = std::numeric_limits<std::size_t>::max();
  // The for-loop optimizer's allocations parameter by parameter (optimizer_loop.hpp), which the
  // replay runs in place of the step's "optimizer temporaries" tensor; empty where that tensor is
  // the temporaries as they are allocated.
  std::vector<LoopOp> optimizer_loop;
};

// Whether autograd records the graph: `record` (a training forward) or `off` (inference_mode).
enum class GradMode : std::uint8_t { record, off };

class AutogradSim {
 public:
  explicit AutogradSim(bool explain, GradMode grad = GradMode::record) : explain_(explain), grad_(grad) {
    // Room for what this thread's last simulation made: simulations come in runs of one size (a
    // step's two passes, a pipeline's stages, the reserved stream's probes), and a vector grown by
    // doubling to tens of MiB faults in twice its pages (a pipeline's 64 microbatches: 60,000
    // tensors). Room reserved and not used is only address space.
    const Sizes& last = last_sizes();
    tensors_.reserve(last.tensors);
    grads_.reserve(last.tensors);
    grad_view_.reserve(last.tensors);
    subclass_grad_.reserve(last.tensors);
    live_slot_.reserve(last.tensors);
    nodes_.reserve(last.nodes);
  }
  ~AutogradSim() {  // (its own members only: the trace may be gone; finish_trace notes its events)
    Sizes& last = last_sizes();
    last.tensors = std::max<std::size_t>(grads_.size(), 1024);  // (tensors_ may have moved into the trace)
    last.nodes = std::max<std::size_t>(nodes_.size(), 1024);
  }
  AutogradSim(const AutogradSim&) = delete;
  AutogradSim& operator=(const AutogradSim&) = delete;

  // ---- forward ----
  // False under GradMode::off: nothing requires grad and nothing is saved.
  bool recording() const { return grad_ == GradMode::record; }
  // A new tensor held by one Python reference (under GradMode::off, requires_grad is ignored). Its role defaults to the term's usual one
  // (default_role); tensors whose role differs (inputs, workspaces) name theirs.
  TensorId make(const char* name, bytes_t bytes, Term term, const char* op, const char* dtype,
                const char* shape, bool requires_grad);
  TensorId make(const char* name, bytes_t bytes, Term term, Role role, const char* op, const char* dtype,
                const char* shape, bool requires_grad);
  // A parameter (or any tensor already allocated before the step): counted, never freed.
  TensorId param(const char* name, bytes_t bytes, Term term, const char* dtype, bool requires_grad = true,
                 Role role = Role::parameter);
  // A persistent tensor allocated right after the output of the next matmul: a cuBLAS handle's
  // workspace, which cuBLAS takes inside its first call, once that call's output exists (the next
  // matmul node recorded in a forward, including a recompute's, or the first matmul gradient a
  // backward computes).
  void allocate_at_next_matmul(const char* name, bytes_t bytes);
  // A matmul outside autograd (the rotary embedding's inv_freq @ positions, under no_grad): it
  // records no node, but its cuBLAS call takes a workspace deferred to the next matmul.
  void matmul_without_grad() { allocate_deferred("BmmBackward0"); }
  // A parameter whose storage is not on the GPU yet (a model built on the meta device, as FSDP2's
  // recipes build it): nothing is allocated until restore_storage.
  TensorId meta_param(const char* name, bytes_t bytes, Term term, const char* dtype, bool requires_grad = true,
                      Role role = Role::parameter);
  void hold(TensorId t);
  void drop(TensorId t);
  // A parameter's storage freed and allocated again (FSDP2's unsharded parameters: resize_(0) after
  // use, resize_ back at the next all-gather); the tensor, its autograd identity and its gradient
  // stay. `grad_bytes`: its gradient's logical size when not `bytes` (see TensorInfo).
  void release_storage(TensorId t);
  void restore_storage(TensorId t);
  bool storage_alive(TensorId t) const { return tensors_[t].alive; }
  void set_grad_bytes(TensorId t, bytes_t b) { tensors_[t].grad_bytes = b; }
  // A view of `base` (no storage of its own, a gradient of `grad_bytes`): it holds `base` until it
  // dies itself, saved or not, as a PyTorch view keeps its base's storage. kNone: a view whose
  // storage the caller keeps alive itself (TorchOps::view).
  TensorId view_of(TensorId base, const char* name, bytes_t grad_bytes, const char* dtype);
  void set_stream(TensorId t, AllocStream s) { tensors_[t].stream = s; }
  void set_optimizer(TensorId t, std::uint8_t o) { tensors_[t].optimizer = o; }
  void set_state_elements(TensorId t, std::uint64_t n) { tensors_[t].state_elements = n; }
  void set_stepped(TensorId t, bool stepped, std::uint32_t order = 0) {
    tensors_[t].stepped = stepped;
    tensors_[t].step_order = order;
  }
  // Frees a parameter's gradient (FSDP2 reduce-scatters it away, DDP's bucket view replaces it).
  void drop_grad(TensorId param);
  // Records a backward node: `inputs` receive gradients (those that require grad), `outputs` send
  // them, `saved` are kept until the node runs. `bwd_workspace` is transient memory of the
  // backward kernel beyond the input gradients. Bit i of `view_grads` says that the backward
  // formula returns input i's gradient as a view of a tensor it allocated (a reshape or a
  // transpose of a matmul's result): the view keeps its base alive, so autograd's input buffer
  // cannot add a later contribution into it in place. Under GradMode::off it does nothing.
  void node(const char* op, std::initializer_list<TensorId> inputs, std::initializer_list<TensorId> outputs,
            std::initializer_list<TensorId> saved, bytes_t bwd_workspace = 0, std::uint8_t view_grads = 0);
  // Whether the tensors made from now on are DTensors (a tensor subclass): autograd's input buffer
  // never adds into a subclass's gradient in place (input_buffer.cpp, can_accumulate_inplace), so a
  // later contribution to one is summed into a new tensor. Returns the previous setting.
  bool dtensor_scope(bool on) { return std::exchange(dtensor_scope_, on); }
  // A node whose backward launches nothing and hands its incoming gradient to each input as the
  // same tensor, where the input has the output's size and dtype (else it gets a reduced or cast
  // copy): an add (AddBackward0, AddBackward1; a broadcast or promoted addend gets its own), or
  // loss_parallel's log-softmax backward. Autograd's input buffers then share that one tensor, so
  // a residual stream's gradient is one buffer from the loss down, summed into in place layer
  // after layer (see grad_contribution).
  void pass_through_node(const char* op, std::initializer_list<TensorId> inputs, TensorId output,
                         std::initializer_list<TensorId> saved = {});
  // The last recorded node's backward workspace is `pieces` equal temporaries, each its own
  // allocation (the caching allocator places them apart), allocated in order before its input
  // gradients. Bit i of `freed_before_gradient` frees piece i before the gradients are made (a
  // temporary of an expression whose result is the gradient); the others are freed after them,
  // the last allocated first.
  void split_last_workspace(std::uint8_t pieces, std::uint8_t freed_before_gradient = 0);
  // The last recorded node's input `slot` is broadcast (a norm's weight, a bias): its gradient is
  // reduced to its shape after the node has computed every gradient (autograd's validate_outputs
  // sums it to the input's shape), and the reduction's kernel allocates `temporaries` (its staging
  // buffer and semaphores: reduce_launch) right after that gradient, freed last first.
  // `from_workspace`: the unreduced gradient is the node's workspace (a MulBackward0 factor's
  // full-size product), made when the node reaches that input in its order; otherwise it is the
  // incoming gradient itself (addmm's bias). Also a gradient a kernel makes with temporaries of its
  // own (the embedding's partial segments), from_workspace false.
  void reduce_last_gradient(std::uint8_t slot, bool from_workspace, std::array<LaunchSize, 2> temporaries);
  // The last recorded node computes input `slot`'s gradient in a wider dtype than the input's
  // (`computed_bytes`: a 16-bit factor times an fp32 one) and autograd casts it to the input's
  // dtype after the node (validate_outputs), then frees the wide one (Qwen3's k_norm under
  // amp-bf16: 8 MiB in fp32, the weight's reduction, then the 4 MiB bf16 gradient).
  void promote_last_gradient(std::uint8_t slot, bytes_t computed_bytes);
  // The last recorded node allocates its input gradients before its workspace (flash attention's
  // backward: dq, dk, dv, then the fp32 accumulators), of `size` (one request).
  void workspace_after_gradients(LaunchSize size);
  // The last recorded node evaluates an expression after its input gradients and before its
  // workspace (workspace_after_gradients): `pieces` allocated in order (0: none); those whose bit is
  // not in `kept` go, the last made first, before the workspace is made, the kept ones just before
  // it goes. (ATen's fp32 memory-efficient attention backward computes delta itself:
  // grad_out * out, its .sum(-1), then the sum transposed and made contiguous, which the kernel reads.)
  void temporaries_before_workspace(std::array<bytes_t, 3> pieces, std::uint8_t kept);
  // The last recorded node's recomputed saved tensors (a checkpointed region's) go after its
  // workspace and its incoming gradient, as when the node releases its variables, not with the
  // backward function's locals (the memory-efficient attention's backward in DeepSeek-V2-Lite's
  // whole-run snapshot, tests/data/heldout_conf/: its fp32 accumulators, then o_proj's input
  // gradient, then the log-sum-exp, v's base, q, k and the output).
  void saved_outlive_last_node();
  // The last recorded node makes its workspace just before input `slot`'s gradient (a
  // tensor-parallel linear's all-reduce copy, after the weight's gradient and in its input's place).
  void workspace_before_gradient(std::uint8_t slot);
  // A node whose backward hands each input a view of its incoming gradient (CatBackward0's
  // narrows): nothing is allocated, and the incoming gradient lives until every view is consumed.
  // Bit i of `cast_grads`: input i has another dtype than the output, so validate_outputs casts its
  // narrow to a tensor of its own, which holds nothing of the incoming gradient (Phi-3's partial
  // rotary under autocast: the empty bf16 pass slice beside the fp32 rotated half).
  void views_through_node(const char* op, std::initializer_list<TensorId> inputs, TensorId output,
                          std::uint8_t cast_grads = 0);
  // Transient memory of a forward kernel (a workspace allocated and freed inside the op).
  void transient(const char* name, bytes_t bytes, Term term = Term::activations, Role role = Role::temporary);
  // A kernel's temporaries sized by its launch configuration (a reduction's staging buffer, then
  // its semaphores: reduce_launch), allocated in order and freed last first, inside `op`.
  void kernel_temporaries(const char* op, const std::array<LaunchSize, 2>& temporaries);
  // Recompute support: nodes created while discard_saves is set keep no saved tensors; a
  // checkpoint region records [first,last) node indices to be re-run by `recompute`.
  void set_discard_saves(bool on) { discard_saves_ = on; }
  // Sections (used by the compiled plans, src/model/step_plan.cpp): the driver tags the forward
  // with section ids (0: before the layers, 1 + i: layer i, L + 1: after the layers, L + 2: outside
  // the model's module, as a pipeline schedule's loss is outside the stage module). Nodes
  // remember the section they were recorded in; backward (and recompute) runs each node in its
  // section. The trace records the section of every event.
  void set_section(int s) { section_ = s; }
  int section() const { return section_; }
  // Records the allocation stream into `trace` (nullptr: stop); finish_trace() adds the tensors.
  // finish_trace() ends the simulation: the tensors move into the trace (take_phases first).
  void record_to(SimTrace* trace) {
    trace_ = trace;
    if (trace_) trace_->events.reserve(last_sizes().events);
  }
  // The recorded stream reaches the moment the after-forward figures are taken (SimTrace::after_forward).
  void mark_after_forward() {
    if (trace_) trace_->after_forward = trace_->events.size();
  }
  void finish_trace();
  std::size_t node_count() const { return nodes_.size(); }

  // ---- backward ----
  using RecomputeFn = void (*)(AutogradSim&, void* ctx, int region);
  // `frame`: what the checkpoint frame holds (the recompute closure's arguments: the layer's input,
  // the attention mask it was called with, the rotary cos and sin), one reference each that the
  // simulation drops when
  // the frame goes: once the region's first node that saves has run and released its saved
  // tensors, the last unpack handle of the region (Qwen2.5 7B full recompute: each layer's input is
  // freed in input_layernorm's PowBackward0, tests/data/handthrough_snapshots/, event 3977; Llama
  // 3.2 1B's eager mask with layer 0's frame, before the embedding's backward,
  // tests/data/mul_order_alone/; Gemma 2 2B's cos and sin there too, tests/data/eager_alone/).
  using Frame = std::array<TensorId, 4>;
  struct Region {
    std::size_t first_node, end_node;
    int index;
    Frame frame{kNone, kNone, kNone, kNone};
  };
  void add_recompute_region(std::size_t first_node, std::size_t end_node, int index,
                            Frame frame = {kNone, kNone, kNone, kNone}) {
    regions_.push_back({first_node, end_node, index, frame});
  }
  // Runs backward from `root` (the loss). recompute(sim, ctx, region) must re-create the region's
  // saved tensors by calling node() again for exactly the region's nodes, in order, while
  // replaying() is true; those calls attach saved tensors to the existing nodes.
  void backward(TensorId root, RecomputeFn recompute = nullptr, void* ctx = nullptr) {
    backward(root, Graph{}, recompute, ctx);
  }
  // One of several graphs recorded one after another (a pipeline stage's microbatches): the nodes
  // [first_node, end_node) only, seeded with `seed` (the gradient the next stage sent, a tensor the
  // caller owns) instead of d(loss)/d(loss) when given. The gradient of `keep` (the stage's input,
  // sent to the previous stage) stays for the caller to drop (drop_grad). Parameters that already
  // hold a gradient from an earlier graph accumulate into it in place (AccumulateGrad's
  // `variable.grad += new_grad`): only the new contribution is allocated, for the add.
  struct Graph {
    std::size_t first_node = 0, end_node = static_cast<std::size_t>(-1);
    TensorId seed = kNone, keep = kNone;
  };
  void backward(TensorId root, const Graph& graph, RecomputeFn recompute = nullptr, void* ctx = nullptr);
  // What data-parallel wrappers do during backward (src/model/data_parallel.cpp), called by
  // backward(): `section(from, to)` when the next node to run belongs to another section than the
  // last one (from −1 at the start, to −1 at the end; before that section's recompute), i.e.
  // FSDP2's pre- and post-backward hooks of a layer; `grad_ready(param)` once the last node that
  // contributes to a parameter's gradient has run (DDP's autograd hook on AccumulateGrad).
  struct BackwardHooks {
    void* ctx = nullptr;
    void (*section)(AutogradSim&, void* ctx, int from, int to) = nullptr;
    void (*grad_ready)(AutogradSim&, void* ctx, TensorId param) = nullptr;
  };
  void set_backward_hooks(BackwardHooks hooks) { hooks_ = hooks; }
  bool replaying() const { return replay_cursor_ != kNoReplay; }

  // ---- phases ----
  void begin_phase(Phase phase);
  // Each phase once, in the order first entered, with its highest entry's peak (a pipeline
  // schedule enters its phases many times; the first of equals); with explain, the live tensors
  // at that peak.
  std::vector<PhasePeak> take_phases();
  bytes_t live() const { return live_; }
  // Explicit allocation outside the tensor model (optimizer state, workspaces): alloc then free.
  TensorId alloc_raw(const char* name, bytes_t bytes, Term term, Role role, const char* op = "",
                     const char* dtype = "", const char* shape = "");
  void free_raw(TensorId t);
  const TensorInfo& info(TensorId t) const { return tensors_[t]; }
  TensorId grad_of(TensorId t) const;
  // A tensor's logical size (numel × element size): its bytes, or for a view (no storage of its own)
  // the bytes it views.
  bytes_t logical_bytes(TensorId t) const { return grad_bytes(t); }
  const std::array<bytes_t, 6>& live_by_term() const { return live_by_term_; }  // indexed by Term
  // The live tensors, in no order.
  const std::vector<TensorId>& live_tensors() const { return live_list_; }
  // Tensors `ids` of one term, by name (each group described as its first tensor made).
  std::vector<TensorBytes> groups_of(std::vector<TensorId> ids, Term term) const;

 private:
  // A node's tensor lists, stored inline (no allocation per node).
  struct Ids {
    std::array<TensorId, 6> v{};
    std::uint8_t n = 0;
    Ids() = default;
    Ids(std::initializer_list<TensorId> l, bool drop_none = false) {
      if (l.size() > v.size()) throw Error(ErrorKind::unsupported, "internal: autograd node with too many tensors");
      for (TensorId t : l)
        if (!drop_none || t != kNone) v[n++] = t;
    }
    const TensorId* begin() const { return v.data(); }
    const TensorId* end() const { return v.data() + n; }
  };
  struct Node {
    const char* op;
    Ids inputs, outputs, saved;
    bytes_t workspace;
    int section;
    std::uint8_t view_grads;  // bit i: input i's gradient is a view (see node())
    std::uint8_t workspace_pieces = 1;  // split_last_workspace
    std::uint8_t pieces_freed_before_gradient = 0;
    bool hands_through = false;         // pass_through_node: the incoming gradient is passed on, not copied
    bool saves = false;                 // saves a tensor (also where discard_saves drops it)
    bool views_through = false;         // views_through_node
    std::uint8_t cast_grads = 0;        // views_through_node: bit i, input i's narrow is cast to its own tensor
    // its saved tensors came from a checkpoint's recompute: unpacking hands each out once (the
    // frame forgets it), so they die with the backward function's locals, before autograd
    // reduces its gradients (validate_outputs) — not when the node releases its variables
    bool saved_unpacked_once = false;
    bool saved_outlive_node = false;    // saved_outlive_last_node
    std::uint8_t workspace_slot = 0;    // made before this input's gradient (kNoSlot: after all)
    LaunchSize workspace_launch{};      // its size's parts (one piece)
    std::array<bytes_t, 3> before_workspace{};  // temporaries_before_workspace
    std::uint8_t before_workspace_kept = 0;
    std::uint8_t reduced_slot = kNoSlot;  // reduce_last_gradient
    bool reduced_from_workspace = false;
    std::array<LaunchSize, 2> reduction_temporaries{};
    std::uint8_t promoted_slot = kNoSlot;  // promote_last_gradient
    bytes_t promoted_bytes = 0;
  };
  static constexpr std::uint8_t kNoSlot = 0xff;
  bool last_node_recorded_ = false;  // the last node() call pushed a node (split_last_workspace)
  // A contribution that the input buffer must add out of place, after the node has run.
  struct PendingSum {
    TensorId input, incoming;
    bool in_place;  // a parameter's .grad: AccumulateGrad adds in place (no new sum)
  };
  static constexpr std::size_t kNoReplay = static_cast<std::size_t>(-1);

  struct Deferred {
    const char* name = "";
    bytes_t bytes = 0;
  };
  static bool runs_matmul(const char* op);
  void allocate_deferred(const char* op);
  TensorInfo describe(const char* name, bytes_t bytes, Term term, Role role, const char* op, const char* dtype,
                      const char* shape, bool requires_grad) const;
  TensorId add(TensorInfo info);
  void allocate(TensorId t);
  void release(TensorId t);  // its storage goes (the one place a live tensor stops being live)
  void release_if_dead(TensorId t);
  void note_peak();
  // The node's incoming gradient when it is handed to `input` as is (pass_through_node), else kNone.
  TensorId handed_through(TensorId incoming, TensorId input) const;
  // `through`: the node's incoming gradient, handed on as this input's contribution (pass_through_node).
  void grad_contribution(TensorId input, const char* op, bool view, TensorId through);
  bytes_t grad_bytes(TensorId input) const;
  TensorId make_grad(TensorId input, const char* op);

  struct Sizes {
    std::size_t tensors = 1024, nodes = 1024, events = 0;
  };
  static Sizes& last_sizes() {
    thread_local Sizes sizes;
    return sizes;
  }
  bool explain_;
  GradMode grad_;
  Deferred deferred_;  // allocate_at_next_matmul's tensor, until a matmul runs
  bool discard_saves_ = false;
  std::vector<TensorInfo> tensors_;
  // Every parameter, as made: backward() visits these, not every tensor, since a pipeline stage's
  // tensors grow with the microbatches and it runs one backward per microbatch.
  std::vector<TensorId> params_;
  std::vector<char> param_seen_;  // backward()'s scratch (grad_ready), all 0 between calls
  std::vector<Node> nodes_;
  std::vector<Region> regions_;
  std::vector<TensorId> grads_;  // tensor → its gradient buffer (kNone: none)
  std::vector<char> grad_view_;  // tensor → its gradient buffer is a view (cannot be added to in place)
  std::vector<char> subclass_grad_;  // tensor → a DTensor made under dtensor_scope (summed out of place)
  bool dtensor_scope_ = false;
  std::vector<PendingSum> pending_;  // out-of-place sums of the node being run
  std::size_t replay_cursor_ = kNoReplay;
  // torch.utils.checkpoint's early stop (non-reentrant, early_stop=True): the recompute raises as
  // soon as the region's last saved tensor is packed again, so nothing after that node runs.
  // replay_stop_: that node; replay_stopped_: it has run, and what the region's code still makes
  // is never allocated; deferred_outputs_: what was made for the stop node before it recorded
  // (its outputs, allocated only if it saves one of them: inputs are packed before the kernel).
  std::size_t replay_stop_ = kNoReplay;
  bool replay_stopped_ = false;
  std::vector<TensorId> deferred_outputs_;
  void stop_replay(std::initializer_list<TensorId> outputs, std::initializer_list<TensorId> saved);
  void release_saved(Node& n);
  bytes_t live_ = 0;
  // The live tensors, kept as they change so that the figures taken after each pipeline forward
  // (live_by_term, live_tensors) cost the live set, not every tensor made: live_list_ in no order,
  // live_slot_[t] tensor t's place in it.
  std::array<bytes_t, 6> live_by_term_{};
  std::vector<TensorId> live_list_;
  std::vector<std::uint32_t> live_slot_;
  std::vector<PhasePeak> phases_;
  int section_ = 0;
  std::vector<TensorId> log_;             // explain: allocations (id) and frees (~id), in order
  std::vector<std::size_t> peak_event_;   // explain: log position of each phase's peak
  std::vector<TensorBytes> groups_at(std::size_t event) const;
  SimTrace* trace_ = nullptr;
  BackwardHooks hooks_;
};

// The role a tensor of `term` has unless its creator says otherwise.
constexpr Role default_role(Term term) noexcept {
  switch (term) {
    case Term::model_states: return Role::weight_copy;
    case Term::activations: return Role::saved_activation;
    case Term::logits_loss: return Role::logits_loss;
    case Term::kv_cache: return Role::kv_cache;
    case Term::overhead: return Role::workspace;
    case Term::other: return Role::temporary;
  }
  return Role::temporary;
}

}  // namespace membudget::detail

// The allocator's rounding is PyTorch's policy, shared with the instrumented allocator.
#include "common/allocator_policy.hpp"

namespace membudget::detail {

// What the caching allocator counts for a tensor of `b` bytes (0: a tensor with no storage).
inline bytes_t round512(bytes_t b) { return b == 0 ? 0 : kPyTorchAllocator.round_size(b); }

// What memory_allocated() counts for a tensor of `b` bytes given a segment of its own
// (AllocatorPolicy::own_segment_block): an 81 MiB fp32 Gemma 2 MLP weight is an 82 MiB block.
inline bytes_t own_segment_block(bytes_t b) { return b == 0 ? 0 : kPyTorchAllocator.own_segment_block(b); }

// The op of the simulation's estimate of the allocator's slack: whole segments that parameters and
// optimizer state hold beyond their bytes, added to memory_allocated() by hand. The reserved replay
// skips these tensors (its allocator makes the blocks) and, where it stands for the phases, puts
// its own slack in their place (allocated_as_replayed).
inline constexpr const char* kCachingAllocatorOp = "caching allocator";

}  // namespace membudget::detail
