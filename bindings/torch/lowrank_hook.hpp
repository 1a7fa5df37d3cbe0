// bindings/torch/lowrank_hook.hpp: LowRankHook, what dilocox.lowrank_hook runs for a
// DDP gradient bucket: PowerSGD's algorithm (P = M Q, reduce P, orthonormalize,
// Q = M^T P, reduce Q, M ~ P Q^T, warm-started Q, error feedback) on the library's
// projector and compressor (LowRankCompressor at a fixed rank), with int8 or int4
// factors on the wire and the tensors that do not compress (PowerSGD's
// min_compression_rate) sent int8. One compressor over the model's parameters; a
// bucket's sync carries its parameters' gradients, so the state (residual, Q) stays
// with each parameter whatever bucket DDP puts it in. Not here: the hook's Python
// side and its plain-allreduce warm-up (dilocox/ddp.py).
#pragma once

#include <torch/torch.h>

#include <dilocox/compress/lowrank.hpp>

#include <string>
#include <vector>

#include "process_group_comm.hpp"
#include "tensor_shape.hpp"

namespace dilocox::torch_binding {

struct HookOptions {
  int rank = 1;                       // matrix_approximation_rank
  int bits = 8;                       // the factors' bits (8 or 4)
  double min_compression_rate = 2.0;  // low rank only where it sends this many times fewer values
  bool error_feedback = true;         // use_error_feedback
  std::uint64_t seed = 0;             // the projectors' start (same on every rank)
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

class LowRankHook {
 public:
  // names/shapes: the model's parameters that take gradients, in the model's order; a
  // bucket's gradients are named by their indices here (DDP reorders its buckets after
  // the first step and again after a restart, so state is kept per parameter).
  LowRankHook(c10::intrusive_ptr<c10d::ProcessGroup> group, HookOptions o, const std::vector<std::string>& names,
              const std::vector<std::vector<std::int64_t>>& shapes)
      : comm_(std::move(group), o.timeout), any_(comm_), options_(o), compressor_(config()) {
    detail::require(o.rank >= 1, "lowrank_hook", "matrix_approximation_rank must be >= 1");
    detail::require(o.bits == 8 || o.bits == 4, "lowrank_hook", "bits must be 8 or 4, got " + std::to_string(o.bits));
    detail::require(o.min_compression_rate > 0, "lowrank_hook", "min_compression_rate must be > 0");
    detail::require(names.size() == shapes.size() && !names.empty(), "lowrank_hook", "no parameters");
    for (std::size_t i = 0; i < names.size(); ++i) {
      detail::require(shapes[i].size() <= max_ndim, "lowrank_hook",
                      "parameter '" + names[i] + "' has more than " + std::to_string(max_ndim) + " dimensions");
      specs_.push_back({names[i], shape_of(shapes[i])});
    }
    compressor_.setup(specs_);
  }

  // Replaces the gradients of parameters `index` (ascending) by their mean over the
  // ranks (compressed), in place; returns the bytes this rank put on the wire.
  std::uint64_t reduce(const std::vector<std::int64_t>& index, const std::vector<at::Tensor>& grads) {
    detail::require(index.size() == grads.size() && !grads.empty(), "lowrank_hook", "a bucket without gradients");
    std::vector<std::size_t> tensors;
    std::vector<std::span<float>> xs, means;
    for (std::size_t j = 0; j < grads.size(); ++j) {
      const at::Tensor& g = grads[j];
      detail::require(index[j] >= 0 && static_cast<std::size_t>(index[j]) < specs_.size() &&
                          (j == 0 || index[j] > index[j - 1]),
                      "lowrank_hook", "parameter indices must be ascending and within the model's");
      const TensorSpec& spec = specs_[static_cast<std::size_t>(index[j])];
      detail::require(g.scalar_type() == at::kFloat && g.device().is_cpu() && g.is_contiguous(), "lowrank_hook",
                      "the gradient of '" + spec.name + "' is " + std::string(c10::toString(g.scalar_type())) +
                          " on " + g.device().str() + ": contiguous float32 CPU gradients only");
      detail::require(static_cast<std::size_t>(g.numel()) == spec.shape.numel(), "lowrank_hook",
                      "the gradient of '" + spec.name + "' has " + std::to_string(g.numel()) + " elements, the parameter " +
                          std::to_string(spec.shape.numel()));
      tensors.push_back(static_cast<std::size_t>(index[j]));
      xs.emplace_back(g.data_ptr<float>(), static_cast<std::size_t>(g.numel()));  // reduced in place
      means.push_back(xs.back());
    }
    std::vector<std::uint8_t> everyone(static_cast<std::size_t>(comm_.size()), 1);
    const SyncReport r = compressor_.sync(any_, {.tensors = tensors, .contributes = everyone, .sync = syncs_++}, xs, means);
    bytes_ += r.cost.bytes;
    return r.cost.bytes;
  }

  std::uint64_t wire_bytes() const { return bytes_; }
  std::string describe() const { return compressor_.describe(); }

  // Error feedback and warm-started Q of every parameter, for a hook built with the same
  // options over the same parameters (before its first step).
  std::vector<std::byte> save_state() const {
    StateWriter w;
    w.value(state_tag);
    w.value<std::uint64_t>(specs_.size());
    for (const auto& s : specs_) w.value(spec_key(s));
    w.value(syncs_);
    w.value(bytes_);
    compressor_.save_state(w);
    return w.bytes();
  }

  void load_state(std::span<const std::byte> bytes) {
    StateReader r(bytes);
    detail::require(r.value<std::uint64_t>() == state_tag, "lowrank_hook", "not a lowrank_hook state");
    detail::require(r.value<std::uint64_t>() == specs_.size(), "lowrank_hook",
                    "the state is of a model with another number of parameters");
    for (const auto& s : specs_)
      detail::require(r.value<std::uint64_t>() == spec_key(s), "lowrank_hook",
                      "the state's parameter in the place of '" + s.name + "' " + s.shape.str() +
                          " has another name or shape");
    LowRankCompressor loaded(config());
    loaded.setup(specs_);
    const auto syncs = r.value<std::uint64_t>(), sent = r.value<std::uint64_t>();
    loaded.load_state(r);
    detail::require(r.done(), "lowrank_hook", "trailing bytes in the state");
    compressor_ = std::move(loaded);
    syncs_ = syncs, bytes_ = sent;
  }

 private:
  static constexpr std::uint64_t state_tag = 0x336b6f6f684b4e52ull;  // "RNKhook3"

  static std::uint64_t spec_key(const TensorSpec& s) {
    const std::string key = s.name + "|" + s.shape.str();
    return checksum64(std::as_bytes(std::span(key.data(), key.size())));
  }

  LowRankCompressorConfig config() const {
    LowRankCompressorConfig c;
    c.rank = options_.rank;
    c.factor_quant.bits = options_.bits;
    c.factor_blocks_by_column = true;  // columns of P and Q differ in scale as the singular values do
    c.min_ratio = options_.min_compression_rate;
    c.adaptive = false;
    c.error_feedback = options_.error_feedback;
    c.seed = options_.seed;
    return c;
  }

  ProcessGroupCommunicator comm_;
  AnyCommunicator any_;
  HookOptions options_;
  std::vector<TensorSpec> specs_;
  LowRankCompressor compressor_;
  std::uint64_t syncs_ = 0;
  std::uint64_t bytes_ = 0;
};

}  // namespace dilocox::torch_binding
