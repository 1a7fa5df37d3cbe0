// Communicators: ThreadCommunicator collectives (bit-identical sums, gathers, ring
// shifts, async forms, errors instead of hangs) and ThrottledLink's exact accounting
// of bytes on the wire under each collective's real algorithm.
#include <dilocox/comm/thread.hpp>
#include <dilocox/comm/throttled.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "thread_ranks.hpp"

namespace dx = dilocox;
using ::testing::HasSubstr;

static_assert(dx::Communicator<dx::ThreadCommunicator>);
static_assert(dx::Communicator<dx::ThrottledLink<dx::ThreadCommunicator>>);

namespace {
std::vector<float> values_of(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(rank * 131 + i)) * 1e-3f + static_cast<float>(rank);
  return v;
}
}  // namespace

class ThreadComm : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Ranks, ThreadComm, ::testing::Values(1, 2, 3, 4));

TEST_P(ThreadComm, AllreduceSumIsBitIdenticalAndCorrect) {
  const int k = GetParam();
  std::vector<std::vector<float>> results(k);
  run_ranks(k, [&](dx::ThreadCommunicator& c) {
    auto v = values_of(c.rank(), 1001);
    c.allreduce_sum(v);
    results[c.rank()] = v;
  });
  for (int r = 1; r < k; ++r) EXPECT_EQ(results[r], results[0]);
  for (std::size_t i = 0; i < 1001; ++i) {
    double want = 0;
    for (int r = 0; r < k; ++r) want += values_of(r, 1001)[i];
    ASSERT_NEAR(results[0][i], want, 1e-5 * (1 + std::fabs(want)));
  }
}

TEST_P(ThreadComm, AllgatherSendrecvBarrierAndAsync) {
  const int k = GetParam();
  run_ranks(k, [&](dx::ThreadCommunicator& c) {
    const int me = c.rank();
    std::vector<std::byte> send(5, std::byte(me)), recv(5 * k);
    c.allgather(send, recv);
    for (int r = 0; r < k; ++r) ASSERT_EQ(recv[r * 5 + 4], std::byte(r));
    std::vector<std::byte> got(3);
    std::vector<std::byte> mine(3, std::byte(100 + me));
    c.sendrecv(mine, (me + 1) % k, got, (me - 1 + k) % k);
    EXPECT_EQ(got[0], std::byte(100 + (me - 1 + k) % k));
    c.barrier();
    auto v = values_of(me, 64);
    auto req = c.iallreduce_sum(v);
    auto req2 = c.iallgather(send, recv);  // queued behind the first, in order
    req.wait();
    req2.wait();
    EXPECT_TRUE(req.test());
    EXPECT_NEAR(v[0], k * (k - 1) / 2.0 + 0.0, 1e-2);
  });
}

TEST(ThreadComm, SizeMismatchIsAnErrorOnEveryRank) {
  std::vector<std::string> errors(3);
  run_ranks(3, [&](dx::ThreadCommunicator& c) {
    std::vector<float> v(c.rank() == 1 ? 7 : 8);
    try {
      c.allreduce_sum(v);
    } catch (const dx::Error& e) {
      errors[c.rank()] = e.what();
    }
  });
  for (const auto& e : errors) EXPECT_THAT(e, HasSubstr("rank 1 gave 28 bytes"));
}

TEST(ThreadComm, MissingRankTimesOutWithAnError) {
  auto group = std::make_shared<dx::ThreadGroup>(2, std::chrono::milliseconds(100));
  dx::ThreadCommunicator c(group, 0);  // rank 1 never arrives
  EXPECT_THROW(c.barrier(), dx::Error);
  EXPECT_THROW(c.barrier(), dx::Error);  // the group stays aborted
}

TEST(ThreadComm, AsyncErrorsSurfaceAtWait) {
  auto group = std::make_shared<dx::ThreadGroup>(2, std::chrono::milliseconds(50));
  dx::ThreadCommunicator c(group, 0);
  std::vector<float> v(4);
  auto req = c.iallreduce_sum(v);
  EXPECT_THROW(req.wait(), dx::Error);
}

TEST(WireCost, FormulasMatchTheRingAlgorithms) {
  EXPECT_EQ(dx::ring_allreduce_cost(1200, 4).bytes, 1800u);  // 2 (K-1)/K S
  EXPECT_EQ(dx::ring_allreduce_cost(1200, 4).hops, 6);
  EXPECT_EQ(dx::ring_allgather_cost(100, 4).bytes, 300u);    // (K-1) S
  EXPECT_EQ(dx::ring_allgather_cost(100, 4).hops, 3);
  EXPECT_EQ(dx::ring_allreduce_cost(1200, 1).bytes, 0u);
  EXPECT_EQ(dx::barrier_cost(5).hops, 3);
  EXPECT_NEAR(dx::link_seconds({1000, 2}, {.bits_per_second = 8000, .latency_seconds = 0.5}), 2.0, 1e-12);
}

