// reference_trainer/layout.hpp: the run's one rank layout. K clusters (the outer loop's
// replicas) x D data-parallel pipelines per cluster x S pipeline stages; world rank
// ((k D) + d) S + s, so a pipeline's stages are adjacent ranks. RankLayout maps a rank
// to (cluster, dp, stage) and back and names ranks for messages and checkpoint files.
// Arithmetic only. Not here: the communicators (rank_comms.hpp).
#pragma once

#include <cstdio>
#include <string>

namespace dilocox::trainer {

struct RankCoord {
  int cluster = 0, dp = 0, stage = 0;
};

struct RankLayout {
  int clusters = 1, dp = 1, stages = 1;

  int world() const { return clusters * dp * stages; }
  int rank(RankCoord c) const { return (c.cluster * dp + c.dp) * stages + c.stage; }
  RankCoord coord(int rank) const {
    return {.cluster = rank / (dp * stages), .dp = rank / stages % dp, .stage = rank % stages};
  }

  // Which pipeline (same k, d), data-parallel group (same k, s), set of peers across
  // clusters (same s, d) and site (same k) a rank belongs to, numbered from 0.
  int pipeline_of(RankCoord c) const { return c.cluster * dp + c.dp; }
  int group_of(RankCoord c) const { return c.cluster * stages + c.stage; }
  int peers_of(RankCoord c) const { return c.dp * stages + c.stage; }
  // The site (cluster) a rank belongs to: its D x S ranks share the site's link.
  int site_of(RankCoord c) const { return c.cluster; }

  // "stage 1, dp 0, replica 1" (dp and replica only when there are several).
  std::string where(int rank) const {
    const RankCoord c = coord(rank);
    std::string s = "stage " + std::to_string(c.stage);
    if (dp > 1) s += ", dp " + std::to_string(c.dp);
    if (clusters > 1) s += ", replica " + std::to_string(c.cluster);
    return s;
  }
  // "rank 5 (stage 1, dp 0, replica 1)"; what a one-rank run or a layout not yet known
  // (stages <= 0) has not: "rank 5".
  std::string describe(int rank) const {
    if (stages <= 0 || world() <= 1 || rank >= world()) return "rank " + std::to_string(rank);
    return "rank " + std::to_string(rank) + " (" + where(rank) + ")";
  }

  // The checkpoint file prefix of a rank: "stage0of2", "stage0of2-replica1of2",
  // "stage0of2-dp1of2-replica1of2".
  std::string file_prefix(int rank) const {
    const RankCoord c = coord(rank);
    std::string s = "stage" + std::to_string(c.stage) + "of" + std::to_string(stages);
    if (dp > 1) s += "-dp" + std::to_string(c.dp) + "of" + std::to_string(dp);
    if (clusters > 1) s += "-replica" + std::to_string(c.cluster) + "of" + std::to_string(clusters);
    return s;
  }

  // "2 clusters x 2 dp x 2 stages" of a file prefix; the prefix itself when it is none.
  static std::string of_prefix(const std::string& prefix) {
    RankLayout l{.clusters = 1, .dp = 1, .stages = 0};
    int s = 0, d = 0, k = 0;
    if (std::sscanf(prefix.c_str(), "stage%dof%d-dp%dof%d-replica%dof%d", &s, &l.stages, &d, &l.dp, &k, &l.clusters) < 4 &&
        std::sscanf(prefix.c_str(), "stage%dof%d-replica%dof%d", &s, &l.stages, &k, &l.clusters) < 2)
      return prefix;
    return l.str();
  }
  std::string str() const {
    auto n = [](int v, const char* one) { return std::to_string(v) + " " + one + (v > 1 ? "s" : ""); };
    return n(clusters, "cluster") + (dp > 1 ? " x " + std::to_string(dp) + " dp" : "") + " x " + n(stages, "stage");
  }
};

}  // namespace dilocox::trainer
