// reference_trainer/run_elastic.cpp: the step loop of elastic sites (--elastic; world.hpp's
// ElasticGroup between one-rank sites). Each sync and the round boundary after it are a
// transaction: before the sync the site keeps a snapshot (parameters, AdamW, outer state,
// step; the last two); at the boundary leavers go (a site that got SIGTERM says goodbye)
// and joiners are admitted and given the state. When any collective fails, the survivors
// form the next membership (ElasticGroup::recover) and all roll back to the latest
// snapshot every one of them holds, then replay from there: the result is identical on
// every live site. A joining site takes the state from a live one (join_running()).
#include "run.hpp"

#include "stop_signals.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace dilocox::trainer {

#ifdef DILOCOX_TRAINER_GLOO

namespace {
std::string site_list(const std::vector<int>& sites) {
  std::string s;
  for (int x : sites) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return "{" + s + "}";
}
}  // namespace

ElasticGroup& Run::group() { return *world_.elastic(); }

void Run::train_loop_elastic() {
  bool skipped_since_sync = false, replay_sync = false;
  StepStats st{};
  keep_snapshot(/*before_sync=*/false);
  while (step_ < total_steps_) {
    try {
      if (!replay_sync) {
        at(Activity::training, step_);
        if (fault_.first == step_ + 1 && fault_.second == replica_) trainer_->inject_nan_next_step();
        const double t0 = now_seconds();
        st = trainer_->train_step(step_, total_steps_, *train_sampler_);
        sync_->count_dense_step();
        ++step_;
        ++trained_here_;
        skipped_since_sync = skipped_since_sync || st.skipped;
        last_step_seconds_ = now_seconds() - t0;
        train_seconds_ += last_step_seconds_;
      }
      replay_sync = false;
      const bool syncs = sync_->next_step_syncs();
      if (syncs) keep_snapshot(/*before_sync=*/true);
      after_rounds_step(skipped_since_sync);
      log_step(st);
      const StepFlags f = agree_after_step(st);
      if (syncs && at_boundary()) return;
      nonfinite_streak_ = f.nonfinite ? nonfinite_streak_ + 1 : 0;
      if (nonfinite_streak_ >= o_.max_nonfinite_steps) {
        diverged_ = true;
        return;
      }
      if (f.stop_after && step_ < total_steps_) {
        interrupted_ = true;
        if (world_.speaks()) progress_->note("dilocox-train: --stop-after " + std::to_string(o_.stop_after) + " reached");
        return;
      }
      if (o_.eval_every > 0 && step_ % o_.eval_every == 0 && step_ < total_steps_) evaluate(step_);
    } catch (const dilocox::Error& e) {
      replay_sync = roll_back(e.what());
    }
  }
}

// This site's state at this step, before its sync or after (at the start, after a
// membership change): the last three, by point = 2 x step + (after the sync ? 1 : 0).
void Run::keep_snapshot(bool before_sync) {
  snapshots_.insert_or_assign(2 * step_ + (before_sync ? 0 : 1), Snapshot{make_checkpoint(false), before_sync});
  while (snapshots_.size() > 3) snapshots_.erase(snapshots_.begin());
}

// The round boundary after a sync: leavers go, joiners come. True: this site left.
bool Run::at_boundary() {
  const auto change = group().at_boundary(pending_stop_signal() != 0);
  if (std::count(change.left.begin(), change.left.end(), world_.site()) > 0) {
    left_ = true;
    if (world_.speaks())
      progress_->note("dilocox-train: site " + std::to_string(world_.site()) + " left the run at step " +
                      std::to_string(step_) + " (" + signal_name(pending_stop_signal()) + "); the others go on");
    return true;
  }
  if (!change.changed()) return false;
  const Checkpoint state = make_checkpoint(false);
  group().share_state([&] { return state.bytes(); });
  rebuild_sync(state);  // the parameters and AdamW stay as they are
  check_same_global();
  keep_snapshot(/*before_sync=*/false);  // the point a joiner starts from
  membership_event("change", step_, 0.0,
                   "joined " + site_list(change.joined) + ", left " + site_list(change.left));
  return false;
}

