// dilocox/compress/registry.hpp: the methods by name. An entry is a method as a user
// picks it: the compressor its name builds from a few named knobs (each with its
// default and where the default comes from), the outer-loop schedule it runs with
// (overlap style, where the outer momentum runs) and what still differs from its
// paper. The built-in five (allreduce, diloco, cocktail, sparseloco, dilocox) are there
// from the first use; a user's own compressor is added the same way (add_method). The
// reference trainer's --sync, the convergence suite and the bindings read this table.
//
//   AnyCompressor c = make_compressor("dilocox", {{"rank", 16}, {"bits", 8}});
//   add_method({.name = "sign", .help = "...", .knobs = {}, .make = [](const KnobReader&) {
//     return AnyCompressor(SignCompressor{}); }});
//
// add_method() is for start-up: it must not run while another thread looks methods up.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dilocox/compress/cocktail.hpp"
#include "dilocox/compress/compressor.hpp"
#include "dilocox/compress/dense.hpp"
#include "dilocox/compress/lowrank.hpp"
#include "dilocox/compress/sparse.hpp"
#include "dilocox/diloco.hpp"

namespace dilocox {

// One setting of a method's compressor, with its default.
struct Knob {
  std::string name{};
  double value = 0;                // the default
  std::string help{};              // what it sets, and where the default comes from
  std::vector<double> allowed{};   // the values it takes; empty: any the compressor's config accepts
};

// A user's settings by knob name; the knobs not named keep their defaults.
using KnobValues = std::map<std::string, double, std::less<>>;

// The value of each knob of one method, for its factory: the user's, else the default.
class KnobReader {
 public:
  KnobReader(std::string_view method, const std::vector<Knob>& knobs, const KnobValues& values)
      : method_(method), knobs_(&knobs), values_(&values) {}
  double number(std::string_view name) const {
    if (const auto it = values_->find(name); it != values_->end()) return it->second;
    for (const auto& k : *knobs_)
      if (k.name == name) return k.value;
    throw Error("method '" + method_ + "' reads knob '" + std::string(name) + "' it does not declare");
  }
  int integer(std::string_view name) const {
    const double v = number(name);
    detail::require(v == std::floor(v) && std::abs(v) < 1e9, method_.c_str(),
                    std::string(name) + " must be an integer, got " + detail::number(v));
    return static_cast<int>(v);
  }
  bool flag(std::string_view name) const {
    const double v = number(name);
    detail::require(v == 0 || v == 1, method_.c_str(), std::string(name) + " must be 0 or 1, got " + detail::number(v));
    return v != 0;
  }
  float real(std::string_view name) const { return static_cast<float>(number(name)); }

 private:
  std::string method_;
  const std::vector<Knob>* knobs_;
  const KnobValues* values_;
};

struct Method {
  std::string name{};
  std::string help{};          // one line
  std::string defaults{};      // its defaults and their sources (README, --help)
  std::vector<Knob> knobs{};   // what make() reads
  std::function<AnyCompressor(const KnobReader&)> make{};  // null when per_step
  bool per_step = false;     // the gradient every step, no outer loop (allreduce)
  bool overlap = true;       // overlaps each sync with the next round's compute by default
  int overlap_steps = 0;     // overlap as Streaming DiLoCo: tau steps, then mix; 0: the one-step delay
  MomentumAt momentum_at = MomentumAt::replica;  // where the outer momentum runs
  std::string differs{};     // what still differs from the published method, measured

