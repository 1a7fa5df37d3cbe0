// SparseLoCo: the chunked top-k code (round trip, 2-bit bound, the format refusing bad
// indices), the compressor (top-k of the decayed accumulator, error-feedback
// conservation, what it keeps owed) and its mean, bit-identical on K = 2, 3, 4 replicas.
#include <dilocox/compress/sparse.hpp>
#include <dilocox/sparse_code.hpp>
#include <dilocox/wire.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "thread_ranks.hpp"

namespace dx = dilocox;
using ::testing::HasSubstr;

namespace {

std::vector<float> values(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = dx::counter_normal(seed, i) * (1.0f + static_cast<float>(i % 5));
  return v;
}

// Per chunk, the positions of the k largest magnitudes (ties by position), ascending:
// the reference the compressor must match.
std::vector<std::uint32_t> reference_topk(const std::vector<float>& x, const dx::ChunkedCode& c) {
  std::vector<std::uint32_t> out;
  for (std::size_t base = 0; base < x.size(); base += c.chunk) {
    const std::size_t len = std::min(c.chunk, x.size() - base), kc = std::min<std::size_t>(c.k, len);
    std::vector<std::uint32_t> idx(len);
    std::iota(idx.begin(), idx.end(), 0u);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return std::fabs(x[base + a]) > std::fabs(x[base + b]); });
    idx.resize(kc);
    std::sort(idx.begin(), idx.end());
    out.insert(out.end(), idx.begin(), idx.end());
  }
  return out;
}

}  // namespace

// Decoding gives, at each picked position, the sign of the value and the mean magnitude
// of its half of the chunk (smaller or larger k/2); zeros elsewhere. So each decoded
// magnitude is within its half's range, and a chunk's magnitudes sum to the picked ones'.
TEST(ChunkedCode, RoundTripKeepsSignsAndHalfMeans) {
  for (const dx::ChunkedCode c : {dx::ChunkedCode{4096, 64}, dx::ChunkedCode{16, 4}, dx::ChunkedCode{10, 3},
                                  dx::ChunkedCode{16, 4, dx::ScaleFormat::bf16}}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{31}, c.chunk - 1, c.chunk + 1, std::size_t{4097},
                          std::size_t{10007}}) {
      SCOPED_TRACE("chunk " + std::to_string(c.chunk) + " k " + std::to_string(c.k) + " n " + std::to_string(n));
      const auto x = values(n, 3);
      const auto picked = reference_topk(x, c);
      std::vector<std::byte> code(dx::chunked_encoded_size(n, c));
      dx::encode_chunked(x, picked, c, code);
      std::vector<float> y(n, 0.0f);
      dx::decode_chunked_add(code, y, c);
      std::size_t at = 0;
      for (std::size_t base = 0; base < n; base += c.chunk) {
        const std::size_t len = std::min(c.chunk, n - base), kc = std::min<std::size_t>(c.k, len);
        std::vector<float> mags;
        for (std::size_t i = 0; i < kc; ++i) mags.push_back(std::fabs(x[base + picked[at + i]]));
        std::vector<float> sorted = mags;
        std::sort(sorted.begin(), sorted.end());
        const std::size_t half = kc / 2;
        double sum_x = 0, sum_y = 0;
        for (std::size_t i = 0; i < kc; ++i) {
          const float v = x[base + picked[at + i]], d = y[base + picked[at + i]];
          ASSERT_EQ(std::signbit(v), std::signbit(d)) << "sign at " << base + picked[at + i];
          const bool big = std::lower_bound(sorted.begin(), sorted.end(), mags[i]) - sorted.begin() >= static_cast<long>(half);
          const float lo = big ? sorted[half] : sorted.front(), hi = big ? sorted.back() : sorted[half ? half - 1 : 0];
          const float tol = c.scale == dx::ScaleFormat::bf16 ? 0.008f * hi : 1e-5f * hi;
          EXPECT_GE(std::fabs(d), lo - tol);  // the 2-bit bound: inside its half's range
          EXPECT_LE(std::fabs(d), hi + tol);
          sum_x += std::fabs(v), sum_y += std::fabs(d);
        }
        if (c.scale == dx::ScaleFormat::fp32) {
          EXPECT_NEAR(sum_y, sum_x, 1e-4 * sum_x + 1e-6);
        }
        for (std::size_t i = 0, j = 0; i < len; ++i) {  // zeros where nothing was picked
          if (j < kc && picked[at + j] == i) {
            ++j;
            continue;
          }
          ASSERT_EQ(y[base + i], 0.0f) << base + i;
        }
        at += kc;
      }
    }
  }
}

