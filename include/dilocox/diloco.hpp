// dilocox/diloco.hpp: OuterLoop<C>, the DiLoCoX round protocol (DESIGN.md 2) over a
// list of host parameter tensors, for any trainer and any compressor:
//   after every inner step:  loop.step();     (syncs when a fragment's turn comes)
//   at the end:              loop.finish();   (phi = the final global parameters)
// A sync of fragment f: delta = anchor - phi; NaN/Inf check and status exchange; the
// compressor reduces delta in the background; with overlap, the fragment's previous
// mean is applied by the outer step and phi rebased (keep local progress, overwrite or
// blend); without, this sync's mean is applied at once and phi set to theta. With
// F fragments (Streaming DiLoCo) fragment f syncs after step ceil((f + 1) H / F) of
// each round of H steps. H is agreed: it comes only from what every replica sees
// identically (the compressor's hint from reduced data, modelled link seconds), never
// from a clock. The communicator belongs to the loop until finish(): reductions run on
// a background thread. Not here: the inner optimizer, the model, printing.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dilocox/checksum.hpp"
#include "dilocox/comm/any.hpp"
#include "dilocox/comm/communicator.hpp"
#include "dilocox/comm/cost.hpp"
#include "dilocox/compress/compressor.hpp"
#include "dilocox/config.hpp"
#include "dilocox/named_tensor.hpp"
#include "dilocox/outer.hpp"
#include "dilocox/overlap.hpp"
#include "dilocox/state.hpp"
#include "dilocox/tensor.hpp"

namespace dilocox {

enum class Rebase : std::uint8_t { keep, overwrite, blend, mix };

// What an OuterLoop holds, in bytes (OuterLoop::memory()).
struct OuterMemory {
  std::uint64_t global = 0;      // theta, the global parameters
  std::uint64_t anchor = 0;      // each pseudo-gradient's origin
  std::uint64_t momentum = 0;    // the outer optimizer's momentum
  std::uint64_t workspace = 0;   // the syncs' buffers: two pseudo-gradient slots and the mean (12 bytes a parameter)
  std::uint64_t compressor = 0;  // the compressor's state (error feedback, projector)
  std::uint64_t total() const { return global + anchor + momentum + workspace + compressor; }
};

// What an OuterLoop over tensors `specs` with `compressor` will hold, before building it
// (planning: what OuterLoop::memory() then counts from its buffers).
inline OuterMemory outer_memory(std::span<const TensorSpec> specs, const AnyCompressor& compressor,
                                MomentumStorage momentum = MomentumStorage::fp32) {
  std::uint64_t n = 0;
  for (const auto& s : specs) n += s.shape.numel();
  return {.global = 4 * n, .anchor = 4 * n, .momentum = (momentum == MomentumStorage::bf16 ? 2 : 4) * n,
          .workspace = 12 * n, .compressor = compressor.state_bytes(specs).value_or(0)};
}

inline const char* to_string(Rebase r) {
  return r == Rebase::keep ? "keep" : r == Rebase::overwrite ? "overwrite" : r == Rebase::blend ? "blend" : "mix";
}

// Where the outer momentum runs. replica: each replica applies it to its own
// pseudo-gradient before compression, error feedback carries the momentum step, and
// theta moves by lr x the mean of what was sent; with lossless syncs this is DiLoCo's
// theta, and with lossy ones what compression drops is sent later once instead of being
// amplified by momentum. mean: DiLoCo's published form, momentum on the reduced mean;
// with compressed or overlapped syncs it diverged at momentum 0.9 (docs/RESULTS.md).
enum class MomentumAt : std::uint8_t { replica, mean };

inline const char* to_string(MomentumAt m) { return m == MomentumAt::replica ? "replica" : "mean"; }

struct OuterLoopConfig {
  int local_steps = 50;       // H0: inner steps per round at the compressor's initial setting (DiLoCo: 50-500)
  int min_local_steps = 1;    // clamps of H when the compressor asks for another (adaptive) or the
  int max_local_steps = 1000; //   overlap floor binds
  int fragments = 1;          // F: streaming fragments, each synced once per round, staggered
  bool overlap = true;        // one-step delay (DiLoCoX): reduce a sync behind the next round's compute
  // tau (Streaming DiLoCo): a fragment's reduction starts tau inner steps before its turn
  // and is applied at its turn, then merged by Rebase::mix; 0: none. Needs overlap off;
  // H is kept >= (tau + 1) F so that one reduction at a time is in flight.
  int overlap_steps = 0;
  Rebase rebase = Rebase::keep;  // after a sync: phi <- theta - what theta lacks of this replica (keep), theta, or a blend
  float blend = 0.5f;         // the share kept, for Rebase::blend; alpha for Rebase::mix
  MomentumAt momentum_at = MomentumAt::replica;  // the form that converged at momentum 0.9 with compressed syncs
  std::optional<NesterovConfig> outer{};  // unset: the compressor's outer_step(), else NesterovConfig{}
  // The outer momentum's storage: bf16 halves it (2 bytes a parameter); its loss effect on
  // the convergence suite is in docs/RESULTS.md. fp32 by default.
  MomentumStorage momentum_storage = MomentumStorage::fp32;
  double step_seconds = 0;    // modelled seconds of one inner step, for the overlap floor of H; 0: no floor
  std::optional<LinkConfig> link{};  // the link that floor uses; unset: the communicator's link(), if any
  std::uint64_t seed = 0;     // folded into the fingerprint replicas compare (same on every replica)
  // Replicas must start from the same weights (checked by checksum at construction).
  // A loop that will load_state() (resume) may start from unequal phi: set this to
  // defer the check to the first sync, which load_state() then waives.
  bool defer_start_check = false;
  std::function<void(const std::string&)> log{};  // events (dropped replicas); none by default
  // A loop over one shard of a data-parallel group (dilocox/shard.hpp): the sum over the
  // group of a few numbers, the same bits on every rank (shard.hpp's group_sum()). Called
  // at the end of each round on every rank of the group, so that the group agrees on H:
  // the compressor's hints and the modelled link seconds of every shard. Unset: alone.
  std::function<void(std::span<double>)> group_sum{};
};

struct DroppedReplica {
  int replica;
  std::string tensor;  // the first tensor with a NaN/Inf
};

// One sync of one fragment (with one fragment: one outer round).
struct SyncStats {
  std::uint64_t sync = 0;          // index of the sync applied (0, 1, ... over the whole run)
  std::uint64_t round = 0;         // the round it was started in
  int fragment = 0;
  int local_steps = 0;             // H of the round now running
  double low_rank = 0;             // mean rank of the tensors sent low rank (0: none)
  std::uint64_t wire_bytes = 0;    // what this rank put on the wire for the sync
  std::uint64_t fp32_sync_bytes = 0;     // an fp32 ring allreduce of the same pseudo-gradient, once
  std::uint64_t allreduce_step_bytes = 0;  // an fp32 gradient allreduce after each step the sync covers
  double ratio_vs_fp32_sync = 0;         // fp32_sync_bytes / wire_bytes: what compression alone saves
  double ratio_vs_allreduce_steps = 0;   // allreduce_step_bytes / wire_bytes: against per-step AllReduce
  int steps = 0;                   // inner steps the sync covers
  double comm_seconds = 0;         // the reduction's duration (background)
  double wait_seconds = 0;         // time the trainer was blocked on it
  double hidden_seconds = 0;       // comm_seconds - wait_seconds, >= 0
  int contributors = 0;
  std::vector<DroppedReplica> dropped;
};

template <Communicator C>
class OuterLoop {
 public:
  OuterLoop(C& comm, std::vector<NamedTensor> params, AnyCompressor compressor, OuterLoopConfig config = {})
      : comm_(&comm), any_(comm), params_(std::move(params)), compressor_(std::move(compressor)),
        config_(std::move(config)) {
    validate();
    std::vector<TensorSpec> specs;
    for (const auto& p : params_) specs.push_back({p.name, p.shape});
    compressor_.setup(specs);
    outer_config_ = config_.outer ? *config_.outer : compressor_.outer_step().value_or(NesterovConfig{});
    warn_unsafe_settings();
    check_replicas_agree();
    for (const auto& p : params_) {
      theta_.emplace_back(p.data.begin(), p.data.end());
      anchor_.emplace_back(p.data.begin(), p.data.end());
      outer_.emplace_back(p.data.size(), outer_config_, config_.momentum_storage);
    }
    make_fragments();
    local_steps_ = config_.local_steps;
  }
  OuterLoop(const OuterLoop&) = delete;
  OuterLoop& operator=(const OuterLoop&) = delete;
  ~OuterLoop() { background_.drain(); }

