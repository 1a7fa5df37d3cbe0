// reference_trainer/model/adamw.hpp: the inner optimizer: AdamW (decoupled weight
// decay on matrices only), the learning-rate schedule (linear warmup, then cosine
// down to min_lr_ratio x lr at the last step) and global-norm gradient clipping.
// State (m, v) lives beside the parameters of one stage; nothing here communicates.
#pragma once

#include "model/cpu/parallel.hpp"
#include "model/param_layout.hpp"

#include <dilocox/config.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <span>
#include <vector>

namespace dilocox::trainer {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;     // max global gradient norm; 0 turns clipping off
  int warmup_steps = 20;
  float min_lr_ratio = 0.1f;  // the cosine ends at min_lr_ratio x lr
};

// Learning rate at step (0-based) of total_steps.
inline float learning_rate(const AdamWConfig& c, std::int64_t step, std::int64_t total_steps) {
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr * static_cast<float>(step + 1) / static_cast<float>(c.warmup_steps);
  const double span = std::max<std::int64_t>(1, total_steps - c.warmup_steps - 1);
  const double progress = std::clamp(static_cast<double>(step - c.warmup_steps) / span, 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return static_cast<float>(c.lr * (c.min_lr_ratio + (1.0 - c.min_lr_ratio) * cosine));
}

// Multiplier that brings the gradient's global norm down to grad_clip.
inline float clip_scale(const AdamWConfig& c, double grad_norm) {
  return c.grad_clip > 0 && grad_norm > c.grad_clip ? static_cast<float>(c.grad_clip / grad_norm) : 1.0f;
}

// One AdamW update (t counts updates from 1): its constants, and the rule for one element,
// which the CPU loop below and the CUDA kernel (model/cuda/kernels.cuh) both apply.
struct AdamWUpdate {
  float lr, beta1, beta2, eps, grad_scale;
  float b1t, b2t;  // bias corrections 1 - beta^t

  AdamWUpdate(const AdamWConfig& c, float lr_, float grad_scale_, std::int64_t t)
      : lr(lr_), beta1(c.beta1), beta2(c.beta2), eps(c.eps), grad_scale(grad_scale_),
        b1t(1.0f - static_cast<float>(std::pow(c.beta1, static_cast<double>(t)))),
        b2t(1.0f - static_cast<float>(std::pow(c.beta2, static_cast<double>(t)))) {}

  // p, m, v updated in place from gradient g; wd: this tensor's weight decay (0 for none).
  DILOCOX_HOST_DEVICE void apply(float& p, float& m, float& v, float g, float wd) const {
    const float gi = g * grad_scale;
    m = beta1 * m + (1.0f - beta1) * gi;
    v = beta2 * v + (1.0f - beta2) * gi * gi;
    const float mhat = m / b1t, vhat = v / b2t;
    p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
  }
};

class AdamW {
 public:
  explicit AdamW(std::size_t n) : m_(n, 0.0f), v_(n, 0.0f) {}

  // One update of a stage's flat parameters from its gradients; t counts updates from 1.
  void step(std::span<float> params, std::span<const float> grads, const std::vector<ParamTensor>& tensors,
            const AdamWConfig& c, float lr, float grad_scale, std::int64_t t) {
    const AdamWUpdate u(c, lr, grad_scale, t);
    for (const auto& tensor : tensors) {
      float* p = params.data() + tensor.offset;
      const float* g = grads.data() + tensor.offset;
      float* m = m_.data() + tensor.offset;
      float* v = v_.data() + tensor.offset;
      const float wd = tensor.decay ? c.weight_decay : 0.0f;
      // Element-wise: split over the kernels' threads, the same numbers for any count. The
      // trainer builds with -fno-math-errno, so sqrtf leaves the loop vectorizable.
      cpu::parallel_ranges(tensor.numel(), 16384, [&](int, std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) u.apply(p[i], m[i], v[i], g[i], wd);
      });
    }
  }

  std::span<float> m() { return m_; }
  std::span<float> v() { return v_; }
  std::span<const float> m() const { return m_; }
  std::span<const float> v() const { return v_; }

 private:
  std::vector<float> m_, v_;  // (n) each, in the stage's flat parameter order
};

}  // namespace dilocox::trainer