TEST_P(ThreadComm, ThrottledLinkCountsBytesExactly) {
  const int k = GetParam();
  std::vector<dx::LinkStats> stats(k);
  run_ranks(k, [&](dx::ThreadCommunicator& inner) {
    dx::ThrottledLink link(inner, {.bits_per_second = 1e12, .latency_seconds = 0});
    std::vector<float> v(1000);
    link.allreduce_sum(v);                                  // 2 (K-1)/K 4000
    std::vector<std::byte> s(300), r(300 * k);
    link.allgather(s, r);                                   // (K-1) 300
    link.iallgather(s, r).wait();                           // async counts too
    std::vector<std::byte> a(50), b(50);
    link.sendrecv(a, (inner.rank() + 1) % k, b, (inner.rank() - 1 + k) % k);  // 50
    link.barrier();                                         // 0
    stats[inner.rank()] = link.stats();
  });
  const std::uint64_t want = k == 1 ? 0 : 2ull * (k - 1) * 4000 / k + 2ull * (k - 1) * 300 + 50;
  for (const auto& s : stats) {
    EXPECT_EQ(s.wire_bytes, want);
    EXPECT_EQ(s.collectives, 5u);
  }
}

TEST(ThrottledLink, EachCollectiveTakesAtLeastItsModelledTime) {
  run_ranks(2, [&](dx::ThreadCommunicator& inner) {
    // 8e5 bits/s, 10 ms per hop: an allreduce of 4000 bytes (4000 on the wire, 2 hops)
    // takes >= 0.02 + 0.04 s.
    dx::ThrottledLink link(inner, {.bits_per_second = 8e5, .latency_seconds = 0.01});
    std::vector<float> v(1000);
    const auto t0 = std::chrono::steady_clock::now();
    link.allreduce_sum(v);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(s, 0.06);
    EXPECT_NEAR(link.stats().link_seconds, 0.06, 1e-6);
    EXPECT_GE(link.stats().wall_seconds, 0.06);
  });
}

// Two stages x two clusters; each cluster's two ranks share one uplink. Every rank sends
// 4000 bytes at 1.6e5 bits/s (0.2 s alone), all four at once: on a shared uplink one of
// each cluster's two waits for the other's bytes (0.4 s; >= 0.3 s allows the threads'
// starts 0.1 s apart); apart, both take 0.2 s.
TEST(ThrottledLink, RanksOfASiteQueueOnItsSharedUplink) {
  for (const bool shared : {true, false}) {
    std::int64_t free_at[2] = {0, 0};  // cluster 0's uplink, cluster 1's
    std::vector<dx::SharedUplink> uplinks = {dx::SharedUplink(&free_at[0]), dx::SharedUplink(&free_at[1])};
    std::vector<std::vector<dx::ThreadCommunicator>> stages;  // stage s: its two clusters' ranks
    stages.push_back(dx::make_thread_communicators(2));
    stages.push_back(dx::make_thread_communicators(2));
    std::vector<double> seconds(4);
    std::barrier start(4);
    std::vector<std::thread> t;
    for (int s = 0; s < 2; ++s)
      for (int k = 0; k < 2; ++k)
        t.emplace_back([&, s, k] {
          dx::ThrottledLink link(stages[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)],
                                 {.bits_per_second = 1.6e5, .latency_seconds = 0},
                                 shared ? &uplinks[static_cast<std::size_t>(k)] : nullptr);
          std::vector<float> v(1000);
          start.arrive_and_wait();
          link.allreduce_sum(v);  // 2 (K-1)/K x 4000 = 4000 bytes from each rank
          seconds[static_cast<std::size_t>(2 * s + k)] = link.stats().link_seconds;
        });
    for (auto& th : t) th.join();
    for (int k = 0; k < 2; ++k) {  // per cluster: the first to queue, the second
      const double lo = std::min(seconds[static_cast<std::size_t>(k)], seconds[static_cast<std::size_t>(2 + k)]);
      const double hi = std::max(seconds[static_cast<std::size_t>(k)], seconds[static_cast<std::size_t>(2 + k)]);
      EXPECT_GE(lo, 0.2 - 1e-6) << "cluster " << k;
      if (shared) EXPECT_GE(hi, 0.3) << "cluster " << k;
      else EXPECT_NEAR(hi, 0.2, 1e-6) << "cluster " << k;
    }
  }
}

TEST(ThrottledLink, RejectsBadLinkSettings) {
  auto comms = dx::make_thread_communicators(1);
  EXPECT_THROW(dx::ThrottledLink(comms[0], {.bits_per_second = 0}), dx::Error);
  EXPECT_THROW(dx::ThrottledLink(comms[0], {.bits_per_second = 1e9, .latency_seconds = -1}), dx::Error);
  EXPECT_THROW(dx::ThrottledLink(comms[0], {.bits_per_second = NAN}), dx::Error);
}
