// reference_trainer/sync_modes.hpp: the table of --sync modes. One row per mode: its
// name, help, the defaults it runs with and where they come from, and the compressor it
// builds (the library's compress/*.hpp). Adding a mode = one compressor header + one row.
// The outer-loop settings every mode shares (H, overlap, fragments, rebase, outer step)
// are built here too. No MPI: the planner (plan.hpp) reads the same table.
#pragma once

#include <dilocox/comm/cost.hpp>
#include <dilocox/compress/cocktail.hpp>
#include <dilocox/compress/compressor.hpp>
#include <dilocox/compress/dense.hpp>
#include <dilocox/compress/lowrank.hpp>
#include <dilocox/compress/sparse.hpp>
#include <dilocox/diloco.hpp>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dilocox::trainer {

// The flags that shape synchronization across clusters (train_options.hpp fills them).
struct SyncOptions {
  std::string mode = "dilocox";
  int bits = 0;                  // 0: the mode's default
  int rank = LowRankCompressorConfig{}.rank;        // dilocox: initial rank r0 (the library's default)
  int max_rank = AdaptiveConfig{}.r_max;            // dilocox adaptive: r_max (the library's default)
  int local_steps = 20;          // H0
  int max_local_steps = 500;     // largest H the adaptive rule may reach
  std::optional<bool> overlap;   // unset: the mode's default
  bool adaptive = true;          // dilocox: adaptive rank and H
  int fragments = 1;             // streaming fragments
  std::optional<Rebase> rebase;  // unset: the mode's (keep; Streaming DiLoCo: mix, or overwrite without overlap)
  std::optional<int> overlap_steps;          // unset: the mode's tau
  std::optional<MomentumAt> momentum_at;     // unset: the mode's
  std::optional<float> outer_lr, outer_momentum;  // unset: the mode's outer step
  MomentumStorage momentum_storage = OuterLoopConfig{}.momentum_storage;  // the library's default
  double step_seconds = 0;       // modelled seconds per inner step (overlap floor of H); 0: none
  LinkConfig link{1e9, 0.0};
};

struct SyncMode {
  std::string name;
  std::string help;                 // one line, for --help
  std::string defaults;             // the mode's defaults and their sources (README, --help)
  bool per_step = false;            // allreduce: the gradient every step, no outer loop
  std::vector<int> bits;            // accepted --bits; the first is the default
  bool overlap = true;              // default of --overlap
  std::function<AnyCompressor(const SyncOptions&)> make;  // null when per_step
  int overlap_steps = 0;            // overlap as Streaming DiLoCo: tau steps, then mix; 0: the one-step delay
  MomentumAt momentum_at = MomentumAt::replica;  // where the outer momentum runs
  std::string differs;              // what still differs from the published method, measured (README, --help)
};

namespace detail {
inline int bits_of(const SyncMode& m, const SyncOptions& o) { return o.bits ? o.bits : m.bits.front(); }
inline Codec dense_codec(int bits) {
  if (bits == 32) return {Encoding::f32, {}};
  if (bits == 16) return {Encoding::f16, {}};
  return {Encoding::quantized, {.bits = bits, .block = 128}};
}
}  // namespace detail

// The table. Each row's defaults are its method's published configuration, except where
// tests/convergence measured it unsafe (then the row says so).
inline const std::vector<SyncMode>& sync_modes() {
  static const std::vector<SyncMode> modes = {
      {"allreduce", "the fp32 gradient, averaged every step (the baseline)",
       "every step, fp32 ring allreduce", true, {32}, false, nullptr, 0, MomentumAt::replica, ""},
      {"diloco", "every H steps the dense pseudo-gradient, --bits 32|16|8|4",
       "4-bit pseudo-gradient, overlap as Streaming DiLoCo (arXiv 2501.18512: reduce 1 step before the turn, mix "
       "alpha 0.5, momentum on the mean); Nesterov outer step lr 0.7 (DiLoCo, arXiv 2311.08105) with momentum 0.5, "
       "not 0.9 (measured: docs/RESULTS.md)",
       false, {4, 8, 16, 32}, true,
       [](const SyncOptions& o) -> AnyCompressor {
         return DenseCompressor({.codec = detail::dense_codec(o.bits ? o.bits : 4)});
       },
       1, MomentumAt::mean,
       "int4 not the paper's fp4 (not measured); momentum 0.5 not 0.9 (0.9: up to +19% loss on the MLPs); "
       "consecutive fragments, not strided layers"},
      {"cocktail", "every H steps: random 10% x top 20% x int4 values, error feedback (CocktailSGD)",
       "random 10% subset, top 20% of it, int4 values, error feedback (CocktailSGD, ICML 2023, its README's "
       "ratios); one-step-delay overlap, Nesterov lr 0.7 momentum 0.5 at the replica",
       false, {4, 8}, true,
       [](const SyncOptions& o) -> AnyCompressor {
         CocktailConfig c;
         c.quant.bits = o.bits ? o.bits : 4;
         return CocktailCompressor(c);
       },
       0, MomentumAt::replica,
       "every H steps with a Nesterov step, not every step with lr 1; fresh random subsets; 4-byte indices "
       "(2.6-4x the reference's bytes); an exact mean, not a re-compressing server"},
      {"sparseloco", "every H steps: top-64 of each 64x64 tile, 2-bit values, decayed error feedback (SparseLoCo)",
       "top-64 per tile of up to 64 x 64 (biases whole), 2-bit values in a per-tensor 4-bin codebook, error "
       "feedback decayed by 0.95 in place of outer momentum, plain averaged outer step lr 1, replicas restart "
       "from the global model (SparseLoCo, arXiv 2508.15706); overlap on",
       false, {2}, true, [](const SyncOptions&) -> AnyCompressor { return SparseLoCoCompressor(); },
       0, MomentumAt::replica,
       "the mean is sum / R (the paper), not the reference code's per-position mean with median norm clipping; "
       "restarting from theta fails on least squares (keep_residual converges there)"},
      {"dilocox", "every H steps: low rank (power iteration) + int4 factors + error feedback, adaptive rank",
       "low rank from r0 8 (adaptive up to r_max 32) with int4 factors, int8 small tensors, error feedback, "
       "one-step-delay overlap, rebase keep (DiLoCoX, arXiv 2506.21263); Nesterov lr 0.7 momentum 0.5 at the replica",
       false, {4, 8}, true,
       [](const SyncOptions& o) -> AnyCompressor {
         LowRankCompressorConfig c;
         c.rank = o.rank;
         c.factor_quant.bits = o.bits ? o.bits : 4;
         c.adaptive = o.adaptive;
         c.adaptive_config.r_max = std::max(o.max_rank, o.rank);
         c.adaptive_config.r_min = std::min(c.adaptive_config.r_min, o.rank);
         return LowRankCompressor(c);
       },
       0, MomentumAt::replica,
       "outer momentum at the replica, not on the mean (on the mean at 0.9: 13-21x AllReduce's loss on the "
       "MLPs); momentum 0.5; the adaptive rank rule is a reconstruction"},
  };
  return modes;
}

