// reference_trainer/run_finish.cpp: checkpoints (every rank its file, the older ones
// dropped after all are written), the end of a run (the final round and evaluation, the
// last checkpoint) and its one-line JSON summary.
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

Checkpoint Run::make_checkpoint(bool finished) {
  Checkpoint c;
  trainer_->save(c);
  if (sync_) {
    const auto state = sync_->save_state();
    c.put("cluster_sync", std::span<const std::byte>(state));
  }
  c.put_text("meta", run_meta(step_, finished, last_eval_).dump());
  return c;
}

// Every rank writes its file; after a barrier (every file complete) the older ones go.
void Run::save(bool finished) {
  at(Activity::checkpointing, step_);
  const double t0 = now_seconds();
  const auto path = checkpoint_path(o_.checkpoint_dir, prefix_, step_);
  make_checkpoint(finished).write_atomically(path);
  at(Activity::waiting_for_saves, step_);
  world_.barrier();
  const auto steps = list_checkpoints(o_.checkpoint_dir, prefix_);
  for (std::size_t i = 2; i < steps.size(); ++i) fs::remove(checkpoint_path(o_.checkpoint_dir, prefix_, steps[i]));
  last_checkpoint_ = step_;
  last_save_time_ = now_seconds();
  last_save_seconds_ = last_save_time_ - t0;
  if (world_.speaks()) progress_->note("checkpoint: step " + std::to_string(step_) + " -> " + path.string());
}

// After the loop: the final round and evaluation (unless stopped early), the last
// checkpoint (never of a diverged model), the summary. Returns the exit code.
int Run::finish() {
  if (left_) return finish_left();
  at(Activity::finishing, step_);
  const bool finished = !interrupted_ && !diverged_ && !finished_before_;
  if (finished && rounds_) {
    const auto stats = sync_->finish();
    refresh_tied(true);
    trainer_->model().push_params();
    for (const auto& rs : stats) sync_event(rs);
  }
  if (finished) evaluate(step_);
  const bool bad_eval = finished && !std::isfinite(last_eval_);
  const bool save_now = !o_.checkpoint_dir.empty() && !diverged_ && !bad_eval && !finished_before_ &&
                        last_checkpoint_ != step_ && (trained_here_ > 0 || finished);
  if (save_now && nonfinite_streak_ == 0)
    save(finished);
  else if (save_now && world_.speaks())
    progress_->note("dilocox-train: no checkpoint at step " + std::to_string(step_) + ": the loss is not finite");
  progress_->finish();
  const json s = summary();
  if (world_.speaks()) {
    if (diverged_)
      std::fprintf(stderr,
                   "dilocox-train: the loss was NaN/Inf on some replica for %d consecutive steps (to step %lld): the "
                   "run diverged; no checkpoint written (lower --lr, check the data; --max-nonfinite-steps)\n",
                   nonfinite_streak_, static_cast<long long>(step_));
    if (bad_eval)
      std::fprintf(stderr, "dilocox-train: the final evaluation loss is %s: the run diverged; no checkpoint written\n",
                   std::isnan(last_eval_) ? "NaN" : "infinite");
    if (interrupted_ && stop_signal_ != 0 && o_.checkpoint_dir.empty() && trained_here_ > 0)
      std::fprintf(stderr, "dilocox-train: stopped by %s at step %lld without --checkpoint-dir: the work is lost\n",
                   signal_name(stop_signal_).c_str(), static_cast<long long>(step_));
    if (metrics_.lost_lines() > 0)
      std::fprintf(stderr, "dilocox-train: warning: %zu line(s) of --metrics %s were lost (%s)\n",
                   metrics_.lost_lines(), metrics_.path().c_str(), metrics_.first_error().c_str());
    std::printf("%s\n", s.dump().c_str());
    std::fflush(stdout);
  }
  release();
  if (diverged_ || bad_eval) return 1;
  return interrupted_ && o_.checkpoint_dir.empty() && trained_here_ > 0 ? 1 : 0;
}

