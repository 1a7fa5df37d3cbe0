// The rank layout (reference_trainer/layout.hpp): rank <-> (cluster, dp, stage) both
// ways for every rank of several layouts, each communicator's members (same pipeline,
// group, peers) counted, names and file prefixes, and a prefix read back as a layout.
#include "layout.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace dt = dilocox::trainer;

TEST(RankLayout, RanksAndCoordinatesRoundTripAndGroupsHaveTheirSizes) {
  for (const dt::RankLayout l : {dt::RankLayout{1, 1, 1}, dt::RankLayout{2, 1, 2}, dt::RankLayout{2, 2, 2},
                                 dt::RankLayout{3, 4, 2}, dt::RankLayout{2, 3, 1}}) {
    SCOPED_TRACE(l.str());
    std::map<int, int> pipelines, groups, peers;
    std::set<int> seen;
    for (int r = 0; r < l.world(); ++r) {
      const auto c = l.coord(r);
      EXPECT_EQ(l.rank(c), r);
      EXPECT_TRUE(c.cluster < l.clusters && c.dp < l.dp && c.stage < l.stages);
      seen.insert(l.rank(c));
      ++pipelines[l.pipeline_of(c)], ++groups[l.group_of(c)], ++peers[l.peers_of(c)];
    }
    EXPECT_EQ(static_cast<int>(seen.size()), l.world());
    EXPECT_EQ(static_cast<int>(pipelines.size()), l.clusters * l.dp);
    EXPECT_EQ(static_cast<int>(groups.size()), l.clusters * l.stages);
    EXPECT_EQ(static_cast<int>(peers.size()), l.dp * l.stages);
    for (const auto& [id, n] : pipelines) EXPECT_EQ(n, l.stages) << id;
    for (const auto& [id, n] : groups) EXPECT_EQ(n, l.dp) << id;
    for (const auto& [id, n] : peers) EXPECT_EQ(n, l.clusters) << id;
  }
  const dt::RankLayout l{2, 2, 2};
  EXPECT_EQ(l.rank({.cluster = 1, .dp = 0, .stage = 1}), 5);  // stages adjacent, then dp, then cluster
}

TEST(RankLayout, NamesAndPrefixes) {
  const dt::RankLayout l{2, 2, 2};
  EXPECT_EQ(l.describe(5), "rank 5 (stage 1, dp 0, replica 1)");
  EXPECT_EQ(dt::RankLayout({2, 1, 2}).describe(3), "rank 3 (stage 1, replica 1)");
  EXPECT_EQ(dt::RankLayout({1, 1, 0}).describe(3), "rank 3");  // layout unknown
  EXPECT_EQ(l.file_prefix(5), "stage1of2-dp0of2-replica1of2");
  EXPECT_EQ(dt::RankLayout({2, 1, 2}).file_prefix(3), "stage1of2-replica1of2");
  EXPECT_EQ(dt::RankLayout({1, 1, 2}).file_prefix(1), "stage1of2");
  EXPECT_EQ(dt::RankLayout::of_prefix("stage1of2-dp0of2-replica1of2"), "2 clusters x 2 dp x 2 stages");
  EXPECT_EQ(dt::RankLayout::of_prefix("stage1of2-replica1of3"), "3 clusters x 2 stages");
  EXPECT_EQ(dt::RankLayout::of_prefix("stage0of1"), "1 cluster x 1 stage");
  EXPECT_EQ(dt::RankLayout::of_prefix("stage0of2-dp1of4"), "1 cluster x 4 dp x 2 stages");
  EXPECT_EQ(dt::RankLayout::of_prefix("other"), "other");
}
