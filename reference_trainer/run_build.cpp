// reference_trainer/run_build.cpp: after the agreement: the communicators, the stage,
// its trainer and cross-cluster sync, the checkpoint loaded, the metrics file opened;
// the room checks before the first step, and what build() made, freed.
#include "run.hpp"

#include "checkpoint_folder.hpp"
#include "run_agreement.hpp"
#include "run_fingerprint.hpp"
#include "stop_signals.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace dilocox::trainer {

namespace fs = std::filesystem;

void Run::build() {
  const int S = shape_.stages;
  if (shape_.backend.device == Device::cuda) {  // one GPU per rank: the node-local rank's, unless --gpu
    MPI_Comm node;
    MPI_Comm_split_type(world_.job(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    shape_.backend.gpu = o_.gpu >= 0 ? o_.gpu : local;
  }
  comms_ = std::make_unique<RankComms>(world_.job(), layout_, rank_);
  cluster_ = comms_->pipeline();
  const auto act = static_cast<std::size_t>(shape_.micro_batch()) * shape_.seq_len * shape_.model.n_embd;
  link_ = std::make_unique<StageLink>(cluster_, pipeline_slots(shape_.schedule, S, stage_, shape_.micro_batches), act);
  cpu::set_threads(o_.threads);
  shape_.dp_rank = dp_rank_;
  trainer_ = std::make_unique<StageTrainer>(shape_, o_.adamw, *link_, data_parallel(), o_.seed);
  auto& model = trainer_->model();
  // On the GPU the host copy of the parameters is moved explicitly. In the outer-loop
  // modes it is pulled once per round, after the local steps, for end_round (and the
  // dump), and pushed after the round writes it: so between rounds, where begin_round,
  // evaluation and finish read it, host and device agree.
  wte_ = model.tied_embedding();
  if (o_.clusters > 1) {
    uplink_ = std::make_unique<SiteUplink>(comms_->site());
    if (uplink_->spans_hosts() && world_.speaks())
      std::fprintf(stderr, "dilocox-train: note: a cluster spans hosts; its --wan-bandwidth is shared by the ranks "
                           "of each host (%d here), not of the whole cluster\n", uplink_->sharers());
    peers_ = make_peers();
    make_sync(/*resuming=*/step_ > 0);
    if (sync_->per_step())
      trainer_->set_gradient_hook([this](std::span<float> g, bool finite) { return sync_->average_gradients(g, finite); });
  }
  rounds_ = sync_ && !sync_->per_step();
  if (!o_.dump_pseudo_gradients.empty() && replica_ == 0) dump_.emplace(o_.dump_pseudo_gradients, stage_);
}

// The sync across clusters over peers_ (again, elastic sites: over the current members).
void Run::make_sync(bool resuming) {
  sync_.emplace(sync_opts_, *peers_, data_parallel(), trainer_->model(), /*sync_tied=*/stage_ == 0, resuming,
                *uplink_->uplink(), shape_.stages);
  const auto* loop = sync_->loop();
  if (o_.elastic > 0 && loop && (loop->config().overlap || loop->config().overlap_steps > 0))
    throw UsageError("--elastic needs syncs that do not overlap the next round (--sync " + o_.sync +
                     " overlaps by default): add --no-overlap --overlap-steps 0");
}

MPI_Comm Run::data_parallel() const { return layout_.dp > 1 ? comms_->data_parallel() : MPI_COMM_NULL; }

// This rank's channels to its peers in the other clusters: MPI when one job holds every
// cluster, Gloo groups between the sites' jobs, the run's ElasticGroup between elastic sites.
std::unique_ptr<PeerComms> Run::make_peers() {
  if (world_.one_job()) return std::make_unique<PeerComms>(comms_->clusters());
#ifdef DILOCOX_TRAINER_GLOO
  if (world_.elastic()) return std::make_unique<PeerComms>(*world_.elastic());
  return std::make_unique<PeerComms>(site_gloo(o_), layout_.peers_of(layout_.coord(rank_)), replica_, o_.clusters);
#else
  throw dilocox::Error("internal: a site's world without Gloo");
#endif
}

// Loads the agreed step's checkpoint (read again when this rank's newest is another) and
// drops this rank's checkpoints after it: they are not common to every rank.
void Run::load(std::int64_t start) {
  at(Activity::loading, start);
  const auto path = checkpoint_path(o_.checkpoint_dir, prefix_, start);
  if (loaded_step_ != start) {
    loaded_ = Checkpoint::read(path);
    check_resumable(*loaded_, start);
  }
  const json meta = json::parse(loaded_->get_text("meta"));
  finished_before_ = meta.value("finished", false);
  if (finished_before_) last_eval_ = meta.value("final_eval_loss", std::numeric_limits<double>::quiet_NaN());
  trainer_->load(*loaded_);
  if (sync_) {
    const std::string state = loaded_->get_text("cluster_sync");
    sync_->load_state(std::as_bytes(std::span<const char>(state.data(), state.size())));
  }
  loaded_.reset();
  for (auto s : own_steps_)
    if (s > start) fs::remove(checkpoint_path(o_.checkpoint_dir, prefix_, s));
  last_checkpoint_ = start;
}

// A resumed run (--resume at any step, --resume-if-present too) cuts the file back to
// its start step and appends; only a fresh run starts a new file.
void Run::open_metrics(std::int64_t start) {
  if (rank_ != 0 || o_.metrics.empty()) return;
  if (o_.resume && !finished_before_) {
    const auto dropped = cut_metrics_after(o_.metrics, start);
    if (dropped > 0)
      std::fprintf(stderr, "dilocox-train: %s: dropped %zu line(s) logged after step %lld by the interrupted run\n",
                   o_.metrics.c_str(), dropped, static_cast<long long>(start));
  }
  metrics_.open(o_.metrics, /*append=*/o_.resume);
}

void Run::write_metrics(const json& line) {
  const std::string note = metrics_.write(line.dump());
  if (!note.empty()) progress_->warn("dilocox-train: warning: " + note);
}

// A stop signal that arrived while the run was starting or loading: every rank agrees on
// it before the first step and the run ends with exit 0, nothing saved.
bool Run::stopped_before_training() {
  int sig = pending_stop_signal();
  sig = world_.reduce(sig, ReduceOp::max);
  if (sig == 0) return false;
  interrupted_ = true;
  stop_signal_ = sig;
  if (world_.speaks())
    progress_->warn("dilocox-train: " + signal_name(sig) + " during start-up: stopped before step " +
                    std::to_string(step_ + 1) + ", nothing trained" +
                    (step_ > 0 ? ", the checkpoints are as they were" : ""));
  return true;
}

// The folder must hold, per rank, the newest two checkpoints plus the one being written,
// each the size of this rank's first one; the ranks of one node share a filesystem (ranks
// on other nodes are counted on theirs). A shortfall ends every rank with exit 2, named
// by the rank that found it.
bool Run::room_for_checkpoints() {
  if (o_.checkpoint_dir.empty()) return true;
  const auto bytes = static_cast<double>(make_checkpoint(false).file_bytes());
  double held = 0;
  for (auto s : list_checkpoints(o_.checkpoint_dir, prefix_)) {
    std::error_code ec;
    const auto n = fs::file_size(checkpoint_path(o_.checkpoint_dir, prefix_, s), ec);
    if (!ec) held += static_cast<double>(n);
  }
  double need = std::max(0.0, 3 * bytes - held);
  MPI_Comm node;
  MPI_Comm_split_type(world_.job(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  int ranks_here = 1;
  MPI_Comm_size(node, &ranks_here);
  MPI_Allreduce(MPI_IN_PLACE, &need, 1, MPI_DOUBLE, MPI_SUM, node);
  MPI_Comm_free(&node);
  const double room = static_cast<double>(free_bytes(o_.checkpoint_dir));
  const double shortfall = std::max(0.0, need - room);
  const double worst = world_.reduce(shortfall, ReduceOp::max);
  if (worst <= 0) return true;
  if (world_.reduce(shortfall == worst ? rank_ : world_size_, ReduceOp::min) == rank_) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "dilocox-train: %s--checkpoint-dir %s has %.1f MB free, the run needs %.1f MB more there (%d rank(s) "
                  "on this node, each keeping 3 checkpoints of %.1f MB: the newest two and the one being written): "
                  "%.1f MB short; free space or choose another folder\n",
                  world_size_ > 1 ? (layout_.describe(rank_) + ": ").c_str() : "",
                  o_.checkpoint_dir.c_str(), room / 1e6, need / 1e6, ranks_here, bytes / 1e6, worst / 1e6);
    std::fputs(buf, stderr);
    std::fflush(stderr);
  }
  return false;
}

// Frees what build() made (the communicators, the outer loop).
void Run::release() {
  if (sync_) sync_.reset();
  peers_.reset();
  uplink_.reset();
  comms_.reset();
  cluster_ = MPI_COMM_NULL;
}

}  // namespace dilocox::trainer
