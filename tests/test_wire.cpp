// Wire format: round trips, and every truncation, bit flip, foreign version and
// inconsistent header refused with dilocox::Error.
#include <dilocox/wire.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace dx = dilocox;
using ::testing::HasSubstr;

namespace {

std::vector<std::byte> quantized_payload(const std::string& name, dx::Shape shape, dx::QuantConfig q) {
  std::vector<float> x(shape.numel());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.37f * static_cast<float>(i));
  const dx::PayloadHeader h{dx::PayloadKind::quantized, shape, q};
  std::vector<std::byte> out(dx::payload_size(h, name));
  auto body = dx::begin_payload(h, name, out);
  dx::quantize(x, body, q);
  dx::seal_payload(out);
  return out;
}

std::string read_error(std::span<const std::byte> in) {
  try {
    dx::read_payload(in);
  } catch (const dx::Error& e) {
    return e.what();
  }
  return "no error";
}

// Rewrites a header field and recomputes the checksum: a well-formed lie.
template <class T>
std::vector<std::byte> forge(std::vector<std::byte> p, std::size_t off, T value) {
  std::memcpy(p.data() + off, &value, sizeof value);
  std::uint16_t name_len;
  std::uint64_t body_len;
  std::memcpy(&name_len, p.data() + 80, 2);
  std::memcpy(&body_len, p.data() + 88, 8);
  const std::size_t end = dx::wire_header_bytes + name_len + body_len;
  if (end + 8 <= p.size()) {
    const std::uint64_t sum = dx::checksum64(std::span<const std::byte>(p).first(end));
    std::memcpy(p.data() + end, &sum, 8);
  }
  return p;
}

}  // namespace

TEST(Wire, QuantizedRoundTripKeepsEverything) {
  const dx::QuantConfig q{.bits = 4, .block = 32, .rounding = dx::Rounding::stochastic, .seed = 99,
                          .scale = dx::ScaleFormat::bf16};
  const auto p = quantized_payload("layers.3.mlp.fc1.weight", {64, 3, 5}, q);
  const auto v = dx::read_payload(p);
  EXPECT_EQ(v.header.kind, dx::PayloadKind::quantized);
  EXPECT_EQ(v.header.shape, (dx::Shape{64, 3, 5}));
  EXPECT_EQ(v.header.quant, q);
  EXPECT_EQ(v.name, "layers.3.mlp.fc1.weight");
  EXPECT_EQ(v.body.size(), dx::encoded_size(64 * 3 * 5, q));
  EXPECT_EQ(v.size, p.size());
}

TEST(Wire, DenseRoundTripAndConcatenatedPayloads) {
  std::vector<float> a{1, 2, 3, 4, 5, 6}, b;
  const dx::PayloadHeader ha{dx::PayloadKind::dense_f32, {2, 3}, {}}, hb{dx::PayloadKind::dense_f32, {0}, {}};
  std::vector<std::byte> buf(dx::payload_size(ha, "a") + dx::payload_size(hb, ""));
  const std::size_t na = dx::write_payload(ha, "a", std::as_bytes(std::span(a)), buf);
  dx::write_payload(hb, "", std::as_bytes(std::span(b)), std::span(buf).subspan(na));
  const auto va = dx::read_payload(buf);
  ASSERT_EQ(va.size, na);
  std::vector<float> got(6);
  std::memcpy(got.data(), va.body.data(), 24);
  EXPECT_EQ(got, a);
  const auto vb = dx::read_payload(std::span<const std::byte>(buf).subspan(va.size));
  EXPECT_EQ(vb.header.shape.numel(), 0u);
  EXPECT_EQ(vb.name, "");
}

TEST(Wire, EveryTruncationThrows) {
  const auto p = quantized_payload("w", {10, 7}, {.bits = 8, .block = 16});
  for (std::size_t len = 0; len < p.size(); ++len) {
    SCOPED_TRACE(len);
    EXPECT_THROW(dx::read_payload(std::span<const std::byte>(p).first(len)), dx::Error);
  }
}

