// reference_trainer/cluster_sync.hpp: what one rank (k, s) does across clusters, over
// its peers' data channel (the K replicas of stage s: peer_comms.hpp) wrapped in an
// emulated WAN (ThrottledLink): AllReduce averages the gradient every step (fp32, the baseline);
// every other mode runs the library's OuterLoop on the stage's parameters with that
// mode's compressor, stepped after every inner step. Also the accounting the summary
// reports. Not here: which modes exist (the library's registry, via sync_modes.hpp).
#pragma once

#include "model/stage_model.hpp"
#include "peer_comms.hpp"
#include "sync_modes.hpp"

#include <dilocox/checksum.hpp>
#include <dilocox/comm/any.hpp>
#include <dilocox/comm/mpi.hpp>
#include <dilocox/comm/throttled.hpp>
#include <dilocox/diloco.hpp>
#include <dilocox/shard.hpp>
#include <dilocox/state.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace dilocox::trainer {

using WanLink = ThrottledLink<AnyCommunicator>;

class ClusterSync {
 public:
  // peers: the K replicas of this stage (rank = replica), for this rank's shard.
  // data_parallel: the D ranks of this stage in this cluster (MPI_COMM_NULL: D = 1); the
  // stage's tensors are split over them (dilocox/shard.hpp) and each runs the outer loop
  // on its own. sync_tied: whether this stage's copy of the tied embedding takes part
  // (the last stage's copy is refreshed from the first stage's instead). resuming:
  // load_state() follows (replicas' phi may differ).
  // uplink: the site's link, which the stage's bytes share with the site's other stages
  // (and shards); stages: how many share it, for the outer loop's modelled sync time.
  ClusterSync(const SyncOptions& o, PeerComms& peers, MPI_Comm data_parallel, StageModel& model, bool sync_tied,
              bool resuming, SharedUplink& uplink, int stages)
      : mode_(&sync_mode(o.mode)), control_(&peers.control()), link_(peers.data(), o.link, &uplink), model_(&model) {
    if (data_parallel != MPI_COMM_NULL) group_.emplace(data_parallel);
    std::vector<TensorSpec> specs;
    for (const auto& t : model.tensors()) {
      if (t.name == "wte" && !sync_tied) continue;
      specs.push_back({t.name, t.dims()});
      synced_.push_back(model.param(t));
    }
    if (mode_->per_step) return;  // AllReduce: the group splits the flat gradient instead
    owner_ = shard_tensors(specs, group_size());
    mine_ = owned_tensors(owner_, group_rank());
    std::vector<NamedTensor> params;
    for (std::size_t i : mine_) params.push_back({specs[i].name, specs[i].shape, synced_[i]});
    for (const auto& p : params) stage_floats_ += p.data.size();
    AnyCompressor compressor = make_compressor(*mode_, o);
    OuterLoopConfig c = outer_loop_config(*mode_, o, compressor);
    c.defer_start_check = resuming;
    // The H floor's modelled sync time: the D shards' seconds are summed (group_sum), and
    // the S stages send at once on one site link, each at 1/S of it.
    if (c.link) c.link->bits_per_second /= stages;
    if (group_) c.group_sum = group_sum(*group_);
    loop_.emplace(link_, std::move(params), std::move(compressor), c);
  }

  // Writes the global parameters theta into the synced tensors (for evaluating the
  // global model; the caller saves and restores its own parameters around it).
  void load_global() {
    if (mode_->per_step) return;
    for (std::size_t i = 0; loop_ && i < mine_.size(); ++i) {
      const auto g = loop_->global(i);
      std::copy(g.begin(), g.end(), synced_[mine_[i]].begin());
    }
    share(mine_);
  }

  // How the compressor sends this stage's tensors, when it says (DiLoCoX: which go low
  // rank and which are quantized only); empty otherwise.
  std::string treatment() {
    if (!loop_) return "";
    const auto* lr = loop_->compressor().get<LowRankCompressor>();
    if (!lr) return "";
    std::string low, small;
    for (const auto& t : lr->treatment()) (t.low_rank ? low : small) += (t.low_rank ? low : small).empty() ? t.name : ", " + t.name;
    return "low rank: " + (low.empty() ? std::string("none") : low) + "; quantized only (low rank would not pay): " +
           (small.empty() ? std::string("none") : small);
  }

