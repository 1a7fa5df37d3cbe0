// reference_trainer/peer_comms.hpp: the channels between one rank and its peers in the
// other clusters (same stage and dp index; rank = cluster): `data`, which the outer loop
// and AllReduce send over (throttled by the caller), and `control`, unthrottled, for the
// small agreements of the sync (never the data channel, whose reductions run on the outer
// loop's background thread). One job: both are duplicates of an MPI communicator. One job
// per site: both are Gloo groups meeting through the run's store; elastic sites: both are
// the run's ElasticGroup. Not here: what goes over them (cluster_sync.hpp).
#pragma once

#include <dilocox/comm/any.hpp>
#include <dilocox/comm/mpi.hpp>
#ifdef DILOCOX_TRAINER_GLOO
#include <dilocox/comm/elastic.hpp>
#include <dilocox/comm/gloo.hpp>
#endif

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dilocox::trainer {

class PeerComms {
 public:
  // One job: `clusters`, the K ranks of this (stage, dp), ranked by cluster.
  explicit PeerComms(MPI_Comm clusters)
      : mpi_data_(std::make_unique<MpiCommunicator>(clusters)),
        mpi_control_(std::make_unique<MpiCommunicator>(clusters)),
        data_(*mpi_data_),
        control_(*mpi_control_) {}
#ifdef DILOCOX_TRAINER_GLOO
  // One job per site: Gloo groups named after this (stage, dp) position under the run's
  // prefix, this rank being `replica` of `replicas`.
  PeerComms(const GlooOptions& run, int position, int replica, int replicas)
      : gloo_data_(std::make_unique<GlooCommunicator>(replica, replicas, named(run, position, "data"))),
        gloo_control_(std::make_unique<GlooCommunicator>(replica, replicas, named(run, position, "control"))),
        data_(*gloo_data_),
        control_(*gloo_control_) {}
  // Elastic sites (one rank a site): both channels are the run's ElasticGroup, whose
  // operations run in program order (the syncs do not overlap the next round there).
  explicit PeerComms(ElasticGroup& group) : data_(group), control_(group) {}
#endif
  PeerComms(const PeerComms&) = delete;
  PeerComms& operator=(const PeerComms&) = delete;

  AnyCommunicator& data() { return data_; }
  AnyCommunicator& control() { return control_; }

 private:
#ifdef DILOCOX_TRAINER_GLOO
  static GlooOptions named(GlooOptions o, int position, const char* channel) {
    o.prefix += "/peers" + std::to_string(position) + "/" + channel;
    return o;
  }
  std::unique_ptr<GlooCommunicator> gloo_data_, gloo_control_;
#endif
  std::unique_ptr<MpiCommunicator> mpi_data_, mpi_control_;
  AnyCommunicator data_, control_;
};

// Every rank's value of `c`, in rank order (a small control message).
template <class T>
std::vector<T> gather_values(AnyCommunicator& c, T mine) {
  std::vector<T> all(static_cast<std::size_t>(c.size()));
  c.allgather(std::as_bytes(std::span<const T>(&mine, 1)), std::as_writable_bytes(std::span<T>(all)));
  return all;
}

}  // namespace dilocox::trainer
