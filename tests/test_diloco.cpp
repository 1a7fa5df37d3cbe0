// OuterLoop on a problem with a known answer (least squares per replica, inner
// AdamW, optimum from the normal equations), every compressor and rebase, replicas
// bit-identical after every round, NaN replicas dropped, mismatched replicas refused.
#include <dilocox/compress/cocktail.hpp>
#include <dilocox/compress/dense.hpp>
#include <dilocox/compress/lowrank.hpp>
#include <dilocox/compress/sparse.hpp>
#include <dilocox/diloco.hpp>
#include <dilocox/comm/thread.hpp>
#include <dilocox/comm/throttled.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cmath>
#include <mutex>
#include <vector>

#include "least_squares.hpp"
#include "thread_ranks.hpp"

namespace dx = dilocox;
using ::testing::HasSubstr;

namespace {

constexpr int kDin = 128, kDout = 96;

std::vector<dx::NamedTensor> tensors(LeastSquaresReplica& rep) {
  return {{"w", {kDout, kDin}, {rep.w.data(), static_cast<std::size_t>(rep.w.size())}},
          {"b", {kDout}, {rep.b.data(), static_cast<std::size_t>(rep.b.size())}}};
}

std::uint64_t global_hash(const dx::OuterLoop<dx::ThreadCommunicator>& loop) {
  std::uint64_t h = 0;
  for (std::size_t i = 0; i < loop.tensor_count(); ++i) h ^= dx::checksum64(std::as_bytes(loop.global(i))) + i;
  return h;
}

struct RunResult {
  std::vector<double> distance;      // per replica, after finish()
  std::vector<dx::SyncStats> stats;  // rank 0's
  bool identical_every_round = true;
};

using MakeCompressor = std::function<dx::AnyCompressor()>;

// K replicas, `rounds` rounds: every round, every replica's global parameters are
// compared bit for bit through their checksum.
RunResult run(const LeastSquares& prob, const MakeCompressor& make, dx::OuterLoopConfig cfg, int rounds, float lr,
              int nan_replica = -1, int nan_round = -1) {
  RunResult res;
  res.distance.resize(prob.k);
  std::vector<std::vector<std::uint64_t>> hashes(prob.k);
  std::mutex m;
  run_ranks(prob.k, [&](dx::ThreadCommunicator& c) {
    LeastSquaresReplica rep(prob, c.rank(), lr);
    dx::OuterLoop loop(c, tensors(rep), make(), cfg);
    for (int t = 0; t < rounds; ++t) {
      for (int h = 0; h < loop.local_steps(); ++h) rep.adam_step();
      if (c.rank() == nan_replica && t == nan_round) rep.w(3, 5) = NAN;  // a poisoned batch
      const auto s = loop.end_round();
      hashes[c.rank()].push_back(global_hash(loop));
      if (c.rank() == 0) res.stats.insert(res.stats.end(), s.begin(), s.end());
    }
    const auto last = loop.finish();
    if (c.rank() == 0) res.stats.insert(res.stats.end(), last.begin(), last.end());
    hashes[c.rank()].push_back(global_hash(loop));
    std::lock_guard lock(m);
    res.distance[c.rank()] = prob.distance(rep.w.data(), rep.b.data());
  });
  for (int r = 1; r < prob.k; ++r) res.identical_every_round &= hashes[r] == hashes[0];
  return res;
}

dx::LowRankCompressorConfig lowrank_config() {
  dx::LowRankCompressorConfig c;
  c.rank = 4;
  c.adaptive_config.r_max = 16;  // AdamW's pseudo-gradients are nearly full rank: cap the growth
  return c;
}
MakeCompressor lowrank(dx::LowRankCompressorConfig c = lowrank_config()) {
  return [c] { return dx::AnyCompressor(dx::LowRankCompressor(c)); };
}

dx::OuterLoopConfig dilocox_config() {
  dx::OuterLoopConfig cfg;
  cfg.local_steps = 20;
  cfg.max_local_steps = 20;  // keep H fixed at 20 (the adaptive hint may only lower it)
  cfg.overlap = true;
  cfg.outer = dx::NesterovConfig{.lr = 0.7f, .momentum = 0.5f};
  return cfg;
}

}  // namespace