  bool per_step() const { return mode_->per_step; }
  int replicas() const { return link_.size(); }
  int replica() const { return link_.rank(); }
  int local_steps() const { return loop_ ? loop_->local_steps() : 1; }
  std::string describe() const { return loop_ ? loop_->describe() : "fp32 gradient allreduce every step"; }
  OuterLoop<WanLink>* loop() { return loop_ ? &*loop_ : nullptr; }

  // AllReduce mode: grads <- mean over the replicas whose gradient is finite (a replica
  // with a NaN/Inf gradient contributes nothing, and takes the others' mean). With D > 1
  // each rank of the group reduces its 1/D of the gradient and the group shares the
  // results. Returns the number of contributors (0: nobody had a finite gradient; grads
  // untouched).
  int average_gradients(std::span<float> grads, bool finite) {
    int good = 0;
    for (int f : gather_values(*control_, finite ? 1 : 0)) good += f;
    if (good == 0) return 0;
    if (!finite) std::fill(grads.begin(), grads.end(), 0.0f);
    const int d = group_size(), me = group_rank();
    std::vector<std::span<float>> parts;
    for (int p = 0; p < d; ++p) parts.push_back(grads.subspan(grads.size() * p / d, grads.size() * (p + 1) / d - grads.size() * p / d));
    const std::span<float> mine = parts[static_cast<std::size_t>(me)];
    link_.allreduce_sum(mine);
    const float inv = 1.0f / static_cast<float>(good);
    for (auto& g : mine) g *= inv;
    dense_bytes_ += ring_allreduce_cost(mine.size_bytes(), replicas()).bytes;
    if (group_) {
      std::vector<int> owner(static_cast<std::size_t>(d));
      std::iota(owner.begin(), owner.end(), 0);
      const std::size_t self[1] = {static_cast<std::size_t>(me)};
      group_bytes_ += share_rewritten(*group_, owner, parts, self);
    }
    return good;
  }

  // Outer-loop modes, after every inner step: the syncs this rank's loop applied; the
  // tensors any loop of the group rewrote reach every rank of it when `group_syncs`
  // (next_step_syncs() before the step).
  std::vector<SyncStats> after_step(bool group_syncs) {
    auto stats = loop_ ? record(loop_->step()) : std::vector<SyncStats>{};
    if (group_syncs) share_rewritten_tensors();
    return stats;
  }
  std::vector<SyncStats> finish() {
    auto stats = loop_ ? record(loop_->finish()) : std::vector<SyncStats>{};
    share_rewritten_tensors();
    return stats;
  }

  // Makes this replica sit out its next sync (its pseudo-gradient turns non-finite: the
  // protocol drops it on every replica, reports it, and it restarts from theta).
  void drop_next_sync() {
    if (!loop_ || !loop_->next_step_syncs()) return;
    const auto tensors = loop_->fragment_tensors(loop_->next_fragment());
    synced_[mine_[tensors.front()]][0] = std::numeric_limits<float>::quiet_NaN();
  }
  // Whether the next step syncs (the same answer on every rank of the group: its loops
  // agree on H, and each cuts its tensors into the same number of fragments).
  bool next_step_syncs() const { return loop_ && loop_->next_step_syncs(); }
  // The outer state this rank holds (none in AllReduce mode).
  OuterMemory memory() const { return loop_ ? loop_->memory() : OuterMemory{}; }
  // Bytes this rank put on the in-cluster link to share the group's tensors.
  std::uint64_t group_bytes() const { return group_bytes_; }

  // What an fp32 ring allreduce of every step's gradient would have moved, for steps
  // taken by the outer-loop modes (AllReduce counts its own).
  void count_dense_step() {
    if (!per_step()) dense_bytes_ += ring_allreduce_cost(stage_floats_ * 4, replicas()).bytes;
  }

