// The outer loop sharded over a data-parallel group (dilocox/shard.hpp): owners balanced
// by bytes and the same on every rank; share_rewritten's refusals and its result; and
// K = 2 clusters x D = 2 ranks, each rank an OuterLoop over its own tensors, against
// the unsharded loop (one rank per cluster) on the same updates: the same global model
// and local model, bit for bit (fp32 syncs), every rank of a group identical, and each
// rank's wire bytes and outer state about half, the wire's halves adding up to the
// unsharded rank's (and a payload header). The counted outer state against the heap.
#include <dilocox/comm/thread.hpp>
#include <dilocox/compress/dense.hpp>
#include <dilocox/compress/lowrank.hpp>
#include <dilocox/diloco.hpp>
#include <dilocox/shard.hpp>
#include <gtest/gtest.h>

#include <malloc.h>

#include <algorithm>
#include <array>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace dx = dilocox;

namespace {

const std::vector<std::size_t> kSizes = {3000, 40, 5000, 600, 2000, 100, 900, 64};

// The model every rank of cluster k holds, after `step` inner steps (a stand-in for the
// group's averaged gradient step: the same on the D ranks of a cluster).
void inner_step(std::vector<std::vector<float>>& t, int cluster, int step) {
  for (std::size_t i = 0; i < t.size(); ++i)
    for (std::size_t j = static_cast<std::size_t>(step) % 7; j < t[i].size(); j += 7)
      t[i][j] -= 0.01f * static_cast<float>((cluster + 1) * (1 + static_cast<int>((i + j) % 3)));
}

struct Result {
  std::vector<std::vector<float>> phi, theta;  // theta: only the tensors this rank's loop holds
  std::uint64_t wire = 0;  // what one sync of this rank's tensors puts on the wire
  std::uint64_t memory = 0;  // the loop's outer state, counted
  std::vector<int> h;  // H after each step
  std::size_t syncs = 0;
};

// K clusters x D ranks on threads; rank (k, d) runs fn(group comm, peer comm, k, d).
template <class F>
void run_grid(int K, int D, F&& fn) {
  std::vector<std::vector<dx::ThreadCommunicator>> groups, peers;
  for (int k = 0; k < K; ++k) groups.push_back(dx::make_thread_communicators(D));
  for (int d = 0; d < D; ++d) peers.push_back(dx::make_thread_communicators(K));
  std::exception_ptr first;
  std::mutex m;
  std::vector<std::thread> threads;
  for (int k = 0; k < K; ++k)
    for (int d = 0; d < D; ++d)
      threads.emplace_back([&, k, d] {
        try {
          fn(groups[static_cast<std::size_t>(k)][static_cast<std::size_t>(d)],
             peers[static_cast<std::size_t>(d)][static_cast<std::size_t>(k)], k, d);
        } catch (...) {
          std::lock_guard lock(m);
          if (!first) first = std::current_exception();
          groups[static_cast<std::size_t>(k)][static_cast<std::size_t>(d)].group().abort("failed");
          peers[static_cast<std::size_t>(d)][static_cast<std::size_t>(k)].group().abort("failed");
        }
      });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

std::vector<dx::TensorSpec> specs_of(std::span<const dx::Shape> shapes) {
  std::vector<dx::TensorSpec> specs;
  for (std::size_t i = 0; i < shapes.size(); ++i) specs.push_back({"t" + std::to_string(i), shapes[i]});
  return specs;
}

std::vector<dx::Shape> vectors_of(std::span<const std::size_t> sizes) {
  std::vector<dx::Shape> shapes;
  for (std::size_t n : sizes) shapes.push_back({n});
  return shapes;
}

// Steps of K clusters x D ranks with the outer loop sharded over each group, the loops of
// a group agreeing on H when `agree`; results by (k, d).
std::vector<std::vector<Result>> train(int K, int D, dx::OuterLoopConfig cfg, int steps,
                                       std::span<const dx::Shape> shapes = vectors_of(kSizes),
                                       std::function<dx::AnyCompressor()> make = [] { return dx::DenseCompressor(); },
                                       bool agree = true) {
  std::vector<std::vector<Result>> out(static_cast<std::size_t>(K), std::vector<Result>(static_cast<std::size_t>(D)));
  run_grid(K, D, [&](dx::ThreadCommunicator& group, dx::ThreadCommunicator& peers, int k, int d) {
    std::vector<std::vector<float>> t;
    const auto specs = specs_of(shapes);
    for (const auto& s : specs) t.emplace_back(s.shape.numel(), 0.5f);
    const auto owner = dx::shard_tensors(specs, D);
    const auto mine = dx::owned_tensors(owner, d);
    std::vector<dx::NamedTensor> params;
    for (std::size_t i : mine) params.push_back({specs[i].name, specs[i].shape, t[i]});
    dx::OuterLoopConfig c = cfg;
    if (agree && D > 1) c.group_sum = dx::group_sum(group);
    dx::OuterLoop loop(peers, params, make(), c);
    std::vector<std::span<float>> all(t.begin(), t.end());
    Result& r = out[static_cast<std::size_t>(k)][static_cast<std::size_t>(d)];
    auto share = [&] {
      std::vector<std::size_t> wrote;
      for (std::size_t i : loop.rewritten()) wrote.push_back(mine[i]);
      dx::share_rewritten(group, owner, all, wrote);
    };
    for (int s = 0; s < steps; ++s) {
      inner_step(t, k, s);
      r.syncs += loop.step().size();
      r.h.push_back(loop.local_steps());
      share();
    }
    loop.finish();
    share();
    r.phi = t;
    for (std::size_t i = 0; i < mine.size(); ++i) r.theta.emplace_back(loop.global(i).begin(), loop.global(i).end());
    std::vector<dx::TensorSpec> own;
    for (std::size_t i : mine) own.push_back(specs[i]);
    r.wire = loop.compressor().wire_bytes(own, K).value();
    r.memory = loop.memory().total();
  });
  return out;
}

}  // namespace

TEST(ShardTensors, BalancedByBytesAndTheSameOnEveryCall) {
  std::vector<dx::TensorSpec> specs;
  for (std::size_t i = 0; i < kSizes.size(); ++i) specs.push_back({"t" + std::to_string(i), {kSizes[i]}});
  for (int parts : {1, 2, 3, 4}) {
    const auto owner = dx::shard_tensors(specs, parts);
    EXPECT_EQ(owner, dx::shard_tensors(specs, parts));
    std::vector<std::size_t> load(static_cast<std::size_t>(parts), 0);
    for (std::size_t i = 0; i < owner.size(); ++i) load[static_cast<std::size_t>(owner[i])] += kSizes[i];
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(*hi - *lo, 5000u) << parts << " parts";  // never off by more than the largest tensor
  }
  EXPECT_EQ(dx::shard_tensors(specs, 2), (std::vector<int>{1, 1, 0, 1, 1, 1, 0, 1}));  // 5000+900 | 3000+2000+...
  EXPECT_THROW(dx::shard_tensors(specs, 0), dx::Error);
  EXPECT_THROW(dx::shard_tensors(specs, 9), dx::Error);  // a rank without a tensor
}

TEST(ShareRewritten, OwnersValuesReachEveryRankAndOthersAreRefused) {
  auto comms = dx::make_thread_communicators(3);
  std::vector<std::thread> threads;
  std::array<std::vector<std::vector<float>>, 3> got;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      std::vector<std::vector<float>> t = {std::vector<float>(5, float(r)), std::vector<float>(3, float(r)),
                                           std::vector<float>(4, float(r))};
      std::vector<std::span<float>> all(t.begin(), t.end());
      const std::vector<int> owner = {0, 1, 2};
      std::vector<std::size_t> wrote;
      if (r != 1) wrote = {static_cast<std::size_t>(r), static_cast<std::size_t>(r)};  // rank 1 wrote nothing
      if (r == 2) t[2][0] = -0.0f;
      dx::share_rewritten(comms[static_cast<std::size_t>(r)], owner, all, wrote);
      got[static_cast<std::size_t>(r)] = t;
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[static_cast<std::size_t>(r)][0], std::vector<float>(5, 0.0f)) << r;
    EXPECT_EQ(got[static_cast<std::size_t>(r)][1], std::vector<float>(3, float(r))) << r;  // not rewritten: untouched
    EXPECT_FALSE(std::signbit(got[static_cast<std::size_t>(r)][2][0])) << r;  // the same bits everywhere
    EXPECT_EQ(got[static_cast<std::size_t>(r)][2][1], 2.0f) << r;
  }
  run_grid(1, 2, [&](dx::ThreadCommunicator& group, dx::ThreadCommunicator&, int, int d) {
    std::vector<float> a(4), b(4);
    std::vector<std::span<float>> all{a, b};
    const std::vector<int> owner = {0, 1};
    const std::vector<std::size_t> not_mine = {static_cast<std::size_t>(1 - d)};
    EXPECT_THROW(dx::share_rewritten(group, owner, all, not_mine), dx::Error);
    EXPECT_THROW(dx::share_rewritten(group, std::vector<int>{0}, all, {}), dx::Error);
  });
}

