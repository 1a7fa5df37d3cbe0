// bindings/torch/torch_outer_loop.hpp: TorchOuterLoop, the library's OuterLoop around
// torch parameters over a torch.distributed process group. fp32 CPU parameters are
// used in place (the loop keeps a view of their memory, which the inner optimizer
// updates); bf16 ones go through an fp32 host copy, filled before a step that syncs
// and written back to the tensors a sync rewrote (the outer state stays fp32). Bad
// input on one rank is an Error on every rank: the checks' verdicts are exchanged
// before the loop's first collective. Not here: Python (module.cpp), the transport
// (process_group_comm.hpp).
#pragma once

#include <torch/torch.h>

#include <dilocox/compress/registry.hpp>
#include <dilocox/diloco.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "process_group_comm.hpp"
#include "tensor_shape.hpp"

namespace dilocox::torch_binding {

// The loop's settings as the binding takes them: a method of the registry, its knobs,
// the outer-loop choices, and the transport's timeout.
struct LoopOptions {
  std::string method = "dilocox";
  KnobValues knobs{};
  LoopChoices choices{};
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::uint64_t seed = 0;
};

class TorchOuterLoop {
 public:
  TorchOuterLoop(std::vector<std::string> names, std::vector<at::Tensor> params,
                 c10::intrusive_ptr<c10d::ProcessGroup> group, const LoopOptions& options)
      : comm_(std::move(group), options.timeout) {
    const std::string problem = check_input(names, params, options);
    agree_on_input(problem);
    std::vector<NamedTensor> tensors;
    for (std::size_t i = 0; i < params.size(); ++i) {
      Param p{.param = params[i]};
      p.data_ptr = p.param.data_ptr();
      if (params[i].scalar_type() != at::kFloat) p.staged = at::empty(params[i].sizes(), at::kFloat);
      const Shape shape = shape_of(params[i].sizes());
      tensors.push_back({names[i], shape, {p.host().data_ptr<float>(), shape.numel()}});
      params_.push_back(std::move(p));
    }
    stage_in();
    const Method& m = method(options.method);
    AnyCompressor compressor = make_compressor(m, options.knobs);
    OuterLoopConfig config = outer_loop_config(m, options.choices, compressor);
    config.seed = options.seed;
    config.defer_start_check = true;  // a resuming replica builds the loop, then loads its state
    config.log = [this](const std::string& line) {
      std::lock_guard lock(log_mutex_);
      log_.push_back(line);
    };
    loop_ = std::make_unique<OuterLoop<ProcessGroupCommunicator>>(comm_, std::move(tensors), std::move(compressor),
                                                                  std::move(config));
  }

  // After each inner optimizer step: the syncs applied (empty on most steps).
  std::vector<SyncStats> step() {
    check_unmoved();
    if (loop_->next_step_syncs()) stage_in();
    auto out = loop_->step();
    stage_out();
    return out;
  }

  std::vector<SyncStats> finish() {
    check_unmoved();
    stage_in();
    auto out = loop_->finish();
    stage_out();
    return out;
  }

  std::vector<std::byte> save_state() { return loop_->save_state(); }
  void load_state(std::span<const std::byte> bytes) { loop_->load_state(bytes); }

  // theta of tensor i (identical on every replica), as a new fp32 tensor shaped as the parameter.
  at::Tensor global(std::size_t i) const {
    detail::require(i < params_.size(), "OuterLoop.global_parameters", "no such tensor");
    const auto g = loop_->global(i);
    return at::from_blob(const_cast<float*>(g.data()), params_[i].param.sizes(), at::kFloat).clone();
  }

  std::vector<std::string> take_log() {
    std::lock_guard lock(log_mutex_);
    return std::exchange(log_, {});
  }

  OuterLoop<ProcessGroupCommunicator>& loop() { return *loop_; }
  const ProcessGroupCommunicator& comm() const { return comm_; }

 private:
  struct Param {
    at::Tensor param;
    at::Tensor staged{};  // fp32 host copy of a parameter that is not fp32 (undefined: used in place)
    void* data_ptr = nullptr;  // where the parameter's memory was when the loop was built
    at::Tensor& host() { return staged.defined() ? staged : param; }
  };

  // What is wrong with this rank's input, or "" (checked before any collective).
  static std::string check_input(const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                                 const LoopOptions& options) {
    if (names.size() != params.size()) return "names and parameters differ in number";
    if (params.empty()) return "no parameters";
    for (std::size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      const std::string which = "parameter '" + names[i] + "'";
      if (!p.defined()) return which + " is undefined";
      if (p.scalar_type() != at::kFloat && p.scalar_type() != at::kBFloat16)
        return which + " is " + std::string(c10::toString(p.scalar_type())) + ": float32 or bfloat16 parameters only";
      if (!p.device().is_cpu())
        return which + " is on " + p.device().str() + ": CPU parameters only (the device path does not run yet)";
      if (!p.is_contiguous()) return which + " is not contiguous";
      if (p.dim() > static_cast<std::int64_t>(max_ndim))
        return which + " has " + std::to_string(p.dim()) + " dimensions (at most " + std::to_string(max_ndim) + ")";
      if (p.numel() == 0) return which + " is empty";
    }
    try {
      const Method& m = method(options.method);
      if (m.per_step) return "'" + m.name + "' runs every step (DDP's own allreduce), not an outer loop";
      check_knobs(m, options.knobs);
      check_loop_choices(m, options.choices);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  // Every rank learns every rank's verdict; all throw the first rank's problem.
  void agree_on_input(const std::string& problem) {
    const int k = comm_.size();
    const std::int64_t mine = static_cast<std::int64_t>(problem.size());
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(k));
    comm_.allgather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(sizes)));
    std::size_t longest = 0;
    for (auto s : sizes) longest = std::max(longest, static_cast<std::size_t>(s));
    if (longest == 0) return;
    std::string padded = problem;
    padded.resize(longest, ' ');
    std::string all(longest * static_cast<std::size_t>(k), ' ');
    comm_.allgather(std::as_bytes(std::span(padded.data(), longest)),
                    std::as_writable_bytes(std::span(all.data(), all.size())));
    for (int r = 0; r < k; ++r)
      if (sizes[static_cast<std::size_t>(r)] > 0)
        throw Error("OuterLoop: rank " + std::to_string(r) + ": " +
                    all.substr(static_cast<std::size_t>(r) * longest, static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)])));
  }

  void check_unmoved() const {
    for (std::size_t i = 0; i < params_.size(); ++i)
      detail::require(params_[i].param.data_ptr() == params_[i].data_ptr, "OuterLoop",
                      "parameter " + std::to_string(i) + "'s memory moved (param.data = ... or a device move): the "
                      "loop keeps a view of it; update parameters in place");
  }

  void stage_in() {
    at::NoGradGuard no_grad;
    for (auto& p : params_)
      if (p.staged.defined()) p.staged.copy_(p.param);
  }
  void stage_out() {
    at::NoGradGuard no_grad;
    for (std::size_t i : loop_->rewritten())
      if (params_[i].staged.defined()) params_[i].param.copy_(params_[i].staged);
  }

  ProcessGroupCommunicator comm_;
  std::vector<Param> params_;
  std::unique_ptr<OuterLoop<ProcessGroupCommunicator>> loop_;
  std::mutex log_mutex_;
  std::vector<std::string> log_;
};

}  // namespace dilocox::torch_binding
