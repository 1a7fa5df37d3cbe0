// reference_trainer/model/stage_model.hpp: what the training loop needs from one
// pipeline stage's model, on any backend: forward and backward of micro-batches,
// per-tensor gradient norms, the AdamW step, and host copies of the parameters,
// gradients and optimizer state. On the CPU those copies are the model's own buffers and
// pull/push do nothing; on the GPU they are mirrors that pull_* / push_* move.
// CpuStageModel (GptStage<float> + AdamW) is here; the CUDA one is in model/cuda/.
#pragma once

#include "model/adamw.hpp"
#include "model/gpt_stage.hpp"
#include "model/param_layout.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace dilocox::trainer {

enum class Device { cpu, cuda };
enum class Precision { fp32, bf16 };  // the CUDA path's compute type (master weights are fp32)

struct Backend {
  Device device = Device::cpu;
  Precision precision = Precision::bf16;
  int gpu = 0;  // CUDA device index (modulo the device count)
};

class StageModel {
 public:
  virtual ~StageModel() = default;

  virtual const ParamLayout& layout() const = 0;
  bool first() const { return layout().first(); }
  bool last() const { return layout().last(); }
  const std::vector<ParamTensor>& tensors() const { return layout().tensors(); }
  const ParamTensor* tied_embedding() const { return layout().tied_embedding(); }
  // Whether t's squared gradient norm counts on this stage: the tied embedding only on
  // the first stage, so the global norm sees it once.
  bool counts_in_norm(const ParamTensor& t) const { return t.name != "wte" || first(); }
  virtual int slots() const = 0;
  virtual void init(std::uint64_t seed) = 0;

  // Host copies: read them after pull_*(), call push_*() after writing them.
  virtual std::span<float> params() = 0;
  virtual std::span<float> grads() = 0;
  virtual std::span<float> adam_m() = 0;
  virtual std::span<float> adam_v() = 0;
  std::span<float> param(const ParamTensor& t) { return params().subspan(t.offset, t.numel()); }
  std::span<float> grad(const ParamTensor& t) { return grads().subspan(t.offset, t.numel()); }
  virtual void pull_params() {}
  virtual void push_params() {}
  virtual void pull_grads() {}
  virtual void push_grads() {}
  virtual void pull_optimizer() {}
  virtual void push_optimizer() {}

  // Activations exchanged with the neighbouring stages, (B, T, C) in host memory.
  virtual std::span<float> input(int slot) = 0;         // fill before forward (non-first stage)
  virtual std::span<const float> output(int slot) = 0;  // after forward (non-last stage)
  virtual std::span<float> grad_output() = 0;           // fill before backward (non-last stage)
  virtual std::span<const float> grad_input() = 0;      // after backward (non-first stage)

  // As GptStage: the loss sum of the micro-batch on the last stage, 0 elsewhere.
  virtual double forward(int slot, const std::int32_t* tokens, const std::int32_t* targets) = 0;
  virtual void backward(int slot, float loss_scale) = 0;
  virtual void finish_backward() = 0;
  virtual void zero_grads() = 0;

  // Squared L2 norm of each tensor's gradient at its global id (the tied embedding
  // counted on the first stage only); other entries untouched.
  virtual void grad_square_norms(std::span<double> by_global_id) = 0;
  virtual void adamw_step(const AdamWConfig& c, float lr, float grad_scale, std::int64_t t) = 0;
};

class CpuStageModel final : public StageModel {
 public:
  CpuStageModel(const GptConfig& cfg, int stages, int stage, int micro_batch, int seq_len, int slots)
      : model_(cfg, stages, stage, micro_batch, seq_len, slots), adam_(model_.params().size()) {}

  const ParamLayout& layout() const override { return model_.layout(); }
  int slots() const override { return model_.slots(); }
  void init(std::uint64_t seed) override { model_.init(seed); }
  std::span<float> params() override { return model_.params(); }
  std::span<float> grads() override { return model_.grads(); }
  std::span<float> adam_m() override { return adam_.m(); }
  std::span<float> adam_v() override { return adam_.v(); }
  std::span<float> input(int slot) override { return model_.input(slot); }
  std::span<const float> output(int slot) override { return model_.output(slot); }
  std::span<float> grad_output() override { return model_.grad_output(); }
  std::span<const float> grad_input() override { return model_.grad_input(); }
  double forward(int slot, const std::int32_t* tokens, const std::int32_t* targets) override {
    return model_.forward(slot, tokens, targets);
  }
  void backward(int slot, float loss_scale) override { model_.backward(slot, loss_scale); }
  void finish_backward() override { model_.finish_backward(); }
  void zero_grads() override { model_.zero_grads(); }
  void grad_square_norms(std::span<double> by_id) override {
    for (const auto& t : model_.tensors()) {
      if (!counts_in_norm(t)) continue;
      const float* g = model_.grad(t).data();
      by_id[static_cast<std::size_t>(t.global_id)] = cpu::sum_in_index_order<double>(
          t.numel(), [g](std::size_t i) { return static_cast<double>(g[i]) * static_cast<double>(g[i]); });
    }
  }
  void adamw_step(const AdamWConfig& c, float lr, float grad_scale, std::int64_t t) override {
    adam_.step(model_.params(), model_.grads(), model_.tensors(), c, lr, grad_scale, t);
  }

  GptStage<float>& gpt() { return model_; }

 private:
  GptStage<float> model_;
  AdamW adam_;
};

// The CUDA backend (model/cuda/cuda_stage_model.cu, linked when DILOCOX_TRAINER_CUDA is
// defined); throws Error when the machine has no device or this build no CUDA.
#if defined(DILOCOX_TRAINER_CUDA)
std::unique_ptr<StageModel> make_cuda_stage_model(const GptConfig& cfg, int stages, int stage, int micro_batch,
                                                  int seq_len, int slots, const Backend& backend);
#else
inline std::unique_ptr<StageModel> make_cuda_stage_model(const GptConfig&, int, int, int, int, int, const Backend&) {
  throw Error("--device cuda: this build has no CUDA path (configure with nvcc present or -DDILOCOX_WITH_CUDA=ON)");
}
#endif

inline std::unique_ptr<StageModel> make_stage_model(const Backend& b, const GptConfig& cfg, int stages, int stage,
                                                    int micro_batch, int seq_len, int slots) {
  if (b.device == Device::cuda)
    return make_cuda_stage_model(cfg, stages, stage, micro_batch, seq_len, slots, b);
  return std::make_unique<CpuStageModel>(cfg, stages, stage, micro_batch, seq_len, slots);
}

}  // namespace dilocox::trainer
