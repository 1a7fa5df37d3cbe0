// SparseLoCo: the compressor against an oracle of its reference (sparseloco_oracle.hpp:
// tiles, top-k per tile, the 4-bin codebook per tensor), the tiled code (round trip,
// the format refusing bad indices and the retired chunked kind), error-feedback
// conservation, what it keeps owed, and its mean, bit-identical on K = 2, 3, 4 replicas.
#include <dilocox/compress/sparse.hpp>
#include <dilocox/sparse_code.hpp>
#include <dilocox/wire.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "sparseloco_oracle.hpp"
#include "thread_ranks.hpp"

namespace dx = dilocox;
using ::testing::HasSubstr;

namespace {

std::vector<float> values(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = dx::counter_normal(seed, i) * (1.0f + static_cast<float>(i % 5));
  return v;
}

// One sync of one replica with error decay 0: the mean is what it sent, decoded.
std::vector<float> sent_by_one_replica(const dx::TensorSpec& spec, const std::vector<float>& x,
                                       dx::SparseLoCoConfig cfg) {
  cfg.error_decay = 0;
  std::vector<float> mean(x.size());
  run_ranks(1, [&](dx::ThreadCommunicator& comm) {
    dx::SparseLoCoCompressor c(cfg);
    c.setup(std::vector<dx::TensorSpec>{spec});
    dx::AnyCommunicator any(comm);
    std::vector<float> in = x;
    const std::vector<std::size_t> all{0};
    const std::vector<std::uint8_t> contributes{1};
    std::vector<std::span<float>> xs{in}, means{mean};
    c.sync(any, {all, contributes, 0}, xs, means);
  });
  return mean;
}

void write_checksum(std::vector<std::byte>& p) {
  const std::size_t end = p.size() - 8;
  const std::uint64_t sum = dx::checksum64(std::span<const std::byte>(p).first(end));
  std::memcpy(p.data() + end, &sum, 8);
}

}  // namespace

// The known answer by hand: (4) = [1, -2, 3, 0.5], k = 2: the tile is the whole vector,
// |3| and |-2| are kept; shift 0.5, both centred values +-2.5 lie within half a step
// (6 sigma / 4 = 5.30) of the centre, so both fall in bin 2 and decode to its mean 0.5.
TEST(SparseLoCoOracle, HandWorkedVector) {
  const std::vector<float> x{1, -2, 3, 0.5f};
  const auto o = oracle::sparseloco_round(x, 1, 4, 2);
  EXPECT_EQ(o.kept, (std::vector<std::size_t>{1, 2}));
  EXPECT_EQ(o.decoded, (std::vector<double>{0, 0.5, 0.5, 0}));
  EXPECT_EQ(sent_by_one_replica({"v", {4}}, x, {.k = 2}), (std::vector<float>{0, 0.5f, 0.5f, 0}));
}

// The compressor keeps the oracle's positions and decodes to its values, on shapes that
// exercise each tiling rule: divisors below 64, a vector in runs, a vector longer than a
// tile, a prime length (tiles of one), a 3-D tensor, k above the tile, an odd tile.
TEST(SparseLoCoOracle, CompressorMatchesTheReference) {
  struct Case {
    dx::Shape shape;
    std::size_t rows, cols;
    std::uint32_t k;
  };
  const std::vector<Case> cases = {
      {{96, 80}, 96, 80, 64},  {{128, 256}, 128, 256, 64}, {{100}, 1, 100, 64}, {{640}, 1, 640, 64},
      {{67}, 1, 67, 64},       {{3, 4, 8}, 3, 32, 64},      {{7, 5}, 7, 5, 64},   {{192, 64}, 192, 64, 32},
      {{64, 64}, 64, 64, 4096}, {{1}, 1, 1, 64}};
  for (const auto& c : cases) {
    SCOPED_TRACE("shape " + c.shape.str() + " k " + std::to_string(c.k));
    const auto x = values(c.shape.numel(), 11 + c.shape.numel());
    const auto o = oracle::sparseloco_round(x, c.rows, c.cols, c.k);
    const auto got = sent_by_one_replica({"t", c.shape}, x, {.k = c.k});
    std::vector<std::size_t> kept;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (got[i] != 0.0f) kept.push_back(i);
    ASSERT_EQ(kept, o.kept);
    double top = 0;
    for (double v : o.decoded) top = std::max(top, std::fabs(v));
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], o.decoded[i], 1e-5 * top) << "position " << i;
  }
}

