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
#include <utility>
#include <vector>

namespace dilocox::trainer {

// The flags that shape synchronization across clusters (train_options.hpp fills them):
// the method's knobs the flags set, and the outer-loop choices (the library's
// LoopChoices) with the trainer's H0 and largest H.
struct SyncOptions : LoopChoices {
  SyncOptions() {
    local_steps = 20;       // H0
    max_local_steps = 500;  // largest H the adaptive rule may reach
  }
  std::string mode = "dilocox";
  int bits = 0;                  // 0: the mode's default
  int rank = LowRankCompressorConfig{}.rank;        // dilocox: initial rank r0 (the library's default)
  int max_rank = AdaptiveConfig{}.r_max;            // dilocox adaptive: r_max (the library's default)
  bool adaptive = true;          // dilocox: adaptive rank and H
  KnobValues knobs;              // --knob NAME=VALUE: any other knob of the mode (registry names)
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

// The knobs these options set for mode m: --knob's, --bits when given, and the rank
// flags where the mode has them.
inline KnobValues knobs_of(const SyncMode& m, const SyncOptions& o) {
  KnobValues k = o.knobs;
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

// The knobs set by flags of their own (knobs_of), which --knob does not take.
inline constexpr std::pair<const char*, const char*> knob_flags[] = {
    {"bits", "--bits"}, {"rank", "--rank"}, {"max_rank", "--max-rank"}, {"adaptive", "--no-adaptive"}};

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
  for (const auto& [knob, flag] : knob_flags)
    dilocox::detail::require(!o.knobs.contains(knob), "--knob", std::string(knob) + " has its own flag, " + flag);
  try {
    check_knobs(m, knobs_of(m, o));
  } catch (const Error& e) {
    throw Error(std::string("--knob: ") + e.what());
  }
  check_loop_choices(m, o,
                     {.local_steps = "--local-steps", .max_local_steps = "--max-local-steps", .fragments = "--fragments",
                      .overlap_steps = "--overlap-steps", .rebase = "--rebase"});
}

// The OuterLoop settings of a mode with these options.
inline OuterLoopConfig outer_loop_config(const SyncMode& m, const SyncOptions& o, const AnyCompressor& c) {
  OuterLoopConfig cfg = dilocox::outer_loop_config(m, o, c);
  cfg.step_seconds = o.step_seconds;
  cfg.link = o.link;
  return cfg;
}

}  // namespace dilocox::trainer