  int local_steps() const { return local_steps_; }             // H of the round now running
  int step_in_round() const { return step_in_round_; }
  std::uint64_t round() const { return round_; }
  int fragments() const { return static_cast<int>(fragments_.size()); }
  std::string describe() const { return compressor_.describe(); }
  const OuterLoopConfig& config() const { return config_; }
  const NesterovConfig& outer_config() const { return outer_config_; }
  AnyCompressor& compressor() { return compressor_; }
  // The global parameters theta of tensor i (identical on every replica).
  std::span<const float> global(std::size_t i) const { return theta_[i]; }
  std::size_t tensor_count() const { return params_.size(); }
  // The tensors of fragment f (indices into the constructor's list).
  std::span<const std::size_t> fragment_tensors(int f) const { return fragments_[static_cast<std::size_t>(f)].tensors; }
  // The outer state this loop holds, in bytes by component, counted from its buffers
  // (the compressor's from its state_bytes(): error feedback, projector state).
  OuterMemory memory() const {
    OuterMemory m;
    std::vector<TensorSpec> specs;
    for (std::size_t t = 0; t < params_.size(); ++t) {
      m.global += 4 * theta_[t].capacity();
      m.anchor += 4 * anchor_[t].capacity();
      m.momentum += outer_[t].state_bytes();
      specs.push_back({params_[t].name, params_[t].shape});
    }
    for (const auto& f : fragments_) {
      for (const auto& b : f.mean) m.workspace += 4 * b.capacity();
      for (const auto& slot : f.slots)
        for (const auto& b : slot.x) m.workspace += 4 * b.capacity();
    }
    m.compressor = compressor_.state_bytes(specs).value_or(0);
    return m;
  }

  // The tensors whose phi the last step(), end_round() or finish() wrote (indices into
  // the constructor's list): what a data-parallel group sharing this loop must pass on
  // (dilocox/shard.hpp).
  std::span<const std::size_t> rewritten() const { return rewritten_; }

