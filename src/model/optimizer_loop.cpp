// src/model/optimizer_loop.cpp: see optimizer_loop.hpp.
#include "optimizer_loop.hpp"

#include <algorithm>

#include "autograd_sim.hpp"
#include "cuda_reduce.hpp"
#include "membudget/bytes.hpp"

namespace membudget::detail {

namespace {

// Allocations numbered as they are made.
class LoopRecorder {
 public:
  std::uint32_t alloc(bytes_t bytes) {
    const auto id = next_++;
    ops_.push_back({id, bytes});
    return id;
  }
  void free(std::uint32_t id) { ops_.push_back({id, 0}); }
  // A reduction's staging buffer and semaphores: made inside the kernel launch, after its output,
  // and freed when it returns.
  void staging(const ReduceStaging& s) {
    if (s.buffer == 0) return;
    const std::uint32_t buffer = alloc(s.buffer), semaphores = alloc(s.semaphores);
    free(semaphores);
    free(buffer);
  }
  std::vector<LoopOp> take() { return std::move(ops_); }

 private:
  std::vector<LoopOp> ops_;
  std::uint32_t next_ = 0;
};

// A Python name the loop rebinds every parameter: the new tensor is made while the old one is still
// bound, and the old one dies when the assignment completes.
class Rebound {
 public:
  void bind(LoopRecorder& r, std::uint32_t id) {
    if (bound_) r.free(held_);
    held_ = id;
    bound_ = true;
  }
  void release(LoopRecorder& r) {
    if (bound_) r.free(held_);
    bound_ = false;
  }

 private:
  std::uint32_t held_ = 0;
  bool bound_ = false;
};

}  // namespace

std::vector<LoopOp> adafactor_for_loop(const std::vector<ParamTensor>& tensors, bytes_t elem) {
  LoopRecorder r;
  Rebound row_mean, col_mean, grad_squared, update;
  // tensor.norm(2).item() (_adafactor.py:381, 415): a 0-d result, the reduction's staging
  auto full_norm = [&](std::uint64_t n) {
    const std::uint32_t out = r.alloc(elem);
    r.staging(cuda_reduce_staging(1, n, true));
    r.free(out);
  };
  for (const ParamTensor& t : tensors) {
    const std::uint64_t n = t.elements();
    const bytes_t bytes = checked_mul(n, elem, "Adafactor temporaries");
    full_norm(n);  // alpha's param.norm(2)
    if (t.projection()) {
      // factored over the last two dimensions: nn.Embedding's weight is (V, h), nn.Linear's
      // (out, in), packed experts (E, out, in)
      const std::uint64_t rows = t.module == Module::embedding ? t.in : t.out;
      const std::uint64_t cols = t.module == Module::embedding ? t.out : t.in;
      const std::uint64_t E = t.count;
      const std::uint64_t row_means = checked_mul(E, rows, "Adafactor row mean");
      const std::uint64_t col_means = checked_mul(E, cols, "Adafactor column mean");
      // row_mean = torch.norm(grad, dim=-1, keepdim=True)... (_adafactor.py:393)
      const std::uint32_t row = r.alloc(checked_mul(row_means, elem, "Adafactor row mean"));
      r.staging(cuda_reduce_staging(row_means, cols, true));
      row_mean.bind(r, row);
      // col_mean = torch.norm(grad, dim=-2, keepdim=True)... (_adafactor.py:398): a strided
      // reduction, the one with a large staging buffer (32 MiB for a 2048 × 2048 matrix)
      const std::uint32_t col = r.alloc(checked_mul(col_means, elem, "Adafactor column mean"));
      r.staging(cuda_reduce_staging(col_means, rows, false, cols));
      col_mean.bind(r, col);
      // var_estimate = row_var @ col_var (_adafactor.py:402), divided by row_var.mean(dim=-2)
      const std::uint32_t var = r.alloc(bytes);
      const std::uint32_t mean = r.alloc(checked_mul(E, elem, "Adafactor row variance mean"));
      r.staging(cuda_reduce_staging(E, rows, true));
      r.free(mean);
      update.bind(r, var);  // update = var_estimate.clamp_(...) (_adafactor.py:413): in place
    } else {
      grad_squared.bind(r, r.alloc(bytes));  // grad * grad
      update.bind(r, r.alloc(bytes));        // var_estimate = variance.clone()
    }
    full_norm(n);  // update.norm(2)
  }
  for (Rebound* name : {&row_mean, &col_mean, &grad_squared, &update}) name->release(r);
  return r.take();
}

std::vector<LoopOp> adamw_for_loop(const std::vector<ParamTensor>& tensors, bytes_t elem) {
  LoopRecorder r;
  Rebound denom;
  for (const ParamTensor& t : tensors) {
    const bytes_t bytes = checked_mul(t.elements(), elem, "AdamW temporaries");
    const std::uint32_t sqrt = r.alloc(bytes);
    const std::uint32_t quotient = r.alloc(bytes);
    r.free(sqrt);
    denom.bind(r, quotient);
  }
  denom.release(r);
  return r.take();
}

bytes_t loop_peak(const std::vector<LoopOp>& ops) {
  std::vector<bytes_t> held;
  bytes_t live = 0, peak = 0;
  for (const LoopOp& op : ops) {
    if (op.id >= held.size()) held.resize(op.id + 1u, 0);
    if (op.bytes) {
      held[op.id] = own_segment_block(op.bytes);
      live += held[op.id];
      peak = std::max(peak, live);
    } else {
      live -= held[op.id];
      held[op.id] = 0;
    }
  }
  return peak;
}

}  // namespace membudget::detail
