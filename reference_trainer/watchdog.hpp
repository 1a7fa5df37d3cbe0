// reference_trainer/watchdog.hpp: no rank waits forever for a peer that stopped or hangs.
// A thread per rank exchanges one small heartbeat a second with rank 0 (the hub: it hears
// every rank, every rank hears it) on a duplicate of the world communicator that nothing
// else uses, so heartbeats never queue behind training traffic or the emulated WAN. Each
// carries the sender's step and what it is doing. Two faults end the job (MPI_Abort, exit
// 1) with one line per live rank naming the culprit (stage, replica, step, activity):
//   - silence: a peer unheard for --collective-timeout (dead, stopped, its node gone);
//   - no progress: a rank whose step and activity have not changed for the progress
//     deadline (max of --progress-timeout and 5x the longest activity seen), judged by
//     the hub: alive but stuck, e.g. in a write to a hung filesystem. The rank named is
//     the one stuck longest among those not waiting for the others' saves (the others
//     wait for it in a collective; a collective the stuck rank never reaches looks alike
//     on every rank, and then the longest wins).
// A pause is not a fault: time this thread did not run (the job stopped with SIGSTOP or
// Ctrl-Z, the VM suspended) is not counted as anyone's silence or lack of progress, so a
// resumed job waits for fresh heartbeats before judging. Not here: a rank that never
// arrives at a collective for a reason of its own flags: the start agreement and the
// flag fingerprint (run_agreement.hpp) remove the causes found so far.
#pragma once

#include "layout.hpp"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dilocox::trainer {

// What a rank is doing, as heartbeats report it.
enum class Activity : std::int32_t {
  starting, agreeing, loading, training, evaluating, checkpointing, waiting_for_saves, finishing
};

inline const char* to_string(Activity a) {
  switch (a) {
    case Activity::starting: return "starting";
    case Activity::agreeing: return "checking its inputs";
    case Activity::loading: return "loading a checkpoint";
    case Activity::training: return "training";
    case Activity::evaluating: return "evaluating";
    case Activity::checkpointing: return "writing a checkpoint";
    case Activity::waiting_for_saves: return "waiting for the other ranks' checkpoints";
    case Activity::finishing: return "finishing";
  }
  return "?";
}

class Watchdog {
 public:
  // world: every rank (duplicated here). timeout_seconds: silence before a peer is lost.
  // progress_seconds: the least time at one step and activity before a rank is stuck
  // (0: never). layout: to name ranks (stages <= 0: by number only); first_rank: the
  // layout's rank of world's rank 0 (one job per site: the site's first).
  Watchdog(MPI_Comm world, double timeout_seconds, double progress_seconds, RankLayout layout, int first_rank = 0)
      : timeout_(timeout_seconds), progress_(progress_seconds), layout_(layout), first_rank_(first_rank) {
    MPI_Comm_dup(world, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    thread_ = std::thread([this] { run(); });
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() { stop(); }

  void at(Activity a, std::int64_t step) {
    const auto code = static_cast<std::int32_t>(a);
    if (activity_.load() == code && step_.load() == step) return;
    activity_.store(code);
    step_.store(step);
    since_.store(Clock::now().time_since_epoch().count());
  }

  // The normal end (every rank calls it after its last collective): says goodbye so no
  // peer mistakes the silence for a fault, then joins the thread and frees the copy.
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
    MPI_Comm_free(&comm_);
  }

 private:
  enum Kind : std::int32_t { beat, bye, lost, ack };
  enum Reason : std::int32_t { silent, stuck };
  struct Message {
    std::int32_t kind = beat;
    std::int32_t activity = 0;
    std::int64_t step = 0;
    std::int32_t subject = -1;            // lost: the rank declared lost
    std::int32_t subject_activity = -1;   // lost: what it was doing when last heard (-1: never heard)
    std::int64_t subject_step = 0;
    double silent_seconds = 0;            // lost: seconds unheard (silent) or at one step and activity (stuck)
    std::int32_t reason = silent;         // lost: why
    double limit_seconds = 0;             // lost, stuck: the progress deadline that passed
    double still_seconds = 0;             // beat: how long the sender has been at this step and activity
  };
  using Clock = std::chrono::steady_clock;
  static constexpr int tag = 0x0dd0;

  struct Peer {
    Clock::time_point heard;
    Clock::time_point changed;  // the hub: when its step or activity last changed
    Message last;           // its last heartbeat
    bool ever = false, gone = false;
    Message out;            // the buffer of the send below
    MPI_Request send = MPI_REQUEST_NULL;
  };

  void run() {
    peers_.assign(static_cast<std::size_t>(size_), Peer{});
    const auto start = Clock::now();
    for (auto& p : peers_) p.heard = p.changed = start;
    MPI_Irecv(&in_, sizeof in_, MPI_BYTE, MPI_ANY_SOURCE, tag, comm_, &recv_);
    auto next_beat = start, last_turn = start;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      const auto now = Clock::now();
      if (now - last_turn > std::chrono::seconds(1)) {  // this thread did not run (a pause): not silence
        const auto paused = now - last_turn - turn;
        for (auto& p : peers_) p.heard += paused, p.changed += paused;
        since_.fetch_add(std::chrono::duration_cast<Clock::duration>(paused).count());
        next_beat = now;
      }
      last_turn = now;
      drain();
      if (now >= next_beat) {
        for (int p : targets()) send(p, own_beat(now));
        next_beat = now + std::chrono::seconds(1);
      }
      for (int p : targets()) {
        const double unheard = std::chrono::duration<double>(now - peers_[p].heard).count();
        if (!peers_[p].gone && unheard > timeout_) declare_lost(p, unheard);
      }
      if (rank_ == 0 && progress_ > 0) judge_progress(now);
      lock.lock();
      wake_.wait_for(lock, turn, [this] { return stopping_; });
    }
    lock.unlock();
    say_goodbye();
  }

