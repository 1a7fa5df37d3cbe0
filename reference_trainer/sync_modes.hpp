// reference_trainer/sync_modes.hpp: the --sync modes, which are the methods of the
// library's registry (dilocox/compress/registry.hpp: name, help, defaults and their
// sources, knobs, the compressor each builds), and the flags that reach them: the knobs
// the flags set, and the outer-loop settings every mode shares (H, overlap, fragments,
// rebase, outer step). No MPI: the planner (plan.hpp) reads the same table.
#pragma once

#include <dilocox/comm/cost.hpp>
#include <dilocox/compress/registry.hpp>
#include <dilocox/diloco.hpp>

#include <algorithm>
#include <deque>
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

// A --sync mode is a method of the library's registry (dilocox/compress/registry.hpp).
using SyncMode = Method;

inline const std::deque<Method>& sync_modes() { return methods(); }
inline std::string sync_mode_names() { return method_names(); }

inline const SyncMode& sync_mode(const std::string& name) {
  for (const auto& m : sync_modes())
    if (m.name == name) return m;
  throw Error("unknown --sync '" + name + "' (" + sync_mode_names() + ")");
}

// The knobs these options set for mode m: --bits when given, and the rank flags where
// the mode has them.
inline KnobValues knobs_of(const SyncMode& m, const SyncOptions& o) {
  KnobValues k;
  if (o.bits) k["bits"] = o.bits;
  if (m.knob("rank")) k["rank"] = o.rank;
  if (m.knob("max_rank")) k["max_rank"] = std::max(o.max_rank, o.rank);
  if (m.knob("adaptive")) k["adaptive"] = o.adaptive ? 1 : 0;
  return k;
}

// The compressor of mode m with these options.
inline AnyCompressor make_compressor(const SyncMode& m, const SyncOptions& o) {
  return dilocox::make_compressor(m, knobs_of(m, o));
}

// Throws Error naming the flag when the options do not suit the mode.
inline void validate(const SyncMode& m, const SyncOptions& o) {
  const Knob* bits = m.knob("bits");
  if (o.bits && bits && std::find(bits->allowed.begin(), bits->allowed.end(), o.bits) == bits->allowed.end()) {
    std::string allowed;
    for (double b : bits->allowed) allowed += (allowed.empty() ? "" : ", ") + dilocox::detail::number(b);
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