TEST(ChunkedCode, RefusesBadPositionsAndNonFiniteValues) {
  const dx::ChunkedCode c{8, 2};
  std::vector<float> x(16, 1.0f);
  std::vector<std::byte> code(dx::chunked_encoded_size(16, c));
  EXPECT_THROW(dx::encode_chunked(x, std::vector<std::uint32_t>{3, 1, 0, 1}, c, code), dx::Error);  // descending
  EXPECT_THROW(dx::encode_chunked(x, std::vector<std::uint32_t>{0, 8, 0, 1}, c, code), dx::Error);  // outside
  EXPECT_THROW(dx::encode_chunked(x, std::vector<std::uint32_t>{0, 1}, c, code), dx::Error);        // too few
  x[9] = NAN;
  EXPECT_THROW(dx::encode_chunked(x, std::vector<std::uint32_t>{0, 1, 1, 2}, c, code), dx::Error);
  EXPECT_THROW(dx::validate(dx::ChunkedCode{8, 9}), dx::Error);
  EXPECT_THROW(dx::validate(dx::ChunkedCode{1, 1}), dx::Error);
}

TEST(Wire, ChunkedSparsePayloadRoundTripsAndRefusesForgedIndices) {
  const dx::ChunkedCode c{32, 4};
  const auto x = values(100, 9);
  const auto picked = reference_topk(x, c);
  dx::PayloadHeader h{dx::PayloadKind::sparse_chunked, {10, 10}, {}, c.k};
  h.quant.bits = 2, h.quant.block = c.chunk;
  std::vector<std::byte> p(dx::payload_size(h, "w"));
  dx::encode_chunked(x, picked, c, dx::begin_payload(h, "w", p));
  dx::seal_payload(p);
  const auto v = dx::read_payload(p);
  EXPECT_EQ(v.header.kind, dx::PayloadKind::sparse_chunked);
  EXPECT_EQ(v.header.shape, (dx::Shape{10, 10}));
  EXPECT_EQ(v.header.nnz, 4u);
  EXPECT_EQ(v.header.quant.block, 32u);
  std::vector<float> a(100, 0.0f), b(100, 0.0f);
  dx::decode_add(v, a);
  dx::decode_chunked_add(v.body, b, c);
  EXPECT_EQ(a, b);
  // The first index of chunk 0 (5 bits) set past the chunk, checksum recomputed: refused.
  auto forged = p;
  const std::size_t index_at = dx::wire_header_bytes + 1 + 4 * 2 * 4;  // name "w", then 4 chunks x 2 scales
  forged[index_at] |= std::byte{0x1f};
  forged[index_at + 1] |= std::byte{0x01};
  const std::size_t end = forged.size() - 8;
  const std::uint64_t sum = dx::checksum64(std::span<const std::byte>(forged).first(end));
  std::memcpy(forged.data() + end, &sum, 8);
  try {
    dx::read_payload(forged);
    ADD_FAILURE() << "forged index accepted";
  } catch (const dx::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("out of order or range"));
  }
  // bits other than 2 in the header: refused.
  auto other = p;
  other[9] = std::byte{4};
  std::memcpy(other.data() + end, &sum, 8);
  const std::uint64_t sum2 = dx::checksum64(std::span<const std::byte>(other).first(end));
  std::memcpy(other.data() + end, &sum2, 8);
  EXPECT_THROW(dx::read_payload(other), dx::Error);
}