  Message own_beat(Clock::time_point now) const {
    Message m{beat, activity_.load(), step_.load()};
    m.still_seconds = std::chrono::duration<double>(now - Clock::time_point(Clock::duration(since_.load()))).count();
    return m;
  }

  // The hub: records when each rank's (step, activity) changed (the sender's own count of
  // seconds since, so a heartbeat's delay does not move it), itself included, and ends
  // the job when one has stayed put past the deadline.
  void note_progress(Peer& peer, const Message& m, Clock::time_point now) {
    if (peer.ever && m.activity == peer.last.activity && m.step == peer.last.step) return;
    const auto changed = now - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(m.still_seconds));
    if (peer.ever) longest_ = std::max(longest_, std::chrono::duration<double>(changed - peer.changed).count());
    peer.changed = changed;
  }

  void judge_progress(Clock::time_point now) {
    auto& self = peers_[0];
    const Message mine = own_beat(now);
    note_progress(self, mine, now);
    self.last = mine;
    self.ever = true;
    const double limit = std::max(progress_, 5 * longest_);
    // Once one rank is past the deadline, the culprit is the rank stuck longest among
    // those not waiting for the others' saves (a rank waiting is stuck because of
    // someone); all ranks that have stayed put for half the deadline are candidates, since
    // on a loaded machine the culprit may have entered its activity a little after the
    // ranks that now wait for it.
    int worst = -1, waiting = -1;
    double worst_for = 0, waiting_for = 0, longest_still = 0;
    for (int p = 0; p < size_; ++p) {
      const auto& peer = peers_[static_cast<std::size_t>(p)];
      if (peer.gone || !peer.ever) continue;
      const double still = std::chrono::duration<double>(now - peer.changed).count();
      longest_still = std::max(longest_still, still);
      if (still < 0.5 * limit) continue;
      const bool waits = peer.last.activity == static_cast<std::int32_t>(Activity::waiting_for_saves);
      if (waits && still > waiting_for) waiting = p, waiting_for = still;
      if (!waits && still > worst_for) worst = p, worst_for = still;
    }
    if (longest_still <= limit) return;
    if (worst < 0) worst = waiting, worst_for = waiting_for;
    if (worst >= 0) declare_stuck(worst, worst_for, limit);
  }

  // The hub talks to everyone; the others to the hub.
  std::vector<int> targets() const {
    std::vector<int> t;
    if (rank_ != 0) return {0};
    for (int p = 1; p < size_; ++p) t.push_back(p);
    return t;
  }

  void send(int p, const Message& m) {
    auto& peer = peers_[static_cast<std::size_t>(p)];
    if (peer.gone) return;
    if (peer.send != MPI_REQUEST_NULL) {  // at most one message in flight per peer
      int done = 0;
      MPI_Test(&peer.send, &done, MPI_STATUS_IGNORE);
      if (!done) return;
    }
    peer.out = m;
    MPI_Isend(&peer.out, sizeof peer.out, MPI_BYTE, p, tag, comm_, &peer.send);
  }

  // Handles every message that has arrived.
  void drain() {
    for (;;) {
      int done = 0;
      MPI_Status st;
      MPI_Test(&recv_, &done, &st);
      if (!done) return;
      const Message m = in_;
      const int from = st.MPI_SOURCE;
      MPI_Irecv(&in_, sizeof in_, MPI_BYTE, MPI_ANY_SOURCE, tag, comm_, &recv_);
      auto& peer = peers_[static_cast<std::size_t>(from)];
      if (m.kind == beat) {
        peer.heard = Clock::now();
        if (rank_ == 0) note_progress(peer, m, peer.heard);
        peer.last = m;
        peer.ever = true;
      } else if (m.kind == bye) {
        peer.gone = true;
      } else if (m.kind == lost) {
        told_lost(m);
      } else if (m.kind == ack) {
        ++acks_;
      }
    }
  }

  std::string lost_line(const Message& m) const {
    char buf[192];
    if (m.reason == stuck)
      std::snprintf(buf, sizeof buf,
                    "made no progress for %.1f s (deadline %.1f s: --progress-timeout %g, or 5x the longest step or "
                    "activity seen)",
                    m.silent_seconds, m.limit_seconds, progress_);
    else
      std::snprintf(buf, sizeof buf, "stopped answering: nothing heard for %.1f s (--collective-timeout %g)",
                    m.silent_seconds, timeout_);
    std::string s = "dilocox-train: " + layout_.describe(first_rank_ + rank_) + ": " +
                    layout_.describe(first_rank_ + m.subject) + " " + buf;
    if (m.reason == stuck)
      s += "; still " + std::string(to_string(static_cast<Activity>(m.subject_activity))) + " at step " +
           std::to_string(m.subject_step);
    else if (m.subject_activity >= 0)
      s += "; last heard at step " + std::to_string(m.subject_step) + ", " +
           to_string(static_cast<Activity>(m.subject_activity));
    else
      s += "; never heard from";
    return s + "; ending the run";
  }

  Message notice_of(int p, double seconds, Reason reason, double limit) const {
    const auto& peer = peers_[static_cast<std::size_t>(p)];
    Message m{lost, 0, 0, p, peer.ever ? peer.last.activity : -1, peer.last.step, seconds};
    m.reason = reason;
    m.limit_seconds = limit;
    return m;
  }

  void declare_lost(int p, double seconds) { end_for(notice_of(p, seconds, silent, 0)); }
  void declare_stuck(int p, double still, double limit) { end_for(notice_of(p, still, stuck, limit)); }

  // This rank found a fault (m names the rank). The hub tells the others and waits (a
  // few seconds at most) until each has printed its line; a rank that found the hub
  // silent gives the others (which heard the hub's last heartbeat at the same moment) two
  // seconds to say so too. Then the job ends.
  void end_for(const Message& m) {
    std::fprintf(stderr, "%s\n", lost_line(m).c_str());
    std::fflush(stderr);
    if (rank_ == 0) {
      notice_ = m;
      int told = 0;
      for (int q = 1; q < size_; ++q) {
        auto& other = peers_[static_cast<std::size_t>(q)];
        if ((q == m.subject && m.reason == silent) || other.gone) continue;
        if (other.send != MPI_REQUEST_NULL) MPI_Request_free(&other.send);  // a heartbeat still queued: let it go
        MPI_Isend(&notice_, sizeof notice_, MPI_BYTE, q, tag, comm_, &other.send);
        ++told;
      }
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (acks_ < told && Clock::now() < deadline) {
        drain();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    end_job();
  }

  void told_lost(const Message& m) {
    std::fprintf(stderr, "%s\n", lost_line(m).c_str());
    std::fflush(stderr);
    send(0, Message{ack});
    const auto deadline = Clock::now() + std::chrono::seconds(10);  // the hub ends the job; if not, this rank does
    while (Clock::now() < deadline) {
      drain();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    end_job();
  }

  [[noreturn]] static void end_job() {
    ::alarm(15);  // should MPI_Abort not return control to the launcher, SIGALRM ends this process
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  void say_goodbye() {
    for (int p : targets()) {
      auto& peer = peers_[static_cast<std::size_t>(p)];
      if (peer.gone) continue;
      if (peer.send != MPI_REQUEST_NULL) MPI_Request_free(&peer.send);  // its buffer is left alone
      MPI_Isend(&farewell_, sizeof farewell_, MPI_BYTE, p, tag, comm_, &peer.send);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    for (auto& peer : peers_) {
      while (peer.send != MPI_REQUEST_NULL && Clock::now() < deadline) {
        int done = 0;
        MPI_Test(&peer.send, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (peer.send != MPI_REQUEST_NULL) MPI_Request_free(&peer.send);
    }
    MPI_Cancel(&recv_);
    MPI_Wait(&recv_, MPI_STATUS_IGNORE);
  }

  static constexpr auto turn = std::chrono::milliseconds(100);  // the thread's period

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_;
  double progress_;
  double longest_ = 0;  // the hub: the longest any rank has stayed at one step and activity
  RankLayout layout_;
  int first_rank_ = 0;
  std::atomic<std::int32_t> activity_{static_cast<std::int32_t>(Activity::starting)};
  std::atomic<std::int64_t> step_{0};
  std::atomic<Clock::rep> since_{Clock::now().time_since_epoch().count()};  // when step_ or activity_ changed
  std::vector<Peer> peers_;  // the thread's own
  Message in_;
  Message notice_;                  // the hub's "lost" message, sent to every live rank
  const Message farewell_{bye};
  MPI_Request recv_ = MPI_REQUEST_NULL;
  int acks_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dilocox::trainer
