// dilocox/adaptive.hpp: AdaptiveRankController, our reconstruction of DiLoCoX's
// adaptive gradient compression (the paper gives the idea, not the rule; DESIGN.md 2.6):
//   effective rank  = smallest k with sum_{i<=k} sigma_i^2 >= rho * sum_i sigma_i^2
//                     (sigma: the sketch's singular-value estimates), except that when
//                     the sketch holds < rho_total of the energy of the matrix it sketches
//                     (the same matrix: the replicas' mean), the rank doubles instead;
//   next rank       = ceil(mean of the last `window` effective ranks), in [r_min, r_max]
//                     (the window starts full of the initial rank, so decreases are gradual;
//                     a growth refills the window, so recovery is immediate).
// H follows the rank in OuterLoop (H = H0 r / r0, clamped): the compressor reports r / r0.
// Pure arithmetic on what every replica sees identically; no I/O, no clock.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <span>
#include <string>

#include "dilocox/config.hpp"
#include "dilocox/state.hpp"

namespace dilocox {

struct AdaptiveConfig {
  double rho = 0.9;          // energy fraction the effective rank must keep (DESIGN.md 2.6)
  double rho_total = 0.5;    // below this fraction of the sketched matrix's energy, the rank grows
  int window = 5;            // rounds averaged: a decrease takes effect over ~5 rounds (DESIGN.md 2.6)
  int r_min = 2;             // a rank-1 sketch cannot tell signal from noise; 2 keeps one spare direction
  int r_max = 32;            // growth cap: see LowRankConfig's rank in compress/lowrank.hpp for the measurement
};

class AdaptiveRankController {
 public:
  AdaptiveRankController(AdaptiveConfig config, int initial_rank)
      : config_(config), r0_(initial_rank), rank_(initial_rank) {
    const auto& c = config;
    detail::require(c.rho > 0 && c.rho <= 1, "AdaptiveConfig", "rho must be in (0, 1]");
    detail::require(c.rho_total >= 0 && c.rho_total <= 1, "AdaptiveConfig", "rho_total must be in [0, 1]");
    detail::require(c.window >= 1, "AdaptiveConfig", "window must be >= 1");
    detail::require(c.r_min >= 1 && c.r_min <= c.r_max, "AdaptiveConfig", "need 1 <= r_min <= r_max");
    detail::require(initial_rank >= c.r_min && initial_rank <= c.r_max, "AdaptiveRankController",
                    "initial rank " + std::to_string(initial_rank) + " outside [r_min, r_max]");
    history_.assign(static_cast<std::size_t>(c.window), initial_rank);
  }

  // One round's sketch: singular values (descending), the energy the sketch holds
  // (sum sigma^2) and the energy of the matrix it sketches.
  void observe(std::span<const float> sigma, double sketch_energy, double total_energy) {
    last_effective_ = effective_rank(sigma, sketch_energy, total_energy);
    if (last_effective_ > static_cast<int>(sigma.size()))  // growth acts at once: the window
      history_.assign(history_.size(), last_effective_);  // smooths decreases only
    history_.push_back(last_effective_);
    while (static_cast<int>(history_.size()) > config_.window) history_.pop_front();
    double sum = 0;
    for (int r : history_) sum += r;
    rank_ = std::clamp(static_cast<int>(std::ceil(sum / static_cast<double>(history_.size()) - 1e-9)), config_.r_min,
                       config_.r_max);
  }

  // The effective rank of one sketch, before smoothing (DESIGN.md 2.6).
  int effective_rank(std::span<const float> sigma, double sketch_energy, double total_energy) const {
    const int r = static_cast<int>(sigma.size());
    if (total_energy > 0 && sketch_energy < config_.rho_total * total_energy)
      return std::min(2 * std::max(r, 1), config_.r_max);  // the sketch misses too much: grow
    double all = 0;
    for (float s : sigma) all += static_cast<double>(s) * s;
    if (all <= 0) return config_.r_min;
    double acc = 0;
    for (int k = 0; k < r; ++k) {
      acc += static_cast<double>(sigma[k]) * sigma[k];
      if (acc >= config_.rho * all) return k + 1;
    }
    return r;
  }

  int rank() const { return rank_; }                 // r_{t+1}
  int initial_rank() const { return r0_; }
  int last_effective_rank() const { return last_effective_; }

  const AdaptiveConfig& config() const { return config_; }

  void save_state(StateWriter& w) const {
    w.value<std::int32_t>(rank_);
    w.value<std::int32_t>(last_effective_);
    const std::vector<std::int32_t> h(history_.begin(), history_.end());
    w.values(std::span<const std::int32_t>(h));
  }
  void load_state(StateReader& r) {
    rank_ = r.value<std::int32_t>();
    last_effective_ = r.value<std::int32_t>();
    const auto h = r.vector<std::int32_t>();
    history_.assign(h.begin(), h.end());
  }

 private:
  AdaptiveConfig config_;
  int r0_, rank_;
  int last_effective_ = 0;
  std::deque<int> history_;  // the last `window` effective ranks
};

}  // namespace dilocox