  // Whether the next step() syncs (a trainer with parameters elsewhere, e.g. on a GPU,
  // brings them to the host first), and which fragment syncs next.
  bool next_step_syncs() const {
    const int tau = config_.overlap_steps, f = in_flight();
    return (next_fragment_ < fragments() && step_in_round_ + 1 >= boundary(next_fragment_) - tau) ||
           (f >= 0 && tau > 0 && step_in_round_ + 1 >= boundary(f));
  }
  int next_fragment() const { return next_fragment_ < fragments() ? next_fragment_ : 0; }  // next to start

  // Call after every inner step. Syncs the fragments whose turn it is; returns the
  // syncs applied (empty on most steps). When it returns anything, phi has changed.
  std::vector<SyncStats> step() {
    rewritten_.clear();
    for (auto& f : fragments_) ++f.steps;
    ++step_in_round_;
    std::vector<SyncStats> out;
    if (config_.overlap_steps > 0) {
      stream(out);
    } else {
      while (next_fragment_ < fragments() && step_in_round_ >= boundary(next_fragment_)) sync_next(out);
    }
    if (step_in_round_ >= local_steps_) new_round();
    return out;
  }

  // The round's remaining steps were taken (for trainers that count H themselves):
  // syncs every fragment not yet synced this round, and starts the next round.
  std::vector<SyncStats> end_round() {
    rewritten_.clear();
    for (auto& f : fragments_) f.steps += local_steps_ - step_in_round_;
    step_in_round_ = local_steps_;
    std::vector<SyncStats> out;
    if (config_.overlap_steps > 0) {
      stream(out);  // applies the fragment in flight, starts the rest
      while (in_flight() >= 0) stream(out);
    } else {
      while (next_fragment_ < fragments()) sync_next(out);
    }
    new_round();
    return out;
  }

  // Applies every reduction in flight, syncs the progress made since each fragment's
  // last sync (without delay), and sets phi to the final global parameters. Call once
  // at the end, on every replica after the same number of steps.
  std::vector<SyncStats> finish() {
    rewritten_.clear();
    std::vector<SyncStats> out;
    for (int i = 0; i < fragments(); ++i) {  // oldest first: the queue's order
      const int f = (next_fragment_ + i) % fragments();
      if (!fragments_[static_cast<std::size_t>(f)].pending) continue;
      out.push_back(apply(f));
      if (config_.overlap_steps > 0) merge(f);  // its anchor moves to theta, as at its turn
    }
    for (int f = 0; f < fragments(); ++f) {
      Fragment& fr = fragments_[static_cast<std::size_t>(f)];
      if (fr.steps > 0) {
        start(f);
        out.push_back(apply(f));
      }
      set_phi_to_theta(fr);
      copy_anchor(fr);
    }
    return out;
  }

  // Checkpoints, at any step. save_state() waits for the reductions in flight without
  // applying them; load_state() on a loop built with the same tensors, compressor and
  // configuration (before its first step) continues exactly where the saved one was.
  // The trainer's own parameters (phi) and inner optimizer are the trainer's to save.
  std::vector<std::byte> save_state() {
    while (background_.pending() > 0) completed_.push_back(background_.wait());
    StateWriter w;
    w.value(state_tag);
    w.value<std::uint64_t>(params_.size());
    w.value<std::int32_t>(fragments());
    w.value(round_);
    w.value(next_sync_);
    w.value<std::int32_t>(local_steps_);
    w.value<std::int32_t>(step_in_round_);
    w.value<std::int32_t>(next_fragment_);
    w.value(hint_sum_), w.value(hint_weight_), w.value(round_comm_seconds_);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      w.values(std::span<const float>(theta_[i]));
      w.values(std::span<const float>(anchor_[i]));
      outer_[i].save_state(w);
    }
    compressor_.save_state(w);
    std::size_t done = 0;
    for (const auto& fr : fragments_) {
      w.value<std::int32_t>(fr.steps);
      w.value<std::uint64_t>(fr.syncs);
      w.value<std::uint8_t>(fr.self_dropped ? 1 : 0);
      w.value<std::uint8_t>(fr.pending ? 1 : 0);
    }
    for (int i = 0; i < fragments(); ++i) {  // the completed reductions, oldest first
      const Fragment& fr = fragments_[static_cast<std::size_t>((next_fragment_ + i) % fragments())];
      if (fr.pending) save_slot(w, fr, fr.slots[(fr.syncs - 1) % 2], completed_[done++].ran_seconds);
    }
    return w.bytes();
  }

  // This replica starts over from the global parameters, as a site does that joins a
  // running group with another replica's state (dilocox/comm/elastic.hpp): phi and every
  // sync anchor become theta, and what the state's replica still owed (the compressor's
  // error feedback) is dropped; the outer momentum is kept. Only with no reduction in
  // flight (overlap off, or before the first sync).
  void restart_from_global() {
    const bool idle = background_.pending() == 0 &&
                      std::none_of(fragments_.begin(), fragments_.end(), [](const Fragment& f) { return f.pending; });
    detail::require(idle, "OuterLoop::restart_from_global", "a reduction is in flight (overlapped syncs): not possible");
    detail::require(compressor_.forget_owed(), "OuterLoop::restart_from_global",
                    "compressor '" + compressor_.describe() + "' keeps state but has no forget_owed()");
    rewritten_.clear();
    for (std::size_t t = 0; t < params_.size(); ++t) {
      std::copy(theta_[t].begin(), theta_[t].end(), params_[t].data.begin());
      std::copy(theta_[t].begin(), theta_[t].end(), anchor_[t].begin());
      rewritten_.push_back(t);
    }
  }

