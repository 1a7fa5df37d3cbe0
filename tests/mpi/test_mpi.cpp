// The distributed layer across processes: MpiCommunicator collectives, compressed
// reductions bit-identical on every rank, OuterLoop on the known-answer problem,
// NaN replicas dropped and mismatched replicas refused. Run under mpiexec with 2-4
// ranks; every rank runs every test, rank 0 prints.
#include <dilocox/comm/mpi.hpp>
#include <dilocox/compress/lowrank.hpp>
#include <dilocox/diloco.hpp>
#include <dilocox/reduce.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../least_squares.hpp"

namespace dx = dilocox;
using ::testing::HasSubstr;

static_assert(dx::Communicator<dx::MpiCommunicator>);

namespace {

// The checksums of `bytes` on every rank.
std::vector<std::uint64_t> gather_hash(dx::MpiCommunicator& c, std::span<const std::byte> bytes) {
  std::uint64_t h = dx::checksum64(bytes);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(c.size()));
  c.allgather(std::as_bytes(std::span(&h, 1)), std::as_writable_bytes(std::span(all)));
  return all;
}

std::vector<float> replica_values(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = dx::counter_normal(200 + static_cast<std::uint64_t>(rank), i);
  return v;
}

}  // namespace

TEST(MpiCommunicator, CollectivesMoveTheRightBytes) {
  dx::MpiCommunicator c(MPI_COMM_WORLD);
  const int k = c.size(), me = c.rank();
  std::vector<float> v(1000, static_cast<float>(me + 1));
  c.allreduce_sum(v);
  EXPECT_EQ(v[999], k * (k + 1) / 2.0f);
  std::vector<std::byte> s(7, std::byte(me)), r(7 * k);
  c.allgather(s, r);
  for (int q = 0; q < k; ++q) EXPECT_EQ(r[q * 7 + 6], std::byte(q));
  std::vector<std::byte> got(3), mine(3, std::byte(50 + me));
  c.sendrecv(mine, (me + 1) % k, got, (me - 1 + k) % k);
  EXPECT_EQ(got[0], std::byte(50 + (me - 1 + k) % k));
  auto req = c.iallgather(s, r);
  req.wait();
  c.barrier();
}

TEST(MpiCommunicator, AllgatherSizeMismatchIsAnErrorOnEveryRank) {
  dx::MpiCommunicator c(MPI_COMM_WORLD);
  std::vector<std::byte> s(c.rank() == 1 ? 5 : 4), r(s.size() * c.size());
  try {
    c.allgather(s, r);
    ADD_FAILURE() << "no error";
  } catch (const dx::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("disagree on the message size"));
  }
}

TEST(CompressedReducer, BitIdenticalOnEveryRankWithinTheBound) {
  dx::MpiCommunicator c(MPI_COMM_WORLD);
  const int k = c.size();
  for (auto algo : {dx::ReduceAlgorithm::allgather, dx::ReduceAlgorithm::ring})
    for (int bits : {4, 8}) {
      SCOPED_TRACE(std::string(dx::to_string(algo)) + " int" + std::to_string(bits));
      const dx::Codec codec{dx::Encoding::quantized, {.bits = bits, .block = 64}};
      dx::CompressedReducer red(codec, algo);
      const std::size_t n = 10007;
      const auto x = replica_values(c.rank(), n);
      std::vector<std::uint8_t> all(k, 1);
      std::vector<float> mean(n);
      red.mean(c, x, all, mean, 3);
      const auto hashes = gather_hash(c, std::as_bytes(std::span(mean)));
      for (int r = 1; r < k; ++r) EXPECT_EQ(hashes[r], hashes[0]) << "rank " << r << " differs";
      double m = 0;
      for (int r = 0; r < k; ++r)
        for (float v : replica_values(r, n)) m = std::max(m, static_cast<double>(std::fabs(v)));
      const double hops = algo == dx::ReduceAlgorithm::ring ? k + 1.0 : 1.0;
      const double bound = hops * k * m / dx::quant_max(bits) + 1e-6;
      std::vector<double> dense(n, 0.0);
      for (int r = 0; r < k; ++r) {
        const auto v = replica_values(r, n);
        for (std::size_t i = 0; i < n; ++i) dense[i] += v[i];
      }
      for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(mean[i], dense[i] / k, bound) << i;
    }
}

