// reference_trainer/run_train.cpp: the step loop: each inner step, the outer loop after
// it, the agreement after it (stop signals, the checkpoint clock, non-finite losses),
// logging, evaluation of the global model, sync events.
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

int Run::train(std::int64_t start) {
  step_ = start;
  progress_ = std::make_unique<ProgressLine>(world_.speaks() && !o_.quiet, total_steps_);
  build();
  const bool joined = joined_.has_value();
  if (joined)
    load_joined();
  else if (start > 0)
    load(start);
  if (!joined && stopped_before_training()) return finish();
  if (!room_for_checkpoints()) {
    release();
    return 2;
  }
  open_metrics(start);
  const int K = o_.clusters, S = shape_.stages;
  if (world_.speaks() && !o_.quiet)
    progress_->note("dilocox-train: " + shape_.model.name + ", " + std::to_string(shape_.model.params()) +
                    " parameters, " + std::to_string(K) + " cluster(s) x " + std::to_string(S) + " stage(s), " +
                    std::to_string(total_steps_) + " steps of " + std::to_string(step_tokens_) + " tokens" +
                    (sync_ ? ", sync " + o_.sync + ": " + sync_->describe() : "") +
                    (start > 0 ? ", resuming at step " + std::to_string(start) : ""));
  if (world_.speaks() && !o_.quiet && sync_ && !sync_->treatment().empty())
    progress_->note("dilocox-train: stage 0: " + sync_->treatment());
  if (world_.speaks() && !o_.quiet) progress_->note("dilocox-train: " + checkpoint_plan());
  if (finished_before_) {
    if (world_.speaks() && !o_.quiet) progress_->note("dilocox-train: the checkpoint is the end of the run: nothing to train");
  } else if (o_.elastic > 0) {
    train_loop_elastic();
  } else {
    train_loop();
  }
  return finish();
}

// Where and when this run saves, for the start banner: an operator knows before the
// first step what a stop or a kill will cost.
std::string Run::checkpoint_plan() const {
  if (o_.checkpoint_dir.empty())
    return "no --checkpoint-dir: nothing is saved, a stop or a kill loses the run";
  char minutes[32];
  std::snprintf(minutes, sizeof minutes, "%g", o_.checkpoint_minutes);
  std::string when;
  if (o_.checkpoint_every > 0) when += "every " + std::to_string(o_.checkpoint_every) + " steps, ";
  if (o_.checkpoint_minutes > 0) when += "every " + std::string(minutes) + " minutes, ";
  return "checkpoints in " + o_.checkpoint_dir + ": " + when +
         "on SIGTERM, SIGINT or SIGUSR1 (README: stopping a run) and at the end";
}

void Run::train_loop() {
  auto& model = trainer_->model();
  bool skipped_since_sync = false;
  if (dump_) dump_->begin_round(model);
  while (step_ < total_steps_) {
    at(Activity::training, step_);
    if (fault_.first == step_ + 1 && fault_.second == replica_) trainer_->inject_nan_next_step();
    const double t0 = now_seconds();
    const StepStats st = trainer_->train_step(step_, total_steps_, *train_sampler_);
    if (sync_) sync_->count_dense_step();
    ++step_;
    ++trained_here_;
    skipped_since_sync = skipped_since_sync || st.skipped;
    if (rounds_) after_rounds_step(skipped_since_sync);
    last_step_seconds_ = now_seconds() - t0;
    train_seconds_ += last_step_seconds_;
    log_step(st);
    const StepFlags f = agree_after_step(st);
    nonfinite_streak_ = f.nonfinite ? nonfinite_streak_ + 1 : 0;
    if (nonfinite_streak_ >= o_.max_nonfinite_steps) {
      diverged_ = true;
      return;
    }
    if ((f.signal != 0 || f.stop_after) && step_ < total_steps_) {
      interrupted_ = true;
      stop_signal_ = f.signal;
      if (world_.speaks())
        progress_->note(f.signal != 0 ? "dilocox-train: " + signal_name(f.signal) + " at step " + std::to_string(step_) +
                                            (o_.checkpoint_dir.empty() ? " (no --checkpoint-dir: nothing saved)" : "")
                                      : "dilocox-train: --stop-after " + std::to_string(o_.stop_after) + " reached");
      return;
    }
    if (o_.eval_every > 0 && step_ % o_.eval_every == 0 && step_ < total_steps_) evaluate(step_);
    const bool due = (o_.checkpoint_every > 0 && step_ - std::max<std::int64_t>(last_checkpoint_, 0) >= o_.checkpoint_every) ||
                     f.time_due;
    if (!o_.checkpoint_dir.empty() && due && step_ < total_steps_) {
      if (nonfinite_streak_ == 0)
        save(false);
      else if (world_.speaks())
        progress_->note("dilocox-train: no checkpoint at step " + std::to_string(step_) + ": the loss is not finite");
    }
    maybe_note_grace();
  }
}