// Plain averaging: fp32 means, no overlap, outer lr 1 without momentum (FedAvg).
// DiLoCoX: low rank from 4 + int4 factors + adaptive rank, one-step-delay overlap,
// Nesterov outer step. Tolerance: 6% relative distance to the optimum of the mean
// objective. The floor is local AdamW on heterogeneous replicas (plain averaging itself
// ends near 5%).
TEST(OuterLoop, ReachesTheGlobalOptimumWithDiLoCoXAsPlainAveragingDoes) {
  const LeastSquares prob(3, kDin, kDout, 512, 0.1f, 1);
  dx::OuterLoopConfig plain;
  plain.overlap = false;
  plain.local_steps = 20;
  plain.outer = dx::NesterovConfig{.lr = 1.0f, .momentum = 0.0f};
  const MakeCompressor fp32 = [] { return dx::AnyCompressor(dx::DenseCompressor({.codec = {dx::Encoding::f32, {}}})); };
  const auto a = run(prob, fp32, plain, 100, 0.003f);
  const auto b = run(prob, lowrank(), dilocox_config(), 100, 0.003f);
  for (int r = 0; r < 3; ++r) {
    EXPECT_LT(a.distance[r], 0.06) << "plain averaging, replica " << r;
    EXPECT_LT(b.distance[r], 0.06) << "dilocox, replica " << r;
  }
  EXPECT_TRUE(a.identical_every_round);
  EXPECT_TRUE(b.identical_every_round);
  const auto& last = b.stats.back();
  EXPECT_LE(last.low_rank, 16);
  std::printf("distance to the optimum: plain averaging %.4f; dilocox %.4f (rank %.0f, %.1fx vs fp32 sync, "
              "%.1fx vs per-step allreduce)\n",
              a.distance[0], b.distance[0], last.low_rank, last.ratio_vs_fp32_sync, last.ratio_vs_allreduce_steps);
}

struct ModeCase {
  const char* name;
  MakeCompressor make;
  dx::OuterLoopConfig cfg;
  double bound = 0.5;  // relative distance after 40 rounds, from 1.0
  friend void PrintTo(const ModeCase& c, std::ostream* os) { *os << c.name; }
};

class OuterLoopModes : public ::testing::TestWithParam<ModeCase> {};

TEST_P(OuterLoopModes, ConvergeAndStayBitIdentical) {
  const LeastSquares prob(2, kDin, kDout, 256, 0.05f, 2);
  const auto r = run(prob, GetParam().make, GetParam().cfg, 40, 0.003f);
  EXPECT_TRUE(r.identical_every_round);
  for (double d : r.distance) EXPECT_LT(d, GetParam().bound) << GetParam().name;
  std::size_t applied = 0;
  for (const auto& s : r.stats) {
    ++applied;
    EXPECT_GT(s.wire_bytes, 0u);
    EXPECT_EQ(s.contributors, 2);
    EXPECT_GE(s.comm_seconds, s.hidden_seconds);
  }
  EXPECT_EQ(applied, 40u);  // every round's reduction is applied exactly once
}

namespace {
dx::OuterLoopConfig with(dx::OuterLoopConfig c, auto&& f) {
  f(c);
  return c;
}
const dx::OuterLoopConfig base = with(dx::OuterLoopConfig{}, [](auto& c) {
  c.local_steps = 10;
  c.max_local_steps = 10;
  c.outer = dx::NesterovConfig{.lr = 0.7f, .momentum = 0.5f};
});
MakeCompressor dense(dx::DenseConfig c) {
  return [c] { return dx::AnyCompressor(dx::DenseCompressor(c)); };
}
}  // namespace