// An elastic site that left the run: the global model's evaluation and this site's own
// summary (the others go on; nothing is agreed with them any more).
int Run::finish_left() {
  evaluate(step_);
  progress_->finish();
  if (world_.speaks()) {
    const json s{{"model", shape_.model.name}, {"site", world_.site()}, {"left", true}, {"steps", step_},
                 {"eval_loss", std::isfinite(last_eval_) ? json(last_eval_) : json(nullptr)},
                 {"wire_bytes", sync_->wire_bytes()}, {"syncs", sync_->syncs()}};
    std::printf("%s\n", s.dump().c_str());
    std::fflush(stdout);
  }
  release();
  return 0;
}

// The summary: wire and dense bytes of every rank, hidden fraction over all rounds.
// Whether the D ranks of every stage hold the same parameters, bit for bit (all ranks).
bool Run::data_parallel_identical() {
  auto& model = trainer_->model();
  model.pull_params();
  const std::uint64_t h = dilocox::checksum64(std::as_bytes(std::span<const float>(model.params())));
  std::uint64_t v[2] = {h, ~h};  // min of ~h = ~(max of h)
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MIN, comms_->data_parallel());
  int same = v[0] == ~v[1] ? 1 : 0;
  return world_.reduce(same, ReduceOp::min) != 0;
}

json Run::summary() {
  const int K = o_.clusters;
  constexpr ReduceOp sum = ReduceOp::sum;
  json s{{"model", shape_.model.name},
         {"params", shape_.model.params()},
         {"clusters", K},
         {"stages", shape_.stages},
         {"steps", step_},
         {"tokens", step_ * step_tokens_},
         {"final_eval_loss", interrupted_ || diverged_ || !std::isfinite(last_eval_) ? json(nullptr) : json(last_eval_)},
         {"tokens_per_second", static_cast<double>(trained_here_ * step_tokens_) / std::max(train_seconds_, 1e-9)},
         {"wall_seconds", now_seconds() - t_start_},
         {"interrupted", interrupted_},
         {"diverged", diverged_ || (!interrupted_ && !std::isfinite(last_eval_))},
         {"checkpoint_step", last_checkpoint_ >= 0 && !o_.checkpoint_dir.empty() ? json(last_checkpoint_) : json(nullptr)}};
  if (metrics_.is_open()) s["metrics_lost_lines"] = metrics_.lost_lines();
  if (layout_.dp > 1) {  // the fast links inside clusters: data-parallel gradients, shared outer-loop shards
    s["dp"] = layout_.dp;
    s["dp_identical"] = data_parallel_identical();
    s["in_cluster_bytes"] =
        world_.reduce(static_cast<double>(trainer_->data_parallel_bytes() + (sync_ ? sync_->group_bytes() : 0)), sum);
  }
  if (sync_) {
    double sums[5] = {static_cast<double>(sync_->wire_bytes()), static_cast<double>(sync_->dense_bytes()),
                      sync_->per_step() ? sync_->link_seconds() : sync_->comm_seconds(), sync_->hidden_seconds(),
                      sync_->last_rank()};
    world_.allreduce(std::span<double>(sums), sum);
    const auto [wire, dense, comm, hidden, rank_sum] = sums;
    const int bad = world_.reduce(mismatched_syncs_, ReduceOp::max);
    s["sync"] = o_.sync;
    s["wire_bytes"] = wire;
    s["dense_bytes"] = dense;
    s["compression_ratio"] = wire > 0 ? dense / wire : 0.0;
    // The busiest rank's modelled time on the site link, waits behind its site's other
    // ranks included.
    s["wan_link_seconds"] = world_.reduce(sync_->link_seconds(), ReduceOp::max);
    s["comm_hidden_fraction"] = comm > 0 ? hidden / comm : 0.0;
    s["final_rank"] = rank_sum / world_.live_size();
    s["final_local_steps"] = rounds_ ? sync_->local_steps() : 1;
    s["syncs"] = sync_->syncs();
    s["dropped_syncs"] = sync_->dropped_syncs();
    s["replicas_identical"] = bad == 0;
    const auto m = sync_->memory();  // the largest of any rank, component by component
    std::uint64_t v[6] = {m.global, m.anchor, m.momentum, m.workspace, m.compressor, m.total()};
    world_.allreduce(std::span<std::uint64_t>(v), ReduceOp::max);
    s["outer_state_bytes_per_rank"] = {{"global", v[0]}, {"anchor", v[1]}, {"momentum", v[2]},
                                       {"workspace", v[3]}, {"compressor", v[4]}, {"total", v[5]}};
  }
  return s;
}

}  // namespace dilocox::trainer