  const Knob* knob(std::string_view n) const {
    for (const auto& k : knobs)
      if (k.name == n) return &k;
    return nullptr;
  }
};

namespace detail {
inline Codec dense_codec(int bits) {
  if (bits == 32) return {Encoding::f32, {}};
  if (bits == 16) return {Encoding::f16, {}};
  return {Encoding::quantized, {.bits = bits, .block = 128}};
}
inline std::deque<Method> builtin_methods();

inline std::deque<Method>& method_table() {
  static std::deque<Method> table = builtin_methods();
  return table;
}
inline std::string knob_names(const Method& m) {
  std::string s;
  for (const auto& k : m.knobs) s += (s.empty() ? "" : ", ") + k.name;
  return s.empty() ? "none" : s;
}
}  // namespace detail

// Every method, in the order registered (the built-ins first).
inline const std::deque<Method>& methods() { return detail::method_table(); }

inline std::string method_names() {
  std::string s;
  for (const auto& m : methods()) s += (s.empty() ? "" : ", ") + m.name;
  return s;
}

// The method called `name`; Error naming the known ones otherwise.
inline const Method& method(std::string_view name) {
  for (const auto& m : methods())
    if (m.name == name) return m;
  throw Error("unknown method '" + std::string(name) + "' (" + method_names() + ")");
}

// Adds a method; Error for an empty or taken name, a method with neither a factory nor
// per_step, or a knob declared twice.
inline void add_method(Method m) {
  detail::require(!m.name.empty(), "add_method", "a method needs a name");
  for (const auto& k : methods())
    detail::require(k.name != m.name, "add_method", "a method called '" + m.name + "' exists");
  detail::require(static_cast<bool>(m.make) != m.per_step, "add_method",
                  "'" + m.name + "': a method has a compressor factory, or is per_step without one");
  for (std::size_t i = 0; i < m.knobs.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      detail::require(m.knobs[i].name != m.knobs[j].name, "add_method",
                      "'" + m.name + "' declares knob '" + m.knobs[i].name + "' twice");
  detail::method_table().push_back(std::move(m));
}

// Error unless every value names a knob of `m` and is one it allows.
inline void check_knobs(const Method& m, const KnobValues& values) {
  for (const auto& [name, v] : values) {
    const Knob* k = m.knob(name);
    detail::require(k != nullptr, m.name.c_str(),
                    "has no knob '" + name + "' (its knobs: " + detail::knob_names(m) + ")");
    detail::require(std::isfinite(v), m.name.c_str(), name + " must be finite");
    if (k->allowed.empty() || std::find(k->allowed.begin(), k->allowed.end(), v) != k->allowed.end()) continue;
    std::string list;
    for (double a : k->allowed) list += (list.empty() ? "" : ", ") + detail::number(a);
    throw Error(m.name + ": " + name + " " + detail::number(v) + " is not one of " + list);
  }
}

// The compressor of `m` with `values` over its defaults (checked as check_knobs does).
inline AnyCompressor make_compressor(const Method& m, const KnobValues& values = {}) {
  detail::require(!m.per_step, m.name.c_str(), "runs every step without an outer loop: it has no compressor");
  check_knobs(m, values);
  return m.make(KnobReader(m.name, m.knobs, values));
}
inline AnyCompressor make_compressor(std::string_view name, const KnobValues& values = {}) {
  return make_compressor(method(name), values);
}

// The outer-loop settings a user picks for a method; each unset one is the method's
// (Method::overlap, overlap_steps, momentum_at, its compressor's outer step). The rest
// default to OuterLoopConfig's.
struct LoopChoices {
  int local_steps = OuterLoopConfig{}.local_steps;  // H0
  int max_local_steps = OuterLoopConfig{}.max_local_steps;
  int fragments = OuterLoopConfig{}.fragments;
  std::optional<bool> overlap{};
  std::optional<int> overlap_steps{};  // tau, when overlap is on
  std::optional<Rebase> rebase{};      // the method's: keep; Streaming DiLoCo: mix, or overwrite without overlap
  std::optional<MomentumAt> momentum_at{};
  std::optional<float> outer_lr{}, outer_momentum{};
  MomentumStorage momentum_storage = OuterLoopConfig{}.momentum_storage;
};

// How check_loop_choices() names the settings in its messages: the fields' names by
// default; a command line passes its flags.
struct LoopChoiceNames {
  std::string local_steps = "local_steps", max_local_steps = "max_local_steps", fragments = "fragments",
              overlap_steps = "overlap_steps", rebase = "rebase";
};

// Error naming the setting when `c` does not suit method `m`.
inline void check_loop_choices(const Method& m, const LoopChoices& c, const LoopChoiceNames& n = {}) {
  detail::require(c.local_steps >= 1, n.local_steps.c_str(), "must be >= 1, got " + std::to_string(c.local_steps));
  detail::require(c.max_local_steps >= c.local_steps, n.max_local_steps.c_str(),
                  std::to_string(c.max_local_steps) + " is below " + n.local_steps + " " +
                      std::to_string(c.local_steps));
  detail::require(c.fragments >= 1, n.fragments.c_str(), "must be >= 1, got " + std::to_string(c.fragments));
  const int tau = c.overlap.value_or(m.overlap) ? c.overlap_steps.value_or(m.overlap_steps) : 0;
  if (tau <= 0 || m.per_step) return;
  detail::require(!c.rebase || *c.rebase == Rebase::mix || *c.rebase == Rebase::overwrite, n.rebase.c_str(),
                  n.overlap_steps + " " + std::to_string(tau) + " merges as Streaming DiLoCo: mix or overwrite");
  detail::require(c.local_steps >= (tau + 1) * c.fragments, n.overlap_steps.c_str(),
                  std::to_string(tau) + " needs " + n.local_steps + " >= (overlap steps + 1) x " + n.fragments +
                      " = " + std::to_string((tau + 1) * c.fragments));
}

// The OuterLoop settings of method `m` with choices `c`, for its compressor `comp`.
inline OuterLoopConfig outer_loop_config(const Method& m, const LoopChoices& c, const AnyCompressor& comp) {
  check_loop_choices(m, c);
  OuterLoopConfig cfg;
  cfg.local_steps = c.local_steps;
  cfg.min_local_steps = std::min(cfg.min_local_steps, c.local_steps);
  cfg.max_local_steps = c.max_local_steps;
  const bool overlap = c.overlap.value_or(m.overlap);
  const int tau = overlap ? c.overlap_steps.value_or(m.overlap_steps) : 0;
  cfg.overlap = overlap && tau == 0;
  cfg.overlap_steps = tau;
  cfg.fragments = c.fragments;
  // Streaming DiLoCo's overlap mixes; a streaming method without overlap is DiLoCo (phi = theta).
  cfg.rebase = c.rebase.value_or(tau > 0 ? Rebase::mix : m.overlap_steps > 0 ? Rebase::overwrite : Rebase::keep);
  cfg.momentum_at = c.momentum_at.value_or(m.momentum_at);
  cfg.momentum_storage = c.momentum_storage;
  if (c.outer_lr || c.outer_momentum) {
    NesterovConfig n = comp.outer_step().value_or(NesterovConfig{});
    if (c.outer_lr) n.lr = *c.outer_lr;
    if (c.outer_momentum) n.momentum = *c.outer_momentum;
    cfg.outer = n;
  }
  return cfg;
}

namespace detail {
inline Knob error_decay_knob(double v, const char* source) {
  return {"error_decay", v, std::string("the residual is kept as decay x (x - sent); ") + source, {}};
}

inline Method dilocox_method() {
  const LowRankCompressorConfig d;
  Method m{.name = "dilocox",
           .help = "every H steps: low rank (power iteration) + int4 factors + error feedback, adaptive rank",
           .defaults = "low rank from r0 8 (adaptive up to r_max 32) with int4 factors, int8 small tensors, error "
                       "feedback, one-step-delay overlap, rebase keep (DiLoCoX, arXiv 2506.21263); Nesterov lr 0.7 "
                       "momentum 0.5 at the replica"};
  m.knobs = {{"bits", 4, "the factors' bits (DiLoCoX: int4)", {4, 8}},
             {"rank", static_cast<double>(d.rank), "initial rank r0 of every matrix (measured: docs/RESULTS.md)", {}},
             {"max_rank", static_cast<double>(d.adaptive_config.r_max), "adaptive: the largest rank", {}},
             {"adaptive", 1, "adaptive rank and H (DiLoCoX's AdaGC)", {0, 1}},
             {"error_feedback", 1, "keep what was not sent for the next round (DiLoCoX)", {0, 1}},
             error_decay_knob(d.error_decay, "1: nothing forgotten")};
  m.make = [](const KnobReader& k) -> AnyCompressor {
    LowRankCompressorConfig c;
    c.rank = k.integer("rank");
    c.factor_quant.bits = k.integer("bits");
    c.adaptive = k.flag("adaptive");
    c.error_feedback = k.flag("error_feedback");
    c.error_decay = k.real("error_decay");
    const int r_max = k.integer("max_rank");
    require(!c.adaptive || r_max >= c.rank, "dilocox",
            "max_rank " + std::to_string(r_max) + " is below rank " + std::to_string(c.rank));
    c.adaptive_config.r_max = std::max(r_max, c.rank);
    c.adaptive_config.r_min = std::min(c.adaptive_config.r_min, c.rank);
    return LowRankCompressor(c);
  };
  m.differs = "outer momentum at the replica, not on the mean (on the mean at 0.9: 13-21x AllReduce's loss on the "
              "MLPs); momentum 0.5; the adaptive rank rule is a reconstruction";
  return m;
}

inline std::deque<Method> builtin_methods() {
  std::deque<Method> t;
  t.push_back({.name = "allreduce",
               .help = "the fp32 gradient, averaged every step (the baseline)",
               .defaults = "every step, fp32 ring allreduce",
               .knobs = {{"bits", 32, "fp32 gradients", {32}}},
               .per_step = true,
               .overlap = false});
  t.push_back({.name = "diloco",
               .help = "every H steps the dense pseudo-gradient, bits 32|16|8|4",
               .defaults = "4-bit pseudo-gradient, overlap as Streaming DiLoCo (arXiv 2501.18512: reduce 1 step "
                           "before the turn, mix alpha 0.5, momentum on the mean); Nesterov outer step lr 0.7 "
                           "(DiLoCo, arXiv 2311.08105) with momentum 0.5, not 0.9 (measured: docs/RESULTS.md)",
               .knobs = {{"bits", 4, "the pseudo-gradient's bits (Streaming DiLoCo: 4)", {4, 8, 16, 32}},
                         {"error_feedback", 0, "keep what quantization lost (off: DiLoCo sends it as it is)", {0, 1}},
                         error_decay_knob(1, "1: nothing forgotten")},
               .make = [](const KnobReader& k) -> AnyCompressor {
                 DenseConfig c{.codec = dense_codec(k.integer("bits"))};
                 c.error_feedback = k.flag("error_feedback");
                 c.error_decay = k.real("error_decay");
                 return DenseCompressor(c);
               },
               .overlap_steps = 1,
               .momentum_at = MomentumAt::mean,
               .differs = "int4 not the paper's fp4 (not measured); momentum 0.5 not 0.9 (0.9: up to +19% loss on "
                          "the MLPs); consecutive fragments, not strided layers"});
  const CocktailConfig cc;
  t.push_back({.name = "cocktail",
               .help = "every H steps: random 10% x top 20% x int4 values, error feedback (CocktailSGD)",
               .defaults = "random 10% subset, top 20% of it, int4 values, error feedback (CocktailSGD, ICML 2023, "
                           "its README's ratios); one-step-delay overlap, Nesterov lr 0.7 momentum 0.5 at the replica",
               .knobs = {{"bits", 4, "the values' bits (CocktailSGD: 4)", {4, 8}},
                         {"random_fraction", cc.random_fraction, "share in the random subset (its README: 0.1)", {}},
                         {"topk_fraction", cc.topk_fraction, "share of the subset sent (its README: 0.2)", {}},
                         error_decay_knob(cc.error_decay, "1: nothing forgotten")},
               .make = [](const KnobReader& k) -> AnyCompressor {
                 CocktailConfig c;
                 c.quant.bits = k.integer("bits");
                 c.random_fraction = k.number("random_fraction");
                 c.topk_fraction = k.number("topk_fraction");
                 c.error_decay = k.real("error_decay");
                 return CocktailCompressor(c);
               },
               .differs = "every H steps with a Nesterov step, not every step with lr 1; fresh random subsets; "
                          "4-byte indices (2.6-4x the reference's bytes); an exact mean, not a re-compressing server"});
  const SparseLoCoConfig sc;
  t.push_back({.name = "sparseloco",
               .help = "every H steps: top-64 of each 64x64 tile, 2-bit values, decayed error feedback (SparseLoCo)",
               .defaults = "top-64 per tile of up to 64 x 64 (biases whole), 2-bit values in a per-tensor 4-bin "
                           "codebook, error feedback decayed by 0.95 in place of outer momentum, plain averaged "
                           "outer step lr 1, replicas restart from the global model (SparseLoCo, arXiv "
                           "2508.15706); overlap on",
               .knobs = {{"bits", 2, "the values: a 4-bin codebook (the reference's)", {2}},
                         {"k", static_cast<double>(sc.k), "kept per tile (the reference's topk 64)", {}},
                         error_decay_knob(sc.error_decay, "the accumulator's beta (the paper: 0.95)"),
                         {"keep_residual", 0, "1: a replica keeps beta e locally instead of restarting", {0, 1}},
                         {"average_chosen", 0, "1: the reference code's per-position mean with median norms", {0, 1}}},
               .make = [](const KnobReader& k) -> AnyCompressor {
                 SparseLoCoConfig c;
                 const int kept = k.integer("k");
                 require(kept >= 1, "sparseloco", "k must be >= 1");
                 c.k = static_cast<std::uint32_t>(kept);
                 c.error_decay = k.real("error_decay");
                 c.keep_residual = k.flag("keep_residual");
                 c.average_chosen = k.flag("average_chosen");
                 return SparseLoCoCompressor(c);
               },
               .differs = "the mean is sum / R (the paper), not the reference code's per-position mean with median "
                          "norm clipping; restarting from theta fails on least squares (keep_residual converges "
                          "there)"});
  t.push_back(dilocox_method());
  return t;
}
}  // namespace detail

}  // namespace dilocox
