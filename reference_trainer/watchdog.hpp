// reference_trainer/watchdog.hpp: no rank waits forever for a peer that stopped. A
// thread per rank exchanges one small heartbeat a second with rank 0 (the hub: it hears
// every rank, every rank hears it) on a duplicate of the world communicator that nothing
// else uses, so heartbeats never queue behind training traffic or the emulated WAN. Each
// carries the sender's step and what it is doing. A peer unheard for the timeout is
// lost: the hub tells every live rank, each prints one line naming the lost rank (stage,
// replica, last step heard), and the job ends (MPI_Abort, exit 1). Not here: a rank that
// is alive but never arrives at a collective (its heartbeats go on): the start agreement
// and the flag fingerprint (run_agreement.hpp) remove the causes found so far.
#pragma once

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
enum class Activity : std::int32_t { starting, agreeing, loading, training, evaluating, checkpointing, finishing };

inline const char* to_string(Activity a) {
  switch (a) {
    case Activity::starting: return "starting";
    case Activity::agreeing: return "checking its inputs";
    case Activity::loading: return "loading a checkpoint";
    case Activity::training: return "training";
    case Activity::evaluating: return "evaluating";
    case Activity::checkpointing: return "writing a checkpoint";
    case Activity::finishing: return "finishing";
  }
  return "?";
}

// "rank 2 (stage 0, replica 1)"; stages <= 0: "rank 2".
inline std::string describe_rank(int rank, int stages, int world) {
  if (stages <= 0 || world <= 1) return "rank " + std::to_string(rank);
  std::string s = "rank " + std::to_string(rank) + " (stage " + std::to_string(rank % stages);
  if (world > stages) s += ", replica " + std::to_string(rank / stages);
  return s + ")";
}

class Watchdog {
 public:
  // world: every rank (duplicated here). timeout_seconds: silence before a peer is lost.
  // stages: to name ranks (stage = rank % stages, replica = rank / stages).
  Watchdog(MPI_Comm world, double timeout_seconds, int stages) : timeout_(timeout_seconds), stages_(stages) {
    MPI_Comm_dup(world, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    thread_ = std::thread([this] { run(); });
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() { stop(); }

  void at(Activity a, std::int64_t step) {
    activity_.store(static_cast<std::int32_t>(a));
    step_.store(step);
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
  struct Message {
    std::int32_t kind = beat;
    std::int32_t activity = 0;
    std::int64_t step = 0;
    std::int32_t subject = -1;            // lost: the rank declared lost
    std::int32_t subject_activity = -1;   // lost: what it was doing when last heard (-1: never heard)
    std::int64_t subject_step = 0;
    double silent_seconds = 0;
  };
  using Clock = std::chrono::steady_clock;
  static constexpr int tag = 0x0dd0;

  struct Peer {
    Clock::time_point heard;
    Message last;           // its last heartbeat
    bool ever = false, gone = false;
    Message out;            // the buffer of the send below
    MPI_Request send = MPI_REQUEST_NULL;
  };

  void run() {
    peers_.assign(static_cast<std::size_t>(size_), Peer{});
    const auto start = Clock::now();
    for (auto& p : peers_) p.heard = start;
    MPI_Irecv(&in_, sizeof in_, MPI_BYTE, MPI_ANY_SOURCE, tag, comm_, &recv_);
    auto next_beat = start;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      drain();
      const auto now = Clock::now();
      if (now >= next_beat) {
        for (int p : targets()) send(p, Message{beat, activity_.load(), step_.load()});
        next_beat = now + std::chrono::seconds(1);
      }
      for (int p : targets()) {
        const double silent = std::chrono::duration<double>(now - peers_[p].heard).count();
        if (!peers_[p].gone && silent > timeout_) declare_lost(p, silent);
      }
      lock.lock();
      wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_; });
    }
    lock.unlock();
    say_goodbye();
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

  std::string lost_line(int subject, double silent, int activity, std::int64_t step, bool heard) const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "nothing heard for %.1f s (--collective-timeout %g)", silent, timeout_);
    std::string s = "dilocox-train: " + describe_rank(rank_, stages_, size_) + ": " +
                    describe_rank(subject, stages_, size_) + " stopped answering: " + buf;
    if (heard)
      s += "; last heard at step " + std::to_string(step) + ", " + to_string(static_cast<Activity>(activity));
    else
      s += "; never heard from";
    return s + "; ending the run";
  }

  // This rank found p silent. The hub tells the others and waits (a few seconds at most)
  // until each has printed its line; a rank that found the hub silent gives the others
  // (which heard the hub's last heartbeat at the same moment) two seconds to say so too.
  // Then the job ends.
  void declare_lost(int p, double silent) {
    const auto& peer = peers_[static_cast<std::size_t>(p)];
    std::fprintf(stderr, "%s\n", lost_line(p, silent, peer.last.activity, peer.last.step, peer.ever).c_str());
    std::fflush(stderr);
    if (rank_ == 0) {
      notice_ = Message{lost, 0, 0, p, peer.ever ? peer.last.activity : -1, peer.last.step, silent};
      int told = 0;
      for (int q = 1; q < size_; ++q) {
        auto& other = peers_[static_cast<std::size_t>(q)];
        if (q == p || other.gone) continue;
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
    std::fprintf(stderr, "%s\n",
                 lost_line(m.subject, m.silent_seconds, m.subject_activity, m.subject_step, m.subject_activity >= 0)
                     .c_str());
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

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_;
  int stages_;
  std::atomic<std::int32_t> activity_{static_cast<std::int32_t>(Activity::starting)};
  std::atomic<std::int64_t> step_{0};
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
