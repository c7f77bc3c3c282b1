// What DDP and FSDP2 allocate around a training step: data_parallel.hpp. The torch 2.11 functions
// each step follows are in torch/distributed/fsdp/_fully_shard/ (_fsdp_param_group.py,
// _fsdp_collectives.py, _fsdp_param.py, _fsdp_state.py) and torch/csrc/distributed/c10d/reducer.cpp.
#include "data_parallel.hpp"

#include <deque>

namespace membudget::detail {
namespace {
bytes_t times(std::uint64_t a, std::uint64_t b, std::uint64_t c = 1) {
  return checked_product("data-parallel buffer", a, b, c, 1);
}
}  // namespace

void DataParallelSim::add_group(std::vector<std::pair<TensorId, ParamTensor>> params) {
  Group g;
  for (const auto& [id, t] : params) g.shard_elems = checked_add(g.shard_elems, fsdp_padded_shard(t, l_.shard), "FSDP2 group");
  g.params = std::move(params);
  groups_.push_back(std::move(g));
}

void DataParallelSim::shard(bool building) {
  // fully_shard keeps each parameter's padded dim-0 chunk as its own tensor (_init_sharded_param:
  // new_zeros(padded_sharded_size)); the unsharded parameter (built on the meta device: never
  // allocated yet) is an empty storage until the first all-gather.
  // Under CPUOffloadPolicy the shards are pinned host tensors instead.
  // Built on the meta device, the shards get their storage from to_empty, module by module: each
  // the rank's own rows, unpadded. Where those are fewer than the padded chunk (the last ranks of
  // an uneven split), FSDPModule._apply then pads them (FSDPParam.reset_sharded_param: a padded
  // chunk, the rows copied in, the unpadded storage freed), parameter by parameter after the
  // unit's to_empty. The freed storages stay cached: OLMoE's last rank of three holds a segment
  // per layer the size of its unpadded experts' gate_up (tests/data/fsdp_uneven/).
  // to_empty goes through the modules in registration order: the embedding, the decoder layers,
  // the final norm and lm_head, so the root group's (group 0's) embedding, where it leads the group,
  // comes first and its other parameters last (Llama 3.2 1B's last pipeline stage under FSDP2 4:
  // its lm_head shard, a tied model's own copy of the embedding's shape, is made after the layers',
  // tests/data/inprocess_alone/*_build).
  using Pending = std::vector<std::pair<TensorId, bytes_t>>;  // the unpadded storage (kNone: none) and the padded bytes
  auto make = [&](const ParamTensor& t, Pending& to_pad) {
    const bytes_t shard = times(fsdp_padded_shard(t, l_.shard), stored_);
    const bytes_t own = times(fsdp_local_shard(t, l_.shard, l_.shard_rank), stored_);
    if (l_.offload) {
      host_params_ = checked_add(host_params_, shard, "FSDP2 host shards");
    } else if (building && own != shard) {
      to_pad.push_back({own ? sim_.alloc_raw("to_empty: the rank's own rows, until FSDP2 pads them", own, Term::other,
                                             Role::workspace, "to_empty")
                            : kNone,
                        shard});
    } else {
      sim_.alloc_raw("FSDP2 sharded parameters", shard, Term::model_states, Role::parameter, "fully_shard");
    }
  };
  auto pad = [&](const Pending& to_pad) {  // the unit's _apply after its to_empty
    for (const auto& [unpadded, shard] : to_pad) {
      sim_.alloc_raw("FSDP2 sharded parameters", shard, Term::model_states, Role::parameter, "fully_shard");
      if (unpadded != kNone) sim_.drop(unpadded);
    }
  };
  if (groups_.empty()) return;
  const auto& root = groups_.front().params;
  const bool embedding_first = !root.empty() && root.front().second.module == Module::embedding;
  Pending root_pad;  // padded when the root's _apply ends, after the layers'
  if (embedding_first) make(root.front().second, root_pad);
  for (std::size_t g = 1; g < groups_.size(); ++g) {
    Pending layer_pad;
    for (const auto& [id, t] : groups_[g].params) make(t, layer_pad);
    pad(layer_pad);
  }
  for (std::size_t i = embedding_first ? 1 : 0; i < root.size(); ++i) make(root[i].second, root_pad);
  pad(root_pad);
}

void DataParallelSim::allocate_buckets(const std::vector<ParamTensor>& params, bool steady) {
  // Reducer::initialize_buckets: one contiguous gradient buffer per bucket, kept for the run. In
  // the first iteration the whole model is one bucket (one block of its own segment); the buckets
  // rebuilt before the second forward are carved from that freed block.
  // Each bucket is an allocation of its own, as the caching allocator (and the reserved replay)
  // sees them.
  for (std::uint64_t n : ddp_buckets(params, stored_, steady)) {
    const bytes_t b = times(n, stored_);
    sim_.alloc_raw("DDP gradient buckets", steady ? round512(b) : own_segment_block(b), Term::other, Role::gradient,
                   "DistributedDataParallel");
  }
}

void DataParallelSim::sync_module_states(const std::vector<ParamTensor>& params) {
  // DistributedDataParallel.__init__ -> _sync_module_states -> broadcast_coalesced (c10d's
  // comm.cpp): the parameters in module.parameters() order (the caller's), in buckets closed once they reach 250 MiB
  // (compute_bucket_assignment_by_size); each bucket flattened into one buffer
  // (flatten_dense_tensors: a lone tensor's is a view) and broadcast, at most two in flight, the
  // oldest finished and freed before a third is made. The dense Llama 3.1 8B ZeRO-1 rank's snapshot
  // (tests/data/inprocess_alone/) begins with their segments cached: 384, 386, 448 and 2,006 MiB.
  constexpr bytes_t kBucket = 250 * MiB;
  std::deque<TensorId> in_flight;
  bytes_t bytes = 0;
  std::size_t tensors = 0;
  auto broadcast = [&] {
    if (tensors == 0) return;
    if (in_flight.size() >= 2) {
      sim_.drop(in_flight.front());
      in_flight.pop_front();
    }
    in_flight.push_back(tensors > 1 ? sim_.alloc_raw("DDP construction: a parameter broadcast bucket (_sync_module_states)",
                                                     bytes, Term::other, Role::communication, "broadcast_coalesced")
                                    : kNone);
    bytes = 0;
    tensors = 0;
  };
  for (const ParamTensor& t : params) {
    bytes = checked_add(bytes, times(t.elements(), stored_), "DDP broadcast bucket");
    ++tensors;
    if (bytes >= kBucket) broadcast();
  }
  broadcast();
  for (TensorId t : in_flight) sim_.drop(t);
}

bool DataParallelSim::unsharded(std::size_t g) const {
  return !groups_[g].params.empty() && sim_.storage_alive(groups_[g].params.front().first);
}

TensorId DataParallelSim::all_gather(std::size_t g) {
  // foreach_all_gather: with a MixedPrecisionPolicy that casts, the shards are first copied into
  // one flat param_dtype input (_get_param_all_gather_inputs); otherwise the output's own slice is
  // the input. The output holds every rank's shards (S · Σ padded shard elements).
  const Group& gr = groups_[g];
  // CPU offload: FSDPParam.all_gather_inputs first copies each host shard to the GPU
  // (sharded_param_data.to(device), in the stored dtype); the copies go once the output is filled.
  std::vector<TensorId> copies;
  if (l_.offload)
    for (const auto& [id, t] : gr.params)
      copies.push_back(sim_.make("FSDP2 offload: shards copied to the GPU for the all-gather",
                                 times(fsdp_padded_shard(t, l_.shard), stored_), Term::other, Role::communication,
                                 "FSDPParam.all_gather_inputs", "", "", false));
  const TensorId in = stored_ != compute_
                          ? sim_.make("FSDP2 all-gather input (shards cast to param_dtype)", times(gr.shard_elems, compute_),
                                      Term::other, Role::communication, "foreach_all_gather", "", "", false)
                          : kNone;
  const TensorId out = sim_.make("FSDP2 all-gather output", times(l_.shard, gr.shard_elems, compute_), Term::other,
                                 Role::communication, "foreach_all_gather", "", "", false);
  // all on the all-gather copy-in stream (foreach_all_gather allocates them under it)
  for (TensorId c : copies) sim_.set_stream(c, AllocStream::all_gather);
  if (in != kNone) sim_.set_stream(in, AllocStream::all_gather);
  sim_.set_stream(out, AllocStream::all_gather);
  for (TensorId c : copies) sim_.drop(c);
  sim_.drop(in);
  return out;
}

void DataParallelSim::copy_out(std::size_t g) {
  // foreach_all_gather_copy_out: each unsharded parameter's padded storage is resized back, then
  // filled from the flat output
  for (const auto& [id, t] : groups_[g].params) sim_.restore_storage(id);
}

void DataParallelSim::pre_forward(std::size_t g) {
  // FSDPParamGroup.unshard: nothing when the group is still unsharded (a pipeline stage's
  // microbatch backward left it so) or holds no parameters (a middle stage's root)
  if (!fsdp() || groups_[g].params.empty() || unsharded(g)) return;
  const TensorId out = all_gather(g);
  copy_out(g);
  // FSDPParamGroup.wait_for_unshard: the previous group's output is held (all_gather_state) until
  // this copy-out, so that its stream's work is done before its memory is reused
  sim_.drop(held_all_gather_);
  held_all_gather_ = out;
}

void DataParallelSim::post_forward(std::size_t g) {
  if (!fsdp() || !l_.reshard) return;
  for (const auto& [id, t] : groups_[g].params) sim_.release_storage(id);
}

void DataParallelSim::root_post_forward() {
  if (!fsdp()) return;
  post_forward(0);  // reshard_after_forward is given to the root too (docs/distributed.md)
  sim_.drop(held_all_gather_);  // FSDPState._post_forward of the root drops the last all_gather_state
  held_all_gather_ = kNone;
}

void DataParallelSim::pre_backward(std::size_t g, std::size_t next) {
  Group& gr = groups_[g];
  if (!gr.params.empty() && !unsharded(g)) {
    if (gr.prefetched != kNone) {  // the output of the previous group's prefetch
      copy_out(g);
      sim_.drop(gr.prefetched);
      gr.prefetched = kNone;
    } else {
      const TensorId out = all_gather(g);
      copy_out(g);
      sim_.drop(out);  // in backward the output is freed right after its copy-out
    }
  }
  // _backward_prefetch: the group that runs backward next is all-gathered now
  if (next != g && !groups_[next].params.empty() && !unsharded(next) && groups_[next].prefetched == kNone)
    groups_[next].prefetched = all_gather(next);
}

void DataParallelSim::accumulate(std::size_t g) {
  // FSDPParamGroup.post_backward with reduce_grads off: no reshard, no reduce-scatter;
  // to_accumulated_grad_if_needed moves a gradient whose dtype is not reduce_dtype into an
  // unsharded accumulator of that dtype (amp-bf16's fp32), and the next microbatch's gradient is
  // added into it and freed (accumulate_unsharded_grad_if_needed). Without the cast the gradients
  // accumulate in .grad, as autograd accumulates them.
  Group& gr = groups_[g];
  if (reshard_between_microbatches_ && unsharded(g))  // reshard_after_backward, not turned off
    for (const auto& [id, t] : gr.params) sim_.release_storage(id);
  if (reduce_ == compute_) return;
  gr.accumulated.resize(gr.params.size(), kNone);
  for (std::size_t i = 0; i < gr.params.size(); ++i) {
    const auto& [id, t] = gr.params[i];
    if (sim_.grad_of(id) == kNone) continue;
    if (gr.accumulated[i] == kNone)
      gr.accumulated[i] = sim_.make("FSDP2 unsharded accumulated gradients (reduce_dtype, microbatches)",
                                    times(t.elements(), reduce_), Term::model_states, Role::gradient,
                                    "to_accumulated_grad_if_needed", "", "", false);
    sim_.drop_grad(id);
  }
}

void DataParallelSim::reduce_grads() {
  if (!fsdp()) return;
  // all_states in order (the stage module, then its layers): each group's post-backward
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (!groups_[g].params.empty()) post_backward(g);
  sim_.drop(held_reduce_scatter_);  // _root_post_backward_final_callback
  held_reduce_scatter_ = kNone;
}

void DataParallelSim::post_backward(std::size_t g) {
  // FSDPParamGroup.post_backward: reshard (reshard_after_backward), wait on and drop the previous
  // reduce-scatter's input, then foreach_reduce: the unsharded gradients copied (cast to
  // reduce_dtype) into one flat input and freed, the output allocated; the sharded gradients are
  // views of that output until zero_grad.
  Group& gr = groups_[g];
  if (gr.params.empty()) return;
  if (microbatches_) return accumulate(g);
  if (unsharded(g))
    for (const auto& [id, t] : gr.params) sim_.release_storage(id);
  // accumulate_unsharded_grad_if_needed: a gradient with an fp32 accumulator is added into it and
  // freed before the reduction reads the accumulator
  for (std::size_t i = 0; i < gr.accumulated.size(); ++i)
    if (gr.accumulated[i] != kNone && sim_.grad_of(gr.params[i].first) != kNone) sim_.drop_grad(gr.params[i].first);
  sim_.drop(held_reduce_scatter_);
  held_reduce_scatter_ = sim_.make("FSDP2 reduce-scatter input", times(l_.shard, gr.shard_elems, reduce_), Term::other,
                                   Role::communication, "foreach_reduce", "", "", false);
  // The root's post-backward runs in the autograd engine's final callback, when the embedding's
  // AccumulateGrad (the last node of the backward) has just run: its gradient is still referenced
  // until the callback returns, so it outlives the reduce-scatter output's allocation (the snapshot
  // llama-3.1-8b_fsdp2-tp4_w8r0_amp-bf16_none_b1s2048_L2: events 1054-1057). The others go first.
  const TensorId last_grad = g == 0 && !gr.params.empty() ? gr.params.front().first : kNone;
  for (const auto& [id, t] : gr.params)
    if (id != last_grad) sim_.drop_grad(id);
  // The microbatches' accumulators (what was reduced): a layer's go as foreach_reduce drops its
  // list of them, last first, before the output; the root's outlive the output until
  // post_backward returns (the pipeline stages' snapshots: Llama 3.1 8B's first stage under 1F1B ×
  // TP 2 × FSDP2, tests/data/inprocess_alone/, events 6651-6665, a layer's seven accumulators then
  // its output, and events 6616-6623, the root's 1,002 MiB output then the embedding's 2,004 MiB
  // fp32 accumulator; Llama 3.2 1B's last stage under 1F1B × FSDP2 4,
  // tests/data/handthrough_snapshots/, events 12742-12751, lm_head's).
  auto drop_accumulators = [&] {
    for (std::size_t i = gr.accumulated.size(); i-- > 0;) sim_.drop(std::exchange(gr.accumulated[i], kNone));
  };
  const bool root = g == 0;
  if (!root) drop_accumulators();
  const TensorId out = sim_.make("FSDP2 sharded gradients (reduce-scatter output)", times(gr.shard_elems, reduce_),
                                 Term::model_states, Role::gradient, "foreach_reduce", "", "", false);
  sim_.set_stream(out, AllocStream::reduce_scatter);  // the input is the compute stream's
  if (root) drop_accumulators();
  if (last_grad != kNone) sim_.drop_grad(last_grad);
  if (gr.sharded_grad != kNone) {
    // a later micro-batch's reduction (gradient accumulation, --fsdp-grad-sync every): foreach_reduce
    // adds its output into the sharded gradients in place, and nothing keeps it
    sim_.drop(out);
    return;
  }
  if (!l_.offload) {
    gr.sharded_grad = out;
    rs_outputs_.push_back(out);
    return;
  }
  // CPU offload: the output is copied to a pinned host gradient and freed within post_backward
  host_grads_ = checked_add(host_grads_, times(gr.shard_elems, reduce_), "FSDP2 host gradients");
  sim_.drop(out);
}

std::size_t DataParallelSim::group_of_section(int section) const {
  // sections (AutogradSim::set_section): 0 before the layers, 1 + i layer i, L + 1 after them (all
  // the root's), L + 2 outside the root module (no group)
  if (section >= 1 && static_cast<std::uint64_t>(section) <= layers_) return static_cast<std::size_t>(section);
  return static_cast<std::uint64_t>(section) == layers_ + 2 ? kNoGroup : 0;
}

void DataParallelSim::on_section(AutogradSim&, void* ctx, int from, int to) {
  auto& self = *static_cast<DataParallelSim*>(ctx);
  const std::size_t L = static_cast<std::size_t>(self.layers_);
  const std::size_t gf = from < 0 ? kNoGroup : self.group_of_section(from);
  const std::size_t gt = to < 0 ? kNoGroup : self.group_of_section(to);
  // The root's pre-backward hook runs when the backward reaches the root module's output, and
  // prefetches the last layer: first when the loss is computed inside the root (a model's forward
  // returns it); after a pipeline loss outside the stage module; and after the last layer's own
  // hook when the stage's output is that layer's (a stage that sends its hidden states on: the
  // layer's all-gather and the next one's prefetch come first).
  if (from < 0 && gt != kNoGroup && gt != 0) {
    self.pre_backward(gt, gt - 1);
    self.pre_backward(0, gt - 1);
  } else if (gf == kNoGroup && gt == 0) {  // (the backward's start, or the loss outside the module left)
    self.pre_backward(0, L);
  }
  if (gf != kNoGroup && gf != 0 && gf != gt) self.post_backward(gf);
  if (gt != kNoGroup && gt != 0 && gt != gf) self.pre_backward(gt, gt - 1);
  if (to < 0) {
    // _root_post_backward_final_callback: the root's post-backward (its inputs need no gradient,
    // so it runs only here), then the last reduce-scatter input is dropped
    self.post_backward(0);
    self.sim_.drop(self.held_reduce_scatter_);
    self.held_reduce_scatter_ = kNone;
  }
}

void DataParallelSim::on_grad_ready(AutogradSim& sim, void* ctx, TensorId param) {
  // gradient_as_bucket_view: mark_variable_ready copies the gradient into its bucket and points
  // .grad at the bucket's view; the gradient AccumulateGrad made is freed. Under no_sync (a
  // pipeline's microbatches before the last) the reducer does nothing: the gradients accumulate.
  const auto& self = *static_cast<const DataParallelSim*>(ctx);
  if (self.microbatches_ && !self.last_microbatch_) return;
  sim.drop_grad(param);
}

void DataParallelSim::install_backward_hooks(std::uint64_t layers) {
  layers_ = layers;
  AutogradSim::BackwardHooks h;
  h.ctx = this;
  if (fsdp()) h.section = on_section;
  if (ddp() && l_.bucket_view) h.grad_ready = on_grad_ready;
  sim_.set_backward_hooks(h);
}

}  // namespace membudget::detail
