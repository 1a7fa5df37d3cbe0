// reference_trainer/rank_comms.hpp: the communicators a rank of the layout (layout.hpp)
// works over: its pipeline (same cluster k and dp index d), its data-parallel group (same
// k and stage s), its peers in the other clusters (same s, d) and its site (same k: the
// ranks that share the site's link). Not here: what runs over them.
#pragma once

#include "layout.hpp"

#include <mpi.h>

namespace dilocox::trainer {

// The communicators of one rank (freed with it). Each is split from `world`, ranked by
// the coordinate that varies inside it: pipeline by stage, data parallel by dp index,
// clusters by cluster, the site by world rank.
class RankComms {
 public:
  RankComms(MPI_Comm world, const RankLayout& layout, int rank) {
    const RankCoord c = layout.coord(rank);
    MPI_Comm_split(world, layout.pipeline_of(c), c.stage, &pipeline_);
    MPI_Comm_split(world, layout.group_of(c), c.dp, &data_parallel_);
    MPI_Comm_split(world, layout.peers_of(c), c.cluster, &clusters_);
    MPI_Comm_split(world, layout.site_of(c), rank, &site_);
  }
  RankComms(const RankComms&) = delete;
  RankComms& operator=(const RankComms&) = delete;
  ~RankComms() {
    for (MPI_Comm* c : {&pipeline_, &data_parallel_, &clusters_, &site_})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
  MPI_Comm pipeline() const { return pipeline_; }            // same cluster and dp index: the S stages
  MPI_Comm data_parallel() const { return data_parallel_; }  // same cluster and stage: the D copies
  MPI_Comm clusters() const { return clusters_; }            // same stage and dp index: the K replicas
  MPI_Comm site() const { return site_; }                    // same cluster: its D x S ranks

 private:
  MPI_Comm pipeline_ = MPI_COMM_NULL, data_parallel_ = MPI_COMM_NULL, clusters_ = MPI_COMM_NULL, site_ = MPI_COMM_NULL;
};

}  // namespace dilocox::trainer