TEST(ShardedOuterLoop, MatchesTheUnshardedLoopBitForBit) {
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "one-step delay" : "no overlap");
    dx::OuterLoopConfig cfg{.local_steps = 5, .overlap = overlap};
    const auto one = train(2, 1, cfg, 23), two = train(2, 2, cfg, 23);
    for (int k = 0; k < 2; ++k) {
      for (int d = 0; d < 2; ++d)
        EXPECT_EQ(two[static_cast<std::size_t>(k)][static_cast<std::size_t>(d)].phi, one[static_cast<std::size_t>(k)][0].phi)
            << "cluster " << k << ", dp " << d;
      EXPECT_EQ(one[static_cast<std::size_t>(k)][0].phi, one[0][0].phi);  // finish(): every replica at theta
    }
    // theta: each sharded rank holds its own tensors' part of the unsharded theta.
    std::vector<dx::TensorSpec> specs;
    for (std::size_t i = 0; i < kSizes.size(); ++i) specs.push_back({"t" + std::to_string(i), {kSizes[i]}});
    const auto owner = dx::shard_tensors(specs, 2);
    for (int d = 0; d < 2; ++d) {
      const auto mine = dx::owned_tensors(owner, d);
      for (std::size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(two[0][static_cast<std::size_t>(d)].theta[i], one[0][0].theta[mine[i]]);
      const double wire = double(two[0][static_cast<std::size_t>(d)].wire) / double(one[0][0].wire);
      const double memory = double(two[0][static_cast<std::size_t>(d)].memory) / double(one[0][0].memory);
      EXPECT_GT(wire, 0.35) << d;
      EXPECT_LT(wire, 0.65) << d;
      EXPECT_GT(memory, 0.35) << d;
      EXPECT_LT(memory, 0.65) << d;
    }
    // The bytes cross once, not twice: the halves add up to the whole, plus a payload header each.
    EXPECT_GE(two[0][0].wire + two[0][1].wire, one[0][0].wire);
    EXPECT_LE(two[0][0].wire + two[0][1].wire, one[0][0].wire + 256);
  }
}

