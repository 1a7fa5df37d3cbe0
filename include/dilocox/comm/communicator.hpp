// dilocox/comm/communicator.hpp: the Communicator concept every transport satisfies
// (thread, MPI, throttled), the Request handle of asynchronous collectives, and
// AsyncCollectives, which gives a transport its async forms by running its blocking
// collectives in order on one background thread (a progress thread).
// Needs only the standard library. Not here: any transport.
#pragma once

#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <thread>

#include "dilocox/config.hpp"

namespace dilocox {

// The handle of an asynchronous collective. wait() rethrows what the collective threw.
class Request {
 public:
  Request() = default;
  explicit Request(std::future<void> f) : f_(std::move(f)) {}
  bool valid() const { return f_.valid(); }
  void wait() {
    if (f_.valid()) f_.get();
  }
  bool test() const {
    return !f_.valid() || f_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::future<void> f_;
};

// Collectives every rank calls in the same order:
//   rank(), size()
//   allreduce_sum(span<float>)              in place, sum over ranks
//   allgather(span<const byte> send, span<byte> recv)   recv = size() blocks of send.size()
//   sendrecv(span<const byte> send, int dest, span<byte> recv, int src)   every rank at once
//   barrier()
//   iallreduce_sum, iallgather: the same, returning a Request; the buffers must stay
//   alive and untouched until wait().
template <class C>
concept Communicator = requires(C& c, std::span<float> f, std::span<const std::byte> s, std::span<std::byte> r,
                                int peer) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  c.allreduce_sum(f);
  c.allgather(s, r);
  c.sendrecv(s, peer, r, peer);
  c.barrier();
  { c.iallreduce_sum(f) } -> std::same_as<Request>;
  { c.iallgather(s, r) } -> std::same_as<Request>;
};

// Runs submitted tasks one at a time, in order, on one thread it owns (started on
// the first submit). Movable; destruction finishes the queued tasks first.
class SerialExecutor {
 public:
  SerialExecutor() : s_(std::make_unique<State>()) {}
  SerialExecutor(SerialExecutor&&) noexcept = default;
  SerialExecutor& operator=(SerialExecutor&&) noexcept = default;
  ~SerialExecutor() {
    if (!s_) return;
    {
      std::lock_guard lock(s_->m);
      s_->stop = true;
    }
    s_->cv.notify_all();
    if (s_->worker.joinable()) s_->worker.join();
  }

  Request submit(std::function<void()> task) {
    std::packaged_task<void()> job(std::move(task));
    Request r(job.get_future());
    {
      std::lock_guard lock(s_->m);
      if (!s_->worker.joinable()) s_->worker = std::thread([s = s_.get()] { loop(*s); });
      s_->queue.push_back(std::move(job));
    }
    s_->cv.notify_one();
    return r;
  }

 private:
  struct State {
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::packaged_task<void()>> queue;
    bool stop = false;
    std::thread worker;
  };

  static void loop(State& s) {
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock lock(s.m);
        s.cv.wait(lock, [&] { return s.stop || !s.queue.empty(); });
        if (s.queue.empty()) return;  // stopping, nothing left
        job = std::move(s.queue.front());
        s.queue.pop_front();
      }
      job();  // exceptions land in the future
    }
  }

  std::unique_ptr<State> s_;
};

// CRTP base: async collectives as the derived transport's blocking ones, run in
// submission order on a progress thread.
template <class Derived>
class AsyncCollectives {
 public:
  Request iallreduce_sum(std::span<float> x) {
    return executor_.submit([this, x] { self().allreduce_sum(x); });
  }
  Request iallgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    return executor_.submit([this, send, recv] { self().allgather(send, recv); });
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
  SerialExecutor executor_;
};

}  // namespace dilocox
