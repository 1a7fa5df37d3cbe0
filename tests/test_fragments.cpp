// OuterLoop's schedule: streaming fragments (each tensor synced exactly once per round,
// staggered through it, bytes per sync ~1/F), H from the compressor's agreed hint and the
// modelled overlap floor, checkpoints mid-round with fragments, and a step-budget loop
// that cannot hang however the budget falls (with and without load on the machine).
#include <dilocox/compress/dense.hpp>
#include <dilocox/compress/lowrank.hpp>
#include <dilocox/diloco.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "least_squares.hpp"
#include "thread_ranks.hpp"

namespace dx = dilocox;

namespace {

// A compressor that averages exactly (fp32 allgather) and records what each sync carried.
struct Recorder {
  struct Sync {
    std::uint64_t index;
    std::vector<std::size_t> tensors;
  };
  std::shared_ptr<std::vector<Sync>> log = std::make_shared<std::vector<Sync>>();
  double scale = 0;  // the H hint it reports (0: none)
  dx::DenseCompressor dense{{.codec = {dx::Encoding::f32, {}}}};

  void setup(std::span<const dx::TensorSpec> specs) { dense.setup(specs); }
  dx::SyncReport sync(dx::AnyCommunicator& comm, const dx::SyncInput& in, dx::TensorSpans x, dx::TensorSpans mean) {
    log->push_back({in.sync, {in.tensors.begin(), in.tensors.end()}});
    auto r = dense.sync(comm, in, x, mean);
    r.local_steps_scale = scale;
    r.local_steps_weight = scale > 0 ? 1 : 0;
    return r;
  }
  std::string describe() const { return "recorder"; }
  std::uint64_t wire_bytes(std::span<const dx::TensorSpec> s, int k) const { return dense.wire_bytes(s, k); }
};

struct Model {  // 7 tensors of different sizes, the same start on every replica
  std::vector<std::vector<float>> t;
  explicit Model(int rank) {
    for (std::size_t n : {300, 40, 500, 60, 200, 10, 90}) t.emplace_back(n, 0.0f);
    (void)rank;
  }
  std::vector<dx::NamedTensor> named() {
    std::vector<dx::NamedTensor> v;
    for (std::size_t i = 0; i < t.size(); ++i) v.push_back({"t" + std::to_string(i), {t[i].size()}, t[i]});
    return v;
  }
  void local_step(int rank, int step) {
    for (auto& x : t) x[static_cast<std::size_t>(step) % x.size()] += 0.01f * static_cast<float>(rank + 1);
  }
};

}  // namespace

TEST(Fragments, EveryTensorSyncsOncePerRoundStaggeredThroughIt) {
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap);
    std::vector<std::vector<int>> sync_steps(2);  // per rank: the steps after which a sync started
    Recorder rec;
    run_ranks(2, [&](dx::ThreadCommunicator& comm) {
      Model m(comm.rank());
      Recorder mine;
      dx::OuterLoop loop(comm, m.named(), mine, {.local_steps = 9, .fragments = 3, .overlap = overlap});
      for (int s = 1; s <= 36; ++s) {  // 4 rounds
        m.local_step(comm.rank(), s);
        if (loop.next_step_syncs()) sync_steps[static_cast<std::size_t>(comm.rank())].push_back(s);
        loop.step();
      }
      loop.finish();
      if (comm.rank() == 0) rec = mine;
    });
    EXPECT_EQ(sync_steps[0], sync_steps[1]);
    // Fragment f after step ceil((f + 1) 9 / 3) of each round: 3, 6, 9, 12, ...
    std::vector<int> want;
    for (int s = 3; s <= 36; s += 3) want.push_back(s);
    EXPECT_EQ(sync_steps[0], want);
    // Each round of 3 syncs covers every tensor exactly once.
    ASSERT_GE(rec.log->size(), 12u);
    for (std::size_t round = 0; round < 4; ++round) {
      std::map<std::size_t, int> count;
      for (std::size_t j = 0; j < 3; ++j)
        for (std::size_t t : (*rec.log)[3 * round + j].tensors) ++count[t];
      EXPECT_EQ(count.size(), 7u) << "round " << round;
      for (const auto& [t, c] : count) EXPECT_EQ(c, 1) << "tensor " << t << " round " << round;
    }
  }
}