// DiLoCoX's adaptive compression sets H from every matrix's rank: through group_sum the
// shards of a group take one H, step by step, from all the matrices' ranks (so they sync
// together); alone, each shard would follow its own. Not bit for bit the unsharded run's:
// the random streams (projector starts, probes, stochastic rounding, the ring's chunks)
// follow each loop's own layout, so the ranks and H differ by their noise (here 32
// syncs against 35).
TEST(ShardedOuterLoop, TheGroupAgreesOnTheAdaptiveH) {
  const std::vector<dx::Shape> shapes = {{96, 64}, {64, 48}, {128, 32}, {48, 48}, {64, 80}, {200}};
  auto make = [] { return dx::AnyCompressor(dx::LowRankCompressor()); };
  const dx::OuterLoopConfig cfg{.local_steps = 6, .overlap = true};
  const auto one = train(2, 1, cfg, 120, shapes, make), two = train(2, 2, cfg, 120, shapes, make);
  const auto& h = two[0][0].h;
  EXPECT_NE(*std::min_element(h.begin(), h.end()), *std::max_element(h.begin(), h.end()))
      << "H never moved: the test shows nothing";
  for (int k = 0; k < 2; ++k)
    for (int d = 0; d < 2; ++d) EXPECT_EQ(two[static_cast<std::size_t>(k)][static_cast<std::size_t>(d)].h, h) << k << ", " << d;
  const double syncs = static_cast<double>(two[0][0].syncs), syncs1 = static_cast<double>(one[0][0].syncs);
  EXPECT_NEAR(syncs, syncs1, 0.15 * syncs1);
  const auto alone = train(2, 2, cfg, 120, shapes, make, false);
  EXPECT_NE(alone[0][0].h, alone[0][1].h) << "the shards' own ranks agree: the test shows nothing";
}

// OuterLoop::memory() against what constructing the loop took from the heap (glibc's
// mallinfo2): the same within 10% (the rest is bookkeeping), and 28 bytes per parameter
// for DiLoCoX's defaults: theta, anchor, momentum 12, the sync workspace 12 (two slots of
// pseudo-gradient, one mean), error feedback 4.
TEST(OuterMemory, CountedBytesMatchTheHeap) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator: mallinfo2 does not see its blocks";
#endif
  auto comms = dx::make_thread_communicators(1);
  std::vector<std::vector<float>> t;
  std::vector<dx::NamedTensor> params;
  std::size_t n = 0;
  for (std::size_t rows : {512, 256, 384}) {
    t.emplace_back(rows * 128, 0.25f);
    params.push_back({"m" + std::to_string(rows), {rows, 128}, t.back()});
    n += rows * 128;
  }
  auto heap = [] {  // small blocks and mmapped ones
    const auto i = mallinfo2();
    return i.uordblks + i.hblkhd;
  };
  const auto before = heap();
  std::optional<dx::OuterLoop<dx::ThreadCommunicator>> loop;
  loop.emplace(comms[0], params, dx::LowRankCompressor(), dx::OuterLoopConfig{});
  const auto took = static_cast<double>(heap() - before);
  const auto m = loop->memory();
  EXPECT_NEAR(static_cast<double>(m.total()), took, 0.1 * took) << "counted " << m.total() << ", heap " << took;
  EXPECT_EQ(m.global, 4 * n);
  EXPECT_EQ(m.anchor, 4 * n);
  EXPECT_EQ(m.momentum, 4 * n);
  EXPECT_EQ(m.workspace, 12 * n);
  EXPECT_GE(m.compressor, 4 * n) << m.compressor;  // error feedback, and the projector's warm start
  EXPECT_LT(m.compressor, 6 * n) << m.compressor;
  std::vector<dx::TensorSpec> specs;
  for (const auto& p : params) specs.push_back({p.name, p.shape});
  const auto planned = dx::outer_memory(specs, loop->compressor());
  EXPECT_EQ(planned.total(), m.total());
  EXPECT_EQ(planned.workspace, m.workspace);
}
