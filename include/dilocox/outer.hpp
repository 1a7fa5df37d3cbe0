// dilocox/outer.hpp: the outer optimizer of DiLoCo rounds, SGD with (Nesterov)
// momentum on a pseudo-gradient Delta (the direction to subtract):
//   v <- mu v + Delta;   theta <- theta - lr (Delta + mu v)   (Nesterov)
//                        theta <- theta - lr v                (heavy ball)
// in one call (step), or split: momentum_direction() on a replica's own Delta, then
// descend() by the reduced directions (OuterLoop's MomentumAt::replica).
// Host memory, standard library only. Not here: the inner optimizer (the trainer's).
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dilocox/config.hpp"

namespace dilocox {

// The library's default outer step (every compressor but SparseLoCo, whose accumulator
// replaces momentum): lr 0.7 as DiLoCo; momentum 0.5, not DiLoCo's 0.9: tests/convergence
// runs every mode at both, and 0.5 lost less everywhere (docs/RESULTS.md, "Methods as
// published, stable at the published settings").
struct NesterovConfig {
  float lr = 0.7f;        // DiLoCo's outer learning rate
  float momentum = 0.5f;  // measured: 0.9 converges but loses up to 1.42x AllReduce (0.5: 1.20x)
  bool nesterov = true;   // Nesterov, as DiLoCo
};

class NesterovOuterOptimizer {
 public:
  NesterovOuterOptimizer(std::size_t n, NesterovConfig config) : config_(config), v_(n, 0.0f) {
    detail::require(std::isfinite(config.lr) && config.lr > 0, "NesterovOuterOptimizer", "lr must be > 0");
    detail::require(std::isfinite(config.momentum) && config.momentum >= 0 && config.momentum < 1,
                    "NesterovOuterOptimizer", "momentum must be in [0, 1)");
  }

  // v <- mu v + delta; then delta <- the direction step() would move theta along, over lr
  // (delta + mu v, or v without Nesterov).
  void momentum_direction(std::span<float> delta) {
    detail::require(delta.size() == v_.size(), "NesterovOuterOptimizer::momentum_direction",
                    "span has " + std::to_string(delta.size()) + " elements, the state has " + std::to_string(v_.size()));
    const float mu = config_.momentum;
    float* v = v_.data();
    for (std::size_t i = 0; i < v_.size(); ++i) {
      v[i] = mu * v[i] + delta[i];
      delta[i] = config_.nesterov ? delta[i] + mu * v[i] : v[i];
    }
  }

  // theta <- theta - lr direction (a direction momentum_direction() made, reduced).
  void descend(std::span<float> theta, std::span<const float> direction) const {
    detail::require(theta.size() == v_.size() && direction.size() == v_.size(), "NesterovOuterOptimizer::descend",
                    "spans have " + std::to_string(theta.size()) + " and " + std::to_string(direction.size()) +
                        " elements, the state has " + std::to_string(v_.size()));
    for (std::size_t i = 0; i < v_.size(); ++i) theta[i] -= config_.lr * direction[i];
  }

  void step(std::span<float> theta, std::span<const float> delta) {
    detail::require(theta.size() == v_.size() && delta.size() == v_.size(), "NesterovOuterOptimizer::step",
                    "spans have " + std::to_string(theta.size()) + " and " + std::to_string(delta.size()) +
                        " elements, the state has " + std::to_string(v_.size()));
    const float lr = config_.lr, mu = config_.momentum;
    float* v = v_.data();
    for (std::size_t i = 0; i < v_.size(); ++i) {
      v[i] = mu * v[i] + delta[i];
      theta[i] -= lr * (config_.nesterov ? delta[i] + mu * v[i] : v[i]);
    }
  }

  const NesterovConfig& config() const { return config_; }
  std::span<const float> momentum_buffer() const { return v_; }
  std::span<float> momentum_buffer() { return v_; }  // for checkpoints

 private:
  NesterovConfig config_;
  std::vector<float> v_;  // (n) host
};

}  // namespace dilocox
