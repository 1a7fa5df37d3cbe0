// dilocox/diloco.hpp: OuterLoop<C>, the DiLoCoX round protocol (DESIGN.md 2) for a
// list of host parameter tensors, usable from any trainer:
//   while training: loop.begin_round(); H = loop.local_steps() inner steps on phi;
//                   stats = loop.end_round();
//   at the end:     loop.finish();   (phi = the final global parameters)
// end_round(): delta = anchor - phi; NaN/Inf check and status exchange; compress and
// reduce in the background; with overlap, apply the *previous* round's mean with the
// Nesterov outer step and rebase phi (keep local progress, overwrite or blend);
// without, wait for this round's mean and set phi to the global parameters.
// The communicator belongs to the loop from construction to finish(): its reductions
// run on a background thread, so the trainer must not issue collectives on it meanwhile
// (use another communicator, e.g. a duplicate, for anything else).
// Not here: the inner optimizer and the model (the trainer's), any printing (events go
// to the optional log callback).
#pragma once

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dilocox/adaptive.hpp"
#include "dilocox/checksum.hpp"
#include "dilocox/comm/communicator.hpp"
#include "dilocox/comm/cost.hpp"
#include "dilocox/compressor.hpp"
#include "dilocox/config.hpp"
#include "dilocox/outer.hpp"
#include "dilocox/overlap.hpp"
#include "dilocox/quantize.hpp"
#include "dilocox/reduce.hpp"
#include "dilocox/state.hpp"

namespace dilocox {

enum class SyncMode : std::uint8_t { dense, cocktail, dilocox };
enum class Rebase : std::uint8_t { keep, overwrite, blend };

inline const char* to_string(SyncMode m) {
  return m == SyncMode::dense ? "dense" : m == SyncMode::cocktail ? "cocktail" : "dilocox";
}

struct OuterLoopConfig {
  SyncMode mode = SyncMode::dilocox;
  int local_steps = 50;               // H0: inner steps per round (at the initial rank)
  bool overlap = true;                // one-step-delay: reduce round t behind round t+1's compute
  Rebase rebase = Rebase::keep;       // with overlap: phi <- theta - delta (keep), theta, theta - a delta
  float blend = 0.5f;                 // a, for Rebase::blend
  NesterovConfig outer;               // lr 0.7, momentum 0.9, Nesterov
  ReduceAlgorithm algorithm = ReduceAlgorithm::allgather;
  Codec dense_codec{Encoding::f32, {}};  // SyncMode::dense: fp32 / fp16 / bf16 / int8 ...
  bool dense_error_feedback = false;
  CocktailConfig cocktail;            // SyncMode::cocktail
  LowRankCompressorConfig lowrank;    // SyncMode::dilocox (rank, factor bits, adaptive, ...)
  std::uint64_t seed = 0;             // same on every replica
  std::function<void(const std::string&)> log;  // events (dropped replicas); none by default
};

struct NamedTensor {
  std::string name;
  Shape shape;
  std::span<float> data;  // phi: the trainer's live parameters, host, shape.numel() floats
};

struct DroppedReplica {
  int replica;
  std::string tensor;  // the first tensor with a NaN/Inf
};

struct RoundStats {
  std::uint64_t round = 0;          // the reduction applied by this call
  int local_steps = 0;              // H for the next round
  double rank = 0;                  // mean low-rank rank used (dilocox), 0 otherwise
  std::uint64_t dense_bytes = 0;    // what an fp32 ring allreduce of the same tensors puts on the wire
  std::uint64_t wire_bytes = 0;     // what this rank put on the wire for the reduction
  double compression_ratio = 0;     // dense_bytes / wire_bytes
  double comm_seconds = 0;          // the reduction's duration (background)
  double wait_seconds = 0;          // time the trainer was blocked on it
  double hidden_seconds = 0;        // comm_seconds - wait_seconds, >= 0
  int contributors = 0;
  std::vector<DroppedReplica> dropped;
  bool applied = false;             // false when no reduction completed in this call
};

template <Communicator C>
class OuterLoop {
 public:
  OuterLoop(C& comm, std::vector<NamedTensor> params, OuterLoopConfig config)
      : comm_(&comm), params_(std::move(params)), config_(std::move(config)) {
    detail::require(!params_.empty(), "OuterLoop", "no parameters");
    detail::require(config_.local_steps >= 1, "OuterLoop", "local_steps must be >= 1");
    detail::require(config_.blend >= 0 && config_.blend <= 1, "OuterLoop", "blend must be in [0, 1]");
    std::vector<TensorSpec> specs;
    for (const auto& p : params_) {
      detail::require(p.data.size() == p.shape.numel(), "OuterLoop",
                      "tensor '" + p.name + "' has " + std::to_string(p.data.size()) + " elements, shape " +
                          p.shape.str() + " says " + std::to_string(p.shape.numel()));
      specs.push_back({p.name, p.shape});
      total_ += p.data.size();
    }
    check_replicas_agree();
    config_.lowrank.adaptive_config.h0 = config_.local_steps;
    config_.lowrank.seed ^= config_.seed;
    switch (config_.mode) {
      case SyncMode::dense:
        compressor_ = std::make_unique<DenseCompressor<C>>(comm, specs, config_.dense_codec, config_.algorithm,
                                                           config_.dense_error_feedback);
        break;
      case SyncMode::cocktail:
        compressor_ = std::make_unique<CocktailCompressor<C>>(comm, specs, config_.cocktail, config_.seed);
        break;
      case SyncMode::dilocox:
        compressor_ = std::make_unique<LowRankCompressor<C>>(comm, specs, config_.lowrank, config_.algorithm);
        break;
    }
    for (const auto& p : params_) {
      theta_.emplace_back(p.data.begin(), p.data.end());
      anchor_.emplace_back(p.data.begin(), p.data.end());
      outer_.emplace_back(p.data.size(), config_.outer);
      for (auto& slot : slots_) {
        slot.delta.emplace_back(p.data.size(), 0.0f);
        slot.x.emplace_back(p.data.size(), 0.0f);
        slot.mean.emplace_back(p.data.size(), 0.0f);
      }
    }
    if (config_.mode == SyncMode::dilocox && config_.lowrank.adaptive)
      h_rule_.emplace(config_.lowrank.adaptive_config, config_.lowrank.rank);
    local_steps_ = config_.local_steps;
    round_start_ = std::chrono::steady_clock::now();
  }
  OuterLoop(const OuterLoop&) = delete;
  OuterLoop& operator=(const OuterLoop&) = delete;
  ~OuterLoop() { background_.drain(); }