TEST(TiledCode, RoundTripAndRefusals) {
  const dx::TiledCode c{.tile = 8, .k = 4};
  const dx::Shape shape{16, 8};  // two 8 x 8 tiles
  auto x = values(128, 3);
  std::vector<std::byte> code(dx::tiled_encoded_size(shape, c));
  EXPECT_EQ(code.size(), dx::tiled_params_bytes + 8 * 12 / 8 + 8 * 2 / 8);
  const std::vector<std::uint32_t> picked{0, 9, 18, 63, 1, 2, 3, 4};
  dx::encode_tiled(x, shape, picked, c, code);
  std::vector<float> y(128, 0.0f);
  dx::decode_tiled_add(code, shape, c, y);
  for (std::size_t i = 0; i < 128; ++i) {
    const bool kept = i == 0 || i == 9 || i == 18 || i == 63 || (i >= 65 && i <= 68);
    if (!kept) {
      EXPECT_EQ(y[i], 0.0f) << i;
    }
  }
  EXPECT_THROW(dx::encode_tiled(x, shape, std::vector<std::uint32_t>{3, 1, 5, 6, 0, 1, 2, 3}, c, code), dx::Error);
  EXPECT_THROW(dx::encode_tiled(x, shape, std::vector<std::uint32_t>{0, 1, 2, 64, 0, 1, 2, 3}, c, code), dx::Error);
  EXPECT_THROW(dx::encode_tiled(x, shape, std::vector<std::uint32_t>{0, 1}, c, code), dx::Error);
  x[9] = NAN;
  EXPECT_THROW(dx::encode_tiled(x, shape, picked, c, code), dx::Error);
  EXPECT_THROW(dx::validate(dx::TiledCode{.tile = 65}), dx::Error);
  EXPECT_THROW(dx::validate(dx::TiledCode{.k = 0}), dx::Error);
}

TEST(Wire, TiledSparsePayloadRoundTripsAndRefusesForgeries) {
  const dx::TiledCode c{.tile = 8, .k = 4};
  const dx::Shape shape{10, 16};  // tiles 5 x 8: 4 tiles of 4
  const auto x = values(160, 9);
  const dx::PayloadHeader h = dx::tiled_header(shape, c);
  std::vector<std::byte> p(dx::payload_size(h, "w"));
  const std::vector<std::uint32_t> picked{0, 1, 2, 3, 4, 5, 6, 7, 36, 37, 38, 39, 10, 20, 30, 31};
  dx::encode_tiled(x, shape, picked, c, dx::begin_payload(h, "w", p));
  dx::seal_payload(p);
  const auto v = dx::read_payload(p);
  EXPECT_EQ(v.header.kind, dx::PayloadKind::sparse_tiled);
  EXPECT_EQ(v.header.shape, shape);
  EXPECT_EQ(v.header.nnz, 4u);
  EXPECT_EQ(v.header.quant.block, 8u);
  std::vector<float> a(160, 0.0f), b(160, 0.0f);
  dx::decode_add(v, a);
  dx::decode_tiled_add(v.body, shape, c, b);
  EXPECT_EQ(a, b);
  // The first index (12 bits) set past its tile of 40, checksum recomputed: refused.
  auto forged = p;
  const std::size_t index_at = dx::wire_header_bytes + 1 + dx::tiled_params_bytes;
  forged[index_at] = std::byte{0xff};
  write_checksum(forged);
  try {
    dx::read_payload(forged);
    ADD_FAILURE() << "forged index accepted";
  } catch (const dx::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("out of order or range"));
  }
  // A codebook value that is not finite: refused.
  auto nan = p;
  const float bad = NAN;
  std::memcpy(nan.data() + dx::wire_header_bytes + 1 + 4, &bad, 4);
  write_checksum(nan);
  EXPECT_THROW(dx::read_payload(nan), dx::Error);
  // bits other than 2, and the retired kind 6: refused.
  auto other = p;
  other[9] = std::byte{4};
  write_checksum(other);
  EXPECT_THROW(dx::read_payload(other), dx::Error);
  auto retired = p;
  retired[6] = std::byte{6};
  write_checksum(retired);
  try {
    dx::read_payload(retired);
    ADD_FAILURE() << "kind 6 accepted";
  } catch (const dx::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown kind 6"));
  }
}