TEST(Wire, EverySingleBitFlipThrows) {
  const auto p = quantized_payload("emb", {9, 4}, {.bits = 4, .block = 8});
  for (std::size_t byte = 0; byte < p.size(); ++byte)
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = p;
      bad[byte] ^= std::byte(1u << bit);
      ASSERT_THROW(dx::read_payload(bad), dx::Error) << "byte " << byte << " bit " << bit;
    }
}

TEST(Wire, ForeignOrInconsistentHeadersThrowNamingTheProblem) {
  const auto p = quantized_payload("w", {10, 7}, {.bits = 8, .block = 16});
  EXPECT_THAT(read_error(forge<std::uint16_t>(p, 4, 2)), HasSubstr("version 2"));
  EXPECT_THAT(read_error(forge<std::uint32_t>(p, 0, 0x46445025)), HasSubstr("magic"));
  EXPECT_THAT(read_error(forge<std::uint16_t>(p, 6, 77)), HasSubstr("kind"));
  EXPECT_THAT(read_error(forge<std::uint16_t>(p, 6, 0)), HasSubstr("kind"));
  EXPECT_THAT(read_error(forge<std::uint8_t>(p, 8, 7)), HasSubstr("ndim"));
  EXPECT_THAT(read_error(forge<std::uint64_t>(p, 24, 11)), HasSubstr("count"));
  EXPECT_THAT(read_error(forge<std::uint64_t>(p, 72, 71)), HasSubstr("count"));
  EXPECT_THAT(read_error(forge<std::uint8_t>(p, 9, 5)), HasSubstr("bits"));
  EXPECT_THAT(read_error(forge<std::uint32_t>(p, 12, 0)), HasSubstr("block"));
  EXPECT_THAT(read_error(forge<std::uint8_t>(p, 82, 1)), HasSubstr("reserved"));
  EXPECT_THAT(read_error(forge<std::uint32_t>(p, 84, 3)), HasSubstr("nnz"));
  EXPECT_THAT(read_error(forge<std::uint64_t>(p, 88, 1u << 20)), HasSubstr("truncated"));
  auto shorter_body = forge<std::uint64_t>(p, 88, dx::encoded_size(70, {.bits = 8, .block = 16}) - 1);
  EXPECT_THAT(read_error(shorter_body), HasSubstr("body"));
  auto corrupt = p;
  corrupt[dx::wire_header_bytes + 3] ^= std::byte{0x10};
  EXPECT_THAT(read_error(corrupt), HasSubstr("checksum"));
}

TEST(Wire, WriterRejectsBadArguments) {
  std::vector<std::byte> out(4096);
  const dx::PayloadHeader h{dx::PayloadKind::dense_f32, {4}, {}};
  std::vector<float> body(3);
  EXPECT_THROW(dx::write_payload(h, "x", std::as_bytes(std::span(body)), out), dx::Error);
  std::vector<std::byte> tiny(10);
  EXPECT_THROW(dx::begin_payload(h, "x", tiny), dx::Error);
  EXPECT_THROW(dx::begin_payload(h, std::string(2000, 'n'), out), dx::Error);
  const dx::PayloadHeader bad_q{dx::PayloadKind::quantized, {4}, {.bits = 5}};
  EXPECT_THROW(dx::begin_payload(bad_q, "x", out), dx::Error);
}

TEST(Checksum, SensitiveToContentOrderAndLength) {
  std::vector<std::byte> a(64);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::byte(i * 7);
  auto b = a;
  std::swap_ranges(b.begin(), b.begin() + 8, b.begin() + 8);  // swap two words
  EXPECT_NE(dx::checksum64(a), dx::checksum64(b));
  EXPECT_NE(dx::checksum64(std::span(a).first(63)), dx::checksum64(a));
  std::vector<std::byte> z1(8), z2(16);
  EXPECT_NE(dx::checksum64(z1), dx::checksum64(z2));
  EXPECT_EQ(dx::checksum64(a), dx::checksum64(a));
}