  // Whether every replica holds the same global parameters of this rank's shard of the
  // stage (checksums compared over an unthrottled control channel).
  bool replicas_agree() {
    std::uint64_t h = 0;
    if (loop_) {
      for (std::size_t i = 0; i < loop_->tensor_count(); ++i) h ^= checksum64(std::as_bytes(loop_->global(i))) + i;
    } else if (mode_->per_step) {
      model_->pull_params();
      h = checksum64(std::as_bytes(std::span<const float>(model_->params())));
    }
    const auto all = gather_values(*control_, h);
    return std::all_of(all.begin(), all.end(), [&](std::uint64_t x) { return x == h; });
  }

  // The outer loop's state and this object's counters, for checkpoints.
  std::vector<std::byte> save_state() {
    StateWriter w;
    w.value(dense_bytes_);
    w.value(comm_seconds_);
    w.value(hidden_seconds_);
    w.value(last_rank_);
    w.value<std::int32_t>(syncs_);
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
    syncs_ = r.value<std::int32_t>();
    dropped_ = r.value<std::int32_t>();
    // The saved count holds the run's start check, which this process's loop has just
    // made again on the link: counted once.
    const std::uint64_t saved_wire = r.value<std::uint64_t>(), checked = link_.stats().wire_bytes;
    dilocox::detail::require(saved_wire >= checked, "ClusterSync::load_state",
                             "the checkpoint's wire bytes are fewer than a start check's");
    wire_before_ = saved_wire - checked;
    const auto loop = r.vector<std::byte>();
    if (loop_) loop_->load_state(loop);
  }

  std::uint64_t wire_bytes() const { return link_.stats().wire_bytes + wire_before_; }
  std::uint64_t dense_bytes() const { return dense_bytes_; }
  double comm_seconds() const { return comm_seconds_; }
  double hidden_seconds() const { return hidden_seconds_; }
  double last_rank() const { return last_rank_; }
  int syncs() const { return syncs_; }
  int dropped_syncs() const { return dropped_; }
  double link_seconds() const { return link_.stats().link_seconds; }

 private:
  int group_size() const { return group_ ? group_->size() : 1; }
  int group_rank() const { return group_ ? group_->rank() : 0; }
  // The group's tensors that `owned` (indices into synced_, this rank's) name reach every
  // rank of the group; a collective of the group.
  void share(std::span<const std::size_t> owned) {
    if (group_) group_bytes_ += share_rewritten(*group_, owner_, synced_, owned);
  }
  void share_rewritten_tensors() {
    if (!group_) return;
    std::vector<std::size_t> wrote;
    if (loop_)
      for (std::size_t i : loop_->rewritten()) wrote.push_back(mine_[i]);
    share(wrote);
  }

  std::vector<SyncStats> record(std::vector<SyncStats> stats) {
    for (const auto& s : stats) {
      ++syncs_;
      comm_seconds_ += s.comm_seconds;
      hidden_seconds_ += s.hidden_seconds;
      last_rank_ = s.low_rank;
      if (!s.dropped.empty()) ++dropped_;
    }
    return stats;
  }

  const SyncMode* mode_;
  AnyCommunicator* control_;  // the peers' unthrottled control channel
  WanLink link_;
  StageModel* model_;
  std::optional<OuterLoop<WanLink>> loop_;
  std::optional<MpiCommunicator> group_;   // the stage's D ranks in this cluster (D > 1)
  std::vector<std::span<float>> synced_;   // the stage's tensors the outer loops of the group hold
  std::vector<int> owner_;                 // (synced_) the group rank whose loop holds each
  std::vector<std::size_t> mine_;          // this rank's: loop tensor i is synced_[mine_[i]]
  std::uint64_t group_bytes_ = 0;
  std::size_t stage_floats_ = 0;           // the floats of this rank's loop
  std::uint64_t dense_bytes_ = 0;
  std::uint64_t wire_before_ = 0;  // wire bytes of the run before a resume, less the start check
  double comm_seconds_ = 0, hidden_seconds_ = 0, last_rank_ = 0;
  int syncs_ = 0, dropped_ = 0;
};

}  // namespace dilocox::trainer