// One replica (K = 1): e_new + sent == beta e_old + Delta, element by element, over
// several syncs; the sent entries per tile are the oracle's; nothing is owed locally
// (published form), or beta e with keep_residual.
TEST(SparseLoCoCompressor, ConservesTheAccumulator) {
  for (bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "keep_residual" : "published");
    const dx::SparseLoCoConfig cfg{.k = 8, .error_decay = 0.9f, .keep_residual = keep};
    const std::vector<dx::TensorSpec> specs = {{"w", {20, 10}}, {"b", {30}}};
    run_ranks(1, [&](dx::ThreadCommunicator& comm) {
      dx::SparseLoCoCompressor c(cfg);
      c.setup(specs);
      dx::AnyCommunicator any(comm);
      const std::vector<std::size_t> all{0, 1};
      const std::vector<std::uint8_t> contributes{1};
      std::vector<float> e0(200, 0.0f), e1(30, 0.0f);
      for (std::uint64_t s = 0; s < 5; ++s) {
        auto d0 = values(200, 100 + s), d1 = values(30, 200 + s);
        std::vector<float> acc0, acc1;  // beta e + Delta: what the sync compresses
        for (std::size_t i = 0; i < 200; ++i) acc0.push_back(0.9f * e0[i] + d0[i]);
        for (std::size_t i = 0; i < 30; ++i) acc1.push_back(0.9f * e1[i] + d1[i]);
        std::vector<float> m0(200), m1(30);
        std::vector<std::span<float>> x{d0, d1}, mean{m0, m1};
        c.sync(any, {all, contributes, s}, x, mean);
        const auto o0 = oracle::sparseloco_round(acc0, 20, 10, 8);
        std::size_t nonzero = 0;
        for (float v : m0) nonzero += v != 0.0f;
        EXPECT_EQ(nonzero, o0.kept.size()) << "sync " << s;
        const auto a0 = c.accumulator(0), a1 = c.accumulator(1);
        for (std::size_t i = 0; i < 200; ++i) EXPECT_NEAR(a0[i] + m0[i], acc0[i], 1e-5f * (1 + std::fabs(acc0[i])));
        for (std::size_t i = 0; i < 30; ++i) EXPECT_NEAR(a1[i] + m1[i], acc1[i], 1e-5f * (1 + std::fabs(acc1[i])));
        for (std::size_t i = 0; i < 200; ++i) EXPECT_EQ(x[0][i], keep ? 0.9f * a0[i] : 0.0f);
        e0.assign(a0.begin(), a0.end());
        e1.assign(a1.begin(), a1.end());
      }
    });
  }
}

// The mean of what the replicas sent (sent: per replica, the dense decoded payload of
// each tensor of `sizes`, end to end): sum / n, or (chosen) each replica's tensor scaled
// to at most the lower median of their norms, then each position averaged over the
// replicas that sent it.
std::vector<double> expected_mean(const std::vector<std::vector<float>>& sent, int n, bool chosen,
                                  const std::vector<std::size_t>& sizes) {
  std::vector<double> mean(sent[0].size(), 0.0);
  for (std::size_t at = 0; std::size_t size : sizes) {
    std::vector<double> norms, scale(static_cast<std::size_t>(n), 1.0);
    for (int r = 0; r < n; ++r) {
      double s2 = 0;
      for (std::size_t i = at; i < at + size; ++i) s2 += double(sent[static_cast<std::size_t>(r)][i]) * sent[static_cast<std::size_t>(r)][i];
      norms.push_back(std::sqrt(s2));
    }
    auto sorted = norms;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[static_cast<std::size_t>(n - 1) / 2];
    for (int r = 0; chosen && r < n; ++r) scale[static_cast<std::size_t>(r)] = std::min(1.0, median / norms[static_cast<std::size_t>(r)]);
    for (std::size_t i = at; i < at + size; ++i) {
      int count = 0;
      for (int r = 0; r < n; ++r) {
        const float v = sent[static_cast<std::size_t>(r)][i];
        mean[i] += scale[static_cast<std::size_t>(r)] * v;
        count += v != 0.0f;
      }
      mean[i] /= chosen ? std::max(count, 1) : n;
    }
    at += size;
  }
  return mean;
}

