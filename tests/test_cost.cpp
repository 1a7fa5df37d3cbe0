// Link arithmetic: ring costs (the paper's 100B / 3 clusters / 1 Gbit/s example) and
// the parsing of link figures ("1Gbps", "20ms"), with errors for anything else.
#include <dilocox/comm/cost.hpp>

#include <gtest/gtest.h>

namespace dx = dilocox;

TEST(LinkCost, PaperAllreduceArithmetic) {
  const auto c = dx::ring_allreduce_cost(400'000'000'000ULL, 3);  // 100e9 fp32 parameters
  EXPECT_NEAR(static_cast<double>(c.bytes), 533.333e9, 0.001e9);
  EXPECT_NEAR(dx::link_seconds(c, {1e9, 0.0}) / 3600.0, 1.185, 0.001);
}

TEST(LinkCost, ParsesBandwidthAndLatency) {
  EXPECT_DOUBLE_EQ(dx::parse_bits_per_second("1Gbps"), 1e9);
  EXPECT_DOUBLE_EQ(dx::parse_bits_per_second("20Mbps"), 20e6);
  EXPECT_DOUBLE_EQ(dx::parse_bits_per_second("2.5kbps"), 2500.0);
  EXPECT_DOUBLE_EQ(dx::parse_seconds("20ms"), 0.02);
  EXPECT_DOUBLE_EQ(dx::parse_seconds("1.5s"), 1.5);
  EXPECT_DOUBLE_EQ(dx::parse_seconds("300us"), 300e-6);
  EXPECT_DOUBLE_EQ(dx::parse_seconds("0"), 0.0);
  for (const char* bad : {"", "1", "Gbps", "1 Gbps", "1gbps", "-1Mbps", "0Mbps", "1e999Gbps", "1Gbpsx"})
    EXPECT_THROW(dx::parse_bits_per_second(bad), dx::Error) << bad;
  for (const char* bad : {"", "20", "ms", "-5ms", "20 ms", "20min"}) EXPECT_THROW(dx::parse_seconds(bad), dx::Error) << bad;
}