// After a failed collective: the survivors' membership, and this site back at the latest
// point every survivor holds a snapshot of. True: the point is before a sync (replay it).
// A site without that snapshot (it joined at that boundary) takes a holder's copy as a
// joining site does.
bool Run::roll_back(const std::string& why) {
  const double t0 = now_seconds();
  const std::int64_t held = snapshots_.empty() ? -1 : snapshots_.rbegin()->first;
  const std::int64_t target = group().recover(held);
  const double waited = now_seconds() - t0;
  const auto it = snapshots_.find(target);
  const bool have = it != snapshots_.end();
  const auto got = group().share_state([&] { return it->second.state.bytes(); }, !have);
  if (have) {
    const Snapshot snap = it->second;
    snapshots_.erase(std::next(it), snapshots_.end());
    adopt(snap.state);
  } else {
    snapshots_.clear();
    adopt(Checkpoint::parse(*got, "the state from a live site"));
    sync_->loop()->restart_from_global();
    trainer_->model().push_params();
  }
  step_ = target / 2;
  check_same_global();
  membership_event("lost", step_, waited, why);
  return target % 2 == 0;  // before a sync: replay it
}

// This site's state becomes `c` (a snapshot, or the state the membership shares): the
// outer loop is rebuilt over the current members, which must then hold the same global
// parameters.
void Run::adopt(const Checkpoint& c) {
  trainer_->load(c);
  rebuild_sync(c);
}
// The outer loop over the current members, from c's outer state.
void Run::rebuild_sync(const Checkpoint& c) {
  sync_.reset();
  make_sync(/*resuming=*/true);
  load_sync_state(c);
}
void Run::load_sync_state(const Checkpoint& c) {
  const std::string state = c.get_text("cluster_sync");
  sync_->load_state(std::as_bytes(std::span<const char>(state.data(), state.size())));
}
void Run::check_same_global() {
  if (!sync_->replicas_agree())
    throw Error("site " + std::to_string(world_.site()) + " holds other global parameters than the run's other sites");
}

// A site admitted into a running group: the run's state from a live site. Its replica
// starts from the global parameters and owes nothing (OuterLoop::restart_from_global).
void Run::join_running() {
  const auto got = group().share_state([]() -> std::vector<std::byte> { throw Error("a joining site holds no state"); });
  joined_.emplace(Checkpoint::parse(*got, "the state from a live site"));
  step_ = json::parse(joined_->get_text("meta")).at("step").get<std::int64_t>();
}
void Run::load_joined() {
  trainer_->load(*joined_);
  load_sync_state(*joined_);
  sync_->loop()->restart_from_global();
  trainer_->model().push_params();
  check_same_global();
  joined_.reset();
  membership_event("joined", step_, 0.0, "");
}

void Run::membership_event(const char* kind, std::int64_t at_step, double waited, const std::string& why) {
  const auto& sites = group().sites();
  if (metrics_.is_open())
    write_metrics({{"type", "membership"}, {"event", kind}, {"step", at_step}, {"epoch", group().epoch()},
                   {"sites", sites}, {"waited_seconds", waited}, {"why", why}});
  if (!world_.speaks()) return;
  char buf[96];
  std::snprintf(buf, sizeof buf, " (waited %.2f s)", waited);
  const std::string what = std::string(kind) == "lost"      ? "a site was lost" + std::string(buf) + ": " + why.substr(0, 160)
                           : std::string(kind) == "joined" ? "joined the run"
                                                           : why;
  progress_->note("dilocox-train: site " + std::to_string(world_.site()) + ", step " + std::to_string(at_step) +
                  ": " + what + "; sites " + site_list(sites) + " train on (epoch " + std::to_string(group().epoch()) +
                  ")");
}

#else

void Run::train_loop_elastic() { throw Error("internal: --elastic without Gloo"); }
void Run::join_running() { throw Error("internal: --elastic without Gloo"); }
void Run::load_joined() { throw Error("internal: --elastic without Gloo"); }

#endif

}  // namespace dilocox::trainer
