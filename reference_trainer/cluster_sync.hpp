// reference_trainer/cluster_sync.hpp: what one rank (k, s) does across clusters, over
// the `stage` communicator (the K replicas of stage s) wrapped in an emulated WAN
// (ThrottledLink): AllReduce averages the gradient every step (fp32, the baseline);
// the other modes run the library's OuterLoop on the stage's parameters every H steps:
// diloco (dense pseudo-gradient, fp32/fp16/int8), cocktail (random + top-k + int4,
// error feedback) and dilocox (low rank + int4 + error feedback + adaptive rank and H,
// one-step-delay overlap). Also the accounting the summary reports.
#pragma once

#include "model/stage_model.hpp"

#include <dilocox/checksum.hpp>
#include <dilocox/comm/mpi.hpp>
#include <dilocox/comm/throttled.hpp>
#include <dilocox/diloco.hpp>
#include <dilocox/state.hpp>

#include <mpi.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dilocox::trainer {

enum class SyncKind { allreduce, diloco, cocktail, dilocox };

inline SyncKind parse_sync(const std::string& s) {
  if (s == "allreduce") return SyncKind::allreduce;
  if (s == "diloco") return SyncKind::diloco;
  if (s == "cocktail") return SyncKind::cocktail;
  if (s == "dilocox") return SyncKind::dilocox;
  throw Error("unknown --sync '" + s + "' (allreduce, diloco, cocktail, dilocox)");
}
inline const char* to_string(SyncKind k) {
  switch (k) {
    case SyncKind::allreduce: return "allreduce";
    case SyncKind::diloco: return "diloco";
    case SyncKind::cocktail: return "cocktail";
    case SyncKind::dilocox: return "dilocox";
  }
  return "?";
}

struct SyncOptions {
  SyncKind kind = SyncKind::dilocox;
  int bits = 0;             // 0: the mode's default (diloco 8, cocktail and dilocox 4); 32/16/8/4
  int rank = 8;             // dilocox: initial rank r0
  int max_rank = 16;        // dilocox adaptive: r_max
  int local_steps = 20;     // H0
  int max_local_steps = 500;  // dilocox adaptive: H_max
  bool overlap = true;      // dilocox: one-step-delay
  bool adaptive = true;     // dilocox: adaptive rank and H
  Rebase rebase = Rebase::keep;
  float outer_lr = 0.7f, outer_momentum = 0.5f;
  LinkConfig link{1e9, 0.0};
};

inline int default_bits(const SyncOptions& o) {
  if (o.bits) return o.bits;
  return o.kind == SyncKind::diloco ? 8 : o.kind == SyncKind::allreduce ? 32 : 4;
}

using WanLink = ThrottledLink<MpiCommunicator>;

class ClusterSync {
 public:
  // stage_comm: the K replicas of this stage (rank = replica). sync_tied: whether this
  // stage's copy of the tied embedding takes part (the last stage's copy is refreshed
  // from the first stage's instead).
  ClusterSync(const SyncOptions& o, MPI_Comm stage_comm, StageModel& model, bool sync_tied, std::uint64_t seed)
      : o_(o), mpi_(stage_comm), control_(stage_comm), link_(mpi_, o.link), model_(&model) {
    if (o.kind == SyncKind::allreduce) return;
    std::vector<NamedTensor> params;
    for (const auto& t : model.tensors()) {
      if (t.name == "wte" && !sync_tied) continue;
      params.push_back({t.name, t.dims(), model.param(t)});
      synced_.push_back(model.param(t));
      stage_floats_ += t.numel();
    }
    OuterLoopConfig c;
    c.local_steps = o.local_steps;
    c.rebase = o.rebase;
    c.outer.lr = o.outer_lr;
    c.outer.momentum = o.outer_momentum;
    c.seed = seed;
    const int bits = default_bits(o);
    switch (o.kind) {
      case SyncKind::diloco:
        c.mode = SyncMode::dense;
        c.overlap = false;
        c.dense_codec = bits == 32   ? Codec{Encoding::f32, {}}
                        : bits == 16 ? Codec{Encoding::f16, {}}
                                     : Codec{Encoding::quantized, QuantConfig{.bits = bits, .block = 128}};
        break;
      case SyncKind::cocktail:
        c.mode = SyncMode::cocktail;
        c.overlap = false;
        c.cocktail.quant.bits = bits;
        break;
      case SyncKind::dilocox:
        c.mode = SyncMode::dilocox;
        c.overlap = o.overlap;
        c.lowrank.rank = o.rank;
        c.lowrank.factor_quant.bits = bits;
        c.lowrank.adaptive = o.adaptive;
        c.lowrank.adaptive_config.r_max = std::max(o.max_rank, o.rank);
        c.lowrank.adaptive_config.h_max = std::max(o.max_local_steps, o.local_steps);
        c.lowrank.adaptive_config.h_min = std::min(c.lowrank.adaptive_config.h_min, o.local_steps);
        break;
      case SyncKind::allreduce:
        break;
    }
    loop_.emplace(link_, std::move(params), c);
  }

  // Writes the global parameters theta into the synced tensors (for evaluating the
  // global model; the caller saves and restores its own parameters around it).
  void load_global() {
    if (!loop_) return;
    for (std::size_t i = 0; i < synced_.size(); ++i) {
      const auto g = loop_->global(i);
      std::copy(g.begin(), g.end(), synced_[i].begin());
    }
  }