// The outer loop, after every inner step: a sync when this step ends a fragment's turn.
void Run::after_rounds_step(bool& skipped_since_sync) {
  auto& model = trainer_->model();
  const bool due = sync_->next_step_syncs();
  if (due) {
    model.pull_params();
    // A replica that had to skip a step for a non-finite gradient sits the sync out:
    // the protocol leaves it out on every replica, reports it, and it restarts from theta.
    if (skipped_since_sync) sync_->drop_next_sync();
    skipped_since_sync = false;
    if (dump_) dump_->write(dump_index_++, model);
  }
  const auto stats = sync_->after_step(due);
  if (due) {
    refresh_tied(stage_ == 0);
    model.push_params();
    if (dump_) dump_->begin_round(model);
  } else {
    refresh_tied(false);
  }
  for (const auto& rs : stats) sync_event(rs);
}

void Run::log_step(const StepStats& st) {
  const int K = o_.clusters;
  const double tps = static_cast<double>(trained_here_ * step_tokens_) / train_seconds_;
  if (metrics_.is_open()) {
    json line{{"type", "step"}, {"step", step_}, {"tokens", step_ * step_tokens_}, {"loss", st.loss},
              {"lr", st.lr}, {"grad_norm", st.grad_norm}, {"skipped", st.skipped},
              {"tokens_per_second", tps}, {"seconds", now_seconds() - t_start_}};
    if (sync_ && sync_->per_step()) line["contributors"] = st.contributors;
    write_metrics(line);
  }
  if (st.skipped && world_.speaks())
    progress_->note("step " + std::to_string(step_) + ": non-finite gradient, update skipped");
  if (sync_ && sync_->per_step() && st.contributors < K && world_.speaks())
    progress_->note("step " + std::to_string(step_) + ": " + std::to_string(K - st.contributors) +
                    " replica(s) with a non-finite gradient left out of the average");
  progress_->step(step_, st.loss, tps,
                  static_cast<double>(total_steps_ - step_) * train_seconds_ / static_cast<double>(trained_here_));
}

// One allreduce over every rank after every step: stop signals, --stop-after, the
// checkpoint clock and non-finite losses. Each rank's clock only adds a vote. An elastic
// site's stop signal is its own: it leaves at the next round boundary.
StepFlags Run::agree_after_step(const StepStats& st) {
  const bool time_due = !o_.checkpoint_dir.empty() && o_.checkpoint_minutes > 0 &&
                        now_seconds() - last_save_time_ >= 60.0 * o_.checkpoint_minutes;
  int v[4] = {o_.elastic > 0 ? 0 : pending_stop_signal(), o_.stop_after > 0 && trained_here_ >= o_.stop_after ? 1 : 0, time_due ? 1 : 0,
              std::isfinite(st.loss) ? 0 : 1};
  world_.allreduce(std::span<int>(v), ReduceOp::max);
  return {v[0], v[1] != 0, v[2] != 0, v[3] != 0};
}

