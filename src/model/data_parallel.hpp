// src/model/data_parallel.hpp: what DDP and FSDP2 allocate around a training step (internal).
//
// The training walk (inventory_torch.cpp) runs the model's ops; a DataParallelSim beside it adds
// what the data-parallel wrapper does, at the moments the wrapper's hooks run: FSDP2's all-gathers
// before each group's forward and backward, its reshards, its reduce-scatters after each group's
// backward; DDP's gradient buckets. The sizes come from parallel.hpp; docs/distributed.md says
// which torch 2.11 code each step models.
#pragma once

#include <utility>
#include <vector>

#include "autograd_sim.hpp"
#include "parallel.hpp"

namespace membudget::detail {

class DataParallelSim {
 public:
  // `compute`: bytes of the unsharded parameters and their gradients (FSDP2's param_dtype);
  // `stored`: bytes of the sharded parameters (their original dtype); `reduce`: of the sharded
  // gradients (reduce_dtype, else the parameters' dtype).
  DataParallelSim(AutogradSim& sim, const RankLayout& layout, bytes_t compute, bytes_t stored, bytes_t reduce)
      : sim_(sim), l_(layout), compute_(compute), stored_(stored), reduce_(reduce) {}

  bool fsdp() const { return l_.strategy == DataStrategy::fsdp; }
  bool ddp() const { return l_.strategy == DataStrategy::ddp || l_.strategy == DataStrategy::zero1; }
  const RankLayout& layout() const { return l_; }

  // FSDP2: the unsharded parameters of one group (index 0 is the root: embedding, final norm,
  // lm_head; 1 + i is decoder layer i) with their descriptions. After the last group: shard().
  void add_group(std::vector<std::pair<TensorId, ParamTensor>> params);
  // The model as fully_shard leaves it: the sharded parameters (ps rows each, padded) allocated,
  // the unsharded storage freed. `building`: as to_empty and FSDP2's re-padding make them (step 0);
  // else found built (a steady step's prologue).
  void shard(bool building);

  // DDP: the gradient buckets of the wrapped module's parameters (the model's, or a pipeline
  // stage's), allocated when DistributedDataParallel is built (step 0's one bucket of every
  // parameter) or rebuilt before the second forward (a steady step's).
  void allocate_buckets(const std::vector<ParamTensor>& params, bool steady);
  // DDP's construction broadcasting the wrapped module's parameters (_sync_module_states): each
  // 250 MiB bucket flattened into a buffer of its own, at most two in flight; all freed by the end,
  // their segments left cached.
  void sync_module_states(const std::vector<ParamTensor>& params);

  // Forward hooks (FSDP2): before and after group g's forward; the root's post-forward follows the loss.
  void pre_forward(std::size_t g);
  void post_forward(std::size_t g);
  void root_post_forward();
  // Installs the backward hooks on the simulator (FSDP2 pre/post-backward, DDP's bucket view).
  void install_backward_hooks(std::uint64_t layers);
  // FSDP2 within a pipeline stage (torch.distributed.pipelining's backward_maybe_with_nosync):
  // while on, each microbatch's backward runs with set_requires_gradient_sync(False) and
  // set_reshard_after_backward(False): the parameters stay unsharded and their unsharded
  // gradients accumulate (in an fp32 copy when reduce_dtype is not param_dtype). reduce_grads()
  // is perform_reduce_grad after the last: every group's post-backward with the reduction on.
  // DDP within a stage runs every microbatch's backward but the last under no_sync(): the reducer
  // (and gradient_as_bucket_view's hook) acts only in the last (`last_microbatch`).
  // `reshard_after_backward`: gradient accumulation outside a pipeline (--fsdp-grad-sync last,
  // accelerate's set_requires_gradient_sync(False) alone): the parameters are resharded after each
  // backward as usual, the unsharded gradients kept.
  void set_microbatch_backwards(bool on, bool reshard_after_backward = false) {
    microbatches_ = on;
    reshard_between_microbatches_ = reshard_after_backward;
  }
  void set_last_microbatch(bool last) { last_microbatch_ = last; }
  void reduce_grads();
  // What the step keeps after backward as the parameters' gradients: FSDP2's reduce-scatter outputs
  // (freed by zero_grad with the rest; none on the GPU under CPU offload).
  const std::vector<TensorId>& sharded_grads() const { return rs_outputs_; }
  // CPU offload: the host memory the sharded parameters and their gradients take (pinned).
  bytes_t host_parameters() const { return host_params_; }
  bytes_t host_gradients() const { return host_grads_; }

 private:
  struct Group {
    std::vector<std::pair<TensorId, ParamTensor>> params;
    std::uint64_t shard_elems = 0;  // Σ padded shard elements: the all-gather input per rank
    TensorId prefetched = kNone;    // all-gather output issued by the backward prefetch
    std::vector<TensorId> accumulated;  // per parameter: its unsharded_accumulated_grad (microbatch backwards)
    TensorId sharded_grad = kNone;      // the reduce-scatter output its sharded gradients are views of
  };
  static void on_section(AutogradSim& sim, void* ctx, int from, int to);
  static void on_grad_ready(AutogradSim& sim, void* ctx, TensorId param);
  bool unsharded(std::size_t g) const;
  TensorId all_gather(std::size_t g);  // returns the output; allocates and frees the input
  void copy_out(std::size_t g);
  void pre_backward(std::size_t g, std::size_t next);
  void post_backward(std::size_t g);
  void accumulate(std::size_t g);  // post_backward without the reduction (microbatch backwards)
  static constexpr std::size_t kNoGroup = static_cast<std::size_t>(-1);
  std::size_t group_of_section(int section) const;  // kNoGroup: outside the root module

  AutogradSim& sim_;
  RankLayout l_;
  bytes_t compute_, stored_, reduce_;
  std::vector<Group> groups_;
  std::uint64_t layers_ = 0;
  bool microbatches_ = false;
  bool reshard_between_microbatches_ = false;
  bool last_microbatch_ = false;
  TensorId held_all_gather_ = kNone;      // forward: the last all-gather output, until the next copy-out
  TensorId held_reduce_scatter_ = kNone;  // the last reduce-scatter input, until the next group's
  std::vector<TensorId> rs_outputs_;
  bytes_t host_params_ = 0, host_grads_ = 0;
};

}  // namespace membudget::detail