INSTANTIATE_TEST_SUITE_P(
    Modes, OuterLoopModes,
    ::testing::Values(
        ModeCase{"dense_fp32", dense({.codec = {dx::Encoding::f32, {}}}), base},
        ModeCase{"dense_fp16_ring", dense({.codec = {dx::Encoding::f16, {}}, .algorithm = dx::ReduceAlgorithm::ring}),
                 base},
        ModeCase{"dense_int8_no_overlap", dense({.codec = {dx::Encoding::quantized, {.bits = 8, .block = 64}}}),
                 with(base, [](auto& c) { c.overlap = false; })},
        ModeCase{"dense_int4", dense({}), base},
        // CocktailSGD sends 2% of the entries per round (10% random x 20% top-k): slower.
        ModeCase{"cocktail", [] { return dx::AnyCompressor(dx::CocktailCompressor()); }, base, 0.8},
        ModeCase{"sparseloco", [] { return dx::AnyCompressor(dx::SparseLoCoCompressor()); },
                 with(base, [](auto& c) { c.outer.reset(); }), 0.8},
        ModeCase{"dilocox_keep", lowrank(), base},
        ModeCase{"dilocox_momentum_on_the_mean", lowrank(), with(base, [](auto& c) { c.momentum_at = dx::MomentumAt::mean; })},
        // Streaming DiLoCo: reduce 2 steps before the turn, mix alpha 0.5, momentum on the mean.
        ModeCase{"dense_int4_streaming", dense({.codec = {dx::Encoding::quantized, {.bits = 4, .block = 128}}}),
                 with(base, [](auto& c) {
                   c.overlap = false, c.overlap_steps = 2, c.rebase = dx::Rebase::mix;
                   c.momentum_at = dx::MomentumAt::mean;
                 })},
        ModeCase{"dilocox_overwrite", lowrank(), with(base, [](auto& c) { c.rebase = dx::Rebase::overwrite; })},
        ModeCase{"dilocox_blend_ring",
                 lowrank([] {
                   auto c = lowrank_config();
                   c.algorithm = dx::ReduceAlgorithm::ring;
                   return c;
                 }()),
                 with(base, [](auto& c) {
                   c.rebase = dx::Rebase::blend;
                   c.blend = 0.5f;
                 })},
        ModeCase{"dilocox_fixed_rank_no_overlap",
                 lowrank([] {
                   auto c = lowrank_config();
                   c.adaptive = false;
                   return c;
                 }()),
                 with(base, [](auto& c) { c.overlap = false; })}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(OuterLoop, NaNReplicaIsDroppedReportedAndRecovers) {
  const LeastSquares prob(3, kDin, kDout, 256, 0.05f, 3);
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap);
    std::vector<std::vector<std::string>> logs(3);
    std::vector<std::vector<dx::DroppedReplica>> dropped(3);
    std::vector<double> dist(3);
    run_ranks(3, [&](dx::ThreadCommunicator& c) {
      LeastSquaresReplica rep(prob, c.rank(), 0.003f);
      auto cfg = dilocox_config();
      cfg.overlap = overlap;
      cfg.log = [&, r = c.rank()](const std::string& msg) { logs[r].push_back(msg); };
      dx::OuterLoop loop(c, tensors(rep), dx::LowRankCompressor(lowrank_config()), cfg);
      for (int t = 0; t < 12; ++t) {
        for (int h = 0; h < loop.local_steps(); ++h) rep.adam_step();
        if (c.rank() == 1 && t == 4) rep.w(3, 5) = NAN;
        for (const auto& s : loop.end_round())
          for (const auto& d : s.dropped) dropped[c.rank()].push_back(d);
        for (std::size_t i = 0; i < loop.tensor_count(); ++i)
          for (float v : loop.global(i)) ASSERT_TRUE(std::isfinite(v)) << "round " << t;
      }
      loop.finish();
      dist[c.rank()] = prob.distance(rep.w.data(), rep.b.data());
      if (rep.w.hasNaN()) dist[c.rank()] = NAN;
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(dropped[r].size(), 1u) << "rank " << r;
      EXPECT_EQ(dropped[r][0].replica, 1);
      EXPECT_EQ(dropped[r][0].tensor, "w");
      ASSERT_EQ(logs[r].size(), 1u);
      EXPECT_THAT(logs[r][0], HasSubstr("replica 1 dropped, tensor 'w'"));
      EXPECT_TRUE(std::isfinite(dist[r])) << "replica " << r << " did not recover";
      EXPECT_LT(dist[r], 0.8);
    }
  }
}

TEST(OuterLoop, MismatchedReplicasGetAnErrorNamingTheTensorOnEveryRank) {
  struct Case {
    const char* what;
    std::function<std::vector<dx::NamedTensor>(int, std::vector<float>&)> params;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"name",
       [](int r, std::vector<float>& buf) {
         return std::vector<dx::NamedTensor>{{"a", {4, 4}, {buf.data(), 16}},
                                             {r == 2 ? "bias" : "b", {4}, {buf.data() + 16, 4}}};
       },
       "tensor 1 'b"},
      {"shape",
       [](int r, std::vector<float>& buf) {
         return std::vector<dx::NamedTensor>{{"a", r == 0 ? dx::Shape{2, 8} : dx::Shape{4, 4}, {buf.data(), 16}}};
       },
       "tensor 0 'a'"},
      {"count",
       [](int r, std::vector<float>& buf) {
         std::vector<dx::NamedTensor> p{{"a", {4, 4}, {buf.data(), 16}}};
         if (r == 1) p.push_back({"b", {4}, {buf.data() + 16, 4}});
         return p;
       },
       "number of tensors"},
      {"initial values",
       [](int r, std::vector<float>& buf) {
         if (r == 1) buf[17] = 2.0f;
         return std::vector<dx::NamedTensor>{{"a", {4, 4}, {buf.data(), 16}}, {"b", {4}, {buf.data() + 16, 4}}};
       },
       "different weights: tensor 1 'b'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<std::string> err(3);
    run_ranks(3, [&](dx::ThreadCommunicator& comm) {
      std::vector<float> buf(20, 1.0f);
      try {
        dx::OuterLoop loop(comm, c.params(comm.rank(), buf), dx::LowRankCompressor{}, dx::OuterLoopConfig{});
      } catch (const dx::Error& e) {
        err[comm.rank()] = e.what();
      }
    });
    for (int r = 0; r < 3; ++r) EXPECT_THAT(err[r], HasSubstr(c.expect)) << "rank " << r;
  }
  std::vector<std::string> err(2);
  run_ranks(2, [&](dx::ThreadCommunicator& comm) {
    std::vector<float> buf(16, 1.0f);
    try {
      dx::OuterLoop loop(comm, {{"a", {4, 4}, {buf.data(), 16}}}, dx::LowRankCompressor({.rank = comm.rank() == 0 ? 4 : 8}));
    } catch (const dx::Error& e) {
      err[comm.rank()] = e.what();
    }
  });
  for (const auto& e : err) EXPECT_THAT(e, HasSubstr("configuration"));
}

TEST(OuterLoop, OverlapHidesTheLinkBehindCompute) {
  // 2 replicas over an emulated link: each reduction takes >= 40 ms (two 20 ms hops);
  // each round computes for 80 ms. With overlap the trainer should barely wait.
  const LeastSquares prob(2, kDin, kDout, 64, 0.05f, 4);
  std::vector<double> hidden(2), comm_s(2);
  run_ranks(2, [&](dx::ThreadCommunicator& c) {
    dx::ThrottledLink link(c, {.bits_per_second = 1e9, .latency_seconds = 0.02});
    LeastSquaresReplica rep(prob, c.rank(), 0.003f);
    auto lc = lowrank_config();
    lc.adaptive = false;
    dx::OuterLoop loop(link, tensors(rep), dx::LowRankCompressor(lc), dilocox_config());
    for (int t = 0; t < 6; ++t) {
      for (int h = 0; h < loop.local_steps(); ++h) rep.adam_step();
      std::this_thread::sleep_for(std::chrono::milliseconds(80));  // the rest of a real step's compute
      for (const auto& s : loop.end_round())
        if (t > 1) hidden[c.rank()] += s.hidden_seconds, comm_s[c.rank()] += s.comm_seconds;
    }
    loop.finish();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(comm_s[r], 3 * 0.04);
    EXPECT_GT(hidden[r] / comm_s[r], 0.8) << "replica " << r;
  }
}

// A replica that takes another's state (a site joining a running group) starts from
// theta and owes nothing: its phi is theta, its error feedback is empty, and the group
// still holds identical global parameters after the next sync. Not with a reduction in
// flight (overlap).
TEST(OuterLoop, RestartFromGlobalTakesThetaAndDropsTheDebt) {
  const LeastSquares prob(2, kDin, kDout, 64, 0.05f, 6);
  std::vector<std::uint64_t> hash(2);
  run_ranks(2, [&](dx::ThreadCommunicator& c) {
    LeastSquaresReplica rep(prob, c.rank(), 0.003f);
    auto cfg = dilocox_config();
    cfg.overlap = false;
    dx::OuterLoop loop(c, tensors(rep), dx::SparseLoCoCompressor(), cfg);
    for (int t = 0; t < 3; ++t) {
      for (int h = 0; h < loop.local_steps(); ++h) rep.adam_step();
      loop.end_round();
    }
    const auto* sparse = loop.compressor().get<dx::SparseLoCoCompressor>();
    const auto owed = [&] {
      double s = 0;
      for (std::size_t i = 0; i < loop.tensor_count(); ++i)
        for (float v : sparse->accumulator(i)) s += std::abs(v);
      return s;
    };
    EXPECT_GT(owed(), 0.0);
    if (c.rank() == 1) {
      loop.restart_from_global();
      EXPECT_EQ(owed(), 0.0);
      EXPECT_TRUE(std::equal(loop.global(0).begin(), loop.global(0).end(), rep.w.data()));
      EXPECT_TRUE(std::equal(loop.global(1).begin(), loop.global(1).end(), rep.b.data()));
    }
    for (int h = 0; h < loop.local_steps(); ++h) rep.adam_step();
    loop.end_round();
    hash[static_cast<std::size_t>(c.rank())] = global_hash(loop);
    loop.finish();
  });
  EXPECT_EQ(hash[0], hash[1]);
  run_ranks(2, [&](dx::ThreadCommunicator& c) {
    LeastSquaresReplica rep(prob, c.rank(), 0.003f);
    dx::OuterLoop loop(c, tensors(rep), dx::SparseLoCoCompressor(), dilocox_config());  // overlap on
    for (int h = 0; h < loop.local_steps(); ++h) rep.adam_step();
    loop.end_round();
    std::string what;
    try {
      loop.restart_from_global();
    } catch (const dx::Error& e) {
      what = e.what();
    }
    EXPECT_THAT(what, HasSubstr("in flight"));
    loop.finish();
  });
}

// A checkpoint of the outer loop mid-run (with a reduction in flight under overlap):
// a fresh loop that loads it continues bit for bit as the uninterrupted one.
TEST(OuterLoop, SavedStateContinuesBitForBit) {
  const LeastSquares prob(2, kDin, kDout, 128, 0.05f, 5);
  const std::vector<std::pair<const char*, MakeCompressor>> makers = {
      {"dilocox", lowrank()},
      {"cocktail", [] { return dx::AnyCompressor(dx::CocktailCompressor()); }},
      {"dense int8 + error feedback",
       dense({.codec = {dx::Encoding::quantized, {.bits = 8, .block = 64}}, .error_feedback = true})},
      {"sparseloco", [] { return dx::AnyCompressor(dx::SparseLoCoCompressor()); }},
  };
  for (const auto& [name, make] : makers) {
    SCOPED_TRACE(name);
    auto trace = [&, make = make](bool interrupt) {
      std::vector<std::uint64_t> hashes;
      run_ranks(prob.k, [&](dx::ThreadCommunicator& c) {
        LeastSquaresReplica rep(prob, c.rank(), 1e-2f);
        auto loop = std::make_unique<dx::OuterLoop<dx::ThreadCommunicator>>(c, tensors(rep), make(), dilocox_config());
        for (int t = 0; t < 8; ++t) {
          if (interrupt && t == 4) {
            const auto state = loop->save_state();
            loop.reset();
            auto cfg = dilocox_config();
            cfg.defer_start_check = true;  // phi differs between replicas mid-run (keep rebase)
            loop = std::make_unique<dx::OuterLoop<dx::ThreadCommunicator>>(c, tensors(rep), make(), cfg);
            loop->load_state(state);
          }
          for (int h = 0; h < loop->local_steps(); ++h) rep.adam_step();
          loop->end_round();
          if (c.rank() == 0) hashes.push_back(global_hash(*loop));
        }
        loop->finish();
        if (c.rank() == 0) hashes.push_back(global_hash(*loop));
      });
      return hashes;
    };
    EXPECT_EQ(trace(false), trace(true));
  }
}

TEST(OuterLoop, LoadStateRefusesAForeignState) {
  const LeastSquares prob(2, kDin, kDout, 128, 0.05f, 5);
  run_ranks(prob.k, [&](dx::ThreadCommunicator& c) {
    LeastSquaresReplica rep(prob, c.rank(), 1e-2f);
    dx::OuterLoop loop(c, tensors(rep), dx::LowRankCompressor{}, dilocox_config());
    auto state = loop.save_state();
    state.resize(state.size() / 2);
    dx::OuterLoop fresh(c, tensors(rep), dx::LowRankCompressor{}, dilocox_config());
    EXPECT_THROW(fresh.load_state(state), dx::Error);
    const std::vector<std::byte> junk(64, std::byte{7});
    EXPECT_THROW(fresh.load_state(junk), dx::Error);
  });
}