  int local_steps() const { return local_steps_; }
  std::uint64_t round() const { return round_; }
  std::string describe() const { return compressor_->describe(); }
  const OuterLoopConfig& config() const { return config_; }
  // The global parameters theta of tensor i (identical on every replica).
  std::span<const float> global(std::size_t i) const { return theta_[i]; }
  std::size_t tensor_count() const { return params_.size(); }

  // Marks the start of the round's compute (for the overlap floor of H).
  void begin_round() { round_start_ = std::chrono::steady_clock::now(); }

  RoundStats end_round() {
    const double compute = std::chrono::duration<double>(std::chrono::steady_clock::now() - round_start_).count();
    Slot& slot = slots_[round_ % 2];
    int bad = -1;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& d = slot.delta[i];
      const auto phi = params_[i].data;
      for (std::size_t j = 0; j < d.size(); ++j) d[j] = anchor_[i][j] - phi[j];
      if (bad < 0 && !all_finite(d)) bad = static_cast<int>(i);
      std::copy(d.begin(), d.end(), slot.x[i].begin());
    }
    slot.self_bad = bad;
    slot.step_seconds = compute / local_steps_;
    slot.round = round_;
    background_.start([this, &slot] { run_reduction(slot); });
    ++round_;

    RoundStats stats;
    if (config_.overlap) {
      if (in_flight() > 1) stats = apply(slots_[(round_ - 2) % 2]);
      rebase(slot);
    } else {
      stats = apply(slot);
      set_phi_to_theta();
    }
    for (std::size_t i = 0; i < params_.size(); ++i)
      std::copy(params_[i].data.begin(), params_[i].data.end(), anchor_[i].begin());
    stats.local_steps = local_steps_;
    return stats;
  }

  // Applies the reduction still in flight (overlap) and sets phi to the final global
  // parameters. Call once after the last end_round().
  RoundStats finish() {
    RoundStats stats;
    if (in_flight() > 0) stats = apply(slots_[(round_ - 1) % 2]);
    set_phi_to_theta();
    for (std::size_t i = 0; i < params_.size(); ++i)
      std::copy(params_[i].data.begin(), params_[i].data.end(), anchor_[i].begin());
    stats.local_steps = local_steps_;
    return stats;
  }

