// dilocox/comm/throttled.hpp: ThrottledLink<C>, an emulated wide-area link around
// any Communicator. It counts the bytes each rank puts on the wire under the
// collective's real algorithm and stretches every collective to at least
//   latency x hops + bytes x 8 / bandwidth,
// so one machine shows what a 1 Gbit/s, 20 ms WAN does to a schedule. Several links
// can share one uplink (SharedUplink: a site's link, shared by all its ranks): then the
// bytes x 8 / bandwidth part of every collective queues behind what the others have
// queued, and the collective ends when its bytes have gone, plus latency x hops.
//   ring allreduce of S bytes:  2 (K-1)/K x S bytes, 2 (K-1) hops
//   ring allgather, S per rank: (K-1) x S bytes,      K-1 hops
//   sendrecv of S bytes:        S bytes,              1 hop
//   barrier (dissemination):    0 bytes,              ceil(log2 K) hops
// Not here: packet loss or jitter; the inner transport's own time counts toward the floor.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <type_traits>

#include "dilocox/comm/communicator.hpp"
#include "dilocox/comm/cost.hpp"
#include "dilocox/config.hpp"

namespace dilocox {


// A site's uplink shared by several ThrottledLinks, in threads or processes: one
// number, the steady-clock time (ns) at which the link will have sent all that is queued
// on it. It lives wherever every sharer sees it (a member for threads; shared memory for
// processes of one host, where steady_clock is the host's CLOCK_MONOTONIC).
class SharedUplink {
 public:
  using clock = std::chrono::steady_clock;
  // `free_at` must outlive the uplink; zero it (or any past time) before the first use.
  explicit SharedUplink(std::int64_t* free_at) : free_at_(free_at) {
    detail::require(free_at != nullptr, "SharedUplink", "needs the shared word");
  }
  // Queues `seconds` of sending, to start no earlier than `now`; returns when it ends.
  clock::time_point queue(clock::time_point now, double seconds) {
    std::atomic_ref<std::int64_t> at(*free_at_);
    const std::int64_t t = now.time_since_epoch().count(), d = static_cast<std::int64_t>(seconds * 1e9);
    std::int64_t was = at.load(), end = 0;
    do end = std::max(was, t) + d;
    while (!at.compare_exchange_weak(was, end));
    return clock::time_point(clock::duration(end));
  }

 private:
  static_assert(std::is_same_v<std::chrono::steady_clock::duration, std::chrono::nanoseconds>);
  static_assert(std::atomic_ref<std::int64_t>::is_always_lock_free, "processes share the word lock-free");
  std::int64_t* free_at_;
};

struct LinkStats {
  std::uint64_t wire_bytes = 0;   // bytes this rank put on the wire
  std::uint64_t collectives = 0;
  double link_seconds = 0;        // modelled time of those collectives
  double wall_seconds = 0;        // time spent inside them, delays included
};

template <Communicator C>
class ThrottledLink : public AsyncCollectives<ThrottledLink<C>> {
 public:
  // With `uplink`, this link's bytes queue on the uplink it shares with others.
  ThrottledLink(C& inner, LinkConfig link, SharedUplink* uplink = nullptr)
      : inner_(&inner), link_(link), uplink_(uplink) {
    detail::require(std::isfinite(link.bits_per_second) && link.bits_per_second > 0, "ThrottledLink",
                    "bandwidth must be a positive number of bits/s");
    detail::require(std::isfinite(link.latency_seconds) && link.latency_seconds >= 0, "ThrottledLink",
                    "latency must be >= 0 seconds");
  }
  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  const LinkConfig& link() const { return link_; }
  C& inner() { return *inner_; }

  void allreduce_sum(std::span<float> x) {
    timed(ring_allreduce_cost(x.size_bytes(), size()), [&] { inner_->allreduce_sum(x); });
  }
  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    timed(ring_allgather_cost(send.size(), size()), [&] { inner_->allgather(send, recv); });
  }
  void sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src) {
    timed(sendrecv_cost(send.size(), size()), [&] { inner_->sendrecv(send, dest, recv, src); });
  }
  void barrier() {
    timed(barrier_cost(size()), [&] { inner_->barrier(); });
  }

  // Counters since construction or the last reset; safe to read from any thread.
  LinkStats stats() const {
    return {wire_bytes_.load(), collectives_.load(), link_ns_.load() * 1e-9, wall_ns_.load() * 1e-9};
  }
  void reset_stats() { wire_bytes_ = 0, collectives_ = 0, link_ns_ = 0, wall_ns_ = 0; }

 private:
  template <class F>
  void timed(WireCost cost, F&& op) {
    using std::chrono::duration, std::chrono::duration_cast, std::chrono::steady_clock;
    const auto t0 = steady_clock::now();
    op();
    const double send = static_cast<double>(cost.bytes) * 8.0 / link_.bits_per_second;
    auto ticks = [](double s) { return duration_cast<steady_clock::duration>(duration<double>(s)); };
    const auto sent = uplink_ ? uplink_->queue(t0, send) : t0 + ticks(send);
    const auto until = sent + ticks(link_.latency_seconds * cost.hops);
    const double floor = duration<double>(until - t0).count();
    std::this_thread::sleep_until(until);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    wire_bytes_ += cost.bytes;
    collectives_ += 1;
    link_ns_ += static_cast<std::uint64_t>(floor * 1e9);
    wall_ns_ += static_cast<std::uint64_t>(wall * 1e9);
  }

  C* inner_;
  LinkConfig link_;
  SharedUplink* uplink_;
  std::atomic<std::uint64_t> wire_bytes_{0}, collectives_{0}, link_ns_{0}, wall_ns_{0};
};

}  // namespace dilocox