// K replicas: every rank gets the same mean, bit for bit, equal to the mean of what each
// replica's payload decodes to (the paper's sum / R, or the reference code's average over
// the replicas that chose a position after clipping to the median norm); a replica left
// out contributes nothing.
TEST(SparseLoCoCompressor, MeanIsBitIdenticalOnEveryRank) {
  for (bool chosen : {false, true})
    for (int k : {2, 3, 4}) {
      SCOPED_TRACE(std::to_string(k) + (chosen ? " replicas, average_chosen" : " replicas"));
      const std::vector<dx::TensorSpec> specs = {{"w", {64, 100}}, {"b", {100}}};
      std::vector<std::vector<float>> means(static_cast<std::size_t>(k)), sent(static_cast<std::size_t>(k));
      for (bool drop_last : {false, true}) {
        run_ranks(k, [&](dx::ThreadCommunicator& comm) {
          dx::SparseLoCoCompressor c(dx::SparseLoCoConfig{.k = 16, .average_chosen = chosen});
          c.setup(specs);
          dx::AnyCommunicator any(comm);
          const std::vector<std::size_t> all{0, 1};
          std::vector<std::uint8_t> contributes(static_cast<std::size_t>(k), 1);
          if (drop_last) contributes.back() = 0;
          const bool mine = contributes[static_cast<std::size_t>(comm.rank())] != 0;
          auto d0 = values(6400, 300 + comm.rank()), d1 = values(100, 400 + comm.rank());
          for (float& v : d0) v *= static_cast<float>(1 + comm.rank());  // norms differ: the clip binds
          if (!mine) std::fill(d0.begin(), d0.end(), 0.0f), std::fill(d1.begin(), d1.end(), 0.0f);
          const auto before0 = d0, before1 = d1;
          std::vector<float> m0(6400), m1(100);
          std::vector<std::span<float>> x{d0, d1}, mean{m0, m1};
          c.sync(any, {all, contributes, 7}, x, mean);
          auto& out = means[static_cast<std::size_t>(comm.rank())];
          out = m0;
          out.insert(out.end(), m1.begin(), m1.end());
          auto& s = sent[static_cast<std::size_t>(comm.rank())];  // Delta - e_new: what it sent
          s.clear();
          for (std::size_t i = 0; i < 6400; ++i) s.push_back(before0[i] - c.accumulator(0)[i]);
          for (std::size_t i = 0; i < 100; ++i) s.push_back(before1[i] - c.accumulator(1)[i]);
        });
        for (int r = 1; r < k; ++r) ASSERT_EQ(means[static_cast<std::size_t>(r)], means[0]) << "rank " << r;
        const auto want = expected_mean(sent, drop_last ? k - 1 : k, chosen, {6400, 100});
        for (std::size_t i = 0; i < means[0].size(); ++i)
          ASSERT_NEAR(means[0][i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << i;
      }
    }
}

TEST(SparseLoCoCompressor, OuterStepIsPlainAveragingAndConfigIsChecked) {
  const dx::SparseLoCoCompressor c;
  EXPECT_EQ(c.outer_step().momentum, 0.0f);
  EXPECT_EQ(c.outer_step().lr, 1.0f);
  EXPECT_FALSE(c.config().keep_residual);
  EXPECT_THROW(dx::SparseLoCoCompressor({.k = 0}), dx::Error);
  EXPECT_THROW(dx::SparseLoCoCompressor({.tile = 128}), dx::Error);
  EXPECT_THROW(dx::SparseLoCoCompressor({.error_decay = 1.5f}), dx::Error);
  EXPECT_THROW(dx::SparseLoCoCompressor({.outer_lr = 0}), dx::Error);
  // 1.56% of the entries at 14 bits each, plus a 20-byte codebook and a header per
  // tensor: ~146x under fp32 for one large matrix.
  const std::vector<dx::TensorSpec> specs = {{"w", {4096, 1024}}};
  const double ratio = 4.0 * 4096 * 1024 / static_cast<double>(c.wire_bytes(specs, 2));
  EXPECT_GT(ratio, 140);
  EXPECT_LT(ratio, 150);
  // A bias goes whole: 1024 entries kept of 1024.
  const std::vector<dx::TensorSpec> bias = {{"b", {1024}}};
  EXPECT_EQ(c.wire_bytes(bias, 2), dx::ring_allgather_cost(dx::payload_size(dx::tiled_header({1024}, c.code()), ""), 2).bytes);
  EXPECT_EQ(dx::tile_grid({1024}, c.code()).total_kept(), 1024u);
}