// One replica (K = 1): the sent entries are the top-k of beta e + Delta per chunk, and
// e_new + sent == beta e_old + Delta, element by element, over several syncs.
TEST(SparseLoCoCompressor, SendsTheTopKOfTheAccumulatorAndConservesIt) {
  const dx::SparseLoCoConfig cfg{.chunk = 64, .k = 4, .error_decay = 0.9f};
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
      std::vector<float> acc;  // beta e + Delta, flat, what the sync compresses
      for (std::size_t i = 0; i < 200; ++i) acc.push_back(0.9f * e0[i] + d0[i]);
      for (std::size_t i = 0; i < 30; ++i) acc.push_back(0.9f * e1[i] + d1[i]);
      std::vector<float> m0(200), m1(30);
      std::vector<std::span<float>> x{d0, d1}, mean{m0, m1};
      c.sync(any, {all, contributes, s}, x, mean);
      std::vector<float> sent(m0);
      sent.insert(sent.end(), m1.begin(), m1.end());  // K = 1: the mean is what was sent
      const auto picked = reference_topk(acc, {64, 4});
      std::size_t nonzero = 0;
      for (float v : sent) nonzero += v != 0.0f;
      EXPECT_EQ(nonzero, picked.size()) << "sync " << s;
      for (std::size_t at = 0, base = 0; base < acc.size(); base += 64) {
        const std::size_t kc = std::min<std::size_t>(4, acc.size() - base);
        for (std::size_t i = 0; i < kc; ++i) EXPECT_NE(sent[base + picked[at + i]], 0.0f) << "sync " << s;
        at += kc;
      }
      const auto a0 = c.accumulator(0), a1 = c.accumulator(1);
      for (std::size_t i = 0; i < 200; ++i) EXPECT_NEAR(a0[i] + sent[i], acc[i], 1e-5f * (1 + std::fabs(acc[i])));
      for (std::size_t i = 0; i < 30; ++i) EXPECT_NEAR(a1[i] + sent[200 + i], acc[200 + i], 1e-5f * (1 + std::fabs(acc[200 + i])));
      for (std::size_t i = 0; i < 200; ++i) EXPECT_EQ(x[0][i], 0.9f * a0[i]);  // owed: beta e, kept locally
      e0.assign(a0.begin(), a0.end());
      e1.assign(a1.begin(), a1.end());
    }
  });
}

// K replicas: every rank gets the same mean, bit for bit, equal to the mean of what each
// replica's payload decodes to; a replica left out contributes nothing.
TEST(SparseLoCoCompressor, MeanIsBitIdenticalOnEveryRank) {
  for (int k : {2, 3, 4}) {
    SCOPED_TRACE(k);
    const std::vector<dx::TensorSpec> specs = {{"w", {64, 100}}, {"b", {100}}};
    std::vector<std::vector<float>> means(static_cast<std::size_t>(k)), sent(static_cast<std::size_t>(k));
    for (bool drop_last : {false, true}) {
      run_ranks(k, [&](dx::ThreadCommunicator& comm) {
        dx::SparseLoCoCompressor c(dx::SparseLoCoConfig{.chunk = 512, .k = 16});
        c.setup(specs);
        dx::AnyCommunicator any(comm);
        const std::vector<std::size_t> all{0, 1};
        std::vector<std::uint8_t> contributes(static_cast<std::size_t>(k), 1);
        if (drop_last) contributes.back() = 0;
        const bool mine = contributes[static_cast<std::size_t>(comm.rank())] != 0;
        auto d0 = values(6400, 300 + comm.rank()), d1 = values(100, 400 + comm.rank());
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
      const int n = drop_last ? k - 1 : k;
      for (std::size_t i = 0; i < means[0].size(); ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += sent[static_cast<std::size_t>(r)][i];
        ASSERT_NEAR(means[0][i], sum / n, 1e-5 * (1 + std::fabs(sum))) << i;
      }
    }
  }
}

TEST(SparseLoCoCompressor, OuterStepIsPlainAveragingAndConfigIsChecked) {
  const dx::SparseLoCoCompressor c;
  EXPECT_EQ(c.outer_step().momentum, 0.0f);
  EXPECT_EQ(c.outer_step().lr, 1.0f);
  EXPECT_THROW(dx::SparseLoCoCompressor({.k = 0}), dx::Error);
  EXPECT_THROW(dx::SparseLoCoCompressor({.error_decay = 1.5f}), dx::Error);
  EXPECT_THROW(dx::SparseLoCoCompressor({.outer_lr = 0}), dx::Error);
  // 1.56% of the entries at 14 bits each, plus two fp32 scales per 4096: ~136x under fp32.
  const std::vector<dx::TensorSpec> specs = {{"w", {4096, 1024}}};
  const double ratio = 4.0 * 4096 * 1024 / static_cast<double>(c.wire_bytes(specs, 2));
  EXPECT_GT(ratio, 130);
  EXPECT_LT(ratio, 140);
}