TEST(Fragments, SplitTheElementsEvenlyAndLowerTheBytesPerSync) {
  auto peak = [](int fragments, std::uint64_t& peak_bytes, std::vector<std::size_t>& sizes) {
    run_ranks(2, [&](dx::ThreadCommunicator& comm) {  // a communicator belongs to one loop
      std::vector<std::vector<float>> t(12, std::vector<float>(1000, 0.0f));
      std::vector<dx::NamedTensor> named;
      for (std::size_t i = 0; i < t.size(); ++i) named.push_back({"t" + std::to_string(i), {1000}, t[i]});
      dx::OuterLoop loop(comm, named, dx::DenseCompressor(), {.local_steps = 4, .fragments = fragments});
      std::uint64_t p = 0;
      for (int s = 0; s < 8; ++s)
        for (const auto& st : loop.step()) p = std::max(p, st.wire_bytes);
      loop.finish();
      if (comm.rank() != 0) return;
      peak_bytes = p;
      sizes.clear();
      for (int f = 0; f < fragments; ++f) sizes.push_back(loop.fragment_tensors(f).size());
    });
  };
  std::uint64_t one = 0, four = 0;
  std::vector<std::size_t> sizes;
  peak(1, one, sizes);
  peak(4, four, sizes);
  EXPECT_EQ(sizes, (std::vector<std::size_t>{3, 3, 3, 3}));
  EXPECT_LT(four, one / 3);  // ~1/4 of the bytes per sync, plus headers
  EXPECT_GT(four, one / 5);
}

TEST(OuterLoopSchedule, HFollowsTheAgreedHintWithinItsClamps) {
  for (double scale : {0.5, 2.0, 8.0}) {
    SCOPED_TRACE(scale);
    run_ranks(2, [&](dx::ThreadCommunicator& comm) {
      Model m(comm.rank());
      Recorder rec;
      rec.scale = scale;
      dx::OuterLoop loop(comm, m.named(), rec,
                         {.local_steps = 10, .min_local_steps = 4, .max_local_steps = 30, .overlap = false});
      EXPECT_EQ(loop.local_steps(), 10);
      for (int s = 0; s < 10; ++s) m.local_step(comm.rank(), s), loop.step();
      EXPECT_EQ(loop.local_steps(), std::clamp(static_cast<int>(std::lround(10 * scale)), 4, 30));
      loop.finish();
    });
  }
}

TEST(OuterLoopSchedule, OverlapFloorComesFromModelledSecondsNotAClock) {
  // An fp32 sync of 1200 floats (+ header, checksum, status) on 1 Mbit/s: ~39 ms of link
  // time; a step is modelled at 1 ms, so H may not drop below the ~40 steps that hide it.
  run_ranks(2, [&](dx::ThreadCommunicator& comm) {
    Model m(comm.rank());
    Recorder rec;
    rec.scale = 0.1;  // asks for H = 2
    dx::OuterLoopConfig cfg{.local_steps = 20, .overlap = false, .step_seconds = 1e-3};
    cfg.link = dx::LinkConfig{.bits_per_second = 1e6, .latency_seconds = 0};
    dx::OuterLoop loop(comm, m.named(), rec, cfg);
    for (int s = 0; s < 20; ++s) m.local_step(comm.rank(), s), loop.step();
    const double bytes = static_cast<double>(*dx::AnyCompressor(Recorder{}).wire_bytes(
        std::vector<dx::TensorSpec>{{"all", {1200}}}, 2));
    const int floor = static_cast<int>(std::ceil((bytes + 4) * 8 / 1e6 / 1e-3));  // + the status exchange
    EXPECT_GE(loop.local_steps(), floor - 2);
    EXPECT_LE(loop.local_steps(), floor + 2);
    loop.finish();
  });
}