// Evaluates the global model: in the outer-loop modes theta (identical on every
// replica), swapped in for the evaluation; otherwise the parameters as they are.
void Run::evaluate(std::int64_t at_step) {
  at(Activity::evaluating, at_step);
  auto& model = trainer_->model();
  if (rounds_) {
    saved_params_.assign(model.params().begin(), model.params().end());
    sync_->load_global();
    if (wte_ && shape_.stages > 1) link_->copy_tied(model.param(*wte_));
    model.push_params();
  }
  last_eval_ = trainer_->evaluate(*val_sampler_, static_cast<std::size_t>(o_.eval_sequences));
  if (rounds_) {
    std::copy(saved_params_.begin(), saved_params_.end(), model.params().begin());
    model.push_params();
  }
  if (metrics_.is_open())
    write_metrics({{"type", "eval"}, {"step", at_step}, {"tokens", at_step * step_tokens_}, {"eval_loss", last_eval_},
                   {"seconds", now_seconds() - t_start_}});
  char buf[96];
  std::snprintf(buf, sizeof buf, "eval at step %lld: val loss %.4f", static_cast<long long>(at_step), last_eval_);
  if (world_.speaks()) progress_->note(buf);
}

// The last stage's copy of the tied embedding follows the first stage's after the first
// stage synced: every stage of the cluster learns it from one flag (their schedules differ).
void Run::refresh_tied(bool first_stage_synced) {
  if (!wte_ || shape_.stages == 1) return;
  int flag = first_stage_synced ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MAX, cluster_);
  if (flag) link_->copy_tied(trainer_->model().param(*wte_));
}

// Rank 0, once: when mpirun's SIGTERM-to-SIGKILL grace is shorter than a step plus a
// checkpoint, a Ctrl-C or SIGTERM to mpirun keeps only the last checkpoint before it.
void Run::maybe_note_grace() {
  const double grace = launcher_kill_grace();
  if (grace_noted_ || !world_.speaks() || o_.quiet || grace <= 0 || o_.checkpoint_dir.empty() || trained_here_ < 2) return;
  const double need = last_step_seconds_ + last_save_seconds_;
  if (need < 0.5 * grace) return;
  grace_noted_ = true;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "dilocox-train: note: mpirun leaves the ranks %g s between SIGTERM and SIGKILL "
                "(odls_base_sigkill_timeout) and a step plus a checkpoint take %.1f s here: a Ctrl-C or SIGTERM to "
                "mpirun may keep only the last periodic checkpoint. Stop with `kill -USR1 <mpirun pid>`, or launch "
                "with `mpirun --mca odls_base_sigkill_timeout %d`",
                grace, need, static_cast<int>(std::ceil(4 * need)) + 5);
  progress_->note(buf);
}

void Run::sync_event(const dilocox::SyncStats& rs) {
  const bool agree = sync_->replicas_agree();
  if (!agree) ++mismatched_syncs_;
  if (metrics_.is_open()) {
    json dropped = json::array();
    for (const auto& d : rs.dropped) dropped.push_back({{"replica", d.replica}, {"tensor", d.tensor}});
    write_metrics({{"type", "sync"}, {"sync", rs.sync}, {"round", rs.round}, {"fragment", rs.fragment},
                   {"step", step_}, {"tokens", step_ * step_tokens_}, {"low_rank", rs.low_rank},
                   {"local_steps", rs.local_steps}, {"steps", rs.steps}, {"wire_bytes", rs.wire_bytes},
                   {"fp32_sync_bytes", rs.fp32_sync_bytes}, {"allreduce_step_bytes", rs.allreduce_step_bytes},
                   {"ratio_vs_fp32_sync", rs.ratio_vs_fp32_sync},
                   {"ratio_vs_allreduce_steps", rs.ratio_vs_allreduce_steps}, {"comm_seconds", rs.comm_seconds},
                   {"wait_seconds", rs.wait_seconds}, {"contributors", rs.contributors}, {"dropped", dropped},
                   {"replicas_identical", agree}});
  }
  for (const auto& d : rs.dropped)
    if (world_.speaks())
      progress_->note("sync " + std::to_string(rs.sync) + ": replica " + std::to_string(d.replica) +
                      " dropped (non-finite " + d.tensor + ")");
}

}  // namespace dilocox::trainer