TEST(OuterLoop, KnownAnswerUnderMpi) {
  dx::MpiCommunicator c(MPI_COMM_WORLD);
  dx::MpiCommunicator check(MPI_COMM_WORLD);  // the loop's communicator is busy in the background
  const LeastSquares prob(c.size(), 128, 96, 512, 0.1f, 1);
  LeastSquaresReplica rep(prob, c.rank(), 0.003f);
  dx::OuterLoopConfig cfg;  // DiLoCoX at its defaults, H 20, rank from 4 up to 16
  cfg.local_steps = 20;
  cfg.max_local_steps = 20;
  dx::LowRankCompressorConfig lc;
  lc.rank = 4;
  lc.adaptive_config.r_max = 16;
  dx::OuterLoop loop(c, {{"w", {96, 128}, {rep.w.data(), 96 * 128}}, {"b", {96}, {rep.b.data(), 96}}},
                     dx::LowRankCompressor(lc), cfg);
  for (int t = 0; t < 100; ++t) {
    for (int h = 0; h < loop.local_steps(); ++h) rep.adam_step();
    if (!loop.end_round().empty()) {
      const auto h = gather_hash(check, std::as_bytes(loop.global(0)));
      for (int r = 1; r < c.size(); ++r) ASSERT_EQ(h[r], h[0]) << "round " << t;
    }
  }
  loop.finish();
  EXPECT_LT(prob.distance(rep.w.data(), rep.b.data()), 0.06);
}

TEST(OuterLoop, NaNReplicaIsDroppedOnEveryRank) {
  dx::MpiCommunicator c(MPI_COMM_WORLD);
  const LeastSquares prob(c.size(), 64, 48, 128, 0.05f, 2);
  LeastSquaresReplica rep(prob, c.rank(), 0.003f);
  dx::OuterLoopConfig cfg;
  cfg.local_steps = 5;
  std::vector<std::string> log;
  cfg.log = [&](const std::string& m) { log.push_back(m); };
  dx::OuterLoop loop(c, {{"w", {48, 64}, {rep.w.data(), 48 * 64}}, {"b", {48}, {rep.b.data(), 48}}}, dx::LowRankCompressor{}, cfg);
  int dropped = 0;
  for (int t = 0; t < 6; ++t) {
    for (int h = 0; h < loop.local_steps(); ++h) rep.adam_step();
    if (c.rank() == c.size() - 1 && t == 2) rep.b[7] = INFINITY;
    for (const auto& s : loop.end_round()) dropped += static_cast<int>(s.dropped.size());
    for (float v : loop.global(1)) ASSERT_TRUE(std::isfinite(v));
  }
  loop.finish();
  EXPECT_EQ(dropped, 1);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_THAT(log[0], HasSubstr("replica " + std::to_string(c.size() - 1) + " dropped, tensor 'b'"));
  EXPECT_TRUE(rep.b.allFinite());
}

TEST(OuterLoop, MismatchedShapesAreAnErrorOnEveryRank) {
  dx::MpiCommunicator c(MPI_COMM_WORLD);
  std::vector<float> buf(16, 1.0f);
  const dx::Shape shape = c.rank() == 0 ? dx::Shape{8, 2} : dx::Shape{4, 4};
  try {
    dx::OuterLoop loop(c, {{"layer.weight", shape, {buf.data(), 16}}}, dx::LowRankCompressor{}, dx::OuterLoopConfig{});
    ADD_FAILURE() << "no error";
  } catch (const dx::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 0 'layer.weight'"));
  }
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) delete ::testing::UnitTest::GetInstance()->listeners().Release(
      ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  int failed = RUN_ALL_TESTS(), any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any) std::fprintf(stderr, "test_mpi: a test failed on some rank\n");
  MPI_Finalize();
  return any;
}