  void load_state(std::span<const std::byte> bytes) {
    detail::require(background_.pending() == 0 && completed_.empty() && round_ == 0 && next_sync_ == 0,
                    "OuterLoop::load_state", "load state into a freshly built loop, before its first step");
    StateReader r(bytes);
    detail::require(r.value<std::uint64_t>() == state_tag, "OuterLoop::load_state", "not an OuterLoop state");
    detail::require(r.value<std::uint64_t>() == params_.size(), "OuterLoop::load_state",
                    "the state has another number of tensors");
    detail::require(r.value<std::int32_t>() == fragments(), "OuterLoop::load_state",
                    "the state has another number of fragments");
    unequal_start_.clear();  // resumed: phi legitimately differs between replicas
    round_ = r.value<std::uint64_t>();
    next_sync_ = r.value<std::uint64_t>();
    local_steps_ = r.value<std::int32_t>();
    step_in_round_ = r.value<std::int32_t>();
    next_fragment_ = r.value<std::int32_t>();
    hint_sum_ = r.value<double>(), hint_weight_ = r.value<double>(), round_comm_seconds_ = r.value<double>();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      r.values(std::span<float>(theta_[i]));
      r.values(std::span<float>(anchor_[i]));
      outer_[i].load_state(r);
    }
    compressor_.load_state(r);
    for (auto& fr : fragments_) {
      fr.steps = r.value<std::int32_t>();
      fr.syncs = r.value<std::uint64_t>();
      fr.self_dropped = r.value<std::uint8_t>() != 0;
      fr.pending = r.value<std::uint8_t>() != 0;
    }
    for (int i = 0; i < fragments(); ++i) {
      Fragment& fr = fragments_[static_cast<std::size_t>((next_fragment_ + i) % fragments())];
      if (!fr.pending) continue;
      detail::require(fr.syncs > 0, "OuterLoop::load_state", "a pending reduction before the first sync");
      ReductionTiming t;
      t.ran_seconds = load_slot(r, fr, fr.slots[(fr.syncs - 1) % 2]);
      completed_.push_back(t);
    }
    detail::require(r.done(), "OuterLoop::load_state", "trailing bytes in the state");
  }

 private:
  static constexpr std::uint64_t state_tag = 0x3230524554554f44ULL;  // "DOUTER02"

  // One sync's buffers, the reduction's from its launch until applied. x: the
  // pseudo-gradient (or momentum step), which the rebase reads before the launch; the
  // compressor then leaves in it what this replica still owes. Two per fragment: the
  // rebase after a one-step-delayed sync reads the previous sync's debt and this one's step.
  struct Slot {
    std::vector<std::vector<float>> x;      // (fragment tensors)
    int self_bad = -1;                      // first non-finite tensor (global index) of this replica
    std::uint64_t sync = 0, round = 0;
    int steps = 0;
    SyncReport report;
    std::vector<DroppedReplica> dropped;
  };
  struct Fragment {
    std::vector<std::size_t> tensors;
    std::size_t elements = 0;
    Slot slots[2];
    // (fragment tensors) the reduced mean of the sync in flight: one is enough, since a
    // fragment's reduction is applied before its next one is launched
    std::vector<std::vector<float>> mean;
    int steps = 0;            // inner steps since its last sync
    std::uint64_t syncs = 0;  // syncs started
    bool pending = false;     // a started reduction not yet applied
    bool self_dropped = false;
  };

  void validate() const {
    detail::require(!params_.empty(), "OuterLoop", "no parameters");
    detail::require(config_.local_steps >= 1, "OuterLoop", "local_steps must be >= 1");
    detail::require(config_.min_local_steps >= 1 && config_.min_local_steps <= config_.max_local_steps, "OuterLoop",
                    "need 1 <= min_local_steps <= max_local_steps");
    detail::require(config_.local_steps >= config_.min_local_steps && config_.local_steps <= config_.max_local_steps,
                    "OuterLoop", "local_steps must be within [min_local_steps, max_local_steps]");
    detail::require(config_.fragments >= 1 && static_cast<std::size_t>(config_.fragments) <= params_.size(),
                    "OuterLoop", "fragments must be in [1, number of tensors = " + std::to_string(params_.size()) + "]");
    detail::require(config_.blend >= 0 && config_.blend <= 1, "OuterLoop", "blend must be in [0, 1]");
    if (config_.overlap_steps != 0) {
      detail::require(config_.overlap_steps > 0 && !config_.overlap, "OuterLoop",
                      "overlap_steps (Streaming DiLoCo) must be >= 0 and needs overlap (the one-step delay) off");
      detail::require(config_.rebase == Rebase::mix || config_.rebase == Rebase::overwrite, "OuterLoop",
                      "overlap_steps merges the delayed update as Streaming DiLoCo: rebase must be mix or overwrite");
      const int floor = (config_.overlap_steps + 1) * config_.fragments;  // one reduction in flight at a time
      detail::require(config_.local_steps >= floor && config_.max_local_steps >= floor, "OuterLoop",
                      "overlap_steps " + std::to_string(config_.overlap_steps) +
                          " needs local_steps and max_local_steps >= (overlap_steps + 1) x fragments = " +
                          std::to_string(floor));
    }
    detail::require(std::isfinite(config_.step_seconds) && config_.step_seconds >= 0, "OuterLoop",
                    "step_seconds must be finite and >= 0");
    for (const auto& p : params_)
      detail::require(p.data.size() == p.shape.numel(), "OuterLoop",
                      "tensor '" + p.name + "' has " + std::to_string(p.data.size()) + " elements, shape " +
                          p.shape.str() + " says " + std::to_string(p.shape.numel()));
  }

  // F fragments of consecutive tensors with about equal element counts.
  void make_fragments() {
    std::size_t total = 0;
    for (const auto& p : params_) total += p.data.size();
    fragments_.resize(static_cast<std::size_t>(config_.fragments));
    std::size_t f = 0, acc = 0;
    const std::size_t n = params_.size(), frags = fragments_.size();
    for (std::size_t i = 0; i < n; ++i) {
      // Next fragment once this one holds its share, or when every later fragment
      // needs one of the tensors left.
      if (!fragments_[f].tensors.empty() && f + 1 < frags && (acc >= total * (f + 1) / frags || n - i <= frags - f - 1))
        ++f;
      fragments_[f].tensors.push_back(i);
      fragments_[f].elements += params_[i].data.size();
      acc += params_[i].data.size();
    }
    for (auto& fr : fragments_)
      for (std::size_t t : fr.tensors) {
        const std::size_t n = params_[t].data.size();
        fr.mean.emplace_back(n, 0.0f);
        for (auto& slot : fr.slots) slot.x.emplace_back(n, 0.0f);
      }
  }

  // Fragment f syncs once the round has run this many steps.
  int boundary(int f) const {
    const long h = local_steps_, n = fragments();
    return static_cast<int>(((f + 1) * h + n - 1) / n);
  }

  // Streaming DiLoCo's schedule: the fragment in flight is applied and merged at its
  // turn; the next one starts tau steps before its own.
  void stream(std::vector<SyncStats>& out) {
    const int f = in_flight();
    if (f >= 0 && step_in_round_ >= boundary(f)) {
      out.push_back(apply(f));
      merge(f);
    }
    if (in_flight() < 0 && next_fragment_ < fragments() &&
        step_in_round_ >= boundary(next_fragment_) - config_.overlap_steps)
      start(next_fragment_++);
  }
  void merge(int f) {
    const Fragment& fr = fragments_[static_cast<std::size_t>(f)];
    rebase(fr, nullptr, nullptr);
    copy_anchor(fr);
  }
  int in_flight() const {
    for (int f = 0; f < fragments(); ++f)
      if (fragments_[static_cast<std::size_t>(f)].pending) return f;
    return -1;
  }

  void sync_next(std::vector<SyncStats>& out) {
    const int f = next_fragment_++;
    Fragment& fr = fragments_[static_cast<std::size_t>(f)];
    const bool had_pending = fr.pending;
    std::optional<SyncStats> applied;
    if (config_.overlap && had_pending) applied = apply(f);  // the previous sync of f, one round late
    const Slot* previous = had_pending ? &fr.slots[(fr.syncs - 1) % 2] : nullptr;
    Slot& slot = prepare(f);
    if (config_.overlap) {  // theta lacks this sync and what the previous one left owed
      rebase(fr, &slot, had_pending ? previous : nullptr);
      launch(fr, slot);
    } else {                // theta lacks what this sync left owed
      launch(fr, slot);
      applied = apply(f);
      rebase(fr, nullptr, &slot);
    }
    copy_anchor(fr);
    if (applied) out.push_back(std::move(*applied));
  }

  // Fragment f's next sync, started: prepare() then launch().
  Slot& start(int f) {
    Slot& slot = prepare(f);
    launch(fragments_[static_cast<std::size_t>(f)], slot);
    return slot;
  }
  // x = anchor - phi for fragment f (with momentum at the replica: its momentum step).
  Slot& prepare(int f) {
    check_start();
    Fragment& fr = fragments_[static_cast<std::size_t>(f)];
    Slot& slot = fr.slots[fr.syncs % 2];
    slot.self_bad = -1;
    for (std::size_t j = 0; j < fr.tensors.size(); ++j) {
      const std::size_t t = fr.tensors[j];
      auto& d = slot.x[j];
      const auto phi = params_[t].data;
      for (std::size_t i = 0; i < d.size(); ++i) d[i] = anchor_[t][i] - phi[i];
      if (slot.self_bad < 0 && !all_finite(d)) slot.self_bad = static_cast<int>(t);
    }
    if (config_.momentum_at == MomentumAt::replica && slot.self_bad < 0)
      for (std::size_t j = 0; j < fr.tensors.size(); ++j) outer_[fr.tensors[j]].momentum_direction(slot.x[j]);
    slot.sync = next_sync_++;
    slot.round = round_;
    slot.steps = fr.steps;
    fr.steps = 0;
    ++fr.syncs;
    fr.pending = true;
    return slot;
  }
  // The prepared sync's reduction, in the background: slot.x and fr.mean are its until applied.
  void launch(Fragment& fr, Slot& slot) {
    background_.start([this, &fr, &slot] { run_reduction(fr, slot); });
  }

  static bool all_finite(std::span<const float> v) {
    for (float x : v)
      if (!std::isfinite(x)) return false;
    return true;
  }

  // Runs on the background thread: status exchange, then the compressor's sync.
  void run_reduction(Fragment& fr, Slot& slot) {
    const int k = comm_->size();
    const std::int32_t bad = slot.self_bad;
    std::vector<std::int32_t> all(static_cast<std::size_t>(k));
    comm_->allgather(std::as_bytes(std::span(&bad, 1)), std::as_writable_bytes(std::span(all)));
    std::vector<std::uint8_t> contributes(static_cast<std::size_t>(k), 0);
    slot.dropped.clear();
    for (int r = 0; r < k; ++r) {
      const std::int32_t rb = all[static_cast<std::size_t>(r)];
      if (rb < 0) {
        contributes[static_cast<std::size_t>(r)] = 1;
        continue;
      }
      const std::string name = rb < static_cast<std::int32_t>(params_.size()) ? params_[rb].name : "?";
      slot.dropped.push_back({r, name});
      if (config_.log)
        config_.log("dilocox: sync " + std::to_string(slot.sync) + " (round " + std::to_string(slot.round) +
                    "): replica " + std::to_string(r) + " dropped, tensor '" + name +
                    "' has NaN/Inf in its pseudo-gradient");
    }
    if (bad >= 0)  // this replica sends zeros and is left out of the mean
      for (auto& d : slot.x) std::fill(d.begin(), d.end(), 0.0f);
    std::vector<std::span<float>> x, out;
    for (std::size_t j = 0; j < fr.tensors.size(); ++j) x.emplace_back(slot.x[j]), out.emplace_back(fr.mean[j]);
    slot.report = compressor_.sync(any_, {fr.tensors, contributes, slot.sync}, x, out);
    slot.report.cost += ring_allgather_cost(sizeof(std::int32_t), k);
  }

  // Waits for the oldest reduction (fragment f's), applies its mean to theta, returns stats.
  SyncStats apply(int f) {
    Fragment& fr = fragments_[static_cast<std::size_t>(f)];
    Slot& slot = fr.slots[(fr.syncs - 1) % 2];  // the pending one: started last for f
    ReductionTiming timing;
    if (!completed_.empty()) {
      timing = completed_.front();
      completed_.pop_front();
    } else {
      timing = background_.wait();
    }
    fr.pending = false;
    if (slot.report.contributors > 0)
      for (std::size_t j = 0; j < fr.tensors.size(); ++j) {
        auto& outer = outer_[fr.tensors[j]];
        if (config_.momentum_at == MomentumAt::replica) outer.descend(theta_[fr.tensors[j]], fr.mean[j]);
        else outer.step(theta_[fr.tensors[j]], fr.mean[j]);
      }
    fr.self_dropped = slot.self_bad >= 0;
    return stats_of(fr, f, slot, timing);
  }

  SyncStats stats_of(const Fragment& fr, int f, const Slot& slot, const ReductionTiming& timing) {
    SyncStats s;
    s.sync = slot.sync, s.round = slot.round, s.fragment = f, s.steps = slot.steps;
    s.contributors = slot.report.contributors;
    s.dropped = slot.dropped;
    s.low_rank = slot.report.low_rank;
    s.wire_bytes = slot.report.cost.bytes;
    s.fp32_sync_bytes = ring_allreduce_cost(fr.elements * 4, comm_->size()).bytes;
    s.allreduce_step_bytes = s.fp32_sync_bytes * static_cast<std::uint64_t>(slot.steps);
    if (s.wire_bytes) {
      s.ratio_vs_fp32_sync = static_cast<double>(s.fp32_sync_bytes) / static_cast<double>(s.wire_bytes);
      s.ratio_vs_allreduce_steps = static_cast<double>(s.allreduce_step_bytes) / static_cast<double>(s.wire_bytes);
    }
    s.comm_seconds = timing.ran_seconds;
    s.wait_seconds = timing.waited_seconds;
    s.hidden_seconds = timing.hidden_seconds();
    s.local_steps = local_steps_;
    // For the next round's H: the compressor's hint and the modelled link time.
    if (slot.report.local_steps_weight > 0)
      hint_sum_ += slot.report.local_steps_scale * slot.report.local_steps_weight,
          hint_weight_ += slot.report.local_steps_weight;
    if (const auto link = link_config()) round_comm_seconds_ += link_seconds(slot.report.cost, *link);
    return s;
  }

  std::optional<LinkConfig> link_config() const {
    if (config_.link) return config_.link;
    if constexpr (requires(const C& c) { { c.link() } -> std::convertible_to<LinkConfig>; })
      return comm_->link();
    return std::nullopt;
  }

  // The next round: H from agreed quantities only (DESIGN.md 2.6).
  void new_round() {
    if (config_.group_sum) {
      double v[3] = {hint_sum_, hint_weight_, round_comm_seconds_};
      config_.group_sum(v);
      hint_sum_ = v[0], hint_weight_ = v[1], round_comm_seconds_ = v[2];
    }
    int h = config_.local_steps;
    if (hint_weight_ > 0) h = static_cast<int>(std::lround(config_.local_steps * hint_sum_ / hint_weight_));
    int lo = config_.min_local_steps;
    if (config_.overlap_steps > 0) lo = std::max(lo, (config_.overlap_steps + 1) * fragments());  // one in flight
    if (config_.step_seconds > 0 && round_comm_seconds_ > 0)  // the overlap floor, from modelled seconds
      lo = std::max(lo, static_cast<int>(std::min<double>(config_.max_local_steps,
                                                          std::ceil(round_comm_seconds_ / config_.step_seconds))));
    local_steps_ = std::clamp(h, lo, config_.max_local_steps);
    hint_sum_ = hint_weight_ = round_comm_seconds_ = 0;
    step_in_round_ = 0;
    next_fragment_ = 0;
    ++round_;
  }

  // mix: phi = (1 - alpha) theta + alpha phi, and the anchor is theta (Streaming DiLoCo).
  // Otherwise phi = theta - a (delta of `current` + what `owed` left owed), where theta will be
  // once this replica's part lands, as far as the replica knows (keep: a = 1, or the
  // outer lr with momentum at the replica, whose steps theta takes times lr; blend: that
  // times the blend; overwrite: phi = theta). A replica dropped now or last time
  // restarts from theta.
  void rebase(const Fragment& fr, const Slot* current, const Slot* owed) {
    rewritten_.insert(rewritten_.end(), fr.tensors.begin(), fr.tensors.end());
    const bool reset = config_.rebase == Rebase::overwrite || (current && current->self_bad >= 0) || fr.self_dropped;
    if (config_.rebase == Rebase::mix && !reset) {  // Streaming DiLoCo: phi = (1 - alpha) theta + alpha phi
      for (std::size_t t : fr.tensors)
        for (std::size_t i = 0; i < theta_[t].size(); ++i)
          params_[t].data[i] = (1 - config_.blend) * theta_[t][i] + config_.blend * params_[t].data[i];
      return;
    }
    const float a = (config_.rebase == Rebase::blend ? config_.blend : 1.0f) *
                    (config_.momentum_at == MomentumAt::replica ? outer_config_.lr : 1.0f);
    for (std::size_t j = 0; j < fr.tensors.size(); ++j) {
      const std::size_t t = fr.tensors[j];
      const auto phi = params_[t].data;
      const auto& th = theta_[t];
      std::copy(th.begin(), th.end(), phi.begin());
      if (reset) continue;
      if (current)
        for (std::size_t i = 0; i < phi.size(); ++i) phi[i] -= a * current->x[j][i];
      if (owed)
        for (std::size_t i = 0; i < phi.size(); ++i) phi[i] -= a * owed->x[j][i];
    }
  }
  void set_phi_to_theta(const Fragment& fr) {
    rewritten_.insert(rewritten_.end(), fr.tensors.begin(), fr.tensors.end());
    for (std::size_t t : fr.tensors) std::copy(theta_[t].begin(), theta_[t].end(), params_[t].data.begin());
  }
  void copy_anchor(const Fragment& fr) {  // the next pseudo-gradient's origin: phi, or theta (mix)
    for (std::size_t t : fr.tensors) {
      const auto& from = config_.rebase == Rebase::mix ? std::span<const float>(theta_[t]) : std::span<const float>(params_[t].data);
      std::copy(from.begin(), from.end(), anchor_[t].begin());
    }
  }

  void save_slot(StateWriter& w, const Fragment& fr, const Slot& s, double ran_seconds) const {
    w.value(s.sync), w.value(s.round);
    w.value<std::int32_t>(s.steps), w.value<std::int32_t>(s.self_bad);
    w.value(ran_seconds);
    w.value<std::int32_t>(s.report.contributors);
    w.value(s.report.low_rank), w.value(s.report.local_steps_scale), w.value(s.report.local_steps_weight);
    w.value(s.report.cost.bytes);
    w.value<std::int32_t>(s.report.cost.hops);
    w.value<std::uint64_t>(s.dropped.size());
    for (const auto& d : s.dropped) {
      w.value<std::int32_t>(d.replica);
      w.values(std::span<const char>(d.tensor.data(), d.tensor.size()));
    }
    for (const auto& m : fr.mean) w.values(std::span<const float>(m));
    for (const auto& x : s.x) w.values(std::span<const float>(x));  // what the sync left owed
  }
  double load_slot(StateReader& r, Fragment& fr, Slot& s) {
    s.sync = r.value<std::uint64_t>(), s.round = r.value<std::uint64_t>();
    s.steps = r.value<std::int32_t>(), s.self_bad = r.value<std::int32_t>();
    const double ran = r.value<double>();
    s.report.contributors = r.value<std::int32_t>();
    s.report.low_rank = r.value<double>();
    s.report.local_steps_scale = r.value<double>();
    s.report.local_steps_weight = r.value<double>();
    s.report.cost.bytes = r.value<std::uint64_t>();
    s.report.cost.hops = r.value<std::int32_t>();
    s.dropped.resize(r.value<std::uint64_t>());
    for (auto& d : s.dropped) {
      d.replica = r.value<std::int32_t>();
      const auto name = r.vector<char>();
      d.tensor.assign(name.begin(), name.end());
    }
    for (auto& m : fr.mean) r.values(std::span<float>(m));
    for (auto& x : s.x) r.values(std::span<float>(x));
    return ran;
  }

  // Every replica must hold the same tensors, configuration and initial values; a
  // mismatch is an Error naming the first differing tensor, on every rank (never a hang
  // in a later collective).
  void check_replicas_agree() {
    const int k = comm_->size();
    const std::size_t t = params_.size();
    auto hash_of = [](const std::string& s) {
      return checksum64({reinterpret_cast<const std::byte*>(s.data()), s.size()});
    };
    const std::string cfg = compressor_.describe() + "|H" + std::to_string(config_.local_steps) + "[" +
                            std::to_string(config_.min_local_steps) + "," + std::to_string(config_.max_local_steps) +
                            "]|F" + std::to_string(config_.fragments) + "|overlap" + std::to_string(config_.overlap) +
                            "," + std::to_string(config_.overlap_steps) +
                            "|" + to_string(config_.rebase) + std::to_string(config_.blend) + "|momentum at " +
                            to_string(config_.momentum_at) + "|outer" +
                            std::to_string(outer_config_.lr) + "," + std::to_string(outer_config_.momentum) + "," +
                            std::to_string(outer_config_.nesterov) + "," + to_string(config_.momentum_storage) +
                            "|seed" + std::to_string(config_.seed);
    std::vector<std::uint64_t> mine = {t, hash_of(cfg)};
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(k));
    comm_->allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
    for (int r = 0; r < k; ++r) {
      detail::require(all[2 * r] == t, "OuterLoop",
                      "replicas disagree on the number of tensors: rank " + std::to_string(comm_->rank()) + " has " +
                          std::to_string(t) + ", rank " + std::to_string(r) + " has " + std::to_string(all[2 * r]));
      detail::require(all[2 * r + 1] == mine[1], "OuterLoop",
                      "replicas disagree on the configuration (compressor '" + compressor_.describe() +
                          "', local steps, fragments, overlap, rebase, outer step, seed): rank " + std::to_string(r) +
                          " differs from rank " + std::to_string(comm_->rank()));
    }
    std::vector<std::uint64_t> per(2 * t), per_all(2 * t * static_cast<std::size_t>(k));
    for (std::size_t i = 0; i < t; ++i) {
      per[2 * i] = hash_of(params_[i].name + "|" + params_[i].shape.str());
      per[2 * i + 1] = checksum64(std::as_bytes(params_[i].data));
    }
    comm_->allgather(std::as_bytes(std::span(per)), std::as_writable_bytes(std::span(per_all)));
    for (std::size_t i = 0; i < t; ++i)
      for (int r = 0; r < k; ++r) {
        const std::string which = "tensor " + std::to_string(i) + " '" + params_[i].name + "' " + shape_in_memory(params_[i].shape);
        detail::require(per_all[2 * (r * t + i)] == per[2 * i], "OuterLoop",
                        "replicas disagree on " + which + ": rank " + std::to_string(r) + " has a different name or shape");
        if (per_all[2 * (r * t + i) + 1] != per[2 * i + 1] && unequal_start_.empty())
          unequal_start_ = "OuterLoop: replicas start from different weights: " + which + " differs between rank " +
                           std::to_string(r) + " and rank " + std::to_string(comm_->rank()) +
                           " (initialize every replica identically, e.g. from the same seed, or broadcast)";
      }
    if (!config_.defer_start_check && !unequal_start_.empty()) throw Error(unequal_start_);
  }

  // Settings measured unsafe on tests/convergence (docs/RESULTS.md), said through `log`.
  void warn_unsafe_settings() const {
    if (!config_.log || outer_config_.momentum <= 0.5f) return;
    const std::string mu = "dilocox: warning: outer momentum " + detail::number(outer_config_.momentum);
    std::vector<TensorSpec> specs;
    for (const auto& p : params_) specs.push_back({p.name, p.shape});
    const bool residual = compressor_.state_bytes(specs).value_or(1) > 0;  // error feedback re-sends what it kept
    if (config_.momentum_at == MomentumAt::mean && residual)
      config_.log(mu + " on the reduced mean, with a compressor that keeps a residual, diverged on tests/convergence "
                       "(low rank: docs/RESULTS.md); momentum_at = MomentumAt::replica runs it stably");
    if (config_.overlap)
      config_.log(mu + " with the one-step-delay overlap diverged (least squares, SGD inner steps) on "
                       "tests/convergence (docs/RESULTS.md); momentum 0.5, or overlap_steps (Streaming DiLoCo) "
                       "instead, ran it stably");
    if (config_.overlap_steps > 0)
      config_.log(mu + " with Streaming DiLoCo's overlap (overlap_steps) lost 11-18% of final loss against no "
                       "overlap on tests/convergence's MLPs, whatever alpha (docs/RESULTS.md); at momentum 0.5 "
                       "it lost at most 4.8%");
  }

  // A shape as the loop sees it, row-major, saying how a column-major matrix reads.
  static std::string shape_in_memory(const Shape& s) {
    if (s.ndim != 2) return s.str();
    return s.str() + " (memory order: a column-major (" + std::to_string(s.dims[1]) + ", " + std::to_string(s.dims[0]) +
           ") matrix is this)";
  }

  // The start-weight check, deferred to the first sync unless load_state() resumed.
  void check_start() {
    if (!unequal_start_.empty()) throw Error(unequal_start_);
  }

  C* comm_;
  AnyCommunicator any_;
  std::vector<NamedTensor> params_;
  AnyCompressor compressor_;
  OuterLoopConfig config_;
  NesterovConfig outer_config_;
  std::vector<std::vector<float>> theta_, anchor_;  // (tensors) global parameters, sync anchors
  std::vector<NesterovOuterOptimizer> outer_;
  std::vector<Fragment> fragments_;
  std::vector<std::size_t> rewritten_;  // tensors whose phi the last step wrote (may repeat)
  BackgroundReductions background_;
  std::deque<ReductionTiming> completed_;  // reductions waited for by save_state(), oldest first
  std::uint64_t round_ = 0, next_sync_ = 0;
  int local_steps_ = 1, step_in_round_ = 0, next_fragment_ = 0;
  double hint_sum_ = 0, hint_weight_ = 0, round_comm_seconds_ = 0;  // this round's, for the next H
  std::string unequal_start_;  // the start-weight mismatch found at construction, if any
};

}  // namespace dilocox