  // Checkpoints. save_state() waits for the reduction in flight (overlap) without
  // applying it; load_state() on a loop built with the same tensors and configuration
  // continues exactly where the saved one was: the next end_round() applies that
  // reduction. The trainer's own parameters (phi) are the trainer's to save.
  std::vector<std::byte> save_state() {
    if (background_.pending() > 0 && !completed_) completed_ = background_.wait();
    StateWriter w;
    w.value(state_tag);
    w.value<std::uint64_t>(params_.size());
    w.value(round_);
    w.value<std::int32_t>(local_steps_);
    w.value<std::uint8_t>(self_dropped_ ? 1 : 0);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      w.values(std::span<const float>(theta_[i]));
      w.values(std::span<const float>(anchor_[i]));
      w.values(std::as_const(outer_[i]).momentum_buffer());
    }
    compressor_->save_state(w);
    w.value<std::uint8_t>(completed_ ? 1 : 0);
    if (completed_) {
      const Slot& s = slots_[(round_ - 1) % 2];
      w.value(s.round);
      w.value<std::int32_t>(s.self_bad);
      w.value(s.step_seconds);
      w.value(s.max_step_seconds);
      w.value(completed_->ran_seconds);
      w.value<std::int32_t>(s.report.contributors);
      w.value(s.report.mean_rank);
      w.value(s.report.next_rank_ratio);
      w.value(s.report.cost.bytes);
      w.value<std::int32_t>(s.report.cost.hops);
      w.value<std::uint64_t>(s.dropped.size());
      for (const auto& d : s.dropped) {
        w.value<std::int32_t>(d.replica);
        w.values(std::span<const char>(d.tensor.data(), d.tensor.size()));
      }
      for (const auto& m : s.mean) w.values(std::span<const float>(m));
    }
    return w.bytes();
  }

  void load_state(std::span<const std::byte> bytes) {
    detail::require(background_.pending() == 0 && !completed_ && round_ == 0, "OuterLoop::load_state",
                    "load state into a freshly built loop, before its first round");
    StateReader r(bytes);
    detail::require(r.value<std::uint64_t>() == state_tag, "OuterLoop::load_state", "not an OuterLoop state");
    detail::require(r.value<std::uint64_t>() == params_.size(), "OuterLoop::load_state",
                    "the state has another number of tensors");
    round_ = r.value<std::uint64_t>();
    local_steps_ = r.value<std::int32_t>();
    self_dropped_ = r.value<std::uint8_t>() != 0;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      r.values(std::span<float>(theta_[i]));
      r.values(std::span<float>(anchor_[i]));
      r.values(outer_[i].momentum_buffer());
    }
    compressor_->load_state(r);
    if (r.value<std::uint8_t>() != 0) {
      detail::require(round_ > 0, "OuterLoop::load_state", "a pending reduction before the first round");
      Slot& s = slots_[(round_ - 1) % 2];
      s.round = r.value<std::uint64_t>();
      s.self_bad = r.value<std::int32_t>();
      s.step_seconds = r.value<double>();
      s.max_step_seconds = r.value<double>();
      ReductionTiming t;
      t.ran_seconds = r.value<double>();
      s.report.contributors = r.value<std::int32_t>();
      s.report.mean_rank = r.value<double>();
      s.report.next_rank_ratio = r.value<double>();
      s.report.cost.bytes = r.value<std::uint64_t>();
      s.report.cost.hops = r.value<std::int32_t>();
      s.dropped.resize(r.value<std::uint64_t>());
      for (auto& d : s.dropped) {
        d.replica = r.value<std::int32_t>();
        const auto name = r.vector<char>();
        d.tensor.assign(name.begin(), name.end());
      }
      for (auto& m : s.mean) r.values(std::span<float>(m));
      completed_ = t;
    }
    detail::require(r.done(), "OuterLoop::load_state", "trailing bytes in the state");
  }

 private:
  static constexpr std::uint64_t state_tag = 0x3130524554554f44ULL;  // "DOUTER01"

  // Reductions started and not yet applied (one may have completed for a checkpoint).
  std::size_t in_flight() const { return background_.pending() + (completed_ ? 1 : 0); }

  struct Slot {  // one round's buffers, owned by its background reduction until applied
    std::vector<std::vector<float>> delta;  // (tensors) pseudo-gradient, read by the trainer's thread
    std::vector<std::vector<float>> x;      // (tensors) its copy, compressed in place by the reduction
    std::vector<std::vector<float>> mean;   // (tensors) the reduced mean
    int self_bad = -1;                            // first non-finite tensor of this replica
    double step_seconds = 0;
    std::uint64_t round = 0;
    SyncReport report;
    std::vector<DroppedReplica> dropped;
    double max_step_seconds = 0;
  };

  static bool all_finite(std::span<const float> v) {  // the quantizer's NaN/Inf scan
    return detail::absmax_bits(v.data(), v.size()) < 0x7f800000U;
  }

  // Runs on the background thread: status exchange, then the compressed reduction.
  void run_reduction(Slot& slot) {
    const int k = comm_->size();
    const std::size_t t = params_.size();
    // Status: [i32 first bad tensor or -1][pad][f64 step seconds][f64 ||delta_i||^2 ...]
    const std::size_t rec = 16 + 8 * t;
    status_send_.assign(rec, std::byte{0});
    status_recv_.assign(rec * static_cast<std::size_t>(k), std::byte{0});
    const std::int32_t bad = slot.self_bad;
    std::memcpy(status_send_.data(), &bad, 4);
    std::memcpy(status_send_.data() + 8, &slot.step_seconds, 8);
    // ||x_i + e_i||^2: the energy of what the compressor will compress this round
    const auto residual = compressor_->residuals();
    for (std::size_t i = 0; i < t; ++i) {
      double sq = 0;
      if (bad < 0) {
        const auto& x = slot.x[i];
        for (std::size_t j = 0; j < x.size(); ++j) {
          const double v = static_cast<double>(x[j]) + (residual.empty() ? 0.0 : residual[i][j]);
          sq += v * v;
        }
      }
      std::memcpy(status_send_.data() + 16 + 8 * i, &sq, 8);
    }
    comm_->allgather(status_send_, status_recv_);
    contributes_.assign(static_cast<std::size_t>(k), 0);
    mean_sq_.assign(t, 0.0);
    slot.dropped.clear();
    slot.max_step_seconds = 0;
    int count = 0;
    for (int r = 0; r < k; ++r) {
      const std::byte* p = status_recv_.data() + r * rec;
      std::int32_t rb;
      double step;
      std::memcpy(&rb, p, 4);
      std::memcpy(&step, p + 8, 8);
      slot.max_step_seconds = std::max(slot.max_step_seconds, std::isfinite(step) ? step : 0.0);
      if (rb >= 0) {
        const std::string name = rb < static_cast<std::int32_t>(t) ? params_[rb].name : "?";
        slot.dropped.push_back({r, name});
        if (config_.log)
          config_.log("dilocox: round " + std::to_string(slot.round) + ": replica " + std::to_string(r) +
                      " dropped, tensor '" + name + "' has NaN/Inf in its pseudo-gradient");
        continue;
      }
      contributes_[r] = 1;
      ++count;
      for (std::size_t i = 0; i < t; ++i) {
        double sq;
        std::memcpy(&sq, p + 16 + 8 * i, 8);
        mean_sq_[i] += sq;
      }
    }
    for (double& v : mean_sq_) v = count ? v / count : 0.0;
    if (bad >= 0)  // this replica sends zeros and is left out of the mean
      for (auto& d : slot.x) std::fill(d.begin(), d.end(), 0.0f);
    std::vector<std::span<float>> x, out;
    for (std::size_t i = 0; i < t; ++i) x.emplace_back(slot.x[i]), out.emplace_back(slot.mean[i]);
    slot.report = compressor_->sync(x, {contributes_, mean_sq_, slot.round}, out);
    slot.report.cost += ring_allgather_cost(rec, k);
    if (bad >= 0)
      for (auto r : compressor_->residuals()) std::fill(r.begin(), r.end(), 0.0f);
  }

  // Waits for the oldest reduction (slot), applies its mean to theta, returns stats.
  RoundStats apply(Slot& slot) {
    const ReductionTiming timing = completed_ ? *completed_ : background_.wait();
    completed_.reset();
    RoundStats s;
    s.round = slot.round;
    s.applied = true;
    s.contributors = slot.report.contributors;
    s.dropped = slot.dropped;
    s.rank = slot.report.mean_rank;
    s.wire_bytes = slot.report.cost.bytes;
    s.dense_bytes = ring_allreduce_cost(total_ * 4, comm_->size()).bytes;
    s.compression_ratio = s.wire_bytes ? static_cast<double>(s.dense_bytes) / static_cast<double>(s.wire_bytes) : 0;
    s.comm_seconds = timing.ran_seconds;
    s.wait_seconds = timing.waited_seconds;
    s.hidden_seconds = timing.hidden_seconds();
    if (slot.report.contributors > 0)
      for (std::size_t i = 0; i < params_.size(); ++i) outer_[i].step(theta_[i], slot.mean[i]);
    self_dropped_ = slot.self_bad >= 0;
    // H for the next rounds, from what every replica saw identically.
    if (config_.mode == SyncMode::dilocox && config_.lowrank.adaptive) {
      const int floor = slot.max_step_seconds > 0
                            ? static_cast<int>(std::ceil(timing.ran_seconds / slot.max_step_seconds))
                            : 0;
      local_steps_ = h_rule_->local_steps_for(config_.lowrank.rank * slot.report.next_rank_ratio, floor);
    }
    return s;
  }

  void rebase(const Slot& current) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto phi = params_[i].data;
      const auto& th = theta_[i];
      const auto& d = current.delta[i];
      const bool reset = config_.rebase == Rebase::overwrite || current.self_bad >= 0 || self_dropped_;
      const float a = config_.rebase == Rebase::blend ? config_.blend : 1.0f;
      for (std::size_t j = 0; j < phi.size(); ++j) phi[j] = reset ? th[j] : th[j] - a * d[j];
    }
  }

  void set_phi_to_theta() {
    for (std::size_t i = 0; i < params_.size(); ++i) std::copy(theta_[i].begin(), theta_[i].end(), params_[i].data.begin());
  }

  // Every replica must hold the same tensors and configuration; a mismatch is an Error
  // naming the first differing tensor, on every rank (never a hang in a later collective).
  void check_replicas_agree() {
    const int k = comm_->size();
    const std::size_t t = params_.size();
    auto hash_of = [&](const std::string& s) {
      return checksum64({reinterpret_cast<const std::byte*>(s.data()), s.size()});
    };
    std::string cfg = std::string(to_string(config_.mode)) + to_string(config_.dense_codec) +
                      std::to_string(config_.lowrank.rank) + std::to_string(config_.local_steps) +
                      std::to_string(config_.overlap) + std::to_string(static_cast<int>(config_.algorithm)) +
                      std::to_string(config_.seed);
    std::vector<std::uint64_t> mine = {t, hash_of(cfg)};
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(k));
    comm_->allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
    for (int r = 0; r < k; ++r) {
      detail::require(all[2 * r] == t, "OuterLoop",
                      "replicas disagree on the number of tensors: rank " + std::to_string(comm_->rank()) + " has " +
                          std::to_string(t) + ", rank " + std::to_string(r) + " has " + std::to_string(all[2 * r]));
      detail::require(all[2 * r + 1] == mine[1], "OuterLoop",
                      "replicas disagree on the configuration (mode, codec, rank, local steps, overlap, "
                      "algorithm, seed): rank " + std::to_string(r) + " differs from rank " +
                          std::to_string(comm_->rank()));
    }
    std::vector<std::uint64_t> per(t), per_all(t * static_cast<std::size_t>(k));
    for (std::size_t i = 0; i < t; ++i) per[i] = hash_of(params_[i].name + "|" + params_[i].shape.str());
    comm_->allgather(std::as_bytes(std::span(per)), std::as_writable_bytes(std::span(per_all)));
    for (std::size_t i = 0; i < t; ++i)
      for (int r = 0; r < k; ++r)
        detail::require(per_all[r * t + i] == per[i], "OuterLoop",
                        "replicas disagree on tensor " + std::to_string(i) + " '" + params_[i].name + "' " +
                            params_[i].shape.str() + ": rank " + std::to_string(r) +
                            " has a different name or shape");
  }

  C* comm_;
  std::vector<NamedTensor> params_;
  OuterLoopConfig config_;
  std::size_t total_ = 0;
  std::unique_ptr<PseudoGradientCompressor<C>> compressor_;
  std::vector<std::vector<float>> theta_, anchor_;  // (tensors) global parameters, round anchors
  std::vector<NesterovOuterOptimizer> outer_;
  std::optional<AdaptiveRankController> h_rule_;  // H from the rank (dilocox with adaptive rank)
  Slot slots_[2];
  BackgroundReductions background_;
  std::optional<ReductionTiming> completed_;  // the oldest reduction, waited for by save_state()
  std::uint64_t round_ = 0;
  int local_steps_ = 1;
  bool self_dropped_ = false;
  std::chrono::steady_clock::time_point round_start_;
  std::vector<std::byte> status_send_, status_recv_;
  std::vector<std::uint8_t> contributes_;
  std::vector<double> mean_sq_;
};

}  // namespace dilocox
