// CompressedReducer across K in-process replicas: bit-identical means on every rank,
// within the codec's bound of the dense mean, for both algorithms; non-contributing
// replicas left out; a corrupted payload is an Error.
#include <dilocox/comm/throttled.hpp>
#include <dilocox/reduce.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <tuple>
#include <vector>

#include "thread_ranks.hpp"

namespace dx = dilocox;
using ::testing::HasSubstr;

namespace {
std::vector<float> replica_values(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = dx::counter_normal(100 + static_cast<std::uint64_t>(rank), i) * (1.0f + (i % 7));
  return v;
}

struct Case {
  int k;
  dx::ReduceAlgorithm algo;
  dx::Codec codec;
};

std::string name(const Case& c) {
  std::string s = "K" + std::to_string(c.k) + "_" + dx::to_string(c.algo) + "_" + dx::to_string(c.codec);
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// Largest error one encoding of values of magnitude <= m can make.
double codec_bound(const dx::Codec& c, double m) {
  switch (c.encoding) {
    case dx::Encoding::f32: return 1e-6 * m;
    case dx::Encoding::f16: return m / 1024;
    case dx::Encoding::bf16: return m / 128;
    case dx::Encoding::quantized: return m / dx::quant_max(c.quant.bits);
  }
  return 0;
}
}  // namespace

class Reducer : public ::testing::TestWithParam<Case> {};

TEST_P(Reducer, EveryRankGetsTheSameMeanWithinTheCodecBound) {
  const Case c = GetParam();
  for (std::size_t n : {0, 1, 31, 1000, 4097}) {
    SCOPED_TRACE(n);
    std::vector<std::vector<float>> out(c.k);
    std::vector<std::uint64_t> wire(c.k);
    run_ranks(c.k, [&](dx::ThreadCommunicator& inner) {
      dx::ThrottledLink link(inner, {.bits_per_second = 1e15});
      dx::CompressedReducer red(c.codec, c.algo);
      const auto x = replica_values(inner.rank(), n);
      std::vector<std::uint8_t> all(c.k, 1);
      std::vector<float> mean(n);
      const auto r = red.mean(link, x, all, mean, 7);
      EXPECT_EQ(r.contributors, c.k);
      EXPECT_EQ(r.cost.bytes, link.stats().wire_bytes);  // what it reports is what went out
      out[inner.rank()] = mean;
      wire[inner.rank()] = r.cost.bytes;
    });
    for (int r = 1; r < c.k; ++r) ASSERT_EQ(out[r], out[0]) << "rank " << r << " differs";
    double m = 0;
    for (int r = 0; r < c.k; ++r)
      for (float v : replica_values(r, n)) m = std::max(m, static_cast<double>(std::fabs(v)));
    // allgather: one encoding per replica; ring: each hop re-encodes a partial sum
    // (magnitude <= K m) and the owner encodes the mean once more.
    const double hops = c.algo == dx::ReduceAlgorithm::ring ? c.k + 1.0 : 1.0;
    const double bound = hops * codec_bound(c.codec, c.k * m) + 1e-6;
    std::vector<double> dense(n, 0.0);
    for (int r = 0; r < c.k; ++r) {
      const auto v = replica_values(r, n);
      for (std::size_t i = 0; i < n; ++i) dense[i] += v[i];
    }
    for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(out[0][i], dense[i] / c.k, bound) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, Reducer,
    ::testing::Values(Case{2, dx::ReduceAlgorithm::allgather, {dx::Encoding::quantized, {.bits = 4, .block = 64}}},
                      Case{3, dx::ReduceAlgorithm::allgather, {dx::Encoding::quantized, {.bits = 8, .block = 32}}},
                      Case{4, dx::ReduceAlgorithm::allgather, {dx::Encoding::f16, {}}},
                      Case{3, dx::ReduceAlgorithm::allgather, {dx::Encoding::f32, {}}},
                      Case{2, dx::ReduceAlgorithm::ring, {dx::Encoding::quantized, {.bits = 4, .block = 64}}},
                      Case{3, dx::ReduceAlgorithm::ring, {dx::Encoding::quantized, {.bits = 4, .block = 32}}},
                      Case{4, dx::ReduceAlgorithm::ring, {dx::Encoding::quantized, {.bits = 8, .block = 128}}},
                      Case{4, dx::ReduceAlgorithm::ring, {dx::Encoding::bf16, {}}},
                      Case{1, dx::ReduceAlgorithm::ring, {dx::Encoding::quantized, {.bits = 4, .block = 64}}}),
    [](const auto& info) { return name(info.param); });

TEST(Reducer, NonContributingReplicasAreLeftOut) {
  for (auto algo : {dx::ReduceAlgorithm::allgather, dx::ReduceAlgorithm::ring}) {
    std::vector<std::vector<float>> out(3);
    run_ranks(3, [&](dx::ThreadCommunicator& c) {
      dx::CompressedReducer red({dx::Encoding::f32, {}}, algo);
      std::vector<float> x(10, static_cast<float>(c.rank() + 1));  // 1, 2, 3
      if (c.rank() == 1) x.assign(10, NAN);  // never read: rank 1 does not contribute
      const std::vector<std::uint8_t> mask = {1, 0, 1};
      std::vector<float> mean(10);
      EXPECT_EQ(red.mean(c, x, mask, mean, 0).contributors, 2);
      out[c.rank()] = mean;
    });
    for (const auto& o : out)
      for (float v : o) ASSERT_EQ(v, 2.0f) << dx::to_string(algo);  // (1 + 3) / 2
  }
}

// A transport that flips one byte of what rank `victim` receives.
class CorruptingComm : public dx::AsyncCollectives<CorruptingComm> {
 public:
  CorruptingComm(dx::ThreadCommunicator& c, int victim) : c_(&c), victim_(victim) {}
  int rank() const { return c_->rank(); }
  int size() const { return c_->size(); }
  void barrier() { c_->barrier(); }
  void allreduce_sum(std::span<float> x) { c_->allreduce_sum(x); }
  void allgather(std::span<const std::byte> s, std::span<std::byte> r) {
    c_->allgather(s, r);
    if (rank() == victim_ && !r.empty()) r[r.size() / 2 + 100] ^= std::byte{4};
  }
  void sendrecv(std::span<const std::byte> s, int d, std::span<std::byte> r, int src) {
    c_->sendrecv(s, d, r, src);
    if (rank() == victim_ && !r.empty()) r[r.size() / 2] ^= std::byte{4};
  }

 private:
  dx::ThreadCommunicator* c_;
  int victim_;
};
static_assert(dx::Communicator<CorruptingComm>);

// Every rank's error message (empty: no error) when 3 ranks reduce n ones through a
// communicator that corrupts what rank `victim` receives.
std::vector<std::string> corrupted_mean_errors(int victim, dx::Codec codec, dx::ReduceAlgorithm algorithm,
                                               std::size_t n) {
  std::vector<std::string> err(3);
  run_ranks(3, [&](dx::ThreadCommunicator& c) {
    CorruptingComm bad(c, victim);
    dx::CompressedReducer red(codec, algorithm);
    std::vector<float> x(n, 1.0f), mean(n);
    const std::vector<std::uint8_t> all = {1, 1, 1};
    try {
      red.mean(bad, x, all, mean, 0);
    } catch (const dx::Error& e) {
      err[c.rank()] = e.what();
    }
  });
  return err;
}

TEST(Reducer, CorruptedPayloadIsAnErrorNamingTheChecksum) {
  const auto err = corrupted_mean_errors(1, {dx::Encoding::quantized, {.bits = 4, .block = 64}},
                                         dx::ReduceAlgorithm::allgather, 1000);
  EXPECT_THAT(err[1], HasSubstr("checksum"));  // the rank that received bad bytes
}

TEST(Reducer, CorruptedRingHopFailsOnEveryRankWithoutHanging) {
  const auto err = corrupted_mean_errors(2, {dx::Encoding::quantized, {.bits = 8, .block = 64}},
                                         dx::ReduceAlgorithm::ring, 3000);
  for (int r = 0; r < 3; ++r) EXPECT_THAT(err[r], HasSubstr("rank 2 rejected the payload from rank 1")) << r;
  EXPECT_THAT(err[2], HasSubstr("checksum"));
}

TEST(Reducer, RejectsAMaskOfTheWrongLength) {
  run_ranks(2, [&](dx::ThreadCommunicator& c) {
    dx::CompressedReducer red({dx::Encoding::f32, {}}, dx::ReduceAlgorithm::allgather);
    std::vector<float> x(4), m(4);
    const std::vector<std::uint8_t> mask = {1};
    EXPECT_THROW(red.mean(c, x, mask, m, 0), dx::Error);
  });
}