inline std::string sync_mode_names() {
  std::string s;
  for (const auto& m : sync_modes()) s += (s.empty() ? "" : ", ") + m.name;
  return s;
}

inline const SyncMode& sync_mode(const std::string& name) {
  for (const auto& m : sync_modes())
    if (m.name == name) return m;
  throw Error("unknown --sync '" + name + "' (" + sync_mode_names() + ")");
}

// Throws Error naming the flag when the options do not suit the mode.
inline void validate(const SyncMode& m, const SyncOptions& o) {
  if (o.bits && std::find(m.bits.begin(), m.bits.end(), o.bits) == m.bits.end()) {
    std::string allowed;
    for (int b : m.bits) allowed += (allowed.empty() ? "" : ", ") + std::to_string(b);
    throw Error("--bits " + std::to_string(o.bits) + ": --sync " + m.name + " takes " + allowed);
  }
  dilocox::detail::require(o.max_rank >= o.rank, "--max-rank",
                  std::to_string(o.max_rank) + " is below --rank " + std::to_string(o.rank));
  dilocox::detail::require(o.max_local_steps >= o.local_steps, "--max-local-steps",
                  std::to_string(o.max_local_steps) + " is below --local-steps " + std::to_string(o.local_steps));
  const int tau = o.overlap.value_or(m.overlap) ? o.overlap_steps.value_or(m.overlap_steps) : 0;
  if (tau > 0 && !m.per_step) {
    dilocox::detail::require(!o.rebase || *o.rebase == Rebase::mix || *o.rebase == Rebase::overwrite, "--rebase",
                             "--overlap-steps " + std::to_string(tau) + " merges as Streaming DiLoCo: mix or overwrite");
    dilocox::detail::require(o.local_steps >= (tau + 1) * o.fragments, "--overlap-steps",
                             std::to_string(tau) + " needs --local-steps >= (overlap steps + 1) x --fragments = " +
                                 std::to_string((tau + 1) * o.fragments));
  }
}

// The OuterLoop settings of a mode with these options.
inline OuterLoopConfig outer_loop_config(const SyncMode& m, const SyncOptions& o, const AnyCompressor& c) {
  OuterLoopConfig cfg;
  cfg.local_steps = o.local_steps;
  cfg.min_local_steps = std::min(cfg.min_local_steps, o.local_steps);
  cfg.max_local_steps = std::max(o.max_local_steps, o.local_steps);
  const bool overlap = o.overlap.value_or(m.overlap);
  const int tau = overlap ? o.overlap_steps.value_or(m.overlap_steps) : 0;
  cfg.overlap = overlap && tau == 0;
  cfg.overlap_steps = tau;
  cfg.fragments = o.fragments;
  // Streaming DiLoCo's overlap mixes; a streaming mode without overlap is DiLoCo (phi = theta).
  cfg.rebase = o.rebase.value_or(tau > 0 ? Rebase::mix : m.overlap_steps > 0 ? Rebase::overwrite : Rebase::keep);
  cfg.momentum_at = o.momentum_at.value_or(m.momentum_at);
  cfg.momentum_storage = o.momentum_storage;
  cfg.step_seconds = o.step_seconds;
  cfg.link = o.link;
  if (o.outer_lr || o.outer_momentum) {
    NesterovConfig n = c.outer_step().value_or(NesterovConfig{});
    if (o.outer_lr) n.lr = *o.outer_lr;
    if (o.outer_momentum) n.momentum = *o.outer_momentum;
    cfg.outer = n;
  }
  return cfg;
}

}  // namespace dilocox::trainer