  bool per_step() const { return o_.kind == SyncKind::allreduce; }
  int replicas() const { return link_.size(); }
  int replica() const { return link_.rank(); }
  int local_steps() const { return loop_ ? loop_->local_steps() : 1; }
  std::string describe() const { return loop_ ? loop_->describe() : "fp32 gradient allreduce every step"; }

  // AllReduce mode: grads <- mean over the replicas whose gradient is finite (a replica
  // with a NaN/Inf gradient contributes nothing, and takes the others' mean). Returns
  // the number of contributors (0: nobody had a finite gradient; grads untouched).
  int average_gradients(std::span<float> grads, bool finite) {
    int good = finite ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &good, 1, MPI_INT, MPI_SUM, control_.comm());
    if (good == 0) return 0;
    if (!finite) std::fill(grads.begin(), grads.end(), 0.0f);
    link_.allreduce_sum(grads);
    const float inv = 1.0f / static_cast<float>(good);
    for (auto& g : grads) g *= inv;
    dense_bytes_ += ring_allreduce_cost(grads.size_bytes(), replicas()).bytes;
    return good;
  }

  void begin_round() {
    if (loop_) loop_->begin_round();
  }
  RoundStats end_round() { return record(loop_->end_round()); }
  RoundStats finish() { return loop_ ? record(loop_->finish()) : RoundStats{}; }

  // What an fp32 ring allreduce of every step's gradient would have moved, for steps
  // taken by the outer-loop modes (AllReduce counts its own).
  void count_dense_step() {
    if (!per_step()) dense_bytes_ += ring_allreduce_cost(stage_floats_ * 4, replicas()).bytes;
  }

  // Whether every replica holds the same global parameters of this stage (checksums
  // compared over an unthrottled control channel).
  bool replicas_agree() {
    std::uint64_t h = 0;
    if (loop_) {
      for (std::size_t i = 0; i < loop_->tensor_count(); ++i) h ^= checksum64(std::as_bytes(loop_->global(i))) + i;
    } else {
      model_->pull_params();
      h = checksum64(std::as_bytes(std::span<const float>(model_->params())));
    }
    std::uint64_t v[2] = {h, ~h};  // min of ~h = ~(max of h): one reduction gives both ends
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MIN, control_.comm());
    return v[0] == ~v[1];
  }

  // The outer loop's state and this object's counters, for checkpoints.
  std::vector<std::byte> save_state() {
    StateWriter w;
    w.value(dense_bytes_);
    w.value(comm_seconds_);
    w.value(hidden_seconds_);
    w.value(last_rank_);
    w.value<std::int32_t>(rounds_);
    w.value<std::int32_t>(dropped_);
    w.value(link_.stats().wire_bytes + wire_before_);
    std::vector<std::byte> loop = loop_ ? loop_->save_state() : std::vector<std::byte>{};
    w.values(std::span<const std::byte>(loop));
    return w.bytes();
  }
  void load_state(std::span<const std::byte> bytes) {
    StateReader r(bytes);
    dense_bytes_ = r.value<std::uint64_t>();
    comm_seconds_ = r.value<double>();
    hidden_seconds_ = r.value<double>();
    last_rank_ = r.value<double>();
    rounds_ = r.value<std::int32_t>();
    dropped_ = r.value<std::int32_t>();
    wire_before_ = r.value<std::uint64_t>();
    const auto loop = r.vector<std::byte>();
    if (loop_) loop_->load_state(loop);
  }

  std::uint64_t wire_bytes() const { return link_.stats().wire_bytes + wire_before_; }
  std::uint64_t dense_bytes() const { return dense_bytes_; }
  double comm_seconds() const { return comm_seconds_; }
  double hidden_seconds() const { return hidden_seconds_; }
  double last_rank() const { return last_rank_; }
  int rounds() const { return rounds_; }
  int dropped_rounds() const { return dropped_; }
  double link_seconds() const { return link_.stats().link_seconds; }

 private:
  // An unthrottled duplicate of the stage communicator for control messages (never the
  // OuterLoop's, whose reductions run on a background thread).
  struct Control {
    explicit Control(MPI_Comm c) { MPI_Comm_dup(c, &comm_); }
    ~Control() { MPI_Comm_free(&comm_); }
    MPI_Comm comm() const { return comm_; }
    MPI_Comm comm_;
  };

  RoundStats record(RoundStats s) {
    if (s.applied) {
      ++rounds_;
      comm_seconds_ += s.comm_seconds;
      hidden_seconds_ += s.hidden_seconds;
      last_rank_ = s.rank;
      if (!s.dropped.empty()) ++dropped_;
    }
    return s;
  }

  SyncOptions o_;
  MpiCommunicator mpi_;
  Control control_;
  WanLink link_;
  StageModel* model_;
  std::optional<OuterLoop<WanLink>> loop_;
  std::vector<std::span<float>> synced_;  // the model's tensors the outer loop owns, in its order
  std::size_t stage_floats_ = 0;
  std::uint64_t dense_bytes_ = 0;
  std::uint64_t wire_before_ = 0;  // wire bytes of the run before a resume
  double comm_seconds_ = 0, hidden_seconds_ = 0, last_rank_ = 0;
  int rounds_ = 0, dropped_ = 0;
};

}  // namespace dilocox::trainer
