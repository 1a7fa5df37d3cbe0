// dilocox/comm/thread.hpp: ThreadCommunicator, K ranks as threads of one process
// sharing a ThreadGroup: the embedded transport for tests and demos. Reductions sum
// in rank order, so every rank gets bit-identical results. A rank that fails can
// abort() the group, and a collective that waits longer than the group's timeout
// throws: a missing rank is an Error, never a hang. Not a transport between processes.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "dilocox/comm/communicator.hpp"
#include "dilocox/config.hpp"

namespace dilocox {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size, std::chrono::milliseconds timeout = std::chrono::minutes(5))
      : size_(size), timeout_(timeout), slots_(static_cast<std::size_t>(size)) {
    detail::require(size >= 1, "ThreadGroup", "size must be >= 1, got " + std::to_string(size));
  }
  int size() const { return size_; }

  // Wakes every waiting and future collective with an Error carrying `why`.
  void abort(const std::string& why) {
    {
      std::lock_guard lock(m_);
      if (aborted_.empty()) aborted_ = why.empty() ? "aborted" : why;
    }
    cv_.notify_all();
  }

 private:
  friend class ThreadCommunicator;
  struct Slot {
    const void* send = nullptr;
    std::size_t bytes = 0;
    int peer = -1;
  };

  void arrive_and_wait(int rank, const char* op) {
    std::unique_lock lock(m_);
    if (!aborted_.empty()) throw Error(std::string("ThreadCommunicator::") + op + ": group aborted: " + aborted_);
    const std::size_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, timeout_, [&] { return generation_ != gen || !aborted_.empty(); })) {
      aborted_ = "rank " + std::to_string(rank) + " timed out in " + op;
      cv_.notify_all();
    }
    if (generation_ == gen)
      throw Error(std::string("ThreadCommunicator::") + op + ": group aborted: " + aborted_);
  }

  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<Slot> slots_;  // (size) what each rank posted for the current collective
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::size_t generation_ = 0;
  std::string aborted_;
};

class ThreadCommunicator : public AsyncCollectives<ThreadCommunicator> {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank) : group_(std::move(group)), rank_(rank) {
    detail::require(group_ != nullptr, "ThreadCommunicator", "null group");
    detail::require(rank >= 0 && rank < group_->size(), "ThreadCommunicator",
                    "rank " + std::to_string(rank) + " outside [0, " + std::to_string(group_->size()) + ")");
  }
  int rank() const { return rank_; }
  int size() const { return group_->size(); }
  ThreadGroup& group() { return *group_; }

  void barrier() { group_->arrive_and_wait(rank_, "barrier"); }

  void allreduce_sum(std::span<float> x) {
    post(x.data(), x.size_bytes(), -1, "allreduce_sum");
    check_equal_sizes("allreduce_sum");
    scratch_.resize(x.size());  // (n) this rank's sum, host
    std::fill(scratch_.begin(), scratch_.end(), 0.0f);
    for (int k = 0; k < size(); ++k) {  // fixed order: bit-identical on every rank
      const auto* src = static_cast<const float*>(group_->slots_[k].send);
      for (std::size_t i = 0; i < x.size(); ++i) scratch_[i] += src[i];
    }
    group_->arrive_and_wait(rank_, "allreduce_sum");  // everyone has read every input
    std::copy(scratch_.begin(), scratch_.end(), x.begin());
  }

  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    post(send.data(), send.size(), -1, "allgather");
    check_equal_sizes("allgather");
    detail::require(recv.size() == send.size() * static_cast<std::size_t>(size()), "ThreadCommunicator::allgather",
                    "receive buffer has " + std::to_string(recv.size()) + " bytes, needs " +
                        std::to_string(send.size() * static_cast<std::size_t>(size())));
    for (int k = 0; k < size(); ++k)
      if (send.size()) std::memcpy(recv.data() + k * send.size(), group_->slots_[k].send, send.size());
    group_->arrive_and_wait(rank_, "allgather");
  }

  void sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src) {
    detail::require(dest >= 0 && dest < size() && src >= 0 && src < size(), "ThreadCommunicator::sendrecv",
                    "peer outside the group");
    post(send.data(), send.size(), dest, "sendrecv");
    const ThreadGroup::Slot from = group_->slots_[src];  // a copy: the slot is reused after the barrier
    const bool ok = from.peer == rank_ && from.bytes == recv.size();
    if (ok && recv.size()) std::memcpy(recv.data(), from.send, recv.size());
    group_->arrive_and_wait(rank_, "sendrecv");
    detail::require(ok, "ThreadCommunicator::sendrecv",
                    "rank " + std::to_string(src) + " sent " + std::to_string(from.bytes) + " bytes to rank " +
                        std::to_string(from.peer) + ", rank " + std::to_string(rank_) + " expected " +
                        std::to_string(recv.size()));
  }

 private:
  void post(const void* p, std::size_t bytes, int peer, const char* op) {
    group_->slots_[rank_] = {p, bytes, peer};  // own slot; published by the barrier
    group_->arrive_and_wait(rank_, op);
  }

  // Every rank sees the same slots, so every rank throws the same Error (no hang).
  void check_equal_sizes(const char* op) {
    for (int k = 1; k < size(); ++k)
      if (group_->slots_[k].bytes != group_->slots_[0].bytes) {
        const std::string msg = "rank 0 gave " + std::to_string(group_->slots_[0].bytes) + " bytes, rank " +
                                std::to_string(k) + " gave " + std::to_string(group_->slots_[k].bytes) + " bytes";
        group_->arrive_and_wait(rank_, op);
        throw Error(std::string("ThreadCommunicator::") + op + ": " + msg);
      }
  }

  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  std::vector<float> scratch_;
};

// K communicators over one new group: element k is rank k.
inline std::vector<ThreadCommunicator> make_thread_communicators(int size) {
  auto group = std::make_shared<ThreadGroup>(size);
  std::vector<ThreadCommunicator> comms;
  comms.reserve(static_cast<std::size_t>(size));
  for (int k = 0; k < size; ++k) comms.emplace_back(group, k);
  return comms;
}

}  // namespace dilocox
