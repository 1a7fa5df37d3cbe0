// reference_trainer/run.hpp: one rank's run of dilocox-train, by phase: the inputs and
// the start agreement (run_start.cpp), building and loading (run_build.cpp), the step
// loop and evaluation (run_train.cpp), checkpoints, the end and the summary
// (run_finish.cpp). main (train_main.cpp) makes a Run, agrees on its start, trains.
#pragma once

#include "checkpoint.hpp"
#include "checkpoint_folder.hpp"
#include "cluster_sync.hpp"
#include "data/batch_sampler.hpp"
#include "data/token_shard.hpp"
#include "layout.hpp"
#include "metrics_file.hpp"
#include "progress.hpp"
#include "pseudo_gradient_dump.hpp"
#include "peer_comms.hpp"
#include "rank_comms.hpp"
#include "run_inputs.hpp"
#include "site_uplink.hpp"
#include "stage_trainer.hpp"
#include "train_options.hpp"
#include "watchdog.hpp"
#include "world.hpp"

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dilocox::trainer {

// What the ranks agree on after every step (one allreduce of these, MAX).
struct StepFlags {
  int signal = 0;           // a stop signal on some rank
  bool stop_after = false;  // --stop-after reached
  bool time_due = false;    // --checkpoint-minutes elapsed on some rank's clock
  bool nonfinite = false;   // some replica's loss was NaN/Inf
};

class Run {
 public:
  Run(const TrainOptions& o, World& world, Watchdog* watchdog) : o_(o), world_(world), watchdog_(watchdog) {
    rank_ = world_.rank();
    world_size_ = world_.size();
    layout_ = layout_of(o_);
    const RankCoord c = layout_.coord(rank_);
    replica_ = c.cluster, dp_rank_ = c.dp, stage_ = c.stage;
  }

  // Start (run_start.cpp): this rank's report for the start agreement (never throws);
  // after a go, the step every rank resumes from.
  json check_inputs();
  std::int64_t agreed_start(const std::vector<json>& reports);
  // Builds, loads the agreed step, trains to the end or a stop; the exit code.
  int train(std::int64_t start);
  // Elastic sites (run_elastic.cpp): a site admitted into a running group receives the
  // run's state; then train(step()) goes on from it.
  void join_running();
  std::int64_t step() const { return step_; }

 private:
  std::string where() const;
  void check_inputs_or_throw();
  void check_checkpoints();
  void check_resumable(const Checkpoint& c, std::int64_t step);
  json run_meta(std::int64_t step, bool finished, double final_eval) const;

  void at(Activity a, std::int64_t step) {
    if (watchdog_) watchdog_->at(a, step);
  }

  void build();
  std::unique_ptr<PeerComms> make_peers();
  void make_sync(bool resuming);
  MPI_Comm data_parallel() const;  // this stage's data-parallel group (MPI_COMM_NULL with --dp 1)
  void load(std::int64_t start);
  bool stopped_before_training();
  bool room_for_checkpoints();
  Checkpoint make_checkpoint(bool finished);
  void open_metrics(std::int64_t start);
  void write_metrics(const json& line);
  void release();
  void train_loop();
  std::string checkpoint_plan() const;
  void after_rounds_step(bool& skipped_since_sync);
  void log_step(const StepStats& st);
  StepFlags agree_after_step(const StepStats& st);
  void evaluate(std::int64_t at);
  void refresh_tied(bool first_stage_synced);
  void maybe_note_grace();
  void save(bool finished);
  int finish();
  json summary();
  bool data_parallel_identical();
  void sync_event(const dilocox::SyncStats& rs);
  int finish_left();

  // Elastic sites (run_elastic.cpp).
  struct Snapshot {
    Checkpoint state;
    bool before_sync = false;  // taken after a round's last inner step, before its sync
  };
  void train_loop_elastic();
  void load_joined();
#ifdef DILOCOX_TRAINER_GLOO
  ElasticGroup& group();
  void keep_snapshot(bool before_sync);
  bool at_boundary();
  bool roll_back(const std::string& why);
  void adopt(const Checkpoint& c);
  void rebuild_sync(const Checkpoint& c);
  void load_sync_state(const Checkpoint& c);
  void check_same_global();
  void membership_event(const char* kind, std::int64_t at_step, double waited, const std::string& why);
#endif
  std::map<std::int64_t, Snapshot> snapshots_;  // by point (2 x step, + 1 after the sync): the last three
  std::optional<Checkpoint> joined_;            // the state a joining site received
  bool left_ = false;                           // this site left the run (SIGTERM, elastic)

  TrainOptions o_;
  World& world_;
  Watchdog* watchdog_;
  RankLayout layout_;
  int rank_ = 0, world_size_ = 1, replica_ = 0, dp_rank_ = 0, stage_ = 0;
  // Checked inputs.
  TokenShard train_data_, val_data_;
  std::string data_fingerprint_;
  TrainShape shape_;
  SyncOptions sync_opts_;
  std::int64_t step_tokens_ = 0, total_steps_ = 0;
  std::pair<std::int64_t, int> fault_{-1, -1};
  std::optional<BatchSampler> train_sampler_, val_sampler_;
  std::string prefix_;
  std::vector<std::int64_t> own_steps_, intact_steps_;
  int removed_tmp_ = 0;
  std::optional<Checkpoint> loaded_;
  std::int64_t loaded_step_ = -1;
  FolderLock folder_lock_, rank_lock_;  // held for the run's life
  // Built after the agreement.
  std::unique_ptr<RankComms> comms_;
  MPI_Comm cluster_ = MPI_COMM_NULL;  // comms_->pipeline(): this pipeline's S stages
  std::unique_ptr<StageLink> link_;
  std::unique_ptr<StageTrainer> trainer_;
  std::unique_ptr<SiteUplink> uplink_;  // the site's link, shared by its ranks (outlives sync_)
  std::unique_ptr<PeerComms> peers_;    // this rank's channels to the other clusters (outlives sync_)
  std::optional<ClusterSync> sync_;
  std::optional<PseudoGradientDump> dump_;
  std::uint64_t dump_index_ = 0;
  const ParamTensor* wte_ = nullptr;
  bool rounds_ = false;
  MetricsFile metrics_;
  std::unique_ptr<ProgressLine> progress_;
  std::vector<float> saved_params_;
  // The run's progress.
  double t_start_ = now_seconds(), train_seconds_ = 0, last_eval_ = std::numeric_limits<double>::quiet_NaN();
  std::int64_t step_ = 0, trained_here_ = 0, last_checkpoint_ = -1;
  double last_save_time_ = now_seconds(), last_save_seconds_ = 0, last_step_seconds_ = 0;
  bool interrupted_ = false, diverged_ = false, finished_before_ = false, grace_noted_ = false;
  int stop_signal_ = 0, nonfinite_streak_ = 0, mismatched_syncs_ = 0;
};

}  // namespace dilocox::trainer