// Two replicas of a least-squares problem for `steps` inner steps under cfg, the loop
// rebuilt from its saved state before step `interrupt_at` (-1: never). Returns rank 0's
// global checksums after every step and at the end; rank 0's steps that applied a sync
// go to `applied_at`, and every applying step must have been announced by next_step_syncs().
template <class Make>
std::vector<std::uint64_t> resumed_trace(const LeastSquares& prob, const dx::OuterLoopConfig& cfg, Make make, int steps,
                                         int interrupt_at, std::vector<int>* applied_at = nullptr) {
  std::vector<std::uint64_t> hashes;
  run_ranks(2, [&](dx::ThreadCommunicator& c) {
    LeastSquaresReplica rep(prob, c.rank(), 1e-2f);
    auto tensors = [&] {
      return std::vector<dx::NamedTensor>{{"w", {48, 64}, {rep.w.data(), 48 * 64}}, {"b", {48}, {rep.b.data(), 48}}};
    };
    auto loop = std::make_unique<dx::OuterLoop<dx::ThreadCommunicator>>(c, tensors(), make(), cfg);
    for (int s = 1; s <= steps; ++s) {
      if (s == interrupt_at) {
        const auto state = loop->save_state();
        loop.reset();
        auto resumed = cfg;
        resumed.defer_start_check = true;
        loop = std::make_unique<dx::OuterLoop<dx::ThreadCommunicator>>(c, tensors(), make(), resumed);
        loop->load_state(state);
      }
      rep.adam_step();
      const bool announced = loop->next_step_syncs();
      if (!loop->step().empty()) {
        EXPECT_TRUE(announced) << "step " << s;
        if (applied_at && c.rank() == 0) applied_at->push_back(s);
      }
      if (c.rank() == 0)
        hashes.push_back(dx::checksum64(std::as_bytes(loop->global(0))) ^ dx::checksum64(std::as_bytes(loop->global(1))));
    }
    loop->finish();
    if (c.rank() == 0) hashes.push_back(dx::checksum64(std::as_bytes(loop->global(0))));
  });
  return hashes;
}

// A checkpoint between two fragments' syncs, with overlap: the loop rebuilt from it
// continues bit for bit.
TEST(Fragments, SavedStateMidRoundContinuesBitForBit) {
  const LeastSquares prob(2, 64, 48, 128, 0.05f, 7);
  const dx::OuterLoopConfig cfg{.local_steps = 10, .max_local_steps = 10, .fragments = 2};
  auto make = [] { return dx::LowRankCompressor({.rank = 4}); };
  const auto straight = resumed_trace(prob, cfg, make, 40, -1);
  EXPECT_EQ(straight, resumed_trace(prob, cfg, make, 40, 13));  // after fragment 0's sync of round 1, before fragment 1's
  EXPECT_EQ(straight, resumed_trace(prob, cfg, make, 40, 20));  // at a round's end
}

// Streaming DiLoCo (overlap_steps 2, F = 2, H = 10): each fragment's reduction starts 2
// steps before its turn and is applied and mixed at it, one in flight at a time; a
// checkpoint taken while one is in flight continues bit for bit.
TEST(Fragments, StreamingOverlapStartsTauStepsEarlyAndResumesBitForBit) {
  const LeastSquares prob(2, 64, 48, 128, 0.05f, 9);
  const dx::OuterLoopConfig cfg{.local_steps = 10, .max_local_steps = 10, .fragments = 2, .overlap = false,
                                .overlap_steps = 2, .rebase = dx::Rebase::mix, .momentum_at = dx::MomentumAt::mean};
  auto make = [] { return dx::DenseCompressor({.codec = {dx::Encoding::quantized, {.bits = 4, .block = 64}}}); };
  auto trace = [&](int interrupt_at, std::vector<int>* applied_at) {
    return resumed_trace(prob, cfg, make, 30, interrupt_at, applied_at);
  };
  std::vector<int> applied;
  const auto straight = trace(-1, &applied);
  EXPECT_EQ(applied, (std::vector<int>{5, 10, 15, 20, 25, 30}));  // each fragment at its turn
  EXPECT_EQ(straight, trace(14, nullptr));  // fragment 0 of round 2 in flight (started at step 13)
  EXPECT_EQ(straight, trace(19, nullptr));  // fragment 1 in flight (started at step 18)
}

