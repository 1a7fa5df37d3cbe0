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
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dilocox/config.hpp"
#include "dilocox/half.hpp"
#include "dilocox/state.hpp"

namespace dilocox {

// The library's default outer step (every compressor but SparseLoCo, whose accumulator
// replaces momentum): lr 0.7 as DiLoCo; momentum 0.5, not DiLoCo's 0.9: tests/convergence
// runs every mode at both, and 0.5 lost less everywhere (docs/RESULTS.md, "Methods as
// published, stable at the published settings").
struct NesterovConfig {
  float lr = 0.7f;        // DiLoCo's outer learning rate
  float momentum = 0.5f;  // measured: 0.9 converges but loses up to 1.44x AllReduce (0.5: 1.20x)
  bool nesterov = true;   // Nesterov, as DiLoCo
};

// How the momentum buffer is stored: fp32, or bf16 (2 bytes a parameter instead of 4;
// each update computed in fp32 from the stored value and rounded to nearest when stored).
enum class MomentumStorage : std::uint8_t { fp32, bf16 };

inline const char* to_string(MomentumStorage m) { return m == MomentumStorage::fp32 ? "fp32" : "bf16"; }

class NesterovOuterOptimizer {
 public:
  NesterovOuterOptimizer(std::size_t n, NesterovConfig config, MomentumStorage storage = MomentumStorage::fp32)
      : config_(config), storage_(storage), n_(n) {
    detail::require(std::isfinite(config.lr) && config.lr > 0, "NesterovOuterOptimizer", "lr must be > 0");
    detail::require(std::isfinite(config.momentum) && config.momentum >= 0 && config.momentum < 1,
                    "NesterovOuterOptimizer", "momentum must be in [0, 1)");
    if (storage_ == MomentumStorage::bf16) vb_.assign(n, 0);
    else v_.assign(n, 0.0f);
  }

  // v <- mu v + delta; then delta <- the direction step() would move theta along, over lr
  // (delta + mu v, or v without Nesterov).
  void momentum_direction(std::span<float> delta) {
    check(delta.size(), "momentum_direction");
    const float mu = config_.momentum;
    for (std::size_t i = 0; i < n_; ++i) {
      const float v = update(i, mu, delta[i]);
      delta[i] = config_.nesterov ? delta[i] + mu * v : v;
    }
  }

  // theta <- theta - lr direction (a direction momentum_direction() made, reduced).
  void descend(std::span<float> theta, std::span<const float> direction) const {
    detail::require(theta.size() == n_ && direction.size() == n_, "NesterovOuterOptimizer::descend",
                    "spans have " + std::to_string(theta.size()) + " and " + std::to_string(direction.size()) +
                        " elements, the state has " + std::to_string(n_));
    for (std::size_t i = 0; i < n_; ++i) theta[i] -= config_.lr * direction[i];
  }

  void step(std::span<float> theta, std::span<const float> delta) {
    check(theta.size(), "step");
    check(delta.size(), "step");
    const float lr = config_.lr, mu = config_.momentum;
    for (std::size_t i = 0; i < n_; ++i) {
      const float v = update(i, mu, delta[i]);
      theta[i] -= lr * (config_.nesterov ? delta[i] + mu * v : v);
    }
  }

  const NesterovConfig& config() const { return config_; }
  MomentumStorage storage() const { return storage_; }
  std::uint64_t state_bytes() const { return 4 * v_.size() + 2 * vb_.size(); }
  // The momentum buffer, for checkpoints (in its storage type).
  void save_state(StateWriter& w) const {
    if (storage_ == MomentumStorage::fp32) w.values(std::span<const float>(v_));
    else w.values(std::span<const std::uint16_t>(vb_));
  }
  void load_state(StateReader& r) {
    if (storage_ == MomentumStorage::fp32) r.values(std::span<float>(v_));
    else r.values(std::span<std::uint16_t>(vb_));
  }

 private:
  // v_i <- mu v_i + d, stored; returns the fp32 value before storing.
  float update(std::size_t i, float mu, float d) {
    if (storage_ == MomentumStorage::fp32) return v_[i] = mu * v_[i] + d;
    const float v = mu * bf16_to_float(vb_[i]) + d;
    vb_[i] = float_to_bf16(v);
    return v;
  }
  void check(std::size_t size, const char* what) const {
    detail::require(size == n_, "NesterovOuterOptimizer",
                    std::string(what) + ": a span has " + std::to_string(size) + " elements, the state has " + std::to_string(n_));
  }

  NesterovConfig config_;
  MomentumStorage storage_;
  std::size_t n_;
  std::vector<float> v_;            // (n) fp32 storage, or empty
  std::vector<std::uint16_t> vb_;   // (n) bf16 storage, or empty
};

}  // namespace dilocox