// Settings the library will not run, and those it runs with a warning (measured unsafe).
TEST(OuterLoopSchedule, StreamingSettingsAreCheckedAndUnsafeOnesWarned) {
  run_ranks(1, [&](dx::ThreadCommunicator& c) {
    Model m(0);
    auto build = [&](dx::OuterLoopConfig cfg) { dx::OuterLoop loop(c, m.named(), Recorder{}, cfg); };
    EXPECT_THROW(build({.overlap = true, .overlap_steps = 1, .rebase = dx::Rebase::mix}), dx::Error);
    EXPECT_THROW(build({.overlap = false, .overlap_steps = 1, .rebase = dx::Rebase::keep}), dx::Error);
    EXPECT_THROW(build({.local_steps = 5, .fragments = 3, .overlap = false, .overlap_steps = 1, .rebase = dx::Rebase::mix}),
                 dx::Error);  // H 5 < (1 + 1) x 3
    EXPECT_NO_THROW(build({.local_steps = 6, .fragments = 3, .overlap = false, .overlap_steps = 1, .rebase = dx::Rebase::mix}));
    std::vector<std::string> said;
    auto log = [&](const std::string& s) { said.push_back(s); };
    const dx::NesterovConfig mu9{.momentum = 0.9f};
    build({.overlap = true, .outer = mu9, .log = log});
    ASSERT_EQ(said.size(), 1u);
    EXPECT_NE(said[0].find("one-step-delay overlap"), std::string::npos) << said[0];
    said.clear();
    build({.overlap = false, .overlap_steps = 1, .rebase = dx::Rebase::mix, .outer = mu9, .log = log});
    ASSERT_EQ(said.size(), 1u);
    EXPECT_NE(said[0].find("Streaming DiLoCo's overlap"), std::string::npos) << said[0];
    said.clear();
    build({.overlap = false, .overlap_steps = 1, .rebase = dx::Rebase::mix, .outer = dx::NesterovConfig{}, .log = log});
    build({.overlap = false, .outer = dx::NesterovConfig{}, .log = log});  // momentum 0.5: nothing to say
    EXPECT_TRUE(said.empty());
    dx::OuterLoop with_residual(c, m.named(), dx::LowRankCompressor(),
                                {.overlap = false, .momentum_at = dx::MomentumAt::mean, .outer = mu9, .log = log});
    ASSERT_EQ(said.size(), 1u);
    EXPECT_NE(said[0].find("on the reduced mean"), std::string::npos) << said[0];
  });
}

// The loop a user writes without knowing H: a step budget, step() after every step,
// finish(). Adaptive H (DiLoCoX defaults), 3 replicas, budgets that end anywhere in a
// round; half the runs beside busy threads. A hang would be a collective timeout (Error).
TEST(OuterLoopSchedule, AStepBudgetLoopNeverHangs) {
  const LeastSquares prob(3, 64, 48, 64, 0.05f, 8);
  for (int run = 0; run < 12; ++run) {
    SCOPED_TRACE(run);
    std::atomic<bool> stop{false};
    std::vector<std::thread> hogs;
    if (run % 2)
      for (int i = 0; i < 2; ++i)
        hogs.emplace_back([&] {
          volatile double x = 1;
          while (!stop) x = x * 1.0000001 + 1e-9;
        });
    const int budget = 17 + 13 * run;
    auto group = std::make_shared<dx::ThreadGroup>(3, std::chrono::seconds(60));  // a hang: an Error
    std::vector<dx::ThreadCommunicator> comms;
    for (int r = 0; r < 3; ++r) comms.emplace_back(group, r);
    std::vector<std::thread> ranks;
    std::vector<std::string> errors(3);
    std::vector<std::uint64_t> hashes(3);
    for (int r = 0; r < 3; ++r)
      ranks.emplace_back([&, r] {
        try {
          LeastSquaresReplica rep(prob, r, 1e-2f);
          dx::OuterLoop loop(comms[static_cast<std::size_t>(r)],
                             {{"w", {48, 64}, {rep.w.data(), 48 * 64}}, {"b", {48}, {rep.b.data(), 48}}},
                             dx::LowRankCompressor({.rank = 4}), {.local_steps = 7});
          for (int s = 0; s < budget; ++s) rep.adam_step(), loop.step();
          loop.finish();
          hashes[static_cast<std::size_t>(r)] = dx::checksum64(std::as_bytes(loop.global(0)));
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
          comms[static_cast<std::size_t>(r)].group().abort(e.what());
        }
      });
    for (auto& t : ranks) t.join();
    stop = true;
    for (auto& t : hogs) t.join();
    for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(hashes[1], hashes[0]);
    EXPECT_EQ(hashes[2], hashes[0]);
  }
}
